"""sweeper: which micro-batch size, gradient accumulation and data-parallel layout to train with,
and what each choice costs in throughput, memory and accuracy."""

__version__ = "0.1.0"

__all__ = ["results"]


def __getattr__(name: str):
    # Lazy: `import sweeper` happens in every Ray worker, which needs neither MLflow nor pandas.
    if name == "results":
        from sweeper.tracking.results import results

        return results
    raise AttributeError(f"module 'sweeper' has no attribute {name!r}")

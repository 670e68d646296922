"""sweeper: which micro-batch size, gradient accumulation and data-parallel layout to train with,
and what each choice costs in throughput, memory and accuracy."""

__version__ = "0.1.0"

"""Inference at one batch size on one device: timed forward passes, latency percentiles, throughput, the
peak memory of one forward and FLOP/s. Knows torch only and reports through a callable, as training does.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from sweeper import errors
from sweeper.config import ModelConfig
from sweeper.measure import flops, telemetry
from sweeper.schema import InferenceResult
from sweeper.workloads import models

ROLE = "inference"


def model_key(cfg: ModelConfig) -> str:
    """The part of a point's key that names the model: "mlp1024" for the built-in MLP, whose width seed
    003's experiment sweeps, else "" (a sweep times one such model). Not "w1024": in training keys w counts
    workers ("mb32-acc2-w1")."""
    if cfg.name == "mlp" and not cfg._target_:
        return f"mlp{cfg.width}"
    return ""


def label(model: ModelConfig) -> str:
    return model_key(model) or model.name


def group_label(spec: InferenceSpec) -> str:
    """A series of the sweep: the model's label, and a decoder's context ("gpt-ctx64")."""
    return label(spec.model) if spec.context is None else f"{label(spec.model)}-ctx{spec.context}"


@dataclass
class InferenceSpec:
    """One batch size of one model to time (picklable, sent to a worker)."""

    model: ModelConfig
    num_classes: int
    batch_size: int
    warmup_runs: int = 10
    # Timing goes on until both are reached: every point has at least `timed_runs` samples for its
    # percentiles, and a batch that takes microseconds is timed long enough to see the machine's
    # interruptions (100 runs of 50 us span only 5 ms)...
    timed_runs: int = 100
    min_timed_seconds: float = 0.5
    use_gpu: bool = False
    # FLOPs per sample of this model, counted once per sweep by the driver (None: not counted).
    flop_count: Optional[flops.FlopCount] = None
    # device.memory_budget_gb in bytes: enforced on GPU, simulated against the tracked forward on CPU.
    memory_budget_bytes: Optional[int] = None
    seed: int = 0
    # ...and no more than this many, so a sub-microsecond forward does not log a list of a million.
    max_timed_runs: int = 10_000
    # A language model (model=gpt): decode at this context, `batch_size` concurrent sequences
    # (inference.contexts; sweeper.inference.decode). None: one forward of a batch of samples.
    context: Optional[int] = None

    def __post_init__(self) -> None:
        problems = []
        for key, value, least in (
            ("inference.batch_sizes", self.batch_size, 1),
            ("inference.warmup_runs", self.warmup_runs, 0),
            ("inference.timed_runs", self.timed_runs, 1),
        ):
            if value < least:
                problems.append(f"{key} has {value}: must be at least {least}")
        if not self.min_timed_seconds >= 0:  # also rejects NaN
            problems.append(f"inference.min_timed_seconds={self.min_timed_seconds}: must be >= 0 (0: no minimum)")
        if self.max_timed_runs < self.timed_runs:
            problems.append(
                f"max_timed_runs={self.max_timed_runs} is below inference.timed_runs={self.timed_runs}: "
                "raise it, or time fewer runs"
            )
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def key(self) -> str:
        """ "bs64", "mlp1024-bs64" for the built-in MLP (widths are swept; see `model_key`), "bs8-ctx256" for
        a decoder's decode at a context."""
        prefix = model_key(self.model)
        key = f"{prefix}-bs{self.batch_size}" if prefix else f"bs{self.batch_size}"
        return key if self.context is None else f"{key}-ctx{self.context}"


def summarize_latency(samples_seconds: Sequence[float], batch_size: int) -> Dict[str, Any]:
    """Latency percentiles and throughput of `batch_size` samples a run, from per-run seconds.

    Percentiles interpolate linearly between samples (numpy's default, as batching_sim does).
    `samples_per_second` is the headline: batch_size / median latency. The median shrugs off the odd
    preempted run on a shared machine, which at a microsecond batch would move a mean by far more than
    the difference between neighbouring batch sizes; it is also what the batching simulator's
    LatencyCurve serves a batch in, so its capacity at a batch size is this figure.
    `samples_per_second_overall` is every timed sample over the summed run time (batch_size / mean
    latency), what back-to-back batches sustained outliers included; below the headline by the tail.
    """
    if len(samples_seconds) == 0:
        raise ValueError("no latency samples: time at least one run")
    values = np.asarray(samples_seconds, dtype=np.float64)
    if not (np.all(np.isfinite(values)) and np.all(values > 0)):
        raise ValueError(f"latency samples must be finite and > 0, got min {values.min()!r}")
    p50, p95, p99 = (float(v) for v in np.percentile(values, [50, 95, 99]))
    mean = float(values.mean())
    return {
        "latency_p50_seconds": p50,
        "latency_p95_seconds": p95,
        "latency_p99_seconds": p99,
        "latency_mean_seconds": mean,
        "latency_min_seconds": float(values.min()),
        "latency_max_seconds": float(values.max()),
        # Population stdev / mean over many timed runs.
        "latency_cv": statistics.pstdev(values.tolist()) / mean if len(values) > 1 else 0.0,
        "timed_runs": len(values),
        "samples_per_second": batch_size / p50,
        "samples_per_second_overall": batch_size * len(values) / float(values.sum()),
        "latency_samples_seconds": values.tolist(),
    }


def run_inference_point(
    spec: InferenceSpec,
    device: Optional[telemetry.Device] = None,
    peak: Optional[flops.PeakFlops] = None,
) -> InferenceResult:
    """Time one batch size; never raises: an out-of-memory error is status "oom", any other "failed".

    The model is built once (eval mode, seeded by spec.seed) and runs under torch.inference_mode() on
    one random batch of `model.input_shape`. On CPU one untimed forward is memory-tracked first (torch's
    MemTracker), with spec.memory_budget_bytes enforced on it; on GPU the budget is the allocator's.
    Then `warmup_runs` untimed runs, then timed runs, each waited for (device.synchronize) so it is one
    request's latency and not a pipelined rate: CUDA events on GPU, perf_counter on CPU. `peak` (the
    device's peak FLOP/s) adds an MFU when the spec has a flop count.
    """
    start = time.time()
    status, error = "ok", None
    result: Dict[str, Any] = {}
    try:
        device = device or telemetry.select(spec.use_gpu)
        result = _measure(spec, device)
    except Exception as exc:  # recorded as the point's result, never raised: the sweep goes on
        status, error, simulated = errors.failure(exc)
        result = {"oom_simulated": True} if simulated else {}
    finally:
        gc.collect()  # the point's model and activations go before the next point is measured
        if device is not None:
            device.release_cached_memory()
    if status == "ok":
        result.update(_flops_metrics(spec, result["samples_per_second"], peak))
    else:
        result["error"] = error
    result.update(
        trial_key=spec.key,
        role=ROLE,
        status=status,
        batch_size=spec.batch_size,
        started_at=start,
        trial_seconds=time.time() - start,
    )
    return InferenceResult.from_flat(result)


def _measure(spec: InferenceSpec, device: telemetry.Device) -> Dict[str, Any]:
    budget_mode = device.limit_memory(spec.memory_budget_bytes)
    device.start_memory_window()
    # Seeded, but without moving the caller's random stream (the weights' init draws from it).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model: nn.Module = models.build(spec.model, spec.num_classes)
    model = model.to(device.torch_device).eval()
    if spec.context is not None:
        return _measure_decode(spec, device, model, budget_mode)
    generator = torch.Generator().manual_seed(spec.seed)
    inputs = torch.randn(spec.batch_size, *spec.model.input_shape, generator=generator).to(device.torch_device)

    breakdown = None
    with torch.inference_mode():
        if not device.is_cuda:
            from sweeper.measure import memory  # loads DTensor (~1.5 s): CPU only, where it is the measure

            # The batch is copied inside the tracker, as a request's batch arrives on the device:
            # it is part of what one forward needs. MemTracker works under inference_mode.
            breakdown = memory.track_step(
                model,
                None,  # no optimizer: track_external skips None
                lambda: model(inputs.clone()),
                device.torch_device,
                budget_bytes=spec.memory_budget_bytes if budget_mode == "simulated" else None,
            )
        for _ in range(spec.warmup_runs):
            model(inputs)
        samples, timed_seconds = _timed_runs(spec, device, model, inputs)

    measure = ("cuda: torch.cuda.max_memory_allocated over the point (weights, the input batch and the largest "
               "forward's activations and workspace)") if device.is_cuda else (
        "cpu: peak tensor memory of one forward under inference_mode (torch MemTracker): parameters, buffers, the "
        "input batch and live activations; process RSS above its pre-point baseline is "
        "cpu_rss_peak_above_baseline_bytes")
    return _figures(spec, device, budget_mode, samples, breakdown, measure, timed_seconds=timed_seconds)


def _figures(spec: InferenceSpec, device: telemetry.Device, budget_mode: str, samples: List[float], breakdown: Any,
             measure: str, **own: Any) -> Dict[str, Any]:
    """What every inference point records: its own figures, latency and throughput, the device's memory,
    the peak (`breakdown`'s when tracked, else the CUDA allocator's) with `measure` saying how, the budget."""
    result: Dict[str, Any] = {"device": device.torch_device.type, "warmup_runs": spec.warmup_runs, **own}
    result.update(summarize_latency(samples, spec.batch_size))
    result.update(device.memory_metrics())
    if breakdown is not None:
        result.update(breakdown.as_metrics())
        result["peak_memory_bytes"] = breakdown.peak_bytes
    elif device.is_cuda:
        result["peak_memory_bytes"] = result["cuda_max_memory_allocated_bytes"]
    if "peak_memory_bytes" in result:
        result["memory_measure"] = measure
    if budget_mode != "none":
        result["memory_budget_bytes"] = spec.memory_budget_bytes
        result["memory_budget_mode"] = budget_mode
    return result


def _measure_decode(spec: InferenceSpec, device: telemetry.Device, model: nn.Module, budget_mode: str
                    ) -> Dict[str, Any]:
    """A decoder's prefill and decode at spec.context (sweeper.inference.decode): the decode step's
    latency is the point's latency (samples_per_second: tokens/s over the batch), its peak memory that
    of a fresh cache, the prefill and one decode step."""
    from sweeper.inference import decode

    def track(fn: Callable[[], Any], enforce: bool) -> Any:
        if device.is_cuda:  # the allocator's own peak over fn alone (its budget is the allocator's, on both)
            device.synchronize()
            torch.cuda.reset_peak_memory_stats(device.torch_device)
            fn()
            device.synchronize()
            return _Peak(torch.cuda.max_memory_allocated(device.torch_device))
        from sweeper.measure import memory

        budget = spec.memory_budget_bytes if budget_mode == "simulated" and enforce else None
        return memory.track_step(model, None, fn, device.torch_device, budget_bytes=budget)

    def timed(fn: Callable[[], Any]) -> Tuple[List[float], float]:
        for _ in range(spec.warmup_runs):
            fn()
        return _timed_runs(spec, device, fn)

    found = decode.measure(model, spec.batch_size, spec.context, spec.seed, device, timed, track)
    breakdown, samples = found.pop("breakdown"), found.pop("latency_samples_seconds")
    measure = ("cuda: torch.cuda.max_memory_allocated over a KV cache of the context and one decode step (peak "
               "statistics reset before it); the prefill's apart") if device.is_cuda else (
        "cpu: peak tensor memory of a KV cache of the context and one decode step under inference_mode (torch "
        "MemTracker); the prefill's apart: prefill_peak_memory_bytes")
    result = _figures(spec, device, budget_mode, samples, breakdown, measure, **found)
    result["tokens_per_second"] = result["samples_per_second"]
    result["tokens_per_second_per_sequence"] = 1.0 / result["latency_p50_seconds"]
    return result


class _Peak:
    """A CUDA peak as the CPU tracker's breakdown reads: `peak_bytes`, no breakdown by category."""

    def __init__(self, peak_bytes: int):
        self.peak_bytes = peak_bytes

    def as_metrics(self) -> Dict[str, Any]:
        return {}


def _timed_runs(
    spec: InferenceSpec, device: telemetry.Device, model: Callable[..., Any], inputs: Any = None
) -> Tuple[List[float], float]:
    """Runs of model(inputs) (or of model() without inputs), each waited for, until the spec's rule is met."""
    samples: List[float] = []
    started = time.perf_counter()
    elapsed = 0.0
    while len(samples) < spec.max_timed_runs and (
        len(samples) < spec.timed_runs or elapsed < spec.min_timed_seconds
    ):
        device.synchronize()  # nothing queued before this run may count towards it
        begin = device.mark()
        if inputs is None:
            model()
        else:
            model(inputs)
        end = device.mark()
        samples.append(device.seconds_between(begin, end))  # waits for `end` on CUDA
        elapsed = time.perf_counter() - started
    return samples, elapsed


def _flops_metrics(spec: InferenceSpec, samples_per_second: float, peak: Optional[flops.PeakFlops]) -> Dict[str, Any]:
    if spec.flop_count is None:
        return {}
    achieved = spec.flop_count.forward_per_sample * samples_per_second
    out: Dict[str, Any] = {
        "forward_flops_per_sample": spec.flop_count.forward_per_sample,
        "achieved_flops_per_second": achieved,
    }
    if peak is not None:
        out.update(
            mfu=flops.mfu(achieved, peak),
            peak_flops_per_second=peak.flops_per_second,
            peak_flops_source=peak.source,
        )
    return out


def _model_identity(spec: InferenceSpec) -> Tuple[Any, ...]:
    # Points that share all of these differ only in batch size, so a smaller batch running out of
    # memory implies a larger one would too (a decoder's: at the same context).
    return (repr(spec.model), spec.num_classes, spec.use_gpu, spec.memory_budget_bytes, spec.context)


def order_points(specs: Sequence[InferenceSpec]) -> List[InferenceSpec]:
    """Models in the order they first appear, each model's batch sizes smallest first."""
    first_seen: Dict[Tuple[Any, ...], int] = {}
    for spec in specs:
        first_seen.setdefault(_model_identity(spec), len(first_seen))
    return sorted(specs, key=lambda s: (first_seen[_model_identity(s)], s.batch_size))


def _peak(spec: InferenceSpec, device: telemetry.Device, threads: int) -> Optional[flops.PeakFlops]:
    return None if spec.flop_count is None else flops.device_peak(device.name, device.is_cuda, spec.flop_count, threads)


def run_inference_points(
    specs: Sequence[InferenceSpec],
    report: Callable[[InferenceResult], None],
    threads: int = 1,
) -> None:
    """Time every spec, calling `report(result)` after each: models in their given order, each model's
    batch sizes smallest first. Once a batch size runs out of memory, the model's larger batch sizes
    are reported as "oom" with `oom_implied_by` and not run. On CPU torch uses `threads` threads
    meanwhile; the peak FLOP/s (for MFU) is measured once, with the same threads."""
    if threads < 1:
        raise ValueError(f"threads={threads}: must be at least 1")
    devices: Dict[bool, telemetry.Device] = {}
    peaks: Dict[Tuple[bool, bool], Optional[flops.PeakFlops]] = {}
    out_of_memory: Dict[Tuple[Any, ...], str] = {}
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for spec in order_points(specs):
            identity = _model_identity(spec)
            cause = out_of_memory.get(identity)
            if cause is not None:
                report(InferenceResult(
                    trial_key=spec.key,
                    role=ROLE,
                    status="oom",
                    batch_size=spec.batch_size,
                    oom_implied_by=cause,
                    error=f"oom (implied): {cause} ran out of memory and this batch is larger",
                ))
                continue
            device = devices.get(spec.use_gpu)
            if device is None:
                try:
                    device = devices[spec.use_gpu] = telemetry.select(spec.use_gpu)
                except Exception:  # noqa: BLE001 - run_inference_point selects again and records the error
                    device = None
            peak = None
            if device is not None and spec.flop_count is not None:
                # The GPU peak depends on whether convolutions or matmuls dominate (TF32 switches).
                facts = (spec.use_gpu, spec.flop_count.convolution_share >= 0.5)
                if facts not in peaks:
                    peaks[facts] = _peak(spec, device, threads)
                peak = peaks[facts]
            result = run_inference_point(spec, device, peak)
            if result.status == "oom":
                out_of_memory[identity] = spec.key
            report(result)
    finally:
        torch.set_num_threads(previous_threads)


__all__ = [
    "InferenceSpec",
    "model_key",
    "order_points",
    "run_inference_point",
    "run_inference_points",
    "summarize_latency",
]

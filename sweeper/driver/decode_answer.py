"""A decoder's inference answer (task=inference, model=gpt), per context: the decode knee measured and
predicted by the decode roofline, the KV cache per sequence measured from its tensors at each batch
against its formula, the decode step's activation peak per sequence beside it, and the largest decode
batch under the memory budget (from the peak memory's growth with the batch, their sum). Logged on the
parent run; printed by the console."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Tuple

from sweeper import tracking
from sweeper.config import SweeperConfig, budget_bytes
from sweeper.driver import console
from sweeper.errors import first_line
from sweeper.inference import roofline
from sweeper.inference.latency import InferenceSpec, group_label
from sweeper.schema import InferenceResult

Rows = List[Tuple[str, InferenceResult]]


def memory_line(points: List[Tuple[int, float]]) -> Optional[Tuple[float, float]]:
    """(bytes at batch 0, bytes per sequence): least squares of peak memory on the batch, or None with
    fewer than two batch sizes. The slope is what one more concurrent sequence holds: its KV cache and
    its share of a decode step's activations."""
    if len({b for b, _ in points}) < 2:
        return None
    xs, ys = [float(b) for b, _ in points], [float(m) for _, m in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def largest_batch(line: Tuple[float, float], budget: float) -> Optional[int]:
    """The largest batch whose fitted peak memory fits `budget` (None when not even one does)."""
    fixed, per_sequence = line
    if per_sequence <= 0:
        return None
    found = math.floor((budget - fixed) / per_sequence)
    return found if found >= 1 else None


def record(cfg: SweeperConfig, tracker: tracking.Tracker, series: List[InferenceSpec], rows: Rows,
           facts: Dict[str, Any]) -> Dict[str, Tuple[Optional[int], Optional[int]]]:
    """Per context (one spec of each series), the measured and predicted decode knee (as the inference
    plot draws them), with the KV cache and budget figures logged on the parent run and printed."""
    knees: Dict[str, Tuple[Optional[int], Optional[int]]] = {}
    metrics: Dict[str, float] = {}
    bandwidth = facts.get("bandwidth_bytes_per_second")
    budget = budget_bytes(cfg.device)
    lines: List[str] = []
    for spec in series:
        name = group_label(spec)
        ok = sorted(((int(r.batch_size), r) for lbl, r in rows if lbl == name and r.status == "ok"),
                    key=lambda x: x[0])
        grid = [b for b, _ in ok]
        measured = roofline.measured_knee(grid, [r["samples_per_second"] for _, r in ok], cfg.report.knee_min_gain)
        metrics[f"knee_measured_batch_size_{name}"] = measured if measured is not None else -1
        predicted, words = _predicted_knee(cfg, name, ok, bandwidth, metrics)
        knees[name] = (measured, predicted)
        said = f"{name}: decode knee measured {measured or '-'} (predicted {predicted or '-'}; {words})"
        lines.append(said + _memory_words(cfg, name, ok, budget, metrics))
    if bandwidth:
        metrics["bandwidth_bytes_per_second"] = bandwidth
        tracker.log_sweep_tags({"sweeper.bandwidth_source": str(facts.get("bandwidth_source"))})
    tracker.log_parent_metrics(metrics)
    for said in lines:
        console.print_line(said)
    return knees


def _predicted_knee(cfg: SweeperConfig, name: str, ok: List[Tuple[int, InferenceResult]], bandwidth: Optional[float],
                    metrics: Dict[str, float]) -> Tuple[Optional[int], str]:
    """One context's decode knee predicted by the roofline from its first ok point (its figures added to
    `metrics`), and the words that say how, or why there is no prediction."""
    predicted, words = None, "no prediction (no ok point, or no peak FLOP/s or bandwidth measured)"
    if not (ok and bandwidth and ok[0][1].flops.peak_flops_per_second):
        return predicted, words
    grid = [b for b, _ in ok]
    first = ok[0][1]
    try:
        prediction = roofline.predict_knee(first.decode.decode_flops_per_token, first.decode.weight_bytes,
                                           first.decode.kv_cache_formula_bytes_per_sequence,
                                           first.flops.peak_flops_per_second, bandwidth)
        predicted = prediction.knee_on_grid(grid, cfg.report.knee_min_gain) if len(grid) > 1 else None
        words = prediction.explanation
        metrics.update({
            f"knee_predicted_batch_size_{name}": predicted if predicted is not None else -1,
            f"knee_predicted_exact_batch_size_{name}": prediction.knee_batch_size or -1,
            f"ridge_flops_per_byte_{name}": prediction.ridge_flops_per_byte,
            f"weight_bytes_{name}": first.decode.weight_bytes,
            f"decode_flops_per_token_{name}": first.decode.decode_flops_per_token,
            f"peak_flops_per_second_{name}": first.flops.peak_flops_per_second,
        })
    except ValueError as exc:
        words = f"no prediction: {first_line(exc)}"
    return predicted, words


def _memory_words(cfg: SweeperConfig, name: str, ok: List[Tuple[int, InferenceResult]], budget: Optional[float],
                  metrics: Dict[str, float]) -> str:
    """One context's KV cache per sequence (measured against its formula), a decode step's activations
    and the largest batch under the budget: added to `metrics`, and the words that say them."""
    said = ""
    line = memory_line([(b, r.memory.peak_memory_bytes) for b, r in ok if r.memory.peak_memory_bytes])
    formula = ok[0][1].decode.kv_cache_formula_bytes_per_sequence if ok else None
    # The cache from its tensors at each concurrency and the step's activations, each on the batch:
    # the peak's slope (what the budget line uses) is their sum, and names neither.
    cache = memory_line([(b, r.decode.kv_cache_bytes) for b, r in ok if r.decode.kv_cache_bytes])
    step = memory_line([(b, r.decode.decode_activation_peak_bytes) for b, r in ok
                        if r.decode.decode_activation_peak_bytes is not None])
    if cache is not None and formula:
        metrics[f"kv_cache_measured_bytes_per_sequence_{name}"] = cache[1]
        metrics[f"kv_cache_formula_bytes_per_sequence_{name}"] = formula
        said += (f"; the KV cache's tensors hold {cache[1] / 1024:,.1f} KiB per sequence against its formula "
                 f"{formula / 1024:,.1f} KiB ({cache[1] / formula - 1:+.1%})")
    if step is not None:
        metrics[f"decode_activation_peak_bytes_per_sequence_{name}"] = step[1]
        said += f", a decode step's activations {step[1] / 1024:,.1f} KiB more at their peak"
    if line is not None:
        metrics[f"peak_memory_bytes_per_sequence_{name}"] = line[1]
    if budget is not None:
        fits = [b for b, _ in ok]
        fitted = largest_batch(line, budget) if line is not None else None
        metrics[f"largest_decode_batch_measured_{name}"] = max(fits) if fits else -1
        metrics[f"largest_decode_batch_fitted_{name}"] = fitted if fitted is not None else -1
        said += (f"; under device.memory_budget_gb={cfg.device.memory_budget_gb:g}: the largest batch measured "
                 f"ok {max(fits) if fits else '-'}, the fitted line's {fitted if fitted is not None else '-'}")
    return said

"""The sweep's figures as PNG files, one mark per point (seeds folded): throughput and memory against
the micro-batch (also per recipe) in `micro_batch`, accuracy, time and steps to target against the
global batch (with the critical batch size) in `global_batch`, the throughput/memory Pareto front in
`pareto`, the inference sweep's curves in `inference`; a point's series, colour and marker in `marks`,
the figure, its axes and saving in `canvas`. matplotlib's object API only."""

from sweeper.report.plots.canvas import DPI, FIGSIZE
from sweeper.report.plots.global_batch import (
    accuracy_vs_global_batch, steps_to_target_vs_global_batch, time_to_target_vs_global_batch,
)
from sweeper.report.plots.inference import inference_curves
from sweeper.report.plots.marks import series_of
from sweeper.report.plots.micro_batch import memory_by_recipe, memory_vs_micro_batch, throughput_vs_micro_batch
from sweeper.report.plots.pareto import pareto_throughput_memory

__all__ = [
    "DPI", "FIGSIZE", "accuracy_vs_global_batch", "inference_curves", "memory_by_recipe", "memory_vs_micro_batch",
    "pareto_throughput_memory", "series_of", "steps_to_target_vs_global_batch", "throughput_vs_micro_batch",
    "time_to_target_vs_global_batch",
]

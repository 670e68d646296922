"""The memory frontier of one worker count: probe micro-batches (warm-up steps only, the last one
memory-tracked under the budget) as measure.frontier.FrontierSearch asks for them.

Knows torch only and reports through a callable, as the point loop does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Union

from sweeper.measure import frontier, telemetry
from sweeper.plan import GridPoint
from sweeper.schema import FrontierResult, PointResult, SearchFound
from sweeper.worker import collectives as comm
from sweeper.worker.points import STATUS_TIMEOUT, freeze_long_lived_objects, run_point
from sweeper.worker.spec import FrontierSpec, WorkerContext
from sweeper.workloads import datasets


def run_frontier(
    fspec: FrontierSpec,
    ctx: WorkerContext,
    report: Callable[[Union[PointResult, FrontierResult]], None],
    threads: int = 1,
) -> None:
    """Find the largest micro-batch that fits the budget on this worker group: each probe is reported
    as it ends (`probe_role` fit | verify), then the frontier itself (a FrontierResult). When the
    grid will accumulate gradients, a second search finds the frontier with accumulation: the
    accumulated gradients live beside the activations, so it is lower. Every rank runs the same
    probes: their results agree, so their searches do too."""
    template = fspec.template
    device = telemetry.select(template.use_gpu, ctx.local_rank)
    splits = datasets.load(template.data, template.model.input_shape)
    member = replace(ctx, status_group=comm.status_group(ctx, STATUS_TIMEOUT))
    if template.point.parallelism == "hsdp":  # its probes shard within a node, as its points will
        mesh = comm.node_meshes([ctx.world_size], comm.gather_objects(ctx.node, ctx), ctx).get(ctx.world_size)
        if isinstance(mesh, str):
            report(FrontierResult(trial_key=f"frontier-{fspec.label}", status="failed", error=mesh))
            return
        member = replace(member, mesh=mesh)
    freeze_long_lived_objects()
    # No budget given: a GPU's whole memory (a CPU sweep is refused one before it starts).
    budget = fspec.budget_bytes if fspec.budget_bytes is not None else device.total_memory_bytes()
    summary = FrontierResult(trial_key=f"frontier-{fspec.label}", memory_budget_bytes=budget)
    prober = _Prober(fspec, member, device, splits, budget, report)
    summary.plain = prober.search(1, fspec.upper)
    largest = summary.plain.micro_batch_size if summary.plain else None
    if largest is not None and largest >= 1 and frontier.needs_accumulating(
        largest, fspec.num_workers, fspec.accumulation_steps, fspec.global_batch_sizes
    ):
        summary.accumulating = prober.search(2, largest)
    if prober.failed is not None:
        summary.status, summary.error = "failed", prober.failed
    report(summary)


class _Prober:
    """Runs a search's probes as points of warm-up steps only, reporting each as it ends."""

    def __init__(self, fspec: FrontierSpec, ctx: WorkerContext, device, splits, budget: int, report):
        self.fspec, self.ctx, self.device, self.splits, self.budget = fspec, ctx, device, splits, budget
        self.report = report
        self.count = 0
        self.failed: Optional[str] = None

    def search(self, accumulation_steps: int, upper: int) -> Optional[SearchFound]:
        if self.failed is not None:
            return None
        finder = frontier.FrontierSearch(budget_bytes=self.budget, upper=upper, **self.fspec.search)
        while (size := finder.next_size()) is not None:
            role = finder.pending_role
            search = self.fspec.template.point
            result = self.probe(replace(search, micro_batch_size=size, accumulation_steps=accumulation_steps), role)
            if result.status == "failed":
                # Not a memory answer: the model or data is broken at this size; say so and stop.
                self.failed = result.error
                return None
            finder.record(size, result.memory.peak_memory_bytes if result.status == "ok" else None)
        return _found(finder.result())

    def probe(self, point: GridPoint, role: str) -> PointResult:
        template = self.fspec.template
        spec = replace(
            template,
            point=point,
            # Memory is all a probe measures: its warm-up; a verification runs on, so the allocator's
            # growth over more steps shows in its peak.
            steps=template.measure.warmup_steps + (self.fspec.verify_steps if role == "verify" else 0),
            memory_budget_bytes=self.budget,
            measure=replace(template.measure, memory_breakdown=True),
            evaluate=False,
            flop_count=None,
            profile=False,
        )
        result = run_point(spec, self.ctx, self.device, self.splits)
        self.count += 1
        result.trial_key = f"probe{self.count}-{point.key}"
        result.probe_role = role
        result.micro_batch_size, result.accumulation_steps = point.micro_batch_size, point.accumulation_steps
        self.report(result)
        return result


def _found(found: frontier.Frontier) -> SearchFound:
    search = SearchFound(
        micro_batch_size=found.micro_batch_size,
        predicted_micro_batch_size=found.predicted_micro_batch_size,
        fit_probes=found.num_fit_probes,
        verifications=found.num_verifications,
        reason=found.reason,
    )
    if found.model is not None:
        search.update(dict(
            fixed_bytes=found.model.fixed_bytes,
            per_sample_bytes=found.model.per_sample_bytes,
            fit_r_squared=found.model.r_squared,
            fit_max_relative_residual=found.model.max_relative_residual,
            fit_points=found.model.num_points,
        ))
    return search

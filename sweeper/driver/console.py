"""What the user sees in the terminal: where things are, a progress bar while points run, and the
final table of points sorted by throughput. Text that comes from outside (errors, paths) is escaped:
Rich would read `[/]` in it as markup."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any, Dict, List, Optional, Tuple

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sweeper.cluster import environment
from sweeper.plan import GridPoint
from sweeper.schema import FrontierResult, InferenceResult, PointResult
from sweeper.units import MiB, format_bytes

# A wide table even when piped to a file or a CI log (rich would pick 80 columns there).
console = Console(width=None if Console().is_terminal else 120)


def print_where(tracking_uri: str, dashboard_url: Optional[str], token_path: Optional[str], results_dir: str) -> None:
    """Where to watch the sweep, printed as soon as Ray is up: before any probe or trial runs."""
    console.print(f"[bold]sweeper[/]: MLflow store:   {tracking_uri}", soft_wrap=True)
    console.print(f"  Ray results:    {results_dir}", soft_wrap=True)
    if dashboard_url:
        console.print(f"  Ray dashboard:  {dashboard_url}", soft_wrap=True)
        if token_path:
            console.print(
                f"    token auth is on: paste the token from {token_path} into the dashboard's "
                "login prompt (or send `Authorization: Bearer <token>`)",
                soft_wrap=True,
            )
    shell = environment.job_shell()
    if shell:
        console.print(
            f"  Ray job:        started through `{shell} -c`; put `exec` before `python -m sweeper` in the "
            "entrypoint, so `ray job stop` waits for the sweep, not for its orphan to be reaped (docs/cluster.md)",
            soft_wrap=True,
        )


def print_start(num_points: int, num_groups: int, groups: str = "Ray Train worker group(s)") -> None:
    console.print(f"[bold]sweeper[/]: {num_points} points in {num_groups} {groups}", soft_wrap=True)


def describe(search: GridPoint) -> str:
    """A frontier search in words: `2 worker(s)`, `2 worker(s), bf16, checkpointing`."""
    words = [f"{search.num_workers} worker(s)"]
    if search.precision != "fp32":
        words.append(search.precision)
    if search.checkpointing != "none":
        words.append("checkpointing")
    return ", ".join(words)


def print_frontier_start(searches: List[GridPoint], budget_gb: Optional[float]) -> None:
    budget = f"{budget_gb:g} GiB" if budget_gb is not None else "the whole device"
    console.print(
        f"[bold]sweeper[/]: finding the largest micro-batch that fits {budget} for "
        f"{'; '.join(describe(s) for s in searches)}",
        soft_wrap=True,
    )


def print_probe(search: GridPoint, result: PointResult) -> None:
    peak = result.memory.peak_memory_bytes
    measured = f"peak {format_bytes(peak)}" if result.status == "ok" and peak is not None else result.status
    accumulation = " with accumulation" if (result.accumulation_steps or 1) > 1 else ""
    console.print(
        f"  probe ({result.probe_role}) micro-batch {result.micro_batch_size}{accumulation} on "
        f"{describe(search)}: {measured}",
        soft_wrap=True,
    )


def print_frontier(search: GridPoint, result: FrontierResult) -> None:
    if result.status != "ok":
        warn(f"{describe(search)}: the frontier search failed: {result.error}")
        return
    for label, found in (("", result.plain), (" with accumulation", result.accumulating)):
        if found is None:
            continue
        text = (
            f"  frontier, {describe(search)}{label}: micro-batch {found.micro_batch_size} "
            f"(the grid uses {found.safe_micro_batch_size}) "
            f"({found.reason}; {found.fit_probes} fit probe(s) + {found.verifications} verification(s))"
        )
        if found.per_sample_bytes is not None:
            text += f"; line {format_bytes(found.fixed_bytes)} + {format_bytes(found.per_sample_bytes)}/sample"
        if found.estimated_micro_batch_size is not None:
            text += f"; fake-tensor estimate {found.estimated_micro_batch_size}"
        console.print(text, soft_wrap=True)


def print_resume(experiment: str, recorded: int, replayed: int = 0, half_written: int = 0) -> None:
    text = f"[bold]sweeper[/]: resuming {experiment}: {recorded} point(s) already recorded are not run again"
    if replayed:
        text += f"; {replayed} write(s) kept while the store was unreachable are recorded now"
    if half_written:
        text += f"; {half_written} half-written point record(s) ended KILLED, their points measured again"
    console.print(text, soft_wrap=True)


def print_inference_point(model: str, batch_size: int, result: InferenceResult) -> None:
    if result.status != "ok":
        console.print(f"  {model} batch {batch_size}: {result.status} ({escape(str(result.error))})", soft_wrap=True)
        return
    latency, decode = result.latency, result.decode
    if decode.context is not None:  # a decoder: one decode step, the prefill apart
        console.print(
            f"  {model} batch {batch_size}: decode step p50 {latency.latency_p50_seconds * 1e3:,.3f} ms, "
            f"p99 {latency.latency_p99_seconds * 1e3:,.3f} ms, {decode.tokens_per_second:,.0f} tokens/s "
            f"({decode.tokens_per_second_per_sequence:,.0f} per sequence); prefill of {decode.prefill_tokens} "
            f"tokens {decode.prefill_p50_seconds * 1e3:,.1f} ms; KV cache "
            f"{decode.kv_cache_bytes_per_sequence / 1024:,.0f} KiB per sequence", soft_wrap=True)
        return
    console.print(
        f"  {model} batch {batch_size}: p50 {latency.latency_p50_seconds * 1e3:,.3f} ms, "
        f"p99 {latency.latency_p99_seconds * 1e3:,.3f} ms, {latency.samples_per_second:,.0f} samples/s",
        soft_wrap=True,
    )


def print_inference_summary(
    rows: List[Tuple[str, InferenceResult]],
    knees: Dict[str, Tuple[Optional[int], Optional[int]]],
    facts: Dict[str, Any],
    tracking_uri: str,
    parent_run_id: str,
    experiment: str,
    plot: str,
) -> None:
    decoding = any(r.decode.context is not None for _, r in rows)
    table = Table(title="inference: the knee of each model" + (" and context (decode steps)" if decoding else ""),
                  title_style="bold")
    for column in ("model", "measured knee", "roofline knee", "best tokens/s" if decoding else "best samples/s",
                   "at batch"):
        table.add_column(column, justify="right")
    for model, (measured, predicted) in knees.items():
        ok = [r for m, r in rows if m == model and r.status == "ok"]
        best = max(ok, key=lambda r: r["samples_per_second"]) if ok else None
        table.add_row(
            model,
            "-" if measured is None else str(measured),
            "-" if predicted is None else str(predicted),
            "-" if best is None else f"{best['samples_per_second']:,.0f}",
            "-" if best is None else str(best["batch_size"]),
        )
    console.print(table)
    if facts.get("bandwidth_source"):
        rate = facts["bandwidth_bytes_per_second"] / 1e9
        console.print(f"  bandwidth: {rate:,.1f} GB/s ({facts['bandwidth_source']})", soft_wrap=True)
    console.print(f"MLflow: experiment {experiment!r}, sweep run {parent_run_id}", soft_wrap=True)
    console.print(f"  plot: {plot} (also the run's artifact report/inference_curves.png)", soft_wrap=True)


def print_line(text: str) -> None:
    console.print(escape(text), soft_wrap=True)


def warn(text: str) -> None:
    console.print(f"[yellow]warning[/]: {escape(text)}", soft_wrap=True)


def note(text: str) -> None:
    console.print(f"[bold]sweeper[/]: {escape(text)}", soft_wrap=True)


def print_continued(key: str, samples: Optional[int], folder: str) -> None:
    """A point whose worker group was lost mid-point, recorded after it went on from its last save."""
    note(f"{key} went on from its save at {samples} samples ({folder}) after its worker group was lost, "
         "instead of from step 0")


def stopped(why: str, parent_run_id: str, status: str) -> None:
    """How a sweep that stopped early is left, and the one line that finishes it."""
    args = [a for a in sys.argv[1:] if not a.startswith("sweep.resume=")]
    again = " ".join(shlex.quote(a) for a in [*args, "sweep.resume=true"])
    console.print(
        f"[bold red]sweeper[/]: the sweep stopped ({escape(why)}); its run {parent_run_id} is {status} with the "
        f"points recorded so far. Finish it with:\n  python -m sweeper {escape(again)}",
        soft_wrap=True,
    )


def progress() -> Progress:
    return Progress(
        TextColumn("[bold]points"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=False,
    )


def print_summary(
    rows: List[Tuple[GridPoint, PointResult]],
    tracking_uri: str,
    parent_run_id: str,
    experiment_name: str,
    accuracy_note: Optional[str],
) -> None:
    console.print(_points_table(rows))
    for point, result in rows:
        if result.status != "ok":
            # did_not_learn says why in status_detail, not error: a status is never printed without its reason.
            why = result.get("error") or result.get("status_detail") or "no reason recorded"
            console.print(f"  [red]{point.key}[/] {_status(result, markup=False)}: {escape(why)}", soft_wrap=True)
    if any(r.get("gns_b_simple") is None and r.get("gns_note") for _, r in rows):
        notes = sorted({r.get("gns_note") for _, r in rows if r.get("gns_b_simple") is None and r.get("gns_note")})
        console.print(f"  B_simple: the gradient noise scale tr(Sigma) / |G|^2; '-' is {escape('; or '.join(notes))}",
                      soft_wrap=True)
    if any(not r.get("throughput_stable", True) for _, r in rows):
        console.print(
            "  unstable: the last timed windows disagreed by more than the tolerance "
            "(measure.stable_windows / measure.stability_tolerance); the figure is the median of all windows",
            soft_wrap=True,
        )
    entropy = next((r["train_unigram_entropy_bits"] for _, r in rows if "train_unigram_entropy_bits" in r), None)
    if entropy is not None:
        unit = "bits/byte: the validation loss in bits per byte" if any(
            "val_bits_per_byte" in r for _, r in rows) else "val loss: the validation loss in nats per token"
        console.print(f"  {unit}; the training stream's unigram entropy is {entropy:.3f} bits per token (what a "
                      "model that learned only which tokens are common scores)", soft_wrap=True)
    sources = {r["peak_flops_source"] for _, r in rows if r.get("peak_flops_source")}
    for source in sorted(sources):
        console.print(f"  MFU peak: {source}", soft_wrap=True)
    if accuracy_note:
        console.print(f"  val acc: {accuracy_note}", soft_wrap=True)
    console.print(f"MLflow: experiment {experiment_name!r}, sweep run {parent_run_id}", soft_wrap=True)
    if tracking_uri.startswith(("http://", "https://")):
        console.print(f"  open it at: {tracking_uri}", soft_wrap=True)
    else:
        console.print(f"  open it with: mlflow ui --backend-store-uri {tracking_uri}", soft_wrap=True)
    # MLflow 3.17's UI opens an experiment on its GenAI view whatever the experiment's kind tag says.
    console.print("  in the UI choose 'Model training' atop the sidebar (or add ?workflowType=machine_learning "
                  "to an experiment's URL)", soft_wrap=True)


def print_ledger(ledger: Dict[str, float]) -> None:
    """sweep.strategy=smart or branch: what the sweep spent, by phase, against the whole grid's estimate."""
    if "compute_trunk_point_seconds" in ledger:
        line = (f"[bold]sweeper[/]: compute {ledger['compute_point_seconds']:.1f} point-seconds: throughput "
                f"{ledger['compute_throughput_point_seconds']:.1f}, trunk {ledger['compute_trunk_point_seconds']:.1f}, "
                f"branches {ledger['compute_branch_point_seconds']:.1f} ({ledger['branch_runs']} branches)")
        if "full_grid_point_seconds_estimate" in ledger:
            line += (f"; the whole grid: ~{ledger['full_grid_point_seconds_estimate']:.1f} point-seconds = "
                     f"{100 * ledger['compute_fraction_of_full_grid']:.0f} %")
        console.print(line, soft_wrap=True)
        return
    line = (f"[bold]sweeper[/]: compute {ledger['compute_point_seconds']:.1f} point-seconds: throughput "
            f"{ledger['compute_throughput_point_seconds']:.1f}, "
            f"accuracy {ledger['compute_accuracy_point_seconds']:.1f}, "
            f"stopped early {ledger['compute_stopped_point_seconds']:.1f} "
            f"({ledger['smart_measurement_runs']} runs; {ledger['smart_classes_stopped']} of "
            f"{ledger['smart_accuracy_classes']} classes stopped)")
    if ledger.get("smart_continued_runs"):
        line += (f"; {ledger['smart_continued_runs']} rung runs continued from a checkpoint, sparing "
                 f"{ledger['compute_continuation_saved_point_seconds']:.1f} s of repeated steps")
    if "full_grid_point_seconds_estimate" in ledger:
        line += (f"; the whole grid: ~{ledger['full_grid_point_seconds_estimate']:.1f} point-seconds "
                 f"(estimated from the throughput runs, evaluations left out) = "
                 f"{100 * ledger['compute_fraction_of_full_grid']:.0f} %")
    console.print(line, soft_wrap=True)


def print_report(html_path: str, recommendation: str, yaml_path: str) -> None:
    """The answer at a glance (report/headline.py: a headline of at most 3 lines of 120 characters and the
    table of alternatives), then where the full reasoning is."""
    console.print("[bold]recommendation[/]:", soft_wrap=True)
    console.print(escape(recommendation), soft_wrap=True)
    console.print(f"  report (the full reasoning): {html_path}", soft_wrap=True)
    console.print(f"  as YAML: {yaml_path}", soft_wrap=True)
    snippets = os.path.join(os.path.dirname(yaml_path), "snippets")
    if os.path.isdir(snippets):
        console.print(f"  for your trainer (Lightning, Hugging Face, DeepSpeed, Ray Train, torchrun): {snippets}",
                      soft_wrap=True)


def _points_table(rows: List[Tuple[GridPoint, PointResult]]) -> Table:
    """The points, fastest first: layout (or key), status (a diverged point's reason), figures, B_simple."""
    # The key column only when a recipe, LR multiplier or seed makes micro/accum/workers ambiguous.
    keyed = any(point.key != f"mb{point.micro_batch_size}-acc{point.accumulation_steps}-w{point.num_workers}"
                for point, _ in rows)
    # With a key, micro/accum/workers are in it; no vertical rules, so the table fits 120 characters.
    layout = () if keyed else ("micro", "accum", "workers")
    # A language model's points: throughput in tokens and the loss in bits per byte (or nats per token).
    tokens = any("tokens_per_second" in result for _, result in rows)
    bits = any("val_bits_per_byte" in result for _, result in rows)
    rate, rate_key = ("tokens/s", "tokens_per_second") if tokens else ("samples/s", "samples_per_second")
    quality, quality_key, pattern = (("bits/byte", "val_bits_per_byte", "{:.3f}") if bits else
                                     ("val loss", "val_loss", "{:.3f}") if tokens else
                                     ("val acc", "val_accuracy", "{:.3f}"))
    table = Table(title="points, fastest first", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for column in (("point",) if keyed else ()) + layout + (
            "global", "status", rate, "cv", "MFU", "peak MiB", quality, "B_simple", "startup s"):
        table.add_column(column, justify="left" if column == "point" else "right", min_width=20 if column == "point"
                         else None, no_wrap=column in ("status", rate),
                         overflow="fold" if column == "point" else "ellipsis")

    def speed(row):
        return row[1].get(rate_key, -1.0)

    for point, result in sorted(rows, key=speed, reverse=True):
        table.add_row(
            *((escape(point.key),) if keyed else
              (str(point.micro_batch_size), str(point.accumulation_steps), str(point.num_workers))),
            str(point.global_batch_size),
            _status(result, step=False),
            _fmt(result.get(rate_key), "{:,.0f}" if tokens else "{:.1f}")
            + ("" if result.get("throughput_stable", True) else " [yellow]unstable[/]"),
            _fmt(result.get("samples_per_second_cv"), "{:.1%}"),
            _fmt(result.get("mfu"), "{:.1%}"),
            _fmt(_mib(result.get("peak_memory_bytes")), "{:.0f}"),
            _fmt(result.get(quality_key), pattern),
            _fmt(result.get("gns_b_simple"), "{:.1f}"),
            _fmt(result.get("startup_seconds"), "{:.1f}"),
        )
    return table


def _status(result: PointResult, markup: bool = True, step: bool = True) -> str:
    """ok, or e.g. "diverged (nonfinite at step 7)" (red in the table, without the step)."""
    text = result.status
    if result.status == "diverged" and result.get("divergence_reason"):
        at = result.get("diverged_at_step") if step else None
        text += f" ({result.get('divergence_reason')}{'' if at is None else f' at step {at}'})"
    if result.status == "ok" and result.get("eval_oom"):  # trained and measured; only its evaluation ran out of memory
        return "ok (eval oom)" if not markup else "ok [yellow](eval oom)[/]"
    return text if result.status == "ok" or not markup else f"[red]{escape(text)}[/]"


def _mib(value: Optional[float]) -> Optional[float]:
    return None if value is None else value / MiB


def _fmt(value: Optional[float], pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def print_branch_answer(answer) -> None:
    """sweep.strategy=branch: the critical batch size over training, the schedule and the constant layout."""
    console.print("[bold]sweeper[/]: critical batch size over training (branches from the trunk at global batch "
                  f"{answer.base}, {answer.window} samples each):", soft_wrap=True)
    for c in answer.locals:
        upto = f"< {c.high}" if c.high is not None else "or more (every branch kept up)"
        judged = ", ".join(f"{g}: {d:+.3g} ({c.verdict(g)}; margin {c.tolerance_of(g):.3g})"
                           for g, d in c.differences.items())
        weak = "; weak: the trunk fell too little over the window to tell" if c.weak else ""
        reading = f"{c.low} {upto}" if c.informative else \
            "no reading (the trunk did not fall and no branch was certified no worse; left out of the rising fit)"
        console.print(f"  at {c.samples} samples: {reading}  (loss rise by global batch: {judged}{weak})",
                      soft_wrap=True)
    spans = ", ".join(f"{g} from {s}" for s, g in answer.schedule)
    console.print(f"  schedule: {spans}; predicted {answer.schedule_seconds:.3g} s to the trunk's final loss; "
                  f"constant {answer.constant} (global batch {answer.constant_batch}): {answer.constant_seconds:.3g} s",
                  soft_wrap=True)
    console.print(f"  answer: {'the schedule' if answer.recommend_schedule else answer.constant}: {answer.why}",
                  soft_wrap=True)
    if answer.recommend_schedule:
        console.print("  as an override: train.batch_schedule="
                      + "[" + ",".join(f"[{s},{g}]" for s, g in answer.schedule) + "]", soft_wrap=True)

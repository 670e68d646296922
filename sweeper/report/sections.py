"""The report page's sections between the recommendation and the plots: the critical batch size in
words, the points over their seeds, the LR multipliers per global batch, the recipes compared."""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

from sweeper.report import analysis, folding, recipe_comparison
from sweeper.report.analysis import Trial
from sweeper.report.critical_batch import CriticalBatch
from sweeper.report.html import Section
from sweeper.report.quality import ACCURACY, AUTO, QUALITIES, Quality, resolve
from sweeper.config.report import ReportConfig


def lr_rule(params: Dict[str, str]) -> str:
    """The LR rule the critical batch size holds under, from the sweep's params: the scaling rule
    and the multipliers of which the fit took the best per global batch."""
    rule = f"lr_scaling={params.get('lr_scaling', '?')} (base batch {params.get('base_batch_size', '?')})"
    multipliers = params.get("lr_multipliers")
    if multipliers and multipliers not in ("[1.0]", "[1]"):
        rule += f", the best of lr_multipliers {multipliers} per global batch"
    return rule


def sections(trials: List[Trial], found: Optional[CriticalBatch], params: Dict[str, str],
              sweep_figures: Dict[str, float]) -> List[Section]:
    """The page's sections between the recommendation and the plots (each left out when empty).
    `sweep_figures`: the parent run's metrics (the frontier searches', the compute ledger)."""
    return [
        (f"Compute spent (sweep.strategy={params.get('strategy', 'smart')})", compute_words(sweep_figures)),
        ("Critical batch size", _critical_batch_words(trials, found, params)),
        ("Points (mean over seeds)", _point_rows(trials, judging(params, trials)[2])),
        ("LR multipliers per global batch", lr_rows(trials, *judging(params, trials))),
        *_recipe_sections(trials, sweep_figures, *judging(params, trials)),
    ]


def compute_words(figures: Dict[str, float]) -> str:
    """The smart strategy's compute ledger in words, against what the whole grid would have spent
    ('' for a grid sweep, which records no ledger)."""
    if "compute_point_seconds" not in figures:
        return ""
    if "compute_trunk_point_seconds" in figures:  # sweep.strategy=branch
        words = (f"The sweep spent {figures['compute_point_seconds']:.1f} point-seconds (each measurement run's wall "
                 f"time in its worker): {figures.get('compute_throughput_point_seconds', 0.0):.1f} in the layouts' "
                 f"throughput and memory runs, {figures['compute_trunk_point_seconds']:.1f} training the trunk and "
                 f"{figures.get('compute_branch_point_seconds', 0.0):.1f} in {int(figures.get('branch_runs', 0))} "
                 "branches.")
        return words + _against_grid(figures)
    runs, classes = int(figures.get("smart_measurement_runs", 0)), int(figures.get("smart_accuracy_classes", 0))
    words = (f"The sweep spent {figures['compute_point_seconds']:.1f} point-seconds (each measurement run's wall "
             f"time in its worker): {figures.get('compute_throughput_point_seconds', 0.0):.1f} in the layouts' "
             f"throughput and memory runs, {figures.get('compute_accuracy_point_seconds', 0.0):.1f} training the "
             f"accuracy classes it kept and {figures.get('compute_stopped_point_seconds', 0.0):.1f} in classes "
             f"successive halving stopped early; {runs} measurement runs, "
             f"{int(figures.get('smart_classes_stopped', 0))} of {classes} accuracy classes stopped.")
    if figures.get("smart_continued_runs"):
        words += (f" {int(figures['smart_continued_runs'])} rung runs continued from the rung before's checkpoint, "
                  f"sparing the {figures.get('compute_continuation_saved_point_seconds', 0.0):.1f} seconds of earlier "
                  "rungs' steps that runs from step 0 would have trained again.")
    return words + _against_grid(figures)


def _against_grid(figures: Dict[str, float]) -> str:
    if "full_grid_point_seconds_estimate" not in figures:
        return ""
    return (f" The whole grid would have spent ~{figures['full_grid_point_seconds_estimate']:.1f} "
            "point-seconds (estimated from the same runs: each point's budget at its layout's measured "
            f"step time, plus its evaluations): {figures['compute_fraction_of_full_grid']:.0%} of it.")


def _critical_batch_words(trials: List[Trial], found: Optional[CriticalBatch], params: Dict[str, str]) -> str:
    """The fit in words with the mean B_simple beside it, or why there is none ('' when the sweep
    measured neither steps to a target nor a noise scale)."""
    b_simple = folding.b_simple_mean(trials)
    noise = "" if b_simple is None else (
        f" The points' gradient noise scale B_simple averages {b_simple:.0f} (McCandlish et al. 2018 expect "
        "B_crit ~ B_simple within an order of magnitude).")
    if found is None:
        if b_simple is None and not any(t.steps_to_target is not None for t in trials):
            return ""
        return f"No fit: {folding.no_fit_reason(trials)}.{noise}"
    words = found.in_words(folding.single_context(trials))
    return (f"{words[:1].upper()}{words[1:]}; fitted to {found.points} global batch sizes "
            f"(R\u00b2 {found.r_squared:.2f}) under {lr_rule(params)}.{noise}")


def _point_rows(trials: List[Trial], quality: Quality = ACCURACY) -> List[Dict[str, str]]:
    """One row per point: its seeds, how they ended, and the mean and interval of its figures (a loss
    judged as the quality: its interval too); none for a sweep of single runs without a target or a
    noise scale (the runs table says it all)."""
    groups = analysis.replicates(trials)
    rows = []
    for key, members in groups.items():
        acc, loss = analysis.accuracy_interval(members), analysis.loss_interval(members)
        point = folding.fold(members)[0]
        time = folding.spread(members, "time_to_target_seconds")
        reached = [t for t in members if t.reached_target]
        rows.append({
            "point": key,
            "global": str(point.global_batch_size),
            "seeds": str(len(members)),
            "status": _statuses(members),
            "val acc [interval]": "-" if acc is None else acc.text(),
            "interval": "-" if acc is None else acc.how,
            **({} if quality.is_accuracy else {f"{quality.metric} [interval]": _interval_text(
                quality.interval(analysis.summarize(members)))}),
            "train loss [interval]": "-" if loss is None else loss.text(),
            "reached target": f"{len(reached)} of {len(members)}" if any(
                t.reached_target is not None for t in members) else "-",
            "steps to target": _fmt(point.steps_to_target, "{:.0f}"),
            "time to target s": "-" if time is None else f"{time[0]:.3g} ({time[1]:.3g}-{time[2]:.3g})",
            "B_simple": _fmt(point.gns_b_simple, "{:.1f}"),
        })
    if not quality.is_accuracy and not quality.user:
        # A language model: its rows lead with tokens/s and the judged loss, next-token accuracy after.
        lead = ("point", "tokens/s", f"{quality.metric} [interval]")
        for row, members in zip(rows, groups.values()):
            rate = folding.fold(members)[0].tokens_per_second
            row["tokens/s"] = _fmt(rate, "{:,.0f}")
        rows = [{**{k: r[k] for k in lead}, **{k: v for k, v in r.items() if k not in lead}} for r in rows]
    telling = any(len(m) > 1 for m in groups.values()) or any(
        r["B_simple"] != "-" or r["reached target"] != "-" for r in rows)
    return rows if telling else []


def judging(params: Dict[str, str], trials: Sequence[Trial] = ()) -> Tuple[Optional[float], float, Quality]:
    """(the quality's tolerance, report.confidence, the quality) as the sweep recorded them (its parent
    params: report.quality resolved over `trials`, its tolerance report.max_accuracy_drop or
    report.max_loss_rise), the defaults where it did not: the LR table and the recipes are judged by the
    recommendation's rule."""
    defaults = ReportConfig()

    def number(name: str, default: Optional[float]) -> Optional[float]:
        text = params.get(f"report_{name}")
        if text is None:
            return default
        try:
            return None if text in ("None", "null", "") else float(text)
        except ValueError:
            return default
    metric = params.get("report_quality_metric")
    named = metric if metric not in (None, "None", "") else params.get("report_quality", defaults.quality)
    found = resolve(named if named in QUALITIES or named == AUTO or metric == named else AUTO, list(trials))
    tolerance = number("max_accuracy_drop", defaults.max_accuracy_drop) if found.tolerance_key.endswith("drop") \
        else number("max_loss_rise", defaults.max_loss_rise)
    return tolerance, number("confidence", defaults.confidence), found


def lr_rows(trials: List[Trial], max_drop: Optional[float] = None, level: float = 0.95,
            quality: Quality = ACCURACY) -> List[Dict[str, str]]:
    """analysis.lr_table as rows: per global batch, the multipliers tried, the best and the largest
    that did not diverge, and (by `quality`, with `max_drop` in its units) which are certified within
    the tolerance of the best, which are unproven and which shown worse; none when the sweep tried one
    multiplier and nothing diverged."""
    table = analysis.lr_table(trials, max_drop=max_drop, level=level, quality=quality)
    if not any(len(row.multipliers) > 1 or row.diverged for row in table.values()):
        return []

    def listed(values) -> str:
        return ", ".join(f"{m:g}" for m in values) or "-"

    return [{
        "global": str(batch),
        "multipliers tried": listed(row.multipliers),
        f"best (by {row.metric})": "-" if row.best_multiplier is None else f"{row.best_multiplier:g}",
        row.metric: "-" if row.best_value is None else f"{row.best_value:.3f}",
        "largest not diverged": "-" if row.largest_stable is None else f"{row.largest_stable:g}",
        "diverged at": listed(row.diverged),
        **({} if not row.judged else {
            f"certified within {max_drop:g} of the best": listed(row.outcome("eligible")),
            "unproven": listed(row.outcome("unproven")),
            "shown worse": listed(row.outcome("excluded")),
            "not tested": listed(row.outcome("untested")),
        }),
    } for batch, row in table.items()]


def _interval_text(interval) -> str:
    return "-" if interval is None else f"{interval.text()} ({interval.how})"


def _statuses(members: List[Trial]) -> str:
    """"ok", or e.g. "2 ok, 1 diverged (nonfinite at step 12)"."""
    counts: Dict[str, int] = {}
    for t in members:
        what = t.status
        if t.status == "diverged" and t.diverged_reason:
            at = "" if t.diverged_at_step is None else f" at step {t.diverged_at_step}"
            what = f"diverged ({t.diverged_reason}{at})"
        counts[what] = counts.get(what, 0) + 1
    if len(counts) == 1 and len(members) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} {what}" for what, n in counts.items())


def _fmt(value: Optional[float], pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


_FRONTIER_METRIC = re.compile(r"^frontier_micro_batch_size_w(\d+)((?:_(?:fp32|bf16|fp16))?)((?:_ckpt)?)$")


def largest_micro_batches(trials: List[Trial], frontier: Dict[str, float]) -> List[Dict[str, str]]:
    """Per recipe and worker count, the largest micro-batch: the frontier search's
    (`frontier_micro_batch_size_w<N>[_<precision>][_ckpt]` on the parent run, with
    sweep.micro_batch_sizes=auto), else the largest one measured ok (and the smallest oom above it)."""
    found: Dict[Tuple[str, str, int], Dict[str, str]] = {}
    for name, value in frontier.items():
        match = _FRONTIER_METRIC.match(name)
        if match:
            recipe = (match.group(2)[1:] or "fp32", "blocks" if match.group(3) else "none")
            found[(*recipe, int(match.group(1)))] = {"largest micro-batch": f"{value:.0f}", "from": "frontier search"}
    for (precision, ckpt, workers), group in _by_recipe_and_workers(trials).items():
        if (precision, ckpt, workers) in found:
            continue
        ok = [t.micro_batch_size for t in group if t.status == "ok"]
        oom = [t.micro_batch_size for t in group if t.status == "oom" and (not ok or t.micro_batch_size > max(ok))]
        found[(precision, ckpt, workers)] = {
            "largest micro-batch": str(max(ok)) if ok else "-",
            "from": "largest ok point" + (f" (oom at {min(oom)})" if oom else " (none ran out of memory)"),
        }
    return [{"recipe": folding.recipe_label((p, c)), "workers": str(w), **row}
            for (p, c, w), row in sorted(found.items(), key=lambda kv: folding.recipe_order(kv[0][:2]) + (kv[0][2],))]



def _by_recipe_and_workers(trials: List[Trial]) -> Dict[Tuple[str, str, int], List[Trial]]:
    groups: Dict[Tuple[str, str, int], List[Trial]] = {}
    for t in trials:
        groups.setdefault((*folding.recipe(t), t.num_workers), []).append(t)
    return groups


def _recipe_sections(trials: List[Trial], frontier: Dict[str, float], max_drop: Optional[float] = 0.02,
                     level: float = 0.95, quality: Quality = ACCURACY) -> List[Section]:
    """When the sweep measured more than one recipe: the largest micro-batch per recipe, each recipe
    against fp32 without checkpointing (recipe_comparison.compare_recipes), and in words what checkpointing
    saved and whether a larger micro-batch with it beats accumulation at equal global batch."""
    compared = recipe_comparison.compare_recipes(trials, max_drop, level, quality)
    if not compared.rows:
        return []

    def signed(value: Optional[float], pattern: str) -> str:
        return "-" if value is None else pattern.format(value)

    rows = [{
        "recipe": folding.recipe_label((r.precision, r.checkpointing)),
        "layouts compared": str(r.layouts_compared),
        "throughput vs fp32": signed(r.throughput_delta, "{:+.0%}"),
        "val accuracy vs fp32": signed(None if r.accuracy_delta is None else r.accuracy_delta * 100,
                                       "{:+.1f} points"),
        "peak memory vs fp32": signed(r.memory_delta, "{:+.0%}"),
    } for r in sorted(compared.rows, key=lambda r: folding.recipe_order((r.precision, r.checkpointing)))
        if (r.precision, r.checkpointing) != recipe_comparison.BASELINE]
    return [
        ("Largest micro-batch per recipe", largest_micro_batches(trials, frontier)),
        ("Recipes against fp32 without checkpointing (same layouts, mean over seeds)", rows),
        (f"Recipes against fp32: {quality.word} by the recommendation's rule",
         "\n".join(s + "." for s in compared.verdicts)),
        ("Checkpointing: what it saved, and against accumulation", "\n".join(s + "." for s in compared.sentences)),
    ]

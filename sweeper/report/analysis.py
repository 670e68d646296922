"""From a sweep's trials to an answer: throughput knees, the throughput/memory front, the configuration to use.
Pure functions on plain values (standard library; PyYAML for the report only), tested without processes."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import yaml

from sweeper.errors import ConfigError
from sweeper.report.settings import LR_SCALING_RULES, OBJECTIVES, ReportConfig, check, invalid_choice

GiB = 2**30
# Accuracies this close (absolute, as fractions) are one result: a few held-out samples, not a real
# difference, so throughput decides between them.
ACCURACY_TIE = 0.005
MAX_RUNNERS_UP = 3


@dataclass(frozen=True)
class Trial:
    """One grid point's outcome, as the sweep recorded it (MLflow child run params and metrics)."""

    key: str  # e.g. "mb32-acc2-w1"
    micro_batch_size: int
    accumulation_steps: int
    num_workers: int
    global_batch_size: int
    status: str  # "ok" | "oom" | "failed"
    lr: Optional[float] = None
    samples_per_second: Optional[float] = None
    samples_per_second_cv: Optional[float] = None
    throughput_stable: Optional[bool] = None
    peak_memory_bytes: Optional[float] = None
    val_accuracy: Optional[float] = None
    train_seconds: Optional[float] = None  # wall time of its optimizer steps
    samples_seen: Optional[float] = None


@dataclass(frozen=True)
class Recommendation:
    """The answer for one objective; `best` is None when no trial was eligible, and `reason` says why."""

    best: Optional[Trial]
    runners_up: List[Trial]  # up to 3, best first
    reason: str  # one or two sentences with the measured numbers that decided it
    excluded: Dict[str, str]  # trial key -> why it was not eligible
    objective: str


# ---------------------------------------------------------------------------------------------------
# Knees and the Pareto front


def knee(points: Sequence[Tuple[int, float]], min_gain: float = 0.10) -> Optional[int]:
    """The micro-batch size past which a bigger micro-batch stops paying, or None.

    `points` are (micro_batch_size, samples_per_second) of one (accumulation, workers) series. Sorted
    by size, each step from s1 to s2 is scored as a gain per doubling of the micro-batch,
    `(t2 / t1) ** (1 / log2(s2 / s1)) - 1`, so a grid 16, 64 is judged like a grid 16, 32, 64 (a 21 %
    gain over 16 -> 64 is 10 % per doubling). The knee is the first s1 whose next step gains less than
    `min_gain` per doubling (a loss counts too). None when every step gains at least `min_gain`
    (throughput still climbing: try larger micro-batches) or with fewer than two points.
    """
    if min_gain < 0:
        raise ValueError(f"min_gain={min_gain} must be >= 0 (a fraction: 0.10 is 10 % per doubling)")
    ordered = sorted((int(size), float(rate)) for size, rate in points)
    for (s1, t1), (s2, t2) in zip(ordered, ordered[1:]):
        if s1 == s2:
            raise ValueError(f"micro_batch_size {s1} appears twice in one series: pass one throughput per size")
        if s1 <= 0 or t1 <= 0 or t2 <= 0:
            raise ValueError(
                f"knee needs positive sizes and throughputs, got ({s1}, {t1}) -> ({s2}, {t2}): "
                "leave out trials without a measured throughput"
            )
        gain_per_doubling = (t2 / t1) ** (1.0 / math.log2(s2 / s1)) - 1.0
        if gain_per_doubling < min_gain:
            return s1
    return None


def knees(trials: Iterable[Trial], min_gain: float = 0.10) -> Dict[Tuple[int, int], Optional[int]]:
    """`knee` of every (accumulation_steps, num_workers) series, over ok trials with a throughput.
    A series with a single measured size maps to None (no knee can be seen)."""
    series: Dict[Tuple[int, int], List[Tuple[int, float]]] = {}
    for trial in trials:
        if trial.status == "ok" and trial.samples_per_second is not None:
            series.setdefault((trial.accumulation_steps, trial.num_workers), []).append(
                (trial.micro_batch_size, trial.samples_per_second)
            )
    return {group: knee(points, min_gain) for group, points in sorted(series.items())}


def pareto(trials: Iterable[Trial]) -> List[Trial]:
    """Ok trials that no other ok trial beats on both throughput (higher) and peak memory (lower),
    sorted by peak memory. Trials missing either figure cannot be placed and are left out."""
    measured = [
        t
        for t in trials
        if t.status == "ok" and t.samples_per_second is not None and t.peak_memory_bytes is not None
    ]

    def dominated(t: Trial) -> bool:
        return any(
            o.samples_per_second >= t.samples_per_second
            and o.peak_memory_bytes <= t.peak_memory_bytes
            and (o.samples_per_second > t.samples_per_second or o.peak_memory_bytes < t.peak_memory_bytes)
            for o in measured
        )

    front = [t for t in measured if not dominated(t)]
    return sorted(front, key=lambda t: (t.peak_memory_bytes, -t.samples_per_second, t.key))


# ---------------------------------------------------------------------------------------------------
# Recommendation


def seconds_to_train(trial: Trial) -> Optional[float]:
    """Time to train the trial's sample budget. The steady-state rate is preferred over the wall
    clock: `train_seconds` also holds the warm-up steps (one of them memory-tracked, much slower) and
    any profiled steps, which a real training run does not repeat."""
    if trial.samples_seen is not None and trial.samples_per_second:
        return trial.samples_seen / trial.samples_per_second
    return trial.train_seconds


_METRIC_NAMES = {
    "throughput": "samples_per_second",
    "accuracy": "val_accuracy",
    "time_to_accuracy": "training time (samples_seen and samples_per_second, or train_seconds)",
}


def _has_metric(trial: Trial, objective: str) -> bool:
    if objective == "throughput":
        return trial.samples_per_second is not None
    if objective == "accuracy":
        return trial.val_accuracy is not None
    return seconds_to_train(trial) is not None


def _over_budget(trial: Trial, memory_budget_bytes: Optional[float]) -> Optional[str]:
    if memory_budget_bytes is None:
        return None
    if trial.peak_memory_bytes is None:
        # An unmeasured trial cannot be shown to fit, and recommending it could OOM the real run.
        return f"no peak_memory_bytes to check against {_budget_text(memory_budget_bytes)}"
    if trial.peak_memory_bytes > memory_budget_bytes:
        return (
            f"peak_memory_bytes {_bytes(trial.peak_memory_bytes)} over "
            f"{_budget_text(memory_budget_bytes)}"
        )
    return None


def _under_accuracy(trial: Trial, min_accuracy: Optional[float]) -> Optional[str]:
    if min_accuracy is None:
        return None
    if trial.val_accuracy is None:
        return f"no val_accuracy to check against report.min_accuracy={min_accuracy:g}"
    if trial.val_accuracy < min_accuracy:
        return f"val_accuracy {trial.val_accuracy:.3f} under report.min_accuracy={min_accuracy:g}"
    return None


def _check_inputs(
    objective: str,
    min_accuracy: Optional[float],
    memory_budget_bytes: Optional[float],
    max_accuracy_drop: Optional[float] = None,
) -> None:
    budget_gb = None if memory_budget_bytes is None else memory_budget_bytes / GiB
    settings = ReportConfig(objective, min_accuracy, max_accuracy_drop, budget_gb)
    # The objective is named as this function's argument, the limits as the report.* settings users give.
    problems = check(settings, key=lambda name: name if name == "objective" else f"report.{name}")
    if problems:
        raise ConfigError(problems)


def recommend(
    trials: Iterable[Trial],
    objective: str = "throughput",
    min_accuracy: Optional[float] = None,
    memory_budget_bytes: Optional[float] = None,
    max_accuracy_drop: Optional[float] = None,
) -> Recommendation:
    """The best trial for `objective` among the eligible ones, up to three runners-up, and why.

    Eligible: status "ok", the objective's metric measured, `peak_memory_bytes` within
    `memory_budget_bytes` and `val_accuracy` at least `min_accuracy` (each when given; a trial
    without the figure cannot satisfy the constraint). An unstable throughput stays eligible and is
    noted in the reason. With `max_accuracy_drop` (throughput and time_to_accuracy), a trial whose
    val_accuracy is more than that below the best eligible one's is left out too: a layout that
    trains fast but learns less from the same samples is not a better way to train. When some
    eligible trials measured accuracy, those without it are left out as well (nothing to compare);
    when none did (synthetic data), the guard does not apply. Objectives:

    - "throughput": highest samples_per_second.
    - "accuracy": highest val_accuracy; accuracies within 0.005 of each other are a tie that
      throughput breaks.
    - "time_to_accuracy": accuracy is measured once, after training, so this is the shortest time to
      train the sample budget (samples_seen / samples_per_second, else train_seconds) among trials
      reaching `min_accuracy`, which is required.
    """
    _check_inputs(objective, min_accuracy, memory_budget_bytes, max_accuracy_drop)
    trials = list(trials)

    excluded: Dict[str, str] = {}
    eligible: List[Trial] = []
    for trial in trials:
        if trial.status != "ok":
            excluded[trial.key] = f"status {trial.status}"
            continue
        problems = [] if _has_metric(trial, objective) else [f"no {_METRIC_NAMES[objective]}"]
        for problem in (_over_budget(trial, memory_budget_bytes), _under_accuracy(trial, min_accuracy)):
            if problem:
                problems.append(problem)
        if problems:
            excluded[trial.key] = "; ".join(problems)
        else:
            eligible.append(trial)

    if not eligible:
        return Recommendation(None, [], _nobody_reason(trials, objective, min_accuracy, memory_budget_bytes),
                              excluded, objective)

    dropped: List[Trial] = []
    top: Optional[Trial] = None
    if max_accuracy_drop is not None and objective != "accuracy":
        eligible, dropped, top = _within_accuracy_drop(eligible, max_accuracy_drop, excluded)
    ranked = _rank(eligible, objective)
    best, runners_up = ranked[0], ranked[1 : 1 + MAX_RUNNERS_UP]
    reason = _winner_reason(best, ranked, objective, min_accuracy)
    # The trials the objective alone would have preferred: the reason says why they lost.
    in_order = _rank([*dropped, best], objective)
    passed_over = in_order[: in_order.index(best)]
    if passed_over:
        reason += " " + _accuracy_drop_note(passed_over, max_accuracy_drop, top)
    return Recommendation(best, runners_up, reason, excluded, objective)


def _within_accuracy_drop(
    eligible: List[Trial], max_drop: float, excluded: Dict[str, str]
) -> Tuple[List[Trial], List[Trial], Optional[Trial]]:
    """(kept, dropped, the most accurate): the eligible trials within `max_drop` of the best
    val_accuracy among them, and the rest, each noted in `excluded`. All kept when none measured
    accuracy."""
    measured = [t for t in eligible if t.val_accuracy is not None]
    if not measured:
        return eligible, [], None
    top = max(measured, key=lambda t: (t.val_accuracy, t.key))
    kept, dropped = [], []
    for trial in eligible:
        if trial.val_accuracy is None:
            excluded[trial.key] = "no val_accuracy to compare with the best (report.max_accuracy_drop)"
            dropped.append(trial)
        # The epsilon keeps decimal edges exact, as in _tie_group.
        elif trial.val_accuracy < top.val_accuracy - max_drop - 1e-12:
            excluded[trial.key] = (
                f"val_accuracy {trial.val_accuracy:.3f} is more than report.max_accuracy_drop={max_drop:g} "
                f"below the best, {top.val_accuracy:.3f} ({top.key})"
            )
            dropped.append(trial)
        else:
            kept.append(trial)
    return kept, dropped, top


def _accuracy_drop_note(passed_over: List[Trial], max_drop: float, top: Trial) -> str:
    shown = passed_over[:MAX_RUNNERS_UP]
    listed = ", ".join(
        f"{t.key} ({_rate_text(t)}, val_accuracy {'-' if t.val_accuracy is None else f'{t.val_accuracy:.3f}'})"
        for t in shown
    )
    more = f" and {len(passed_over) - len(shown)} more" if len(passed_over) > len(shown) else ""
    below = f"more than report.max_accuracy_drop={max_drop:g} below the best ({top.val_accuracy:.3f}, {top.key})"
    lead = f"Not recommended although faster: {listed}{more}: their accuracy is {below}"
    if any(t.val_accuracy is None for t in passed_over):
        return f"{lead} or was not measured."
    return f"{lead}, so they learn less from the same samples."


def _rank(eligible: List[Trial], objective: str) -> List[Trial]:
    # The key is the last sort criterion everywhere, so equal figures give the same answer every run.
    if objective == "throughput":
        return sorted(eligible, key=lambda t: (-t.samples_per_second, t.key))
    if objective == "time_to_accuracy":
        return sorted(eligible, key=lambda t: (seconds_to_train(t), t.key))
    # "Within 0.005" is not transitive, so the order is built greedily: take the most accurate
    # remaining trial's tie group, pick its fastest member, repeat.
    remaining = sorted(eligible, key=lambda t: t.key)
    ranked: List[Trial] = []
    while remaining:
        pick = min(_tie_group(remaining), key=lambda t: (-_rate(t), -t.val_accuracy, t.key))
        ranked.append(pick)
        remaining.remove(pick)
    return ranked


def _tie_group(trials: List[Trial]) -> List[Trial]:
    """The trials whose val_accuracy is within ACCURACY_TIE of the most accurate one."""
    top = max(t.val_accuracy for t in trials)
    # The epsilon keeps decimal ties exact: 0.962 - 0.005 is not 0.957 in binary floating point.
    return [t for t in trials if t.val_accuracy >= top - ACCURACY_TIE - 1e-12]


def _rate(trial: Trial) -> float:
    return trial.samples_per_second if trial.samples_per_second is not None else -math.inf


def _winner_reason(best: Trial, ranked: List[Trial], objective: str, min_accuracy: Optional[float]) -> str:
    n = len(ranked)
    other = ranked[1] if n > 1 else None
    notes: List[str] = []
    if objective == "throughput":
        decided = (
            f"{best.key} has the highest throughput of {n} eligible trial{'s' if n > 1 else ''}: "
            f"{best.samples_per_second:.1f} samples/s{_at_memory(best)}"
        )
        if other is not None:
            decided += f" (next: {other.key}, {other.samples_per_second:.1f} samples/s)"
            gap = _relative_gap(best.samples_per_second, other.samples_per_second)
            notes += _noise_note(best, other, gap, "throughput")
    elif objective == "accuracy":
        group = _tie_group(ranked)
        rivals = [t for t in group if t is not best]
        if rivals and best.samples_per_second is not None:
            # The tie was broken by throughput: show it against the fastest of the others it tied with.
            rival = max(rivals, key=lambda t: (_rate(t), t.val_accuracy))
            top = max(group, key=lambda t: t.val_accuracy)
            if top.val_accuracy > best.val_accuracy:
                standing = (
                    f"{best.key} has val_accuracy {best.val_accuracy:.3f}, within {ACCURACY_TIE} of the best "
                    f"({top.val_accuracy:.3f}, {top.key}), and is the fastest of that tie"
                )
            else:
                standing = (
                    f"{best.key} has the highest val_accuracy ({best.val_accuracy:.3f}) and is the fastest of "
                    f"the trials within {ACCURACY_TIE} of it"
                )
            decided = (
                f"{standing}: {_rate_text(best)} vs {_rate_text(rival)} for {rival.key} ({rival.val_accuracy:.3f})"
            )
            if best.samples_per_second is not None and rival.samples_per_second is not None:
                gap = _relative_gap(best.samples_per_second, rival.samples_per_second)
                notes += _noise_note(best, rival, gap, "throughput")
        else:
            decided = (
                f"{best.key} has the highest val_accuracy of {n} eligible trial{'s' if n > 1 else ''}: "
                f"{best.val_accuracy:.3f} at {_rate_text(best)}"
            )
            if other is not None:
                decided += f" (next: {other.key}, {other.val_accuracy:.3f})"
    else:
        seconds = seconds_to_train(best)
        decided = (
            f"{best.key} trains its budget the fastest of {n} trial{'s' if n > 1 else ''} reaching "
            f"report.min_accuracy={min_accuracy:g}: {seconds:.1f} s{_samples_text(best)}, "
            f"val_accuracy {best.val_accuracy:.3f}"
        )
        if other is not None:
            other_seconds = seconds_to_train(other)
            decided += f" (next: {other.key}, {other_seconds:.1f} s)"
            # Measured against the slower time, this gap is the throughput gap when the budgets match.
            notes += _noise_note(best, other, _relative_gap(other_seconds, seconds), "training time")
    if best.throughput_stable is False:
        notes.insert(0, "its throughput was unstable (the last timing windows disagreed, so the figure is the "
                        "median of all windows): re-measure before relying on it")
    sentences = decided + "."
    if notes:
        sentences += " " + _capitalize("; ".join(notes)) + "."
    return sentences


def _relative_gap(larger: float, smaller: float) -> float:
    return (larger - smaller) / larger if larger > 0 else math.inf


def _noise_note(best: Trial, other: Trial, gap: float, what: str) -> List[str]:
    """'within noise' when the winner's relative margin over `other` is no larger than the
    window-to-window spread (cv) either of them measured: a re-run could swap them."""
    spreads = [cv for cv in (best.samples_per_second_cv, other.samples_per_second_cv) if cv is not None]
    if not spreads:
        return []
    spread = max(spreads)
    if gap > spread:
        return []
    return [
        f"{other.key} is within noise: the {what} gap ({gap:.1%}) is within the measured spread "
        f"(cv {spread:.1%}), so either will do"
    ]


def _nobody_reason(
    trials: List[Trial], objective: str, min_accuracy: Optional[float], memory_budget_bytes: Optional[float]
) -> str:
    # The constraints are applied in a fixed order; the reason names the one that removed the last
    # candidates, with the closest miss, since that is the constraint a user would relax.
    if not trials:
        return "no trials to choose from"
    ok = [t for t in trials if t.status == "ok"]
    if not ok:
        counts = Counter(t.status for t in trials)
        listed = ", ".join(f"{count} {status}" for status, count in sorted(counts.items(), key=lambda x: (-x[1], x[0])))
        return f"no trial finished ok: {listed}"
    measured = [t for t in ok if _has_metric(t, objective)]
    if not measured:
        hint = " (synthetic data has none)" if objective == "accuracy" else ""
        return f"no ok trial has {_METRIC_NAMES[objective]}{hint}"
    fitting = [t for t in measured if _over_budget(t, memory_budget_bytes) is None]
    if not fitting:
        with_memory = [t for t in measured if t.peak_memory_bytes is not None]
        if not with_memory:
            return f"no ok trial has a peak_memory_bytes to check against {_budget_text(memory_budget_bytes)}"
        smallest = min(with_memory, key=lambda t: (t.peak_memory_bytes, t.key))
        return (
            f"no ok trial fits {_budget_text(memory_budget_bytes)}: "
            f"the smallest peak was {_bytes(smallest.peak_memory_bytes)} ({smallest.key})"
        )
    within = " within report.memory_budget_gb" if memory_budget_bytes is not None else ""
    with_accuracy = [t for t in fitting if t.val_accuracy is not None]
    if not with_accuracy:
        return f"no ok trial{within} has a val_accuracy to check against report.min_accuracy={min_accuracy:g}"
    closest = max(with_accuracy, key=lambda t: (t.val_accuracy, t.key))
    return (
        f"no ok trial{within} reached report.min_accuracy={min_accuracy:g} "
        f"(best was {closest.val_accuracy:.3f}, {closest.key})"
    )


def _at_memory(trial: Trial) -> str:
    return f" at peak memory {_bytes(trial.peak_memory_bytes)}" if trial.peak_memory_bytes is not None else ""


def _rate_text(trial: Trial) -> str:
    if trial.samples_per_second is None:
        return "unmeasured throughput"
    return f"{trial.samples_per_second:.1f} samples/s"


def _samples_text(trial: Trial) -> str:
    if trial.samples_seen is not None and trial.samples_per_second:
        return f" for {trial.samples_seen:.0f} samples at {trial.samples_per_second:.1f} samples/s"
    return " of wall-clock training"


def _budget_text(memory_budget_bytes: float) -> str:
    # The key's own value so it can be copied back, then the size in bytes' units.
    return f"report.memory_budget_gb={memory_budget_bytes / 2**30:g} ({_bytes(memory_budget_bytes)})"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


# ---------------------------------------------------------------------------------------------------
# Output: a command line and a YAML report


def override_line(best: Trial, lr_scaling: Optional[str] = None) -> str:
    """Hydra overrides that train `best`'s configuration, to append to the sweep's own command line.

    `train.lr` is the LR the trial trained with, already scaled by the sweep's `lr_scaling` rule for
    its global batch. Scaling it again would change it, so unless the sweep's rule is known to be
    "none" (`lr_scaling`; None: unknown) the line also sets `train.lr_scaling=none`. The LR is left
    out when the trial did not record one.
    """
    problem = None if lr_scaling is None else invalid_choice("lr_scaling", lr_scaling, LR_SCALING_RULES)
    if problem:
        raise ValueError(problem)
    parts = [
        f"sweep.micro_batch_sizes=[{best.micro_batch_size}]",
        f"sweep.accumulation_steps=[{best.accumulation_steps}]",
        f"sweep.num_workers=[{best.num_workers}]",
    ]
    if best.lr is not None:
        # repr: the shortest text that reads back as the same float, so the run uses the exact LR.
        parts.append(f"train.lr={float(best.lr)!r}")
        if lr_scaling != "none":
            parts.append("train.lr_scaling=none")
    return " ".join(parts)


def _figures(trial: Trial) -> Dict[str, object]:
    # Plain Python types only: figures read back from MLflow or numpy would make safe_dump fail.
    def num(value: Optional[float]) -> Optional[float]:
        return None if value is None else float(value)

    return {
        "key": trial.key,
        "samples_per_second": num(trial.samples_per_second),
        "samples_per_second_cv": num(trial.samples_per_second_cv),
        "throughput_stable": None if trial.throughput_stable is None else bool(trial.throughput_stable),
        "peak_memory_bytes": _byte_count(trial.peak_memory_bytes),
        "val_accuracy": num(trial.val_accuracy),
        "seconds_to_train": num(seconds_to_train(trial)),
    }


def _byte_count(value: Optional[float]) -> Optional[float]:
    # Whole bytes read back as an int (2147483648, not 2147483648.0), as a person would write them.
    if value is None:
        return None
    return int(value) if float(value).is_integer() else float(value)


def recommendation_yaml(
    rec: Recommendation,
    objective: Optional[str] = None,
    min_accuracy: Optional[float] = None,
    memory_budget_bytes: Optional[float] = None,
    max_accuracy_drop: Optional[float] = None,
) -> str:
    """A small YAML report of `rec`: the objective and constraints, the chosen configuration with its
    measured figures and a Hydra override line, the reason, the runners-up and the excluded trials.
    With no eligible trial, `recommendation: null` and the reason. `objective` defaults to
    `rec.objective` and must agree with it."""
    objective = rec.objective if objective is None else objective
    if objective != rec.objective:
        raise ValueError(f"objective {objective!r} does not match the recommendation's {rec.objective!r}")
    doc: Dict[str, object] = {
        "objective": objective,
        "constraints": {
            "min_accuracy": None if min_accuracy is None else float(min_accuracy),
            "memory_budget_bytes": _byte_count(memory_budget_bytes),
            "max_accuracy_drop": None if max_accuracy_drop is None else float(max_accuracy_drop),
        },
    }
    best = rec.best
    if best is None:
        doc["recommendation"] = None
    else:
        chosen: Dict[str, object] = {
            "key": best.key,
            "micro_batch_size": int(best.micro_batch_size),
            "accumulation_steps": int(best.accumulation_steps),
            "num_workers": int(best.num_workers),
            "global_batch_size": int(best.global_batch_size),
            "lr": None if best.lr is None else float(best.lr),
        }
        chosen.update(_figures(best))
        chosen["overrides"] = override_line(best)
        doc["recommendation"] = chosen
    doc["reason"] = rec.reason
    doc["runners_up"] = [_figures(t) for t in rec.runners_up]
    doc["excluded"] = dict(rec.excluded)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000)


__all__ = [
    "ACCURACY_TIE",
    "OBJECTIVES",
    "Recommendation",
    "Trial",
    "knee",
    "knees",
    "override_line",
    "pareto",
    "recommend",
    "recommendation_yaml",
    "seconds_to_train",
]

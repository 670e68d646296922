"""The answer at a glance: the recommendation as a headline of at most three lines of 120 characters (the
point, its speed-up over the most accurate point, the device-hours its budget costs, its quality gap with
interval, the override line) and a small table of the alternatives (point, throughput, gap [interval],
verdict, seeds that would settle it), printed by the console and shown in the report. The full reasoning
stays in the report's "Why" and the YAML. Pure (stdlib; scipy.stats via report.stats)."""

from __future__ import annotations

import math
import textwrap
from typing import Callable, Dict, List, Optional, Tuple

from sweeper import stats
from sweeper.report.noninferiority import Gap, judge_gap, one_sided
from sweeper.report.quality import Quality, judged_by
from sweeper.report.reasons import rate
from sweeper.report.trials import PointSummary, Recommendation, seconds_to_train

WIDTH = 120  # characters per line
MAX_ROWS = 6  # the recommended point and up to five alternatives
VERDICTS = {"eligible": "certified", "unproven": "unproven", "excluded": "worse", "untested": "not tested"}


# The run the answer configures (report.run_samples): its words by detail (report/projection.run_words: 2, 1, 0;
# -1 names train.samples inline for when the run's override line does not fit), and the run's override line.
RunWords = Tuple[Callable[[int], Optional[str]], str]


def headline(rec: Recommendation, line: Optional[str],
             glance: Optional[Tuple[List[str], Optional[str]]] = None,
             run: Optional[RunWords] = None) -> List[str]:
    """The answer in at most 3 lines of WIDTH characters: what to train and why in figures, then the
    override line (wrapped at its spaces). Details are dropped, least useful first, until it fits; an
    override line that alone takes 3 lines is kept whole (it must be copied). `glance` (a branch sweep's:
    report/branched.glance) replaces the sentences, most detailed first, and the override line: one answer,
    the schedule or the constant layout, per sweep. `run` puts the run's time, device-hours and price and the
    sweep's share of it in place of the budget's device-hours, with the run's override line (train.samples: the
    LR schedule over the run); at the least detail the quality gives way to it (the table below the headline has
    it), and last the sweep's own line with train.samples named in the sentence."""
    if rec.best is None:
        lines = _wrap(f"No recommendation: {rec.reason}")
        # The full reason is the report's "Why"; three lines say what happened.
        return lines if len(lines) <= 3 else lines[:2] + [textwrap.shorten(lines[2], WIDTH - 6) + " [...]"]
    quality = judged_by(rec)
    best = rec.points[rec.best.key]
    if glance is not None:
        tries = [(text, glance[1]) for text in glance[0]]
    elif run is not None:
        tries = [(_sentence(rec, best, quality, detail, run[0]), run[1]) for detail in (2, 1, 0, -1)]
        tries.append((f"Train {best.key}: {run[0](-1)}", line))
    else:
        tries = [(_sentence(rec, best, quality, detail), line) for detail in (2, 1, 0)]
    for i, (text, shown) in enumerate(tries):
        override = _wrap(f"Overrides: {shown}") if shown else []
        sentence = _wrap(text)
        # The run's own line is tried only while the whole fits; the sweep's line, as ever, is kept whole.
        whole = run is not None and i < len(tries) - 1
        if len(sentence) <= (3 - len(override) if whole else max(1, 3 - len(override))):
            return sentence + override
    room = max(1, 3 - len(override))
    if run is not None:  # the run's figures are cut short rather than the line that must be copied
        sentence = sentence[:room - 1] + [textwrap.shorten(" ".join(sentence[room - 1:]), WIDTH, placeholder=" ...")]
    return sentence + override


def _wrap(text: str) -> List[str]:
    return textwrap.wrap(text, WIDTH, break_on_hyphens=False, break_long_words=False)


def _sentence(rec: Recommendation, best: PointSummary, quality: Quality, detail: int,
              run: Optional[Callable[[int], Optional[str]]] = None) -> str:
    """'Train mb32-acc1-w1: 1.50x the speed of the most accurate (mb16-acc1-w1); 0.0012 device-hours (1 x 4 s);
    gap -0.010 [-0.015, -0.005] certified'; `detail` 2 names the most accurate point and the budget's workers and
    seconds, 1 the workers and seconds, 0 neither; with `run`, its words at that detail instead of the budget's,
    and at -1 without the quality."""
    top = most_accurate(rec)
    mine = rec.classes.get(best.key, best)
    if top is None:
        standing = f"{_speed(best)}"
    elif mine.key == rec.top:
        standing = "the best class's fastest layout" if mine.key != best.key else f"the {quality.most('point')}"
    else:
        standing = f"{rate(best.trial) / rate(top.trial):.2f}x the speed of the {quality.most()}" + (
            f" ({top.key})" if detail >= 2 else "")
    parts = [device_hours(best, detail >= 1) if run is None else run(max(detail, 0))]
    # At the least detail (detail -1, with a run) the run's figures go before the quality's: the alternatives'
    # table under the headline shows the gap.
    if detail >= 0:
        parts.append(_quality_part(rec, best, mine, quality))
    return f"Train {best.key}: " + "; ".join(p for p in [standing, *parts] if p)


def _quality_part(rec: Recommendation, best: PointSummary, mine: PointSummary, quality: Quality) -> Optional[str]:
    if rec.top is None or mine.key == rec.top:
        return f"{quality.metric} {quality.text(mine, rec.level)}"
    gap = rec.gaps.get(best.key)
    if gap is not None and gap.interval is not None:
        return f"gap {gap_text(gap.interval, quality)} certified"
    return None


def most_accurate(rec: Recommendation) -> Optional[PointSummary]:
    """The fastest point of the best class (the most accurate point when each point is its own class)."""
    if rec.top is None:
        return None
    members = [p for k, p in rec.points.items() if rec.classes.get(k, p).key == rec.top]
    return max(members, key=lambda p: (rate(p.trial), p.key)) if members else None


def _speed(point: PointSummary) -> str:
    if point.trial.tokens_per_second is not None:
        return f"{rate(point.trial):,.0f} tokens/s"
    return f"{rate(point.trial):.1f} samples/s"


def device_hours(point: PointSummary, detail: bool = True) -> Optional[str]:
    """What its sample budget costs: workers x the time to train it, in device-hours."""
    seconds = seconds_to_train(point.trial)
    if not seconds:
        return None
    workers = point.trial.num_workers
    hours = workers * seconds / 3600.0
    # Two significant figures without an exponent: 0.0012, 0.000016, 3.4.
    digits = max(1, 1 - math.floor(math.log10(hours))) if hours > 0 else 1
    return f"{hours:.{digits}f} device-hours" + (f" ({workers} x {seconds:,.3g} s)" if detail else "")


def gap_text(interval: stats.Interval, quality: Quality) -> str:
    g = quality.shown(interval)
    return f"{g.mean:+.3f} [{g.low:+.3f}, {g.high:+.3f}]"


def alternatives(rec: Recommendation, chosen_word: str = "recommended") -> List[Dict[str, str]]:
    """The recommended point and up to MAX_ROWS - 1 others, fastest first, with the most accurate point
    always among them: point, throughput, gap [interval] to the best class, verdict, seeds to settle it.
    `chosen_word`: the recommended point's verdict (a branch sweep whose answer is a schedule names it so)."""
    if rec.best is None:
        return []
    quality = judged_by(rec)
    best, top = rec.points[rec.best.key], most_accurate(rec)
    others = sorted((p for p in rec.points.values() if p is not best), key=lambda p: (-rate(p.trial), p.key))
    chosen = [best] + others[: MAX_ROWS - 1]
    if top is not None and top not in chosen:
        chosen[-1] = top
    tokens = best.trial.tokens_per_second is not None
    return [_row(rec, p, quality, p is best, tokens, chosen_word) for p in chosen]


def _top_summary(rec: Recommendation) -> Optional[PointSummary]:
    return next((c for k, p in rec.points.items() for c in [rec.classes.get(k, p)] if c.key == rec.top), None)


def _judged(rec: Recommendation, point: PointSummary) -> Optional[Gap]:
    """The point's gap to the best class: the guard's, else (objective accuracy, or no tolerance) the same
    judgement at the tie floor, shown but not applied."""
    if point.key in rec.gaps:
        return rec.gaps[point.key]
    top, mine = _top_summary(rec), rec.classes.get(point.key)
    if top is None or mine is None or mine is top:
        return None
    quality = judged_by(rec)
    return judge_gap(mine, top, quality.tie_floor, rec.level, quality)


def _row(rec: Recommendation, point: PointSummary, quality: Quality, chosen: bool, tokens: bool,
         chosen_word: str) -> Dict[str, str]:
    speed = rate(point.trial)
    gap = _judged(rec, point)
    mine = rec.classes.get(point.key, point)
    verdict, settle = (chosen_word if chosen else _verdict(rec, point, gap)), "-"
    if gap is not None and gap.interval is not None:
        shown = gap_text(gap.interval, quality)
        if gap.outcome == "unproven" and point.key in rec.gaps:
            settle = _settle(rec, gap.interval)
    elif rec.top is not None and mine.key == rec.top:
        shown = "best" if mine.key == point.key else "best (class)"
    else:
        shown = "-"
    return {
        "point": point.key,
        "tokens/s" if tokens else "samples/s": "-" if speed == float("-inf") else (
            f"{speed:,.0f}" if tokens else f"{speed:.1f}"),
        f"{quality.metric} gap [interval]": shown,
        "verdict": verdict,
        "seeds to settle": settle,
    }


def _verdict(rec: Recommendation, point: PointSummary, gap: Optional[Gap]) -> str:
    status = point.trial.status
    if status != "ok":
        return status.replace("_", " ")
    mine = rec.classes.get(point.key, point)
    best_class = rec.classes.get(rec.best.key, rec.points[rec.best.key])
    if mine.key != point.key and mine is best_class:
        return "same model, slower"
    quality = judged_by(rec)
    top_words = quality.most()
    if rec.top is not None and mine.key == rec.top:
        return top_words if point is most_accurate(rec) else f"same model as the {top_words}"
    if point.key in rec.excluded and point.key not in rec.gaps:
        return "not eligible"
    if point.key in rec.gaps:
        return VERDICTS[gap.outcome] + (", slower" if gap.outcome == "eligible" else "")
    if gap is not None:  # judged at the tie floor, for the table only
        worse = "less accurate" if quality.is_accuracy else f"worse by {quality.metric}"
        return {"eligible": "tie", "untested": "not tested", "unproven": "not a tie"}.get(gap.outcome, worse)
    return "-"


def _settle(rec: Recommendation, interval: stats.Interval) -> str:
    drop = rec.tolerance
    if drop is None or interval.sd is None:
        return "more than 1"  # one seed: no spread to extrapolate
    n = stats.seeds_to_settle(interval, -drop, one_sided(rec.level))
    return ">1000" if n is None else str(n)


def table_text(rows: List[Dict[str, str]]) -> str:
    """The rows as a plain-text table (console, MLflow tag): columns padded, numbers right-aligned."""
    if not rows:
        return ""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    left = {"point", "verdict"}

    def cell(c: str, text: str) -> str:
        return text.ljust(widths[c]) if c in left else text.rjust(widths[c])
    lines = ["  ".join(cell(c, c) for c in columns).rstrip()]
    lines += ["  ".join(cell(c, r[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)

"""Answer repeatability: the README demo (`+experiment=resnet_batch`) run with two disjoint seed sets,
each sweep from scratch in its own folder; prints both recommendations, each set's eligible / unproven /
excluded points with the interval of their accuracy gap to the best, and the tolerance each set can
certify for its fastest point. Goal: never two different *certified* answers.

    python scripts/bench_answer_repro.py [--seeds-a 0,1,2] [--seeds-b 3,4,5] [--quick]
        [--out .sweeper/bench_answer_repro] [--only A|B] [--show] [-- Hydra overrides]

On a busy machine, `--only A` and `--only B` side by side, then `--show`, take about half the time.

--quick (train.epochs=1) is a smoke check of the script, not the demo's answer. The judgement is the
report's own (`recommend` at the sweep's recorded report settings), rebuilt from each MLflow store.
"""

from __future__ import annotations

import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, List, Tuple

from _sweeps import parser, run_sweep, start

DEFAULT = ["+experiment=resnet_batch"]
QUICK = ["train.epochs=1"]


def main() -> None:
    options = parser(__doc__, ".sweeper/bench_answer_repro", DEFAULT)
    options.add_argument("--seeds-a", default="0,1,2")
    options.add_argument("--seeds-b", default="3,4,5")
    options.add_argument("--quick", action="store_true", help="train.epochs=1: a smoke check of the script")
    options.add_argument("--show", action="store_true", help="do not sweep: read the sweeps already in --out")
    options.add_argument("--only", choices=("A", "B"), help="sweep this set only (two such runs can go side by "
                         "side; then --show prints both)")
    args = options.parse_args()
    if args.show or args.only:
        out, overrides = Path(args.out).resolve(), list(args.overrides or DEFAULT)
        print(f"config: {' '.join(overrides)}")
    else:
        out, overrides = start(args, DEFAULT)
    if args.quick:
        overrides += QUICK
    sets = {"A": args.seeds_a, "B": args.seeds_b}
    if set(args.seeds_a.split(",")) & set(args.seeds_b.split(",")):
        sys.exit(f"--seeds-a {args.seeds_a} and --seeds-b {args.seeds_b} share seeds: give disjoint sets")

    answers: Dict[str, Tuple[str, bool]] = {}
    started = time.perf_counter()
    for name, seeds in sets.items():
        folder = out / f"seeds_{name}"
        if args.only and name != args.only:
            continue
        if args.only:
            shutil.rmtree(folder, ignore_errors=True)
        wall = 0.0 if args.show else run_sweep(folder, [*overrides, f"sweep.seeds=[{seeds}]"])
        print(f"\n== set {name}: sweep.seeds=[{seeds}] ({wall:.0f} s)")
        try:
            answers[name] = show(folder)
        except Exception:  # the sweep's store is kept: --show reads it again
            traceback.print_exc()
            answers[name] = ("unread", False)
        sys.stdout.flush()
    print()
    if args.only:
        print(f"wall_seconds: {time.perf_counter() - started:.0f}")
        return
    (a, a_certified), (b, b_certified) = answers["A"], answers["B"]
    if a == b:
        verdict = f"same answer: {a}"
    elif a_certified and b_certified:
        verdict = f"TWO DIFFERENT CERTIFIED ANSWERS: {a} vs {b}"
    else:
        verdict = f"different answers, not both certified: A {a} ({_kind(a_certified)}), B {b} ({_kind(b_certified)})"
    print(f"verdict: {verdict}")
    print(f"wall_seconds: {time.perf_counter() - started:.0f}")


def _kind(certified: bool) -> str:
    return "certified faster than the best" if certified else "the most accurate point itself"


def show(folder: Path) -> Tuple[str, bool]:
    """Print one sweep's answer; returns (the recommended point, whether it is a faster point the data
    certify within the tolerance, as opposed to the most accurate point itself)."""
    from sweeper import tracking
    from sweeper.report import analysis, noninferiority
    from sweeper.report.recorded import recorded_settings, trials_of

    sweep = tracking.SweepReader.of(f"sqlite:///{folder / 'mlflow.db'}", "sweeper").load()
    cfg = recorded_settings(sweep.params)
    trials = trials_of(sweep)
    rec = analysis.recommend(trials, cfg.objective, cfg.min_accuracy, None, cfg.max_accuracy_drop,
                             level=cfg.confidence)
    points = list(rec.points.values())
    measured = [p for p in points if p.key not in rec.excluded or p.key in rec.unproven
                or "max_accuracy_drop" in rec.excluded[p.key]]
    top = max((p for p in measured if p.trial.val_accuracy is not None),
              key=lambda p: (p.trial.val_accuracy, p.key), default=None)
    drop = cfg.max_accuracy_drop
    print(f"report: objective={cfg.objective} max_accuracy_drop={drop} confidence={cfg.confidence}")
    best = rec.best.key if rec.best else "none"
    print(f"recommendation: {best}" + (f" (global batch {rec.best.global_batch_size}, "
                                       f"{rec.best.samples_per_second:.1f} samples/s)" if rec.best else ""))
    if top is not None:
        print(f"most accurate: {top.key} val_accuracy {_acc(top)}")
    rows: List[Tuple[float, str]] = []
    for p in points:
        rate = p.trial.samples_per_second or 0.0
        outcome, gap = _outcome(p, top, rec, drop, cfg.confidence)
        rows.append((-rate, f"  {p.key:<14} {rate:7.1f} samples/s  acc {_acc(p):<24} {outcome:<9} {gap}"))
    for _, line in sorted(rows):
        print(line)
    certified = rec.best is not None and top is not None and rec.best.key != top.key
    fastest = max((p for p in points if p.trial.status == "ok" and p.trial.samples_per_second),
                  key=lambda p: p.trial.samples_per_second, default=None)
    if top is not None and fastest is not None and fastest is not top and drop is not None:
        gap = analysis.judge_gap(fastest, top, drop, cfg.confidence)
        if gap.interval is not None:
            print(f"certifiable: the fastest point, {fastest.key}, is within "
                  f"{noninferiority.certifying_drop(gap.interval) * 100:.1f} "
                  f"points of the best at {cfg.confidence:.0%} (tolerance {drop * 100:g} points: {gap.outcome})")
    for key, why in rec.unproven.items():
        print(f"unproven: {key}: {why}")
    print(f"reason: {rec.reason}")
    return best, certified


def _acc(p) -> str:
    if p.trial.val_accuracy is None:
        return "-"
    if p.accuracy is None:
        return f"{p.trial.val_accuracy:.3f}"
    return f"{p.trial.val_accuracy:.3f} [{p.accuracy.low:.3f}, {p.accuracy.high:.3f}]"


def _outcome(p, top, rec, drop, level) -> Tuple[str, str]:
    from sweeper.report import analysis

    if p.key in rec.unproven:
        kind = "unproven"
    elif p.key in rec.excluded:
        kind = "excluded"
    else:
        kind = "eligible"
    if top is None or p is top or drop is None or p.trial.val_accuracy is None or p.trial.status != "ok":
        return kind, ("(the best)" if p is top else "" if kind == "eligible" else rec.excluded.get(p.key, "")[:60])
    gap = analysis.judge_gap(p, top, drop, level)
    if gap.interval is None:
        return kind, "gap: no interval"
    return kind, (f"gap {gap.interval.mean:+.3f} [{gap.interval.low:+.3f}, {gap.interval.high:+.3f}]"
                  f" (one-sided {level:.0%})")


if __name__ == "__main__":
    main()

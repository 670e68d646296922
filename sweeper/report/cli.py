"""`python -m sweeper.report <sweep run id | experiment>`: the command line that rebuilds a sweep's report
from MLflow alone, each setting the sweep's own unless given (report/build.py builds it)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from typing import Optional, Sequence

from sweeper import tracking
from sweeper.config import ReportConfig, TrackingConfig, tracking_uri
from sweeper.config.report import OBJECTIVES, QUALITY_CHOICES, check
from sweeper.errors import first_line
from sweeper.report.build import build
from sweeper.report.recorded import recorded_settings


def _optional_float(text: str) -> Optional[float]:
    return None if text.lower() in ("none", "null") else float(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sweeper.report",
        description="Rebuild a sweep's report (plots, HTML, recommendation) from MLflow alone. Every setting "
        "defaults to the one the sweep ran with; a report with other settings is kept beside the sweep's own "
        "(artifacts report/variants/<settings>/), never over it.",
    )
    parser.add_argument("sweep", help="the sweep's parent run id, or an experiment name (its latest sweep)")
    parser.add_argument("--tracking-uri", default=None, help="default: sqlite:///<cwd>/mlflow.db")
    # SUPPRESS: an option not given is absent, so the sweep's own setting applies ("none" clears one).
    keep = argparse.SUPPRESS
    parser.add_argument("--objective", default=keep, choices=OBJECTIVES)
    parser.add_argument("--min-accuracy", type=_optional_float, default=keep, help="a fraction, or none")
    parser.add_argument("--memory-budget-gb", type=_optional_float, default=keep,
                        help="GiB per worker; none: the device budget the sweep ran under, if any")
    parser.add_argument("--max-accuracy-drop", type=_optional_float, default=keep, help="a fraction, or none")
    parser.add_argument("--quality", default=keep, choices=QUALITY_CHOICES,
                        help="what 'better' means; auto: bits per byte or the loss for a language model")
    parser.add_argument("--quality-metric", type=lambda text: None if text.lower() in ("none", "null") else text,
                        default=keep, help="judge by this recorded metric (e.g. an eval.metrics_fn's f1), or none")
    parser.add_argument("--max-loss-rise", type=_optional_float, default=keep,
                        help="the tolerance when the quality is a loss, in its units, or none")
    parser.add_argument("--knee-min-gain", type=float, default=keep)
    # The run the answer configures and the clusters it predicts for (report/projection.py).
    parser.add_argument("--run-samples", type=_optional_float, default=keep,
                        help="samples the run will train (sequences for a language model), or none")
    parser.add_argument("--run-tokens", type=_optional_float, default=keep, help="a language model's run in tokens")
    parser.add_argument("--price-per-device-hour", type=_optional_float, default=keep, help="the run's price, or none")
    parser.add_argument("--max-workers", type=_optional_float, default=keep,
                        help="worker counts the throughput model predicts up to")
    parser.add_argument("--target-workers", type=_optional_float, default=keep,
                        help="the worker count of a cluster to answer for (predicted), or none")
    parser.add_argument("--out", default=None, help="default: <MLflow store folder>/reports/<sweep run name>")
    parser.add_argument("--no-log", action="store_true", help="write files only; do not attach them to the run")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    uri = args.tracking_uri or tracking_uri(TrackingConfig())
    problems = tracking.check(uri, must_exist=True)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        reader = tracking.SweepReader.of(uri, args.sweep)
        sweep = reader.load()
        given = {f.name: getattr(args, f.name) for f in fields(ReportConfig) if hasattr(args, f.name)}
        cfg = replace(recorded_settings(sweep.params), **given)
        problems = check(cfg, key=lambda name: "--" + name.replace("_", "-"))
        if problems:
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            return 2
        made = build(reader.store, reader.run_id, cfg, args.out, log=not args.no_log, sweep=sweep)
    except (LookupError, ValueError, OSError, *tracking.store_errors()) as exc:
        print(f"error: {type(exc).__name__}: {first_line(exc)}", file=sys.stderr)
        return 2
    print(made.text)
    print(f"report: {made.html_path}")
    print(f"as YAML: {made.yaml_path}")
    return 0

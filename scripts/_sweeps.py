"""Shared by the benchmarks that run real sweeps: run the CLI in a folder of its own and read the
sweep back from its MLflow store."""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from mlflow.tracking import MlflowClient


def parser(doc: str, out: str, default: Sequence[str]) -> argparse.ArgumentParser:
    """The options every sweep benchmark takes: an output folder and Hydra overrides."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=out)
    parser.add_argument("overrides", nargs="*", help=f"Hydra overrides (default: {' '.join(default)})")
    return parser


def start(args: argparse.Namespace, default: Sequence[str]) -> Tuple[Path, List[str]]:
    """A clean output folder and the overrides to run, printed as the first figure line."""
    overrides = list(args.overrides or default)
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    print(f"config: {' '.join(overrides)}")
    return out, overrides


def run_sweep(folder: Path, overrides: Sequence[str]) -> float:
    """Run `python -m sweeper <overrides>` in `folder`; returns the command's wall seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sweeper", *overrides], cwd=folder, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"sweep failed in {folder} (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return wall


def read_sweep(folder: Path) -> Tuple[Dict[str, float], List[Dict[str, float]]]:
    """The parent run's metrics and every child run's metrics (with its params merged in)."""
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sweeper")
    runs = client.search_runs([experiment.experiment_id], max_results=10_000)
    parent = next(r for r in runs if r.data.tags.get("sweeper.role") == "sweep")
    children = [
        {**r.data.params, **r.data.metrics, "status": r.data.tags.get("sweeper.status")}
        for r in runs
        if r.data.tags.get("sweeper.role") == "trial"
    ]
    return dict(parent.data.metrics), children


def spread(values: Sequence[float]) -> str:
    values = list(values)
    if not values:
        return "n/a"
    return f"median {statistics.median(values):.2f}, min {min(values):.2f}, max {max(values):.2f}, n={len(values)}"

"""`sweeper.results(...)`: a sweep's points read back from MLflow as a pandas DataFrame, one row per
point, through read.py's SweepReader; pandas comes with mlflow."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from sweeper import config
from sweeper.tracking.read import SweepReader
from sweeper.tracking.store import check

# The first columns, in this order; then the params, the metrics and the other sweeper.* tags, sorted.
LEADING = ["key", "status", "micro_batch_size", "accumulation_steps", "num_workers", "global_batch_size",
           "precision", "activation_checkpointing", "lr", "seed"]


def results(experiment_or_run: str = "sweeper", tracking_uri: Optional[str] = None) -> Any:
    """The points of one sweep as a pandas DataFrame: one row per point (child run with
    `sweeper.role=trial` and its identity written), columns `key`, `status`, the point's params
    (numbers as numbers), its metrics (last value of each) and its `sweeper.*` tags.

    `experiment_or_run`: a sweep's parent run id, or an experiment name meaning its latest sweep.
    `tracking_uri`: the store (None: `sqlite:///<cwd>/mlflow.db`, as `tracking.uri=null`).
    The frame's `attrs` hold `run_id` and `run_name` of the sweep's parent run. LookupError if there
    is no such sweep."""
    import pandas as pd

    uri = tracking_uri or config.tracking_uri(config.TrackingConfig())
    problems = check(uri, must_exist=True)
    if problems:
        raise LookupError(problems[0])
    record = SweepReader.of(uri, experiment_or_run).load()
    rows = [_typed(row) for row in record.children]
    frame = pd.DataFrame(rows, columns=_columns(rows))
    frame = frame.sort_values("key", ignore_index=True) if len(frame) else frame
    frame.attrs.update(run_id=record.run_id, run_name=record.run_name)
    return frame


def _typed(row: Dict[str, Any]) -> Dict[str, Any]:
    """MLflow keeps params as strings: "32" -> 32, "0.1" -> 0.1; other text stays text."""
    out: Dict[str, Any] = {}
    for name, value in row.items():
        if isinstance(value, str) and not name.startswith("sweeper.") and name not in ("key", "status"):
            for kind in (int, float):
                try:
                    value = kind(value)
                    break
                except ValueError:
                    continue
        out[name] = value
    return out


def _columns(rows: List[Dict[str, Any]]) -> List[str]:
    names = {name for row in rows for name in row}
    lead = [name for name in LEADING if name in names]
    tags = sorted(name for name in names if name.startswith("sweeper.") and name not in lead)
    rest = sorted(names - set(lead) - set(tags))
    return lead + rest + tags if rows else ["key", "status"]

"""A sweep read back from MLflow: its complete points as rows for the report (`SweepReader.load`), the
keys resume skips, smart's and branch's measurement runs, the parent's own figures and files.

Reads only; a half-written point (no identity tag: written last) is not part of the record.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from sweeper.tracking.store import Store

# A point's run is a sweep's record only once its identity is written, last: resume measures a
# point again whose run lacks it (a driver killed halfway through writing it).
IDENTITY_TAG = "sweeper.trial_key"
# sweep.strategy=smart's and branch's measurement runs, and the file that keeps each one's whole result.
MEASUREMENT_ROLES, MEASUREMENT_FILE = ("throughput", "rung", "trunk", "branch"), "result.json"


@dataclass(frozen=True)
class SweepRecord:
    """A sweep read back from MLflow: its parent run and one row per child run (params, metrics and
    the sweeper tags, plus `key` and `status`)."""

    run_id: str
    run_name: str
    params: Dict[str, str]
    children: List[Dict[str, Any]]


class SweepReader:
    """The sweep whose parent run is `run_id`, in `store`."""

    def __init__(self, store: Store, run_id: str):
        self.store, self.run_id = store, run_id

    @classmethod
    def of(cls, uri: str, ref: str) -> "SweepReader":
        """The sweep `ref` names in the store at `uri`: a parent run id, or an experiment name meaning
        its latest sweep. LookupError if there is none."""
        return cls(*Store.holding(uri, ref))

    def load(self) -> SweepRecord:
        """The sweep's parent and its complete points (half-written runs are not a record)."""
        parent = self.store.client.get_run(self.run_id)
        children = []
        for run in self.children():
            tags = run.data.tags
            if tags.get("sweeper.role") != "trial" or IDENTITY_TAG not in tags:
                continue
            row: Dict[str, Any] = {**run.data.params, **run.data.metrics}
            row.update({k: v for k, v in tags.items() if k.startswith("sweeper.")})
            row["key"] = tags[IDENTITY_TAG]
            row["status"] = tags.get("sweeper.status", "failed")
            children.append(row)
        return SweepRecord(self.run_id, parent.info.run_name, dict(parent.data.params), children)

    def children(self) -> List[Any]:
        """Every child run of the sweep, superseded and half-written ones included (MLflow's Run)."""
        return self.store.client.search_runs(
            [self.store.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self.run_id}'",
            max_results=10_000,
        )

    def spent(self) -> List[Dict[str, Any]]:
        """Every complete child run that trained or probed (points, smart's and branch's measurement runs,
        frontier probes; superseded runs left out), as a row of its params and metrics with its `role`: what the
        sweep's own compute is summed from (report/run_cost.py)."""
        rows = []
        for run in self.children():
            tags = run.data.tags
            role = tags.get("sweeper.role")
            if role in ("trial", "probe", *MEASUREMENT_ROLES) and IDENTITY_TAG in tags:
                rows.append({**run.data.params, **run.data.metrics, "role": role, "key": tags[IDENTITY_TAG]})
        return rows

    def recorded_keys(self) -> List[str]:
        """Keys of the points this sweep holds complete (ok, oom or failed alike: each once)."""
        return [r.data.tags[IDENTITY_TAG] for r in self.children()
                if r.data.tags.get("sweeper.role") == "trial" and IDENTITY_TAG in r.data.tags]

    def failed_keys(self) -> List[str]:
        return [r.data.tags[IDENTITY_TAG] for r in self.children() if r.data.tags.get("sweeper.role") == "trial"
                and r.data.tags.get("sweeper.status") == "failed" and IDENTITY_TAG in r.data.tags]

    def measurements(self, role: str) -> Dict[str, Dict[str, Any]]:
        """This sweep's complete measurement runs of `role`: key -> its result (as it was reported)."""
        out: Dict[str, Dict[str, Any]] = {}
        for run in self.children():
            tags = run.data.tags
            if tags.get("sweeper.role") != role or IDENTITY_TAG not in tags:
                continue
            with tempfile.TemporaryDirectory() as folder:
                path = self.store.client.download_artifacts(run.info.run_id, MEASUREMENT_FILE, folder)
                with open(path) as f:
                    out[tags[IDENTITY_TAG]] = json.load(f)
        return out

    def metrics(self) -> Dict[str, float]:
        """The parent run's metrics by name (e.g. the frontier's `frontier_micro_batch_size_w1`)."""
        return dict(self.store.client.get_run(self.run_id).data.metrics)

    def artifact_text(self, path: str) -> Optional[str]:
        """The text of the parent run's artifact `path` (e.g. `config.yaml`), or None without one."""
        try:
            # Through this store's client: `runs:/` URIs resolve against MLflow's global tracking URI,
            # which is ./mlflow.db unless set, not tracking.uri (a resume to another store read nothing).
            with tempfile.TemporaryDirectory() as folder:
                with open(self.store.client.download_artifacts(self.run_id, path, folder)) as f:
                    return f.read()
        except Exception:  # noqa: BLE001 - MLflow raises its own errors for a missing artifact; a sweep
            return None  # without its config cannot be checked: the caller refuses it


def find_sweep(store: Store, ray_experiment: str) -> Optional[Any]:
    """The parent run of the sweep whose Ray Tune experiment is `ray_experiment`, if recorded."""
    runs = store.client.search_runs(
        [store.experiment_id],
        filter_string=f"tags.`sweeper.ray_experiment` = '{ray_experiment}'",
        max_results=1,
    )
    return runs[0] if runs else None

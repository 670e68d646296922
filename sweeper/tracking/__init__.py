"""MLflow, by role: writing a sweep (`write.py`: the Tracker and its journal, `journal.py`), reading it
back (`read.py`; as a pandas DataFrame for `sweeper.results`: `results.py`), the store and its URI
(`store.py`), the system-metrics monitor (`monitor.py`). The only package that imports MLflow, always
inside functions (`import sweeper` happens in every Ray worker); the names it records are
sweeper/schema.py's (docs/mlflow.md). May import sweeper.plan, sweeper.schema and sweeper.config.

Callers use the names below (`from sweeper import tracking`, `tracking.Tracker`).
"""

from sweeper.tracking.monitor import Monitor
from sweeper.tracking.read import IDENTITY_TAG, SweepReader, SweepRecord, find_sweep
from sweeper.tracking.store import (
    Store, check, credentials_to_environment, default_journal_dir, password, redact, store_errors, store_folder,
)
from sweeper.tracking.write import (
    RESUME_FORMAT, DatasetRecord, Tracker, log_report, log_sweep_metrics, record_launch,
)

__all__ = [
    "IDENTITY_TAG", "RESUME_FORMAT", "DatasetRecord", "Monitor", "Store", "SweepReader", "SweepRecord", "Tracker",
    "check", "credentials_to_environment", "default_journal_dir", "find_sweep", "log_report", "log_sweep_metrics",
    "password", "record_launch", "redact", "store_errors", "store_folder",
]

"""Where a sweep's report is written: beside the MLflow store, one folder per sweep run, a report with
other settings in a folder of its own below it. Standard library only."""

from __future__ import annotations

import os
import re
from typing import Optional

from sweeper.tracking import store_folder


def default_folder(uri: str, run_name: str, variant_name: Optional[str] = None) -> str:
    """Next to the MLflow store: `<store folder>/reports/<sweep run name>` for a SQLite or file
    store, `./reports/<name>` for a tracking server; a report with other settings than the
    sweep's in `variants/<settings>` below it, as in MLflow. Names come from the store (a run name
    anyone with write access can set): each becomes one safe path component, so a report is always
    written under `reports/`."""
    folder = os.path.join(store_folder(uri), "reports", safe_name(run_name))
    return os.path.join(folder, "variants", safe_name(variant_name)) if variant_name else folder


def safe_name(name: str) -> str:
    """One path component: letters, digits and `._=,-` kept, anything else (a separator, `..`) made
    `_`, and never empty or hidden."""
    cleaned = re.sub(r"[^A-Za-z0-9._=,-]", "_", name).lstrip(".")
    return cleaned or "_"

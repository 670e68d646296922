"""What a recorded sweep holds, in the report's types: its child runs as `Trial`s, read field by field
from Trial's own fields (each under its MLflow name: sweeper/schema.py's for a recorded figure), and the
report settings the sweep recorded (`report_<key>` params). Pure (standard library).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import fields, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from sweeper.config import ReportConfig
from sweeper.report.trials import Trial, user_metrics
from sweeper.schema import PointResult

# Labels of the bundled datasets whose labels are real (data=synthetic's are random: its accuracy sits
# at chance by design, so no chance check applies). A child run's own `num_classes` (param or metric)
# wins; a dataset not named here leaves the pooled chance check off.
KNOWN_CLASSES = {"digits": 10, "cifar10": 10}


def settings_params(cfg: ReportConfig) -> Dict[str, Any]:
    """The report's settings as the sweep's parent params (`report_<key>`), so a rebuild from
    MLflow alone answers the same question the sweep did."""
    return {f"report_{f.name}": getattr(cfg, f.name) for f in fields(ReportConfig)}


def recorded_settings(params: Dict[str, str]) -> ReportConfig:
    """The report settings a sweep recorded (its parent params); the defaults for any it did not."""
    values: Dict[str, Any] = {}
    for f in fields(ReportConfig):
        text = params.get(f"report_{f.name}")
        if text is not None:
            if f.name == "quality_metric":  # a name, or None
                values[f.name] = None if text in ("None", "") else text
            else:
                values[f.name] = text if f.name in ("objective", "quality") else number(text)
    return replace(ReportConfig(), **values)


def variant(cfg: ReportConfig, params: Dict[str, str]) -> Optional[str]:
    """None when `cfg` asks what the sweep itself asked; else a name for the other question, e.g.
    `objective=accuracy,min_accuracy=0.9`, under which its report is kept beside the sweep's own."""
    own = recorded_settings(params)
    changed = [f"{f.name}={getattr(cfg, f.name)}" for f in fields(ReportConfig)
               if getattr(cfg, f.name) != getattr(own, f.name)]
    return ",".join(changed) or None


def number(text: Optional[str]) -> Optional[float]:
    """A recorded param as a number; None for an unset one ("None") or text that is not a number."""
    try:
        return float(text) if text not in (None, "None") else None
    except ValueError:
        return None


def num_classes(row: Dict[str, Any], sweep_params: Dict[str, str]) -> Optional[int]:
    """The class count behind a child run's accuracy: its own record when it has one, else the
    sweep's dataset when it is a bundled one with real labels (KNOWN_CLASSES); None: unknown."""
    own = number(None if row.get("num_classes") is None else str(row.get("num_classes")))
    if own is not None and own >= 2:
        return int(own)
    return KNOWN_CLASSES.get(str(sweep_params.get("dataset")))


def coupled(params: Dict[str, str]) -> Optional[bool]:
    """Whether the sweep's model has batch-coupled layers (param batch_coupled_layers: "none" or their
    names); None for a record from before the param: the report then judges every point on its own."""
    layers = params.get("batch_coupled_layers")
    return None if layers is None else layers.strip() != "none"


def trials_of(sweep: Any) -> List[Trial]:
    """The sweep's child runs (a tracking.SweepRecord's `children`) as Trials, each with the class count
    the report's pooled chance check needs (`num_classes`)."""
    return [replace(trial_of(row), num_classes=num_classes(row, sweep.params)) for row in sweep.children]


def trial_of(row: Dict[str, Any]) -> Trial:
    """One child run's row (params and metrics by name, sweeper.* tags) as a Trial: each field read
    under its recorded names and made its declared type. Params come back as text ("None" for an unset
    one); a record from before seeds or recipes leaves those fields None."""
    values: Dict[str, Any] = {name: read(row) for name, read in _FROM_ROW.items()}
    for name, (names, parse, when_unrecorded) in _READERS.items():
        raw = next((row[n] for n in names if row.get(n) not in (None, "None", "")), None)
        if raw is not None:
            values[name] = parse(raw)
        elif when_unrecorded is not None:
            values[name] = when_unrecorded
        elif name in _REQUIRED:
            raise KeyError(names[0])
    return Trial(**values)


def _flag(raw: Any) -> bool:
    """A recorded yes/no: a tag's or param's text ("true", "True"), or a metric's number (1 or 0)."""
    return raw > 0 if isinstance(raw, (int, float)) else str(raw).lower() == "true"


# Trial fields read from the whole row, not one name: eval.metrics_fn's metrics, each under its prefixed
# names with its direction tag (report/trials.py user_metrics).
_FROM_ROW: Dict[str, Callable[[Dict[str, Any]], Any]] = {"val_metrics": user_metrics}
_PARSERS: Dict[Any, Callable[[Any], Any]] = {
    str: str, float: float, int: lambda raw: int(float(raw)), bool: _flag,
}


def _readers() -> Dict[str, Tuple[Tuple[str, ...], Callable[[Any], Any], Any]]:
    """Trial field -> (the MLflow names it is read from, first present winning; its parser, by its
    declared type; its value when the record has none, if it has one)."""
    # A recorded figure's MLflow name: a tag field's own (schema.tag: error -> sweeper.error), else its name.
    schema = {f.name: f.metadata.get("tag", f.name) for f, _ in PointResult().leaves()}
    hints = typing.get_type_hints(Trial)
    out = {}
    for f in fields(Trial):
        if f.name in _FROM_ROW:
            continue
        names = tuple(schema.get(n, n) for n in f.metadata.get("recorded_as", (f.name,)))
        declared = typing.get_args(hints[f.name])[0] if typing.get_origin(hints[f.name]) else hints[f.name]
        out[f.name] = (names, _PARSERS[declared], f.metadata.get("unrecorded"))
    return out


_READERS = _readers()
_REQUIRED = {f.name for f in fields(Trial)
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}

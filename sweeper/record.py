"""A typed record of measured figures (sweeper.schema's results are made of them): each field's kind says how
MLflow records it (a metric, a per-step series, a curve, a tag, a map of run-time names, or a note that travels
with the result but is not a figure); sections nest; a record crosses processes as a flat dict and is rebuilt
from it, refusing a name it does not know. Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import Field, field, fields
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

METRIC, SERIES, CURVE, TAG, NOTE, MAP = "metric", "series", "curve", "tag", "note", "map"


def metric() -> Any:
    """A number, one MLflow metric under the field's name."""
    return field(default=None, metadata={"kind": METRIC})


def series() -> Any:
    """A list of numbers, one MLflow metric under the field's name with the index as its step."""
    return field(default=None, metadata={"kind": SERIES})


def curve() -> Any:
    """(step, value) pairs, one MLflow metric under the field's name at those steps (e.g. samples seen)."""
    return field(default=None, metadata={"kind": CURVE})


def tag(name: str) -> Any:
    """Text (or a bool, as "true"/"false"), the run tag `name`."""
    return field(default=None, metadata={"kind": TAG, "tag": name})


def metric_map(prefix: str) -> Any:
    """Numbers under names chosen at run time (your step's figures: {name: value}), each one MLflow metric
    `prefix + name`; flat, each travels under that name too."""
    return field(default=None, metadata={"kind": MAP, "prefix": prefix})


def note(default: Any = None) -> Any:
    """Travels with the result (identity, clocks, paths) but is not a recorded figure."""
    return field(default=default, metadata={"kind": NOTE})


class Record:
    """A dataclass of schema fields, some of them nested Records (the sections)."""

    def leaves(self) -> Iterator[Tuple[Field, Any]]:
        """(field, value) of every non-section field, sections flattened in order."""
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if _is_section(f):
                if value is not None:
                    yield from value.leaves()
            else:
                yield f, value

    def to_flat(self) -> Dict[str, Any]:
        """Every set field by name (None left out): what a worker reports. A map's entries by their prefixed names."""
        out: Dict[str, Any] = {}
        for f, value in self.leaves():
            if value is None:
                continue
            if f.metadata.get("kind") == MAP:
                out.update({f.metadata["prefix"] + name: v for name, v in value.items()})
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> "Record":
        """The record of a flat dict; ValueError naming any key the schema does not know."""
        prefixes = cls._map_prefixes()
        unknown = {k for k in set(values) - set(cls.names()) if not k.startswith(prefixes)}
        if unknown:
            raise ValueError(f"{cls.__name__} has no field for {sorted(unknown)}: add it to sweeper/schema.py")
        return cls._build(values)

    @classmethod
    def _build(cls, values: Mapping[str, Any]) -> "Record":
        kwargs: Dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if _is_section(f):
                kwargs[f.name] = f.metadata["section"]._build(values)
            elif f.metadata.get("kind") == MAP:
                prefix = f.metadata["prefix"]
                found = {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}
                kwargs[f.name] = found or None
            elif f.name in values:
                kwargs[f.name] = values[f.name]
        return cls(**kwargs)

    @classmethod
    def _map_prefixes(cls) -> Tuple[str, ...]:
        """The prefixes of the maps' names, sections included."""
        out: Tuple[str, ...] = ()
        for f in fields(cls):  # type: ignore[arg-type]
            if _is_section(f):
                out += f.metadata["section"]._map_prefixes()
            elif f.metadata.get("kind") == MAP:
                out += (f.metadata["prefix"],)
        return out

    @classmethod
    def names(cls, kind: Optional[str] = None) -> List[str]:
        """Field names (all, or of one kind), sections flattened: the recorded names of the schema."""
        out: List[str] = []
        for f in fields(cls):  # type: ignore[arg-type]
            if _is_section(f):
                out += f.metadata["section"].names(kind)
            elif kind is None or f.metadata.get("kind") == kind:
                out.append(f.name)
        return out

    def update(self, values: Mapping[str, Any]) -> None:
        """Set fields of this record or its sections by name; ValueError for an unknown one."""
        owners = {f.name: owner for owner, f in self._owners()}
        unknown = set(values) - set(owners)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field for {sorted(unknown)}: add it to sweeper/schema.py")
        for name, value in values.items():
            setattr(owners[name], name, value)

    def get(self, name: str, default: Any = None) -> Any:
        """A field by its recorded name, wherever its section is; `default` when unset. KeyError for a
        name the schema does not have (a typo, not an absent figure)."""
        for owner, f in self._owners():
            if f.name == name:
                value = getattr(owner, name)
                return default if value is None else value
        raise KeyError(f"{type(self).__name__} has no field {name!r}")

    # The flat view by recorded name, as MLflow holds it: result["val_accuracy"], "mfu" in result.
    def __getitem__(self, name: str) -> Any:
        value = self.get(name)
        if value is None:
            raise KeyError(f"{name!r} is not set")
        return value

    def __contains__(self, name: str) -> bool:
        try:
            return self.get(name) is not None
        except KeyError:
            return False

    def metrics(self) -> Dict[str, float]:
        """The MLflow metrics: every set number that is finite (MLflow stores NaN, but a NaN figure
        is a measurement that did not happen; the status says why)."""
        out = {
            f.name: float(v)
            for f, v in self.leaves()
            if f.metadata.get("kind") == METRIC and v is not None and math.isfinite(float(v))
        }
        for f, v in self.leaves():
            if f.metadata.get("kind") == MAP and v:
                out.update({f.metadata["prefix"] + k: float(x) for k, x in v.items() if math.isfinite(float(x))})
        return out

    def series(self) -> Dict[str, List[float]]:
        return {f.name: [float(x) for x in v] for f, v in self.leaves() if f.metadata.get("kind") == SERIES and v}

    def curves(self) -> Dict[str, List[Tuple[int, float]]]:
        """Each curve's finite (step, value) pairs."""
        return {
            f.name: [(int(s), float(x)) for s, x in v if x is not None and math.isfinite(float(x))]
            for f, v in self.leaves() if f.metadata.get("kind") == CURVE and v
        }

    def tags(self) -> Dict[str, str]:
        out: Dict[str, str] = {}
        for f, value in self.leaves():
            if f.metadata.get("kind") != TAG or value is None or value == "":
                continue
            out[f.metadata["tag"]] = str(value).lower() if isinstance(value, bool) else str(value)[:5000]
        return out

    def _owners(self) -> Iterator[Tuple["Record", Field]]:
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if _is_section(f):
                yield from value._owners()
            else:
                yield self, f


def section(cls: type) -> Any:
    """A nested record, always present (its fields None until measured)."""
    return field(default_factory=cls, metadata={"kind": "section", "section": cls})


def _is_section(f: Field) -> bool:
    return f.metadata.get("kind") == "section"

"""The small predicates every section's checker shares: one problem line per broken rule, naming the
key, the value, the rule and the fix.
"""

from __future__ import annotations

import math
from typing import Any, Callable, List, Sequence


def check_rule(problems: List[str], key: str, value: Any, ok: Callable[[Any], bool], rule: str) -> None:
    """Adds `key=value: rule` when a set value breaks `ok` (None: the setting is null, which its rule
    allows or OmegaConf refused). NaN and infinity break every rule: NaN compares false (`lr <= 0`
    lets it through) and infinity passes `> 0`, and either would reach torch or Ray as a setting."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{key}={value} is not a finite number: {rule}")
    elif not ok(value):
        problems.append(f"{key}={value}: {rule}")


def check_choices(key: str, values: Any, allowed: Sequence[str], example: str) -> List[str]:
    """Problems with a list of names from `allowed` (a recipe axis)."""
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        return [f"{key}={values!r} is invalid: give a list of {', '.join(allowed)}, e.g. {key}={example}"]
    unknown = [v for v in values if v not in allowed]
    return [f"{key} has {', '.join(unknown)}: use {', '.join(allowed)}"] if unknown else []


def is_positive(value: Any) -> bool:
    return value > 0


def is_not_negative(value: Any) -> bool:
    return value >= 0


def check_sizes(key: str, values: Any, example: str, otherwise: str = "", least: int = 1) -> List[str]:
    """Problems with a list of integers of at least `least` (a grid axis, batch sizes, widths, seeds);
    `otherwise` names what else the key accepts."""
    what = "positive integers" if least == 1 else f"integers >= {least}"
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        shown = "null" if values is None else repr(values)
        return [f"{key}={shown} is invalid: give a list of {what} (or one integer), e.g. {key}={example}{otherwise}"]
    if not values:
        return [f"{key}=[] is empty: give at least one value, e.g. {key}={example}{otherwise}"]
    one = "a positive integer" if least == 1 else f"an integer >= {least}"
    return [f"{key} contains {v}: every value must be {one}; remove or fix it" for v in values if v < least]

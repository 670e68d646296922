"""sweep.strategy=grid, its decisions: every point of the grid measured as itself (the grid's arithmetic:
sweeper/plan.py), in worker groups of sweep.points_per_worker_group, each point recorded as it arrives,
in rounds until every point is recorded: a worker group that died leaves the points after its last
recorded one to a fresh round, and each round records at least the point its group died on.

Pure (standard library and sweeper's plan), tested without processes. The driver's side runs the rounds on
Ray (sweeper/driver/grid.py).
"""

from __future__ import annotations

from typing import AbstractSet, Dict, List, Sequence

from sweeper.plan import GridPoint
from sweeper.strategies.base import Strategy


class Grid(Strategy):
    """sweep.strategy=grid: the defaults of every strategy (the config as given, nothing asked of the grid)."""

    name = "grid"


def run_params(points: Sequence[GridPoint], groups: Sequence[Sequence[GridPoint]]) -> Dict[str, int]:
    """The parent run's params a new grid sweep records before its first round."""
    return {"num_trials": len(points), "num_worker_groups": len(groups)}


def unrecorded(points: Sequence[GridPoint], recorded: AbstractSet[str]) -> List[GridPoint]:
    """The points a round still has to measure: those whose key is not recorded, in the grid's order."""
    return [p for p in points if p.key not in recorded]


def round_label(name: str, attempt: int, stamp: str, resume: bool) -> str:
    """The Ray Tune experiment of round `attempt` (from 0): the sweep's own name first, the one sweep.resume
    restores; then name-rerunN, stamped (`stamp`) on a resume, so that its names differ from the
    interrupted sweep's own reruns."""
    return name if attempt == 0 else f"{name}-rerun{attempt}" + (f"-{stamp}" if resume else "")

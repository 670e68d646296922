"""What every sweep.strategy answers before its points run (`Strategy`), and what running them gives back
(`Measured`). Each strategy's module subclasses `Strategy` with its own rules (grid.py, smart.py,
branch.py); its driver side (sweeper/driver/grid.py, smart.py, branch.py) adds `measure`, which runs the
points on Ray. The train sweep finds a strategy by its name (sweeper/driver/strategy.py) and asks it,
never `if strategy == ...`.

Pure: standard library and sweeper's config, plan and schema; imports nothing of the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence, Tuple

from sweeper.config import SweeperConfig
from sweeper.plan import GridPoint
from sweeper.schema import PointResult

if TYPE_CHECKING:
    from sweeper.strategies.branch import Answer

Rows = List[Tuple[GridPoint, PointResult]]


class Strategy:
    """A sweep.strategy's decisions the train sweep asks for before any point runs. The defaults are the
    grid's: the config as given, nothing asked of the grid, the model's batch-coupled layers recorded."""

    name = ""

    def configure(self, cfg: SweeperConfig) -> SweeperConfig:
        """The config the sweep's points train with (another only for a strategy with its own LR rule)."""
        return cfg

    def grid_problems(self, cfg: SweeperConfig, points: Sequence[GridPoint]) -> List[str]:
        """What the strategy needs of the grid that the grid lacks, one line each, found before Ray starts."""
        return []

    def opening_params(self, batch_coupled: Sequence[str]) -> Dict[str, str]:
        """The parent run's params a new sweep records as soon as its run is open, before any point: the
        model's batch-coupled layers, which the report's accuracy classes read (report/classes.py)."""
        return {"batch_coupled_layers": ", ".join(batch_coupled) or "none"}


class Spent(Protocol):
    """What a strategy that composes its points from measurement runs spent (smart's and branch's ledgers)."""

    measured: Rows  # every measurement run: the sweep's point-time is theirs, a composed point has none

    def metrics(self) -> Dict[str, float]: ...


@dataclass
class Measured:
    """What running a strategy's points gave: the points it recorded in this run, with their results;
    what it spent (None for the grid, whose points are their own measurements); its answer (branch's)."""

    rows: Rows
    spent: Optional[Spent] = None
    answer: Optional[Answer] = None

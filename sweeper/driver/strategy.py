"""sweep.strategy's name -> the strategy, the one interface the train sweep asks (`SweepStrategy`): its
decisions (sweeper/strategies/) with what runs its points on Ray (driver/grid.py, smart.py, branch.py).
A new strategy is a module in each of the two folders and a line here; the train sweep does not change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Protocol, Sequence

from sweeper.config import SweeperConfig
from sweeper.driver.branch import BranchRun
from sweeper.driver.grid import GridRun
from sweeper.driver.skeleton import Session
from sweeper.driver.smart import SmartRun
from sweeper.plan import GridPoint
from sweeper.strategies.base import Measured
from sweeper.worker.spec import PointSpec

if TYPE_CHECKING:
    from sweeper.driver.preflight import Prepared


class SweepStrategy(Protocol):
    """What the train sweep asks of a strategy, in the order it asks (strategies/base.py says what each
    default is)."""

    name: str

    def configure(self, cfg: SweeperConfig) -> SweeperConfig:
        """The config the points train with."""

    def grid_problems(self, cfg: SweeperConfig, points: Sequence[GridPoint]) -> List[str]:
        """What the grid lacks for this strategy, before Ray starts."""

    def opening_params(self, batch_coupled: Sequence[str]) -> Dict[str, str]:
        """The parent's params a new sweep records once its run is open."""

    def measure(self, cfg: SweeperConfig, s: Session, name: str, points: List[GridPoint],
                specs: Dict[GridPoint, PointSpec], done_keys: frozenset, prepared: Prepared) -> Measured:
        """Every point not in `done_keys` measured (or composed) and recorded; what it spent, its answer."""


STRATEGIES: Dict[str, SweepStrategy] = {s.name: s for s in (GridRun(), SmartRun(), BranchRun())}


def strategy_of(name: str) -> SweepStrategy:
    """The strategy called `name`. An unknown name gets the grid's, whose hooks change nothing: the config's
    own checks refuse the name (sweep.strategy, with the choices) before any point runs."""
    return STRATEGIES.get(name, STRATEGIES["grid"])

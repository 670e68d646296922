"""What the driver's Ray layer and the code in Ray's processes share: the Sink that receives a Tune
experiment's trial events, and the key a failed worker group's last result carries. No Ray import, so
both sides (cluster.launch, cluster.entry, cluster.runs) read it without an import circle."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from sweeper.errors import last_line

# A trial's last result when its Ray Train worker group failed for good (entry._fit): the trial ends
# without an error of its own, so Tune does not retry what Ray Train already restarted.
GROUP_ERROR = "worker_group_error"


# A stop (SIGINT, SIGTERM) that reached the driver while a Tune experiment ran is raised by the experiment's
# Relay at the loop's next step (Tune steps every ~0.1 s), in Python code, rather than by the signal handler
# inside Ray's C code: there it surfaces as a SystemError, an Exception on which Tune first stops every trial
# gracefully (2.6-2.9 s here before the record could end KILLED; `ray job stop` SIGKILLs after 3 s).
_TUNE_LOOPS: List[int] = []
_DEFERRED: List[BaseException] = []


def defer_stop(stop: BaseException) -> bool:
    """Whether a Tune experiment runs and will raise `stop` at its next step (else the caller raises it)."""
    if _TUNE_LOOPS:
        _DEFERRED.append(stop)
        return True
    return False


def raise_deferred() -> None:
    if _DEFERRED:
        raise _DEFERRED.pop()


class Sink:
    """The driver-side receiver of one Tune experiment's trial events (see cluster.launch.Relay).
    `config` is the trial's entry of the param space; `result` has Tune's own fields removed.

    `trial_result` and `trial_ended` are what a subclass implements; a worker group's failure reported as a
    result (GROUP_ERROR) reaches `trial_ended` as the trial's error."""

    def __init__(self) -> None:
        self._group_errors: Dict[str, str] = {}

    def started(self, trial_id: str, config: Dict[str, Any]) -> None: ...

    def result(self, trial_id: str, config: Dict[str, Any], result: Dict[str, Any]) -> None:
        if GROUP_ERROR in result:
            self._group_errors[trial_id] = last_line(str(result[GROUP_ERROR]))
        else:
            self.trial_result(trial_id, config, result)

    def ended(self, trial_id: str, config: Dict[str, Any], error: Optional[str]) -> None:
        group_error = self._group_errors.pop(trial_id, None)
        self.trial_ended(trial_id, config, error if error is not None else group_error)

    def waiting(self, seconds: float) -> bool:
        """Every trial has waited `seconds` to be placed, none running; whether the wait was said (a sink
        that finds its trials not waiting for the cluster says nothing, and is asked again later)."""
        return False

    def trial_result(self, trial_id: str, config: Dict[str, Any], result: Dict[str, Any]) -> None: ...

    def trial_ended(self, trial_id: str, config: Dict[str, Any], error: Optional[str]) -> None:
        """The trial finished (error None) or failed (the last line of its error)."""

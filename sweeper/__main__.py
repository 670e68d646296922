"""`python -m sweeper [overrides]`: compose the Hydra config, convert it once to typed objects, run.

Exit status: 0 every point ended ok or oom, 1 a point failed, 2 bad input (one `error:` line per
problem, before Ray starts), 3 sweeper itself crashed, 130/143 interrupted by SIGINT/SIGTERM (the
sweep's run ends KILLED). A multirun (`-m`) exits with its worst job's status; an interrupt ends it.
"""

from __future__ import annotations

import atexit
import os
import shlex
import signal
import sys
import threading
import traceback
from typing import Dict, List, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from sweeper import config, tracking
from sweeper.cluster import environment
from sweeper.errors import EXIT_CONFIG, EXIT_INTERNAL, EXIT_OK, ConfigError, Interrupted, first_line

config.register()

# One entry per job that started: its exit status (None while it runs, or if it raised). Hydra's job
# runner keeps a task's return value to itself (and a multirun runs the task once per job), so the
# task function records it here for main().
_jobs: List[Optional[int]] = []


@hydra.main(config_path="pkg://sweeper.conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> int:
    _jobs.append(None)
    _jobs[-1] = run_task(cfg)
    return _jobs[-1]


def run_task(cfg: DictConfig) -> int:
    """One job, start to finish; its exit status. Returned, never sys.exit(): Hydra's job runner does
    not catch SystemExit, so one job's exit would end a multirun before its other jobs."""
    try:
        typed = typed_config(cfg)
        resolved = OmegaConf.to_yaml(cfg, resolve=True)
        if typed.tracking.uri:
            # Credentials move to MLflow's own environment variables: the URI printed and recorded
            # from here on has none, and Hydra's copies of the config are redacted.
            secret = tracking.password(typed.tracking.uri)
            typed.tracking.uri = tracking.credentials_to_environment(typed.tracking.uri)
            if secret:
                resolved = resolved.replace(secret, "***")
                redact_hydra_outputs(secret)
        tracking.record_launch(launch_files(tracking.password(cfg.tracking.uri or "")))
        # Before anything imports Ray (a resume's check reads Ray Tune's state): Ray reads its token once.
        environment.prepare(typed.cluster)
        # Each validates everything (values, model, data, store) before Ray starts.
        if typed.task == "inference":
            from sweeper.driver import inference as task
        else:
            from sweeper.driver import train_sweep as task
        return task.run(typed, resolved)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:  # noqa: BLE001 - a bug in sweeper: its traceback, and an exit status of its own
        traceback.print_exc()
        print(f"error: internal: {type(exc).__name__}: {first_line(exc)} (a bug in sweeper; the sweep's run, "
              "if it had one, is ended FAILED)", file=sys.stderr)
        return EXIT_INTERNAL


def launch_files(secret: Optional[str]) -> Dict[str, str]:
    """What launched this job, for the sweep's run beside its config.yaml: Hydra's overrides (the
    job's own, as in Hydra's `overrides.yaml`; a multirun's job has its values) and the command line
    as typed, a password in them replaced by ***."""
    from hydra.core.hydra_config import HydraConfig

    def clean(text: str) -> str:
        return text.replace(secret, "***") if secret else text

    command = ["python", "-m", "sweeper"] if sys.argv[0].endswith("__main__.py") else [os.path.basename(sys.argv[0])]
    return {
        "overrides.yaml": clean(OmegaConf.to_yaml(HydraConfig.get().overrides.task)),
        "command.txt": shlex.join(command + [clean(arg) for arg in sys.argv[1:]]) + "\n",
    }


def redact_hydra_outputs(secret: str) -> None:
    """Hydra saved the config (and the command line) under the run's output folder before the task
    started: replace the secret there too."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.output_subdir is None:
        return
    folder = os.path.join(hydra_cfg.runtime.output_dir, hydra_cfg.output_subdir)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace(secret, "***"))


def typed_config(cfg: DictConfig) -> config.SweeperConfig:
    try:
        return config.to_typed(cfg)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever conversion refuses is bad input, told in one line
        raise ConfigError([config.conversion_problem(exc)]) from exc


def main() -> None:
    _jobs.clear()
    # Without HYDRA_FULL_ERROR, Hydra prints a composition error (an unknown key or option, a wrong
    # type, an override that does not parse) over several lines and exits 1; with it, Hydra raises,
    # and the error is told here as one `error:` line. A user who set it gets Hydra's traceback.
    previous = os.environ.get("HYDRA_FULL_ERROR")
    wants_traceback = previous == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _hydra_main()
    except Interrupted as stop:
        sys.exit(stop.exit_status)  # the sweep said how it was left and how to finish it
    except KeyboardInterrupt:
        sys.exit(Interrupted(signal.SIGINT).exit_status)  # before any sweep had started
    except Exception as exc:
        # Before any job ran, Hydra was parsing or composing: bad input. After, only Hydra's and
        # OmegaConf's own errors are (a multirun composes its jobs a batch at a time); anything else
        # escaped a task: a bug, shown with its traceback.
        hydra_or_omegaconf = type(exc).__module__.split(".")[0] in ("hydra", "omegaconf")
        if wants_traceback or (_jobs and not hydra_or_omegaconf):
            raise
        print(f"error: {config.conversion_problem(exc)}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous
    sys.exit(max((status for status in _jobs if status is not None), default=EXIT_OK))


def cli() -> None:
    """The `sweeper` command and `python -m sweeper`: main(), then the process ends as soon as what it
    wrote is on disk. Past the last atexit handler (MLflow's, Ray's, logging's), tearing down the
    interpreter's modules (torch, Ray's and gRPC's C++ state) takes 2-4 s here and writes nothing."""
    try:
        main()
    except SystemExit as done:
        status = done.code
    else:
        status = EXIT_OK
    if not isinstance(status, int):  # as Python does: None is 0; anything else is printed, status 1
        if status is not None:
            print(status, file=sys.stderr)
        status = EXIT_OK if status is None else 1
    # What a normal exit does before the teardown, in its order: threading's own exit hooks (they stop
    # the thread pools of concurrent.futures), joining the non-daemon threads, the atexit handlers.
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    cli()

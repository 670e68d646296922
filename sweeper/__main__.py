"""`python -m sweeper [overrides]`: compose the Hydra config, convert it once to typed objects, run."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from sweeper import config
from sweeper.errors import ConfigError

config.register()


_composed = False


@hydra.main(config_path="pkg://sweeper.conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    global _composed
    _composed = True
    try:
        typed = config.to_typed(cfg)
        # Each validates everything (values, model, data, store) before Ray starts.
        if typed.task == "inference":
            from sweeper.driver import inference as task
        else:
            from sweeper.driver import train as task

        status = task.run(typed, OmegaConf.to_yaml(cfg, resolve=True))
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status)


def main() -> None:
    try:
        _hydra_main()
    except SystemExit as exc:
        # Hydra reports a bad override or config group (e.g. model=nope) itself, without a
        # traceback, and exits 1; that is a config error like ours, so use our exit status.
        if exc.code == 1 and not _composed:
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()

"""`python -m sweeper [overrides]`: compose the Hydra config, convert it once to typed objects, run."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from sweeper import config

config.register()


@hydra.main(config_path="pkg://sweeper.conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        typed = config.to_typed(cfg)
        from sweeper import app  # validates everything (values, model, data, store) before Ray starts

        status = app.run(typed, OmegaConf.to_yaml(cfg, resolve=True))
    except config.ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status)


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()

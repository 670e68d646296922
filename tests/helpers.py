"""Factories the test files share, imported by name (`from tests.helpers import problems`): the
repository's root, the experiment files, and a config's problems as the CLI would report them."""

from pathlib import Path

from hydra import compose, initialize_config_module

from sweeper.config import register, to_typed, validate
from sweeper.driver.preflight import preflight
from sweeper.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def problems(*overrides):
    """The problems `python -m sweeper` would report for these overrides: the config's checks, then
    preflight's (which loads the data and builds the model), without starting Ray."""
    register()
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = to_typed(compose("config", overrides=list(overrides)))
    found = validate(cfg)
    if not found:
        try:
            preflight(cfg)
        except ConfigError as exc:
            found = exc.problems
    return found

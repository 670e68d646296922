"""Bad input through the CLI's own path: exit 2, one `error:` line naming the key, no traceback, no Ray.

Every case calls `sweeper.__main__.main()` (what `python -m sweeper` runs) with its overrides as
sys.argv. The cases share one subprocess, which pays Python, torch and the driver's imports once
instead of once per case (5-10 s each on 2 cores); each case runs in a folder of its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from torch.utils.data import TensorDataset

from tests.harness import run_cli
from tests.helpers import REPO

HERE = "tests.unit.test_bad_input"
NO_DASHBOARD = "cluster.include_dashboard=false"


# Factories that break their contract, as a user's might (model=custom / data=custom).
def returns_a_dict(num_classes: int):
    return {"num_classes": num_classes}


def raises(**kwargs):
    raise RuntimeError("weights file not found")


def three_datasets():
    ds = TensorDataset(torch.zeros(4, 8), torch.zeros(4, dtype=torch.long))
    return ds, ds, ds


def not_datasets():
    return 1, 2


def unlabelled():
    return TensorDataset(torch.zeros(4, 8)), None


class NoBlocks(torch.nn.Module):
    """A model with nothing activation checkpointing knows how to wrap."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.linear = torch.nn.Linear(64, num_classes)

    def forward(self, x):
        return self.linear(x.flatten(1))


class HalfOnItsOwn(NoBlocks):
    """A model whose own code computes in the autocast dtype, with an op the CPU has no fp16 kernel for
    (QR); under bf16, or on a GPU, it would run."""

    def forward(self, x):
        h = self.linear(x.flatten(1))
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16:
            with torch.autocast("cpu", enabled=False):  # its own fp16 math, outside autocast's casts
                h = h + torch.linalg.qr(h.half())[0].float().sum() * 0
        return h


def not_an_optimizer(params, lr):
    return {"lr": lr}


# (overrides, the key the error line must name)
CASES = [
    # null where a list is needed (a scalar is a one-element list: tests/unit/test_config.py)
    (["sweep.micro_batch_sizes=null"], "sweep.micro_batch_sizes"),
    (["sweep.accumulation_steps=null"], "sweep.accumulation_steps"),
    (["sweep.num_workers=[1.5]"], "sweep.num_workers"),
    (["sweep.global_batch_sizes=[]"], "sweep.global_batch_sizes"),
    (["inference.batch_sizes=null"], "inference.batch_sizes"),
    (["sweep.max_concurrent_trials=0"], "sweep.max_concurrent_trials"),
    # a value twice on an axis: two points with one key
    (["sweep.seeds=[0,0]"], "sweep.seeds"),
    (["sweep.lr_multipliers=[1,1.0]"], "sweep.lr_multipliers"),
    (["sweep.micro_batch_sizes=[16,16]"], "sweep.micro_batch_sizes"),
    # NaN and infinity, wherever a number goes
    (["optim.lr=nan"], "optim.lr"),
    (["optim.lr=inf"], "optim.lr"),
    (["optim.lr=-inf"], "optim.lr"),
    (["optim.momentum=1.5"], "optim.momentum"),
    (["optim.weight_decay=-0.1"], "optim.weight_decay"),
    (["device.memory_budget_gb=nan"], "device.memory_budget_gb"),
    (["device.memory_budget_gb=inf"], "device.memory_budget_gb"),
    (["cluster.cpus_per_worker=nan"], "cluster.cpus_per_worker"),
    (["cluster.cpus_per_trial=inf"], "cluster.cpus_per_trial"),
    (["measure.stability_tolerance=nan"], "measure.stability_tolerance"),
    (["measure.utilization_interval_seconds=inf"], "measure.utilization_interval_seconds"),
    (["report.min_accuracy=nan"], "report.min_accuracy"),
    (["report.memory_budget_gb=inf"], "report.memory_budget_gb"),
    (["report.knee_min_gain=nan"], "report.knee_min_gain"),
    (["report.max_accuracy_drop=inf"], "report.max_accuracy_drop"),
    (["data.val_fraction=nan"], "data.val_fraction"),
    (["inference.min_timed_seconds=inf"], "inference.min_timed_seconds"),
    # out of range for the machine or the protocol
    (["cluster.dashboard_port=99999"], "cluster.dashboard_port"),
    (["cluster.dashboard_port=0"], "cluster.dashboard_port"),
    (["data.loader_workers=10000"], "data.loader_workers"),
    (["cluster.num_cpus=100000"], "cluster.num_cpus"),
    (["model.input_shape=[3,100000,100000]"], "model.input_shape"),
    (["data=synthetic", "data.num_samples=1000000000"], "model.input_shape"),  # 11 TiB held in memory
    (["model.input_shape=[1,2,3,4]"], "model.input_shape"),  # digits makes images
    (["data=cifar10", "data.download=true", "model.input_shape=[2,32,32]"], "model.input_shape"),
    (["tracking.experiment_name=''"], "tracking.experiment_name"),
    # refused by Hydra or OmegaConf themselves
    (["train.epochs=abc"], "train.epochs"),
    (["train.epochs=1.5"], "train.epochs"),
    (["cluster.include_dashboard=maybe"], "cluster.include_dashboard"),
    (["train.nope=1"], "train.nope"),
    (["model=nope"], "model/nope"),
    (["model.name=???"], "model.name"),
    (["sweep.micro_batch_sizes=[1,"], "sweep.micro_batch_sizes"),
    (["sweep.micro_batch_sizes=16,32"], "sweep.micro_batch_sizes"),  # a sweep without -m
    # your own factories, called once before Ray starts
    (["model=custom", f"model._target_={HERE}.returns_a_dict"], "model._target_"),
    (["model=custom", f"model._target_={HERE}.raises"], "model._target_"),
    (["data=custom", f"data._target_={HERE}.three_datasets"], "data._target_"),
    (["data=custom", f"data._target_={HERE}.not_datasets"], "data._target_"),
    (["data=custom", f"data._target_={HERE}.unlabelled"], "data._target_"),
    # the recipe
    (["train.lr=0.1"], "train.lr moved to optim.lr"),
    (["train.momentum=0.8"], "train.momentum moved to optim.momentum"),
    (["optim=nope"], "Could not find 'optim/nope'"),
    (["optim=adamw", "optim.betas=[0.9]"], "optim.betas"),
    (["optim=adamw", "optim.betas=[0.9,1.5]"], "optim.betas[1]"),
    (["optim.eps=0"], "optim.eps"),
    (["optim=custom", "optim._target_=no.such.factory"], "optim._target_"),
    (["loss.label_smoothing=1.5"], "loss.label_smoothing"),
    (["loss.name=hinge"], "loss.name"),
    (["sweep.precisions=[fp8]"], "sweep.precisions"),
    (["sweep.precisions=[]"], "sweep.precisions"),
    (["sweep.activation_checkpointing=[layers]"], "sweep.activation_checkpointing"),
    # sweep.parallelism (docs/parallelism.md): a list of plan.PARALLELISMS, and what sharding refuses
    (["sweep.parallelism=zero3"], "sweep.parallelism='zero3' is invalid: give a list"),
    (["sweep.parallelism=[zero4]"], "sweep.parallelism has zero4"),
    (["sweep.parallelism=[ddp,ddp]"], "sweep.parallelism gives ddp more than once"),
    # sweep.gradient_sync: a list of final | every
    (["sweep.gradient_sync=every"], "sweep.gradient_sync='every' is invalid: give a list of final, every"),
    (["sweep.gradient_sync=[sometimes]"], "sweep.gradient_sync has sometimes: use final, every"),
    (["sweep.gradient_sync=[every,every]"], "sweep.gradient_sync gives every more than once"),
    (["sweep.parallelism=[zero3]", "gns.enabled=false", "train.compile=true"],
     "train.compile=true with sweep.parallelism"),
    (["sweep.parallelism=[zero2]"], "gns.enabled=true with sweep.parallelism has zero2"),
    (["sweep.parallelism=[zero1,hsdp]"], "gns.enabled=true with sweep.parallelism has hsdp: the noise scale's"),
    (["sweep.parallelism=[hsdp]", "gns.enabled=false", "cluster.placement_strategy=STRICT_SPREAD"],
     "sweep.parallelism has hsdp with cluster.placement_strategy=STRICT_SPREAD: every rank on a node"),
    (["sweep.parallelism=[zero3]", "gns.enabled=false", "sweep.precisions=[fp16]", "cluster.use_gpu=false"],
     "sweep.parallelism=zero3 with precision fp16"),
    (["model=custom", f"model._target_={HERE}.NoBlocks", "model.input_shape=[1,8,8]", "gns.enabled=false",
      "sweep.parallelism=[ddp,zero2]"], "sweep.parallelism=zero2: NoBlocks has no blocks"),
    (["model=custom", f"model._target_={HERE}.NoBlocks", "model.input_shape=[1,8,8]",
      "sweep.activation_checkpointing=[none,blocks]"], "sweep.activation_checkpointing=blocks"),
    (["model=custom", f"model._target_={HERE}.HalfOnItsOwn", "model.input_shape=[1,8,8]",
      "sweep.precisions=[fp32,fp16]", "cluster.use_gpu=false"], "sweep.precisions has fp16"),
    # sweep.strategy=smart
    (["sweep.strategy=fast"], "sweep.strategy"),
    (["smart.eta=1"], "smart.eta"),
    (["smart.rungs=0"], "smart.rungs"),
    (["smart.confidence=1.5"], "smart.confidence"),
    (["smart.confidence=nan"], "smart.confidence"),
    (["smart.throughput_steps=0"], "smart.throughput_steps"),
    (["smart.batch_coupled=maybe"], "smart.batch_coupled"),
    # sweep.strategy=branch
    (["sweep.strategy=branch", "branch.at=[0,2]"], "branch.at"),
    (["sweep.strategy=branch", "branch.at=0.5"], "branch.at"),
    (["sweep.strategy=branch", "branch.window=-4"], "branch.window"),
    (["sweep.strategy=branch", "branch.tolerance=nan"], "branch.tolerance"),
    (["sweep.strategy=branch", "branch.lr_scaling=cubic"], "branch.lr_scaling"),
    (["sweep.strategy=branch", "sweep.lr_multipliers=[1,2]"], "sweep.lr_multipliers"),
    (["sweep.strategy=branch", "branch.base_global_batch=48"], "branch.base_global_batch"),
    (["sweep.strategy=branch", "sweep.micro_batch_sizes=[16]", "sweep.accumulation_steps=[1]",
      "sweep.num_workers=[1]"], "a global batch larger"),
    # the gradient noise scale
    (["gns.every_steps=0"], "gns.every_steps"),
    (["gns.ema_beta=1"], "gns.ema_beta"),
    # the inference task checks the same sections
    (["task=inference", "inference.batch_sizes=[0]"], "inference.batch_sizes"),
    (["task=inference", "optim.lr=nan"], "optim.lr"),
]
# The most a run that stopped at its bad input leaves in its working folder: Hydra's run logs.
NOTHING_STARTED = {".sweeper", ".sweeper/outputs"}


def run_cases(cases: List[List[str]], folder: Path, stub_driver: bool = False) -> List[Dict[str, Any]]:
    """Each case through `sweeper.__main__.main()` in one subprocess, in its own folder under `folder`.
    `stub_driver`: the train driver is replaced by `validating_driver` (no Ray)."""
    spec, results = folder / "cases.json", folder / "results.json"
    spec.write_text(json.dumps(cases))
    code = f"from {HERE} import _main; _main({str(spec)!r}, {str(results)!r}, {stub_driver})"
    env = {**os.environ, "HOME": str(folder / "home"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(results.read_text())


def validating_driver(cfg, resolved_yaml: str) -> int:
    """A stand-in for sweeper.driver.train_sweep.run that keeps its contract without Ray: a ConfigError for
    bad input, else an exit status (here the job's train.seed, so a test can choose it)."""
    from sweeper.config import validate
    from sweeper.errors import ConfigError

    problems = validate(cfg)
    if problems:
        raise ConfigError(problems)
    print(f"job: micro_batch_sizes={cfg.sweep.micro_batch_sizes} seed={cfg.train.seed}")
    return cfg.train.seed


def _made(folder: Path) -> List[str]:
    """What a run left in its working folder, two levels deep (.sweeper/outputs: Hydra's run logs)."""
    return sorted(str(p.relative_to(folder)) for p in folder.glob("*")) + sorted(
        str(p.relative_to(folder)) for p in folder.glob(".sweeper/*"))


def _main(spec: str, results: str, stub_driver: bool) -> None:
    """The subprocess's side: run every case as the CLI would, and record what it printed."""
    import sweeper.__main__ as cli

    if stub_driver:
        from sweeper.driver import train_sweep

        train_sweep.run = validating_driver
    records = []
    for index, args in enumerate(json.loads(Path(spec).read_text())):
        case_dir = Path(spec).parent / f"case{index}"
        case_dir.mkdir()
        os.chdir(case_dir)
        sys.argv = ["sweeper", *args]
        out, err, status = io.StringIO(), io.StringIO(), None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                status = exc.code
            except BaseException:  # noqa: BLE001 - an escaped exception is what the test looks for
                import traceback

                traceback.print_exc()
        records.append({
            "status": status, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "ray_imported": "ray" in sys.modules, "made": _made(case_dir),
        })
    Path(results).write_text(json.dumps(records))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> List[Dict[str, Any]]:
    folder = tmp_path_factory.mktemp("bad_input")
    return run_cases([[*args, NO_DASHBOARD] for args, _ in CASES], folder)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[" ".join(args) for args, _ in CASES])
def test_bad_input_is_one_error_line_before_ray(outcomes, index):
    key, outcome = CASES[index][1], outcomes[index]
    assert outcome["status"] == 2, outcome
    assert "Traceback" not in outcome["stderr"] + outcome["stdout"], outcome["stderr"]
    errors = [line for line in outcome["stderr"].splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and key in errors[0], outcome["stderr"]
    # Nothing started: Ray not even imported, and no store, Ray folder, Tune results or report made
    # (at most Hydra's run logs in .sweeper/outputs, when the config composed).
    assert not outcome["ray_imported"] and set(outcome["made"]) <= NOTHING_STARTED, outcome


def test_a_multirun_goes_on_after_a_job_with_bad_input(tmp_path):
    """Hydra's job runner does not catch SystemExit: a job that exited would end the multirun."""
    result = run_cli("-m", "optim.lr=nan,inf", NO_DASHBOARD, cwd=tmp_path, env={"HOME": str(tmp_path / "home")},
                     timeout=120, own_ray=True)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert [e.split(" ")[1] for e in errors] == ["optim.lr=nan", "optim.lr=inf"], result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / ".sweeper" / "ray").exists()


def test_multirun_exits_with_its_worst_job_and_takes_one_value_per_list_key(tmp_path):
    """Labelled stand-in: the train driver is replaced by its validation (no Ray); the real two-job
    multirun that measures sweeps is an end-to-end test."""
    bad_then_good, seeds, sizes, bad_compose = run_cases([
        ["-m", "optim.lr=nan,0.05"],
        ["-m", "train.seed=0,1"],
        ["-m", "sweep.micro_batch_sizes=16,32"],
        ["-m", "train.epochs=1,abc"],  # Hydra composes every job before the first runs
    ], tmp_path, stub_driver=True)
    assert bad_then_good["status"] == 2 and bad_then_good["stderr"].startswith("error: optim.lr=nan")
    assert bad_then_good["stdout"].count("job: ") == 1, bad_then_good  # the second job ran all the same
    assert seeds["status"] == 1 and seeds["stdout"].count("job: ") == 2, seeds
    assert sizes["status"] == 0, sizes
    assert [line for line in sizes["stdout"].splitlines() if line.startswith("job: ")] == [
        "job: micro_batch_sizes=[16] seed=0", "job: micro_batch_sizes=[32] seed=0"
    ]
    assert bad_compose["status"] == 2 and "job: " not in bad_compose["stdout"], bad_compose
    assert bad_compose["stderr"].startswith("error: train.epochs:") and "Traceback" not in bad_compose["stderr"]

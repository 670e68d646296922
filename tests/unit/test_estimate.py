"""`python -m sweeper.estimate` with sharding: a sharded sweep's points are predicted by the sharded model (their
phase named, both gradient syncs), not estimated as DDP without a word, and an optimizer of your own is predicted
from its measured state (no processes: fake tensors and the meta device)."""

from sweeper import config
from sweeper.estimate import report_lines
from tests.harness import compose_cfg

SMALL = ["model=gpt", "data=text", "model.d_model=32", "model.n_layer=2", "model.n_head=2", "model.context=16",
         "gns.enabled=false", "sweep.micro_batch_sizes=[2]", "sweep.accumulation_steps=[1,2]",
         "sweep.num_workers=[2]", "sweep.parallelism=[ddp,zero3]", "sweep.gradient_sync=[final,every]"]


def _rows(lines):
    """point key -> the rest of its line's columns."""
    return {line.split()[0]: line.split()[1:] for line in lines if line.startswith("mb")}


def test_a_sharded_sweep_is_predicted_per_layout_and_sync_with_its_phase():
    cfg = config.load(compose_cfg(*SMALL, "optim=adamw", "device.memory_budget_gb=1"))
    lines = report_lines(cfg, cfg.data.num_classes)
    rows = _rows(lines)
    assert sorted(rows) == sorted(["mb2-acc1-w2", "mb2-acc2-w2", "mb2-acc2-w2-every", "mb2-acc1-w2-zero3",
                                   "mb2-acc2-w2-zero3", "mb2-acc2-w2-zero3-every"])
    assert any("Sharded points: measure.sharded_memory" in line for line in lines)
    for key in ("mb2-acc1-w2-zero3", "mb2-acc2-w2-zero3", "mb2-acc2-w2-zero3-every"):
        assert rows[key][2] in ("forward", "backward", "optimizer") and rows[key][3] == "yes", rows[key]
    assert rows["mb2-acc2-w2"][2] == "step"  # a DDP point: one fake-tensor step of the whole model
    # MiB figures: the unsharded gradients `final` holds cost more than `every`'s shards
    assert float(rows["mb2-acc2-w2-zero3"][0]) > float(rows["mb2-acc2-w2-zero3-every"][0])
    # bytes a worker sends per step: `every` reduces at both micro-steps
    assert float(rows["mb2-acc2-w2-zero3-every"][-1]) > float(rows["mb2-acc2-w2-zero3"][-1]) > 0


def test_an_optimizer_of_your_own_is_predicted_from_its_measured_state():
    cfg = config.load(compose_cfg(*SMALL, "optim=custom", "optim._target_=torch.optim.RMSprop"))
    rows = _rows(report_lines(cfg, cfg.data.num_classes))
    assert rows["mb2-acc1-w2-zero3"][0] != "not" and float(rows["mb2-acc1-w2-zero3"][0]) > 0


def test_it_says_when_data_parallelism_is_not_enough():
    tight = config.load(compose_cfg(*SMALL, "optim=adamw", "device.memory_budget_gb=0.00001"))  # 10 KiB a worker
    said = [line for line in report_lines(tight, tight.data.num_classes) if "not enough" in line]
    assert len(said) == 1 and said[0].startswith("Data parallelism is not enough: even ZeRO-3 at 2 workers")
    assert "tensor or pipeline parallelism" in said[0]
    roomy = config.load(compose_cfg(*SMALL, "optim=adamw", "device.memory_budget_gb=1"))
    assert not any("not enough" in line for line in report_lines(roomy, roomy.data.num_classes))

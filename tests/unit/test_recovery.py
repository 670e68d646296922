"""A point's saves on the way (cluster.checkpoint_every_steps): a point whose worker group was lost goes on
from its latest complete save, trains as the uninterrupted point does, and is recorded as the whole point;
a torn save is passed over; the saves go once the point is reported. The node lost for real is
tests/e2e/test_node_loss.py."""

import pytest
import torch

from sweeper.cluster import recovery
from sweeper.plan import GridPoint
from sweeper.worker.spec import WorkerContext
from sweeper.worker.train import train_point
from tests.helpers import problems
from tests.unit.test_state import _losses, _spec

POINT = GridPoint(16, 2, 1)  # 32 samples a step


def test_saves_go_every_n_steps_but_the_last(tmp_path):
    spec = recovery.with_saves(_spec(POINT, 16), str(tmp_path), 4)
    folder = tmp_path / "resume" / POINT.key
    assert spec.save_states_at == {n * 32: str(folder / f"s{n * 32}") for n in (4, 8, 12)}


def test_a_lost_point_goes_on_from_its_last_save_and_is_recorded_whole(tmp_path):
    torch.set_num_threads(1)
    straight = train_point(_spec(POINT, 16), WorkerContext())
    planned = recovery.with_saves(_spec(POINT, 16), str(tmp_path), 4)
    assert recovery.resumed(planned) == (planned, None)  # nothing saved yet: from step 0
    # Its first try saved at 4, 8 and 12 steps and was lost after; the save at 12 was torn by the loss.
    train_point(planned, WorkerContext())
    (tmp_path / "resume" / POINT.key / "s384" / "meta.json").unlink()
    spec, done = recovery.resumed(planned)
    assert done == 8 and spec.start_from.endswith("s256") and spec.steps == 8
    assert sorted(spec.save_states_at) == [384]  # its later saves still made
    result = train_point(spec, WorkerContext())
    recovery.made_whole(result, done, spec)
    torch.testing.assert_close(_losses(result), _losses(straight), rtol=1e-6, atol=1e-6)
    assert result["optimizer_steps"] == 16 and result["samples_seen"] == 16 * 32
    assert result["start_samples"] == 8 * 32 and result["continued_from"] == spec.start_from
    recovery.clear(planned)
    assert not (tmp_path / "resume" / POINT.key).exists()


def test_a_save_too_late_to_time_the_rest_is_passed_over(tmp_path):
    planned = recovery.with_saves(_spec(POINT, 16), str(tmp_path), 7)  # saves at 7 and 14 steps
    train_point(planned, WorkerContext())
    spec, done = recovery.resumed(planned)  # 2 steps after 14 cannot time 1 warm-up step and 2 windows
    assert done == 7 and spec.steps == 9


@pytest.mark.parametrize("overrides, says", [
    (["sweep.strategy=smart"], "cluster.checkpoint_every_steps=5 with sweep.strategy=smart: saves on the way"),
    (["cluster.storage_path=s3://bucket/x"], "cluster.checkpoint_every_steps=5 with cluster.storage_path=s3://"),
    (["cluster.checkpoint_every_steps=0"], "cluster.checkpoint_every_steps=0: must be a positive number"),
])
def test_saves_on_the_way_it_cannot_make_are_refused_in_one_line(overrides, says):
    found = problems("model=mlp", "cluster.checkpoint_every_steps=5", *overrides)
    assert any(says in line for line in found), found


def test_a_branch_trunks_checkpoints_are_neither_continued_from_nor_deleted_with_its_record(tmp_path):
    # sweep.strategy=branch saves the trunk's state on the way for its branches, which start from those
    # checkpoints after the trunk is recorded: deleting them with the record failed every branch.
    torch.set_num_threads(1)
    trunk = _spec(POINT, 16)
    trunk.save_states_at = {n * 32: str(tmp_path / "trunk" / POINT.key / f"s{n * 32}") for n in (4, 8)}
    train_point(trunk, WorkerContext())
    assert recovery.resumed(trunk) == (trunk, None)
    recovery.clear(trunk)
    assert sorted(p.parent.name for p in (tmp_path / "trunk" / POINT.key).glob("s*/meta.json")) == ["s128", "s256"]

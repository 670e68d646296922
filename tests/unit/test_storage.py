"""cluster.storage_path: checkpoints on a URI (file:// here; s3:// and gs:// take the same pyarrow path) moved to and
from the local folders workers write and read, and one line when the storage cannot be written."""

import os
import shutil
from pathlib import Path

from sweeper.cluster import storage
from sweeper.plan import GridPoint
from sweeper.schema import PointResult
from tests.unit.test_state import _spec


def test_a_checkpoint_folder_goes_to_a_uri_and_comes_back_through_ray_trains_checkpoint(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "meta.json").write_text("{}")
    (src / "sub" / "weights.pt").write_bytes(b"\0" * 100)
    uri = f"file://{tmp_path}/store/sweep/rungs/r1-x"
    assert storage.check(f"file://{tmp_path}/store") is None
    storage.upload(str(src), uri)
    cache = {}
    local = storage.fetch(uri, cache)
    assert sorted(os.listdir(local)) == ["meta.json", "sub"] and (Path(local) / "sub" / "weights.pt").stat().st_size == 100
    assert storage.fetch(uri, cache) == local  # once per process
    storage.delete(f"file://{tmp_path}/store/sweep")
    assert not (tmp_path / "store" / "sweep").exists()
    assert storage.join("s3://b/p", "sweep", "rungs") == "s3://b/p/sweep/rungs"
    assert storage.root(None, "/ray/results", "sweep-1") == "/ray/results/sweep-1"


def test_storage_that_cannot_be_written_is_one_line_naming_the_key(tmp_path):
    (tmp_path / "file").write_text("")
    problem = storage.check(str(tmp_path / "file" / "under-a-file"))
    assert problem.startswith(f"cluster.storage_path={tmp_path / 'file' / 'under-a-file'} cannot be written from here")
    assert "\n" not in problem and "s3://bucket/path" in problem
    assert storage.check(None) is None


def test_a_worker_writes_locally_and_rank_0_uploads_to_the_uris_it_was_given(tmp_path):
    store = f"file://{tmp_path}/store"
    spec = _spec(GridPoint(16, 1, 1), 4, save_state_to=f"{store}/end")
    spec.save_states_at = {32: f"{store}/s32", 48: str(tmp_path / "plain")}
    staged = storage.Staged()
    local = staged.local(spec)
    assert not storage.is_uri(local.save_state_to) and not storage.is_uri(local.save_states_at[32])
    assert local.save_states_at[48] == str(tmp_path / "plain")  # a plain folder is written in place
    for folder in (local.save_state_to, local.save_states_at[32]):
        os.makedirs(folder)
        Path(folder, "meta.json").write_text("{}")
    result = PointResult(trial_key=spec.point.key)
    result.state.saved_state_path = local.save_state_to
    staged.persist(result)
    assert result.state.saved_state_path == f"{store}/end" and result.state.checkpoint_error is None
    assert (tmp_path / "store" / "end" / "meta.json").exists() and (tmp_path / "store" / "s32" / "meta.json").exists()
    # and back: a spec starting from a URI gets a local copy
    again = staged.local(_spec(GridPoint(16, 2, 1), 4, start_from=f"{store}/s32"))
    assert Path(again.start_from, "meta.json").exists()
    result = PointResult(trial_key=again.point.key)
    result.state.continued_from = again.start_from
    staged.persist(result)
    assert result.state.continued_from == f"{store}/s32"  # recorded as where it came from


def test_a_group_leaves_no_local_copies_behind_and_makes_none_without_uris(tmp_path):
    store = f"file://{tmp_path}/store"
    os.makedirs(tmp_path / "store" / "s32")
    Path(tmp_path / "store" / "s32" / "meta.json").write_text("{}")
    with storage.Staged() as plain:
        plain.local(_spec(GridPoint(16, 1, 1), 4))
        assert plain._folder is None and plain.cache == {}  # nothing on a URI: no folder made
    with storage.Staged() as staged:
        local = staged.local(_spec(GridPoint(16, 2, 1), 4, start_from=f"{store}/s32", save_state_to=f"{store}/end"))
        copies = [staged.folder, local.start_from]
        assert all(os.path.isdir(c) for c in copies)
    assert not any(os.path.exists(c) for c in copies)  # the staging folder and the fetched checkpoint


def test_a_failed_upload_keeps_the_state_where_the_point_wrote_it(tmp_path):
    (tmp_path / "file").write_text("")
    spec = _spec(GridPoint(16, 1, 1), 4, save_state_to=f"file://{tmp_path}/file/under-a-file")
    with storage.Staged() as staged:
        local = staged.local(spec)
        os.makedirs(local.save_state_to)
        Path(local.save_state_to, "meta.json").write_text("{}")
        result = PointResult(trial_key=spec.point.key)
        result.state.saved_state_path = local.save_state_to
        staged.persist(result)
    assert result.state.checkpoint_error.startswith("upload to cluster.storage_path failed")
    assert Path(result.state.saved_state_path, "meta.json").exists()
    shutil.rmtree(Path(local.save_state_to).parents[1])  # the staging folder this test made

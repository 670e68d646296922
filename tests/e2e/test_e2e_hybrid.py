"""ZeRO-1 and HSDP across two nodes of a real Ray cluster on this machine, through the CLI: one worker group of
four workers (two per node) measures DDP, ZeRO-1 and HSDP at one global batch. They train the same model, each
ZeRO-1 rank holds a quarter of DDP's optimizer state, HSDP's mesh is (nodes, ranks per node) with every
parameter sharded over one node's ranks only, the node of every rank is recorded, and so is each layout's
communication per step within a node and across nodes."""

import pytest

from tests.e2e.test_e2e import _runs
from tests.harness import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.own_ray]

# Four equal Linear(16, 16) layers (three blocks and the classifier, 16 synthetic classes): ZeRO-1 hands each of
# four ranks one weight and one bias, exactly a quarter. 12 steps of global batch 16: 3 warm-up, 3 windows of 3.
SWEEP = ["model=mlp", "model.depth=3", "model.width=16", "model.input_shape=[1,4,4]", "data=synthetic",
         "data.num_classes=16", "data.num_samples=400", "train.samples=192", "optim=adamw", "gns.enabled=false",
         "sweep.parallelism=[ddp,zero1,hsdp]", "sweep.micro_batch_sizes=[4]", "sweep.accumulation_steps=[1]",
         "sweep.num_workers=[4]", "measure.warmup_steps=3", "measure.windows=3", "measure.flops=false",
         "cluster.include_dashboard=false"]
TOLERANCE = 1e-5


def _series(client, run, name):
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)]


def test_zero1_and_hsdp_train_as_ddp_does_on_two_nodes_and_hsdp_shards_only_within_a_node(tmp_path):
    from ray.cluster_utils import Cluster

    # Two nodes of one CPU: the trial's driver (0.01) and four workers of 0.49 CPU, two on each node.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        node_ids = {node.node_id for node in cluster.list_all_nodes()}
        result = run_cli(*SWEEP, f"cluster.address={cluster.address}", cwd=tmp_path, timeout=900)
    finally:
        cluster.shutdown()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    client, _, children = _runs(tmp_path)
    runs = {r.data.tags["sweeper.trial_key"]: r for r in children}
    assert sorted(runs) == ["mb4-acc1-w4", "mb4-acc1-w4-hsdp", "mb4-acc1-w4-zero1"]
    ddp, zero1, hsdp = runs["mb4-acc1-w4"], runs["mb4-acc1-w4-zero1"], runs["mb4-acc1-w4-hsdp"]
    for run in (ddp, zero1, hsdp):
        tags = run.data.tags
        assert tags["sweeper.status"] == "ok", tags.get("sweeper.error")
        # Every rank's node: two ranks on each of the cluster's two nodes, node by node.
        assert run.data.metrics["num_nodes"] == 2 and tags["sweeper.rank_nodes"] == "0,0,1,1"
        assert set(tags["sweeper.nodes"].split(",")) == node_ids
    assert (zero1.data.params["parallelism"], hsdp.data.params["parallelism"]) == ("zero1", "hsdp")

    losses = _series(client, ddp, "train_loss")
    assert len(losses) == 12
    assert _series(client, zero1, "train_loss") == pytest.approx(losses, abs=TOLERANCE)
    assert _series(client, hsdp, "train_loss") == pytest.approx(losses, abs=TOLERANCE)

    # AdamW's two moments of 4 x (16 x 16 + 16) fp32 values and a 4-byte step per tensor, on every DDP rank.
    whole = 2 * 4 * 4 * 272 + 8 * 4
    assert _series(client, ddp, "memory_optimizer_state_bytes_by_rank") == [whole] * 4
    assert _series(client, zero1, "memory_optimizer_state_bytes_by_rank") == [whole / 4] * 4

    # HSDP: a row of the mesh per node, each a shard group of that node's two ranks (ranks 0, 1 on node 0).
    assert hsdp.data.tags["sweeper.mesh"] == (
        "replicate 2 x shard 2; shard groups [0, 1] [2, 3]; placements (Replicate(), Shard(dim=0))")
    assert _series(client, hsdp, "memory_optimizer_state_bytes_by_rank") == [2 * 4 * 2 * 272 + 8 * 4] * 4  # half

    # Communication per step, predicted where the ranks ran (four units of 272 fp32 values: 4352 bytes). zero1:
    # DDP's all-reduce (2 x 3/4 x 4352) and the broadcasts (3/4 x 4352), all across nodes; hsdp: within a node
    # 1/2 x ((4 + 3 blocks) x 272 x 4 gathered + 4352 reduce-scattered), across only 2 x 1/2 x its half, 2176.
    for run, within, across in ((zero1, 0, 9792), (hsdp, 5984, 2176)):
        metrics = run.data.metrics
        assert (metrics["communication_within_node_bytes_per_step"],
                metrics["communication_across_nodes_bytes_per_step"]) == (within, across)

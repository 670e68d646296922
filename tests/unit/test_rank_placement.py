"""What sweeper's record of ranks by node rests on, pinned against the installed Ray: Ray Train V2 numbers the world
ranks of a worker group after placement, node by node (`WorkerGroup._assign_worker_ranks`, a private method read
from ray/train/v2/_internal/execution/worker_group/worker_group.py in Ray 2.60), whatever order the placement
group's bundles landed in. sweeper does not rely on it (an hsdp mesh follows each rank's recorded node:
plan.mesh_by_node); this test says when a Ray upgrade changes it, so docs/cluster.md's account stays true."""

from ray.train.v2._internal.execution.worker_group.worker import ActorMetadata, Worker
from ray.train.v2._internal.execution.worker_group.worker_group import WorkerGroup

from sweeper.plan import mesh_by_node


def _worker(node: str, bundle: int, gpu=None) -> Worker:
    metadata = ActorMetadata(hostname=node, node_id=node, node_ip=f"10.0.0.{ord(node[-1])}", pid=bundle,
                             accelerator_ids={"GPU": [gpu]} if gpu is not None else {})
    return Worker(actor=None, metadata=metadata, resources={"CPU": 0.5}, placement_group_bundle_index=bundle)


def test_ray_train_numbers_a_worker_groups_ranks_node_by_node_whatever_order_its_bundles_landed_in():
    # Bundles 0..5 placed on nodes a, b, a, b, c, c (as a SPREAD or a partly-filled PACK can).
    landed = [_worker(node, i) for i, node in enumerate("abab" + "cc")]
    ranked = WorkerGroup._assign_worker_ranks(landed)
    nodes = [w.metadata.node_id for w in sorted(ranked, key=lambda w: w.distributed_context.world_rank)]
    assert nodes == ["a", "a", "b", "b", "c", "c"]
    assert mesh_by_node(nodes) == [[0, 1], [2, 3], [4, 5]]  # the rows are consecutive ranks
    assert [w.distributed_context.local_rank for w in ranked] == [0, 1, 0, 1, 0, 1]
    assert [w.distributed_context.node_rank for w in ranked] == [0, 0, 1, 1, 2, 2]


def test_on_a_node_ray_train_numbers_gpu_workers_by_their_lowest_gpu_id():
    landed = [_worker("a", 0, gpu=1), _worker("b", 1, gpu=0), _worker("a", 2, gpu=0), _worker("b", 3, gpu=1)]
    ranked = WorkerGroup._assign_worker_ranks(landed)
    assert [(w.metadata.node_id, w.metadata.gpu_ids[0]) for w in ranked] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]

"""measure.node_traffic: zero1's and hsdp's bytes per rank per optimizer step, within a node and across nodes, on
units worked by hand. What four gloo ranks really issue is compared with it in tests/unit/test_hybrid_sharding.py."""

import pytest

from sweeper.measure import node_traffic
from sweeper.measure.sharded_memory import Unit

# 40 + 40 + 12 values (the root's 3 rows pad to 4 over a shard group of 2 or 4: 16).
UNITS = [Unit("block0", ((8, 4), (8,))), Unit("block1", ((8, 4), (8,))), Unit("root", ((3, 4),))]


def test_zero1_sends_ddps_all_reduce_and_a_broadcast_of_every_parameter_over_every_rank():
    # 92 fp32 values = 368 bytes: all-reduce 2 x 3/4 x 368 = 552, broadcast 3/4 x 368 = 276.
    one_node = node_traffic.per_step(UNITS, "zero1", 4, accumulation_steps=2)
    assert (one_node.within_node_bytes, one_node.across_nodes_bytes) == (828, 0)
    assert (one_node.all_reduce_payload_bytes, one_node.broadcast_payload_bytes) == (368, 368)
    two_nodes = node_traffic.per_step(UNITS, "zero1", 4, accumulation_steps=2, nodes=2)
    assert (two_nodes.within_node_bytes, two_nodes.across_nodes_bytes) == (0, 828)  # its group spans them
    assert node_traffic.per_step(UNITS, "zero1", 1, 1).total_bytes == 0


def test_hsdp_gathers_and_scatters_within_a_node_and_all_reduces_only_its_shards_across_nodes():
    # Two nodes of two, accumulation 2: per micro-step every unit (96 padded values) gathered for forward and the
    # blocks (80) again for backward: (96 + 80) x 4 bytes x 2 = 1408; 384 bytes reduce-scattered once. Within:
    # 1/2 x (1408 + 384) = 896. Across: the rank's 192 bytes of gradient shards all-reduced over 2 nodes, 192.
    traffic = node_traffic.per_step(UNITS, "hsdp", 4, accumulation_steps=2, nodes=2)
    assert (traffic.within_node_bytes, traffic.across_nodes_bytes) == (896, 192)
    assert (traffic.all_gather_payload_bytes, traffic.reduce_scatter_payload_bytes,
            traffic.all_reduce_payload_bytes) == (1408, 384, 192)
    # One node of four (a local Ray): ZeRO-3's traffic, 3/4 x ((96 + 80) x 4 + 384) = 816, nothing across.
    local = node_traffic.per_step(UNITS, "hsdp", 4, accumulation_steps=1)
    assert (local.within_node_bytes, local.across_nodes_bytes, local.all_reduce_payload_bytes) == (816, 0, 0)
    # A rank per node: nothing to shard (nor pad) within, the whole gradient (92 x 4) all-reduced over 4 nodes.
    spread = node_traffic.per_step(UNITS, "hsdp", 4, accumulation_steps=1, nodes=4)
    assert (spread.within_node_bytes, spread.across_nodes_bytes) == (0, 552)
    # bf16 gathers: half the gathered bytes, the reduce still fp32.
    assert node_traffic.per_step(UNITS, "hsdp", 4, 2, nodes=2, gather_bytes_per_value=2).all_gather_payload_bytes == 704


def test_other_layouts_and_uneven_nodes_are_refused():
    with pytest.raises(ValueError, match="zero1, or hsdp"):
        node_traffic.per_step(UNITS, "zero3", 4, 1)
    assert node_traffic.per_step(UNITS, "zero1", 4, 1, nodes=3).across_nodes_bytes == 828  # uneven: zero1 spans them
    with pytest.raises(ValueError, match="same number of ranks"):
        node_traffic.per_step(UNITS, "hsdp", 4, 1, nodes=3)

"""Batch arithmetic: the grid, the global-batch filter, LR scaling, the step budget, the stream."""


import pytest

from sweeper.plan import GridPoint, expand_grid, optimizer_steps, scaled_lr, stream_indices, worker_groups


def test_grid_is_the_product_and_global_batch_is_micro_x_accum_x_workers():
    points = expand_grid([16, 32], [1, 4], [1, 2])
    assert len(points) == 8
    assert GridPoint(32, 4, 2).global_batch_size == 256
    assert {p.key for p in points} >= {"mb16-acc1-w1", "mb32-acc4-w2"}


def test_duplicates_are_dropped():
    assert len(expand_grid([16, 16], [1], [1])) == 1


def test_global_batch_filter_keeps_only_matching_points():
    points = expand_grid([8, 16, 32], [1, 2, 4], [1, 2], global_batch_sizes=[32])
    assert points and all(p.global_batch_size == 32 for p in points)
    assert set(points) == {GridPoint(8, 4, 1), GridPoint(16, 2, 1), GridPoint(32, 1, 1),
                           GridPoint(8, 2, 2), GridPoint(16, 1, 2)}
    assert expand_grid([8], [1], [1], global_batch_sizes=[64]) == []


@pytest.mark.parametrize("rule,expected", [("none", 0.1), ("linear", 0.4), ("sqrt", 0.2)])
def test_lr_scaling(rule, expected):
    assert scaled_lr(0.1, 128, 32, rule) == pytest.approx(expected)


def test_unknown_lr_rule_is_rejected():
    with pytest.raises(ValueError, match="should be one of|Should be one of"):
        scaled_lr(0.1, 64, 32, "cubic")


def test_step_budget_gives_every_layout_the_same_samples_up_to_one_global_batch():
    n, epochs = 1437, 3
    for g in (16, 48, 256):
        seen = optimizer_steps(n, epochs, g) * g
        assert n * epochs - g < seen <= n * epochs


def test_stream_gives_each_step_the_same_samples_whatever_the_layout():
    perms = [list(range(10))[::-1], list(range(10))]  # two "epochs"
    one = GridPoint(2, 2, 1)  # global 4
    two = GridPoint(1, 2, 2)  # global 4
    steps = 4  # crosses the epoch boundary at sample 10
    single = stream_indices(perms, 0, steps, one, 0)
    ranks = [stream_indices(perms, 0, steps, two, r) for r in range(2)]
    assert len(single) == steps * 4 and all(len(r) == steps * 2 for r in ranks)
    for k in range(steps):
        step_single = set(single[4 * k : 4 * k + 4])
        step_ranks = set(ranks[0][2 * k : 2 * k + 2]) | set(ranks[1][2 * k : 2 * k + 2])
        assert step_single == step_ranks
    assert single[8:12] == [1, 0, 0, 1]  # epoch 0's tail then epoch 1's head


def test_layouts_with_the_same_micro_batch_fill_each_micro_batch_with_the_same_samples():
    # BatchNorm normalizes over a micro-batch: accumulation 2 on 1 worker and 2 workers without
    # accumulation must group the samples alike, or they train different models on the same data.
    perms = [list(range(24))[::-1]]
    accumulated = stream_indices(perms, 0, 3, GridPoint(4, 2, 1), 0)
    ranks = [stream_indices(perms, 0, 3, GridPoint(4, 1, 2), r) for r in range(2)]

    def micro_batches(indices):
        return [indices[i : i + 4] for i in range(0, len(indices), 4)]

    from_ranks = [mb for pair in zip(*map(micro_batches, ranks)) for mb in pair]  # step by step, rank 0 first
    assert micro_batches(accumulated) == from_ranks
    assert micro_batches(accumulated)[:2] == [[23, 22, 21, 20], [19, 18, 17, 16]]  # consecutive samples
    # Resuming mid-stream gives the same indices as the whole stream cut there.
    assert stream_indices(perms, 1, 3, GridPoint(4, 1, 2), 1) == ranks[1][4:]


def test_worker_groups_hold_every_point_ordered_by_worker_count():
    points = expand_grid([16, 32], [1, 2], [1, 2])  # workers vary fastest
    (group,) = worker_groups(points)
    assert [p.num_workers for p in group] == [1, 1, 1, 1, 2, 2, 2, 2]
    assert [p for p in group if p.num_workers == 1] == [p for p in points if p.num_workers == 1]  # stable
    chunks = worker_groups(points, points_per_group=3)
    assert [[p.num_workers for p in g] for g in chunks] == [[1, 1, 1], [1, 2, 2], [2, 2]]
    assert worker_groups(points, points_per_group=1) == [[p] for p in group]
    assert worker_groups([]) == []

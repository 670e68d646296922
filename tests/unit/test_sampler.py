"""The sample order computed on demand (sweeper/permutation.py, sampler.GlobalBatchSampler): each epoch a
seeded bijection of [0, N), the rank's indices plan.rank_runs' positions looked up in it, in memory that
does not grow with N. The order is not torch.randperm's (the change is in docs/data.md); what layouts share is
unchanged: the same samples at every step."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from sweeper.permutation import Permutation, epoch_seed
from sweeper.plan import GridPoint, rank_runs
from sweeper.sampler import GlobalBatchSampler, epoch_order, indices_at


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 16, 17, 1000, 4097, 65_537])
def test_each_order_is_a_bijection_of_the_dataset(n):
    order = Permutation(n, 12345)[np.arange(n)]
    assert sorted(order.tolist()) == list(range(n))
    assert Permutation(n, 12345)[n - 1] == int(order[-1])  # one index alone: the same place


def test_orders_are_seeded_and_differ_between_seeds_and_epochs():
    n = 1000
    first = Permutation(n, 7)[np.arange(n)]
    assert (first == Permutation(n, 7)[np.arange(n)]).all()  # the same on every call (and machine)
    assert (first != Permutation(n, 8)[np.arange(n)]).mean() > 0.9
    epochs = [epoch_order(n, 0, e)[np.arange(n)] for e in range(2)]
    assert (epochs[0] != epochs[1]).mean() > 0.9 and epoch_seed(0, 1) != epoch_seed(1, 0)
    with pytest.raises(IndexError, match="index 1000 is outside the permutation of 1000"):
        Permutation(n, 7)[np.array([1000])]


def test_a_sample_lands_anywhere_alike():
    # Where sample 0 of 10 lands over 5,000 seeds: each place ~500 times (a chi-square of 9 degrees of freedom
    # above 27.9 has probability 0.001).
    places = np.bincount([Permutation(10, seed)[0] for seed in range(5000)], minlength=10)
    chi_square = ((places - 500) ** 2 / 500).sum()
    assert chi_square < 27.9, places


def test_the_sampler_yields_the_rank_positions_looked_up_in_each_epochs_order():
    point = GridPoint(3, 2, 2)
    sampler = GlobalBatchSampler(50, point, 1, 20, 4, start_sample=7)  # 20 steps of 12 from 7: into epoch 4
    positions = [p for first, n in rank_runs(0, 20, point, 1, 7) for p in range(first, first + n)]
    assert list(sampler) == indices_at(50, 4, np.array(positions)).tolist()
    assert len(list(sampler)) == len(sampler) == 20 * 6
    # Every epoch is each sample once, whichever rank reads it.
    both = [i for rank in range(2) for i in GlobalBatchSampler(48, GridPoint(4, 3, 2), rank, 2, 4)]
    assert sorted(both) == list(range(48))


def test_layouts_of_one_global_batch_get_the_same_samples_from_the_sampler_at_every_step():
    def per_step(point):
        ranks = [list(GlobalBatchSampler(100, point, r, 30, 9)) for r in range(point.num_workers)]
        share = point.micro_batch_size * point.accumulation_steps
        return [sorted(i for r in ranks for i in r[k * share:(k + 1) * share]) for k in range(30)]

    reference = per_step(GridPoint(8, 1, 1))  # 240 samples: into the third epoch
    for point in (GridPoint(2, 4, 1), GridPoint(4, 1, 2), GridPoint(1, 4, 2)):
        assert per_step(point) == reference, point.key


def test_the_sampler_holds_a_chunk_of_indices_whatever_the_dataset_size():
    # 50 million samples: a list of their permutation would take ~2 GB (randperm(N).tolist()); the sampler
    # holds one chunk of a few MiB, at any position of the epoch.
    tracemalloc.start()
    try:
        sampler = GlobalBatchSampler(50_000_000, GridPoint(256, 1, 1), 0, 300, 0, start_sample=30_000_000)
        count = sum(1 for _ in sampler)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 300 * 256 and peak < 16 * 2**20, peak

"""A seeded permutation of [0, n) computed index by index, never as a list of n: the sample order of one
epoch at any dataset size, in memory that does not grow with n (numpy only; no other part of sweeper).

A Feistel network on the smallest even number of bits that holds n, walked until it lands inside [0, n)
(cycle walking: Black and Rogaway 2002, "Ciphers with arbitrary finite domains"). Each round is a keyed
64-bit mix (splitmix64's finalizer), so four rounds make a pseudorandom permutation (Luby and Rackoff
1988). Vectorized over numpy arrays: a chunk of indices costs a few dozen array operations.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 4
# splitmix64's finalizer constants (Steele, Lea and Flood 2014): every input bit moves every output bit.
_MIX_1, _MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def epoch_seed(seed: int, epoch: int) -> int:
    """The sample order's seed for one epoch of one replicate. Not `seed + epoch`: then replicate 1's
    first epoch would be replicate 0's second, and `sweep.seeds` replicates would replay each other's
    orders one epoch apart."""
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, epoch]).generate_state(1)[0])


class Permutation:
    """A bijection of [0, n) keyed by `seed`: `self[indices]` maps an array of indices (or one int) to
    their places in the shuffled order. The same (n, seed) gives the same order on every machine and
    numpy version (integer arithmetic only)."""

    def __init__(self, n: int, seed: int):
        if n < 1:
            raise ValueError(f"a permutation needs at least one element, not n={n}")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        self.half = (bits + 1) // 2  # the two halves of an even number of bits: a domain of at most 4n
        self.mask = np.uint64((1 << self.half) - 1)
        self.keys = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF]).generate_state(
            ROUNDS, dtype=np.uint64)

    def __getitem__(self, indices):
        """The shuffled position of each index in `indices` (a numpy array or an int in [0, n))."""
        scalar = np.isscalar(indices)
        x = np.asarray(indices, dtype=np.uint64).reshape(-1)
        if x.size and int(x.max()) >= self.n:
            raise IndexError(f"index {int(x.max())} is outside the permutation of {self.n}")
        y = self._encrypt(x)
        outside = y >= np.uint64(self.n)
        while outside.any():  # each walk leaves the 4n-domain's extra part with probability >= 1/4
            y[outside] = self._encrypt(y[outside])
            outside = y >= np.uint64(self.n)
        out = y.astype(np.int64)
        return int(out[0]) if scalar else out

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.half)
        left, right = x >> shift, x & self.mask
        for key in self.keys:
            mixed = _mix(right ^ key)
            mixed &= self.mask
            mixed ^= left
            left, right = right, mixed
        left <<= shift
        left |= right
        return left


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on a uint64 array, in place (wrapping multiplication)."""
    x ^= x >> np.uint64(30)
    x *= _MIX_1
    x ^= x >> np.uint64(27)
    x *= _MIX_2
    x ^= x >> np.uint64(31)
    return x

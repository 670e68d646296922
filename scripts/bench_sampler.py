"""The sampler's memory and time per epoch at 1M, 10M and 100M samples: today's (sweeper.sampler, a seeded
permutation computed index by index) against the one it replaced (torch.randperm(N).tolist() per epoch, then
plan.stream_indices' list of the rank's indices).

Each (sampler, N) runs in a fresh process: after the imports, the process's resident set is read, then one
rank's sampler is iterated over one epoch (N // global batch optimizer steps, one worker, micro-batch 32 x
accumulation 1, as torch's DataLoader iterates it), timed, and the process's peak resident set above that
baseline is its memory. The replaced sampler at 100M needs ~7 GB (100M Python ints and three lists of them):
it runs only with --old-max 100000000 on a machine with that much free; the table says where it was not run.

    slot python scripts/bench_sampler.py              # 1M, 10M, 100M; the old one up to 10M
    slot python scripts/bench_sampler.py --sizes 1000000 --old-max 1000000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

MICRO, ACCUMULATION, WORKERS = 32, 1, 1


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _old_sampler(num_samples: int, point, steps: int, seed: int):
    """The sampler as it was before sweeper.permutation: every epoch's permutation as a Python list."""
    import torch

    from sweeper.permutation import epoch_seed
    from sweeper.plan import stream_indices

    last = math.ceil(steps * point.global_batch_size / num_samples)
    perms = [torch.randperm(num_samples, generator=torch.Generator().manual_seed(epoch_seed(seed, e))).tolist()
             for e in range(last)]
    return iter(stream_indices(perms, 0, steps, point, 0))


def _one(kind: str, num_samples: int) -> dict:
    """Run in the child: one epoch of one rank's sampler."""
    from sweeper.plan import GridPoint
    from sweeper.sampler import GlobalBatchSampler

    point = GridPoint(MICRO, ACCUMULATION, WORKERS)
    steps = num_samples // point.global_batch_size
    baseline = _rss_bytes()
    began = time.perf_counter()
    indices = _old_sampler(num_samples, point, steps, 0) if kind == "old" else \
        iter(GlobalBatchSampler(num_samples, point, 0, steps, 0))
    count = checksum = 0
    for index in indices:
        count += 1
        checksum ^= index
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"kind": kind, "n": num_samples, "seconds": seconds, "peak_above_baseline_bytes": max(0, peak - baseline),
            "indices": count}


def _table(rows) -> str:
    lines = [f"{'samples':>12} | {'sampler':<28} | {'s / epoch':>9} | {'peak RSS above baseline':>23}",
             "-" * 82]
    names = {"new": "permutation (sweeper today)", "old": "randperm(N).tolist() (before)"}
    for row in rows:
        if row.get("skipped"):
            lines.append(f"{row['n']:>12,} | {names[row['kind']]:<28} | {'-':>9} | {row['skipped']:>23}")
            continue
        lines.append(f"{row['n']:>12,} | {names[row['kind']]:<28} | {row['seconds']:>9.2f} | "
                     f"{row['peak_above_baseline_bytes'] / 2**20:>19,.1f} MiB")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    parser.add_argument("--old-max", type=int, default=10_000_000,
                        help="the largest N the replaced sampler runs at (its lists need ~70 bytes a sample)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one(args.child[0], int(args.child[1]))))
        return
    rows = []
    for n in args.sizes:
        for kind in ("new", "old"):
            if kind == "old" and n > args.old_max:
                rows.append({"kind": kind, "n": n, "skipped": "not run (> --old-max)"})
                continue
            out = subprocess.run([sys.executable, __file__, "--child", kind, str(n)], capture_output=True, text=True,
                                 check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"done: {kind} at {n:,}", file=sys.stderr)
    print(f"one rank, one epoch (micro-batch {MICRO}, accumulation {ACCUMULATION}, {WORKERS} worker), "
          "each in a fresh process")
    print(_table(rows))


if __name__ == "__main__":
    main()

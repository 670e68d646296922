"""Decode knee, measured against the decode roofline's prediction (issue 31, seed 003's transformer section).

In one process (no Ray): sweeper's GPT decodes with its KV cache at each context, batch sizes 1..N
concurrent sequences, each decode step timed as task=inference times it (sweeper.inference.latency);
the machine's peak FLOP/s (the faster of a large matmul and convolution) and memory bandwidth (a 256 MiB
copy) measured once; the predicted knee from the counted decode FLOPs per token, the weights' bytes and
each sequence's KV cache bytes read per step. Prints a table per context and the figures behind it.

    python scripts/bench_decode.py                       # contexts 64 and 256, batches 1..128, 1 thread
    python scripts/bench_decode.py --contexts 32 512 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from sweeper.config import ModelConfig  # noqa: E402
from sweeper.inference import roofline  # noqa: E402
from sweeper.inference.latency import InferenceSpec, run_inference_points  # noqa: E402
from sweeper.inference import bandwidth  # noqa: E402
from sweeper.measure import flops  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--timed-runs", type=int, default=50)
    parser.add_argument("--min-gain", type=float, default=0.10, help="the knee rule: a doubling gains less")
    args = parser.parse_args()

    context = max(args.contexts)
    model = ModelConfig(name="gpt", n_layer=args.n_layer, n_head=4, d_model=args.d_model, context=context,
                        input_shape=[context])
    torch.set_num_threads(args.threads)
    moved = bandwidth.measure_cpu_bandwidth(args.threads)
    print(f"machine: {args.threads} thread(s); bandwidth {moved.bytes_per_second / 1e9:.1f} GB/s ({moved.source})")
    for ctx in args.contexts:
        from sweeper.workloads import gpt

        per_token = gpt.decode_flops_per_token(256, ctx, args.n_layer, args.d_model)
        count = flops.FlopCount(forward_per_sample=per_token, train_per_sample=3 * per_token)
        specs = [InferenceSpec(model=model, num_classes=256, batch_size=b, timed_runs=args.timed_runs,
                               min_timed_seconds=0.3, flop_count=count, context=ctx) for b in args.batches]
        rows = []
        run_inference_points(specs, rows.append, threads=args.threads)
        ok = [r for r in rows if r.status == "ok"]
        first = ok[0]
        peak = first.flops.peak_flops_per_second
        prediction = roofline.predict_knee(first.decode.decode_flops_per_token, first.decode.weight_bytes,
                                           first.decode.kv_cache_formula_bytes_per_sequence, peak,
                                           moved.bytes_per_second)
        grid = [int(r.batch_size) for r in ok]
        measured = roofline.measured_knee(grid, [r.decode.tokens_per_second for r in ok], args.min_gain)
        predicted = prediction.knee_on_grid(grid, args.min_gain)
        print(f"\ncontext {ctx}: peak {peak / 1e9:.1f} GFLOP/s ({first.flops.peak_flops_source}); decode FLOPs per "
              f"token counted {first.decode.decode_flops_per_token:,.0f} (closed form "
              f"{first.decode.decode_flops_formula_per_token:,.0f}); weights {first.decode.weight_bytes:,} B; KV cache "
              f"{first.decode.kv_cache_bytes_per_sequence:,.0f} B per sequence (formula "
              f"{first.decode.kv_cache_formula_bytes_per_sequence:,.0f})")
        print(f"  {'batch':>5} {'step p50 ms':>11} {'p99 ms':>8} {'tokens/s':>9} {'roofline tokens/s':>17} {'MFU':>6}")
        for r in ok:
            b = int(r.batch_size)
            print(f"  {b:>5} {r.latency.latency_p50_seconds * 1e3:>11.3f} {r.latency.latency_p99_seconds * 1e3:>8.3f} "
                  f"{r.decode.tokens_per_second:>9,.0f} {prediction.samples_per_second(b):>17,.0f} "
                  f"{(r.flops.mfu or 0):>6.1%}")
        print(f"  knee: measured {measured if measured is not None else 'beyond the grid (still climbing)'}, "
              f"predicted on the same grid {predicted if predicted is not None else 'beyond the grid'}; "
              f"{prediction.explanation}")
    print("\nOn a CPU the measured knee is a lower bound of a GPU's: small matmuls run far below the peak, and "
          "the weights sit in cache rather than streaming from memory at every step.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

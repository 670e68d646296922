"""Validate sweeper.batching_sim against a real Ray Serve `@serve.batch` server running seed 003's MLP on CPU.
Prints `name: value` lines, a measured-vs-simulated table per device and load level, and a grid recommendation.

    python scripts/bench_batching_sim.py [--requests 1500] [--loads 0.05,0.15] [--max-batch-size 4]
        [--max-wait-ms 5] [--seed 0] [--device both] [--slo-ms 30] [--quick] [--dump run.npz]

Steps: (1) time the model per batch size in this process; (2) start local Ray + Serve with one replica and
time the same batch function inside it (the curve the simulator uses); (3) measure Serve's per-request path
(send -> batch start, batch end -> answer) at low load with max_batch_size=1; (4) drive open-loop Poisson load
through a DeploymentHandle, then simulate the send times that were actually generated and compare percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sweeper.inference import batching_sim as bsim  # noqa: E402

IN_FEATURES, DEPTH, WIDTH, NUM_CLASSES = 1024, 8, 1024, 10
P50_GOAL, P99_GOAL = 0.15, 0.25


def build_mlp():
    """Seed 003's MLP (depth 8, width 1024): the layers of sweeper.workloads.mlp.MLP, built here so the replica
    does not import the project's config stack."""
    from torch import nn

    layers: List[nn.Module] = []
    features = IN_FEATURES
    for _ in range(DEPTH):
        layers += [nn.Linear(features, WIDTH), nn.ReLU()]
        features = WIDTH
    layers.append(nn.Linear(features, NUM_CLASSES))
    return nn.Sequential(*layers).eval()


def run_batch(model, inputs: Sequence[np.ndarray]) -> List[int]:
    """Everything the replica does per batch: stack the requests, run the model, split the answers."""
    import torch

    with torch.inference_mode():
        logits = model(torch.from_numpy(np.stack(inputs)))
    return logits.argmax(dim=1).tolist()


def time_curve(model, sizes: Sequence[int], runs: int, warmup: int, seed: int) -> Dict[int, List[float]]:
    """Seconds per batch of each size: `warmup` untimed runs, then `runs` timed ones, sizes interleaved
    round-robin so a slow spell on the machine spreads over all sizes instead of biasing one."""
    rng = np.random.default_rng(seed)
    batches = {b: [rng.standard_normal(IN_FEATURES, dtype=np.float32) for _ in range(b)] for b in sizes}
    for b in sizes:
        for _ in range(warmup):
            run_batch(model, batches[b])
    samples: Dict[int, List[float]] = {b: [] for b in sizes}
    for _ in range(runs):
        for b in sizes:
            start = time.perf_counter()
            run_batch(model, batches[b])
            samples[b].append(time.perf_counter() - start)
    return samples


def make_deployment(max_batch_size: int, max_wait_seconds: float):
    from ray import serve

    # max_ongoing_requests well above max_batch_size: otherwise the handle's router holds requests back
    # and batches can never fill (Serve warns about this). One replica, one CPU, one torch thread.
    @serve.deployment(num_replicas=1, max_ongoing_requests=4096,
                      ray_actor_options={"num_cpus": 1,
                                         "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}})
    class BatchedMLP:
        def __init__(self):
            import torch

            torch.set_num_threads(1)
            torch.manual_seed(0)
            self.model = build_mlp()
            self.emulated: Optional[Dict[int, List[float]]] = None
            self.rng = random.Random(0)

        # The documented handler shape: an async def that runs the model synchronously (policy "serve").
        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=max_wait_seconds)
        async def infer(self, inputs: List[np.ndarray]) -> List[tuple]:
            start = time.perf_counter()
            if self.emulated is None:
                answers = run_batch(self.model, inputs)
            else:
                # Emulated accelerator: block the loop for a measured service time, leaving the CPU free.
                time.sleep(self.rng.choice(self.emulated[len(inputs)]))
                answers = [0] * len(inputs)
            end = time.perf_counter()
            return [(answer, len(inputs), start, end) for answer in answers]

        async def __call__(self, x: np.ndarray) -> tuple:
            # perf_counter is CLOCK_MONOTONIC, one clock for every process on the machine, so these
            # stamps line up with the driver's send and receive times.
            entered = time.perf_counter()
            answer, size, start, end = await self.infer(x)
            return answer, size, start, end, entered, time.perf_counter()

        async def configure(self, max_batch_size: int, max_wait_seconds: float,
                            emulated: Optional[Dict[int, List[float]]] = None) -> None:
            self.infer.set_max_batch_size(max_batch_size)
            self.infer.set_batch_wait_timeout_s(max_wait_seconds)
            self.emulated = emulated

        # async so it runs on the user-code event-loop thread, the thread that runs `infer`.
        async def measure_curve(self, sizes: List[int], runs: int, warmup: int, seed: int) -> Dict[int, List[float]]:
            return time_curve(self.model, sizes, runs, warmup, seed)

    return BatchedMLP


async def drive(handle, arrivals: np.ndarray, max_outstanding: int, seed: int) -> dict:
    """Open-loop load: send request k at `arrivals[k]` seconds from now, whatever is still in flight
    (up to `max_outstanding`, a safety cap; sends it delays are counted). Records the actual send times."""
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(IN_FEATURES, dtype=np.float32) for _ in range(64)]
    n = len(arrivals)
    sent, done = np.zeros(n), np.zeros(n)
    replies: List[tuple] = [()] * n
    slots = asyncio.Semaphore(max_outstanding)
    capped = 0

    async def one(k: int) -> None:
        sent[k] = time.perf_counter()
        replies[k] = await handle.remote(inputs[k % len(inputs)])
        done[k] = time.perf_counter()
        slots.release()

    tasks = []
    origin = time.perf_counter()
    for k in range(n):
        delay = origin + arrivals[k] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if slots.locked():
            capped += 1
        await slots.acquire()
        tasks.append(asyncio.create_task(one(k)))
    await asyncio.gather(*tasks)
    entered, left = np.array([r[4] for r in replies]), np.array([r[5] for r in replies])
    start, end = np.array([r[2] for r in replies]), np.array([r[3] for r in replies])
    return {"sent": sent, "latency": done - sent, "entered": entered, "left": left, "done": done,
            "batch_size": np.array([r[1] for r in replies]), "batch_start": start, "batch_end": end,
            # Send to the start of its batch, and batch end to the answer: at low load with max_batch_size=1,
            # nothing queues, so these two are Serve's path and all of the latency but the model run.
            "to_start": start - sent, "from_end": done - end,
            "capped": capped, "schedule_lag": (sent - origin) - arrivals}


def run_level(handle, rate: float, num_requests: int, max_outstanding: int, seed: int) -> dict:
    arrivals = bsim.poisson_arrivals(rate, num_requests, seed)
    gc.collect()
    gc.freeze()  # the load generator's own GC pauses are not part of the system under test
    try:
        return asyncio.run(drive(handle, arrivals, max_outstanding, seed))
    finally:
        gc.unfreeze()


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def percentile_ms(values: np.ndarray, q: float) -> str:
    return ms(float(np.percentile(values, q)))


def curve_summary(samples: Dict[int, List[float]]) -> str:
    return "  ".join(f"{b}:{ms(statistics.median(s))}" for b, s in sorted(samples.items()))


def batches_of(run: dict) -> Dict[int, List[float]]:
    """Execution seconds of each distinct batch in a run, by batch size."""
    seen: Dict[float, tuple] = {}
    for size, start, end in zip(run["batch_size"], run["batch_start"], run["batch_end"]):
        seen[float(start)] = (int(size), float(end - start))
    by_size: Dict[int, List[float]] = {}
    for size, took in seen.values():
        by_size.setdefault(size, []).append(took)
    return by_size


def in_run_curve(run: dict, fallback: bsim.LatencyCurve) -> bsim.LatencyCurve:
    """The curve of what the replica actually spent per batch during the run (sizes seen >= 5 times;
    the rest interpolated). Falls back to `fallback` if no size was seen often enough."""
    samples = {b: t for b, t in batches_of(run).items() if len(t) >= 5}
    return bsim.LatencyCurve.from_samples(samples) if samples else fallback


def mean_batch_size(run: dict) -> float:
    """Per batch (requests / batches), as the simulator reports it; each request's own batch size would
    weigh big batches once per member."""
    return len(run["batch_size"]) / len(np.unique(run["batch_start"]))


def simulate_like(run: dict, curve: bsim.LatencyCurve, max_batch_size: int, max_wait: float,
                  path: dict, repeats: int) -> Dict[str, float]:
    """Simulate the run's actual send times, averaging percentiles over `repeats` service/path draws."""
    arrivals = run["sent"] - run["sent"][0]
    results = [bsim.simulate(arrivals, curve, max_batch_size, max_wait, policy="serve",
                             inbound_seconds=path["to_start"], overhead_seconds=path["from_end"], seed=s)
               for s in range(repeats)]
    return {"p50": float(np.mean([r.latency_p50_seconds for r in results])),
            "p99": float(np.mean([r.latency_p99_seconds for r in results])),
            "mean_batch": float(np.mean([r.mean_batch_size for r in results])),
            "busy": float(np.mean([r.busy_fraction for r in results]))}


def print_table(device: str, rows: list, max_batch: int, max_wait_ms: float, requests: int) -> bool:
    """Measured vs simulated percentiles per load level; True if every level met both goals with sim B."""
    print()
    print(f"device={device}, max_batch_size={max_batch}, max_wait={max_wait_ms:g} ms, policy=serve (blocking "
          f"handler), {requests} requests per level, latencies in ms")
    print(f"{'load':>5} {'req/s':>6} {'busy':>5} | {'meas p50':>8} {'A p50':>7} {'err':>6} {'B p50':>7} {'err':>6} "
          f"| {'meas p99':>8} {'A p99':>7} {'err':>6} {'B p99':>7} {'err':>6} | {'meas b':>6} {'A b':>5} {'B b':>5} "
          "| goals")
    verdicts = {"A": True, "B": True}
    for load, run, sim_a, sim_b in rows:
        p50, p99 = float(np.percentile(run["latency"], 50)), float(np.percentile(run["latency"], 99))
        errs = {}
        for name, sim in (("A", sim_a), ("B", sim_b)):
            errs[name] = (sim["p50"] / p50 - 1, sim["p99"] / p99 - 1)
            met = abs(errs[name][0]) <= P50_GOAL and abs(errs[name][1]) <= P99_GOAL
            verdicts[name] &= met
            errs[name] += ("met" if met else "MISSED",)
        achieved = (len(run["sent"]) - 1) / (run["sent"][-1] - run["sent"][0])
        print(f"{load:5.2f} {achieved:6.0f} {sim_b['busy']:5.2f} | {ms(p50):>8} {ms(sim_a['p50']):>7} "
              f"{errs['A'][0]:+6.1%} {ms(sim_b['p50']):>7} {errs['B'][0]:+6.1%} | {ms(p99):>8} {ms(sim_a['p99']):>7} "
              f"{errs['A'][1]:+6.1%} {ms(sim_b['p99']):>7} {errs['B'][1]:+6.1%} | {mean_batch_size(run):6.2f} "
              f"{sim_a['mean_batch']:5.2f} {sim_b['mean_batch']:5.2f} | A {errs['A'][2]}, B {errs['B'][2]}")
    for name in ("A", "B"):
        print(f"goals {device} sim {name} (|p50 err| <= {P50_GOAL:.0%}, |p99 err| <= {P99_GOAL:.0%} at every load): "
              f"{'met' if verdicts[name] else 'NOT met'}")
    return verdicts["B"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500, help="requests per load level")
    parser.add_argument("--loads", default="0.05,0.15",
                        help="comma-separated fractions of the capacity at --max-batch-size "
                             "(max_batch_size / service(max_batch_size))")
    parser.add_argument("--max-batch-size", type=int, default=4)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("mlp", "emulated", "both"), default="both",
                        help="mlp: the model runs on the replica's CPU; emulated: the handler blocks for a service "
                             "time drawn from the replica-measured curve without using the CPU (an accelerator)")
    parser.add_argument("--slo-ms", type=float, default=30.0, help="p99 SLO for the simulated grid recommendation")
    parser.add_argument("--max-curve-batch", type=int, default=64)
    parser.add_argument("--curve-runs", type=int, default=60)
    parser.add_argument("--path-requests", type=int, default=300,
                        help="requests at low load that measure Serve's path (inbound/outbound)")
    parser.add_argument("--max-outstanding", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="small run for smoke testing")
    parser.add_argument("--dump", type=Path, help="save every request's timestamps and the curves to this .npz")
    args = parser.parse_args()
    try:
        from ray import serve  # noqa: F401 - only this benchmark needs Ray Serve: sweeper's `serve` extra
    except ImportError as exc:
        sys.exit(f"error: Ray Serve is not installed ({exc}): pip install -e '.[serve]'")
    if args.quick:
        args.requests, args.curve_runs, args.path_requests, args.max_curve_batch = 300, 15, 80, 16
    loads = [float(v) for v in args.loads.split(",")]
    devices = ["mlp", "emulated"] if args.device == "both" else [args.device]
    max_batch, max_wait = args.max_batch_size, args.max_wait_ms / 1e3
    if max_batch > args.max_curve_batch:
        parser.error(f"--max-batch-size={max_batch} exceeds --max-curve-batch={args.max_curve_batch}")
    sizes = sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= args.max_curve_batch} | {max_batch})

    import torch

    torch.set_num_threads(1)
    print(f"machine: {os.cpu_count()} CPUs, load average before start {os.getloadavg()[0]:.2f}")
    print(f"model: MLP depth {DEPTH} width {WIDTH}, input {IN_FEATURES}, torch {torch.__version__}, 1 thread, "
          "inference_mode")

    # (1) The curve in this process, before Ray starts (reference only).
    torch.manual_seed(0)
    local = time_curve(build_mlp(), sizes, args.curve_runs, warmup=5, seed=args.seed)
    print(f"curve_driver_median_ms: {curve_summary(local)}")

    import ray
    from ray import serve

    # (2) Local Ray sized to the machine; Serve without its HTTP proxy. The client is a DeploymentHandle in
    # this process: HTTP would add a proxy actor and a client stack competing for the same 2 cores.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    rows: Dict[str, list] = {device: [] for device in devices}
    try:
        serve.start(http_options={"location": "NoServer"})
        handle = serve.run(make_deployment(max_batch, max_wait).bind(), name="batching_sim_bench",
                           route_prefix=None)
        replica = bsim.LatencyCurve.from_samples(
            handle.measure_curve.remote(sizes, args.curve_runs, 5, args.seed).result())
        print(f"curve_replica_median_ms: {curve_summary(dict(zip(replica.batch_sizes, replica.samples_seconds)))}")
        capacity = replica.capacity_rps(max_batch)
        print(f"capacity_at_max_batch_size: {capacity:.0f} req/s (B={max_batch}, "
              f"service {ms(replica.seconds(max_batch))} ms)")

        # (3) Serve's own path: handle call, routing, (de)serialization, event-loop hops, batch bookkeeping.
        # At low load with max_batch_size=1 and no wait nothing queues, so latency minus the model run is
        # the path: send -> batch start (inbound) and batch end -> answer (outbound).
        handle.configure.remote(1, 0.0).result()
        for _ in range(30):
            handle.remote(np.zeros(IN_FEATURES, np.float32)).result()
        low_rate = min(30.0, 0.05 / replica.seconds(1))
        path = run_level(handle, low_rate, args.path_requests, args.max_outstanding, args.seed + 1000)
        print(f"serve_path_ms: inbound p50 {percentile_ms(path['to_start'], 50)} p99 "
              f"{percentile_ms(path['to_start'], 99)}, outbound p50 {percentile_ms(path['from_end'], 50)} p99 "
              f"{percentile_ms(path['from_end'], 99)} ({len(path['sent'])} requests at {low_rate:.0f} req/s, "
              "max_batch_size=1; drawn per simulated request: inbound delays arrivals at the batcher in FIFO "
              "order, outbound is added to the latency)")

        # (4) Load levels, each preceded by a short untimed warm-up at the same rate.
        draw = np.random.default_rng(args.seed)
        emulated = {k: [replica.sample(k, draw) for _ in range(256)] for k in range(1, max_batch + 1)}
        for device in devices:
            handle.configure.remote(max_batch, max_wait, emulated if device == "emulated" else None).result()
            for index, load in enumerate(loads):
                rate = load * capacity
                run_level(handle, rate, min(200, args.requests), args.max_outstanding, args.seed + 500 + index)
                time.sleep(0.5)
                run = run_level(handle, rate, args.requests, args.max_outstanding, args.seed + index)
                actual = in_run_curve(run, replica)
                rows[device].append((load, run, simulate_like(run, replica, max_batch, max_wait, path, repeats=5),
                                     simulate_like(run, actual, max_batch, max_wait, path, repeats=5)))
                in_run = batches_of(run)
                print(f"{device} load {load:.2f}: batch exec median ms in run / replica curve: " + "  ".join(
                    f"{b}:{ms(statistics.median(t))}/{ms(replica.seconds(b))}(n={len(t)})"
                    for b, t in sorted(in_run.items())))
                to_call = run["entered"] - run["sent"]
                print(f"{device} load {load:.2f}: send lag p99 {percentile_ms(run['schedule_lag'], 99)} ms, capped "
                      f"sends {run['capped']}, outbound p50/p99 {percentile_ms(run['from_end'], 50)}/"
                      f"{percentile_ms(run['from_end'], 99)} ms, send->__call__ p50/p99 {percentile_ms(to_call, 50)}/"
                      f"{percentile_ms(to_call, 99)} ms (includes waiting out a blocked event loop)")
    finally:
        serve.shutdown()
        ray.shutdown()

    print()
    print("sim A = the replica's curve measured idle before the load (a prediction); sim B = the per-batch times the "
          "replica recorded during that run (what it actually spent per batch). Both replay the actual send times "
          "with Serve's path (inbound and outbound) measured at low load; batch sizes are per batch.")
    for device in devices:
        print_table(device, rows[device], max_batch, args.max_wait_ms, args.requests)

    # A simulated grid at the highest load level: what would we configure for the SLO?
    rate = loads[-1] * capacity
    arrivals = bsim.poisson_arrivals(rate, max(args.requests, 3000), args.seed)
    slo = args.slo_ms / 1e3
    grid = bsim.sweep_grid(arrivals, replica, [b for b in sizes if b <= 64], [0.0, 0.001, 0.002, 0.005, 0.01, 0.02],
                           inbound_seconds=path["to_start"], overhead_seconds=path["from_end"],
                           slo_p99_seconds=slo, seed=args.seed)
    choice = bsim.recommend(grid, slo)
    print()
    print(f"recommendation at {rate:.0f} req/s for p99 <= {args.slo_ms:g} ms (simulated from the replica curve, "
          f"policy=serve, Serve's path included): {choice.reason}")
    device, (load, run, _, _) = devices[0], rows[devices[0]][-1]
    print(f"caveat: the simulated headroom keeps Serve's path at its low-load cost (outbound p50 "
          f"{percentile_ms(path['from_end'], 50)} ms); on this machine it grows with load ({device} at load {load:g}: "
          f"{percentile_ms(run['from_end'], 50)} ms), and no rate above {load * capacity:.0f} req/s was measured here")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.dump:
        arrays = {"path_to_start": path["to_start"], "path_from_end": path["from_end"],
                  "curve_sizes": np.array(replica.batch_sizes),
                  "curve_samples": np.array([np.resize(s, args.curve_runs) for s in replica.samples_seconds])}
        for device in devices:
            for load, run, _, _ in rows[device]:
                arrays.update({f"{device}_load{load:g}_{key}": np.asarray(value) for key, value in run.items()})
        np.savez(args.dump, **arrays)
        print(f"dump: {args.dump}")


if __name__ == "__main__":
    main()

"""What a training-state checkpoint costs per point (issue 28): write and read seconds and bytes, for the
MLP and ResNet-18 on digits, SGD and AdamW (AdamW keeps two moments per weight: twice SGD's state).

In one process (no Ray): each model trains a few steps with `save_state_to`, then a second run
continues from it (`start_from`); the figures are the ones the points record (checkpoint_write_seconds,
checkpoint_read_seconds, checkpoint_bytes), best of `--repeats`. A branch of issue 29 pays one read and
each trunk checkpoint one write.

    python scripts/bench_checkpoint.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, OptimConfig, TrainConfig  # noqa: E402
from sweeper.plan import GridPoint  # noqa: E402
from sweeper.worker.spec import PointSpec, WorkerContext  # noqa: E402
from sweeper.worker.train import train_point  # noqa: E402

MODELS = {
    "mlp (4 x 1024)": ModelConfig(name="mlp", depth=4, width=1024, input_shape=[1, 8, 8]),
    "resnet18": ModelConfig(name="resnet18", input_shape=[3, 32, 32]),
}
OPTIMIZERS = {"sgd": OptimConfig(name="sgd", lr=0.05, momentum=0.9), "adamw": OptimConfig(name="adamw", lr=0.001)}


def spec(model: ModelConfig, optim: OptimConfig, steps: int, **extra) -> PointSpec:
    return PointSpec(model=model, data=DataConfig(name="digits", num_classes=10), train=TrainConfig(seed=0),
                     measure=MeasureConfig(warmup_steps=1, windows=2, stable_windows=2, memory_breakdown=False),
                     point=GridPoint(16, 1, 1), lr=optim.lr, steps=steps, optim=optim, evaluate=False, **extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'model':<16} {'optimizer':<9} {'MiB':>8} {'write s':>8} {'read s':>8}")
    for name, model in MODELS.items():
        for opt_name, optim in OPTIMIZERS.items():
            writes, reads, size = [], [], 0
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as folder:
                    saved = train_point(spec(model, optim, 3, save_state_to=folder), WorkerContext())
                    continued = train_point(spec(model, optim, 3, start_from=folder), WorkerContext())
                    writes.append(saved["checkpoint_write_seconds"])
                    reads.append(continued["checkpoint_read_seconds"])
                    size = saved["checkpoint_bytes"]
            print(f"{name:<16} {opt_name:<9} {size / 2**20:>8.1f} {min(writes):>8.3f} {min(reads):>8.3f}")
    print("\nWrite: rank 0's torch.save of the weights, the optimizer state and the RNG, plus meta.json, to local "
          "disk; read: the same files loaded with weights_only=True and checked against the point's identity.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Datasets and models by name, the CIFAR-10 loader on a tiny archive in its on-disk format, and the
sampler that keeps every micro-batch full."""

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from sweeper.config import DataConfig, MeasureConfig, ModelConfig, TrainConfig
from sweeper.plan import GridPoint
from sweeper.sampler import GlobalBatchSampler
from sweeper.worker.spec import PointSpec, WorkerContext
from sweeper.worker.train import train_point
from sweeper.workloads import datasets as data, models
from sweeper.workloads.images import CIFAR_FOLDER


def write_tiny_cifar10(root, per_batch=20, test=30):
    """Five training batches and a test batch in CIFAR-10's python pickle format."""
    folder = root / CIFAR_FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", test)]:
        entry = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, n).tolist()}
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f)


def test_cifar10_loader_reads_the_on_disk_format(tmp_path):
    write_tiny_cifar10(tmp_path)
    cfg = DataConfig(name="cifar10", root=str(tmp_path), verify_checksums=False)
    assert data.check(cfg) == []
    splits = data.load(cfg, [3, 32, 32])
    assert len(splits.train) == 100 and len(splits.val) == 30
    image, label = splits.train[0]
    assert image.shape == (3, 32, 32) and 0 <= label < 10


def test_cifar10_checksums_are_verified_by_default(tmp_path):
    write_tiny_cifar10(tmp_path)
    with pytest.raises(RuntimeError, match="corrupted"):
        data.load(DataConfig(name="cifar10", root=str(tmp_path)), [3, 32, 32])


def test_cifar10_missing_root_without_download_is_a_config_problem(tmp_path):
    problems = data.check(DataConfig(name="cifar10", root=str(tmp_path / "nothing")))
    assert len(problems) == 1 and problems[0].startswith("data.root=") and "data.download=true" in problems[0]


def test_a_trial_trains_on_cifar10_resized(tmp_path):
    write_tiny_cifar10(tmp_path)
    spec = PointSpec(
        model=ModelConfig(name="mlp", input_shape=[1, 16, 16], depth=2, width=32),
        data=DataConfig(name="cifar10", root=str(tmp_path), verify_checksums=False),
        train=TrainConfig(),
        measure=MeasureConfig(warmup_steps=2, windows=2, flops=False),
        point=GridPoint(10, 1, 1), lr=0.05, steps=5,
    )
    result = train_point(spec, WorkerContext())
    assert len(result["train_loss"]) == 5 and 0.0 <= result["val_accuracy"] <= 1.0


def test_digits_are_resized_to_the_model_input():
    splits = data.load(DataConfig(name="digits"), [3, 32, 32])
    x, y = splits.train[0]
    assert x.shape == (3, 32, 32)
    assert len(splits.train) + len(splits.val) == 1797


def test_sampler_yields_only_full_micro_batches_for_every_rank():
    point = GridPoint(micro_batch_size=7, accumulation_steps=3, num_workers=2)
    lengths = []
    for rank in range(2):
        sampler = GlobalBatchSampler(num_samples=100, point=point, rank=rank, steps=5, seed=0)
        indices = list(sampler)
        assert len(indices) == len(sampler) == 5 * 7 * 3
        lengths.append(len(indices))
    assert lengths[0] == lengths[1]


def test_any_torchvision_model_by_name():
    model = models.build(ModelConfig(name="mobilenet_v3_small"), num_classes=10)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert models.check(ModelConfig(name="resnet18")) == []
    assert models.check(ModelConfig(name="not_a_model"))[0].startswith("model.name=")


def make_tiny_model(num_classes, hidden=8):
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes)
    )


def test_custom_model_factory_gets_kwargs_and_num_classes():
    cfg = ModelConfig(name="custom", _target_="tests.unit.test_data_models.make_tiny_model", kwargs={"hidden": 5})
    assert models.check(cfg) == []
    model = models.build(cfg, num_classes=4)
    assert model[1].out_features == 5 and model[3].out_features == 4


def test_mlp_has_the_seed_003_shape():
    # Seed 003's MLP is depth 8 (the default is 4: what learns digits in the default budget).
    mlp = models.build(ModelConfig(name="mlp", depth=8, input_shape=[1, 32, 32]), num_classes=10)
    linears = [m for m in mlp.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 9 and linears[0].in_features == 1024 and linears[0].out_features == 1024


# --- a factory of your own is called once by check(), before any point ------------------------------

def make_not_a_model(num_classes):
    return [torch.nn.Linear(8, num_classes)]


def make_huge_model(num_classes):
    return torch.nn.Linear(2**20, 2**15)  # 128 GiB of float32 weights, were they allocated


def make_splits(n=8):
    return TensorDataset(torch.zeros(n, 8), torch.zeros(n, dtype=torch.long)), None


def make_too_many_splits():
    return make_splits() + (None,)


def make_unlabelled_splits():
    return TensorDataset(torch.zeros(4, 8)), None


def test_a_model_factory_must_return_a_module():
    def cfg(target):
        return ModelConfig(name="custom", _target_=f"tests.unit.test_data_models.{target}")

    problems = models.check(cfg("make_not_a_model"))
    assert problems == [
        "model._target_='tests.unit.test_data_models.make_not_a_model' returned list, not an nn.Module: the factory "
        "must return the model itself (a torch.nn.Module)"
    ]
    # Checked on the meta device: nothing is allocated for the weights.
    assert models.check(cfg("make_huge_model")) == []
    assert models.check(cfg("make_tiny_model")) == []
    assert "raised TypeError" in models.check(ModelConfig(name="custom",
                                                           _target_="tests.unit.test_data_models.make_tiny_model",
                                                           kwargs={"nope": 1}))[0]


@pytest.mark.parametrize("target,says", [
    ("make_too_many_splits", "returned a tuple of 3, not a 2-tuple (train_dataset, val_dataset or None)"),
    ("make_unlabelled_splits", "a train sample is a tuple of 1, not an (input, label) pair"),
    ("write_tiny_cifar10", "raised TypeError"),
])
def test_a_data_factory_must_return_train_and_val_datasets(target, says):
    problems = data.check(DataConfig(name="custom", _target_=f"tests.unit.test_data_models.{target}"))
    assert len(problems) == 1 and problems[0].startswith("data._target_=") and says in problems[0], problems


def test_a_data_factory_that_keeps_its_contract_passes_and_loads():
    cfg = DataConfig(name="custom", _target_="tests.unit.test_data_models.make_splits", kwargs={"n": 5})
    assert data.check(cfg) == []
    assert len(data.load(cfg, [8]).train) == 5


def test_every_built_in_model_has_its_own_config_section_found_by_its_name():
    from sweeper.config import check_model
    from sweeper.config.model_sections import MODEL_SECTIONS

    assert set(MODEL_SECTIONS) == set(models.BUILT_IN)
    # Each section's fields are keys of the one flat `model` section.
    assert [s.fields for s in MODEL_SECTIONS.values() if not issubclass(ModelConfig, s.fields)] == []
    assert check_model(ModelConfig(name="mlp", depth=0, input_shape=[4])) == ["model.depth=0: must be positive"]
    assert check_model(ModelConfig(name="hf", context=1, input_shape=[1]))[0].startswith("model.context=1: must be")
    # A factory of your own is not a built-in model, whatever its name: the section's rules do not apply.
    assert check_model(ModelConfig(name="mlp", depth=0, input_shape=[4], _target_="my_pkg.build")) == []

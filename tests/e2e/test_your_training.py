"""Your training, measured (issue 54), through the CLI with nothing downloaded: docs/your-training.md's Hugging Face
sequence classifier (examples/hf_classifier.py: a BERT from its config) fine-tuned from CSV files this test writes,
with dynamic padding (data.collate_fn), dict batches, the model's own loss from `labels`, a cosine schedule, clipping
at 1.0, weight decay sparing biases and LayerNorms, and F1 (eval.metrics_fn) as the quality the recommendation
judges by."""

import csv
import random
import re

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.harness import run_cli

pytestmark = pytest.mark.e2e

GOOD, BAD = ["good", "great", "fine", "lovely"], ["bad", "awful", "poor", "dull"]
FILLER = ["the", "film", "was", "a", "plot", "and", "very", "acting", "it", "story", "quite", "with"]


def write_csv(path, rows: int, seed: int) -> None:
    """Sentences of 3 to 14 words labelled 1 when their one opinion word is a good one, one label in ten flipped
    (so no classifier is perfect and F1's interval has a width)."""
    rng = random.Random(seed)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["text", "label"])
        for _ in range(rows):
            label = rng.random() < 0.5
            words = rng.choices(FILLER, k=rng.randint(2, 13))
            words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if label else BAD))
            out.writerow([" ".join(words), int(label != (rng.random() < 0.1))])


def test_a_hugging_face_classifier_from_a_csv_is_swept_with_its_recipe_and_judged_by_f1(tmp_path):
    write_csv(tmp_path / "train.csv", 512, 0)
    write_csv(tmp_path / "val.csv", 256, 1)
    result = run_cli(
        "model=custom", "model._target_=examples.hf_classifier.build_model", "model.checkpoint_modules=[BertLayer]",
        "data=custom", "data._target_=examples.hf_classifier.load_csv", "data.num_classes=2",
        f"+data.kwargs.train_path={tmp_path / 'train.csv'}", f"+data.kwargs.val_path={tmp_path / 'val.csv'}",
        "data.collate_fn=examples.hf_classifier.collate", "eval.metrics_fn=examples.hf_classifier.F1",
        "report.quality_metric=f1", "optim=adamw", "optim.lr=0.002", "optim.weight_decay=0.01",
        "optim.no_decay=[bias,LayerNorm]", "train.lr_schedule=cosine", "train.warmup_steps=4",
        "train.grad_clip_norm=1.0", "train.epochs=6", "sweep.micro_batch_sizes=[16,32]",
        "sweep.accumulation_steps=[1]", "measure.warmup_steps=2", "measure.windows=3",
        "tracking.experiment_name=yours", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("yours")
    runs = {r.data.tags["sweeper.trial_key"]: r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get("sweeper.role") == "trial"}
    assert sorted(runs) == ["mb16-acc1-w1", "mb32-acc1-w1"]
    for run in runs.values():
        assert run.data.tags["sweeper.status"] == "ok", run.data.tags.get("sweeper.error")
        params, metrics = run.data.params, run.data.metrics
        assert {k: params[k] for k in ("lr_schedule", "grad_clip_norm", "no_decay", "weight_decay",
                                       "collate_fn")} == {
            "lr_schedule": "cosine", "grad_clip_norm": "1.0", "no_decay": "bias,LayerNorm", "weight_decay": "0.01",
            "collate_fn": "examples.hf_classifier.collate"}
        # The F1 of the whole split (counts summed before compute), with its bootstrap standard error; the
        # classifier learned the opinion words well past a guess (a constant guess of 1 scores F1 0.67; with one
        # label in ten flipped, about 0.9 is the best there is).
        assert metrics["val_metric/f1"] > 0.75 and 0 < metrics["val_metric_se/f1"] < 0.1
        assert run.data.tags["sweeper.metric_directions"] == "f1=higher,precision=higher,recall=higher"
        assert metrics["val_samples"] == 256
    parent = next(r for r in client.search_runs([experiment.experiment_id])
                  if r.data.tags.get("sweeper.role") == "sweep")
    assert parent.data.params["report_quality_metric"] == "f1"
    # The recommendation judges by F1 and says so; the snippets carry the recipe measured.
    report = next(tmp_path.glob("reports/*/recommendation.yaml"))
    answer = yaml.safe_load(report.read_text())
    assert answer["quality"] == "f1"
    chosen = answer["recommendation"]
    assert "bootstrap standard error" in chosen["quality_interval"]["how"]
    assert chosen["quality_interval"]["mean"] == pytest.approx(runs[chosen["key"]].data.metrics["val_metric/f1"])
    # The headline gives the chosen point's F1 with its interval; the alternatives' gaps are in F1.
    assert re.search(rf"Train {chosen['key']}: .*f1 0\.\d{{3}} \[0\.\d{{3}}, [01]\.\d{{3}}\]", result.stdout)
    assert "f1 gap [interval]" in result.stdout
    snippets = report.parent / "snippets"
    hf = (snippets / "hf_training_arguments.py").read_text()
    assert "lr_scheduler_type='cosine'" in hf and "max_grad_norm=1.0" in hf
    assert "NO_DECAY = ('bias', 'LayerNorm')" in (snippets / "measured_recipe.py").read_text()

"""The report's figures and HTML page: every plot writes a PNG of the fixed size, copes with a single
point, missing figures and no ok trial, and the page embeds its images and escapes what it shows."""

import base64
import dataclasses
import os
import subprocess
import sys

import pytest
from matplotlib.image import imread

from sweeper.report import analysis, plots
from sweeper.report import folding
from sweeper.report import html as html_report
from sweeper.report.plots import canvas
from tests.helpers import trial

MiB = 2**20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PIXELS = (round(plots.FIGSIZE[1] * plots.DPI), round(plots.FIGSIZE[0] * plots.DPI))  # rows, columns


def measured(micro, accum=1, workers=1, status="ok", **figures):
    """A run (tests.helpers.trial) whose figures, unless given, follow a plausible curve for its layout."""
    if status == "ok":
        figures.setdefault("samples_per_second", 100.0 * workers * min(micro, 32) / (1 + micro / 256))
        figures.setdefault("samples_per_second_cv", 0.03)
        figures.setdefault("peak_memory_bytes", 40 * MiB + micro * 600 * 1024)
        figures.setdefault("val_accuracy", 0.95 - 0.01 * (micro * accum * workers) / 64)
    return trial(micro, accum, workers, status, **figures)


@pytest.fixture
def sweep():
    """A 4 x 2 x 2 grid where micro 128 runs out of memory, one point failed and one has no cv."""
    trials = []
    for accum in (1, 2):
        for workers in (1, 2):
            for micro in (8, 16, 32, 64):
                trials.append(measured(micro, accum, workers))
            trials.append(measured(128, accum, workers, status="oom"))
    trials[0] = measured(8, 1, 1, samples_per_second_cv=None)
    trials[6] = measured(16, 1, 2, status="failed")
    return trials


def assert_png(path):
    assert path is not None and os.path.isfile(path)
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert imread(path).shape[:2] == PIXELS


def draw_all(trials, folder, **memory_options):
    return {
        "throughput": plots.throughput_vs_micro_batch(trials, analysis.knees(trials), folder / "throughput.png"),
        "memory": plots.memory_vs_micro_batch(trials, folder / "memory.png", **memory_options),
        "accuracy": plots.accuracy_vs_global_batch(trials, folder / "accuracy.png", "LR scaling: sqrt (base 32)"),
        "pareto": plots.pareto_throughput_memory(trials, analysis.pareto(trials), folder / "pareto.png"),
    }


def test_every_plot_writes_a_png_of_the_fixed_size(sweep, tmp_path):
    written = draw_all(sweep, tmp_path, budget_bytes=160 * MiB)
    for name, path in written.items():
        assert path == str(tmp_path / f"{name}.png")
        assert_png(path)


def test_memory_plot_with_a_given_fit_and_no_budget(monkeypatch, sweep, tmp_path):
    ax = _drawn(monkeypatch, lambda: plots.memory_vs_micro_batch(sweep, tmp_path / "m.png", fit=(40 * MiB, 600 * 1024)))
    # The given fit is the one dashed line (no series fits its own), from 0 to the largest size tried, 128
    # (it ran out of memory): 40 MiB there, 40 MiB + 128 x 600 KiB = 40 + 75 = 115 MiB at 128.
    (fit,) = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    xs, ys = fit.get_data()
    assert list(xs) == [0.0, 128.0] and list(ys) == pytest.approx([40.0, 115.0])
    assert "fit: 40 MiB fixed\n  + 600 KiB/sample x micro" in _legend_texts(ax)
    # No budget: no budget line, and the size that ran out of memory marked near the top of the axes.
    assert not any(t.startswith("budget") for t in _legend_texts(ax))
    (oom,) = [line for line in ax.get_lines() if line.get_label() == "oom"]
    assert list(oom.get_xdata()) == [128] and list(oom.get_ydata()) == [0.96]
    monkeypatch.undo()
    assert_png(plots.memory_vs_micro_batch(sweep, tmp_path / "m.png", fit=(40 * MiB, 600 * 1024)))


def test_a_single_point_and_missing_figures_still_plot(monkeypatch, tmp_path):
    one = [measured(32, samples_per_second_cv=None)]
    for path in draw_all(one, tmp_path).values():
        assert_png(path)
    # Throughput but no memory, memory but no accuracy: each plot draws what it has. Throughput at 16 is
    # 100 x 16 / (1 + 16/256) = 1505.9 samples/s, at 32: 3200 / 1.125 = 2844.4; peak memory at 32:
    # 40 MiB + 32 x 600 KiB = 58.75 MiB; accuracy at 16: 0.95 - 0.01 x 16/64 = 0.9475.
    sparse = [measured(16, peak_memory_bytes=None), measured(32, val_accuracy=None), measured(64, status="oom")]
    drawn = _draw_all_figures(monkeypatch, sparse, tmp_path)
    (rates,) = drawn["throughput"].containers
    assert _points(rates.lines[0]) == [pytest.approx((16, 1505.882), rel=1e-6), pytest.approx((32, 2844.444), rel=1e-6)]
    assert "oom" in [t.get_text() for t in drawn["throughput"].texts]  # 64, on the floor
    assert _marked(drawn["memory"], "o") == [[(32, 58.75)]]
    (accuracy,) = drawn["accuracy"].containers
    assert _points(accuracy.lines[0]) == [(16, 0.9475)]
    assert _marked(drawn["pareto"], "o") == [[pytest.approx((58.75, 2844.444), rel=1e-6)]]  # needs both figures
    monkeypatch.undo()
    for path in draw_all(sparse, tmp_path / "sparse").values():
        assert_png(path)


def test_no_ok_trial_gives_a_placeholder_and_no_accuracy_plot(monkeypatch, tmp_path):
    failed = [measured(64, status="oom"), measured(128, status="oom"), measured(32, status="failed")]
    for trials, folder in ((failed, tmp_path / "failed"), ([], tmp_path / "empty")):
        written = draw_all(trials, folder, budget_bytes=100 * MiB)
        # A picture that says "no ok points" keeps the report's layout; accuracy has nothing to say.
        for name in ("throughput", "memory", "pareto"):
            assert_png(written[name])
        assert written["accuracy"] is None
        assert not (folder / "accuracy.png").exists()
    # What the placeholder says: its plot's title, why it is empty, and what the points did.
    fig = _figure(monkeypatch, lambda: plots.throughput_vs_micro_batch(failed, {}, tmp_path / "t.png"))
    assert fig.axes == [] and [t.get_text() for t in fig.texts] == [
        "Throughput vs micro-batch size", "no ok points with a throughput", "(1 failed, 2 oom)"]
    fig = _figure(monkeypatch, lambda: plots.memory_vs_micro_batch([], tmp_path / "m.png"))
    assert [t.get_text() for t in fig.texts][1:] == ["no ok points with a peak memory", "(no points)"]


def test_synthetic_data_has_no_accuracy_plot(tmp_path):
    trials = [measured(m, val_accuracy=None) for m in (8, 16)]
    assert plots.accuracy_vs_global_batch(trials, tmp_path / "a.png", "LR scaling: none") is None


def test_a_dollar_sign_in_a_key_is_not_typeset(tmp_path):
    # A pair of "$" around what mathtext cannot parse: drawn as typed, or the figure fails to draw
    # (issue 46: "$x$-$y", an odd count, is never mathtext, so it passed without the escaping).
    t = measured(8)
    odd = dataclasses.replace(t, key="mb8-$^$")
    assert_png(plots.pareto_throughput_memory([odd], [odd], tmp_path / "p.png"))


def test_plotting_leaves_pyplot_alone(tmp_path):
    code = (
        "import sys\n"
        "from sweeper.report import plots\n"
        "from sweeper.report.analysis import Trial\n"
        "t = Trial(key='k', micro_batch_size=8, accumulation_steps=1, num_workers=1, global_batch_size=8,"
        " status='ok', samples_per_second=10.0, peak_memory_bytes=1e6)\n"
        f"plots.pareto_throughput_memory([t], [t], {str(tmp_path / 'p.png')!r})\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_html_page_is_self_contained_and_escaped(sweep, tmp_path):
    images = draw_all(sweep, tmp_path, budget_bytes=160 * MiB)
    images["accuracy"] = None  # a plot that was not drawn is left out
    rows = [{"trial": "<script>alert(1)</script>", "samples/s": "123.4", "status": "ok"},
            {"trial": "mb8-acc1-w1", "samples/s": "-", "status": "oom", "note": "a & b"}]
    page = html_report.render(
        "sweep <demo>",
        rows,
        images,
        "Train with mb32-acc1-w2 (global batch 64).\nOverrides: sweep.micro_batch_sizes=[32]",
        {"objective": "throughput", "MLflow run": "abc123"},
    )
    assert page.count("data:image/png;base64,") == 3
    with open(images["throughput"], "rb") as f:
        assert base64.b64encode(f.read()).decode() in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "sweep &lt;demo&gt;" in page and "a &amp; b" in page
    assert "http://" not in page and "https://" not in page
    assert "Train with mb32-acc1-w2 (global batch 64)." in page
    assert "Overrides: sweep.micro_batch_sizes=[32]" in page
    # Columns in first-seen key order, a key missing from a row gives an empty cell.
    assert page.index(">trial</th>") < page.index(">samples/s</th>") < page.index(">note</th>")
    assert page.count("<tr>") == 3
    # A column of figures (a dash for a missing one) is right-aligned as a whole; text columns are not.
    assert '<td class="num">123.4</td>' in page and '<td class="num">-</td>' in page
    assert "<td>ok</td>" in page


def test_html_page_without_trials_or_images():
    page = html_report.render("empty", [], {}, "No recommendation: no ok trials", {})
    assert "No points." in page and "No recommendation: no ok trials" in page
    assert "<img" not in page


def _figure(monkeypatch, draw):
    """The figure a plot function saved (instead of writing it), to read what it shows."""
    saved = []
    monkeypatch.setattr(canvas, "save", lambda fig, path: saved.append(fig) or os.fspath(path))
    draw()
    (fig,) = saved
    return fig


def _drawn(monkeypatch, draw):
    """The axes of the figure a plot function saved."""
    return _figure(monkeypatch, draw).axes[0]


def _draw_all_figures(monkeypatch, trials, folder):
    """draw_all's four figures' axes, by name (the accuracy plot's: None when it draws nothing)."""
    saved = {}
    for name in ("throughput", "memory", "accuracy", "pareto"):
        monkeypatch.setattr(canvas, "save",
                            lambda fig, path, name=name: saved.setdefault(name, fig) and os.fspath(path))
        {"throughput": lambda: plots.throughput_vs_micro_batch(trials, analysis.knees(trials), folder / "t.png"),
         "memory": lambda: plots.memory_vs_micro_batch(trials, folder / "m.png"),
         "accuracy": lambda: plots.accuracy_vs_global_batch(trials, folder / "a.png", "LR scaling: none"),
         "pareto": lambda: plots.pareto_throughput_memory(trials, analysis.pareto(trials), folder / "p.png")}[name]()
    return {name: saved[name].axes[0] if name in saved else None for name in ("throughput", "memory", "accuracy",
                                                                                 "pareto")}


def _points(line):
    """A drawn line's (x, y) points, as plain floats."""
    return [(float(x), float(y)) for x, y in zip(*line.get_data())]


def _marked(ax, marker):
    """The (x, y) points of each line drawn with `marker`, line by line."""
    return [_points(line) for line in ax.get_lines() if line.get_marker() == marker and len(line.get_xdata())]


def _legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_throughput_plot_names_its_knee_rule_or_says_there_is_no_knee_yet(monkeypatch, tmp_path):
    bending = [measured(16, samples_per_second=300.0), measured(32, samples_per_second=450.0),
               measured(64, samples_per_second=470.0)]
    ax = _drawn(monkeypatch, lambda: plots.throughput_vs_micro_batch(
        bending, analysis.knees(bending, 0.10), tmp_path / "t.png", 0.10))
    assert "knee: next doubling gains < 10%" in _legend_texts(ax)
    climbing = [measured(16, samples_per_second=300.0), measured(64, samples_per_second=700.0)]
    ax = _drawn(monkeypatch, lambda: plots.throughput_vs_micro_batch(
        climbing, analysis.knees(climbing, 0.10), tmp_path / "c.png", 0.10))
    texts = _legend_texts(ax)
    assert any(t.startswith("no knee yet: every doubling gained >= 10%") for t in texts), texts
    assert not any(t.startswith("knee") for t in texts)
    # One ok size and one that ran out of memory: no doubling was measured, so nothing is claimed.
    single = [measured(16, samples_per_second=300.0), measured(32, status="oom")]
    ax = _drawn(monkeypatch, lambda: plots.throughput_vs_micro_batch(
        single, analysis.knees(single, 0.10), tmp_path / "s.png", 0.10))
    assert not any(t.startswith(("knee", "no knee")) for t in _legend_texts(ax))


def test_the_memory_fit_is_a_straight_line_from_the_fixed_memory_on_a_linear_axis(monkeypatch, tmp_path):
    points = [measured(16), measured(32), measured(64)]  # 40 MiB + 600 KiB per sample, exactly
    ax = _drawn(monkeypatch, lambda: plots.memory_vs_micro_batch(points, tmp_path / "m.png"))
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    (fit,) = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    xs, ys = fit.get_data()
    assert list(xs) == [0.0, 64.0]
    assert ys[0] == pytest.approx(40.0) and ys[1] == pytest.approx(40.0 + 64 * 600 / 1024)
    assert any("fit 40 MiB + 600 KiB/sample" in t for t in _legend_texts(ax))


def test_the_pareto_view_stars_the_recommended_trial_even_off_the_front(monkeypatch, tmp_path):
    fast = measured(64, samples_per_second=700.0, peak_memory_bytes=100 * MiB)
    slow = measured(16, samples_per_second=300.0, peak_memory_bytes=120 * MiB)  # beaten on both figures
    ax = _drawn(monkeypatch, lambda: plots.pareto_throughput_memory(
        [fast, slow], analysis.pareto([fast, slow]), tmp_path / "p.png", recommended=slow))
    assert "recommended: mb16-acc1-w1" in _legend_texts(ax)
    (star,) = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert list(zip(*star.get_data())) == [(120.0, 300.0)]
    # Off the front, it is labelled anyway so the reader can find it.
    assert "mb16-acc1-w1" in [t.get_text() for t in ax.texts]
    ax = _drawn(monkeypatch, lambda: plots.pareto_throughput_memory(
        [fast, slow], analysis.pareto([fast, slow]), tmp_path / "p.png"))
    assert not [line for line in ax.get_lines() if line.get_marker() == "*"]


# -- seeds, diverged points, recipes, the critical batch --------------------------------------------


def replicate(t, seed, **figures):
    """Seed `seed` of point `t`: its key gets -s<seed>, the point key stays."""
    return dataclasses.replace(t, key=f"{t.key}-s{seed}", point_key=t.point, seed=seed, **figures)


def seeded(micro, accums=(1,), accuracies=(0.90, 0.92, 0.94), **figures):
    return [replicate(measured(micro, a, **figures), s, val_accuracy=acc, val_samples=360)
            for a in accums for s, acc in enumerate(accuracies)]


def diverged(micro, seed=0, reason="nonfinite", step=7):
    return replicate(measured(micro, status="diverged"), seed, diverged_reason=reason, diverged_at_step=step)


def test_the_accuracy_plot_draws_one_mark_per_point_with_its_interval(monkeypatch, tmp_path):
    trials = seeded(16) + seeded(32)
    trials += [diverged(64, 0), diverged(64, 1, step=9), replicate(measured(64), 2, val_samples=360)]
    ax = _drawn(monkeypatch, lambda: plots.accuracy_vs_global_batch(trials, tmp_path / "a.png", "LR scaling: none"))
    marks = [line for line in ax.get_lines() if line.get_marker() == "o" and len(line.get_xdata()) > 0]
    # Three points (16, 32 and 64's one ok seed), not seven runs; the mean over seeds.
    assert sorted(len(m.get_xdata()) for m in marks) == [3]
    assert list(marks[0].get_ydata())[:2] == pytest.approx([0.92, 0.92])
    texts = _legend_texts(ax)
    assert "error bar: 95 % t interval over seeds" in texts  # 16 and 32: three seeds
    assert "error bar: 95 % Wilson interval of the\n  validation set (one seed)" in texts  # 64: one ok seed
    assert "diverged (reason @step; left out)" in texts
    assert "diverged (nonfinite) (2/3 seeds)" in [t.get_text() for t in ax.texts]
    monkeypatch.undo()
    assert_png(plots.accuracy_vs_global_batch(trials, tmp_path / "a.png", "LR scaling: none"))


def test_seeds_lr_multipliers_and_recipes_are_one_mark_per_layout_on_the_throughput_plot(monkeypatch, tmp_path):
    trials = []
    for precision, faster in (("fp32", 0.0), ("bf16", 1000.0)):
        for multiplier in (1.0, 2.0):
            for micro in (16, 32, 64):
                base = dataclasses.replace(measured(micro), precision=precision, lr_multiplier=multiplier,
                                           point_key=f"mb{micro}-acc1-w1-{precision}-lrx{multiplier:g}")
                # 100 samples/s per sample of micro-batch, seed 1 10 more than seed 0, LR x2 40 more.
                rate = 100.0 * micro + faster + 40 * (multiplier - 1)
                trials += [replicate(base, s, samples_per_second=rate + 10 * s) for s in (0, 1)]
    layouts = folding.fold_layouts(trials)
    assert len(layouts) == 6  # 3 micro-batches x 2 recipes
    knees = {(1, 1, ""): 32, (1, 1, "bf16"): None}
    ax = _drawn(monkeypatch, lambda: plots.throughput_vs_micro_batch(trials, knees, tmp_path / "t.png", 0.1))
    # One line per recipe, one mark per micro-batch: the mean of its 2 seeds x 2 LR multipliers, +5 for the
    # seeds and +20 for the multipliers: 100 x micro + 25 (fp32), 1000 more for bf16.
    assert {c.get_label(): _points(c.lines[0]) for c in ax.containers} == {
        "accum 1, workers 1": [(16, 1625.0), (32, 3225.0), (64, 6425.0)],
        "accum 1, workers 1, bf16": [(16, 2625.0), (32, 4225.0), (64, 7425.0)],
    }
    (ring,) = [c for c in ax.collections if list(getattr(c, "get_sizes", list)()) == [230]]  # the knee's ring
    assert [tuple(map(float, xy)) for xy in ring.get_offsets()] == [(32.0, 3225.0)]
    memory = _drawn(monkeypatch, lambda: plots.memory_vs_micro_batch(trials, tmp_path / "m.png"))
    assert [len(points) for points in _marked(memory, "o") + _marked(memory, "s")] == [3, 3]  # 3 layouts a recipe
    by_recipe = _drawn(monkeypatch, lambda: plots.memory_by_recipe(trials, tmp_path / "r.png"))
    assert [label.split(" (")[0] for label in _legend_texts(by_recipe)][:2] == ["fp32", "bf16"]
    monkeypatch.undo()
    assert_png(plots.throughput_vs_micro_batch(trials, knees, tmp_path / "t.png", 0.1))
    # One recipe: nothing to compare.
    assert plots.memory_by_recipe([t for t in trials if t.precision == "fp32"], tmp_path / "one.png") is None


def test_a_point_smart_stopped_early_keeps_its_layout_figures_but_not_its_rung_accuracy():
    # sweep.strategy=smart: mb64's class was stopped at a rung; its throughput and memory come whole
    # from its layout's own run, its accuracy is a rung's (not comparable with a full budget's).
    stopped = measured(64, samples_per_second=500.0, peak_memory_bytes=80 * MiB, val_accuracy=0.41,
                    steps_to_target=None, reached_target=False)
    stopped = dataclasses.replace(stopped, status="stopped")
    diverged = dataclasses.replace(measured(32, samples_per_second=300.0), status="diverged")
    layouts = {t.key: t for t in folding.fold_layouts([measured(16), stopped, diverged])}
    assert layouts["mb64-acc1-w1"].status == "ok"
    assert layouts["mb64-acc1-w1"].samples_per_second == 500.0
    assert layouts["mb64-acc1-w1"].peak_memory_bytes == 80 * MiB
    assert layouts["mb64-acc1-w1"].val_accuracy is None and layouts["mb64-acc1-w1"].reached_target is None
    assert layouts["mb32-acc1-w1"].status == "diverged"  # its windows ended with its training: left out


def test_memory_by_recipe_draws_a_line_per_recipe(monkeypatch, tmp_path):
    fp32 = [measured(m) for m in (16, 32, 64)]
    bf16 = [dataclasses.replace(measured(m, peak_memory_bytes=40 * MiB + m * 300 * 1024), precision="bf16",
                                point_key=f"mb{m}-acc1-w1-bf16") for m in (16, 32, 64)]
    ax = _drawn(monkeypatch, lambda: plots.memory_by_recipe(fp32 + bf16, tmp_path / "r.png"))
    texts = _legend_texts(ax)
    assert any(t.startswith("fp32 (workers 1, accum 1)\n  40 MiB + 600 KiB/sample") for t in texts), texts
    assert any(t.startswith("bf16 (workers 1, accum 1)\n  40 MiB + 300 KiB/sample") for t in texts), texts


def targets(micro, steps, seeds=(0, 1), b_simple=50.0, reached=True):
    return [replicate(measured(micro), s, steps_to_target=steps * (1 + 0.02 * (-1) ** s), reached_target=reached,
                      samples_to_target=steps * micro, time_to_target_seconds=steps * micro / 1000,
                      gns_b_simple=b_simple) for s in seeds]


def test_steps_and_time_to_target_plots(monkeypatch, tmp_path):
    from sweeper.report.critical_batch import fit_with_interval
    from sweeper.report.folding import critical_batch_observations

    trials = [t for m in (16, 32, 64, 128) for t in targets(m, 100 * (1 + 64 / m), b_simple=30.0 + m)]
    trials += [diverged(256)]
    found = fit_with_interval(critical_batch_observations(trials))
    assert found.critical_batch_size == pytest.approx(64, rel=1e-6)
    ax = _drawn(monkeypatch, lambda: plots.steps_to_target_vs_global_batch(trials, tmp_path / "s.png", found, "LR"))
    (triangles,) = [line for line in ax.get_lines() if line.get_marker() == "^"]
    assert sorted(triangles.get_xdata()) == [46.0, 62.0, 94.0, 158.0]  # each point's B_simple, on the x axis
    assert any(line.get_xdata()[0] == pytest.approx(64) for line in ax.get_lines() if line.get_linestyle() == "--")
    monkeypatch.undo()
    assert_png(plots.steps_to_target_vs_global_batch(trials, tmp_path / "s.png", found, "LR"))
    assert_png(plots.steps_to_target_vs_global_batch(trials, tmp_path / "nofit.png", None, "LR"))
    assert_png(plots.time_to_target_vs_global_batch(trials, tmp_path / "t.png"))
    # Without a fit: the same triangles, no critical batch line.
    ax = _drawn(monkeypatch, lambda: plots.steps_to_target_vs_global_batch(trials, tmp_path / "s.png", None, "LR"))
    assert not [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    monkeypatch.undo()
    # Nothing reached a target (or none was set): no picture.
    plain = [measured(16), measured(32), diverged(64)]
    assert plots.steps_to_target_vs_global_batch(plain, tmp_path / "none.png", None, "LR") is None
    assert plots.time_to_target_vs_global_batch(plain, tmp_path / "none2.png") is None
    assert not (tmp_path / "none.png").exists()

"""sweep.strategy=branch in the report: the branches' answer (branch/answer.json on the parent run, written by
sweeper/driver/branch.py) as a section, a plot of the critical batch size over training, the limit it puts
on which points may be recommended, and the schedule as paste-able code."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from sweeper.report.trials import Trial
from sweeper.strategies.branch import CONSTANT, SCHEDULE, TIE

ANSWER = "branch/answer.json"


def read(reader: Any) -> Optional[Dict[str, Any]]:
    """The branch answer of the sweep `reader` (a tracking.SweepReader) reads, or None (not a branch
    sweep, or its trunk could not run)."""
    text = reader.artifact_text(ANSWER)
    return None if text is None else json.loads(text)


def flat(answer: Dict[str, Any]) -> Tuple[int, str]:
    """The critical batch size where it flattens (the last checkpoint's) and, in words, what it is."""
    checkpoints = answer["checkpoints"]
    last = checkpoints[-1] if checkpoints else None
    batch = answer["critical_batch_size_flat"]
    where = f" at {last['samples']} samples" if last else ""
    return int(batch), (f"the critical batch size the branches measured where it flattens ({batch:.0f}{where}, the "
                        "rising fit of the checkpoints' values)")


def verdict(answer: Dict[str, Any], global_batch: int) -> str:
    """What the branches said of `global_batch` at the last checkpoint that compared it, in the grid's
    non-inferiority words: "keeps up" (its rise certified within the margin), "worse" (shown beyond it),
    "unproven" (neither), "not judged" (never branched to, or no finite comparison)."""
    if global_batch in (answer.get("unjudged_global_batches") or []):
        return "not judged"
    for c in reversed(answer["checkpoints"]):
        if str(global_batch) not in c["differences"]:
            continue
        said = (c.get("verdicts") or {}).get(str(global_batch))
        if said is not None:
            return said
        # an answer recorded before verdicts: kept up up to the reading's value; above it, not certified
        return "keeps up" if global_batch <= c["critical_batch_size"] else "unproven"
    return "not judged"


def limit(answer: Optional[Dict[str, Any]]) -> Tuple[int, Callable[[int], str]]:
    """The quality rule of a branch sweep: no point above the flat critical batch size, each excluded with what
    the branches said of its global batch (shown worse per sample, not certified to keep up, or not judged
    at all: never "worse" without a branch that showed it); without an answer (the trunk diverged, failed
    or did not learn, or there was nothing to branch to), no point at all, since nothing measured the
    quality of any."""
    if answer is None:
        return 0, lambda _: ("no critical batch size was measured (the trunk did not train its budget ok, or nothing "
                             "could branch: the sweep's log says which), so no point's quality was measured")
    batch, what = flat(answer)

    def why(global_batch: int) -> str:
        said = verdict(answer, global_batch)
        if said == "not judged":
            return (f"global batch {global_batch} not judged: no branch compared it with the trunk (the window was too "
                    f"short for 3 of its steps, or its branch did not finish); above {what}")
        if said == "worse":
            return (f"global batch {global_batch} above {what}: its branch was shown to train worse per sample than "
                    "the trunk (its rise over the margin at branch.confidence)")
        if said == "unproven":
            return (f"global batch {global_batch} above {what}: unproven, its branch's rise was neither certified "
                    "within the margin nor shown beyond it at branch.confidence")
        return (f"global batch {global_batch} above {what}: its branch kept up at the last checkpoint that compared "
                "it, but a smaller global batch was not certified to, or the rising fit over the checkpoints is lower")
    return batch, why


def section_rows(answer: Dict[str, Any]) -> List[Dict[str, str]]:
    """One row per checkpoint: the critical batch size's interval and each branch's loss difference."""
    rows = []
    for c in answer["checkpoints"]:
        high = c.get("next_tried")
        bounds, verdicts = c.get("bounds") or {}, c.get("verdicts") or {}
        diffs = ", ".join(f"{g}: {d:+.4f}" + (f" (upper bound {bounds[g][1]:+.4f}: {verdicts[g]})"
                                              if g in verdicts and g in bounds and bounds[g][1] == bounds[g][1]
                                              else f" ({verdicts[g]})" if g in verdicts else "")
                          for g, d in c["differences"].items())
        silent = c.get("informative") is False  # answers before the rule have no such key: a reading each
        rows.append({"samples seen": str(c["samples"]),
                     "critical batch size": "no reading (nothing certified against a zero margin; left out of "
                     "the rising fit)" if silent else f"{c['critical_batch_size']} to {high}" if high else
                     f">= {c['critical_batch_size']}",
                     "rising fit": f"{c['monotone_fit']:.0f}" if c.get("monotone_fit") else "-",
                     "margin": "-" if c["tolerance"] != c["tolerance"] else f"{c['tolerance']:.4f}",
                     "trunk's fall over the window": "-" if c.get("trunk_fall") is None else
                     f"{c['trunk_fall']:.4f}" + (" (weak reading)" if c.get("weak") else ""),
                     "branch loss - trunk loss, by global batch (one-sided upper bound: verdict)": diffs})
    return rows


def words(answer: Dict[str, Any]) -> str:
    """The schedule, the constant layout, their predicted times and which one is the answer, in words."""
    spans = answer["schedule"]
    timed = answer.get("schedule_timed_as") or answer["schedule_layouts"]
    schedule = "; ".join(f"{g} from {s} samples ({_timed(layout, t)})"
                         for (s, g), layout, t in zip(spans, answer["schedule_layouts"], timed))
    answer_is = "the schedule" if answer["recommend_schedule"] else f"the constant layout {answer['constant']}"
    text = (f"Trunk at global batch {answer['base_global_batch']} over {answer['budget_samples']} samples; branches of "
            f"{answer['window_samples']} samples to every larger global batch of the grid, each on its fastest "
            f"measured layout, compared with the trunk on the same samples (the second half of the window). "
            f"Schedule: {schedule}: predicted {answer['schedule_predicted_seconds']:.3g} s to the trunk's final loss. "
            f"Best constant layout (the fastest at or below the critical batch size where it flattens): "
            f"{answer['constant']}, global batch {answer['constant_global_batch']}: predicted "
            f"{answer['constant_predicted_seconds']:.3g} s. The answer is {answer_is}: {answer['why']}. Predictions "
            "take each stretch of the trunk's progress at E = E_min (1 + B / B_crit) samples (McCandlish et al. "
            "2018) with B_crit the critical batch size measured there, at the layout's measured samples/s.")
    if "schedule_timed_as" in answer:  # answers recorded before it timed each span at each global batch's fastest
        text += (" The schedule's spans keep its first layout's micro-batch and workers and raise the accumulation, "
                 "as train.batch_schedule runs them.")
    over = answer.get("b_simple") or []
    if over:
        text += (" The gradient noise scale B_simple its branches measured at the checkpoints: "
                 + ", ".join(f"{v:.1f} at {x}" for x, v in over) + " (a proxy that can sit far below the critical "
                 "batch size measured directly).")
    if len(spans) > 1:
        text += " As an override: " + override(spans) + "."
    return text


def _timed(layout: str, timed_as: str) -> str:
    """A span's layout, and the measured layout that times it when that is another (a lower bound)."""
    return layout if timed_as == layout else f"{layout}, timed at {timed_as}'s measured samples/s, a lower bound"


def headline(answer: Dict[str, Any]) -> str:
    """What the console adds below the table for a branch sweep: what the branches said of the global batches
    above the critical batch size where it flattens (the headline says whether the schedule or the constant
    layout is the answer: `glance`)."""
    batch = flat(answer)[0]
    above = sorted({int(g) for c in answer["checkpoints"] for g in c["differences"]} |
                   set(answer.get("unjudged_global_batches") or []))
    said = [f"{g} {verdict(answer, g)}" for g in above if g > batch]
    return (f" The branches certified global batches up to {batch} as keeping up with the trunk where the "
            f"critical batch size flattens; no point above it is recommended"
            + (f" ({', '.join(said)})." if said else "."))


def chosen_word(answer: Optional[Dict[str, Any]], glance: Optional[Tuple[List[str], Optional[str]]]) -> str:
    """The alternatives' verdict for the report's recommended (constant) point: "recommended", unless the
    branch sweep's one answer (its `glance`) is a schedule, which that constant layout is the fallback of."""
    if answer is None or glance is None or choice(answer) != SCHEDULE or len(answer["schedule"]) < 2:
        return "recommended"
    return "constant (the schedule is recommended)"


def choice(answer: Dict[str, Any]) -> str:
    """SCHEDULE, CONSTANT or TIE (the constant is the answer); an answer recorded before ties: by its flag."""
    return answer.get("choice") or (SCHEDULE if answer["recommend_schedule"] else CONSTANT)


def glance(answer: Dict[str, Any], best: Trial, points: Sequence[Trial], line: Optional[str]
           ) -> Optional[Tuple[List[str], Optional[str]]]:
    """One answer per sweep, for the headline: sentences saying whether to train the schedule or the constant
    layout `best` (the report's recommendation), most detailed first, and the override line of the one to
    train (the schedule's: its first layout, the LR rule and train.batch_schedule). None when `best` is not
    the answer's constant global batch (the report excluded it): the ordinary headline then speaks."""
    if best.global_batch_size != answer.get("constant_global_batch"):
        return None
    spans, chosen = answer["schedule"], choice(answer)
    path = " -> ".join(str(g) for _, g in spans)
    s, c = answer["schedule_predicted_seconds"], answer["constant_predicted_seconds"]
    share = answer.get("prediction_noise_share")
    noise = "no measured noise" if share is None else f"the {_percent(share)} noise"
    me = f"Train {best.key}"
    if len(spans) < 2:
        flat_ = answer["critical_batch_size_flat"]
        return [f"{me} at a constant global batch {best.global_batch_size}: at or below the critical batch size the "
                f"branches measured where it flattens ({flat_:.0f}); no schedule reaches above it",
                f"{me} (constant global batch {best.global_batch_size}, at or below the critical batch size "
                f"measured, {flat_:.0f})"], line
    apart = _percent(abs(c - s) / c)
    if chosen == SCHEDULE:
        first = answer["schedule_layouts"][0]
        return [f"Train the batch-size schedule {path} on {first}: predicted {s:.3g} s to the trunk's final loss, "
                f"{apart} under constant {best.key}'s {c:.3g} s, beyond {noise}",
                f"Train the schedule {path} on {first}: {apart} faster than constant {best.key} (predicted; "
                f"{noise})"], schedule_line(answer, best, points)
    if chosen == TIE:
        return [f"{me} at a constant global batch {best.global_batch_size}: it ties the schedule {path} (predicted "
                f"{c:.3g} s against {s:.3g} s to the trunk's final loss, {apart} apart, inside {noise}); a constant "
                "batch is simpler to run",
                f"{me} (constant {best.global_batch_size}): a tie with the schedule {path}, {apart} apart inside "
                f"{noise}; the simpler"], line
    return [f"{me} at a constant global batch {best.global_batch_size}: predicted {c:.3g} s to the trunk's final "
            f"loss, {apart} under the schedule {path}'s {s:.3g} s, beyond {noise}",
            f"{me} (constant {best.global_batch_size}): {apart} faster than the schedule {path} (predicted)"], line


def _percent(share: float) -> str:
    """0.04 -> '4 %', 0.0024 -> '0.2 %': a share in the project's words, a small one not rounded to nothing."""
    return f"{100 * share:.0f} %" if share >= 0.01 else f"{100 * share:.1f} %"


def schedule_line(answer: Dict[str, Any], best: Trial, points: Sequence[Trial]) -> str:
    """The overrides that train the schedule: its first layout (the trunk's) at the trunk's LR, the LR rule the
    branches scaled by from the trunk's global batch, and train.batch_schedule."""
    import re

    from sweeper.report.output import override_line

    mb, acc, workers = (int(x) for x in re.match(r"mb(\d+)-acc(\d+)-w(\d+)", answer["schedule_layouts"][0]).groups())
    base, rule = answer["base_global_batch"], answer.get("lr_scaling") or "none"
    trunk = next((t for t in points if (t.micro_batch_size, t.accumulation_steps, t.num_workers) == (mb, acc, workers)
                  and t.lr is not None), None)
    ratio = best.global_batch_size / base
    lr = trunk.lr if trunk is not None else None if best.lr is None else best.lr / (
        ratio if rule == "linear" else math.sqrt(ratio) if rule == "sqrt" else 1.0)
    first = replace(best, micro_batch_size=mb, accumulation_steps=acc, num_workers=workers,
                    global_batch_size=base, lr=lr)
    return (f"{override_line(first, 'none')} train.lr_scaling={rule} train.base_batch_size={base} "
            f"{override(answer['schedule'])}")


def snippets_for(answer: Dict[str, Any], folder: str) -> List[str]:
    """snippets() at the micro-batch and workers of the schedule's first layout (a key like mb16-acc1-w1)."""
    import re

    found = re.match(r"mb(\d+)-acc\d+-w(\d+)", answer["schedule_layouts"][0] if answer["schedule_layouts"] else "")
    return snippets(answer, int(found.group(1)), int(found.group(2)), folder) if found else []


def override(spans: Sequence[Sequence[int]]) -> str:
    return "train.batch_schedule=[" + ",".join(f"[{s},{g}]" for s, g in spans) + "]"


def plot(answer: Dict[str, Any], path: str, grid_fit: Optional[float] = None, b_simple: Optional[float] = None
         ) -> Optional[str]:
    """The critical batch size at each checkpoint as a band from the largest global batch that kept up to the
    next one tried, with the schedule's global batch as steps, B_simple at each checkpoint (its branches'; the
    sweep's mean as a line when they measured none) and the grid fit's B_crit as a line where one exists."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    checkpoints = [c for c in answer["checkpoints"] if c.get("informative") is not False]  # no reading, no point
    if not checkpoints:
        return None
    fig = Figure(figsize=(8, 4.8), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, color="0.9")
    xs = [c["samples"] for c in checkpoints]
    low = [c["critical_batch_size"] for c in checkpoints]
    tried = max(max(low), *(c["next_tried"] or 0 for c in checkpoints))
    high = [c["next_tried"] or tried * 2 for c in checkpoints]
    ax.fill_between(xs, low, high, color="tab:blue", alpha=0.15, step=None, label="between: not yet tried")
    ax.plot(xs, low, marker="o", color="tab:blue", linestyle="none", label="critical batch size (largest that kept up)")
    if all(c.get("monotone_fit") for c in checkpoints):
        ax.plot(xs, [c["monotone_fit"] for c in checkpoints], color="tab:blue", label="its rising fit")
    spans = answer["schedule"]
    edges = [s for s, _ in spans] + [answer["budget_samples"]]
    ax.step(edges, [g for _, g in spans] + [spans[-1][1]], where="post", color="tab:green", linestyle="--",
            label="schedule")
    if grid_fit:
        ax.axhline(grid_fit, color="tab:orange", linestyle=":", label=f"grid fit B_crit {grid_fit:.0f}")
    over = answer.get("b_simple") or []
    if over:
        ax.plot([x for x, _ in over], [v for _, v in over], marker="s", color="tab:red", linestyle="-.",
                label="B_simple (its branches' gradient noise scale)")
    elif b_simple:
        ax.axhline(b_simple, color="tab:red", linestyle="-.", label=f"mean B_simple {b_simple:.0f}")
    ax.set_yscale("log", base=2)
    ax.set_title("Critical batch size over training (branches from the trunk)")
    ax.set_xlabel("samples seen")
    ax.set_ylabel("global batch size (log2)")
    ax.legend(loc="upper left", fontsize="small")
    fig.savefig(path)
    return path


def snippets(answer: Dict[str, Any], micro_batch: int, workers: int, folder: str) -> List[str]:
    """The schedule as code that changes accumulation steps at sample counts, keeping the micro-batch and the
    workers: a plain PyTorch loop fragment and a Lightning callback. [] for a single global batch."""
    spans = answer["schedule"]
    if len(spans) < 2:
        return []
    per_step = micro_batch * workers
    table = ", ".join(f"({s}, {g // per_step})" for s, g in spans)
    head = (f"# sweeper's batch-size schedule: global batch {' -> '.join(str(g) for _, g in spans)} at samples "
            f"{', '.join(str(s) for s, _ in spans)},\n# micro-batch {micro_batch} x {workers} worker(s), "
            "accumulation steps rising; scale the LR with the global batch as the sweep did.\n")
    texts = (("schedule_pytorch.py", head + _loop_text(table, micro_batch, per_step)),
             ("schedule_lightning.py", head + _lightning_text(table, per_step)))
    os.makedirs(folder, exist_ok=True)
    written = []
    for name, text in texts:
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(text)
        written.append(path)
    return written


def _loop_text(table: str, micro_batch: int, per_step: int) -> str:
    """The schedule in a plain PyTorch loop: accumulation steps looked up at each optimizer step."""
    return f"""SCHEDULE = [{table}]  # (samples seen, accumulation steps)


def accumulation_at(samples_seen):
    return [acc for start, acc in SCHEDULE if start <= samples_seen][-1]


samples_seen, micro_steps = 0, 0
for x, y in loader:  # the loader yields micro-batches of {micro_batch}
    accumulate = accumulation_at(samples_seen)
    loss = loss_fn(model(x), y) / accumulate
    loss.backward()
    micro_steps += 1
    if micro_steps == accumulate:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        samples_seen += accumulate * {per_step}
        micro_steps = 0
"""


def _lightning_text(table: str, per_step: int) -> str:
    """The schedule as a Lightning callback setting Trainer.accumulate_grad_batches."""
    return f"""import lightning as L

SCHEDULE = [{table}]  # (samples seen, accumulation steps)


class BatchSizeSchedule(L.Callback):
    \"\"\"Sets Trainer.accumulate_grad_batches from SCHEDULE at each optimizer step's first micro-batch
    (Lightning's GradientAccumulationScheduler changes it per epoch; this per sample count).\"\"\"

    def __init__(self):
        self.samples, self.micro = 0, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.micro == 0:  # a step boundary: this step's accumulation
            trainer.accumulate_grad_batches = [acc for start, acc in SCHEDULE if start <= self.samples][-1]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.micro += 1
        if self.micro == trainer.accumulate_grad_batches:
            self.samples += self.micro * {per_step}
            self.micro = 0


trainer = L.Trainer(callbacks=[BatchSizeSchedule()])  # with your other Trainer arguments
"""

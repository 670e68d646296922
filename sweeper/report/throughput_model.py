"""The throughput of layouts the sweep did not measure, predicted from those it did, each prediction with its
measured error: the throughput model of Pollux (Qiao et al., OSDI'21), fitted per parallelism and recipe.
Pure (stdlib, numpy).

One optimizer step's seconds:

    step = accumulation x (fixed + per_sample x micro-batch) + per_step
           + [workers > 1] x (latency + bytes / bandwidth + accumulation x contention x micro-batch)

where `per_step` is what an optimizer step costs once, whatever its accumulation (the update, zeroing the gradients:
measured apart only where the accumulation varies), `bytes` is what each worker moves per step: in shares of the
model ((N-1)/N of its parameter bytes), a part once per step and a part per micro-step (`comm_bytes_per_step` gives
what the parallelism's collectives move); where the points recorded what they moved (communication_bytes_per_step),
the two parts are fitted to those figures instead and predict every layout (FSDP2 keeps its root's weights gathered
from forward to backward, so ZeRO-3 gathers less than twice per micro-step: 1.1 shares on the MLP benchmark, not 2).
`fixed` and `per_sample` are a micro-step's compute, and the bandwidth is fitted from the points with more than one
worker unless cluster.interconnect_gbps gives it. The latency is fitted only where two world sizes above one were
measured (with one, it cannot be told from the bandwidth). `contention` is a cost per sample that appears only with
more than one worker: workers that share a node's cores or memory bandwidth (all of them on one CPU machine) compute
slower together than alone; fitted where the workers' shares differ above one worker. Weighted least squares on
relative residuals, every coefficient >= 0 (the best subset of terms that fits without a negative one). Points whose
steps waited on data for more than DATA_BOUND of their time measure the input pipeline, not the model, and points
whose timed windows spread over NOISY_CV measure the machine's other load: both are left out of the fit (and said
so).

The error each prediction carries, measured on the sweep's own points:
- a world size within the measured ones: leave-one-out, each measured point predicted by the fit to the others;
  the worst absolute relative error of throughput over them (their median beside it);
- a world size beyond the largest measured: the worst error of predicting the points at the largest measured
  world size from the fit to the smaller ones (and never less than the leave-one-out error); "unbounded" (None)
  where that cannot be done (one world size measured, or only one worker below it and no given bandwidth).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from sweeper.report import parallelism as parallelisms
from sweeper.report.data_bound import DATA_BOUND_FRACTION
from sweeper.report.trials import Trial

# A step waiting on data for more than this share of it measures the input pipeline, not the model: the project's
# one line for "data-bound" (report/data_bound.py, which also names such points in the recommendation). Below it, a
# loader that runs in the step's own process (its time linear in the micro-batch) is absorbed by `per_sample`, so
# such points still fit.
DATA_BOUND = DATA_BOUND_FRACTION
# Timed windows whose throughput spreads wider than this measured the machine's other load, not the layout: on the
# shared 2-core CPU the benchmark ran on, a point at 47 % sat at 40 % of its neighbours' rate (docs/recommendation.md).
NOISY_CV = 0.25
BYTES_PER_VALUE = 4  # gradients are reduced in fp32 (DDP's autocast, FSDP2's reduce_dtype)
# Terms of the fit, in the order ties are broken (an earlier subset of equal fit wins: the bandwidth, which
# scales with the world size, before a constant latency).
TERMS = ("fixed", "per_sample", "per_step", "bandwidth", "latency", "contention")
Group = Tuple[str, str, str, Optional[str], bool, Optional[int]]


def comm_bytes_per_step(parallelism: str, workers: int, accumulation_steps: int, parameter_bytes: float,
                        gather_ratio: float = 1.0) -> float:
    """Bytes each worker sends per optimizer step, with ring collectives: an all-gather or a reduce-scatter of a
    buffer moves (N-1)/N of it per worker, an all-reduce twice that (Patarasuk and Yuan 2009). DDP all-reduces
    the gradients once per step (no_sync before the last micro-step); ZeRO-2 and ZeRO-3 (FSDP2) reduce-scatter
    them once per step and all-gather the weights at every micro-step: ZeRO-2 in forward (FSDP2 reshards after
    each backward), ZeRO-3 in forward and again in backward. `gather_ratio`: the gathered weights' bytes per
    value over the gradients' (bf16 weights, fp32 gradients: 0.5). The one place the model says what a
    parallelism moves where nothing was recorded: where points recorded their bytes
    (Trial.communication_bytes_per_step), fitted_bytes_rule fits its two parts to them.
    ZeRO-1: DDP's all-reduce, then each rank broadcasts its share of the updated (fp32) weights once per step
    (measure.node_traffic's zero1). HSDP: as ZeRO-3 over all its workers, exact on one node (its mesh is then
    (1, workers)); across nodes the record read here holds no node count (node_traffic has the split)."""
    return bytes_of_shares(bytes_rule(parallelism, gather_ratio), workers, accumulation_steps, parameter_bytes)


def bytes_rule(parallelism: str, gather_ratio: float = 1.0) -> Tuple[float, float]:
    """(shares moved once per optimizer step, shares moved per micro-step) that the parallelism's collectives
    move, a share being (N-1)/N of the parameter bytes (comm_bytes_per_step)."""
    if parallelism in ("ddp", "zero1"):
        return (2.0 if parallelism == "ddp" else 3.0), 0.0
    return 1.0, {"zero2": 1, "zero3": 2, "hsdp": 2}[parallelism] * gather_ratio


def bytes_of_shares(rule: Tuple[float, float], workers: int, accumulation_steps: int,
                    parameter_bytes: float) -> float:
    """Bytes each worker moves per step under `rule` (bytes_rule's two parts); none with one worker."""
    if workers <= 1:
        return 0.0
    once, per_micro_step = rule
    return (workers - 1) / workers * parameter_bytes * (once + per_micro_step * accumulation_steps)


def fitted_bytes_rule(observed: Sequence["Observed"], default: Tuple[float, float],
                      parameter_bytes: float) -> Tuple[float, float]:
    """The two parts of `default` fitted to the bytes the points above one worker recorded: both parts by least
    squares where two accumulations were measured (each >= 0), else `default` scaled to the figures' mean
    ratio; `default` itself where none recorded what it moved."""
    found = [(o.layout.accumulation_steps,
              o.comm_bytes / ((o.layout.num_workers - 1) / o.layout.num_workers * parameter_bytes))
             for o in observed if o.bytes_measured and o.layout.num_workers > 1]
    if not found:
        return default
    if len({a for a, _ in found}) >= 2:
        x = np.array([[1.0, float(a)] for a, _ in found])
        values, *_ = np.linalg.lstsq(x, np.array([shares for _, shares in found]), rcond=None)
        if (values >= 0).all():
            return float(values[0]), float(values[1])
    scale = statistics.mean(shares / (default[0] + default[1] * a) for a, shares in found)
    return default[0] * scale, default[1] * scale


@dataclass(frozen=True)
class Layout:
    micro_batch_size: int
    accumulation_steps: int
    num_workers: int

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.accumulation_steps * self.num_workers

    @property
    def key(self) -> str:
        return f"mb{self.micro_batch_size}-acc{self.accumulation_steps}-w{self.num_workers}"


@dataclass(frozen=True)
class Observed:
    """A measured layout: its throughput, and the bytes each worker moved per step (measured or modelled)."""

    key: str
    layout: Layout
    samples_per_second: float
    comm_bytes: float
    bytes_measured: bool = False  # comm_bytes is the point's recorded figure (else the parallelism's formula)

    @property
    def step_seconds(self) -> float:
        return self.layout.global_batch_size / self.samples_per_second


@dataclass(frozen=True)
class Coefficients:
    """A fit: seconds per micro-step and per sample of it, per optimizer step; seconds per byte moved
    (1 / bandwidth; None: not known, so no world size above one is predicted) and per step with more than one
    worker."""

    fixed_seconds: float = 0.0
    per_sample_seconds: float = 0.0
    seconds_per_byte: Optional[float] = None
    latency_seconds: float = 0.0
    per_step_seconds: float = 0.0
    contention_seconds_per_sample: float = 0.0

    def step_seconds(self, layout: Layout, comm_bytes: float) -> Optional[float]:
        compute = layout.accumulation_steps * (self.fixed_seconds + self.per_sample_seconds * layout.micro_batch_size)
        compute += self.per_step_seconds
        if layout.num_workers <= 1:
            return compute
        if self.seconds_per_byte is None:
            return None
        samples = layout.accumulation_steps * layout.micro_batch_size
        return compute + self.latency_seconds + comm_bytes * self.seconds_per_byte + \
            samples * self.contention_seconds_per_sample


@dataclass(frozen=True)
class Prediction:
    """A layout's throughput: predicted by the model (`measured` beside it where the sweep ran it), with the
    error the rule gives it (None: unbounded) and the rule in words."""

    layout: Layout
    samples_per_second: float
    error: Optional[float]
    rule: str
    measured: Optional[float] = None

    def text(self) -> str:
        """'predicted 512.0 samples/s ±8 %' or '... ± unbounded'."""
        bound = "unbounded" if self.error is None else f"{self.error:.0%}"
        return f"predicted {self.samples_per_second:,.1f} samples/s \u00b1{bound}"


@dataclass(frozen=True)
class GroupModel:
    """The model of one parallelism and recipe: its fit, the points behind it, and its errors."""

    group: Group
    coefficients: Coefficients
    observed: Tuple[Observed, ...]
    parameter_bytes: Optional[float]  # the whole model's, from the points' memory records (None: unknown)
    gather_ratio: float
    bandwidth_given: bool
    loo_errors: Dict[str, float]  # point key -> predicted / measured - 1, by the fit to the others
    beyond_error: Optional[float]  # None: unbounded
    excluded: Dict[str, str] = field(default_factory=dict)  # data-bound points, with why
    # (shares once per step, per micro-step) each worker moves: fitted_bytes_rule over the points' records
    shares_moved: Optional[Tuple[float, float]] = None

    @property
    def parallelism(self) -> str:
        return self.group[0]

    @property
    def largest_workers(self) -> int:
        return max(o.layout.num_workers for o in self.observed)

    @property
    def within_error(self) -> Optional[float]:
        """The worst leave-one-out error (None: no point could be left out and predicted)."""
        return max((abs(e) for e in self.loo_errors.values()), default=None)

    @property
    def within_median(self) -> Optional[float]:
        values = [abs(e) for e in self.loo_errors.values()]
        return statistics.median(values) if values else None

    def comm_bytes(self, layout: Layout) -> float:
        rule = self.shares_moved or bytes_rule(self.parallelism, self.gather_ratio)
        return bytes_of_shares(rule, layout.num_workers, layout.accumulation_steps, self.parameter_bytes or 1.0)

    def predict(self, layout: Layout) -> Optional[Prediction]:
        """The layout's predicted throughput and its error; None where the fit cannot say (more than one worker
        and no bandwidth)."""
        step = self.coefficients.step_seconds(layout, self.comm_bytes(layout))
        if step is None or step <= 0:
            return None
        measured = next((o.samples_per_second for o in self.observed if o.layout == layout), None)
        n = len(self.loo_errors)
        if layout.num_workers <= self.largest_workers:
            error, rule = self.within_error, f"leave-one-out over {n} measured points" if n else \
                "unbounded: too few points to leave one out"
        else:
            beyond = self.beyond_error
            error = None if beyond is None else max(beyond, self.within_error or 0.0)
            rule = (f"beyond the largest measured world size ({self.largest_workers}): the error of predicting it "
                    "from the smaller ones" if beyond is not None else
                    f"unbounded: beyond the largest measured world size ({self.largest_workers}), with no smaller "
                    "world size to test the extrapolation on")
        return Prediction(layout, layout.global_batch_size / step, error, rule, measured)


# ---------------------------------------------------------------------------------------------------
# Fitting


def group_of(t: Trial) -> Group:
    """What must match for points to share one model: parallelism, precision, checkpointing, optimizer,
    compilation and a language model's context (the LR and the seed change neither a step's time nor its bytes)."""
    return (parallelisms.of(t), t.precision or "fp32", t.activation_checkpointing or "none", t.optimizer,
            bool(t.compiled), t.context)


def group_label(group: Group) -> str:
    """'ddp, fp32', 'zero3, bf16 + ckpt, context 128'."""
    label = f"{group[0]}, {group[1]}" + ("" if group[2] == "none" else " + ckpt")
    return label + (" compiled" if group[4] else "") + ("" if group[5] is None else f", context {group[5]}")


def left_out(t: Trial) -> Optional[str]:
    """Why a point is left out of the fit (None: it is not): its steps waited on data, or its windows spread too
    wide to stand for its layout."""
    if t.samples_per_second_cv is not None and t.samples_per_second_cv > NOISY_CV:
        return f"noisy: its timed windows' throughput spread {t.samples_per_second_cv:.0%} (over {NOISY_CV:.0%})"
    return data_bound(t)


def data_bound(t: Trial) -> Optional[str]:
    """Why a point measured its input pipeline rather than its model (None: it did not)."""
    share = t.data_wait_fraction
    if share is None and t.data_seconds_per_step is not None and t.samples_per_second:
        share = t.data_seconds_per_step / (t.global_batch_size / t.samples_per_second)
    if share is not None and share > DATA_BOUND:
        return f"data-bound: {share:.0%} of its step waited on data (over {DATA_BOUND:.0%})"
    return None


def fit_all(layouts: Sequence[Trial], interconnect_gbps: Optional[float] = None) -> Dict[Group, GroupModel]:
    """A model per group of `layouts` (one measured Trial per layout and recipe: report.folding.fold_layouts) that
    ran ok with a throughput; groups whose points fit no model are left out."""
    by_group: Dict[Group, List[Trial]] = {}
    for t in layouts:
        if t.status == "ok" and t.samples_per_second:
            by_group.setdefault(group_of(t), []).append(t)
    models = {}
    for group, members in by_group.items():
        model = fit_group(group, members, interconnect_gbps)
        if model is not None:
            models[group] = model
    return models


def fit_group(group: Group, members: Sequence[Trial], interconnect_gbps: Optional[float] = None
              ) -> Optional[GroupModel]:
    """One group's model, its leave-one-out errors and its extrapolation error; None with no point to fit."""
    excluded = {t.key: why for t in members for why in [left_out(t)] if why}
    kept = [t for t in members if t.key not in excluded]
    if not kept:
        return None
    parameter_bytes = _parameter_bytes(kept, group[0])
    gather_ratio = 1.0 if group[1] == "fp32" else 0.5  # FSDP2 gathers bf16/fp16 weights, reduces fp32 gradients
    per_byte = None if interconnect_gbps is None or parameter_bytes is None else 8 / (interconnect_gbps * 1e9)
    observed = tuple(_observed(t, group[0], parameter_bytes or 1.0, gather_ratio) for t in kept)
    coefficients = fit(observed, per_byte)
    if coefficients is None:
        return None
    default = bytes_rule(group[0], gather_ratio)
    loo = {}
    for i, one in enumerate(observed):
        others = observed[:i] + observed[i + 1:]
        refit = fit(others, per_byte)
        # the left-out point's bytes as a layout never measured gets them: from the others' records
        moved = bytes_of_shares(fitted_bytes_rule(others, default, parameter_bytes or 1.0), one.layout.num_workers,
                                one.layout.accumulation_steps, parameter_bytes or 1.0)
        step = None if refit is None else refit.step_seconds(one.layout, moved)
        if step:
            loo[one.key] = (one.layout.global_batch_size / step) / one.samples_per_second - 1
    return GroupModel(group, coefficients, observed, parameter_bytes, gather_ratio, per_byte is not None, loo,
                      _beyond_error(observed, per_byte, default, parameter_bytes or 1.0), excluded,
                      fitted_bytes_rule(observed, default, parameter_bytes or 1.0))


def _parameter_bytes(members: Sequence[Trial], parallelism: str) -> Optional[float]:
    """The whole model's parameter bytes: a DDP worker's own (it holds them all), a sharded worker's times the
    shard group; None where no point recorded its memory breakdown."""
    found = [t.memory_parameters_bytes * (t.num_workers if parallelism not in ("ddp", "zero1") else 1)
             for t in members if t.memory_parameters_bytes]
    return max(found) if found else None


def _observed(t: Trial, parallelism: str, parameter_bytes: float, gather_ratio: float) -> Observed:
    layout = Layout(t.micro_batch_size, t.accumulation_steps, t.num_workers)
    modelled = comm_bytes_per_step(parallelism, t.num_workers, t.accumulation_steps, parameter_bytes, gather_ratio)
    measured = (t.communication_bytes_per_step if t.communication_bytes_per_step is not None and t.num_workers > 1
                else None)
    return Observed(t.key, layout, float(t.samples_per_second), modelled if measured is None else float(measured),
                    measured is not None)


def fit(observed: Sequence[Observed], seconds_per_byte: Optional[float] = None) -> Optional[Coefficients]:
    """The coefficients of the step model over `observed`: weighted least squares (each residual relative to its
    step's seconds), every term >= 0, the subset of terms that fits best (fewer terms on a tie); with
    `seconds_per_byte` given, the communication's bandwidth is not fitted. None when nothing fits."""
    if not observed:
        return None
    y = np.array([o.step_seconds for o in observed])
    columns = _columns(observed, seconds_per_byte)
    if seconds_per_byte is not None:
        y = y - np.array([o.comm_bytes * seconds_per_byte if o.layout.num_workers > 1 else 0.0 for o in observed])
    weights = 1.0 / np.array([o.step_seconds for o in observed])
    best: Optional[Tuple[float, Dict[str, float]]] = None
    names = list(columns)
    for size in range(1, len(names) + 1):
        for subset in itertools.combinations(names, size):
            found = _solve(np.column_stack([columns[n] for n in subset]), y, weights)
            if found is None:
                continue
            residual, values = found
            if best is None or residual < best[0] * (1 - 1e-9) - 1e-18:
                best = (residual, dict(zip(subset, values)))
    if best is None:
        return None
    values = best[1]
    multi = any(o.layout.num_workers > 1 for o in observed)
    # Points above one worker measured the communication (a term left out of the best subset costs nothing);
    # without any, a world size above one is unknown.
    per_byte = seconds_per_byte if seconds_per_byte is not None else (values.get("bandwidth", 0.0) if multi else None)
    return Coefficients(float(values.get("fixed", 0.0)), float(values.get("per_sample", 0.0)),
                        None if per_byte is None else float(per_byte), float(values.get("latency", 0.0)),
                        float(values.get("per_step", 0.0)), float(values.get("contention", 0.0)))


def _columns(observed: Sequence[Observed], seconds_per_byte: Optional[float]) -> Dict[str, np.ndarray]:
    """The terms the points can tell apart: compute always (the per-step cost is told from the per-micro-step
    one only where the accumulation varies: otherwise the two are one column, and the subset search keeps one);
    with points above one worker the bandwidth (unless given), with two world sizes above one a latency, and with
    two sizes of a worker's share above one worker the contention."""
    acc = np.array([float(o.layout.accumulation_steps) for o in observed])
    micro = np.array([float(o.layout.micro_batch_size) for o in observed])
    multi = np.array([1.0 if o.layout.num_workers > 1 else 0.0 for o in observed])
    columns = {"fixed": acc, "per_sample": acc * micro, "per_step": np.ones(len(observed))}
    if seconds_per_byte is None and multi.any():
        columns["bandwidth"] = np.array([o.comm_bytes if o.layout.num_workers > 1 else 0.0 for o in observed])
    if len({o.layout.num_workers for o in observed if o.layout.num_workers > 1}) >= 2:
        columns["latency"] = multi
    shares = {o.layout.accumulation_steps * o.layout.micro_batch_size for o in observed if o.layout.num_workers > 1}
    if len(shares) >= 2:
        columns["contention"] = multi * acc * micro
    return {name: columns[name] for name in TERMS if name in columns}


def _solve(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> Optional[Tuple[float, np.ndarray]]:
    """(weighted squared residual, coefficients) of least squares, or None when the terms cannot be told apart
    (fewer points than terms, or collinear) or a coefficient comes out negative."""
    if x.shape[0] < x.shape[1] or np.linalg.matrix_rank(x) < x.shape[1]:
        return None
    xw, yw = x * weights[:, None], y * weights
    values, *_ = np.linalg.lstsq(xw, yw, rcond=None)
    if (values < -1e-12).any():
        return None
    values = np.clip(values, 0.0, None)
    return float(((xw @ values - yw) ** 2).sum()), values


def _beyond_error(observed: Sequence[Observed], seconds_per_byte: Optional[float], default: Tuple[float, float],
                  parameter_bytes: float) -> Optional[float]:
    """The worst error of predicting the points at the largest measured world size from the fit to the points at
    smaller ones (their bytes from the smaller ones' records); None (unbounded) when there are none, or that fit
    cannot predict them."""
    largest = max(o.layout.num_workers for o in observed)
    smaller = [o for o in observed if o.layout.num_workers < largest]
    if largest <= 1 or not smaller:
        return None
    refit = fit(smaller, seconds_per_byte)
    if refit is None:
        return None
    rule = fitted_bytes_rule(smaller, default, parameter_bytes)
    errors = []
    for o in observed:
        if o.layout.num_workers != largest:
            continue
        step = refit.step_seconds(o.layout, bytes_of_shares(rule, o.layout.num_workers, o.layout.accumulation_steps,
                                                            parameter_bytes))
        if not step:
            return None
        errors.append(abs((o.layout.global_batch_size / step) / o.samples_per_second - 1))
    return max(errors)


# ---------------------------------------------------------------------------------------------------
# Predicting the grid


def worker_counts(measured: Sequence[int], max_workers: Optional[int], extra: Sequence[int] = ()) -> List[int]:
    """The worker counts predicted: the measured ones, the powers of two up to `max_workers` (null: the largest
    measured), `max_workers` itself and any `extra` (report.target_workers)."""
    top = max(list(measured) + [1]) if max_workers is None else int(max_workers)
    counts = set(measured) | {2 ** k for k in range(0, top.bit_length()) if 2 ** k <= top} | {top} | set(extra)
    return sorted(c for c in counts if c >= 1)


def predict_grid(model: GroupModel, micro_batch_sizes: Sequence[int], accumulation_steps: Sequence[int],
                 workers: Sequence[int]) -> List[Prediction]:
    """Every layout of the axes, in order of workers, micro-batch and accumulation, that the model can predict."""
    out = []
    for w, m, a in itertools.product(sorted(set(workers)), sorted(set(micro_batch_sizes)),
                                     sorted(set(accumulation_steps))):
        found = model.predict(Layout(int(m), int(a), int(w)))
        if found is not None:
            out.append(found)
    return out

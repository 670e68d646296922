"""What a measured point is: the typed results workers return, and the MLflow name of each figure.

One home for the recorded schema (docs/mlflow.md): a field's name IS its MLflow metric name, and its
metadata says how it is recorded (a metric, a per-step series, a tag, or a note that travels with the
result but is not a figure; those kinds and the Record base are sweeper/record.py's). A worker fills a
result; it crosses to the driver as a flat dict (Ray reports numbers by name) and is rebuilt there with
`from_flat`, which refuses a name it does not know: a figure the code produces but the schema lacks
fails loudly instead of vanishing on its way to MLflow. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

# The record machinery (sweeper/record.py), re-exported: `from sweeper.schema import METRIC` as before.
from sweeper.record import (  # noqa: F401 - re-exported
    CURVE, MAP, METRIC, NOTE, SERIES, TAG, Record, curve, metric, metric_map, note, section, series, tag,
)

# How a point ends, best to worst: the worst over a point's ranks is its status.
# `stopped` (sweep.strategy=smart: its class stopped early by successive halving) is the driver's, never a worker's.
STATUSES = ("ok", "stopped", "did_not_learn", "diverged", "oom", "failed")


# ---------------------------------------------------------------------------------------------------
# A training point (also a frontier probe: the same step, run for its warm-up only)


@dataclass
class Throughput(Record):
    """Timed windows of whole optimizer steps, warm-up excluded (measure.timing)."""

    samples_per_second: Optional[float] = metric()
    samples_per_second_cv: Optional[float] = metric()
    tokens_per_second: Optional[float] = metric()  # a language model's: samples/s x its context
    # a loss that counts items (tokens that are not padding): samples/s x the items per sample of the timed steps
    items_per_second: Optional[float] = metric()
    # why the throughput is not the recipe's: a precision this device only emulates (e.g. bf16 on a CPU without
    # AVX512-BF16 or AMX): never compared with the others as if it were
    throughput_emulated: Optional[str] = tag("sweeper.throughput_emulated")
    step_time_seconds: Optional[float] = metric()
    window_samples_per_second: Optional[List[float]] = series()
    timing_windows: Optional[int] = metric()
    stable_windows_used: Optional[int] = metric()
    throughput_stable: Optional[bool] = tag("sweeper.throughput_stable")
    # where a step's time went (measure.timing.phase_split)
    data_seconds_per_step: Optional[float] = metric()
    forward_backward_seconds_per_step: Optional[float] = metric()
    optimizer_seconds_per_step: Optional[float] = metric()
    data_wait_fraction: Optional[float] = metric()  # data's share of the step; over report/data_bound's: data-bound


@dataclass
class Memory(Record):
    """The largest worker's memory, each figure named for what it counts (measure.telemetry, measure.memory)."""

    peak_memory_bytes: Optional[int] = metric()
    memory_measure: Optional[str] = tag("sweeper.memory_measure")
    # one training step's tensors by category (torch MemTracker, measure.memory.MemoryBreakdown)
    memory_parameters_bytes: Optional[int] = metric()
    memory_buffers_bytes: Optional[int] = metric()
    memory_gradients_bytes: Optional[int] = metric()
    memory_optimizer_state_bytes: Optional[int] = metric()
    memory_activations_bytes: Optional[int] = metric()
    memory_temporaries_bytes: Optional[int] = metric()
    memory_other_bytes: Optional[int] = metric()
    memory_tracked_peak_bytes: Optional[int] = metric()
    memory_forward_activations_bytes: Optional[int] = metric()
    # the tracked step's highest total in each phase: the peak is the largest (measure.memory.MemoryBreakdown)
    memory_forward_peak_bytes: Optional[int] = metric()
    memory_backward_peak_bytes: Optional[int] = metric()
    memory_optimizer_peak_bytes: Optional[int] = metric()
    # the budget the step ran under, and the fake-tensor estimate of the tracked peak against it
    memory_budget_bytes: Optional[int] = metric()
    memory_budget_mode: Optional[str] = tag("sweeper.memory_budget")
    memory_estimated_peak_bytes: Optional[int] = metric()
    memory_estimate_error: Optional[float] = metric()
    # a sweep with a sharded parallelism: measure.sharded_memory's peak per worker, against the tracked one
    memory_predicted_bytes: Optional[int] = metric()
    memory_prediction_error: Optional[float] = metric()
    memory_optimizer_state_bytes_by_rank: Optional[List[float]] = series()  # each rank's, at the end (step: rank)
    # the device's own figures (measure.telemetry.Device.memory_metrics)
    cuda_max_memory_allocated_bytes: Optional[int] = metric()
    cuda_max_memory_reserved_bytes: Optional[int] = metric()
    cpu_rss_peak_above_baseline_bytes: Optional[int] = metric()
    cpu_rss_peak_bytes: Optional[int] = metric()


@dataclass
class Communication(Record):
    """The collectives of one optimizer step on a worker, counted where they reach the process group
    (measure.collective_count, on the last warm-up step), the bytes a worker sent for them under ring
    algorithms (measure.communication), and the prediction from the model's units against it."""

    communication_bytes_per_step: Optional[int] = metric()
    communication_collectives_per_step: Optional[int] = metric()
    communication_predicted_bytes_per_step: Optional[int] = metric()
    communication_prediction_error: Optional[float] = metric()


@dataclass
class Utilization(Record):
    """How busy the process, the machine and the GPU were in the timed windows: means over workers,
    maxima over workers (measure.telemetry.Utilization)."""

    process_cpu_percent_mean: Optional[float] = metric()
    process_cpu_percent_max: Optional[float] = metric()
    system_cpu_percent_mean: Optional[float] = metric()
    system_cpu_percent_max: Optional[float] = metric()
    gpu_utilization_percent_mean: Optional[float] = metric()
    gpu_utilization_percent_max: Optional[float] = metric()
    gpu_device_memory_used_bytes_max: Optional[int] = metric()
    gpu_telemetry_note: Optional[str] = tag("sweeper.gpu_telemetry")


@dataclass
class Flops(Record):
    """FLOPs per sample counted on fake tensors, against the device's peak (measure.flops)."""

    flops_per_sample_forward: Optional[float] = metric()
    flops_per_sample_train: Optional[float] = metric()  # the model's: what MFU counts
    # What the hardware computes: with activation checkpointing, the recomputed forward too (HFU).
    flops_per_sample_hardware: Optional[float] = metric()
    flops_per_token_train: Optional[float] = metric()  # a language model's, per token of its context
    achieved_flops_per_second: Optional[float] = metric()
    peak_flops_per_second: Optional[float] = metric()  # in the point's precision
    mfu: Optional[float] = metric()
    hfu: Optional[float] = metric()
    peak_flops_source: Optional[str] = tag("sweeper.peak_flops_source")


@dataclass
class Accuracy(Record):
    val_accuracy: Optional[float] = metric()
    val_loss: Optional[float] = metric()  # mean cross-entropy over the held-out split (nats per token for a LM)
    val_loss_se: Optional[float] = metric()  # its standard error over the held-out samples
    val_samples: Optional[int] = metric()  # the held-out split's size (its binomial interval)
    # a language model: val_accuracy is next-token accuracy over these tokens; the loss as perplexity,
    # and for byte-level data in bits per byte, beside the training stream's unigram entropy (bits)
    val_tokens: Optional[int] = metric()
    val_perplexity: Optional[float] = metric()
    val_bits_per_byte: Optional[float] = metric()
    train_unigram_entropy_bits: Optional[float] = metric()
    num_classes: Optional[int] = metric()  # the labels' count: a guess scores 1/num_classes (the chance check)
    # BatchNorm statistics re-estimated over these samples before validation (absent without BatchNorm)
    bn_recalibration_samples: Optional[int] = metric()
    # why there is no accuracy (e.g. synthetic data), set by the driver
    accuracy_note: Optional[str] = tag("sweeper.accuracy")
    eval_batch_size: Optional[int] = metric()  # validation samples per forward on each worker (eval.batch_size)
    # eval.metrics_fn's metrics over the whole validation split (or what your loop or LightningModule reported),
    # their bootstrap standard errors, and which way each is better ("f1=higher,wer=lower")
    val_metrics: Optional[Dict[str, float]] = metric_map("val_metric/")
    val_metrics_se: Optional[Dict[str, float]] = metric_map("val_metric_se/")
    val_metric_directions: Optional[str] = tag("sweeper.metric_directions")
    # an evaluation that ran out of memory: why (the point keeps its throughput and memory, and has no quality)
    eval_error: Optional[str] = tag("sweeper.eval_error")
    eval_oom: Optional[bool] = tag("sweeper.eval_oom")


@dataclass
class Progress(Record):
    """Evaluations during training (eval.every_samples) and the time to a target."""

    val_accuracy_curve: Optional[List[Tuple[int, float]]] = curve()  # (samples seen, accuracy)
    val_loss_curve: Optional[List[Tuple[int, float]]] = curve()
    # (samples seen, seconds since training started at that evaluation, evaluations included): a time to a
    # target measured on the run's own clock, for a target chosen after it
    val_wall_seconds_curve: Optional[List[Tuple[int, float]]] = curve()
    val_eval_seconds_curve: Optional[List[Tuple[int, float]]] = curve()  # (samples seen, seconds evaluating so far)
    evaluations: Optional[int] = metric()
    eval_seconds: Optional[float] = metric()  # on the time to target's clock, out of the throughput windows
    reached_target: Optional[int] = metric()  # 1 or 0 (with a target)
    samples_to_target: Optional[int] = metric()
    steps_to_target: Optional[int] = metric()
    time_to_target_seconds: Optional[float] = metric()  # from the first step, evaluations included
    eval_seconds_to_target: Optional[float] = metric()  # the evaluations' share of it


@dataclass
class NoiseScale(Record):
    """The gradient noise scale B_simple = tr(Sigma) / |G|^2 from the point's micro-gradients
    (worker.gns): the final moving averages, the ratio over the whole training, and after each step."""

    gns_b_simple: Optional[float] = metric()  # the final moving averages' ratio
    gns_b_simple_train_avg: Optional[float] = metric()  # mean tr(Sigma) over the steps / mean |G|^2
    gns_trace_sigma: Optional[float] = metric()  # mean over the steps
    gns_grad_sq_norm: Optional[float] = metric()  # mean over the steps
    gns_b_simple_ema: Optional[List[float]] = series()  # the moving averages' ratio after each step
    gns_trace_sigma_per_step: Optional[List[float]] = series()  # each step's unbiased estimates
    gns_grad_sq_norm_per_step: Optional[List[float]] = series()
    gns_small_batch: Optional[int] = metric()  # b: the micro-batch
    gns_big_batch: Optional[int] = metric()  # B: the global batch
    gns_train_samples: Optional[int] = metric()  # N, for the without-replacement correction
    gns_every_steps: Optional[int] = metric()  # one step in this many measured: the series' spacing
    gns_note: Optional[str] = tag("sweeper.gns")  # why there is no estimate

    def follow(self, earlier: Sequence["NoiseScale"]) -> None:
        """This run's per-step series as the last part of one run that `earlier` runs began (the moving
        averages already went on from theirs: worker.state.History)."""
        for name in ("gns_b_simple_ema", "gns_trace_sigma_per_step", "gns_grad_sq_norm_per_step"):
            values = [v for e in earlier for v in (getattr(e, name) or [])] + list(getattr(self, name) or [])
            setattr(self, name, values or None)


@dataclass
class Divergence(Record):
    """Why a point is `diverged` or `did_not_learn` (worker.divergence), a loss spike it came back
    from, and the gradient it had."""

    diverged_at_step: Optional[int] = metric()
    divergence_reason: Optional[str] = tag("sweeper.divergence")  # nonfinite | spike | worse_than_guess
    # did_not_learn: its accuracy against a guess, in words (the binomial test's numbers and level)
    status_detail: Optional[str] = tag("sweeper.status_detail")
    # a loss spike that came back under its bar within divergence.recover_steps: a warning, not a divergence
    spike_at_step: Optional[int] = metric()  # its first step over the bar
    spike_peak_over_mean: Optional[float] = metric()  # its highest loss / the running mean before it
    spike_recovered_after_steps: Optional[int] = metric()
    spike_warning: Optional[str] = tag("sweeper.spike_warning")
    grad_norm: Optional[List[float]] = series()  # the whole gradient's norm at every step

    def follow(self, earlier: Sequence["Divergence"], steps_before: int) -> None:
        """This run as the last part of one run that `earlier` runs of `steps_before` steps began: its
        steps counted from the first run's first step, the gradient's norm of every step."""
        for name in ("diverged_at_step", "spike_at_step"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name) + steps_before)
        norms = [v for e in earlier for v in (e.grad_norm or [])] + list(self.grad_norm or [])
        self.grad_norm = norms or None


@dataclass
class Provenance(Record):
    """sweep.strategy=smart: which measurement each of the point's figures comes from (its layout's
    throughput run, its class representative's accuracy run), and how far a stopped class got."""

    throughput_from: Optional[str] = tag("sweeper.throughput_from")
    accuracy_from: Optional[str] = tag("sweeper.accuracy_from")
    accuracy_class: Optional[str] = tag("sweeper.accuracy_class")
    # derived: the representative's steps to target x this point's own step time + its evaluations
    time_to_target_from: Optional[str] = tag("sweeper.time_to_target")
    stopped_at_rung: Optional[int] = metric()
    stopped_at_samples: Optional[int] = metric()
    stopped_reason: Optional[str] = tag("sweeper.stopped")
    # sweep.strategy=branch: a branch's trunk (its last run's key), the trunk checkpoint it continued from (in
    # samples seen) and its global batch; a trunk run's place in its chain
    branch_trunk: Optional[str] = tag("sweeper.branch_trunk")
    branch_checkpoint_samples: Optional[int] = metric()
    branch_global_batch: Optional[int] = metric()
    branch_window_samples: Optional[int] = metric()


@dataclass
class Schedule(Record):
    """train.batch_schedule: the spans one point trained, one entry per span (the span's index as step)."""

    schedule_start_samples: Optional[List[float]] = series()
    schedule_global_batch_size: Optional[List[float]] = series()
    schedule_accumulation_steps: Optional[List[float]] = series()
    schedule_steps: Optional[List[float]] = series()
    schedule_lr: Optional[List[float]] = series()  # the span's LR (its global batch's, before any warmup)


@dataclass
class TrainingState(Record):
    """A point's training-state checkpoint (sweeper.worker.state): where it continued from and where it
    saved, with what the save and the read cost."""

    continued_from: Optional[str] = tag("sweeper.continued_from")  # the checkpoint folder it started from
    start_samples: Optional[int] = metric()  # samples seen before this run (0: from scratch)
    checkpoint_read_seconds: Optional[float] = metric()
    # Where this run saved its state at its end (not "checkpoint_path": Ray Tune takes that result key).
    saved_state_path: Optional[str] = tag("sweeper.checkpoint")
    checkpoint_samples: Optional[int] = metric()
    checkpoint_write_seconds: Optional[float] = metric()
    checkpoint_bytes: Optional[int] = metric()
    checkpoint_error: Optional[str] = tag("sweeper.checkpoint_error")  # why the save failed (the point stands)
    # Saved on the way too (sweep.strategy=branch's trunk): at these samples seen, each write's seconds
    saved_at_samples: Optional[List[float]] = series()
    saved_write_seconds: Optional[List[float]] = series()


@dataclass
class Recipe(Record):
    """What the point's recipe did beyond the figures above: fp16's loss scaling, checkpointing, compilation."""

    # fp16: the GradScaler's scale after the last step, and the optimizer steps it skipped (a gradient not finite)
    grad_scaler_scale: Optional[float] = metric()
    grad_scaler_skipped_steps: Optional[int] = metric()
    # train.grad_clip_norm: the steps whose whole gradient (series grad_norm: before clipping) was over it and
    # clipped, and their share of the run's steps
    grad_clipped_steps: Optional[int] = metric()
    grad_clipped_fraction: Optional[float] = metric()
    # the figures your step (train.step_fn) returned beside its loss, averaged over the timed steps' micro-batches
    # and the ranks: MLflow metric step_metric_<name>
    step_metrics: Optional[Dict[str, float]] = metric_map("step_metric_")
    checkpointed_blocks: Optional[int] = metric()  # blocks recomputed in backward (activation_checkpointing)
    # train.compile: the first (untimed) optimizer step's wall time, compilation included.
    compile_step_seconds: Optional[float] = metric()


@dataclass
class Cost(Record):
    """Where the point's time, and its worker group's, went; what it trained."""

    trial_seconds: Optional[float] = metric()  # the point's wall time in its worker
    train_seconds: Optional[float] = metric()  # its optimizer steps alone
    startup_seconds: Optional[float] = metric()  # point start to its first optimizer step done
    optimizer_steps: Optional[int] = metric()
    samples_seen: Optional[int] = metric()
    tokens_seen: Optional[int] = metric()  # a language model's: samples x its context
    items_seen: Optional[int] = metric()  # a loss that counts items: the items of every step (e.g. tokens not padding)
    # paid once per worker group, logged on its first point (worker.points.startup_split)
    worker_group_startup_seconds: Optional[float] = metric()
    worker_group_launch_seconds: Optional[float] = metric()
    worker_group_init_seconds: Optional[float] = metric()
    worker_group_setup_seconds: Optional[float] = metric()
    between_points_seconds: Optional[float] = metric()  # the harness's gap since the previous point
    worker_group_points: Optional[int] = metric()
    # faults and placement: restarts of the worker group before this point, nodes its workers spanned, each rank's
    # node ("0,0,1,1": an index into `nodes`, Ray's node ids), an hsdp point's mesh (sharding.mesh_text); zero1's
    # and hsdp's bytes a rank sends per step within its node and across nodes, predicted (measure.node_traffic)
    worker_group_restarts: Optional[int] = metric()
    num_nodes: Optional[int] = metric()
    rank_nodes: Optional[str] = tag("sweeper.rank_nodes")
    nodes: Optional[str] = tag("sweeper.nodes")
    mesh: Optional[str] = tag("sweeper.mesh")
    communication_within_node_bytes_per_step: Optional[int] = metric()
    communication_across_nodes_bytes_per_step: Optional[int] = metric()


@dataclass
class PointResult(Record):
    """One measured grid point (or frontier probe), the same on every rank of its process group."""

    trial_key: str = note("")  # the point's key, e.g. mb32-acc2-w1 (MLflow tag sweeper.trial_key)
    # ok | did_not_learn | diverged | oom | failed (| idle: a rank outside a smaller point's sub-group)
    status: str = note("ok")
    error: Optional[str] = tag("sweeper.error")
    oom_implied_by: Optional[str] = tag("sweeper.oom_implied_by")
    oom_simulated: Optional[bool] = note()  # the out-of-memory was a simulated CPU budget's
    oom_predicted: Optional[bool] = note()  # never launched: its predicted peak is over the budget
    probe_role: Optional[str] = tag("sweeper.probe_role")  # frontier probes: fit | verify
    micro_batch_size: Optional[int] = note()  # a frontier probe's size (a grid point's is its key)
    accumulation_steps: Optional[int] = note()
    started_at: Optional[float] = note()  # epoch seconds in the worker: the MLflow run's start
    device: Optional[str] = note()
    profile_trace_dir: Optional[str] = note()  # profile=true: logged as the run's `profile/` artifacts
    # how accumulation reduced, read back from the worker's wrapped model (final | every | none): the driver
    # records it as the point's param gradient_sync
    gradient_sync: Optional[str] = note()
    train_loss: Optional[List[float]] = series()  # the global batch's loss at every optimizer step
    throughput: Throughput = section(Throughput)
    memory: Memory = section(Memory)
    communication: Communication = section(Communication)
    utilization: Utilization = section(Utilization)
    flops: Flops = section(Flops)
    accuracy: Accuracy = section(Accuracy)
    progress: Progress = section(Progress)
    divergence: Divergence = section(Divergence)
    noise: NoiseScale = section(NoiseScale)
    recipe: Recipe = section(Recipe)
    cost: Cost = section(Cost)
    provenance: Provenance = section(Provenance)
    state: TrainingState = section(TrainingState)
    schedule: Schedule = section(Schedule)

    @property
    def oom_source(self) -> Optional[str]:
        """Where an out-of-memory came from (MLflow tag sweeper.oom): never run, implied by a smaller
        point's or predicted over the budget; a budget simulated on CPU; or the device's own allocator."""
        if self.status != "oom":
            return None
        if self.oom_predicted:
            return "predicted"
        return "implied" if self.oom_implied_by else "simulated" if self.oom_simulated else "device"


# ---------------------------------------------------------------------------------------------------
# An inference point (task=inference)


@dataclass
class Latency(Record):
    """Timed forward passes at one batch size (inference.latency.summarize_latency)."""

    latency_p50_seconds: Optional[float] = metric()
    latency_p95_seconds: Optional[float] = metric()
    latency_p99_seconds: Optional[float] = metric()
    latency_mean_seconds: Optional[float] = metric()
    latency_min_seconds: Optional[float] = metric()
    latency_max_seconds: Optional[float] = metric()
    latency_cv: Optional[float] = metric()
    timed_runs: Optional[int] = metric()
    samples_per_second: Optional[float] = metric()  # batch size / median latency: the headline
    samples_per_second_overall: Optional[float] = metric()  # batch size / mean latency
    latency_samples_seconds: Optional[List[float]] = note()  # every run; summarized, not recorded
    warmup_runs: Optional[int] = note()
    timed_seconds: Optional[float] = note()


@dataclass
class InferenceFlops(Record):
    forward_flops_per_sample: Optional[float] = metric()
    achieved_flops_per_second: Optional[float] = metric()
    peak_flops_per_second: Optional[float] = metric()
    mfu: Optional[float] = metric()
    peak_flops_source: Optional[str] = tag("sweeper.peak_flops_source")


@dataclass
class Decode(Record):
    """A decoder's batch of concurrent sequences at one context (model=gpt, sweeper.inference.decode):
    the point's latency is one decode step's; prefill timed apart; the KV cache against its formula."""

    context: Optional[int] = metric()  # cached positions a timed decode step attends to
    tokens_per_second: Optional[float] = metric()  # the batch's: batch / median decode step
    tokens_per_second_per_sequence: Optional[float] = metric()  # 1 / median decode step
    prefill_tokens: Optional[int] = metric()  # the prompt's length
    prefill_p50_seconds: Optional[float] = metric()
    prefill_tokens_per_second: Optional[float] = metric()
    prefill_peak_memory_bytes: Optional[int] = metric()  # a whole prompt at once (the point's peak is decoding's)
    # measured from the cache's tensors (each storage once), `context` positions
    kv_cache_bytes: Optional[int] = metric()
    # the decode step's own peak beyond the weights and the cache: its activations and temporaries
    decode_activation_peak_bytes: Optional[int] = metric()
    kv_cache_bytes_per_sequence: Optional[float] = metric()
    kv_cache_formula_bytes_per_sequence: Optional[float] = metric()  # 2 x layers x d_model x context x bytes
    decode_flops_per_token: Optional[float] = metric()  # counted (FlopCounterMode), per sequence and step
    decode_flops_formula_per_token: Optional[float] = metric()  # 2N + 4 L d T
    weight_bytes: Optional[int] = metric()


@dataclass
class InferenceResult(Record):
    trial_key: str = note("")  # e.g. bs64, or mlp1024-bs64
    status: str = note("ok")
    role: str = note("inference")
    batch_size: Optional[int] = metric()
    error: Optional[str] = tag("sweeper.error")
    oom_implied_by: Optional[str] = tag("sweeper.oom_implied_by")
    oom_simulated: Optional[bool] = note()
    device: Optional[str] = note()
    started_at: Optional[float] = note()  # epoch seconds: the MLflow run's start
    trial_seconds: Optional[float] = metric()
    latency: Latency = section(Latency)
    memory: Memory = section(Memory)
    flops: InferenceFlops = section(InferenceFlops)
    decode: Decode = section(Decode)


# ---------------------------------------------------------------------------------------------------
# A worker count's memory frontier (sweep.micro_batch_sizes=auto), on the parent run


@dataclass
class SearchFound(Record):
    """One search (without, or with, gradient accumulation): its answer and the line it fitted.
    Recorded on the parent run as `frontier_<name>_w<workers>` (with accumulation:
    `frontier_accumulating_<name>_w<workers>`)."""

    micro_batch_size: Optional[int] = metric()  # the largest that ran and fit
    safe_micro_batch_size: Optional[int] = metric()  # frontier.margin below it: what the grid trains
    predicted_micro_batch_size: Optional[int] = metric()
    estimated_micro_batch_size: Optional[int] = metric()  # the fake-tensor prediction, set by the driver
    fit_probes: Optional[int] = metric()
    verifications: Optional[int] = metric()
    fixed_bytes: Optional[float] = metric()
    per_sample_bytes: Optional[float] = metric()
    fit_r_squared: Optional[float] = metric()
    fit_max_relative_residual: Optional[float] = metric()
    fit_points: Optional[int] = metric()
    reason: Optional[str] = note()  # a tag sweeper.frontier[_accumulating]_w<workers>


FRONTIER_PREFIXES = {"plain": "frontier_", "accumulating": "frontier_accumulating_"}


@dataclass
class FrontierResult:
    """A worker count's frontier search: the plain search always, the accumulating one when the grid
    accumulates. Crosses to the driver flat, its searches' fields prefixed (FRONTIER_PREFIXES)."""

    trial_key: str = ""  # frontier-w<workers>
    status: str = "ok"
    error: Optional[str] = None
    memory_budget_bytes: Optional[int] = None
    plain: Optional[SearchFound] = None
    accumulating: Optional[SearchFound] = None

    def searches(self) -> Iterator[Tuple[str, SearchFound]]:
        for name, prefix in FRONTIER_PREFIXES.items():
            found = getattr(self, name)
            if found is not None:
                yield prefix, found

    def to_flat(self) -> Dict[str, Any]:
        out = {k: v for k, v in (("trial_key", self.trial_key), ("status", self.status), ("error", self.error),
                                 ("memory_budget_bytes", self.memory_budget_bytes)) if v is not None}
        for prefix, found in self.searches():
            out.update({prefix + k: v for k, v in found.to_flat().items()})
        return out

    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> "FrontierResult":
        own = {k: values[k] for k in ("trial_key", "status", "error", "memory_budget_bytes") if k in values}
        # Longest prefix first: "frontier_accumulating_x" is not the plain search's "accumulating_x".
        prefixes = sorted(FRONTIER_PREFIXES.items(), key=lambda item: -len(item[1]))
        parts: Dict[str, Dict[str, Any]] = {}
        for key, value in values.items():
            if key in own:
                continue
            name = next((n for n, p in prefixes if key.startswith(p)), None)
            if name is None:
                raise ValueError(f"FrontierResult has no field for {key!r}: add it to sweeper/schema.py")
            parts.setdefault(name, {})[key[len(FRONTIER_PREFIXES[name]):]] = value
        searches = {name: SearchFound.from_flat(part) for name, part in parts.items()}
        return cls(**own, **searches)  # type: ignore[arg-type]

    def metrics(self, label: str) -> Dict[str, float]:
        """Its figures on the parent run, each suffixed with the search's label (`_w2`, or
        `_w2_bf16_ckpt` for another recipe than fp32 without checkpointing)."""
        suffix = "_" + label.replace("-", "_")
        out = {f"{prefix}{k}{suffix}": v for prefix, found in self.searches() for k, v in found.metrics().items()}
        if self.memory_budget_bytes is not None:
            out[f"memory_budget_bytes{suffix}"] = float(self.memory_budget_bytes)
        return out

    @staticmethod
    def metric_names() -> List[str]:
        """Every recorded name, before the `_w<workers>` suffix."""
        names = [p + n for p in FRONTIER_PREFIXES.values() for n in SearchFound.names(METRIC)]
        return names + ["memory_budget_bytes"]


# ---------------------------------------------------------------------------------------------------
# The sweep's parent run


@dataclass
class SweepSummary(Record):
    """Counted and timed once the grid is done: how its points ended and where its wall time went."""

    num_trials_ok: Optional[int] = metric()
    num_trials_stopped: Optional[int] = metric()
    num_trials_did_not_learn: Optional[int] = metric()
    num_trials_diverged: Optional[int] = metric()
    num_trials_oom: Optional[int] = metric()
    num_trials_failed: Optional[int] = metric()  # then the sweep's wall time in phases that add up to it
    sweep_wall_seconds: Optional[float] = metric()
    sweep_setup_seconds: Optional[float] = metric()
    sweep_ray_start_seconds: Optional[float] = metric()
    sweep_tracking_seconds: Optional[float] = metric()
    sweep_frontier_seconds: Optional[float] = metric()
    sweep_grid_seconds: Optional[float] = metric()
    sweep_report_seconds: Optional[float] = metric()
    sum_trial_seconds: Optional[float] = metric()  # its points' own time, then their optimizer steps alone
    sweep_wall_over_trial_seconds: Optional[float] = metric()
    sum_train_seconds: Optional[float] = metric()
    sweep_wall_over_train_seconds: Optional[float] = metric()
    # sweep.strategy=smart: the compute ledger in point-seconds (each measurement run's wall time in its worker)
    # by phase, and what the whole grid would have spent, estimated from the same runs
    compute_throughput_point_seconds: Optional[float] = metric()
    compute_accuracy_point_seconds: Optional[float] = metric()
    compute_stopped_point_seconds: Optional[float] = metric()
    compute_point_seconds: Optional[float] = metric()
    full_grid_point_seconds_estimate: Optional[float] = metric()
    compute_fraction_of_full_grid: Optional[float] = metric()
    smart_measurement_runs: Optional[int] = metric()
    smart_accuracy_classes: Optional[int] = metric()
    smart_classes_stopped: Optional[int] = metric()
    # smart.continue_rungs: rung runs continued from the rung before's checkpoint, and the training seconds of
    # earlier rungs they did not spend again (what rungs from step 0 would have repeated)
    smart_continued_runs: Optional[int] = metric()
    compute_continuation_saved_point_seconds: Optional[float] = metric()
    # sweep.strategy=branch: the ledger (trunk and branch runs) and the answer: the local critical batch size at each
    # checkpoint (a curve over samples seen: the largest global batch that kept up, and the next one tried), where
    # it flattens, z x the trunk's noise over the window's tail (each global batch's own: branch/answer.json's)
    compute_trunk_point_seconds: Optional[float] = metric()
    compute_branch_point_seconds: Optional[float] = metric()
    branch_runs: Optional[int] = metric()
    critical_batch_size_branched: Optional[List[Tuple[int, float]]] = curve()
    critical_batch_size_branched_upper: Optional[List[Tuple[int, float]]] = curve()
    branch_tolerance: Optional[List[Tuple[int, float]]] = curve()
    critical_batch_size_flat: Optional[float] = metric()
    schedule_predicted_seconds: Optional[float] = metric()
    constant_predicted_seconds: Optional[float] = metric()

    def count(self, statuses: Mapping[str, int]) -> "SweepSummary":
        """How many points ended in each status (num_trials_<status>)."""
        self.update({f"num_trials_{status}": statuses.get(status, 0) for status in STATUSES})
        return self


def recorded_metric_names() -> List[str]:
    """Every metric name a sweep records (frontier names before their `_w<workers>` suffix)."""
    names = PointResult.names(METRIC) + PointResult.names(SERIES) + PointResult.names(CURVE)
    names += InferenceResult.names(METRIC)
    names += FrontierResult.metric_names() + SweepSummary.names(METRIC)
    return sorted(set(names))

"""Your training loop's small API (loop.fn, docs/your-training.md#your-loop): a loop written for Ray Train,
Accelerate or plain PyTorch is swept with its prepare and report lines swapped. sweeper calls your
`fn(config)` once per point on every worker, `config` holding the point's layout (micro_batch_size,
accumulation_steps, num_workers, parallelism, precision, lr, seed, steps, samples, epochs) and loop.kwargs:

    model, optimizer, loader = sweeper.loop.prepare(model, optimizer, loader)
    for epoch in range(config["epochs"]):          # the passes: each ends at an evaluation, the last at the budget
        for x, y in loader:                         # the point's micro-batches, on the device
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()                   # nothing: the step zeroes the gradients
            loss.backward()                         # no gradient sync before a step's last micro-batch
            optimizer.step()                        # the point's optimizer step, after a step's last micro-batch
            sweeper.loop.report(loss=loss)          # the micro-batch's training loss (a tensor: no sync)
        sweeper.loop.report(val_loss=..., val_accuracy=...)   # between passes: an evaluation's figures

Calls outside a point raise RuntimeError. The machinery is sweeper/worker/user_loop.py's.
"""

from __future__ import annotations

from typing import Any, Optional

from sweeper.worker import user_loop


def prepare(model: Any, optimizer: Any, loader: Any):
    """(model, optimizer, loader) as the point trains them: the model on this worker's device, wrapped as the
    point holds it (DDP across its workers, or FSDP2 sharded for zero2/zero3, with your optimizer moved onto
    the shards; its activation checkpointing, torch.compile and autocast for bf16/fp16, its floating outputs
    returned in fp32); the optimizer whose `step()` is the point's optimizer step (clipping, LR schedule, fp16's
    scaler: the built-in step's own) and whose `zero_grad()` does nothing; the loader of your loader's dataset
    and collate_fn in the point's sample order on this rank, micro-batches of the point's size. Call it once,
    with an optimizer that has not stepped."""
    return user_loop.current().prepare(model, optimizer, loader)


def device() -> Any:
    """This worker's torch device (Ray Train's get_device): where your evaluation's batches go."""
    return user_loop.current().device.torch_device


def step() -> None:
    """The point's optimizer step, as the prepared optimizer's `step()` (nothing while accumulating)."""
    user_loop.current().optimizer_step()


def backward(loss: Any) -> None:
    """The micro-batch's backward, its loss recorded as report(loss=) records it; under fp16 the loss scaled
    first (fp16 needs it: a plain loss.backward() is refused there)."""
    user_loop.current().backward(loss)


def accumulate(model: Any):
    """`with sweeper.loop.accumulate(model):` around a micro-batch's forward and backward, Accelerate's
    spelling: no gradient sync before a step's last micro-batch (the prepared loader already sets it so)."""
    return user_loop.current().accumulate(model)


def report(loss: Optional[Any] = None, **metrics: Any) -> None:
    """Inside a pass of the prepared loader: the micro-batch's training loss (and figures of yours, recorded as
    step_metric_<name>), once per micro-batch or once per step. Between passes (after one ended, before the
    next begins) and after the last: an evaluation's figures, val_accuracy and val_loss as the point's own,
    any other name as val_metric/<name> (loop.metrics says which way each is better, for report.quality_metric);
    `loss` there is your last training loss and is not recorded again."""
    user_loop.current().report({"loss": loss, **metrics})

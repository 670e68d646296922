"""The collectives a step issues, counted where they reach the process group: every c10d op (DDP's bucket
all-reduces from its C++ reducer, FSDP2's all-gathers and reduce-scatters, sweeper's own reductions) passes
torch's dispatcher, where a dispatch mode sees it with its tensors. Knows torch only; the bytes each moves are
measure.communication's arithmetic.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# c10d op -> (kind, which argument holds the payload: the tensor or tensor list whose bytes count)
_OPS = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
    "_allgather_base_": ("all_gather", 0),  # (output, input): the gathered output
    "allgather_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),  # (output, input): every rank's input
    "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "broadcast_": ("broadcast", 0),
}


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


class CollectiveCounter(TorchDispatchMode):
    """Within `with CollectiveCounter() as counter:`, `counter.calls` gets (kind, payload bytes) for every
    collective issued on this rank: kind all_reduce, all_gather (payload: the gathered output),
    reduce_scatter (the input), broadcast, or the op's own name (barrier, send, ...: payload its tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = getattr(func, "_schema", None)
        name = packet.name if packet is not None else ""
        if name.startswith("c10d::"):
            op = name.split("::", 1)[1]
            kind, at = _OPS.get(op, (op.strip("_"), 0))
            if kind not in ("barrier", "monitored_barrier"):
                self.calls.append((kind, _bytes(args[at]) if len(args) > at else 0))
        return func(*args, **(kwargs or {}))

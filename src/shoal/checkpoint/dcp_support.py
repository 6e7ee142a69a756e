"""What every use of ``torch.distributed.checkpoint`` (DCP) here shares: a load planner that unpickles
with ``weights_only=True`` (a checkpoint cannot run code), DCP's one-process warning silenced, its
error reduced to one line, and the process group of its own its collectives run on."""

from __future__ import annotations

import io
import warnings
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses
from torch.distributed.checkpoint.api import CheckpointException

from shoal.distributed import collectives
from shoal.errors import first_line

_groups: dict[int, Any] = {}


def dcp_reason(err: BaseException) -> str:
    """One line: the first rank's own error inside DCP's CheckpointException (whose message is
    tracebacks of every rank), else the error's first line."""
    if isinstance(err, CheckpointException) and err.failures:
        inner = next(iter(err.failures.values()))
        inner = inner[0] if isinstance(inner, tuple) else inner
        return f"{type(inner).__name__}: {first_line(inner)}"
    return first_line(err)


SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
"""How DCP's warning starts, on every save and load in one plain process, that it assumes one
process (which is what ``no_dist`` asks for)."""


def quiet_single_process() -> None:
    """Drop DCP's single-process warning in this process from now on; keep every other warning.

    A filter for that one message, added before each DCP call in one process (adding it again
    replaces it): not a ``catch_warnings`` block around the call, because an async save warns from
    DCP's writer thread after such a block has restored the filters (and the block would swap the
    process-wide filters under that thread)."""
    warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING)


def checkpoint_group() -> Any:
    """A gloo process group of all ranks for DCP's collectives (made once per default group), or
    None with one plain process. Async saves need a CPU backend and must not share the default group
    with the training's collectives (DCP's async_save docs)."""
    if not collectives.is_initialized():
        return None
    import torch.distributed as dist

    default = dist.distributed_c10d._get_default_group()
    key = id(default)
    if key not in _groups:
        _groups.clear()
        _groups[key] = dist.new_group(backend="gloo")
    return _groups[key]


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor values are unpickled with ``weights_only=True``
    (DCP's own uses ``weights_only=False``, which would let a checkpoint run code)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded

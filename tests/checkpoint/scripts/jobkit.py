"""What the checkpoint scripts run under torchrun (gloo) or as one plain process share: joining the
job, a model wrapped by strategy, its full state gathered, every rank's value, the comparison of a
loaded state with a reference, the watch for a save's first shard file, and several jobs in one
launch (:func:`run_jobs`)."""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from shoal.distributed.fsdp import apply_fsdp
from shoal.distributed.process_group import destroy_process_group
from shoal.distributed.wrap import apply_ddp, model_state_dict
from shoal.workloads.language_model import TinyGPT, lm_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/checkpoint: checkpoint_helpers
from checkpoint_helpers import Counter, flat

__all__ = ["CPU", "Counter", "flat", "init", "wrap", "full_state", "everyone", "diffs", "watch_first_shard"]
__all__ += ["blocking_setup", "finish", "run_jobs"]

CPU = torch.device("cpu")


def init() -> tuple[int, int]:
    """(rank, world size): the torchrun job's (gloo), else one plain process (no process group)."""
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap(model: nn.Module, strategy: str) -> nn.Module:
    """``model`` under ``strategy``: ``fsdp``, ``ddp`` or ``none`` (as it is), on the CPU."""
    if strategy == "fsdp":
        return apply_fsdp(model, device=CPU)
    if strategy == "ddp":
        return apply_ddp(model, CPU, dist.get_world_size() if dist.is_initialized() else 1)
    return model


def full_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole model and optimizer state, plain tensors keyed by name, on rank 0 (collective)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {"model": model_state_dict(model), "optim": get_optimizer_state_dict(model, opt, options=options)}
    return copy.deepcopy(state)  # a plain model's state dict holds its live parameters


def everyone(mine: Any) -> list[Any]:
    """Every rank's ``mine``, in rank order (collective)."""
    if not dist.is_initialized():
        return [mine]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def diffs(reference: Any, loaded: Any) -> dict[str, float]:
    """{dotted name: largest absolute difference} of every value of two state trees with the same
    keys (0 or inf for a non-tensor: equal or not)."""
    ref, got = flat(reference), flat(loaded)
    assert sorted(ref) == sorted(got), sorted(set(ref) ^ set(got))
    out = {}
    for key, value in ref.items():
        if isinstance(value, torch.Tensor):
            out[key] = (got[key].float() - value.float()).abs().max().item()
        else:
            out[key] = 0.0 if got[key] == value else float("inf")
    return out


def watch_first_shard(tmp: Path, timeout_s: float = 60) -> str:
    """Until a save in flight into ``tmp`` has written its first shard file (DCP writes from its
    background thread): the names of the files there then, space-separated."""
    deadline = time.monotonic() + timeout_s
    while not any(tmp.glob("*.distcp")) and time.monotonic() < deadline:
        time.sleep(0.0005)
    return " ".join(sorted(p.name for p in tmp.iterdir()))


def blocking_setup(n_layers: int) -> tuple[Path, str, int, int, int, nn.Module, torch.optim.Optimizer, int]:
    """The blocking measurements' start (argv: DIR [STRATEGY] [ROUNDS]): (out, strategy, rounds,
    rank, world, model, optimizer, parameters) with a TinyGPT of ``n_layers`` that took one Adam
    step (so that the optimizer has state to save)."""
    out = Path(sys.argv[1])
    strategy = sys.argv[2] if len(sys.argv) > 2 else "fsdp"
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyGPT(d_model=512, n_layers=n_layers, n_heads=8, seq_len=64)
    n_params = sum(p.numel() for p in model.parameters())
    model = wrap(model, strategy)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (2, 65))
    lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
    opt.step()
    return out, strategy, rounds, rank, world, model, opt, n_params


def finish() -> None:
    """The job's end: every rank here, then the process group gone (if there is one)."""
    if dist.is_initialized():
        dist.barrier()
        # Leave the group, then collect garbage: torchrun has no exit hook, and a gloo worker that
        # exits right after destroy_process_group() alone can abort (CI, 2026-11-24).
        destroy_process_group()


def run_jobs(jobs: dict[str, Callable[..., None]], argv: list[str]) -> None:
    """Each argument is one job, ``NAME:ARG:...`` (its fields joined by ``:``): ``jobs[NAME](*ARGS)``,
    one after the other in these processes (a test's launches are its cost), then :func:`finish`."""
    for job in argv:
        name, *args = job.split(":")
        if name not in jobs:
            raise SystemExit(f"unknown job {name!r}: one of {', '.join(jobs)}")
        jobs[name](*args)
    finish()

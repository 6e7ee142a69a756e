"""``shoal.init()``: one call that puts this process into the job, whatever launched it.

It detects the launch scheme, picks device, backend and thread count, joins the process group with
short timeouts and a readable error, and seeds the RNGs. The returned :class:`Context` carries the
job's shape and the helpers a training script needs (``wrap``, ``loader``, ``print``, ...).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shoal.console import LAUNCHER_ENV, write_line
from shoal.distributed import collectives
from shoal.distributed.device import choose_backend, choose_device, configure_threads
from shoal.distributed.process_group import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_INIT_TIMEOUT_S,
    destroy_process_group,
    join_process_group,
)
from shoal.distributed.wrap import wrap_model
from shoal.env import EnvInfo, detect_environment
from shoal.env.grace import PREEMPT_GRACE_S
from shoal.errors import ShoalError

_current: "Context | None" = None


@dataclass
class Context:
    """This process's place in the job and the helpers that depend on it. Made by :func:`init`."""

    environment: EnvInfo
    device: torch.device
    backend: str
    seed: int | None = None
    threads: int = 1
    owns_process_group: bool = False
    _active: bool = field(default=True, repr=False)
    _progress: Any = field(default=None, repr=False)

    # The job's shape, read from the environment.
    @property
    def rank(self) -> int:
        return self.environment.rank

    @property
    def local_rank(self) -> int:
        return self.environment.local_rank

    @property
    def world_size(self) -> int:
        return self.environment.world_size

    @property
    def local_world_size(self) -> int:
        return self.environment.local_world_size

    @property
    def node_rank(self) -> int:
        return self.environment.node_rank

    @property
    def num_nodes(self) -> int:
        return self.environment.num_nodes

    @property
    def is_main(self) -> bool:
        """True on global rank 0: the one process that logs and writes shared files."""
        return self.rank == 0

    # Helpers.
    def wrap(self, model: nn.Module, strategy: str = "ddp", **kwargs: Any) -> nn.Module:
        """``model`` on this process's device, ready for the job's processes to train together.

        ``strategy="ddp"`` (the default): in DistributedDataParallel when the job has more than one
        process (``kwargs`` go to DDP). ``strategy="fsdp"``: sharded with FSDP2, each process holding
        1/N of the parameters, gradients and optimizer state, for a model that does not fit one
        process (docs/SHARDING.md)::

            model = ctx.wrap(model, strategy="fsdp")               # or mixed_precision="bf16"
            optimizer = torch.optim.AdamW(model.parameters())       # after wrapping: FSDP's are DTensors

        With FSDP, ``mixed_precision="bf16"`` computes in bf16 (no autocast needed) and
        ``cpu_offload=True`` (GPU only) keeps the shards in host memory; the model's forward is then
        collective (every rank runs it), and so is ``shoal.distributed.wrap.model_state_dict(model)``
        for saving the whole model. A bad strategy or option is one line and a HINT."""
        return wrap_model(model, strategy=strategy, device=self.device, world_size=self.world_size, **kwargs)

    def replicas(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, state: dict[str, Any] | None = None):
        """This process as one replica group of a fault-tolerant job (torchft; started by
        ``shoal.run(fn, nproc=N, fault_tolerance=True)`` or ``shoal train --fault-tolerance``): a
        :class:`~shoal.distributed.fault_tolerance.Replicas` whose ``.model`` averages gradients
        across the live groups and whose ``commit()`` steps ``optimizer`` only when the step
        committed everywhere. ``state``: more objects that travel with the model when a group
        heals from a live one. docs/FAULT_TOLERANCE.md."""
        from shoal.distributed.fault_tolerance import Replicas

        return Replicas(model.to(self.device), optimizer, device=self.device, backend=self.backend, state=state)

    def loader(self, dataset: Any, batch_size: int, *, shuffle: bool = True, **kwargs: Any):
        """This rank's shard of ``dataset`` in batches of ``batch_size`` (per process).

        Every epoch is reshuffled automatically; for a given seed the global order is the same
        whatever the world size. Tensor datasets take a fast path that gathers whole batches.
        """
        from shoal.data import make_loader

        kwargs.setdefault("seed", self.seed or 0)
        kwargs.setdefault("device", self.device)
        return make_loader(dataset, batch_size, rank=self.rank, world_size=self.world_size, shuffle=shuffle, **kwargs)

    def eval_loader(self, dataset: Any, batch_size: int, **kwargs: Any):
        """A loader for exact evaluation: in order, no padding, each sample on exactly one rank."""
        return self.loader(dataset, batch_size, shuffle=False, pad=False, **kwargs)

    def evaluate(self, model: nn.Module, loader: Any, loss_fn: Callable | None = None) -> dict[str, float]:
        """Loss and accuracy over the whole evaluation set, summed exactly across ranks."""
        from shoal.evaluation import evaluate

        return evaluate(model, loader, loss_fn=loss_fn)

    def checkpointer(
        self,
        directory: str,
        *,
        every: str | int | None = None,
        keep: int = 3,
        sharded: bool = False,
        async_save: bool = False,
    ):
        """A :class:`~shoal.checkpoint.manager.CheckpointManager` for ``directory``.

        ``every``: ``N``/``Nepochs`` or ``Nsteps`` for :meth:`~CheckpointManager.maybe_save`;
        ``keep``: how many of the newest checkpoints stay. Saves are atomic; ``resume()`` loads the
        newest valid one, skipping corrupt files.

        Epochs count from 0, as ``for epoch in range(epochs)`` numbers them: ``every="2epochs"``
        saves after epochs 1, 3, 5... (the 2nd, 4th, 6th completed), and
        ``maybe_save(..., epoch_end=True, final=epoch == epochs - 1)`` saves the last one too.

        ``sharded``: every rank writes its own shards (``ckpt-*.dcp``, PyTorch DCP): needed for a
        model wrapped with ``strategy="fsdp"``, allowed for any; ``async_save``: ``save()`` returns
        once the state is copied to host memory and the write finishes in the background (implies
        ``sharded``); call ``wait()`` on every rank before exiting. docs/SHARDING.md.
        """
        from shoal.checkpoint.manager import CheckpointManager

        return CheckpointManager(
            directory, every=every, keep=keep, first_epoch=0, sharded=sharded, async_save=async_save
        )

    def preemption(self, grace_s: float = PREEMPT_GRACE_S):
        """A context manager whose ``requested()`` (call once per step on every rank) returns the
        signal number once any rank got SIGTERM or SIGUSR1: checkpoint, then exit."""
        from shoal.preemption import PreemptionWatch

        return PreemptionWatch(grace_s=grace_s)

    def progress(self):
        """This rank's :class:`~shoal.progress.ProgressWriter` (one per process), the opt-in that lets
        the launcher's watchdog see a ``shoal run`` script's steps (docs/WATCHDOG.md)::

            progress = ctx.progress()
            for step, batch in enumerate(loader):
                progress.phase("forward", step)
                ...
                progress.step_done(len(batch), compute_s, wait_s)

        A no-op writer when no shoal launcher named a progress directory (torchrun, srun, one
        process). Stacks on demand (``shoal status --stacks``) work from the first call."""
        from shoal.progress import ProgressWriter

        if self._progress is None:
            self._progress = ProgressWriter.from_env(self.rank)
        return self._progress

    def tracker(self, spec: str | None, *, run_dir: str, **options: Any):
        """Experiment trackers for your own loop (``"wandb,tensorboard,mlflow"``, any subset): rank 0
        logs, every other rank gets a tracker whose methods do nothing. Reduce what you log first
        (``shoal.tracking.reduce_metrics``). Options: see :func:`shoal.tracking.create_tracker`."""
        from shoal.tracking import create_tracker

        return create_tracker(spec, run_dir=run_dir, rank=self.rank, **options)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only. A plain line goes out in one write
        (:func:`shoal.console.write_line`): the main processes of several groups or jobs sharing a
        terminal never run their lines together."""
        if not self.is_main:
            return
        if set(kwargs) <= {"flush"}:
            write_line(" ".join(str(arg) for arg in args), sys.stdout)
            return
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)

    def barrier(self) -> None:
        collectives.barrier()

    def all_reduce_mean(self, value):
        return collectives.all_reduce_mean(value)

    def shutdown(self) -> None:
        """Leave the process group (if :func:`init` joined it). Safe to call twice."""
        global _current
        if self._active and self.owns_process_group and dist.is_initialized():
            destroy_process_group()
        self._active = False
        if self._progress is not None:
            self._progress.close()
        if _current is self:
            _current = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def describe(self) -> str:
        """One line saying where this process sits, for logs."""
        env = self.environment
        # Workers of shoal's own launcher see torchrun's variables: name the command the user ran.
        via = os.environ.get(LAUNCHER_ENV) or env.scheme
        return (
            f"rank {env.rank}/{env.world_size} (local {env.local_rank}/{env.local_world_size}, "
            f"node {env.node_rank}/{env.num_nodes}) via {via} on {self.device} [{self.backend}]"
        )


def init(
    *,
    device: str = "auto",
    backend: str = "auto",
    seed: int | None = None,
    init_timeout: float | None = None,
    timeout: float | None = None,
    threads: int | None = None,
    environment: str | None = None,
) -> Context:
    """Join the job this process was launched into and return its :class:`Context`.

    Args:
        device: ``auto`` (``cuda:<local_rank>`` when this node has a GPU per local process, else
            CPU), ``cpu`` or ``cuda``.
        backend: ``auto`` (nccl on CUDA, gloo on CPU), ``gloo`` or ``nccl``.
        seed: seeds Python, NumPy and torch (same value on every rank) when given.
        init_timeout: seconds to wait for every rank to join (default 60, or ``SHOAL_INIT_TIMEOUT``).
        timeout: seconds after which a collective counts as hung (default 600, or ``SHOAL_TIMEOUT``).
        threads: intra-op threads per process; default: cores / local processes, unless
            ``OMP_NUM_THREADS`` is set.
        environment: force a launch scheme by name (same as ``SHOAL_ENV``).

    Calling it again returns the same context. Use :meth:`Context.shutdown` (or ``with``) to leave.
    """
    global _current
    if _current is not None and _current._active:
        return _current
    info = detect_environment(forced=environment)
    dev = choose_device(device, info.local_rank, info.local_world_size)
    chosen_backend = choose_backend(backend, dev)
    nthreads = configure_threads(threads, info.local_world_size)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if info.world_size > 1 and not dist.is_initialized():
        join_process_group(
            info,
            chosen_backend,
            init_timeout=_seconds(init_timeout, "SHOAL_INIT_TIMEOUT", DEFAULT_INIT_TIMEOUT_S),
            timeout=_seconds(timeout, "SHOAL_TIMEOUT", DEFAULT_COLLECTIVE_TIMEOUT_S),
        )
        owns = True
    if seed is not None:
        seed_everything(seed)
    _current = Context(
        environment=info, device=dev, backend=chosen_backend, seed=seed, threads=nthreads, owns_process_group=owns
    )
    return _current


def current() -> Context | None:
    """The context made by :func:`init`, or None."""
    return _current


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and CUDA) global RNGs."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # numpy is optional for users' scripts
        pass
    torch.manual_seed(seed)


def _seconds(value: float | None, env_name: str, default: float) -> float:
    if value is not None:
        return float(value)
    raw = os.environ.get(env_name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ShoalError(f"{env_name}={raw!r} is not a number of seconds", f"set {env_name}=60, for example") from None

"""``shoal.init()``: one call that puts this process into the job, whatever launched it.

It detects the launch scheme, picks device, backend and thread count, joins the process group with
short timeouts and a readable error, and seeds the RNGs. The returned :class:`Context` carries the
job's shape and the helpers a training script needs (``wrap``, ``loader``, ``print``, ...).
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from shoal.dist import collectives
from shoal.dist.device import choose_backend, choose_device
from shoal.dist.wrap import apply_ddp, unwrap_model
from shoal.env import EnvInfo, detect_environment
from shoal.errors import ShoalError

DEFAULT_INIT_TIMEOUT_S = 60.0
"""Joining the process group fails after this long: a missing rank is reported in about a minute."""
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
"""A collective that waits longer than this is a hang (torch's own default for gloo is 30 minutes)."""

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
    def wrap(self, model: nn.Module, **ddp_kwargs: Any) -> nn.Module:
        """``model`` on this process's device, in DDP when the job has more than one process."""
        return apply_ddp(model, self.device, self.world_size, **ddp_kwargs)

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        """The plain module inside any wrapper that :meth:`wrap` or torch.compile added."""
        return unwrap_model(model)

    def loader(self, dataset: Any, batch_size: int, *, shuffle: bool = True, **kwargs: Any):
        """This rank's shard of ``dataset`` in batches of ``batch_size`` (per process).

        Every epoch is reshuffled automatically; for a given seed the global order is the same
        whatever the world size. Tensor datasets take a fast path that gathers whole batches.
        """
        from shoal.data import make_loader

        kwargs.setdefault("seed", self.seed or 0)
        kwargs.setdefault("device", self.device)
        return make_loader(
            dataset, batch_size, rank=self.rank, world_size=self.world_size, shuffle=shuffle, **kwargs
        )

    def eval_loader(self, dataset: Any, batch_size: int, **kwargs: Any):
        """A loader for exact evaluation: in order, no padding, each sample on exactly one rank."""
        return self.loader(dataset, batch_size, shuffle=False, pad=False, **kwargs)

    def evaluate(self, model: nn.Module, loader: Any, loss_fn: Callable | None = None) -> dict[str, float]:
        """Loss and accuracy over the whole evaluation set, summed exactly across ranks."""
        from shoal.train.evaluate import evaluate

        return evaluate(model, loader, loss_fn=loss_fn)

    def checkpointer(self, directory: str, *, every: str | int | None = None, keep: int = 3):
        """A :class:`~shoal.checkpoint.manager.CheckpointManager` for ``directory``.

        ``every``: ``N``/``Nepochs`` or ``Nsteps`` for :meth:`~CheckpointManager.maybe_save`;
        ``keep``: how many of the newest checkpoints stay. Saves are atomic; ``resume()`` loads the
        newest valid one, skipping corrupt files.
        """
        from shoal.checkpoint.manager import CheckpointManager

        return CheckpointManager(directory, every=every, keep=keep)

    def preemption(self, grace_s: float = 25.0):
        """A context manager whose ``requested()`` (call once per step on every rank) returns the
        signal number once any rank got SIGTERM or SIGUSR1: checkpoint, then exit."""
        from shoal.train.preemption import PreemptionWatch

        return PreemptionWatch(grace_s=grace_s)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        if self.is_main:
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
            collectives.destroy_process_group()
        self._active = False
        if _current is self:
            _current = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def describe(self) -> str:
        """One line saying where this process sits, for logs."""
        env = self.environment
        return (
            f"rank {env.rank}/{env.world_size} (local {env.local_rank}/{env.local_world_size}, "
            f"node {env.node_rank}/{env.num_nodes}) via {env.scheme} on {self.device} [{self.backend}]"
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


def join_process_group(info: EnvInfo, backend: str, *, init_timeout: float, timeout: float) -> None:
    """``init_process_group`` with a short join timeout and an error that names what is missing."""
    endpoint = f"{info.main_address}:{info.main_port}"
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None or info.scheme == "torchrun":
        # torchrun's agent already runs the store and exported MASTER_*; env:// reuses it.
        init_method = "env://"
    else:
        init_method = f"tcp://{_bracket(info.main_address)}:{info.main_port}"
    _choose_socket_interface(info, backend)
    try:
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=info.rank,
            world_size=info.world_size,
            timeout=timedelta(seconds=init_timeout),
        )
    except Exception as err:  # torch raises DistStoreError, RuntimeError, ValueError here
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "address already in use" in text.lower() or "EADDRINUSE" in text:
            raise ShoalError(
                f"rank 0 could not listen on {endpoint}: the port is already in use",
                "choose another MASTER_PORT (or let `shoal run` pick a free one)",
            ) from None
        if "connectFullMesh" in str(err) or "GLOO_SOCKET_IFNAME" in str(err):
            raise ShoalError(
                f"rank {info.rank} of {info.world_size} reached the store at {endpoint} but not its peers: {text[:160]}",
                "gloo advertised an address the other nodes cannot reach (often 127.0.0.1 from /etc/hosts): "
                "set GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME on GPUs) to the interface that routes between nodes",
            ) from None
        if "timeout" in text.lower() or "timed out" in text.lower():
            raise ShoalError(
                f"rank {info.rank} of {info.world_size} timed out after {init_timeout:.0f} s joining the "
                f"process group at {endpoint} ({info.scheme})",
                f"check that every rank was started and that {endpoint} is reachable from node "
                f"{info.node_rank} (MASTER_ADDR, firewall); wait longer with SHOAL_INIT_TIMEOUT",
            ) from None
        raise ShoalError(
            f"rank {info.rank} of {info.world_size} could not join the process group at {endpoint}: {text}",
            f"check MASTER_ADDR/MASTER_PORT and that {endpoint} is reachable from node {info.node_rank}",
        ) from None
    # The short timeout was for joining; collectives get the longer one.
    if hasattr(dist, "set_timeout"):
        dist.set_timeout(timedelta(seconds=timeout))


def _choose_socket_interface(info: EnvInfo, backend: str) -> None:
    """Across nodes, make gloo/NCCL use the interface that routes to the main address.

    Where the host name resolves to 127.0.0.1 (common in /etc/hosts), gloo would advertise
    loopback to the other nodes and the job would fail in connectFullMesh. Launchers that start
    the ranks directly (mpirun, srun, pods) do not set the variable; `shoal run` does already.
    """
    var = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    if info.num_nodes <= 1 or var in os.environ:
        return
    from shoal.launch.network import route_to

    route = route_to(info.main_address)
    if route.ifname and not route.loopback:
        os.environ[var] = route.ifname
        if info.rank == 0 or info.local_rank == 0:
            print(f"shoal: node {info.node_rank}: {var}={route.ifname} ({route.why})", file=sys.stderr, flush=True)


def configure_threads(threads: int | None, local_world_size: int) -> int:
    """Set torch's intra-op threads: explicit value, else OMP_NUM_THREADS, else cores / local procs."""
    if threads is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        # Applied explicitly: torch reads OMP_NUM_THREADS only when it starts, and a worker forked
        # from a process that imported torch earlier inherits that process's thread count.
        threads = int(env) if env.isdigit() and int(env) > 0 else max(1, usable_cores() // max(1, local_world_size))
    if threads < 1:
        raise ShoalError(f"threads must be at least 1, got {threads}", "pass threads=1 or more")
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which Slurm/cgroups/taskset restrict)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address

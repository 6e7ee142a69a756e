"""Per-step fault tolerance across replica groups, on torchft (pytorch/torchft, ``torchft>=0.2``).

A job is N replica groups that train the same model on different shards of the data. Each step
every live group asks torchft's lighthouse for a quorum, all-reduces its gradients with the other
members through torchft's reconfigurable process group (gloo on the CPU, NCCL on GPUs), and commits
the step only when every member got through it (:meth:`torchft.Manager.should_commit`). A group
that dies costs the others that one step; when it comes back it receives a live member's model and
optimizer state (healing) and joins the next step.

What shoal adds over the stock pieces, each a sharp edge seen with torchft 0.2.0:

* :class:`ReplicaDataParallel`'s comm hook lets the manager record a failed all-reduce. The stock
  ``torchft.ddp.DistributedDataParallel._comm_hook`` (torchft/ddp.py, 0.2.0) asserts on
  ``fut._fut``, which is unset when gloo's ``work.wait()`` failed because a peer died mid
  all-reduce: the *surviving* group crashed.
* The manager server binds the address shoal chose instead of torchft's hard-coded ``[::]``
  (torchft/manager.py, ``bind = f"[::]:{port}"``), and advertises that address, not
  ``socket.gethostname()``.
* The state of a healing group travels over the replicas' own process group
  (``torchft.checkpointing.pg_transport.PGTransport``), not over torchft's default HTTP server,
  which listens on every interface and advertises the hostname.
* A group whose collective failed because a peer's connection closed aborts its own connections at
  once (:func:`release_peers`). With more than 3 groups, gloo's ring has groups that are no
  neighbour of the dead one: they stay blocked in a receive from a live group that has already
  given the step up, until the collective timeout, and the lighthouse waits for them (10 s
  stalls at 4 groups). Closing the failed group's sockets fails their pending operation now, and
  each aborts in turn. torchft 0.2.0 aborts only when it reconfigures, after the next quorum.

A group of several processes (``--nproc-per-group K``) is a process group of its own: the model is
wrapped for it (DDP, or FSDP2 for HSDP: sharded inside the group, replicated across groups), and
each step's gradients, already averaged inside the group, are averaged across the live groups
before the commit vote, rank ``r`` of every group with rank ``r`` of the others (torchft's replica
group of each group rank). Under FSDP that is each rank's own shard of the gradients; a healing
rank receives its own shards from the same rank of a live group.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from shoal.distributed.device import choose_backend
from shoal.distributed.torchft_check import INSTALL_HINT
from shoal.env.replica import ReplicaCoordinates, heartbeat_ms, pass_first_quorum_gate, replica_coordinates
from shoal.errors import ShoalError, first_line


def require_torchft() -> Any:
    """``import torchft``, or one line and a HINT when it is missing."""
    try:
        import torchft
    except ImportError as err:
        raise ShoalError(f"--fault-tolerance needs torchft, which does not import here ({err})", INSTALL_HINT) from None
    return torchft


COLLECTIVE_TIMEOUT_S = 10.0
"""A replica all-reduce (or state transfer) that takes longer fails the step (torchft: 60 s)."""
QUORUM_TIMEOUT_S = 30.0
"""How long a group waits for a quorum, and to reach the lighthouse, before it gives up (torchft: 60 s)."""


class Replicas:
    """This process as one replica group of a fault-tolerant job (``ctx.replicas(model, optimizer)``).

    Each step of a loop over it::

        step = replicas.start_step()          # join the quorum; heal first if behind
        epoch, batch = divmod(step, batches)  # what to train on follows from the committed steps
        loss = loss_fn(replicas.model(x), y)  # the wrapped model: gradients averaged across groups
        loss.backward()
        replicas.commit()                     # optimizer.step() only if every member got through

    ``state``: more objects with ``state_dict``/``load_state_dict`` (a data position, running
    sums) that travel with the model and optimizer when a group heals. ``backend``: how the groups
    reach each other, ``nccl`` (default on CUDA: a GPU per process) or ``gloo`` (default on the CPU;
    on CUDA it carries device tensors through host memory, and lets groups share a GPU). The
    coordinates (group, store, lighthouse) come from the launcher
    (:func:`shoal.env.replica.replica_coordinates`).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        device: torch.device,
        backend: str | None = None,
        state: dict[str, Any] | None = None,
        coordinates: ReplicaCoordinates | None = None,
        timeout_s: float = COLLECTIVE_TIMEOUT_S,
        quorum_timeout_s: float = QUORUM_TIMEOUT_S,
        async_quorum: bool = True,
    ) -> None:
        self.coordinates = coordinates or replica_coordinates()
        self.async_quorum = async_quorum
        """Whether each step's quorum runs during the forward pass (below) or before it."""
        self.optimizer = optimizer
        self.group_rank, self.group_nproc = _group_shape()
        if self.group_nproc > 1:
            model = _wrapped_for_group(model, device)
        self.healable = {"model": model, "optimizer": optimizer, **(state or {})}
        self.backend = choose_backend(backend or "auto", device)
        """How the groups reach each other: ``nccl`` or ``gloo``."""
        self.manager = _make_manager(self, device, self.backend, timeout_s, quorum_timeout_s, async_quorum)
        pass_first_quorum_gate()  # the job's first start: every group heartbeats before any quorum
        # One process: DDP's reducer overlaps the replicas' all-reduce with backward. Several: the
        # group's own wrapper reduces inside it, and commit() averages across the groups.
        self.model = ReplicaDataParallel(self.manager, model) if self.group_nproc == 1 else model
        self.participants = 0
        """Groups in the current step's quorum."""
        self.heals = 0
        """How many times this process received a live group's state (healing)."""
        self._quorum_pending: tuple[bool, int] | None = None
        """While this step's quorum is unconfirmed: whether the connections were released before it,
        and the quorum id before it."""

    @property
    def group(self) -> int:
        return self.coordinates.group

    @property
    def groups(self) -> int:
        return self.coordinates.groups

    @property
    def data_rank(self) -> int:
        """This process's place in the job's one data order: ``group x K + its rank in the group``,
        of :attr:`data_world` (``group`` of ``groups`` for groups of one process)."""
        return self.group * self.group_nproc + self.group_rank

    @property
    def data_world(self) -> int:
        """Every process of every group: ``groups x K``."""
        return self.groups * self.group_nproc

    @property
    def waited_s(self) -> float:
        """Seconds this process has waited on the other groups' gradient all-reduce inside backward
        (groups of one process; a group of several averages in :meth:`commit`, after backward)."""
        across = getattr(self.model, "across", None)
        return across.waited_s if across is not None else 0.0

    @property
    def step(self) -> int:
        """Steps committed by the job so far (every group agrees on it at each commit)."""
        return self.manager.current_step()

    @property
    def quorum(self) -> int:
        """The id of the current quorum: it changes whenever a group leaves or joins, and whenever
        the lighthouse, restarted, forms another set of groups (:class:`ReplicaClient`)."""
        return int(getattr(self.manager, "_quorum_id", -1))  # torchft 0.2 keeps it private

    @property
    def lighthouse_quorum(self) -> int:
        """The lighthouse's own id of the current quorum (it counts from 1 again when the lighthouse
        restarts)."""
        client = self.manager._client
        return client.lighthouse_id if isinstance(client, ReplicaClient) else self.quorum

    @property
    def is_writer(self) -> bool:
        """Whether this group is the quorum's replica rank 0: the one that writes logs and checkpoints."""
        return self.manager.participating_rank() == 0

    @property
    def error(self) -> str | None:
        """Why the last step dropped, in one line, or None."""
        error = self.manager.errored()
        return None if error is None else dropped_because(str(getattr(error, "original_exception", error)))

    def start_step(self) -> int:
        """Start this step's quorum; the committed steps as this group knows them.

        With ``async_quorum`` (the default) the quorum completes while the forward pass runs (the
        gradient all-reduce waits for it); else before this returns. A group behind the others (a
        restart) learns the job's step from the quorum: it receives a live group's state at
        :meth:`commit` (or here, without ``async_quorum``), and its gradient of the step it joins
        in counts as zero, the step's average being over the groups that were up to date (torchft's
        rule). At the job's first step (every group at step 0), groups other than the first receive
        its weights here, before their forward pass, so that every group's gradient counts.

        No quorum within the quorum timeout (the lighthouse gone for good, or a quorum that never
        formed) is a ShoalError with exit status 1: one line, and this group's launcher restarts it
        (status 2, bad input, would stop the job)."""
        self._quorum_pending = (released_connections(self.manager), self.quorum)
        try:
            self.manager.start_quorum()
        except (TimeoutError, RuntimeError) as err:  # a synchronous quorum's failure
            raise self._no_quorum(err) from None
        if not self.async_quorum or self.manager.current_step() == 0:
            self._quorum_done()
        return self.manager.current_step()

    def _quorum_done(self) -> None:
        """Wait for this step's quorum (once a step), and check what it says."""
        if self._quorum_pending is None:
            return
        released, before = self._quorum_pending
        self._quorum_pending = None
        try:
            self.manager.wait_quorum()
        except (TimeoutError, RuntimeError) as err:
            raise self._no_quorum(err) from None
        if released and self.quorum == before:
            # The connections were closed for a peer that went away, yet the same groups met again
            # (a peer's connection broke while it lived): this group has nothing left to talk over.
            raise ShoalError(
                f"replica group {self.coordinates.group}: its connections to the other groups closed "
                "after a failed step, and the same groups met again",
                "the launcher restarts this group, which heals from a live one",
                exit_code=1,
            )
        manager = self.manager
        if manager._healing and manager.current_step() == 0:
            # The job's first quorum (torchft's init_sync): the weights of the first group, taken
            # before the forward pass as torchft's synchronous quorum takes them (manager.py,
            # start_quorum, 0.2.0); every group is at step 0 and sees the same, so every gradient
            # of the step counts and the average is over all of them.
            manager._apply_pending_state_dict()
            manager._healing = False
        self.participants = manager.num_participants()

    def _no_quorum(self, err: BaseException) -> ShoalError:
        return ShoalError(
            f"replica group {self.coordinates.group}: no quorum from torchft's lighthouse at "
            f"{self.coordinates.lighthouse}: {first_line(err)}",
            "the launcher restarts this group, which heals from a live one; if every group says this, "
            "check that the lighthouse runs and that this node reaches it",
            exit_code=1,
        )

    def commit(self) -> bool:
        """Step the optimizer if every group of the quorum got through this step; else drop it."""
        self._quorum_done()
        if self.group_nproc > 1:
            _average_across_groups(self.manager, self.optimizer)
            release_peers(self.manager)
        if not self.manager.should_commit():  # a healing group receives the live state in here
            return False
        self.optimizer.step()
        return True

    def state_dict(self) -> dict[str, Any]:
        """torchft's step counters, for a checkpoint (with the model's and optimizer's)."""
        return self.manager.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.manager.load_state_dict(state)

    def close(self) -> None:
        self.manager.shutdown(wait=False)

    def _state_dict(self) -> dict[str, Any]:
        """What a healing group receives, as plain tensors: an FSDP shard travels as its local
        tensor (the same rank of every group holds the same shard)."""
        return {name: _local_tensors(obj.state_dict()) for name, obj in self.healable.items()}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self.heals += 1
        for name, obj in self.healable.items():
            obj.load_state_dict(_as_shards_of(obj, state[name]))


def _group_shape() -> tuple[int, int]:
    """This process's rank in its replica group and the group's size (its own process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _wrapped_for_group(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` as the group's processes train it together: as given when already wrapped (DDP,
    or FSDP2: HSDP), else in DDP over the group."""
    import torch.distributed as dist

    from shoal.distributed.fsdp import is_fsdp
    from shoal.distributed.wrap import apply_ddp

    if is_fsdp(model) or isinstance(model, nn.parallel.DistributedDataParallel):
        return model
    return apply_ddp(model.to(device), device, dist.get_world_size())


def _average_across_groups(manager: Any, optimizer: torch.optim.Optimizer) -> None:
    """Average this rank's gradients (its FSDP shard, or the group's DDP average) with the same
    rank of every live group, in one flat all-reduce. A failure is recorded by the manager (the
    step then does not commit); nothing raises."""
    grads = [_local(p.grad) for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    manager.allreduce(flat).wait()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _local_tensors(state: Any) -> Any:
    """``state`` with each DTensor replaced by its local shard (the same storage)."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: _local(v) if isinstance(v, torch.Tensor) else v, state)


def _as_shards_of(obj: Any, state: dict[str, Any]) -> dict[str, Any]:
    """A received state dict whose local shards become DTensors again, shaped as ``obj``'s own
    (an FSDP model's parameters, or its optimizer's per-parameter state); others as they came."""
    from torch.distributed.tensor import DTensor

    def like(value: Any, template: Any) -> Any:
        if not isinstance(template, DTensor) or not isinstance(value, torch.Tensor) or value.dim() == 0:
            return value
        return DTensor.from_local(
            value.to(template.device), template.device_mesh, template.placements,
            shape=template.shape, stride=template.stride(), run_check=False,
        )  # fmt: skip

    if isinstance(obj, torch.optim.Optimizer):
        params = [p for group in obj.param_groups for p in group["params"]]
        per_param = {
            index: {name: like(value, params[index]) for name, value in entry.items()}
            for index, entry in state["state"].items()
        }
        return {**state, "state": per_param}
    if isinstance(obj, nn.Module):
        own = obj.state_dict()
        return {key: like(value, own.get(key)) for key, value in state.items()}
    return state


def _make_manager(
    replicas: Replicas, device: torch.device, backend: str, timeout_s: float, quorum_timeout_s: float,
    async_quorum: bool,
) -> Any:  # fmt: skip
    """torchft's Manager for this process: rank ``group_rank`` of its group's ``group_nproc``; the
    groups meet through torchft's reconfigurable NCCL or gloo group (``backend``).

    The manager server (on the group's rank 0) binds and advertises the group's address; weights are synced on the first
    quorum (``init_sync``), so groups need not start from the same initialisation."""
    torchft = require_torchft()
    from torchft.checkpointing.pg_transport import PGTransport

    where = replicas.coordinates
    # A failed step is said in one line by the caller; torchft logs each with a traceback.
    logging.getLogger("torchft.manager").setLevel(logging.CRITICAL)
    # PGTransport sends a pickle through torch.frombuffer of immutable bytes, read-only (0.2.0).
    warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl":
        # torchft aborts a timed-out NCCL communicator after this long (it warns and sets it itself
        # when unset: torchft/process_group.py, ProcessGroupNCCL, 0.2.0).
        os.environ.setdefault("TORCH_NCCL_NONBLOCKING_TIMEOUT", str(timeout_s))
        pg, wire = torchft.ProcessGroupNCCL(timeout=timeout), device
    else:  # gloo sends and receives host memory only: a healing group's state crosses through it
        pg, wire = torchft.ProcessGroupGloo(timeout=timeout), torch.device("cpu")
    try:
        with _manager_server_bound_to(where.address):
            manager = torchft.Manager(
                pg=pg,
                load_state_dict=replicas._load_state_dict,
                state_dict=replicas._state_dict,
                min_replica_size=1,
                use_async_quorum=async_quorum,
                timeout=timeout,
                quorum_timeout=timedelta(seconds=quorum_timeout_s),
                connect_timeout=timedelta(seconds=quorum_timeout_s),
                rank=replicas.group_rank,
                world_size=replicas.group_nproc,
                store_addr=where.store[0],
                store_port=where.store[1],
                lighthouse_addr=where.lighthouse,
                replica_id=f"shoal_group_{where.group}",
                hostname=where.address,
                heartbeat_interval=timedelta(milliseconds=heartbeat_ms(where.groups)[1]),
                checkpoint_transport=PGTransport(pg, timeout=timeout, device=wire),
            )
    except RuntimeError as err:
        raise ShoalError(
            f"replica group {where.group} cannot reach torchft's lighthouse at {where.lighthouse}: "
            f"{(str(err).splitlines() or [''])[0]}",
            "check that the lighthouse runs and that this node reaches its address and port",
        ) from None
    manager._client = ReplicaClient(manager._client, replicas.group_nproc)
    return manager


class ReplicaClient:
    """torchft's ManagerClient (the group's line to its manager server) with two changes.

    * **Quorum ids no restart of the lighthouse repeats.** torchft reconfigures a group's
      connections only when the quorum id changes, and names their rendezvous keys in the store by
      it (torchft/manager.py, ``_async_quorum``, 0.2.0). A restarted lighthouse counts from 1 again
      (torchft/src/lighthouse.rs, ``quorum_id: 0`` in ``Lighthouse::new``), so its first quorum
      may carry the id the groups already hold for another set of groups: the groups of the new
      quorum keep the old connections and wait, every step, for a group that is not in it, until
      the collective timeout (or, with the id of an older set, meet its stale keys). Here the id is
      a digest of the lighthouse's id, the member groups and the step at which that set first met:
      the same in every member (they receive the same quorum), new for every set of groups, in
      any life of the lighthouse.
    * **A group of one process votes alone.** The commit vote is a round trip to the group's
      manager server, which answers with the AND of its ranks' votes once all have voted
      (torchft/src/manager.rs, ``should_commit``): for one rank, its own vote. That round trip is
      skipped.
    """

    def __init__(self, client: Any, group_nproc: int) -> None:
        self._client = client
        self._group_nproc = group_nproc
        self._set: tuple[int, tuple[str, ...]] | None = None
        self.id = -1
        """The current quorum's id, as the groups use it."""
        self.lighthouse_id = -1
        """The current quorum's id, as the lighthouse gave it."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _quorum(self, **kwargs: Any) -> Any:
        quorum = self._client._quorum(**kwargs)
        members = (quorum.quorum_id, tuple(quorum.replica_ids))  # in the lighthouse's order (by id)
        if members != self._set:
            self._set = members
            digest = hashlib.blake2b(repr((members, quorum.max_step)).encode(), digest_size=7).digest()
            self.id = int.from_bytes(digest, "big")  # a positive int64
        self.lighthouse_id = quorum.quorum_id
        quorum.quorum_id = self.id
        return quorum

    def should_commit(self, group_rank: int, step: int, should_commit: bool, timeout: timedelta) -> bool:
        if self._group_nproc == 1:
            return should_commit
        return self._client.should_commit(group_rank, step, should_commit, timeout=timeout)


@contextlib.contextmanager
def _manager_server_bound_to(address: str) -> Iterator[None]:
    """Make torchft.Manager's server bind ``address`` instead of ``[::]`` (see the module doc)."""
    import torchft.manager as manager_module

    stock = manager_module.ManagerServer

    def bound(*args: Any, bind: str, **kwargs: Any) -> Any:
        port = bind.rsplit(":", 1)[1]
        host = f"[{address}]" if ":" in address else address
        return stock(*args, bind=f"{host}:{port}", **kwargs)

    manager_module.ManagerServer = bound
    try:
        yield
    finally:
        manager_module.ManagerServer = stock


class ReplicaDataParallel(nn.parallel.DistributedDataParallel):
    """DDP whose gradient all-reduce goes across the live replica groups, through the manager.

    As torchft's own DistributedDataParallel: DDP's reducer over a one-process dummy group (its
    buckets and the overlap of all-reduce with backward), buckets never rebuilt (a healing group
    must bucket as the others do), and the all-reduce in the comm hook.
    """

    def __init__(self, manager: Any, module: nn.Module) -> None:
        from torchft.process_group import ProcessGroupDummy

        super().__init__(module, process_group=ProcessGroupDummy(0, 1), find_unused_parameters=True)
        self.across = AcrossGroups(manager)
        self.register_comm_hook(self.across, replica_allreduce_hook)


class AcrossGroups:
    """The comm hook's state: the manager, and the seconds spent waiting on the other groups'
    all-reduce inside backward, which a group's record leaves out of its compute time (else every
    group's compute would include its wait for the slowest one, and no straggler could be told)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.waited_s = 0.0


def replica_allreduce_hook(state, bucket):  # DDP checks the annotations: none, or torch's own types
    """Average a gradient bucket over the live replica groups; never raise.

    ``manager.allreduce`` returns a work whose ``wait()`` records a failure (a peer that died mid
    all-reduce) in the manager and returns False: this step then does not commit, and the bucket's
    content does not matter. torchft's stock hook went on to assert on the work's inner future,
    which a failed wait leaves unset (torchft/ddp.py, 0.2.0): here the bucket is handed back as is.
    ``state``: an :class:`AcrossGroups`.
    """
    buffer = bucket.buffer()
    started = time.perf_counter()
    try:
        state.manager.allreduce(buffer).wait()  # on success the average is written into ``buffer``
    except Exception as err:  # the quorum failed (its wait runs in here): commit() says why
        state.manager.report_error(err)  # and the step does not commit
    state.waited_s += time.perf_counter() - started
    release_peers(state.manager)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buffer)
    return done


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote process exited")
"""What gloo (and NCCL's remote error) say when a peer's connection closed: the peer died, or
aborted its own connections after its step failed. A timeout is not one: a hung peer is left out
by the lighthouse's heartbeat, a slow one may still come."""


def dropped_because(error: str) -> str:
    """Why a step dropped, in shoal's words, from the error torchft recorded (gloo's or NCCL's)."""
    if any(marker in error for marker in _PEER_LOST):
        return "another group's connection closed: it died, or gave the step up"
    if "Timed out" in error or "timed out" in error:
        return f"another group did not answer within the collective timeout ({COLLECTIVE_TIMEOUT_S:.0f} s)"
    line = (error.splitlines() or [""])[0]
    return line if len(line) <= 160 else line[:160].rsplit(" ", 1)[0] + " ..."


def release_peers(manager: Any) -> None:
    """After a step that failed because a peer's connection closed, close this group's connections to
    every other group, so that each peer still blocked in the step with it fails now rather than at
    the collective timeout; the next quorum, which leaves the dead group out, connects anew.
    Nothing happens when the step did not fail, or failed otherwise (a timeout)."""
    error = manager.errored()
    if error is None or released_connections(manager):
        return
    text = str(getattr(error, "original_exception", error))
    if any(marker in text for marker in _PEER_LOST):
        manager._pg.abort()  # torchft's reconfigurable group: the backend's abort, then no backend


def released_connections(manager: Any) -> bool:
    """Whether this group's connections were closed (:func:`release_peers`) and no quorum has
    connected it anew since (torchft's reconfigurable group holds no backend then)."""
    return getattr(manager._pg, "_pg", True) is None

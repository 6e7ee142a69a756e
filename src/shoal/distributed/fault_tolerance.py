"""Per-step fault tolerance across replica groups, on torchft (pytorch/torchft, ``torchft>=0.2``).

A job is N replica groups that train the same model on different shards of the data. Each step
every live group asks torchft's lighthouse for a quorum, all-reduces its gradients with the other
members through torchft's reconfigurable gloo group, and commits the step only when every member
got through it (:meth:`torchft.Manager.should_commit`). A group that dies costs the others that one
step; when it comes back it receives a live member's model and optimizer state (healing) and joins
the next step.

What shoal adds over the stock pieces, each a sharp edge seen with torchft 0.2.0:

* :class:`ReplicaDataParallel`'s comm hook lets the manager record a failed all-reduce. The stock
  ``torchft.ddp.DistributedDataParallel._comm_hook`` (torchft/ddp.py, 0.2.0) asserts on
  ``fut._fut``, which is unset when gloo's ``work.wait()`` failed because a peer died mid
  all-reduce: the *surviving* group crashed.
* The manager server binds the address shoal chose instead of torchft's hard-coded ``[::]``
  (torchft/manager.py, ``bind = f"[::]:{port}"``), and advertises that address, not
  ``socket.gethostname()``.
* The state of a healing group travels over the replicas' own gloo group
  (``torchft.checkpointing.pg_transport.PGTransport``), not over torchft's default HTTP server,
  which listens on every interface and advertises the hostname.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from shoal.distributed.torchft_check import INSTALL_HINT
from shoal.env.replica import ReplicaCoordinates, pass_first_quorum_gate, replica_coordinates
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
    sums) that travel with the model and optimizer when a group heals. The coordinates (group,
    store, lighthouse) come from the launcher (:func:`shoal.env.replica.replica_coordinates`).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        device: torch.device,
        state: dict[str, Any] | None = None,
        coordinates: ReplicaCoordinates | None = None,
        timeout_s: float = COLLECTIVE_TIMEOUT_S,
        quorum_timeout_s: float = QUORUM_TIMEOUT_S,
    ) -> None:
        self.coordinates = coordinates or replica_coordinates()
        self.optimizer = optimizer
        self.healable = {"model": model, "optimizer": optimizer, **(state or {})}
        self.manager = _make_manager(self, device, timeout_s, quorum_timeout_s)
        pass_first_quorum_gate()  # the job's first start: every group heartbeats before any quorum
        self.model = ReplicaDataParallel(self.manager, model)
        self.participants = 0
        """Groups in the current step's quorum."""

    @property
    def group(self) -> int:
        return self.coordinates.group

    @property
    def groups(self) -> int:
        return self.coordinates.groups

    @property
    def step(self) -> int:
        """Steps committed by the job so far (every group agrees on it at each commit)."""
        return self.manager.current_step()

    @property
    def quorum(self) -> int:
        """The id of the current quorum: it changes whenever a group leaves or joins."""
        return int(getattr(self.manager, "_quorum_id", -1))  # torchft 0.2 keeps it private

    @property
    def is_writer(self) -> bool:
        """Whether this group is the quorum's replica rank 0: the one that writes logs and checkpoints."""
        return self.manager.participating_rank() == 0

    @property
    def error(self) -> str | None:
        """What made the last step drop (its first line), or None."""
        error = self.manager.errored()
        if error is None:
            return None
        text = str(getattr(error, "original_exception", error))
        return (text.splitlines() or [""])[0][:200]

    def start_step(self) -> int:
        """Join this step's quorum (healing from a live group first if behind); the committed steps.

        No quorum within the quorum timeout (the lighthouse gone for good, or a quorum that never
        formed) is a ShoalError with exit status 1: one line, and this group's launcher restarts it
        (status 2, bad input, would stop the job)."""
        try:
            self.manager.start_quorum()
        except (TimeoutError, RuntimeError) as err:
            raise ShoalError(
                f"replica group {self.coordinates.group}: no quorum from torchft's lighthouse at "
                f"{self.coordinates.lighthouse}: {first_line(err)}",
                "the launcher restarts this group, which heals from a live one; if every group says this, "
                "check that the lighthouse runs and that this node reaches it",
                exit_code=1,
            ) from None
        self.participants = self.manager.num_participants()
        return self.manager.current_step()

    def commit(self) -> bool:
        """Step the optimizer if every group of the quorum got through this step; else drop it."""
        if not self.manager.should_commit():
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
        return {name: obj.state_dict() for name, obj in self.healable.items()}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        for name, obj in self.healable.items():
            obj.load_state_dict(state[name])


def _make_manager(replicas: Replicas, device: torch.device, timeout_s: float, quorum_timeout_s: float) -> Any:
    """torchft's Manager for one group of one process (group rank 0 of 1).

    The manager server binds and advertises the group's address; weights are synced on the first
    quorum (``init_sync``), so groups need not start from the same initialisation."""
    torchft = require_torchft()
    from torchft.checkpointing.pg_transport import PGTransport

    where = replicas.coordinates
    # A failed step is said in one line by the caller; torchft logs each with a traceback.
    logging.getLogger("torchft.manager").setLevel(logging.CRITICAL)
    # PGTransport sends a pickle through torch.frombuffer of immutable bytes, read-only (0.2.0).
    warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
    timeout = timedelta(seconds=timeout_s)
    pg = torchft.ProcessGroupGloo(timeout=timeout)
    try:
        with _manager_server_bound_to(where.address):
            return torchft.Manager(
                pg=pg,
                load_state_dict=replicas._load_state_dict,
                state_dict=replicas._state_dict,
                min_replica_size=1,
                # A synchronous quorum heals a returning group before its forward pass: every step
                # then starts from the same weights in every group (torchft's default is async).
                use_async_quorum=False,
                timeout=timeout,
                quorum_timeout=timedelta(seconds=quorum_timeout_s),
                connect_timeout=timedelta(seconds=quorum_timeout_s),
                rank=0,
                world_size=1,
                store_addr=where.store[0],
                store_port=where.store[1],
                lighthouse_addr=where.lighthouse,
                replica_id=f"shoal_group_{where.group}",
                hostname=where.address,
                checkpoint_transport=PGTransport(pg, timeout=timeout, device=device),
            )
    except RuntimeError as err:
        raise ShoalError(
            f"replica group {where.group} cannot reach torchft's lighthouse at {where.lighthouse}: "
            f"{(str(err).splitlines() or [''])[0]}",
            "check that the lighthouse runs and that this node reaches its address and port",
        ) from None


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
        self.register_comm_hook(manager, replica_allreduce_hook)


def replica_allreduce_hook(manager, bucket):  # DDP checks the annotations: none, or torch's own types
    """Average a gradient bucket over the live replica groups; never raise.

    ``manager.allreduce`` returns a work whose ``wait()`` records a failure (a peer that died mid
    all-reduce) in the manager and returns False: this step then does not commit, and the bucket's
    content does not matter. torchft's stock hook went on to assert on the work's inner future,
    which a failed wait leaves unset (torchft/ddp.py, 0.2.0): here the bucket is handed back as is.
    """
    buffer = bucket.buffer()
    manager.allreduce(buffer).wait()  # on success the average is written into ``buffer``
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buffer)
    return done

"""The pieces of a training step and of an epoch's state, each checkpointable where it must be.

- :class:`Step`: forward and backward over ``grad_accum`` micro-batches with AMP and DDP's
  ``no_sync`` (gradients all-reduced only on the last one), then the optimizer step; under DDP it
  also times the last backward's wait for the other ranks' gradients (:attr:`Step.waited_s`);
- :class:`EpochTally`: the running sums of the current epoch (checkpointed, so an epoch resumed in
  the middle still reports its whole loss);
- :class:`StepTimer`: the training pass's clock (each step's compute and waits for the watchdog's
  record, the epoch's training seconds for its tally);
- :class:`GeneratorState`: a per-rank ``torch.Generator`` (augmentation) as a checkpointable object;
- channels-last helpers: move conv models and their 4-D batches to NHWC memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shoal.distributed import collectives
from shoal.distributed.collectives import all_reduce_sum

if TYPE_CHECKING:
    from shoal.preemption import PreemptionWatch
    from shoal.progress import ProgressWriter


class Step:
    """One optimizer step over ``grad_accum`` micro-batches, with AMP and DDP's no_sync handled.

    Under DDP the backward of the last micro-batch also all-reduces the gradients: DDP's reducer
    starts each bucket's all-reduce once its gradients are in and waits for them all in a callback
    it queues on autograd's engine (``Reducer::finalize_backward``), which runs the callbacks queued
    for a backward in order once all of the backward's computation is done. So the rank that ends its
    backward first waits there for the slowest one. A callback queued as that backward starts runs
    first and stamps the end of this rank's own computation; the rest of the backward is
    :attr:`waited_s`, which the trainer's clock counts as wait, not compute, so that the watchdog's
    straggler judge sees each rank's own compute. One hook on the backward's first node per synced
    micro-batch, whatever the number of parameters. Not with one process (no DDP) nor under FSDP,
    whose waits for the other ranks (all-gathers, reduce-scatters) run throughout the forward and
    backward: :attr:`waited_s` stays 0."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        amp: str,
        device: torch.device,
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
        progress: Any = None,
    ) -> None:
        """``amp``: the autocast dtype (off, bf16, fp16); "off" for an FSDP model in mixed precision,
        whose policy casts. ``progress``: the rank's :class:`~shoal.progress.ProgressWriter`, told
        the phase (forward, backward, optimizer); a disabled one costs an attribute test."""
        self.model, self.optimizer = model, optimizer
        self.progress = progress if progress is not None else _NO_PROGRESS
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        self.autocast: Callable[[], Any] | None = (
            (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else None
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
        self.loss_fn = loss_fn  # the mean over the micro-batch
        self.waited_s = 0.0
        """Seconds of the last micro-batch's backward after this rank's own computation: under DDP,
        when it synced, the wait for the other ranks' gradients (and the last all-reduce); else 0."""
        self._computed = _ComputedClock() if isinstance(model, DistributedDataParallel) else None

    def micro_batch(self, inputs: torch.Tensor, targets: torch.Tensor, *, weight: float, sync: bool) -> torch.Tensor:
        """Forward and backward one micro-batch; gradients are all-reduced only when ``sync``."""
        no_sync = getattr(self.model, "no_sync", None)
        progress = self.progress
        with contextlib.nullcontext() if sync or no_sync is None else no_sync():
            progress.phase("forward")
            with self.autocast() if self.autocast else contextlib.nullcontext():
                loss = self.loss_fn(self.model(inputs), targets)
            progress.phase("backward")  # DDP's all-reduce and FSDP's reduce-scatter run in here
            scaled = self.scaler.scale(loss * weight)
            clock = self._computed
            if clock is None or not sync or scaled.grad_fn is None:
                scaled.backward()
                self.waited_s = 0.0
            else:
                clock.at = 0.0
                scaled.grad_fn.register_prehook(clock.queue)
                scaled.backward()
                self.waited_s = perf_counter() - clock.at if clock.at else 0.0
        return loss.detach()

    def apply(self) -> None:
        self.progress.phase("optimizer")
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)


class EpochTally:
    """The running sums of the current epoch (checkpointed, so a resumed epoch reports whole)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.count = torch.zeros((), dtype=torch.float64, device=self.device)
        self.samples = 0  # global, real (non-padding) samples
        self.train_s = 0.0

    def consolidate(self) -> None:
        """Sum the per-rank loss sums onto rank 0 (collective), so rank 0's state is the total."""
        totals = all_reduce_sum(torch.stack([self.loss_sum, self.count]))
        keep = collectives.rank() == 0
        self.loss_sum, self.count = (
            (totals[0], totals[1]) if keep else (torch.zeros_like(totals[0]), torch.zeros_like(totals[1]))
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "loss_sum": self.loss_sum.cpu(),
            "count": self.count.cpu(),
            "samples": self.samples,
            "train_s": self.train_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rank0 = collectives.rank() == 0
        self.loss_sum = (
            state["loss_sum"].to(self.device) if rank0 else torch.zeros((), dtype=torch.float64, device=self.device)
        )
        self.count = (
            state["count"].to(self.device) if rank0 else torch.zeros((), dtype=torch.float64, device=self.device)
        )
        self.samples, self.train_s = int(state["samples"]), float(state["train_s"])


class StepTimer:
    """The training pass's clock: each step's compute and waits for the watchdog's record (with the
    phase between them: ``data`` while a batch is awaited), and the pass's seconds for the epoch's
    tally (a checkpoint saved in the pass holds them so far).

    The loop tells it where it is: :meth:`start`, then per micro-batch :meth:`fetched`, then
    :meth:`micro_batch_done` (gradients accumulate) or :meth:`computed` and :meth:`step_done` (the
    optimizer stepped), then :meth:`fetching` for the next batch; :meth:`stop` at the end. A step's
    compute runs from its batch's arrival to the end of its backward (and optimizer step), less the
    backward's wait for the other ranks' gradients (:attr:`Step.waited_s`, given to :meth:`computed`);
    its wait is that, the time spent awaiting batches, and what follows the compute (the trackers'
    reduction, the preemption check). ``perf_counter`` reads the clock without a system call."""

    def __init__(self, progress: ProgressWriter, tally: EpochTally) -> None:
        self.progress, self.tally = progress, tally
        self._started = self._fetching = self._begun = self._computed = 0.0
        self._samples, self._compute_s, self._wait_s = 0, 0.0, 0.0

    def start(self, step: int) -> None:
        """The pass starts (or resumes) after optimizer step ``step``: its seconds run from now."""
        self._started = perf_counter()
        self.fetching(step)

    def fetching(self, step: int) -> None:
        """After optimizer step ``step``: the loop awaits its next batch."""
        self.progress.phase("data", step)
        self._fetching = perf_counter()

    def fetched(self) -> None:
        """A batch arrived: the wait for it ends, its compute begins."""
        begun = perf_counter()
        self._wait_s += begun - self._fetching
        self._begun = begun

    def micro_batch_done(self, samples: int) -> None:
        """A micro-batch of ``samples`` that ends no step is done (gradients accumulate): its compute
        ends, the wait for the next batch begins."""
        fetching = perf_counter()
        self._compute_s += fetching - self._begun
        self._samples += samples
        self.progress.phase("data")
        self._fetching = fetching

    def computed(self, samples: int, waited_s: float = 0.0) -> None:
        """The step's last micro-batch (``samples``) and its optimizer step are done: compute ends.
        ``waited_s`` of it were spent waiting for the other ranks (:attr:`Step.waited_s`): wait."""
        computed = perf_counter()
        self._compute_s += computed - self._begun - waited_s
        self._wait_s += waited_s
        self._samples += samples
        self._computed = computed

    def step_done(self, preemption: PreemptionWatch) -> int:
        """The step ends on every rank with the preemption check (a collective now and then, so
        marked as one); then its samples, compute and wait go to the watchdog's record. Returns the
        signal every rank agreed to stop for (0: none)."""
        progress = self.progress
        progress.collective()
        signum = preemption.requested()
        progress.step_done(self._samples, self._compute_s, self._wait_s + perf_counter() - self._computed)
        self._samples, self._compute_s, self._wait_s = 0, 0.0, 0.0
        return signum

    def to_tally(self) -> None:
        """The pass's seconds so far into the epoch's tally (before a checkpoint, which holds them)."""
        now = perf_counter()
        self.tally.train_s += now - self._started
        self._started = now

    def stop(self) -> None:
        """The pass is over: its last seconds into the epoch's tally."""
        self.tally.train_s += perf_counter() - self._started


class GeneratorState:
    """Adapts a torch.Generator to the state_dict protocol (per-rank augmentation RNG)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["state"])


class _ComputedClock:
    """When this rank's computation in a backward ended: :meth:`queue`, a hook on the backward's
    first node, queues :meth:`stamp` on autograd's engine before anything else is queued for that
    backward (DDP queues its wait once its last bucket is ready), so it runs first once the
    backward's computation is done."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = 0.0

    def queue(self, _grad_outputs: Any) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self.stamp)

    def stamp(self) -> None:
        self.at = perf_counter()


class _NoProgress:
    def phase(self, name: str, step: int | None = None) -> None:
        pass


_NO_PROGRESS = _NoProgress()


def has_conv2d(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def in_channels_last(transform: Callable | None) -> Callable:
    """``transform`` followed by moving 4-D inputs to channels-last memory (one copy per batch)."""

    def apply(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if transform is not None:
            batch = transform(batch)
        inputs, *rest = batch
        if inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return (inputs, *rest)

    return apply

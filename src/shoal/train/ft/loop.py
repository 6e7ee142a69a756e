"""One replica group of a fault-tolerant ``shoal train`` job (``--fault-tolerance``): its loop.

The job is N replica groups (:mod:`shoal.train.ft.supervisor`) of one process each, or of K
(``--nproc-per-group``: DDP inside the group, or FSDP2 with ``--strategy fsdp``: HSDP); each step
every live group joins torchft's quorum, computes its gradient on its own batch, averages it with
the others (:class:`~shoal.distributed.fault_tolerance.Replicas`) and steps the optimizer only when
the step commits in every member. What stays exact, and how:

* The step counter is torchft's committed steps. Epoch ``e`` and its batch ``k`` follow from it;
  rank ``r`` of group ``g`` of ``N`` groups of ``K`` reads batch ``k`` of its shard of epoch
  ``e``'s one global order (:class:`~shoal.data.sampler.ShardedSampler`, rank ``g x K + r`` of
  ``N x K``), so the processes of a step cover disjoint samples. A dropped step (a member failed in it) is tried again on the same
  batches; its samples are not counted as seen.
* A group that joins behind the others receives a member's model, optimizer and epoch tally
  (healing) before its forward pass: weights are identical in every group at every commit.
* metrics.jsonl records per epoch the steps committed and dropped, and the participants of every
  committed step; the group that is the quorum's replica rank 0 at the epoch's end writes it and
  the checkpoint, which a whole-job restart resumes from (every group loads it).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.checkpoint.loading import restore
from shoal.checkpoint.manager import CheckpointManager
from shoal.context import init as init_context
from shoal.data import make_loader
from shoal.distributed.wrap import model_state_dict
from shoal.env.replica import replica_coordinates
from shoal.errors import ShoalError
from shoal.evaluation import evaluate
from shoal.launch.process import process_started
from shoal.progress import ProgressWriter, progress_path, read_one, run_progress_dir
from shoal.train.config import TrainConfig
from shoal.train.ft.events import EVENTS_FILE, NODE_ENV, append_event, finished_without, node_label, read_events
from shoal.train.optim import LRSchedule, build_optimizer, scaled_lr
from shoal.train.outputs import RunOutputs
from shoal.train.trainer import TrainResult
from shoal.workloads.base import Workload
from shoal.workloads.blame import blame, checked_loss

UNTIMED_STEPS = 10
"""A process's first committed steps, which its progress record counts but does not time."""


class ReplicaTally:
    """The current epoch's record: steps committed and dropped, participants per committed step,
    the loss of committed steps. Travels with the model when a group heals."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.committed, self.dropped, self.samples = 0, 0, 0
        self.participants: list[int] = []
        self.loss_sum, self.train_s = 0.0, 0.0

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)


class ReplicaEvents:
    """``RUN_DIR/replicas.jsonl`` (:mod:`shoal.train.ft.events`): what each group lived through, one
    line per event, every group appending.

    Events: ``start`` (pid, start count, node, address, lighthouse), ``joined`` (the first step it committed in, seconds since
    the process started), ``healed`` (the step it joined the others at, and its ``source``: a live
    group's state, or for a restart that needed none its own checkpoint or the job's start),
    ``quorum`` (the first commit in
    a new quorum: a group left or joined; with its number of groups), ``dropped`` (a step that did not commit), ``recovered`` (the
    first commit after drops), ``finished`` (step, a hash of the
    parameters: equal in every group)."""

    def __init__(self, run_dir: Path, group: int, *, enabled: bool = True) -> None:
        self.run_dir, self.group, self.enabled = run_dir, group, enabled
        self.born = time.time() - (time.monotonic() - process_started())  # when this process started

    @property
    def path(self) -> Path:
        return self.run_dir / EVENTS_FILE

    def write(self, event: str, **fields: Any) -> None:
        if self.enabled:
            append_event(self.run_dir, self.group, event, **fields)


def parameters_hash(state: dict[str, torch.Tensor]) -> str:
    """A SHA-256 of a model's plain state dict (:func:`~shoal.distributed.wrap.model_state_dict`),
    in order: equal when two replicas hold the same weights."""
    digest = hashlib.sha256()
    for tensor in state.values():
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class _Batches:
    """Batch ``k`` of epoch ``e`` of this group's shard, fetched in order and re-seeked on a jump."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.batches = len(loader)
        self._iter: Any = None
        self._at: tuple[int, int] | None = None
        self._current: Any = None

    def get(self, epoch: int, index: int) -> Any:
        if self._at == (epoch, index):
            return self._current  # a dropped step is tried again on the same batch
        if self._at != (epoch, index - 1):
            self.loader.set_epoch(epoch)
            sampler = self.loader.sampler
            sampler.advance(index * self.loader.batch_size * sampler.world_size)
            self._iter = iter(self.loader)
        self._current, self._at = next(self._iter), (epoch, index)
        return self._current


def train_replica(cfg: TrainConfig, *, workload: Workload, **_: Any) -> TrainResult:
    """Train as the replica group the launcher's variables name (:mod:`shoal.env.replica`);
    ``cfg`` resolved against ``workload``, as :func:`shoal.train.trainer.train` takes them."""
    where = replica_coordinates()
    group, groups = where.group, where.groups
    ctx = init_context(device=cfg.device, backend=cfg.backend, seed=cfg.seed)  # a group of several: its own group
    data_rank, data_world = group * ctx.world_size + ctx.rank, groups * ctx.world_size
    with blame(workload, "load()", "fix the error in your workload's load() or Dataset at that line"):
        data = workload.load(cfg, ctx.device, rank=data_rank)
    with blame(workload, "build_model()", "fix the error in your workload's build_model() at that line"):
        model: nn.Module = workload.build_model(cfg, data.num_classes)
    # A group of several trains the model together: DDP, or FSDP2 (HSDP across the groups).
    model = ctx.wrap(model, strategy=cfg.strategy, **({"mixed_precision": cfg.amp} if cfg.strategy == "fsdp" else {}))
    loss_fn = checked_loss(workload)
    loader = make_loader(
        data.train, cfg.batch_size, rank=data_rank, world_size=data_world, seed=cfg.seed, drop_last=True,
        device=ctx.device, transform=data.train_transform, **data.loader_options,
    )  # fmt: skip
    test_loader = ctx.eval_loader(data.test, cfg.eval_batch_size or 4 * cfg.batch_size, transform=data.test_transform)
    lr = scaled_lr(cfg.lr, cfg.lr_scaling, data_world)  # the global batch is every process's batch together
    optimizer = build_optimizer(cfg.optimizer, model.parameters(), lr, cfg.weight_decay)
    tally = ReplicaTally()
    try:
        replicas = ctx.replicas(model, optimizer, state={"tally": tally})
    except ShoalError:
        # A restarted group that finds no lighthouse, because the other groups finished the job
        # (node 0's launcher then stops serving it): nothing is left to train, and nothing failed.
        done = finished_without(read_events(cfg.out), group) if where.starts > 1 else None
        if done is None:
            raise
        ctx.print(
            f"shoal: replica group {group} started again after group {done['group']} finished "
            f"the job at step {done.get('step')}: nothing left to train"
        )
        ctx.shutdown()
        return TrainResult(
            run_dir=Path(cfg.out), metrics=RunOutputs(cfg.out).logged_epochs(), model_path=None, config=cfg
        )
    checkpoints = CheckpointManager(
        Path(cfg.checkpoint_dir or Path(cfg.out) / "checkpoints"), every=cfg.cadence, sharded=cfg.strategy == "fsdp"
    )
    if cfg.resume in ("auto", "never"):
        found = checkpoints.load_latest() if cfg.resume == "auto" else None
    else:
        found = checkpoints.load(cfg.resume)
    if found is not None:  # a whole-job restart: every group starts from the newest checkpoint
        restore(found, {**replicas.healable, "replicas": replicas})
    batches = _Batches(loader)
    if group == 0 and where.starts == 1:
        inside = f" of {ctx.world_size} processes ({cfg.strategy.upper()} inside)" if ctx.world_size > 1 else ""
        ctx.print(
            f"shoal train {cfg.workload}: {groups} replica groups{inside} on {ctx.device.type} "
            f"(torchft over {replicas.backend}, lighthouse {where.lighthouse}) | "
            f"{cfg.batch_size}/process x {data_world} processes | {batches.batches} steps/epoch x {cfg.epochs} epochs"
        )
    run_dir = Path(cfg.out)
    node = int(os.environ[NODE_ENV]) if os.environ.get(NODE_ENV, "").isdigit() else None
    speaker = ctx.rank == 0  # a group's rank 0 speaks for it: its events, its progress record
    events = ReplicaEvents(run_dir, group, enabled=speaker)
    events.write("start", starts=where.starts, node=node, address=where.address, lighthouse=where.lighthouse)
    progress = run_progress_dir(run_dir)
    before = read_one(progress_path(progress, group))  # the previous process's record: the step it died at
    died_at = before.step if before is not None and before.phase != "done" and where.starts > 1 else None
    # The per-rank record every trainer writes, the group as its rank: shoal status and the
    # launcher's watch read it (a few stores into a shared page per step).
    writer = ProgressWriter(progress if speaker else None, group)
    run = _Run(cfg, ctx, replicas, tally, events, checkpoints, RunOutputs(cfg.out), writer)
    run.where, run.died_at = node_label(node, where.address), died_at
    run.restarted, run.resumed = where.starts > 1, found is not None
    schedule = LRSchedule(lr, cfg.epochs, cfg.warmup_epochs)
    while run.step(batches, loss_fn, schedule, workload):
        if run.epoch_done:
            run.finish_epoch(model, test_loader, loss_fn)
    if run.restarted and not run.said_healed:  # back after the others finished: nothing left to train
        run._healed(replicas.step, "checkpoint" if run.resumed else "start")
    # The whole model, gathered once: collective under FSDP (every rank of the group calls it; the
    # speaker, its rank 0, gets it), for the hash every group reports and group 0's model.pt.
    state = model_state_dict(model)
    events.write("finished", step=replicas.step, params=parameters_hash(state))
    run.progress.close()
    replicas.close()
    ctx.shutdown()
    model_path = run.outputs.save_model(state) if group == 0 and speaker else None
    if model_path is not None:
        ctx.print(f"saved {model_path} and metrics in {run.outputs.directory}")
    return TrainResult(run_dir=Path(cfg.out), metrics=run.outputs.logged_epochs(), model_path=model_path, config=cfg)


class _Run:
    """One group's way through the run: each step, and each epoch's end (record, checkpoint)."""

    def __init__(self, cfg, ctx, replicas, tally, events, checkpoints, outputs, progress: ProgressWriter) -> None:
        self.cfg, self.ctx, self.replicas, self.tally = cfg, ctx, replicas, tally
        self.events, self.checkpoints, self.outputs, self.progress = events, checkpoints, outputs, progress
        self.joined, self.dropped_since, self.quorum = False, 0, None
        self.epoch, self.epoch_done = 0, False
        self.started = time.perf_counter()
        self.where = ""
        """This group's node, as its lines name it."""
        self.died_at: int | None = None
        """The step this group's previous process died at (its record's), for the healed line."""
        self.restarted = False
        """Whether this process is a restart of its group (its launcher's start count above 1)."""
        self.resumed = False
        """Whether this process loaded a checkpoint before its first quorum."""
        self.said_healed = False
        self.steps_done = 0
        """Steps this process committed."""

    def step(self, batches: _Batches, loss_fn: Any, schedule: LRSchedule, workload: Any) -> bool:
        """One step: False once the run's steps are all committed."""
        replicas, tally, events, progress = self.replicas, self.tally, self.events, self.progress
        heals = replicas.heals
        waited = time.perf_counter()
        progress.collective()  # the quorum: it completes during the forward pass
        step = replicas.start_step()  # as this group knows it: a group behind learns the job's at commit
        progress.phase("data", step)
        epoch, index = divmod(step, batches.batches)
        if epoch + 1 > self.cfg.epochs:
            return False
        inputs, targets = batches.get(epoch + 1, index)
        schedule.apply(replicas.optimizer, epoch + index / batches.batches)
        replicas.optimizer.zero_grad(set_to_none=True)
        computed, waited_before = time.perf_counter(), replicas.waited_s
        with blame(workload, "training", "fix your workload's code at that line"):
            progress.phase("forward")
            loss = loss_fn(replicas.model(inputs), targets)
            progress.phase("backward")  # the gradient all-reduce across the live groups runs in here
            loss.backward()
        # Not the wait for the other groups inside backward: a straggler is told by its compute alone.
        compute_s = time.perf_counter() - computed - (replicas.waited_s - waited_before)
        progress.collective()  # the commit vote, and the optimizer step
        committed = replicas.commit()  # a group behind receives a live group's state in here
        step = replicas.step - int(committed)  # the step tried, as the job counts it
        if replicas.heals != heals and not self.joined:
            self._healed(step, "peer")
        epoch, index = divmod(step, batches.batches)
        self.epoch, self.epoch_done = epoch + 1, committed and index == batches.batches - 1
        if not committed:
            tally.dropped += 1
            self.dropped_since += 1
            error = replicas.error or "a member failed in it"  # another rank of this group, or another group
            self._say(
                "dropped", f"dropped step {step + 1} ({error}); the live groups go on", step=step + 1, error=error
            )
            return True
        participants = replicas.participants
        if not self.joined:
            if not self.said_healed and self.restarted:  # it came back at the others' step without a heal
                self._healed(step, "checkpoint" if self.resumed else "start")
            self.joined = True
            events.write("joined", step=step + 1, after_s=round(time.time() - events.born, 3))
        if replicas.quorum != self.quorum:  # the first commit with another set of groups
            events.write("quorum", step=step + 1, participants=participants, quorum=replicas.lighthouse_quorum)
            self.quorum = replicas.quorum
        if self.dropped_since:
            events.write("recovered", step=step + 1, dropped=self.dropped_since, participants=participants)
            self.dropped_since = 0
        # A process's first steps (allocations, first calls) are not the group's pace: untimed, so
        # that a group restarted beside groups long warm is not judged a straggler for them.
        self.steps_done += 1
        timed = self.steps_done > UNTIMED_STEPS
        progress.step_done(targets.shape[0], compute_s, time.perf_counter() - waited - compute_s, timed=timed)
        tally.committed += 1
        tally.participants.append(participants)
        tally.samples += participants * self.ctx.world_size * targets.shape[0]
        tally.loss_sum += float(loss.detach())
        now = time.perf_counter()
        tally.train_s += now - self.started
        self.started = now
        return True

    def finish_epoch(self, model: nn.Module, test_loader: Any, loss_fn: Any) -> None:
        """The lowest live group evaluates, logs the epoch and checkpoints; every group starts afresh."""
        writer = self.replicas.is_writer  # the same in every rank of a group: all its ranks evaluate and save
        if writer:
            self.progress.phase("evaluation")
            groups = self.replicas.groups
            record = _finish_epoch(self.cfg, self.epoch, model, test_loader, loss_fn, self.tally, self.ctx, groups)
            if self.ctx.is_main:
                self.outputs.log_epoch(record)
        self.tally.reset()  # before the checkpoint: a resumed run starts the next epoch's record afresh
        if writer:
            self.progress.phase("checkpoint")
            state = {**self.replicas.healable, "replicas": self.replicas}
            final = self.epoch == self.cfg.epochs
            step = self.replicas.step
            self.checkpoints.maybe_save(epoch=self.epoch, step=step, epoch_end=True, final=final, objects=state)
        self.started = time.perf_counter()

    def _healed(self, step: int, source: str) -> None:
        """The ``healed`` event of a group that joins the others at ``step``: with the state of a live
        group (``peer``), from its own checkpoint already at that step (``checkpoint``), or at the
        job's start with nothing committed yet (``start``)."""
        self.said_healed = True
        after = round(time.time() - self.events.born, 3)
        died = f" (it died at step {self.died_at})" if self.died_at is not None else ""
        how = {"peer": "healed", "checkpoint": "resumed from its checkpoint", "start": "joined from the start"}[source]
        line = f"on {self.where} {how} at step {step}, {after:.1f} s after it started{died}"
        self._say("healed", line, step=step, after_s=after, died_at=self.died_at, source=source)

    def _say(self, event: str, line: str, **fields: Any) -> None:
        self.events.write(event, **fields)
        self.ctx.print(f"shoal: replica group {self.replicas.group} {line}")


def _finish_epoch(
    cfg: TrainConfig, epoch: int, model: nn.Module, test_loader: Any, loss_fn: Any, tally: ReplicaTally, ctx: Any,
    groups: int,
) -> dict[str, Any]:  # fmt: skip
    started = time.perf_counter()
    scores = evaluate(model, test_loader, loss_fn=loss_fn)
    record = {
        "epoch": epoch,
        "train_loss": tally.loss_sum / max(tally.committed, 1),
        "test_loss": scores["loss"],
        **{f"test_{k}": v for k, v in scores.items() if k not in ("loss", "samples")},
        "test_samples": int(scores["samples"]),
        "samples_seen": tally.samples,
        "samples_per_s": tally.samples / tally.train_s if tally.train_s > 0 else float("nan"),
        "epoch_s": tally.train_s + time.perf_counter() - started,
        "replica_groups": groups,
        "steps_committed": tally.committed,
        "steps_dropped": tally.dropped,
        "participants": list(tally.participants),
    }
    accuracy = record.get("test_accuracy")
    shown = f"  test_acc {accuracy:.4f}" if accuracy is not None else ""
    ctx.print(
        f"epoch {epoch}/{cfg.epochs}  train_loss {record['train_loss']:.4f}  test_loss {scores['loss']:.4f}{shown}"
        f"  committed {tally.committed} dropped {tally.dropped}  groups/step {min(tally.participants)}-"
        f"{max(tally.participants)}  {record['epoch_s']:.2f} s"
    )
    return record

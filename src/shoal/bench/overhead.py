"""``shoal bench overhead``: what shoal's trainer costs per step against a hand-written DDP loop.

The same job four ways, each as its own launch of ``nproc`` worker processes through shoal's
launcher: same model and initial weights (seeded), same pre-loaded tensors, same per-rank batches
(``DistributedSampler`` order with ``set_epoch``, which is also shoal's order), same optimizer
(SGD, momentum 0.9, nesterov) and the same per-step learning rate (cosine over the run):

* ``plain``: the loop every DDP tutorial writes: ``init_process_group``, ``DistributedSampler`` +
  ``set_epoch``, ``DistributedDataParallel``, forward, ``backward``, ``step``. Its batches are
  gathered with ``index_select`` (the fastest hand-written gather), so shoal's faster data path
  gives it no head start: any difference is the trainer's own machinery.
* ``shoal``: ``shoal train synthetic`` itself (:func:`shoal.train.trainer.train` on every rank:
  progress-based lr schedule, loss tally, preemption check, everything a real run does; no
  checkpoints, the per-epoch evaluation outside the timed part, and ResNets in the plain loop's
  memory format: ``--no-channels-last``, or the arithmetic would differ).
* ``accelerate`` and ``fabric`` (when installed: ``pip install 'shoal[bench]'``): the plain loop with
  Hugging Face Accelerate's ``prepare``/``backward`` or Lightning Fabric's ``setup``/``backward``.

Timing: rank 0's wall time of each epoch's training part (from building the epoch's indices to
the last optimizer step; the job is in lockstep, so it is the job's time), divided by the steps:
mean ms/step per epoch; the first ``warmup`` epochs are not counted; a launch's figure is the
median over its timed epochs. Launches are interleaved and rotated round by round (A B C D, B C D A,
...), and the reported ratio to ``plain`` is the median over rounds of the ratio measured in the
same round (a shared machine's slow spells hit both sides of a pair).

Correctness is part of the result: ``plain`` and ``shoal`` must end with bit-identical weights
(``torch.equal`` on every tensor), checked every round; the report says so, or the run fails.
For accelerate and fabric the largest absolute weight difference from ``plain`` is reported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from shoal.bench import report as rep
from shoal.bench._launch import check_start_method, launch_workers, resolve_start_method
from shoal.bench.options import require_at_least
from shoal.bench.timing import load_average, median, rotations
from shoal.errors import ShoalError

VARIANTS = ("plain", "shoal", "accelerate", "fabric")
BASELINE = "plain"
PEERS = {"accelerate": "accelerate", "fabric": "lightning"}
"""Variant -> the package it needs (skipped with a note when missing)."""
NUM_CLASSES = 10
LR = 0.01


@dataclass(frozen=True)
class OverheadConfig:
    """What ``shoal bench overhead`` measures."""

    model: str = "mlp"
    """``mlp`` (tiny: per-step costs show) or a torchvision ResNet (resnet18 ...)."""
    image_size: int = 0
    """Side of the random 3xSxS inputs (0: 16 for the MLP, 32 for a ResNet)."""
    batch_size: int = 32
    """Samples per process per step."""
    samples: int = 0
    """Training samples (global) per epoch (0: 64 steps' worth at the MLP, 8 at a ResNet)."""
    epochs: int = 6
    """Epochs per launch; the first ``warmup`` are not timed."""
    warmup: int = 1
    """Untimed epochs at the start of each launch."""
    nproc: int = 2
    """Worker processes per launch (the issue's target is stated for 2)."""
    repeat: int = 5
    """Rounds; every variant is launched once per round, interleaved."""
    threads: int = 1
    """Intra-op threads per process."""
    variants: tuple[str, ...] = VARIANTS
    """Which of plain, shoal, accelerate, fabric to run (plain is always included: the baseline)."""
    start_method: str = "auto"
    """How launch_local starts workers (auto: fork on CPU)."""

    def __post_init__(self) -> None:
        from shoal.workloads.synthetic import ARCHS

        if self.model not in ARCHS:
            raise ShoalError(f"unknown model {self.model!r}", f"choose --model from: {', '.join(ARCHS)}")
        require_at_least(self, 1, "batch_size", "epochs", "nproc", "repeat", "threads")
        require_at_least(self, 0, "image_size", "samples", "warmup")
        if self.warmup >= self.epochs:
            raise ShoalError(
                f"--warmup {self.warmup} leaves no timed epoch of --epochs {self.epochs}",
                f"pass --epochs {self.warmup + 1} or more",
            )
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise ShoalError(
                f"unknown variant(s): {', '.join(unknown) or '(none given)'}", f"choose from: {', '.join(VARIANTS)}"
            )
        check_start_method(self.start_method)

    @property
    def side(self) -> int:
        return self.image_size or (16 if self.model == "mlp" else 32)

    @property
    def epoch_samples(self) -> int:
        steps = 64 if self.model == "mlp" else 8
        return self.samples or steps * self.batch_size * self.nproc


SMOKE = dict(image_size=8, batch_size=8, samples=64, epochs=2, warmup=1, repeat=1)
"""Tiny sizes for ``--smoke``: checks the machinery (and the bit-identical weights) in seconds."""


@dataclass(frozen=True)
class Job:
    """The work every variant does (picklable)."""

    model: str
    side: int
    batch_size: int
    samples: int
    epochs: int
    threads: int
    out: str
    seed: int = 0
    lr: float = LR


# The job's pieces, written as a user would (the plain loop and the peers share them) -----------


def make_data(job: Job):
    """The training set: random images and labels, drawn exactly as the synthetic workload does."""
    import torch

    generator = torch.Generator().manual_seed(job.seed)
    images = torch.randn((job.samples, 3, job.side, job.side), generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (job.samples,), generator=generator)
    return images, labels


def make_model_and_optimizer(job: Job):
    import torch

    from shoal.workloads.synthetic import build_synthetic_model

    torch.manual_seed(job.seed)
    model = build_synthetic_model(job.model, job.side, NUM_CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=0.9, nesterov=True, weight_decay=0.0)
    return model, optimizer


def cosine_lr(job: Job, progress: float) -> float:
    """The learning rate after ``progress`` epochs: cosine from ``lr`` to zero over the run."""
    return job.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress / job.epochs)))


def hand_written_loop(
    job: Job, model, optimizer, backward: Callable[[Any], None], rank: int, world_size: int
) -> list[float]:
    """The tutorials' DDP loop over pre-loaded tensors; returns the seconds of each epoch's training."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DistributedSampler

    images, labels = make_data(job)
    sampler = DistributedSampler(range(job.samples), num_replicas=world_size, rank=rank, shuffle=True, seed=job.seed)
    global_batch = job.batch_size * world_size
    model.train()
    seconds = []
    for epoch in range(job.epochs):
        started = time.perf_counter()
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for step, first in enumerate(range(0, len(order), job.batch_size)):
            index = order[first : first + job.batch_size]
            inputs, targets = images.index_select(0, index), labels.index_select(0, index)
            loss = F.cross_entropy(model(inputs), targets)
            backward(loss)
            lr = cosine_lr(job, epoch + step * global_batch / job.samples)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - started)
    return seconds


def _steps_per_epoch(job: Job, world_size: int) -> int:
    per_rank = -(-job.samples // world_size)
    return -(-per_rank // job.batch_size)


def _result(job: Job, seconds: list[float], world_size: int, variant: str, state: dict) -> dict[str, Any]:
    """Rank 0's answer: epoch times, steps per epoch, and the final weights (a file and a digest).

    The digest is taken here, in the worker: the parent must run no torch computation between
    launches, because a worker forked from a process whose OpenMP pool exists can hang in its
    first parallel op (GNU libgomp is not fork-safe).
    """
    import hashlib

    import torch

    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode())
        digest.update(state[key].numpy().tobytes())
    path = Path(job.out) / f"{variant}.pt"
    torch.save(state, path)
    return {
        "epoch_s": seconds,
        "steps": _steps_per_epoch(job, world_size),
        "weights": str(path),
        "digest": digest.hexdigest(),
    }


# One module-level worker per variant (module-level: spawn must be able to pickle them) ----------


def plain_worker(job: Job) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(job.threads)
    dist.init_process_group("gloo")
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        model, optimizer = make_model_and_optimizer(job)
        ddp = DistributedDataParallel(model)
        seconds = hand_written_loop(job, ddp, optimizer, lambda loss: loss.backward(), rank, world_size)
        return _result(job, seconds, world_size, "plain", model.state_dict()) if rank == 0 else None
    finally:
        dist.destroy_process_group()


def shoal_worker(job: Job) -> dict[str, Any] | None:
    import json

    import torch

    from shoal.train.config import TrainConfig
    from shoal.train.entry import run_worker

    os.environ["OMP_NUM_THREADS"] = str(job.threads)
    cfg = TrainConfig(
        workload="synthetic",
        arch=job.model,
        image_size=job.side,
        samples=job.samples,
        batch_size=job.batch_size,
        epochs=job.epochs,
        lr=job.lr,
        optimizer="sgd",
        weight_decay=0.0,
        seed=job.seed,
        device="cpu",
        out=str(Path(job.out) / "shoal-run"),
        checkpoint_every="0",
        resume="never",
        progress=False,
        channels_last=False,  # the plain loop's memory format: the same arithmetic, bit for bit
    )
    rank = int(os.environ.get("RANK", "0"))
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        run_worker(cfg)
    if rank != 0:
        return None
    run = Path(cfg.out)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # metrics.jsonl holds each epoch's training throughput: samples seen / training seconds.
    seconds = [r["samples_seen"] / r["samples_per_s"] for r in records]
    world_size = records[0]["world_size"]
    state = torch.load(run / "model.pt", map_location="cpu", weights_only=True)
    return _result(job, seconds, world_size, "shoal", state)


def accelerate_worker(job: Job) -> dict[str, Any] | None:
    import torch
    from accelerate import Accelerator

    torch.set_num_threads(job.threads)
    accelerator = Accelerator(cpu=True)
    model, optimizer = make_model_and_optimizer(job)
    wrapped, optimizer = accelerator.prepare(model, optimizer)
    rank, world_size = accelerator.process_index, accelerator.num_processes
    seconds = hand_written_loop(job, wrapped, optimizer, accelerator.backward, rank, world_size)
    result = _result(job, seconds, world_size, "accelerate", model.state_dict()) if rank == 0 else None
    accelerator.end_training()
    return result


def fabric_worker(job: Job) -> dict[str, Any] | None:
    import logging

    import torch
    from lightning.fabric import Fabric

    torch.set_num_threads(job.threads)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)  # its banner would break the table
    world_size = int(os.environ["WORLD_SIZE"])
    fabric = Fabric(accelerator="cpu", devices=world_size, strategy="ddp", num_nodes=1)
    fabric.launch()  # under torch's elastic agent: joins the group, starts nothing
    model, optimizer = make_model_and_optimizer(job)
    wrapped, optimizer = fabric.setup(model, optimizer)
    seconds = hand_written_loop(job, wrapped, optimizer, fabric.backward, fabric.global_rank, world_size)
    result = _result(job, seconds, world_size, "fabric", model.state_dict()) if fabric.global_rank == 0 else None
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        dist.destroy_process_group()
    return result


WORKERS: dict[str, Callable[[Job], dict[str, Any] | None]] = {
    "plain": plain_worker,
    "shoal": shoal_worker,
    "accelerate": accelerate_worker,
    "fabric": fabric_worker,
}


# The orchestration, in the parent process --------------------------------------------------------


def largest_difference(a_path: str, b_path: str) -> float:
    """The largest absolute difference between two saved state dicts with the same keys.

    Runs torch ops in this process with one thread, so no OpenMP pool is created here (workers
    forked from this process later stay safe).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.load(a_path, weights_only=True)
        b = torch.load(b_path, weights_only=True)
        if a.keys() != b.keys():
            raise ShoalError(
                f"weights of {a_path} and {b_path} have different keys",
                "this is a bug in shoal bench overhead; please report it",
            )
        return max(((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel()), default=0.0)
    finally:
        torch.set_num_threads(threads)


def run_overhead(cfg: OverheadConfig, *, log: Callable[[str], None] = print, argv=None) -> dict[str, Any]:
    """Run the benchmark; return the report (see :func:`format_overhead`)."""
    from shoal.env.host import usable_cores

    variants = [BASELINE] + [v for v in dict.fromkeys(cfg.variants) if v != BASELINE]
    notes = []
    for name in list(variants):
        package = PEERS.get(name)
        if package and importlib.util.find_spec(package) is None:
            variants.remove(name)
            notes.append(f"{name}: skipped, {package} is not installed (pip install 'shoal[bench]')")
    report = rep.new_report(
        "overhead",
        {**asdict(cfg), "variants": variants, "image_size": cfg.side, "samples": cfg.epoch_samples},
        argv=argv,
    )
    report["notes"] += notes
    cores = usable_cores()
    if cfg.nproc * cfg.threads > cores:
        report["notes"].append(f"oversubscribed: {cfg.nproc * cfg.threads} threads on {cores} cores")
    start_method = resolve_start_method(cfg.start_method, "cpu")
    report["config"]["start_method"] = start_method
    if start_method == "fork":
        _preimport(variants)  # once here, inherited by every forked worker: faster launches
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    loads = report["meta"]["load_averages"] = []
    digests: dict[str, list[str]] = {name: [] for name in variants}
    first_weights: dict[str, str] = {}
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(cfg.threads)
    with tempfile.TemporaryDirectory(prefix="shoal-bench-overhead-") as tmp:
        try:
            for index, order in enumerate(rotations(variants, cfg.repeat)):
                for name in order:
                    out = Path(tmp) / f"round{index}-{name}"
                    out.mkdir()
                    job = Job(cfg.model, cfg.side, cfg.batch_size, cfg.epoch_samples, cfg.epochs, cfg.threads, str(out))
                    loads.append(load_average())
                    result = launch_workers(WORKERS[name], (job,), cfg.nproc, start_method)
                    step_s = median(s / result["steps"] for s in result["epoch_s"][cfg.warmup :])
                    runs[name].append({"round": index, "step_s": step_s, "epoch_s": result["epoch_s"]})
                    digests[name].append(result["digest"])
                    if name in first_weights:
                        os.remove(result["weights"])  # the digest is enough; keep one file per variant
                    else:
                        first_weights[name] = result["weights"]
                log(
                    f"  round {index + 1}/{cfg.repeat}: "
                    + ", ".join(f"{name} {runs[name][-1]['step_s'] * 1e3:.2f} ms/step" for name in order)
                )
        finally:
            os.environ.pop("OMP_NUM_THREADS") if saved is None else os.environ.__setitem__("OMP_NUM_THREADS", saved)
        # All launches are done: torch computation in this process is safe from here on.
        report["weights"] = _weights_summary(variants, digests, first_weights)
    report["rows"] = _rows(variants, runs)
    report["notes"] += _verdicts(report)
    if "shoal" in variants and not report["weights"]["shoal"]["identical"]:
        raise ShoalError(
            f"shoal's trainer and the plain DDP loop ended with different weights "
            f"(largest difference {report['weights']['shoal']['max_abs_diff']:.3g})",
            "this is a bug in shoal (its step must match plain DDP bit for bit); please report it",
        )
    return rep.finish_report(report)


def _preimport(variants: list[str]) -> None:
    import torch.nn.parallel
    import torch.utils.data  # noqa: F401

    import shoal.train.trainer
    import shoal.workloads.synthetic  # noqa: F401

    if "accelerate" in variants:
        import accelerate  # noqa: F401
    if "fabric" in variants:
        import lightning.fabric  # noqa: F401


def _rows(variants: list[str], runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    base_by_round = {r["round"]: r["step_s"] for r in runs[BASELINE]}
    base = median(base_by_round.values())
    rows = []
    for name in variants:
        step_s = median(r["step_s"] for r in runs[name])
        ratios = [r["step_s"] / base_by_round[r["round"]] for r in runs[name]]
        rows.append(
            {
                "variant": name,
                "step_ms": step_s * 1e3,
                "step_ms_runs": [r["step_s"] * 1e3 for r in runs[name]],
                "vs_plain": step_s / base,
                "vs_plain_paired": median(ratios),
                "paired_ratios": ratios,
                "paired_min": min(ratios),
                "paired_max": max(ratios),
            }
        )
    return rows


def _weights_summary(
    variants: list[str], digests: dict[str, list[str]], files: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Per variant: bit-identical to plain in every round (by digest), and the largest difference."""
    out = {}
    for name in variants[1:]:
        identical = all(d == b for d, b in zip(digests[name], digests[BASELINE]))
        out[name] = {
            "identical": identical,
            "same_every_round": len(set(digests[name])) == 1,
            "max_abs_diff": 0.0 if identical else largest_difference(files[BASELINE], files[name]),
        }
    return out


def _verdicts(report: dict[str, Any]) -> list[str]:
    by = {r["variant"]: r for r in report["rows"]}
    lines = []
    if "shoal" in by:
        weights = report["weights"]["shoal"]
        same = (
            "bit-identical weights"
            if weights["identical"]
            else f"weights differ by up to {weights['max_abs_diff']:.3g}"
        )
        lines.append(
            f"shoal / plain DDP step time: {by['shoal']['vs_plain_paired']:.3f} (paired median; "
            f"target <= 1.02), {same} in every round"
        )
    for name in ("accelerate", "fabric"):
        if name in by:
            diff = report["weights"][name]["max_abs_diff"]
            lines.append(
                f"{name} / plain: {by[name]['vs_plain_paired']:.3f}; weights vs plain: "
                + ("bit-identical" if report["weights"][name]["identical"] else f"max |diff| {diff:.3g}")
            )
            if "shoal" in by:
                lines.append(f"shoal / {name}: {by['shoal']['vs_plain_paired'] / by[name]['vs_plain_paired']:.3f}")
    return lines


def format_overhead(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        rep.header(report),
        f"{cfg['model']} {cfg['image_size']}x{cfg['image_size']}, batch {cfg['batch_size']}/process, {cfg['nproc']} "
        f"processes x {cfg['threads']} thread(s), {cfg['samples']} samples/epoch, {cfg['epochs']} epochs "
        f"({cfg['warmup']} untimed); {cfg['repeat']} interleaved round(s); paired = median of per-round ratios to plain",
        "",
        rep.table(
            ["variant", "ms/step", "vs plain", "paired", "paired range", "weights vs plain"],
            [
                [
                    r["variant"],
                    f"{r['step_ms']:.2f}",
                    f"{r['vs_plain']:.3f}",
                    f"{r['vs_plain_paired']:.3f}",
                    f"{r['paired_min']:.2f}-{r['paired_max']:.2f}",
                    _weights_cell(report, r["variant"]),
                ]
                for r in report["rows"]
            ],
            align="lrrrrl",
        ),
    ]
    lines += [f"- {note}" for note in report["notes"]]
    return "\n".join(lines)


def _weights_cell(report: dict[str, Any], name: str) -> str:
    if name == BASELINE:
        return "(baseline)"
    w = report["weights"][name]
    return "bit-identical" if w["identical"] else f"max |diff| {w['max_abs_diff']:.2g}"


def plot_overhead(report: dict[str, Any], path) -> tuple[Any, str | None]:
    rows = report["rows"]

    def draw(ax) -> None:
        names = [r["variant"] for r in rows]
        ax.barh(names, [r["step_ms"] for r in rows])
        for i, r in enumerate(rows):
            ax.plot(r["step_ms_runs"], [i] * len(r["step_ms_runs"]), "k.", markersize=4)
        ax.invert_yaxis()
        ax.set_xlabel("ms per training step (bars: median, dots: rounds)")
        ax.set_title(f"overhead, {report['config']['model']}, {report['config']['nproc']} processes")

    return rep.save_plot(path, draw)


def smoke_config(**overrides: Any) -> OverheadConfig:
    return replace(OverheadConfig(**SMOKE), **overrides)

"""``python -m benchmarks.overhead``: what shoal's trainer costs per step against a hand-written DDP loop.

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
* ``accelerate`` and ``fabric`` (when installed: ``pip install -r benchmarks/requirements.txt``): the
  plain loop with Hugging Face Accelerate's ``prepare``/``backward`` or Lightning Fabric's
  ``setup``/``backward``.
* ``horovod``: the plain loop on the bare model with a Horovod script's setup through
  ``shoal.horovod`` (``shoal.horovod.recipe.prepare``: ``hvd.init()``, broadcasts from
  rank 0, ``hvd.DistributedOptimizer`` averaging the gradients with bucketed asynchronous
  all-reduces started during backward): no DDP.

Timing: rank 0's wall time of each epoch's training part (from building the epoch's indices to
the last optimizer step; the job is in lockstep, so it is the job's time), divided by the steps:
mean ms/step per epoch; the first ``warmup`` epochs are not counted; a launch's figure is the
median over its timed epochs. Launches are interleaved and rotated round by round (A B C D, B C D A,
...), and the reported ratio to ``plain`` is the median over rounds of the ratio measured in the
same round (a shared machine's slow spells hit both sides of a pair).

The workers live in :mod:`benchmarks.overhead_workers`; this module plans, launches and reports.

Correctness is part of the result: ``plain`` and ``shoal`` must end with bit-identical weights
(``torch.equal`` on every tensor), checked every round; the report says so, or the run fails.
For accelerate, fabric and horovod the largest absolute weight difference from ``plain`` is reported
(horovod averages as Horovod does, sum then divide, where DDP divides first: float rounding apart).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from benchmarks.overhead_workers import WORKERS, Job
from benchmarks.peers import skip_missing_peers
from shoal.bench import report as rep
from shoal.bench.harness import Benchmark, Log, Measured, launch_workers, paired_ratios, require_at_least
from shoal.bench.timing import load_average, median, rotations
from shoal.env.host import usable_cores
from shoal.errors import ShoalError
from shoal.launch.local import check_start_method, resolve_start_method

VARIANTS = ("plain", "shoal", "accelerate", "fabric", "horovod")
BASELINE = "plain"


@dataclass(frozen=True)
class OverheadConfig:
    """What ``python -m benchmarks.overhead`` measures."""

    model: str = "mlp"
    """mlp (tiny: per-step costs show) or a torchvision ResNet (resnet18 ...)."""
    image_size: int = 0
    """Side of the random 3xSxS inputs; 0: 16 for the MLP, 32 for a ResNet."""
    batch_size: int = 32
    """Samples per process per step."""
    samples: int = 0
    """Training samples (global) per epoch; 0: 64 steps' worth for the MLP, 8 for a ResNet."""
    epochs: int = 6
    """Epochs per launch; the first --warmup are not timed."""
    warmup: int = 1
    """Untimed epochs at the start of each launch."""
    nproc: int = 2
    """Worker processes per launch (the issue's target is stated for 2)."""
    repeat: int = 5
    """Rounds, each launching every variant once, interleaved."""
    threads: int = 1
    """Intra-op threads per process."""
    variants: tuple[str, ...] = VARIANTS
    """Comma-separated subset of plain, shoal, accelerate, fabric, horovod (plain, the baseline, always runs)."""
    start_method: Literal["auto", "fork", "spawn"] = "auto"
    """How the workers start: auto (fork on CPU), fork or spawn."""

    def __post_init__(self) -> None:
        from shoal.workloads.archs import SYNTHETIC

        if self.model not in SYNTHETIC:
            raise ShoalError(f"unknown model {self.model!r}", f"choose --model from: {', '.join(SYNTHETIC)}")
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
                "this is a bug in benchmarks/overhead.py; please report it",
            )
        return max(((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel()), default=0.0)
    finally:
        torch.set_num_threads(threads)


def measure(cfg: OverheadConfig, log: Log) -> Measured:
    """Every variant launched once per round, rotated; ms/step, paired ratios and the weights check."""
    variants, notes = skip_missing_peers([BASELINE] + [v for v in dict.fromkeys(cfg.variants) if v != BASELINE])
    cores = usable_cores()
    if cfg.nproc * cfg.threads > cores:
        notes.append(f"oversubscribed: {cfg.nproc * cfg.threads} threads on {cores} cores")
    start_method = resolve_start_method(cfg.start_method, "cpu")
    if start_method == "fork":
        _preimport(variants)  # once here, inherited by every forked worker: faster launches
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    loads = []
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
        weights = _weights_summary(variants, digests, first_weights)
    rows = _rows(variants, runs)
    if "shoal" in variants and not weights["shoal"]["identical"]:
        raise ShoalError(
            f"shoal's trainer and the plain DDP loop ended with different weights "
            f"(largest difference {weights['shoal']['max_abs_diff']:.3g})",
            "this is a bug in shoal (its step must match plain DDP bit for bit); please report it",
        )
    return Measured(
        rows,
        notes + _verdicts(rows, weights),
        config={
            "variants": variants,
            "image_size": cfg.side,
            "samples": cfg.epoch_samples,
            "start_method": start_method,
        },
        meta={"load_averages": loads},
        extra={"weights": weights},
    )


def _preimport(variants: list[str]) -> None:
    import torch.nn.parallel
    import torch.utils.data  # noqa: F401

    import shoal.train.trainer
    import shoal.workloads.synthetic

    if "accelerate" in variants:
        import accelerate  # noqa: F401
    if "fabric" in variants:
        import lightning.fabric  # noqa: F401
    if "horovod" in variants:
        import shoal.horovod.recipe  # noqa: F401


def _rows(variants: list[str], runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    base_by_round = {r["round"]: r["step_s"] for r in runs[BASELINE]}
    base = median(base_by_round.values())
    rows = []
    for name in variants:
        step_s = median(r["step_s"] for r in runs[name])
        ratios = paired_ratios({r["round"]: r["step_s"] for r in runs[name]}, base_by_round)
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


def _verdicts(rows: list[dict[str, Any]], weights: dict[str, dict[str, Any]]) -> list[str]:
    by = {r["variant"]: r for r in rows}
    lines = []
    if "shoal" in by:
        same = (
            "bit-identical weights"
            if weights["shoal"]["identical"]
            else f"weights differ by up to {weights['shoal']['max_abs_diff']:.3g}"
        )
        lines.append(
            f"shoal / plain DDP step time: {by['shoal']['vs_plain_paired']:.3f} (paired median; "
            f"target <= 1.02), {same} in every round"
        )
    for name in ("accelerate", "fabric", "horovod"):
        if name in by:
            diff = weights[name]["max_abs_diff"]
            lines.append(
                f"{name} / plain: {by[name]['vs_plain_paired']:.3f}; weights vs plain: "
                + ("bit-identical" if weights[name]["identical"] else f"max |diff| {diff:.3g}")
            )
            if "shoal" in by:
                lines.append(f"shoal / {name}: {by['shoal']['vs_plain_paired'] / by[name]['vs_plain_paired']:.3f}")
    return lines


def text(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    return [
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


def _weights_cell(report: dict[str, Any], name: str) -> str:
    if name == BASELINE:
        return "(baseline)"
    w = report["weights"][name]
    return "bit-identical" if w["identical"] else f"max |diff| {w['max_abs_diff']:.2g}"


BENCHMARK = Benchmark(
    name="overhead",
    command="python -m benchmarks.overhead",
    config=OverheadConfig,
    smoke=SMOKE,
    measure=measure,
    text=text,
    draw=rep.runs_chart(
        "step_ms",
        "step_ms_runs",
        "ms per training step (bars: median, dots: rounds)",
        lambda cfg: f"overhead, {cfg['model']}, {cfg['nproc']} processes",
    ),
    description="The same model, data, batches, optimizer and lr schedule run by a plain DDP loop, by shoal train, "
    "(when installed) by Accelerate and Lightning Fabric, and by a Horovod-style loop on shoal.horovod, launches "
    "interleaved; median ms/step and the ratio to the plain loop. The plain loop and shoal must end with "
    "bit-identical weights; the others report their largest weight difference.",
    examples="""\
examples:
  python -m benchmarks.overhead                              # tiny MLP, 2 processes: per-step cost shows
  python -m benchmarks.overhead --model resnet18 --repeat 7  # ResNet-18 32x32
  python -m benchmarks.overhead --variants plain,shoal       # without Accelerate / Fabric / Horovod
  python -m benchmarks.overhead --variants plain,horovod --model resnet18  # shoal.horovod against DDP
  python -m benchmarks.overhead --smoke --json o.json        # seconds; checks the bit-identical weights
""",
)


if __name__ == "__main__":
    from benchmarks import main

    raise SystemExit(main("overhead"))

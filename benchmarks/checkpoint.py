"""``python -m benchmarks.checkpoint``: save and load MB/s of shoal's checkpoint writer against plain ``torch.save``.

A checkpoint is worth something only if a crash at any instant leaves a loadable one on disk. Two
things buy that, and both cost time:

* **durability**: ``os.fsync`` waits until the bytes are on the disk, not only in the page cache
  (a plain ``torch.save`` returns as soon as the kernel has them in memory; a power cut then loses
  them);
* **atomicity**: writing to a temporary file in the same directory and ``os.replace``-ing it over the
  target (then fsyncing the directory) means a crash mid-write leaves the previous file, never half
  a new one.

Four ways to save the SAME state (a torchvision model's state dict and its SGD-momentum optimizer
state, about 2x the parameter bytes; or ``mb:N``: N MB of float32 in ~100 tensors) to the same
disk, interleaved round by round (median of ``--repeat``), each loaded back and checked tensor by
tensor with ``torch.equal``:

* ``torch_save``: ``torch.save(state, path)``, ``torch.load(path, weights_only=True)``: the plain
  baseline, neither durable nor atomic;
* ``torch_save_fsync``: ``torch.save`` to an open file, flush, ``os.fsync``: durable, not atomic; the
  fair baseline for a durable save;
* ``shoal_atomic``: :func:`shoal.checkpoint.storage.atomic_torch_save` (temporary file, fsync,
  ``os.replace``, directory fsync) and :func:`~shoal.checkpoint.storage.torch_load`;
* ``shoal_manager``: a whole :meth:`CheckpointManager.save` (one process, ``keep=1``): the payload with
  RNG states and metadata, the ``latest`` pointer (a second atomic, durable write) and retention
  (deleting the previous checkpoint); then :meth:`CheckpointManager.load_latest`.

Every save starts after an untimed ``os.sync()`` so no variant pays for write-back left by another.
Loads read from the page cache (dropping it needs root): load MB/s is unpickling and copying, not the
disk. MB = 10^6 bytes. The target: shoal's atomic, durable save at least 0.8x plain ``torch.save``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.checkpoint_state import build_state, same, synthetic_bytes, tensors_in, torchvision_models
from shoal.bench import report as rep
from shoal.bench.harness import Benchmark, Log, Measured, flag
from shoal.bench.timing import median, rotations
from shoal.errors import ShoalError

VARIANTS = ("torch_save", "torch_save_fsync", "shoal_atomic", "shoal_manager")
BASELINE, DURABLE_BASELINE = "torch_save", "torch_save_fsync"
TARGET = 0.8
DESCRIPTIONS = {
    "torch_save": "torch.save(state, path) / torch.load(path, weights_only=True)",
    "torch_save_fsync": "torch.save to an open file, flush, os.fsync / torch.load",
    "shoal_atomic": "shoal.checkpoint.storage.atomic_torch_save / torch_load",
    "shoal_manager": "CheckpointManager.save (RNG, latest pointer, retention) / load_latest",
}
DURABLE = {"torch_save": False, "torch_save_fsync": True, "shoal_atomic": True, "shoal_manager": True}
ATOMIC = {"torch_save": False, "torch_save_fsync": False, "shoal_atomic": True, "shoal_manager": True}


@dataclass(frozen=True)
class CheckpointConfig:
    """What ``python -m benchmarks.checkpoint`` measures."""

    model: str = "resnet18"
    """A torchvision model whose state dict and SGD-momentum state are saved, or mb:N for N MB
    (10^6 bytes) of float32 in ~100 tensors."""
    directory: str | None = field(default=None, metadata=flag(name="--dir", metavar="DIR"))
    """Existing directory on the disk to measure (default: the system temp dir); the files go to a
    temporary folder inside it, removed afterwards."""
    repeat: int = 5
    """Timed rounds, every variant once per round, interleaved; the median is reported."""
    warmup: int = 1
    """Untimed rounds first."""

    def __post_init__(self) -> None:
        if self.repeat < 1 or self.warmup < 0:
            raise ShoalError(
                f"--repeat must be at least 1 and --warmup at least 0, got {self.repeat} and {self.warmup}",
                "pass e.g. --repeat 5 --warmup 1",
            )
        if self.model.lower().startswith("mb:"):
            synthetic_bytes(self.model)  # raises on a bad size
        elif self.model not in torchvision_models():
            raise ShoalError(
                f"unknown model {self.model!r}",
                "pass a torchvision model name such as resnet18 or resnet50, or mb:N for N MB of tensors",
            )
        if self.directory is not None and not Path(self.directory).expanduser().is_dir():
            raise ShoalError(
                f"--dir {self.directory} is not an existing directory",
                "create it first, or leave --dir out to use the system temp dir",
            )


SMOKE = dict(model="mb:2", repeat=2, warmup=0)
"""``--smoke``: 2 MB of tensors, two rounds, no warm-up (the machinery, in seconds)."""


def filesystem(path: str | os.PathLike) -> dict[str, Any]:
    """The mount point, device and type of the filesystem holding ``path``, and its free bytes."""
    mount = os.path.realpath(path)
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    device = fstype = "unknown"
    try:
        with open("/proc/self/mounts") as f:
            for line in f:  # the last entry for a mount point is the one in effect
                fields = line.split()
                if len(fields) >= 3 and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]) == mount:
                    device, fstype = fields[0], fields[2]
    except OSError:  # not Linux
        pass
    return {"mount": mount, "device": device, "type": fstype, "free_bytes": shutil.disk_usage(path).free}


def _sync_disks() -> None:
    sync = getattr(os, "sync", None)
    if sync is not None:
        sync()


def measure(cfg: CheckpointConfig, log: Log) -> Measured:
    """Every variant saves and loads the same state, round by round; each load checked."""
    state, objects, described = build_state(cfg.model)
    tensors = list(tensors_in(state))
    state_bytes = sum(t.numel() * t.element_size() for t in tensors)
    parent = Path(cfg.directory).expanduser() if cfg.directory else Path(tempfile.gettempdir())
    fs = filesystem(parent)
    # At most: three plain files, two manager checkpoints (before retention) and a temporary.
    if fs["free_bytes"] < 6 * state_bytes:
        raise ShoalError(
            f"{parent} has {fs['free_bytes'] / 1e6:,.0f} MB free; the benchmark needs about "
            f"{6 * state_bytes / 1e6:,.0f} MB (6 x the {state_bytes / 1e6:,.1f} MB state)",
            "pass --dir on a disk with more room, or a smaller --model (e.g. mb:100)",
        )
    work = Path(tempfile.mkdtemp(prefix="shoal-bench-checkpoint-", dir=parent))
    try:
        runs, nbytes, files = _measure(cfg, state, objects, work, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    config = {
        "path": str(work),
        "filesystem": fs,
        "state": described,
        "state_bytes": state_bytes,
        "tensors": len(tensors),
    }
    rows = []
    for v in VARIANTS:
        save_s, load_s = median(runs[v]["save"]), median(runs[v]["load"])
        rows.append(
            {
                "variant": v,
                "description": DESCRIPTIONS[v],
                "durable": DURABLE[v],
                "atomic": ATOMIC[v],
                "bytes": nbytes[v],
                "save_s": save_s,
                "save_s_runs": runs[v]["save"],
                "save_mbps": nbytes[v] / 1e6 / save_s,
                "load_s": load_s,
                "load_s_runs": runs[v]["load"],
                "load_mbps": nbytes[v] / 1e6 / load_s,
                "verified": True,
            }
        )
    by = {r["variant"]: r for r in rows}
    for r in rows:
        r["vs_torch_save"] = r["save_mbps"] / by[BASELINE]["save_mbps"]
        r["vs_torch_save_fsync"] = r["save_mbps"] / by[DURABLE_BASELINE]["save_mbps"]
    atomic, manager = by["shoal_atomic"], by["shoal_manager"]
    verdict = f"shoal atomic save: {atomic['vs_torch_save']:.2f}x plain torch.save (target >= {TARGET}x)"
    target_met = atomic["vs_torch_save"] >= TARGET
    notes = [
        f"target {'met' if target_met else 'not met'}; against torch.save + fsync (the same durability) "
        f"shoal's atomic save is {atomic['vs_torch_save_fsync']:.2f}x (the cost of the temp file, rename and "
        f"directory fsync), a whole CheckpointManager save {manager['vs_torch_save_fsync']:.2f}x"
    ]
    where = "--dir" if cfg.directory else "the system temp dir (pass --dir to measure another disk)"
    notes.append(
        f"files written in {work} on {fs['device']} ({fs['type']}, mounted at {fs['mount']}), the "
        f"filesystem of {where}: what fsync costs depends entirely on that disk"
    )
    if fs["type"] in ("tmpfs", "ramfs"):
        notes.append(
            f"{fs['mount']} is {fs['type']}, held in memory: fsync costs nothing there and a reboot loses "
            "everything; measure a real disk with --dir"
        )
    notes.append(
        "loads read from the page cache (dropping it needs root): load MB/s is unpickling and copying, not the disk"
    )
    notes.append(
        "each save starts after an untimed os.sync(), so none pays for write-back left by another; plain "
        "torch.save's figure is the speed of writing into the page cache, the disk write happens later"
    )
    notes.append(
        f"shoal_manager: one process (no process group needed), keep=1; its file is "
        f"{manager['bytes'] - by[BASELINE]['bytes']:+,} bytes beside torch_save's (RNG states, metadata), "
        f"plus the 'latest' pointer"
    )
    notes.append("verified: every load of every variant matched the saved state (torch.equal on each tensor)")
    extra = {"verified": True, "files": files, "verdict": verdict, "target_met": target_met}
    return Measured(rows, notes, config=config, extra=extra)


def _measure(
    cfg: CheckpointConfig, state: dict[str, Any], objects: dict[str, Any], work: Path, log: Callable[[str], None]
) -> tuple[dict[str, dict[str, list[float]]], dict[str, int], list[str]]:
    import torch

    from shoal.checkpoint.manager import CheckpointManager
    from shoal.checkpoint.storage import atomic_torch_save, torch_load

    paths = {v: work / f"{v}.pt" for v in VARIANTS[:3]}
    manager = CheckpointManager(work / "manager", every=None, keep=1)
    steps = iter(range(1, 1 << 62))

    def save_fsync() -> Path:
        with open(paths["torch_save_fsync"], "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        return paths["torch_save_fsync"]

    def load_manager() -> Any:
        found = manager.load_latest()
        return found.payload["state"] if found is not None else None

    saves: dict[str, Callable[[], Any]] = {
        "torch_save": lambda: torch.save(state, paths["torch_save"]) or paths["torch_save"],
        "torch_save_fsync": save_fsync,
        "shoal_atomic": lambda: atomic_torch_save(state, paths["shoal_atomic"]),
        "shoal_manager": lambda: manager.save(epoch=0, step=next(steps), objects=objects),
    }
    loads: dict[str, Callable[[], Any]] = {
        "torch_save": lambda: torch.load(paths["torch_save"], weights_only=True),
        "torch_save_fsync": lambda: torch.load(paths["torch_save_fsync"], weights_only=True),
        "shoal_atomic": lambda: torch_load(paths["shoal_atomic"]),
        "shoal_manager": load_manager,
    }
    runs = {v: {"save": [], "load": []} for v in VARIANTS}
    nbytes: dict[str, int] = {}
    rounds = rotations(VARIANTS, cfg.warmup + cfg.repeat)
    for r, order in enumerate(rounds):
        timed = r >= cfg.warmup
        for v in order:
            _sync_disks()
            start = time.perf_counter()
            written = Path(saves[v]())
            saved = time.perf_counter()
            loaded = loads[v]()
            done = time.perf_counter()
            if not same(loaded, state) or manager.warnings:
                raise ShoalError(
                    f"{v}: the checkpoint loaded from {written} differs from the state saved",
                    "the disk or shoal's checkpoint code is broken: report it with this command",
                )
            del loaded
            nbytes[v] = written.stat().st_size
            if timed:
                runs[v]["save"].append(saved - start)
                runs[v]["load"].append(done - saved)
        if timed:
            log(
                f"  round {r + 1}/{len(rounds)}: save MB/s "
                + ", ".join(f"{v} {rep.rate(nbytes[v] / 1e6 / runs[v]['save'][-1])}" for v in VARIANTS)
            )
        else:
            log(f"  round {r + 1}/{len(rounds)}: warm-up done")
    files = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
    return runs, nbytes, files


def text(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    fs = cfg["filesystem"]
    return [
        f"{cfg['state']}: {cfg['state_bytes'] / 1e6:,.1f} MB in {cfg['tensors']} tensors; median of {cfg['repeat']} "
        f"interleaved round(s) after {cfg['warmup']} warm-up round(s); MB = 10^6 bytes",
        f"files in {cfg['path']} on {fs['device']} ({fs['type']}, mounted at {fs['mount']})",
        "",
        rep.table(
            [
                "variant",
                "durable",
                "atomic",
                "file MB",
                "save (s)",
                "save MB/s",
                "vs torch.save",
                "vs +fsync",
                "load (s)",
                "load MB/s",
                "what",
            ],
            [
                [
                    r["variant"],
                    _yes(r["durable"]),
                    _yes(r["atomic"]),
                    f"{r['bytes'] / 1e6:,.1f}",
                    f"{r['save_s']:.3f}",
                    rep.rate(r["save_mbps"]),
                    f"{r['vs_torch_save']:.2f}x",
                    f"{r['vs_torch_save_fsync']:.2f}x",
                    f"{r['load_s']:.3f}",
                    rep.rate(r["load_mbps"]),
                    r["description"],
                ]
                for r in report["rows"]
            ],
            align="lllrrrrrrrl",
        ),
        "",
        report["verdict"],
    ]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def draw(ax: Any, report: dict[str, Any]) -> None:
    rows, cfg = report["rows"], report["config"]
    x = list(range(len(rows)))
    for offset, key, label in ((-0.2, "save_mbps", "save"), (0.2, "load_mbps", "load (page cache)")):
        values = [r[key] for r in rows]
        ax.bar([i + offset for i in x], values, 0.4, label=label)
        for i, v in zip(x, values):
            ax.text(i + offset, v, rep.rate(v), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [r["variant"] for r in rows])
    ax.set_ylabel("MB/s (10^6 bytes/s)")
    ax.set_title(f"checkpoint save/load, {cfg['state_bytes'] / 1e6:,.0f} MB on {cfg['filesystem']['type']}")
    ax.legend()


BENCHMARK = Benchmark(
    name="checkpoint",
    command="python -m benchmarks.checkpoint",
    config=CheckpointConfig,
    smoke=SMOKE,
    measure=measure,
    text=text,
    draw=draw,
    description="Save the same state (a torchvision model + SGD momentum state, or mb:N MB of tensors) four ways to "
    "the same disk: torch.save, torch.save + fsync, shoal's atomic writer (temp file, fsync, rename, directory "
    "fsync) and a whole CheckpointManager save; load each back, check it, report MB/s and the ratio to torch.save "
    "(target: shoal's atomic save >= 0.8x).",
    examples="""\
examples:
  python -m benchmarks.checkpoint                             # resnet18 state, the system temp dir
  python -m benchmarks.checkpoint --dir /data/ckpt            # the disk your checkpoints really go to
  python -m benchmarks.checkpoint --model mb:1000 --repeat 3  # 1 GB of tensors
  python -m benchmarks.checkpoint --smoke --json ckpt.json    # 2 MB, seconds
""",
)


if __name__ == "__main__":
    from benchmarks import main

    raise SystemExit(main("checkpoint"))

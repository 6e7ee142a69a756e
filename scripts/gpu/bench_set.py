"""The GPU check's benchmark set: which commands run, and the figures read back from what they wrote.

Each figure stands against a baseline measured in the same run, by shoal's own benchmarks where one
exists (``shoal bench allreduce``, ``python -m benchmarks.memory``), else by scripts/gpu/resnet_ddp.py, the
plain DDP script under torchrun:

* ``shoal train synthetic`` (ResNet-50, bf16, channels-last) samples/s vs the plain DDP script's;
* step time with ``shoal.init`` + ``ctx.wrap`` vs plain DDP (the same loop and DataLoader);
* share of step time waiting on data: ``ctx.loader`` vs ``DataLoader(pin_memory=True)``;
* nccl all-reduce algbw and busbw per message size vs a device-to-device copy of the same size;
* FSDP2 bf16 per-rank training state and peak GPU memory vs DDP (TinyGPT large, the largest
  ``language`` preset), and how many parameters would fit at the measured bytes per parameter.

With one GPU every world size is 1 (NCCL refuses two ranks on one device), which the figures say; a
probe (scripts/gpu/nccl_shared_gpu.py) asks this machine's NCCL again and notes its answer.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

from steps import ROOT, Step

PY = sys.executable
RESNET_DDP = ROOT / "scripts" / "gpu" / "resnet_ddp.py"
SHARED_GPU = ROOT / "scripts" / "gpu" / "nccl_shared_gpu.py"
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
ROUNDS = {"cuda": 2, "cpu": 1}
"""Launches of each resnet_ddp.py mode, interleaved (plain, library, loader, plain, ...)."""
MODES = ("plain", "library", "loader")
SIZES = {
    "cuda": {
        "arch": "resnet50",
        "image": 224,
        "batch": 64,
        "train_samples": 4096,
        "epochs": 3,
        "ddp": ["--samples", "1024", "--warmup", "10", "--steps", "30", "--amp", "bf16"],
        "allreduce": ["--min-bytes", "64K", "--max-bytes", "1G", "--factor", "4"],
        "memory": ["--model", "large", "--batch-size", "8"],
    },
    "cpu": {  # --rehearse: the pipeline in seconds, on any machine
        "arch": "resnet18",
        "image": 16,
        "batch": 8,
        "train_samples": 64,
        "epochs": 2,
        "ddp": ["--samples", "32", "--warmup", "1", "--steps", "2", "--amp", "off"],
        "allreduce": ["--smoke"],
        "memory": ["--smoke"],
    },
}


def steps(device: str, out: Path, nproc: int) -> list[Step]:
    """The benchmark commands, in order, for ``nproc`` GPUs (or CPU processes when rehearsing)."""
    size = SIZES[device]
    n = str(nproc)
    shoal = [PY, "-m", "shoal"]
    train = [
        *shoal,
        "train",
        "synthetic",
        "--device",
        device,
        "--arch",
        size["arch"],
        "--image-size",
        str(size["image"]),
    ]
    train += ["--batch-size", str(size["batch"]), "--samples", str(size["train_samples"] * nproc)]
    train += ["--epochs", str(size["epochs"]), "--eval-samples", str(size["batch"]), "--no-progress"]
    train += ["--amp", "bf16" if device == "cuda" else "off", "--nproc", n, "--out", str(out / "train")]
    plan = [Step("train", train, 240, f"shoal train synthetic {size['arch']} on {n} {device} process(es)")]
    for round_ in range(1, ROUNDS[device] + 1):
        for mode in MODES:
            cmd = [*TORCHRUN, n, str(RESNET_DDP)]
            cmd += ["--mode", mode, "--device", device, "--arch", size["arch"], "--image-size", str(size["image"])]
            cmd += ["--batch-size", str(size["batch"]), *size["ddp"], "--json", str(out / f"ddp-{mode}-{round_}.json")]
            plan.append(Step(f"ddp-{mode}-{round_}", cmd, 120, f"resnet_ddp.py --mode {mode}", needs=(RESNET_DDP,)))
    allreduce = [*shoal, "bench", "allreduce", "--device", device, "--nproc", n if device == "cuda" else "2"]
    plan.append(
        Step(
            "allreduce",
            [*allreduce, *size["allreduce"], "--json", str(out / "allreduce.json")],
            120,
            "nccl all-reduce vs copy",
        )
    )
    memory = [PY, "-m", "benchmarks.memory", "--device", device, "--world-sizes", n, *size["memory"]]
    memory += ["--amp", "bf16" if device == "cuda" else "off", "--json", str(out / "memory.json")]
    plan.append(Step("memory", memory, 120, "FSDP2 vs DDP per-rank memory"))
    if device == "cuda" and nproc == 1:
        probe = [*TORCHRUN, "2", str(SHARED_GPU), "--json", str(out / "nccl-shared-gpu.json")]
        what = "a probe: does NCCL take two ranks on one GPU? (a finding, not a failure)"
        plan.append(Step("nccl-shared-gpu", probe, 90, what, needs=(SHARED_GPU,), required=False))
    return plan


def prepare(out: Path) -> None:
    """A fresh output: shoal train's run would otherwise be resumed, and a file left by an earlier try
    (a JSON figure, the tests' XML) must not stand in for one this try did not write."""
    shutil.rmtree(out / "train", ignore_errors=True)
    for old in [*out.glob("*.json"), *out.glob("*.xml")]:
        old.unlink()


def figures(results: dict[str, dict], out: Path, machine: dict) -> tuple[list[dict], list[str]]:
    """The figures from the files the steps wrote (a step that failed leaves its figures out, noted)."""
    found, notes = [], []
    readers = (("train", _train), ("ddp", _ddp), ("allreduce", _allreduce), ("memory", _memory))
    if "nccl-shared-gpu" in results:
        readers += (("nccl-shared-gpu", _shared_gpu),)
    for name, reader in readers:
        try:
            got, more = reader(results, out, machine)
        except (OSError, KeyError, ValueError, IndexError, statistics.StatisticsError) as error:
            notes.append(f"{name}: no figures ({type(error).__name__}: {error})")
            continue
        found += got
        notes += more
    return found, notes


def _figure(name, value, baseline, baseline_name, unit, command, baseline_command, ratio=None) -> dict:
    ratio = ratio if ratio is not None else (value / baseline if baseline else float("nan"))
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_name": baseline_name,
        "ratio": ratio,
        "command": command,
        "baseline_command": baseline_command,
    }


def _runs(results: dict[str, dict], out: Path, mode: str) -> dict[int, dict]:
    """Each round's result of one resnet_ddp.py mode, by round (rounds whose step failed left out)."""
    runs = {}
    for path in sorted(out.glob(f"ddp-{mode}-*.json")):
        round_ = int(path.stem.rsplit("-", 1)[1])
        if results.get(path.stem, {}).get("status") == "ok":
            runs[round_] = json.loads(path.read_text())
    if not runs:
        raise ValueError(f"no successful run of resnet_ddp.py --mode {mode}")
    return runs


def _paired(a: dict[int, dict], b: dict[int, dict], key: str) -> float:
    """The median over rounds of a[round][key] / b[round][key] (pairs saw the same spell of the machine)."""
    return statistics.median(a[r][key] / b[r][key] for r in a if r in b and b[r][key])


def _median(runs: dict[int, dict], key: str) -> float:
    return statistics.median(r[key] for r in runs.values())


def _train(results, out, machine):
    records = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = records[-1]
    plain = _runs(results, out, "plain")
    figure = _figure(
        f"{plain[min(plain)]['arch']} training throughput, shoal train (last epoch) vs plain DDP",
        last["samples_per_s"],
        _median(plain, "samples_per_s"),
        "plain DDP script",
        "samples/s",
        results["train"]["command"],
        results["ddp-plain-1"]["command"],
    )
    return [figure], [
        f"shoal train: {len(records)} epochs, world size {last['world_size']}, figure from epoch {last['epoch']}"
    ]


COMPARED = (
    ("step time, shoal.init + ctx.wrap vs plain DDP (same loop, same DataLoader)", "step_ms", "ms",
     "library", "plain", "init_process_group + DDP"),
    ("share of step time waiting on data, ctx.loader vs DataLoader(pin_memory=True)", "data_wait_share",
     "of step time", "loader", "library", "torch DataLoader"),
)  # fmt: skip
"""resnet_ddp.py's figures: (name, key, unit, mode, baseline mode, the baseline's name)."""


def _ddp(results, out, machine):
    runs = {mode: _runs(results, out, mode) for mode in MODES}
    figures = [
        _figure(
            name,
            _median(runs[mode], key),
            _median(runs[base], key),
            base_name,
            unit,
            results[f"ddp-{mode}-1"]["command"],
            results[f"ddp-{base}-1"]["command"],
            ratio=_paired(runs[mode], runs[base], key),
        )
        for name, key, unit, mode, base, base_name in COMPARED
    ]
    plain = runs["plain"]
    world = plain[min(plain)]["world_size"]
    note = f"resnet_ddp.py: {len(plain)} round(s) of each mode, world size {world}"
    if world == 1:
        note += " (one process: ctx.wrap adds no DDP wrapper, the plain script does, as the tutorials do)"
    return figures, [note]


def _allreduce(results, out, machine):
    report = json.loads((out / "allreduce.json").read_text())
    cfg, command = report["config"], results["allreduce"]["command"]
    figures = [
        _figure(
            f"{cfg['backend']} all-reduce algbw at {_size(r['bytes'])} (busbw {r['busbw_gbps']:.1f} GB/s, {cfg['nproc']} rank(s))",
            r["algbw_gbps"],
            r["memcpy_gbps"],
            "device copy",
            "GB/s",
            command,
            command + " (its memcpy column)",
            ratio=r["algbw_vs_memcpy"],
        )
        for r in report["rows"]
    ]
    notes = []
    if cfg["nproc"] == 1:
        notes.append("all-reduce over 1 rank: NCCL's kernel within one GPU, no link crossed (busbw 0 by definition)")
    return figures, notes


def _memory(results, out, machine):
    report = json.loads((out / "memory.json").read_text())
    command = results["memory"]["command"]
    rows = {(r["world_size"], r["strategy"]): r for r in report["rows"]}
    figures, notes = [], []
    for world in sorted({w for w, _ in rows}):
        ddp, fsdp = rows[(world, "ddp")], rows[(world, "fsdp")]
        for key, what in (
            ("state_bytes", "training state (params + grads + Adam)"),
            ("peak_device_bytes", "peak GPU memory"),
        ):
            if not ddp.get(key):
                continue
            figures.append(
                _figure(
                    f"FSDP2 per-rank {what} vs DDP, {report['config']['model']} TinyGPT, {world} rank(s), amp {report['config'].get('amp', 'off')}",
                    fsdp[key] / 2**20,
                    ddp[key] / 2**20,
                    "DDP",
                    "MB",
                    command + " (fsdp rows)",
                    command + " (ddp rows)",
                )
            )
    n_params = report["config"]["n_params"]
    peak = min(r["peak_device_bytes"] for r in report["rows"]) or None
    memory_gib = machine.get("memory_gib")
    notes.append(f"largest language preset trained: {report['config']['model']} ({n_params:,} parameters)")
    if peak and memory_gib:
        fits = memory_gib * 2**30 / (peak / n_params)
        notes.append(
            f"projection, not a measurement: at the measured {peak / n_params:.1f} peak bytes per parameter, "
            f"about {fits / 1e9:.2f} B parameters would fit one GPU of {memory_gib} GiB (activations grow with batch and length)"
        )
    return figures, notes


def _shared_gpu(results, out, machine):
    step = results["nccl-shared-gpu"]
    path = out / "nccl-shared-gpu.json"
    if step["status"] != "ok" or not path.is_file():
        return [], [f"NCCL with two ranks on one GPU: no answer ({step['status']}; logs/nccl-shared-gpu.log)"]
    seen = json.loads(path.read_text())
    verdict = "accepted" if seen["allowed"] else f"refused ({seen.get('error', '?')})"
    return [], [f"NCCL with two ranks on one GPU: {verdict}"]


def _size(nbytes: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}B"
    return f"{nbytes} B"

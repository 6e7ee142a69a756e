"""``shoal bench scaling|allreduce|overhead|data|startup|checkpoint``: measured numbers, as a table, JSON and a plot.

Each benchmark lives in :mod:`shoal.bench`; this module only parses flags into the benchmark's
config dataclass, runs it and writes the outputs. ``--smoke`` starts from tiny sizes (seconds; the
numbers mean nothing) and any flag given explicitly still wins. Progress goes to stderr, the table
to stdout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.errors import ShoalError

EXAMPLES = """\
examples:
  shoal bench scaling                          # ResNet-18 32x32 on 1..cores processes, with controls
  shoal bench allreduce --nproc 2              # 4 KB .. 256 MB all-reduce vs memcpy
  shoal bench overhead                         # shoal's trainer vs a hand-written DDP loop (and peers)
  shoal bench data --data ~/data               # shoal's loader vs the tutorials' MNIST pipeline
  shoal bench startup                          # time to the first step vs torchrun
  shoal bench checkpoint                       # atomic, durable save/load MB/s vs torch.save
  shoal bench scaling --smoke --json out.json  # seconds; also writes out.png when matplotlib is installed
"""

SCALING_EXAMPLES = """\
examples:
  shoal bench scaling                                   # 1..cores processes x 1 thread, ResNet-18 32x32, batch 32
  shoal bench scaling --world-sizes 1,2 --repeat 5      # more repeats on a noisy machine
  shoal bench scaling --comm-hook bf16                  # also measure bf16 gradient compression
  shoal bench scaling --arch resnet50 --image-size 64 --batch-size 16
  shoal bench scaling --device cuda --world-sizes 1,2,4,8 --json scaling.json   # GPUs, nccl
  shoal bench scaling --smoke --json /tmp/s.json        # a few seconds: checks the machinery only
"""

ALLREDUCE_EXAMPLES = """\
examples:
  shoal bench allreduce                                 # cores processes, 4 KB .. 256 MB (x4)
  shoal bench allreduce --nproc 4 --min-bytes 1M --max-bytes 1G --factor 2
  shoal bench allreduce --dtype bfloat16 --json ar.json # also writes ar.png
  shoal bench allreduce --device cuda                   # one process per GPU, nccl
  shoal bench allreduce --smoke                         # 3 sizes, seconds
"""

DATA_EXAMPLES = """\
examples:
  shoal bench data                                      # random images in MNIST's files (no download)
  shoal bench data --data ~/data                        # real MNIST in ~/data/MNIST/raw
  shoal bench data --batch-size 128 --samples 20000 --repeat 5
  shoal bench data --num-workers 2                      # give the per-sample pipeline worker processes
  shoal bench data --smoke --json data.json
"""

OVERHEAD_EXAMPLES = """\
examples:
  shoal bench overhead                                  # tiny MLP, 2 processes: per-step cost shows
  shoal bench overhead --model resnet18 --repeat 7      # ResNet-18 32x32
  shoal bench overhead --variants plain,shoal           # without Accelerate / Fabric
  shoal bench overhead --smoke --json o.json            # seconds; checks the bit-identical weights
"""

CHECKPOINT_EXAMPLES = """\
examples:
  shoal bench checkpoint                                # resnet18 state, the system temp dir
  shoal bench checkpoint --dir /data/ckpt               # the disk your checkpoints really go to
  shoal bench checkpoint --model mb:1000 --repeat 3     # 1 GB of tensors
  shoal bench checkpoint --smoke --json ckpt.json       # 2 MB, seconds
"""

STARTUP_EXAMPLES = """\
examples:
  shoal bench startup                                   # every variant, median of 5 interleaved rounds
  shoal bench startup --variants torchrun,shoal_run,launch_spawn,launch_fork --repeat 9
  shoal bench startup --nproc 4 --json startup.json
  shoal bench startup --smoke                           # torchrun and shoal run once, 1 worker
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmarks: scaling, allreduce, overhead, data, startup, checkpoint (tables, JSON, plots)",
        description="Measure how fast a job runs, how well it scales over processes and why not better. "
        "Every figure is measured in the same run as its baseline.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=lambda args: _help(parser))
    benches = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")

    p = _sub(
        benches,
        "scaling",
        "throughput, speedup and efficiency over 1..N processes (ResNet, random data)",
        "Train a torchvision ResNet (or an MLP) on random images with 1..N processes "
        "started by shoal's launcher; report global samples/s, speedup, scaling efficiency and the time "
        "saved on fixed work, with a no-all-reduce control and (CPU) 1 process with N x threads.",
        SCALING_EXAMPLES,
    )
    p.add_argument("--world-sizes", type=_int_list, help="comma-separated process counts (default 1..cores)")
    p.add_argument("--arch", help="resnet18 (default) ... resnet152, or mlp")
    p.add_argument("--image-size", type=int, help="side of the random images (default 32)")
    p.add_argument("--batch-size", type=int, help="samples per process per step (default 32)")
    p.add_argument("--steps", type=int, help="timed steps per variant (default 20)")
    p.add_argument("--warmup", type=int, help="untimed steps of each variant first (default 3)")
    p.add_argument("--blocks", type=int, help="timed steps run in this many blocks, variants taking turns (default 4)")
    p.add_argument("--repeat", type=int, help="launches per world size, interleaved; median reported (default 3)")
    p.add_argument("--threads", type=int, help="intra-op threads per process on CPU (default 1)")
    p.add_argument("--comm-hook", help="also measure DDP with gradient compression: none (default), bf16, fp16")
    p.add_argument("--device", help="auto (default), cpu or cuda")
    p.add_argument("--start-method", help="auto (default: fork on CPU, spawn with CUDA), fork or spawn")
    p.add_argument(
        "--no-controls",
        dest="controls",
        action="store_false",
        default=None,
        help="skip the no-all-reduce control and the equal-threads process",
    )
    p.set_defaults(func=_runner("scaling"))

    p = _sub(
        benches,
        "allreduce",
        "all-reduce latency, algbw and busbw vs memcpy across N processes",
        "Time torch.distributed.all_reduce of 4 KB .. 256 MB across N processes (gloo on CPU, nccl on "
        "GPU); algbw = bytes/time, busbw = algbw x 2(n-1)/n (nccl-tests), beside one process's "
        "dst.copy_(src) of the same size measured in the same run.",
        ALLREDUCE_EXAMPLES,
    )
    p.add_argument("--nproc", type=int, help="processes (default: cores, or GPUs)")
    p.add_argument("--min-bytes", type=_bytes, help="smallest message, e.g. 4K (default)")
    p.add_argument("--max-bytes", type=_bytes, help="largest message, e.g. 256M (default)")
    p.add_argument("--factor", type=int, help="size multiplier between steps (default 4)")
    p.add_argument("--dtype", help="float32 (default), bfloat16, float16")
    p.add_argument("--target-time", type=float, help="seconds of timed operations per size (default 0.25)")
    p.add_argument("--threads", type=int, help="intra-op threads per process (default cores / processes)")
    p.add_argument("--device", help="auto (default), cpu or cuda")
    p.add_argument("--start-method", help="auto (default: fork on CPU, spawn with CUDA), fork or spawn")
    p.set_defaults(func=_runner("allreduce"))

    p = _sub(
        benches,
        "overhead",
        "shoal's trainer vs a hand-written DDP loop, Accelerate and Fabric: ms/step",
        "The same model, data, batches, optimizer and lr schedule run by a plain DDP loop, by shoal train, "
        "and (when installed) by Accelerate and Lightning Fabric, launches interleaved; median ms/step and "
        "the ratio to the plain loop. The plain loop and shoal must end with bit-identical weights.",
        OVERHEAD_EXAMPLES,
    )
    p.add_argument("--model", help="mlp (default: tiny, per-step costs show) or a torchvision ResNet (resnet18 ...)")
    p.add_argument(
        "--image-size", type=int, help="side of the random 3xSxS inputs (default 16 for mlp, 32 for ResNets)"
    )
    p.add_argument("--batch-size", type=int, help="samples per process per step (default 32)")
    p.add_argument("--samples", type=int, help="training samples per epoch (default: 64 steps' worth, 8 for ResNets)")
    p.add_argument("--epochs", type=int, help="epochs per launch (default 6)")
    p.add_argument("--warmup", type=int, help="untimed epochs at the start of each launch (default 1)")
    p.add_argument("--nproc", type=int, help="worker processes (default 2)")
    p.add_argument("--repeat", type=int, help="rounds, each launching every variant once, interleaved (default 5)")
    p.add_argument("--threads", type=int, help="intra-op threads per process (default 1)")
    p.add_argument("--variants", type=_name_list, help="comma-separated subset of plain,shoal,accelerate,fabric")
    p.add_argument("--start-method", help="auto (default: fork on CPU), fork or spawn")
    p.set_defaults(func=_runner("overhead"))

    p = _sub(
        benches,
        "data",
        "samples/s of shoal's loader vs the tutorials' per-sample MNIST pipeline",
        "Shuffled MNIST batches three ways in one process: shoal's in-memory loader, torchvision's "
        "MNIST with ToTensor/Normalize through a DataLoader (the tutorials' pipeline), and raw "
        "X[perm[i:i+B]] slicing (the ceiling).",
        DATA_EXAMPLES,
    )
    p.add_argument("--data", help="real MNIST root (DIR/MNIST/raw); default: random images in MNIST's format")
    p.add_argument("--batch-size", type=int, help="samples per batch (default 64)")
    p.add_argument("--samples", type=int, help="samples per timed pass (default 60000: one epoch)")
    p.add_argument("--repeat", type=int, help="timed passes per loader, interleaved (default 3)")
    p.add_argument("--num-workers", type=int, help="DataLoader workers for the per-sample pipeline (default 0)")
    p.add_argument("--threads", type=int, help="torch threads (default 1; 0: torch's choice, all cores)")
    p.set_defaults(func=_runner("data"))

    p = _sub(
        benches,
        "startup",
        "time from the command to the first step on every rank, vs torchrun",
        "Start N workers that finish one DDP training step, through torchrun, shoal run, shoal's launch_local "
        "(spawn and fork), shoal train, accelerate and Lightning Fabric (when installed); report the "
        "median seconds to the first step and the ratio to torchrun.",
        STARTUP_EXAMPLES,
    )
    p.add_argument("--nproc", type=int, help="workers (default 2)")
    p.add_argument("--repeat", type=int, help="timed rounds, interleaved (default 5)")
    p.add_argument("--warmup", type=int, help="untimed rounds first (default 1)")
    p.add_argument("--variants", type=_name_list, help="comma-separated; default: all (see the list above)")
    p.set_defaults(func=_runner("startup"))

    p = _sub(
        benches,
        "checkpoint",
        "save/load MB/s of shoal's atomic, durable checkpoint writer vs plain torch.save",
        "Save the same state (a torchvision model + SGD momentum state, or mb:N MB of tensors) four ways to "
        "the same disk: torch.save, torch.save + fsync, shoal's atomic writer (temp file, fsync, rename, "
        "directory fsync) and a whole CheckpointManager save; load each back, check it, report MB/s and the "
        "ratio to torch.save (target: shoal's atomic save >= 0.8x).",
        CHECKPOINT_EXAMPLES,
    )
    p.add_argument(
        "--model",
        help="torchvision model whose state + SGD momentum is saved (default resnet18), "
        "or mb:N for N MB (10^6 bytes) of float32 tensors",
    )
    p.add_argument(
        "--dir",
        dest="directory",
        metavar="DIR",
        help="existing directory on the disk to measure (default: the system temp dir); "
        "files go to a temporary folder inside it, removed afterwards",
    )
    p.add_argument("--repeat", type=int, help="timed rounds, interleaved; median reported (default 5)")
    p.add_argument("--warmup", type=int, help="untimed rounds first (default 1)")
    p.set_defaults(func=_runner("checkpoint"))


def _sub(benches, name: str, help_text: str, description: str, examples: str) -> argparse.ArgumentParser:
    p = benches.add_parser(
        name,
        help=help_text,
        description=description,
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes: runs in seconds, the numbers mean nothing")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON (and a PNG plot beside it)")
    p.add_argument("--plot", metavar="PATH", help="write the plot here (PNG; needs matplotlib)")
    return p


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


# name: (module, config class, run, format, plot, {flag dest: config field})
_BENCHES: dict[str, tuple[str, str, str, str, str, dict[str, str]]] = {
    "scaling": (
        "shoal.bench.scaling",
        "ScalingConfig",
        "run_scaling",
        "format_scaling",
        "plot_scaling",
        {
            "world_sizes": "world_sizes",
            "arch": "arch",
            "image_size": "image_size",
            "batch_size": "batch_size",
            "steps": "steps",
            "warmup": "warmup",
            "blocks": "blocks",
            "repeat": "repeat",
            "threads": "threads",
            "comm_hook": "comm_hook",
            "device": "device",
            "start_method": "start_method",
            "controls": "controls",
        },
    ),
    "allreduce": (
        "shoal.bench.allreduce",
        "AllreduceConfig",
        "run_allreduce",
        "format_allreduce",
        "plot_allreduce",
        {
            "nproc": "nproc",
            "min_bytes": "min_bytes",
            "max_bytes": "max_bytes",
            "factor": "factor",
            "dtype": "dtype",
            "target_time": "target_time",
            "threads": "threads",
            "device": "device",
            "start_method": "start_method",
        },
    ),
    "data": (
        "shoal.bench.data",
        "DataConfig",
        "run_data",
        "format_data",
        "plot_data",
        {
            "data": "data",
            "batch_size": "batch_size",
            "samples": "samples",
            "repeat": "repeat",
            "num_workers": "num_workers",
            "threads": "threads",
        },
    ),
    "overhead": (
        "shoal.bench.overhead",
        "OverheadConfig",
        "run_overhead",
        "format_overhead",
        "plot_overhead",
        {
            "model": "model",
            "image_size": "image_size",
            "batch_size": "batch_size",
            "samples": "samples",
            "epochs": "epochs",
            "warmup": "warmup",
            "nproc": "nproc",
            "repeat": "repeat",
            "threads": "threads",
            "variants": "variants",
            "start_method": "start_method",
        },
    ),
    "checkpoint": (
        "shoal.bench.checkpoint",
        "CheckpointConfig",
        "run_checkpoint",
        "format_checkpoint",
        "plot_checkpoint",
        {"model": "model", "directory": "directory", "repeat": "repeat", "warmup": "warmup"},
    ),
    "startup": (
        "shoal.bench.startup",
        "StartupConfig",
        "run_startup",
        "format_startup",
        "plot_startup",
        {"nproc": "nproc", "repeat": "repeat", "warmup": "warmup", "variants": "variants"},
    ),
}


def _runner(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        return run_benchmark(name, args)

    return run


def run_benchmark(name: str, args: argparse.Namespace) -> int:
    import importlib

    module_name, config_name, run_name, format_name, plot_name, fields = _BENCHES[name]
    module = importlib.import_module(module_name)
    given = {field: getattr(args, dest) for dest, field in fields.items() if getattr(args, dest, None) is not None}
    try:
        cfg = module.smoke_config(**given) if args.smoke else getattr(module, config_name)(**given)
    except TypeError as err:  # pragma: no cover - a flag/field mismatch is a bug, not user input
        raise ShoalError(f"bad options for shoal bench {name}: {err}") from None
    log = _stderr
    log(f"shoal bench {name}{' (smoke: tiny sizes, the numbers mean nothing)' if args.smoke else ''}")
    report: dict[str, Any] = getattr(module, run_name)(cfg, log=log, argv=["shoal", *sys.argv[1:]])
    report["config"]["smoke"] = bool(args.smoke)
    plot_path = args.plot or (str(Path(args.json).with_suffix(".png")) if args.json else None)
    if plot_path:
        written, note = getattr(module, plot_name)(report, plot_path)
        report["plot"] = str(written) if written else None
        if note:
            report["notes"].append(note)
    print(getattr(module, format_name)(report), flush=True)
    if args.json:
        from shoal.bench.report import write_json

        path = write_json(args.json, report)
        log(f"wrote {path}" + (f" and {report['plot']}" if report.get("plot") else ""))
    elif report.get("plot"):
        log(f"wrote {report['plot']}")
    return 0


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,2,4, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number, e.g. 1,2")
    return values


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}


def _bytes(text: str) -> int:
    """'4K' -> 4096, '256M' -> 268435456, '1G', '4096' (binary units, as nccl-tests)."""
    raw = text.strip().upper()
    number = raw.rstrip("KMGB")
    unit = raw[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"expected a size such as 4096, 4K, 256M or 1G, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, got {text!r}")
    return int(value)

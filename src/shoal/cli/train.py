"""``shoal train [WORKLOAD]``: train a workload (bundled, or your own) on 1..N processes, here or
under a launcher.

The flags are generated from :class:`~shoal.train.config.TrainConfig` (what the run computes) and
:class:`~shoal.launch.options.LaunchOptions` (how many processes, how nodes meet): one field, one
flag, its docstring the help. In a Kubeflow pod the operator's ``PET_*`` variables give the launch
options' defaults (:mod:`shoal.env.operator`).
"""

from __future__ import annotations

import argparse
import os

from shoal.cli.fields import add_fields, given_fields
from shoal.cli.parser import HelpFormatter
from shoal.errors import ShoalError

EXAMPLES = """\
examples:
  shoal train                                  # digits, one process
  shoal train digits --nproc 2 --device cpu    # 2 local workers (gloo)
  shoal train mnist --data ~/data --nproc 2    # MNIST from ~/data/MNIST/raw
  shoal train mnist --data ~/data --download   # fetch MNIST first (needs internet)
  shoal train cifar10 --data ~/data --amp bf16 --lr-scaling linear
  shoal train synthetic --arch resnet50 --image-size 64 --samples 512
  shoal train my_model.py:MyWorkload --nproc 2 # your own shoal.Workload (docs/WORKLOADS.md)
  shoal train mypkg.workloads:MyWorkload --data ~/data
  torchrun --nproc-per-node 4 -m shoal train digits   # under any launcher: no --nproc
  srun -n 8 shoal train mnist --data /shared/data     # Slurm, one task per process
  shoal train cifar10 --data ~/data --out runs/c10 --checkpoint-every 500steps --keep 2
  shoal train cifar10 --data ~/data --out runs/c10    # again: resumes from the newest checkpoint
  shoal train digits --nproc 2 --max-restarts 3       # a crashed worker: restart, resume, go on
  shoal train digits --nproc 2 --fault-tolerance      # 2 replica groups (torchft): a lost one costs a step
  shoal train synthetic --nproc 2 --comm-hook bf16    # gradients all-reduced in bfloat16
  # two nodes (static rendezvous; run on each node with its own --node-rank), see docs/MULTINODE.md:
  shoal train mnist --data /shared --out /shared/m --nproc 4 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1
"""

_LAUNCH_HERE = ("nproc", "start_method", "max_restarts", "verbose")
_ACROSS_NODES = ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id")
_ACROSS_NODES += ("join_timeout", "local_addr")
_CHECKPOINTS = ("checkpoint_every", "checkpoint_dir", "keep", "resume", "preempt_grace", "async_checkpoint")
_WATCHDOG = ("hang_timeout", "on_hang")


def register(subparsers: argparse._SubParsersAction) -> None:
    from shoal.launch.options import LaunchOptions
    from shoal.train.config import TrainConfig
    from shoal.workloads import WORKLOADS

    p = subparsers.add_parser(
        "train",
        help=f"train a workload ({', '.join(WORKLOADS)}, or your own)",
        description="Train a bundled workload or your own shoal.Workload on one process, N local processes "
        "(--nproc), or as one rank of a job started by torchrun, srun, mpirun or Kubernetes.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "workload",
        nargs="?",
        default="digits",
        metavar="WORKLOAD",
        help=f"one of: {', '.join(WORKLOADS)} (default: digits), or your own shoal.Workload as "
        "pkg.module:Name or path/to/file.py:Name (a class, an instance or a zero-argument factory)",
    )
    training = add_fields(p, TrainConfig, exclude=("workload", *_CHECKPOINTS))
    training += add_fields(p.add_argument_group("checkpoints and resume"), TrainConfig, only=_CHECKPOINTS)
    here = add_fields(p.add_argument_group("workers on this node"), LaunchOptions, only=_LAUNCH_HERE)
    nodes = p.add_argument_group(
        "across nodes",
        "Run the same command on every node (each with its own --node-rank for a static rendezvous); "
        "see docs/MULTINODE.md.",
    )
    here += add_fields(nodes, LaunchOptions, only=_ACROSS_NODES)
    watchdog = p.add_argument_group("hangs and stragglers", "See docs/WATCHDOG.md.")
    here += add_fields(watchdog, LaunchOptions, only=_WATCHDOG)
    p.set_defaults(func=main_args, training_fields=training, launch_fields=here)


def _gpu_device_files() -> bool:
    """Whether this machine has the device files a GPU torch could use (NVIDIA's ``/dev/nvidia0``...,
    AMD's ``/dev/kfd`` for ROCm builds); off Linux, assume so (torch decides)."""
    import glob
    import os
    import sys

    return not sys.platform.startswith("linux") or bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/kfd")


def main_args(args: argparse.Namespace) -> int:
    from shoal.launch.options import LaunchOptions
    from shoal.train.config import TrainConfig, check_resume

    if getattr(args, "fault_tolerance", False):
        # First, before anything can load torch: torch reads its C++ log level once, at import,
        # and the replica groups are forked from this process. The two C++ warnings every group prints are noise to a user: torchft's gloo
        # group calls a deprecated sequence-number setter, and DDP's find_unused_parameters (set on
        # purpose: it keeps buckets from being rebuilt, torchft/ddp.py) finds none.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # The flags, the workload's name and --resume are checked (TrainConfig, LaunchOptions,
    # check_resume) before torch is imported (2-3 s of CPU): bad input fails at once.
    cfg = TrainConfig(workload=args.workload, **given_fields(args, args.training_fields))
    launch = LaunchOptions.from_environment(given_fields(args, args.launch_fields))
    check_resume(cfg.resume)
    if cfg.device == "cuda" and not _gpu_device_files():
        from shoal.distributed.device import NO_CUDA

        raise ShoalError(*NO_CUDA)  # said before torch loads: a machine without GPU device files has none
    from shoal.train.job import run_training

    run_training(cfg, launch)
    return 0

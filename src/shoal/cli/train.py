"""``shoal train [WORKLOAD]``: train a ready workload on 1..N processes, here or under a launcher."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from shoal.errors import ShoalError

EXAMPLES = """\
examples:
  shoal train                                  # digits, one process
  shoal train digits --nproc 2 --device cpu    # 2 local workers (gloo)
  shoal train mnist --data ~/data --nproc 2    # MNIST from ~/data/MNIST/raw
  shoal train mnist --data ~/data --download   # fetch MNIST first (needs internet)
  shoal train cifar10 --data ~/data --amp bf16 --lr-scaling linear
  shoal train synthetic --arch resnet50 --image-size 64 --samples 512
  torchrun --nproc-per-node 4 -m shoal train digits   # under any launcher: no --nproc
  srun -n 8 shoal train mnist --data /shared/data     # Slurm, one task per process
  shoal train cifar10 --data ~/data --out runs/c10 --checkpoint-every 500steps --keep 2
  shoal train cifar10 --data ~/data --out runs/c10    # again: resumes from the newest checkpoint
  shoal train digits --nproc 2 --max-restarts 3       # a crashed worker: restart, resume, go on
  shoal train synthetic --nproc 2 --comm-hook bf16    # gradients all-reduced in bfloat16
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from shoal.workloads import WORKLOADS

    p = subparsers.add_parser(
        "train",
        help="train a ready workload (digits, mnist, cifar10, synthetic)",
        description="Train a ready workload on one process, N local processes (--nproc), or as one "
        "rank of a job started by torchrun, srun, mpirun or Kubernetes.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "workload",
        nargs="?",
        default="digits",
        metavar="WORKLOAD",
        help=f"one of: {', '.join(WORKLOADS)} (default: digits)",
    )
    p.add_argument("--nproc", type=int, default=1, help="local worker processes to start (default 1)")
    p.add_argument("--epochs", type=int, help="passes over the training set (workload default)")
    p.add_argument("--batch-size", type=int, help="samples per process per step (workload default)")
    p.add_argument("--lr", type=float, help="base learning rate (workload default)")
    p.add_argument("--lr-scaling", default="none", help="scale lr by world size: none, linear, sqrt")
    p.add_argument("--optimizer", help="sgd or adamw (workload default)")
    p.add_argument("--weight-decay", type=float, help="weight decay (workload default)")
    p.add_argument("--warmup-epochs", type=float, default=0.0, help="linear lr warm-up, then cosine")
    p.add_argument("--seed", type=int, default=0, help="seed for init, data order, augmentation")
    p.add_argument("--data", help="dataset directory (mnist, cifar10)")
    p.add_argument("--download", action="store_true", help="download the dataset into --data if missing")
    p.add_argument("--out", help="output directory (default runs/<workload>-<timestamp>)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    p.add_argument("--amp", default="off", help="mixed precision: off, bf16, fp16 (fp16: CUDA only)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--arch", default="resnet18", help="synthetic: resnet18 ... resnet152, or mlp")
    p.add_argument("--image-size", type=int, default=32, help="synthetic: input side (default 32)")
    p.add_argument("--samples", type=int, help="synthetic: training samples (default 1024)")
    p.add_argument("--eval-batch-size", type=int, help="per-process evaluation batch (default 4 x batch)")
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run convolutions in channels-last (NHWC) memory format (default: on for conv models; "
        "faster on CPU and GPU)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on rank 0 (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--comm-hook",
        default="none",
        metavar="none|bf16|fp16",
        help="DDP gradient compression: all-reduce the gradients in bf16 or fp16, half the bytes "
        "of float32 (parameters and optimizer stay float32); pays off when communication is "
        "the bottleneck (e.g. a slow network between nodes), costs two casts per bucket "
        "otherwise; measure with `shoal bench scaling --comm-hook bf16` (default none)",
    )
    p.add_argument(
        "--start-method",
        default="auto",
        metavar="auto|fork|spawn",
        help="how --nproc starts the workers: fork (they inherit this process's imports: "
        "seconds sooner) or spawn (fresh interpreters); auto: fork on CPU, spawn with CUDA",
    )
    ck = p.add_argument_group("checkpoints and resume")
    ck.add_argument(
        "--checkpoint-every",
        default="1",
        metavar="N",
        help="checkpoint every N epochs (2, 2epochs) or steps (500steps); 0: only at the end",
    )
    ck.add_argument("--checkpoint-dir", help="where checkpoints go (default OUT/checkpoints)")
    ck.add_argument("--keep", type=int, default=3, help="keep the newest K checkpoints (default 3)")
    ck.add_argument(
        "--resume",
        default="auto",
        metavar="auto|never|PATH",
        help="auto: continue from the newest valid checkpoint in the output directory (default)",
    )
    ck.add_argument(
        "--preempt-grace",
        type=float,
        default=25.0,
        metavar="S",
        help="after SIGTERM/SIGUSR1: checkpoint and exit within S seconds (default 25)",
    )
    ck.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restart the local workers up to K times after a failure; they resume (default 0)",
    )
    from shoal.launch.rendezvous import add_rendezvous_arguments

    add_rendezvous_arguments(p)  # --nnodes, --node-rank, --master-addr, ...: docs/MULTINODE.md
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from shoal.train.config import TrainConfig

    return TrainConfig(
        workload=args.workload,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        lr_scaling=args.lr_scaling,
        optimizer=args.optimizer,
        weight_decay=args.weight_decay,
        warmup_epochs=args.warmup_epochs,
        seed=args.seed,
        data=args.data,
        download=args.download,
        out=args.out,
        device=args.device,
        backend=args.backend,
        amp=args.amp,
        grad_accum=args.grad_accum,
        nproc=args.nproc,
        arch=args.arch,
        image_size=args.image_size,
        samples=args.samples,
        eval_batch_size=args.eval_batch_size,
        progress=args.progress,
        channels_last=args.channels_last,
        checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir,
        keep=args.keep,
        resume=args.resume,
        preempt_grace=args.preempt_grace,
        max_restarts=args.max_restarts,
        start_method=args.start_method,
        comm_hook=args.comm_hook,
    )


def run(args: argparse.Namespace) -> int:
    from shoal.env import detect_environment
    from shoal.train.trainer import resolve_defaults
    from shoal.workloads import get_workload

    cfg = resolve_defaults(config_from_args(args))
    env = detect_environment()
    if env.world_size > 1 and cfg.nproc > 1:
        raise ShoalError(
            f"--nproc {cfg.nproc} given, but this process is already rank {env.rank} of {env.world_size} "
            f"started by {env.scheme}",
            "drop --nproc: the launcher already starts one process per rank",
        )
    if cfg.resume not in ("auto", "never") and not Path(cfg.resume).is_file():
        raise ShoalError(
            f"--resume {cfg.resume}: no such checkpoint file", "pass --resume auto, never, or a ckpt-*.pt file"
        )
    from shoal.launch.rendezvous import options_from_args

    rendezvous = options_from_args(args)  # None: this machine only
    if env.world_size > 1 and rendezvous is not None:
        raise ShoalError(
            f"rendezvous flags given, but {env.scheme} already started this process as "
            f"rank {env.rank} of {env.world_size}",
            "drop --nnodes/--master-addr/--rdzv-*",
        )
    in_process = (cfg.nproc == 1 and rendezvous is None) or env.world_size > 1
    # Data present (or downloaded) before workers start. The workers may be forked from this
    # process: see _fork_safe for why no torch computation here may use intra-op threads.
    with contextlib.nullcontext() if in_process else _fork_safe():
        get_workload(cfg.workload).prepare(cfg)
    if in_process:
        from shoal.train.entry import run_worker

        run_worker(cfg)
        return 0
    return _launch_workers(cfg, rendezvous)


def _launch_workers(cfg, rendezvous=None) -> int:
    from shoal.launch.local import launch_local, resolve_start_method
    from shoal.train.entry import run_local_worker
    from shoal.train.outputs import default_out_dir, prepare_out_dir

    # Check here what would otherwise fail N times over in the workers; the device decides how
    # they start: fork on CPU (they inherit the imported torch: seconds sooner), spawn with CUDA.
    device = _launcher_device(cfg)
    start_method = resolve_start_method(cfg.start_method, device.type)
    cfg.extra["start_method"] = start_method  # announced by rank 0, recorded in config.json
    if cfg.out is None:
        if rendezvous is not None and rendezvous.min_max_nodes[1] > 1:
            # A name made up per attempt would change on every restart, and a restarted group
            # must find the checkpoints of the one before.
            raise ShoalError(
                "a multi-node shoal train needs --out",
                "pass --out DIR on storage every node can see (checkpoints and resume live there)",
            )
        cfg.out = default_out_dir(cfg.workload)
    prepare_out_dir(cfg.out)
    launch_local(
        run_local_worker,
        (cfg,),
        cfg.nproc,
        max_restarts=cfg.max_restarts,
        rendezvous=rendezvous,
        start_method=start_method,
    )
    return 0


# Fork safety of the launching process. Forked workers inherit this process as it is, so before
# launch_local it must not have
# * run a torch operation on more than one intra-op thread: GNU libgomp (torch's OpenMP on Linux)
#   is not fork-safe, and a child whose parent has started its thread pool hangs in its first
#   parallel region (tests/train/test_train_fork.py shows it). What runs here: argument parsing,
#   TrainConfig, resolve_defaults, detect_environment, the rendezvous options, the workload's
#   prepare(), the device check and the output directory: no torch computation, except
#   torchvision's MNIST reader when `shoal train mnist --download` fetches the files (it converts
#   the labels with .long(), a parallel op on 60,000 elements). _fork_safe makes any such op
#   run on this thread alone.
# * initialised CUDA: the CUDA driver does not survive fork. torch.cuda.is_available() calls
#   cudaGetDeviceCount (which runs cuInit) unless PYTORCH_NVML_BASED_CUDA_CHECK=1, with which it
#   counts devices through NVML and leaves the driver alone; _launcher_device sets it for its check
#   (where NVML itself fails, torch falls back to cudaGetDeviceCount). With CUDA the workers are
#   spawned anyway; this matters for CPU runs on a machine with GPUs (--device cpu, or auto with
#   fewer GPUs than --nproc), whose forked workers call torch.cuda.is_available() themselves.


@contextlib.contextmanager
def _fork_safe() -> Iterator[None]:
    """Run torch operations in this block on the calling thread only (no OpenMP thread pool)."""
    import torch

    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)  # what the workers inherit (and then set their own)


def _launcher_device(cfg):
    """``choose_device`` for the workers' device type, without initialising CUDA in this process."""
    import os

    from shoal.distributed.device import choose_device

    name = "PYTORCH_NVML_BASED_CUDA_CHECK"
    if cfg.start_method == "spawn" or name in os.environ:
        return choose_device(cfg.device, 0, cfg.nproc)
    os.environ[name] = "1"
    try:
        return choose_device(cfg.device, 0, cfg.nproc)
    finally:
        os.environ.pop(name, None)

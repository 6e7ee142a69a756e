"""``shoal train [WORKLOAD]``: train a ready workload on 1..N processes, here or under a launcher."""

from __future__ import annotations

import argparse

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
    p.add_argument("workload", nargs="?", default="digits", metavar="WORKLOAD",
                   help=f"one of: {', '.join(WORKLOADS)} (default: digits)")
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
    p.add_argument("--arch", default="resnet18", help="synthetic: resnet18 ... resnet152")
    p.add_argument("--image-size", type=int, default=32, help="synthetic: input side (default 32)")
    p.add_argument("--samples", type=int, help="synthetic: training samples (default 1024)")
    p.add_argument("--eval-batch-size", type=int, help="per-process evaluation batch (default 4 x batch)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on rank 0 (default: when stderr is a terminal)")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from shoal.train.config import TrainConfig

    return TrainConfig(
        workload=args.workload, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        lr_scaling=args.lr_scaling, optimizer=args.optimizer, weight_decay=args.weight_decay,
        warmup_epochs=args.warmup_epochs, seed=args.seed, data=args.data, download=args.download,
        out=args.out, device=args.device, backend=args.backend, amp=args.amp, grad_accum=args.grad_accum,
        nproc=args.nproc, arch=args.arch, image_size=args.image_size, samples=args.samples,
        eval_batch_size=args.eval_batch_size, progress=args.progress,
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
    get_workload(cfg.workload).prepare(cfg)  # data present (or downloaded) before workers start
    if cfg.nproc == 1 or env.world_size > 1:
        from shoal.train.entry import run_worker

        run_worker(cfg)
        return 0
    return _launch_workers(cfg)


def _launch_workers(cfg) -> int:
    from shoal.dist.device import choose_device
    from shoal.launch.local import launch_local
    from shoal.train.entry import run_worker
    from shoal.train.outputs import default_out_dir, prepare_out_dir

    # Check here what would otherwise fail N times over in the workers.
    choose_device(cfg.device, 0, cfg.nproc)
    if cfg.out is None:
        cfg.out = default_out_dir(cfg.workload)
    prepare_out_dir(cfg.out)
    launch_local(run_worker, (cfg,), cfg.nproc)
    return 0

"""``shoal env``: what launcher, rank, world size, address, device and backend shoal sees here.

Detection reads only environment variables; torch is imported inside :func:`run` just to choose
the device and backend, so ``import shoal.cli.env`` stays light.
"""

from __future__ import annotations

import argparse
import json

from shoal.distributed.device import BACKEND_CHOICES, DEVICE_CHOICES
from shoal.env.base import EnvInfo
from shoal.env.detect import detect_environment, scheme_names, torch_env_vars

EXAMPLES = """\
examples:
  shoal env                                   # plain python: local, rank 0 of 1
  shoal env --json                            # the same as one JSON object
  mpirun -np 2 shoal env                      # each rank prints what it sees
  srun -N2 --ntasks-per-node=4 shoal env      # inside a Slurm allocation
  torchrun --nproc-per-node 2 -m shoal env    # under torch's elastic agent
  SHOAL_ENV=slurm shoal env                   # force a scheme; says which variables are missing
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "env",
        help="show the launcher, rank, world size, address, device and backend detected here",
        description=(
            "Detect how this process was launched (torchrun, slurm, openmpi, pmi, kubeflow or local), "
            "show why, and show where it sits in the job. Run it the way you run training."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (machine-readable)")
    parser.add_argument(
        "--device", choices=DEVICE_CHOICES, default="auto", help="device request to resolve (default: auto)"
    )
    parser.add_argument(
        "--backend", choices=BACKEND_CHOICES, default="auto", help="backend request to resolve (default: auto)"
    )
    parser.add_argument(
        "--scheme",
        choices=scheme_names(),
        default=None,
        help="use this launch scheme instead of detecting it (same as SHOAL_ENV)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    info = detect_environment(forced=args.scheme)
    from shoal.distributed.device import choose_backend, choose_device  # imports torch

    device = choose_device(args.device, info.local_rank, info.local_world_size)
    backend = choose_backend(args.backend, device)
    report = as_dict(info, str(device), backend)
    if args.json:
        print(json.dumps(report, sort_keys=False), flush=True)
    else:
        print(as_text(report), flush=True)
    return 0


def as_dict(info: EnvInfo, device: str, backend: str) -> dict:
    """The report: every EnvInfo field, the device and backend, and the variables torch would get."""
    return {
        "scheme": info.scheme,
        "reason": list(info.reason),
        "rank": info.rank,
        "local_rank": info.local_rank,
        "world_size": info.world_size,
        "local_world_size": info.local_world_size,
        "node_rank": info.node_rank,
        "num_nodes": info.num_nodes,
        "main_address": info.main_address,
        "main_port": info.main_port,
        "device": device,
        "backend": backend,
        "torch_env": torch_env_vars(info),
    }


def as_text(report: dict) -> str:
    why = " ".join(report["reason"]) or "no launcher variables found: a single process"
    rows = [
        ("scheme", report["scheme"]),
        ("why", why),
        ("rank", f"{report['rank']} of {report['world_size']} (world size)"),
        ("local rank", f"{report['local_rank']} of {report['local_world_size']} (local world size)"),
        ("node", f"{report['node_rank']} of {report['num_nodes']}"),
        ("main address", f"{report['main_address']}:{report['main_port']}"),
        ("device", report["device"]),
        ("backend", report["backend"]),
    ]
    return "\n".join(f"{name + ':':<14}{value}" for name, value in rows)

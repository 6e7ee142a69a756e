"""``shoal env``: what launcher, rank, world size, address, device and backend shoal sees here.

Detection reads only environment variables; torch is imported inside :func:`run` just to choose
the device and backend, so ``import shoal.cli.env`` stays light.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from shoal.cli.fields import add_fields, given_fields
from shoal.cli.parser import HelpFormatter
from shoal.distributed.device import BACKEND_CHOICES, DEVICE_CHOICES
from shoal.env.base import EnvInfo
from shoal.env.detect import detect_environment, scheme_names, torch_env_vars
from shoal.errors import ShoalError
from shoal.launch.options import LaunchOptions

EXAMPLES = """\
examples:
  shoal env                                   # plain python: local, rank 0 of 1
  shoal env --json                            # the same as one JSON object
  mpirun -np 2 shoal env                      # each rank prints what it sees
  srun -N2 --ntasks-per-node=4 shoal env      # inside a Slurm allocation
  torchrun --nproc-per-node 2 -m shoal env    # under torch's elastic agent
  kubectl exec dist-train1-worker-0 -- shoal env   # in a pod: the job a launcher there would join
  SHOAL_ENV=slurm shoal env                   # force a scheme; says which variables are missing
"""


_NOT_HERE = ("start_method", "max_restarts", "verbose", "hang_timeout", "on_hang")
"""LaunchOptions fields that change nothing ``shoal env`` reports: no flag here."""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "env",
        help="show the launcher, rank, world size, address, device and backend detected here",
        description=(
            "Detect how this process was launched (torchrun, slurm, openmpi, pmi, kubeflow or local), "
            "show why, and show where it sits in the job. Run it the way you run training."
        ),
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
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
    group = parser.add_argument_group(
        "a job started here",
        "What `shoal run`/`shoal train` would start here with these launch options (in a Kubeflow pod "
        "the operator's PET_* variables give their defaults), and where it would listen.",
    )
    # What decides where a job would listen; how workers start, restart and are watched does not act here.
    launch = add_fields(group, LaunchOptions, exclude=(*_NOT_HERE, "rdzv_conf"))
    parser.set_defaults(func=main_args, launch_fields=launch)
    return parser


def main_args(args: argparse.Namespace) -> int:
    from shoal.env.operator import classic_pod, operator_defaults

    pod = operator_defaults(os.environ)
    try:
        info: EnvInfo | None = detect_environment(forced=args.scheme)
        as_one_process = None
    except ShoalError as err:
        if not pod:
            raise
        info, as_one_process = None, err.message  # a pod whose command starts several workers
    given = given_fields(args, args.launch_fields)
    options = LaunchOptions.from_environment(given, pod=pod)  # checked before torch loads
    from shoal.distributed.device import choose_backend, choose_device  # imports torch

    local = (info.local_rank, info.local_world_size) if info else (0, 1)
    device = choose_device(args.device, *local)
    backend = choose_backend(args.backend, device)
    report = as_dict(info, str(device), backend) if info else {"scheme": None, "as_one_process": as_one_process}
    if info is not None and info.world_size > 1 and not pod and not given:
        report["job"] = rank_report(info)
    else:
        report["job"] = job_report(options, pod)
    report["job"]["pod_variables"] = "classic" if classic_pod(os.environ) else ("PET" if pod else None)
    if args.json:
        print(json.dumps(report, sort_keys=False), flush=True)
    else:
        print(as_text(report), flush=True)
    return 0


def job_report(options: LaunchOptions, pod: dict) -> dict:
    """The launch options a `shoal run`/`shoal train` here would use, and where its job listens."""
    from shoal.launch.local import check_allocation
    from shoal.launch.rendezvous import plan_for

    report: dict = {"from_pod": dict(pod), "options": dataclasses.asdict(options)}
    try:  # a short look only: a master that does not resolve yet is reported, not waited for
        if not pod:
            check_allocation(options, os.environ)  # a Slurm allocation asking for more than this
        plan = plan_for(dataclasses.replace(options, join_timeout=min(options.join_timeout, 2.0)), joins=False)
    except ShoalError as err:
        report["listen"], report["problem"] = None, f"{err.message} (HINT: {err.hint})"
        return report
    report["listen"] = plan.listening()
    report["nodes"], report["nproc"] = plan.nnodes, options.nproc
    return report


def rank_report(info: EnvInfo) -> dict:
    """The job this process is already a rank of (mpirun, srun, torchrun): what a launcher here joins."""
    return {
        "from_pod": {},
        "rank_of": info.scheme,
        "listen": None,
        "nodes": str(info.num_nodes),  # as a launch plan gives it (MIN:MAX when elastic)
        "nproc": info.local_world_size,
        "world_size": info.world_size,
    }


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
    rows = []
    if report["scheme"] is None:
        rows.append(("this process", f"not a rank of its own: {report['as_one_process']}"))
    else:
        why = " ".join(report["reason"]) or "no launcher variables found: a single process"
        rows += [
            ("scheme", report["scheme"]),
            ("why", why),
            ("rank", f"{report['rank']} of {report['world_size']} (world size)"),
            ("local rank", f"{report['local_rank']} of {report['local_world_size']} (local world size)"),
            ("node", f"{report['node_rank']} of {report['num_nodes']}"),
            ("main address", f"{report['main_address']}:{report['main_port']}"),
            ("device", report["device"]),
            ("backend", report["backend"]),
        ]
    job = report["job"]
    if job["from_pod"]:
        read = ", ".join(f"{k}={v}" for k, v in job["from_pod"].items())
        if job.get("pod_variables") == "classic":
            source = (
                "this pod has MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE but no PET_* (Run:ai, or a "
                "training-operator before 1.7): a launcher here is node RANK of WORLD_SIZE pods"
            )
        else:
            source = (
                "a Kubeflow operator started this pod's command; read from PET_* "
                "(WORLD_SIZE is not read: its meaning changed in training-operator 1.7)"
            )
        rows.append(("pod", f"{source}; launch defaults: {read}"))
    if job.get("rank_of"):
        rows.append(
            (
                "a job here",
                f"{report['scheme']} started this process as rank {report['rank']} of {job['world_size']}: "
                f"{job['nproc']} process(es) on this node, {job['nodes']} node(s) in all; `shoal train` here "
                "runs as that rank (no workers of its own)",
            )
        )
    elif job["listen"] is None:
        rows.append(("a job here", f"cannot be planned: {job['problem']}"))
    else:
        listen = job["listen"]
        where = f"{listen['address']} ({listen['interface']})" if listen["interface"] else listen["address"]
        stores = [f"rendezvous store on {listen['rendezvous_store']}"] if listen["rendezvous_store"] else []
        stores.append(
            f"workers' store {listen['workers_store']}"
            if isinstance(listen["workers_store"], str) and listen["workers_store"].startswith("on ")
            else f"workers' store on {listen['workers_store']}"
        )
        rows.append(
            (
                "a job here",
                f"{job['nproc']} worker(s) here ({job['nodes']} node(s) in all); listens on {where} "
                f"only: {', '.join(stores)}, {listen['collectives']}",
            )
        )
    return "\n".join(f"{name + ':':<14}{value}" for name, value in rows)

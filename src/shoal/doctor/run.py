"""Which doctor runs: one node's checks, one rank of a job, or a job of its own across nodes.

- This process is one rank of a job another launcher started (``shoal run -m shoal doctor``,
  torchrun, srun, mpirun, ``shoal launch``, a pod): it is a rank of the cluster doctor
  (:func:`shoal.doctor.cluster.run_rank`); rank 0 prints the report.
- The options name several nodes (``--nnodes`` and a master, or a Kubeflow operator's variables):
  this node checks itself first and stays out when it cannot join (no route, the rendezvous port
  dropped, a bad interface variable: it says so at once instead of waiting for a rendezvous it cannot
  reach); otherwise it starts its workers through :func:`shoal.launch.local.run_here_or_launch`, and
  they run the cluster doctor.
- Otherwise: this node's checks (``--nproc`` is the number of processes the job will run here).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from shoal.doctor.model import FAIL
from shoal.doctor.node import blocking_failures, node_report
from shoal.doctor.report import node_document, render_node
from shoal.doctor.settings import DoctorSettings
from shoal.env import detect_environment
from shoal.errors import ShoalError


def doctor(settings: DoctorSettings, options: Any, *, json_output: bool = False) -> int:
    """Run the doctor this process is set up for (see the module docstring); the exit status."""
    try:
        world_size = detect_environment().world_size
    except ShoalError:  # contradicting launcher variables: the one-node checks name them
        world_size = 1
    if world_size > 1:
        from shoal.doctor.cluster import run_rank
        from shoal.launch.local import placement

        placement(options)  # this process is a rank: refuses --nproc / --nnodes that disagree with its launcher
        return run_rank(settings, json_output)
    if options.several_nodes or options.in_pod:
        return _join_job(settings, options, json_output=json_output)
    return one_node(settings, options, json_output=json_output)


def one_node(settings: DoctorSettings, options: Any, *, json_output: bool = False) -> int:
    """This node's checks, as a table (or JSON); 1 if any failed."""
    from shoal.launch.options import LaunchOptions

    master = settings.master_endpoint
    if master is None and (options.master_addr or options.rdzv_endpoint):  # the job's own flags, one node
        from shoal.launch.rendezvous.plan import store_endpoint

        master = store_endpoint(options)
    plan_options = options
    if master is not None:
        host, port = master
        # The job the user is checking for: this node as the master (node 0) when it owns the
        # address, else as another node; plan_description then shows what that node would bind.
        from shoal.env.network import is_local_address, is_loopback, resolve

        try:
            local = any(is_loopback(ip) or is_local_address(ip) for ip in resolve(host))
        except ShoalError:
            local = False
        plan_options = LaunchOptions(
            nproc=options.nproc, nnodes="2", node_rank=0 if local else 1, master_addr=host, master_port=port
        )
    report = node_report(settings, nproc=options.nproc, master=master, plan_options=plan_options)
    document = node_document(report)
    _print(json.dumps(document, indent=1) if json_output else render_node(document))
    return 1 if document["status"] == FAIL else 0


def _join_job(settings: DoctorSettings, options: Any, *, json_output: bool) -> int:
    """Check this node against the job's master first; join only if that can work."""
    from shoal.launch.local import run_here_or_launch
    from shoal.launch.rendezvous.plan import store_endpoint

    report = node_report(settings, nproc=options.nproc, master=store_endpoint(options), plan_options=options)
    blocking = blocking_failures(report)
    if blocking:
        document = node_document(report)
        _print(json.dumps(document, indent=1) if json_output else render_node(document))
        print(
            f"shoal doctor: this node cannot join the job ({', '.join(blocking)} failed): not starting it",
            file=sys.stderr,
            flush=True,
        )
        return 1
    from shoal.doctor.cluster import run_rank

    try:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        results = run_here_or_launch(run_rank, (settings, json_output, report.plan), options, device_type=device)
    except ShoalError as err:
        if "nodes arrived" in err.message or "could not join" in err.message:
            err.hint = (
                f"{err.hint}; run `shoal doctor --master {_master(options)}` on the missing node(s) to see why they "
                "cannot join"
            )
        raise
    return max((code or 0 for code in results.values()), default=0)


def _master(options: Any) -> str:
    from shoal.env.network import bracket
    from shoal.launch.rendezvous.plan import store_endpoint

    host, port = store_endpoint(options)
    return f"{bracket(host)}:{port}"


def _print(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()

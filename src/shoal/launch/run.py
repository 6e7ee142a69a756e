"""``shoal run``'s launch: a script as N workers per node, run by torch's elastic agent.

torch does the work: its config builder (``config_from_args``, over torchrun's parsed arguments)
and its elastic agent, reached through the launch core (:mod:`shoal.launch.core`). The command line
is the CLI's (:mod:`shoal.cli.run`: torchrun's flags, parsed torch-free, and the script checked);
this module is what follows: the checks of the job's place (a rank of another launcher's job, an
allocation), the rendezvous plan, the run directory (the workers' logs, ``progress/``), and the
workers started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator

from shoal.console import write_line
from shoal.env.base import DEFAULT_MAIN_PORT
from shoal.env.host import threads_per_process
from shoal.env.operator import classic_pod, classic_pod_line
from shoal.errors import ShoalError
from shoal.launch.options import LaunchOptions

RUN_DIR_PREFIX = "shoal-run-"
"""``shoal run`` without ``--log-dir``: its run directory is a temporary ``shoal-run-*`` (what
``shoal status`` with no argument looks for)."""


def run_script(args: argparse.Namespace, options: LaunchOptions, *, started: float) -> int:
    """Run the script of torchrun's parsed ``args`` as ``options`` say; return 0 (a failure raises).
    ``started``: ``time.monotonic()`` at the command's start (the join timeout counts from it).

    Raises:
        WorkersFailed: a worker failed (its traceback and the summary are the message), or a signal
            stopped the workers or the launcher.
        ShoalError: bad input (a taken port, a bad flag value) or a rendezvous that could not complete.
    """
    # The launch machinery is imported here, not with this module: an argument error needs none of it.
    from shoal.launch.core import Launch, run_workers
    from shoal.launch.exit_hook import HOROVOD_SHIM_ENV, add_horovod_shim
    from shoal.launch.local import check_allocation, refuse_rank_launching_alone
    from shoal.launch.process import temporary_run_dir
    from shoal.launch.rendezvous import plan_for
    from shoal.launch.tf_config import ENV as TF_CONFIG_ENV
    from shoal.launch.tf_config import check_layout, requested

    if args.tf_config or requested(os.environ):
        check_layout(options, os.environ)
    add_horovod_shim(dict(os.environ))  # a bad SHOAL_HOROVOD_SHIM is said here once, not by every worker
    if classic_pod(os.environ) and options.several_nodes:
        write_line(classic_pod_line("shoal run", os.environ))
    elif not classic_pod(os.environ) and _standalone(args, options):
        refuse_rank_launching_alone("shoal run", os.environ)
        check_allocation(options, os.environ, "shoal run")
    plan = plan_for(options, started=started)
    user_log_dir = args.log_dir
    # Workers' stderr must land in files to be read back after a failure; keep them only as long
    # as the run unless the user asked for a log dir (or a hang was reported: its stacks are there).
    # The log directory is the run directory: progress/ (`shoal status`) and hang-<time>/ go there.
    args.log_dir = user_log_dir or temporary_run_dir(RUN_DIR_PREFIX)
    launch = Launch(
        plan=plan, prog="shoal run", announce_single_node=True, log_dir=args.log_dir,
        keep_logs=bool(user_log_dir), verbose=options.verbose, run_dir=args.log_dir,
        hang_timeout=options.hang_timeout, on_hang=options.on_hang,
    )  # fmt: skip
    try:
        config, cmd, cmd_args = _torch_config(args, options)
        with contextlib.ExitStack() as presets:
            if args.tf_config:
                presets.enter_context(_preset(TF_CONFIG_ENV, "1"))
            if args.horovod_shim:
                presets.enter_context(_preset(HOROVOD_SHIM_ENV, "1"))
            run_workers(config, cmd, tuple(cmd_args), launch)
        return 0
    finally:
        if not launch.keep_logs:  # the user's --log-dir, or kept after a hang report: the report names it
            shutil.rmtree(args.log_dir, ignore_errors=True)


def _standalone(args: argparse.Namespace, options: LaunchOptions) -> bool:
    """One node and no rendezvous of the user's: the job shoal run starts is this node's alone."""
    return not options.several_nodes and args.master_port is None and not args.rdzv_endpoint


def _torch_config(args: argparse.Namespace, options: LaunchOptions):
    """torch's ``LaunchConfig`` and command from the arguments (the core applies the plan to it)."""
    from torch.distributed.run import config_from_args

    args.nproc_per_node = str(options.nproc)
    if not options.several_nodes:  # replaced by the plan; valid values for torch's checks
        args.standalone, args.rdzv_backend, args.rdzv_endpoint = False, "c10d", "127.0.0.1:0"
        args.node_rank = 0  # a pod's RANK default means nothing here (and torch would warn of it)
        args.rdzv_id = str(uuid.uuid4())
    elif args.rdzv_backend == "static" and args.master_port is None:
        args.master_port = DEFAULT_MAIN_PORT
    try:
        # torchrun sets OMP_NUM_THREADS=1 in this process, with a warning, unless it is set: the core
        # sets the workers' own value, so let torch see one here and take it back afterwards.
        with _preset("OMP_NUM_THREADS", str(threads_per_process(options.nproc))):
            return config_from_args(args)
    except (AssertionError, ValueError, RuntimeError) as err:
        raise ShoalError(f"invalid launch options: {err}", "see `shoal run --help`") from None


@contextlib.contextmanager
def _preset(name: str, value: str) -> Iterator[None]:
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)

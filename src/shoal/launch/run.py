"""``shoal run``: torchrun, done right on one node, and torchrun unchanged across many.

Everything is delegated to torch: its parser (``torch.distributed.run.get_args_parser``), its
config builder (``config_from_args``) and its elastic agent (``elastic_launch``). Around them:

- a free rendezvous port on a single node, so two jobs on one machine never collide;
- an explicitly chosen port that is already taken here fails in a second, not after a timeout;
- ``OMP_NUM_THREADS`` = usable cores // workers per node instead of torchrun's blanket 1;
- a failed worker's own traceback (torch only has it for ``@record`` scripts; here every worker's
  stderr is tee'd into a log dir and read back, see :data:`_WORKER_SHIM` and
  :mod:`shoal.launch.failures`);
- workers that die with the launcher, even when it is killed with SIGKILL;
- user errors (``--nproc 0``, a missing script) as one-line :class:`ShoalError` with a hint.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from shoal.env.base import DEFAULT_C10D_PORT, DEFAULT_MAIN_PORT
from shoal.env.host import threads_per_process
from shoal.errors import ShoalError
from shoal.launch.failures import describe_child_failure
from shoal.launch.ports import check_port_free
from shoal.launch.rendezvous import (
    DEFAULT_JOIN_TIMEOUT_S,
    RESTART_ENVIRON,
    RendezvousOptions,
    RendezvousPlan,
    explain_failure,
    is_rendezvous_failure,
    parse_conf,
    plan_rendezvous,
    process_started,
    register_backends,
)

DESCRIPTION = """\
Launch SCRIPT as N worker processes per node: a drop-in for torchrun (every torchrun flag works, in
both spellings), run by torch's own elastic agent. What shoal adds:
  - one node and no --master-port/--rdzv-endpoint: a free port is picked (jobs never collide);
  - a given port that is already taken on this machine is an immediate error;
  - OMP_NUM_THREADS, unless set, = usable cores // workers per node (torchrun: always 1);
  - when a worker fails, its own traceback is shown and shoal exits with its exit code;
  - across nodes: the interface and address that route to the master are found and used
    (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, --local-addr, c10d is_host) unless you set them,
    and every node gives up after --join-timeout with the reason."""

EXAMPLES = """\
examples:
  shoal run --nproc 2 train.py --lr 0.1          # 2 workers on this machine, free port
  shoal run --nproc-per-node 4 -m mypkg.train    # run a module, like python -m
  OMP_NUM_THREADS=4 shoal run --nproc 2 train.py # your thread count wins
  shoal run --nproc 2 --log-dir logs train.py    # keep every worker's stdout/stderr logs
  # two nodes, static rendezvous (run on each node with its --node-rank):
  shoal run --nnodes 2 --node-rank 0 --nproc 4 --master-addr 10.0.0.1 --master-port 29500 train.py
  # two to four nodes, c10d (the same line on every node; 10.0.0.1 hosts the store):
  shoal run --nnodes 2:4 --nproc 4 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 \
      --max-restarts 3 train.py
  shoal run --nproc 2 -m shoal demo all-reduce   # check that collectives work
"""

# Default rendezvous ports of torch: static (--master-port) and c10d (--rdzv-endpoint without one).
_STATIC_DEFAULT_PORT = DEFAULT_MAIN_PORT
_C10D_DEFAULT_PORT = DEFAULT_C10D_PORT


def build_parser() -> argparse.ArgumentParser:
    """torchrun's own parser, renamed, with shoal's ``--nproc`` alias and worked examples."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "shoal run"
    parser.description = DESCRIPTION
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    group = parser.add_argument_group("shoal additions")
    group.add_argument(
        "--nproc",
        metavar="N",
        default=None,
        help="short for --nproc-per-node N (workers on this node: an integer, or auto/cpu/gpu)",
    )
    group.add_argument(
        "--join-timeout",
        type=float,
        default=DEFAULT_JOIN_TIMEOUT_S,
        metavar="S",
        help=f"several nodes: fail when they have not all arrived after S seconds (default {DEFAULT_JOIN_TIMEOUT_S:g})",
    )
    return parser


@dataclass
class _Plan:
    """What shoal decided on top of torchrun's arguments (used for the start-up line)."""

    nproc: int
    max_nodes: int
    free_port: bool
    omp_threads: str
    omp_from_user: bool
    rendezvous: RendezvousPlan | None = None
    """Several nodes: the network and rendezvous decisions (see :mod:`shoal.launch.rendezvous`)."""
    starts: int = 0
    """How many times the workers were started so far."""


def run(argv: list[str]) -> int:
    """Run ``shoal run ARGV``; return the exit status (0, or the failed worker's).

    Raises:
        ShoalError: bad input (``--nproc 0``, a missing script, a taken port, a bad flag value)
            or a rendezvous that could not complete.
        SystemExit: from torch's parser on unknown flags or ``--help`` (status 2 or 0).
    """
    args = build_parser().parse_args(argv)
    _apply_nproc_alias(args, argv)
    nproc = _local_world_size(args.nproc_per_node)
    max_nodes = _max_nodes(args.nnodes)
    _check_script(args)
    free_port = _choose_rendezvous(args, max_nodes)
    rendezvous = _plan_rendezvous(args, max_nodes)
    _check_port(args, max_nodes, rendezvous)

    omp_from_user = "OMP_NUM_THREADS" in os.environ
    omp = os.environ["OMP_NUM_THREADS"] if omp_from_user else str(threads_per_process(nproc))
    plan = _Plan(nproc, max_nodes, free_port, omp, omp_from_user, rendezvous)
    extra_env = {"OMP_NUM_THREADS": omp, **(rendezvous.environ if rendezvous else {})}
    if args.max_restarts > 0 and args.rdzv_backend == "c10d":
        extra_env.update(RESTART_ENVIRON)  # fresh worker store per restart (pytorch#135712)

    user_log_dir = bool(args.log_dir)
    if not user_log_dir:
        # Workers' stderr must land in files to be read back after a failure; keep them only as
        # long as the run unless the user asked for a log dir.
        args.log_dir = tempfile.mkdtemp(prefix="shoal-run-")
    try:
        with _launch_environ(extra_env):
            return _launch(args, plan, keep_logs=user_log_dir)
    finally:
        if not user_log_dir:
            shutil.rmtree(args.log_dir, ignore_errors=True)


def _launch(args: argparse.Namespace, plan: _Plan, *, keep_logs: bool) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args

    try:
        config, cmd, cmd_args = config_from_args(args)
    except (AssertionError, ValueError, RuntimeError) as err:
        raise ShoalError(f"invalid launch options: {err}", "see `shoal run --help`") from None
    if plan.rendezvous is not None:
        plan.rendezvous.configure(config)
        register_backends()
    if plan.max_nodes != 1:  # single node: announced once the port is known (at worker start)
        print(_startup_line(plan, args, env=None), file=sys.stderr, flush=True)
    cmd, cmd_args, shimmed = _wrap_in_shim(cmd, cmd_args)
    recorder = _recording_logs_specs(config.logs_specs, tee=shimmed, on_start=lambda env: _on_start(plan, args, env))
    config.logs_specs = recorder
    endpoint = config.rdzv_endpoint
    try:
        elastic_launch(config=config, entrypoint=cmd)(*cmd_args)
    except ChildFailedError as err:
        _wait_for_tees(recorder.stderrs.values())
        report = describe_child_failure(err, args.log_dir, stderr_logs=recorder.stderrs, keep_logs=keep_logs)
        print(report.format(), file=sys.stderr, flush=True)
        return report.exit_code
    except SignalException as err:
        # The agent already stopped the workers (SIGTERM, then SIGKILL after a grace period).
        print(f"shoal run: stopped by {err.sigval.name}; workers stopped", file=sys.stderr)
        return 128 + int(err.sigval)
    except Exception as err:
        if plan.rendezvous is not None and is_rendezvous_failure(err):
            raise explain_failure(err, plan.rendezvous) from None  # endpoint, arrivals, a hint
        if not isinstance(err, (RendezvousError, TimeoutError, _dist_error())):
            raise
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ShoalError(
            f"rendezvous at {endpoint} failed: {first_line}",
            "check that every node was started with the same --nnodes and rendezvous address, "
            "and that the address is reachable from each node",
            exit_code=1,
        ) from None
    return 0


def _dist_error() -> type[BaseException]:
    import torch.distributed as dist

    return getattr(dist, "DistError", RuntimeError)


# --- argument checks -------------------------------------------------------------------------


def _apply_nproc_alias(args: argparse.Namespace, argv: list[str]) -> None:
    """``--nproc N`` is ``--nproc-per-node N``; giving both (differently) is an error."""
    if args.nproc is None:
        return
    launcher_argv = argv[: len(argv) - len(args.training_script_args) - 1]
    spelled = {"--nproc-per-node", "--nproc_per_node"}
    given = any(tok.split("=", 1)[0] in spelled for tok in launcher_argv)
    if given and args.nproc != args.nproc_per_node:
        raise ShoalError(
            f"--nproc {args.nproc} and --nproc-per-node {args.nproc_per_node} disagree",
            "give only one of them (--nproc is short for --nproc-per-node)",
        )
    args.nproc_per_node = args.nproc


def _local_world_size(value: str) -> int:
    """Workers on this node, from ``--nproc-per-node`` (an integer, or torch's auto/cpu/gpu/xpu)."""
    from torch.distributed.run import determine_local_world_size

    hint = "give the number of worker processes per node, e.g. --nproc 2 (or auto, cpu, gpu)"
    try:
        n = determine_local_world_size(value)
    except ValueError as err:
        raise ShoalError(f"--nproc-per-node {value}: {err}", hint) from None
    if n < 1:
        raise ShoalError(f"--nproc-per-node must be at least 1, got {value}", hint)
    return n


def _max_nodes(nnodes: str) -> int:
    from torch.distributed.run import parse_min_max_nnodes

    hint = "give --nnodes N or --nnodes MIN:MAX with 1 <= MIN <= MAX"
    try:
        min_nodes, max_nodes = parse_min_max_nnodes(nnodes)
    except (ValueError, RuntimeError):
        raise ShoalError(f"--nnodes {nnodes} is not N or MIN:MAX", hint) from None
    if not 0 < min_nodes <= max_nodes:
        raise ShoalError(f"--nnodes {nnodes} is not a valid node count", hint)
    return max_nodes


def _check_script(args: argparse.Namespace) -> None:
    """The script (or ``--no-python`` program) must exist here; ``-m module`` is not checked."""
    if args.module:
        return
    path = args.training_script
    if args.no_python and not args.run_path:
        if shutil.which(path) is None:
            raise ShoalError(
                f"program not found: {path} (--no-python runs it directly)",
                "give a path to an executable or a command on PATH",
            )
        return
    if not os.path.exists(path):
        raise ShoalError(
            f"script not found: {path} (working directory: {os.getcwd()})",
            "check the path; to run a module, use -m package.module; for a program that is not Python, add --no-python",
        )


# --- rendezvous ------------------------------------------------------------------------------


def _choose_rendezvous(args: argparse.Namespace, max_nodes: int) -> bool:
    """Pick the rendezvous for a single-node job given no port; return True if a free port is used.

    Like ``torchrun --standalone`` (and torchrun >= 2.6 by default on one node), the rendezvous
    becomes c10d on 127.0.0.1 port 0: the agent's TCPStore binds a port the OS picks and the workers
    get that very store as MASTER_ADDR/MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE). Nothing is
    closed and re-bound later, so unlike "find a free port, then pass it to a static rendezvous"
    there is no window in which another job can take it. 127.0.0.1 rather than torch's
    "localhost": localhost may resolve to ::1 first, and the start-up line should name an address.
    The workers' MASTER_ADDR is the agent's ``--local-addr``, else ``socket.getfqdn()``, which can
    be a name that resolves to another interface or to nothing useful; on one node, loopback is
    always right, so it becomes the default local address too.
    """
    if args.standalone or (
        max_nodes == 1 and args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None
    ):
        args.standalone = False  # already applied here; torch's run() is not called
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "127.0.0.1:0"
        args.rdzv_id = str(uuid.uuid4())
        if max_nodes == 1 and not args.local_addr:
            args.local_addr = "127.0.0.1"
        return True
    if args.master_port is None:
        args.master_port = _STATIC_DEFAULT_PORT  # what torchrun does for static multi-node jobs
    return False


def _check_port(args: argparse.Namespace, max_nodes: int, rendezvous: RendezvousPlan | None = None) -> None:
    """Fail fast if the port this node will serve the rendezvous store on is taken.

    The store is served here on a single node, on node rank 0 of a static rendezvous, and where a
    c10d rendezvous is told ``is_host=1`` (by the user, or by :func:`_plan_rendezvous` on the node
    that owns the endpoint's address). Left unchecked, a taken port means a timeout after
    minutes (static) or, worse, joining another job's c10d store (torch falls back to being a
    client when it cannot bind).
    """
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    from torch.distributed.run import get_rdzv_endpoint

    static = args.rdzv_backend == "static"
    if rendezvous is not None:
        hosts_store = rendezvous.hosts_store
    elif static:
        hosts_store = max_nodes == 1 or args.node_rank == 0
    elif args.rdzv_backend == "c10d":
        conf = dict(kv.split("=", 1) for kv in args.rdzv_conf.split(",") if "=" in kv)
        hosts_store = max_nodes == 1 or conf.get("is_host", "").lower() in ("1", "true", "yes")
    else:
        return  # etcd and others: the store is not served by this process
    if not hosts_store:
        return
    endpoint = get_rdzv_endpoint(args)
    try:
        default_port = _STATIC_DEFAULT_PORT if static else _C10D_DEFAULT_PORT
        _, port = parse_rendezvous_endpoint(endpoint, default_port)
    except ValueError as err:
        raise ShoalError(f"bad rendezvous endpoint {endpoint!r}: {err}", "use HOST:PORT") from None
    if port == 0:
        return
    if static and not args.rdzv_endpoint:
        pick, omit = "another --master-port", "omit it"
    else:
        pick, omit = "another port in --rdzv-endpoint", "omit --rdzv-endpoint"
    if max_nodes == 1:
        hint = f"pick {pick}, or {omit} to get a free one"
    else:
        hint = f"pick {pick} that is free on this node, and give every node the same one"
    check_port_free(port, hint=hint)


def _plan_rendezvous(args: argparse.Namespace, max_nodes: int) -> RendezvousPlan | None:
    """Several nodes over static or c10d: pick interface, address, store host and timeouts.

    The choices go into torch's own arguments only where the user left them open (``--local-addr``,
    ``--rdzv-conf`` keys); see :func:`shoal.launch.rendezvous.plan_rendezvous`.
    """
    if args.join_timeout <= 0:
        raise ShoalError(
            f"--join-timeout must be positive, got {args.join_timeout:g}", "pass seconds, e.g. --join-timeout 60"
        )
    if max_nodes == 1 or args.rdzv_backend not in ("static", "c10d"):
        return None
    opts = RendezvousOptions(
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        backend=args.rdzv_backend,
        endpoint=args.rdzv_endpoint or None,
        run_id=args.rdzv_id,
        join_timeout=args.join_timeout,
        conf=parse_conf(args.rdzv_conf),
        local_addr=args.local_addr,
    )
    plan = plan_rendezvous(opts, started=process_started())
    if args.rdzv_backend == "c10d" and not args.rdzv_endpoint:
        args.rdzv_endpoint = opts.endpoint  # from --master-addr/--master-port
    return plan


# --- workers' environment and logs -----------------------------------------------------------


# Runs in each worker process first, then replaces itself with the real command (exec: same PID,
# so the agent's signals, exit codes and process-group kills reach the worker as usual):
#
# 1. PR_SET_PDEATHSIG: the kernel SIGKILLs the worker when the launcher dies. The agent stops the
#    workers on a failure or on SIGTERM/SIGINT, but a launcher killed with SIGKILL (or by the OOM
#    killer) would otherwise leave them running, maybe blocked forever in a collective. The flag
#    survives exec and fires when the launcher thread that started the worker exits (torch starts
#    workers from the main thread). If the launcher is already gone, stop right here.
# 2. A byte-for-byte tee of stderr into $SHOAL_STDERR_LOG (<attempt dir>/<local rank>/stderr.log,
#    next to the error file torch assigns), so a failed worker's traceback can be read back.
#    torch's own ``--tee 2`` would do that too, but it reads the log line by line and re-prints
#    every line with a "[default0]:" prefix: each carriage-return refresh of a tqdm progress bar
#    then becomes a new line. Here the console gets exactly the bytes a torchrun worker writes.
#    The tee process (a fork, without torch) ignores termination signals and exits when every
#    writer of the pipe is gone, so it never cuts off the worker's last words; it holds an flock
#    on the log meanwhile, which the launcher waits for before reading. The launcher sets
#    $SHOAL_STDERR_LOG per worker (see _recording_logs_specs) unless torch already writes its
#    stderr to a file (--redirects or --tee given) or there is no log dir (--log-dir /dev/null);
#    the variable is removed before exec.
_WORKER_SHIM = """\
import ctypes, fcntl, os, select, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(128 + signal.SIGKILL)
path = os.environ.pop("SHOAL_STDERR_LOG", None)
if path:
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fcntl.flock(log, fcntl.LOCK_EX)
    r, w = os.pipe()
    worker = os.getpid()
    if os.fork() == 0:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        for fd in (w, 0, 1):  # hold no end of the worker's pipes but the one it reads
            os.close(fd)
        console, idle = True, 0.0
        while True:
            if not select.select([r], [], [], 0.5)[0]:
                # Writers may outlive the worker (a daemon it spawned): stop 2 s after both.
                idle = idle + 0.5 if os.getppid() != worker else 0.0
                if idle >= 2:
                    break
                continue
            data = os.read(r, 65536)
            if not data:
                break
            try:
                os.write(log, data)
            except OSError:
                pass
            while console and data:
                try:
                    data = data[os.write(2, data):]
                except OSError:  # the console is gone: keep logging and draining the pipe
                    console = False
        os._exit(0)
    os.dup2(w, 2)
    os.close(w)
    os.close(r)
    os.close(log)  # the tee's copy keeps the file and the lock
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as err:
    sys.exit(f"shoal: cannot run {sys.argv[2]}: {err.strerror}")
"""


def _wrap_in_shim(cmd: Any, cmd_args: list[str]) -> tuple[Any, list[str], bool]:
    """Wrap a command entrypoint in :data:`_WORKER_SHIM`; return (cmd, args, wrapped).

    Functions (``--run-path``) are left alone: torch records their tracebacks itself. So is
    everything off Linux (no prctl there).
    """
    if not isinstance(cmd, str) or not sys.platform.startswith("linux"):
        return cmd, cmd_args, False
    return sys.executable, ["-c", _WORKER_SHIM, str(os.getpid()), cmd, *cmd_args], True


def _wait_for_tees(paths: Iterable[str], timeout: float = 3.0) -> None:
    """Wait (at most ``timeout`` s) until every worker's stderr tee is done: it holds an flock."""
    deadline = time.monotonic() + timeout
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
        finally:
            os.close(fd)


@contextmanager
def _launch_environ(extra: dict[str, str]) -> Iterator[None]:
    """Set variables for the workers (the agent copies os.environ into them), restore afterwards.

    torch's launcher also writes os.environ (TORCHELASTIC_SIGNALS_TO_HANDLE); restoring the whole
    mapping keeps ``run()`` free of side effects for callers in the same process.
    """
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in extra.items() if k not in os.environ})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _recording_logs_specs(inner: Any, *, tee: bool, on_start: Callable[[dict[str, str]], None]) -> Any:
    """Wrap the launch's LogsSpecs: place each worker's stderr log and announce the start.

    The agent calls ``reify`` right before it starts (or restarts) the workers, with every worker's
    environment (which it may still change, as torch's DefaultLogsSpecs does to name each error
    file), so the rendezvous address and the ranks are known there. ``tee``: the workers run in
    the shim, which copies stderr to ``$SHOAL_STDERR_LOG`` where that is set. Wrapping rather
    than subclassing keeps a user's ``--logs-specs`` plugin working.
    """
    from torch.distributed.elastic.multiprocessing.api import LogsSpecs

    class RecordingLogsSpecs(LogsSpecs):
        def __init__(self) -> None:
            super().__init__(log_dir=inner.root_log_dir)
            self.stderrs: dict[int, str] = {}
            """local rank -> its stderr log in the current attempt"""

        @property
        def root_log_dir(self) -> str:
            return inner.root_log_dir

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            dest = inner.reify(envs)
            self.stderrs = {}
            for rank, env in envs.items():
                redirected = dest.stderrs.get(rank)
                error_file = dest.error_files.get(rank)
                if redirected and redirected != os.devnull:  # torch writes it (--redirects/--tee)
                    self.stderrs[rank] = redirected
                elif tee and error_file and error_file != os.devnull:
                    path = os.path.join(os.path.dirname(error_file), "stderr.log")
                    env["SHOAL_STDERR_LOG"] = self.stderrs[rank] = path
            if envs:
                on_start(envs[0])
            return dest

    return RecordingLogsSpecs()


def _on_start(plan: _Plan, args: argparse.Namespace, env: dict[str, str]) -> None:
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart:
        line = f"shoal run: restarting the workers (restart {restart} of {args.max_restarts})"
    elif plan.starts:
        # Another node failed and restarted, or joined (elastic): torch restarts every node's
        # workers, without counting it against this node's --max-restarts.
        line = "shoal run: the other nodes changed (one restarted or joined); " + _startup_line(
            plan, args, env
        ).removeprefix("shoal run: ")
    else:
        line = _startup_line(plan, args, env)
    plan.starts += 1
    print(line, file=sys.stderr, flush=True)


def _startup_line(plan: _Plan, args: argparse.Namespace, env: dict[str, str] | None) -> str:
    """One line: workers, rendezvous, threads. ``env``: local rank 0's env once workers start."""
    threads = f"OMP_NUM_THREADS={plan.omp_threads}" + (" (yours)" if plan.omp_from_user else "")
    workers = f"{plan.nproc} worker{'s' if plan.nproc != 1 else ''}"
    if plan.max_nodes == 1:
        addr = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if env else args.rdzv_endpoint
        how = " (free port picked)" if plan.free_port else ""
        return f"shoal run: {workers} on this node, rendezvous {addr}{how}, {threads}"
    if env is None and plan.rendezvous is not None:
        return "\n".join(plan.rendezvous.lines("shoal run", plan.nproc, extra=f", {threads}"))
    if env is None:
        from torch.distributed.run import get_rdzv_endpoint

        node = f"node {args.node_rank}, " if args.rdzv_backend == "static" else ""
        return (
            f"shoal run: {workers} on this node ({node}--nnodes {args.nnodes}), waiting for "
            f"{args.rdzv_backend} rendezvous at {get_rdzv_endpoint(args)}, {threads}"
        )
    first, last = int(env["RANK"]), int(env["RANK"]) + plan.nproc - 1
    ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
    return f"shoal run: rendezvous done; starting {ranks} of {env['WORLD_SIZE']}"

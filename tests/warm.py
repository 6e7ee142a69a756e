"""Warm starts for the tests' ``python -m shoal`` commands: the same command, minus the 2-3 CPU-s of imports.

Most of the suite's CPU goes into starting interpreters that import torch (docs/contributing/TEST_TIME.md). A
command that :func:`popen` or :func:`run` starts warm is a fork of tests/warm_server.py, which
imported torch, torch._dynamo and shoal's CLI once: from there it is ``python -m shoal ARGS`` (or
the ``shoal`` console script, as a pod's container command names it) as a fresh interpreter runs it
(its own argv, environment, directory, standard streams, session and, in a pod, namespaces; its own
exit), and everything it starts (forked or spawned workers, torchrun's agent, mpirun, ssh) is
started for real. A server is started by the interpreter the command names (the console script's
``#!`` line) with the command's own import-time variables (:data:`IMPORT_TIME`), so a pod's image
environment (PYTHONUNBUFFERED, LD_LIBRARY_PATH, LANG) gets a server of its own from its second
command on (:data:`FRESH_BEFORE_A_SERVER`); at most :data:`MAX_SERVERS`. The xdist workers of one
session share their servers (:func:`share_servers`): a server started by one serves the others'
commands of the same interpreter and import-time environment, and lives while any of them does.

A command starts fresh instead, exactly as ``subprocess`` starts it, when a warm start could differ:
- it sets a variable that makes the interpreter report on its start-up (:data:`REPORTS_START`:
  PYTHONPROFILEIMPORTTIME among them): the tests that assert what a command imports get a real
  interpreter;
- its environment differs from this process's in a variable read while modules are imported
  (:data:`IMPORT_TIME`: ``PYTHON*`` such as PYTHONPATH, OpenMP's and torch's settings, the locale)
  and :data:`MAX_SERVERS` servers are already running with other values (TMPDIR and HOME are not
  among them, see :data:`IMPORT_TIME`);
- it is neither ``python -m shoal`` (or ``-m torch.distributed.run``, torchrun) with this
  interpreter nor this environment's ``shoal`` console script, or it asks for what :func:`popen`
  does not do (any other Popen argument). Other scripts start warm only when the caller says
  ``script=True``: ``python SCRIPT ARGS`` or ``python -c CODE ARGS`` whose start-up and imports are
  not what the test looks at (a driver that calls shoal's API and reports what it did), run with
  torch, torch._dynamo and shoal already imported;
- ``SHOAL_TEST_FRESH=1`` is set: every command fresh, to check that the warm start hides nothing.

What a warm start does not show, then: a command's import errors and its start-up cost. Those are
tested by commands started fresh (tests/test_import_cost.py, tests/cli/test_train_bad_input.py,
``benchmarks/startup.py``, and every script a launcher starts).
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("warm_server.py")
FRESH = "SHOAL_TEST_FRESH"
IMPORT_TIME = ("PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH", "LD_", "CUDA",
               "NVIDIA_", "LOGLEVEL", "MALLOC_", "XDG_", "LANG", "LC_")  # fmt: skip
"""Prefixes of the variables read when the interpreter starts or modules are imported (a warm start
keeps the server's: the command gets a server started with its own). Not TMPDIR and HOME: the
server's imports read them only into two caches that the child resets once it has the command's
environment (tests/warm_server.py, ``become``): tempfile's directory (torch's imports call
``gettempdir``) and site's user base. A search of every imported module's attributes, made with both
set to marked paths, found no other copy."""
REPORTS_START = ("PYTHONPROFILEIMPORTTIME", "PYTHONVERBOSE", "PYTHONDEBUG", "PYTHONMALLOCSTATS", "PYTHONINSPECT")
"""Variables that make the interpreter report on its start-up or imports: a command given one starts fresh."""
HANDLED = {"env", "cwd", "stdin", "stdout", "stderr", "text", "start_new_session"}
"""The Popen arguments a warm start honours; any other one starts the command fresh."""
MAX_SERVERS = 12
"""Servers at most, shared by the processes of :func:`share_servers` (each maps ~0.7 GB, ~0.4 GB of
it its own: ``/proc/PID/smaps_rollup``'s Private_Dirty; 12 are ~4.8 GB of the machine's 24 GiB, of
which a full run left more than 11 GB free with up to 24, 8 per xdist worker before they shared:
the least of ``vmstat 5``'s free column in the runs of 2026-11-25, where they started 11-12 in all,
7 of them a second or third worker's copy of another's; shared, a full run starts 8). The
environments: this process's, a pod image's, a pod image's with the client libraries' PYTHONPATH
(tests/clients/), the OMP_NUM_THREADS=1 of the Horovod-style and tracking tests
(tests/horovod/horovod_launch.py, tests/tracking/harness.py), and a test's own PYTHONPATH or
OMP_NUM_THREADS (with 4 a worker, 12 commands a run found no server left; with 6 a worker, 9, 6 of them
the pods of tests/k8s/test_runai_pods.py)."""
FRESH_BEFORE_A_SERVER = 1
"""Commands of an import-time environment other than this process's that start fresh before it gets
a server of its own (the pods' image environment has dozens; a test's own PYTHONPATH one or two). A
server costs about what one fresh ``shoal train`` does (the same imports), so it pays from the
second command of an environment on; the first stays fresh, as a torch-free one (``shoal launch``,
``--help``: 0.3 CPU-s) would lose 3 CPU-s to it."""
MODULES = ("shoal", "torch.distributed.run")
"""The ``python -m`` modules that start warm: shoal, and torchrun's (the server imported both)."""
CONSOLE_SCRIPT = Path(sys.executable).with_name("shoal")
"""The ``shoal`` console script of this environment (pip's: ``#!PYTHON``, then ``sys.exit(main())``)."""

_BASE_ENV: dict[str, str] = {}
"""The environment servers start with (their import-time variables replaced by the command's): this
process's when tests/warm.py was first imported, or as :func:`set_base_environment` was last given it."""
_BASE_IMPORT_TIME: tuple[tuple[str, str], ...] = ()


def set_base_environment(environ: Mapping[str, str]) -> None:
    """Take ``environ`` as the servers' environment, and its import-time variables as those whose
    commands start warm from the first on (tests/conftest.py: the session's, once the imports that add
    variables to it have run). Before any server has started."""
    global _BASE_ENV, _BASE_IMPORT_TIME
    if _started:
        raise RuntimeError("the warm servers' environment is set before the first one starts")
    _BASE_ENV = {k: v for k, v in environ.items() if k != "PYTEST_CURRENT_TEST"}
    _BASE_IMPORT_TIME = tuple(sorted((k, v) for k, v in _BASE_ENV.items() if k.startswith(IMPORT_TIME)))


_started: list[subprocess.Popen] = []
"""The servers this process started."""
_leased: dict[tuple, tuple[str, socket.socket]] = {}
"""By key (interpreter, import-time variables): the socket of the server this process holds a lease
on, and the lease (a connection it keeps open while it lives: tests/warm_server.py)."""
_directory: str | None = None
"""Where the servers' sockets and PID files are: :func:`share_servers`'s, else this process's own."""
_shared = False
set_base_environment(os.environ)
_asked: dict[tuple, int] = {}
"""Commands asked for by key, for a key with no server yet."""
_lock = threading.RLock()
"""Held while a command starts: tests may start commands from threads
(the background runs of tests/launch/test_hang_faults.py and tests/cluster/test_elastic_membership.py)."""


def share_servers(directory: str) -> None:
    """Use and start servers in ``directory``, shared with every process given the same one (the
    xdist workers of one session: tests/conftest.py, whose controller makes it, then ends what is
    left there with :func:`stop_shared_servers`). Before this process has started any."""
    global _directory, _shared
    if _leased or _started:
        raise RuntimeError("servers are shared from the start")
    _directory, _shared = directory, True


def stop_shared_servers(directory: str) -> None:
    """End the servers whose PID files are in ``directory`` (shoal's ``stop_processes``: SIGTERM, then
    SIGKILL after 10 s), then remove it. Called once every process that shared them has ended (they
    end on their own then: this is for one whose end was missed)."""
    from shoal.launch.watchdog.processes import stop_processes

    servers = []
    for record in Path(directory).glob("*.pid"):
        pid = record.read_text()
        try:  # a PID of one of ours, not a later process's that reused it
            if str(SERVER).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                servers.append(int(pid))
        except OSError:
            pass  # ended already
    stop_processes(servers)
    shutil.rmtree(directory, ignore_errors=True)


def starts_warm(cmd: list[str], *, script: bool = False, **kwargs: Any) -> bool:
    """Whether ``cmd`` with these Popen arguments starts warm (see the module's docstring)."""
    return isinstance(_plan(cmd, kwargs, script=script), tuple)


def server_running(cmd: list[str], *, script: bool = False, **kwargs: Any) -> bool:
    """Whether ``cmd`` with these Popen arguments would find its server running (this process's, or
    one that a process sharing its servers started): then even its first command starts warm."""
    plan = _plan(cmd, kwargs, script=script)
    return isinstance(plan, tuple) and (plan[0] in _leased or _running(plan[0]))


def _plan(
    cmd: list[str], kwargs: dict[str, Any], *, script: bool = False
) -> tuple[tuple, list[str], list[str]] | str | None:
    """How ``cmd`` starts warm: the server's key (interpreter, import-time variables), what the child
    runs (``["module", NAME]`` for ``-m NAME``, ``["script", PATH]``, ``["code", CODE]`` for ``-c``)
    and its ``sys.argv``. When it starts fresh: why, for a command that could have started warm,
    else None. ``script``: the caller's opt-in for other scripts."""
    cmd = [os.fspath(part) for part in cmd]
    env = os.environ if kwargs.get("env") is None else kwargs["env"]
    if cmd[:2] == [sys.executable, "-m"] and len(cmd) > 2 and cmd[2] in MODULES:
        interpreter, main, argv = sys.executable, ["module", cmd[2]], [str(SERVER), *cmd[3:]]
    elif script and cmd[:2] == [sys.executable, "-c"] and len(cmd) > 2:
        interpreter, main, argv = sys.executable, ["code", cmd[2]], ["-c", *cmd[3:]]
    elif script and cmd[:1] == [sys.executable] and len(cmd) > 1 and not cmd[1].startswith("-"):
        interpreter, main, argv = sys.executable, ["script", cmd[1]], cmd[1:]
    elif cmd and shutil.which(cmd[0], path=env.get("PATH", os.defpath)) == str(CONSOLE_SCRIPT):
        interpreter, main = _shebang(CONSOLE_SCRIPT), ["script", str(CONSOLE_SCRIPT)]
        argv = [str(CONSOLE_SCRIPT), *cmd[1:]]
        if interpreter is None:
            return "the console script's #! is another interpreter"
    else:
        return None
    if os.environ.get(FRESH) == "1":
        return f"{FRESH}=1"
    if not set(kwargs) <= HANDLED or kwargs.get("stdin") == subprocess.PIPE:
        return f"Popen arguments {sorted(set(kwargs) - HANDLED) or ['stdin=PIPE']}"
    if reporting := [name for name in REPORTS_START if env.get(name)]:
        return f"reports its start: {reporting[0]}"
    key = (interpreter, tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME))))
    if key not in _leased and not _running(key) and len(list(Path(_home()).glob("*.pid"))) >= MAX_SERVERS:
        return f"over {MAX_SERVERS} servers ({_differing(key[1])})"
    return key, main, argv


def _differing(import_time: tuple) -> str:
    """The names of the import-time variables that differ from this process's."""
    return ", ".join(sorted({k for k, _ in set(import_time) ^ set(_BASE_IMPORT_TIME)})) or "none"


@functools.cache
def _shebang(script: Path) -> str | None:
    """The interpreter of ``script``'s ``#!`` line when it is this environment's Python, else None."""
    with open(script, "rb") as f:
        first = f.readline().decode(errors="replace").strip()
    interpreter = first[2:].strip() if first.startswith("#!") else ""
    same = os.path.dirname(interpreter) == os.path.dirname(sys.executable) and (
        os.path.realpath(interpreter) == os.path.realpath(sys.executable)
    )
    return interpreter if same else None


def start(cmd: list[str], *, enter: int | Callable[[], int] | None = None, script: bool = False,
          **kwargs: Any) -> WarmProcess | None:  # fmt: skip
    """``cmd`` started warm (in the namespaces of PID ``enter`` if given; a callable is asked for it
    only when the command does start warm), or None: it must start fresh (:func:`starts_warm`), or its
    import-time environment is not this process's and has no server yet: the first
    :data:`FRESH_BEFORE_A_SERVER` commands of such an environment start fresh (a server for one
    command costs more than it saves). ``script``: see the
    module's docstring."""
    with _lock:
        plan = _plan(cmd, kwargs, script=script)
        if not isinstance(plan, tuple):
            return None
        key = plan[0]
        if key not in _leased and key[1] != _BASE_IMPORT_TIME and not _running(key):
            _asked[key] = _asked.get(key, 0) + 1
            if _asked[key] <= FRESH_BEFORE_A_SERVER:
                return None
        return WarmProcess(list(cmd), plan, enter=enter() if callable(enter) else enter, **kwargs)


def popen(cmd: list[str], *, script: bool = False, **kwargs: Any):
    """``subprocess.Popen(cmd, **kwargs)``, started warm (a :class:`WarmProcess`) when :func:`start` can."""
    return start(cmd, script=script, **kwargs) or subprocess.Popen(cmd, **kwargs)


def run(cmd: list[str], *, input: Any = None, capture_output: bool = False, timeout: float | None = None,
        check: bool = False, start=popen, **kwargs: Any) -> subprocess.CompletedProcess:  # fmt: skip
    """``subprocess.run`` on ``start`` (:func:`popen`, or a pod's): the same CompletedProcess, the
    same TimeoutExpired after the command was killed (SIGKILL), the same CalledProcessError with ``check``."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:  # as subprocess.run: a pipe to write it to (so the command starts fresh)
        kwargs["stdin"] = subprocess.PIPE
    with start(cmd, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, stdout, stderr)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _home() -> str:
    """The directory of the servers' sockets and PID files (this process's own, made on first use and
    removed at its exit, unless :func:`share_servers` gave one)."""
    global _directory
    if _directory is None:
        _directory = tempfile.mkdtemp(prefix="shoal-warm-")
        atexit.register(shutil.rmtree, _directory, True)  # after the servers' _stop: atexit runs last-in first
    return _directory


def _paths(key: tuple) -> tuple[str, Path, Path]:
    """The socket, PID file and lock file of the server of ``key``."""
    base = os.path.join(_home(), hashlib.sha1(repr(key).encode()).hexdigest()[:16])
    return base + ".socket", Path(base + ".pid"), Path(base + ".lock")


def _running(key: tuple) -> bool:
    """Whether a server of ``key`` was started (by this process or one sharing its servers)."""
    return _paths(key)[1].exists()


def _connect(key: tuple) -> socket.socket:
    """A connection to the server of ``key`` (interpreter, import-time variables), started if need be;
    a server found gone is started again."""
    for _ in range(2):
        address = _lease(key)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(address)
            return conn
        except OSError:  # it ended (or was ended) after the lease: start another
            conn.close()
            _leased.pop(key)[1].close()
    raise RuntimeError(f"the warm server at {address} accepts no command")


def _lease(key: tuple) -> str:
    """The socket of a server of ``key`` this process holds a lease on: the running one (a process
    sharing this one's servers may have started it), else one started now. Under the key's lock, so
    that two processes asking at once start one server."""
    if key in _leased:
        return _leased[key][0]
    address, record, lock = _paths(key)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        lease = _take_lease(address) if record.exists() else None
        if lease is None:  # none yet, or it has ended: its last lease went with the processes it served
            record.unlink(missing_ok=True)
            _start_server(key, address, record)
            lease = _take_lease(address)
            if lease is None:
                raise RuntimeError(f"the warm server at {address} refused its first lease")
    _leased[key] = (address, lease)
    return address


def _take_lease(address: str) -> socket.socket | None:
    """A lease on the server at ``address`` (tests/warm_server.py), or None if it has ended or is ending."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.settimeout(30)
        conn.connect(address)
        conn.send(b"lease")
        if conn.recv(16) == b"ok":
            conn.settimeout(None)
            return conn
    except OSError:
        pass
    conn.close()
    return None


def _start_server(key: tuple, address: str, record: Path) -> None:
    interpreter, import_time = key
    env = {**{k: v for k, v in _BASE_ENV.items() if not k.startswith(IMPORT_TIME)}, **dict(import_time)}
    if os.path.exists(address):
        os.unlink(address)  # an ended server's
    server = subprocess.Popen(
        [interpreter, str(SERVER), address], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env
    )
    if server.stdout.readline() != b"ready\n":
        raise RuntimeError(f"tests/warm_server.py did not start (exit {server.wait()}); see its stderr above")
    server.stdout.close()
    record.write_text(str(server.pid))
    _started.append(server)
    if not _shared:  # else it serves the others after this process: the session's controller ends it
        atexit.register(_stop, server)


def _stop(server: subprocess.Popen) -> None:
    """End a server this process started and no other shares."""
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


class WarmProcess:
    """What the tests use of ``subprocess.Popen``, for a command started warm: ``pid`` (its session's
    too with ``start_new_session``), ``stdout``/``stderr`` (pipes, or where they were sent),
    ``poll``, ``wait``, ``communicate``, ``send_signal``/``terminate``/``kill`` and ``with``. The
    server reaps it and sends its exit status, so ``wait`` reads that, not ``waitpid``."""

    def __init__(self, cmd: list[str], plan: tuple[tuple, list[str], list[str]], *, enter: int | None = None,
                 env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None, stdin: Any = None,
                 stdout: Any = None, stderr: Any = None, text: bool = False,
                 start_new_session: bool = False) -> None:  # fmt: skip
        key, main, argv = plan  # what start() found with _plan: the server and what the child runs
        self.args = cmd
        self.returncode: int | None = None
        self.stdin = None
        self._text = text
        self._output: dict[int, bytearray] = {}
        child_ends: list[int] = []
        pipes: dict[str, int] = {}
        for name, given, default in (("stdin", stdin, 0), ("stdout", stdout, 1), ("stderr", stderr, 2)):
            if given == subprocess.PIPE and name != "stdin":
                read_end, write_end = os.pipe()
                pipes[name] = read_end
                child_ends.append(write_end)
            elif given == subprocess.STDOUT and name == "stderr":
                child_ends.append(os.dup(child_ends[1]))
            elif given == subprocess.DEVNULL:
                child_ends.append(os.open(os.devnull, os.O_RDWR))
            else:
                fd = default if given is None else given if isinstance(given, int) else given.fileno()
                child_ends.append(os.dup(fd))
        if cwd is None:
            cwd = "/" if enter is not None else os.getcwd()
        request = {
            "argv": argv,
            "main": main,
            "env": dict(os.environ if env is None else env),
            "cwd": os.fspath(cwd) if enter is not None else os.path.abspath(cwd),
            "session": start_new_session,
            "enter": enter,
        }
        self._conn = _connect(key)
        try:
            socket.send_fds(self._conn, [json.dumps(request).encode()], child_ends)
        finally:
            for fd in child_ends:
                os.close(fd)
        started = json.loads(self._conn.recv(4096))
        if "pid" not in started:  # it died setting up (entering the namespaces, the directory): its stderr says
            raise RuntimeError(f"the warm start of {cmd} failed (exit {started['returncode']}): see the stderr above")
        self.pid = started["pid"]
        self._pipes = [pipes.get("stdout"), pipes.get("stderr")]
        self.stdout, self.stderr = (None if fd is None else open(fd, "r" if text else "rb") for fd in self._pipes)  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._ended()
        return self.returncode

    def _ended(self) -> None:
        answer = json.loads(self._conn.recv(4096))
        self._conn.close()
        self.returncode = answer["returncode"]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: None = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Read the piped streams to their end, then wait; a timeout keeps what was read for the next call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for stream, fd in zip((self.stdout, self.stderr), self._pipes):
                if stream is not None and not stream.closed:
                    self._output.setdefault(fd, bytearray())
                    selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    so_far = [bytes(self._output[fd]) if fd in self._output else None for fd in self._pipes]
                    raise subprocess.TimeoutExpired(self.args, timeout, output=so_far[0], stderr=so_far[1])
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        self._output[key.fd] += chunk
                    else:
                        selector.unregister(key.fd)
        results = []
        for stream, fd in zip((self.stdout, self.stderr), self._pipes):
            data = bytes(self._output.pop(fd, b"")) if fd is not None else None
            if stream is not None:
                stream.close()
            results.append(
                data.decode().replace("\r\n", "\n").replace("\r", "\n") if self._text and data is not None else data
            )
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0))
        return results[0], results[1]

    def __enter__(self) -> WarmProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()

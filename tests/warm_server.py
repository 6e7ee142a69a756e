"""The warm server behind tests/warm.py: imports what every ``python -m shoal`` command imports first,
once, then forks a copy of itself for each command the tests run.

``python tests/warm_server.py SOCKET`` listens on the Unix socket SOCKET (SOCK_SEQPACKET: one message
is one request). A request is a JSON object ``{"argv": [...], "main": ["module", NAME], ["script",
PATH] or ["code", CODE], "env": {...}, "cwd": "...", "session": bool, "enter": PID or null}`` sent
with three file descriptors (stdin, stdout, stderr). The server forks. The child becomes ``python -m
NAME ARGV[1:]`` (shoal, or torchrun's torch.distributed.run), ``python PATH ARGV[1:]`` (as the kernel
runs a ``#!`` script such as the ``shoal`` console script) or ``python -c CODE ARGV[1:]``: in PID's
network, UTS and mount namespaces if asked (a pod's, as ``nsenter`` enters them), in a session of
its own if asked, those descriptors as 0, 1 and 2, that directory, exactly that environment,
``sys.argv`` and ``sys.path[0]`` as the interpreter sets them; then it answers ``{"pid": PID}`` and
runs. It ends as an interpreter ends (SystemExit's code, or a traceback and 1; threads joined, atexit
run, streams flushed) but for the module teardown (:func:`end`). The server answers ``{"returncode": CODE}`` when the
child has ended.

A connection whose first message is ``lease`` (answered ``ok``) is a lease: the test process that
sent it keeps it open while it may send commands, and its end (the process's exit closes it) ends
the lease. The server ends when its last lease has ended (the test processes that share it are all
gone or done; none within :data:`FIRST_LEASE_S` of its start), or on SIGTERM; its commands go on to
their own end.

No thread is started and no torch operation is run here before a fork (a forked OpenMP or libuv
runtime with threads behind it can hang).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import json
import os
import runpy
import selectors
import signal
import site
import socket
import sys
import tempfile
import threading
import types

# What `shoal train --nproc N` has imported when it forks its workers (1.3 CPU-s for torch, 1.1 for
# torch._dynamo, which the first optimizer pulls in, 0.3 for shoal's own: docs/contributing/TEST_TIME.md).
import numpy  # noqa: F401
import torch
import torch._dynamo
import torch.distributed.elastic.agent.server.local_elastic_agent
import torch.distributed.launcher.api
import torch.distributed.run  # noqa: F401
import tqdm  # noqa: F401

import shoal.cli.main
import shoal.cli.run.args
import shoal.launch.core
import shoal.launch.run
import shoal.train.job
import shoal.train.trainer  # noqa: F401

MAX_REQUEST = 1 << 20
FIRST_LEASE_S = 60.0
"""A server that no test process has leased by then ends (its starter died before it could)."""


def serve(listener: socket.socket) -> tuple[dict, list[int], socket.socket]:
    """Answer requests until one forks: returns ``(request, fds, connection)`` in the child; never in
    the server, which ends here when its last lease has ended."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    leased = False
    while True:
        events = selector.select(None if leased else FIRST_LEASE_S)
        if not events:  # the first lease's wait timed out
            os._exit(0)
        for key, _ in events:
            if key.data == "lease":  # its test process has ended (or let it go)
                selector.unregister(key.fileobj)
                key.fileobj.close()
                if not any(other.data == "lease" for other in selector.get_map().values()):
                    os._exit(0)
                continue
            if key.data == "accept":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
                if message == b"lease":
                    conn.send(b"ok")
                    selector.register(conn, selectors.EVENT_READ, "lease")
                    leased = True
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    for other in list(selector.get_map().values()):
                        if other.data == "lease":
                            other.fileobj.close()
                        elif isinstance(other.data, tuple):  # another command's pidfd and connection
                            os.close(other.fd)
                            other.data[1].close()
                    selector.close()
                    listener.close()
                    return json.loads(message), fds, conn
                for fd in fds:
                    os.close(fd)
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
                continue
            pid, conn = key.data
            selector.unregister(key.fd)
            os.close(key.fd)
            _, status = os.waitpid(pid, 0)
            answer = {"returncode": os.waitstatus_to_exitcode(status)}
            try:
                conn.send(json.dumps(answer).encode())
            except OSError:
                pass  # the test gave up waiting (its own timeout): nobody to tell
            conn.close()


def enter(pid: int) -> None:
    """Join the network, UTS and mount namespaces of ``pid``, as ``nsenter --target=PID --net --uts
    --mount`` does (setns(2); the mount namespace last, as it changes this process's root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind in ("uts", "net", "mnt"):
        fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
        try:
            if libc.setns(fd, 0) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"setns into {kind} namespace of {pid}: {os.strerror(error)}")
        finally:
            os.close(fd)


def become(request: dict, fds: list[int], conn: socket.socket) -> None:
    """Turn this forked child into ``python -m shoal ARGV[1:]`` (see the module's docstring), then
    send its PID: like Popen, whose return means the child's session and streams are in place."""
    if request["enter"] is not None:
        enter(request["enter"])
    if request["session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # What the imports above cached of TMPDIR and HOME (tests/warm.py, IMPORT_TIME): read them anew.
    tempfile.tempdir = None
    site.USER_BASE = site.USER_SITE = None
    sys.argv = list(request["argv"])
    # What the interpreter puts first: the working directory for `-m`, "" for `-c`, the script's directory.
    kind, name = request["main"]
    if kind == "module":
        sys.path[0] = os.getcwd()
    elif kind == "code":
        sys.path[0] = ""
    else:
        sys.path[0] = os.path.dirname(os.path.realpath(name))
    conn.send(json.dumps({"pid": os.getpid()}).encode())
    conn.close()


def run(main: list[str]) -> None:
    kind, name = main
    if kind == "module":
        # Imported here before the fork (torch.distributed.run): as in a fresh `python -m`, the
        # module runs as __main__ only (and runpy would warn that it found it imported).
        sys.modules.pop(name, None)
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    else:  # as the interpreter runs `python -c CODE` or `python PATH`: a fresh __main__ (for a script,
        # __file__ the absolute path, sys.argv[0] as given; runpy.run_path would set both to the path)
        main_module = types.ModuleType("__main__")
        if kind == "code":
            filename, source = "<string>", name
        else:
            filename = main_module.__file__ = os.path.abspath(name)
            with open(filename, "rb") as f:
                source = f.read()
        sys.modules["__main__"] = main_module
        exec(compile(source, filename, "exec"), main_module.__dict__)


def _print_exception() -> None:
    """The uncaught exception as the interpreter prints it: its traceback from the command's own
    first frame on (this file's frames, which a fresh interpreter has not, left out)."""
    kind, error, tb = sys.exc_info()
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    sys.excepthook(kind, error.with_traceback(tb), tb)  # the hook prints the exception's own __traceback__


def exit_code(main: list[str]) -> int:
    """What the interpreter makes of the command's end: SystemExit's code (a message: printed, 1), an
    uncaught exception's traceback and 1, an uncaught KeyboardInterrupt as a death by SIGINT."""
    try:
        run(main)
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _print_exception()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:
        _print_exception()
        return 1


def end(code: int) -> None:
    """End as ``Py_FinalizeEx`` begins (non-daemon threads joined, atexit run, streams flushed), then
    stop there: tearing down the modules imported before the fork costs more than most commands
    (docs/contributing/TEST_TIME.md) and makes triton's bindings print leak warnings for the frozen objects."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF)


def main() -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sys.argv[1])
    listener.listen(8)
    gc.freeze()  # the imported objects: no collection in a child walks them (each walk copies their pages)
    print("ready", flush=True)
    request, fds, conn = serve(listener)
    become(request, fds, conn)
    end(exit_code(request["main"]))


if __name__ == "__main__":
    main()

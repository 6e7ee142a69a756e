"""Runs in each worker process of ``shoal run`` first, then replaces itself with the real command.

Usage (by the launch core): ``python worker_shim.py LAUNCHER_PID PROGRAM ARGS...``. ``exec`` keeps
the PID, so the agent's signals, exit codes and process-group kills reach the worker as usual.

1. :func:`shoal.launch.process.die_with_parent`: the worker dies with the launcher, even one killed
   with SIGKILL. If the launcher is already gone, stop right here.
2. A byte-for-byte tee of stderr into ``$SHOAL_STDERR_LOG`` (``<attempt dir>/<local rank>/stderr.log``,
   next to the error file torch assigns), so a failed worker's traceback can be read back. torch's
   own ``--tee 2`` would do that too, but it reads the log line by line and re-prints every line with
   a ``[default0]:`` prefix: each carriage-return refresh of a tqdm progress bar then becomes a new
   line. Here the console gets exactly the bytes a torchrun worker writes. The tee process (a fork,
   before anything heavy is imported) ignores termination signals and exits when every writer of
   the pipe is gone, so it never cuts off the worker's last words; it holds an flock on the log
   meanwhile, which the launcher waits for before reading (:func:`shoal.launch.worker_logs.wait_for_tees`).
   The variable is removed before exec.
3. A Python worker gets :mod:`shoal.launch.exit_hook` first on its ``PYTHONPATH``: its
   ``sitecustomize`` leaves a gloo process group the script left open at exit (a torch bug otherwise
   aborts about 1 worker in 8 after its work), then restores the worker's own ``PYTHONPATH``.
   ``SHOAL_EXIT_HOOK=0`` leaves it out. With ``SHOAL_HOROVOD_SHIM=1`` (``--horovod-shim``), this
   installation's Horovod shim goes first on ``PYTHONPATH`` too, and stays there
   (:func:`shoal.launch.exit_hook.add_horovod_shim`).
4. With ``SHOAL_TF_CONFIG=1`` (``shoal run --tf-config``), ``TF_CONFIG`` for TensorFlow's
   MultiWorkerMirroredStrategy, its addresses exchanged through the workers' store the agent serves
   (:func:`shoal.launch.tf_config.add_tf_config`), right before ``exec``.
"""

import fcntl
import os
import select
import signal
import sys

from shoal.errors import ShoalError
from shoal.launch.exit_hook import add_exit_hook, add_horovod_shim
from shoal.launch.process import die_with_parent
from shoal.launch.tf_config import add_tf_config

_TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE)
_IDLE_EXIT_S = 2.0
"""Writers may outlive the worker (a daemon it spawned): the tee stops this long after the worker."""


def tee_stderr(path: str) -> None:
    """Send this process's stderr through a forked tee that copies it into ``path``."""
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fcntl.flock(log, fcntl.LOCK_EX)
    read_end, write_end = os.pipe()
    worker = os.getpid()
    if os.fork() == 0:
        for sig in _TERMINATING:
            signal.signal(sig, signal.SIG_IGN)
        for fd in (write_end, 0, 1):  # hold no end of the worker's pipes but the one it reads
            os.close(fd)
        _copy(read_end, log, worker)
        os._exit(0)
    os.dup2(write_end, 2)
    os.close(write_end)
    os.close(read_end)
    os.close(log)  # the tee's copy keeps the file and the lock


def _copy(source: int, log: int, worker: int) -> None:
    console, idle = True, 0.0
    while True:
        if not select.select([source], [], [], 0.5)[0]:
            idle = idle + 0.5 if os.getppid() != worker else 0.0
            if idle >= _IDLE_EXIT_S:
                return
            continue
        data = os.read(source, 65536)
        if not data:
            return
        try:
            os.write(log, data)
        except OSError:
            pass
        while console and data:
            try:
                data = data[os.write(2, data) :]
            except OSError:  # the console is gone: keep logging and draining the pipe
                console = False


def main(argv: list[str]) -> None:
    if os.getppid() != int(argv[1]):
        sys.exit(128 + signal.SIGKILL)
    die_with_parent()
    path = os.environ.pop("SHOAL_STDERR_LOG", None)
    if path:
        tee_stderr(path)
    try:
        add_horovod_shim(os.environ)
        add_exit_hook(os.environ, argv[2])
        add_tf_config(os.environ, serve=False)
    except ShoalError as err:
        print(err.format(), file=sys.stderr, flush=True)
        sys.exit(err.exit_code)
    try:
        os.execvp(argv[2], argv[2:])
    except OSError as err:
        sys.exit(f"shoal: cannot run {argv[2]}: {err.strerror}")


if __name__ == "__main__":
    main(sys.argv)

"""Turn torch's ``ChildFailedError`` into the failing rank's own traceback and a one-line summary.

torch's elastic agent reports a failed worker as a :class:`ChildFailedError` whose text is a table
with ``traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html``
unless the worker wrapped its entrypoint in ``@record`` (unmodified scripts don't). This module
finds the traceback wherever it is:

1. the worker's error file (``failure.message`` is then a dict with ``py_callstack``): scripts using
   ``@record``, and every *function* entrypoint, which torch wraps in ``record`` itself;
2. otherwise the worker's stderr log (``shoal run`` tees every worker's stderr into the log dir,
   see :mod:`shoal.launch.run`; torch's ``--redirects``/``--tee`` write the same file), from which
   the last ``Traceback`` block is cut out (torch prefixes each of its lines with ``[rankN]: ``);
3. otherwise the last lines of that log, or torch's own message (e.g. which signal killed it).

Which rank failed *first* matters: when rank 1 raises, rank 0 usually dies a moment later in a
collective ("Connection closed by peer"), or is stopped by the agent with SIGTERM, and all of them
land in the failure report. torch orders failures by a timestamp with one-second resolution
(``time.time()`` when the agent noticed, unless there is an error file), so ties are the rule.
Here workers that died of SIGTERM (how the agent stops the survivors) come last, and among the
others the one whose error file or stderr log was last written earliest is the root cause.

A worker killed by SIGKILL is named with its cause: the kernel's out-of-memory killer or something
else (:mod:`shoal.launch.oom`).

The launch core's every other end is said here too, as one :class:`WorkersFailed` each: workers
stopped by a preemption signal (:func:`workers_failed`), the launcher stopped by one
(:func:`launcher_stopped`), the workers stopped for a hang (:func:`hang_failure`), a rendezvous that
did not complete (:func:`rendezvous_failure`).
"""

from __future__ import annotations

import glob
import os
import re
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shoal.errors import EXIT_HUNG, ShoalError, first_line
from shoal.launch.oom import AT_IMPORT, UNKNOWN_CAUSE, MemoryState, SigkillCause, sigkill_cause
from shoal.launch.process import signal_name

if TYPE_CHECKING:  # torch is imported lazily: this module is imported by CLI code paths too
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from shoal.launch.rendezvous.plan import RendezvousPlan
    from shoal.launch.watchdog import JobWatch

PREEMPTED_CODES = frozenset({128 + signal.SIGTERM, 128 + signal.SIGUSR1})
"""Exit statuses of workers that stopped for SIGTERM / SIGUSR1 (see :mod:`shoal.preemption`)."""


class WorkersFailed(ShoalError):
    """A worker failed (or the workers were stopped); the message is the whole report to print.

    ``raised``: the root-cause worker ended on its own with a failure status, not for a lost peer
    (:attr:`FailureReport.raised`): its code or input failed, and a retry would fail the same way.
    False for a kill, a preemption, a hang or a stop.
    """

    def __init__(self, message: str, hint: str = "", *, exit_code: int = 2, raised: bool = False) -> None:
        super().__init__(message, hint, exit_code=exit_code)
        self.raised = raised

    def format(self) -> str:
        return self.message


_TB_HEADER = "Traceback (most recent call last):"
_CHAIN_LINES = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# Lines that are log records rather than part of an exception message: c10/glog
# ("[rank0]:[W1122 01:09:59.359 ...]", "W1122 01:09:59.359000 ..."), Python warnings, torch elastic.
_LOG_LINE = re.compile(r"^(\[rank\d+\]:)?\[?[IWEF]\d{4} |^\[[IWEF] |^\S+:\d+: \w*Warning: ")
_MAX_MESSAGE_LINES = 30
_TAIL_LINES = 20
_NOT_AVAILABLE = "<N/A>"
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket Timeout")


def says_peer_gone(text: str) -> bool:
    """Whether ``text`` (an error, a traceback) is what gloo and the stores say when another rank's
    process or node is gone."""
    return any(marker in text for marker in _PEER_GONE)


_ABORT_AT_EXIT = "terminate called without an active exception"
_ABORT_AT_EXIT_HINT = (
    "the worker aborted while exiting, after its work: gloo's threads outlived the interpreter "
    "(a torch bug); end the script with dist.destroy_process_group() then gc.collect(), or with "
    "shoal.init()'s ctx.shutdown(), which does both"
)


def extract_last_traceback(text: str) -> str | None:
    """Return the last Python traceback in ``text`` (a worker's stderr), or None if there is none.

    The block runs from ``Traceback (most recent call last):`` through the exception line and any
    continuation lines of a multi-line message; a chain of exceptions ("During handling of the above
    exception ..." / "The above exception was the direct cause ...") is kept whole. Lines carrying a
    common prefix before the header (e.g. torchrun's tee prefix ``[default1]:``) are matched by that
    prefix, which is stripped; lines of other ranks interleaved with them are skipped.
    """
    lines = text.splitlines()
    for start in range(len(lines) - 1, -1, -1):
        pos = lines[start].find(_TB_HEADER)
        if pos != -1 and lines[start][pos:].rstrip() == _TB_HEADER:
            break
    else:
        return None
    prefix = lines[start][:pos]
    own = [line[len(prefix) :] for line in lines if line.startswith(prefix)] if prefix else lines
    last = max(i for i, line in enumerate(own) if line.rstrip() == _TB_HEADER)
    first = _chain_start(own, last)

    end = last + 1
    while end < len(own) and own[end][:1] in (" ", "\t"):  # the frames
        end += 1
    if end < len(own) and own[end].strip():  # the exception line and a multi-line message
        end += 1
        extra = 0
        while (
            end < len(own)
            and extra < _MAX_MESSAGE_LINES
            and own[end].strip()
            and not _LOG_LINE.match(own[end])
            and own[end].rstrip() != _TB_HEADER
        ):
            end += 1
            extra += 1
    return "\n".join(own[first:end]).rstrip() or None


def _chain_start(lines: list[str], header: int) -> int:
    """Walk back from a traceback header over "During handling ..." links to the chain's first."""
    while True:
        i = header - 1
        while i >= 0 and not lines[i].strip():
            i -= 1
        if i < 0 or lines[i].strip() not in _CHAIN_LINES:
            return header
        earlier = [j for j in range(i) if lines[j].rstrip() == _TB_HEADER]
        if not earlier:
            return header
        header = earlier[-1]


def exception_line(traceback_text: str) -> str:
    """The ``Type: message`` line of the last exception in a traceback block."""
    lines = traceback_text.splitlines()
    last_header = max((i for i, ln in enumerate(lines) if ln.rstrip() == _TB_HEADER), default=-1)
    for line in lines[last_header + 1 :]:
        if line.strip() and line[:1] not in (" ", "\t"):
            return line.strip()
    return lines[-1].strip() if lines else ""


def find_stderr_log(log_dir: str, local_rank: int) -> str | None:
    """The newest ``stderr.log`` of ``local_rank`` under a torch elastic log dir, if any.

    torch's ``DefaultLogsSpecs`` writes ``<log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/
    stderr.log``; a reused log dir holds several runs, so the most recently modified file wins.
    """
    pattern = os.path.join(glob.escape(log_dir), "*", "attempt_*", str(local_rank), "stderr.log")
    paths = glob.glob(pattern)
    return max(paths, key=os.path.getmtime) if paths else None


@dataclass
class FailureReport:
    """What went wrong with the root-cause worker of a failed job, ready to print."""

    rank: int
    local_rank: int
    exitcode: int
    """The worker's exit status; negative: killed by that signal (``subprocess`` convention)."""
    traceback: str | None = None
    """The worker's own Python traceback, if one was found."""
    stderr_tail: str | None = None
    """The last lines of its stderr, when there was no traceback to show."""
    message: str = ""
    """One line: the exception (``ValueError: boom``), or what torch knows (a signal)."""
    log_path: str | None = None
    """Where the worker's stderr was written, if that file is kept after the run."""
    other_ranks: list[int] = field(default_factory=list)
    """Other ranks of this node that failed or were stopped after it (a consequence, as a rule)."""
    same_ranks: list[int] = field(default_factory=list)
    """Other ranks of this node that failed with the same exception (the same cause, met by each)."""
    hint: str | None = None
    """What to do, when the failure is one shoal recognises."""
    host: str = ""
    """The machine the worker ran on (this launcher's)."""
    kill_cause: "SigkillCause | None" = None
    """For SIGKILL: whether the out-of-memory killer did it, and the evidence."""
    known: bool = False
    """The hint comes from :func:`known_cause`: shoal knows what the exception means."""

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def raised(self) -> bool:
        """The worker ended on its own with a failure status (an exception, ``sys.exit(N)``, a shoal
        error), not for a lost peer: what the code or its input did, which a retry would do again.
        False when it was killed by a signal (the OOM killer, a preemption, a dead node)."""
        said = f"{self.message}\n{self.traceback or ''}\n{self.stderr_tail or ''}"
        return self.exitcode > 0 and not says_peer_gone(said)

    @property
    def exit_code(self) -> int:
        """The launcher's exit status: the worker's, 128+N for signal N (as a shell reports it)."""
        if self.exitcode < 0:
            return 128 - self.exitcode
        return self.exitcode or 1

    def format(self) -> str:
        """Header, the traceback (or last stderr lines), then a ``shoal: error:`` summary line. A
        failure whose cause shoal knows (:func:`known_cause`) is one line, where in the user's code
        and what, and its HINT: the traceback through torch's frames would say less, at length."""
        if self.known and self.message and not self.signal_name:
            return self._known_format()
        who = f"rank {self.rank} (local rank {self.local_rank})"
        if self.signal_name:
            how = f"was killed by {self.signal_name} ({-self.exitcode})"
        else:
            how = f"failed with exit code {self.exitcode}"
        out = []
        if self.traceback:
            out += [f"shoal: {who} {how}; its traceback:", self.traceback]
        elif self.stderr_tail:
            out += [f"shoal: {who} {how}; the last lines of its stderr:", self.stderr_tail]
        else:
            out += [f"shoal: {who} {how}; it left no traceback."]
        what = self.message or f"exit code {self.exitcode}"
        summary = f"shoal: error: rank {self.rank} failed: {what}"
        if self.signal_name == "SIGKILL":  # "... failed: killed by SIGKILL on HOST: <the cause>"
            cause = self.kill_cause or SigkillCause(None, UNKNOWN_CAUSE)
            summary = (
                f"shoal: error: rank {self.rank} failed: killed by SIGKILL on {self.host or 'this host'}{cause.clause}"
            )
        if self.same_ranks:
            out.append(f"shoal: {_ranks(self.same_ranks)} failed the same way")
        if self.other_ranks:
            out.append(f"shoal: {_ranks(self.other_ranks)} stopped because rank {self.rank} failed")
        out.append(summary)
        if self.hint:
            out.append(f"HINT: {self.hint}")
        if self.log_path:
            out.append(f"shoal: worker logs: {os.path.dirname(os.path.dirname(self.log_path))}")
        return "\n".join(out)

    def _known_format(self) -> str:
        where = user_frame(self.traceback or "")
        out = [f"shoal: error: {_ranks(sorted([self.rank, *self.same_ranks]))} failed{where}: {self.message}"]
        if self.other_ranks:
            out.append(f"shoal: {_ranks(self.other_ranks)} stopped because rank {self.rank} failed")
        out.append(f"HINT: {self.hint}")
        if self.log_path:
            out.append(f"shoal: worker logs (its traceback): {os.path.dirname(os.path.dirname(self.log_path))}")
        return "\n".join(out)


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in ')


def user_frame(traceback_text: str) -> str:
    """`` at train.py, line 3`` for the innermost frame of a traceback in the user's own code (not in
    an installed package, nor Python's library); empty when there is none."""
    import sysconfig

    library = tuple(
        os.path.realpath(path) + os.sep for path in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
    )
    found = ""
    for line in traceback_text.splitlines():
        match = _FRAME.match(line)
        if not match:
            continue
        path = match.group(1)
        if path.startswith("<") or "site-packages" in path or os.path.realpath(path).startswith(library):
            continue
        relative = os.path.relpath(path) if os.path.isabs(path) else path
        shown = path if relative.startswith("..") else relative
        found = f" at {shown}, line {match.group(2)}"
    return found


def _ranks(ranks: list[int]) -> str:
    """``[0]`` -> ``rank 0``; ``[0, 2]`` -> ``ranks 0, 2``."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}"


_KNOWN_CAUSES = (
    (
        re.compile(r"ProcessGroupNCCL is only supported with GPUs|Distributed package doesn't have NCCL"),
        'the nccl backend needs GPUs and this machine has none: use init_process_group("gloo") on CPU, '
        "or shoal.init(), which picks the backend for the device",
    ),
    (
        re.compile(r"^ModuleNotFoundError: No module named 'horovod[.']"),
        "Horovod itself no longer builds against today's frameworks; shoal serves its API: keep the import "
        "and pass --horovod-shim (or export PYTHONPATH=$(python -m shoal.horovod.shim)), or import "
        "shoal.horovod (torch) or shoal.horovod.tensorflow.keras instead (docs/HOROVOD.md)",
    ),
    (
        re.compile(r"^ModuleNotFoundError: No module named '([^']+)'"),
        "install it into the Python environment the workers run: {python}",
    ),
)


def known_cause(message: str) -> str | None:
    """The HINT for an exception line shoal recognises (``ValueError: ProcessGroupNCCL is only
    supported with GPUs...``), else None."""
    import sys

    for pattern, hint in _KNOWN_CAUSES:
        if pattern.search(message):
            return hint.format(python=sys.executable)
    return None


def _message(failure: ProcessFailure) -> str:
    """A failure's exception line, from its error file (empty without one)."""
    recorded = failure.message if isinstance(failure.message, dict) else {}
    return str(recorded.get("message") or "")


def first_recorded_failure(error_files: Mapping[int, str]) -> str | None:
    """The first failure among an attempt's error files (global rank -> path), as the lines a
    restart prints before it says so: ``shoal: rank R failed: <exception>; its traceback:`` and the
    traceback. None when no file holds a recorded exception."""
    import json

    found = []
    for rank, path in error_files.items():
        try:
            with open(path) as f:
                message = json.load(f).get("message")
            found.append((os.path.getmtime(path), rank, message))
        except (OSError, ValueError, AttributeError):
            continue
    for _, rank, message in sorted(found):
        if isinstance(message, dict) and message.get("message"):
            traceback = ((message.get("extraInfo") or {}).get("py_callstack") or "").rstrip()
            head = f"shoal: rank {rank} failed: {message['message']}"
            return f"{head}; its traceback:\n{traceback}" if traceback else head
    return None


def describe_child_failure(
    err: ChildFailedError,
    log_dir: str | None = None,
    *,
    stderr_logs: Mapping[int, str] | None = None,
    keep_logs: bool = False,
    memory_before: MemoryState | None = None,
) -> FailureReport:
    """Find the root-cause failure in ``err`` and its traceback.

    Args:
        err: what ``elastic_launch(...)(...)`` raised.
        log_dir: the elastic log dir (``LaunchConfig.logs_specs``' ``log_dir``) to search for
            ``stderr.log`` files when ``stderr_logs`` doesn't name them.
        stderr_logs: local rank -> path of its stderr log (e.g. ``LogsDest.stderrs`` of the last
            attempt); empty paths (stderr went to the console) are ignored.
        keep_logs: the logs outlive this run (the user chose the log dir), so name their place.
        memory_before: :func:`memory_state` before the workers started, to tell an OOM kill of
            theirs from earlier ones (default: the state when this module was loaded).
    """
    paths = _stderr_paths(err, log_dir, stderr_logs or {})
    ranks = _root_cause_first(err, paths)
    rank, failure = ranks[0], err.failures[ranks[0]]
    report = FailureReport(
        rank=rank,
        local_rank=failure.local_rank,
        exitcode=failure.exitcode,
        other_ranks=sorted(ranks[1:]),
        log_path=paths.get(rank) if keep_logs else None,
        host=socket.gethostname(),
    )
    _read_cause(report, failure, paths.get(rank))
    report.same_ranks = sorted(
        r for r in report.other_ranks if report.message and _message(err.failures[r]) == report.message
    )
    report.other_ranks = [r for r in report.other_ranks if r not in report.same_ranks]
    _add_hint(report, failure, memory_before)
    return report


def _stderr_paths(err: ChildFailedError, log_dir: str | None, stderr_logs: Mapping[int, str]) -> dict[int, str]:
    """Global rank -> its stderr log, for the failed ranks whose log exists (named in
    ``stderr_logs`` by local rank, else found under ``log_dir``)."""
    paths: dict[int, str] = {}
    for rank, failure in err.failures.items():
        path = stderr_logs.get(failure.local_rank) or None
        if path is None and log_dir:
            path = find_stderr_log(log_dir, failure.local_rank)
        if path and os.path.isfile(path):
            paths[rank] = path
    return paths


def _root_cause_first(err: ChildFailedError, paths: Mapping[int, str]) -> list[int]:
    """The failed ranks, the root cause first (see the module docstring): those the agent stopped
    last, then by when each failed, then as the agent noticed them."""
    order = {rank: i for i, rank in enumerate(err.failures)}  # as the agent noticed them

    def stopped(rank: int) -> bool:  # by the agent, before it failed on its own (no error file)
        failure = err.failures[rank]
        return failure.exitcode == -signal.SIGTERM and not isinstance(failure.message, dict)

    return sorted(
        err.failures,
        key=lambda r: (stopped(r), _failure_time(err.failures[r], paths.get(r)), order[r]),
    )


def _read_cause(report: FailureReport, failure: ProcessFailure, stderr_log: str | None) -> None:
    """The root cause's traceback and exception line, from its error file, else its stderr log (or
    that log's last lines)."""
    recorded = failure.message if isinstance(failure.message, dict) else None
    if recorded:  # an error file: @record, or a function entrypoint
        report.traceback = (recorded.get("extraInfo") or {}).get("py_callstack") or None
        report.message = str(recorded.get("message") or "")
        if report.traceback:
            report.traceback = report.traceback.rstrip()
        if failure.exitcode == -signal.SIGTERM:
            # It raised, and the agent's SIGTERM (another rank had failed meanwhile) caught it still
            # exiting (its exit hook): what it failed of is the exception, as Python's status 1 says.
            report.exitcode = 1
    elif isinstance(failure.message, str) and failure.error_file not in ("", _NOT_AVAILABLE):
        report.message = failure.message  # an error file in the newer plain-string format
    if not report.traceback and stderr_log:
        text = _read_text(stderr_log)
        report.traceback = extract_last_traceback(text)
        if not report.traceback:
            tail = [ln for ln in text.splitlines() if ln.strip()][-_TAIL_LINES:]
            report.stderr_tail = "\n".join(tail) or None
        if failure.exitcode == -signal.SIGABRT and _ABORT_AT_EXIT in text:
            report.hint = _ABORT_AT_EXIT_HINT
    if report.traceback and not report.message:
        report.message = exception_line(report.traceback)


def _add_hint(report: FailureReport, failure: ProcessFailure, memory_before: MemoryState | None) -> None:
    """What to do about a cause shoal knows, and what killed a worker that died of a signal."""
    if not report.hint:
        report.hint = known_cause(report.message)
        report.known = report.hint is not None
    if not report.message and failure.exitcode < 0:
        report.message = f"killed by {report.signal_name}"
    if failure.exitcode == -signal.SIGKILL:
        report.kill_cause = sigkill_cause(failure.pid, before=memory_before or AT_IMPORT)
        report.hint = report.hint or report.kill_cause.hint


def workers_failed(
    err: ChildFailedError,
    prog: str,
    log_dir: str | None,
    *,
    stderr_logs: Mapping[int, str],
    keep_logs: bool,
    memory_before: MemoryState,
) -> WorkersFailed:
    """The launch's end when its workers failed: one line when every one of them stopped for a
    preemption signal (they said why, and where the checkpoint went, themselves: a traceback report
    would only bury that), else the root cause's report (:func:`describe_child_failure`)."""
    codes = {failure.exitcode for failure in err.failures.values()}
    if codes and codes <= PREEMPTED_CODES:
        code = max(codes)
        return WorkersFailed(
            f"{prog}: workers stopped by {signal_name(code - 128)}{signal_hint(code - 128)}", exit_code=code
        )
    report = describe_child_failure(
        err, log_dir, stderr_logs=stderr_logs, keep_logs=keep_logs, memory_before=memory_before
    )
    return WorkersFailed(report.format(), exit_code=report.exit_code, raised=report.raised)


def launcher_stopped(prog: str, signum: int, stopped_note: str) -> WorkersFailed:
    """The launch's end when the launcher itself got a signal (Kubernetes or Slurm stopping the job,
    a Ctrl-C): torch's agent has forwarded it to the workers and waited for them."""
    return WorkersFailed(
        f"{prog}: stopped by {signal_name(signum)}; {stopped_note}{signal_hint(signum)}", exit_code=128 + signum
    )


def hang_failure(prog: str, watch: JobWatch, max_restarts: int) -> WorkersFailed:
    """The launch's end after ``--on-hang stop`` (or ``restart`` with no restart left): the report
    is the message's last lines."""
    event = watch.event
    assert event is not None
    if watch.stopping:
        what = "stopped the workers: they hung (--on-hang stop)"
    else:
        what = f"the workers hung and no restart is left (--max-restarts {max_restarts}; --on-hang restart)"
    return WorkersFailed(f"{prog}: {what}\n{event.report}", exit_code=EXIT_HUNG)


def rendezvous_failure(err: Exception, plan: RendezvousPlan) -> ShoalError | None:
    """What a rendezvous that did not complete says (endpoint, arrivals, hint); None when ``err``
    is no rendezvous failure."""
    from shoal.launch.rendezvous.explain import explain_failure, is_rendezvous_failure

    if not is_rendezvous_failure(err):
        return None
    if not plan.single_node:
        return explain_failure(err, plan)
    return ShoalError(
        f"the workers' rendezvous on this machine failed: {first_line(err)}",
        "run again; if it persists, run with --verbose and report the output",
        exit_code=1,
    )


SLURM_WARNING_HINT = (
    "SIGUSR1 is Slurm's warning that the job's time limit is near (#SBATCH --signal=USR1@60, which shoal "
    "launch slurm writes). A script that uses ctx.preemption() with a checkpointer (shoal train does) saves and "
    "stops on it: submit the same job again to resume from that checkpoint. Any other script just stops: give "
    "a longer --time, or delete that line to run up to the limit"
)


def signal_hint(signum: int, environ: Mapping[str, str] = os.environ) -> str:
    """``\nHINT: ...`` for a stop that Slurm's pre-timeout signal caused (SIGUSR1 in a Slurm job), else ``""``."""
    return f"\nHINT: {SLURM_WARNING_HINT}" if signum == signal.SIGUSR1 and "SLURM_JOB_ID" in environ else ""


def _failure_time(failure: ProcessFailure, stderr_log: str | None) -> float:
    """When the worker failed, as precisely as known (see the module docstring): its error file is
    written as it fails; its stderr log may have been idle since it started (a traceback that went
    to the error file instead)."""
    for path in (failure.error_file, stderr_log):
        if path and path != _NOT_AVAILABLE and os.path.isfile(path):
            return os.path.getmtime(path)
    return float(failure.timestamp)


def _read_text(path: str, limit: int = 1 << 20) -> str:
    """The last ``limit`` bytes of a log (a traceback is at the end; logs can be huge)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", errors="replace")

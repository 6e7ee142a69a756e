"""Flyte's intra-task checkpoint kept as a copy of a shoal run's resumable state, so a retry resumes.

How Flyte hands checkpoints between attempts (flytepropeller, ``pkg/controller/nodes/task/
taskexec_context.go``, ``ComputePreviousCheckpointPath``): every attempt writes to a checkpoint
location of its own, ``<attempt's raw output prefix>/_flytecheckpoints``, and attempt N reads attempt
N-1's, and only that one. In the container, ``pyflyte-execute --checkpoint-path ... --prev-checkpoint
...`` gives both to flytekit's ``SyncCheckpoint`` (flytekit ``core/checkpointer.py``):
``restore()`` downloads the previous location, ``save(path)`` uploads a file or a directory's contents.
A local run (``pyflyte run``) has a location and no previous one: flytekit retries nothing locally.

So :class:`CheckpointMirror`

- :meth:`~CheckpointMirror.restore`: before training, copies the previous attempt's files into the run
  directory (unless it has checkpoints of its own) and at once uploads them to this attempt's
  location, so an attempt that dies before its first checkpoint still hands them on;
- while training, a thread uploads every new checkpoint of the run, a ``ckpt-e*-s*.pt`` file or a
  sharded ``ckpt-e*-s*.dcp`` directory (shoal writes each one under a temporary name and renames it,
  so a name appears only once the checkpoint is complete), after the run's
  ``config.json``, ``metrics.jsonl`` and ``accuracies.json`` (the epochs already logged: a resumed
  run's metrics start with them; they go first, so they are never older than the newest checkpoint),
  and removes what shoal's retention (``keep``) removed;
- on exit, does that once more: the checkpoint a preemption wrote goes up before the task fails.

The ``latest`` pointer is not copied: shoal finds the newest valid file by its name, and the next
save writes the pointer again. Tracker files (``tensorboard/``, ``wandb/``) and ``model.pt`` stay local.
A mirror that fails is reported once and stops; training goes on.
"""

from __future__ import annotations

import contextvars
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from shoal.checkpoint.manager import CheckpointManager
from shoal.train.outputs import ACCURACIES, CONFIG, METRICS

RUN_FILES = (CONFIG, METRICS, ACCURACIES)
"""The run directory's files a resumed attempt needs besides the checkpoints."""
DEFAULT_INTERVAL_S = 0.25
"""How often the thread looks for a new checkpoint (a directory listing: cheap)."""
STOP_TIMEOUT_S = 120.0
"""How long leaving the mirror waits for an upload still under way."""


class CheckpointMirror:
    """Keep ``checkpoint`` (flytekit's ``current_context().checkpoint``) a copy of the run in ``run_dir``
    whose checkpoints live in ``checkpoint_dir``. Use :meth:`restore` first, then ``with mirror:``
    around the training."""

    def __init__(
        self, checkpoint: Any, run_dir: Path, checkpoint_dir: Path, *, interval: float = DEFAULT_INTERVAL_S
    ) -> None:
        self.checkpoint = checkpoint
        self.run_dir = Path(run_dir)
        self.checkpoints = CheckpointManager(Path(checkpoint_dir))
        self.interval = interval
        self.uploaded: set[str] = set()
        """Checkpoint file names in this attempt's Flyte checkpoint."""
        self.failure: str | None = None
        self._lock = threading.Lock()  # flytekit's SyncCheckpoint is not thread-safe
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- before training ------------------------------------------------------------------------

    def restore(self) -> list[str]:
        """Bring the previous attempt's files into the run and carry them into this attempt's
        checkpoint; the names of the checkpoint files restored (none: nothing to resume from there)."""
        if self.checkpoints.checkpoints():
            return []  # the run directory has checkpoints of its own (a given out=, a restarted group)
        previous = self.checkpoint.restore()  # None when there is no previous attempt
        if previous is None:
            return []
        previous = Path(previous)
        found = CheckpointManager(previous).checkpoints()
        if not found:
            return []
        with self._lock:
            self.checkpoint.save(previous)  # carried forward first: this attempt may die any time
        self.checkpoints.directory.mkdir(parents=True, exist_ok=True)
        for path in found:
            _copy(path, self.checkpoints.directory / path.name)
        for name in RUN_FILES:
            if (previous / name).is_file():
                shutil.copyfile(previous / name, self.run_dir / name)
        self.uploaded = {p.name for p in found}
        return [p.name for p in found]

    # -- while training -------------------------------------------------------------------------

    def sync(self) -> None:
        """Upload the checkpoints not uploaded yet (the run's files first) and remove those gone."""
        with self._lock:
            present = {p.name: p for p in self.checkpoints.checkpoints()}
            new = [path for name, path in present.items() if name not in self.uploaded]
            gone = sorted(self.uploaded - present.keys())
            if new:
                for name in RUN_FILES:
                    if (self.run_dir / name).is_file():
                        self.checkpoint.save(self.run_dir / name)
            for path in new:
                try:
                    self._upload(path)
                except Exception:
                    if path.exists():
                        raise
                    continue  # retention removed it meanwhile: a newer one is on its way
                self.uploaded.add(path.name)
            for name in gone:
                if self._remove(name):
                    self.uploaded.discard(name)

    def _upload(self, path: Path) -> None:
        """One checkpoint into this attempt's location under its own name. flytekit uploads a
        directory's contents (not the directory), so a sharded ``.dcp`` goes up from a staging
        directory holding only it (hard links: no copy of the shards)."""
        if not path.is_dir():
            self.checkpoint.save(path)
            return
        with tempfile.TemporaryDirectory(prefix=".tmp-flyte-", dir=self.run_dir) as staging:
            _copy(path, Path(staging) / path.name, link=True)
            self.checkpoint.save(Path(staging))

    def _remove(self, name: str) -> bool:
        """Delete ``name`` from this attempt's checkpoint location; False where that cannot be done.

        flytekit's Checkpoint API has no delete (flytekit 1.16 ``core/checkpointer.py``): the
        location is read from ``SyncCheckpoint._checkpoint_dest``, as the kfpytorch plugin does to
        hand it to its workers. Without it the old files stay (more storage, same resume)."""
        destination = getattr(self.checkpoint, "_checkpoint_dest", None)
        if not destination:
            return False
        from flytekit.core.context_manager import FlyteContextManager

        target = f"{str(destination).rstrip('/')}/{name}"
        file_system = FlyteContextManager.current_context().file_access.get_filesystem_for_path(target)
        if file_system.exists(target):
            file_system.rm(target, recursive=True)  # a sharded checkpoint is a directory
        return True

    def __enter__(self) -> CheckpointMirror:
        # The thread runs in a copy of this context: flytekit keeps the task's context (and with it
        # the file access the checkpoint uploads through) in a ContextVar.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._watch,), name="shoal-flyte-checkpoint", daemon=True
        )
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception as err:
                self._fail(err)
                return

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            if self._thread.is_alive():
                self._fail(TimeoutError(f"an upload still runs after {STOP_TIMEOUT_S:.0f} s"))
                return
        if self.failure is None:
            try:
                self.sync()
            except Exception as err:
                self._fail(err)

    def _fail(self, err: BaseException) -> None:
        if self.failure is not None:
            return
        self.failure = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
        print(
            f"shoal: flyte: copying checkpoints to Flyte's checkpoint failed and stopped ({self.failure}); "
            "training goes on, a retry resumes from what was copied before",
            file=sys.stderr,
            flush=True,
        )


def _copy(source: Path, destination: Path, *, link: bool = False) -> None:
    """A checkpoint file, or a sharded checkpoint's directory; ``link``: hard links where possible."""
    if not source.is_dir():
        shutil.copyfile(source, destination)
        return

    def copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, destination, copy_function=copy if link else shutil.copy2)

"""The tracker the trainer and users' loops log through: rank 0 only, never fatal, resumable.

:func:`create_tracker` is the one entry point. On global rank 0 it returns a :class:`Tracker`
that fans every call out to the chosen backends, each on its own thread (:mod:`shoal.tracking.sink`);
on every other rank it returns a tracker with no backends, whose methods do nothing, which imports
no tracker library and which, like every tracker, never runs a collective.

Contract with the caller:

- Numbers given to a tracker are the job's numbers already: reduce per-rank values first (the
  trainer does; users' loops call :func:`shoal.tracking.reduce_metrics` on every rank).
- ``step`` is the caller's global optimizer step. Steps only grow (W&B drops a step lower than the
  last one), and a resumed job continues after the step its checkpoint was taken at.
- Nothing the tracker does can fail or stall the job: a backend that raises is reported once and
  turned off; ``close`` is bounded in time.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from shoal.errors import ShoalError
from shoal.tracking.backend import Backend, Resume, RunOptions
from shoal.tracking.predictions import Predictions
from shoal.tracking.sink import Sink
from shoal.tracking.spec import TRACKERS, parse_spec, require_installed

STATE_FORMAT = 1


class Tracker:
    """Logs to the chosen trackers from rank 0. Made by :func:`create_tracker`.

    The first logging call starts the backends (each opens its run on its own thread), so
    :meth:`load_state_dict` may come any time before it, e.g. from a checkpoint's ``restore``.
    Call it from one thread (the training loop's); it is cheap: each call only queues work.
    """

    def __init__(
        self,
        names: Iterable[str],
        options: RunOptions,
        *,
        config: Mapping[str, Any] | None = None,
        state: Mapping[str, Any] | None = None,
        max_predictions: int = 64,
        close_timeout: float = 30.0,
        state_timeout: float = 10.0,
    ) -> None:
        self.names: tuple[str, ...] = tuple(names)
        self.options = options
        self.max_predictions = max_predictions
        self.close_timeout = close_timeout
        self.state_timeout = state_timeout
        self._pending_config = dict(config) if config is not None else None
        self._resumed: dict[str, Any] = {}
        self._resumed_step: int | None = None  # the step the loaded state was taken at
        self._last_step: int | None = None
        self._sinks: list[Sink] | None = None
        self._closed = False
        self._said: set[str] = set()
        self._classes = {name: _load_backend(name) for name in self.names}
        if state:
            self.load_state_dict(state)
        if self.names:
            _OPEN.add(self)  # a script that forgets close() still ends its runs at exit (bounded)

    # -- what callers log -----------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether any backend is (still) logging."""
        if not self.names or self._closed:
            return False
        return self._sinks is None or any(not sink.failed for sink in self._sinks)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The run's resolved configuration (hyperparameters); nested dicts are fine."""
        self._fan_out("log_config", dict(config), self._last_step or 0)

    def log(self, metrics: Mapping[str, Any], *, step: int) -> None:
        """Numbers (floats, ints, one-element tensors) at global step ``step``."""
        values = self._numbers(metrics)
        self._advance(step)
        if values:
            self._fan_out("log_scalars", values, step, time.time())

    def log_epoch(self, record: Mapping[str, Any], *, step: int) -> None:
        """One epoch's record (what ``metrics.jsonl`` holds) at the global step the epoch ended.

        Every number but ``epoch`` is logged as ``epoch/<name>``, with ``epoch`` beside it (W&B
        plots ``epoch/*`` against it).
        """
        values = {("epoch" if key == "epoch" else f"epoch/{key}"): value for key, value in record.items()}
        self.log(values, step=step)

    def log_predictions(self, predictions: Predictions, *, step: int, name: str = "predictions") -> None:
        """A table of classification predictions (see :class:`Predictions`), at most
        ``max_predictions`` rows: W&B gets a ``wandb.Table`` with images, MLflow a table artifact
        ``<name>/step-<step>.json``, TensorBoard one image per row and a text table."""
        if len(predictions) > self.max_predictions:
            self._say_once(
                "rows", f"predictions tables keep their first {self.max_predictions} of {len(predictions)} rows"
            )
            predictions = predictions.head(self.max_predictions)
        self._advance(step)
        self._fan_out("log_predictions", name, predictions, step)

    def flush(self, timeout: float | None = None) -> bool:
        """Make what was logged so far durable and wait (at most ``timeout``, default
        ``close_timeout``) until every backend has; False if one is still busy. After a flush, log
        at later steps only: W&B has written the step's row."""
        return not self._flush_naming_busy(self.close_timeout if timeout is None else timeout)

    def _flush_naming_busy(self, timeout: float) -> list[str]:
        """:meth:`flush`, returning the names of the trackers still busy after ``timeout`` s."""
        if not self._started() or self._closed:
            return []
        self._fan_out("flush")
        deadline = time.monotonic() + timeout
        return [s.name for s in self._sinks or [] if not s.wait_idle(max(0.0, deadline - time.monotonic()))]

    # -- resume -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a resumed job needs to continue the same runs: W&B run id, MLflow run id, the last
        step logged (TensorBoard drops later steps on resume). Plain values, safe for
        ``torch.load(weights_only=True)``; save it with the checkpoint taken at that step.

        It first flushes (waiting at most ``state_timeout``), so what was logged up to the
        checkpoint is on disk (or sent) before the checkpoint is, and a job killed right after
        the checkpoint loses none of it: TensorBoard's event file flushed, W&B's transaction log
        read back until it holds the last step, MLflow's requests returned. Call it once
        everything of that step is logged: what is logged later is not in the checkpoint's state,
        and a resumed job does not log it again."""
        busy = self._flush_naming_busy(self.state_timeout)
        if busy:  # never silent: the checkpoint's promise does not hold for these
            _print(
                f"shoal: tracker: {', '.join(busy)} had not made step {self._last_step} durable within "
                f"{self.state_timeout:g} s of the checkpoint; a job stopped right after it may lose those steps there "
                "(create_tracker(state_timeout=...) waits longer)"
            )
        trackers = dict(self._resumed)
        for sink in self._sinks or []:
            if sink.backend.state_needs_open and not sink.wait_open(self.state_timeout):
                continue  # still opening (a slow server): keep what the previous attempt had
            trackers[sink.name] = sink.backend.state()
        return {"format": STATE_FORMAT, "step": self._last_step, "trackers": trackers}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Continue the runs of a previous attempt (``state`` from :meth:`state_dict`; None or
        ``{}``: nothing to continue). Call it before anything is logged."""
        if self._sinks is not None:
            raise ShoalError(
                "the tracker's state was loaded after it had started logging",
                "call tracker.load_state_dict(...) (or pass state=) before the first log call",
            )
        if not state:
            return
        if state.get("format") != STATE_FORMAT:
            raise ShoalError(
                f"tracker state format {state.get('format')!r} is not {STATE_FORMAT}",
                "resume with the shoal version that wrote the checkpoint, or start a new run",
            )
        self._resumed = {name: dict(value) for name, value in (state.get("trackers") or {}).items()}
        step = state.get("step")
        self._resumed_step = self._last_step = None if step is None else int(step)

    # -- the end ------------------------------------------------------------------------------

    def close(self, *, failed: bool = False, timeout: float | None = None) -> None:
        """End every run (``failed``: marked failed/crashed), waiting at most ``timeout`` seconds
        (default ``close_timeout``) in all; a backend still busy then is left behind, with a
        message. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)
        limit = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        for sink in self._sinks or []:  # every backend closes at once, on its own thread
            sink.close(failed)
        for sink in self._sinks or []:
            if not sink.join(deadline):
                sink.backend.say(f"did not finish within {limit:g} s; left behind" + sink.backend.unfinished_hint())

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        self.close(failed=exc_type is not None)

    def __repr__(self) -> str:
        return f"Tracker({', '.join(self.names) or 'no trackers'}, run_dir={str(self.options.run_dir)!r})"

    # -- internals ----------------------------------------------------------------------------

    def _started(self) -> bool:
        return self._sinks is not None

    def _start(self) -> list[Sink]:
        if self._sinks is None:
            self.options.run_dir.mkdir(parents=True, exist_ok=True)
            self._sinks = []
            for name in self.names:
                resumed = self._resumed.get(name)
                resume = Resume(self._resumed_step, resumed) if resumed is not None else None
                backend = self._classes[name](self.options, resume, _speaker(name))
                sink = Sink(backend, backend.say)
                sink.start()
                self._sinks.append(sink)
            if self._pending_config is not None:
                config, self._pending_config = self._pending_config, None
                self._fan_out("log_config", config, self._last_step or 0)
        return self._sinks

    def _fan_out(self, method: str, *args: Any) -> None:
        if not self.names or self._closed:
            return
        for sink in self._start():
            sink.submit(getattr(sink.backend, method), *args)

    def _advance(self, step: int) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        self._last_step = step if self._last_step is None else max(self._last_step, step)

    def _numbers(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        values: dict[str, float] = {}
        for key, value in metrics.items():
            try:
                number = float(value.item() if hasattr(value, "item") else value)
            except (TypeError, ValueError):
                self._say_once(f"not-a-number-{key}", f"ignoring {key!r}: not a number ({type(value).__name__})")
                continue
            values[str(key)] = number
        return values

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            _print(f"shoal: tracker: {message}")


def create_tracker(
    spec: str | Iterable[str] | None,
    *,
    run_dir: str | os.PathLike,
    project: str = "shoal",
    run_name: str | None = None,
    config: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
    rank: int | None = None,
    mlflow_uri: str | None = None,
    max_predictions: int = 64,
    init_timeout: float = 30.0,
    close_timeout: float = 30.0,
    state_timeout: float = 10.0,
) -> Tracker:
    """A tracker for ``spec`` (``"wandb,tensorboard,mlflow"``, any subset; None/"" for none).

    Call it on every rank: global rank 0 gets the real trackers, the others a tracker whose methods
    do nothing (no tracker library imported, no collective). Unknown names and missing packages are
    a :class:`ShoalError` on every rank alike, before anything starts.

    Args:
        spec: the trackers, comma-separated (or a list of names).
        run_dir: where local files go: ``run_dir/tensorboard``, ``run_dir/wandb``.
        project: W&B project and MLflow experiment.
        run_name: the run's display name (default: ``run_dir``'s name).
        config: the resolved configuration, logged once when logging starts.
        state: a previous :meth:`Tracker.state_dict` (from a checkpoint): continue those runs.
        rank: this process's global rank (default: read from torch.distributed when it is
            initialised, else from the launcher's environment variables).
        mlflow_uri: MLflow tracking URI (default: ``MLFLOW_TRACKING_URI``, else MLflow's default).
        max_predictions: rows kept per predictions table.
        init_timeout: seconds W&B may take to open an online run before logging offline instead.
        close_timeout: seconds :meth:`Tracker.close` waits for all trackers together.
        state_timeout: seconds :meth:`Tracker.state_dict` (a checkpoint) waits for the trackers to
            make what was logged durable; past it the checkpoint goes on, and a line says which
            trackers were still busy.

    In a training loop (``ctx.tracker(...)`` passes the run's rank for you)::

        tracker = shoal.tracking.create_tracker("wandb,tensorboard", run_dir="runs/a", config=vars(args))
        for step, (x, y) in enumerate(loader, 1):
            loss = train_step(x, y)
            if step % 50 == 0:
                stats = shoal.tracking.reduce_metrics({"loss": loss.item()}, count=len(y))  # every rank
                tracker.log({"train/loss": stats["loss"], "lr": lr}, step=step)             # rank 0 logs
        tracker.close()
    """
    names = parse_spec(spec)
    require_installed(names)
    path = Path(run_dir).expanduser()
    options = RunOptions(
        run_dir=path,
        project=project,
        run_name=run_name or path.resolve().name,
        mlflow_uri=mlflow_uri,
        init_timeout=init_timeout,
        flush_timeout=state_timeout,
    )
    is_main = (global_rank() if rank is None else rank) == 0
    return Tracker(
        names if is_main else (),
        options,
        config=config,
        state=state,
        max_predictions=max_predictions,
        close_timeout=close_timeout,
        state_timeout=state_timeout,
    )


def global_rank() -> int:
    """This process's rank in the job, without importing torch when the caller has not."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    from shoal.env import detect_environment

    return detect_environment().rank


# Imported (with their libraries, see Backend.load) only when rank 0 makes a tracker.
_BACKENDS = {
    "wandb": ("shoal.tracking.wandb_backend", "WandbBackend"),
    "tensorboard": ("shoal.tracking.tensorboard_backend", "TensorBoardBackend"),
    "mlflow": ("shoal.tracking.mlflow_backend", "MlflowBackend"),
}


def _load_backend(name: str) -> type[Backend]:
    module, cls = _BACKENDS[name]
    backend: type[Backend] = getattr(importlib.import_module(module), cls)
    try:
        backend.load()
    except ImportError as err:  # installed, but broken (a missing dependency of its own)
        raise ShoalError(
            f"the {name} tracker cannot import its library: {str(err).splitlines()[0]}",
            f"pip install --force-reinstall 'shoal[{TRACKERS[name].extra}]' (or drop {name} from --tracker)",
        ) from None
    return backend


def _speaker(name: str):
    def say(message: str) -> None:
        _print(f"shoal: tracker {name}: {message}")

    return say


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_OPEN: weakref.WeakSet[Tracker] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for tracker in list(_OPEN):
        tracker.close()

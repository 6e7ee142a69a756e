"""A Flyte task whose body is one shoal call: :func:`train_task`, :func:`fit`, :func:`resources`.

``train_task(nproc=N, ...)`` is ``flytekit.task`` with one GPU requested per worker process, and
:func:`fit` inside it starts exactly those N workers: GPUs requested = processes started, by
construction. :func:`fit` is ``shoal.fit`` plus what a Flyte task needs: a run directory in the
task's sandbox, resume from (and copies to) Flyte's intra-task checkpoint
(:mod:`~shoal.flyte.mirror`), failures a retry can fix raised as
``FlyteRecoverableException`` (Flyte retries only those: flytekit ``bin/entrypoint.py`` files every
other user exception as non-recoverable), and the outputs as :class:`TrainOutputs`.

Inside a ``flytekitplugins-kfpytorch`` ``Elastic`` task the plugin's agent (torch's elastic agent)
starts the workers and runs the body in each: shoal's launch detection sees one rank of a job
(``TORCHELASTIC_RUN_ID`` and the ranks' variables, as under torchrun), ``shoal.fit`` trains as that
rank, and global rank 0 owns the run directory, the checkpoint copies and the outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import tempfile
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from typing import Any

import flytekit
from flytekit.core.resources import Resources
from flytekit.exceptions.user import FlyteRecoverableException

from shoal.env import EnvInfo, detect_environment
from shoal.errors import ShoalError
from shoal.flyte.mirror import CheckpointMirror
from shoal.flyte.outputs import TrainOutputs, epoch_accuracies, to_outputs

_TASK_NPROC: ContextVar[int | None] = ContextVar("shoal_flyte_task_nproc", default=None)
"""The worker count of the :func:`train_task` whose body runs now."""
RUN_DIR_KEY = "shoal/flyte/run_dir"
"""Key in torch's agent store under which global rank 0 of an Elastic task names the run directory."""


def resources(nproc: int = 1, *, gpu: bool = True, **others: Any) -> Resources:
    """``flytekit.Resources`` for ``@task(resources=...)``: ``nproc`` GPUs as request and limit (one per
    worker process; none with ``gpu=False``), plus ``cpu``, ``mem``, ``ephemeral_storage`` as given
    (a single value is a request only, a ``(request, limit)`` pair both: flytekit's rule)."""
    _check_nproc(nproc)
    return Resources(gpu=(nproc, nproc) if gpu else None, **others)


def train_task(_function: Callable[..., Any] | None = None, *, nproc: int = 1, gpu: bool = True, **task_options: Any):
    """``flytekit.task`` for a body that calls :func:`fit`: ``nproc`` workers, one GPU requested each.

    ``task_options`` go to ``flytekit.task`` unchanged (``retries``, ``cache``, ``cache_version``,
    ``requests``, ``limits``, ``resources``, ``container_image``...); the GPU count is set on
    ``resources`` (or on ``requests`` and ``limits`` when those are given). ``gpu=False``: CPU
    workers, no GPU requested. A GPU count given elsewhere that differs from ``nproc`` is an error::

        @train_task(nproc=2, retries=2, cache=True, cache_version="1")
        def train(epochs: int) -> TrainOutputs:
            return fit("mnist", epochs=epochs, data="/data")
    """
    _check_nproc(nproc)
    if gpu:
        _request_gpus(task_options, nproc)

    def decorate(function: Callable[..., Any]):
        @functools.wraps(function)  # flytekit reads the signature and type hints through __wrapped__
        def body(*args: Any, **kwargs: Any) -> Any:
            token = _TASK_NPROC.set(nproc)
            try:
                return function(*args, **kwargs)
            finally:
                _TASK_NPROC.reset(token)

        return flytekit.task(body, **task_options)

    return decorate(_function) if _function is not None else decorate


def fit(workload: Any = "digits", **options: Any) -> TrainOutputs:
    """``shoal.fit(workload, **options)`` as a Flyte task's body; the task's :class:`TrainOutputs`.

    - ``workload``: a bundled name, your own ``shoal.Workload`` as a spec (``"pkg.module:Name"``,
      ``"path/to/file.py:Name"``: a task input can be one) or an instance made in the body
      (docs/WORKLOADS.md); every option below applies to it as to a bundled one.

    - ``nproc``: inside :func:`train_task`, its ``nproc`` (giving another is an error); inside a kfpytorch
      ``Elastic`` task, none (the plugin started this rank); else as given (default 1).
    - ``out``: default, a new directory in the task's sandbox (``current_context().working_directory``).
    - Resume: the previous attempt's checkpoints come from Flyte's checkpoint before training, and
      every new checkpoint goes there while it trains (see :mod:`~shoal.flyte.mirror`).
    - A worker killed (a signal, the OOM killer, a lost node) or a preemption (SIGTERM) raises
      ``FlyteRecoverableException``: Flyte retries it (``retries=N``) and the retry resumes. Bad
      input, and a worker whose own code raised (your workload's exception, a bad argument), raise
      :class:`~shoal.errors.ShoalError`, which Flyte does not retry: a retry would fail the same way.
    """
    task_nproc = _TASK_NPROC.get()
    if task_nproc is not None:
        given = options.setdefault("nproc", task_nproc)
        if given != task_nproc:
            raise ShoalError(
                f"fit(nproc={given}) inside train_task(nproc={task_nproc}): the task requests {task_nproc} GPU(s)",
                "drop nproc from fit(): train_task's nproc decides both the GPUs and the processes",
            )
    checkpoint = _flyte_checkpoint()
    env = detect_environment()
    if env.world_size > 1:
        return _fit_as_rank(workload, options, checkpoint, env)
    given = options.pop("out", None)
    out = Path(given) if given else _new_run_dir(workload)
    try:
        return _fit_mirrored(workload, out, options, checkpoint)
    except ShoalError:
        if not given:
            with contextlib.suppress(OSError):
                out.rmdir()  # bad input: leave no empty run directory behind
        raise


def _fit_mirrored(workload: Any, out: Path, options: dict[str, Any], checkpoint: Any) -> TrainOutputs:
    """Train into ``out`` with the Flyte checkpoint restored first and copied to while training."""
    from shoal.train.job import fit as shoal_fit

    if checkpoint is None:
        return to_outputs(_recoverable(shoal_fit, workload, out=str(out), **options))
    mirror = CheckpointMirror(checkpoint, out, Path(options.get("checkpoint_dir") or out / "checkpoints"))
    restored = mirror.restore()
    if restored:
        _say(f"resuming from the previous attempt's Flyte checkpoint ({len(restored)} file(s), newest {restored[-1]})")
    with mirror:
        result = _recoverable(shoal_fit, workload, out=str(out), **options)
    return to_outputs(result)


def _fit_as_rank(workload: Any, options: dict[str, Any], checkpoint: Any, env: EnvInfo) -> TrainOutputs:
    """One rank of a job another launcher started (the Elastic plugin's agent): global rank 0 owns
    the run directory, Flyte's checkpoint and the outputs; the others train into the same directory."""
    from shoal.train.job import fit as shoal_fit

    given = options.pop("out", None)
    if env.rank == 0:
        out = Path(given or _shared_run_dir(lambda: str(_new_run_dir(workload))))
        return _fit_mirrored(workload, out, options, checkpoint)
    out = given or _shared_run_dir(None)
    result = _recoverable(shoal_fit, workload, out=out, **options)
    return TrainOutputs(epoch_accuracies=epoch_accuracies(result), model_state=None)


def _shared_run_dir(propose: Callable[[], str] | None) -> str:
    """The run directory every rank of this launch uses, agreed through torch's agent store.

    Rank 0 (``propose``) reuses the one an earlier round of the same launch named (a group the
    agent restarted resumes from its local checkpoints) or names a new one; the others wait for it.
    The key lives in the rendezvous store of the plugin's agent, which the workers reach at
    MASTER_ADDR:MASTER_PORT when ``TORCHELASTIC_USE_AGENT_STORE=True`` (torch's default since 2.3)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise ShoalError(
            "the ranks of this job cannot agree on a run directory: torch's agent store is not shared "
            "with the workers (TORCHELASTIC_USE_AGENT_STORE is not True)",
            "pass out=DIR to fit(), on storage every rank can read",
        )
    from torch.distributed import TCPStore

    from shoal.distributed.process_group import DEFAULT_INIT_TIMEOUT_S

    wait = float(os.environ.get("SHOAL_INIT_TIMEOUT") or DEFAULT_INIT_TIMEOUT_S)
    store = TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=wait)
    )
    key = f"{RUN_DIR_KEY}/{os.environ.get('TORCHELASTIC_RUN_ID', '')}"
    try:
        if propose is None:
            return store.get(key).decode()
        if store.check([key]):
            return store.get(key).decode()
        chosen = propose()
        store.set(key, chosen)
        return chosen
    except RuntimeError as err:  # the store's timeout: rank 0 never named the directory
        raise ShoalError(
            f"waited {wait:.0f} s for global rank 0 to name the run directory at "
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}: {str(err).splitlines()[0]}",
            "see rank 0's error; or pass out=DIR to fit(), on storage every rank can read",
        ) from None


def _recoverable(shoal_fit: Callable[..., Any], workload: Any, **options: Any) -> Any:
    """``shoal_fit(workload, **options)``; a failure a retry can fix as ``FlyteRecoverableException``."""
    from shoal.launch.core import WorkersFailed
    from shoal.preemption import Preempted

    try:
        return shoal_fit(workload, **options)
    except (WorkersFailed, Preempted) as err:
        if isinstance(err, WorkersFailed) and err.raised:
            raise  # the user's code or input failed: a retry would fail the same way (a user error to Flyte)
        raise FlyteRecoverableException(
            f"{err.format()}\nshoal: a retry of this task resumes from the last checkpoint copied to Flyte"
        ) from None
    except ShoalError as err:
        if err.hint and hasattr(err, "add_note"):  # Python 3.11+: Flyte's error report shows the hint
            err.add_note(f"HINT: {err.hint}")
        raise


def _flyte_checkpoint() -> Any:
    """This task attempt's ``current_context().checkpoint``, or None (no task, or no checkpointing)."""
    try:
        return flytekit.current_context().checkpoint
    except NotImplementedError:
        return None


def _new_run_dir(workload: Any) -> Path:
    """A new directory for the run in the task's sandbox (a fresh one per attempt and per execution)."""
    from shoal.workloads import label, short_name

    sandbox = Path(flytekit.current_context().working_directory)
    sandbox.mkdir(parents=True, exist_ok=True)
    name = short_name(workload if isinstance(workload, str) else label(workload))
    return Path(tempfile.mkdtemp(prefix=f"shoal-{name}-", dir=sandbox))


def _request_gpus(task_options: dict[str, Any], nproc: int) -> None:
    """One GPU per process as request and limit (Kubernetes needs the limit for GPUs): on
    ``resources`` as a (request, limit) pair, or on ``requests`` and ``limits`` when either is given
    (flytekit takes one way or the other). A different GPU count given there is an error."""
    split = task_options.get("requests") is not None or task_options.get("limits") is not None
    for name in ("requests", "limits") if split else ("resources",):
        current = task_options.get(name) or Resources()
        given = current.gpu if isinstance(current.gpu, (list, tuple)) else [current.gpu]
        if any(value is not None and str(value) != str(nproc) for value in given):
            raise ShoalError(
                f"train_task(nproc={nproc}) with {name}=Resources(gpu={current.gpu!r}): one GPU per process is {nproc}",
                "drop gpu from the resources (train_task sets it), or pass gpu=False for CPU workers",
            )
        task_options[name] = dataclasses.replace(current, gpu=nproc if split else (nproc, nproc))


def _check_nproc(nproc: int) -> None:
    if not isinstance(nproc, int) or nproc < 1:
        raise ShoalError(f"nproc must be a whole number of processes, at least 1, got {nproc!r}", "pass nproc=2, say")


def _say(text: str) -> None:
    print(f"shoal: flyte: {text}", flush=True)

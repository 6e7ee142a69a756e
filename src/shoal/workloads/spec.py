"""Workload specs: ``digits`` (bundled), ``pkg.module:Name`` or ``path/to/file.py:Name``.

``Name`` may be a :class:`~shoal.workloads.base.Workload` subclass (called with no arguments), an
instance, or a zero-argument factory returning one. Resolving a spec imports the user's code; every
failure there is a :class:`~shoal.errors.ShoalError` naming the user's file and line
(:mod:`shoal.workloads.blame`).

No torch import at module level: ``shoal train --help`` lists the bundled names through this.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pickle
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.errors import ShoalError, close_match, first_line
from shoal.workloads.blame import blame, defined_at
from shoal.workloads.blame import shown_path as _shown_file

if TYPE_CHECKING:
    from shoal.workloads.base import Workload

BUNDLED: dict[str, str] = {
    "digits": "shoal.workloads.digits:Digits",
    "mnist": "shoal.workloads.mnist:MNIST",
    "cifar10": "shoal.workloads.cifar10:CIFAR10",
    "synthetic": "shoal.workloads.synthetic:Synthetic",
}
SPEC_FORMS = "digits, mnist, cifar10, synthetic, pkg.module:Name or path/to/file.py:Name"


def check_form(spec: str) -> None:
    """A ShoalError if ``spec`` cannot name a workload (empty, an unknown bundled name, a ``:`` with
    nothing on one side), without importing anything: :class:`shoal.train.config.TrainConfig` checks
    it with the flags, so ``shoal train`` says so before torch loads."""
    if not isinstance(spec, str) or not spec.strip():
        raise ShoalError(f"a workload spec must be a non-empty string, got {spec!r}", f"pass one of: {SPEC_FORMS}")
    if spec in BUNDLED:
        return
    if ":" not in spec:
        close = close_match(spec, BUNDLED)
        raise ShoalError(
            f"unknown workload {spec!r}",
            f"did you mean `shoal train {close}`?"
            if close
            else f"choose one of: {', '.join(BUNDLED)} (e.g. `shoal train digits`), or your own as "
            "pkg.module:Name or path/to/file.py:Name",
        )
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ShoalError(f"workload spec {spec!r} is incomplete", "write it as pkg.module:Name or path/to/file.py:Name")


def resolve(spec: str) -> Workload:
    """The workload ``spec`` names, as an instance (a fresh one for a class or a factory)."""
    check_form(spec)
    return _instantiate(_import_target(BUNDLED.get(spec, spec)), spec)


def label(workload: Any) -> str:
    """What trained, for config.json and re-import in each worker: the spec that names ``workload``'s
    class (``pkg.module:Name``, ``path/to/file.py:Name``, or a bundled name)."""
    cls = type(workload)
    for name, target in BUNDLED.items():
        if target == f"{cls.__module__}:{cls.__qualname__}":
            return name
    source = getattr(sys.modules.get(cls.__module__), "__shoal_spec_file__", None)
    return f"{source or cls.__module__}:{cls.__qualname__}"


def short_name(spec: str) -> str:
    """A name for run directories: ``digits``, or ``Name`` of ``...:Name``, made file-name safe."""
    name = spec.rsplit(":", 1)[-1] if ":" in spec else spec
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "workload"


def _import_target(spec: str) -> Any:
    where, _, name = spec.rpartition(":")  # complete: check_form said so
    module = _load_file(where, spec) if where.endswith(".py") or "/" in where else _load_module(where, spec)
    target: Any = module
    for part in name.split("."):
        if not hasattr(target, part):
            file = _shown_file(getattr(module, "__file__", None) or where)
            known = sorted(n for n, v in vars(module).items() if _looks_like_workload(v))
            raise ShoalError(
                f"{file} has no {name!r} (from workload spec {spec!r})",
                "name a Workload subclass, instance or factory defined there"
                + (f", e.g. {where}:{known[0]}" if known else " (none found)"),
            )
        target = getattr(target, part)
    return target


def _load_module(module_name: str, spec: str) -> Any:
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ShoalError(
            f"workload spec {spec!r}: no module named {module_name!r}",
            "install the package, add its directory to PYTHONPATH, or give a file: path/to/file.py:Name",
        )
    with blame(None, f"importing {module_name}", "fix the error in your module", files=_origin(found)):
        return importlib.import_module(module_name)


def _load_file(path_text: str, spec: str) -> Any:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ShoalError(
            f"workload spec {spec!r}: no such file {path_text}",
            "give the path of a .py file (relative to the current directory, or absolute) before the ':'",
        )
    resolved = path.resolve()
    module_name = "shoal_user_workload_" + re.sub(r"\W", "_", str(resolved))
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    spec_obj = importlib.util.spec_from_file_location(module_name, resolved)
    assert spec_obj is not None and spec_obj.loader is not None
    module = importlib.util.module_from_spec(spec_obj)
    module.__shoal_spec_file__ = path_text  # type: ignore[attr-defined]  (label() gives this path back)
    # Registered before it runs, as import does: dataclasses, pickle (spawned workers re-import by
    # the spec, not by this name) and typing look classes up in sys.modules.
    sys.modules[module_name] = module
    try:
        with blame(None, f"importing {path_text}", "fix the error in your file", files=(str(resolved),)):
            spec_obj.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _origin(found: Any) -> tuple[str, ...]:
    return (str(Path(found.origin).resolve()),) if getattr(found, "origin", None) else ()


def _looks_like_workload(value: Any) -> bool:
    from shoal.workloads.base import Workload

    return (inspect.isclass(value) and issubclass(value, Workload) and value is not Workload) or isinstance(
        value, Workload
    )


def _instantiate(target: Any, spec: str) -> Workload:
    """A class -> an instance of it; an instance -> itself; a factory -> what it returns (checked)."""
    from shoal.workloads.base import Workload

    if isinstance(target, Workload):
        return target
    if inspect.isclass(target) and not issubclass(target, Workload):
        raise _not_a_workload(target, spec)
    if not callable(target):
        raise _not_a_workload(target, spec)
    with blame(None, f"creating workload {spec}", "make it callable with no arguments", files=_files_of(target)):
        workload = target()
    if not isinstance(workload, Workload):
        raise _not_a_workload(target, spec, made=workload)
    return workload


def _files_of(target: Any) -> tuple[str, ...]:
    where = defined_at(target)
    return (where[0],) if where else ()


def _not_a_workload(target: Any, spec: str, made: Any = None) -> ShoalError:
    where = defined_at(target)
    at = f"{where[0]}:{where[1]}: " if where else ""
    what = f"returned a {type(made).__name__}" if made is not None else f"is of type {type(target).__name__}"
    return ShoalError(
        f"{at}workload spec {spec!r} {what}, not a shoal.Workload",
        "subclass shoal.Workload (or return an instance of one from a zero-argument function); see docs/WORKLOADS.md",
    )


@dataclass(frozen=True)
class Parcel:
    """A workload instance on its way to spawned workers: its class's spec (imported first, so a
    class from ``path/to/file.py`` is found by pickle) and the pickled instance."""

    spec: str
    payload: bytes

    @classmethod
    def of(cls, workload: Any, spec: str) -> Parcel:
        try:
            payload = pickle.dumps(workload)
        except Exception as err:  # pickling fails in many ways (lambdas, locks, open files)
            raise ShoalError(
                f"the workload {type(workload).__name__} cannot be pickled for spawned workers: {first_line(err)}",
                "keep only picklable attributes on the instance (create models and data in load()/build_model()), "
                "or pass a spec string such as 'path/to/file.py:Name' instead",
            ) from None
        return cls(spec, payload)

    def open(self) -> Workload:
        where = self.spec.rpartition(":")[0]
        if where.endswith(".py") or "/" in where:
            _load_file(where, self.spec)
        with blame(None, "unpickling the workload", "make the workload's class importable by its module name"):
            return pickle.loads(self.payload)

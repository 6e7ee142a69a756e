"""A failure in a workload's own code as one line naming the user's file and line, plus a HINT.

A user's workload runs inside shoal's loop: an exception from their dataset, model or loss would
otherwise surface as a traceback wall through shoal's and torch's internals. :func:`blame` finds the
innermost frame of the traceback that is the user's code (not shoal's own modules, not the standard
library or installed packages; the bundled workloads count as workload code too) and turns the
exception into a :class:`~shoal.errors.ShoalError` naming ``file:line``.

No torch import: the spec resolver (used by ``shoal train --help``) imports this module.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from shoal.errors import ShoalError, first_line

_SHOAL_DIR = str(Path(__file__).resolve().parent.parent) + os.sep
_BUNDLED_DIR = str(Path(__file__).resolve().parent) + os.sep
_NOT_WORKLOAD_CODE = ("base.py", "blame.py", "spec.py", "__init__.py")


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(key, "") for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(str(Path(d).resolve()) + os.sep for d in dirs if d)


_LIBRARY_DIRS = _library_dirs()


def is_workload_code(filename: str) -> bool:
    """``filename`` is a workload's code: the user's (anywhere but shoal, the standard library and
    installed packages) or a bundled workload's module."""
    if not filename or filename.startswith("<"):
        return False
    path = str(Path(filename).resolve())
    if path.startswith(_BUNDLED_DIR):
        return Path(path).name not in _NOT_WORKLOAD_CODE
    if path.startswith(_SHOAL_DIR):
        return False
    return not path.startswith(_LIBRARY_DIRS)


def innermost_frame(err: BaseException, files: Iterable[str] = ()) -> tuple[str, int] | None:
    """``(file, line)`` of the innermost traceback frame of ``err`` in workload code or in ``files``
    (e.g. an installed user package's module); a SyntaxError's own position when it is in one."""
    wanted = {str(Path(f).resolve()) for f in files}

    def chosen(filename: str) -> bool:
        return is_workload_code(filename) or (bool(wanted) and str(Path(filename).resolve()) in wanted)

    if isinstance(err, SyntaxError) and err.filename and chosen(err.filename):
        return shown_path(err.filename), int(err.lineno or 0)
    found = None
    tb: TracebackType | None = err.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if chosen(filename):
            found = (shown_path(filename), tb.tb_lineno)
        tb = tb.tb_next
    return found


@contextlib.contextmanager
def blame(workload: Any, what: str, hint: str, *, files: Iterable[str] = ()) -> Iterator[None]:
    """Inside: an exception (not a ShoalError) raised through workload code becomes
    ``FILE:LINE: WHAT failed: Type: message`` with ``hint``. One raised inside torch's layers with
    no workload code on the way (a model built from ``nn`` modules given inputs it cannot take)
    names the workload's ``build_model``. Any other exception passes unchanged."""
    try:
        yield
    except ShoalError:
        raise
    except Exception as err:
        found = innermost_frame(err, files)
        name = f" of {type(workload).__name__}" if workload is not None else ""
        if found is None and workload is not None and _inside_torch_layers(err):
            where = defined_at(type(workload).build_model)
            if where is not None:
                raise ShoalError(
                    f"{where[0]}:{where[1]}: the model{name} failed on a batch: {type(err).__name__}: "
                    f"{first_line(err)}",
                    "make build_model's model take the inputs your data gives (their shape and dtype)",
                ) from None
        if found is None:
            raise
        raise ShoalError(
            f"{found[0]}:{found[1]}: {what}{name} failed: {type(err).__name__}: {first_line(err)}", hint
        ) from None


def _inside_torch_layers(err: BaseException) -> bool:
    """``err`` was raised in a ``torch.nn`` module's forward (torch/nn/modules/...)."""
    marker = os.sep.join(("torch", "nn", "modules", ""))
    tb: TracebackType | None = err.__traceback__
    while tb is not None:
        if marker in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def defined_at(obj: Any) -> tuple[str, int] | None:
    """``(file, line)`` where a class, function or method is defined, if Python knows."""
    target = getattr(obj, "__func__", obj)
    try:
        filename = inspect.getsourcefile(target)
        line = inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return None
    return (shown_path(filename), line) if filename else None


def shown_path(filename: str) -> str:
    """A path as the user would type it: relative to the current directory when inside it."""
    path = Path(filename).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def checked_loss(workload: Any) -> Any:
    """``workload.loss``, with a failure that is not in the user's own code (the default
    cross-entropy given outputs of the wrong shape) explained as a model that does not fit the loss,
    at the line of the workload's ``build_model``."""
    loss = workload.loss

    def checked(outputs: Any, targets: Any) -> Any:
        try:
            return loss(outputs, targets)
        except ShoalError:
            raise
        except Exception as err:
            if innermost_frame(err) is not None:
                raise  # the user's own loss failed: blame() names its line
            where = defined_at(type(workload).build_model) or defined_at(type(workload))
            at = f"{where[0]}:{where[1]}: " if where else ""
            shapes = f"output {_shape(outputs)} and targets {_shape(targets)}"
            raise ShoalError(
                f"{at}the model of {type(workload).__name__} does not fit its loss ({shapes}): "
                f"{type(err).__name__}: {first_line(err)}",
                "make build_model's model return what loss() takes (the default, cross-entropy: N x classes "
                "logits and N class indices), or override loss() in your Workload",
            ) from None

    return checked


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"[{', '.join(str(d) for d in shape)}]" if shape is not None else type(value).__name__

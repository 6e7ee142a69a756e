"""The errors of ``shoal.horovod``: one line naming the problem and a HINT, typed as Horovod types them.

Each is a :class:`~shoal.errors.ShoalError` (message + hint) and also the built-in exception type
Horovod raises in the same situation (``ValueError`` for a call before ``hvd.init()`` or a bad
argument, ``AssertionError`` for ``zero_grad()`` between ``backward()`` and ``step()``,
``NotImplementedError`` for what shoal does not offer, ``HorovodInternalError`` (a RuntimeError) for
collectives whose ranks disagree), so a script that catches Horovod's
exceptions keeps working.

:func:`install_excepthook` makes an uncaught one print as those two lines instead of a traceback.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from types import TracebackType

from shoal.errors import ShoalError


class HorovodUsageError(ShoalError, ValueError):
    """A call Horovod would reject with ``ValueError``: before ``hvd.init()``, or a bad argument."""


class HorovodOrderError(ShoalError, AssertionError):
    """Calls in an order that would race or lose gradients (Horovod raises ``AssertionError``)."""


class HorovodUnsupported(ShoalError, NotImplementedError):
    """A Horovod feature shoal does not offer; the hint names shoal's equivalent."""


class HorovodMissingName(HorovodUnsupported, AttributeError):
    """A Horovod name ``shoal.horovod`` does not have (an AttributeError too, so ``hasattr`` is False)."""


class HorovodInternalError(RuntimeError):
    """Horovod's type for a failed collective, so that ``except hvd.HorovodInternalError`` works.

    shoal raises it (as :class:`HorovodMismatchError`) when ranks submit collectives that disagree;
    a collective that fails in the backend fails with torch's own error.
    """


class HorovodMismatchError(ShoalError, HorovodInternalError):
    """Ranks submitted collectives that disagree (shape, dtype, name, op...): Horovod's coordinator
    error, which ``hvd.synchronize`` raises there as ``HorovodInternalError``."""


def not_initialized(call: str) -> HorovodUsageError:
    """The error for ``hvd.<call>`` made before ``hvd.init()``."""
    return HorovodUsageError(
        f"hvd.{call} was called before hvd.init()",
        "call hvd.init() once at the start of the script (every rank), before any other hvd call",
    )


def _user_frame(tb: TracebackType | None) -> str:
    """``file:line`` where the user's code made the failing call: the innermost frame outside shoal,
    and outside the installed libraries (torch's autograd runs the optimizer's hooks) when one is."""
    shoal_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    libraries = tuple(os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "purelib", "platlib"))
    outside_shoal = [
        frame
        for frame in traceback.extract_tb(tb)
        if not os.path.abspath(frame.filename).startswith(shoal_dir + os.sep)
    ]
    users = [frame for frame in outside_shoal if not os.path.abspath(frame.filename).startswith(libraries)]
    chosen = (users or outside_shoal or [None])[-1]
    return f"{os.path.basename(chosen.filename)}:{chosen.lineno}" if chosen else ""


_remembered: list[ShoalError] = []


def remember(error: ShoalError) -> None:
    """Keep ``error`` for the excepthook: TensorFlow's ``py_function`` re-raises it as its own type."""
    _remembered[:] = [error]


def install_excepthook() -> None:
    """Print an uncaught :class:`ShoalError` as ``shoal: error: ...`` + ``HINT: ...``, not a traceback.

    Other exceptions go to the hook that was installed before. Installed once per process; the
    interpreter still exits with status 1 after an uncaught exception.
    """
    previous = sys.excepthook
    if getattr(previous, "_shoal_horovod", False):
        return

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(error, ShoalError) and _remembered and _remembered[0].message in str(error):
            error = _remembered[0]  # raised inside a tf.py_function, which re-raised it as a TF error
        if not isinstance(error, ShoalError):
            previous(kind, error, tb)
            return
        where = _user_frame(tb)
        text = error.format()
        if where:
            first, _, rest = text.partition("\n")
            text = f"{first} (at {where})" + (f"\n{rest}" if rest else "")
        print(text, file=sys.stderr, flush=True)

    hook._shoal_horovod = True  # type: ignore[attr-defined]
    sys.excepthook = hook

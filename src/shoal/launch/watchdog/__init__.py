"""The launcher's watch over its workers' progress: hangs, stragglers, stacks, and stopping for good.

One module per concept, in layers (each imports only from those below it; ``pyproject.toml``):

- :mod:`.monitor`: the watch that runs in the launcher: :class:`JobWatch`, one launch's watch, which
  the launch core runs beside torch's agent (the progress directory, the monitor, ``--on-hang`` acted
  on, the workers' trees stopped), and :class:`Monitor`, the thread polling the progress channel every
  second (hang reports with every rank's stack under ``RUN_DIR/hang-<time>/``, stragglers, the records
  shared with the other nodes' launchers), with :class:`HangEvent`;
- :mod:`.judges`: what is judged, over data (testable over snapshots): hangs (:class:`HangDetector`,
  :func:`hang_report`, :func:`where`) and stragglers (:class:`StragglerJudge`, :func:`straggler_line`);
  (the verdict written for the workers is :mod:`shoal.progress`'s ``VERDICT_FILE``, beside the records
  it judges);
- :mod:`.processes`: how it acts on this node's processes: every rank's stack (:func:`dump_stacks`,
  :func:`dump_all_stacks`, SIGUSR2 to the ranks), :func:`stop_processes` (SIGTERM, then SIGKILL after
  the grace), a process's children, descendants, start time;
- :mod:`.options`: the constants (``HANG_FLOOR_S``, ``ON_HANG``...) and :func:`hang_options`.

The names the rest of shoal uses are re-exported here (``from shoal.launch.watchdog import
JobWatch``); the others are imported from their module. Nothing in the package imports torch:
:mod:`shoal.launch.options` imports it on the ``--help`` path.
"""

from __future__ import annotations

from shoal.launch.watchdog.judges import Hang, HangDetector, StragglerJudge, activity, format_ranks, hang_report, where
from shoal.launch.watchdog.monitor import JobWatch, Monitor
from shoal.launch.watchdog.options import ON_HANG, hang_options
from shoal.launch.watchdog.processes import dump_all_stacks, dump_stacks, stop_processes

__all__ = [
    "ON_HANG",
    "Hang",
    "HangDetector",
    "JobWatch",
    "Monitor",
    "StragglerJudge",
    "activity",
    "dump_all_stacks",
    "dump_stacks",
    "format_ranks",
    "hang_options",
    "hang_report",
    "stop_processes",
    "where",
]

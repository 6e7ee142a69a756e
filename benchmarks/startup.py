"""``python -m benchmarks.startup``: wall time from the command to the first step completed on every rank.

Every variant starts ``--nproc`` workers that join a gloo process group and finish one DDP training
step of a tiny model (forward, backward with its gradient all-reduce, an SGD step: the first
optimizer step imports ``torch._dynamo``, about 2 s here, which any real first step pays too);
each rank then writes ``time.time()`` to a file. The figure is the last rank's
stamp minus the moment just before the command was started (same clock, same machine), so it
includes the interpreter and torch imports, the launcher, the rendezvous and the process group.
``cpu (s)`` is the CPU time (user + system) of the command and every process it waited for: what a
start-up costs a machine with fewer cores than processes, where the wall time hides it in overlap.
Variants run interleaved, rotated every round, after an untimed warm-up round (page cache); the
median of ``--repeat`` rounds is reported, with the ratio to torchrun's median and the *paired*
ratio (the median over rounds of each run against torchrun's in the same round: steadier on a shared
machine). A failed run (a port taken by another job, say) is counted and reported, not fatal.

Variants (``--variants``, comma-separated):

The probe is a real file, :mod:`benchmarks.startup_probe`: the script variants run it, the
function variants import it.

* ``torchrun``: ``python -m torch.distributed.run --standalone --nproc-per-node N startup_probe.py`` (baseline);
* ``shoal_run``: ``shoal run --nproc N probe.py`` on the same script;
* ``launch_spawn`` / ``launch_fork``: ``python -c`` calling the probe's ``launch_probe``, that is
  ``shoal.launch.local.launch_local(probe, (...), N, start_method=...)`` with a function entrypoint
  (what ``shoal train --nproc`` does);
* ``train_synthetic`` / ``train_digits``: ``shoal train ... --nproc N`` with an epoch of exactly one
  step per rank; observed from outside as the moment the ``epoch 1/1`` line appears, so it is an
  upper bound that also holds loading the data, one step and a tiny evaluation;
* ``accelerate``: ``accelerate launch --multi_gpu --num_processes N probe.py`` (delegates to torchrun;
  on CPU too), and ``fabric``: Lightning's ``fabric run --accelerator cpu --devices N probe.py``:
  each skipped with a note when the package is not installed (``pip install -r benchmarks/requirements.txt``);
* ``import_torch``: ``python startup_probe.py --import-only``, one process that imports
  ``torch.distributed``: the floor every worker pays.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers import skip_missing_peers
from shoal.bench import report as rep
from shoal.bench.harness import Benchmark, Log, Measured, paired_ratio
from shoal.bench.timing import load_average, median, rotations
from shoal.errors import ShoalError
from shoal.launch.ports import find_free_port

ALL_VARIANTS = (
    "torchrun",
    "shoal_run",
    "launch_spawn",
    "launch_fork",
    "train_synthetic",
    "train_digits",
    "accelerate",
    "fabric",
    "import_torch",
)
BASELINE = "torchrun"
RUN_TIMEOUT_S = 180.0

PROBE = Path(__file__).with_name("startup_probe.py")
"""The probe the script variants run (:mod:`benchmarks.startup_probe`)."""
ROOT = Path(__file__).resolve().parents[1]
"""The repository root, where every command starts: the function variants import ``benchmarks`` from there."""


@dataclass(frozen=True)
class StartupConfig:
    """What ``python -m benchmarks.startup`` measures."""

    nproc: int = 2
    """Workers per launch."""
    repeat: int = 5
    """Timed rounds, every variant once per round, interleaved; the median is reported."""
    warmup: int = 1
    """Untimed rounds first (they warm the page cache)."""
    variants: tuple[str, ...] = ALL_VARIANTS
    """Comma-separated launchers to time (see the description above; default: all of them)."""

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in ALL_VARIANTS]
        if unknown or not self.variants:
            raise ShoalError(
                f"unknown startup variant(s): {', '.join(unknown) or '(none given)'}",
                f"choose --variants from: {', '.join(ALL_VARIANTS)}",
            )
        if self.nproc < 1 or self.repeat < 1 or self.warmup < 0:
            raise ShoalError(
                "--nproc and --repeat must be at least 1, --warmup at least 0", "pass e.g. --nproc 2 --repeat 5"
            )


SMOKE = dict(nproc=1, repeat=1, warmup=0, variants=("torchrun", "shoal_run"))
"""``--smoke``: torchrun and shoal run, once each, one worker (the machinery, in seconds)."""


@dataclass
class _Command:
    argv: list[str]
    ranks: int = 0
    """Rank stamp files to wait for (0: watch stdout for ``line`` instead)."""
    line: str | None = None


def _commands(cfg: StartupConfig, script: Path, work: Path) -> tuple[dict[str, Callable[[Path], _Command]], list[str]]:
    """Variant -> factory of its command for a fresh output dir; plus notes on skipped variants."""
    py, n, ranks = sys.executable, str(cfg.nproc), cfg.nproc

    def train(workload: str, *options: str) -> Callable[[Path], _Command]:
        # Timed by its "epoch 1/1" line: an epoch of exactly one step per rank.
        common = ["--nproc", n, "--epochs", "1", *options, "--device", "cpu", "--no-progress"]
        return lambda out: _Command(
            [py, "-m", "shoal", "train", workload, *common, "--out", str(out / "run")], line="epoch 1/1"
        )

    made: dict[str, Callable[[Path], _Command]] = {
        "torchrun": lambda out: _Command(
            [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n, str(script), str(out)], ranks
        ),
        "shoal_run": lambda out: _Command([py, "-m", "shoal", "run", "--nproc", n, str(script), str(out)], ranks),
        "launch_spawn": lambda out: _Command([py, "-c", _probe_call("spawn", cfg.nproc, out)], ranks),
        "launch_fork": lambda out: _Command([py, "-c", _probe_call("fork", cfg.nproc, out)], ranks),
        # synthetic: nproc x 32 samples at batch 32; digits: 1,440 training images at batch 1024 (each
        # rank's shard fits one batch).
        "train_synthetic": train("synthetic", "--batch-size", "32", "--samples", str(32 * cfg.nproc)),
        "train_digits": train("digits", "--batch-size", "1024"),
        # accelerate and fabric rendezvous on fixed default ports (29500, 29400): give them a free
        # one, or a concurrent job on the machine makes them fail with EADDRINUSE.
        "accelerate": lambda out: _Command(
            [py, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", n, "--num_machines", "1"]
            + ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(find_free_port())]
            + [str(script), str(out)],
            ranks,
        ),
        "fabric": lambda out: _Command(
            [py, "-m", "lightning.fabric.cli", "--accelerator", "cpu", "--devices", n]
            + ["--main-port", str(find_free_port()), str(script), str(out)],
            ranks,
        ),
        "import_torch": lambda out: _Command([py, str(script), "--import-only", str(out)], 1),
    }
    chosen, notes = skip_missing_peers(cfg.variants)
    return {name: made[name] for name in chosen}, notes


def _display(argv: list[str]) -> str:
    """``argv`` as a shell line a person reads: ``python -c "..."`` rather than shlex's '"'"' quoting."""
    words = []
    for arg in argv:
        quoted = shlex.quote(arg)
        if quoted != arg and not any(c in arg for c in '"$`\\'):
            quoted = f'"{arg}"'
        words.append(quoted)
    return " ".join(words)


def _probe_call(method: str, nproc: int, out: Path) -> str:
    return f"from benchmarks.startup_probe import launch_probe; launch_probe({method!r}, {nproc}, {str(out)!r})"


def _run_once(cmd: _Command, out: Path) -> dict[str, float]:
    """Start ``cmd``; return seconds to the first step (all ranks) and to exit, and the CPU seconds
    (user + system) of the command and every process it waited for (its workers)."""
    out.mkdir(parents=True)
    seen: dict[str, float] = {}
    used_before = _children_cpu_s()
    start = time.time()
    proc = subprocess.Popen(
        cmd.argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=_env(),
        cwd=ROOT,
    )
    lines: list[str] = []

    def watch() -> None:
        assert proc.stdout is not None
        for text in proc.stdout:
            lines.append(text)
            if cmd.line and "first" not in seen and text.startswith(cmd.line):
                seen["first"] = time.time()

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own child's session: the launcher and its workers
        proc.wait()
        raise ShoalError(
            f"`{shlex.join(cmd.argv)}` took more than {RUN_TIMEOUT_S:.0f} s", "is the machine overloaded?"
        ) from None
    done = time.time()
    cpu_s = _children_cpu_s() - used_before
    reader.join(timeout=5)
    if rc != 0:
        tail = "".join(lines[-15:]).rstrip()
        raise ShoalError(
            f"`{shlex.join(cmd.argv)}` failed with exit status {rc}:\n{tail}",
            "run the command by hand to see the whole output",
        )
    if cmd.ranks:
        stamps = [float((out / f"rank{r}.txt").read_text()) for r in range(cmd.ranks)]
        first = max(stamps)
    else:
        if "first" not in seen:
            raise ShoalError(
                f"`{shlex.join(cmd.argv)}` never printed a line starting with {cmd.line!r}",
                "has the epoch line of shoal train changed?",
            )
        first = seen["first"]
    return {"first_step_s": first - start, "exit_s": done - start, "cpu_s": cpu_s}


def _children_cpu_s() -> float:
    """CPU seconds of this process's ended children and of what they waited for (RUSAGE_CHILDREN):
    on a machine with fewer cores than processes, what the start-up costs rather than how it overlaps."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _failure_summary(message: str) -> str:
    """The command line of a failed run and its last line that says something (torchrun's report
    ends in rules of ``=``)."""
    lines = message.splitlines()
    telling = [line.strip() for line in lines[1:] if any(ch.isalnum() for ch in line)]
    return lines[0] + (" " + telling[-1] if telling else "")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SHOAL_ENV", None)
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines arrive when printed (the train variants are timed by them)
    return env


def measure(cfg: StartupConfig, log: Log) -> Measured:
    """Every variant once per round, rotated, after the warm-up rounds; a failed run is noted, not fatal."""
    with tempfile.TemporaryDirectory(prefix="shoal-bench-startup-") as tmp:
        work = Path(tmp)
        commands, notes = _commands(cfg, PROBE, work)
        names = list(commands)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        failures: dict[str, list[str]] = {name: [] for name in names}
        counter = 0
        total = cfg.warmup + cfg.repeat
        loads = []  # sampled before each round: how noisy it was
        for index, order in enumerate(rotations(names, total)):
            timed = index >= cfg.warmup
            loads.append(load_average())
            done = []
            for name in order:
                counter += 1
                out = work / f"{counter:03d}-{name}"
                try:
                    result = _run_once(commands[name](out), out)
                except ShoalError as err:
                    # One failed run (a port taken by another job, a timeout) is reported, not fatal.
                    failures[name].append(_failure_summary(err.message))
                    done.append(f"{name} FAILED")
                    continue
                if timed:
                    runs[name].append({**result, "round": index})
                done.append(f"{name} {result['first_step_s']:.2f} s")
            log(f"  round {index + 1}/{total}{'' if timed else ' (warm-up, not counted)'}: " + ", ".join(done))
        commands_shown = {name: _shown(commands[name](work / "OUT").argv, work) for name in names}
    for name, errors in failures.items():
        if errors:
            notes.append(f"{name}: {len(errors)} run(s) failed and are not counted; first: {errors[0]}")
    rows = _rows(names, runs, failures, commands_shown)
    if BASELINE not in runs:
        notes.append("torchrun not measured: the ratios are n/a")
    by = {r["variant"]: r for r in rows}
    if "launch_fork" in by and "launch_spawn" in by:
        fork, spawn = by["launch_fork"]["first_step_s"], by["launch_spawn"]["first_step_s"]
        notes.append(
            f"launch_local: fork {fork:.2f} s vs spawn {spawn:.2f} s to the first step "
            f"({spawn - fork:+.2f} s for spawn)"
        )
    return Measured(rows, notes, config={"variants": names}, meta={"load_averages": loads})


def _shown(argv: list[str], work: Path) -> str:
    """The command as the report shows it: the temporary folders and the probe's path shortened."""
    return _display(argv).replace(str(work / "OUT"), "OUT").replace(str(work), "TMP").replace(str(PROBE), PROBE.name)


def _rows(names, runs, failures, commands_shown) -> list[dict[str, Any]]:
    base = median(r["first_step_s"] for r in runs[BASELINE]) if BASELINE in runs else float("nan")
    base_by_round = {r["round"]: r["first_step_s"] for r in runs.get(BASELINE, [])}
    rows = []
    for name in names:
        first = median(r["first_step_s"] for r in runs[name])
        rows.append(
            {
                "variant": name,
                "command": commands_shown[name],
                "first_step_s": first,
                "first_step_runs": [r["first_step_s"] for r in runs[name]],
                "failed_runs": len(failures[name]),
                "exit_s": median(r["exit_s"] for r in runs[name]),
                "cpu_s": median(r["cpu_s"] for r in runs[name]),
                "vs_torchrun": first / base,
                # Paired: each run against torchrun's in the same round (the same spell of a shared machine).
                "vs_torchrun_paired": paired_ratio({r["round"]: r["first_step_s"] for r in runs[name]}, base_by_round),
                "kind": "reference"
                if name == "import_torch"
                else ("upper bound" if name.startswith("train_") else "launcher"),
            }
        )
    return rows


def text(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    return [
        f"{cfg['nproc']} workers; seconds from starting the command to the first training step done on every rank; "
        f"median of {cfg['repeat']} interleaved round(s) after {cfg['warmup']} warm-up round(s); "
        f"paired = median of per-round ratios to torchrun",
        "",
        rep.table(
            ["variant", "first step (s)", "vs torchrun", "paired", "exit (s)", "cpu (s)", "kind", "command"],
            [
                [
                    r["variant"],
                    f"{r['first_step_s']:.2f}",
                    _ratio(r["vs_torchrun"]),
                    _ratio(r["vs_torchrun_paired"]),
                    f"{r['exit_s']:.2f}",
                    f"{r['cpu_s']:.2f}",
                    r["kind"],
                    _short(r["command"]),
                ]
                for r in report["rows"]
            ],
            align="lrrrrrll",
        ),
    ]


def _ratio(value: float) -> str:
    return f"{value:.2f}x" if value == value else "n/a"


def _short(command: str) -> str:
    command = re.sub(r"^\S*python\S*", "python", command)
    return command if len(command) <= 110 else command[:107] + "..."


BENCHMARK = Benchmark(
    name="startup",
    command="python -m benchmarks.startup",
    config=StartupConfig,
    smoke=SMOKE,
    measure=measure,
    text=text,
    draw=rep.runs_chart(
        "first_step_s",
        "first_step_runs",
        "seconds from the command to the first step on every rank (bars: median, dots: runs)",
        lambda cfg: f"start-up, {cfg['nproc']} workers",
    ),
    description="Start N workers that finish one DDP training step, through torchrun, shoal run, shoal's "
    "launch_local (spawn and fork), shoal train, accelerate and Lightning Fabric (when installed); report the "
    "median seconds to the first step and the ratio to torchrun.",
    examples="""\
examples:
  python -m benchmarks.startup          # every variant, median of 5 interleaved rounds
  python -m benchmarks.startup --variants torchrun,shoal_run,launch_spawn,launch_fork --repeat 9
  python -m benchmarks.startup --nproc 4 --json startup.json
  python -m benchmarks.startup --smoke  # torchrun and shoal run once, 1 worker
""",
)


if __name__ == "__main__":
    from benchmarks import main

    raise SystemExit(main("startup"))

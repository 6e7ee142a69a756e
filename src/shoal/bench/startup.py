"""``shoal bench startup``: wall time from the command to the first step completed on every rank.

Every variant starts ``--nproc`` workers that join a gloo process group and finish one DDP training
step of a tiny model (forward, backward with its gradient all-reduce, an SGD step: the first
optimizer step imports ``torch._dynamo``, about 2 s here, which any real first step pays too);
each rank then writes ``time.time()`` to a file. The figure is the last rank's
stamp minus the moment just before the command was started (same clock, same machine), so it
includes the interpreter and torch imports, the launcher, the rendezvous and the process group.
Variants run interleaved, rotated every round, after an untimed warm-up round (page cache); the
median of ``--repeat`` rounds is reported, with the ratio to torchrun's median and the *paired*
ratio (the median over rounds of each run against torchrun's in the same round: steadier on a shared
machine). A failed run (a port taken by another job, say) is counted and reported, not fatal.

Variants (``--variants``, comma-separated):

* ``torchrun``: ``python -m torch.distributed.run --standalone --nproc-per-node N probe.py`` (baseline);
* ``shoal_run``: ``shoal run --nproc N probe.py`` on the same script;
* ``launch_spawn`` / ``launch_fork``: ``python -c`` calling ``shoal.launch.local.launch_local(probe,
  (...), N, start_method=...)`` with a function entrypoint (what ``shoal train --nproc`` does);
* ``train_synthetic`` / ``train_digits``: ``shoal train ... --nproc N`` with an epoch of exactly one
  step per rank; observed from outside as the moment the ``epoch 1/1`` line appears, so it is an
  upper bound that also holds loading the data, one step and a tiny evaluation;
* ``accelerate``: ``accelerate launch --multi_gpu --num_processes N probe.py`` (delegates to torchrun;
  on CPU too), and ``fabric``: Lightning's ``fabric run --accelerator cpu --devices N probe.py``:
  each skipped with a note when the package is not installed (``pip install 'shoal[bench]'``);
* ``import_torch``: ``python -c "import torch.distributed"``, one process: the floor every worker pays.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from shoal.bench import report as rep
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

PROBE_SCRIPT = '''\
"""shoal bench startup probe: join the group, finish one DDP training step, stamp the time."""
import gc, os, sys, time
import torch
import torch.distributed as dist


def probe(out_dir):
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(4, 8)).sum().backward()  # the gradient all-reduce
    optimizer.step()
    stamp = time.time()
    rank = dist.get_rank()
    dist.destroy_process_group()
    gc.collect()  # torch 2.14's gloo can abort at exit otherwise (see shoal.distributed.process_group)
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(repr(stamp))


if __name__ == "__main__":
    probe(sys.argv[1])
'''


@dataclass(frozen=True)
class StartupConfig:
    """What ``shoal bench startup`` measures."""

    nproc: int = 2
    """Workers per launch."""
    repeat: int = 5
    """Timed rounds (every variant once per round, interleaved); the median is reported."""
    warmup: int = 1
    """Untimed rounds first (warms the page cache)."""
    variants: tuple[str, ...] = ALL_VARIANTS

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


def startup_probe(out_dir: str) -> None:
    """The probe as a function (a ``launch_local`` entrypoint): PROBE_SCRIPT's own ``probe``."""
    namespace: dict[str, Any] = {"__name__": "shoal_startup_probe"}
    exec(PROBE_SCRIPT, namespace)  # the one definition of the probe, shared with the script variants
    namespace["probe"](out_dir)


def launch_probe(start_method: str, nproc: int, out_dir: str) -> None:
    """``python -c`` target of the ``launch_*`` variants: launch_local with a function entrypoint."""
    from shoal.launch.local import launch_local

    launch_local(startup_probe, (out_dir,), nproc, start_method=start_method)


@dataclass
class _Command:
    argv: list[str]
    ranks: int = 0
    """Rank stamp files to wait for (0: watch stdout for ``line`` instead)."""
    line: str | None = None


def _commands(cfg: StartupConfig, script: Path, work: Path) -> tuple[dict[str, Callable[[Path], _Command]], list[str]]:
    """Variant -> factory of its command for a fresh output dir; plus notes on skipped variants."""
    py, n = sys.executable, str(cfg.nproc)
    notes: list[str] = []
    made: dict[str, Callable[[Path], _Command]] = {
        "torchrun": lambda out: _Command(
            [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n, str(script), str(out)], cfg.nproc
        ),
        "shoal_run": lambda out: _Command([py, "-m", "shoal", "run", "--nproc", n, str(script), str(out)], cfg.nproc),
        "launch_spawn": lambda out: _Command([py, "-c", _probe_call("spawn", cfg.nproc, out)], cfg.nproc),
        "launch_fork": lambda out: _Command([py, "-c", _probe_call("fork", cfg.nproc, out)], cfg.nproc),
        # One step per rank per epoch: synthetic with nproc x 32 samples at batch 32; digits' 1,440
        # training images at batch 1024 (each rank's shard fits one batch).
        "train_synthetic": lambda out: _Command(
            [
                py,
                "-m",
                "shoal",
                "train",
                "synthetic",
                "--nproc",
                n,
                "--epochs",
                "1",
                "--batch-size",
                "32",
                "--samples",
                str(32 * cfg.nproc),
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(out / "run"),
            ],
            line="epoch 1/1",
        ),
        "train_digits": lambda out: _Command(
            [
                py,
                "-m",
                "shoal",
                "train",
                "digits",
                "--nproc",
                n,
                "--epochs",
                "1",
                "--batch-size",
                "1024",
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(out / "run"),
            ],
            line="epoch 1/1",
        ),
        # accelerate and fabric rendezvous on fixed default ports (29500, 29400): give them a free
        # one, or a concurrent job on the machine makes them fail with EADDRINUSE.
        "accelerate": lambda out: _Command(
            [
                py,
                "-m",
                "accelerate.commands.launch",
                "--multi_gpu",
                "--num_processes",
                n,
                "--num_machines",
                "1",
                "--mixed_precision",
                "no",
                "--dynamo_backend",
                "no",
                "--main_process_port",
                str(find_free_port()),
                str(script),
                str(out),
            ],
            cfg.nproc,
        ),
        "fabric": lambda out: _Command(
            [
                py,
                "-m",
                "lightning.fabric.cli",
                "--accelerator",
                "cpu",
                "--devices",
                n,
                "--main-port",
                str(find_free_port()),
                str(script),
                str(out),
            ],
            cfg.nproc,
        ),
        "import_torch": lambda out: _Command([py, "-c", _import_call(out)], 1),
    }
    chosen = {}
    for name in cfg.variants:
        missing = {"accelerate": "accelerate", "fabric": "lightning"}.get(name)
        if missing and importlib.util.find_spec(missing) is None:
            notes.append(f"{name} skipped: {missing} is not installed (pip install 'shoal[bench]')")
            continue
        chosen[name] = made[name]
    return chosen, notes


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
    return f"from shoal.bench.startup import launch_probe; launch_probe({method!r}, {nproc}, {str(out)!r})"


def _import_call(out: Path) -> str:
    return f"import time, torch, torch.distributed; open({str(out / 'rank0.txt')!r}, 'w').write(repr(time.time()))"


def _run_once(cmd: _Command, out: Path) -> dict[str, float]:
    """Start ``cmd``; return seconds to the first step (all ranks) and to exit."""
    out.mkdir(parents=True)
    seen: dict[str, float] = {}
    start = time.time()
    proc = subprocess.Popen(
        cmd.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=_env()
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
    return {"first_step_s": first - start, "exit_s": done - start}


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


def run_startup(cfg: StartupConfig, *, log: Callable[[str], None] = print, argv=None) -> dict[str, Any]:
    """Run the benchmark; return the report."""
    load_start, started = load_average(), rep.now()
    with tempfile.TemporaryDirectory(prefix="shoal-bench-startup-") as tmp:
        work = Path(tmp)
        script = work / "probe.py"
        script.write_text(PROBE_SCRIPT)
        commands, notes = _commands(cfg, script, work)
        names = list(commands)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        failures: dict[str, list[str]] = {name: [] for name in names}
        counter = 0
        total = cfg.warmup + cfg.repeat
        loads = []
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
        sample = {name: _display(commands[name](work / "OUT").argv) for name in names}
    report = rep.new_report(
        "startup", {**asdict(cfg), "variants": names}, argv=argv, load_start=load_start, started=started
    )
    report["meta"]["load_averages"] = loads  # sampled before each round: how noisy it was
    report["notes"] += notes
    for name, errors in failures.items():
        if errors:
            report["notes"].append(f"{name}: {len(errors)} run(s) failed and are not counted; first: {errors[0]}")
    base = median(r["first_step_s"] for r in runs[BASELINE]) if BASELINE in runs else float("nan")
    base_by_round = {r["round"]: r["first_step_s"] for r in runs.get(BASELINE, [])}
    rows = []
    for name in names:
        first = median(r["first_step_s"] for r in runs[name])
        # Paired: each run against torchrun's in the same round (the same spell of a shared machine).
        paired = median(
            r["first_step_s"] / base_by_round[r["round"]] for r in runs[name] if r["round"] in base_by_round
        )
        rows.append(
            {
                "variant": name,
                "command": sample[name].replace(str(work / "OUT"), "OUT").replace(str(work), "TMP"),
                "first_step_s": first,
                "first_step_runs": [r["first_step_s"] for r in runs[name]],
                "failed_runs": len(failures[name]),
                "exit_s": median(r["exit_s"] for r in runs[name]),
                "vs_torchrun": first / base,
                "vs_torchrun_paired": paired,
                "kind": "reference"
                if name == "import_torch"
                else ("upper bound" if name.startswith("train_") else "launcher"),
            }
        )
    report["rows"] = rows
    if BASELINE not in runs:
        report["notes"].append("torchrun not measured: the ratios are n/a")
    by = {r["variant"]: r for r in rows}
    if "launch_fork" in by and "launch_spawn" in by:
        fork, spawn = by["launch_fork"]["first_step_s"], by["launch_spawn"]["first_step_s"]
        report["notes"].append(
            f"launch_local: fork {fork:.2f} s vs spawn {spawn:.2f} s to the first step "
            f"({spawn - fork:+.2f} s for spawn)"
        )
    return rep.finish_report(report)


def format_startup(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        rep.header(report),
        f"{cfg['nproc']} workers; seconds from starting the command to the first training step done on every rank; "
        f"median of {cfg['repeat']} interleaved round(s) after {cfg['warmup']} warm-up round(s); "
        f"paired = median of per-round ratios to torchrun",
        "",
        rep.table(
            ["variant", "first step (s)", "vs torchrun", "paired", "exit (s)", "kind", "command"],
            [
                [
                    r["variant"],
                    f"{r['first_step_s']:.2f}",
                    _ratio(r["vs_torchrun"]),
                    _ratio(r["vs_torchrun_paired"]),
                    f"{r['exit_s']:.2f}",
                    r["kind"],
                    _short(r["command"]),
                ]
                for r in report["rows"]
            ],
            align="lrrrrll",
        ),
    ]
    lines += [f"- {note}" for note in report["notes"]]
    return "\n".join(lines)


def _ratio(value: float) -> str:
    return f"{value:.2f}x" if value == value else "n/a"


def _short(command: str) -> str:
    command = re.sub(r"^\S*python\S*", "python", command)
    return command if len(command) <= 110 else command[:107] + "..."


def plot_startup(report: dict[str, Any], path) -> tuple[Any, str | None]:
    rows = report["rows"]

    def draw(ax) -> None:
        names = [r["variant"] for r in rows]
        ax.barh(names, [r["first_step_s"] for r in rows])
        for i, r in enumerate(rows):
            ax.plot(r["first_step_runs"], [i] * len(r["first_step_runs"]), "k.", markersize=4)
        ax.invert_yaxis()
        ax.set_xlabel("seconds from the command to the first step on every rank (bars: median, dots: runs)")
        ax.set_title(f"start-up, {report['config']['nproc']} workers")

    return rep.save_plot(path, draw)


def smoke_config(**overrides: Any) -> StartupConfig:
    return replace(StartupConfig(**SMOKE), **overrides)

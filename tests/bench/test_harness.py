"""The harness every benchmark goes through (``shoal bench``'s and the project's own beside the package):
paired ratios, --smoke, and the report it writes."""

from __future__ import annotations

import importlib
import json
import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pytest

from shoal.bench import BENCHMARKS, benchmark
from shoal.bench.harness import Benchmark, Measured, paired_ratio, paired_ratios, run_and_write
from shoal.errors import ShoalError

PROJECT_BENCHMARKS = ("overhead", "data", "startup", "checkpoint", "memory")
"""The project's own benchmarks beside the package (``python -m benchmarks.NAME``)."""


def _any_benchmark(name: str) -> Benchmark:
    if name in BENCHMARKS:
        return benchmark(name)
    return importlib.import_module(f"benchmarks.{name}").BENCHMARK


def test_paired_ratios_pair_by_position_or_by_round():
    assert paired_ratios([2.0, 9.0, 4.0], [1.0, 3.0, 2.0]) == [2.0, 3.0, 2.0]
    assert paired_ratio([2.0, 9.0, 4.0], [1.0, 3.0, 2.0]) == 2.0  # not 15/6 = 2.5, the ratio of the sums
    # By round: a round that failed on one side is left out, whatever the order.
    assert paired_ratios({3: 6.0, 0: 4.0, 1: 9.0}, {0: 2.0, 3: 2.0}) == [3.0, 2.0]
    assert paired_ratio({0: 4.0, 1: 9.0, 2: 1.0}, {0: 2.0, 1: 3.0, 2: 2.0}) == 2.0
    assert math.isnan(paired_ratio({0: 1.0}, {1: 1.0}))


def test_every_benchmark_is_registered_with_its_module():
    assert list(BENCHMARKS) == ["scaling", "allreduce"]  # what a user runs; the rest is the project's own
    for name in [*BENCHMARKS, *PROJECT_BENCHMARKS]:
        bench = _any_benchmark(name)
        command = f"shoal bench {name}" if name in BENCHMARKS else f"python -m benchmarks.{name}"
        assert bench.name == name and bench.command == command and bench.examples.startswith("examples:\n")
        assert all(line.startswith(f"  {command}") for line in bench.examples.splitlines()[1:])
        assert set(bench.smoke) <= {f.name for f in fields(bench.config)}


@pytest.mark.parametrize("name", [*BENCHMARKS, *PROJECT_BENCHMARKS])
def test_smoke_gives_tiny_sizes_and_explicit_values_win(name):
    bench = _any_benchmark(name)
    assert bench.configure() == bench.config()
    smoke = bench.configure(smoke=True)
    assert {k: getattr(smoke, k) for k in bench.smoke} == dict(bench.smoke)
    # One smoke field given explicitly wins; the other smoke sizes stay.
    key, value = next((k, v) for k, v in bench.smoke.items() if isinstance(v, int) and not isinstance(v, bool))
    mixed = bench.configure(smoke=True, **{key: value + 1})
    assert getattr(mixed, key) == value + 1
    assert {k: getattr(mixed, k) for k in bench.smoke if k != key} == {k: v for k, v in bench.smoke.items() if k != key}


def test_a_bad_value_is_refused_with_or_without_smoke():
    bench = benchmark("scaling")
    for smoke in (False, True):
        with pytest.raises(ShoalError, match="--repeat must be at least 1") as err:
            bench.configure(smoke=smoke, repeat=0)
        assert err.value.hint


# A small real benchmark, to see the whole pipeline: config -> measure -> report -> table, JSON, plot.


@dataclass(frozen=True)
class SleepConfig:
    seconds: float = 0.02
    """How long each run sleeps."""
    repeat: int = 3
    """Runs."""


def _measure(cfg: SleepConfig, log) -> Measured:
    runs = []
    for _ in range(cfg.repeat):
        start = time.perf_counter()
        time.sleep(cfg.seconds)
        runs.append(time.perf_counter() - start)
    log(f"  {cfg.repeat} run(s)")
    row = {"variant": "sleep", "seconds": sorted(runs)[len(runs) // 2], "runs": runs}
    return Measured([row], ["slept"], config={"runs": len(runs)}, meta={"clock": "perf_counter"}, extra={"ok": True})


SLEEP = Benchmark(
    name="sleep",
    config=SleepConfig,
    smoke={"seconds": 0.001, "repeat": 2},
    measure=_measure,
    text=lambda report: ["one line of my own", f"rows: {len(report['rows'])}"],
    draw=lambda ax, report: ax.bar(["sleep"], [report["rows"][0]["seconds"]]),
    description="sleeps",
    examples="examples:\n  none\n",
)


def _is_png(path: str | Path) -> bool:
    return Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pipeline_writes_the_table_the_json_and_a_plot_beside_it(tmp_path: Path, capsys):
    logged: list[str] = []
    out = tmp_path / "deep" / "sleep.json"
    cfg = SLEEP.configure(smoke=True, repeat=3)
    returned = run_and_write(
        SLEEP, cfg, smoke=True, json_path=str(out), argv=["shoal", "bench", "sleep"], log=logged.append
    )
    report = json.loads(out.read_text())
    assert report == json.loads(json.dumps(returned))
    assert list(report)[:5] == ["benchmark", "meta", "config", "notes", "rows"] and report["ok"] is True
    assert report["benchmark"] == "sleep"
    assert report["config"] == {**asdict(cfg), "runs": 3, "smoke": True}
    assert report["meta"]["command"] == "shoal bench sleep" and report["meta"]["clock"] == "perf_counter"
    assert {"date", "machine", "load_average_start", "load_average_end"} <= set(report["meta"])
    assert len(report["rows"][0]["runs"]) == 3 and report["rows"][0]["seconds"] >= 0.001
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "shoal bench sleep" and printed[2:] == ["one line of my own", "rows: 1", "- slept"]
    assert report["plot"] == str(out.with_suffix(".png")) and _is_png(report["plot"])  # matplotlib: a test extra
    assert logged[0] == "shoal bench sleep (smoke: tiny sizes, the numbers mean nothing)"
    assert logged[1] == "  3 run(s)" and logged[2].startswith(f"wrote {out}")


def test_plot_path_without_json(tmp_path: Path, capsys):
    plot = tmp_path / "p.png"
    report = run_and_write(SLEEP, SLEEP.configure(), plot_path=str(plot), log=lambda _: None)
    assert report["config"]["smoke"] is False and report["plot"] == str(plot) and _is_png(plot)
    assert list(tmp_path.iterdir()) == [plot]
    assert "rows: 1" in capsys.readouterr().out


def test_plots_start_the_value_axis_at_zero_and_show_every_bar(tmp_path: Path):
    from shoal.bench.report import save_plot

    drawn = {}

    def horizontal(ax):
        ax.barh(["a", "b", "c"], [5.0, 6.0, 7.0])
        drawn["h"] = ax

    def vertical(ax):
        ax.plot([1, 2], [5.0, 7.0])
        drawn["v"] = ax

    for name, draw in (("h", horizontal), ("v", vertical)):
        path, note = save_plot(tmp_path / f"{name}.png", draw)
        assert note is None and _is_png(path)
    low, high = sorted(drawn["h"].get_ylim())
    assert low < -0.3 and high > 2.3  # the categories' axis is left alone: all three bars show
    assert drawn["h"].get_xlim()[0] == 0 and drawn["v"].get_ylim()[0] == 0

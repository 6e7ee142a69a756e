"""``scripts/bench-slow-link --smoke``: two namespace nodes on a 50 Mbit/s tbf-shaped link, shoal's scaling
benchmark and ``shoal train digits`` across it with each hook, and everything gone afterwards.

What is checked is the machinery and that the rate limit is really in place (a TCP transfer between
the namespaces measured below the limit, the qdisc counting packets held back), never the speed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cluster.netns import netns_unavailable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench-slow-link"

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _leftovers(tag: str) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(f"shslow{tag}")]


def test_smoke_on_a_rate_limited_link(tmp_path):
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"namespace nodes cannot be made here: {reason}")
    out = tmp_path / "slow.json"
    # --arch mlp: the scaling benchmark's smallest model (2.6 MB of gradients, not ResNet-18's 45 MB,
    # which at 50 Mbit/s made every all-reduce 7 s and the test 100 s): the machinery is the same.
    proc = subprocess.Popen(
        [str(SCRIPT), "--smoke", "--arch", "mlp", "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-4000:] + stdout
    assert not _leftovers(str(proc.pid)), "the script left its namespaces behind"
    report = json.loads(out.read_text())
    (link,) = report["links"]
    assert link["rate"] == "50mbit" and link["rate_bits"] == 50e6
    # The limit is real: the transfer is below it (the tbf burst lets a few KB through at line rate:
    # 5% slack), far below what an unshaped veth pair carries (gigabits), and the qdisc held packets back.
    assert 0.5 * 50e6 < link["measured_bits"] < 1.05 * 50e6
    assert link["qdisc"]["overlimits"] > 0 and link["qdisc"]["sent_bytes"] >= link["probe_megabytes"] * 2**20
    # The scaling benchmark ran across the two nodes with every hook, beside plain DDP and the control.
    scaling = link["scaling"]
    variants = {(r["world_size"], r["variant"]) for r in scaling["rows"]}
    assert variants == {(1, "ddp"), (2, "ddp"), (2, "hook:bf16"), (2, "hook:powersgd"), (2, "no_allreduce")}
    assert (
        scaling["config"]["nnodes"] == 2
        and scaling["config"]["arch"] == "mlp"
        and scaling["rows"][1]["label"].startswith("2 nodes x 1 proc")
    )
    (summary,) = scaling["summary"]
    assert set(summary["hook_gains"]) == {"bf16", "powersgd"} and summary["verdict"].startswith("2 processes")
    # Training: one process alone, then both nodes with no hook and with PowerSGD, each to the end.
    runs = {run["hook"]: run for run in link["train"]}
    assert set(runs) == {None, "none", "powersgd"}
    assert runs[None]["world_size"] == 1 and runs["none"]["world_size"] == runs["powersgd"]["world_size"] == 2
    for run in runs.values():
        assert run["epochs"] and run["samples_per_s"] > 0 and 0 < run["final_accuracy"] <= 1
    # The table compares with no hook on the same link.
    assert "== link 50mbit: measured" in stdout and "powersgd" in stdout and "vs no hook" in stdout
    assert os.path.exists(out)


def test_refuses_without_root_or_bad_rates(tmp_path):
    bad = subprocess.run([str(SCRIPT), "--rates", "fast"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected a rate such as 200mbit" in bad.stderr
    hooks = subprocess.run([str(SCRIPT), "--hooks", "bf16"], capture_output=True, text=True, timeout=60)
    assert hooks.returncode == 2 and "--hooks must start with none" in hooks.stderr

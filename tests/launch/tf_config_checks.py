"""What every TF_CONFIG path test checks: the reports tests/launch/scripts/tf_config_print.py wrote (one
per rank: the TF_CONFIG it got, whether its port was free, its torchrun variables)."""

from __future__ import annotations

import json
from pathlib import Path

PRINT = Path(__file__).parent / "scripts" / "tf_config_print.py"


def tf_config_reports(directory: Path, world: int) -> list[dict]:
    found = sorted(directory.glob("rank*.json"))
    assert len(found) == world, [p.name for p in found]
    return sorted((json.loads(p.read_text()) for p in found), key=lambda r: int(r["RANK"]))


def check_tf_config(reports: list[dict], world: int) -> list[str]:
    """Every rank's TF_CONFIG agrees and matches its rank; returns the workers' hosts in rank order."""
    workers = reports[0]["tf_config"]["cluster"]["worker"]
    assert len(workers) == world and len(set(workers)) == world, workers
    for rank, report in enumerate(reports):
        assert report["tf_config"] == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        assert report["bindable"], f"rank {rank}: its port was not free for TF: {workers[rank]}"
        assert report["SHOAL_TF_CONFIG"] is None  # the opt-in is not handed on to the script
    return [worker.rpartition(":")[0] for worker in workers]

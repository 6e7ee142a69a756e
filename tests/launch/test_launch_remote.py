"""``run_launchers``: one launcher per host, real processes; which host's status is reported."""

from __future__ import annotations

import time

from shoal.errors import EXIT_ANOTHER_NODE_FAILED
from shoal.launch.remote import processes as remote


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def test_the_cause_is_reported_even_when_its_consequence_ends_first(capsys):
    # Host a only saw another node end the job and exits at once; host b, the cause, a moment later.
    status = remote.run_launchers(
        [_sh(f"exit {EXIT_ANOTHER_NODE_FAILED}"), _sh("sleep 1; exit 3")], ["host a", "host b"]
    )
    assert status == 3
    assert "shoal launch: host b exited with status 3" in capsys.readouterr().err


def test_a_consequence_alone_is_reported_after_the_settle_time(capsys, monkeypatch):
    monkeypatch.setattr(remote, "SETTLE_S", 0.5)
    monkeypatch.setattr(remote, "GRACE_S", 2.0)  # sleep ignores its stdin closing: killed after the grace
    started = time.monotonic()
    status = remote.run_launchers([_sh(f"exit {EXIT_ANOTHER_NODE_FAILED}"), _sh("exec sleep 60")], ["host a", "host b"])
    elapsed = time.monotonic() - started
    assert status == EXIT_ANOTHER_NODE_FAILED
    assert 0.5 <= elapsed < 10  # waited SETTLE_S for a cause, then stopped host b instead of waiting for it
    assert "host a exited with status 75; stopping the other hosts" in capsys.readouterr().err


def test_a_real_failure_stops_the_others_at_once(capsys, monkeypatch):
    monkeypatch.setattr(remote, "GRACE_S", 2.0)  # sleep ignores its stdin closing: killed after the grace
    started = time.monotonic()
    status = remote.run_launchers([_sh("exit 4"), _sh("exec sleep 60")], ["host a", "host b"])
    assert status == 4 and time.monotonic() - started < 10
    assert "host a exited with status 4; stopping the other hosts" in capsys.readouterr().err


def test_all_succeed():
    assert remote.run_launchers([_sh("exit 0"), _sh("sleep 0.2")], ["host a", "host b"]) == 0

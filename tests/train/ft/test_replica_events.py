"""``replicas.jsonl`` read back for ``shoal status``: each group's current life, never an earlier one's."""

from __future__ import annotations

from shoal.train.ft.events import append_event, finished_without, group_states, read_events


def test_a_group_restarted_and_not_yet_back_shows_no_heal_of_its_earlier_life(tmp_path):
    append_event(tmp_path, 1, "start", pid=100, starts=1, node=0, address="127.0.0.1")
    append_event(tmp_path, 1, "healed", pid=100, step=5, after_s=1.0, source="peer")
    append_event(tmp_path, 1, "joined", pid=100, step=6)
    append_event(tmp_path, 1, "died", pid=100, step=40, how="killed by SIGKILL")
    append_event(tmp_path, 1, "start", pid=200, starts=2, node=0, address="127.0.0.1")
    (state,) = group_states(read_events(tmp_path))
    assert (state.pid, state.starts, state.state, state.step) == (200, 2, "training", 40)
    assert state.healed is None and state.died["step"] == 40
    assert state.failure() == "killed by SIGKILL at step 40"

    append_event(tmp_path, 1, "healed", pid=200, step=41, after_s=1.2, source="checkpoint")
    (state,) = group_states(read_events(tmp_path))
    assert state.healed["step"] == 41 and state.healed["source"] == "checkpoint"
    assert state.failure() == "killed by SIGKILL at step 40; resumed from its checkpoint at step 41 after 1.2 s"


def test_a_group_restarted_after_the_others_finished_sees_the_job_is_over(tmp_path):
    """A restarted group that finds no lighthouse asks this: has another group finished since its
    previous process started? An earlier run's end in the same directory does not count."""
    append_event(tmp_path, 0, "finished", pid=50, step=90)  # a previous run into the same --out
    append_event(tmp_path, 0, "start", pid=100, starts=1)
    append_event(tmp_path, 1, "start", pid=101, starts=1)
    assert finished_without(read_events(tmp_path), 1) is None
    append_event(tmp_path, 1, "died", pid=101, step=40, how="killed by SIGKILL")
    assert finished_without(read_events(tmp_path), 1) is None  # the others still train
    append_event(tmp_path, 0, "finished", pid=100, step=180)
    done = finished_without(read_events(tmp_path), 1)
    assert (done["group"], done["step"]) == (0, 180)
    assert finished_without(read_events(tmp_path), 2) is None  # a group that never started: no verdict


def test_every_event_written_is_in_the_guides_table():
    """docs/FAULT_TOLERANCE.md's table of replicas.jsonl names every event the groups and their
    launcher write (found in the source by their calls), so tooling can trust the page."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    source = "".join(p.read_text() for p in (root / "src" / "shoal" / "train" / "ft").glob("*.py"))
    written = set(re.findall(r'(?:events\.write|self\._say|append_event)\([^"]*"(\w+)"', source))
    assert {"start", "joined", "quorum", "dropped", "recovered", "finished", "died", "hung"} <= written, written
    table = (root / "docs" / "FAULT_TOLERANCE.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \| (?:the group|its launcher|node 0's launcher) \|", table, re.M))
    assert written == documented, (written, documented)


def test_above_256_groups_the_heartbeats_are_longer_and_the_start_says_so():
    """What benchmarks/lighthouse_scale.py measured with 1,000 simulated groups against the real
    lighthouse: a 1 s timeout counts live groups as dead; 10 s, with heartbeats every 500 ms, held."""
    from shoal.env.replica import heartbeat_ms, heartbeat_note, lighthouse_args
    from shoal.jobs.kubernetes.fault_tolerance import lighthouse_command
    from shoal.train.ft.lighthouse import Lighthouse

    assert heartbeat_ms(None) == heartbeat_ms(2) == heartbeat_ms(256) == (1000, 100)
    assert heartbeat_ms(257) == heartbeat_ms(1000) == (10000, 500)
    assert heartbeat_note(256) is None
    assert heartbeat_note(1000) == (
        "shoal: 1000 replica groups: the lighthouse leaves a group out after 10 s without a heartbeat (1 s up to "
        "256 groups), each group heartbeats every 500 ms: a dead group costs the others about 10 s "
        "(docs/FAULT_TOLERANCE.md, 'What holds at which size')"
    )

    def timeout(args: list[str]) -> str:
        return args[args.index("--heartbeat_timeout_ms") + 1]

    assert timeout(lighthouse_args("127.0.0.1:1")) == timeout(Lighthouse(port=1, groups=8).command()) == "1000"
    assert timeout(Lighthouse(port=1, groups=1000).command()) == timeout(lighthouse_command(300)) == "10000"

"""The join error names what is missing: real torch stores timing out in this process."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from shoal.distributed.process_group import _join_error
from shoal.env import EnvInfo


def _info(rank: int, world: int) -> EnvInfo:
    return EnvInfo("torchrun", rank, rank, world, world, 0, 1, "127.0.0.1", 29500, ())


def test_with_tcp_rank_0_says_how_many_ranks_reached_its_store():
    # tcp://: rank 0 hosts the store and waits for every rank to connect (only itself here).
    with pytest.raises(dist.DistStoreError) as raised:
        dist.TCPStore("127.0.0.1", 0, 3, True, timeout=timedelta(seconds=1), wait_for_workers=True)
    error = _join_error(raised.value, _info(0, 3), "127.0.0.1:29500", 1)
    assert error.message.endswith("joining the process group at 127.0.0.1:29500 (torchrun): 1 of 3 ranks arrived")


@pytest.mark.parametrize("agent_store", ["True", None])
def test_the_awaited_key_names_a_rank_only_in_a_launchers_store(monkeypatch, agent_store):
    # The key gloo waits on, read from a real store's timeout; only a launcher's store makes it the
    # missing rank (with tcp:// the others wait for rank 0's key whoever is missing).
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=1), wait_for_workers=False)
    with pytest.raises(dist.DistStoreError) as raised:
        store.wait(["default_pg/0//cpu//0/2"])  # reported as torch reports gloo's: "/default_pg/0//cpu//0/2"
    if agent_store is None:
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    else:
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent_store)
    error = _join_error(raised.value, _info(0, 3), "127.0.0.1:29500", 1)
    named = error.message.endswith(": rank 2 never arrived")
    assert named is (agent_store == "True"), error.message

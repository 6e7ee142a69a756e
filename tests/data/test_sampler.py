"""ShardedSampler: one global order, strided shards, padding/dropping, and resume under any world size."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import DistributedSampler

from shoal.data import ShardedSampler


def shards(n: int, world: int, **kw) -> list[list[int]]:
    return [list(ShardedSampler(n, rank=r, world_size=world, **kw)) for r in range(world)]


@pytest.mark.parametrize("shuffle", [True, False])
def test_global_order_is_the_same_for_every_world_size(shuffle):
    n, seed = 103, 7
    for epoch in range(3):
        g = torch.Generator().manual_seed(seed + epoch)
        expected = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
        for world in (1, 2, 3):
            for rank in range(world):
                s = ShardedSampler(n, rank=rank, world_size=world, shuffle=shuffle, seed=seed)
                assert torch.equal(s.global_order(epoch), expected)
        # Each rank's shard is the strided slice of the (padded) global order.
        for world in (2, 3):
            for rank, got in enumerate(shards(n, world, shuffle=shuffle, seed=seed)):
                order = ShardedSampler(n, shuffle=shuffle, seed=seed).global_order(0).tolist()
                padded = order + order[: len(got) * world - n]
                assert got == padded[rank::world]


@pytest.mark.parametrize("n,world", [(100, 1), (100, 2), (101, 2), (100, 3), (2, 3), (1, 4)])
def test_every_index_once_per_epoch_plus_padding(n, world):
    for epoch in range(3):
        got = []
        for r in range(world):
            s = ShardedSampler(n, rank=r, world_size=world, seed=3)
            s.set_epoch(epoch)
            got.append(list(s))
        counts = {len(g) for g in got}
        assert counts == {-(-n // world)}, "pad=True must give every rank the same count"
        flat = [i for g in got for i in g]
        assert set(flat) == set(range(n))
        padding = len(flat) - n
        assert 0 <= padding < world
        # The padding repeats the start of the epoch's order.
        order = ShardedSampler(n, seed=3).global_order(epoch).tolist()
        extra = Counter(flat) - Counter(range(n))
        assert sorted(extra.elements()) == sorted((order * world)[:padding])


@pytest.mark.parametrize("n,world", [(10, 3), (11, 4), (7, 2), (2, 3)])
def test_matches_torch_distributed_sampler(n, world):
    # Same seed rule and same strided split as torch's DistributedSampler, for pad and drop_last.
    ds = list(range(n))
    for drop_last in (False, True):
        for epoch in (0, 1):
            for r in range(world):
                ref = DistributedSampler(ds, num_replicas=world, rank=r, shuffle=True, seed=5, drop_last=drop_last)
                ref.set_epoch(epoch)
                mine = ShardedSampler(n, rank=r, world_size=world, seed=5, drop_last=drop_last)
                mine.set_epoch(epoch)
                assert list(mine) == list(ref)
                assert len(mine) == len(ref)


def test_no_padding_for_exact_evaluation():
    n, world = 103, 4
    got = shards(n, world, shuffle=False, pad=False)
    assert sorted(i for g in got for i in g) == list(range(n))
    assert [len(g) for g in got] == [26, 26, 26, 25]
    assert [len(ShardedSampler(n, rank=r, world_size=world, pad=False)) for r in range(world)] == [26, 26, 26, 25]


def test_drop_last_drops_the_tail_that_does_not_fill_a_global_batch():
    n, world, bs = 103, 2, 8
    got = shards(n, world, seed=1, drop_last=True, batch_size=bs)
    keep = n // (bs * world) * bs * world  # 96
    order = ShardedSampler(n, seed=1).global_order(0).tolist()
    assert sorted(i for g in got for i in g) == sorted(order[:keep])
    assert all(len(g) == keep // world and len(g) % bs == 0 for g in got)
    s = ShardedSampler(n, world_size=world, seed=1, drop_last=True, batch_size=bs)
    assert s.num_remaining == keep
    # Too small for one global batch: nothing at all.
    assert shards(10, 2, drop_last=True, batch_size=8) == [[], []]


@pytest.mark.parametrize("world,bs", [(2, 4), (3, 5), (4, 1)])
def test_global_step_is_the_same_whatever_the_world_size(world, bs):
    # W ranks x batch B cover, step by step, exactly what 1 rank x batch W*B covers.
    n = 97
    single = list(ShardedSampler(n, seed=11, shuffle=True))
    per_rank = shards(n, world, seed=11)
    steps = -(-len(per_rank[0]) // bs)
    for k in range(steps):
        union = [i for g in per_rank for i in g[k * bs : (k + 1) * bs]]
        expected = single[k * bs * world : (k + 1) * bs * world]
        if len(expected) == bs * world:
            assert sorted(union) == sorted(expected)
        else:  # the last step: the remainder plus padding from the start of the order
            assert set(expected) <= set(union) and len(union) - len(expected) < world


def test_state_dict_round_trip_and_set_epoch_after_load():
    s = ShardedSampler(50, seed=4)
    s.set_epoch(3)
    s.advance(20)
    state = s.state_dict()
    assert state == {"version": 1, "epoch": 3, "consumed": 20, "seed": 4, "num_samples": 50, "shuffle": True}

    t = ShardedSampler(50, seed=4)
    t.load_state_dict(state)
    t.set_epoch(3)  # what a trainer calls at the top of the resumed epoch: keeps the position
    assert (t.epoch, t.consumed, len(t)) == (3, 20, 30)
    assert list(t) == t.global_order(3)[20:].tolist()
    t.set_epoch(3)  # a later set_epoch rewinds as usual
    assert t.consumed == 0

    u = ShardedSampler(50, seed=4)
    u.load_state_dict(state)
    u.set_epoch(4)  # another epoch: from its start
    assert (u.epoch, u.consumed) == (4, 0)


@pytest.mark.parametrize(
    "change,word",
    [
        ({"version": 2}, "version"),
        ({"num_samples": 51}, "num_samples"),
        ({"seed": 5}, "seed"),
        ({"shuffle": False}, "shuffle"),
    ],
)
def test_load_state_dict_names_the_mismatch(change, word):
    state = ShardedSampler(50, seed=4).state_dict() | change
    with pytest.raises(ValueError, match=word):
        ShardedSampler(50, seed=4).load_state_dict(state)


def test_load_state_dict_rejects_a_position_outside_the_epoch():
    state = ShardedSampler(50).state_dict() | {"consumed": 51}
    with pytest.raises(ValueError, match="consumed"):
        ShardedSampler(50).load_state_dict(state)


def _run_rest(state: dict, n: int, world: int, bs: int, **kw) -> list[list[int]]:
    """Every rank of a fresh world resumes from ``state`` and runs the epoch out in lockstep."""
    samplers = [ShardedSampler(n, rank=r, world_size=world, batch_size=bs, **kw) for r in range(world)]
    for s in samplers:
        s.load_state_dict(state)
        s.set_epoch(state["epoch"])
    return [list(s) for s in samplers]


@pytest.mark.parametrize("before,after", [(2, 2), (2, 1), (1, 3), (3, 2), (4, 3)])
def test_mid_epoch_resume_under_any_world_size_sees_every_index_once(before, after):
    n, bs, seed = 101, 4, 9
    samplers = [ShardedSampler(n, rank=r, world_size=before, seed=seed, batch_size=bs) for r in range(before)]
    for s in samplers:
        s.set_epoch(2)
    seen = [list(s)[: 5 * bs] for s in samplers]  # five steps, then a crash
    for s in samplers:
        s.advance(5 * bs * before)  # what a loader does per step (batch * world)
    state = samplers[0].state_dict()
    assert all(s.state_dict() == state for s in samplers)
    assert state["consumed"] == 5 * bs * before

    rest = _run_rest(state, n, after, bs, seed=seed)
    flat = [i for g in seen + rest for i in g]
    assert set(flat) == set(range(n))
    assert len(flat) - n < after  # only the padding of the new world is seen twice
    assert {len(g) for g in rest} == {-(-(n - state["consumed"]) // after)}


def test_advance_and_num_remaining_count_real_samples_exactly():
    n, world, bs = 23, 2, 4  # per step 8; steps cover 8, 8, 7 real samples (+1 padding)
    s = ShardedSampler(n, world_size=world)
    covered = []
    while not s.epoch_done:
        before = s.num_remaining
        s.advance(bs * world)
        covered.append(before - s.num_remaining)
    assert covered == [8, 8, 7]
    assert s.consumed == n and len(s) == 0 and list(s) == []

    d = ShardedSampler(n, world_size=world, drop_last=True, batch_size=bs)
    assert d.num_remaining == 16
    d.advance(8)
    d.advance(8)
    assert d.epoch_done and d.consumed == n  # the dropped tail counts as done


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank"):
        ShardedSampler(10, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        ShardedSampler(10, world_size=0)
    with pytest.raises(ValueError, match="negative"):
        ShardedSampler(10).advance(-1)


def test_empty_dataset():
    s = ShardedSampler(0, world_size=2)
    assert list(s) == [] and len(s) == 0 and s.epoch_done


def test_resume_under_the_same_world_size_replays_the_uninterrupted_run():
    # Padding comes from the start of the epoch's order, so even the padded last step is identical.
    n, world, bs = 23, 3, 2
    for r in range(world):
        full = list(ShardedSampler(n, rank=r, world_size=world, seed=2, batch_size=bs))
        s = ShardedSampler(n, rank=r, world_size=world, seed=2, batch_size=bs)
        s.advance(2 * bs * world)
        resumed = ShardedSampler(n, rank=r, world_size=world, seed=2, batch_size=bs)
        resumed.load_state_dict(s.state_dict())
        assert list(resumed) == full[2 * bs :]

"""TensorBatchLoader, the DataLoader path and make_loader: batches, epochs, resume, devices, errors."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from shoal.data import ShardedDataLoader, ShardedSampler, TensorBatchLoader, make_loader
from shoal.errors import ShoalError

N = 53


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 3, 4, generator=g), torch.arange(N) * 10


class PairDataset(Dataset):
    """A plain map-style dataset (not a TensorDataset): one Python call per sample."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


def labels(loader) -> list[list[int]]:
    """One pass, as lists of label values (label = 10 * sample index)."""
    return [(b[1] // 10).tolist() for b in loader]


def test_tensor_batches_equal_per_sample_collation(data):
    x, y = data
    for world in (1, 3):
        for rank in range(world):
            loader = make_loader((x, y), 8, rank=rank, world_size=world, seed=2)
            assert isinstance(loader, TensorBatchLoader)
            idx = list(ShardedSampler(N, rank=rank, world_size=world, seed=2))
            batches = list(loader)
            assert len(batches) == len(loader) == -(-len(idx) // 8)
            for k, (bx, by) in enumerate(batches):
                chunk = idx[k * 8 : (k + 1) * 8]
                assert torch.equal(bx, torch.stack([x[i] for i in chunk]))
                assert torch.equal(by, torch.stack([y[i] for i in chunk]))


@pytest.mark.parametrize(
    "workers", [{"num_workers": 0}, {"num_workers": 2}, {"num_workers": 1, "persistent_workers": True}]
)
def test_dataloader_path_equals_tensor_fast_path(data, workers):
    x, y = data
    for rank in range(2):
        fast = make_loader(TensorDataset(x, y), 5, rank=rank, world_size=2, seed=8)
        slow = make_loader(PairDataset(x, y), 5, rank=rank, world_size=2, seed=8, **workers)
        assert isinstance(slow, ShardedDataLoader)
        for _ in range(2):  # two epochs: both reshuffle the same way
            a, b = list(fast), list(slow)
            assert len(a) == len(b) == len(fast) == len(slow)
            for (ax, ay), (bx, by) in zip(a, b):
                assert torch.equal(ax, bx) and torch.equal(ay, by)
        assert fast.epoch == slow.epoch == 1


def test_epochs_reshuffle_automatically_and_deterministically(data):
    x, y = data
    loader = make_loader((x, y), 4, rank=0, world_size=1, seed=3)
    epochs = [labels(loader) for _ in range(3)]
    assert loader.epoch == 2
    flat = [sum(e, []) for e in epochs]
    assert all(sorted(f) == list(range(N)) for f in flat)
    assert flat[0] != flat[1] != flat[2]
    for e, f in enumerate(flat):
        assert f == torch.randperm(N, generator=torch.Generator().manual_seed(3 + e)).tolist()
    again = make_loader((x, y), 4, rank=0, world_size=1, seed=3)
    assert [labels(again) for _ in range(3)] == epochs
    other = make_loader((x, y), 4, rank=0, world_size=1, seed=4)
    assert labels(other) != epochs[0]


def test_explicit_set_epoch(data):
    x, y = data
    loader = make_loader((x, y), 4, rank=0, world_size=1, seed=3)
    loader.set_epoch(5)
    first = labels(loader)
    loader.set_epoch(5)  # the same epoch again, from its start
    assert labels(loader) == first
    assert loader.epoch == 5
    assert labels(loader) != first and loader.epoch == 6  # and on it goes automatically


def test_no_shuffle_is_in_order(data):
    x, y = data
    loader = make_loader((x, y), 10, rank=0, world_size=1, shuffle=False)
    assert sum(labels(loader), []) == list(range(N))
    assert sum(labels(loader), []) == list(range(N))


def test_state_after_k_batches_resumes_at_batch_k_plus_1(data):
    x, y = data
    full = labels(make_loader((x, y), 4, rank=1, world_size=2, seed=6))
    loader = make_loader((x, y), 4, rank=1, world_size=2, seed=6)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert state["consumed"] == 3 * 4 * 2

    resumed = make_loader((x, y), 4, rank=1, world_size=2, seed=6)
    resumed.load_state_dict(state)
    assert len(resumed) == len(full) - 3
    assert labels(resumed) == full[3:]
    # The next pass is the next epoch, as for the uninterrupted loader.
    reference = make_loader((x, y), 4, rank=1, world_size=2, seed=6)
    labels(reference)
    assert labels(resumed) == labels(reference)


@pytest.mark.parametrize("workers", [{"num_workers": 2}, {"num_workers": 2, "persistent_workers": True}])
def test_worker_prefetch_does_not_move_the_position(data, workers):
    # Workers fetch batches ahead; only batches handed out count, so breaking out and iterating
    # again continues right after the last batch the loop saw.
    x, y = data
    full = labels(make_loader((x, y), 4, rank=0, world_size=1, seed=6))
    loader = make_loader(PairDataset(x, y), 4, rank=0, world_size=1, seed=6, **workers)
    first = []
    for k, (_, by) in enumerate(loader):
        first.append((by // 10).tolist())
        if k == 1:
            break
    assert loader.state_dict()["consumed"] == 8
    assert first + labels(loader) == full


def test_resume_with_set_epoch_like_a_trainer(data):
    x, y = data
    loader = make_loader((x, y), 4, rank=0, world_size=1, seed=6)
    loader.set_epoch(2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = make_loader((x, y), 4, rank=0, world_size=1, seed=6)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # the trainer's loop calls this at the top of the resumed epoch
    rest = sum(labels(resumed), [])
    assert rest == ShardedSampler(N, seed=6).global_order(2)[4:].tolist()


def lockstep(loaders, steps: int | None = None) -> list[int]:
    """Run every rank's loader ``steps`` steps (all, if None) in lockstep; the labels seen."""
    seen: list[int] = []
    its = [iter(ld) for ld in loaders]
    k = 0
    while steps is None or k < steps:
        got = [next(it, None) for it in its]
        if all(g is None for g in got):
            break
        seen += [i for g in got if g is not None for i in (g[1] // 10).tolist()]
        k += 1
    return seen


@pytest.mark.parametrize("before,after", [(2, 2), (2, 1), (1, 3)])
@pytest.mark.parametrize("kind", ["tensor", "dataloader"])
def test_mid_epoch_resume_with_another_world_size(data, before, after, kind):
    x, y = data
    ds = (x, y) if kind == "tensor" else PairDataset(x, y)
    old = [make_loader(ds, 3, rank=r, world_size=before, seed=1) for r in range(before)]
    lockstep(old)  # epoch 0 in full
    seen = lockstep(old, steps=4)  # epoch 1: four steps, then preempted
    state = old[0].state_dict()
    assert state["epoch"] == 1 and state["consumed"] == 4 * 3 * before
    assert all(ld.state_dict() == state for ld in old)

    new = [make_loader(ds, 3, rank=r, world_size=after, seed=1) for r in range(after)]
    for ld in new:
        ld.load_state_dict(state)
    rest = lockstep(new)
    assert sorted(set(seen + rest)) == list(range(N))
    assert len(seen) + len(rest) - N < after  # duplicates are only the new world's padding
    assert all(ld.epoch == 1 and ld.state_dict()["consumed"] == N for ld in new)


def test_exact_evaluation_without_padding(data):
    x, y = data
    loaders = [make_loader((x, y), 4, rank=r, world_size=4, shuffle=False, pad=False) for r in range(4)]
    seen = lockstep(loaders)
    assert sorted(seen) == list(range(N))
    # A rank with one batch fewer still ends the epoch in the same state as the others.
    assert {str(ld.state_dict()) for ld in loaders} == {str(loaders[0].state_dict())}


def test_drop_last_gives_only_full_batches(data):
    x, y = data
    for rank in range(2):
        loader = make_loader((x, y), 4, rank=rank, world_size=2, drop_last=True)
        batches = labels(loader)
        assert len(batches) == len(loader) == N // 8
        assert all(len(b) == 4 for b in batches)


def test_epochs_advance_even_when_drop_last_leaves_nothing(data):
    x, y = data
    loader = make_loader((x, y), 40, rank=0, world_size=2, drop_last=True)  # N < one global batch
    assert len(loader) == 0
    for epoch in range(3):
        assert list(loader) == [] and loader.epoch == epoch
    assert loader.state_dict()["consumed"] == N


def test_len_before_the_next_epoch(data):
    x, y = data
    loader = make_loader((x, y), 4, rank=0, world_size=3)
    n0 = len(loader)
    labels(loader)
    assert len(loader) == n0  # the next pass is a whole fresh epoch
    it = iter(loader)
    next(it)
    assert len(loader) == n0 - 1


def test_counting_global_samples_per_step(data):
    # The trainer's exact "global samples seen": the drop in num_remaining per step.
    x, y = data
    loader = make_loader((x, y), 4, rank=0, world_size=2)
    for _ in range(2):
        it = iter(loader)  # starts the epoch
        before, per_step = loader.sampler.num_remaining, []
        for _ in it:
            now = loader.sampler.num_remaining
            per_step.append(before - now)
            before = now
        assert per_step == [8] * (N // 8) + [N % 8]


def test_transform_and_device(data):
    x, y = data

    def scale(batch):
        bx, by = batch
        return bx * 2, by

    for ds in ((x, y), PairDataset(x, y)):
        loader = make_loader(ds, 6, rank=0, world_size=1, device="cpu", transform=scale, shuffle=False)
        bx, by = next(iter(loader))
        assert bx.device == torch.device("cpu")
        assert torch.equal(bx, x[:6] * 2) and torch.equal(by, y[:6])


def test_batches_move_when_the_device_differs(data):
    # The copy branch (taken for CPU data and a CUDA device), exercised without a GPU via "meta".
    x, y = data
    loader = make_loader((x, y), 8, rank=0, world_size=1, device="meta")
    batches = list(loader)
    assert all(bx.device.type == "meta" and by.device.type == "meta" for bx, by in batches)
    assert [len(bx) for bx, _ in batches] == [8] * (N // 8) + [N % 8]


def test_dict_batches_move_to_device():
    class DictDataset(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return {"x": torch.tensor([float(i)]), "name": f"s{i}"}

    loader = make_loader(DictDataset(), 4, rank=0, world_size=1, shuffle=False, device=torch.device("cpu"))
    first = next(iter(loader))
    assert first["name"] == ["s0", "s1", "s2", "s3"] and first["x"].shape == (4, 1)


@pytest.mark.gpu
def test_cuda_device(data):
    x, y = data
    cuda = torch.device("cuda")
    for ds in ((x, y), (x.to(cuda), y.to(cuda)), PairDataset(x, y)):
        got = list(make_loader(ds, 8, rank=0, world_size=1, seed=1, device=cuda))
        ref = list(make_loader((x, y), 8, rank=0, world_size=1, seed=1))
        for (gx, gy), (rx, ry) in zip(got, ref):
            assert gx.device.type == "cuda" and gy.device.type == "cuda"
            assert torch.equal(gx.cpu(), rx) and torch.equal(gy.cpu(), ry)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_batch_size(data, bad):
    x, y = data
    with pytest.raises(ShoalError) as err:
        make_loader((x, y), bad, rank=0, world_size=1)
    assert err.value.message == f"batch size must be at least 1, got {bad!r}"
    assert "--batch-size" in err.value.hint
    with pytest.raises(ShoalError):
        make_loader(PairDataset(x, y), bad, rank=0, world_size=1)
    with pytest.raises(ShoalError):
        TensorBatchLoader((x, y), bad, ShardedSampler(N))


def test_bad_tensor_datasets(data):
    x, y = data
    with pytest.raises(ShoalError, match="same length"):
        make_loader((x, y[:-1]), 4, rank=0, world_size=1)
    with pytest.raises(ShoalError, match="map-style"):
        make_loader(Stream(), 4, rank=0, world_size=1)
    with pytest.raises(ShoalError, match="sampler"):
        make_loader((x, y), 4, rank=0, world_size=1, sampler=ShardedSampler(N))


def test_custom_collate_fn_takes_the_dataloader_path(data):
    x, y = data
    loader = make_loader((x, y), 4, rank=0, world_size=1, collate_fn=lambda items: len(items))
    assert isinstance(loader, ShardedDataLoader)
    assert sum(loader) == N

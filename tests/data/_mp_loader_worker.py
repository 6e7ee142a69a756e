"""One rank of the multi-process loader test (run as a script by test_loader_multiprocess.py).

Usage: python _mp_loader_worker.py RANK WORLD_SIZE PORT OUT_JSON

Joins a gloo group on 127.0.0.1:PORT, iterates a tensor loader and a DataLoader-path loader for two
epochs each (no set_epoch: the loaders reshuffle by themselves), all_gathers what every rank saw,
and rank 0 writes it as JSON for the test to check.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from shoal.data import make_loader

N, BATCH, SEED, EPOCHS = 61, 4, 5, 2


class Squares(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.tensor(i), torch.tensor(i * i)


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        ids = torch.arange(N)
        result: dict[str, list] = {}
        for kind, dataset in (("tensor", (ids, ids * ids)), ("dataloader", Squares())):
            loader = make_loader(dataset, BATCH, rank=rank, world_size=world, seed=SEED)
            mine = []
            for _ in range(EPOCHS):
                seen: list[int] = []
                for x, sq in loader:
                    assert torch.equal(sq, x * x), "inputs and targets of a batch must stay paired"
                    seen += x.tolist()
                mine.append({"epoch": loader.epoch, "indices": seen, "state": loader.state_dict()})
            gathered: list = [None] * world
            dist.all_gather_object(gathered, mine)
            result[kind] = gathered
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"world": world, "n": N, "seed": SEED, "ranks": result}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

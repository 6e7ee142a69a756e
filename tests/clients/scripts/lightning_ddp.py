"""A Lightning script as a user writes it: ``Trainer(strategy="ddp", accelerator="cpu")`` on a tiny
model and an in-memory dataset. Nothing in it knows about shoal.

Launched by torchrun (or anything that sets torchrun's variables), Lightning takes the process group
from the environment: ``devices`` must be the processes per node (LOCAL_WORLD_SIZE) and
``num_nodes`` the nodes (WORLD_SIZE / LOCAL_WORLD_SIZE), as Lightning checks them against it.

Usage: torchrun --nproc-per-node 2 lightning_ddp.py RESULTS.jsonl [ROOT_DIR]
Each rank appends one JSON line to RESULTS.jsonl: its rank, the world size it saw, and that it finished.
"""

import json
import os
import sys
import tempfile

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def report(path, **fields):
    with open(path, "a") as f:  # one write per rank: lines from several ranks never interleave
        f.write(json.dumps(fields) + "\n")


def main():
    results = sys.argv[1]
    root = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="lightning-")
    L.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // per_node
    model = Tiny()
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=per_node,
        num_nodes=nodes,
        max_steps=3,
        default_root_dir=root,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    report(
        results,
        library="lightning",
        rank=dist.get_rank() if dist.is_initialized() else 0,
        world_size=dist.get_world_size() if dist.is_initialized() else 1,
        library_world_size=trainer.world_size,
        library_rank=trainer.global_rank,
        steps=trainer.global_step,
        checksum=checksum,
        finished=True,
        pid=os.getpid(),
    )


if __name__ == "__main__":
    main()

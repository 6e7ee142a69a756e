"""The Lightning script many users write first: ``Trainer(strategy="ddp", accelerator="cpu")`` with
``devices`` left at "auto". On CPU "auto" is 1 device, so under a 2-process launch (torchrun's or
shoal's) Lightning refuses to start: devices x num_nodes (1 x 1) is not the world size (2).
See docs/CLIENTS.md; lightning_ddp.py is the same script with devices and num_nodes from the launch.

Usage: torchrun --nproc-per-node 2 lightning_devices_auto.py
"""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    x = torch.randn(16, 8)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False)
    trainer.fit(Tiny(), data)

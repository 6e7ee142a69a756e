"""A user's epoch loop on the library API, as the README writes it: ``for epoch in range(...)``
(0-based), ``every="2epochs"``, ``final=`` on the last epoch, resume after the saved epoch.

argv: OUT_DIR EPOCHS. Rank 0 appends one line per epoch to OUT_DIR/epochs.txt: "epoch saved|-".
"""

import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import shoal

out, epochs = Path(sys.argv[1]), int(sys.argv[2])
ctx = shoal.init(seed=0, device="cpu")
data = TensorDataset(torch.arange(16, dtype=torch.float32).view(-1, 1), torch.zeros(16, dtype=torch.long))
loader = ctx.loader(data, batch_size=4)
model = ctx.wrap(nn.Linear(1, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
ckpt = ctx.checkpointer(out / "ckpt", every="2epochs", keep=10)
state = {"model": model, "optimizer": optimizer, "loader": loader}

found = ckpt.resume(state)
step = found.step if found else 0
start = found.epoch + 1 if found else 0  # saved at an epoch's end: go on with the next one
for epoch in range(start, epochs):
    loader.set_epoch(epoch)
    for inputs, targets in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        step += 1
    saved = ckpt.maybe_save(epoch=epoch, step=step, epoch_end=True, final=epoch == epochs - 1, objects=state)
    if ctx.is_main:
        with open(out / "epochs.txt", "a") as f:
            f.write(f"{epoch} {saved.name if saved else '-'}\n")
ctx.shutdown()

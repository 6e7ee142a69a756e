"""A user's training script on the library API, with checkpoints, preemption and a sample trace.

argv: OUT_DIR LIFE EPOCHS. Every rank appends, per optimizer step, "life step epoch idx idx ..."
to OUT_DIR/trace-<life>-<rank>.txt (the samples' values are their indices).
"""

import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import shoal

out, life, epochs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
ctx = shoal.init(seed=0, device="cpu")
data = TensorDataset(torch.arange(97, dtype=torch.float32).view(-1, 1), torch.zeros(97, dtype=torch.long))
loader = ctx.loader(data, batch_size=4)
model = ctx.wrap(nn.Linear(1, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
ckpt = ctx.checkpointer(out / "ckpt", every="5steps")
state = {"model": model, "optimizer": optimizer, "loader": loader}

found = ckpt.resume(state)
step = found.step if found else 0
start = found.extra["epoch"] if found else 0
trace = open(out / f"trace-{life}-{ctx.rank}.txt", "a")  # noqa: SIM115 (kept open for the whole run)
with ctx.preemption() as preemption:
    for epoch in range(start, epochs):
        loader.set_epoch(epoch)  # after resume(): keeps the loaded position inside that epoch
        for inputs, targets in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
            step += 1
            trace.write(f"{life} {step} {epoch} " + " ".join(str(int(v)) for v in inputs.view(-1).tolist()) + "\n")
            trace.flush()
            ckpt.maybe_save(epoch=epoch, step=step, epoch_end=False, objects=state, extra={"epoch": epoch})
            if preemption.requested():
                ckpt.save(epoch=epoch, step=step, objects=state, extra={"epoch": epoch})
                ctx.print(f"preempted at step {step}")
                raise SystemExit(143)
        ckpt.maybe_save(
            epoch=epoch, step=step, epoch_end=True, final=epoch == epochs - 1, objects=state, extra={"epoch": epoch + 1}
        )
ctx.shutdown()

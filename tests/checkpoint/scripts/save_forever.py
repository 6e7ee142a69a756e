"""Save checkpoints in a loop until killed; each one's tensors all equal its step number."""

import sys

import torch

from shoal.checkpoint.manager import CheckpointManager


class Blob:
    """A few MB of state, so a save takes long enough to be killed half-way."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self):
        return {"step": self.step, "weights": torch.full((1 << 19,), float(self.step))}


manager = CheckpointManager(sys.argv[1], keep=2)
blob = Blob()
print("ready", flush=True)
while True:
    blob.step += 1
    manager.save(epoch=1, step=blob.step, objects={"blob": blob})

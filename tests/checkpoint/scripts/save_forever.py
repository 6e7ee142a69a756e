"""Save checkpoints in a loop until killed; each one's tensors all equal its step number.

Steps continue after the newest checkpoint already in the directory (so the newest file is always
the last one written), and every completed save is announced on stdout."""

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
existing = manager.checkpoints()
blob.step = int(existing[-1].name.split("-s")[1].split(".")[0]) if existing else 0
print("ready", flush=True)
while True:
    blob.step += 1
    manager.save(epoch=1, step=blob.step, objects={"blob": blob})
    print(f"saved {blob.step}", flush=True)

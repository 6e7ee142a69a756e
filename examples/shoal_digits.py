"""examples/ddp_digits.py ported to shoal: the same training, and it runs as written everywhere.

python examples/shoal_digits.py                                   # one process
shoal run --nproc 2 examples/shoal_digits.py --epochs 5           # 2 local workers
torchrun --standalone --nproc-per-node 2 examples/shoal_digits.py # (or srun, mpirun, a pod)
"""

import argparse
import os

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import shoal

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--out", default="runs/shoal_digits", help="directory for model.pt")
args = parser.parse_args()

ctx = shoal.init(seed=0)  # whatever started this process: python, shoal run, torchrun, srun, mpirun, a pod

images, labels = load_digits(return_X_y=True)  # 1,797 real 8x8 digits, shipped with scikit-learn
images = torch.tensor(images / 16.0, dtype=torch.float32)
labels = torch.tensor(labels)
train_set = TensorDataset(images[:1500], labels[:1500])
test_set = TensorDataset(images[1500:], labels[1500:])

model = ctx.wrap(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))  # on ctx.device; DDP if > 1 rank
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
train_loader = ctx.loader(train_set, batch_size=32)  # this rank's shard, reshuffled every epoch
test_loader = ctx.eval_loader(test_set, batch_size=256)  # every test sample on exactly one rank

for epoch in range(args.epochs):
    for inputs, targets in train_loader:  # already on ctx.device
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    scores = ctx.evaluate(model, test_loader)  # {"loss", "accuracy", "samples"}: the whole test set, on every rank
    loss, accuracy, samples = scores["loss"], scores["accuracy"], scores["samples"]
    ctx.print(f"epoch {epoch}: test loss {loss:.3f}, accuracy {accuracy:.3f} ({samples} test samples)")  # rank 0

if ctx.is_main:
    os.makedirs(args.out, exist_ok=True)
    torch.save(shoal.model_state_dict(model), os.path.join(args.out, "model.pt"))  # no "module." prefixes
ctx.shutdown()

"""A plain PyTorch DDP script, as the DDP tutorials teach it: the "before" of examples/shoal_digits.py.

It does not import shoal. It trains a small MLP on scikit-learn's digits (1,797 real 8x8 images,
shipped with scikit-learn: no download) and runs unchanged under a launcher that starts one process
per rank and sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT:

    shoal run --nproc 2 examples/ddp_digits.py --epochs 5
    torchrun --standalone --nproc-per-node 2 examples/ddp_digits.py --epochs 5

Every line marked ``# shoal:`` is one that examples/shoal_digits.py drops or replaces.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--out", default="runs/ddp_digits", help="directory for model.pt")
args = parser.parse_args()

dist.init_process_group("gloo")  # shoal: shoal.init() (gloo on CPU, nccl on GPU)
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)

images, labels = load_digits(return_X_y=True)
images = torch.tensor(images / 16.0, dtype=torch.float32)
labels = torch.tensor(labels)
train_set = TensorDataset(images[:1500], labels[:1500])
test_set = TensorDataset(images[1500:], labels[1500:])

model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))  # shoal: ctx.wrap(...)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sampler = DistributedSampler(train_set, shuffle=True, seed=0)  # shoal: ctx.loader(...)
train_loader = DataLoader(train_set, batch_size=32, sampler=sampler)
# shoal: ctx.eval_loader(...); DistributedSampler would pad the test set to a multiple of world_size
test_loader = DataLoader(test_set, batch_size=256, sampler=DistributedSampler(test_set, shuffle=False))

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)  # shoal: drop (the loader reshuffles every epoch)
    model.train()
    for inputs, targets in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    # shoal: ctx.evaluate(model, test_loader) replaces this block
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct predictions, samples
    with torch.no_grad():
        for inputs, targets in test_loader:
            outputs = model.module(inputs)  # shoal: drop .module
            totals[0] += F.cross_entropy(outputs, targets, reduction="sum").item()
            totals[1] += (outputs.argmax(1) == targets).sum().item()
            totals[2] += len(targets)
    dist.all_reduce(totals)  # the padding counts a test sample twice when world_size does not divide 297
    loss, accuracy, samples = (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item(), int(totals[2])
    if rank == 0:  # shoal: ctx.print(...)
        print(f"epoch {epoch}: test loss {loss:.3f}, accuracy {accuracy:.3f} ({samples} test samples)", flush=True)

if rank == 0:  # shoal: if ctx.is_main
    os.makedirs(args.out, exist_ok=True)
    torch.save(model.module.state_dict(), os.path.join(args.out, "model.pt"))  # shoal: shoal.model_state_dict(model)
dist.destroy_process_group()  # shoal: ctx.shutdown()

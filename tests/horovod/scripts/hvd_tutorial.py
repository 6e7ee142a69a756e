"""A Horovod PyTorch training script, as Horovod's tutorial writes it, with one import changed.

Trains a small CNN on scikit-learn's bundled 8x8 digits (offline) with the tutorial's seven steps:
hvd.init, pin the GPU to the local rank, scale the learning rate by hvd.size(), shard the data with
DistributedSampler, hvd.DistributedOptimizer, broadcast the initial state from rank 0, and checkpoint
on rank 0 only (resuming from it: rank 0 loads, the broadcasts hand it to the others).

Usage: hvd_tutorial.py --out DIR [--epochs N] [--fp16-allreduce] [--batches-per-allreduce K]
Writes DIR/checkpoint-{epoch}.pt (rank 0) and DIR/rank{r}.json (every rank: its view of the job,
per-epoch test accuracy and a digest of its final weights).
"""

import argparse
import hashlib
import json
import os

import torch
import torch.nn.functional as F
import torch.utils.data.distributed
from torch import nn

import shoal.horovod as hvd  # was: import horovod.torch as hvd
from shoal.workloads.digits import load_digits_arrays  # scikit-learn's digits, without its 1 s import

parser = argparse.ArgumentParser(description="Horovod-style digits example")
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--batches-per-allreduce", type=int, default=1)
parser.add_argument("--no-cuda", action="store_true")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.flatten(1)))), dim=1)


def digits():
    pixels, targets = load_digits_arrays()
    images = torch.tensor(pixels, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    labels = torch.tensor(targets, dtype=torch.int64)
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(labels), generator=generator)
    train, test = order[:1500], order[1500:]
    tensors = torch.utils.data.TensorDataset
    return tensors(images[train], labels[train]), tensors(images[test], labels[test])


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


# 1. Initialize Horovod.
hvd.init()
torch.manual_seed(args.seed)
# 2. Pin each process to one GPU (its local rank).
if args.cuda:
    torch.cuda.set_device(hvd.local_rank())
    torch.cuda.manual_seed(args.seed)
torch.set_num_threads(1)

# 7 (resume side). Rank 0 finds the newest checkpoint and tells the others which epoch to resume from.
resume_from_epoch = 0
for epoch in range(args.epochs, 0, -1):
    if os.path.exists(os.path.join(args.out, f"checkpoint-{epoch}.pt")):
        resume_from_epoch = epoch
        break
resume_from_epoch = hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0, name="resume_from_epoch").item()

# 4. Shard the data: each rank a different part of every epoch.
train_set, test_set = digits()
train_sampler = torch.utils.data.distributed.DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
test_sampler = torch.utils.data.distributed.DistributedSampler(
    test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False
)
test_loader = torch.utils.data.DataLoader(test_set, batch_size=256, sampler=test_sampler)

model = Net()
if args.cuda:
    model.cuda()
# 3. Scale the learning rate by the number of workers (the global batch grows with them).
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
if resume_from_epoch > 0 and hvd.rank() == 0:
    checkpoint = torch.load(os.path.join(args.out, f"checkpoint-{resume_from_epoch}.pt"), weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])

# 6. Broadcast the initial state (or rank 0's resumed state) from rank 0 to everyone.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

# 5. Wrap the optimizer: gradients are averaged across ranks before every step.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    backward_passes_per_step=args.batches_per_allreduce,
)

accuracies = []
for epoch in range(resume_from_epoch, args.epochs):
    model.train()
    train_sampler.set_epoch(epoch)
    batches = list(train_loader)
    # K micro-batches of batch_size / K each: K backward passes per optimizer step, one all-reduce.
    for data, target in batches:
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        for chunk, chunk_target in zip(
            data.chunk(args.batches_per_allreduce), target.chunk(args.batches_per_allreduce)
        ):
            loss = F.nll_loss(model(chunk), chunk_target) / args.batches_per_allreduce
            loss.backward()
        optimizer.step()

    model.eval()
    correct, seen = 0.0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            correct += (model(data).argmax(1) == target).sum().item()
            seen += len(target)
    accuracy = metric_average(correct, "correct") / metric_average(seen, "seen")
    accuracies.append(accuracy)
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1}: test accuracy {accuracy:.3f}", flush=True)
        # 7. Checkpoint on rank 0 only.
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
            os.path.join(args.out, f"checkpoint-{epoch + 1}.pt"),
        )

digest = hashlib.sha256()
for name, tensor in sorted(model.state_dict().items()):
    digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(
        {
            "rank": hvd.rank(),
            "size": hvd.size(),
            "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(),
            "cross_rank": hvd.cross_rank(),
            "cross_size": hvd.cross_size(),
            "resumed_from": resume_from_epoch,
            "accuracies": accuracies,
            "weights": digest.hexdigest(),
            "lr": optimizer.param_groups[0]["lr"],
            "momentum_buffers": sum(1 for s in optimizer.state.values() if "momentum_buffer" in s),
            "device": str(next(model.parameters()).device),
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        },
        f,
    )

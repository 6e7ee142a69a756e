"""Flyte's "Single Node, Multi GPU Training" tutorial with its *own* model, through shoal (docs/FLYTE.md).

The tutorial's ``Net``, ``Hyperparameters``, ``train`` and ``test`` (with its W&B table of test
predictions) stay the user's code; shoal replaces ``dist_setup``, ``mp.spawn`` and the
``DistributedSampler``. Two forms of the same port:

- ``function_workflow``: the tutorial's per-rank function, run by ``shoal.run(train_mnist, hp, ..., nproc=2)``;
- ``workload_workflow``: the same ``Net`` as a :class:`shoal.Workload`, trained by shoal's trainer.

pyflyte run examples/flyte_own_model.py function_workflow --data_dir ~/data   # MNIST in ~/data/MNIST/raw
pyflyte run examples/flyte_own_model.py workload_workflow --data_dir ~/data

W&B logs online with ``WANDB_API_KEY`` set, else offline (``WANDB_MODE`` decides when set).
"""

import os
import tempfile
import typing
from dataclasses import asdict, dataclass
from pathlib import Path

import flytekit
import torch
import torch.nn.functional as F
from flytekit import task, workflow
from flytekit.types.file import FlyteFile
from torch import nn, optim
from torch.utils.data import Subset
from torchvision import datasets, transforms

import shoal
from shoal.flyte import TrainOutputs, fit, resources, train_task

WORKERS = 2  # processes, and GPUs requested: one per process
PROJECT = "mnist-single-node-multi-gpu"
NUM_BATCHES_TO_LOG = 10  # test batches whose predictions go into the W&B table...
LOG_IMAGES_PER_BATCH = 32  # ...this many images of each


class Net(nn.Module):
    """The tutorial's CNN: two convolutions, two dense layers, log-probabilities out."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5, 1)
        self.conv2 = nn.Conv2d(20, 50, 5, 1)
        self.fc1 = nn.Linear(4 * 4 * 50, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))  # flatten, not view: the input may be channels-last
        return F.log_softmax(self.fc2(x), dim=1)


@dataclass
class Hyperparameters:
    """The tutorial's hyperparameters (the backend is shoal's choice: nccl on GPUs, gloo on CPUs),
    plus how much of MNIST to use (0: all of it) for a quick run."""

    sgd_momentum: float = 0.5
    seed: int = 1
    log_interval: int = 10
    batch_size: int = 64
    test_batch_size: int = 1000
    epochs: int = 10
    learning_rate: float = 0.01
    train_samples: int = 0
    test_samples: int = 0


class TrainingOutputs(typing.NamedTuple):
    epoch_accuracies: list[float]
    model_state: FlyteFile


def mnist(data_dir: str, train: bool, samples: int = 0, download: bool = False) -> torch.utils.data.Dataset:
    """MNIST from ``data_dir/MNIST/raw``, normalised as in the tutorial; its first ``samples`` images if given."""
    normalise = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    dataset = datasets.MNIST(data_dir, train=train, download=download, transform=normalise)
    return Subset(dataset, range(samples)) if samples else dataset


def train(model, device, train_loader, optimizer, epoch, log_interval, rank):
    """One epoch (the tutorial's loop); rank 0 prints and logs the loss every ``log_interval`` batches."""
    import wandb

    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if rank == 0 and batch_idx % log_interval == 0:
            print(f"Train Epoch: {epoch} batch {batch_idx}\tloss={loss.item():.4f}", flush=True)
            wandb.log({"loss": loss.item(), "epoch": epoch})


def log_test_predictions(images, labels, outputs, predicted, table, log_counter):
    """The first ``LOG_IMAGES_PER_BATCH`` images of a test batch into the W&B table, with their scores."""
    import wandb

    scores = F.softmax(outputs, dim=1).cpu().numpy()
    rows = zip(images.cpu().numpy(), labels.cpu().numpy(), predicted.cpu().numpy(), scores)
    for index, (image, label, guess, score) in enumerate(rows):
        if index == LOG_IMAGES_PER_BATCH:
            break
        table.add_data(f"{index}_{log_counter}", wandb.Image(image[0]), int(guess), int(label), *score.tolist())


def test(model, device, test_loader) -> float:
    """Test loss and accuracy over the whole test set, logged with the table of predictions (rank 0)."""
    import wandb

    model.eval()
    table = wandb.Table(columns=["id", "image", "guess", "truth", *[f"score_{i}" for i in range(10)]])
    test_loss, correct, total = 0.0, 0, 0
    with torch.no_grad():
        for log_counter, (images, targets) in enumerate(test_loader):
            images, targets = images.to(device), targets.to(device)
            outputs = model(images)
            test_loss += F.nll_loss(outputs, targets, reduction="sum").item()
            predicted = outputs.argmax(dim=1)
            correct += (predicted == targets).sum().item()
            total += len(targets)
            if log_counter < NUM_BATCHES_TO_LOG:
                log_test_predictions(images, targets, outputs, predicted, table, log_counter)
    test_loss /= total
    accuracy = correct / total
    print(f"test_loss={test_loss:.4f} accuracy={accuracy:.4f}", flush=True)
    wandb.log({"test_loss": test_loss, "accuracy": accuracy, "mnist_predictions": table})
    return accuracy


def train_mnist(hp: Hyperparameters, data_dir: str, out: str) -> tuple[list[float], str]:
    """What every rank runs (the tutorial's ``train_mnist``): ``shoal.run`` has joined the group."""
    import wandb

    ctx = shoal.current()
    if ctx.local_rank == 0:  # one download per node, before any rank reads the files
        for split in (True, False):
            datasets.MNIST(data_dir, train=split, download=True)
    ctx.barrier()
    if ctx.is_main:
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        wandb.init(project=PROJECT, dir=out, mode=mode, config={**asdict(hp), "world_size": ctx.world_size})
    torch.manual_seed(hp.seed)  # every rank starts from the same weights
    train_loader = ctx.loader(mnist(data_dir, True, hp.train_samples), batch_size=hp.batch_size)  # this rank's shard
    test_loader = torch.utils.data.DataLoader(mnist(data_dir, False, hp.test_samples), batch_size=hp.test_batch_size)
    model = ctx.wrap(Net())
    optimizer = optim.SGD(model.parameters(), lr=hp.learning_rate, momentum=hp.sgd_momentum)
    accuracies = []
    for epoch in range(1, hp.epochs + 1):
        train(model, ctx.device, train_loader, optimizer, epoch, hp.log_interval, ctx.rank)
        if ctx.is_main:  # validation in the main process only, as in the tutorial
            accuracies.append(test(model, ctx.device, test_loader))
        ctx.barrier()
    model_file = Path(out) / "mnist_cnn.pt"
    if ctx.is_main:
        wandb.finish()
        torch.save(shoal.model_state_dict(model), model_file)  # plain Net keys, no DDP "module." prefix
    return accuracies, str(model_file)


@task(resources=resources(WORKERS), retries=2, cache=True, cache_version="1")
def train_function(hp: Hyperparameters, data_dir: str, out: str) -> TrainingOutputs:
    """The tutorial's task with ``shoal.run`` for ``mp.spawn``: rank 0's return value comes back here.
    ``out``: where the model and W&B's files go (default: a new directory in the task's sandbox)."""
    if not out:
        sandbox = Path(flytekit.current_context().working_directory)
        sandbox.mkdir(parents=True, exist_ok=True)
        out = tempfile.mkdtemp(prefix="mnist-", dir=sandbox)
    accuracies, model_file = shoal.run(train_mnist, hp, data_dir, out, nproc=WORKERS)
    return TrainingOutputs(epoch_accuracies=accuracies, model_state=FlyteFile(model_file))


@workflow
def function_workflow(
    hp: Hyperparameters = Hyperparameters(), data_dir: str = "data", out: str = ""
) -> TrainingOutputs:
    return train_function(hp=hp, data_dir=data_dir, out=out)


class TutorialMnist(shoal.Workload):
    """The same ``Net`` and data as a :class:`shoal.Workload`: shoal's trainer runs the loop (sharding,
    DDP, exact evaluation over every rank, checkpoints and resume, W&B with its predictions table)."""

    name = "tutorial-mnist"

    def __init__(self, train_samples: int = 0, test_samples: int = 0) -> None:
        self.train_samples, self.test_samples = train_samples, test_samples

    def prepare(self, cfg) -> None:  # in the launching process, once, before any worker starts
        for split in (True, False):
            datasets.MNIST(cfg.data, train=split, download=True)

    def load(self, cfg, device, rank=0) -> shoal.WorkloadData:
        return shoal.WorkloadData(
            train=mnist(cfg.data, True, self.train_samples),
            test=mnist(cfg.data, False, self.test_samples),
            num_classes=10,
        )

    def build_model(self, cfg, num_classes) -> nn.Module:
        return Net()

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(outputs, targets)  # Net returns log-probabilities


@train_task(nproc=WORKERS, retries=2, cache=True, cache_version="1")
def train_workload(hp: Hyperparameters, data_dir: str, tracker: str) -> TrainOutputs:
    """``tracker="wandb"``: W&B from rank 0 (config, loss, test accuracy, the predictions table)."""
    return fit(
        TutorialMnist(hp.train_samples, hp.test_samples), data=data_dir, epochs=hp.epochs, batch_size=hp.batch_size,
        lr=hp.learning_rate, optimizer="sgd", seed=hp.seed, tracker=tracker,
    )  # fmt: skip


@workflow
def workload_workflow(
    hp: Hyperparameters = Hyperparameters(), data_dir: str = "data", tracker: str = "wandb"
) -> TrainOutputs:
    return train_workload(hp=hp, data_dir=data_dir, tracker=tracker)

"""Flyte's "Single Node, Multi GPU Training" tutorial (MNIST, DDP, W&B) with shoal: see docs/FLYTE.md.

pyflyte run examples/flyte_workflow.py training_workflow                       # digits, 2 workers, offline
pyflyte run examples/flyte_workflow.py training_workflow --data ~/data --tracker wandb   # MNIST, W&B
pyflyte run examples/flyte_workflow.py elastic_workflow                        # the kfpytorch Elastic plugin
"""

from flytekit import task, workflow
from flytekitplugins.kfpytorch import Elastic

from shoal.flyte import TrainOutputs, fit, resources, train_task

WORKERS = 2  # processes, and GPUs requested: one per process


@train_task(nproc=WORKERS, retries=2, cache=True, cache_version="1")
def train(epochs: int, data: str, tracker: str, batch_size: int | None, checkpoint_every: str) -> TrainOutputs:
    """MNIST in DATA/MNIST/raw (downloaded there once if missing) when ``data`` is given, else scikit-learn's
    digits (offline); W&B from rank 0 with ``tracker="wandb"``."""
    workload = "mnist" if data else "digits"
    return fit(
        workload, epochs=epochs, batch_size=batch_size, data=data, download=True, tracker=tracker,
        checkpoint_every=checkpoint_every,
    )  # fmt: skip


@workflow
def training_workflow(
    epochs: int = 3, data: str = "", tracker: str = "", batch_size: int | None = None, checkpoint_every: str = "1"
) -> TrainOutputs:
    return train(epochs=epochs, data=data, tracker=tracker, batch_size=batch_size, checkpoint_every=checkpoint_every)


# The same training in the kfpytorch plugin's Elastic task: its agent starts the workers (forked here:
# spawned workers would re-import this file, which `pyflyte run` does not put on their path).
@task(
    task_config=Elastic(nproc_per_node=WORKERS, start_method="fork", monitor_interval=1, increase_shared_mem=False),
    resources=resources(WORKERS), shared_memory=True, retries=2, cache=True, cache_version="1",
)  # fmt: skip
def train_elastic(epochs: int, data: str, tracker: str) -> TrainOutputs:
    return fit("mnist" if data else "digits", epochs=epochs, data=data, tracker=tracker)  # no nproc: a rank


@workflow
def elastic_workflow(epochs: int = 3, data: str = "", tracker: str = "") -> TrainOutputs:
    return train_elastic(epochs=epochs, data=data, tracker=tracker)

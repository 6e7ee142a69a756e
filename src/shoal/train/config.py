"""What one training run computes (``shoal train``, ``shoal.fit``): :class:`TrainConfig`.

Frozen and checked on construction; :meth:`TrainConfig.resolved` fills what the user left to the
workload (epochs, batch size, lr, optimizer, weight decay, warm-up), once, before any worker starts.
``shoal train``'s flags are generated from the fields and the docstrings under them
(``shoal.cli.fields``): a new option is one field here. How many processes run the job, and how
they meet, is not part of it (:class:`shoal.launch.options.LaunchOptions`).

Nothing here imports torch: ``shoal train --help`` stays instant.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from shoal.checkpoint.cadence import Cadence
from shoal.checkpoint.layout import is_sharded
from shoal.distributed.comm_hooks import COMM_HOOKS, check_comm_hook
from shoal.env.grace import PREEMPT_GRACE_S
from shoal.errors import ShoalError
from shoal.tracking.spec import parse_spec, require_installed
from shoal.workloads.archs import check_arch
from shoal.workloads.spec import check_form

LR_SCALING = ("none", "linear", "sqrt")
AMP_MODES = ("off", "bf16", "fp16")
OPTIMIZERS = ("sgd", "adamw")
_FROM_WORKLOAD = ("epochs", "batch_size", "lr", "optimizer", "weight_decay", "warmup_epochs")
"""Fields that None leaves to the workload's defaults."""
_FALLBACK = {"epochs": 10, "batch_size": 32, "lr": 0.01, "optimizer": "sgd", "weight_decay": 0.0, "warmup_epochs": 0.0}
"""What a workload's defaults leave out."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a training run computes with; ``None`` means "the workload's default"."""

    workload: str = "digits"
    """What trains: a bundled workload (digits, mnist, cifar10, synthetic), pkg.module:Name or
    path/to/file.py:Name (your own shoal.Workload; docs/WORKLOADS.md)."""
    epochs: int | None = None
    """Passes over the training set (workload default)."""
    batch_size: int | None = None
    """Samples per process per micro-batch; the global batch is this x world size x grad accumulation."""
    lr: float | None = None
    """Base learning rate, before --lr-scaling (workload default)."""
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    """How the base lr grows with the world size: none, linear (x N) or sqrt (x sqrt N)."""
    optimizer: Literal["sgd", "adamw"] | None = None
    """sgd (momentum 0.9, nesterov) or adamw (workload default)."""
    weight_decay: float | None = None
    """L2 weight decay of the optimizer (workload default)."""
    warmup_epochs: float | None = None
    """Linear lr warm-up over this many epochs, then cosine decay to zero (workload default, else 0)."""
    seed: int = 0
    """Seeds model initialisation, the data order and augmentation."""
    data: str | None = field(default=None, metadata={"metavar": "DIR"})
    """Dataset directory (mnist: DIR/MNIST/raw; cifar10: DIR/cifar-10-batches-py)."""
    download: bool = False
    """Download the dataset into --data when it is missing."""
    out: str | None = field(default=None, metadata={"metavar": "DIR"})
    """Output directory (default runs/<workload>-<timestamp>); an existing run there is resumed."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto (a GPU per process when there are enough, else the CPU), cpu or cuda."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Collective backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl."""
    amp: Literal["off", "bf16", "fp16"] = "off"
    """Mixed precision: off, bf16 or fp16 (fp16 needs CUDA)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are all-reduced only on the last one."""
    arch: str = field(default="resnet18", metadata={"metavar": "NAME"})
    """synthetic: the model, a torchvision ResNet (resnet18 ... resnet152) or mlp; cifar10: the ResNet
    (resnet18 ... resnet152, with the CIFAR stem); language: the size, tiny, small or large."""
    image_size: int = 32
    """synthetic: side of the square input images."""
    samples: int | None = None
    """synthetic: training samples (default 1024); language: training windows (default 2048); the
    test set of both has an eighth as many (at least 1)."""
    eval_batch_size: int | None = None
    """Per-process batch size for evaluation (default 4 x --batch-size)."""
    eval_samples: int | None = None
    """Evaluate on the test set's first N samples only, still each once across the processes (default:
    all; as Lightning's limit_val_batches or Hugging Face's max_eval_samples, for quick iterations)."""
    channels_last: bool | None = None
    """Convolutions in channels-last (NHWC) memory format: faster on CPU and GPU (default: on for conv models)."""
    progress: bool | None = None
    """Progress bar on rank 0 (default: when stderr is a terminal)."""
    comm_hook: Literal["none", "bf16", "fp16", "powersgd"] = "none"
    """DDP gradient compression: all-reduce the gradients in bf16 or fp16, half the bytes of float32
    (parameters and optimizer stay float32), or powersgd: torch's low-rank PowerSGD with error
    feedback (see --powersgd-rank; plain all-reduce for the first 10% of the steps), far fewer bytes;
    pays off when communication is the bottleneck (a slow network between nodes)."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """How the model is spread over the processes: ddp (a whole copy in each, gradients all-reduced)
    or fsdp (FSDP2: each process holds 1/N of the parameters, gradients and optimizer state; for a
    model whose training state does not fit one process; docs/SHARDING.md). fsdp takes --amp bf16
    (FSDP's mixed precision), not --amp fp16 nor --comm-hook."""
    fault_tolerance: bool = False
    """Per-step fault tolerance (torchft): --nproc N runs N replica groups per node that train together; a
    group that dies costs the others one step, is restarted alone and heals from a live group
    (docs/FAULT_TOLERANCE.md). Needs pip install 'shoal[ft]'."""
    nproc_per_group: int | None = field(default=None, metadata={"metavar": "K"})
    """--fault-tolerance: processes per replica group (--nproc / K groups per node). A group of several
    trains as one DDP job inside, or with --strategy fsdp shards the model over its processes (HSDP:
    FSDP inside a group, replicas across). Default 1, with --strategy fsdp every process of the node."""
    lighthouse: str | None = field(default=None, metadata={"metavar": "URL"})
    """--fault-tolerance: the torchft lighthouse to use (http://HOST:PORT); default, shoal runs one (on node 0)."""
    powersgd_rank: int = 2
    """--comm-hook powersgd: rank of each gradient matrix's approximation (1-4 typical; higher sends
    more and is closer to the exact gradient)."""
    checkpoint_every: str = field(default="1", metadata={"metavar": "N|Nsteps"})
    """Checkpoint every N epochs (2, 2epochs) or steps (500steps); 0 or off: only at the end."""
    checkpoint_dir: str | None = field(default=None, metadata={"metavar": "DIR"})
    """Where checkpoints go (default OUT/checkpoints)."""
    keep: int = 3
    """Keep the newest K checkpoints."""
    resume: str = field(default="auto", metadata={"metavar": "auto|never|PATH"})
    """auto: continue from the newest valid checkpoint in the output directory; never; or a ckpt-*.pt file."""
    async_checkpoint: bool = False
    """Write checkpoints in the background: training waits only for the copy to memory. They are
    sharded (.dcp directories, every process writes its part), as with --strategy fsdp always."""
    preempt_grace: float = field(default=PREEMPT_GRACE_S, metadata={"metavar": "S"})
    """After SIGTERM/SIGUSR1: checkpoint and exit within this many seconds."""
    tracker: str | None = field(default=None, metadata={"metavar": "wandb,tensorboard,mlflow"})
    """Experiment trackers rank 0 logs to, comma-separated (any of wandb, tensorboard, mlflow; default none)."""
    log_every: int = 50
    """Log the train loss, lr and throughput to the trackers every N optimizer steps (0: epoch records only)."""
    project: str = field(default="shoal", metadata={"metavar": "NAME"})
    """W&B project and MLflow experiment."""
    run_name: str | None = field(default=None, metadata={"metavar": "NAME"})
    """The run's name in every tracker (default: the output directory's name)."""
    mlflow_uri: str | None = field(default=None, metadata={"metavar": "URI"})
    """MLflow tracking URI (default: MLFLOW_TRACKING_URI, else MLflow's default)."""
    log_predictions: int = 32
    """Rows of the per-epoch table of test predictions (id, image, guess, truth, scores); 0: none."""

    def __post_init__(self) -> None:
        check_form(self.workload)  # the name alone, nothing imported: bad input fails before torch loads
        if isinstance(self.workload, str):
            check_arch(self.workload, self.arch)  # a bundled workload's --arch, likewise
        for flag, value in (
            ("--epochs", self.epochs),
            ("--grad-accum", self.grad_accum),
            ("--image-size", self.image_size),
            ("--samples", self.samples),
            ("--eval-batch-size", self.eval_batch_size),
            ("--eval-samples", self.eval_samples),
            ("--keep", self.keep),
            ("--powersgd-rank", self.powersgd_rank),
        ):
            _at_least_one(flag, value)
        _at_least_one("--batch-size", self.batch_size, hint="pass --batch-size 1 or more (it is per process)")
        if self.lr is not None and not self.lr > 0:
            raise ShoalError(f"--lr must be positive, got {self.lr}", "pass a learning rate such as --lr 0.05")
        if self.warmup_epochs is not None and self.warmup_epochs < 0:
            raise ShoalError(f"--warmup-epochs must be >= 0, got {self.warmup_epochs}", "pass 0 to disable warm-up")
        if self.preempt_grace <= 0:
            raise ShoalError(f"--preempt-grace must be positive, got {self.preempt_grace}", "pass seconds, e.g. 25")
        _choice("--lr-scaling", self.lr_scaling, LR_SCALING)
        _choice("--amp", self.amp, AMP_MODES)
        _choice("--device", self.device, ("auto", "cpu", "cuda"))
        _choice("--backend", self.backend, ("auto", "gloo", "nccl"))
        if self.optimizer is not None:
            _choice("--optimizer", self.optimizer, OPTIMIZERS)
        try:
            check_comm_hook(self.comm_hook)
        except ShoalError as err:
            raise ShoalError(f"--comm-hook: {err.message}", err.hint) from None
        _check_strategy(self.strategy, self.comm_hook, self.amp, self.channels_last)
        if self.fault_tolerance or self.lighthouse is not None or self.nproc_per_group is not None:
            _check_fault_tolerance(self)
        self.cadence  # noqa: B018  (parsed once here: a malformed --checkpoint-every fails now)
        if self.log_every < 0 or self.log_predictions < 0:
            raise ShoalError("--log-every and --log-predictions must be 0 or more", "pass 0 to turn them off")
        require_installed(parse_spec(self.tracker))  # an unknown name or a missing package fails here

    @functools.cached_property
    def cadence(self) -> Cadence:
        """``checkpoint_every``, parsed."""
        return Cadence.parse(self.checkpoint_every)

    @property
    def is_resolved(self) -> bool:
        return all(getattr(self, name) is not None for name in _FROM_WORKLOAD)

    def resolved(self, workload: Any = None) -> TrainConfig:
        """This config with every field left to the workload filled in (idempotent).

        ``workload``: the instance being trained (``shoal.fit(MyWorkload(...))``), whose defaults
        apply; default, the one ``self.workload`` names."""
        if self.is_resolved:
            return self
        from shoal.workloads import workload_defaults

        given = workload_defaults(workload if workload is not None else self.workload)
        unknown = sorted(set(given) - set(_FROM_WORKLOAD))
        if unknown:
            raise ShoalError(
                f"workload {self.workload}: unknown key(s) in its defaults: {', '.join(unknown)}",
                f"a Workload's defaults may set: {', '.join(_FROM_WORKLOAD)}",
            )
        defaults = {**_FALLBACK, **given}
        return self.replace(**{name: defaults[name] for name in _FROM_WORKLOAD if getattr(self, name) is None})

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def check_resume(resume: str) -> None:
    """``--resume``: auto, never, or a ``ckpt-*.pt`` file or sharded ``ckpt-*.dcp`` directory that exists.
    Torch-free: ``shoal train`` says so before torch loads, :func:`~shoal.train.job.fit` for
    ``shoal.fit``."""
    if resume not in ("auto", "never") and not (os.path.isfile(resume) or is_sharded(resume)):
        raise ShoalError(
            f"--resume {resume}: no such checkpoint",
            "pass --resume auto, never, a ckpt-*.pt file or a sharded ckpt-*.dcp directory",
        )


def _check_strategy(strategy: str, comm_hook: str, amp: str, channels_last: bool | None) -> None:
    """--strategy, and what fsdp refuses, in the process that starts the workers (one line + HINT)."""
    if strategy == "ddp":
        return  # the default
    from shoal.distributed.strategy import check_strategy, refuse_comm_hook_with_fsdp  # torch-free

    check_strategy(strategy)
    refuse_comm_hook_with_fsdp(comm_hook, strategy)
    if amp == "fp16":
        raise ShoalError(
            "--amp fp16 does not work with --strategy fsdp: FSDP has no loss scaler for fp16",
            "use --amp bf16 with --strategy fsdp (FSDP computes in bf16, reduces in float32)",
        )
    if channels_last:
        raise ShoalError(
            "--channels-last does not work with --strategy fsdp: FSDP shards contiguous parameters only",
            "drop --channels-last (fsdp trains conv models in the default memory format)",
        )


def _check_fault_tolerance(cfg: TrainConfig) -> None:
    """What --fault-tolerance cannot carry, refused before any worker starts (one line + HINT)."""
    if not cfg.fault_tolerance:
        flag = "--lighthouse" if cfg.lighthouse is not None else "--nproc-per-group"
        raise ShoalError(f"{flag} is for --fault-tolerance", f"add --fault-tolerance, or drop {flag}")
    _at_least_one("--nproc-per-group", cfg.nproc_per_group)
    refused = {
        "--comm-hook": (cfg.comm_hook != "none", "torchft averages float32 gradients itself; drop --comm-hook"),
        "--grad-accum": (cfg.grad_accum != 1, "raise --batch-size instead of accumulating"),
        "--async-checkpoint": (cfg.async_checkpoint, "drop --async-checkpoint (the writing group saves a .pt)"),
        "--amp": (cfg.amp != "off", "drop --amp (replica groups train in float32)"),
        "--checkpoint-every Nsteps": (
            cfg.cadence.unit == "step",
            "checkpoint every N epochs (replica groups save at epoch ends)",
        ),
        "--tracker": (cfg.tracker is not None, "drop --tracker (metrics.jsonl records every epoch)"),
        "--eval-samples": (
            cfg.eval_samples is not None,
            "drop --eval-samples (the writing group evaluates the whole test set)",
        ),
    }
    for flag, (bad, hint) in refused.items():
        if bad:
            raise ShoalError(f"{flag} does not work with --fault-tolerance", hint)
    from shoal.distributed.torchft_check import check_torchft

    check_torchft()


def _at_least_one(flag: str, value: int | None, hint: str | None = None) -> None:
    if value is not None and value < 1:
        raise ShoalError(f"{flag} must be at least 1, got {value}", hint or f"pass {flag} 1 or more")


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ShoalError(f"{flag} {value!r} is not one of: {', '.join(choices)}", f"pass {flag} {choices[0]}")


__all__ = ["COMM_HOOKS", "TrainConfig"]

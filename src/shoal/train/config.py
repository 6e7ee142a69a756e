"""The resolved configuration of one training run (``shoal train``), validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from shoal.errors import ShoalError

LR_SCALING = ("none", "linear", "sqrt")
AMP_MODES = ("off", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("sgd", "adamw")


@dataclass(kw_only=True)
class TrainConfig:
    """Everything a ``shoal train`` run needs; ``None`` means "the workload's default"."""

    workload: str = "digits"
    """Name of the ready workload: digits, mnist, cifar10 or synthetic."""
    epochs: int | None = None
    """Passes over the training set."""
    batch_size: int | None = None
    """Samples per process per micro-batch (the global batch is this x world size x grad_accum)."""
    lr: float | None = None
    """Base learning rate, before ``lr_scaling``."""
    lr_scaling: str = "none"
    """How the base lr grows with the world size: none, linear (x N) or sqrt (x sqrt N)."""
    optimizer: str | None = None
    """sgd (momentum 0.9, nesterov) or adamw."""
    weight_decay: float | None = None
    """L2 weight decay of the optimizer."""
    warmup_epochs: float = 0.0
    """Linear warm-up of the lr over this many epochs, then cosine decay to zero."""
    seed: int = 0
    """Seeds model initialisation, the data order and augmentation."""
    data: str | None = None
    """Dataset directory for mnist / cifar10."""
    download: bool = False
    """Let torchvision download the dataset into ``data`` when it is missing."""
    out: str | None = None
    """Output directory; default runs/<workload>-<timestamp>."""
    device: str = "auto"
    """auto, cpu or cuda."""
    backend: str = "auto"
    """Collective backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl."""
    amp: str = "off"
    """Mixed precision: off, bf16 or fp16 (fp16 needs CUDA)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are all-reduced only on the last one."""
    nproc: int = 1
    """Local worker processes to start (through torch's elastic agent)."""
    arch: str = "resnet18"
    """Model of the synthetic workload: any torchvision ResNet."""
    image_size: int = 32
    """Side of the synthetic workload's square inputs."""
    samples: int | None = None
    """Training samples of the synthetic workload."""
    eval_batch_size: int | None = None
    """Per-process batch size for evaluation (default: 4 x batch_size)."""
    channels_last: bool | None = None
    """Convolutions in channels-last (NHWC) memory format; default: on for models with 2-D
    convolutions (oneDNN on CPU and cuDNN on GPU run them faster that way)."""
    progress: bool | None = None
    """Show a progress bar on rank 0 (default: when stderr is a terminal)."""
    checkpoint_every: str = "1"
    """Checkpoint cadence: N (epochs), Nepochs or Nsteps; 0/off: never."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (default <out>/checkpoints)."""
    keep: int = 3
    """Keep the newest K checkpoints."""
    resume: str = "auto"
    """auto (newest valid checkpoint in the checkpoint dir, if any), never, or a checkpoint file."""
    preempt_grace: float = 25.0
    """Seconds after SIGTERM/SIGUSR1 within which the preemption checkpoint must be written."""
    max_restarts: int = 0
    """Times torch's elastic agent restarts the local workers after a failure (--nproc runs)."""
    start_method: str = "auto"
    """How --nproc workers are started: auto (fork on CPU, spawn with CUDA), fork or spawn."""
    comm_hook: str = "none"
    """DDP gradient compression: none (float32 all-reduce), bf16 or fp16 (half the bytes)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Filled in at start: detected environment and world size, for config.json."""

    def __post_init__(self) -> None:
        _positive("--epochs", self.epochs)
        _positive("--batch-size", self.batch_size, hint="pass --batch-size 1 or more (it is per process)")
        _positive("--grad-accum", self.grad_accum)
        _positive("--image-size", self.image_size)
        _positive("--samples", self.samples)
        _positive("--eval-batch-size", self.eval_batch_size)
        if self.nproc is None or self.nproc < 1:
            raise ShoalError(
                f"--nproc must be at least 1, got {self.nproc}",
                "pass --nproc 1 or more (the number of worker processes on this machine)",
            )
        if self.lr is not None and not self.lr > 0:
            raise ShoalError(f"--lr must be positive, got {self.lr}", "pass a learning rate such as --lr 0.05")
        if self.warmup_epochs < 0:
            raise ShoalError(f"--warmup-epochs must be >= 0, got {self.warmup_epochs}", "pass 0 to disable warm-up")
        _positive("--keep", self.keep)
        if self.max_restarts < 0:
            raise ShoalError(f"--max-restarts must be >= 0, got {self.max_restarts}", "pass --max-restarts 0 or more")
        if self.preempt_grace <= 0:
            raise ShoalError(f"--preempt-grace must be positive, got {self.preempt_grace}", "pass seconds, e.g. 25")
        from shoal.checkpoint.cadence import Cadence

        Cadence.parse(self.checkpoint_every)  # raises a ShoalError with a hint if malformed
        _choice("--lr-scaling", self.lr_scaling, LR_SCALING)
        _choice("--amp", self.amp, AMP_MODES)
        _choice("--device", self.device, DEVICES)
        if self.optimizer is not None:
            _choice("--optimizer", self.optimizer, OPTIMIZERS)
        from shoal.launch.local import START_METHODS

        _choice("--start-method", self.start_method, START_METHODS)
        from shoal.distributed.comm_hooks import check_comm_hook

        try:
            check_comm_hook(self.comm_hook)
        except ShoalError as err:
            raise ShoalError(f"--comm-hook: {err.message}", err.hint) from None

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _positive(flag: str, value: int | None, hint: str | None = None) -> None:
    if value is not None and value < 1:
        raise ShoalError(f"{flag} must be at least 1, got {value}", hint or f"pass {flag} 1 or more")


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ShoalError(f"{flag} {value!r} is not one of: {', '.join(choices)}", f"pass {flag} {choices[0]}")

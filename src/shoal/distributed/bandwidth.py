"""What a transfer rate costs a training step: one scale for ``shoal doctor`` and the job's watchdog.

A link's or an all-reduce's rate means little on its own (2.4 MB/s is fine for a tiny MLP, fatal for
a ResNet); what a user feels is the time every step waits for the gradient all-reduce. A ring
all-reduce of ``B`` bytes over ``N`` participants sends ``2 (N - 1) / N * B`` bytes through every
link, so at ``R`` bytes/s on the slowest link one all-reduce takes ``2 (N - 1) / N * B / R`` seconds
(the bus-bandwidth convention of nccl-tests: PERFORMANCE.md, "Bus bandwidth").

The reference gradient is ResNet-18's on CIFAR-10 (11,181,642 float32 parameters: 44.7 MB), the
model of the tutorials shoal replaces and of ``shoal train cifar10``. Thresholds: a step that waits
more than :data:`WARN_STEP_S` for communication is slowed noticeably (ResNet-18 computes a step of
128 images in well under a second on one GPU); more than :data:`FAIL_STEP_S` makes a multi-node run
slower than one node. Pure arithmetic: no torch import.
"""

from __future__ import annotations

from typing import Literal

REFERENCE_MODEL = "ResNet-18"
REFERENCE_GRADIENT_BYTES = 11_181_642 * 4
"""Bytes of one float32 gradient of ResNet-18 with 10 classes (``shoal train cifar10``)."""
WARN_STEP_S = 1.0
FAIL_STEP_S = 10.0


def ring_factor(participants: int) -> float:
    """``2 (N - 1) / N``: the share of an all-reduced buffer that crosses every link of a ring."""
    return 2 * (participants - 1) / participants if participants > 1 else 0.0


def bus_bytes_per_s(nbytes: float, seconds: float, participants: int) -> float:
    """An all-reduce's bus bandwidth (nccl-tests' busbw): what every link carried, per second
    (``inf`` when it took no measurable time)."""
    return ring_factor(participants) * nbytes / seconds if seconds > 0 else float("inf")


def allreduce_seconds(nbytes: float, bytes_per_s: float, participants: int) -> float:
    """Seconds a ring all-reduce of ``nbytes`` takes among ``participants`` when the slowest link
    moves ``bytes_per_s`` (``inf`` for a rate of zero; 0 for one participant)."""
    if participants < 2:
        return 0.0
    if bytes_per_s <= 0:
        return float("inf")
    return ring_factor(participants) * nbytes / bytes_per_s


def step_cost_status(seconds: float) -> Literal["ok", "warn", "fail"]:
    """``ok`` below :data:`WARN_STEP_S` of communication per step, ``fail`` above :data:`FAIL_STEP_S`."""
    if seconds > FAIL_STEP_S:
        return "fail"
    return "warn" if seconds > WARN_STEP_S else "ok"


def describe_step_cost(
    bytes_per_s: float, participants: int, *, who: str = "nodes", nbytes: float = REFERENCE_GRADIENT_BYTES
) -> str:
    """``a ResNet-18 gradient all-reduce (44.7 MB, 3 nodes) takes ~25 s per step at that rate``."""
    seconds = allreduce_seconds(nbytes, bytes_per_s, participants)
    model = f"a {REFERENCE_MODEL} gradient" if nbytes == REFERENCE_GRADIENT_BYTES else "a gradient"
    return f"{model} all-reduce ({nbytes / 1e6:,.1f} MB, {participants} {who}) takes ~{_seconds(seconds)} per step at that rate"


def _seconds(seconds: float) -> str:
    if seconds == float("inf"):
        return "forever"
    if seconds >= 10:
        return f"{seconds:,.0f} s"
    return f"{seconds:.2g} s" if seconds >= 0.01 else f"{seconds * 1e3:.2g} ms"

"""The state ``python -m benchmarks.checkpoint`` saves, built from one seed, and the check of every load."""

from __future__ import annotations

from typing import Any

from shoal.errors import ShoalError

SYNTHETIC_TENSORS = 100


def synthetic_bytes(model: str) -> int:
    """``mb:N`` -> N x 10^6 (a multiple of 4: float32 elements)."""
    try:
        mb = float(model.split(":", 1)[1])
    except ValueError:
        mb = float("nan")
    if not 0 < mb < float("inf"):
        raise ShoalError(f"--model {model!r}: N in mb:N must be a positive number of MB", "pass e.g. --model mb:100")
    return max(4, int(mb * 1e6) // 4 * 4)


def torchvision_models() -> list[str]:
    import torchvision

    return torchvision.models.list_models()


def build_state(model: str, seed: int = 0) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(state the plain variants save, objects the manager saves, description), from the same tensors."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(seed)
    if model.lower().startswith("mb:"):
        elements = synthetic_bytes(model) // 4
        count = min(SYNTHETIC_TENSORS, elements)
        holder = nn.Module()
        for i in range(count):
            n = elements // count + (1 if i < elements % count else 0)
            holder.register_buffer(f"t{i:03d}", torch.randn(n, generator=gen))
        return {"model": holder.state_dict()}, {"model": holder}, f"synthetic float32 tensors ({model})"

    import torchvision

    with torch.random.fork_rng(devices=[]):  # the caller's RNG is left alone
        torch.manual_seed(seed)
        net = torchvision.models.get_model(model, weights=None)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for p in net.parameters():  # one step with random gradients fills the momentum buffers
        p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
    opt.step()
    opt.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in net.parameters())
    objects = {"model": net, "optimizer": opt}
    state = {"model": net.state_dict(), "optimizer": opt.state_dict()}
    return state, objects, f"torchvision {model} ({params:,} parameters) + SGD momentum state"


def tensors_in(obj: Any):
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors_in(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors_in(value)


def same(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` hold the same values: tensors compared with ``torch.equal``."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b

"""Sharding a model with FSDP2 (``torch.distributed.fsdp.fully_shard``) for models that do not fit one process.

``apply_fsdp`` is, like :func:`shoal.distributed.wrap.apply_ddp`, a pure function of the model: it
shards each *block* of the model, then the root. A block is the unit whose parameters are gathered
together for its forward and backward and freed afterwards, so the peak holds one block's full
parameters plus every rank's 1/N shard of the rest. Blocks are found in this order:

1. a transformer's repeated layers: the items of an ``nn.ModuleList`` attribute named ``blocks``,
   ``layers``, ``h`` or ``layer`` (nanoGPT, Llama, GPT-2, BERT), searched through the whole model;
2. a torchvision ResNet's stages ``layer1`` .. ``layer4``;
3. otherwise a size rule: walking the model bottom-up, every module whose parameters not already
   in a block number at least ``min_block_params`` becomes one (FSDP1's ``size_based_auto_wrap_policy``).

The root is always sharded last; it holds what no block took (embeddings, heads, norms).

FSDP2 keeps the module's class and names (``fully_shard`` swaps the class for an ``FSDP<Name>``
subclass in place and turns parameters into DTensors): ``model.state_dict()`` is then a dict of
DTensor shards. :func:`full_model_state_dict` gathers the plain, full state dict that ``model.pt``
holds; it is collective (every rank must call it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shoal.distributed.strategy import MIXED_PRECISION
from shoal.errors import ShoalError

BLOCK_LIST_NAMES = ("blocks", "layers", "h", "layer")
"""Names of the ``nn.ModuleList`` attributes whose items are a transformer's repeated blocks."""

DEFAULT_MIN_BLOCK_PARAMS = 1_000_000
"""The size rule's threshold: a module with at least this many parameters (not already in a block)
is a block. 1M float32 parameters = 4 MB, large enough that one all-gather is not latency-bound."""


def apply_fsdp(
    model: nn.Module,
    *,
    device: torch.device | str,
    mixed_precision: str = "off",
    cpu_offload: bool = False,
    min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS,
) -> nn.Module:
    """Move ``model`` to ``device`` and shard it with FSDP2 over the default process group.

    Each block (see the module docstring) is sharded, then the root; the same module object comes
    back (FSDP2 shards in place). With no process group initialized (one plain process) the model is
    only moved, as :func:`~shoal.distributed.wrap.apply_ddp` does with one process.

    ``mixed_precision="bf16"``: bf16 parameters in compute, float32 gradient reduction; works on
    CUDA (NCCL) and on CPU (gloo reduces bf16/fp32 too, verified with torch 2.15). ``cpu_offload``:
    parameters, gradients and optimizer state live in CPU memory between uses (FSDP2's
    ``CPUOffloadPolicy``); only meaningful with a GPU, refused on a CPU device.
    """
    import torch.distributed as dist

    device = torch.device(device)
    if mixed_precision not in MIXED_PRECISION:
        raise ShoalError(
            f"FSDP mixed precision {mixed_precision!r} is not supported",
            f"pass --amp {' or --amp '.join(MIXED_PRECISION)} with --strategy fsdp (fp16 needs a loss scaler FSDP lacks)",
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ShoalError(
            f"the model ({type(model).__name__}) has no trainable parameters: there is nothing to shard",
            "use --strategy ddp (a frozen model is used as is), or give the model parameters to train",
        )
    if cpu_offload and device.type == "cpu":
        raise ShoalError(
            "FSDP CPU offload needs an accelerator: on a CPU device the parameters are in CPU memory already",
            "drop the CPU offload option, or run on a GPU",
        )
    if min_block_params < 1:
        raise ShoalError(f"min_block_params must be at least 1, got {min_block_params}", "pass 1 or more")
    if not (dist.is_available() and dist.is_initialized()):
        return model.to(device)

    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    options: dict[str, Any] = {}
    if mixed_precision == "bf16":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    options["offload_policy"] = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    if not cpu_offload:
        # With offload the model stays in CPU memory: FSDP2 keeps the shards there and copies each
        # block's parameters to the GPU when it runs (fully_shard's default mesh is on the GPU).
        model = model.to(device)
    for block in find_blocks(model, min_block_params=min_block_params):
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def find_blocks(model: nn.Module, *, min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS) -> list[nn.Module]:
    """The modules :func:`apply_fsdp` shards before the root, in the order of ``model.modules()``."""
    blocks: list[nn.Module] = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.ModuleList) and leaf in BLOCK_LIST_NAMES and module is not model:
            blocks.extend(child for child in module if _has_params(child))
    if blocks:
        return blocks
    stages = [getattr(model, f"layer{i}", None) for i in range(1, 5)]
    if all(isinstance(stage, nn.Module) for stage in stages) and hasattr(model, "fc"):  # torchvision ResNet
        return [stage for stage in stages if _has_params(stage)]
    _by_size(model, min_block_params, blocks, is_root=True)
    return blocks


def _by_size(module: nn.Module, threshold: int, blocks: list[nn.Module], *, is_root: bool = False) -> int:
    """Post-order walk: append the children that became blocks; return ``module``'s parameters left
    for its parent (0 when it is a block itself)."""
    remaining = sum(p.numel() for p in module.parameters(recurse=False))
    for child in module.children():
        remaining += _by_size(child, threshold, blocks)
    if not is_root and remaining >= threshold:
        blocks.append(module)
        return 0
    return remaining


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def is_fsdp(model: nn.Module) -> bool:
    """Whether ``model`` (or any module inside it) was sharded by FSDP2."""
    if not torch.distributed.is_available():  # a torch build without distributed has no FSDP
        return False
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def full_model_state_dict(model: nn.Module) -> dict[str, Any]:
    """The whole model's plain state dict on rank 0 (CPU tensors, no DTensor, no wrapper prefixes),
    ``{}`` on the other ranks. Collective: call it on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state_dict(model: nn.Module, state: dict[str, Any]) -> None:
    """Load a plain, full state dict (``model.pt``, a ``.pt`` checkpoint's model) into ``model``,
    sharded by FSDP2 or not: each rank keeps its own slice. Every rank passes the full dict
    (strict: every key, every shape)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if is_fsdp(model):
        # A copy: set_model_state_dict replaces the dict's values with DTensor shards in place.
        set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True, strict=True))
    else:
        model.load_state_dict(state)


def local_bytes(tensors: Any) -> int:
    """Bytes this rank holds for ``tensors`` (an iterable of tensors): a DTensor counts its local shard."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total

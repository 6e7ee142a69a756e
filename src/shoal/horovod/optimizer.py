"""``hvd.DistributedOptimizer``: the wrapped optimizer's ``step()`` after a gradient all-reduce.

The all-reduces themselves (buckets started by post-accumulate-grad hooks while backward runs,
finished in ``step()``) are :mod:`.reducer`'s. ``synchronize()``, ``skip_synchronize()``,
``set_backward_passes_per_step()``, the ``zero_grad()`` rule (not between ``backward()`` and
``step()``: the gradients in flight would be lost) and the warning for ``step()`` after
``synchronize()`` follow Horovod's ``horovod/torch/optimizer.py``.

The returned object is an instance of a subclass of the wrapped optimizer's class (as in Horovod:
``isinstance(opt, torch.optim.SGD)`` holds, LR schedulers and GradScaler work) that shares the
wrapped optimizer's parameter groups and state.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from shoal.horovod import state
from shoal.horovod.compression import Compression, check_compressor
from shoal.horovod.errors import HorovodOrderError, HorovodUsageError
from shoal.horovod.functions import check_same_on_every_rank, tensor_signature
from shoal.horovod.ops import ReduceOp, resolve_op
from shoal.horovod.reducer import GradientReducer

_ZERO_GRAD_HINT = (
    "call optimizer.zero_grad() before the forward pass or after optimizer.step(); to accumulate "
    "gradients over K micro-batches pass backward_passes_per_step=K and call step() every K passes"
)


class _DistributedOptimizerMixin:
    """What the returned optimizer class adds in front of the wrapped optimizer's class."""

    _hvd: GradientReducer | None
    _hvd_synchronized: bool
    _hvd_should_synchronize: bool
    param_groups: list[dict[str, Any]]

    def synchronize(self) -> None:
        """Finish the gradient all-reduces now (e.g. to clip gradients); then step() inside
        ``with optimizer.skip_synchronize():``."""
        if self._hvd is not None:
            self._hvd.synchronize()
        self._hvd_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within this block ``step()`` does not synchronise (it was done by ``synchronize()``)."""
        self._hvd_should_synchronize = False
        try:
            yield
        finally:
            self._hvd_should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._hvd_should_synchronize:
            if self._hvd_synchronized:
                # Horovod's tests look for the words up to "skip_synchronize()".
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after optimizer.synchronize(): "
                    "the gradients are all-reduced a second time, which costs time (and with op=hvd.Sum scales "
                    "them again); wrap step() in `with optimizer.skip_synchronize():`",
                    stacklevel=2,
                )
            self.synchronize()
        self._hvd_synchronized = False
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._hvd is not None and self._hvd.backward_seen():
            raise HorovodOrderError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                "or optimizer.synchronize(): the gradients being all-reduced would be lost",
                _ZERO_GRAD_HINT,
            )
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._hvd is not None and self._hvd.in_flight:
            self._hvd.finish()  # nothing left in flight across the reload
        if self._hvd is not None:
            self._hvd.reset()
        self._hvd_synchronized = False
        super().load_state_dict(state_dict)  # type: ignore[misc]

    def set_backward_passes_per_step(self, passes: int) -> None:
        _check_passes(passes)
        self.backward_passes_per_step = passes
        if self._hvd is not None:
            self._hvd.passes_per_step = passes
            self._hvd.reset()


_CLASSES: dict[type, type] = {}


def _distributed_class(base: type) -> type:
    """The wrapped optimizer's class with the mixin in front, made once per class."""
    if base not in _CLASSES:
        _CLASSES[base] = type(base.__name__, (_DistributedOptimizerMixin, base), {"__module__": base.__module__})
    return _CLASSES[base]


def _check_passes(passes: Any) -> None:
    if not isinstance(passes, int) or passes <= 0:
        raise HorovodUsageError(
            f"backward_passes_per_step={passes!r} must be a positive integer", "pass 1 (the default) or more"
        )


def _named(optimizer: torch.optim.Optimizer, named_parameters: Any) -> dict[torch.Tensor, str]:
    """Parameter -> name, checked as Horovod checks it (tuples, unique names, every parameter named)."""
    if named_parameters is None:
        pairs = [
            (f"allreduce.noname.{i}.{j}", p)
            for i, group in enumerate(optimizer.param_groups)
            for j, p in enumerate(group["params"])
        ]
    else:
        pairs = list(named_parameters)
    if any(not (isinstance(pair, tuple) and len(pair) == 2) for pair in pairs):
        raise HorovodUsageError(
            "hvd.DistributedOptimizer: named_parameters must be (name, parameter) pairs",
            "pass named_parameters=model.named_parameters()",
        )
    names = [name for name, _ in pairs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise HorovodUsageError(
            f"hvd.DistributedOptimizer: parameter names must be unique; repeated: {', '.join(duplicates[:5])}",
            "pass named_parameters=model.named_parameters()",
        )
    by_param = {p: name for name, p in pairs}
    unnamed = [p for group in optimizer.param_groups for p in group["params"] if p not in by_param]
    if unnamed:
        raise HorovodUsageError(
            f"hvd.DistributedOptimizer: {len(unnamed)} of the optimizer's parameters are not in named_parameters",
            "pass named_parameters=model.named_parameters() of the model whose parameters the optimizer holds",
        )
    return by_param


def DistributedOptimizer(  # Horovod's name: a function that returns an optimizer
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = ReduceOp.Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = state.global_process_set,
) -> torch.optim.Optimizer:
    """``optimizer`` whose ``step()`` first averages (or sums) the gradients across ranks.

    Args, as Horovod's: ``named_parameters`` (``model.named_parameters()``; names only label the
    parameters in errors here), ``compression`` (``hvd.Compression.none|fp16``: the bucket's dtype
    on the wire), ``backward_passes_per_step`` (K backward passes accumulate locally, the K-th
    starts the all-reduce), ``op`` (``hvd.Average`` or ``hvd.Sum``), ``gradient_predivide_factor``
    (Average only: scale by ``1/f`` before the sum and ``f/size`` after), ``sparse_as_dense``.
    ``num_groups``/``groups`` (Horovod's explicit fusion groups) are accepted and not needed:
    buckets are sized by bytes (``HOROVOD_FUSION_THRESHOLD``); ``process_set`` must be the global one.
    """
    job = state.job("DistributedOptimizer()")
    state.check_process_set(process_set, "DistributedOptimizer")
    reduce_op = resolve_op(op, None, "DistributedOptimizer()")
    if reduce_op not in (ReduceOp.Average, ReduceOp.Sum):
        raise HorovodUsageError(
            f"hvd.DistributedOptimizer(op={reduce_op.name}): gradients are combined with Average or Sum",
            "pass op=hvd.Average (the default) or op=hvd.Sum",
        )
    if gradient_predivide_factor != 1.0 and reduce_op is not ReduceOp.Average:
        raise HorovodUsageError(
            "hvd.DistributedOptimizer: gradient_predivide_factor needs op=hvd.Average",
            "drop gradient_predivide_factor, or use op=hvd.Average",
        )
    if not gradient_predivide_factor > 0:
        raise HorovodUsageError(
            f"gradient_predivide_factor={gradient_predivide_factor!r} must be positive", "pass 1.0 or e.g. hvd.size()"
        )
    _check_passes(backward_passes_per_step)
    compressor = check_compressor(compression)
    names = _named(optimizer, named_parameters)

    cls = _distributed_class(type(optimizer))
    wrapped = cls.__new__(cls)
    # Share the wrapped optimizer's fields (param_groups, state, defaults, hooks); not an instance
    # ``step`` that an LR scheduler may have patched in: it would call the old object's step.
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k not in ("step", "_opt_called")})
    wrapped._parameter_names = names  # Horovod's attribute: parameter -> name, unique, the same on every rank
    wrapped.backward_passes_per_step = backward_passes_per_step
    wrapped.op = reduce_op
    wrapped.gradient_predivide_factor = gradient_predivide_factor
    wrapped._hvd = None
    wrapped._hvd_synchronized = False
    wrapped._hvd_should_synchronize = True
    if job.context.world_size > 1:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        check_same_on_every_rank(
            tensor_signature((names[p], p) for p in params),
            "hvd.DistributedOptimizer: the parameters to reduce (name, shape, dtype)",
            "build the same model on every rank (same layers in the same order, same requires_grad) and "
            "create the optimizer over the same parameters before wrapping it",
            call="DistributedOptimizer",
        )
        if params:
            engine = GradientReducer(
                params,
                compression=compressor,
                op=reduce_op,
                predivide=gradient_predivide_factor,
                passes=backward_passes_per_step,
                sparse_as_dense=sparse_as_dense,
            )
            ref = weakref.ref(wrapped)
            for param in params:
                engine.hooks.append(param.register_post_accumulate_grad_hook(_hook(ref)))
            wrapped._hvd = engine
            job.optimizers.add(wrapped)
    return wrapped


def _hook(ref: "weakref.ReferenceType[Any]"):
    # A weak reference: an optimizer the script dropped neither stays alive nor reduces anything.
    def on_gradient(param: torch.Tensor) -> None:
        optimizer = ref()
        if optimizer is not None and optimizer._hvd is not None:
            optimizer._hvd.on_gradient(param)

    return on_gradient

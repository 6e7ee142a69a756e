"""PowerSGD on a DDP model with its state kept per parameter, so a resumed run is bit-identical.

:func:`shoal.distributed.comm_hooks.register_comm_hook` builds :class:`PowerSGD` for ``powersgd``;
the module docstring there says why the state must move between DDP bucket layouts. Also
:func:`powersgd_sizes`, the compression a benchmark report quotes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from shoal.distributed.comm_hooks.base import DEFAULT_POWERSGD_RANK, CommHook

if TYPE_CHECKING:
    import torch
    from torch import nn


class PowerSGD(CommHook):
    """torch's ``PowerSGDState`` and ``powerSGD_hook`` on a DDP model, its state movable between bucket layouts.

    ``state`` is torch's ``PowerSGDState`` (error feedback and warm start on). torch files its
    memories by bucket index (``error_dict``, ``p_memory_dict``, ``q_memory_dict``); ``_placed``
    records which parameters, in which order, each filed entry covers (its *home* layout). A bucket
    that arrives with its home layout goes straight to torch's hook. One that arrives with another
    layout (the first step of a resumed DDP model: one bucket of everything) and holds exactly the
    parameters of some homes is handed to torch's hook as those homes, each a copy of the gradients
    laid out as at home (:class:`_HomeBucket`), and the results are copied back: the same arithmetic
    at the same memory offsets (CPU kernels round differently at other alignments) as in the run
    that saved the state. Anything else (another layout for good) moves the entries concerned to
    per-parameter pieces (``_parked``) and files them anew for the arriving bucket.

    Entries of earlier buckets of the same step are never touched: a parameter belongs to one bucket
    per step, so an entry that overlaps the arriving bucket is from an earlier step, its all-reduce
    long finished.
    """

    def __init__(self, model: nn.Module, *, rank: int, start_iter: int, process_group: Any, seed: int) -> None:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        super().__init__(
            "powersgd",
            f"rank-{rank} PowerSGD with error feedback after {start_iter} steps of plain float32 all-reduce",
            applied=True,
        )
        self.rank, self.seed = rank, seed
        self.state = PowerSGDState(process_group, matrix_approximation_rank=rank, start_powerSGD_iter=start_iter)
        parameters = list(model.parameters())
        self._index = {p.data_ptr(): i for i, p in enumerate(parameters)}
        self._shapes = [tuple(p.shape) for p in parameters]
        self._options = {"dtype": parameters[0].dtype, "device": parameters[0].device}
        self._placed: dict[int, tuple[int, ...]] = {}
        self._parked: dict[int, dict[str, torch.Tensor]] = {}
        # torch's hook issues a bucket's second and third all-reduce from the callbacks of its first: on
        # NCCL they run at once, in bucket order; on gloo they run when the previous one has finished,
        # so two buckets' collectives could reach the ranks in different orders, a collective mismatch
        # (pytorch#58467). There each bucket waits for the one before it.
        self._in_order = dist.get_backend(process_group) != "nccl"
        self._previous: Any = None
        model.register_comm_hook(self, _powersgd_hook)

    def run(self, bucket: Any) -> torch.futures.Future:
        """DDP's hook for ``bucket``: torch's ``powerSGD_hook`` on the bucket or on its homes."""
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

        state = self.state
        if state.iter < state.start_powerSGD_iter:
            return powerSGD_hook(state, bucket)  # torch's plain all-reduce, counting the steps
        index = bucket.index()
        if self._in_order and index > 0 and self._previous is not None:
            self._previous.wait()
        layout = tuple(self._index[p.data_ptr()] for p in bucket.parameters())
        if self._placed.get(index) == layout:
            future = powerSGD_hook(state, bucket)
        elif homes := self._homes(layout):
            future = self._as_homes(bucket, layout, homes)
        else:
            members = set(layout)
            for other, held in list(self._placed.items()):
                if other == index or members.intersection(held):
                    self._park(other)
            self._place(index, layout)
            future = powerSGD_hook(state, bucket)
        self._previous = future
        return future

    def _homes(self, layout: tuple[int, ...]) -> list[int]:
        """The filed entries whose parameters together are exactly ``layout``'s (none if they are not)."""
        members = set(layout)
        homes = [index for index, held in self._placed.items() if members.intersection(held)]
        covered = [param for index in homes for param in self._placed[index]]
        return sorted(homes) if len(covered) == len(members) and set(covered) == members else []

    def _as_homes(self, bucket: Any, layout: tuple[int, ...], homes: list[int]) -> torch.futures.Future:
        """torch's hook on each home's copy of ``bucket``'s gradients, one after the other; the results
        copied back into the bucket (a future already done: DDP reads the bucket from it)."""
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

        buffer = bucket.buffer()
        here = dict(
            zip(layout, _segments([self._shapes[i] for i in layout], self.rank, self.state.min_compression_rate)[0])
        )
        last = max(self._placed)
        for index in homes:
            home = self._placed[index]
            segments, length, *_ = _segments(
                [self._shapes[i] for i in home], self.rank, self.state.min_compression_rate
            )
            copy = torch.empty(length, dtype=buffer.dtype, device=buffer.device)
            for param, (err, _, _) in zip(home, segments):
                copy[err] = buffer[here[param][0]]
            shapes = [self._shapes[i] for i in home]
            result = powerSGD_hook(self.state, _HomeBucket(index, copy, shapes, segments, last=index == last)).wait()
            for param, (err, _, _) in zip(home, segments):
                buffer[here[param][0]] = result[err]
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(buffer)
        return done

    def _pieces(self, index: int) -> dict[int, dict[str, torch.Tensor]]:
        """The filed entries of bucket ``index``, cut into per-parameter copies."""
        state = self.state
        layout = self._placed[index]
        segments, *_ = _segments([self._shapes[i] for i in layout], self.rank, state.min_compression_rate)
        error = state.error_dict.get(index)
        p_memory, q_memory = state.p_memory_dict.get(index), state.q_memory_dict.get(index)
        pieces = {}
        for param, (err, p, q) in zip(layout, segments):
            piece = {}
            if error is not None:
                piece["error"] = error[err].detach().clone()
            if p is not None and p_memory is not None and q_memory is not None:
                piece["p"], piece["q"] = p_memory[p].detach().clone(), q_memory[q].detach().clone()
            pieces[param] = piece
        return pieces

    def _park(self, index: int) -> None:
        """Move bucket ``index``'s filed entries to per-parameter pieces."""
        self._parked.update(self._pieces(index))
        del self._placed[index]
        for memory in (self.state.error_dict, self.state.p_memory_dict, self.state.q_memory_dict):
            memory.pop(index, None)

    def _place(self, index: int, layout: tuple[int, ...]) -> None:
        """File bucket ``index``'s entries from the parked pieces (zeros and a seeded random Q where none)."""
        import torch

        state = self.state
        segments, length, p_length, q_length = _segments(
            [self._shapes[i] for i in layout], self.rank, state.min_compression_rate
        )
        error, p_memory = torch.zeros(length, **self._options), torch.zeros(p_length, **self._options)
        q_memory = torch.zeros(q_length, **self._options)
        for param, (err, p, q) in zip(layout, segments):
            piece = self._parked.pop(param, {})
            if "error" in piece:
                error[err] = piece["error"]
            if q is None:
                continue
            if "q" in piece and piece["q"].numel() == q.stop - q.start:
                p_memory[p], q_memory[q] = piece["p"], piece["q"]
            else:  # torch's start: a standard normal Q (orthogonalised by the hook), the same on every rank
                generator = torch.Generator().manual_seed(self.seed * 1_000_003 + param)
                q_memory[q] = torch.randn(q.stop - q.start, generator=generator, dtype=self._options["dtype"])
        state.error_dict[index], state.p_memory_dict[index], state.q_memory_dict[index] = error, p_memory, q_memory
        self._placed[index] = layout

    def state_dict(self) -> dict[str, Any]:
        """This rank's state, per parameter (by its position in ``model.parameters()``), on the CPU,
        and the bucket layout it was used in."""
        import torch

        state = self.state
        pieces = {param: dict(piece) for param, piece in self._parked.items()}
        for index in self._placed:
            pieces.update(self._pieces(index))
        kind, keys, position, has_gauss, cached = state.rng.get_state()
        return {
            "rank": self.rank,
            "iter": int(state.iter),
            "params": {param: {k: v.cpu() for k, v in piece.items()} for param, piece in sorted(pieces.items())},
            "layouts": {index: list(layout) for index, layout in sorted(self._placed.items())},
            "rng": {
                "kind": str(kind),
                "keys": torch.from_numpy(keys.astype("int64")),
                "position": int(position),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
            "stats": [
                int(state.total_numel_before_compression),
                int(state.total_numel_after_compression),
                int(state.next_stats_report),
            ],
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue from ``saved`` (empty: a checkpoint written with another hook, nothing to load).

        The P and Q memories are kept only when ``saved`` used the same rank; the error feedback
        and the iteration count always. The entries are filed in the saved bucket layout.
        """
        if not saved:
            return
        import numpy as np

        state = self.state
        state.iter = int(saved["iter"])
        rng = saved["rng"]
        keys = rng["keys"].numpy().astype(np.uint32)
        state.rng.set_state((rng["kind"], keys, rng["position"], rng["has_gauss"], rng["cached_gaussian"]))
        before, after, report = saved["stats"]
        state.total_numel_before_compression, state.total_numel_after_compression = before, after
        state.next_stats_report = report
        for memory in (state.error_dict, state.p_memory_dict, state.q_memory_dict):
            memory.clear()
        self._placed.clear()
        same_rank = saved["rank"] == self.rank
        self._parked = {
            int(param): {k: v for k, v in piece.items() if same_rank or k == "error"}
            for param, piece in saved["params"].items()
        }
        for index, layout in saved.get("layouts", {}).items():
            self._place(int(index), tuple(int(i) for i in layout))


class _HomeBucket:
    """What torch's ``powerSGD_hook`` reads of a ``GradBucket`` (index, buffer, per-parameter views,
    whether it is the step's last), for a copy of gradients laid out as in a home bucket."""

    def __init__(self, index: int, buffer: torch.Tensor, shapes: list[Any], segments: list[Any], *, last: bool):
        self._index, self._buffer, self._last = index, buffer, last
        self._gradients = [buffer[err].view(shape) for shape, (err, _, _) in zip(shapes, segments)]

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._gradients

    def is_last(self) -> bool:
        return self._last


# No annotations: DDP checks a hook's annotations against the real classes, and this module's are strings.
def _powersgd_hook(state, bucket):
    """DDP's hook: :meth:`PowerSGD.run`."""
    return state.run(bucket)


def _segments(shapes: list[tuple[int, ...]], rank: int, min_rate: float) -> tuple[list[list[Any]], int, int, int]:
    """Where each of a bucket's parameters (in bucket order) lives in torch's memories.

    Returns ``(segments, length, p_length, q_length)``: per parameter ``[error slice, P slice, Q
    slice]`` (P and Q None for a tensor torch does not compress), and the memories' lengths. The
    rules are torch's ``powerSGD_hook`` (torch 2.15): the gradient lies in the bucket in parameter
    order; a tensor is viewed as ``shape[0] x rest``, compressed when ``_should_compress`` says so,
    with rank ``min(rows, cols, rank)``; the compressed ones are grouped by matrix shape, groups in
    order of first appearance, and P and Q are filled group by group.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    segments: list[list[Any]] = []
    groups: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    offset = 0
    for position, shape in enumerate(shapes):
        numel = math.prod(shape)
        segments.append([slice(offset, offset + numel), None, None])
        offset += numel
        if not shape or numel == 0:
            continue
        rows = shape[0]
        cols = numel // rows
        r = min(rows, cols, rank)
        if _should_compress(rows, cols, r, min_rate)[0]:
            groups.setdefault((rows, cols), []).append((position, rows * r, cols * r))
    p_offset = q_offset = 0
    for members in groups.values():
        for position, p_length, q_length in members:
            segments[position][1] = slice(p_offset, p_offset + p_length)
            segments[position][2] = slice(q_offset, q_offset + q_length)
            p_offset += p_length
            q_offset += q_length
    return segments, offset, p_offset, q_offset


def powersgd_sizes(shapes: list[tuple[int, ...]], rank: int = DEFAULT_POWERSGD_RANK) -> tuple[int, int]:
    """``(floats a plain all-reduce sends, floats PowerSGD sends)`` per step for parameters of ``shapes``
    (torch's default ``min_compression_rate`` of 2): the compression a benchmark report can quote."""
    segments, length, p_length, q_length = _segments(list(shapes), rank, 2)
    uncompressed = sum(err.stop - err.start for err, p, _ in segments if p is None)
    return length, uncompressed + p_length + q_length

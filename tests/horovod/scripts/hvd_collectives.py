"""Horovod's collective API beyond the tutorial, on each rank, checked against torch-computed values.

Usage: hvd_collectives.py OUT_DIR [cuda]   (under any launcher; writes OUT_DIR/rank{r}.json)

With ``cuda`` the inputs of the per-dtype sections live on this rank's GPU (NCCL); gradients,
sparse tensors and the mismatches stay on the CPU (the gloo group beside NCCL).

Every rank can build every rank's input (``make``), so each expected value is computed here with
plain torch from all ranks' inputs; ``checks`` records "ok" or the first line of the difference.
``errors`` records what the deliberate mismatches raised (the test compares them across ranks).
"""

import json
import os
import sys

import torch

import shoal.horovod as hvd

DTYPES = [
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
]  # fmt: skip
REDUCIBLE = [d for d in DTYPES if d is not torch.bool]

hvd.init()
r, n = hvd.rank(), hvd.size()
DEVICE = torch.device("cpu")
if sys.argv[2:] == ["cuda"]:
    DEVICE = torch.device("cuda", hvd.local_rank())
    torch.cuda.set_device(DEVICE)
checks: dict[str, str] = {}
errors: dict[str, str] = {}


def make(rank: int, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """Rank ``rank``'s input: small values (1..4) so that sums and products fit int8."""
    base = (torch.arange(int(torch.tensor(shape).prod())) + rank) % 4 + 1
    return (base % 2 == 0 if dtype is torch.bool else base.to(dtype)).reshape(shape).to(DEVICE)


def check(name: str, actual, expected) -> None:
    try:
        if isinstance(expected, (list, tuple)):
            assert len(actual) == len(expected), f"{len(actual)} results, expected {len(expected)}"
            for a, e in zip(actual, expected):
                torch.testing.assert_close(a, e)
        else:
            torch.testing.assert_close(actual, expected)
        checks[name] = "ok"
    except Exception as err:
        checks[name] = f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"


def caught(call) -> str:
    try:
        call()
    except Exception as err:
        return ",".join(c.__name__ for c in type(err).__mro__[:-2]) + ": " + str(err)
    return "no error"


def reduce_expected(inputs: list[torch.Tensor], op) -> torch.Tensor:
    """What Horovod's op gives for these per-rank inputs, in their dtype (integer average truncates)."""
    acc = inputs[0].clone()
    for other in inputs[1:]:
        if op in (hvd.Sum, hvd.Average):
            acc = acc + other
        elif op is hvd.Min:
            acc = torch.minimum(acc, other)
        elif op is hvd.Max:
            acc = torch.maximum(acc, other)
        else:
            acc = acc * other
    if op is hvd.Average:
        acc = acc / len(inputs) if acc.dtype.is_floating_point else torch.div(acc, len(inputs), rounding_mode="trunc")
    return acc.to(inputs[0].dtype)


def rows_of(rank: int, rows: int) -> slice:
    """Horovod's reducescatter split: rows // n each, the first rows % n ranks one more."""
    base, extra = divmod(rows, n)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def splits_from(source: int) -> list[int]:
    return [(source + dest) % 2 + 1 for dest in range(n)]


# ---- every dtype: allgather, broadcast, alltoall (bool too) ---------------------------------------
for dtype in DTYPES:
    tag = str(dtype).replace("torch.", "")
    everyone = [make(q, dtype, q + 1, 3) for q in range(n)]
    check(f"allgather/{tag}", hvd.allgather(everyone[r], name=f"ag.{tag}"), torch.cat(everyone))
    check(f"allgather_async/{tag}", hvd.synchronize(hvd.allgather_async(everyone[r])), torch.cat(everyone))
    root = n - 1
    mine = make(r, dtype, 2, 2)
    check(f"broadcast/{tag}", hvd.broadcast(mine, root_rank=root), make(root, dtype, 2, 2))
    check(f"broadcast_input_unchanged/{tag}", mine, make(r, dtype, 2, 2))
    hvd.broadcast_(mine, root_rank=root, name=f"bc.{tag}")
    check(f"broadcast_/{tag}", mine, make(root, dtype, 2, 2))
    mine = make(r, dtype, 3)
    check(f"broadcast_async_/{tag}", hvd.synchronize(hvd.broadcast_async_(mine, root)), make(root, dtype, 3))
    sent = {q: make(q, dtype, sum(splits_from(q)), 2) for q in range(n)}
    received, counts = hvd.alltoall(sent[r], splits=splits_from(r), name=f"a2a.{tag}")
    expected = torch.cat([sent[q][sum(splits_from(q)[:r]) :][: splits_from(q)[r]] for q in range(n)])
    check(f"alltoall/{tag}", received, expected)
    check(f"alltoall_counts/{tag}", counts, torch.tensor([splits_from(q)[r] for q in range(n)], dtype=torch.int32))
    out, counts = hvd.synchronize(hvd.alltoall_async(sent[r], splits=splits_from(r)))
    check(f"alltoall_async/{tag}", out, expected)
    pair = [[make(q, dtype, q + 1), make(q + 7, dtype, q + 2, 3)[:, :2]] for q in range(n)]  # a non-contiguous view
    check(
        f"grouped_allgather/{tag}",
        hvd.grouped_allgather(pair[r]),
        [torch.cat([p[0] for p in pair]), torch.cat([p[1] for p in pair])],
    )

state = {"w": make(r, torch.float32, 3), "steps": make(r, torch.int16, 2), "seen": make(r, torch.bool, 2)}
hvd.broadcast_parameters(state, root_rank=0)  # buckets of int16 travel as int32 too
check(
    "broadcast_parameters/int16",
    list(state.values()),
    [make(0, d, *t.shape) for d, t in zip((torch.float32, torch.int16, torch.bool), state.values())],
)

# ---- every reducible dtype: allreduce (each op, forms, scaling), grouped, reducescatter -----------
for dtype in REDUCIBLE:
    tag = str(dtype).replace("torch.", "")
    everyone = [make(q, dtype, 4) for q in range(n)]
    for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
        check(f"allreduce/{op.name}/{tag}", hvd.allreduce(everyone[r], op=op), reduce_expected(everyone, op))
    total = reduce_expected(everyone, hvd.Sum)
    check(
        f"allreduce/scaled/{tag}",
        hvd.allreduce(everyone[r], op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
        total,
    )
    inplace = everyone[r].clone()
    hvd.allreduce_(inplace, op=hvd.Sum, name=f"ar.{tag}")
    check(f"allreduce_/{tag}", inplace, total)
    handle = hvd.allreduce_async(everyone[r], op=hvd.Max, name=f"ara.{tag}")
    while not hvd.poll(handle):
        pass
    check(f"allreduce_async/{tag}", hvd.synchronize(handle), reduce_expected(everyone, hvd.Max))
    inplace = everyone[r].clone()
    check(f"allreduce_async_/{tag}", hvd.synchronize(hvd.allreduce_async_(inplace, op=hvd.Sum)), total)
    check(f"allreduce_async_/in_place/{tag}", inplace, total)

    group = [[make(q, dtype, 4), make(q + 1, dtype, 2, 3), make(q, torch.float32, 5)] for q in range(n)]
    for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
        expected = [reduce_expected([g[i] for g in group], op) for i in range(3)]
        check(f"grouped_allreduce/{op.name}/{tag}", hvd.grouped_allreduce(group[r], op=op), expected)
    summed = [reduce_expected([g[i] for g in group], hvd.Sum) for i in range(3)]
    scaled = hvd.grouped_allreduce(group[r], op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    check(f"grouped_allreduce/scaled/{tag}", scaled, summed)
    inplace = [t.clone() for t in group[r]]
    check(f"grouped_allreduce_/{tag}", hvd.grouped_allreduce_(inplace, op=hvd.Sum), summed)
    check(f"grouped_allreduce_/in_place/{tag}", inplace, summed)
    check(f"grouped_allreduce_async/{tag}", hvd.synchronize(hvd.grouped_allreduce_async(group[r], op=hvd.Sum)), summed)
    check(
        f"grouped_allreduce/inputs_unchanged/{tag}",
        group[r],
        [make(r, dtype, 4), make(r + 1, dtype, 2, 3), make(r, torch.float32, 5)],
    )
    inplace = [t.clone() for t in group[r]]
    hvd.synchronize(hvd.grouped_allreduce_async_(inplace, op=hvd.Sum, name=f"gar.{tag}"))
    check(f"grouped_allreduce_async_/{tag}", inplace, summed)

    rows = 2 * n + 1  # uneven over 2 and 3 ranks
    whole = [make(q, dtype, rows, 2) for q in range(n)]
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        check(
            f"reducescatter/{op.name}/{tag}",
            hvd.reducescatter(whole[r], op=op),
            reduce_expected(whole, op)[rows_of(r, rows)],
        )
    mine = hvd.synchronize(hvd.reducescatter_async(whole[r], op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5))
    check(f"reducescatter_async/scaled/{tag}", mine, reduce_expected(whole, hvd.Sum)[rows_of(r, rows)])
    check(
        f"reducescatter/default_average/{tag}",
        hvd.reducescatter(whole[r]),
        reduce_expected(whole, hvd.Average)[rows_of(r, rows)],
    )
    two = [[make(q, dtype, rows, 2), make(q, dtype, n, 3)] for q in range(n)]
    expected = [
        reduce_expected([t[0] for t in two], hvd.Sum)[rows_of(r, rows)],
        reduce_expected([t[1] for t in two], hvd.Sum)[rows_of(r, n)],
    ]
    check(f"grouped_reducescatter/{tag}", hvd.grouped_reducescatter(two[r], op=hvd.Sum), expected)
    check(
        f"grouped_reducescatter_async/{tag}",
        hvd.synchronize(hvd.grouped_reducescatter_async(two[r], op=hvd.Sum)),
        expected,
    )

# ---- gradients (Horovod's backward rules) ---------------------------------------------------------
x = torch.ones(3, requires_grad=True)
(hvd.grouped_allreduce([x * (r + 1)], op=hvd.Sum)[0].sum()).backward()
check("grad/grouped_allreduce", x.grad, torch.full((3,), float((r + 1) * n)))  # the gradient is summed too
x = torch.ones(2 * n + 1, 2, requires_grad=True)
(hvd.reducescatter(x, op=hvd.Sum) * (r + 1)).sum().backward()  # backward: gathered grads times size for Sum
kept = [rows_of(q, 2 * n + 1) for q in range(n)]
check(
    "grad/reducescatter",
    x.grad,
    torch.cat([torch.full((k.stop - k.start, 2), float((q + 1) * n)) for q, k in enumerate(kept)]),
)
x = torch.ones(sum(splits_from(r)), requires_grad=True)
out, _ = hvd.alltoall(x, splits=splits_from(r))
(out * (r + 1)).sum().backward()  # each row's gradient comes back from the rank it went to
check("grad/alltoall", x.grad, torch.cat([torch.full((c,), float(dest + 1)) for dest, c in enumerate(splits_from(r))]))
x = torch.ones(r + 1, requires_grad=True)
(hvd.grouped_allgather([x])[0] * 2).sum().backward()  # averaged gradient of the gathered rows, this rank's kept
check("grad/grouped_allgather", x.grad, torch.full((r + 1,), 2.0))

# ---- sparse allreduce: equal to the dense reduction ------------------------------------------------
dense = [torch.zeros(6, 3) for _ in range(n)]
for q in range(n):
    dense[q][q] = q + 1.0
    dense[q][5] = 1.0
sparse_sum = hvd.sparse_allreduce_async(dense[r].to_sparse(), name="emb", op=hvd.Sum)()
check("sparse_allreduce/sum", sparse_sum.to_dense(), sum(dense))
handle = hvd.sparse_allreduce_async(dense[r].to_sparse(), name="emb", op=hvd.Average)
check("sparse_allreduce/average", hvd.synchronize(handle).to_dense(), sum(dense) / n)

# ---- mismatches: the same error on every rank, then the job goes on -------------------------------
errors["shape"] = caught(lambda: hvd.allreduce(torch.zeros(4, 3) if r == 0 else torch.zeros(3, 4), name="grad.w"))
errors["dtype"] = caught(lambda: hvd.allreduce(torch.zeros(2, dtype=torch.float32 if r == 0 else torch.float64)))
errors["name"] = caught(lambda: hvd.allreduce(torch.zeros(2), name=f"loss.{r}"))
errors["op"] = caught(lambda: hvd.allreduce(torch.zeros(2), op=hvd.Sum if r == 0 else hvd.Max))
errors["root"] = caught(lambda: hvd.broadcast(torch.zeros(2), root_rank=r))
errors["count"] = caught(lambda: hvd.grouped_allreduce([torch.zeros(1)] * (r + 1)))
errors["gather_dims"] = caught(lambda: hvd.grouped_allgather([torch.zeros(2), torch.zeros(1, 1 + r)]))
bad_splits = [3] * n if r == 1 else [2] * n  # only rank 1 knows its splits are wrong
errors["splits"] = caught(lambda: hvd.alltoall(torch.zeros(2 * n), splits=bad_splits))
errors["not_contiguous"] = caught(lambda: hvd.allreduce_(torch.zeros(3, 2).t() if r == 1 else torch.zeros(2, 3)))
pending = hvd.allreduce_async(torch.ones(1), name="twice")
errors["duplicate"] = caught(lambda: hvd.allreduce_async(torch.ones(1), name="twice"))
hvd.synchronize(pending)
pending = hvd.allreduce_async(torch.ones(1), name="once")
if r == 0:
    hvd.synchronize(pending)  # only the other ranks still hold 'once' pending
errors["duplicate_on_some_ranks"] = caught(lambda: hvd.allreduce(torch.ones(1), name="once"))
hvd.synchronize(pending)
check("after_errors/allreduce", hvd.allreduce(torch.ones(1), name="once", op=hvd.Sum), torch.tensor([float(n)]))
# A dropped handle does not end its op: the name stays pending (Horovod's *_duplicate_name_error).
dropped = torch.zeros(2 * n, 3)
for kind, submit in {
    "allreduce": lambda: hvd.allreduce_async(dropped, name="dup.allreduce"),
    "allgather": lambda: hvd.allgather_async(dropped, name="dup.allgather"),
    "broadcast": lambda: hvd.broadcast_async(dropped, 0, name="dup.broadcast"),
    "reducescatter": lambda: hvd.reducescatter_async(dropped, name="dup.reducescatter"),
}.items():
    submit()  # handle dropped at once
    errors[f"dropped_{kind}"] = caught(submit)
errors["even_split"] = caught(lambda: hvd.alltoall(torch.zeros(n + 1, 2)))  # no splits: rows must divide evenly


# ---- join without a DistributedOptimizer: allreduces go on beside the joined rank, the rest is refused ----
def outcome(actual, expected) -> str:
    try:
        torch.testing.assert_close(actual, expected)
        return "ok"
    except AssertionError as err:
        return str(err).strip().splitlines()[0]


def beside(joined: int, dtype: torch.dtype, *shape: int) -> list[torch.Tensor]:
    """Every rank's input, zeros for the joined rank (what Horovod's joined rank contributes)."""
    zeros = torch.zeros(shape, dtype=dtype, device=DEVICE)
    return [make(q, dtype, *shape) if q != joined else zeros for q in range(n)]


joins = []
for first in range(n):
    seen: dict = {}
    if r == first:
        seen["ret"] = hvd.join()
    else:
        inputs = [beside(first, torch.float32, 5), beside(first, torch.int64, 5)]  # int64 Average truncates
        handles = [hvd.allreduce_async(everyone[r], name=f"join.{i}") for i, everyone in enumerate(inputs)]
        seen["average"] = [
            outcome(hvd.synchronize(h), reduce_expected(e, hvd.Average)) for h, e in zip(handles, inputs)
        ]
        group = [beside(first, torch.float32, 5), beside(first, torch.int16, 3), beside(first, torch.float32, 2, 2)]
        summed = [reduce_expected(everyone, hvd.Sum) for everyone in group]  # int16 travels as int32
        seen["grouped_sum"] = outcome(hvd.grouped_allreduce([everyone[r] for everyone in group], op=hvd.Sum), summed)
        hvd.barrier()
        seen["allgather"] = caught(lambda: hvd.allgather(torch.zeros(1, 2)))
        root = (first + 1) % n  # an active rank
        seen["broadcast"] = caught(lambda: hvd.broadcast(torch.zeros(2), root_rank=root))  # noqa: B023
        seen["max"] = caught(lambda: hvd.allreduce(torch.zeros(2), op=hvd.Max))
        seen["ret"] = hvd.join()
    seen["everyone"] = hvd.allgather_object(seen["ret"])
    joins.append(seen)

json_path = os.path.join(sys.argv[1], f"rank{r}.json")
with open(json_path, "w") as f:
    json.dump({"rank": r, "size": n, "checks": checks, "errors": errors, "joins": joins}, f, indent=1)
hvd.shutdown()

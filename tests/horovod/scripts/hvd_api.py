"""Every shoal.horovod collective and the DistributedOptimizer's rules, on each rank; what it saw goes to JSON.

Usage: hvd_api.py OUT_DIR   (under any launcher; writes OUT_DIR/rank{r}.json). The test asserts the values.
"""

import json
import os
import sys
import warnings

import torch
from torch import nn

import shoal.horovod as hvd


def caught(call) -> str:
    """The error's class names and message (the calls below are expected to fail)."""
    try:
        call()
    except Exception as err:
        return ",".join(c.__name__ for c in type(err).__mro__[:-2]) + ": " + str(err)
    return "no error"


out: dict = {}
out["before_init"] = caught(hvd.rank)
out["is_initialized_before"] = hvd.is_initialized()
hvd.init()
hvd.init()  # a second call is a no-op, as in Horovod
r, n = hvd.rank(), hvd.size()
out["rank"] = r
out["shape"] = [r, n, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(), hvd.is_homogeneous()]
out["queries"] = {
    "mpi_built": hvd.mpi_built(),
    "mpi_enabled": hvd.mpi_enabled(),
    "mpi_threads_supported": hvd.mpi_threads_supported(),
    "gloo_built": hvd.gloo_built(),
    "gloo_enabled": hvd.gloo_enabled(),
    "nccl_built": hvd.nccl_built(),
    "cuda_built": hvd.cuda_built(),
    "rocm_built": hvd.rocm_built(),
    "ddl_built": hvd.ddl_built(),
    "ccl_built": hvd.ccl_built(),
    "gpu_available": hvd.gpu_available(),
}

# allreduce: every op, integer average, scale factors, in place, async, deprecated `average`, autograd.
value = torch.tensor([float(r + 1), 10.0 * (r + 1)])
out["allreduce"] = {
    "average": hvd.allreduce(value, name="avg").tolist(),
    "sum": hvd.allreduce(value, op=hvd.Sum).tolist(),
    "min": hvd.allreduce(value, op=hvd.Min).tolist(),
    "max": hvd.allreduce(value, op=hvd.Max).tolist(),
    "product": hvd.allreduce(value, op=hvd.Product).tolist(),
    "int_average": hvd.allreduce(torch.tensor([r + 2]), op=hvd.Average).tolist(),
    "scaled": hvd.allreduce(value, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).tolist(),
    "average_false": hvd.allreduce(value, average=False).tolist(),
    "fp16": hvd.allreduce(value, compression=hvd.Compression.fp16).tolist(),
    "input_unchanged": value.tolist(),
}
inplace = torch.tensor([float(r)])
hvd.allreduce_(inplace, op=hvd.Sum)
handle = hvd.allreduce_async(torch.tensor([float(r)]), op=hvd.Max)
out["allreduce"]["inplace"] = inplace.tolist()
out["allreduce"]["async"] = hvd.synchronize(handle).tolist()
out["allreduce"]["polled"] = hvd.poll(handle)
leaf = torch.tensor([float(r + 1)], requires_grad=True)
(hvd.allreduce(leaf, op=hvd.Sum) * (r + 1)).sum().backward()
out["allreduce"]["grad"] = leaf.grad.tolist()
out["adasum"] = caught(lambda: hvd.allreduce(value, op=hvd.Adasum))

# allgather with different first dimensions; objects; broadcast; alltoall with uneven splits.
out["allgather"] = hvd.allgather(torch.full((r + 1, 2), float(r))).tolist()
out["allgather_bad"] = caught(lambda: hvd.allgather(torch.zeros(1, 2 + r)))
out["allgather_object"] = hvd.allgather_object({"rank": r})
out["broadcast_object"] = hvd.broadcast_object({"from": r}, root_rank=n - 1)
out["broadcast"] = hvd.broadcast(torch.tensor([float(r)]), root_rank=min(1, n - 1)).tolist()
target = torch.tensor([float(r), float(r)])
hvd.broadcast_(target, root_rank=0)
out["broadcast_"] = target.tolist()
out["broadcast_bad_root"] = caught(lambda: hvd.broadcast(torch.zeros(1), root_rank=n))
rows = torch.arange(3 * n, dtype=torch.float32).reshape(3 * n, 1) + 100 * r
splits = [1 + (j + r) % 2 for j in range(n)]
splits[-1] += 3 * n - sum(splits)
received, counts = hvd.alltoall(rows, splits=splits)
out["alltoall"] = {"sent_splits": splits, "received": received.flatten().tolist(), "counts": counts.tolist()}
out["alltoall_even"] = hvd.alltoall(torch.arange(2 * n) + 10 * r).tolist()
hvd.barrier()


# Horovod's test_optimizer_no_named_parameters, test_broadcast_state_no_grad, test_sparse_embeddings;
# in functions, so that their optimizers are gone before hvd.join() below (it shadows one optimizer).
def default_names() -> dict:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    groups = [{"params": model[0].parameters()}, {"params": model[1].parameters()}]
    names = hvd.DistributedOptimizer(torch.optim.SGD(groups, lr=0.1))._parameter_names
    return {"names": sorted(names.values())}  # the same on every rank: each rank's list is checked


class FrozenIndex(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
        self.b = nn.Parameter(torch.rand(4) + r)  # differs per rank until broadcast


def fresh_state() -> dict:
    model = FrozenIndex()
    sgd = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
    optimizer = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    weights = model.b.detach().clone()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    grad = optimizer.param_groups[0]["params"][1].grad
    return {
        "frozen_grad": repr(model.a.grad),
        "trainable_grad": None if grad is None else grad.tolist(),
        "weights_unmoved": torch.equal(model.b.detach(), weights),  # no state-creating step
        "state_empty": len(optimizer.state) == 0,
    }


def sparse_steps(model: nn.Module, optimizer_class, sparse_as_dense: bool, steps: int, uneven: bool = False) -> dict:
    """Per step: is the embedding's gradient sparse, is every gradient the average of the ranks' own;
    then whether the weights are the same on every rank. ``uneven``: then rank r takes r more steps
    and joins (the joined ranks send no rows)."""
    opt = hvd.DistributedOptimizer(
        optimizer_class(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        sparse_as_dense=sparse_as_dense,
    )
    params, seen = list(model.parameters()), []
    for step in range(steps):
        rows = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]]) if r == 0 else torch.tensor([[1, 3 + step, 4], [4, 7, 9]])
        opt.zero_grad()
        loss = (model(rows) * (r + 1 + step)).sum()
        local = [g.to_dense() for g in torch.autograd.grad(loss, params, retain_graph=True)]
        loss.backward()
        opt.step()
        everyone = hvd.allgather_object([g.tolist() for g in local])
        expected = [sum(torch.tensor(theirs[i]) for theirs in everyone) / n for i in range(len(params))]
        seen.append(
            [params[0].grad.is_sparse, all(torch.allclose(p.grad.to_dense(), e) for p, e in zip(params, expected))]
        )
    weights = [p.detach().sum().item() for p in params]
    found = {"steps": seen, "same_weights": hvd.allgather_object(weights) == [weights] * n}
    if uneven:
        for extra in range(r):
            opt.zero_grad()
            loss = model(torch.tensor([[extra, 2 * extra], [7, 8]])).sum()
            local = [g.to_dense() for g in torch.autograd.grad(loss, params, retain_graph=True)]
            loss.backward()
            opt.step()
        if r == n - 1 and r > 0:  # its last step ran alone: the others' rows are none, Average divides by n
            found["alone"] = all(torch.allclose(p.grad.to_dense(), g / n) for p, g in zip(params, local))
        found["join_last"] = hvd.join()
    return found


def sparse_gradients() -> dict:
    torch.manual_seed(5)  # the same weights on every rank
    found = {}
    for as_dense in (False, True):  # Horovod's model: an embedding alone (bucket 0 keeps only the join flag)
        embedding = nn.Embedding(10, 3, sparse=True)
        found[f"embedding/{as_dense}"] = sparse_steps(embedding, torch.optim.SparseAdam, as_dense, 2)
    # beside a dense layer: the embedding leaves the buckets after step 1, the linear layer stays
    mixed = nn.Sequential(nn.Embedding(10, 3, sparse=True), nn.Linear(3, 2))
    found["mixed"] = sparse_steps(mixed, torch.optim.SGD, False, 3, uneven=True)
    return found


out["default_names"] = default_names()
out["fresh_state"] = fresh_state()
out["sparse"] = sparse_gradients()

# DistributedOptimizer: overlap, accumulation, synchronize/skip_synchronize, zero_grad rule.
os.environ["HOROVOD_FUSION_THRESHOLD"] = "256"  # several buckets for a small model
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), backward_passes_per_step=2
)
engine = opt._hvd  # None with one process: Horovod registers no hooks then either


def in_flight() -> int | None:
    return None if engine is None else len(engine.in_flight)


out["buckets"] = None if engine is None else len(engine.buckets)
torch.manual_seed(100 + r)
x1, x2 = torch.randn(4, 8), torch.randn(4, 8)
params = list(model.parameters())
# This rank's own gradients, computed without touching .grad (so no hook runs).
local_1 = torch.autograd.grad(model(x1).sum(), params)
local_2 = torch.autograd.grad(model(x2).sum(), params)
model(x1).sum().backward()
out["accumulate"] = {
    "in_flight_after_pass_1": in_flight(),
    "pass_1_stayed_local": all(torch.equal(p.grad, g) for p, g in zip(params, local_1)),
    # (with one process there is nothing in flight and zero_grad() would simply clear the pass)
    "zero_grad_mid_accumulation": caught(opt.zero_grad) if engine is not None else "not tried",
}
model(x2).sum().backward()
# Every bucket's all-reduce was started by the hooks during backward, before step().
out["accumulate"]["in_flight_after_pass_2"] = in_flight()
opt.synchronize()
everyone = hvd.allgather_object([(a + b).tolist() for a, b in zip(local_1, local_2)])
expected = [sum(torch.tensor(theirs[i]) for theirs in everyone) / n for i in range(len(params))]
out["accumulate"]["reduced_is_average_of_local_sums"] = all(
    torch.allclose(p.grad, e, atol=1e-6) for p, e in zip(params, expected)
)
with warnings.catch_warnings(record=True) as seen:  # Horovod warns: the gradients are reduced twice
    warnings.simplefilter("always")
    opt.step()
out["step_after_synchronize_warns"] = [str(w.message) for w in seen]
opt.zero_grad()
model(x1).sum().backward()
model(x1).sum().backward()
out["too_many_passes"] = caught(lambda: model(x1).sum().backward())
opt.synchronize()  # settle what the two good passes started
with opt.skip_synchronize():
    opt.step()
opt.zero_grad()
out["same_weights"] = hvd.allgather_object([p.sum().item() for p in model.parameters()])

# join: rank 0 runs out of data first; the others keep stepping (rank 0 adds zero gradients).
opt.set_backward_passes_per_step(1)
extra_steps = r  # rank r has r more batches than rank 0
for _ in range(extra_steps):
    opt.zero_grad()
    local = torch.autograd.grad(model(x1).sum(), params)
    model(x1).sum().backward()
    opt.step()
if r == n - 1 and extra_steps:  # its last step ran alone: the others contributed zeros, Average still divides by size
    out["alone_step_is_local_over_size"] = all(torch.allclose(p.grad, g / n, atol=1e-6) for p, g in zip(params, local))
out["join_last"] = hvd.join()
out["after_join_allreduce"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()

with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
    json.dump(out, f)
hvd.shutdown()
out_file = os.path.join(sys.argv[1], f"rank{r}.json")
print(f"rank {r}: wrote {out_file}; initialized after shutdown: {hvd.is_initialized()}", flush=True)

"""Horovod's PyTorch API (``horovod.torch``) on ``torch.distributed``; users import :mod:`shoal.horovod`.

The modules, by concept:

- :mod:`~.errors`: the errors (ShoalErrors that are also the exception types Horovod raises).
- :mod:`~.state`: ``init``/``shutdown``, the job's shape (``size``, ``rank``, ``local_*``, ``cross_*``)
  and the build queries (``nccl_built``, ``mpi_built``, ...).
- :mod:`~.ops`: the reduction ops (``Average``, ``Sum``, ...), the ``allreduce`` family and the
  handles of async calls (``synchronize``, ``poll``).
- :mod:`~.exchange`: the collectives that move data (``allgather``, ``broadcast``, ``alltoall``, ``barrier``).
- :mod:`~.grouped`: the grouped forms (``grouped_allreduce``, ``grouped_allgather``) and ``sparse_allreduce_async``.
- :mod:`~.scatter`: ``reducescatter`` and ``grouped_reducescatter``.
- :mod:`~.agreement`: Horovod's cross-rank checks before each collective (shape, dtype, name, op,
  duplicate names): the same one-line error on every rank instead of a hang.
- :mod:`~.dtypes`: the dtype a tensor travels in (int16 as int32: gloo and NCCL lack it).
- :mod:`~.functions`: parameters, optimizer state and Python objects across ranks.
- :mod:`~.buckets`: packing many tensors into few flat buffers (one collective per bucket).
- :mod:`~.compression`: ``Compression.none`` / ``Compression.fp16``.
- :mod:`~.reducer`: the gradient buckets' asynchronous all-reduces, started from hooks during backward.
- :mod:`~.sparse_grads`: the optimizer's sparse gradients, gathered as indices and values.
- :mod:`~.optimizer`: ``DistributedOptimizer``: the wrapped optimizer's ``step()`` after the reducer's work.
- :mod:`~.join`: ``join()``: ranks out of data answer the others' all-reduces with zeros until every rank has joined.
- :mod:`~.unsupported`: what shoal cannot offer (Adasum, the timeline, elastic), named with the
  shoal equivalent; the ``HOROVOD_*`` settings it ignores, named in one warning.
- :mod:`~.recipe`: the tutorial's setup in one call, for benchmarks and examples.
"""

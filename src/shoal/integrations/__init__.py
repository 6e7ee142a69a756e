"""Thin adapters between shoal and other systems' APIs.

- :mod:`shoal.integrations.horovod`: Horovod's PyTorch API on torch.distributed
  (``import shoal.horovod as hvd``); docs/HOROVOD.md.
- :mod:`shoal.integrations.flyte`: a Flyte task whose body is one ``shoal.fit`` call, with retries
  that resume from Flyte's intra-task checkpoints; docs/FLYTE.md.
"""

"""torch.distributed for one process of a job: device and backend, process group, DDP and FSDP
(``wrap.py``, ``fsdp.py``), collectives.

Light to import: the submodules import torch, this package does not.
"""

"""Thin adapters that let other systems' APIs run on shoal's engine.

- :mod:`shoal.integrations.horovod`: Horovod's PyTorch API (``import shoal.horovod as hvd``) on
  ``torch.distributed``, joined through :func:`shoal.init` so that every launcher works;
  docs/HOROVOD.md.
- :mod:`shoal.integrations.flyte`: a Flyte task whose body is one ``shoal.fit`` call, with retries
  that resume from Flyte's intra-task checkpoints; docs/FLYTE.md.

Layer: integrations may import ``train``, ``launch``, ``context`` and everything below them, never
``cli`` or ``bench``; the public facades (``shoal.horovod``) sit on top, beside the CLI.
"""

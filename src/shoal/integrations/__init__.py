"""Thin adapters that let other systems' APIs run on shoal's engine.

- :mod:`shoal.integrations.horovod`: Horovod's PyTorch API (``import shoal.horovod as hvd``) on
  ``torch.distributed``, joined through :func:`shoal.init` so that every launcher works.

Layer: integrations may import ``train``, ``context`` and everything below them, never ``cli``;
the public facades (``shoal.horovod``) sit on top, beside the CLI.
"""

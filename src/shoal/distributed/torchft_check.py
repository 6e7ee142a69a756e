"""Whether torchft (``--fault-tolerance``) is installed, asked without importing it or torch."""

from __future__ import annotations

import importlib.util

from shoal.errors import ShoalError

INSTALL_HINT = "pip install 'shoal[ft]' (torchft, PyTorch's per-step fault tolerance)"


def torchft_installed() -> bool:
    """Whether ``import torchft`` would find the package (nothing is imported)."""
    return importlib.util.find_spec("torchft") is not None


def check_torchft() -> None:
    """One line and a HINT when torchft is not installed (before any replica group starts)."""
    if not torchft_installed():
        raise ShoalError("--fault-tolerance needs torchft, which is not installed", INSTALL_HINT)

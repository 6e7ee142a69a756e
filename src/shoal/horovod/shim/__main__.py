"""``python -m shoal.horovod.shim``: print the directory to put first on PYTHONPATH (see the package's docstring)."""

from shoal.horovod.shim import path

print(path())

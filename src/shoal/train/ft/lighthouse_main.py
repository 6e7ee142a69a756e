"""Run torchft's lighthouse: ``python PATH/lighthouse_main.py --bind HOST:PORT --min_replicas N ...``.

torchft's own ``torchft_lighthouse`` script imports the ``torchft`` package first, and with it
torch: 2-10 s before the lighthouse listens (measured here, more on a loaded machine), every time
it is started or restarted. The lighthouse itself is Rust inside the package's extension module,
which this file loads alone (0.2 s). Run it by path, not with ``-m``: the Rust entry point parses
the process's own arguments after the first, which must be this file (torchft 0.2.0,
``lighthouse_main``).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import sys


def main() -> int:
    package = importlib.util.find_spec("torchft")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        print("shoal: error: torchft is not installed\nHINT: pip install 'shoal[ft]'", file=sys.stderr)
        return 2
    found = glob.glob(os.path.join(package.submodule_search_locations[0], "_torchft*.so"))
    if not found:
        print("shoal: error: torchft's extension module is missing\nHINT: pip install 'shoal[ft]'", file=sys.stderr)
        return 2
    _allow_every_connection()
    spec = importlib.util.spec_from_file_location("torchft._torchft", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lighthouse_main()


def _allow_every_connection() -> None:
    """Raise the open-files limit to its ceiling: the lighthouse holds a connection per replica group
    (1,048 files at 1,000 groups, past the usual soft limit of 1,024: benchmarks/lighthouse_scale.py)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


if __name__ == "__main__":
    sys.exit(main())

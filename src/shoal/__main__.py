"""``python -m shoal`` is the ``shoal`` command."""

from shoal.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())

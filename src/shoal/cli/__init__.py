"""The ``shoal`` command line: one module per subcommand, registered in :mod:`shoal.cli.main`."""

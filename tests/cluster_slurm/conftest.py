"""The ``slurm`` fixture: real slurmctld, slurmd and munge daemons for the session (see slurm_cluster)."""

from slurm_cluster import slurm  # noqa: F401  (re-exported as a fixture)

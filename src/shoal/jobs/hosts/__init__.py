"""Running what :mod:`shoal.launch.render` rendered, on this machine and on others.

- :mod:`.processes`: mpirun, one launcher per host over SSH, sbatch, kubectl, and stopping them;
- :mod:`.reach`: before anything starts, check that every host takes a password-less login;
- :mod:`.rank_status`: the wrapper that reports each mpirun rank's exit status.
"""

from shoal.launch.remote.processes import (
    GRACE_S,
    MPIRUN_HINT,
    SETTLE_S,
    SSH_HINT,
    kubectl_apply,
    require_program,
    run_launchers,
    run_mpirun,
    submit_sbatch,
)
from shoal.launch.remote.reach import check_reachable

__all__ = [
    "GRACE_S",
    "MPIRUN_HINT",
    "SETTLE_S",
    "SSH_HINT",
    "check_reachable",
    "kubectl_apply",
    "require_program",
    "run_launchers",
    "run_mpirun",
    "submit_sbatch",
]

"""The one preemption grace: how long a rank has between SIGTERM and SIGKILL.

Kubernetes gives a pod ``terminationGracePeriodSeconds`` (30 s by default) between SIGTERM and
SIGKILL; Slurm's ``KillWait`` is 30 s by default too. shoal spends :data:`PREEMPT_GRACE_S` of it
writing the preemption checkpoint (``shoal train --preempt-grace``, ``ctx.preemption()``) and
leaves :data:`EXIT_MARGIN_S` for the processes to exit and flush their logs. Every default that
speaks of the grace reads it here; ``tests/test_grace.py`` ties them together.
"""

PREEMPT_GRACE_S = 25.0
"""Seconds after SIGTERM/SIGUSR1 within which a rank checkpoints and exits."""
EXIT_MARGIN_S = 5
"""Seconds beyond the preemption grace for the processes to exit and flush their logs."""
PLATFORM_GRACE_S = 30
"""Kubernetes' default terminationGracePeriodSeconds (and Slurm's default KillWait)."""

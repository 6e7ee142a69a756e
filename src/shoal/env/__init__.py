"""Launch-scheme detection: one small class per scheme, tried in the order in :mod:`shoal.env.detect`."""

from shoal.env.base import EnvInfo, LaunchEnvironment
from shoal.env.detect import SCHEMES, detect_environment, torch_env_vars

__all__ = ["EnvInfo", "LaunchEnvironment", "SCHEMES", "detect_environment", "torch_env_vars"]

"""The torchrun contract, checked on every path that starts a user's script (see docs/LAUNCHERS.md)."""

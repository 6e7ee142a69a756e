"""Atomic, durable storage of training state (checkpoints, the saved model, run metadata)."""

"""shoal: take a PyTorch training job from one device to many machines without a rewrite."""

__version__ = "0.1.0"

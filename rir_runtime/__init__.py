"""RIR runtime: environments with checkpoints, recovery modules, episode loop, models."""

__version__ = "0.1.0"

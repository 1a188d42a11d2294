"""vime: declarative RL post-training of mixture-of-experts models."""

__version__ = "0.1.0"

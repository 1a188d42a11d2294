"""The RL loop, on the head: the GRPO loop (loop.py) over the prompts (data.py), the rewards
(rewards.py), checkpoints (checkpoint.py) and metrics (metrics.py). It drives the training and
rollout groups it is given and imports only runtime/core/. runtime/README.md has the layers."""

"""What runs on the cluster: the job entry point and Ray bootstrap (node/), the RL loop (rl/),
the training and rollout workers (workers/) and their backends, Megatron and vLLM among them
(backends/, megatron/). runtime/README.md has the layers."""

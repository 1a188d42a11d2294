"""What runs on the cluster: the job entry point and Ray bootstrap (issue 5), the RL driver
(issue 6), the Megatron actor (issue 7) and the vLLM rollout engines (issue 8)."""

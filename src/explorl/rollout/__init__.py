"""Rollout engines: the interface, the `hf` and `vllm` engines, samplers, the rollout record."""

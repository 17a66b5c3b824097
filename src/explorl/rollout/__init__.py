"""Rollout engines: the engine interface, the `hf` and `vllm` engines, samplers and the rollout record."""

"""The vLLM engine's settings by device (no GPU and no vLLM needed), the checks that refuse what
a machine cannot run, sleep mode's bookkeeping and the vLLM log filter."""

import logging
from types import SimpleNamespace

import pytest

from explorl import validation
from explorl.config import VLLMConfig
from explorl.errors import ConfigError
from explorl.rollout.vllm_process import SleepCycle, _OncePerKind
from explorl.rollout.vllm_settings import (
    ModelShape,
    check_engine_settings,
    engine_kwargs,
)

QWEN_1_5B = SimpleNamespace(num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                            hidden_size=1536)  # Qwen2.5-1.5B's config.json (head_dim 128)


def kwargs(device, **fields):
    return engine_kwargs(VLLMConfig(**fields), model="m", dtype="bfloat16", seed=3,
                         device_type=device, shape=ModelShape.from_hf_config(QWEN_1_5B))


def test_cpu_keeps_eager_mode_and_a_one_gib_cache():
    k = kwargs("cpu")
    assert k == {"model": "m", "dtype": "bfloat16", "seed": 3,
                 "logprobs_mode": "processed_logprobs", "generation_config": "vllm",
                 "tensor_parallel_size": 1, "enable_prefix_caching": True,
                 "enforce_eager": True, "kv_cache_memory_bytes": 2**30}
    assert kwargs("cpu", kv_cache_gib=0.25, max_model_len=64)["kv_cache_memory_bytes"] == 2**28


def test_cuda_uses_graphs_and_a_memory_fraction_unless_the_cache_size_is_given():
    k = kwargs("cuda")
    assert "enforce_eager" not in k and "kv_cache_memory_bytes" not in k  # CUDA graphs on
    assert k["gpu_memory_utilization"] == 0.3 and "enable_sleep_mode" not in k
    fixed = kwargs("cuda", kv_cache_gib=8.0, tensor_parallel_size=2, prefix_caching=False,
                   sleep_level=1)
    assert fixed["kv_cache_memory_bytes"] == 8 * 2**30 and "gpu_memory_utilization" not in fixed
    assert fixed["tensor_parallel_size"] == 2 and fixed["enable_prefix_caching"] is False
    assert fixed["enable_sleep_mode"] is True
    several = engine_kwargs(VLLMConfig(), model="m", dtype="auto", seed=0, device_type="cuda",
                            world_size=4)
    assert several["distributed_executor_backend"] == "external_launcher"  # TRL's colocate mode
    assert "distributed_executor_backend" not in engine_kwargs(
        VLLMConfig(), model="m", dtype="auto", seed=0, device_type="cpu", world_size=4)


def test_llm_kwargs_win_over_everything():
    k = kwargs("cuda", llm_kwargs={"enforce_eager": True, "gpu_memory_utilization": 0.9,
                                   "seed": 7, "max_num_seqs": 64})
    assert k["enforce_eager"] is True and k["gpu_memory_utilization"] == 0.9
    assert k["seed"] == 7 and k["max_num_seqs"] == 64


def test_the_kv_cache_arithmetic_of_the_docs():
    shape = ModelShape.from_hf_config(QWEN_1_5B)
    assert shape.head_dim == 128 and shape.num_kv_heads == 2
    assert shape.kv_bytes_per_token(2) == 28 * 1024  # 28 × 2 × 128 × (K, V) × 2 bytes
    assert 2**30 // shape.kv_bytes_per_token() == 37449  # ~37k tokens in 1 GiB


def test_tensor_parallel_must_split_the_heads():
    with pytest.raises(ConfigError, match="rollout.vllm.tensor_parallel_size: 5"):
        kwargs("cuda", tensor_parallel_size=5)
    assert kwargs("cuda", tensor_parallel_size=4)["tensor_parallel_size"] == 4  # KV replicated


def test_heads_vllms_cpu_attention_cannot_run_are_refused_before_the_engine_starts():
    """Off CUDA the engine needs heads vLLM's CPU attention runs (a lab model's 16-dim heads
    would start the engine and fail at its first sampling call); CUDA's backends take them."""
    lab = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=64)
    shape = ModelShape.from_hf_config(lab)
    with pytest.raises(ConfigError, match=r"rollout.engine: vllm on cpu: .*32, 64, .* this "
                                          r"model's are 16 \(m\); use rollout.engine: hf"):
        engine_kwargs(VLLMConfig(), model="m", dtype="float32", seed=0, device_type="cpu",
                      shape=shape)
    engine_kwargs(VLLMConfig(), model="m", dtype="float32", seed=0, device_type="cuda",
                  shape=shape)
    engine_kwargs(VLLMConfig(), model="m", dtype="float32", seed=0, device_type="cpu",
                  shape=shape, head_sizes=(16, 32))  # what the installed vLLM says it runs
    assert kwargs("cpu")["enforce_eager"] is True  # 128: runs


def test_what_a_machine_cannot_run_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"rollout.vllm.sleep_level: 1 needs a CUDA device"):
        check_engine_settings(VLLMConfig(sleep_level=1), "cpu", gpus=0)
    with pytest.raises(ConfigError, match=r"rollout.vllm.tensor_parallel_size: 8 .* 2 GPUs"):
        check_engine_settings(VLLMConfig(tensor_parallel_size=8), "cuda", gpus=2)
    with pytest.raises(ConfigError, match=r"rollout.vllm.tensor_parallel_size: 1 × 4 .*needs 4"):
        check_engine_settings(VLLMConfig(), "cuda", gpus=2, world_size=4)
    with pytest.raises(ConfigError, match="rollout.vllm.tensor_parallel_size: 2 with 2 training"):
        check_engine_settings(VLLMConfig(tensor_parallel_size=2), "cuda", gpus=8, world_size=2)
    with pytest.raises(ConfigError, match="rollout.vllm.in_process"):
        check_engine_settings(VLLMConfig(in_process=False), "cuda", gpus=8, world_size=2)
    check_engine_settings(VLLMConfig(sleep_level=2, tensor_parallel_size=8), "cuda", gpus=8)


def test_the_config_refuses_bad_vllm_settings_before_any_model_loads(make_config):
    with pytest.raises(ConfigError, match="rollout.vllm.gpu_memory_utilization"):
        validation.load(None, ["rollout.vllm.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match="rollout.vllm.gpu_memory_utilization"):
        validation.load(None, ["rollout.vllm.gpu_memory_utilization=0"])
    with pytest.raises(ConfigError, match="rollout.vllm.sleep_level"):
        validation.load(None, ["rollout.vllm.sleep_level=3"])
    # on this CPU machine (make_config validates against the machine)
    with pytest.raises(ConfigError, match="rollout.vllm.sleep_level: 2 needs a CUDA"):
        make_config({"model": {"device": "cpu"},
                     "rollout": {"engine": "vllm", "vllm": {"sleep_level": 2}}})
    make_config({"rollout": {"engine": "hf", "vllm": {"sleep_level": 2}}})  # vllm unused


class FakeLLM:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_cycle_sleeps_once_and_wakes_each_part_once(level):
    llm, cycle = FakeLLM(), SleepCycle(level)
    assert cycle.wake(llm, "weights") is False and llm.calls == []  # awake: nothing to do
    cycle.sleep(llm)
    cycle.sleep(llm)  # already asleep
    assert cycle.wake(llm, "weights") is (level == 2)  # level 2: weights to push again
    assert cycle.wake(llm, "weights") is False
    cycle.wake(llm, "kv_cache")
    assert llm.calls == [("sleep", level), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",))]
    assert cycle.seconds > 0  # the time the three calls took


def test_sleep_level_0_never_calls_vllm():
    llm, cycle = FakeLLM(), SleepCycle(0)
    cycle.sleep(llm)
    assert not cycle.wake(llm, "weights") and llm.calls == [] and cycle.seconds == 0


def test_vllm_log_lines_pass_once_per_kind_and_not_on_other_ranks(monkeypatch):
    monkeypatch.setattr(_OncePerKind, "seen", set())
    f = _OncePerKind()

    def rec(msg, name="vllm.worker", level=logging.WARNING):
        return logging.LogRecord(name, level, "f", 1, msg, ("x",), None)

    assert f.filter(rec("bind %s")) and not f.filter(rec("bind %s"))
    assert f.filter(rec("other %s")) and f.filter(rec("bind %s", name="vllm.other"))
    assert not _OncePerKind().filter(rec("bind %s"))  # vLLM's next handler: seen already
    monkeypatch.setenv("RANK", "1")
    assert not f.filter(rec("new %s")) and f.filter(rec("boom %s", level=logging.ERROR))

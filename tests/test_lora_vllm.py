"""LoRA with the ``vllm`` engine: it samples from the merged weights of the adapted policy.

Needs vLLM (``make test-vllm``); skipped where it is not installed.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from explorl.outputs.runlog import read_metrics  # noqa: E402
from explorl.rollout import vllm as V  # noqa: E402
from explorl.training.loop import Trainer  # noqa: E402

pytestmark = pytest.mark.vllm


def test_vllm_samples_from_the_merged_adapters_after_every_update(make_config, tmp_path):
    """Two steps with LoRA and EEPO's gate open: vLLM's log-probs of its own samples equal the
    adapted policy's forward (the merged weights were pushed), for the policy and the
    unlearned copy, and the frozen base is left exactly as it was."""
    cfg = make_config({"model": {"lora": {"enabled": True, "rank": 4}},
                       "rollout": {"engine": "vllm", "vllm": {"kv_cache_gib": 0.25}},
                       "control": {"eepo": {"enabled": True, "alpha": 10.0}}})
    t = Trainer(cfg, tmp_path / "run")
    assert isinstance(t.engine, V.VLLMEngine)
    base = {n: p.detach().clone() for n, p in t.policy.named_parameters() if ".lora_" not in n}
    t.train()
    rows = read_metrics(tmp_path / "run")
    for r in rows[1:]:
        assert r["rollout/vllm_logp_diff_max"] <= 1e-4
        assert r["rollout/weight_pushes"] >= 1.0
    assert rows[2]["eepo/active"] == 1.0
    assert all(torch.equal(p, base[n]) for n, p in t.policy.named_parameters() if n in base)
    names = [n for n, _ in V.weights_of(t.policy)]
    assert not any("lora_" in n or "base_layer" in n for n in names)
    t.engine.close()

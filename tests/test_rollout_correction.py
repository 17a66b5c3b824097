"""Rollout correction (docs/methods/baseline.md §7a) against values worked out by hand, its metrics,
and its place in the policy loss (weights reach the loss; dropped tokens leave the denominator)."""

import math

import pytest
import torch

from explorl.algorithms.aggregation import aggregate
from explorl.algorithms.rollout_correction import (
    correction_metrics,
    merge_sums,
    rollout_correction,
)
from explorl.errors import ConfigError
from explorl.training.correction import resolve_mode, step_correction

ELL = [0.1, -0.5, 1.0]  # §7a's example: ℓ = old_logp − engine_logp


def example(pad: int = 0):
    """One response with §7a's log-ratios (plus ``pad`` padding tokens)."""
    engine = torch.tensor([[-1.0, -2.0, -3.0] + [0.0] * pad])
    old = engine + torch.tensor([ELL + [5.0] * pad])  # padding's ratio must never count
    mask = torch.tensor([[True] * 3 + [False] * pad])
    return old, engine, mask


def test_token_truncate_caps_each_token_at_upper():
    c = rollout_correction(*example(pad=1), "token-truncate", upper=2.0)
    assert c.weight[0].tolist() == pytest.approx([math.exp(0.1), math.exp(-0.5), 2.0, 0.0],
                                                  abs=1e-6)
    assert c.weight[0, :3].tolist() == pytest.approx([1.105, 0.607, 2.0], abs=1e-3)
    assert c.keep[0].tolist() == [True, True, True, False]


def test_token_mask_drops_the_third_token_from_the_loss_and_its_denominator():
    old, engine, mask = example()
    c = rollout_correction(old, engine, mask, "token-mask", upper=2.0, lower=0.5)
    assert c.keep[0].tolist() == [True, True, False]
    assert c.weight[0].tolist() == pytest.approx([math.exp(0.1), math.exp(-0.5), 0.0], abs=1e-6)
    # the per-token loss 1 everywhere: the token mean is over the 2 kept tokens (slime PR 657)
    per_tok = torch.ones(1, 3) * c.weight
    loss = aggregate(per_tok, mask & c.keep, "token-mean")
    assert float(loss) == pytest.approx((math.exp(0.1) + math.exp(-0.5)) / 2)
    # the default lower bound is 1/upper = 0.5: same result
    d = rollout_correction(old, engine, mask, "token-mask", upper=2.0)
    assert d.keep.tolist() == c.keep.tolist()


def test_sequence_and_geometric_levels():
    seq = rollout_correction(*example(pad=2), "sequence-truncate", upper=2.0)
    assert seq.weight[0, :3].tolist() == pytest.approx([math.exp(0.6)] * 3, abs=1e-6)  # 1.822
    assert seq.weight[0, 3:].tolist() == [0.0, 0.0]
    geo = rollout_correction(*example(pad=2), "geometric-truncate", upper=2.0)
    assert geo.weight[0, :3].tolist() == pytest.approx([math.exp(0.2)] * 3, abs=1e-6)  # 1.221
    # geometric with its usual tight threshold: truncated to 1.001, masked out entirely
    assert rollout_correction(*example(), "geometric-truncate", upper=1.001).weight[0].tolist() \
        == pytest.approx([1.001] * 3)
    m = rollout_correction(*example(), "geometric-mask", upper=1.001)
    assert not m.keep.any() and (m.weight == 0).all()
    assert rollout_correction(*example(), "sequence-mask", upper=2.0).keep.all()  # 1.822 ≤ 2


def test_veto_drops_a_response_with_one_tiny_token_weight():
    old, engine, mask = example()
    old2 = torch.cat([old, old])
    old2[1, 1] = engine[0, 1] - 10.0  # w = e^-10 < 1e-4
    c = rollout_correction(old2, torch.cat([engine, engine]), torch.cat([mask, mask]),
                           "token-truncate", upper=2.0, veto=1e-4)
    assert c.keep[0].all() and not c.keep[1].any()
    assert c.sums["masked_seqs"] == 1 and c.sums["masked_tokens"] == 3


def test_metrics_of_the_example_by_hand():
    c = rollout_correction(*example(pad=1), "token-truncate", upper=2.0)
    m = correction_metrics(c.sums)
    raw = [math.exp(x) for x in ELL]
    applied = [raw[0], raw[1], 2.0]
    assert m["rollout_corr/weight_mean"] == pytest.approx(sum(raw) / 3)  # 1.4767
    assert m["rollout_corr/weight_min"] == pytest.approx(raw[1])
    assert m["rollout_corr/weight_max"] == pytest.approx(math.e)  # before truncation
    assert m["rollout_corr/ess"] == pytest.approx(
        sum(applied) ** 2 / (3 * sum(w * w for w in applied)))  # 0.8216
    assert m["rollout_corr/ess"] == pytest.approx(0.8216, abs=1e-4)
    assert m["rollout_corr/truncated_frac"] == pytest.approx(1 / 3)
    assert m["rollout_corr/masked_token_frac"] == 0 and m["rollout_corr/masked_seq_frac"] == 0
    assert m["rollout_corr/mismatch_k1"] == pytest.approx(-0.2)  # mean(engine − old)
    assert m["rollout_corr/mismatch_k3"] == pytest.approx(
        sum(math.exp(x) - x - 1 for x in ELL) / 3)  # 0.2767
    assert m["rollout_corr/log_ppl_gap"] == pytest.approx(0.2)
    assert m["rollout_corr/log_ppl_gap_abs_max"] == pytest.approx(0.2)
    mask_m = correction_metrics(rollout_correction(*example(), "token-mask", upper=2.0).sums)
    assert mask_m["rollout_corr/masked_token_frac"] == pytest.approx(1 / 3)
    assert mask_m["rollout_corr/truncated_frac"] == 0
    assert mask_m["rollout_corr/ess"] == pytest.approx(
        (raw[0] + raw[1]) ** 2 / (3 * (raw[0] ** 2 + raw[1] ** 2)))


def test_identical_distributions_are_a_no_op():
    lp = torch.log_softmax(torch.randn(4, 6), -1)
    mask = torch.rand(4, 6) > 0.3
    for mode in ("token-truncate", "token-mask", "sequence-mask", "geometric-mask"):
        c = rollout_correction(lp, lp, mask, mode, upper=1.0002)
        assert torch.equal(c.keep, mask) and torch.equal(c.weight, mask.float())
        m = correction_metrics(c.sums)
        assert m["rollout_corr/ess"] == 1 and m["rollout_corr/mismatch_k3"] == 0


def test_sums_of_two_ranks_give_the_one_process_metrics():
    old = torch.randn(4, 5)
    engine = old + 0.3 * torch.randn(4, 5)
    mask = torch.rand(4, 5) > 0.2
    whole = rollout_correction(old, engine, mask, "sequence-truncate", upper=1.5)
    parts = [rollout_correction(old[s], engine[s], mask[s], "sequence-truncate", upper=1.5)
             for s in (slice(0, 1), slice(1, 4))]
    a, b = correction_metrics(whole.sums), correction_metrics(merge_sums([p.sums for p in parts]))
    assert a == pytest.approx(b)


class _OneRank:
    def gather(self, obj):
        return [obj]


def _rollouts(engine_logp):
    from explorl.rollout.types import Rollouts

    old, engine, mask = example()
    return Rollouts(prompt_ids=torch.zeros(1, 1, dtype=torch.long), prompt_mask=mask[:, :1],
                    response_ids=torch.zeros(1, 3, dtype=torch.long), response_mask=mask,
                    old_logp=old, entropy=torch.zeros(1, 3), prompt_index=torch.zeros(1),
                    texts=[""], engine_logp=engine if engine_logp else None)


def test_auto_is_token_truncate_with_engine_logprobs_and_off_without():
    assert resolve_mode("auto", _rollouts(True)) == "token-truncate"
    assert resolve_mode("auto", _rollouts(False)) == "off"
    with pytest.raises(ConfigError, match="algorithm.rollout_correction.mode"):
        resolve_mode("token-mask", _rollouts(False))


def test_step_correction_denominators_leave_out_dropped_tokens():
    from explorl.config import RolloutCorrectionConfig

    rc = RolloutCorrectionConfig(mode="token-mask", upper=2.0)
    sc = step_correction(rc, _rollouts(True), torch.tensor([0]), 1, _OneRank())
    d = sc.denominators(torch.tensor([0]))
    assert int(d["token_denom"]) == 2 and d["seq_denom"] == 1
    assert sc.metrics["rollout_corr/masked_token_frac"] == pytest.approx(1 / 3)
    assert step_correction(RolloutCorrectionConfig(mode="off"), _rollouts(True),
                           torch.tensor([0]), 1, _OneRank()) is None


def _mismatched_trainer(make_config, tmp_path, name, shift, correction):
    """A 1-step trainer whose scripted engine reports log-probs ``shift`` below the trainer's
    (ℓ = shift on every token)."""
    import dataclasses

    from explorl import models
    from explorl.rollout.fake import FakeEngine
    from explorl.training.loop import Trainer

    cfg = make_config({"max_steps": 1, "eval": {"every": 0},
                       "rollout": {"engine": "vllm"},
                       "algorithm": {"rollout_correction": correction}})
    truths = {}

    class Mismatched(FakeEngine):
        def generate(self, *args, **kwargs):
            ro = super().generate(*args, **kwargs)
            return dataclasses.replace(ro, engine_logp=ro.old_logp - shift)

    # sample 0 right, the others wrong and longer: a non-zero token-mean policy loss
    tok = models.load_tokenizer(models.resolve_model_path(cfg.model.path, cfg.lab), cfg.model)
    engine = Mismatched(tok, lambda p, j: truths[tuple(p)] + ("" if j == 0 else "99"))
    t = Trainer(cfg, tmp_path / name, engine=engine)  # an engine given: none is built
    truths.update({tuple(t.prompts.ids_of(t.train_data, "train")(i)): r.ground_truth
                   for i, r in enumerate(t.train_data)})
    return t


def test_the_weights_reach_the_policy_loss_and_not_the_rest(make_config, tmp_path):
    c = 1.5  # every token's weight (< upper = 2: no truncation)
    off = _mismatched_trainer(make_config, tmp_path, "off", math.log(c), {"mode": "off"})
    m_off = off.train_step()
    on = _mismatched_trainer(make_config, tmp_path, "on", math.log(c), {"mode": "auto"})
    m_on = on.train_step()
    assert abs(m_off["loss/policy"]) > 1e-4
    assert m_on["loss/policy"] == pytest.approx(c * m_off["loss/policy"], rel=1e-5)
    assert m_on["rollout_corr/weight_mean"] == pytest.approx(c, rel=1e-5)
    assert m_on["rollout_corr/mismatch_k1"] == pytest.approx(-math.log(c), rel=1e-5)
    assert m_on["rollout_corr/ess"] == pytest.approx(1.0)
    assert "rollout_corr/weight_mean" not in m_off
    # a sequence mask whose upper bound every response exceeds: nothing left in the policy loss
    drop = _mismatched_trainer(make_config, tmp_path, "drop", math.log(c),
                               {"mode": "sequence-mask", "upper": 1.2})
    m = drop.train_step()
    assert m["rollout_corr/masked_seq_frac"] == 1.0 and m["loss/policy"] == 0.0


def test_an_explicit_correction_needs_an_engine_with_its_own_logprobs(make_config):
    with pytest.raises(ConfigError, match="algorithm.rollout_correction.mode.*hf"):
        make_config({"algorithm": {"rollout_correction": {"mode": "token-mask"}}})


def test_a_lower_bound_without_a_mask_mode_is_refused(make_config):
    with pytest.raises(ConfigError, match="algorithm.rollout_correction.lower"):
        make_config({"rollout": {"engine": "vllm"},
                     "algorithm": {"rollout_correction": {"lower": 0.5}}})

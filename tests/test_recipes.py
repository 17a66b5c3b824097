"""Every built-in recipe trains for two steps (math recipes with the lab swapped in)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY_LAB_CONFIG

from explorl import config as C
from explorl import validation
from explorl.config import builtin
from explorl.outputs.runlog import read_metrics
from explorl.training.loop import Trainer

ROOT = builtin.folder("recipe")
# lab/tools.yaml, lab/arpo.yaml, lab/aepo.yaml and real/tools.yaml need a tool task's model (its
# alphabet has the call markers): they train in tests/test_tools.py, tests/test_arpo.py and
# tests/test_aepo.py.
TOOL_RECIPES = ("lab/tools.yaml", "lab/arpo.yaml", "lab/aepo.yaml", "real/tools.yaml")
RECIPES = sorted(p for p in ROOT.rglob("*.yaml") if "accelerate" not in p.parts
                 and p.relative_to(ROOT).as_posix() not in TOOL_RECIPES)


def _lab_sized(recipe: Path, model_dir: Path) -> C.RunConfig:
    """The recipe with the tiny lab model and data, 2 steps, small batches; methods untouched."""
    cfg = validation.load(recipe, env=False)  # recipes/math/ hold placeholder paths, swapped below
    d = C.to_dict(cfg)
    d["max_steps"] = 2
    d["model"]["path"] = str(model_dir)
    d["lab"].update(TINY_LAB_CONFIG)
    d["data"].update(train=["lab:addition"], val=[], prompts_per_step=4,
                     anneal=["lab:addition"] if d["data"]["anneal"] else [])
    d["rollout"].update(max_response_len=6, batch_size=64)
    d["reward"].update(
        verifier="auto", num_workers=1, overlong_buffer=min(d["reward"]["overlong_buffer"], 2)
    )
    d["eval"].update(every=2, n_samples=2, k=[1, 2], max_problems=4)
    d["log"].update(progress=False, plots=False, checkpoint_every=0)
    if d["control"]["curriculum"]["enabled"]:
        d["control"]["curriculum"].update(start_ratio=0.5, max_response_len=8)
    return validation.from_dict(d)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_recipe_trains_two_steps(recipe, tiny_model, tmp_path):
    cfg = _lab_sized(recipe, tiny_model)
    Trainer(cfg, tmp_path / "run").train()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]  # 0: the pre-RL validation
    last = rows[-1]
    assert "val/accuracy" in last
    ctl = cfg.control
    if cfg.algorithm.loss in ("clip_cov", "kl_cov"):
        assert "loss/cov_selected_frac" in last
    if ctl.temperature.enabled:
        assert "control/temperature_next" in last
    if ctl.budget.enabled:
        assert "rollout/budget_min" in last
    if ctl.eepo.enabled:
        assert "entropy/stage1" in last and "entropy/stage2" in last
    if ctl.adaptive.enabled:
        assert "control/tracking_error" in last
    if ctl.curriculum.enabled:
        assert last["control/curriculum_phase"] == 1.0
    if cfg.algorithm.kl_coef > 0:
        assert "kl/ref_mean" in last
    a = cfg.algorithm
    if a.loss in ("gspo", "luspo"):
        assert "loss/seq_log_ratio_abs_mean" in last
    if a.loss == "sapo":
        assert 0 < last["loss/sapo_gate_mean"] <= 1
    if a.loss == "vespo":
        assert last["loss/vespo_phi_mean"] > 0
    if a.loss == "cispo":
        assert "loss/cispo_masked_frac" in last
    if a.entropy_mask_ratio:
        assert 0 < last["entropy/mask_kept_frac"] <= 1
    if a.entropy_shaping_alpha > 0:
        assert "adv/entropy_shaping_mean" in last
    if ctl.entropic.enabled:
        assert "control/pos_neg_weight" in last and "loss/entropic_confident_frac" in last
    if ctl.entropy_coef.enabled:
        assert "control/entropy_coef_next" in last


def test_display_names_a_builtin_by_name_and_a_file_by_its_relative_path(tmp_path, monkeypatch):
    assert builtin.display(builtin.resolve("subset_sum_v3", "study"), "study") == "subset_sum_v3"
    assert builtin.display(builtin.resolve("lab/grpo"), "recipe") == "lab/grpo"
    spec = tmp_path / "specs" / "mine.yaml"
    spec.parent.mkdir()
    spec.write_text("name: mine\n")
    monkeypatch.chdir(tmp_path)
    assert builtin.display(spec, "study") == "specs/mine.yaml"
    monkeypatch.chdir(spec.parent.parent.parent)
    assert builtin.display(spec, "study") == f"{tmp_path.name}/specs/mine.yaml"
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)  # not under the working directory: the whole path
    assert builtin.display(spec, "study") == str(spec.resolve())


@pytest.mark.parametrize("loss,agg", [("luspo", "seq-mean-token-sum"),
                                      ("sapo", "seq-mean-token-mean"), ("ppo", "token-mean")])
def test_naming_a_loss_on_the_quickstart_trains_with_its_own_aggregation(loss, agg, tiny_model,
                                                                         tmp_path):
    """``--set algorithm.loss=<name>`` with ``agg`` left unset: the loss's own aggregation."""
    from explorl.algorithms import LossParams
    from explorl.control.base import Knobs

    cfg = validation.load(ROOT / "quickstart.yaml", [f"algorithm.loss={loss}"], env=False)
    assert cfg.algorithm.agg is None
    cfg = _lab_sized(ROOT / "quickstart.yaml", tiny_model)
    cfg.algorithm.loss = loss
    cfg = validation.from_dict(C.to_dict(cfg))
    knobs = Knobs(temperature=1.0, eps_high=0.2, entropy_coef=0.0, kl_coef=0.0, n_samples=4,
                  max_response_len=6)
    assert LossParams.build(cfg.algorithm, knobs).agg == agg
    Trainer(cfg, tmp_path / "run").train()
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2]


def test_an_aggregation_the_loss_cannot_take_is_refused_with_its_key_path():
    with pytest.raises(C.ConfigError, match=r"^algorithm\.agg: loss 'luspo' needs agg "
                                            r"'seq-mean-token-sum', got 'token-mean'"):
        validation.load(ROOT / "quickstart.yaml",
                        ["algorithm.loss=luspo", "algorithm.agg=token-mean"], env=False)
    cfg = validation.load(ROOT / "quickstart.yaml",
                          ["algorithm.loss=sapo", "algorithm.agg=token-mean"], env=False)
    assert cfg.algorithm.agg == "token-mean"  # SAPO takes any aggregation the recipe names

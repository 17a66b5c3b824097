"""Issue 17's NaN run: a step whose loss, gradient or rewards are not finite leaves the weights
untouched, is counted, and after ``optim.max_bad_steps`` in a row the run stops with exit 2."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from explorl import config as C
from explorl.cli import main
from explorl.outputs.checkpoint import list_checkpoints
from explorl.outputs.runlog import read_metrics
from explorl.training.loop import Trainer


def _recipe(tmp_path, cfg) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(C.to_dict(cfg)))
    return str(path)


def test_a_nan_reward_skips_the_update_and_three_in_a_row_stop_the_run(
    make_config, tmp_path, capsys
):
    cfg = make_config({"max_steps": 6, "eval": {"every": 0}, "log": {"checkpoint_every": 1},
                       "reward": {"num_workers": 0},
                       "optim": {"max_bad_steps": 3, "max_bad_frac": 1.0}})
    out = tmp_path / "run"
    t = Trainer(cfg, out)
    t.train_step()  # step 1: fine
    t.save()
    before = {n: p.detach().clone() for n, p in t.policy.named_parameters()}
    real = t.update.run

    def poisoned(ro, adv, knobs, sb):  # a NaN advantage: the loss and every gradient turn NaN
        return real(ro, adv * float("nan"), knobs, sb)

    t.update.run = poisoned
    m = t.train_step()  # step 2: skipped
    assert m["train/nonfinite_updates"] >= 1 and m["train/optimizer_steps"] == 0
    assert m["train/skipped_steps"] == 1 and math.isnan(m["grad/norm"])
    assert all(torch.equal(before[n], p) for n, p in t.policy.named_parameters())
    t.train_step()  # step 3: skipped
    with pytest.raises(Exception, match=r"step 4: 3 consecutive steps with a non-finite"):
        t.train_step()
    assert all(torch.equal(before[n], p) for n, p in t.policy.named_parameters())
    t.pool.close()


def test_a_good_step_resets_the_count(make_config, tmp_path):
    cfg = make_config({"max_steps": 6, "eval": {"every": 0},
                       "optim": {"max_bad_steps": 2, "max_bad_frac": 1.0}})
    t = Trainer(cfg, tmp_path / "run")
    real = t.update.run
    poison = iter([True, False, True, False])
    t.update.run = lambda ro, adv, k, sb: real(
        ro, adv * float("nan") if next(poison) else adv, k, sb
    )
    for _ in range(4):
        m = t.train_step()
    assert m["train/skipped_steps"] == 2  # never two in a row: the run goes on
    t.pool.close()


def test_exploding_lr_run_exits_2_names_the_step_and_keeps_a_finite_checkpoint(
    make_config, tmp_path, capsys
):
    cfg = make_config({"max_steps": 12, "eval": {"every": 0}, "log": {"checkpoint_every": 1},
                       "optim": {"lr": 1e6, "max_grad_norm": 0.0, "max_bad_steps": 2,
                                 "max_bad_frac": 1.0}})
    out = tmp_path / "run"
    code = main(["train", _recipe(tmp_path, cfg), "--out", str(out)])
    err = capsys.readouterr().err
    if code == 0:  # the tiny model survived: nothing to check (the poisoned tests above cover it)
        pytest.skip("lr 1e6 did not diverge on this model")
    assert code == 2 and "Traceback" not in err
    assert "consecutive steps with a non-finite" in err or "not finite" in err
    for ckpt in list_checkpoints(out):
        from safetensors.torch import load_file
        weights = load_file(ckpt / "model.safetensors")
        assert all(bool(torch.isfinite(w).all()) for w in weights.values()), ckpt
    assert read_metrics(out)  # the rows before the stop are kept

"""plot_training_curves: which PNGs appear for which logged keys; robust to sparse runs."""

import json

from explorl.plots import plot_training_curves

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(path, records, name="grpo", seed=0):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"name: {name}\nseed: {seed}\nmax_steps: 10\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def full_record(step):
    rec = {
        "step": step, "reward/mean": 0.1 * step, "reward/std": 0.05, "entropy/mean": 1.0 / step,
        "entropy/stage1": 1.1 / step, "entropy/stage2": 0.9 / step,
        "control/temperature": 1.0 + 0.01 * step, "control/eps_high": 0.28,
        "control/target_entropy": 0.5, "time/step_s": 1.0,
    }
    if step % 5 == 0:
        rec.update({"val/accuracy": 0.5, "val/greedy_accuracy": 0.6, "val/pass@1": 0.5,
                    "val/pass@8": 0.9, "val/entropy": 0.4})
    return rec


def names(paths):
    return sorted(p.name for p in paths)


def test_all_figures_for_a_full_run(tmp_path):
    run = write_run(tmp_path / "run", [full_record(s) for s in range(1, 21)])
    paths = plot_training_curves(run)
    assert names(paths) == ["control.png", "entropy.png", "reward.png", "validation.png"]
    for p in paths:
        assert p.parent == run / "plots" and p.read_bytes()[:8] == PNG
    # redrawing (the trainer calls it at every validation) overwrites in place
    assert names(plot_training_curves(run)) == names(paths)


def test_missing_keys_give_fewer_figures(tmp_path):
    recs = [{"step": s, "reward/mean": 0.1 * s, "entropy/mean": 1.0} for s in range(1, 6)]
    recs[2].pop("entropy/mean")  # a key missing at one step
    run = write_run(tmp_path / "run", recs)
    assert names(plot_training_curves(run)) == ["entropy.png", "reward.png"]


def test_control_figure_only_with_a_controlled_knob(tmp_path):
    recs = [{"step": s, "entropy/mean": 1.0, "control/target_entropy": 0.8} for s in range(1, 4)]
    run = write_run(tmp_path / "run", recs)
    assert names(plot_training_curves(run)) == ["control.png", "entropy.png"]


def test_single_step_and_empty_runs(tmp_path):
    one = write_run(tmp_path / "one", [full_record(5)])
    assert len(plot_training_curves(one)) == 4
    empty = write_run(tmp_path / "empty", [])
    assert plot_training_curves(empty) == []
    nothing = tmp_path / "no_metrics"
    nothing.mkdir()
    assert plot_training_curves(nothing) == []

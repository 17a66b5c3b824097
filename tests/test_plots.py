"""plot_training_curves: which PNGs appear for which logged keys; robust to sparse runs."""

import json

from explorl.analysis.plots import plot_training_curves

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


def test_no_control_figure_when_every_knob_stayed_put(tmp_path):
    """Every step logs the knobs it used; a run without controllers keeps them constant."""
    recs = [{"step": s, "entropy/mean": 1.0, "control/temperature": 1.0, "control/eps_high": 0.2,
             "control/entropy_coef": 0.0, "control/kl_coef": 0.0} for s in range(1, 6)]
    run = write_run(tmp_path / "run", recs)
    (run / "plots").mkdir()
    (run / "plots" / "control.png").write_bytes(b"stale")  # drawn before a resume changed it
    assert names(plot_training_curves(run)) == ["entropy.png"]
    assert not (run / "plots" / "control.png").exists()


def test_update_and_response_figures(tmp_path):
    recs = [{"step": s, "grad/norm": 2.0 + s, "loss/clip_frac": 0.01, "response/length_mean": 3.0,
             "response/length_max": 5.0, "response/truncated_frac": 0.0} for s in range(1, 6)]
    run = write_run(tmp_path / "run", recs)
    assert names(plot_training_curves(run)) == ["responses.png", "update.png"]


def test_fraction_panels_keep_their_axis_within_zero_and_one(tmp_path, monkeypatch):
    """A flat-zero truncated fraction is drawn from 0 up (matplotlib alone shows −0.05..0.05);
    the gradient norm, unbounded, keeps matplotlib's limits."""
    import explorl.analysis.plots as plots

    limits, save = {}, plots.save_figure

    def keep(fig, path):
        limits[path.stem] = [ax.get_ylim() for ax in fig.axes]
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    recs = [{"step": s, "grad/norm": 0.0, "loss/clip_frac": 0.0, "response/length_mean": 3.0,
             "response/length_max": 5.0, "response/truncated_frac": 0.0} for s in range(1, 6)]
    plot_training_curves(write_run(tmp_path / "run", recs))
    (g_lo, _), (c_lo, c_hi) = limits["update"]
    (_, _), (t_lo, t_hi) = limits["responses"]
    assert (c_lo, t_lo) == (0.0, 0.0) and c_hi <= 1.0 and t_hi <= 1.0
    assert g_lo < 0.0


def test_step_axes_integer_ticks_and_no_offset():
    from explorl.analysis.runs import new_figure, step_axes

    def drawn(style: bool):
        fig, axes = new_figure()
        ax = axes[0][0]
        ax.plot([1, 2, 3, 4], [6.9171, 6.9172, 6.9174, 6.9173])
        if style:
            step_axes(ax)
        fig.canvas.draw()
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        return ticks, ax.yaxis.get_offset_text().get_text()

    ticks, offset = drawn(style=False)
    assert any(t != int(t) for t in ticks) and offset  # matplotlib's defaults: 1.5, "+6.917"
    ticks, offset = drawn(style=True)
    assert ticks and all(t == int(t) for t in ticks) and offset == ""


def test_metric_ranges_and_clipped_bands():
    from explorl.analysis.runs import clip_band, metric_range

    assert metric_range("reward/mean", {"reward": {"convention": "binary"}}) == (0.0, 1.0)
    assert metric_range("reward/mean", {"reward": {"convention": "signed"}}) == (-1.0, 1.0)
    shaped = {"reward": {"convention": "binary", "overlong_buffer": 4, "overlong_penalty": 0.5}}
    assert metric_range("reward/mean", shaped) == (-0.5, 1.0)
    for key in ("val/accuracy", "val/pass@16", "loss/clip_frac", "response/truncated_frac",
                "val/greedy_accuracy", "reward/accuracy"):
        assert metric_range(key) == (0.0, 1.0)
    assert metric_range("grad/norm") is None and metric_range("entropy/mean") is None
    # a {0, 1} reward with mean 0.2 and std 0.4: mean ± std = [−0.2, 0.6] → [0, 0.6]
    assert clip_band([-0.2, 0.5], [0.6, 1.3], (0.0, 1.0)) == ([0.0, 0.5], [0.6, 1.0])
    assert clip_band([-0.2], [0.6], None) == ([-0.2], [0.6])


def test_single_step_and_empty_runs(tmp_path):
    one = write_run(tmp_path / "one", [full_record(5)])
    assert len(plot_training_curves(one)) == 4
    empty = write_run(tmp_path / "empty", [])
    assert plot_training_curves(empty) == []
    nothing = tmp_path / "no_metrics"
    nothing.mkdir()
    assert plot_training_curves(nothing) == []

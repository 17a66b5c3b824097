"""Training curves of one run as PNGs under ``run_dir/plots/`` (redrawn at every validation).

Each figure is drawn only when at least one of its metrics was logged, so a recipe without
controllers simply gets no ``control.png``. Figures use the Agg canvas directly (no pyplot),
which keeps repeated redraws inside a long training process fast and leak-free.
"""

from __future__ import annotations

from pathlib import Path

from explorl.analysis.runs import Run, load_run, new_figure, save_figure

STEP_LABEL = "training step"
ENTROPY_LABEL = "mean token entropy (nats)"


def _line(ax, run: Run, key: str, label: str, **kw) -> bool:
    """Plot ``key`` of ``run`` against step; False (nothing drawn) when it was never logged."""
    steps, values = run.series(key)
    if not steps:
        return False
    if len(steps) == 1 or key.startswith("val/"):  # sparse series: make each point visible
        kw.setdefault("marker", "o")
        kw.setdefault("markersize", 4)
    ax.plot(steps, values, label=label, **kw)
    return True


def _finish(ax, title: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _reward(run: Run, path: Path) -> Path | None:
    fig, axes = new_figure()
    ax = axes[0][0]
    if not _line(ax, run, "reward/mean", "mean reward", color="C0"):
        return None
    mean = dict(zip(*run.series("reward/mean")))
    std_steps, std = run.series("reward/std")
    pts = [(s, mean[s], d) for s, d in zip(std_steps, std) if s in mean]
    if pts:
        s, m, d = zip(*pts)
        ax.fill_between(s, [a - b for a, b in zip(m, d)], [a + b for a, b in zip(m, d)],
                        color="C0", alpha=0.15, label="± std over responses")
    _finish(ax, f"Reward — {run.label}", "reward")
    return save_figure(fig, path)


def _entropy(run: Run, path: Path) -> Path | None:
    fig, axes = new_figure()
    ax = axes[0][0]
    drawn = [
        _line(ax, run, "entropy/mean", "all responses", color="C0"),
        _line(ax, run, "entropy/stage1", "EEPO stage 1", color="C1", linestyle="--"),
        _line(ax, run, "entropy/stage2", "EEPO stage 2", color="C2", linestyle=":"),
        _line(ax, run, "val/entropy", "validation", color="C3"),
    ]
    if not any(drawn):
        return None
    _finish(ax, f"Policy entropy — {run.label}", ENTROPY_LABEL)
    return save_figure(fig, path)


def _validation(run: Run, path: Path) -> Path | None:
    fig, axes = new_figure()
    ax = axes[0][0]
    drawn = [
        _line(ax, run, "val/accuracy", "accuracy (sampled)", color="C0"),
        _line(ax, run, "val/greedy_accuracy", "accuracy (greedy)", color="C1", linestyle="--"),
    ]
    for i, key in enumerate(run.passk_keys()):
        if key == "val/pass@1" and run.series("val/accuracy")[0]:
            continue  # pass@1 is the sampled accuracy; drawing it twice hides nothing new
        drawn.append(_line(ax, run, key, key.removeprefix("val/"), color=f"C{2 + i}", linestyle=":"))
    if not any(drawn):
        return None
    _finish(ax, f"Validation — {run.label}", "score")
    return save_figure(fig, path)


def _control(run: Run, path: Path) -> Path | None:
    panels = [
        ("Sampling temperature", "temperature T", [("control/temperature", "temperature", {})]),
        ("Clip-higher", "eps_high", [("control/eps_high", "eps_high", {})]),
        ("Target entropy vs entropy", ENTROPY_LABEL,
         [("control/target_entropy", "target", {"linestyle": "--"}),
          ("entropy/mean", "measured", {})]),
    ]
    keys = run.keys()
    # a panel is drawn when its first (controlled) key was logged
    panels = [p for p in panels if p[2][0][0] in keys and run.series(p[2][0][0])[0]]
    if not panels:
        return None
    fig, axes = new_figure(nrows=len(panels), height=2.8, suptitle=True)
    for ax, (title, ylabel, lines) in zip(axes[:, 0], panels):
        for i, (key, label, kw) in enumerate(lines):
            _line(ax, run, key, label, color=f"C{i}", **kw)
        _finish(ax, title, ylabel)
    fig.suptitle(f"Exploration controls — {run.label}")
    return save_figure(fig, path)


def plot_training_curves(run_dir: str | Path) -> list[Path]:
    """Write reward, entropy, validation and control PNGs into ``run_dir/plots/``; return them."""
    run = load_run(run_dir)
    out = Path(run_dir) / "plots"
    written = []
    for name, draw in (("reward", _reward), ("entropy", _entropy),
                       ("validation", _validation), ("control", _control)):
        path = draw(run, out / f"{name}.png")
        if path is not None:
            written.append(path)
    return written


def plot_run_safely(run_dir) -> None:
    """``plot_training_curves``, warning instead of raising: plots must never cost a training run."""
    try:
        plot_training_curves(run_dir)
    except Exception as e:  # noqa: BLE001
        print(f"warning: plotting failed: {e}")

"""Training curves of one run as PNGs under ``run_dir/plots/`` (redrawn at every validation).

Each figure, and each panel of a multi-panel figure, is drawn only when its metrics were
logged, and a knob's panel only when the knob moved: a recipe without controllers gets no
``control.png``. Steps are integers on every x axis, bands stay inside the metric's range, and
tick labels carry their full values (no offset). Figures use the Agg canvas directly (no
pyplot), which keeps repeated redraws inside a long training process fast and leak-free.
"""

from __future__ import annotations

from pathlib import Path

from explorl.analysis.runs import (
    Run,
    bound_axis,
    clip_band,
    load_run,
    metric_range,
    new_figure,
    save_figure,
    step_axes,
)

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


def _finish(ax, title: str, ylabel: str, legend: bool = True) -> None:
    ax.set_title(title)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    step_axes(ax)
    if legend:
        ax.legend(fontsize="small")


def _reward(run: Run, path: Path) -> Path | None:
    fig, axes = new_figure()
    ax = axes[0][0]
    if not _line(ax, run, "reward/mean", "mean reward", color="C0"):
        return None
    mean = dict(zip(*run.series("reward/mean")))
    std, n = dict(zip(*run.series("reward/std"))), dict(zip(*run.series("rollout/n_trained")))
    # standard error of the mean from the population std: std · sqrt(n / (n − 1)) / sqrt(n)
    pts = [
        (s, m, std[s] / (n[s] - 1) ** 0.5) for s, m in mean.items() if s in std and n.get(s, 0) > 1
    ]
    if pts:
        # The spread of {0, 1} rewards is always ~0.5 and says nothing about the step; the
        # standard error says how far the step's mean could move by chance. Cut at the
        # rewards' own range, like every band.
        s, m, se = zip(*pts)
        lo, hi = clip_band([a - b for a, b in zip(m, se)], [a + b for a, b in zip(m, se)],
                           metric_range("reward/mean", run.config))
        ax.fill_between(s, lo, hi, color="C0", alpha=0.2, linewidth=0,
                        label="± standard error of the step's mean")
    acc = dict(zip(*run.series("reward/accuracy")))
    if any(abs(acc[s] - m) > 1e-9 for s, m in mean.items() if s in acc):  # ±1 rewards, shaping
        _line(ax, run, "reward/accuracy", "verifier accuracy", color="C1", linestyle="--")
    _finish(ax, f"Training reward — {run.label}", "reward")
    return save_figure(fig, path)


def _entropy(run: Run, path: Path) -> Path | None:
    fig, axes = new_figure()
    ax = axes[0][0]
    eepo = bool(run.series("entropy/stage1")[0])
    drawn = [
        _line(ax, run, "entropy/mean", "training responses", color="C0"),
        _line(ax, run, "entropy/stage1", "EEPO stage 1", color="C1", linestyle="--"),
        _line(ax, run, "entropy/stage2", "EEPO stage 2", color="C2", linestyle=":"),
        _line(ax, run, "val/entropy", "validation samples", color="C3"),
    ]
    if not any(drawn):
        return None
    title = "Policy entropy" + (" (EEPO: stage 1 / stage 2 sampling)" if eepo else "")
    _finish(ax, f"{title} — {run.label}", ENTROPY_LABEL)
    return save_figure(fig, path)


def _validation(run: Run, path: Path) -> Path | None:
    fig, axes = new_figure()
    ax = axes[0][0]
    drawn = [
        _line(ax, run, "val/accuracy", "accuracy (sampled) = pass@1", color="C0"),
        _line(ax, run, "val/greedy_accuracy", "accuracy (greedy)", color="C1", linestyle="--"),
    ]
    for i, key in enumerate(run.passk_keys()):
        if key == "val/pass@1" and run.series("val/accuracy")[0]:
            continue  # pass@1 is the sampled accuracy; drawing it twice hides nothing new
        drawn.append(
            _line(ax, run, key, key.removeprefix("val/"), color=f"C{2 + i}", linestyle=":")
        )
    if not any(drawn):
        return None
    first = run.series("val/accuracy")[0]
    note = " (step 0 = before training)" if first and first[0] == 0 else ""
    _finish(ax, f"Validation{note} — {run.label}", "score")
    return save_figure(fig, path)


def _panels(run: Run, path: Path, title: str, panels: list[tuple]) -> Path | None:
    """A column of panels ``(title, ylabel, [(key, label, line kwargs), ...][, (y, label)])``,
    the optional last item a horizontal reference line (a limit from the config). A panel is
    kept when its first key was logged; None when none is."""
    panels = [p for p in panels if run.series(p[2][0][0])[0]]
    if not panels:
        return None
    fig, axes = new_figure(nrows=len(panels), height=2.8, suptitle=True)
    for ax, (sub, ylabel, lines, *ref) in zip(axes[:, 0], panels):
        for i, (key, label, kw) in enumerate(lines):
            _line(ax, run, key, label, **{"color": f"C{i}", **kw})
        if ref and ref[0] is not None:
            ax.axhline(ref[0][0], color="0.4", linestyle=":", linewidth=1, label=ref[0][1])
        bound_axis(ax, metric_range(lines[0][0], run.config))
        _finish(ax, sub, ylabel, legend=len(lines) > 1 or bool(ref and ref[0]))
    fig.suptitle(f"{title} — {run.label}")
    return save_figure(fig, path)


def _control(run: Run, path: Path) -> Path | None:
    """One panel per knob a controller moved, and the entropy target a controller tracked."""
    knobs = [
        ("control/temperature", "Sampling temperature", "temperature T"),
        ("control/eps_high", "Clip-higher eps_high", "eps_high"),
        ("control/entropy_coef", "Entropy-bonus coefficient", "entropy_coef"),
        ("control/kl_coef", "Reference-KL coefficient", "kl_coef"),
    ]
    panels = [(title, ylabel, [(key, key.removeprefix("control/"), {})])
              for key, title, ylabel in knobs if run.moved(key)]
    if run.series("control/target_entropy")[0]:
        panels.append(("Target entropy vs entropy", ENTROPY_LABEL,
                       [("control/target_entropy", "target", {"linestyle": "--"}),
                        ("entropy/mean", "measured", {})]))
    if run.moved("rollout/budget_max") or run.moved("rollout/budget_min"):
        panels.append(("Rollout budget per prompt", "samples per prompt",
                       [("rollout/budget_max", "largest", {}),
                        ("rollout/budget_min", "smallest", {"linestyle": "--"})]))
    return _panels(run, path, "Exploration controls", panels)


def _update(run: Run, path: Path) -> Path | None:
    """The policy update: gradient norm and the fraction of tokens the PPO clip held."""
    clip = (run.config.get("optim") or {}).get("max_grad_norm")
    return _panels(run, path, "Policy update", [
        ("Gradient norm (before clipping)", "global L2 norm", [("grad/norm", "grad norm", {})],
         (clip, f"clipped to {clip:g} (optim.max_grad_norm)") if clip else None),
        ("PPO clip fraction", "fraction of tokens", [("loss/clip_frac", "clip fraction", {})]),
    ])


def _responses(run: Run, path: Path) -> Path | None:
    """Response lengths and the fraction cut at ``max_response_len``."""
    limit = (run.config.get("rollout") or {}).get("max_response_len")
    return _panels(
        run,
        path,
        "Responses",
        [
            (
                "Response length",
                "tokens",
                [
                    ("response/length_mean", "mean", {}),
                    ("response/length_max", "max", {"linestyle": "--"}),
                ],
                (limit, "rollout.max_response_len") if limit else None,
            ),
            (
                "Truncated responses (no EOS before the length limit)",
                "fraction of responses",
                [("response/truncated_frac", "truncated", {})],
            ),
        ],
    )


FIGURES = {
    "reward": _reward,
    "entropy": _entropy,
    "validation": _validation,
    "control": _control,
    "update": _update,
    "responses": _responses,
}
"""``plots/<name>.png`` → the function drawing it (None when the run logged nothing for it)."""


def plot_training_curves(run_dir: str | Path) -> list[Path]:
    """Write the figures of ``FIGURES`` that have data into ``run_dir/plots/``; return them.
    A figure that no longer applies (e.g. after a config change on resume) is removed."""
    run = load_run(run_dir)
    out = Path(run_dir) / "plots"
    written = []
    for name, draw in FIGURES.items():
        path = draw(run, out / f"{name}.png")
        if path is not None:
            written.append(path)
        elif (out / f"{name}.png").exists():
            (out / f"{name}.png").unlink()
    return written


def plot_run_safely(run_dir) -> None:
    """``plot_training_curves``, warning instead of raising: plots must never cost a training
    run."""
    try:
        plot_training_curves(run_dir)
    except Exception as e:  # noqa: BLE001
        print(f"warning: plotting failed: {e}")

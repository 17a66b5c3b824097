"""The entropy–performance law R = −a·exp(H) + b (Cui et al. 2025, "The Entropy Mechanism", Eq. 6).

Given x = exp(H) the law is linear in (a, b), so the fit is ordinary least squares in closed
form — no optimiser, no initial guess. b − a is the predicted accuracy once entropy reaches 0
(the "ceiling"). With ``fit_fraction < 1`` the law is fitted on the first part of the run
and predicts the rest, as the paper does with its first 36 steps (§2.4), and the RMSE of that
prediction is reported. Accuracy keeps the units it was given (fractions in [0, 1] for
explorl's ``val/accuracy``; the paper's RMSE figures are in percentage points).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from explorl.analysis.runs import Run, load_run, new_figure, save_figure
from explorl.errors import ExplorlError

MIN_POINTS = 3  # two coefficients: two points always fit exactly, so r2 would mean nothing
ENTROPY_KEY = "entropy/mean"
ACCURACY_KEY = "val/accuracy"


class FitError(ExplorlError, ValueError):
    """The entropy–performance law cannot be fitted (too few points, no entropy spread)."""


@dataclass
class EntropyLawFit:
    """Coefficients of R = −a·exp(H) + b, fitted on the first ``n_fit`` of ``n_total`` points."""

    a: float
    b: float
    r2: float  # coefficient of determination on the fitted points (1.0 if accuracy is flat)
    ceiling: float  # b − a: predicted accuracy at H = 0
    n_fit: int
    n_total: int
    fit_fraction: float
    entropy: list[float]  # all points, in run order (first n_fit are the fitted ones)
    accuracy: list[float]
    steps: list[int] | None = None  # training step of each point, when known
    heldout_predictions: list[float] = field(default_factory=list)  # for points n_fit..n_total
    rmse: float | None = None  # RMSE of heldout_predictions (None without held-out points)
    run: str | None = None

    def predict(self, entropy: float) -> float:
        """Predicted validation accuracy at mean token entropy ``entropy`` (nats)."""
        return -self.a * math.exp(entropy) + self.b

    def formula(self, fmt: str = ".3g", exp: str = "exp(H)") -> str:
        """The fitted law as text with its signs resolved: ``R = −0.35·exp(H) − 0.05`` for
        a = 0.35, b = −0.05, and ``R = 0.2·exp(H) + 0.6`` for a = −0.2 (an increasing law)."""
        slope = f"{'−' if self.a > 0 else ''}{abs(self.a):{fmt}}·{exp}"
        return f"R = {slope} {'−' if self.b < 0 else '+'} {abs(self.b):{fmt}}"

    def to_dict(self) -> dict:
        return asdict(self)


def fit_entropy_law(
    entropy: Sequence[float],
    accuracy: Sequence[float],
    fit_fraction: float = 1.0,
    *,
    steps: Sequence[int] | None = None,
    run: str | None = None,
) -> EntropyLawFit:
    """Least-squares fit of R = −a·exp(H) + b (Entropy Mechanism Eq. 6) on the first points.

    The first ``floor(fit_fraction · n)`` points (in the given, i.e. training, order) are
    fitted; the rest are predicted and scored by RMSE. Raises ``FitError`` with fewer than
    3 fitted points or when all fitted entropies are equal.
    """
    if len(entropy) != len(accuracy):
        raise ValueError(f"got {len(entropy)} entropies but {len(accuracy)} accuracies")
    if steps is not None and len(steps) != len(entropy):
        raise ValueError(f"got {len(steps)} steps for {len(entropy)} points")
    if not 0.0 < fit_fraction <= 1.0:
        raise ValueError(f"fit_fraction must be in (0, 1], got {fit_fraction}")
    H = [float(h) for h in entropy]
    R = [float(r) for r in accuracy]
    if not all(math.isfinite(v) for v in H + R):
        raise ValueError("entropy and accuracy must be finite numbers")
    who = f"run {run}" if run else "the data"
    n_total = len(H)
    # the epsilon keeps e.g. 0.29·100 = 28.999… from losing a point to float rounding
    n_fit = math.floor(fit_fraction * n_total + 1e-9)
    if n_total < MIN_POINTS:
        raise FitError(
            f"{who} has only {n_total} validation points with entropy; need at least "
            f"{MIN_POINTS} — validate more often (eval.every)"
        )
    if n_fit < MIN_POINTS:
        raise FitError(
            f"fit_fraction={fit_fraction} leaves only {n_fit} of {n_total} validation points of "
            f"{who} to fit; need at least {MIN_POINTS} — raise fit_fraction or validate more "
            "often (eval.every)"
        )

    x = [math.exp(h) for h in H[:n_fit]]
    y = R[:n_fit]
    x_mean = math.fsum(x) / n_fit
    y_mean = math.fsum(y) / n_fit
    sxx = math.fsum((xi - x_mean) ** 2 for xi in x)
    sxy = math.fsum((xi - x_mean) * (yi - y_mean) for xi, yi in zip(x, y))
    if sxx <= (1e-12 * x_mean) ** 2 * n_fit:
        raise FitError(
            f"all {n_fit} fitted entropies of {who} are equal (H = {H[0]:.4g}); the law needs "
            "points at different entropies"
        )
    slope = sxy / sxx  # R = slope·exp(H) + intercept, so a = −slope
    a = -slope
    b = y_mean - slope * x_mean

    ss_res = math.fsum((yi - (b - a * xi)) ** 2 for xi, yi in zip(x, y))
    ss_tot = math.fsum((yi - y_mean) ** 2 for yi in y)
    # flat accuracy (up to float rounding of the mean): the horizontal line fits exactly
    flat = ss_tot <= (1e-12 * max(1.0, abs(y_mean))) ** 2 * n_fit
    r2 = 1.0 if flat else 1.0 - ss_res / ss_tot

    heldout = [b - a * math.exp(h) for h in H[n_fit:]]
    rmse = None
    if heldout:
        rmse = math.sqrt(math.fsum((p - r) ** 2 for p, r in zip(heldout, R[n_fit:])) / len(heldout))
    return EntropyLawFit(
        a=a, b=b, r2=r2, ceiling=b - a, n_fit=n_fit, n_total=n_total,
        fit_fraction=fit_fraction, entropy=H, accuracy=R,
        steps=[int(s) for s in steps] if steps is not None else None,
        heldout_predictions=heldout, rmse=rmse, run=run,
    )


def law_points(run: Run) -> tuple[list[int], list[float], list[float]]:
    """(steps, entropy, accuracy) of the validation steps of a run that logged both.

    Entropy is the training batch's ``entropy/mean`` at the validation step, as in the paper,
    which measures the policy entropy on the training prompts (Entropy Mechanism Eq. 5), not
    on the validation set.
    """
    steps, H, R = [], [], []
    for rec in run.records:
        h, r = rec.get(ENTROPY_KEY), rec.get(ACCURACY_KEY)
        if _finite(h) and _finite(r):
            steps.append(rec["step"])
            H.append(float(h))
            R.append(float(r))
    return steps, H, R


def fit_run(run_dir: str | Path, fit_fraction: float = 1.0) -> EntropyLawFit:
    """Fit the entropy–performance law (Eq. 6) on a run's (``entropy/mean``,
    ``val/accuracy``) pairs."""
    run = load_run(run_dir)
    steps, H, R = law_points(run)
    return fit_entropy_law(H, R, fit_fraction, steps=steps, run=run.label)


def write_fit(run_dir: str | Path, fit: EntropyLawFit) -> Path:
    """Write ``fit`` as ``run_dir/fit.json``; returns the path."""
    path = Path(run_dir) / "fit.json"
    path.write_text(json.dumps(fit.to_dict(), indent=2) + "\n")
    return path


def plot_fit(fit: EntropyLawFit, path: str | Path) -> Path:
    """Draw the fitted points, held-out points with their predictions, and the fitted curve."""
    fig, axes = new_figure()
    ax = axes[0][0]
    H, R, n = fit.entropy, fit.accuracy, fit.n_fit
    lo, hi = min(H), max(H)
    pad = 0.05 * (hi - lo) if hi > lo else 0.05
    grid = [lo - pad + i * (hi - lo + 2 * pad) / 199 for i in range(200)]
    ax.plot(grid, [fit.predict(h) for h in grid], color="C0",
            label=f"fit {fit.formula()}  (R² = {fit.r2:.3f})")
    ax.scatter(H[:n], R[:n], color="C0", zorder=3, label=f"fitted points (first {n})")
    if n < fit.n_total:
        ax.scatter(H[n:], R[n:], color="C3", marker="s", zorder=3,
                   label=f"held-out points ({fit.n_total - n})")
        ax.scatter(H[n:], fit.heldout_predictions, color="C3", marker="x", zorder=3,
                   label=f"predicted (RMSE = {fit.rmse:.3g})")
    ax.axhline(fit.ceiling, color="gray", linestyle=":", label=f"ceiling b − a = {fit.ceiling:.3g}")
    ax.set_xlabel("mean token entropy H on the training batch (nats)")
    ax.set_ylabel("validation accuracy R")
    ax.set_title(f"Entropy–performance law{f': {fit.run}' if fit.run else ''}")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    ax.ticklabel_format(axis="both", useOffset=False)  # entropies read as they are, not "+0.35"
    return save_figure(fig, path)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

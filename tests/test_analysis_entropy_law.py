"""Entropy–performance law R = −a·exp(H) + b (Entropy Mechanism Eq. 6): fit, predict, errors."""

import json
import math

import numpy as np
import pytest

import explorl.analysis
from explorl.analysis import FitError, fit_entropy_law, fit_run, plot_fit, write_fit


def write_run(path, records, name="grpo", seed=0):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"name: {name}\nseed: {seed}\nmax_steps: 100\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_recovers_known_coefficients_from_noisy_points():
    rng = np.random.default_rng(0)
    a, b = 0.3, 1.2
    H = np.linspace(1.5, 0.05, 60)
    R = -a * np.exp(H) + b + rng.normal(0, 0.005, H.size)
    fit = fit_entropy_law(H.tolist(), R.tolist())
    assert fit.a == pytest.approx(a, abs=0.01)
    assert fit.b == pytest.approx(b, abs=0.01)
    assert fit.ceiling == pytest.approx(fit.b - fit.a)
    assert fit.r2 > 0.99
    assert (fit.n_fit, fit.n_total, fit.rmse, fit.heldout_predictions) == (60, 60, None, [])


def test_closed_form_least_squares_by_hand():
    # x = exp(H) = 1, 2, 3 ; y = 1, 0, 0 → slope = Sxy/Sxx = −1/2, a = 1/2, b = 1/3 + 2·(1/2) = 4/3
    fit = fit_entropy_law([0.0, math.log(2), math.log(3)], [1.0, 0.0, 0.0])
    assert fit.a == pytest.approx(0.5)
    assert fit.b == pytest.approx(4 / 3)
    # residuals 1 − 5/6, 0 − 1/3, 0 + 1/6 → SS_res = 1/36 + 4/36 + 1/36 = 1/6 ; SS_tot = 2/3
    assert fit.r2 == pytest.approx(1 - (1 / 6) / (2 / 3))
    assert fit.predict(math.log(4)) == pytest.approx(-2 + 4 / 3)


def test_fit_fraction_predicts_the_rest_with_rmse():
    # the first 3 points lie on a = 1, b = 3; the law predicts −1 and −2 for the last two
    H = [0.0, math.log(2), math.log(3), math.log(4), math.log(5)]
    R = [2.0, 1.0, 0.0, -0.5, -3.0]
    fit = fit_entropy_law(H, R, fit_fraction=0.6)
    assert (fit.n_fit, fit.n_total) == (3, 5)
    assert (
        fit.a == pytest.approx(1.0) and fit.b == pytest.approx(3.0) and fit.r2 == pytest.approx(1.0)
    )
    assert fit.heldout_predictions == pytest.approx([-1.0, -2.0])
    assert fit.rmse == pytest.approx(math.sqrt((0.5**2 + 1.0**2) / 2))


def test_too_few_points_and_flat_entropy_raise():
    with pytest.raises(FitError, match="only 2 validation points with entropy; need at least 3"):
        fit_entropy_law([1.0, 0.5], [0.1, 0.2], run="x")
    with pytest.raises(FitError, match="only 2 of 5"):
        fit_entropy_law([1.0, 0.9, 0.8, 0.7, 0.6], [0.1] * 5, fit_fraction=0.5)
    with pytest.raises(FitError, match="equal"):
        fit_entropy_law([0.7, 0.7, 0.7], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="fit_fraction"):
        fit_entropy_law([1.0, 0.5, 0.2], [0.1, 0.2, 0.3], fit_fraction=0.0)


def test_flat_accuracy_fits_exactly():
    fit = fit_entropy_law([1.0, 0.5, 0.2], [0.4, 0.4, 0.4])
    assert fit.a == pytest.approx(0.0, abs=1e-12) and fit.b == pytest.approx(0.4) and fit.r2 == 1.0


def test_fit_run_uses_training_entropy_at_validation_steps(tmp_path):
    recs = []
    for step in range(1, 21):
        H = 1.5 - 0.07 * step
        rec = {"step": step, "entropy/mean": H, "reward/mean": 0.1}
        if step % 4 == 0:  # validation at 4, 8, 12, 16, 20
            rec["val/accuracy"] = -0.2 * math.exp(H) + 0.9
            rec["val/entropy"] = 99.0  # must not be used
        recs.append(rec)
    recs.append({"step": 21, "val/accuracy": 0.5})  # no entropy: left out
    run = write_run(tmp_path / "run", recs)
    fit = fit_run(run, fit_fraction=0.6)
    assert fit.steps == [4, 8, 12, 16, 20] and fit.n_fit == 3
    assert fit.a == pytest.approx(0.2) and fit.b == pytest.approx(0.9)
    assert fit.rmse == pytest.approx(0.0, abs=1e-12)
    assert fit.run == "grpo (seed 0)"

    path = write_fit(run, fit)
    assert path == run / "fit.json"
    saved = json.loads(path.read_text())
    assert saved["a"] == pytest.approx(0.2) and saved["ceiling"] == pytest.approx(0.7)
    assert saved["n_fit"] == 3 and saved["n_total"] == 5 and len(saved["heldout_predictions"]) == 2

    png = plot_fit(fit, tmp_path / "fit.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    plot_fit(fit_run(run), tmp_path / "fit_all.png")  # no held-out part


def test_fit_run_on_a_short_run_names_the_count(tmp_path):
    recs = [{"step": 1, "entropy/mean": 1.0, "val/accuracy": 0.1},
            {"step": 2, "entropy/mean": 0.9},
            {"step": 3, "entropy/mean": 0.8, "val/accuracy": 0.3}]
    run = write_run(tmp_path / "short", recs, name="clip_cov", seed=3)
    with pytest.raises(
        FitError, match=r"run clip_cov \(seed 3\) has only 2 validation points.*eval\.every"
    ):
        fit_run(run)


def test_public_api():
    assert sorted(explorl.analysis.__all__) == [
        "EntropyLawFit", "FitError", "fit_entropy_law", "fit_run", "make_report", "plot_fit",
        "write_fit"]


def test_formula_resolves_the_signs():
    # A law fitted across runs can increase with entropy (a < 0) or sit below 0 (b < 0): the
    # text must not read "−-0.346·e^H + -0.053".
    fit = fit_entropy_law([0.1, 0.2, 0.3], [0.5, 0.4, 0.3])
    fit.a, fit.b = 0.346, -0.053
    assert fit.formula(".3f", "e^H") == "R = −0.346·e^H − 0.053"
    fit.a, fit.b = -0.216, 0.073
    assert fit.formula(".3f") == "R = 0.216·exp(H) + 0.073"

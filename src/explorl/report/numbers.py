"""Every number of the study: per run (``run_numbers``) and per recipe over seeds (``build_table``,
columns ``columns``)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from explorl.analysis.entropy_law import FitError, fit_entropy_law, law_points
from explorl.analysis.frontier import BASELINE
from explorl.analysis.runs import Run
from explorl.control.schedules import anneal_start
from explorl.report.stats import (
    N_BOOT,
    Interval,
    bootstrap,
    percentile_mc_error,
)

WINDOW = 0.1  # "initial" / "final" = mean over the first / last 10% of steps (at least one)
LAW_FIT_FRACTION = 0.4  # the early fit: the first 40% of validation points predict the rest


def _w(n: int) -> int:
    return max(1, math.ceil(WINDOW * n))


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def value_text(value: Any) -> str:
    """A grid value as an override's right-hand side that YAML reads back as the same value
    (``5e-05`` would read as a string: floats keep a mantissa dot, ``5.0e-05``)."""
    if isinstance(value, float):
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exp = text.split("e")
            text = f"{mantissa}.0e{exp}"
        return text
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def fmt_value(x: float | None, digits: int = 3) -> str:
    """A number for the documents: ``digits`` decimals, or ``—`` when it could not be measured."""
    return "—" if x is None else f"{x:.{digits}f}"


def _series_mean(recs: list[dict], key: str) -> float | None:
    return _mean([float(r[key]) for r in recs if key in r])


def run_numbers(run: Run, cfg: dict, eval_summary: dict | None,
                k_list: list[int]) -> dict[str, Any]:
    """Every per-run figure the table and the claims use (None where a run cannot have it)."""
    recs = [r for r in run.records if r["step"] >= 1]  # step 0: the pre-RL validation only
    n = len(recs)
    w = _w(n)
    H = [float(r["entropy/mean"]) for r in recs]
    R = [float(r["reward/mean"]) for r in recs]
    out: dict[str, Any] = {"steps": n}
    out["initial_entropy"] = _mean(H[:w])
    out["final_entropy"] = _mean(H[-w:])
    out["entropy_ratio"] = (out["final_entropy"] / out["initial_entropy"]
                            if out["initial_entropy"] else None)
    out["initial_reward"] = _mean(R[:w])
    out["final_reward"] = _mean(R[-w:])
    out["all_wrong_frac"] = _series_mean(recs, "rollout/all_wrong_frac")
    out["rollouts_per_step"] = _series_mean(recs, "rollout/n_samples")
    out["clip_frac"] = _series_mean(recs, "loss/clip_frac")
    overall = (eval_summary or {}).get("overall", {})
    for k in k_list:
        out[f"eval_pass@{k}"] = overall.get(f"pass@{k}")
    out.update(_tracking(recs, H, w))
    out.update(_anneal(cfg, H, n, w))
    # EEPO: stage-2 minus stage-1 entropy on the steps where the unlearning step ran.
    active = [r for r in recs if "eepo/active" in r]
    on = [r for r in active
          if r["eepo/active"] >= 0.5 and "entropy/stage1" in r and "entropy/stage2" in r]
    out["eepo_active_frac"] = len(on) / len(active) if active else None
    out["eepo_dH"] = _mean([float(r["entropy/stage2"]) - float(r["entropy/stage1"]) for r in on])
    out.update(tool_numbers(recs, eval_summary))
    out.update(_timing(recs))
    out.update(_law(run))
    return out


def _tracking(recs: list[dict], H: list[float], w: int) -> dict[str, Any]:
    """Tracking: the steps after the first 10% (the controllers' warm-up), where a target is
    logged: mean |H − target|, mean H − target, the mean target, the bias ÷ the target."""
    tracked = [(float(r["entropy/mean"]), float(r["control/target_entropy"])) for r in recs[w:]
               if "control/target_entropy" in r]
    out: dict[str, Any] = {"tracked_entropy_mean": _mean(H[w:])}
    out["H0"] = (float(recs[0]["control/target_entropy"])
                 if recs and "control/target_entropy" in recs[0] else None)
    if not tracked:
        return out | dict.fromkeys(("tracking_error", "tracking_bias", "target_mean",
                                    "tracking_rel_bias"))
    target = statistics.fmean(t for _, t in tracked)
    out["tracking_error"] = statistics.fmean(abs(h - t) for h, t in tracked)
    out["tracking_bias"] = statistics.fmean(h - t for h, t in tracked)
    out["target_mean"] = target
    out["tracking_rel_bias"] = out["tracking_bias"] / target if target else None
    return out


def _anneal(cfg: dict, H: list[float], n: int, w: int) -> dict[str, Any]:
    """E3 annealing: β, and the entropy over the last 10% of steps ÷ over the 10% of steps
    before the phase starts."""
    t = cfg.get("control", {}).get("temperature", {})
    start = (anneal_start(n, t.get("annealing_ratio", 0.0))
             if t.get("enabled") and t.get("anneal") else None)
    out = {"anneal_beta": t.get("beta") if start is not None else None}  # β = 1: a flat target
    if start is not None and start - 1 >= w:
        pre = H[start - 1 - w: start - 1]
        out["anneal_entropy_ratio"] = statistics.fmean(H[-w:]) / statistics.fmean(pre)
    else:
        out["anneal_entropy_ratio"] = None
    return out


def _timing(recs: list[dict]) -> dict[str, Any]:
    """Seconds per training step without validation (it runs every eval.every steps): the
    median, which a suspended process or a slow checkpoint write does not move; CPU seconds of
    the training process per step, on the steps without a validation (its CPU time is not
    separated), and over the whole run: the same-budget cost in CPU time."""
    walls = [float(r["time/step_s"]) - float(r.get("time/val_s", 0.0))
             for r in recs if "time/step_s" in r]
    return {"step_s": statistics.median(walls) if walls else None,
            "cpu_step_s": _mean([float(r["time/cpu_s"]) for r in recs
                                 if "time/cpu_s" in r and "time/val_s" not in r]),
            "cpu_run_s": (sum(float(r["time/cpu_s"]) for r in recs)
                          if recs and all("time/cpu_s" in r for r in recs) else None)}


def _law(run: Run) -> dict[str, Any]:
    """The entropy–performance law on (training-batch entropy, val accuracy) at the validation
    steps: the full fit's R² and ceiling; the early fit's RMSE on the later points against
    persistence's, and its error at the last one."""
    steps, Hv, Rv = law_points(run)
    out: dict[str, Any] = {"law_points": len(Hv)}
    for key in ("law_r2", "law_rmse", "law_naive_rmse", "law_final_error", "law_ceiling"):
        out[key] = None
    try:
        full = fit_entropy_law(Hv, Rv, 1.0, steps=steps)
        out["law_r2"], out["law_ceiling"] = full.r2, full.ceiling
        early = fit_entropy_law(Hv, Rv, LAW_FIT_FRACTION, steps=steps)
        if early.heldout_predictions:
            held = Rv[early.n_fit:]
            naive = Rv[early.n_fit - 1]  # persistence: the last fitted accuracy, held constant
            out["law_rmse"] = early.rmse
            out["law_naive_rmse"] = math.sqrt(statistics.fmean((naive - r) ** 2 for r in held))
            out["law_final_error"] = abs(early.heldout_predictions[-1] - held[-1])
    except FitError:
        pass
    return out


def step_tool_calls(r: dict) -> tuple[int, int] | None:
    """(tool calls the step's sampler ran, tool calls in its trained responses) of a metrics row;
    None without tools. The calls run: ``tools/calls_run`` (every call answered, AEPO's
    pre-monitoring probes included, a call an ARPO branch copied once); a row logged before that
    metric existed: ``tools/calls_mean`` × ``rollout/n_trained`` − ``arpo/shared_calls`` (the
    same count without probes). In the trained responses: ``tools/calls_mean`` ×
    ``rollout/n_trained``."""
    if "tools/calls_mean" not in r:
        return None
    n = float(r.get("rollout/n_trained", r.get("rollout/n_samples", 0.0)))
    counted = round(float(r["tools/calls_mean"]) * n)
    if "tools/calls_run" in r:
        return round(float(r["tools/calls_run"])), counted
    return counted - round(float(r.get("arpo/shared_calls", 0.0))), counted


def tool_numbers(recs: list[dict], eval_summary: dict | None) -> dict[str, Any]:
    """A tool run's calls (None without tools): ``train_calls``, the tool calls its sampler ran
    in training (``step_tool_calls``: probes included, a call an ARPO branch copied once);
    ``train_calls_counted``, the calls in the trained responses; ``train_responses``; and the
    final evaluation's ``tools`` (calls per response, the share of responses that call, calls
    per correct answer; ``explorl eval``)."""
    calls = [c for c in map(step_tool_calls, recs) if c is not None]
    t = (eval_summary or {}).get("tools") or {}
    return {"train_calls": sum(a for a, _ in calls) if calls else None,
            "train_calls_counted": sum(b for _, b in calls) if calls else None,
            "train_responses": (sum(float(r.get("rollout/n_trained", r.get("rollout/n_samples",
                                                                           0.0)))
                                    for r in recs if "tools/calls_mean" in r) if calls else None),
            "eval_calls_per_response": t.get("calls_per_response"),
            "eval_call_frac": t.get("call_frac"),
            "eval_calls_per_correct": t.get("calls_per_correct")}


@dataclass
class Stat:
    """Mean and sample standard deviation over seeds (std None with one value)."""

    mean: float | None
    std: float | None
    n: int
    values: list[float]

    @classmethod
    def of(cls, values: list[float | None]) -> Stat:
        vals = [float(v) for v in values if v is not None]
        return cls(statistics.fmean(vals) if vals else None,
                   statistics.stdev(vals) if len(vals) > 1 else None, len(vals), vals)

    def fmt(self, digits: int = 3) -> str:
        if self.mean is None:
            return "—"
        text = f"{self.mean:.{digits}f}"
        return text + (f" ± {self.std:.{digits}f}" if self.std is not None else "")


# (key, title, digits, timing?): timing columns vary between reruns, so the fingerprint skips them.
def columns(k_list: list[int]) -> list[tuple[str, str, int, bool]]:
    return [
        ("entropy_ratio", "H final / H initial", 3, False),
        ("final_entropy", "H final (nats)", 3, False),
        ("final_reward", "final reward", 3, False),
        # the smallest and largest k (the whole curve has its own table)
        *[(f"eval_pass@{k}", f"test pass@{k}", 3, False) for k in sorted({min(k_list),
                                                                           max(k_list)})],
        ("all_wrong_frac", "all-wrong groups", 3, False),
        ("tracking_error", "tracking error (nats)", 3, False),
        ("eepo_dH", "EEPO H2 − H1 (nats)", 3, False),
        ("rollouts_per_step", "rollouts / step", 1, False),
        ("clip_frac", "PPO clip frac", 4, False),
        ("step_s", "s / step", 3, True),
        ("overhead", "overhead vs GRPO", 2, True),
        ("cpu_step_s", "CPU s / step", 3, True),
        ("cpu_overhead", "CPU overhead vs GRPO", 2, True),
    ]


def build_table(rows: list[str], per_run: dict[str, list[dict]],
                k_list: list[int], baseline: str | None = BASELINE) -> dict[str, dict[str, Stat]]:
    """Per recipe, per column: ``Stat`` over its seeds.

    Overhead = s/step ÷ the baseline's mean s/step − 1 (``baseline``: the study's GRPO row;
    no overheads without one)."""
    base_runs = per_run.get(baseline, []) if baseline else []
    base = Stat.of([r["step_s"] for r in base_runs]).mean
    cpu = Stat.of([r.get("cpu_step_s") for r in base_runs]).mean
    table = {}
    for name in rows:
        runs = per_run.get(name, [])
        for r in runs:
            r["overhead"] = r["step_s"] / base - 1 if base and r.get("step_s") is not None else None
            r["cpu_overhead"] = (r["cpu_step_s"] / cpu - 1
                                 if cpu and r.get("cpu_step_s") is not None else None)
        table[name] = {key: Stat.of([r.get(key) for r in runs]) for key, *_ in columns(k_list)}
    return table


def pooled_law(groups: dict[str, list[Run]], n_boot: int = N_BOOT) -> dict[str, Any]:
    """The entropy–performance law fitted across every run of the study (each run's validation
    points, pooled, as the paper fits across a model family's checkpoints), with a bootstrap
    over runs for R², a and b (``stats.bootstrap``: from ``n_boot`` resamples, doubled until
    R²'s bounds have a Monte-Carlo error below ``MC_TARGET``, which its interval carries); per
    model size when the study has runs of more than one."""
    import numpy as np

    def fit(runs: list[Run]) -> dict[str, Any]:
        pts = [law_points(r)[1:] for r in runs]
        pts = [(h, a) for h, a in pts if len(h) >= 2]
        if len(pts) < 2:
            return {}
        H = [x for h, _ in pts for x in h]
        A = [x for _, a in pts for x in a]
        try:
            f = fit_entropy_law(H, A, 1.0)
        except FitError:
            return {}
        # per run: n, Σx, Σy, Σx², Σxy, Σy² of (x = e^H, y = accuracy): a resample's fit is
        # the least-squares fit of its summed statistics (``fit_entropy_law``'s, in closed form)
        sums = []
        for h, acc in pts:
            x, y = np.exp(np.asarray(h, float)), np.asarray(acc, float)
            sums.append([len(x), x.sum(), y.sum(), (x * x).sum(), (x * y).sum(), (y * y).sum()])
        sums = np.array(sums)
        fits: list[np.ndarray] = []

        def r2(counts: np.ndarray) -> np.ndarray:
            n, sx, sy, sxx, sxy, syy = (counts @ sums).T
            with np.errstate(divide="ignore", invalid="ignore"):
                mx, my = sx / n, sy / n
                vxx, vxy, vyy = sxx - n * mx * mx, sxy - n * mx * my, syy - n * my * my
                slope = vxy / vxx
                ok = vxx > (1e-12 * mx) ** 2 * n
                flat = vyy <= (1e-12 * np.maximum(1.0, np.abs(my))) ** 2 * n
                r = np.where(flat, 1.0, vxy * vxy / (vxx * vyy))
            r, a_, b_ = (np.where(ok, v, np.nan) for v in (r, -slope, my - slope * mx))
            fits.append(np.stack([r, a_, b_], axis=1))
            return r

        reps, lo, hi, err = bootstrap(r2, len(pts), first=n_boot)
        if np.isnan(reps).mean() > 0.5:  # the fit fails on most resamples: no interval
            return {}
        arr = np.concatenate(fits)
        how = f"{len(pts)} runs resampled, {len(reps):,} times"

        def iv(i: int, est: float) -> Interval:
            col = arr[:, i]
            col = col[~np.isnan(col)]
            a_lo, a_hi = np.percentile(col, [2.5, 97.5])
            return Interval(float(est), float(a_lo), float(a_hi), how,
                            mc_error=percentile_mc_error(col))

        return {"a": iv(1, f.a), "b": iv(2, f.b),
                "r2": Interval(float(f.r2), lo, hi, how, mc_error=err), "points": len(H),
                "runs": len(pts), "fit": f}

    every = [r for runs in groups.values() for r in runs]
    out = fit(every)
    sizes: dict[str, list[Run]] = {}
    for r in every:
        size = (r.config or {}).get("lab", {}).get("model_size", "default")
        sizes.setdefault(size, []).append(r)
    if len(sizes) > 1:
        out["by_size"] = {s: fit(rs) for s, rs in sizes.items()}
    return out

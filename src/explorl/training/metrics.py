"""# 6. log: every key of a training step's metrics row is built here, from global values.

The keys and their meaning are documented in docs/metrics.md (a test checks that every logged
key is there). Phases return their own namespaced metrics (``rollout/*``, ``loss/*``,
``control/*`` decisions, ``eepo/*``); this module adds the step-level ones and the knobs the
step used (``control/<knob>``), each logged exactly once.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from explorl.control import Knobs
from explorl.training.batch import StepBatch

KNOB_METRICS = ("temperature", "eps_high", "entropy_coef", "kl_coef")
TIME_KEYS = ("time/", "perf/")  # wall-clock metrics: excluded from resume-equality checks


def batch_metrics(step: int, sb: StepBatch, used: Knobs) -> dict[str, float]:
    """Reward, entropy, length and rollout-size metrics of the step's global batch."""
    rows = sb.rows
    entropy = float(rows.entropy_sum.sum() / rows.length.sum().clamp_min(1))
    n = len(rows.reward)
    lengths = rows.length.double()
    out = {
        "step": step,
        "epoch": sb.epoch,
        "reward/mean": float(rows.reward.mean()) if n else 0.0,
        "reward/std": float(rows.reward.std(unbiased=False)) if n else 0.0,
        "reward/accuracy": float(rows.score.mean()) if n else 0.0,
        "entropy/mean": entropy,
        "response/length_mean": float(lengths.mean()) if n else 0.0,
        "response/length_max": float(lengths.max()) if n else 0.0,
        "response/truncated_frac": float(rows.truncated.double().mean()) if n else 0.0,
        "rollout/n_samples": float(sum(sb.prompt_samples)),
        "rollout/n_trained": float(n),
    }
    out.update({f"control/{k}": float(getattr(used, k)) for k in KNOB_METRICS})
    out.update(tool_metrics(rows))
    return out


def tool_metrics(rows) -> dict[str, float]:
    """``tools/*`` and ``tokens/*`` of a multi-turn batch (``StepRows`` with the tool columns);
    none without tools. Per response: means; ``tools/errors``: the batch's count."""
    if rows.turns is None or not len(rows.turns):
        return {}
    calls = rows.tool_calls.double()
    return {
        "tools/calls_mean": float(calls.mean()),
        "tools/call_frac": float((calls > 0).double().mean()),
        "tools/errors": float(rows.tool_errors.sum()),
        "tools/turns": float(rows.turns.double().mean()),
        "tokens/model_mean": float(rows.length.double().mean()),
        "tokens/tool_mean": float(rows.tool_tokens.double().mean()),
    }


def ordered(metrics: dict) -> dict:
    """``step`` first, then the keys in sorted order (one stable layout for metrics.jsonl)."""
    return dict(sorted(metrics.items(), key=lambda kv: (kv[0] != "step", kv[0])))


@contextmanager
def timed(metrics: dict, key: str, cpu_key: str | None = None):
    """Add the seconds a phase takes to ``metrics[key]`` (verl's ``marked_timer``), and with
    ``cpu_key`` the process's CPU seconds (all threads) to ``metrics[cpu_key]``."""
    t0, c0 = time.perf_counter(), (None if cpu_key is None else time.process_time())
    yield
    metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - t0
    if cpu_key is not None:
        metrics[cpu_key] = metrics.get(cpu_key, 0.0) + time.process_time() - c0


def loss_metrics(
    total: dict[str, float], n_rows: int, ppo_epochs: int, upd: dict
) -> dict[str, float]:
    """Metrics from the update's sums over all ranks: token-weighted means, except the three
    below."""
    tokens = max(total.pop("tokens", 0.0), 1.0)
    if "cov/selected_n" in total:  # mean covariance over every selected token of the update
        n_sel, sel_sum = total.pop("cov/selected_n"), total.pop("cov/selected_sum")
        total["cov/selected_mean"] = sel_sum / n_sel * tokens if n_sel > 0 else 0.0
    out = {
        k: v / tokens for k, v in total.items() if k not in ("loss/entropy_bonus", "loss/policy")
    }
    if (
        "loss/entropy_bonus" in total
    ):  # seq-weighted sum of per-mini-batch aggregates → mean aggregate
        out["loss/entropy_bonus"] = total["loss/entropy_bonus"] / (n_rows * ppo_epochs)
    if "loss/policy" in total:  # sum over optimizer steps of the mini-batch losses → mean
        out["loss/policy"] = total["loss/policy"] / max(1.0, upd["train/optimizer_steps"])
    return out

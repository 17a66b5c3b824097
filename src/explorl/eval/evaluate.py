"""Turn per-sample correctness into pass@k / mean@n summaries, a pass@k plot and eval.json.

The generation side (``explorl eval``) produces, per problem, the correctness of each of its
n samples and the problem's ``data_source``; everything here is pure bookkeeping on that.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from explorl.analysis.passk import mean_at_n, pass_at_k_batch
from explorl.analysis.runs import new_figure, save_figure
from explorl.files import write_text_atomic


def _stats(n_list: list[int], c_list: list[int], ks: list[int]) -> dict:
    out = {f"pass@{k}": pass_at_k_batch(n_list, c_list, k) for k in ks}
    out["mean@n"] = mean_at_n(n_list, c_list)
    out["n_problems"] = len(n_list)
    out["n_samples"] = sum(n_list)
    return out


def summarize(
    correct: Sequence[Sequence[bool]], data_sources: Sequence[str], k_list: Sequence[int]
) -> dict:
    """Unbiased pass@k (docs/methods/baseline.md §0) and mean@n, overall and per data source.

    ``correct[i][j]`` says whether sample j of problem i is correct; problems may have
    different sample counts, but every problem needs at least max(k_list) samples (else
    ``ValueError``, naming the problem). pass@1 is always reported. Returns
    ``{"k_list": [...], "overall": {"pass@1", "pass@k"…, "mean@n", "n_problems", "n_samples"},
    "by_source": {source: {same keys}}}``; mean@n is the mean per-problem accuracy c_i/n_i.
    """
    if len(correct) != len(data_sources):
        raise ValueError(f"got {len(correct)} problems but {len(data_sources)} data sources")
    if not correct:
        raise ValueError("nothing to summarize: no problems")
    ks = sorted({1, *(int(k) for k in k_list)})
    if ks[0] < 1:
        raise ValueError(f"every k must be ≥ 1, got {list(k_list)}")
    n_list = [len(samples) for samples in correct]
    c_list = [sum(bool(x) for x in samples) for samples in correct]
    for i, n in enumerate(n_list):
        if n < ks[-1]:
            raise ValueError(
                f"problem {i} ({data_sources[i]}) has {n} samples but pass@{ks[-1]} needs at "
                f"least {ks[-1]}; generate ≥ {ks[-1]} samples per problem or lower k"
            )
    by_source: dict[str, tuple[list[int], list[int]]] = {}
    for n, c, src in zip(n_list, c_list, data_sources):
        ns, cs = by_source.setdefault(str(src), ([], []))
        ns.append(n)
        cs.append(c)
    return {
        "k_list": ks,
        "overall": _stats(n_list, c_list, ks),
        "by_source": {src: _stats(ns, cs, ks) for src, (ns, cs) in sorted(by_source.items())},
    }


def tool_summary(calls: Sequence[Sequence[int]], correct: Sequence[Sequence[bool]]) -> dict:
    """Tool use at evaluation: ``calls[i][j]`` tool calls answered in sample j of problem i,
    ``correct[i][j]`` its verdict. Returns ``calls_per_response`` (mean over every sample),
    ``call_frac`` (share of samples with at least one call), ``calls_per_correct`` (all the
    calls ÷ the correct samples: what a correct answer costs in calls; None with none correct)
    and ``calls_per_correct_response`` (mean calls of the correct samples alone; None likewise).
    """
    flat = [(int(c), bool(ok)) for cs, oks in zip(calls, correct) for c, ok in zip(cs, oks)]
    if len(flat) != sum(len(cs) for cs in calls) or len(calls) != len(correct):
        raise ValueError("calls and correct must have the same shape")
    n = len(flat)
    total = sum(c for c, _ in flat)
    right = [c for c, ok in flat if ok]
    return {"calls_per_response": total / n if n else 0.0,
            "call_frac": sum(c > 0 for c, _ in flat) / n if n else 0.0,
            "calls_per_correct": total / len(right) if right else None,
            "calls_per_correct_response": sum(right) / len(right) if right else None,
            "n_calls": total, "n_responses": n, "n_correct": len(right)}


def write_eval_json(summary: dict, path: str | Path) -> Path:
    """Write a ``summarize`` result as indented JSON; returns the path."""
    return write_text_atomic(path, json.dumps(summary, indent=2) + "\n")


def _curve(stats: dict) -> tuple[list[int], list[float]]:
    ks = sorted(int(key.split("@")[1]) for key in stats if key.startswith("pass@"))
    return ks, [stats[f"pass@{k}"] for k in ks]


def plot_passk(summary: dict, path: str | Path) -> Path:
    """pass@k versus k (log₂ x axis): one line per data source, plus the overall mean in black."""
    fig, axes = new_figure()
    ax = axes[0][0]
    sources = summary.get("by_source") or {"all": summary["overall"]}
    for i, (src, stats) in enumerate(sources.items()):
        ks, vals = _curve(stats)
        ax.plot(ks, vals, marker="o", color=f"C{i % 10}",
                label=f"{src} ({stats['n_problems']} problems)")
    ks, vals = _curve(summary["overall"])
    if len(sources) > 1:
        ax.plot(ks, vals, marker="o", color="black", linewidth=2,
                label=f"overall ({summary['overall']['n_problems']} problems)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("pass@k (unbiased)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("pass@k")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return save_figure(fig, path)


def read_eval(path: str | Path) -> dict:
    """An ``explorl eval`` summary from its output directory or its ``eval.json``."""
    path = Path(path)
    if path.is_dir():
        path = path / "eval.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no eval.json (write one with `explorl eval ... --out DIR`)"
        )
    return json.loads(path.read_text())


def plot_passk_compare(curves: Sequence[tuple[str, dict]], path: str | Path,
                       title: str = "pass@k") -> Path:
    """Overall pass@k versus k of several evaluations in one figure (e.g. a model before and
    after RL); ``curves`` are (label, ``summarize`` result). The legend gives each one's sample
    count and temperature, so curves from different settings are not mistaken for comparable."""
    fig, axes = new_figure()
    ax = axes[0][0]
    all_ks: set[int] = set()
    top = {}  # k -> the highest value there: its label goes above the point, the others below
    for _, summary in curves:
        for k, v in zip(*_curve(summary["overall"])):
            top[k] = max(top.get(k, v), v)
    for i, (label, summary) in enumerate(curves):
        ks, vals = _curve(summary["overall"])
        all_ks.update(ks)
        settings = summary.get("settings", {})
        detail = ", ".join(x for x in (
            f"n={settings['n']}" if "n" in settings else "",
            f"T={settings['temperature']:g}" if "temperature" in settings else "",
            f"{summary['overall']['n_problems']} problems") if x)
        ax.plot(ks, vals, marker="o", color=f"C{i % 10}", label=f"{label} ({detail})")
        for k, v in zip(ks, vals):
            ax.annotate(f"{v:.2f}", (k, v), textcoords="offset points",
                        xytext=(0, 6 if v >= top[k] else -13), ha="center", fontsize=7,
                        color=f"C{i % 10}")
    ks = sorted(all_ks)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("pass@k (unbiased)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    # "best": clear of every curve (a base model near 0 sat under a lower-right legend)
    ax.legend(fontsize="small", loc="best")
    return save_figure(fig, path)

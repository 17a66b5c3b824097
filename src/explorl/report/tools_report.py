"""A study of tool-using arms (any arm whose runs called tools): each arm's pass@1 and pass@k
against the first tool arm (the baseline: the lab's ``tools``, trajectory-level GRPO with the
calculator) with crossed t intervals, its tool calls per response and per correct answer at
evaluation, and the tool calls it ran in training (``numbers.tool_numbers``); and the figure of
calls over training. The claims on them are the spec's (``claims:``, e.g. ``run:train_calls``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from explorl.analysis.runs import Run, new_figure, save_figure, step_axes
from explorl.report.evidence import Evidence
from explorl.report.numbers import Stat, step_tool_calls
from explorl.report.tables import cell

# (key, title, digits) of the per-run tool numbers, in the tables' order
COLUMNS = [("eval_calls_per_response", "calls / response (test)", 3),
           ("eval_call_frac", "responses that call (test)", 3),
           ("eval_calls_per_correct", "calls / correct answer (test)", 3),
           ("train_calls", "tool calls run in training", 0),
           ("train_calls_counted", "calls in the trained responses", 0)]


def tool_arms(ev: Evidence | None) -> list[str]:
    """The arms that ran with tools (a training call count), in table order."""
    if ev is None:
        return []
    return [n for n, runs in ev.per_run.items()
            if any(r.get("train_calls") is not None for r in runs)]


def _ks(ev: Evidence) -> list[int]:
    return sorted({1, *(k for k in (8,) if k in ev.k_list), ev.k_max})


def base_tools(out: Path) -> dict | None:
    """The model before RL's evaluation ``tools`` (``base/eval/eval.json``), if any."""
    try:
        return json.loads((out / "base" / "eval" / "eval.json").read_text()).get("tools")
    except (OSError, ValueError):
        return None


def _fmt(stat: Stat, digits: int) -> str:
    return stat.fmt(digits) if digits else ("—" if stat.mean is None else (
        f"{stat.mean:,.0f}" + (f" ± {stat.std:,.0f}" if stat.std is not None else "")))


def tool_tables(ev: Evidence | None, out: Path) -> list[str]:
    """The study's **Tool use** section (empty without tool arms): per arm, pass@k and the tool
    numbers (mean ± std over seeds); each arm − the first (``tools``) with intervals."""
    arms = tool_arms(ev)
    if not arms or not ev.passk:
        return []
    ref = arms[0]
    ks = _ks(ev)
    head = ["recipe", "seeds", *[f"pass@{k}" for k in ks], *[t for _, t, _ in COLUMNS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = base_tools(out)
    if ev.base is not None:
        b = [f"{ev.mean_passk('base', k):.3f}" for k in ks]
        tb = [f"{base[k]:.3f}" if base and base.get(k) is not None else "—" for k in
              ("calls_per_response", "call_frac", "calls_per_correct")]
        lines.append("| **base** | — | " + " | ".join(b + tb + ["—", "—"]) + " |")
    for name in arms:
        runs = ev.per_run[name]
        pk = [f"{ev.passk[name][k].mean():.3f}" if name in ev.passk else "—" for k in ks]
        tc = [_fmt(Stat.of([r.get(key) for r in runs]), d) for key, _, d in COLUMNS]
        lines.append(f"| {name} | {len(runs)} | " + " | ".join(pk + tc) + " |")
    lines += ["", "pass@k: unbiased, mean over seeds. **calls / response**: tool calls answered "
              "per sampled test response; **calls / correct answer**: all the test responses' "
              "calls ÷ the correct ones (what a correct answer costs in calls); **tool calls "
              "run in training**: Σ over steps of `tools/calls_run`, every call the sampler "
              "answered (AEPO's pre-monitoring probes included; a call an ARPO branch copied "
              "with its source's tokens ran once; a run logged without it: `tools/calls_mean` × "
              "`rollout/n_trained` − `arpo/shared_calls`); **calls in the trained responses**: "
              "`tools/calls_mean` × `rollout/n_trained`. "
              "The model before RL (**base**) is evaluated with the first recipe's tools."]
    others = [n for n in arms if n != ref and ref in ev.per_run]
    if others:
        lines += ["", f"Each arm − GRPO (`{ref}`), with 95% intervals: pass@k t over seeds "
                  "with the test problems' part (after ±, the minimum detectable effect); the "
                  "tool numbers paired by seed, t over seeds; **bold**: the interval excludes 0 "
                  "(the ratio: excludes 1).", "",
                  "| recipe | " + " | ".join(f"pass@{k}" for k in ks)
                  + " | calls / response (test) | calls / correct answer (test) | tool calls "
                  "run in training | ÷ GRPO's |", "|" + "---|" * (len(ks) + 5)]
        for name in others:
            pk = [cell(ev.pk(name, ref, k)) for k in ks]
            tc = [cell(ev.pair(name, ref, lambda r, key=key: r[key]), mde=False) for key in
                  ("eval_calls_per_response", "eval_calls_per_correct")]
            d = ev.pair(name, ref, lambda r: r["train_calls"])
            tc.append("—" if d is None else f"**{d.fmt(0)}**" if d.low > 0 or d.high < 0
                      else d.fmt(0))
            r = ev.ratio(name, ref, "train_calls")
            rc = ("—" if r is None else f"**{r.fmt_abs()}**" if r.low > 1 or r.high < 1
                  else r.fmt_abs())
            lines.append(f"| {name} | " + " | ".join(pk + tc + [rc]) + " |")
    return lines


def tool_json(ev: Evidence | None, out: Path) -> dict:
    """``study.json``'s ``tools``: per arm the tool numbers' means over seeds, and each arm's
    differences with GRPO (``tools``)."""
    arms = tool_arms(ev)
    if not arms:
        return {}
    ref = arms[0]
    got: dict = {"base": base_tools(out), "arms": {}, "vs_" + ref: {}}
    for name in arms:
        got["arms"][name] = {key: Stat.of([r.get(key) for r in ev.per_run[name]]).mean
                             for key, _, _ in COLUMNS}
        if name != ref and ref in ev.per_run:
            d = {f"pass@{k}": ev.pk(name, ref, k) for k in _ks(ev)}
            d |= {key: ev.pair(name, ref, lambda r, key=key: r[key]) for key, _, _ in
                  COLUMNS}
            d["train_calls_ratio"] = ev.ratio(name, ref, "train_calls")
            got["vs_" + ref][name] = {k: None if v is None else v.to_json()
                                           for k, v in d.items()}
    return got


def calls_run(run: Run) -> tuple[list[int], list[float]]:
    """(steps, tool calls run so far) of a run: ``train_calls`` step by step."""
    steps, out, total = [], [], 0
    for r in run.records:
        calls = step_tool_calls(r) if r.get("step", 0) >= 1 else None
        if calls is not None:
            total += calls[0]
            steps.append(int(r["step"]))
            out.append(float(total))
    return steps, out


def draw_tool_calls(groups: dict[str, list[Run]], out_dir: Path) -> list[tuple[str, str]]:
    """``tool_calls.png``: each tool arm's cumulative tool calls run in training (mean over
    seeds, band min–max); nothing without tool arms."""
    curves = {}
    for name, runs in groups.items():
        per = [calls_run(r) for r in runs]
        per = [p for p in per if p[0]]
        if per:
            n = min(len(s) for s, _ in per)
            curves[name] = (per[0][0][:n], np.array([v[:n] for _, v in per]))
    if not curves:
        return []
    fig, axes = new_figure(width=7.0, height=4.2)
    ax = axes[0][0]
    for i, (name, (steps, vals)) in enumerate(curves.items()):
        ax.plot(steps, vals.mean(0), color=f"C{i}", label=f"{name} ({len(vals)} seeds)")
        if len(vals) > 1:
            ax.fill_between(steps, vals.min(0), vals.max(0), color=f"C{i}", alpha=0.15,
                            linewidth=0)
    ax.set_title("Tool calls run in training")
    ax.set_xlabel("training step (band = min–max over seeds)")
    ax.set_ylabel("tool calls run so far")
    ax.grid(alpha=0.3)
    step_axes(ax)
    ax.legend(fontsize="small")
    save_figure(fig, out_dir / "tool_calls.png", dpi=80)
    return [("Tool calls run in training", "tool_calls.png")]

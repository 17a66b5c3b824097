"""The study's documents: ``study.md`` (table, claims, figures), ``claims.md``, ``study.json``
(every number and a fingerprint of the non-timing ones), and their published copy."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import Any

from explorl.analysis.frontier import BASELINE
from explorl.config import builtin
from explorl.report.checkpoints import HORIZON_RULE, checkpoint_json, checkpoint_table
from explorl.report.claims import chance_line, rule_notes
from explorl.report.frontier_report import claim_rule, frontier_json, frontier_table
from explorl.report.horizon import horizon_json, horizon_lines
from explorl.report.numbers import Stat, columns
from explorl.report.tables import (
    ablation_tables,
    base_rows,
    passk_tables,
    power_table,
    temperature_tables,
)
from explorl.report.tools_report import tool_json, tool_tables


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.10g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


def fingerprint(table_json: dict, claims: list[dict], timing: set[str]) -> str:
    """sha256 of every non-timing number of the summary table and of the claims (rounded to 10
    digits); the pass@k tables follow from the runs' per-problem counts that the study's archive
    keeps."""
    payload = {name: {k: v for k, v in cols.items() if k not in timing}
               for name, cols in table_json.items()}
    blob = json.dumps(_round({"table": payload, "claims": claims}), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _jobs_text(jobs: list) -> str:
    """``2 jobs``, ``1 job``, or ``2 or 16 jobs`` when the invocations differed."""
    words = " or ".join(str(j) for j in jobs)
    return f"{words} job{'' if list(jobs) == [1] else 's'}"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


# Each summary column's note (the columns it explains: left out with them).
COLUMN_NOTES: list[tuple[tuple[str, ...], str]] = [
    (("entropy_ratio",), """\
- **H final / H initial**: mean `entropy/mean` over the last 10% of steps ÷ over the first 10%
  (entropy at the step's sampling temperature, so E3's temperature changes are included)."""),
    (("final_reward",), "- **final reward**: mean `reward/mean` over the last 10% of steps."),
    (("eval_pass@",), """\
- **test pass@k**: `explorl eval` of the final checkpoint: {n} samples per problem at T = {T} on
  the {split} split{maxp}; unbiased pass@k (pass@1 = mean@{n})."""),
    (("all_wrong_frac",), """\
- **all-wrong groups**: mean over all steps of `rollout/all_wrong_frac` (prompts whose every
  response was wrong; DAPO counts its extra rounds' prompts too)."""),
    (("tracking_error",), """\
- **tracking error**: mean |H − target| over the steps after the first 10%, for runs with a target
  (E3's H0 or annealed target; Entropy Scheduling's schedule). Per step, so it includes the
  batch's sampling noise."""),
    (("eepo_dH",), """\
- **EEPO H2 − H1**: mean of `entropy/stage2 − entropy/stage1` over the steps where the gate was
  open (the unlearning step ran)."""),
    (("rollouts_per_step",), """\
- **rollouts / step**: mean `rollout/n_samples` (DAPO's dynamic sampling generates extra
  rounds)."""),
    (("clip_frac",), """\
- **PPO clip frac**: mean `loss/clip_frac`, the fraction of tokens whose clip is active: the
  lever of every method that moves `eps_high` (DAPO's clip-higher, the adaptive controller)."""),
    (("step_s",), """\
- **s / step**: median wall-clock seconds of a training step without validation (`time/step_s −
  time/val_s`; the median, so a suspended job or a slow checkpoint write does not move it), with
  `jobs` runs sharing the machine."""),
    (("overhead",), "- **overhead vs {baseline}**: s / step ÷ {baseline}'s − 1."),
    (("cpu_step_s",), """\
- **CPU s / step**: mean `time/cpu_s` (CPU seconds of the training process, all threads) over
  the steps without validation, steadier than wall-clock when jobs share the cores."""),
    (("cpu_overhead",), "- **CPU overhead vs {baseline}**: CPU s / step ÷ {baseline}'s − 1."),
    ((), """\
- Timing columns vary between reruns and machines; every other column is reproduced exactly by
  rerunning with the same seeds (see the fingerprint). ± is the sample standard deviation over
  seeds; no ± with one seed."""),
]


def _claims_table(claims: list[dict]) -> list[str]:
    lines = ["| # | claim | paper | conditions: estimate [95% interval] (claimed side: verdict) "
             "| verdict |", "|---|---|---|---|---|"]
    for c in claims:
        lines.append(f"| {c['id']} | {_md(c['claim'])} | {_md(c['paper'])} | {_md(c['numbers'])} "
                     f"| **{c['verdict']}** |")
    return [*lines, "", chance_line(claims)]


def _law_section(ev) -> list[str]:
    law = (ev.law if ev is not None else {}) or {}
    if law.get("a") is None:
        return ["The law could not be fitted across the runs (too few validation points, or "
                "the fit failed on most resamples).", ""]
    out = [f"Fitted across every run of the study ({law['runs']} runs, {law['points']} "
           "validation points of (training-batch entropy, validation accuracy)), with 95% "
           "intervals from a bootstrap over runs (Monte-Carlo error of R²'s bounds "
           f"{law['r2'].mc_error:.4f}): "
           f"a = {law['a'].fmt_abs()}, b = {law['b'].fmt_abs()}, R² = {law['r2'].fmt_abs()}.",
           ""]
    for size, fit in (law.get("by_size") or {}).items():
        if fit.get("a") is not None:
            out += [f"- lab model size `{size}`: a = {fit['a'].fmt_abs()}, b = "
                    f"{fit['b'].fmt_abs()}, R² = {fit['r2'].fmt_abs()} ({fit['runs']} runs)"]
    return out + [""]


def write_documents(out: Path, spec, spec_path: Path, quick: bool, rows: list[str],
                    table: dict[str, dict[str, Stat]], claims: list[dict],
                    figures: list[tuple[str, str]], per_run: dict[str, list[dict]],
                    failed: list, wall_s: float, budget: str, ev=None,
                    tuned: dict | None = None, jobs: list[int] | None = None, *,
                    frontier=None, long=None, tuning_md: list[str] | None = None,
                    baseline: str | None = BASELINE) -> dict:
    """Write study.md, claims.md and study.json into ``out``; returns the study.json payload.
    ``jobs``: the job counts its invocations ran with (default the spec's); ``frontier``: the
    sweep's ``Frontier``; ``long``: entropy, pass@k and the frontier at intermediate
    checkpoints (``checkpoints.LongHorizon``); ``tuning_md``: the Tuning section's lines;
    ``baseline``: the study's GRPO row (the overheads').
    ``spec`` is the study's ``StudySpec``; ``failed`` its failed jobs (``JobResult``)."""
    cols = columns(spec.eval.k)
    table_json = {name: {k: dataclasses.asdict(s) for k, s in table[name].items()}
                  for name in rows}
    fp = fingerprint(table_json, claims, {k for k, _, _, t in cols if t})
    cmd = f"explorl study {builtin.display(spec_path, 'study')}" + (" --quick" if quick else "")
    title_quick = " (quick)" if quick else ""
    claims_md = _claims_table(claims)
    rules = _rules(spec, claims, frontier, long)
    intro = (f"Task `lab:{spec.task}`, {len(rows)} recipes × seeds "
             f"{{{', '.join(map(str, spec.seeds))}}}, {spec.max_steps} "
             f"steps each ({budget} per step for every recipe; DAPO's dynamic sampling adds "
             f"generation rounds, see rollouts / step).{start_note(spec)} Overrides for every run: "
             f"`{' '.join(spec.set) or '—'}`{_tuned_note(spec) if tuned else ''}. "
             f"Produced by `{cmd}` in {wall_s / 60:.1f} min of "
             f"wall-clock ({_jobs_text(jobs or [spec.jobs])} at a time, summed over "
             "the command's invocations); the overlay "
             "report with every curve is [report/report.md](report/report.md).")
    md = [f"# Lab study: {spec.name}{title_quick}", "", intro, ""]
    if failed:
        md += ["**Incomplete:** these runs failed and are missing from the tables: "
               + "; ".join(f"{j.plan.key} ({j.detail})" for j in failed), ""]
    md += ["## Summary (mean ± std over seeds)", "", *_summary(spec, rows, table, per_run, cols,
                                                                  baseline),
           ""]
    for title, lines in _sections(out, spec, ev, claims, tuning_md or [], frontier, long,
                                  claims_md, rules, figures):
        md += [f"## {title}", "", *lines] + ([""] if title != "Ablations" else [])
    md += ["## Reproducing", "",
           (f"`{cmd}` reruns nothing that is finished; with a fresh `--out` it retrains every run "
            "and reproduces every number above except the timing columns (wall-clock). "
            f"Fingerprint of the summary table's non-timing numbers and the claims: `{fp}` "
            "(`study.json`)."), ""]
    (out / "study.md").write_text("\n".join(md))
    (out / "claims.md").write_text("\n".join([f"# Claims: lab study {spec.name}{title_quick}", "",
                                              *claims_md, "", rules, ""]))
    payload = _payload(out, spec, spec_path, quick, cols, rows, table_json, claims, per_run,
                       failed, tuned, ev, frontier, long) | {
        "fingerprint": fp,
        "timing": {"wall_s": wall_s, "model_params": next(
            (runs[0] for runs in per_run.values() if runs), {}).get("n_params")}}
    (out / "study.json").write_text(json.dumps(_round(payload), indent=1) + "\n")
    return payload


def _summary(spec, rows: list[str], table: dict[str, dict[str, Stat]],
             per_run: dict[str, list[dict]], cols: list, baseline: str | None) -> list[str]:
    """The summary table (mean ± std over seeds) and its column notes; a column no row has a
    number for (EEPO's in a study without EEPO) is left out, with its note. The overheads are
    against ``baseline``, the study's GRPO row."""
    cols = [c for c in cols if any(table[name][c[0]].mean is not None for name in rows)]
    shown = {key for key, *_ in cols}
    called = baseline if baseline not in (None, BASELINE) else "GRPO"
    header = ["recipe", "seeds", *[title.replace("GRPO", called) for _, title, _, _ in cols]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in rows:
        cells = [name, str(len(per_run.get(name, [])))]
        cells += [table[name][k].fmt(d) for k, _, d, _ in cols]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    maxp = f" (first {spec.eval.max_problems} problems)" if spec.eval.max_problems else ""
    notes = [text.format(n=spec.eval.n, T=spec.eval.temperature, split=spec.eval.split,
                         maxp=maxp, baseline=called)
             for keys, text in COLUMN_NOTES
             if not keys or any(k == key or (k.endswith("@") and key.startswith(k))
                                for k in keys for key in shown)]
    return [*lines, "", *notes]


def _rules(spec, claims: list[dict], frontier, long) -> str:
    """How the claims are judged: the rule notes, and the frontier's and the long horizon's."""
    rules = rule_notes(len(spec.seeds))
    if frontier_table(frontier):
        rules += "\n\n" + claim_rule(frontier)
    if long is not None and frontier_table(long.along):
        rules += "\n\n" + claim_rule(long.along, "T")
    if any(c["id"] == "H-collapse" for c in claims):
        cp = long.checkpoints if long else None
        rules += "\n\n" + HORIZON_RULE.format(k=cp.k if cp else "k")
    return rules


def _sections(out: Path, spec, ev, claims: list[dict], tuning_md: list[str], frontier,
              long, claims_md: list[str], rules: str,
              figures: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """study.md's sections between the summary and Reproducing, in order, each (title, lines);
    a section with nothing to show is left out."""
    cp, horizon, along = ((long.checkpoints, long.horizon, long.along) if long
                          else (None, None, None))
    got = [
        ("Tuning", tuning_md),
        (f"The pass@1–pass@{frontier.k if frontier else 'k'} frontier", frontier_table(frontier)),
        ("Checkpoints", checkpoint_table(cp)),
        (f"The pass@1–pass@{along.k if along else 'k'} frontier along training",
         frontier_table(along)),
        ("Entropy over training", horizon_lines(horizon)),
        (f"pass@k on the {spec.eval.split} split ({spec.eval.n} samples per problem, "
         f"T = {spec.eval.temperature})", passk_tables(ev)),
        ("Tool use", tool_tables(ev, out)),
        ("Evaluation temperature", temperature_tables(ev)),
        ("Claims", [*claims_md, "", rules]),
        ("Ablations", ablation_tables(spec, ev)),
        ("Power", power_table(spec, ev)),
        ("The entropy–performance law across runs", _law_section(ev)[:-1]),
        ("Variants", [f"- `{v.name}` = `{v.recipe}` + `{' '.join(v.set)}`"
                      + (f": {v.why}" if v.why else "") for v in spec.variants]),
        ("Figures", [x for title, file in figures
                     for x in (f"### {title}", "", f"![{title}](report/{file})", "")][:-1]),
    ]
    return [(title, lines) for title, lines in got if lines]


def _payload(out: Path, spec, spec_path: Path, quick: bool, cols: list,
             rows: list[str], table_json: dict, claims: list[dict],
             per_run: dict[str, list[dict]], failed: list, tuned: dict | None, ev,
             frontier, long) -> dict:
    """study.json's numbers (the fingerprint and the timing join them)."""
    cp, horizon, along = ((long.checkpoints, long.horizon, long.along) if long
                          else (None, None, None))
    return {
        "spec": {**dataclasses.asdict(spec), "quick": quick, "path": str(spec_path)},
        "columns": [{"key": k, "title": t, "timing": tm} for k, t, _, tm in cols],
        "rows": rows,
        "table": table_json,
        "claims": claims,
        "passk": ({name: {str(k): float(v[k].mean()) for k in v} for name, v in ev.passk.items()}
                  | {b: {str(k): ev.mean_passk(b, k) for k in ev.k_list}
                     for b in base_rows(ev)} if ev is not None else {}),
        "law": {k: (v.to_json() if hasattr(v, "to_json") else v)
                for k, v in ((ev.law if ev is not None else {}) or {}).items()
                if k not in ("by_size", "fit")},
        "runs": {f"{name}-seed{r['seed']}": dict(r) for name, rs in per_run.items() for r in rs},
        "failed": [j.plan.key for j in failed],
        "tuning": {n: [p.to_json() for p in pts] for n, pts in (tuned or {}).items()},
        "passk_t": ({f"{t:g}": {n: {str(k): float(v[k].mean()) for k in v} for n, v in pk.items()}
                     for t, pk in ev.passk_t.items()} if ev is not None else {}),
        **({"frontier": frontier_json(frontier)} if frontier is not None else {}),
        **({"horizon": horizon_json(horizon)} if horizon is not None else {}),
        **({"checkpoints": checkpoint_json(cp)} if cp is not None else {}),
        **({"frontier_along_training": frontier_json(along)} if along is not None else {}),
        **({"tools": tool_json(ev, out)} if tool_tables(ev, out) else {}),
    }


def publish(out: Path, dest: Path) -> None:
    """Copy the study's markdown, JSON and PNGs (not the runs, logs or the HTML) to ``dest``
    (the runs' numbers go to the spec's ``archive``: ``explorl.study.data``)."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "report").mkdir(parents=True)
    for name in ("study.md", "claims.md", "study.json"):
        shutil.copy2(out / name, dest / name)
    for p in (out / "report").iterdir():
        if p.suffix in (".md", ".png", ".json"):
            shutil.copy2(p, dest / "report" / p.name)


def start_note(spec) -> str:
    """The intro's sentence on a warm start (``start:``); empty without one."""
    st = spec.start
    if st is None:
        return ""
    extra = f" with `{' '.join(st.set)}`" if st.set else ""
    return (f" Every run starts from one trained policy, not the task's model: start: "
            f"`{st.recipe}` seed {st.seed} after {st.steps} steps{extra} (`start/`, its final "
            "checkpoint); the base row is that policy.")


def _tuned_note(spec) -> str:
    """Which of the every-run overrides the tuned settings replace (the final runs train at the
    chosen value, not at the spec's ``set``)."""
    keys = sorted({t.key for t in spec.tune.values()} & {x.split("=", 1)[0] for x in spec.set})
    if not keys:
        return ""
    return (" (the tuned settings replace " + ", ".join(f"`{k}`" for k in keys)
            + ": see Tuning)")

"""Compare runs: overlaid curves and a table of final figures per recipe (md + html + json).

Runs that share a recipe ``name`` (different seeds) form one group, drawn as the mean over
its runs with a min–max band, and tabulated as mean ± sample standard deviation across runs.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from explorl.analysis.curves import (
    ALL_PANEL_FILES,
    MANY_GROUPS,
    SECTIONS,
    Group,
    display_window,
    draw,
    panels,
)
from explorl.analysis.frontier import draw_frontier, run_points
from explorl.analysis.runs import PASSK_KEY, Run, load_run
from explorl.outputs.completions import read_completions

FRONTIER_SECTION = "Evaluation"  # the frontier figure, from the runs' eval/ results
FINAL_FRACTION = 0.1  # "final" reward/entropy = mean over the last 10% of logged steps
COMPLETIONS_SHOWN = 4  # per run and step: the report's first and last logged completions
RESPONSE_CHARS = 400  # a longer response is cut (the full text is in completions.jsonl)


# ----------------------------------------------------------------------------- completions


def completion_samples(run: Run) -> list[tuple[int, list[dict]]]:
    """What the run's model wrote at its first and its last logged step: ``[(step, rows)]`` of
    ``completions.jsonl`` (validation rows where a step has them, else training rows), at most
    ``COMPLETIONS_SHOWN`` each; empty when the run logged none."""
    rows = read_completions(run.path / "completions.jsonl")
    if not rows:
        return []
    steps = sorted({r["step"] for r in rows})
    out = []
    for step in dict.fromkeys((steps[0], steps[-1])):
        at = [r for r in rows if r["step"] == step]
        val = [r for r in at if r.get("split") == "val"]
        out.append((step, (val or at)[:COMPLETIONS_SHOWN]))
    return out


def _clip(text: str) -> str:
    return text if len(text) <= RESPONSE_CHARS else text[:RESPONSE_CHARS] + " …"


# ----------------------------------------------------------------------------- final figures


def _tail_mean(values: list[float]) -> float | None:
    if not values:
        return None
    m = max(1, math.ceil(FINAL_FRACTION * len(values)))
    return statistics.fmean(values[-m:])


def run_figures(run: Run) -> dict[str, float | None]:
    """Final figures of one run (the columns of the report table)."""
    reward = run.series("reward/mean")[1]
    entropy = run.series("entropy/mean")[1]
    final_h = _tail_mean(entropy)
    out: dict[str, float | None] = {
        "final_reward": _tail_mean(reward),
        "final_entropy": final_h,
        "entropy_ratio": final_h / entropy[0] if entropy and entropy[0] != 0 else None,
        "last_val_accuracy": (run.series("val/accuracy")[1] or [None])[-1],
    }
    for key in run.passk_keys():
        out[f"last_{key}"] = (run.series(key)[1] or [None])[-1]
    wrong = run.series("rollout/all_wrong_frac")[1]
    secs = run.series("time/step_s")[1]
    out["all_wrong_frac"] = statistics.fmean(wrong) if wrong else None
    out["step_s"] = statistics.fmean(secs) if secs else None
    return out


def _columns(passk_keys: list[str]) -> list[tuple[str, str]]:
    return [
        ("final_reward", "final reward"),
        ("final_entropy", "final entropy (nats)"),
        ("entropy_ratio", "H final / H initial"),
        ("last_val_accuracy", "last val accuracy"),
        # val/pass@1 is val/accuracy (the same number): one column
        *[(f"last_{k}", f"last val {k.removeprefix('val/')}") for k in passk_keys
          if k != "val/pass@1"],
        ("all_wrong_frac", "mean all-wrong frac"),
        ("step_s", "s / step"),
    ]


def recipe_table(groups: list[Group], columns: list[tuple[str, str]]) -> list[dict]:
    """Per group: {"recipe", "seeds", "runs", "metrics": {col: {"mean", "std", "n"}}}.

    ``std`` is the sample standard deviation across the group's runs (None with one run);
    a run that never logged a metric is left out of that metric's statistics.
    """
    rows = []
    for group in groups:
        per_run = [run_figures(r) for r in group.runs]
        metrics = {}
        for col, _ in columns:
            vals = [f[col] for f in per_run if f.get(col) is not None]
            metrics[col] = {
                "mean": statistics.fmean(vals) if vals else None,
                "std": statistics.stdev(vals) if len(vals) > 1 else None,
                "n": len(vals),
            }
        rows.append({
            "recipe": group.name,
            "seeds": [r.seed for r in group.runs],
            "runs": [str(r.path) for r in group.runs],
            "metrics": metrics,
        })
    return rows


def _fmt(cell: dict) -> str:
    if cell["mean"] is None:
        return "—"
    digits = 2 if abs(cell["mean"]) >= 100 else 3
    text = f"{cell['mean']:.{digits}f}"
    if cell["std"] is not None:
        text += f" ± {cell['std']:.{digits}f}"
    return text


# ----------------------------------------------------------------------------- writers


def _md(text: str) -> str:
    return text.replace("|", "\\|")


NOTES = (
    "Final reward / final entropy: mean of `reward/mean` / `entropy/mean` over the last 10% "
    "of logged steps (at least one). H final / H initial: that final entropy divided by the "
    "entropy of the first logged step. Last val: the last validation step's value. "
    "All-wrong fraction and s / step: means over all steps. "
    "± is the sample standard deviation across the runs (seeds) of a recipe; shaded bands in "
    "the plots are the min–max range across them. Per-step curves are smoothed by a trailing "
    "mean (the x-axis label gives the window: about 5% of the run's steps with the raw values "
    "drawn faintly beneath for up to three recipes, about 1% for more); the table uses the raw "
    "values. With more than six recipes each figure is small multiples: one recipe per cell, "
    "the first recipe's curve in grey in every cell, all cells on one y axis."
)


@dataclass
class Report:
    """The files ``write_report`` made: ``figures`` are (title, section, PNG path)."""

    markdown: Path
    html: Path
    json: Path
    figures: list[tuple[str, str, Path]]


def make_report(run_dirs: list[Path], out_dir: Path) -> Path:
    """Overlay the runs' curves and tabulate final figures per recipe; returns ``report.md``
    (``write_report`` returns every file it wrote)."""
    return write_report(run_dirs, out_dir).markdown


def _shown_path(run: Path, out_dir: Path) -> str:
    """A run's directory as the report shows it: relative to the report's folder when both lie
    in one folder (a study's ``report/`` beside its ``runs/``: ``../runs/grpo-seed0``, true
    wherever the study is moved), else as given."""
    run, here = Path(run).resolve(), Path(out_dir).resolve()
    if run.is_relative_to(here.parent):
        return os.path.relpath(run, here)
    return str(run)


def write_report(run_dirs: list[Path], out_dir: Path) -> Report:
    """Write ``report.md``, ``report.html`` (self-contained: plots embedded as base64 PNG, each
    linking to its file), ``report.json`` (the table's raw numbers) and one PNG per panel that
    any run logged into ``out_dir``. PNGs of panels that no longer apply are removed."""
    if not run_dirs:
        raise ValueError("make_report needs at least one run directory")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [load_run(d) for d in run_dirs]
    groups: dict[str, Group] = {}
    for run in runs:
        groups.setdefault(run.name, Group(run.name, [])).runs.append(run)
    group_list = list(groups.values())

    passk_keys = sorted({k for r in runs for k in r.passk_keys()},
                        key=lambda k: int(PASSK_KEY.match(k).group(1)))
    figures: list[tuple[str, str, Path]] = []
    window = display_window(group_list)
    for panel in sorted(panels(passk_keys, runs), key=lambda p: SECTIONS.index(p.section)):
        path = draw(panel, group_list, out_dir / f"{panel.file}.png", window)
        if path is not None:
            figures.append((panel.title, panel.section, path))
    front = run_points(runs)
    if front is not None:  # runs with test evaluations: pass@k against pass@1, per learning rate
        series, k, split = front
        figures.append((f"pass@1–pass@{k} frontier (one line per method through its learning "
                        "rates)", FRONTIER_SECTION,
                        draw_frontier(series, out_dir / "frontier.png", k, split=split)))
    drawn = {p.name for _, _, p in figures}
    for stale in out_dir.glob("*.png"):  # a panel of an earlier report into this directory
        if stale.name not in drawn and (stale.stem in ALL_PANEL_FILES or stale.stem == "frontier"):
            stale.unlink()

    columns = _columns(passk_keys)
    rows = recipe_table(group_list, columns)
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps({"columns": columns, "rows": rows,
                                     "figures": [p.name for _, _, p in figures]}, indent=2) + "\n")

    run_lines = [(_shown_path(r.path, out_dir), r.name, "—" if r.seed is None else str(r.seed),
                  str(r.records[-1]["step"]) if r.records else "0") for r in runs]
    header = ["recipe", "runs", *[title for _, title in columns]]
    body = [[row["recipe"], str(len(row["runs"])), *[_fmt(row["metrics"][c]) for c, _ in columns]]
            for row in rows]
    sections = [(sec, [(t, p) for t, s, p in figures if s == sec])
                for sec in (*SECTIONS, FRONTIER_SECTION)]
    sections = [(sec, figs) for sec, figs in sections if figs]

    md = ["# explorl run report", "", "## Runs", "",
          "| run directory | recipe | seed | last step |", "|---|---|---|---|"]
    md += [f"| `{p}` | {_md(n)} | {s} | {t} |" for p, n, s, t in run_lines]
    md += ["", "## Final figures per recipe", "",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(_md(c) for c in cells) + " |" for cells in body]
    md += ["", NOTES, "", "## Curves", ""]
    for sec, figs in sections:
        md += [f"### {sec}", ""]
        md += [f"![{title}]({path.name})" for title, path in figs]
        md += [""]
    samples = [(r, completion_samples(r)) for r in runs]
    samples = [(r, got) for r, got in samples if got]
    if samples:
        md += ["## Completions", "", "What each run's model wrote at its first and last logged "
               "step (completions.jsonl; ✓ = the verifier's score 1).", ""]
        for run, got in samples:
            md += [f"### {_md(run.label)}", ""]
            for step, rows in got:
                md += [f"Step {step}:", ""]
                md += [f"- {'✓' if r['score'] else '✗'} `{_md(r['prompt'].splitlines()[-1])}` → "
                       f"{_md(_clip(r['response'])).replace(chr(10), ' ⏎ ')}" for r in rows]
                md += [""]
    md_path = out_dir / "report.md"
    md_path.write_text("\n".join(md))

    html_path = out_dir / "report.html"
    html_path.write_text(_html(run_lines, header, body, sections,
                               wide=len(group_list) > MANY_GROUPS, samples=samples))
    return Report(markdown=md_path, html=html_path, json=json_path, figures=figures)


CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1280px;margin:0 auto;
     padding:24px 32px;color:#1f2328;line-height:1.45}
h1{margin-bottom:4px} h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:32px}
.sub{color:#59636e;margin-top:0}
table{border-collapse:collapse;font-size:14px;margin:8px 0}
td,th{border:1px solid #d0d7de;padding:4px 10px} th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.notes{color:#59636e;font-size:13px;max-width:980px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}
figure{margin:0;border:1px solid #d0d7de;border-radius:6px;padding:8px;background:#fff}
figure.wide{grid-column:1/-1}
figure img{width:100%;display:block} figcaption{font-size:12px;color:#59636e;text-align:right}
td.resp{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px;max-width:720px}
"""


def _html(run_lines, header, body, sections, wide: bool = False, samples=()) -> str:
    """The report page; ``wide``: the figures are small multiples, each a whole row;
    ``samples``: ``[(run, completion_samples(run))]``, shown last."""
    esc = html.escape
    n_runs, n_recipes = len(run_lines), len(body)
    parts = [
        "<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
        "<title>explorl run report</title>", f"<style>{CSS}</style></head><body>",
        "<h1>explorl run report</h1>",
        (f"<p class='sub'>{n_runs} run{'s' * (n_runs != 1)} of {n_recipes} "
        f"recipe{'s' * (n_recipes != 1)}. Made by <code>explorl report</code>; the same content "
        "as <a href='report.md'>report.md</a>, the table's numbers in "
        "<a href='report.json'>report.json</a>.</p>"),
        "<h2>Runs</h2>", "<table>",
        "<tr><th>run directory</th><th>recipe</th><th>seed</th><th>last step</th></tr>",
        *[f"<tr><td><code>{esc(p)}</code></td><td>{esc(n)}</td><td class='num'>{s}</td>"
          f"<td class='num'>{t}</td></tr>" for p, n, s, t in run_lines],
        "</table>", "<h2>Final figures per recipe</h2>", "<table>",
        "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>",
        *["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells[:1])
          + "".join(f"<td class='num'>{esc(c)}</td>" for c in cells[1:]) + "</tr>"
          for cells in body],
        "</table>", f"<p class='notes'>{esc(NOTES).replace('`', '')}</p>",
    ]
    for sec, figs in sections:
        parts += [f"<h2>{esc(sec)}</h2>", "<div class='grid'>"]
        for title, path in figs:
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            cls = " class='wide'" if wide else ""
            parts += [(f"<figure{cls}><a href='{esc(path.name)}'><img alt='{esc(title)}' "
                      f"src='data:image/png;base64,{data}'></a>"
                      f"<figcaption>{esc(path.name)}</figcaption></figure>")]
        parts.append("</div>")
    if samples:
        parts += ["<h2>Completions</h2>",
                  "<p class='sub'>What each run's model wrote at its first and last logged step "
                  "(completions.jsonl; ✓ = the verifier's score 1).</p>"]
        for run, got in samples:
            parts.append(f"<h3>{esc(run.label)}</h3>")
            for step, rows in got:
                parts += [f"<p><b>Step {step}</b></p>", "<table>",
                          "<tr><th></th><th>prompt</th><th>response</th></tr>"]
                parts += [f"<tr><td>{'✓' if r['score'] else '✗'}</td>"
                          f"<td>{esc(r['prompt'].splitlines()[-1])}</td>"
                          f"<td class='resp'>{esc(_clip(r['response']))}</td></tr>" for r in rows]
                parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)

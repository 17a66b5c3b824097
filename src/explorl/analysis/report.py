"""Compare runs: overlaid curves and a table of final figures per recipe (md + html + json).

Runs that share a recipe ``name`` (different seeds) form one group, drawn as the mean over
its runs with a min–max band, and tabulated as mean ± sample standard deviation across runs.
"""

from __future__ import annotations

import base64
import html
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from explorl.analysis.runs import (
    PASSK_KEY,
    Run,
    bound_axis,
    changes,
    clip_band,
    load_run,
    metric_range,
    new_figure,
    save_figure,
    step_axes,
)

FINAL_FRACTION = 0.1  # "final" reward/entropy = mean over the last 10% of logged steps


@dataclass
class Group:
    """Runs of one recipe (usually different seeds)."""

    name: str
    runs: list[Run]

    @property
    def label(self) -> str:
        seeds = [r.seed for r in self.runs if r.seed is not None]
        if len(self.runs) == 1:
            return self.runs[0].label
        if len(seeds) == len(self.runs):
            return f"{self.name} (seeds {', '.join(map(str, seeds))})"
        return f"{self.name} ({len(self.runs)} runs)"

    def band(
        self, key: str, window: int = 1
    ) -> tuple[list[int], list[float], list[float], list[float]]:
        """(steps, mean, min, max) of ``key`` across the group's runs that logged each step; each
        run's series is first smoothed by a trailing mean over ``window`` logged points."""
        by_step: dict[int, list[float]] = {}
        for run in self.runs:
            steps, values = run.series(key)
            for s, v in zip(steps, trailing_mean(values, window)):
                by_step.setdefault(s, []).append(v)
        steps = sorted(by_step)
        vals = [by_step[s] for s in steps]
        return (
            steps,
            [statistics.fmean(v) for v in vals],
            [min(v) for v in vals],
            [max(v) for v in vals],
        )


def trailing_mean(values: list[float], window: int) -> list[float]:
    """values[i] replaced by the mean of values[max(0, i − window + 1) : i + 1]."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def smoothing_window(groups: list[Group]) -> int:
    """Trailing-mean window of the per-step curves: about 1% of the longest run (1 = none)."""
    longest = max((len(r.records) for g in groups for r in g.runs), default=0)
    return max(1, round(longest / 100))


FEW_GROUPS = 3
"""Up to this many recipes a panel has room for each one's raw per-step values, drawn faintly
under a curve smoothed over about 5% of the run (TensorBoard's view); more recipes get the 1%
smoothing of ``smoothing_window`` and no raw lines."""


def display_window(groups: list[Group]) -> int:
    """The trailing-mean window of the drawn curves (``FEW_GROUPS`` explains the two cases)."""
    if len(groups) > FEW_GROUPS:
        return smoothing_window(groups)
    longest = max((len(r.records) for g in groups for r in g.runs), default=0)
    return max(smoothing_window(groups), round(longest / 20))


def group_colors(n: int) -> list:
    """n distinguishable colours: matplotlib's 10-colour cycle, or tab20 beyond 10 lines."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]


def place_legend(ax, fig, n_entries: int) -> None:
    """Inside the axes for a few entries; to the right of it (figure widened) for many."""
    if n_entries <= 6:
        ax.legend(fontsize="small")
        return
    extra = 2.6  # inches for the legend column
    w, h = fig.get_size_inches()
    left, right = fig.subplotpars.left * w, (1 - fig.subplotpars.right) * w
    fig.set_size_inches(w + extra, h)
    fig.subplots_adjust(left=left / (w + extra), right=1 - (right + extra) / (w + extra))
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


@dataclass
class Panel:
    """One overlay figure: ``lines`` are (metric key, line style, label suffix); ``section`` is
    the report heading it appears under."""

    file: str
    title: str
    ylabel: str
    lines: list[tuple[str, str, str]]
    section: str = ""


SECTIONS = ("Reward and accuracy", "Entropy and exploration", "Policy update", "Responses")


KNOBS = {
    "temperature": ("control/temperature", "Sampling temperature", "temperature T"),
    "eps_high": ("control/eps_high", "Clip-higher eps_high", "eps_high"),
    "entropy_coef": ("control/entropy_coef", "Entropy-bonus coefficient", "entropy_coef"),
    "kl_coef": ("control/kl_coef", "Reference-KL coefficient", "kl_coef"),
}
"""Knob panels: drawn only when the knob moved in a run or differs between runs."""


def _panels(passk_keys: list[str], runs: list[Run]) -> list[Panel]:
    styles = ["-", "--", ":", "-."]
    passk = [(k, styles[i % 4], f" {k.removeprefix('val/')}") for i, k in enumerate(passk_keys)]
    H = "mean token entropy (nats)"
    eepo = any(r.series("entropy/stage1")[0] for r in runs)
    entropy_title = "Policy entropy" + (" (EEPO runs: dashed = stage 1, dotted = stage 2)"
                                        if eepo else "")
    knobs = [Panel(name, title, ylabel, [(key, "-", "")]) for name, (key, title, ylabel)
             in KNOBS.items() if changes([v for r in runs for v in r.series(key)[1]])]
    acc, ent, upd, resp = SECTIONS
    panels = [
        Panel("reward", "Training reward", "mean reward", [("reward/mean", "-", "")], acc),
        Panel("val_accuracy", "Validation accuracy (sampled)", "validation accuracy",
              [("val/accuracy", "-", "")], acc),
        Panel("val_passk", "Validation pass@k", "pass@k", passk, acc),
        Panel("all_wrong", "Prompts with all responses wrong", "fraction of prompts",
              [("rollout/all_wrong_frac", "-", "")], acc),
        Panel("entropy", entropy_title, H,
              [("entropy/mean", "-", ""), ("entropy/stage1", "--", " stage 1"),
               ("entropy/stage2", ":", " stage 2")], ent),
        *knobs,
        Panel("target_entropy", "Target entropy", H, [("control/target_entropy", "-", "")]),
        Panel("budgets", "Rollout budget per prompt (dashed = min, solid = max)",
              "samples per prompt",
              [("rollout/budget_min", "--", " min"), ("rollout/budget_max", "-", " max")]),
        Panel("covariance", "Covariance of log-prob and advantage", "mean Cov(logp, A)",
              [("cov/mean", "-", "")]),
        Panel("grad_norm", "Gradient norm (before clipping)", "global L2 norm",
              [("grad/norm", "-", "")], upd),
        Panel("clip_frac", "PPO clip fraction", "fraction of tokens",
              [("loss/clip_frac", "-", "")], upd),
        Panel("response_length", "Response length (solid = mean, dashed = max)", "tokens",
              [("response/length_mean", "-", " mean"), ("response/length_max", "--", " max")],
              resp),
        Panel("truncated", "Truncated responses (no EOS before the length limit)",
              "fraction of responses", [("response/truncated_frac", "-", "")], resp),
    ]
    for p in panels:
        p.section = p.section or ent
    return panels


MANY_GROUPS = 6
"""Beyond this many recipes one set of axes is a thicket: each panel becomes small multiples,
one recipe per cell against the first recipe (the reference, e.g. GRPO) drawn in grey."""

MULTIPLES_COLUMNS = 4


def _draw(panel: Panel, groups: list[Group], path: Path, window: int) -> Path | None:
    fig = _figure(panel, groups, window)
    return None if fig is None else save_figure(fig, path)


def _figure(panel: Panel, groups: list[Group], window: int):
    """The panel's figure (None when no group logged any of its keys): one set of axes for up
    to ``MANY_GROUPS`` recipes, small multiples beyond."""
    if len(groups) > MANY_GROUPS:
        return _multiples(panel, groups)
    return _overlay(panel, groups, window)


def _multiples(panel: Panel, groups: list[Group]):
    """One cell per recipe: its mean with the min–max band over seeds in colour, the first
    recipe's mean in grey beneath for reference; every cell on the same y axis. Each cell
    holds two recipes, so the curves get the few-recipe smoothing (about 5% of the run)."""
    cells = [g for g in groups if any(g.band(k)[0] for k, _, _ in panel.lines)]
    if not cells:
        return None
    ref = groups[0]
    window = display_window(groups[:1])
    ncols = min(MULTIPLES_COLUMNS, len(cells))
    nrows = math.ceil(len(cells) / ncols)
    fig, axes = new_figure(nrows, ncols, width=3.4, height=2.5, suptitle=True)
    bounds = metric_range(panel.lines[0][0], groups[0].runs[0].config)
    multi_line = len(panel.lines) > 1
    for i, ax in enumerate(ax for row in axes for ax in row):
        if i >= len(cells):
            ax.set_visible(False)
            continue
        group = cells[i]
        for key, style, suffix in panel.lines:
            sparse = key.startswith("val/")
            w = 1 if sparse else window
            marker = "o" if sparse else None
            if group is not ref:
                steps, mean, _, _ = ref.band(key, w)
                if steps:
                    ax.plot(steps, mean, color="0.6", linestyle=style, marker=marker,
                            markersize=2, linewidth=1.0)
            steps, mean, lo, hi = group.band(key, w)
            if not steps:
                continue
            ax.plot(steps, mean, color="C0", linestyle=style, marker=marker, markersize=2,
                    linewidth=1.2, label=suffix.strip() or None)
            if len(group.runs) > 1:
                lo, hi = clip_band(lo, hi, bounds)
                ax.fill_between(steps, lo, hi, color="C0", alpha=0.15, linewidth=0)
        seeds = f" ({len(group.runs)} seeds)" if len(group.runs) > 1 else ""
        ax.set_title(group.name + seeds + (" — reference" if group is ref else ""),
                     fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.grid(alpha=0.3)
        step_axes(ax)
        if i == 0 and multi_line and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="xx-small")
    shown = [ax for row in axes for ax in row if ax.get_visible()]
    low = min(ax.get_ylim()[0] for ax in shown)
    high = max(ax.get_ylim()[1] for ax in shown)
    for ax in shown:
        ax.set_ylim(low, high)
        bound_axis(ax, bounds)
    for c in range(ncols):  # the lowest visible cell of each column
        [ax for row in axes for ax in row[c:c + 1] if ax.get_visible()][-1].set_xlabel(
            "training step", fontsize="small")
    for row in axes:
        row[0].set_ylabel(panel.ylabel, fontsize="small")
    notes = [f"{window}-step trailing mean"] if window > 1 else []
    if any(len(g.runs) > 1 for g in cells):
        notes.append("band = min–max over seeds")
    fig.suptitle(f"{panel.title}: one recipe per cell, grey = {ref.name}"
                 + (f" ({'; '.join(notes)})" if notes else ""), fontsize="medium")
    return fig


def _overlay(panel: Panel, groups: list[Group], window: int):
    fig, axes = new_figure(width=7.0, height=4.2)
    ax = axes[0][0]
    colors = group_colors(len(groups))
    entries, smoothed = 0, False
    for group, color in zip(groups, colors):
        for key, style, suffix in panel.lines:
            sparse = key.startswith("val/")  # validation points: drawn as they are
            steps, mean, lo, hi = group.band(key, 1 if sparse else window)
            if not steps:
                continue
            smoothed |= not sparse and window > 1
            raw = not sparse and window > 1 and len(groups) <= FEW_GROUPS
            if raw:  # the values behind the smoothed curve, faintly
                ax.plot(*group.band(key, 1)[:2], color=color, linestyle=style, linewidth=0.8,
                        alpha=0.3)
            marker = "o" if len(steps) == 1 or sparse else None
            ax.plot(steps, mean, color=color, linestyle=style, marker=marker, markersize=3,
                    linewidth=1.2, label=group.label + suffix)
            if len(group.runs) > 1:
                lo, hi = clip_band(lo, hi, metric_range(key, group.runs[0].config))
                ax.fill_between(steps, lo, hi, color=color, alpha=0.12, linewidth=0)
            entries += 1
    if not entries:
        return None
    ax.set_title(panel.title)
    notes = [f"{window}-step trailing mean"
             + (", faint: raw" if len(groups) <= FEW_GROUPS else "")] if smoothed else []
    if any(len(g.runs) > 1 for g in groups):
        notes.append("band = min–max over seeds")
    ax.set_xlabel("training step" + (f" ({'; '.join(notes)})" if notes else ""))
    ax.set_ylabel(panel.ylabel)
    bound_axis(ax, metric_range(panel.lines[0][0], groups[0].runs[0].config))
    ax.grid(alpha=0.3)
    step_axes(ax)
    place_legend(ax, fig, entries)
    return fig


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
    panels = _panels(passk_keys, runs)
    for panel in sorted(panels, key=lambda p: SECTIONS.index(p.section)):
        path = _draw(panel, group_list, out_dir / f"{panel.file}.png", window)
        if path is not None:
            figures.append((panel.title, panel.section, path))
    drawn = {p.name for _, _, p in figures}
    for stale in out_dir.glob("*.png"):  # a panel of an earlier report into this directory
        if stale.name not in drawn and stale.stem in _ALL_PANEL_FILES:
            stale.unlink()

    columns = _columns(passk_keys)
    rows = recipe_table(group_list, columns)
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps({"columns": columns, "rows": rows,
                                     "figures": [p.name for _, _, p in figures]}, indent=2) + "\n")

    run_lines = [(str(r.path), r.name, "—" if r.seed is None else str(r.seed),
                  str(r.records[-1]["step"]) if r.records else "0") for r in runs]
    header = ["recipe", "runs", *[title for _, title in columns]]
    body = [[row["recipe"], str(len(row["runs"])), *[_fmt(row["metrics"][c]) for c, _ in columns]]
            for row in rows]
    sections = [(sec, [(t, p) for t, s, p in figures if s == sec]) for sec in SECTIONS]
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
    md_path = out_dir / "report.md"
    md_path.write_text("\n".join(md))

    html_path = out_dir / "report.html"
    html_path.write_text(_html(run_lines, header, body, sections,
                               wide=len(group_list) > MANY_GROUPS))
    return Report(markdown=md_path, html=html_path, json=json_path, figures=figures)


_ALL_PANEL_FILES = {p.file for p in _panels([], [])} | set(KNOBS)

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
"""


def _html(run_lines, header, body, sections, wide: bool = False) -> str:
    """The report page; ``wide``: the figures are small multiples, each a whole row."""
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
    parts.append("</body></html>")
    return "\n".join(parts)

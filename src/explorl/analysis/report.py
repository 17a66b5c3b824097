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

from explorl.analysis.runs import PASSK_KEY, Run, load_run, new_figure, save_figure

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

    def band(self, key: str, window: int = 1) -> tuple[list[int], list[float], list[float], list[float]]:
        """(steps, mean, min, max) of ``key`` across the group's runs that logged each step; each
        run's series is first smoothed by a trailing mean over ``window`` logged points."""
        by_step: dict[int, list[float]] = {}
        for run in self.runs:
            steps, values = run.series(key)
            for s, v in zip(steps, trailing_mean(values, window)):
                by_step.setdefault(s, []).append(v)
        steps = sorted(by_step)
        vals = [by_step[s] for s in steps]
        return steps, [statistics.fmean(v) for v in vals], [min(v) for v in vals], [max(v) for v in vals]


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
    """One overlay figure: ``lines`` are (metric key, line style, label suffix)."""

    file: str
    title: str
    ylabel: str
    lines: list[tuple[str, str, str]]


def _panels(passk_keys: list[str]) -> list[Panel]:
    styles = ["-", "--", ":", "-."]
    passk = [(k, styles[i % 4], f" {k.removeprefix('val/')}") for i, k in enumerate(passk_keys)]
    H = "mean token entropy (nats)"
    return [
        Panel("reward", "Training reward", "mean reward", [("reward/mean", "-", "")]),
        Panel("entropy", "Policy entropy (EEPO: dashed = stage 1, dotted = stage 2)", H,
              [("entropy/mean", "-", ""), ("entropy/stage1", "--", " stage 1"),
               ("entropy/stage2", ":", " stage 2")]),
        Panel("val_accuracy", "Validation accuracy", "validation accuracy",
              [("val/accuracy", "-", "")]),
        Panel("val_passk", "Validation pass@k", "pass@k", passk),
        Panel("temperature", "Sampling temperature", "temperature T",
              [("control/temperature", "-", "")]),
        Panel("eps_high", "Clip-higher eps_high", "eps_high", [("control/eps_high", "-", "")]),
        Panel("target_entropy", "Target entropy", H, [("control/target_entropy", "-", "")]),
        Panel("budgets", "Rollout budget per prompt (dashed = min, solid = max)",
              "samples per prompt",
              [("rollout/budget_min", "--", " min"), ("rollout/budget_max", "-", " max")]),
        Panel("covariance", "Covariance of log-prob and advantage", "mean Cov(logp, A)",
              [("cov/mean", "-", "")]),
        Panel("all_wrong", "Prompts with all responses wrong", "fraction of prompts",
              [("rollout/all_wrong_frac", "-", "")]),
    ]


def _draw(panel: Panel, groups: list[Group], path: Path, window: int) -> Path | None:
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
            marker = "o" if len(steps) == 1 or sparse else None
            ax.plot(steps, mean, color=color, linestyle=style, marker=marker, markersize=3,
                    linewidth=1.2, label=group.label + suffix)
            if len(group.runs) > 1:
                ax.fill_between(steps, lo, hi, color=color, alpha=0.12, linewidth=0)
            entries += 1
    if not entries:
        return None
    ax.set_title(panel.title)
    notes = [f"{window}-step trailing mean"] if smoothed else []
    if any(len(g.runs) > 1 for g in groups):
        notes.append("band = min–max over seeds")
    ax.set_xlabel("training step" + (f" ({'; '.join(notes)})" if notes else ""))
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    place_legend(ax, fig, entries)
    return save_figure(fig, path)


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
        *[(f"last_{k}", f"last val {k.removeprefix('val/')}") for k in passk_keys],
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
    "mean over about 1% of the run's steps (the x-axis label gives the window); the table "
    "uses the raw values."
)


def make_report(run_dirs: list[Path], out_dir: Path) -> Path:
    """Overlay the runs' curves and tabulate final figures per recipe; returns ``report.md``.

    Also writes ``report.html`` (self-contained: plots embedded as base64 PNG), ``report.json``
    (the table's raw numbers) and one PNG per metric that any run logged.
    """
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
    figures = []
    window = smoothing_window(group_list)
    for panel in _panels(passk_keys):
        path = _draw(panel, group_list, out_dir / f"{panel.file}.png", window)
        if path is not None:
            figures.append((panel.title, path))

    columns = _columns(passk_keys)
    rows = recipe_table(group_list, columns)
    (out_dir / "report.json").write_text(json.dumps({"columns": columns, "rows": rows}, indent=2) + "\n")

    run_lines = [(str(r.path), r.name, "—" if r.seed is None else str(r.seed),
                  str(r.records[-1]["step"]) if r.records else "0") for r in runs]
    header = ["recipe", "runs", *[title for _, title in columns]]
    body = [[row["recipe"], str(len(row["runs"])), *[_fmt(row["metrics"][c]) for c, _ in columns]]
            for row in rows]

    md = ["# explorl run report", "", "## Runs", "",
          "| run directory | recipe | seed | last step |", "|---|---|---|---|"]
    md += [f"| `{p}` | {_md(n)} | {s} | {t} |" for p, n, s, t in run_lines]
    md += ["", "## Final figures per recipe", "",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(_md(c) for c in cells) + " |" for cells in body]
    md += ["", NOTES, "", "## Curves", ""]
    for title, path in figures:
        md += [f"### {title}", "", f"![{title}]({path.name})", ""]
    md_path = out_dir / "report.md"
    md_path.write_text("\n".join(md))

    esc = html.escape
    parts = [
        "<!DOCTYPE html>", "<html><head><meta charset='utf-8'><title>explorl run report</title>",
        ("<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
         "img{max-width:100%}</style></head><body>"),
        "<h1>explorl run report</h1>", "<h2>Runs</h2>", "<table>",
        "<tr><th>run directory</th><th>recipe</th><th>seed</th><th>last step</th></tr>",
        *[f"<tr><td><code>{esc(p)}</code></td><td>{esc(n)}</td><td>{s}</td><td>{t}</td></tr>"
          for p, n, s, t in run_lines],
        "</table>", "<h2>Final figures per recipe</h2>", "<table>",
        "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>",
        *["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>" for cells in body],
        "</table>", f"<p>{esc(NOTES).replace('`', '')}</p>", "<h2>Curves</h2>",
    ]
    for title, path in figures:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts += [f"<h3>{esc(title)}</h3>", f"<img alt='{esc(title)}' src='data:image/png;base64,{data}'>"]
    parts.append("</body></html>")
    (out_dir / "report.html").write_text("\n".join(parts))
    return md_path

"""The declared endpoints' figure: each arm minus the baseline on every endpoint a study
declares for its arms (``claims:`` entries with ``arms:``), with the 95% interval the verdict
reads and the minimum detectable effect beside it: the study's answer on one page.

The per-arm marginal bars of the frontier figure overlap even where a paired difference is
resolved (the seeds move arm and baseline together); this figure draws the paired differences
themselves."""

from __future__ import annotations

import re
from pathlib import Path

from explorl.analysis.runs import new_figure, save_figure

# a condition's label: "<arm> − <baseline>, <quantity>" (``declared.as_claim``)
LABEL = re.compile(r"^(?P<arm>.+?) − (?P<vs>.+?), (?P<quantity>.+)$")
COLOURS = {"shown": "tab:green", "opposite": "tab:red"}
FILE = "endpoints.png"


def endpoint_panels(claims: list[dict], ids: set[str]) -> dict[str, list[dict]]:
    """The claims among ``ids`` that are one paired difference with an interval, grouped by
    endpoint ("<quantity> − <baseline>") in the claims' order; each row: arm, estimate, low,
    high, mde (None without one) and verdict."""
    panels: dict[str, list[dict]] = {}
    for c in claims:
        conds = c.get("conditions") or []
        if c["id"] not in ids or len(conds) != 1:
            continue
        cond, iv = conds[0], conds[0].get("interval")
        m = LABEL.match(cond.get("label", ""))
        if iv is None or m is None:
            continue
        power = iv.get("power") or {}
        panels.setdefault(f"{m['quantity']}|{m['vs']}", []).append({
            "arm": m["arm"], "estimate": iv["estimate"], "low": iv["low"], "high": iv["high"],
            "mde": power.get("mde"), "verdict": cond.get("verdict", ""),
            "null": cond.get("null", 0.0)})
    return panels


def draw_endpoints(claims: list[dict], ids: set[str], out_dir: Path) -> str | None:
    """``endpoints.png`` in ``out_dir``: one panel per declared endpoint (stacked), a row per
    arm: its estimate (green: shown, red: opposite, grey: not shown) with its 95% interval,
    and in light grey ± its MDE around the null (80% power). None when no claim qualifies."""
    panels = endpoint_panels(claims, ids)
    if not panels:
        return None
    rows, n = max(len(v) for v in panels.values()), len(panels)
    names = max(len(r["arm"]) for v in panels.values() for r in v)
    # one panel under another, so the figure keeps a page's width and its text stays legible
    fig, axes = new_figure(nrows=n, width=7.0, height=1.6 + 0.36 * rows, suptitle=True)
    W, label = fig.get_figwidth(), 0.3 + 0.075 * names  # inches for the arms' names
    fig.subplots_adjust(left=label / W, top=1 - 1.0 / fig.get_figheight())  # a 2-line title
    for (ax,), (key, got) in zip(axes, panels.items()):
        quantity, vs = key.split("|", 1)
        ys = list(range(len(got)))[::-1]
        for y, r in zip(ys, got):
            if r["mde"] is not None:
                ax.plot([r["null"] - r["mde"], r["null"] + r["mde"]], [y, y], color="0.85",
                        linewidth=9, solid_capstyle="butt", zorder=1)
            colour = COLOURS.get(r["verdict"], "0.35")
            ax.errorbar([r["estimate"]], [y], xerr=[[r["estimate"] - r["low"]],
                                                    [r["high"] - r["estimate"]]],
                        fmt="o", color=colour, capsize=3, zorder=3)
        ax.axvline(got[0]["null"], color="black", linewidth=0.8, zorder=2)
        ax.set_yticks(ys, [r["arm"] for r in got])
        ax.set_ylim(-0.7, len(got) - 0.3)
        ax.set_title(quantity, fontsize="medium")
        ax.set_xlabel(f"arm − {vs}")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Each arm − the baseline, paired by seed: 95% intervals\n(green: shown, red: "
                 "opposite, grey: not shown; light grey: ± the MDE around 0)", fontsize="medium")
    save_figure(fig, out_dir / FILE, dpi=90)
    return FILE

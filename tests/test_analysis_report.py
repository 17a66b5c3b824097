"""make_report: files written, grouping by recipe, table numbers equal hand-computed values."""

import json
import math
import re
import statistics

import pytest

from explorl.analysis import make_report


def write_run(path, records, name, seed):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"name: {name}\nseed: {seed}\nmax_steps: 20\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def records(offset=0.0, val=True, controls=False):
    """20 steps: reward = step/10 + offset, entropy = 2 − 0.05·step, validation every 5."""
    out = []
    for step in range(1, 21):
        rec = {
            "step": step,
            "reward/mean": step / 10 + offset,
            "entropy/mean": 2.0 - 0.05 * step,
            "rollout/all_wrong_frac": 0.5 if step % 2 else 0.0,
            "time/step_s": 2.0 + offset,
        }
        rec["control/eps_high"] = 0.2  # every run logs its knobs; this one never moves
        if controls:
            rec.update(
                {
                    "control/temperature": 1.0 + 0.01 * step,
                    "entropy/stage1": 1.0,
                    "entropy/stage2": 0.5,
                    "rollout/budget_min": 4,
                    "rollout/budget_max": 12,
                    "cov/mean": 0.01,
                }
            )
        if val and step % 5 == 0:
            rec["val/accuracy"] = step / 100 + offset
            rec["val/pass@4"] = step / 50
        out.append(rec)
    return out


def rows_by_recipe(out_dir):
    data = json.loads((out_dir / "report.json").read_text())
    return {row["recipe"]: row for row in data["rows"]}


def test_two_runs_report_files_and_numbers(tmp_path):
    a = write_run(tmp_path / "a", records(), "grpo", 0)
    b = write_run(tmp_path / "b", records(offset=1.0, val=False, controls=True), "eepo", 1)
    md_path = make_report([a, b], tmp_path / "report")
    out = tmp_path / "report"
    assert md_path == out / "report.md"

    md = md_path.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert "reward.png" in links and "entropy.png" in links and "val_passk.png" in links
    assert "temperature.png" in links and "budgets.png" in links
    assert "eps_high.png" not in links  # logged, but the same constant in every run
    for link in links:
        assert (out / link).read_bytes()[:4] == b"\x89PNG"

    # the runs lie beside the report: shown relative to it (true wherever the folder moves)
    assert "| `../a` | grpo | 0 |" in md and "| `../b` | eepo | 1 |" in md

    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(links)
    assert "<table>" in html and "src='reward.png'" not in html
    assert "EEPO" in html  # the eepo run logged stage entropies: the entropy title explains them

    grpo, eepo = rows_by_recipe(out)["grpo"]["metrics"], rows_by_recipe(out)["eepo"]["metrics"]
    # last 10% of 20 steps = steps 19 and 20
    assert grpo["final_reward"]["mean"] == pytest.approx((1.9 + 2.0) / 2)
    final_h = ((2.0 - 0.95) + (2.0 - 1.0)) / 2
    assert grpo["final_entropy"]["mean"] == pytest.approx(final_h)
    assert grpo["entropy_ratio"]["mean"] == pytest.approx(final_h / 1.95)
    assert grpo["last_val_accuracy"]["mean"] == pytest.approx(0.20)
    assert grpo["last_val/pass@4"]["mean"] == pytest.approx(0.40)
    assert grpo["all_wrong_frac"]["mean"] == pytest.approx(0.25)
    assert grpo["step_s"]["mean"] == pytest.approx(2.0)
    assert grpo["final_reward"]["std"] is None  # one seed: no spread
    assert eepo["final_reward"]["mean"] == pytest.approx(2.95)
    assert eepo["last_val_accuracy"]["mean"] is None and eepo["step_s"]["mean"] == pytest.approx(
        3.0
    )

    # the markdown table shows the same numbers
    assert "| grpo | 1 | 1.950 | 1.025 | 0.526 | 0.200 | 0.400 | 0.250 | 2.000 |" in md
    assert "| eepo | 1 | 2.950 | 1.025 | 0.526 | — | — | 0.250 | 3.000 |" in md


def test_seeds_of_one_recipe_are_grouped(tmp_path):
    runs = [write_run(tmp_path / f"s{i}", records(offset=0.1 * i), "clip_cov", i) for i in range(3)]
    make_report(runs, tmp_path / "out")
    rows = rows_by_recipe(tmp_path / "out")
    assert list(rows) == ["clip_cov"] and rows["clip_cov"]["seeds"] == [0, 1, 2]
    final = rows["clip_cov"]["metrics"]["final_reward"]
    per_seed = [1.95, 2.05, 2.15]
    assert final["mean"] == pytest.approx(statistics.fmean(per_seed))
    assert final["std"] == pytest.approx(statistics.stdev(per_seed)) and final["n"] == 3
    assert math.isclose(final["std"], 0.1)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| clip_cov | 3 | 2.050 ± 0.100 |" in md


def test_report_survives_sparse_runs(tmp_path):
    one = write_run(tmp_path / "one", [{"step": 1, "reward/mean": 0.5}], "tiny", 0)
    empty = write_run(tmp_path / "empty", [], "empty", 0)
    md = make_report([one, empty], tmp_path / "out").read_text()
    assert "![Training reward](reward.png)" in md
    assert "| tiny | 1 | 0.500 | — |" in md
    with pytest.raises(ValueError):
        make_report([], tmp_path / "none")


def test_trailing_mean_by_hand():
    from explorl.analysis.curves import trailing_mean

    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 3) == [1.0, 2.0, 3.0, 5.0]
    assert trailing_mean([1.0, 3.0], 1) == [1.0, 3.0]
    assert trailing_mean([], 5) == []


def test_band_smooths_each_run_before_combining_seeds(tmp_path):
    from explorl.analysis.curves import Group, smoothing_window
    from explorl.analysis.runs import load_run

    a = load_run(write_run(tmp_path / "a", [{"step": s, "x": float(s)} for s in (1, 2, 3)], "r", 0))
    b = load_run(write_run(tmp_path / "b", [{"step": s, "x": 10.0 * s} for s in (1, 2, 3)], "r", 1))
    steps, mean, lo, hi = Group("r", [a, b]).band("x", window=2)
    # a smoothed: 1, 1.5, 2.5; b smoothed: 10, 15, 25
    assert steps == [1, 2, 3] and lo == [1.0, 1.5, 2.5] and hi == [10.0, 15.0, 25.0]
    assert mean == pytest.approx([5.5, 8.25, 13.75])
    assert smoothing_window([Group("r", [a, b])]) == 1  # 3 steps: no smoothing
    long = load_run(
        write_run(tmp_path / "c", [{"step": s, "x": 0.0} for s in range(1, 1001)], "r", 2)
    )
    assert smoothing_window([Group("r", [a, long])]) == 10  # ~1% of the longest run


def test_many_lines_get_distinct_colours_and_an_outside_legend(tmp_path):
    from explorl.analysis.curves import group_colors

    assert group_colors(3) == ["C0", "C1", "C2"]
    many = group_colors(13)
    assert len({tuple(c) for c in many}) == 13
    # 4 recipes × 3 entropy lines (mean, stage 1, stage 2) = 12 legend entries: outside
    runs = [write_run(tmp_path / f"r{i}", records(offset=0.01 * i, controls=True), f"recipe{i}",
                      0) for i in range(4)]
    make_report(runs, tmp_path / "out")
    from PIL import Image

    w, _ = Image.open(tmp_path / "out" / "entropy.png").size
    w_few, _ = Image.open(make_report(runs[:2], tmp_path / "few").parent / "entropy.png").size
    assert w > w_few  # the legend column widens the figure


def test_many_recipes_are_drawn_as_small_multiples_against_the_first(tmp_path):
    """Beyond MANY_GROUPS recipes: one cell per recipe (its own curve in colour, the first
    recipe's in grey), every cell on one y axis; the HTML gives each figure a whole row."""
    from explorl.analysis.curves import MANY_GROUPS, Group, figure, panels
    from explorl.analysis.report import write_report
    from explorl.analysis.runs import load_run

    n = MANY_GROUPS + 1
    runs = [load_run(write_run(tmp_path / f"r{i}", records(offset=0.1 * i), f"recipe{i}", 0))
            for i in range(n)]
    groups = [Group(r.name, [r]) for r in runs]
    panel = {p.file: p for p in panels([], runs)}["reward"]
    fig = figure(panel, groups, window=1)
    cells = [ax for ax in fig.axes if ax.get_visible()]
    assert len(cells) == n and len(fig.axes) == 8  # 2 rows of 4, the last cell hidden
    assert cells[0].get_title() == "recipe0 — reference" and cells[3].get_title() == "recipe3"
    assert len({ax.get_ylim() for ax in cells}) == 1
    ref = [v for v in cells[0].lines[0].get_ydata()]
    for i, ax in enumerate(cells[1:], start=1):
        grey, own = ax.lines[0], ax.lines[1]
        assert grey.get_color() == "0.6" and list(grey.get_ydata()) == ref
        # the cell's own curve is that recipe's reward (offset 0.1·i), smoothed alike
        assert own.get_ydata()[-1] == pytest.approx(ref[-1] + 0.1 * i)
    assert len(cells[0].lines) == 1  # the reference cell has no grey copy of itself
    assert "grey = recipe0" in fig._suptitle.get_text()
    # each cell holds two recipes: the few-recipe smoothing, about 5% of the run (200 → 10)
    long = [load_run(write_run(tmp_path / f"l{i}", [{"step": s, "reward/mean": s / 200}
                                                    for s in range(1, 201)], f"long{i}", 0))
            for i in range(n)]
    title = figure(panel, [Group(r.name, [r]) for r in long], window=2)._suptitle.get_text()
    assert "10-step trailing mean" in title
    rep = write_report([r.path for r in runs], tmp_path / "out")
    assert rep.html.read_text().count("<figure class='wide'>") == len(rep.figures)
    few = write_report([r.path for r in runs[:2]], tmp_path / "few")
    assert "class='wide'" not in few.html.read_text()


def full_records(steps=12):
    """Every key a panel of the report draws, with moving knobs."""
    out = []
    for step in range(steps + 1):
        rec = {"step": step, "val/accuracy": 0.3 + 0.01 * step, "val/pass@1": 0.3 + 0.01 * step,
               "val/pass@8": 0.8, "val/entropy": 0.5}
        if step:
            rec.update(
                {
                    "reward/mean": 0.5,
                    "reward/std": 0.5,
                    "rollout/n_trained": 64.0,
                    "entropy/mean": 0.4,
                    "entropy/stage1": 0.4,
                    "entropy/stage2": 0.5,
                    "control/temperature": 1.0 + 0.01 * step,
                    "control/eps_high": 0.2 + 0.01 * step,
                    "control/entropy_coef": 0.001 * step,
                    "control/kl_coef": 0.01 * step,
                    "control/target_entropy": 0.4,
                    "rollout/budget_min": 4,
                    "rollout/budget_max": 12,
                    "cov/mean": 0.01,
                    "rollout/all_wrong_frac": 0.1,
                    "grad/norm": 2.0,
                    "loss/clip_frac": 0.001,
                    "response/length_mean": 3.5,
                    "response/length_max": 6,
                    "response/truncated_frac": 0.0,
                }
            )
        out.append(rec)
    return out


def test_html_references_every_figure_and_the_figures_exist(tmp_path):
    from explorl.analysis.report import write_report

    runs = [write_run(tmp_path / f"r{i}", full_records(), "combined", i) for i in range(2)]
    out = tmp_path / "report"
    (out).mkdir()
    (out / "eps_high.png").write_bytes(b"stale")  # from an earlier report: replaced
    rep = write_report(runs, out)
    html = rep.html.read_text()
    linked = re.findall(
        r"<a href='([^']+\.png)'><img alt='([^']+)' src='data:image/png;base64,", html
    )
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert sorted(name for name, _ in linked) == pngs == sorted(p.name for _, _, p in rep.figures)
    assert json.loads(rep.json.read_text())["figures"] == [p.name for _, _, p in rep.figures]
    for name in pngs:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    expected = {"reward", "val_accuracy", "val_passk", "all_wrong", "entropy", "temperature",
                "eps_high", "entropy_coef", "kl_coef", "target_entropy", "budgets", "covariance",
                "grad_norm", "clip_frac", "response_length", "truncated"}
    assert {p.removesuffix(".png") for p in pngs} == expected
    # the markdown links the same files, grouped under the same section headings
    md = rep.markdown.read_text()
    assert sorted(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)) == pngs
    for section in ("Reward and accuracy", "Entropy and exploration", "Policy update", "Responses"):
        assert f"### {section}" in md and f"<h2>{section}</h2>" in html


def test_knob_panels_only_for_knobs_that_moved_or_differ(tmp_path):
    from explorl.analysis.curves import panels
    from explorl.analysis.runs import load_run

    def run(name, temps):
        return load_run(write_run(tmp_path / name, [{"step": s + 1, "control/temperature": t,
                                                       "control/eps_high": 0.2, "entropy/mean": 1.0}
                                                      for s, t in enumerate(temps)], name, 0))

    def files(runs):
        return {p.file for p in panels([], runs)}

    assert "temperature" not in files([run("a", [1.0, 1.0])])  # constant: no panel
    assert "temperature" in files([run("b", [1.0, 1.1])])  # moved within a run
    assert "temperature" in files([run("c", [1.0, 1.0]), run("d", [0.7, 0.7])])  # runs differ
    assert "eps_high" not in files([run("e", [1.0, 1.1])])
    title = {p.file: p.title for p in panels([], [run("f", [1.0, 1.0])])}["entropy"]
    assert "EEPO" not in title  # no run logged stage entropies


def test_fraction_axes_stay_within_zero_and_one(tmp_path, monkeypatch):
    """A fraction that is 0 at every step is drawn on an axis starting at 0 (matplotlib's own
    limits for a flat line would show −0.05); an unbounded metric keeps matplotlib's limits."""
    import explorl.analysis.curves as curves

    limits, save = {}, curves.save_figure

    def keep(fig, path):
        limits[path.stem] = fig.axes[0].get_ylim()
        return save(fig, path)

    monkeypatch.setattr(curves, "save_figure", keep)
    recs = [dict(r, **{"response/truncated_frac": 0.0, "grad/norm": 0.0}) for r in records()]
    make_report([write_run(tmp_path / "a", recs, "grpo", 0)], tmp_path / "out")
    assert limits["truncated"][0] == 0.0 and 0.0 < limits["truncated"][1] <= 1.0
    assert limits["all_wrong"][0] == 0.0 and limits["all_wrong"][1] <= 1.0
    assert limits["grad_norm"][0] < 0.0  # not a fraction: matplotlib's limits stand


def test_report_shows_the_first_and_last_logged_completions(tmp_path):
    import json

    from explorl.analysis.report import COMPLETIONS_SHOWN, write_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward/mean": 0.1 * s}) + "\n" for s in range(1, 4)))
    rows = [{"step": s, "split": split, "data_source": "chat/addition",
             "prompt": f"system: x\nuser: What is {s} + {i}?", "ground_truth": str(s + i),
             "response": f"answer {i} at {s} {split}", "score": float(i == 0), "reward": None}
            for s in (0, 10, 20) for split in ("train", "val") for i in range(6)]
    (run / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = write_report([run], tmp_path / "rep")
    md = rep.markdown.read_text()
    assert "## Completions" in md and "Step 0:" in md and "Step 20:" in md
    assert "Step 10:" not in md  # the first and the last logged step only
    assert md.count("at 20 val") == COMPLETIONS_SHOWN and "at 20 train" not in md  # val first
    assert "✓ `user: What is 0 + 0?`" in md  # the prompt's last line, the verdict
    html = rep.html.read_text()
    assert "<h2>Completions</h2>" in html and html.count("at 0 val") == COMPLETIONS_SHOWN

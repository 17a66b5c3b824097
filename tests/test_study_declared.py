"""Claims declared in a study's spec (``claims:``): the section's errors, named by key path with
the closest valid key before anything runs, and the generic judge's quantities (pass@k, the
coverage margin pass@k − pass@1, the entropy ratio, per-run numbers and their ratios) on
evidence whose intervals are worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from explorl import config as C
from explorl import study as S
from explorl.config import builtin
from explorl.report.claims import evaluate_claims
from explorl.report.declared import as_claim, parse_claims
from explorl.report.evidence import Evidence

T2 = 4.302653  # t quantile 0.975 at 2 degrees of freedom (3 seeds)


def _spec(tmp_path, claims, **extra):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "name": "declared", "task": "addition",
        "recipe_dir": str(builtin.folder("recipe") / "lab"), "recipes": ["grpo", "kl_cov"],
        "variants": [{"name": "kl_cov_x5", "recipe": "kl_cov", "set": []}],
        "eval": {"n": 8, "k": [1, 4, 8]}, "claims": claims, **extra}))
    return path


GOOD = {"id": "M", "claim": "c", "arm": "kl_cov", "vs": "grpo", "quantity": "margin@8",
        "side": 1}


@pytest.mark.parametrize("entry, message", [
    ({**GOOD, "quantiy": "pass@1"}, "claims[0].quantiy: unknown key; did you mean 'quantity'?"),
    ({**GOOD, "quantity": "margn@8"}, "claims[0].quantity: unknown quantity 'margn@8'; did you "
                                      "mean 'margin@<k>'?"),
    ({**GOOD, "quantity": "run:train_call"}, "unknown per-run number 'train_call'; did you mean "
                                             "'train_calls'?"),
    ({**GOOD, "arm": "kl_conv"}, "claims.M.arm: 'kl_conv' is not an arm of this study; did you "
                                 "mean 'kl_cov'?"),
    ({**GOOD, "vs": "bsae"}, "claims.M.vs: 'bsae' is not an arm of this study; did you mean "
                             "'base'?"),
    ({**GOOD, "quantity": "pass@16"}, "claims.M.quantity: pass@16: k = 16 is not one of eval.k"),
    ({**GOOD, "side": 2}, "claims[0].side: must be 1 (above null), -1 (below) or 0"),
    ({**GOOD, "side": 0}, "claims[0].null: must be a number, > 0 with side 0"),
    ({**GOOD, "vs": None}, "claims[0].vs: margin@8 compares two arms"),
    ({**GOOD, "vs": "base", "quantity": "entropy_ratio"}, "claims[0].vs: base (the model before "
                                                          "RL) has no per-run numbers"),
    ({**{k: v for k, v in GOOD.items() if k != "arm"}, "arms": ["kl_cov", "grpo"]},
     "claims[0].id: with several arms the id needs "
                                           "'{arm}'"),
    ({"check": "8z"}, "claims[0].check: no library claim '8z'"),
    ({"check": "3b"}, "claims.3b.check: 3b needs arms this study does not run: clip_cov, "
                      "clip_cov_more, kl_cov_strong"),
    ({"check": "1", "id": "x"}, "claims[0]: a library claim (check) takes only `as`"),
    ({"check": "frontier"}, "claims.frontier.check: the frontier claims need frontier.arms in "
                            "the spec"),
    ({"check": "horizn"}, "claims[0].check: no library claim 'horizn'; did you mean 'horizon'?"),
    ({"id": "M", "claim": "c", "conditions": [{**{k: v for k, v in GOOD.items()
                                                 if k not in ("id", "claim")}, "lable": "x"}]},
     "claims[0].conditions[0].lable: unknown key; did you mean 'label'?"),
])
def test_a_bad_claims_section_names_the_key_before_anything_runs(tmp_path, entry, message):
    with pytest.raises(C.ConfigError) as e:
        S.load_spec(_spec(tmp_path, [entry]))
    assert message in str(e.value)


def test_repeated_ids_and_a_good_section(tmp_path):
    with pytest.raises(C.ConfigError, match="ids repeat: \\['M'\\]"):
        S.load_spec(_spec(tmp_path, [GOOD, GOOD]))
    with pytest.raises(C.ConfigError, match="claims\\[0\\]: give arm or arms, not both"):
        S.load_spec(_spec(tmp_path, [{**GOOD, "arms": ["kl_cov"]}]))
    many = {k: v for k, v in GOOD.items() if k != "arm"} | {
        "id": "M-{arm}", "arms": ["kl_cov", "kl_cov_x5"], "claim": "{arm} widens"}
    spec = S.load_spec(_spec(tmp_path, [many, {"check": "1"}]))
    assert [(d.id, d.claim, d.conditions[0].arm if d.conditions else None)
            for d in spec.claims] == [("M-kl_cov", "kl_cov widens", "kl_cov"),
                                      ("M-kl_cov_x5", "kl_cov_x5 widens", "kl_cov_x5"),
                                      ("1", "", None)]
    assert S.load_spec(_spec(tmp_path, None)).claims is None  # no section: the library's
    long = S.load_spec(_spec(tmp_path, [{"check": "horizon"}, {"check": "along"}],
                             max_steps=10, eval={"n": 8, "k": [1, 8], "checkpoints": [5]}))
    assert [d.check for d in long.claims] == ["horizon", "along"]


def test_shipped_specs_declare_their_endpoints():
    """real_v5: its three endpoints (pass@1, the coverage margin pass@16 − pass@1, the entropy
    ratio) for each of its five arms against GRPO, then the library's checks; tools_arpo: A1
    and A2, as the library judged them before."""
    spec = S.load_spec(builtin.folder("study") / "real_v5.yaml")
    ids = [d.id for d in spec.claims]
    arms = ["kl_cov", "clip_cov", "es_constant", "e3", "passk_k4"]
    assert ids[:15] == [f"{p}-{a}" for p in ("P1", "M", "E") for a in arms]
    assert [(c.quantity, c.vs, c.side) for d in spec.claims[:15:5] for c in d.conditions] == [
        ("pass@1", "real-grpo", 1), ("margin@max", "real-grpo", 1),
        ("entropy_ratio", "real-grpo", 1)]
    assert max(spec.eval.k) == 16
    # the library's checks read real/grpo (named real-grpo) as their GRPO
    lib = [as_claim(d) for d in spec.claims[15:]]
    assert [c.id for c in lib] == ["N1", "N2", "1", "2b", "3a", "5a"]
    assert all("grpo" not in c.needs for c in lib) and lib[0].needs == ("real-grpo",)
    tools = S.load_spec(builtin.folder("study") / "tools_arpo.yaml")
    assert [as_claim(d).needs for d in tools.claims] == [("tools", "arpo"), ("arpo", "aepo")]


def _evidence() -> Evidence:
    """3 paired seeds, 2 problems, k ∈ {1, 4}. grpo: pass@1 (0.2, 0.4), pass@4 (0.5, 0.7) on
    every seed (margin 0.3); kl_cov: the same pass@1, pass@4 higher by c_s = 0.2, 0.25, 0.3 on
    seed s (every problem). Per run: entropy ratio grpo 0.5, 0.6, 0.7, kl_cov 0.8, 0.8, 1.0;
    final reward kl_cov − grpo 0.01, −0.01, 0; train calls kl_cov 50, 60, 40 vs grpo 100."""
    p1 = np.array([[0.2, 0.4]] * 3)
    p4 = np.array([[0.5, 0.7]] * 3)
    c = np.array([0.2, 0.25, 0.3])[:, None]
    ratio = {"grpo": [0.5, 0.6, 0.7], "kl_cov": [0.8, 0.8, 1.0]}
    reward = {"grpo": [0.5, 0.5, 0.5], "kl_cov": [0.51, 0.49, 0.5]}
    calls = {"grpo": [100, 100, 100], "kl_cov": [50, 60, 40]}
    per_run = {n: [{"seed": s, "entropy_ratio": ratio[n][s], "final_reward": reward[n][s],
                    "train_calls": calls[n][s]} for s in range(3)] for n in ratio}
    return Evidence(per_run, {"grpo": {1: p1, 4: p4}, "kl_cov": {1: p1.copy(), 4: p4 + c}},
                    {"grpo": [0, 1, 2], "kl_cov": [0, 1, 2]}, k_list=[1, 4])


def _judge(entries):
    return {c["id"]: c for c in evaluate_claims(_evidence(), [as_claim(d) for d in
                                                               parse_claims(entries)])}


def test_the_margin_and_the_entropy_ratio_by_hand():
    """Margin kl_cov − grpo: d[s, p] = c_s, no problem part: 0.25 ± t(2)·0.05/√3 = ±0.1242:
    [0.126, 0.374], above 0: shown. pass@1: every difference 0, the interval [0, 0]: not shown.
    Entropy ratio: paired differences 0.3, 0.2, 0.3: 0.2667 ± t(2)·0.0577/√3 = ±0.1434: shown;
    claimed below GRPO's instead: opposite; MDE (t(2) + t_0.8(2))·0.0577/√3 = 0.179. Final
    reward within ±0.05: differences 0.01, −0.01,
    0: 0 ± t(2)·0.01/√3 = ±0.0248, inside: shown; within ±0.02: not shown. Train calls ÷
    grpo's: 0.5 ± t(2)·0.1/√3 = ±0.2484, below 1: shown."""
    got = _judge([
        {"id": "M", "claim": "margin", "arm": "kl_cov", "vs": "grpo", "quantity": "margin@max",
         "side": 1},
        {"id": "P", "claim": "pass@1", "arm": "kl_cov", "vs": "grpo", "quantity": "pass@1",
         "side": 1},
        {"id": "E", "claim": "entropy", "conditions": [
            {"arm": "kl_cov", "vs": "grpo", "quantity": "entropy_ratio", "side": 1},
            {"arm": "kl_cov", "vs": "grpo", "quantity": "entropy_ratio", "side": -1}]},
        {"id": "R", "claim": "reward", "conditions": [
            {"arm": "kl_cov", "vs": "grpo", "quantity": "run:final_reward", "side": 0,
             "null": 0.05},
            {"arm": "kl_cov", "vs": "grpo", "quantity": "run:final_reward", "side": 0,
             "null": 0.02}]},
        {"id": "C", "claim": "calls", "arm": "kl_cov", "vs": "grpo",
         "quantity": "ratio:train_calls", "side": -1, "null": 1.0},
    ])
    (m,) = got["M"]["conditions"]
    assert m["label"] == "kl_cov − grpo, test pass@4 − pass@1 (coverage margin)"
    half = T2 * 0.05 / math.sqrt(3)
    assert (m["interval"]["estimate"], m["interval"]["low"], m["interval"]["high"]) == \
        pytest.approx((0.25, 0.25 - half, 0.25 + half), abs=1e-4)
    assert got["M"]["verdict"] == "shown" and got["M"]["needs"] == ["grpo", "kl_cov"]
    assert got["P"]["conditions"][0]["interval"]["low"] == pytest.approx(0.0)
    assert got["P"]["verdict"] == "not shown"
    up, down = got["E"]["conditions"]
    sd = np.std([0.3, 0.2, 0.3], ddof=1)
    assert up["interval"]["estimate"] == pytest.approx(0.8 / 3)
    assert up["interval"]["high"] - up["interval"]["estimate"] == pytest.approx(
        T2 * sd / math.sqrt(3), abs=1e-5)
    assert (up["verdict"], down["verdict"], got["E"]["verdict"]) == ("shown", "opposite",
                                                                     "mixed")
    # its MDE: (t_{0.975, 2} + t_{0.8, 2}) · SE = (4.3027 + 1.0607) · 0.0577/√3 = 0.1788
    assert up["interval"]["power"]["mde"] == pytest.approx((T2 + 1.060660) * sd / math.sqrt(3),
                                                           abs=1e-5)
    assert "; MDE 0.179)" in got["E"]["numbers"]
    wide, narrow = got["R"]["conditions"]
    assert wide["interval"]["high"] == pytest.approx(T2 * 0.01 / math.sqrt(3), abs=1e-6)
    assert (wide["verdict"], narrow["verdict"], got["R"]["verdict"]) == ("shown", "not shown",
                                                                         "partial")
    assert "(within ±0.05: shown; MDE 0.031)" in got["R"]["numbers"]
    (c,) = got["C"]["conditions"]
    assert c["label"] == "kl_cov ÷ grpo, train_calls"
    assert (c["interval"]["estimate"], c["interval"]["high"]) == pytest.approx(
        (0.5, 0.5 + T2 * 0.1 / math.sqrt(3)), abs=1e-6)
    assert got["C"]["verdict"] == "shown"


def test_a_declared_claim_whose_arm_did_not_finish_is_not_run():
    got = _judge([{"id": "X", "claim": "x", "arm": "e3", "vs": "grpo", "quantity": "pass@1",
                   "side": 1}, {"check": "1"}])
    assert got["X"]["verdict"] == "not run" and got["X"]["needs"] == ["grpo", "e3"]
    assert got["X"]["numbers"] == "recipes not in this study: e3"
    assert got["1"]["claim"] == "GRPO's entropy falls while reward rises"  # the library's own
    # a partial report: e3 is one of the study's arms with no finished run yet
    ev = _evidence()
    ev.unfinished = {"e3"}
    (row,) = evaluate_claims(ev, [as_claim(d) for d in parse_claims(
        [{"id": "X", "claim": "x", "arm": "e3", "vs": "grpo", "quantity": "pass@1", "side": 1}])])
    assert (row["verdict"], row["numbers"]) == ("not run", "no finished run yet: e3")


def test_a_library_claim_reads_its_arms_as_the_study_names_them():
    import dataclasses

    from explorl.report.declared import as_claim, check_claims, parse_claims

    (d,) = parse_claims([{"check": "N1", "as": {"grpo": "real-grpo"}}])
    assert d.renames == {"grpo": "real-grpo"}
    claim = as_claim(d)
    assert claim.needs == ("real-grpo",)
    # the study's arm is found, and an arm the library claim does not have is an error
    assert all(ok for _, ok, _ in check_claims([d], ["real-grpo"], [1, 4], set()))
    bad = parse_claims([{"check": "N1", "as": {"gpro": "real-grpo"}}])
    errors = [m for _, ok, m in check_claims(bad, ["real-grpo", "grpo"], [1, 4], set()) if not ok]
    assert errors == ["N1 names no arm 'gpro' (its arms: grpo)"]
    with pytest.raises(ValueError, match=r"claims\[0\]\.as: expected a mapping"):
        parse_claims([{"check": "N1", "as": ["grpo"]}])
    # judged on the study's arm: the same verdict as the library claim on an arm named grpo
    import numpy as np

    from explorl.report.claims import judge
    from explorl.report.evidence import Evidence

    rng = np.random.default_rng(0)
    pk = {1: rng.uniform(0.5, 0.9, size=(3, 40))}
    base = {1: np.full((1, 40), 0.3)}
    ev = Evidence(per_run={"real-grpo": [{"seed": s} for s in range(3)]},
                  passk={"real-grpo": pk}, seeds={"real-grpo": [0, 1, 2]}, base=base, k_list=[1])
    ev_lib = dataclasses.replace(ev, per_run={"grpo": ev.per_run["real-grpo"]},
                                 passk={"grpo": pk}, seeds={"grpo": [0, 1, 2]})
    row, lib_row = judge(claim, ev), judge(as_claim(parse_claims([{"check": "N1"}])[0]), ev_lib)
    assert row["verdict"] == lib_row["verdict"] == "shown"
    assert row["conditions"] == lib_row["conditions"]


def test_one_paired_seed_judges_nothing():
    """With one seed both arms ran, no interval over seeds exists: the condition reads n/a
    rather than a verdict from the problems' part alone (a real model's seeds can differ by far
    more)."""
    import dataclasses

    from explorl.report.claims import judge

    ev = _evidence()
    one = dataclasses.replace(ev, per_run={**ev.per_run, "kl_cov": ev.per_run["kl_cov"][:1]})
    for q in ("pass@1", "margin@4", "entropy_ratio"):
        (d,) = parse_claims([{"id": "x", "claim": "c", "arm": "kl_cov", "vs": "grpo",
                              "quantity": q, "side": 1}])
        assert judge(as_claim(d), ev)["verdict"] != "n/a"
        assert judge(as_claim(d), one)["verdict"] == "n/a", q


def test_the_pass_k_figure_finds_grpo_by_its_recipe_name():
    """real/grpo's arm is named real-grpo: the figure's GRPO is that arm, and the best arm is
    not labelled as GRPO when no sweep ran."""
    import numpy as np

    from explorl.report.figures import highlighted, reference

    pk = {"real-grpo": {1: np.full((2, 3), 0.5)}, "kl_cov": {1: np.full((1, 3), 0.6)}}
    ev = Evidence(per_run={}, passk=pk, k_list=[1])
    assert reference(ev) == "real-grpo" and highlighted(ev)[0] == "real-grpo"
    assert reference(Evidence(per_run={}, passk={"kl_cov": pk["kl_cov"]}, k_list=[1])) is None


def test_a_table_cell_of_one_seed_is_a_value_not_a_verdict():
    """One run's value: "+0.012 (1 seed)", not bold and not an interval; a t interval over three
    runs that clears 0 (0.020 ± t(2)·0.00058 = ±0.0025) is bold with its bounds; one that
    holds 0 is not bold."""
    from explorl.report.stats import seed_interval
    from explorl.report.tables import cell

    assert cell(seed_interval([0.012])) == "+0.012 (1 seed)"
    assert cell(seed_interval([0.019, 0.02, 0.021])).startswith("**+0.020 [+0.018, +0.022]**")
    assert not cell(seed_interval([-0.01, 0.0, 0.04])).startswith("**")
    assert cell(None) == "—"

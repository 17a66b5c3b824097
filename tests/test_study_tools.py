"""A study of tool-using arms: the tool calls run in training (by hand), the model before RL
evaluated with the runs' tools, and the report's tool section and ARPO's claim (A1) on a small
fake study whose runs are written, not trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from explorl import config as C
from explorl import study as S
from explorl.analysis.runs import load_run
from explorl.config import builtin
from explorl.report.evidence import RUN_KEYS
from explorl.report.numbers import tool_numbers
from explorl.report.tools_report import calls_run, tool_tables
from explorl.study.jobs import base_eval_args
from explorl.study.plan import base_folders

SPEC = builtin.folder("study") / "tools_arpo.yaml"


def test_tool_numbers_by_hand():
    """Step 1: 0.5 calls per response × 8 responses = 4, one of them an ARPO branch's copy;
    step 2: 0.75 × 8 = 6. Run: 4 − 1 + 6 = 9; in the trained responses: 10."""
    recs = [{"step": 1, "tools/calls_mean": 0.5, "rollout/n_trained": 8.0,
             "arpo/shared_calls": 1.0},
            {"step": 2, "tools/calls_mean": 0.75, "rollout/n_trained": 8.0}]
    tools = {"calls_per_response": 0.9, "call_frac": 0.8, "calls_per_correct": 1.5}
    got = tool_numbers(recs, {"tools": tools})
    assert got == {"train_calls": 9, "train_calls_counted": 10, "train_responses": 16.0,
                   "eval_calls_per_response": 0.9, "eval_call_frac": 0.8,
                   "eval_calls_per_correct": 1.5}
    assert set(tool_numbers([{"step": 1, "reward/mean": 0.5}], {}).values()) == {None}
    # with ``tools/calls_run`` (what the sampler answered: here 3 of the trained responses'
    # calls, one shared by a branch, and 2 of AEPO's probes) the run counts it as it is
    recs[0]["tools/calls_run"] = 5.0
    got = tool_numbers(recs, {"tools": tools})
    assert (got["train_calls"], got["train_calls_counted"]) == (5 + 6, 10)


def test_the_model_before_rl_is_evaluated_with_the_runs_tools():
    spec = S.load_spec(SPEC)
    plans = S.plan_runs(spec, SPEC, Path("/tmp/unused"))
    args = base_eval_args(base_folders(plans)["base"], spec, Path("/tmp/b"))
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert "rollout.tools=[explorl.tools.calculator:calculator]" in sets
    assert "rollout.max_turns=2" in sets  # the first recipe's (lab/tools)
    assert {p.name: p.cfg.rollout.max_turns for p in plans} == {"tools": 2, "arpo": 3, "aepo": 3}
    # every override reads back as a value of the run config
    data = {"model": {"path": "lab:multiply"}, "data": {"train": ["lab:multiply"]}}
    for text in sets:
        C.set_path(data, *C.parse_override(text))
    assert data["rollout"]["tools"] == ["explorl.tools.calculator:calculator"]


# ----------------------------------------------------------------------------- a fake study

SEEDS, N, P = [0, 1, 2], 4, 8
ARPO_CORRECT = [[3, 3, 3, 2, 3, 3, 4, 3], [3, 3, 3, 3, 4, 3, 3, 3], [4, 3, 3, 3, 3, 2, 2, 3]]
SHARED = {0: 32, 1: 30, 2: 34}  # arpo/shared_calls per step, by seed


def _eval(folder: Path, spec, correct: list[int], tools: dict) -> None:
    folder.mkdir(parents=True)
    settings = {"n": spec.eval.n, "k": sorted(spec.eval.k), "temperature": spec.eval.temperature,
                "split": spec.eval.split, "seed": spec.eval.seed}
    (folder / "problems.jsonl").write_text("".join(json.dumps(
        {"index": i, "n_correct": c, "n_samples": N, "tool_calls": [1] * N}) + "\n"
        for i, c in enumerate(correct)))
    (folder / "eval.json").write_text(json.dumps(
        {"k_list": settings["k"], "settings": settings, "tools": tools,
         "overall": {"pass@1": sum(correct) / (N * P), "n_problems": P}}))


def _fake_run(p, spec) -> None:
    """Three steps of 64 responses, one call each; ARPO's branches share SHARED[seed] per step."""
    p.out.mkdir(parents=True)
    C.save(p.cfg, p.out / "config.yaml")
    rows = [{"step": 0, "val/accuracy": 0.1}]
    for step in (1, 2, 3):
        r = {"step": step, "entropy/mean": 0.5, "reward/mean": 0.5, "tools/calls_mean": 1.0,
             "rollout/n_trained": 64.0, "rollout/n_samples": 64.0, "time/step_s": 0.1}
        if p.name == "arpo":
            r["arpo/shared_calls"] = float(SHARED[p.seed])
        rows.append(r)
    (p.out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (p.out / "summary.json").write_text(json.dumps({"steps": 3, "max_steps": 3,
                                                    "interrupted": False, "n_params": 1}))
    arpo = p.name == "arpo"
    correct = ARPO_CORRECT[p.seed] if arpo else [2] * P
    tools = ({"calls_per_response": 0.8, "call_frac": 0.8, "calls_per_correct": 1.0} if arpo
             else {"calls_per_response": 0.9, "call_frac": 0.9, "calls_per_correct": 1.8})
    _eval(p.out / "eval", spec, correct, tools)


def _fake_study(tmp_path, recipes):
    """A 3-seed study of ``recipes`` on the multiply task, its runs and base evaluation written
    by ``_fake_run`` / ``_eval``, analysed: (study folder, run plans, ``analyse``'s payload)."""
    import explorl.study.run as R

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tools_fake", "task": "multiply", "recipe_dir": str(builtin.folder("recipe") /
                                                                  "lab"),
        "recipes": recipes, "seeds": SEEDS, "max_steps": 3,
        "eval": {"n": N, "k": [1, 4], "split": "test"},
        "claims": [c for c in yaml.safe_load(SPEC.read_text())["claims"]  # the shipped spec's
                   if {x[k] for x in c["conditions"] for k in ("arm", "vs")} <= set(recipes)]}))
    spec = S.load_spec(path)
    out = tmp_path / "study"
    plans = S.plan_runs(spec, path, out)
    for p in plans:
        _fake_run(p, spec)
    _eval(out / "base" / "eval", spec, [0] * 6 + [1, 1],
          {"calls_per_response": 0.2, "call_frac": 0.2, "calls_per_correct": 0.25})
    return out, plans, R.analyse(out, spec, path, False, plans, [], 60.0)


def test_fake_tool_study_reports_calls_and_judges_arpos_claim(tmp_path):
    """tools: pass@1 0.5 on every problem, 3 × 64 calls run per run (192). arpo: pass@1 0.75
    on average (24, 25 and 23 of 32), 192 − 3 × (32, 30, 34) = 96, 102, 90 calls run: −96 against
    GRPO, paired t over 3 seeds ±4.303 · 6/√3 = ±14.9; ratio (0.5 + 0.53125 + 0.46875)/3 = 0.5.
    Claim A1 (declared in the shipped spec): more pass@1 and fewer calls, both resolved: shown;
    no claim of the library is judged."""
    out, plans, payload = _fake_study(tmp_path, ["tools", "arpo"])

    assert [c["id"] for c in payload["claims"]] == ["A1"]
    # every per-run number a run has is one a declared claim may name (run:<key>), and no more
    keys = set(payload["runs"]["tools-seed0"]) - {"seed", "n_params", "eval_pass@1", "eval_pass@4"}
    assert keys == set(RUN_KEYS)
    (a1,) = payload["claims"]
    assert a1["needs"] == ["tools", "arpo"]
    assert a1["verdict"] == "shown"
    p1, calls = a1["conditions"]
    assert p1["interval"]["estimate"] == pytest.approx(24 / 32 - 0.5)
    assert calls["interval"]["estimate"] == pytest.approx(-96)
    assert calls["interval"]["high"] - calls["interval"]["estimate"] == pytest.approx(
        4.3027 * 6 / 3**0.5, abs=1e-3)
    tools = payload["tools"]
    assert tools["arms"]["tools"]["train_calls"] == 192
    assert tools["arms"]["arpo"]["train_calls"] == pytest.approx(96)
    assert tools["arms"]["arpo"]["train_calls_counted"] == 192
    assert tools["vs_tools"]["arpo"]["train_calls_ratio"]["estimate"] == pytest.approx(0.5)
    assert tools["vs_tools"]["arpo"]["eval_calls_per_response"]["estimate"] == pytest.approx(-0.1)
    assert tools["base"]["calls_per_response"] == 0.2

    md = (out / "study.md").read_text()
    assert "## Tool use" in md and "| A1 | ARPO reaches" in md
    assert "| **base** | — | 0.062 | 0.250 | 0.200 | 0.200 | 0.250 | — | — |" in md
    assert "| tools | 3 | 0.500 | 1.000 | 0.900 ± 0.000 | 0.900 ± 0.000 | 1.800 ± 0.000 | 192 ± 0" \
           " | 192 ± 0 |" in md
    assert "**-96 [-111, -81]** | **0.500 [0.422, 0.578]** |" in md
    assert (out / "report" / "tool_calls.png").is_file()
    assert calls_run(load_run(plans[1].out)) == ([1, 2, 3], [32.0, 64.0, 96.0])


def test_aepos_claim_is_judged_against_arpo(tmp_path):
    """With an aepo arm (faked as GRPO's runs: pass@1 0.5 on every problem) beside arpo (0.75 on
    average), claim A2 reads aepo − arpo: pass@1 −0.25, resolved the other way: opposite."""
    _, _, payload = _fake_study(tmp_path, ["tools", "arpo", "aepo"])
    claims = {c["id"]: c for c in payload["claims"]}
    assert sorted(claims) == ["A1", "A2"]
    p1, pk = claims["A2"]["conditions"]
    assert p1["label"] == "aepo − arpo, test pass@1" and pk["label"] == "aepo − arpo, test pass@4"
    assert p1["interval"]["estimate"] == pytest.approx(0.5 - 24 / 32)
    assert p1["verdict"] == "opposite" and claims["A2"]["verdict"] == "opposite"


def test_no_tool_arms_no_tool_section():
    ev = S.Evidence({"grpo": [{"seed": 0, "train_calls": None}]})
    assert tool_tables(ev, Path("/nonexistent")) == []
    assert "A1" not in {c["id"] for c in S.evaluate_claims(ev)}  # no spec claims: the library's


def test_the_archive_keeps_each_responses_tool_calls():
    from explorl.study.data import counts_only

    row = {"index": 0, "n_correct": 1, "responses": ["[3*4]{12}12", "9"], "scores": [1.0, 0.0],
           "tool_calls": [1, 0]}
    assert json.loads(counts_only((json.dumps(row) + "\n").encode())) == {
        "index": 0, "n_correct": 1, "n_samples": 2, "tool_calls": [1, 0]}

"""``explorl study``: spec validation, resumability, the claims' rules, and a tiny study end to
end."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import TINY_LAB_CONFIG

from explorl import config as C
from explorl import study as S
from explorl import validation
from explorl.cli import main
from explorl.config import builtin

# ----------------------------------------------------------------------------- spec


ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    """A spec in ``tmp_path``; its recipe names are those of the repository's recipes/lab/."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"recipe_dir": str(builtin.folder("recipe") / "lab"), **data}))
    return path


def test_spec_quick_section_replaces_keys_and_appends_set(tmp_path):
    path = _write(tmp_path, {"name": "s", "recipes": ["grpo"], "seeds": [0, 1, 2], "max_steps": 300,
                             "set": ["eval.every=20", "optim.lr=1e-4"],
                             "eval": {"n": 16, "split": "test"},
                             "quick": {"seeds": [0], "max_steps": 50, "set": ["eval.every=10"],
                                       "eval": {"max_problems": 32}}})
    full = S.load_spec(path)
    assert (full.seeds, full.max_steps, full.set, full.eval.max_problems) == (
        [0, 1, 2],
        300,
        ["eval.every=20", "optim.lr=1e-4"],
        None,
    )
    quick = S.load_spec(path, quick=True)
    assert (quick.seeds, quick.max_steps) == ([0], 50)
    # appended, and the spec's own override of the same key dropped: the quick value wins
    assert quick.set == ["optim.lr=1e-4", "eval.every=10"]
    assert (quick.eval.n, quick.eval.split, quick.eval.max_problems) == (16, "test", 32)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"recpies": ["grpo"]}, "recpies: unknown key; did you mean 'recipes'?"),
        (
            {"recipes": ["grpo"], "quick": {"max_step": 3}},
            "quick.max_step: unknown key; did you mean 'quick.max_steps'?",
        ),
        ({"recipes": ["grop"]}, "recipes[0]: unknown recipe 'grop'; did you mean 'grpo'?"),
        ({"recipes": ["grpo"], "seeds": "zero"}, "seeds: expected a list"),
        (
            {"recipes": ["grpo"], "eval": {"n": 4, "k": [1, 8]}},
            "eval.k: every k must be in [1, eval.n]",
        ),
        ({"recipes": ["grpo"], "task": "subtraction"}, "task: 'subtraction' is not a lab task"),
        (
            {"recipes": ["grpo"], "set": ["algorithm.eps_hihg=0.3"]},
            "algorithm.eps_hihg: unknown key",
        ),
        (
            {"recipes": ["grpo"], "variants": [{"name": "grpo", "recipe": "grpo"}]},
            "names used twice: grpo",
        ),
        (
            {"recipes": [], "variants": [{"name": "v", "recipe": "grpo", "sett": []}]},
            "variants[0].sett: unknown key; did you mean 'variants[0].set'?",
        ),
        ({"recipes": ["grpo"], "keep_finished": "some"},
         "keep_finished: 'some' is not one of 'all', 'final'"),
    ],
)
def test_spec_errors_name_the_key(tmp_path, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(C.ConfigError) as e:
        S.plan_runs(S.load_spec(path), path, tmp_path / "out")
    assert message in str(e.value) and str(path) in str(e.value)


def test_study_cli_reports_spec_errors(tmp_path, capsys):
    path = _write(tmp_path, {"recipes": ["grpo"], "jobz": 2})
    assert main(["study", str(path)]) == 2
    assert "jobz: unknown key; did you mean 'jobs'?" in capsys.readouterr().err


def test_recipe_folder_comes_from_the_spec_or_the_recipes_option(tmp_path, capsys):
    """No recipe_dir: a recipe name is an error naming the key; ``recipe_dir`` (relative to the
    spec) or ``--recipes DIR`` (replacing it) supplies the folder."""
    (tmp_path / "mine").mkdir()
    shutil.copy(builtin.find("lab/grpo"), tmp_path / "mine" / "grpo.yaml")
    path = tmp_path / "spec.yaml"
    # the recipe resolves, so planning reaches the (deliberately wrong) override
    path.write_text(yaml.safe_dump({"recipes": ["grpo"], "set": ["algorithm.eps_hihg=0.3"]}))
    assert main(["study", str(path)]) == 2
    err = capsys.readouterr().err
    assert "recipes[0]: 'grpo' names a recipe, but the spec has no recipe_dir" in err
    assert main(["study", str(path), "--recipes", str(tmp_path / "mine")]) == 2
    assert "algorithm.eps_hihg: unknown key" in capsys.readouterr().err
    assert main(["study", str(path), "--recipes", str(tmp_path / "nowhere")]) == 2
    assert "--recipes" in (err := capsys.readouterr().err) and "not a directory" in err
    path.write_text(yaml.safe_dump({"recipes": ["grpo"], "recipe_dir": "mine"}))
    (plan,) = S.plan_runs(S.load_spec(path), path, tmp_path / "out")
    assert plan.recipe == tmp_path / "mine" / "grpo.yaml"


def test_study_does_not_import_the_command_line():
    """The CLI imports the study, never the reverse (lazy imports included): a job runs the
    command line as a child process."""
    found = []
    for path in sorted((ROOT / "src" / "explorl" / "study").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            cli = ("cli", "__main__")
            found += [f"{path.name}: {n}" for n in names
                      if n in ("explorl.cli", "explorl.__main__")
                      or (n == "explorl" and any(a.name in cli for a in node.names))]
    assert not found


def test_lab_spec_plans_every_required_recipe():
    spec = S.load_spec(builtin.find("lab", "study"))
    plans = S.plan_runs(spec, builtin.find("lab", "study"), Path("/tmp/unused"))
    names = set(S.order_rows(spec, plans))
    assert {
        "grpo",
        "dapo",
        "entropy_bonus",
        "clip_cov",
        "kl_cov",
        "e3_ts",
        "e3",
        "eepo",
        "es_wsd",
    } <= names
    assert {n for c in S.CLAIMS for n in c.needs} <= names  # the full study can decide every claim
    assert len(spec.seeds) == 3 and {p.cfg.max_steps for p in plans} == {spec.max_steps}
    # the same rollout budget for every recipe: prompts per step × samples per prompt
    assert {(p.cfg.data.prompts_per_step, p.cfg.rollout.n_samples) for p in plans} == {(8, 8)}
    quick = S.load_spec(builtin.find("lab", "study"), quick=True)
    assert quick.publish is None and len(quick.seeds) == 1 and quick.max_steps < spec.max_steps


@pytest.mark.parametrize(
    "name", sorted(p.name for p in builtin.folder("study").glob("*.yaml"))
)
def test_every_shipped_spec_plans_full_and_quick(name, named_model_stand_in):
    """Every spec in studies/ loads and plans in both forms; study-wide overrides reach every
    run (a spec on a model known by name plans against its tiny stand-in)."""
    path = builtin.folder("study") / name
    for quick in (False, True):
        spec = S.load_spec(path, quick=quick)
        plans = S.plan_runs(spec, path, Path("/tmp/unused"))
        assert len(plans) == len(spec.seeds) * len(S.order_rows(spec, plans))
        if name == "lab_clip.yaml":
            assert {p.cfg.optim.lr for p in plans} == {1e-4}


# ----------------------------------------------------------------------------- resumability


def test_run_state_skips_finished_resumes_interrupted_and_refuses_other_configs(tmp_path):
    path = _write(tmp_path, {"recipes": ["grpo"], "max_steps": 10})
    spec = S.load_spec(path)
    (plan,) = S.plan_runs(spec, path, tmp_path / "out")
    assert S.run_state(plan) == "fresh"
    plan.out.mkdir(parents=True)
    C.save(plan.cfg, plan.out / "config.yaml")
    (plan.out / "metrics.jsonl").write_text("")
    assert S.run_state(plan) == "restart"  # started, no checkpoint yet
    ckpt = plan.out / "checkpoints" / "step-4"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    (plan.out / "summary.json").write_text(
        json.dumps({"steps": 4, "max_steps": 10, "interrupted": True})
    )
    assert S.run_state(plan) == "resume"
    assert S.train_args(plan, "resume") == ["train", "--resume", str(plan.out)]
    (plan.out / "summary.json").write_text(
        json.dumps({"steps": 10, "max_steps": 10, "interrupted": False})
    )
    assert S.run_state(plan) == "done"
    (plan.out / "summary.json").write_text('{"steps": 10, "max_st')  # cut by a kill
    assert S.run_state(plan) == "resume"
    other = validation.load(plan.recipe, [*plan.sets, "optim.lr=1.0e-3"], max_steps=10, seed=0)
    C.save(other, plan.out / "config.yaml")
    with pytest.raises(C.ConfigError, match="another configuration"):
        S.run_state(plan)


def test_an_evaluation_cut_short_is_not_finished(tmp_path):
    """eval.json truncated, or problems.jsonl shorter than eval.json's problem count (older
    versions wrote eval.json first): the evaluation reruns."""
    from explorl.study.plan import eval_done_at

    e = S.StudyEvalSpec(n=4, k=[1, 4])
    settings = {"n": 4, "k": [1, 4], "temperature": e.temperature, "split": e.split,
                "seed": e.seed}
    whole = json.dumps({"overall": {"n_problems": 3}, "settings": settings})
    (tmp_path / "eval.json").write_text(whole)
    (tmp_path / "problems.jsonl").write_text("{}\n{}\n{}\n")
    assert eval_done_at(tmp_path, e)
    (tmp_path / "problems.jsonl").write_text("{}\n{}\n{\"resp")
    assert not eval_done_at(tmp_path, e)
    (tmp_path / "problems.jsonl").write_text("{}\n{}\n{}\n")
    (tmp_path / "eval.json").write_text(whole[:20])
    assert not eval_done_at(tmp_path, e)


# ----------------------------------------------------------------------------- claims


def _run(**kw) -> dict:
    base = {key: None for key, *_ in S.columns([1, 16])}
    base.update(
        {
            "initial_reward": 0.5,
            "final_reward": 0.5,
            "H0": None,
            "tracking_rel_bias": None,
            "target_mean": None,
            "tracking_bias": None,
            "tracked_entropy_mean": None,
            "eepo_active_frac": None,
            "anneal_entropy_ratio": None,
            "law_r2": None,
            "law_points": 0,
            "law_rmse": None,
            "law_naive_rmse": None,
            "law_final_error": None,
            "step_s": 0.1,
        }
    )
    base.update(kw)
    return base


def _claims(per_run: dict[str, list[dict]], **ev) -> dict[str, dict]:
    for runs in per_run.values():
        for seed, r in enumerate(runs):
            r.setdefault("seed", seed)
    return {c["id"]: c for c in S.evaluate_claims(S.Evidence(per_run, **ev))}


def test_claim_verdicts_come_from_intervals():
    fall = [_run(entropy_ratio=h, initial_reward=0.4, final_reward=0.6, final_entropy=0.25)
            for h in (0.6, 0.7, 0.65)]
    c = _claims({"grpo": fall})["1"]
    assert c["verdict"] == "shown" and [x["verdict"] for x in c["conditions"]] == ["shown"] * 2
    # entropy fell on one seed and rose on another: the interval of the fall straddles 0
    mixed = [_run(entropy_ratio=h, initial_reward=0.4, final_reward=0.6) for h in (0.8, 1.2)]
    assert _claims({"grpo": mixed})["1"]["verdict"] == "partial"
    rose = [_run(entropy_ratio=h, initial_reward=0.6, final_reward=r)
            for h, r in ((1.1, 0.4), (1.12, 0.41), (1.14, 0.42))]
    assert _claims({"grpo": rose})["1"]["verdict"] == "opposite"
    # one seed: a value and no spread, so no verdict either way (not "opposite")
    one = _claims({"grpo": rose[:1]})["1"]
    assert one["verdict"] == "n/a" and [x["verdict"] for x in one["conditions"]] == ["n/a"] * 2
    assert "GRPO entropy fall 1 − H final/H initial = -0.100 (1 seed: no interval, n/a)" \
        in one["numbers"]
    assert _claims({"grpo": fall})["3a"]["verdict"] == "not run"

    # paired by seed: clip_cov above GRPO on every seed; kl_cov above on one, below on two
    cov = {"grpo": [_run(final_entropy=h) for h in (0.25, 0.26, 0.27)],
           "clip_cov": [_run(final_entropy=h) for h in (0.30, 0.31, 0.32)],
           "kl_cov": [_run(final_entropy=h) for h in (0.20, 0.20, 0.40)]}
    c = _claims(cov)["3a"]
    assert [x["verdict"] for x in c["conditions"]] == ["shown", "not shown"]
    assert c["verdict"] == "partial"
    iv = c["conditions"][0]["interval"]
    assert iv["estimate"] == pytest.approx(0.05) and iv["low"] == pytest.approx(0.05)

    eepo = [_run(eepo_active_frac=0.5, eepo_dH=0.02), _run(eepo_active_frac=0.4, eepo_dH=0.03)]
    # two seeds: .025 ± t(.975, 1)·.005 = ± .064 holds 0; a third at .025 gives ± 4.30·.0029
    assert _claims({"eepo": eepo})["4"]["verdict"] == "not shown"
    eepo.append(_run(eepo_active_frac=0.45, eepo_dH=0.025))
    assert _claims({"eepo": eepo})["4"]["verdict"] == "shown"
    never = [_run(eepo_active_frac=0.0, eepo_dH=None)]  # the gate never opened: nothing to test
    c = _claims({"eepo": never})["4"]
    assert c["verdict"] == "n/a" and "not testable" in c["numbers"]
    down = [_run(eepo_active_frac=0.5, eepo_dH=d) for d in (-0.01, -0.011, -0.012)]
    assert _claims({"eepo": down})["4"]["verdict"] == "opposite"
    assert _claims({"eepo": down[:1]})["4"]["verdict"] == "n/a"  # one seed: no verdict


def test_narrowing_claims_compare_pass_at_k_with_the_base_model():
    """GRPO better than base at k = 1 and worse at k = 4 on every problem: N1 and N2 shown;
    a method that trained GRPO's runs is not judged (n/a, same runs); one whose pass@k equals
    GRPO's on average but not per problem is not shown."""
    base = {1: np.full((1, 20), 0.3), 4: np.full((1, 20), 0.9)}
    grpo = {1: np.full((3, 20), 0.5), 4: np.full((3, 20), 0.7)}
    runs = {"grpo": [_run() for _ in range(3)], "eepo": [_run() for _ in range(3)]}
    c = _claims(runs, passk={"grpo": grpo, "eepo": grpo}, seeds={"grpo": [0, 1, 2],
                "eepo": [0, 1, 2]}, base=base, k_list=[1, 4])
    assert c["N1"]["verdict"] == "shown" and c["N2"]["verdict"] == "shown"
    n2 = c["N2"]["conditions"][0]["interval"]
    assert n2["estimate"] == pytest.approx(-0.2) and n2["high"] == pytest.approx(-0.2)
    assert c["8b"]["verdict"] == "n/a" and "same runs as GRPO" in c["9b"]["numbers"]
    swapped = {k: np.concatenate([v[:, 10:], v[:, :10]], axis=1) + np.linspace(-.1, .1, 20)
               for k, v in grpo.items()}  # pass@k moved between problems, the same mean
    c = _claims(runs, passk={"grpo": grpo, "eepo": swapped}, seeds={"grpo": [0, 1, 2],
                "eepo": [0, 1, 2]}, base=base, k_list=[1, 4])
    assert c["8b"]["verdict"] == "not shown" and c["9b"]["verdict"] == "not shown"
    assert _claims(runs)["N1"]["verdict"] == "n/a"  # no per-problem numbers: cannot judge


@pytest.mark.parametrize("verdicts, want", [
    (["shown", "shown"], "shown"), (["shown", "not shown"], "partial"),
    (["not shown"], "not shown"), (["opposite", "not shown"], "opposite"),
    (["shown", "opposite"], "mixed"), (["shown", "n/a"], "n/a"), ([], "n/a")])
def test_combined_verdict(verdicts, want):
    assert S.combine(verdicts) == want


def test_tracking_claim_compares_with_grpo_on_the_same_target():
    es = [_run(tracking_rel_bias=b / 0.3, tracking_bias=b, target_mean=0.3, tracking_error=0.03)
          for b in (0.006, 0.0063, 0.0057)]
    near = [_run(tracked_entropy_mean=h) for h in (0.301, 0.300, 0.302)]  # GRPO on the target
    far = [_run(tracked_entropy_mean=h) for h in (0.36, 0.361, 0.359)]
    assert _claims({"grpo": far, "es_constant": es})["5a"]["verdict"] == "shown"
    assert _claims({"grpo": near, "es_constant": es})["5a"]["verdict"] == "mixed"
    # one seed of each: values without spread, no verdict (a partial report's first seed)
    one = {"grpo": far[:1], "es_constant": es[:1]}
    assert _claims(one)["5a"]["verdict"] == "n/a"


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_tiny_study_end_to_end_is_resumable_and_reproducible(tiny_model, tmp_path, capsys):
    lab = [f"lab.{k}={v}" for k, v in TINY_LAB_CONFIG.items() if k != "params"]
    lab += [f"lab.params.{k}={v}" for k, v in TINY_LAB_CONFIG["params"].items()]
    spec = {
        "name": "tiny",
        "task": "addition",
        "recipes": ["grpo", "es_constant"],
        "seeds": [0],
        "max_steps": 3,
        "set": [
            f"model.path={tiny_model}",
            *lab,
            "data.prompts_per_step=4",
            "rollout.n_samples=4",
            "rollout.max_response_len=6",
            "optim.lr=1.0e-3",
            "eval.every=1",
            "eval.n_samples=2",
            "eval.k=[1, 2]",
            "eval.max_problems=4",
            "reward.num_workers=1",
            "log.plots=false",
            "log.checkpoint_every=0",
        ],
        "eval": {"n": 4, "k": [1, 4], "split": "test", "max_problems": 4},
        "jobs": 2,
    }
    path = _write(tmp_path, spec)
    out = tmp_path / "study"
    assert main(["study", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 to train" in printed
    for name in ("study.md", "claims.md", "study.json", "report/report.md"):
        assert (out / name).is_file(), name
    assert list((out / "report").glob("claim_*.png")) and list((out / "report").glob("entropy.png"))
    first = json.loads((out / "study.json").read_text())
    assert first["rows"] == ["grpo", "es_constant"]
    cols = {c["key"] for c in first["columns"]}
    assert {
        "entropy_ratio",
        "final_reward",
        "eval_pass@1",
        "eval_pass@4",
        "all_wrong_frac",
        "tracking_error",
        "eepo_dH",
        "step_s",
        "overhead",
        "rollouts_per_step",
    } <= cols
    assert first["table"]["grpo"]["eval_pass@1"]["n"] == 1
    assert first["table"]["es_constant"]["tracking_error"]["mean"] is not None
    assert first["table"]["grpo"]["tracking_error"]["mean"] is None  # no target, no tracking error
    assert [c["id"] for c in first["claims"]] == [c.id for c in S.CLAIMS]
    assert {c["verdict"] for c in first["claims"]} <= {"shown", "partial", "not shown", "opposite",
                                                       "mixed", "n/a", "not run"}
    assert first["passk"]["base"] and first["passk"]["grpo"]  # the base model was evaluated
    assert next(c for c in first["claims"] if c["id"] == "3a")["verdict"] == "not run"
    md = (out / "study.md").read_text()
    assert "## Claims" in md and "| grpo | 1 |" in md and first["fingerprint"] in md

    # Rerun: nothing is retrained or re-evaluated, and the table is the same.
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*.jsonl")}
    stamps |= {p: p.stat().st_mtime_ns for p in out.glob("runs/*/eval/eval.json")}
    assert main(["study", str(path), "--out", str(out)]) == 0
    assert "0 to train" in capsys.readouterr().out
    assert stamps == {p: p.stat().st_mtime_ns for p in stamps}
    assert json.loads((out / "study.json").read_text())["fingerprint"] == first["fingerprint"]

    # Same seed, trained again from scratch: every non-timing number is reproduced.
    shutil.rmtree(out / "runs" / "grpo-seed0")
    assert main(["study", str(path), "--out", str(out)]) == 0
    assert "1 to train" in capsys.readouterr().out
    again = json.loads((out / "study.json").read_text())
    assert again["fingerprint"] == first["fingerprint"]
    timing = {c["key"] for c in first["columns"] if c["timing"]}
    for row in first["rows"]:
        for key, cell in first["table"][row].items():
            if key not in timing:
                assert again["table"][row][key] == cell, (row, key)

    # --report while a run is unfinished: the finished ones' documents, marked partial, and
    # nothing trained or evaluated; published into <publish>/partial, the runs into archive
    shutil.rmtree(out / "runs" / "es_constant-seed0" / "eval")
    spec2 = {**spec, "publish": str(tmp_path / "pub"), "archive": str(tmp_path / "d" / "t.tar.xz")}
    path2 = _write(tmp_path, spec2, "spec2.yaml")
    assert main(["study", str(path2), "--out", str(out), "--report"]) == 0
    assert "Partial: 1 of 2 runs finished" in capsys.readouterr().out
    assert not (out / "runs" / "es_constant-seed0" / "eval").exists()
    part = json.loads((out / "study.json").read_text())
    assert part["partial"] == {"finished": 1, "runs": 2} and part["rows"] == ["grpo"]
    five_a = next(c for c in part["claims"] if c["id"] == "5a")  # es_constant's: not yet
    assert (five_a["verdict"], five_a["numbers"]) == ("not run",
                                                     "no finished run yet: es_constant")
    for name in ("study.md", "claims.md"):
        lines = (tmp_path / "pub" / "partial" / name).read_text().splitlines()
        assert lines[0].startswith("# ") and lines[2].startswith("**Partial: 1 of 2 runs")
    import tarfile

    with tarfile.open(tmp_path / "d" / "t.tar.xz") as tar:
        names = tar.getnames()
    assert "runs/grpo-seed0/summary.json" in names
    assert not any(n.startswith("runs/es_constant-seed0/eval") for n in names)


def test_exploration_specs_cover_every_claim_and_set_per_task_targets():
    path = builtin.find("subset_sum", "study")
    spec = S.load_spec(path)
    plans = S.plan_runs(spec, path, Path("/tmp/unused"))
    assert {n for c in S.CLAIMS for n in c.needs} <= set(S.order_rows(spec, plans))
    by = {(p.name, p.seed): p.cfg for p in plans}
    assert by["es_constant", 0].control.adaptive.schedule.target == 0.19
    assert by["eepo", 1].control.eepo.alpha == 0.19
    assert by["grpo", 2].optim.mini_batches == 4 and by["grpo", 2].optim.lr == 1e-4
    # a variant gets its recipe's per-task overrides: e3_no_budget keeps e3's (none), and
    # clip_cov_more keeps clip_cov's regime
    assert by["clip_cov_more", 0].algorithm.clip_cov_ratio == 0.1
    assert spec.eval.n == 64 and max(spec.eval.k) == 64 and spec.base_eval
    cd = builtin.find("countdown", "study")
    cplans = S.plan_runs(S.load_spec(cd), cd, Path("/tmp/unused"))
    assert {p.cfg.lab.params["ops"] for p in cplans} == {"+-"}


def test_recipe_set_names_must_be_recipes_of_the_study(tmp_path):
    path = _write(tmp_path, {"recipes": ["grpo", "es_constant"],
                             "recipe_set": {"es_constnt": ["optim.lr=1e-4"]}})
    with pytest.raises(C.ConfigError, match="recipe_set.es_constnt.*did you mean 'es_constant'"):
        S.plan_runs(S.load_spec(path), path, tmp_path / "out")
    path = _write(tmp_path, {"recipes": ["grpo"], "recipe_set": {"grpo": {"optim.lr": 1e-4}}})
    with pytest.raises(C.ConfigError, match="recipe_set"):
        S.load_spec(path)


def test_pooled_law_recovers_a_known_law_per_size(tmp_path):
    """Points exactly on R = −0.2·e^H + 0.9 (runs of the default size) and on
    R = −0.1·e^H + 0.8 (large): the pooled fit over every run mixes the two; each size's fit
    recovers its own a and b with R² = 1 and a point interval."""
    import math

    from explorl.analysis.entropy_law import ACCURACY_KEY, ENTROPY_KEY
    from explorl.analysis.runs import Run
    from explorl.report.numbers import pooled_law

    def run(i, a, b, size):
        recs = [{"step": s, ENTROPY_KEY: h, ACCURACY_KEY: -a * math.exp(h) + b}
                for s, h in enumerate([0.1 + 0.05 * j + 0.01 * i for j in range(6)])]
        return Run(tmp_path / f"r{i}", "grpo", i, recs, {"lab": {"model_size": size}})

    groups = {"grpo": [run(i, 0.2, 0.9, "default") for i in range(3)],
              "grpo_large": [run(i, 0.1, 0.8, "large") for i in range(3)]}
    law = pooled_law(groups, n_boot=50)
    assert law["runs"] == 6 and law["points"] == 36 and law["r2"].estimate < 0.99
    for size, (a, b) in (("default", (0.2, 0.9)), ("large", (0.1, 0.8))):
        fit = law["by_size"][size]
        assert fit["a"].estimate == pytest.approx(a, abs=1e-6)
        assert fit["b"].estimate == pytest.approx(b, abs=1e-6)
        assert fit["r2"].low == pytest.approx(1.0) and fit["a"].high == pytest.approx(a, abs=1e-6)


def test_cpu_overhead_is_cpu_seconds_per_step_over_grpos():
    per_run = {"grpo": [_run(cpu_step_s=0.2), _run(cpu_step_s=0.2)],
               "eepo": [_run(cpu_step_s=0.3), _run(cpu_step_s=0.25)]}
    table = S.build_table(["grpo", "eepo"], per_run, [1, 16])
    assert table["eepo"]["cpu_overhead"].mean == pytest.approx(0.375)  # (0.5 + 0.25) / 2
    assert table["grpo"]["cpu_overhead"].mean == pytest.approx(0.0)
    assert table["eepo"]["cpu_step_s"].mean == pytest.approx(0.275)


def test_run_cpu_numbers_skip_validation_steps(tmp_path):
    """cpu_step_s: mean time/cpu_s over steps without a validation; cpu_run_s: the sum over all."""
    from explorl.analysis.runs import Run

    recs = [{"step": s, "entropy/mean": 0.3, "reward/mean": 0.5, "time/step_s": 1.0,
             "time/cpu_s": c, **({"time/val_s": 0.5} if s == 2 else {})}
            for s, c in ((1, 0.2), (2, 0.9), (3, 0.4))]
    nums = S.run_numbers(Run(tmp_path, "grpo", 0, recs), {}, None, [1])
    assert nums["cpu_step_s"] == pytest.approx(0.3) and nums["cpu_run_s"] == pytest.approx(1.5)


def test_step_seconds_are_the_median_without_validation(tmp_path):
    """s / step: the median of time/step_s − time/val_s, so one step of a suspended job (60 s)
    does not move it: steps of 1.0, 1.5 − 0.5, 1.2 and 60 s → median of (1.0, 1.0, 1.2, 60)."""
    from explorl.analysis.runs import Run

    recs = [{"step": s, "entropy/mean": 0.3, "reward/mean": 0.5, "time/step_s": w,
             **({"time/val_s": 0.5} if s == 2 else {})}
            for s, w in ((1, 1.0), (2, 1.5), (3, 1.2), (4, 60.0))]
    nums = S.run_numbers(Run(tmp_path, "grpo", 0, recs), {}, None, [1])
    assert nums["step_s"] == pytest.approx(1.1)


def test_run_numbers_anneal_ratio_and_beta_by_hand(tmp_path):
    """20 steps, annealing_ratio 0.4: the phase starts at step 12 (20 − ⌊8⌋); the 10% window is
    2 steps, so the ratio is mean H of steps 19–20 (0.8) over steps 10–11 (1.0) = 0.8, and the
    run's β is reported for claim 2b; no annealing: both None."""
    from explorl.analysis.runs import Run

    H = {s: 1.0 if s <= 11 else 0.9 if s <= 18 else 0.8 for s in range(1, 21)}
    recs = [{"step": s, "entropy/mean": h, "reward/mean": 0.5} for s, h in H.items()]
    run = Run(tmp_path, "e3", 0, recs)
    temp = {"enabled": True, "anneal": True, "annealing_ratio": 0.4, "beta": 0.9}
    nums = S.run_numbers(run, {"control": {"temperature": temp}}, None, [1])
    assert nums["anneal_entropy_ratio"] == pytest.approx(0.8) and nums["anneal_beta"] == 0.9
    off = S.run_numbers(run, {"control": {"temperature": {**temp, "anneal": False}}}, None, [1])
    assert off["anneal_entropy_ratio"] is None and off["anneal_beta"] is None


def test_a_run_saved_with_its_losss_own_agg_is_the_same_run_as_one_that_leaves_it_unset(tmp_path):
    """Runs saved before ``algorithm.agg`` could be unset wrote the loss's own aggregation
    (token-mean for ppo); a spec that leaves it unset plans the same run (its archive restores),
    while another aggregation is still another configuration."""
    path = _write(tmp_path, {"recipes": ["grpo"], "max_steps": 10})
    spec = S.load_spec(path)
    (plan,) = S.plan_runs(spec, path, tmp_path / "out")
    assert plan.cfg.algorithm.agg is None
    plan.out.mkdir(parents=True)
    saved = dataclasses.replace(plan.cfg, algorithm=dataclasses.replace(plan.cfg.algorithm,
                                                                        agg="token-mean"))
    C.save(saved, plan.out / "config.yaml")
    assert S.run_state(plan) == "restart"
    other = dataclasses.replace(saved, algorithm=dataclasses.replace(saved.algorithm,
                                                                     agg="seq-mean-token-sum"))
    C.save(other, plan.out / "config.yaml")
    with pytest.raises(C.ConfigError, match="another configuration"):
        S.run_state(plan)


@pytest.mark.parametrize("keep, left", [("all", [10, 20, 30]), ("final", [30])])
def test_a_finished_run_keeps_only_its_final_checkpoint_when_asked(tmp_path, keep, left):
    from explorl.outputs.checkpoint import STATE_FILE, list_checkpoints
    from explorl.study.jobs import free_disk

    path = _write(tmp_path, {"recipes": ["grpo"], "keep_finished": keep})
    spec = S.load_spec(path)
    plan = S.plan_runs(spec, path, tmp_path / "out")[0]
    for step in (10, 20, 30):
        d = plan.out / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        (d / STATE_FILE).write_bytes(b"state")
    free_disk(plan, spec)
    assert [int(p.name.split("-")[1]) for p in list_checkpoints(plan.out)] == left


def test_jobs_start_with_every_seed_of_the_baseline(tmp_path):
    from explorl.study.jobs import baseline_first

    # the baseline is the first recipe, whatever its name (real/grpo's is real-grpo)
    path = _write(tmp_path, {"recipes": ["e3", "grpo"], "seeds": [0, 1, 2],
                             "variants": [{"name": "v", "recipe": "grpo",
                                           "set": ["optim.lr=2e-5"]}]})
    spec = S.load_spec(path)
    plans = S.plan_runs(spec, path, tmp_path / "out")
    assert [p.key for p in plans][:3] == ["e3-seed0", "grpo-seed0", "v-seed0"]  # seed by seed
    assert [(p.name, p.seed) for p in baseline_first(plans, spec)] == [
        ("e3", 0), ("e3", 1), ("e3", 2), ("grpo", 0), ("v", 0), ("grpo", 1), ("v", 1),
        ("grpo", 2), ("v", 2)]


def test_published_archives_are_data_not_documentation():
    """The built-in specs keep their runs' archives in study-data/, never under docs/ (the docs
    site copies every file there)."""
    root = Path(__file__).resolve().parents[1]
    assert not list((root / "docs").rglob("*.tar.xz"))
    for path in sorted(builtin.folder("study").glob("*.yaml")):
        spec = S.load_spec(path)
        assert spec.archive and spec.archive.startswith("study-data/"), path.name
        assert S.archive_path(spec) == Path(spec.archive)

"""A corpus of malformed recipes: each ends in one ``error:`` line and exit status 2, with no
traceback, before any model is loaded and before the run directory is created.

The CLI runs in-process (``explorl.cli.main``) with ``Trainer`` replaced by a stub that fails
the test if it is ever reached, so every case is caught by ``validation.validate``. Part of the
corpus is generated from the config tree (an unknown key in every section, a wrong type for
every field, NaN/inf for every float, both sides of every range in ``config.RANGES``); the rest
is written by hand (YAML errors, encodings, ``base:`` chains, relations between fields, the
values of issue 17).
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import types
import typing

import pytest
import yaml

from explorl import config as C
from explorl import validation
from explorl.cli import main

# ----------------------------------------------------------------------------- the corpus


def _sections(cls=C.RunConfig, prefix=""):
    """Every config section (dataclass) as (dotted prefix, class), the top level included."""
    yield prefix, cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _sections(hints[f.name], f"{prefix}{C.key_of(f.name)}.")


def _nested(path: str, value) -> dict:
    """``"a.b.c", v`` → ``{"a": {"b": {"c": v}}}``."""
    out = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


def _leaf_types() -> dict[str, type]:
    """Dotted path → the field's value type (Optional and list unwrapped)."""
    out = {}
    for prefix, cls in _sections():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                continue
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if typing.get_origin(tp) is list or (args and typing.get_origin(args[0]) is list):
                tp = list
            elif typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
                tp = args[0]
            out[prefix + C.key_of(f.name)] = tp
    return out


def _outside(path: str, tp: type) -> list:
    """Values just outside the interval ``RANGES[path]``."""
    iv = C.Interval.parse(C.RANGES[path])
    out = []
    if math.isfinite(iv.lo):
        out.append(iv.lo if not iv.lo_closed else iv.lo - 1)
    if math.isfinite(iv.hi):
        out.append(iv.hi if not iv.hi_closed else (iv.hi + 1 if tp is int else iv.hi * 1.5 + 1))
    return [int(v) if tp is int else float(v) for v in out]


def generated_cases() -> list[tuple[str, dict, str]]:
    """(id, recipe data, the start of the expected message)."""
    cases = []
    for prefix, _ in _sections():
        key = prefix + "nosuchkey"
        cases.append((f"unknown:{key}", _nested(key, 1), f"{key}: unknown key"))
    types = _leaf_types()
    for path in types:
        wrong = (
            [1] if typing.get_origin(types[path]) is dict else {"x": 1}
        )  # a mapping is right there
        cases.append((f"type:{path}", _nested(path, wrong), f"{path}: "))
    for path in C.RANGES:
        tp = types[path]
        if tp is float:
            for v in (math.nan, math.inf, -math.inf):
                cases.append(
                    (f"nonfinite:{path}={v}", _nested(path, v), f"{path}: must be a finite number")
                )
        for v in _outside(path, tp):
            value = [v] if types[path] is list else v
            where = f"{path}[0]" if types[path] is list else path
            if tp is list:  # eval.k: list of int
                value, where = [int(v)], f"{path}[0]"
            cases.append((f"range:{path}={v}", _nested(path, value), f"{where}: must be"))
    return cases


def _y(text: str) -> dict:
    return {"r.yaml": text}


# (id, files — "r.yaml" is the recipe —, extra CLI arguments, expected fragment of the message)
HAND_WRITTEN: list[tuple[str, dict, list[str], str]] = [
    # YAML syntax, structure and encodings
    ("yaml-unclosed-flow", _y("algorithm: {eps_high: 0.3\n"), [], "r.yaml line"),
    ("yaml-tab-indent", _y("algorithm:\n\teps_high: 0.3\n"), [], "r.yaml line 2"),
    ("yaml-two-colons", _y("max_steps: 3: 4\n"), [], "mapping values are not allowed"),
    ("yaml-truncated", _y("control: {temperature: {enabled: tr"), [], "r.yaml line"),
    (
        "yaml-duplicate-top",
        _y("max_steps: 3\nmax_steps: 4\n"),
        [],
        "duplicate key 'max_steps' (first at line 1)",
    ),
    (
        "yaml-duplicate-nested",
        _y("optim:\n  lr: 1e-5\n  lr: 2e-5\n"),
        [],
        "r.yaml line 3, column 3: duplicate key 'lr' (first at line 2)",
    ),
    ("yaml-top-list", _y("- a\n- b\n"), [], "must be a mapping of keys, got list"),
    ("yaml-top-scalar", _y("hello\n"), [], "must be a mapping of keys, got str"),
    ("yaml-nul", _y("max_steps: 3\x00\n"), [], "unacceptable character"),
    (
        "encoding-latin1",
        {"r.yaml": "name: café\n".encode("latin-1")},
        [],
        "is not UTF-8 text (invalid byte 0xe9 at offset 9)",
    ),
    ("encoding-utf16", {"r.yaml": "max_steps: 3\n".encode("utf-16")}, [], "is not UTF-8 text"),
    ("section-scalar", _y("control: 3\n"), [], "control: expected a mapping"),
    ("section-list", _y("optim: [1, 2]\n"), [], "optim: expected a mapping"),
    ("huge-value-cut", _y("rollout: {n_samples: '" + "x" * 100_000 + "'}\n"), [], "..."),
    # base chains
    (
        "base-list",
        _y("base: [a.yaml, b.yaml]\n"),
        [],
        "base: expected one recipe file name, got list",
    ),
    ("base-number", _y("base: 5\n"), [], "got int 5"),
    ("base-empty", _y("base: ''\n"), [], "got str ''"),
    ("base-null-is-none", _y("base: null\nmax_steps: 0\n"), [], "max_steps: must be in [1,"),
    ("base-missing", _y("base: nope.yaml\n"), [], "base 'nope.yaml' not found"),
    ("base-self", _y("base: r.yaml\n"), [], "circular 'base'"),
    ("base-cycle", {"r.yaml": "base: a.yaml\n", "a.yaml": "base: r.yaml\n"}, [], "circular 'base'"),
    (
        "base-directory",
        {"r.yaml": "base: sub\n", "sub/x.yaml": "max_steps: 3\n"},
        [],
        "base 'sub' not found",
    ),
    ("base-bad-yaml", {"r.yaml": "base: a.yaml\n", "a.yaml": "algorithm: [\n"}, [], "a.yaml line"),
    (
        "base-latin1",
        {"r.yaml": "base: a.yaml\n", "a.yaml": "name: é\n".encode("latin-1")},
        [],
        "a.yaml is not UTF-8",
    ),
    (
        "base-unknown-key",
        {"r.yaml": "base: a.yaml\n", "a.yaml": "algorithm: {eps_hihg: 1}\n"},
        [],
        "algorithm.eps_hihg: unknown key; did you mean 'algorithm.eps_high'?",
    ),
    (
        "base-list-in-base",
        {"r.yaml": "base: a.yaml\n", "a.yaml": "base: [x]\n"},
        [],
        "a.yaml: base: expected one recipe file name",
    ),
    ("recipe-missing", {}, [], "r.yaml does not exist"),
    ("recipe-directory", {"r.yaml/x": "a: 1\n"}, [], "(it is a directory)"),
    # the values of issue 17
    ("lr-string", _y("optim: {lr: fast}\n"), [], "optim.lr: expected a number, got str 'fast'"),
    ("lr-inf", _y("optim: {lr: .inf}\n"), [], "optim.lr: must be a finite number"),
    (
        "n-samples-float",
        _y("rollout: {n_samples: 2.5}\n"),
        [],
        "rollout.n_samples: expected an integer",
    ),
    (
        "n-samples-1e9",
        _y("rollout: {n_samples: 1000000000}\n"),
        [],
        "rollout.n_samples: must be in [1, 4096], got 1000000000",
    ),
    (
        "n-samples-1e9-float",
        _y("rollout: {n_samples: 1e9}\n"),
        [],
        "rollout.n_samples: expected an integer, got float",
    ),
    (
        "timeout-inf",
        _y("reward: {timeout_s: .inf}\n"),
        [],
        "reward.timeout_s: must be a finite number",
    ),
    (
        "temperature-inf",
        _y("rollout: {temperature: .inf}\n"),
        [],
        "rollout.temperature: must be a finite",
    ),
    ("adv-eps-nan", _y("algorithm: {adv_eps: .nan}\n"), [], "algorithm.adv_eps: must be a finite"),
    ("adv-eps-zero", _y("algorithm: {adv_eps: 0}\n"), [], "algorithm.adv_eps: must be in (0, 1]"),
    (
        "eepo-alpha-nan",
        _y("control: {eepo: {alpha: .nan}}\n"),
        [],
        "control.eepo.alpha: must be a finite",
    ),
    (
        "eval-temperature-neg",
        _y("eval: {temperature: -1}\n"),
        [],
        "eval.temperature: must be in [0, 100]",
    ),
    (
        "eval-max-problems-neg",
        _y("eval: {max_problems: -5}\n"),
        [],
        "eval.max_problems: must be in [1,",
    ),
    (
        "max-prompt-len-0",
        _y("data: {max_prompt_len: 0}\n"),
        [],
        "data.max_prompt_len: must be in [1,",
    ),
    (
        "schedule-target-neg",
        _y("control: {adaptive: {schedule: {target: -1}}}\n"),
        [],
        "control.adaptive.schedule.target: must be ≥ 0",
    ),
    ("beta1-2", _y("optim: {beta1: 2}\n"), [], "optim.beta1: must be in [0, 1), got 2.0"),
    (
        "weight-decay-neg",
        _y("optim: {weight_decay: -0.1}\n"),
        [],
        "optim.weight_decay: must be ≥ 0",
    ),
    (
        "device-banana",
        _y("model: {device: banana}\n"),
        [],
        "model.device: 'banana' is not a torch device",
    ),
    ("seed-neg", _y("seed: -1\n"), [], "seed: must be in [0, 4294967295], got -1"),
    ("seed-2-32", _y("seed: 4294967296\n"), [], "seed: must be in [0, 4294967295]"),
    ("seed-cli-neg", _y("max_steps: 3\n"), ["--seed", "-1"], "seed: must be in [0, 4294967295]"),
    ("max-steps-cli-0", _y("max_steps: 3\n"), ["--max-steps", "0"], "max_steps: must be in [1,"),
    ("name-slash", _y("name: a/b\n"), [], "name: must be a non-empty name without '/'"),
    ("name-empty", _y("name: ' '\n"), [], "name: must be a non-empty name"),
    # paths and names, checked before anything is loaded
    (
        "model-missing",
        _y("model: {path: /nonexistent/model}\n"),
        [],
        "model.path: '/nonexistent/model' is not a local directory",
    ),
    (
        "model-no-config",
        {"r.yaml": "model: {path: MODEL}\n", "m/tokenizer.json": "{}"},
        [],
        "holds no config.json",
    ),
    ("model-empty", _y("model: {path: ''}\n"), [], "model.path: is empty"),
    (
        "lab-task-typo",
        _y("model: {path: 'lab:adition'}\n"),
        [],
        "model.path: unknown lab task 'adition'; did you mean 'addition'?",
    ),
    (
        "data-lab-typo",
        _y("data: {train: ['lab:countdwn']}\n"),
        [],
        "data.train[0]: unknown lab task 'countdwn'; did you mean 'countdown'?",
    ),
    (
        "data-missing",
        _y("data: {train: [missing.jsonl]}\nreward: {verifier: math}\n"),
        [],
        "data.train[0]: data file 'missing.jsonl' not found",
    ),
    (
        "data-val-missing",
        _y("data: {val: [nope.parquet]}\n"),
        [],
        "data.val[0]: data file 'nope.parquet'",
    ),
    ("data-anneal-missing", _y("data: {anneal: [nope.json]}\n"), [], "data.anneal[0]: data file"),
    (
        "data-csv",
        {"r.yaml": "data: {train: [DIR/a.csv]}\nreward: {verifier: math}\n", "a.csv": "x\n"},
        [],
        "unsupported file type '.csv'",
    ),
    ("data-empty-list", _y("data: {train: []}\n"), [], "data.train: needs at least one dataset"),
    (
        "verifier-typo",
        _y("reward: {verifier: mathh}\n"),
        [],
        "reward.verifier: unknown verifier 'mathh'; did you mean 'math'?",
    ),
    (
        "verifier-no-module",
        _y("reward: {verifier: 'nosuchmod:fn'}\n"),
        [],
        "reward.verifier: no module named 'nosuchmod'",
    ),
    (
        "verifier-not-callable",
        _y("reward: {verifier: 'explorl.rewards.verifiers:VERIFIERS'}\n"),
        [],
        "is a dict, not a function",
    ),
    ("loss-typo", _y("algorithm: {loss: clipcov}\n"), [], "did you mean 'clip_cov'?"),
    ("agg-typo", _y("algorithm: {agg: token_mean}\n"), [], "did you mean 'token-mean'?"),
    # controllers: conflicts and their own constraints
    (
        "two-entropy-trackers",
        _y("control: {temperature: {enabled: true}, adaptive: {enabled: true}}\n"),
        [],
        "error: control.temperature and control.adaptive both steer entropy",
    ),
    (
        "adaptive-delta-neg",
        _y("control: {adaptive: {enabled: true, delta: -0.01}}\n"),
        [],
        "control.adaptive.delta: must be ≥ 0",
    ),
    (
        "adaptive-min-gt-max",
        _y("control: {adaptive: {enabled: true, min: 0.4, max: 0.3, init: 0.35}}\n"),
        [],
        "control.adaptive.max: must be ≥ control.adaptive.min",
    ),
    (
        "adaptive-init-outside",
        _y("control: {adaptive: {enabled: true, init: 0.5}}\n"),
        [],
        "control.adaptive.init: must be in [min, max] = [0.2, 0.4], got 0.5",
    ),
    (
        "adaptive-temperature-min-0",
        _y("control: {adaptive: {enabled: true, actuator: temperature, min: 0}}\n"),
        [],
        "control.adaptive.min: temperature must be in (0, 100] (the range of rollout.temperature)",
    ),
    (
        "adaptive-entropy-coef-neg",
        _y("control: {adaptive: {enabled: true, actuator: entropy_coef, min: -1}}\n"),
        [],
        "control.adaptive.min: entropy_coef must be ≥ 0",
    ),
    (
        "curriculum-n-samples-0",
        _y("control: {curriculum: {enabled: true, n_samples: 0}}\n"),
        [],
        "control.curriculum.n_samples: must be in [1, 4096]",
    ),
    (
        "curriculum-start-ratio",
        _y("control: {curriculum: {start_ratio: 1.5}}\n"),
        [],
        "control.curriculum.start_ratio: must be in (0, 1)",
    ),
    (
        "eepo-eps",
        _y("control: {eepo: {eps_l: 0.5, eps_r: 0.6}}\n"),
        [],
        "control.eepo.eps_r: need control.eepo.eps_l < 1 − eps_r",
    ),
    (
        "eepo-one-sample",
        _y("rollout: {n_samples: 1}\ncontrol: {eepo: {enabled: true}}\n"),
        [],
        "control.eepo.enabled: EEPO needs rollout.n_samples ≥ 2",
    ),
    (
        "budget-limits",
        _y("control: {budget: {enabled: true, n_min_limit: 10}}\n"),
        [],
        "control.budget.n_min_limit: must be ≤ rollout.n_samples",
    ),
    (
        "temperature-start-outside",
        _y("rollout: {temperature: 3.0}\ncontrol: {temperature: {enabled: true}}\n"),
        [],
        "rollout.temperature: the temperature scheduler starts here",
    ),
    (
        "temperature-clamp",
        _y("control: {temperature: {t_min: 3.0}}\n"),
        [],
        "control.temperature.t_min: must be ≤ control.temperature.t_max",
    ),
    # other relations between fields
    (
        "step-timeout-below-timeout",
        _y("reward: {step_timeout_s: 1, timeout_s: 5}\n"),
        [],
        "reward.step_timeout_s: must be ≥ reward.timeout_s",
    ),
    (
        "max-train-prompts",
        _y("data: {max_train_prompts: 2, prompts_per_step: 4}\n"),
        [],
        "data.max_train_prompts: must be ≥ data.prompts_per_step",
    ),
    (
        "overlong-buffer",
        _y("rollout: {max_response_len: 8}\nreward: {overlong_buffer: 8}\n"),
        [],
        "reward.overlong_buffer: must be < rollout.max_response_len",
    ),
    (
        "clip-cov-bounds",
        _y("algorithm: {clip_cov_lb: 5, clip_cov_ub: 1}\n"),
        [],
        "algorithm.clip_cov_ub: must be > algorithm.clip_cov_lb",
    ),
    (
        "eval-k",
        _y("eval: {n_samples: 4, k: [1, 8]}\n"),
        [],
        "eval.k: every k must be ≤ eval.n_samples",
    ),
    (
        "lab-digits",
        _y("lab: {min_digits: 3, max_digits: 2}\n"),
        [],
        "lab.params: addition needs 1 <= min_digits <= max_digits",
    ),
    # --set
    (
        "set-unknown",
        _y("max_steps: 3\n"),
        ["--set", "algorithm.eps_hihg=0.3"],
        "algorithm.eps_hihg: unknown key; did you mean 'algorithm.eps_high'?",
    ),
    (
        "set-nan",
        _y("max_steps: 3\n"),
        ["--set", "optim.lr=.nan"],
        "optim.lr: must be a finite number",
    ),
    ("set-section-value", _y("max_steps: 3\n"), ["--set", "optim=3"], "optim: expected a mapping"),
    (
        "set-through-value",
        _y("optim: {lr: 1e-5}\n"),
        ["--set", "optim.lr.x=1"],
        "optim.lr: is a value, not a section",
    ),
    ("set-no-equals", _y("max_steps: 3\n"), ["--set", "optim.lr"], "--set expects key=value"),
    ("set-bad-list", _y("max_steps: 3\n"), ["--set", "eval.k=[1, 2"], "eval.k: expected a list"),
]


def _write(tmp_path, files: dict) -> None:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.replace("MODEL", str(tmp_path / "m")).replace("DIR", str(tmp_path))
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run ``explorl train r.yaml`` in-process; fail if a Trainer (hence a model) is reached."""
    import explorl.training.loop

    class NoTrainer:
        def __init__(self, *a, **k):
            raise AssertionError("the recipe was accepted and a Trainer was built")

    monkeypatch.setattr(explorl.training.loop, "Trainer", NoTrainer)
    monkeypatch.chdir(tmp_path)

    def run(files: dict, extra: list[str] = ()) -> str:
        _write(tmp_path, files)
        out = tmp_path / "run"
        code = main(["train", str(tmp_path / "r.yaml"), "--out", str(out), *extra])
        captured = capsys.readouterr()
        err = captured.err
        assert code == 2, err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert "Traceback" not in err + captured.out
        assert not out.exists()  # no stub run directory left behind
        return err

    return run


@pytest.mark.parametrize("case", generated_cases(), ids=lambda c: c[0])
def test_generated_malformed_recipe(cli, case):
    _, data, start = case
    err = cli({"r.yaml": yaml.safe_dump(data)})
    assert err.startswith(f"error: {start}"), err


@pytest.mark.parametrize("case", HAND_WRITTEN, ids=lambda c: c[0])
def test_hand_written_malformed_recipe(cli, case):
    _, files, extra, fragment = case
    err = cli(files, list(extra))
    assert fragment in err, err
    assert len(err) < 1000  # a huge value is quoted cut short


def test_the_corpus_covers_every_numeric_field_both_ways():
    ids = [c[0] for c in generated_cases()]
    assert sum(i.startswith("range:") for i in ids) >= len(C.RANGES)
    assert sum(i.startswith("unknown:") for i in ids) == len(list(_sections()))
    assert len(ids) + len(HAND_WRITTEN) > 300


def test_cuda_device_on_a_machine_without_it(cli):
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    device = "cuda:7" if torch.cuda.is_available() else "cuda"
    assert f"model.device: '{device}'" in cli(_y(f"model: {{device: '{device}'}}\n"))


def test_debug_shows_the_traceback(tmp_path):
    (tmp_path / "r.yaml").write_text("optim: {lr: -1}\n")
    with pytest.raises(C.ConfigError, match="optim.lr: must be > 0"):
        main(["--debug", "train", str(tmp_path / "r.yaml")])
    with pytest.raises(C.ConfigError, match="optim.lr"):
        main(["train", str(tmp_path / "r.yaml"), "--debug"])


def test_resume_of_a_broken_run_directory(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_bytes(b"max_steps: 3\nmax_steps: 4\n")
    assert main(["train", "--resume", str(run)]) == 2
    assert "config.yaml line 2, column 1: duplicate key 'max_steps'" in capsys.readouterr().err
    (run / "config.yaml").write_text("max_steps: 3\n")
    assert main(["train", "--resume", str(run)]) == 2  # no checkpoint: before any model loads
    assert "no complete checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, extra, fragment",
    [
        ("optim: {lr: fast}\n", [], "optim.lr: expected a number"),
        ("base: [a.yaml, b.yaml]\n", [], "base: expected one recipe file name"),
    ],
)
def test_real_process_prints_one_line_and_exits_2(tmp_path, text, extra, fragment):
    (tmp_path / "r.yaml").write_text(text)
    p = subprocess.run(
        [sys.executable, "-m", "explorl", "train", str(tmp_path / "r.yaml"), *extra],
        capture_output=True,
        check=False,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert p.returncode == 2
    assert p.stderr.startswith("error: ") and fragment in p.stderr and p.stderr.count("\n") == 1
    assert "Traceback" not in p.stderr + p.stdout


# ----------------------------------------------------------------------------- accepted


def test_numbers_in_exponent_notation_are_numbers(tmp_path):
    (tmp_path / "r.yaml").write_text(
        "optim:\n  lr: 3e-6\n  weight_decay: 1E-2\nalgorithm: {kl_cov_tol: 1.5e+1}\n"
    )
    cfg = validation.load(tmp_path / "r.yaml", ["control.eepo.lr=1e-3", "optim.beta2=9.99e-1"])
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.algorithm.kl_cov_tol) == (3e-6, 1e-2, 15.0)
    assert (cfg.control.eepo.lr, cfg.optim.beta2) == (1e-3, 0.999)
    assert C.parse_override("optim.lr=1e-5") == ("optim.lr", 1e-5)  # the example in --help
    assert C.parse_override("name=1e5x") == ("name", "1e5x")  # not a number: stays text


def test_byte_order_mark_and_empty_sections_are_read(tmp_path):
    (tmp_path / "r.yaml").write_bytes("\ufeffmax_steps: 7\ncontrol:\n  # nothing yet\n".encode())
    cfg = validation.load(tmp_path / "r.yaml", ["control.temperature.enabled=true"])
    assert cfg.max_steps == 7 and cfg.control.temperature.enabled


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    (tmp_path / "r.yaml").write_text("x: &d {lr: 1.0e-5}\n")
    assert C.load_yaml("a: &d {lr: 1}\nb:\n  <<: *d\n  lr: 2\n") == {"a": {"lr": 1}, "b": {"lr": 2}}

"""What an installed user gets: the wheel holds every built-in recipe and study spec, the package
metadata a registry page shows, and ``explorl recipes`` lists, shows and copies them.

The end-to-end check of an installed wheel (fresh venv, empty directory, train and eval) is
``.ci/wheel_check.sh``: too slow for the default suite.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from explorl import validation
from explorl.cli import main
from explorl.cli_recipes import rows
from explorl.config import builtin

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The project's wheel, built from a copy of the tree (the build writes beside its sources)."""
    src = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "src", src / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, capture_output=True)
    (path,) = out.glob("explorl-*.whl")
    with zipfile.ZipFile(path) as z:
        yield z


def test_the_wheel_holds_every_recipe_and_study_spec(wheel):
    inside = set(wheel.namelist())
    for kind, folder in builtin.KINDS.items():
        shipped = {f"explorl/{folder}/{n}.yaml" for n in builtin.names(kind)}
        assert shipped and shipped <= inside, sorted(shipped - inside)
    assert "explorl/__main__.py" in inside
    assert not [n for n in inside if n.startswith(("tests/", "benchmarks/", "docs/"))]


def test_the_wheel_metadata_has_what_a_registry_page_shows(wheel):
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    meta = Parser().parsestr(wheel.read(name).decode())
    assert meta["Name"] == "explorl" and meta["Version"]
    assert 20 < len(meta["Summary"]) <= 200
    assert any(c.startswith("Programming Language :: Python :: 3") for c in
               meta.get_all("Classifier"))
    assert {u.split(",")[0] for u in meta.get_all("Project-URL")} >= {"Homepage", "Source"}
    entry = wheel.read(name.replace("METADATA", "entry_points.txt")).decode()
    assert "explorl = explorl.cli:main" in entry


def test_version_comes_from_the_package_metadata(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"explorl {version('explorl')}"
    run = subprocess.run([sys.executable, "-m", "explorl", "--version"], capture_output=True,
                         text=True, env={"PYTHONPATH": str(REPO / "src"), "PATH": ""})
    assert run.returncode == 0 and run.stdout.strip() == f"explorl {version('explorl')}"


def test_recipes_lists_every_recipe_one_row_each_at_80_columns(capsys):
    got = rows()
    training = [n for n in builtin.names("recipe") if not n.startswith("accelerate/")]
    assert [r[0] for r in got] == training and "quickstart" in training and "lab/grpo" in training
    assert all(r[1] and r[2] for r in got)
    assert dict((r[0], r[1]) for r in got)["lab/grpo"] == "lab:addition"
    # the three Entropy Scheduling schedules share a head; their next clause tells them apart
    methods = {r[0]: r[2] for r in got}
    assert len({methods["lab/es_constant"], methods["lab/es_cosine"], methods["lab/es_wsd"]}) == 3
    console = Console(width=80, record=True)
    from explorl.cli_recipes import list_builtins

    list_builtins("recipe", console)
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for name in builtin.names("recipe"):
        assert name in text


def test_train_resolves_a_builtin_name_and_a_file_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert validation.load("quickstart", env=False).name == "quickstart"
    assert validation.load("lab/dapo", env=False).algorithm.eps_high == 0.28  # base resolved
    assert validation.load("recipes/lab/dapo.yaml", env=False).name == "dapo"  # a clone's old path
    (tmp_path / "quickstart").write_text("name: mine\nmax_steps: 7\n")
    assert validation.load("quickstart", env=False).name == "mine"  # a file always wins


def test_an_unknown_name_lists_the_closest_builtins(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "lab/gpro", "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: recipe lab/gpro does not exist") and "lab/grpo" in err
    assert "Traceback" not in err
    assert main(["study", "subset_summ"]) == 2
    assert "closest built-in study specs: subset_sum" in capsys.readouterr().err
    assert main(["train", "accelerate/fsdp"]) == 2
    assert "not a recipe" in capsys.readouterr().err


def test_recipes_cp_writes_a_copy_whose_base_still_resolves(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["recipes", "cp", "lab/dapo"]) == 0
    copy = tmp_path / "dapo.yaml"
    assert "base: lab/grpo" in copy.read_text()
    assert validation.load(str(copy), env=False) == validation.load("lab/dapo", env=False)
    assert main(["recipes", "cp", "lab/dapo"]) == 2  # no silent overwrite
    assert "--force" in capsys.readouterr().err
    assert main(["recipes", "show", "quickstart"]) == 0
    assert "base: lab/grpo.yaml" in capsys.readouterr().out
    assert main(["recipes", "--studies", "cp", "lab", "mine.yaml"]) == 0
    spec = yaml.safe_load((tmp_path / "mine.yaml").read_text())
    assert Path(spec["recipe_dir"]) == (builtin.folder("recipe") / "lab").resolve()
    from explorl.study.spec import load_spec, resolve_recipe

    loaded = load_spec(tmp_path / "mine.yaml")
    assert resolve_recipe("grpo", loaded, "recipes[0]", tmp_path / "mine.yaml").is_file()


def test_eval_and_passk_tables_fit_80_columns_without_cutting_a_value(capsys):
    from explorl.eval.run import _print_table
    from explorl.outputs.tables import print_tables, stacked

    ks = [1, 2, 4, 8, 16, 32, 64]
    s = {"n_problems": 100, **{f"pass@{k}": 0.123456 for k in ks}, "mean@n": 0.25,
         "greedy_accuracy": 0.5}
    console = Console(width=80, record=True)
    _print_table({"settings": {"k": ks, "n": 64, "temperature": 1.0}, "overall": s,
                  "by_source": {"countdown_plus_minus": s}}, console)
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for header in ["source", "problems", *[f"pass@{k}" for k in ks], "mean@n", "greedy"]:
        assert f" {header} " in text
    assert text.count("countdown_plus_minus") == 2  # stacked: the label column repeats
    assert text.count("0.123") == 2 * len(ks)
    wide = stacked(["run", *map(str, range(30))], [["a long run label", *["0.500"] * 30]], 80)
    console = Console(width=80, record=True)
    print_tables(wide, console)
    out = console.export_text()
    assert len(wide) > 1 and "…" not in out and out.count("0.500") == 30


def test_recipes_cp_of_a_launcher_config_says_how_to_launch_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["recipes", "cp", "accelerate/cpu_2proc"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "cpu_2proc.yaml").is_file()
    assert "accelerate launch --config_file cpu_2proc.yaml -m explorl train" in out
    assert "explorl train cpu_2proc.yaml" not in out

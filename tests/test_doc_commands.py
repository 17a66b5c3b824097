"""Every shell command the README and the Quickstart page show is run here, in document order, in
a scratch directory, so a documented command cannot rot.

- ``explorl`` commands on the lab run as written, on the tests' tiny lab model and for 2 steps
  (the demo's own command from the Makefile first, so ``runs/quickstart`` exists as after
  ``make demo``); ``report``, ``passk``, ``recipes`` and ``eval`` on those runs run as written.
- A command that names a real model or paper-scale data (``math/*``, ``real/*``, ``accelerate
  launch``) is parsed by the CLI's own parser and its recipe loaded and validated exactly as
  ``explorl train`` does before any model loads (every key, every file), with the placeholder
  paths pointing at a tiny model and data files the test writes; ``models get`` checks the name.
- ``make`` targets exist and ``make -n`` resolves them; ``pip install`` names the Makefile's torch
  pin and this package with extras it declares.

A command no handler knows fails the test: a new documented command needs a way to be run here."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from explorl import validation
from explorl.cli import build_parser, main
from explorl.lab.registry import get_task, parse_lab_spec
from explorl.model_store import registry

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", "docs/getting-started.md"]
MAKEFILE = (ROOT / "Makefile").read_text()

# The tiny run settings of conftest.tiny_config, as --set overrides (a step takes well under 1 s).
TINY_SETS = ["lab.n_train=30", "lab.n_val=10", "lab.n_test=10", "lab.params.max_digits=1",
             "data.prompts_per_step=4", "rollout.n_samples=4", "rollout.max_response_len=6",
             "reward.num_workers=1", "eval.every=2", "eval.n_samples=2", "eval.k=[1,2]",
             "eval.max_problems=8", "log.progress=false", "log.plots=false"]


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.M | re.S)


def commands(block: str) -> list[list[str]]:
    """Each command of a block as argv: continuation lines joined, comments dropped."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            out.append(argv)
    return out


def documented() -> list[tuple[str, list[str]]]:
    return [(doc, argv) for doc in DOCUMENTS
            for block in shell_blocks((ROOT / doc).read_text()) for argv in commands(block)]


def _parquet(path: Path) -> Path:
    """Two verl-schema rows (chat prompt, reward_model.ground_truth, data_source)."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + 1?"}],
             "reward_model": {"ground_truth": str(a + 1)}, "data_source": "math"} for a in (1, 2)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


class Runner:
    """Runs documented commands in ``cwd`` with placeholders mapped to test files."""

    def __init__(self, cwd: Path, tiny_model: Path):
        self.cwd, self.tiny = cwd, str(tiny_model)
        self.placeholders = {"/models/Qwen2.5-1.5B-Instruct": self.tiny}
        for name in ("math_train.parquet", "aime24.parquet"):
            self.placeholders[f"/data/{name}"] = str(_parquet(cwd / "data" / name))

    def map(self, argv: list[str]) -> list[str]:
        out = []
        for a in argv:
            for k, v in self.placeholders.items():
                a = a.replace(k, v)
            bad = re.search(r"(?<![\w.])/(?:models|data|path)/\S*", a)
            assert not bad, f"documented placeholder {bad.group(0)} has no test file: add one"
            out.append(a)
        return out

    def run(self, argv: list[str]) -> None:
        tool, rest = argv[0], self.map(argv[1:])
        if tool == "make":
            self.make(rest)
        elif tool == "pip" or tool.endswith("/pip"):
            self.pip(rest)
        elif tool == "explorl":
            self.explorl(rest)
        elif tool == "accelerate":
            self.accelerate(rest)
        else:
            pytest.fail(f"no test runs the documented command {shlex.join(argv)!r}")

    def make(self, targets: list[str]) -> None:
        for t in targets:
            assert re.search(rf"^{re.escape(t)}:", MAKEFILE, re.M), f"make {t}: no such target"
        if shutil.which("make"):
            done = subprocess.run(["make", "-n", *targets], cwd=ROOT, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, done.stderr

    def pip(self, args: list[str]) -> None:
        assert args[0] == "install", args
        pin = re.search(r"^TORCH_PIN \?= (\S+)", MAKEFILE, re.M).group(1)
        pyproject = (ROOT / "pyproject.toml").read_text()
        for req in args[1:]:
            name, _, extras = req.partition("[")
            if name == "torch==" + pin.split("==")[1] or req == pin:
                continue
            assert name == "explorl", f"pip install {req}: not torch's pin ({pin}) nor explorl"
            for extra in filter(None, extras.rstrip("]").split(",")):
                assert re.search(rf"^{extra} = \[", pyproject, re.M), f"no extra [{extra}]"

    def accelerate(self, args: list[str]) -> None:
        assert args[0] == "launch", args
        config = args[args.index("--config_file") + 1]
        assert (self.cwd / config).is_file(), f"{config}: not written by an earlier command"
        m = args.index("-m")
        assert args[m + 1] == "explorl", args
        self.validate_train(args[m + 2:])

    def explorl(self, args: list[str]) -> None:
        parsed = build_parser().parse_args(args)  # a renamed flag fails here (SystemExit)
        cmd = args[0]
        if cmd == "train" and not self.on_the_lab(parsed.recipe):
            return self.validate_train(args)
        if cmd == "train":
            args = args + [f"--set={s}" for s in [f"model.path={self.tiny}", *TINY_SETS]]
            args += ["--max-steps", "2", "--force"]
        elif cmd == "models":
            assert args[1] == "get" and args[2] in registry.KNOWN, args
            return None
        elif cmd == "eval":
            if args[1] == "lab:addition":  # the lab model itself: the tests' tiny one
                args = [args[0], self.tiny, *args[2:]]
            elif not (self.cwd / args[1]).is_dir():  # a run of a real model: its data resolves
                spec = args[args.index("--data") + 1]
                get_task(parse_lab_spec(spec))
                return None
            args = args + ["--max-problems", "4"]
        elif cmd == "passk":
            Path(self.cwd, parsed.out).parent.mkdir(parents=True, exist_ok=True)
        assert main(args) == 0, f"explorl {shlex.join(args)} failed"

    def on_the_lab(self, recipe: str) -> bool:
        return recipe == "quickstart" or recipe.startswith("lab/")

    def validate_train(self, args: list[str]) -> None:
        """What ``explorl train`` checks before any model loads, every file included; a recipe
        whose model is a registry name (``real/*``) gets the tiny model in its place."""
        parsed = build_parser().parse_args(args)
        sets = list(parsed.set or [])
        cfg = validation.load(parsed.recipe, sets, env=False)
        if registry.is_name(cfg.model.path):
            sets.append(f"model.path={self.tiny}")
        validation.load(parsed.recipe, sets, max_steps=parsed.max_steps, seed=parsed.seed)


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_every_documented_command_runs(doc, tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = Runner(tmp_path, tiny_model)
    demo = re.search(r"^demo:.*\n\t\$\(BIN\)/(explorl .*)$", MAKEFILE, re.M).group(1)
    runner.run(shlex.split(demo))  # what `make demo` leaves: runs/quickstart
    cmds = [argv for d, argv in documented() if d == doc]
    assert cmds, f"{doc} shows no shell command"
    for argv in cmds:
        runner.run(argv)


def test_the_documents_show_the_commands_this_test_knows():
    """The parser sees what a reader copies: continuation lines joined, comments dropped."""
    block = "explorl train a \\\n    --set 'x=[1, 2]'   # note\n\n# only a comment\nmake demo\n"
    assert commands(block) == [["explorl", "train", "a", "--set", "x=[1, 2]"], ["make", "demo"]]
    assert {argv[0] for _, argv in documented()} <= {"make", "pip", "explorl", "accelerate"}

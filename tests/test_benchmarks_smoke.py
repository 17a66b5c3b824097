"""Every script in benchmarks/ still runs against today's code: each one's ``--smoke`` (tiny
shapes, one repetition) as a subprocess. vLLM's side runs where it is installed and is skipped
inside the scripts where not; TRL is hidden from them (``make test`` installs the bench extra for
the losses' TRL-equivalence tests, and the suite's time should not depend on it): explorl's side
always runs. Figures are not checked: the benchmark README keeps them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))
# gpu_check.py --smoke runs these (--smoke) and fails where either exits non-zero
RUN_BY_GPU_CHECK = ("gpu_acceptance.py", "gpu_sampling.py", "gpu_update.py")


def test_every_benchmark_is_listed_and_takes_smoke():
    assert "gpu_acceptance.py" in SCRIPTS and "vs_trl.py" in SCRIPTS
    assert "gpu_sampling.py" in SCRIPTS and "gpu_update.py" in SCRIPTS
    for name in SCRIPTS:
        assert '"--smoke"' in (BENCH / name).read_text(), f"{name} has no --smoke"


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in SCRIPTS if n not in RUN_BY_GPU_CHECK])
def test_benchmark_smoke_runs(name, tmp_path):
    hide = tmp_path / "no_trl" / "trl"  # `import trl` fails as where the bench extra is missing
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'trl'\", name='trl')\n")
    path = os.pathsep.join([str(hide.parent), str(BENCH.parent / "src")])
    env = {**os.environ, "PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false",
           "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"}
    args = ["--smoke"] + (["--dir", str(tmp_path / "bench")] if name == "gpu_matrix.py" else [])
    if name == "gpu_check.py":
        args += ["--out", str(tmp_path / "gpu_check")]
    proc = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True,
                          text=True, env=env, cwd=BENCH.parent, timeout=300, check=False)
    assert proc.returncode == 0, (
        f"{name} --smoke failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    assert proc.stdout.strip(), f"{name} --smoke printed nothing"
    if name == "gpu_check.py":  # every recipe ran and passed; every section reported
        from explorl.config import builtin

        lines = [json.loads(x) for x in (tmp_path / "gpu_check" / "gpu_check.jsonl").open()]
        ran = {x["recipe"]: x["ok"] for x in lines if "recipe" in x}
        lab = {n for n in builtin.names("recipe") if n.startswith("lab/")}
        assert lab | {"quickstart"} == set(ran) and all(ran.values()), ran
        for section in ("resume", "lora", "sampling", "update", "acceptance"):
            assert all(x.get("ok", True) for x in lines if x["section"] == section), lines
            assert any(x["section"] == section for x in lines), section

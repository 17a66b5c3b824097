"""Every tensor built next to model outputs says where it lives.

CI has no GPU, so a tensor built on the CPU and combined with one on CUDA (an index, a mask, a
count) only fails on a GPU. This test reads the source of the packages whose tensors meet model
outputs and flags each torch constructor called without ``device=``, unless its line carries a
``# host`` marker (a host-side record: ``StepRows``' columns, row indices, gathered counts).
``Rollouts`` keeps every field on one device (``Rollouts.device``), which is the rule the
markers are checked against by reading, and the GPU check (``make gpu-check``) by running.
"""

from __future__ import annotations

import ast
from pathlib import Path

import explorl

PACKAGE = Path(explorl.__file__).resolve().parent
CHECKED = ("rollout", "training", "algorithms", "control")
CONSTRUCTORS = frozenset({
    "tensor", "as_tensor", "arange", "zeros", "ones", "full", "empty", "rand", "randn",
    "randint", "randperm", "linspace", "eye",
})


def unplaced_constructors(source: str) -> list[int]:
    """Lines of ``torch.<constructor>(...)`` calls with no ``device=`` and no ``# host`` marker
    on any line the call spans."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in CONSTRUCTORS and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"):
            continue
        if any(k.arg == "device" for k in node.keywords):
            continue
        span = lines[node.lineno - 1: node.end_lineno]
        if not any("# host" in line for line in span):
            found.append(node.lineno)
    return sorted(found)


OLD_SUBSET = '''
def _subset(engine, model, prompt_ids, counts, stage, temperature, max_new_tokens, seeds):
    idx = [i for i, n in enumerate(counts) if n > 0]
    out = engine.generate(model, [prompt_ids[i] for i in idx], [counts[i] for i in idx],
                          temperature, max_new_tokens, seeds=[seeds[i] for i in idx])
    to_batch = torch.as_tensor(idx, dtype=torch.long)
    return dataclasses.replace(out, prompt_index=to_batch[out.prompt_index],
                               stage=torch.full((len(out),), stage, dtype=torch.long))
'''


def test_the_scan_flags_the_eepo_subset_that_crashed_on_cuda():
    # the version of two_stage._subset that crashed at step 1 on CUDA: both constructors
    assert unplaced_constructors(OLD_SUBSET) == [6, 8]
    fixed = OLD_SUBSET.replace("dtype=torch.long)", "dtype=torch.long, device=out.device)")
    assert unplaced_constructors(fixed) == []
    marked = OLD_SUBSET.replace("dtype=torch.long)\n", "dtype=torch.long)  # host\n")
    assert unplaced_constructors(marked) == [8]  # the marker covers its own line only


def test_a_marker_anywhere_in_a_multiline_call_counts():
    src = "x = torch.zeros(\n    3,  # host: a gathered count\n)\ny = torch.ones(2)\n"
    assert unplaced_constructors(src) == [4]


def test_the_current_subset_is_placed():
    source = (PACKAGE / "rollout" / "two_stage.py").read_text()
    tree = ast.parse(source)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_subset")
    assert unplaced_constructors(ast.get_source_segment(source, fn)) == []


def test_every_constructor_near_model_outputs_says_its_device():
    offenders = []
    for pkg in CHECKED:
        for path in sorted((PACKAGE / pkg).rglob("*.py")):
            for line in unplaced_constructors(path.read_text()):
                offenders.append(f"{path.relative_to(PACKAGE)}:{line}")
    assert not offenders, (
        "torch constructors without device= (give one, or mark a host-side tensor with "
        "'# host' on its line): " + ", ".join(offenders))

#!/usr/bin/env bash
# The installed path, as a new user gets it: build the wheel, install it in a fresh virtual
# environment outside the repository (the pinned CPU torch first), and from an empty directory
# list the recipes, train the built-in quickstart for 2 steps, evaluate the run, and train through
# the Python API. Nothing may come from the source tree: PYTHONPATH is cleared, the working
# directory is empty, and the package must import from the venv.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-python3}"
TORCH_PIN="${TORCH_PIN:-torch==2.13.0}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
unset PYTHONPATH

echo "== wheel"
"$PY" -m pip wheel -q --no-deps -w "$tmp/dist" "$repo"
rm -rf "$repo/build"  # setuptools' staging folder; the egg-info it leaves is gitignored
wheel="$(ls "$tmp"/dist/explorl-*.whl)"
echo "$wheel"

echo "== fresh venv"
"$PY" -m venv "$tmp/venv"
bin="$tmp/venv/bin"
"$bin/pip" install -q --upgrade pip
"$bin/pip" install -q "$TORCH_PIN"
"$bin/pip" install -q "$TORCH_PIN" "$wheel"

mkdir "$tmp/work"
cd "$tmp/work"
"$bin/python" - "$repo" <<'PY'
import sys, explorl
where = explorl.__file__
assert not where.startswith(sys.argv[1]), f"explorl imported from the source tree: {where}"
print("explorl", explorl.__version__, "from", where)
PY

echo "== explorl recipes"
"$bin/explorl" recipes
"$bin/explorl" recipes --studies

echo "== explorl train quickstart (2 steps)"
"$bin/explorl" train quickstart --max-steps 2 --out run --set log.progress=false
test -f run/metrics.jsonl && test -f run/summary.json

echo "== explorl eval"
"$bin/explorl" eval run --data lab:addition --n 4 --k 1 2 4 --max-problems 8 --out run/eval
test -f run/eval/eval.json

echo "== python -m explorl / explorl.train"
"$bin/python" -m explorl --version
"$bin/python" -c "
import explorl
s = explorl.train('quickstart', out='api', overrides={'max_steps': 2, 'log.progress': False})
assert s['steps'] == 2, s
print('explorl.train: 2 steps, final reward/mean', s['final'].get('reward/mean'))
"
echo "wheel check passed"

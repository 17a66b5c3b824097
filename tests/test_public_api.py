import subprocess
import sys

import explorl

EXPECTED = sorted(
    [
        "ADVANTAGES",
        "CONTROLLERS",
        "ConfigError",
        "Controller",
        "FakeEngine",
        "HFEngine",
        "Knobs",
        "LOSSES",
        "LabTask",
        "ref_of",
        "train",
        "PromptRecord",
        "Rollouts",
        "RunConfig",
        "StepStats",
        "Trainer",
        "VERIFIERS",
        "VLLMEngine",
        "VerifierPool",
        "aggregate",
        "compute_advantages",
        "fit_entropy_law",
        "lab_model_path",
        "load_config",
        "load_prompts",
        "make_report",
        "make_splits",
        "pass_at_k",
        "token_covariance",
        "__version__",
    ]
)


def test_public_api_is_locked():
    assert sorted(explorl.__all__) == EXPECTED
    for name in explorl.__all__:
        assert getattr(explorl, name) is not None


def test_pure_math_does_not_import_transformers():
    code = "import explorl, explorl.algorithms, sys; print('transformers' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"

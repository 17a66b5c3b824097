import dataclasses
from pathlib import Path

import pytest
import yaml

from explorl import config as C
from explorl import validation
from explorl.config import builtin

RECIPES = sorted(
    p
    for p in builtin.folder("recipe").rglob("*.yaml")
    if "accelerate" not in p.parts
)  # the recipes' accelerate/ holds launcher configs, not recipes


def test_defaults_validate():
    cfg = validation.from_dict({})
    assert cfg.algorithm.eps_low == 0.2 and cfg.rollout.n_samples == 8


def test_unknown_key_names_path_and_suggests():
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict({"algorithm": {"eps_hihg": 0.3}})
    msg = str(e.value)
    assert msg.startswith("algorithm.eps_hihg: unknown key")
    assert "did you mean 'algorithm.eps_high'" in msg


def test_unknown_section_suggests():
    with pytest.raises(C.ConfigError, match=r"rollot: unknown key; did you mean 'rollout'"):
        validation.from_dict({"rollot": {"n_samples": 4}})


@pytest.mark.parametrize("data, path, fragment", [
    ({"rollout": {"n_samples": 2.5}}, "rollout.n_samples", "expected an integer"),
    ({"rollout": {"n_samples": True}}, "rollout.n_samples", "expected an integer"),
    ({"optim": {"lr": "fast"}}, "optim.lr", "expected a number"),
    ({"algorithm": {"agg": "token_mean"}}, "algorithm.agg", "did you mean 'token-mean'"),
    ({"control": {"temperature": 3}}, "control.temperature", "expected a mapping"),
    ({"eval": {"k": ["a"]}}, "eval.k[0]", "expected an integer"),
])
def test_wrong_types_name_the_key(data, path, fragment):
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict(data)
    assert str(e.value).startswith(path + ":") and fragment in str(e.value)


@pytest.mark.parametrize("data, path", [
    ({"optim": {"lr": -1.0}}, "optim.lr"),
    ({"rollout": {"temperature": 0.0}}, "rollout.temperature"),
    ({"algorithm": {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}}, "algorithm.clip_cov_ub"),
    ({"eval": {"n_samples": 4, "k": [8]}}, "eval.k"),
    ({"control": {"temperature": {"t_min": 3.0}}}, "control.temperature.t_min"),
    ({"control": {"budget": {"enabled": True, "n_min_limit": 10}}}, "control.budget.n_min_limit"),
    ({"control": {"eepo": {"enabled": True}}, "rollout": {"n_samples": 1}}, "control.eepo.enabled"),
])
def test_impossible_values_name_the_key(data, path):
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict(data)
    assert str(e.value).startswith(path + ":")


def test_unknown_loss_and_advantage_names_are_rejected_with_choices():
    with pytest.raises(
        C.ConfigError, match=r"algorithm.loss: 'clipcov' is not a known loss.*clip_cov"
    ):
        validation.from_dict({"algorithm": {"loss": "clipcov"}})
    with pytest.raises(C.ConfigError, match=r"algorithm.advantage:.*grpo"):
        validation.from_dict({"algorithm": {"advantage": "gpro"}})


def test_overrides_parse_yaml_values(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 5\nalgorithm:\n  eps_high: 0.28\n")
    cfg = validation.load(
        recipe, ["algorithm.eps_high=0.3", "eval.k=[1, 2]", "data.train=lab:countdown"], seed=3
    )
    assert (
        cfg.algorithm.eps_high == 0.3
        and cfg.eval.k == [1, 2]
        and cfg.data.train == ["lab:countdown"]
    )
    assert cfg.seed == 3 and cfg.max_steps == 5 and cfg.name == "r"


def test_override_errors():
    with pytest.raises(C.ConfigError, match="key=value"):
        C.parse_override("algorithm.eps_high")
    with pytest.raises(C.ConfigError, match=r"^algorithm.eps_high: expected a number"):
        validation.load(None, ["algorithm.eps_high.x=1"])


def test_base_recipes_merge(tmp_path):
    (tmp_path / "a.yaml").write_text("max_steps: 7\nalgorithm: {eps_high: 0.28, loss: ppo}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nalgorithm: {loss: kl_cov}\n")
    cfg = validation.load(tmp_path / "b.yaml")
    assert (cfg.max_steps, cfg.algorithm.eps_high, cfg.algorithm.loss) == (7, 0.28, "kl_cov")


def test_save_round_trip(tmp_path):
    cfg = validation.from_dict({"algorithm": {"clip_c": 3.0}, "eval": {"k": [1, 4]}})
    C.save(cfg, tmp_path / "c.yaml")
    again = validation.from_dict(yaml.safe_load((tmp_path / "c.yaml").read_text()))
    assert again == cfg


def test_every_field_is_documented():
    rows = C.reference()
    missing = [path for path, _, _, doc in rows if not doc]
    assert not missing, f"fields without a docstring: {missing}"
    sections = [f.name for f in dataclasses.fields(C.RunConfig)]
    assert all(C.field_docs(C.RunConfig).get(s) for s in sections)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_recipe_validates(recipe, request):
    from explorl import model_store

    if "math" in recipe.parts:  # templates: model and data paths are placeholders (/path/to/...)
        with pytest.raises(C.ConfigError, match=r"^model.path: '/path/to/"):
            validation.load(recipe)
        validation.load(recipe, env=False)
    elif model_store.is_name(str(validation.load(recipe, env=False).model.path)):
        # a model known by name: on a fresh machine (the tests' empty cache) one line says how
        # to fetch it; fetched (a tiny stand-in under its name), the recipe validates
        with pytest.raises(C.ConfigError, match=r"is not fetched yet .*explorl models get"):
            validation.load(recipe)
        request.getfixturevalue("named_model_stand_in")
        validation.load(recipe)
    else:
        validation.load(recipe)


def test_recipe_reference_doc_is_current():
    from explorl.docs import recipe_reference

    doc = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
    assert doc.read_text() == recipe_reference(), (
        "regenerate: python -m explorl.docs > docs/recipes.md"
    )


def test_every_numeric_field_has_a_range_and_every_range_a_field():
    """The config's table and the losses' and estimators' specs' (``METHOD_RANGES``) together
    cover every numeric key, once."""
    import re

    from explorl.algorithms.contract import METHOD_RANGES
    from explorl.validation.checks import ALL_RANGES

    number = re.compile(r"^(list\[)?(int|float)\]?( or None)?$")  # int, float or None, list[int]
    numeric = {path for path, tp, _, _ in C.reference() if number.match(tp)}
    assert not set(C.RANGES) & set(METHOD_RANGES)
    assert set(ALL_RANGES) == numeric
    for text in ALL_RANGES.values():  # each parses, and its bounds are in order
        iv = C.Interval.parse(text)
        assert iv.lo < iv.hi
    assert C.Interval.parse("(0, 1]").describe() == "in (0, 1]"
    assert C.Interval.parse("[0, inf)").describe() == "≥ 0"
    assert C.Interval.parse("(-inf, inf)").describe() == "a finite number"


def test_adaptive_knobs_map_to_config_fields():
    from explorl.control import ACTUATOR_DEFAULTS
    from explorl.validation.checks import ALL_RANGES

    assert set(C.ADAPTIVE_KNOB_FIELDS) == set(ACTUATOR_DEFAULTS)
    for knob, path in C.ADAPTIVE_KNOB_FIELDS.items():  # the defaults lie in the knob's range
        spec = ACTUATOR_DEFAULTS[knob]
        iv = C.Interval.parse(ALL_RANGES[path])
        assert all(v in iv for v in (spec.c0, spec.c_min, spec.c_max))


def test_env_checks_can_be_skipped_for_templates(tmp_path):
    data = {"model": {"path": str(tmp_path / "nope")}, "data": {"train": ["nope.parquet"]},
            "reward": {"verifier": "nosuchmodule:fn"}}
    with pytest.raises(C.ConfigError, match="model.path"):
        validation.from_dict(data)
    cfg = validation.from_dict(data, env=False)
    assert cfg.reward.verifier == "nosuchmodule:fn"
    with pytest.raises(C.ConfigError, match="reward.verifier: unknown verifier 'mathh'"):
        # built-in names are checked always
        validation.from_dict({**data, "reward": {"verifier": "mathh"}}, env=False)


def test_optim_fused_first_spelling_still_loads():
    # runs written while optim.fused was auto/on/off still resume and evaluate
    assert validation.from_dict({"optim": {"fused": "on"}}).optim.fused is True
    assert validation.from_dict({"optim": {"fused": "auto"}}).optim.fused is None
    assert validation.from_dict({"optim": {"fused": False}}).optim.fused is False

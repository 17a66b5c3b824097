"""One spec per loss and per advantage estimator (``algorithms.spec``): every table is derived from
the registrations, every spec points at a documentation section that exists, and every interval
a spec declares is a field's, holds its default and is enforced at load, naming the key path."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path

import pytest

from explorl import config as C
from explorl import validation
from explorl.algorithms import ADVANTAGES, AGG_MODES, LOSSES, LossParams
from explorl.algorithms.advantages import (
    ADVANTAGE_SPECS,
    READS_CORRECTNESS,
    TAKES_K,
    TAKES_LENGTHS,
)
from explorl.algorithms.contract import METHOD_RANGES
from explorl.algorithms.losses import (
    FOLDS_CORRECTION,
    LOSS_SPECS,
    READS,
    REQUIRED_AGG,
    SELECTORS,
    entropy_agg,
    loss_agg,
)
from explorl.algorithms.spec import AdvantageSpec, LossSpec, owned_ranges
from explorl.errors import ConfigError

DOCS = Path(__file__).resolve().parents[1] / "docs"
SPECS = [*LOSS_SPECS.values(), *ADVANTAGE_SPECS.values()]


def _slug(heading: str) -> str:
    """The anchor of a Markdown heading (Python-Markdown's ``toc``, which the site uses)."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no comments in code blocks
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_slug_rule_on_known_links():
    assert _slug("6k. SAPO (soft gate)") == "6k-sapo-soft-gate"
    assert _slug("Formulas (§0)") == "formulas-0"
    # an anchor the docs already link to by hand
    assert "sapo-luspo-and-vespo-with-the-rollout-correction-and-asynchronous-rollouts" in (
        _anchors(DOCS / "methods" / "wider-field.md"))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{type(s).__name__}:{s.name}")
def test_every_spec_points_at_a_section_that_exists(spec):
    page, _, anchor = spec.docs.partition("#")
    assert anchor, f"{spec.name}: docs {spec.docs!r} names no section"
    path = DOCS / page
    assert path.is_file(), f"{spec.name}: {page} is not a docs page"
    assert anchor in _anchors(path), f"{spec.name}: no section #{anchor} in {page}"
    assert re.search(rf"\b{spec.name}\b", path.read_text()), f"{page} never names {spec.name}"


def test_the_tables_are_derived_from_the_registrations():
    assert list(LOSSES) == list(LOSS_SPECS) and list(ADVANTAGES) == list(ADVANTAGE_SPECS)
    assert all(LOSSES[n] is s.fn and READS[n] == s.reads for n, s in LOSS_SPECS.items())
    assert REQUIRED_AGG == {"gspo": "seq-mean-token-mean", "luspo": "seq-mean-token-sum"}
    assert FOLDS_CORRECTION == {"vespo": ("token-truncate", "token-mask")}
    assert set(SELECTORS) == {"clip_cov", "kl_cov"}
    assert TAKES_K == {"passk_training", "pkpo", "pkpo_loo", "pkpo_loo_minus_one"}
    assert READS_CORRECTNESS == TAKES_K | {"grpo_passk"}
    assert TAKES_LENGTHS == {"reinforce_plus_plus", "reinforce_plus_plus_baseline"}
    assert all(s.name == n for n, s in [*LOSS_SPECS.items(), *ADVANTAGE_SPECS.items()])


def test_each_loss_names_its_own_aggregation_and_the_entropy_bonus_follows_it():
    assert {n: loss_agg(n, None) for n in LOSS_SPECS} == {
        "ppo": "token-mean", "clip_cov": "token-mean", "kl_cov": "token-mean",
        "gspo": "seq-mean-token-mean", "cispo": "token-mean", "sapo": "seq-mean-token-mean",
        "luspo": "seq-mean-token-sum", "vespo": "token-mean", "aepo": "token-mean"}
    assert loss_agg("sapo", "token-mean") == "token-mean"  # a recipe's own choice wins
    assert entropy_agg("luspo", "seq-mean-token-sum") == "token-mean"
    assert entropy_agg("sapo", "seq-mean-token-mean") == "seq-mean-token-mean"
    for spec in LOSS_SPECS.values():
        assert spec.agg in spec.aggs and set(spec.aggs) <= set(AGG_MODES)


def test_what_a_loss_reads_is_a_field_of_the_update_and_what_it_owns_it_reads():
    fields = {f.name for f in dataclasses.fields(LossParams)}
    for spec in LOSS_SPECS.values():
        assert spec.reads <= fields, spec.name
        assert set(spec.ranges) <= spec.reads, spec.name
        assert set(spec.why_not) <= {"eps_high", "entropy_coef", "kl_coef", "temperature",
                                     "pos_neg_weight"}
        assert not set(spec.why_not) & spec.reads, spec.name


def _outside(text: str) -> list[float]:
    """Values just outside an interval, one per finite bound."""
    iv = C.Interval.parse(text)
    out = []
    if math.isfinite(iv.lo):
        out.append(iv.lo if not iv.lo_closed else iv.lo - 1)
    if math.isfinite(iv.hi):
        out.append(iv.hi if not iv.hi_closed else iv.hi + 1)
    return out


@pytest.mark.parametrize("path", sorted(METHOD_RANGES))
def test_a_spec_interval_is_a_numeric_field_holds_its_default_and_is_enforced(path, tiny_model):
    from conftest import tiny_config

    section, _, name = path.partition(".")
    assert section == "algorithm"
    fields = {f.name: f for f in dataclasses.fields(C.AlgorithmConfig)}
    assert name in fields, f"{path} is not a field of the algorithm section"
    iv = C.Interval.parse(METHOD_RANGES[path])
    default = getattr(C.AlgorithmConfig(), name)
    assert default is None or default in iv, f"{path}: default {default} outside {iv}"
    integer = "int" in str(typing.get_type_hints(C.AlgorithmConfig)[name])
    bad = [int(v) for v in _outside(METHOD_RANGES[path])] if integer else (
        _outside(METHOD_RANGES[path]) + [math.inf])
    assert bad, f"{path}: nothing to test outside {iv}"
    for value in bad:
        with pytest.raises(ConfigError, match=rf"^{re.escape(path)}: must be "):
            tiny_config(tiny_model, {"algorithm": {name: value}})


def test_two_specs_that_disagree_on_an_interval_are_refused():
    def f(*a, **k):
        return None

    a = AdvantageSpec("a", f, "x.md#y", ranges={"adv_eps": "(0, 1]"})
    b = AdvantageSpec("b", f, "x.md#y", ranges={"adv_eps": "[0, 1]"})
    assert owned_ranges([a, a]) == {"algorithm.adv_eps": "(0, 1]"}
    with pytest.raises(ValueError, match=r"algorithm.adv_eps: 'a' declares \(0, 1\], 'b' \[0, 1\]"):
        owned_ranges([a, b])


def test_a_loss_spec_that_contradicts_itself_is_refused_when_it_is_declared():
    def f(*a, **k):
        return None

    base = dict(name="x", fn=f, docs="x.md#y", reads=frozenset({"eps_low"}))
    LossSpec(**base)
    with pytest.raises(ValueError, match="aggregations"):
        LossSpec(**base, agg="token-mean", aggs=("seq-mean-token-sum",), agg_why="because")
    with pytest.raises(ValueError, match="say why"):
        LossSpec(**base, agg="seq-mean-token-sum", aggs=("seq-mean-token-sum",))
    with pytest.raises(ValueError, match="correction"):
        LossSpec(**base, correction="per-response")
    with pytest.raises(ValueError, match="owned fields not read"):
        LossSpec(**base, ranges={"eps_high": "[0, 1]"})
    with pytest.raises(ValueError, match="only for a fold"):
        LossSpec(**base, correction_modes=("token-mask",))


def test_a_registered_loss_is_checked_at_load_through_its_spec(tiny_model):
    """Names, aggregation and correction modes are checked against the specs, with the key."""
    from conftest import tiny_config

    with pytest.raises(ConfigError, match=r"^algorithm.loss: 'sappo' is not a known loss; "
                                          r"did you mean 'sapo'\?"):
        tiny_config(tiny_model, {"algorithm": {"loss": "sappo"}})
    with pytest.raises(ConfigError, match=r"^algorithm.agg: loss 'gspo' needs agg "
                                          r"'seq-mean-token-mean', got 'token-mean' \(only then"):
        tiny_config(tiny_model, {"algorithm": {"loss": "gspo", "agg": "token-mean"}})
    with pytest.raises(ConfigError, match=r"^algorithm.rollout_correction.mode: loss 'vespo'"):
        tiny_config(tiny_model, {"rollout": {"engine": "vllm"}, "algorithm": {
            "loss": "vespo", "rollout_correction": {"mode": "sequence-truncate"}}})
    with pytest.raises(ConfigError, match=r"^algorithm.passk_k: advantage 'pkpo'"):
        tiny_config(tiny_model, {"algorithm": {"advantage": "pkpo"}})
    assert validation.from_dict(C.to_dict(tiny_config(tiny_model))).algorithm.agg is None

"""The controller registry: one ``ControllerSpec`` per ``control.<name>`` section, and each spec
telling the truth about its controller (knobs, metrics, checks, ranges)."""

import dataclasses
import re
from pathlib import Path

import pytest
from control_helpers import make_bank, make_ctx, make_knobs, make_stats

from explorl import config as C
from explorl import validation
from explorl.config.ranges import section_ranges
from explorl.control import CONTROLLER_SPECS, CONTROLLERS, ControllerSpec
from explorl.control.adaptive import ACTUATOR_DEFAULTS
from explorl.control.registry import ENTROPY_TRACKERS

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def test_every_control_section_has_a_registry_entry_and_back():
    sections = [f.name for f in dataclasses.fields(C.ControlConfig)]
    assert sorted(sections) == sorted(CONTROLLER_SPECS), "a section without a controller (or back)"
    for name, spec in CONTROLLER_SPECS.items():
        assert isinstance(spec, ControllerSpec)
        assert spec.name == name == spec.cls.name  # the section key is the checkpoint key
        assert CONTROLLERS[name] is spec.cls
        assert hasattr(spec.section(C.ControlConfig()), "enabled")


def _controller_rows() -> dict[str, set[str]]:
    """Key -> the controllers its row in docs/metrics.md's controller table names."""
    text = DOCS.read_text().split("## Controllers (when enabled)")[1].split("\n## ")[0]
    rows: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 3:
            continue
        for key in re.findall(r"`([^`]+)`", cells[0]):
            rows[key] = {n.strip() for n in cells[1].split(",")}
    return rows


@pytest.mark.parametrize("name", list(CONTROLLER_SPECS))
def test_every_metric_of_a_spec_is_documented_under_its_controller(name):
    rows = _controller_rows()
    spec = CONTROLLER_SPECS[name]
    assert spec.metrics, f"{name} declares no metric"
    for key, meaning in spec.metrics.items():
        assert key in rows, f"{key} ({name}) is not in docs/metrics.md's controller table"
        assert name in rows[key], f"docs/metrics.md's row of {key} does not name {name}"
        assert meaning.strip() and "\n" not in meaning


# A configuration of each controller under which its hooks log every key it declares.
SECTIONS = {
    "curriculum": {"start_ratio": 0.5},
    "temperature": {"t_min": 0.9, "t_max": 1.1},  # entropy 0.5 vs H0 swings: clamps at some step
    "budget": {"n_min_limit": 4, "n_max_limit": 12},
    "adaptive": {"schedule": {"kind": "wsd", "release": True, "anneal_ratio": 0.3}},
    "entropic": {},
    "entropy_coef": {},
    "eepo": {},
}


def _drive(name: str, steps: int = 10) -> set[str]:
    """Every metric key the controller configured by ``SECTIONS[name]`` logs over ``steps``."""
    section = C.build(type(CONTROLLER_SPECS[name].section(C.ControlConfig())),
                      {"enabled": True, **SECTIONS[name]})
    controller = CONTROLLER_SPECS[name].make(section, anneal_dataset=False)
    bank = make_bank(controller, make_ctx(max_steps=steps), make_knobs())
    seen: set[str] = set()
    for t in range(1, steps + 1):
        seen |= set(bank.before_batch(t)) | set(bank.before_step(t, [0, 1]))
        stats = make_stats(t, max_steps=steps, entropy=0.3 + 0.4 * (t % 3),
                           prompt_samples=bank.knobs.budgets_for(2), epoch_end=t % 2 == 0)
        seen |= set(bank.before_update(stats)) | set(bank.after_step(stats))
    return seen


def test_the_drive_covers_every_controller():
    assert set(SECTIONS) == set(CONTROLLER_SPECS)


@pytest.mark.parametrize("name", list(CONTROLLER_SPECS))
def test_a_spec_declares_exactly_the_metrics_its_controller_logs(name):
    assert _drive(name) == set(CONTROLLER_SPECS[name].metrics)


@pytest.mark.parametrize("name", list(CONTROLLER_SPECS))
def test_a_spec_declares_the_knobs_its_controller_claims(name):
    spec = CONTROLLER_SPECS[name]
    variants = ([{"actuator": a} for a in ACTUATOR_DEFAULTS] if name == "adaptive" else [{}])
    for extra in variants:
        section = C.build(type(spec.section(C.ControlConfig())),
                          {"enabled": True, **SECTIONS[name], **extra})
        assert spec.writes(section) == spec.make(section).actuators


def test_the_entropy_trackers_are_the_specs_that_steer_entropy():
    assert ENTROPY_TRACKERS == ("temperature", "adaptive", "entropic", "entropy_coef")


def test_a_section_declares_the_ranges_of_its_own_fields():
    assert section_ranges(C.CurriculumControlConfig, "control.curriculum.") == {
        "control.curriculum.start_ratio": "(0, 1)",
        "control.curriculum.n_samples": "[1, 4096]",
        "control.curriculum.max_response_len": "[1, 1048576]",
    }
    # nested sections come in field order: the schedule's before the adaptive section's own
    adaptive = list(section_ranges(C.AdaptiveControlConfig, "a."))
    assert adaptive[:5] == ["a.schedule.target", "a.schedule.start", "a.schedule.end",
                            "a.schedule.anneal_ratio", "a.warmup"]

    @dataclasses.dataclass
    class Typo:
        enabled: bool = False
        window: int = 3
        RANGES = {"windw": "[1, 10]"}

    with pytest.raises(TypeError, match=r"Typo.RANGES names no field: \['windw'\]"):
        section_ranges(Typo, "control.typo.")


@pytest.mark.parametrize(("sections", "path"), [
    ({"temperature": {"t_min": 2.0, "t_max": 1.0}}, "control.temperature.t_min"),
    ({"budget": {"enabled": True, "n_min_limit": 16}}, "control.budget.n_min_limit"),
    ({"eepo": {"eps_l": 0.5, "eps_r": 0.6}}, "control.eepo.eps_r"),
    ({"entropy_coef": {"init": 1.0, "max": 0.5}}, "control.entropy_coef.init"),
    ({"adaptive": {"actuator": "eps_hgh"}}, "control.adaptive.actuator"),
    ({"adaptive": {"enabled": True, "init": 0.5}}, "control.adaptive.init"),
])
def test_validate_runs_each_specs_check(sections, path):
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict({"control": sections}, env=False)
    assert str(e.value).startswith(f"{path}: ")

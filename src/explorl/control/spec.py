"""What explorl needs to know about a controller, declared beside its class.

Each controller module ends with a ``SPEC = ControllerSpec(...)``, and one line in
``control.registry.CONTROLLER_SPECS`` registers it. Everything generic reads the spec:
``build_controllers`` (which controllers to build, in which order), ``validation.validate``
(the spec's ``check``), the knob contract (``control.contract``: the knobs it moves and their
range), the combination rules (``steers_entropy``) and the metric docs test (``metrics``).

The section dataclass stays in ``explorl.config.control_sections`` (a field of
``ControlConfig``, its intervals in the section's ``RANGES``): the configuration is plain data
at the bottom of the dependency graph and cannot import the controllers.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from explorl.config import RunConfig
from explorl.control.base import Controller
from explorl.errors import ConfigError


def fail(path: str, msg: str) -> NoReturn:
    """Raise the ``ConfigError`` of a recipe key: ``"<path>: <msg>"``."""
    raise ConfigError(f"{path}: {msg}")


def require(path: str, ok: bool, msg: str) -> None:
    """``fail(path, msg)`` unless ``ok``."""
    if not ok:
        fail(path, msg)


def check_choice(path: str, value: str, table: Mapping[str, Any], kind: str) -> None:
    """``fail`` unless ``value`` names an entry of ``table``, suggesting the closest one."""
    if value not in table:
        close = difflib.get_close_matches(value, list(table), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        fail(path, f"{value!r} is not a known {kind}{hint} (choices: {', '.join(table)})")


@dataclass(frozen=True)
class ControllerSpec:
    """One controller: its ``control.<name>`` section, its class, checks, knobs and metrics."""

    name: str
    """The section key under ``control`` and the controller's checkpoint key (``cls.name``)."""
    cls: type[Controller]
    """The controller class."""
    metrics: Mapping[str, str]
    """Every key its hooks log -> a one-line meaning (docs/metrics.md holds the full one)."""
    check: Callable[[RunConfig], None] | None = None
    """Checks of its section against the rest of the recipe, run by ``validation.validate`` on
    every recipe (enabled or not; a check of the running controller tests ``enabled``). Raises
    ``ConfigError`` naming the key path (``fail``/``require``)."""
    build: Callable[..., Controller] | None = None
    """``(section, *, anneal_dataset) -> Controller``; None = ``cls(section)``."""
    knobs: Callable[[Any], tuple[str, ...]] | None = None
    """``section -> the actuators it writes``; None = ``cls.actuators`` (fixed by the class)."""
    knob_key: str = "enabled"
    """The key of its section a knob-contract error names (the adaptive one's: ``actuator``)."""
    knob_range: Callable[[Any], tuple[float, float, float] | None] | None = None
    """``section -> (start, min, max)`` of a loss-side knob it owns from the first step, so the
    knob contract can refuse a range that would replace the recipe's value; None = no range."""
    steers_entropy: bool = False
    """True when it steers entropy towards its own target: two such controllers would fight,
    so a recipe may enable only one (``control.registry.EXCLUSIVE``)."""

    def section(self, control: Any) -> Any:
        """Its section of a ``ControlConfig``."""
        return getattr(control, self.name)

    def writes(self, section: Any) -> tuple[str, ...]:
        """The actuators the controller configured by ``section`` writes."""
        return self.knobs(section) if self.knobs is not None else self.cls.actuators

    def make(self, section: Any, **ctx: Any) -> Controller:
        """The controller configured by ``section`` (``ctx``: ``anneal_dataset``)."""
        return self.build(section, **ctx) if self.build is not None else self.cls(section)

"""Building and checking a config before any work starts: ``load`` (a recipe file),
``from_dict`` (plain data) and ``validate`` (a ``RunConfig``).

This layer sits above the features: it checks names against their registries (losses,
advantage estimators, controllers and their actuators, trackers, file types, lab tasks,
verifiers, reward functions), which it imports at module level, while ``explorl.config`` below
it stays plain data. Every error is a ``ConfigError`` naming the key path.
"""

from explorl.validation.checks import from_dict, load, validate

__all__ = ["from_dict", "load", "validate"]

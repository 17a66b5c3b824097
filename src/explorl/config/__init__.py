"""The typed configuration tree: the only home of every default.

Each field carries its documentation as an attribute docstring (CleanRL's ``Args`` style);
``field_docs`` reads them back for ``--help`` and the recipe reference. Recipes are YAML files
that override fields; ``--set a.b=c`` overrides one field. Everything is validated before any
work starts: unknown keys (with the closest valid key suggested), wrong types and impossible
values raise ``ConfigError`` naming the key path.

Modules: ``sections`` and ``control_sections`` (the dataclasses), ``coerce`` (typed building
from plain data), ``ranges`` (every number's interval), ``checks`` (``validate``), ``recipes``
(YAML files, ``base:``, ``--set``), ``reference`` (the docs).
"""

from explorl.config.checks import from_dict, validate
from explorl.config.coerce import build, set_path, to_dict
from explorl.config.control_sections import (
    AdaptiveControlConfig,
    BudgetControlConfig,
    ControlConfig,
    CurriculumControlConfig,
    EEPOControlConfig,
    EntroPICControlConfig,
    EntropyCoefControlConfig,
    ScheduleConfig,
    TemperatureControlConfig,
)
from explorl.config.ranges import ADAPTIVE_KNOB_FIELDS, RANGES, Interval
from explorl.config.recipes import (
    _deep_update,
    load,
    load_yaml,
    parse_override,
    read_utf8,
    save,
)
from explorl.config.reference import field_docs, reference
from explorl.config.sections import (
    SPLIT_SIZES,
    AlgorithmConfig,
    DataConfig,
    DistConfig,
    EvalConfig,
    LabConfig,
    LogConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RewardFunctionConfig,
    RolloutConfig,
    RunConfig,
    VLLMConfig,
)
from explorl.config.watch_sections import WatchConfig
from explorl.errors import ConfigError

__all__ = [
    "ADAPTIVE_KNOB_FIELDS", "RANGES", "SPLIT_SIZES", "AdaptiveControlConfig", "AlgorithmConfig",
    "BudgetControlConfig", "ConfigError", "ControlConfig", "CurriculumControlConfig", "DataConfig",
    "DistConfig", "EEPOControlConfig", "EntroPICControlConfig", "EntropyCoefControlConfig",
    "EvalConfig", "Interval", "LabConfig", "LogConfig", "ModelConfig", "OptimConfig",
    "RewardConfig", "RewardFunctionConfig", "RolloutConfig", "RunConfig", "ScheduleConfig",
    "TemperatureControlConfig", "VLLMConfig", "WatchConfig", "_deep_update", "build", "field_docs",
    "from_dict", "load", "load_yaml", "parse_override", "read_utf8", "reference", "save",
    "set_path", "to_dict", "validate",
]

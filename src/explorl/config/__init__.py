"""The typed configuration tree: the only home of every default.

Each field carries its documentation as an attribute docstring (CleanRL's ``Args`` style);
``field_docs`` reads them back for ``--help`` and the recipe reference. Recipes are YAML files
that override fields; ``--set a.b=c`` overrides one field.

This package is plain data at the bottom of the dependency graph: it imports no feature.
Building and checking a config against the features' registries (loss names, controllers,
verifiers, tasks, files) is ``explorl.validation``'s job (``load``, ``from_dict``, ``validate``).

Modules: ``sections``, ``algorithm_sections``, ``control_sections`` and ``watch_sections`` (the
dataclasses), ``coerce`` (typed building from plain data), ``ranges`` (every number's interval),
``recipes`` (YAML files, ``base:``, ``--set``), ``reference`` (the docs).
"""

from explorl.config.algorithm_sections import AlgorithmConfig, RolloutCorrectionConfig
from explorl.config.coerce import build, key_of, set_path, to_dict
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
    HISTORY_KEY,
    _deep_update,
    load_yaml,
    parse_override,
    read_recipe,
    read_utf8,
    save,
)
from explorl.config.reference import field_docs, reference
from explorl.config.sections import (
    SPLIT_SIZES,
    ARPOConfig,
    AsyncConfig,
    DataConfig,
    DistConfig,
    EvalConfig,
    HFConfig,
    LabConfig,
    LogConfig,
    LoRAConfig,
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
    "ADAPTIVE_KNOB_FIELDS", "ARPOConfig", "HISTORY_KEY", "RANGES", "SPLIT_SIZES",
    "AdaptiveControlConfig",
    "AlgorithmConfig", "AsyncConfig", "BudgetControlConfig", "ConfigError", "ControlConfig",
    "CurriculumControlConfig", "DataConfig",
    "DistConfig", "EEPOControlConfig", "EntroPICControlConfig", "EntropyCoefControlConfig",
    "EvalConfig", "HFConfig", "Interval", "LabConfig", "LogConfig", "LoRAConfig", "ModelConfig",
    "OptimConfig", "RewardConfig", "RewardFunctionConfig", "RolloutConfig",
    "RolloutCorrectionConfig", "RunConfig", "ScheduleConfig", "TemperatureControlConfig",
    "VLLMConfig", "WatchConfig",
    "_deep_update", "build", "field_docs", "load_yaml", "parse_override", "read_recipe",
    "read_utf8", "reference", "save", "set_path", "to_dict", "key_of",
]

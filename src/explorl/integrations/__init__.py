"""explorl's controllers, losses and advantage estimators inside other trainers.

- ``explorl.integrations.trl``: TRL's ``GRPOTrainer`` (docs/integrations-trl.md).
- ``explorl.integrations.verl``: verl's registries and a per-step control object
  (docs/integrations-verl.md).
- ``explorl.integrations.driver``: the framework-neutral part both use (which knobs a framework
  reads, and the controllers run once per step).

Nothing here is imported by ``import explorl``: each submodule imports its framework, which is an
optional dependency.
"""

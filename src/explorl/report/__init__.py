"""A study's report: from its finished runs' numbers to its claims, tables, figures and
documents. ``explorl.study`` trains and evaluates the runs and hands their numbers here; nothing
here trains, evaluates or reads a study's plan.

Modules, in the order a report uses them:

- ``numbers``: per-run numbers (``run_numbers``) and the per-recipe table over seeds;
- ``tdist``, ``stats``: t intervals over seeds and problems and the power (minimum detectable
  effect) of a comparison;
- ``evidence``: what the claims read, per evaluation temperature;
- ``claims``: the library of claims, their rules and every threshold, and the one judge
  (``evaluate_claims``); ``declared``: the claims a spec declares (``claims:``);
- ``frontier``, ``frontier_report``: a ``frontier`` sweep's points against the baseline's
  pass@1–pass@k frontier, its table, claims and figure;
- ``horizon``, ``checkpoints``: entropy and pass@k at a long horizon's checkpoints;
- ``tools_report``: the tool calls of tool-using arms;
- ``figures``, ``tables``, ``documents``: study.md, claims.md, study.json, the published copy.
"""

"""Claims a study declares in its spec (``claims:``), read, checked and turned into ``Claim``\\ s
that ``claims.evaluate_claims`` judges like the library's.

An entry either selects a claim of the library by its id (``check: 8a``: the claims whose logic
is more than one comparison, such as EEPO's open gate or the law's fit), or the claims of a
section of the spec (``check: frontier``: the sweep's F-claims; ``along``: the T-claims of the
frontier along training; ``horizon``: the long horizon's H- and L-claims; ``SECTIONS``), or
declares one::

    - id: "P1-{arm}"              # {arm}: one claim per arm of ``arms``
      claim: "{arm} raises pass@1 over GRPO at the last step"
      paper: "E3 §5 (Table 1)"
      arms: [kl_cov, clip_cov]
      vs: grpo                    # an arm, or base (the model the arm starts from)
      quantity: pass@1            # see QUANTITIES
      side: 1                     # +1 above null, -1 below, 0 within ±null
      null: 0.0

Several conditions go under ``conditions:`` (each with ``arm``, ``vs``, ``quantity``, ``side``,
``null``, ``label``). Every quantity is an interval of ``study.stats``: pass@k and the coverage
margin are crossed t intervals over seeds and problems, paired by seed (clipped to [−1, 1]);
per-run numbers are t intervals over seeds, paired by seed when there is a ``vs``, with their
minimum detectable effect (``with_mde``).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from explorl.report.claims import CLAIMS, Claim, Cond
from explorl.report.evidence import RUN_KEYS, Evidence
from explorl.report.stats import Interval, Power

QUANTITIES = {
    "pass@<k>": "pass@k at k (a k of eval.k, or max: the largest), arm − vs",
    "margin@<k>": "the coverage margin pass@k − pass@1, arm − vs",
    "entropy_ratio": "token entropy over the last 10% of steps ÷ over the first 10% (per run)",
    "run:<key>": "a per-run number (see RUN_KEYS), arm − vs paired by seed, or arm's own",
    "ratio:<key>": "a per-run number of arm ÷ vs's, paired by seed (null 1: equal)",
}
ENTRY_KEYS = ("id", "claim", "paper", "arms", "conditions", "check", "as", "arm", "vs",
              "quantity", "side", "null", "label")
CONDITION_KEYS = ("arm", "vs", "quantity", "side", "null", "label")
SECTIONS = {"frontier": "frontier.arms", "along": "eval.checkpoints",
            "horizon": "eval.checkpoints"}  # section claims → the spec key that makes them
_QUANTITY = re.compile(r"^(pass|margin)@(\d+|max)$|^entropy_ratio$|^(run|ratio):(.+)$")


@dataclass
class Condition:
    """One declared condition: ``quantity`` of ``arm`` (− or ÷ ``vs``'s) on ``side`` of
    ``null``."""

    arm: str
    quantity: str
    side: int
    vs: str | None = None
    null: float = 0.0
    label: str | None = None


@dataclass
class Declared:
    """A declared claim (``conditions``) or a library claim chosen by id (``check``)."""

    id: str
    claim: str = ""
    paper: str = ""
    conditions: list[Condition] = field(default_factory=list)
    check: str | None = None
    renames: dict[str, str] = field(default_factory=dict)
    """A library claim's arms → this study's (``as: {grpo: real-grpo}``)."""


def _closest(word: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(str(word), valid, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _unknown_keys(d: dict, valid: tuple[str, ...], where: str) -> None:
    for key in d:
        if key not in valid:
            raise ValueError(f"{where}.{key}: unknown key{_closest(key, list(valid))} (valid "
                             f"keys here: {', '.join(valid)})")


def _quantity(q: Any, where: str) -> str:
    m = _QUANTITY.match(str(q))
    if not m:
        raise ValueError(f"{where}: unknown quantity {q!r}{_closest(q, list(QUANTITIES))} "
                         f"(valid: {', '.join(QUANTITIES)})")
    if m.group(3) and m.group(4) not in RUN_KEYS:
        raise ValueError(f"{where}: unknown per-run number {m.group(4)!r}"
                         f"{_closest(m.group(4), list(RUN_KEYS))} (valid: {', '.join(RUN_KEYS)})")
    return str(q)


def _condition(d: dict, where: str, arm: str | None) -> Condition:
    _unknown_keys(d, CONDITION_KEYS, where)
    if "quantity" not in d or "side" not in d:
        raise ValueError(f"{where}: give quantity and side")
    arm = d.get("arm", arm)
    if not arm:
        raise ValueError(f"{where}.arm: name the arm (or give the claim arms:)")
    side, null = d["side"], d.get("null", 0.0)
    if side not in (-1, 0, 1):
        raise ValueError(f"{where}.side: must be 1 (above null), -1 (below) or 0 (within ±null), "
                         f"got {side!r}")
    if not isinstance(null, (int, float)) or isinstance(null, bool) or (side == 0 and null <= 0):
        raise ValueError(f"{where}.null: must be a number{', > 0 with side 0' if side == 0 else ''}"
                         f", got {null!r}")
    q = _quantity(d["quantity"], f"{where}.quantity")
    vs = d.get("vs")
    if vs is None and q.startswith(("pass@", "margin@", "ratio:")):
        raise ValueError(f"{where}.vs: {q} compares two arms: name the other (an arm or base)")
    if vs == "base" and not q.startswith(("pass@", "margin@")):
        raise ValueError(f"{where}.vs: base (the model before RL) has no per-run numbers: "
                         f"{q} compares arms only")
    return Condition(str(arm), q, int(side), None if vs is None else str(vs), float(null),
                     d.get("label"))


def _fill(value: Any, arm: str) -> Any:
    if isinstance(value, str):
        return value.replace("{arm}", arm)
    if isinstance(value, dict):
        return {k: _fill(v, arm) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, arm) for v in value]
    return value


def parse_claims(raw: Any) -> list[Declared]:
    """The spec's ``claims:`` list as ``Declared`` claims, each ``arms:`` entry one claim per
    arm; a ``ValueError`` naming the key path (and the closest valid key) on bad input."""
    if not isinstance(raw, list):
        raise ValueError(f"claims: expected a list of claims, got {raw!r}")
    library = [c.id for c in CLAIMS] + list(SECTIONS)
    out: list[Declared] = []
    for i, entry in enumerate(raw):
        where = f"claims[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a mapping (id, claim, ... or check), got "
                             f"{entry!r}")
        _unknown_keys(entry, ENTRY_KEYS, where)
        if "check" in entry:
            if not set(entry) <= {"check", "as"}:
                raise ValueError(f"{where}: a library claim (check) takes only `as`, got "
                                 f"{', '.join(k for k in entry if k not in ('check', 'as'))}")
            if str(entry["check"]) not in library:
                raise ValueError(f"{where}.check: no library claim {entry['check']!r}"
                                 f"{_closest(entry['check'], library)} (library: "
                                 f"{', '.join(library)})")
            renames = entry.get("as", {})
            if not isinstance(renames, dict) or not all(
                    isinstance(a, str) and isinstance(b, str) for a, b in renames.items()):
                raise ValueError(f"{where}.as: expected a mapping of the library claim's arms "
                                 f"to this study's ({{grpo: real-grpo}}), got {renames!r}")
            out.append(Declared(str(entry["check"]), check=str(entry["check"]),
                                renames=dict(renames)))
            continue
        arms = entry.get("arms", [None])
        if not isinstance(arms, list) or not arms:
            raise ValueError(f"{where}.arms: expected a list of arms, got {arms!r}")
        if "id" not in entry or "claim" not in entry:
            raise ValueError(f"{where}: give id and claim (or check: a library claim's id)")
        if "arms" in entry and "arm" in entry:
            raise ValueError(f"{where}: give arm or arms, not both")
        if len(arms) > 1 and "{arm}" not in str(entry["id"]):
            raise ValueError(f"{where}.id: with several arms the id needs '{{arm}}' (one claim "
                             "per arm)")
        for arm in arms:
            e = _fill({k: v for k, v in entry.items() if k != "arms"}, arm or "")
            inline = {k: e[k] for k in CONDITION_KEYS if k in e}
            conds = e.get("conditions")
            if conds is not None and inline:
                raise ValueError(f"{where}: give conditions or {', '.join(inline)}, not both")
            if conds is None:
                conds = [inline]
            if not isinstance(conds, list) or not conds:
                raise ValueError(f"{where}.conditions: expected a list of conditions")
            out.append(Declared(str(e["id"]), str(e["claim"]), str(e.get("paper", "")),
                                [_condition(c if isinstance(c, dict) else {}, where + (
                                    f".conditions[{j}]" if "conditions" in e else ""), arm)
                                 for j, c in enumerate(conds)]))
    ids = [d.id for d in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"claims: ids repeat: {sorted({x for x in ids if ids.count(x) > 1})}")
    return out


def check_claims(claims: list[Declared], arms: list[str], k_list: list[int],
                 sections: set[str]) -> list[tuple[str, bool, str]]:
    """(key, ok, message) of each declared claim against the spec: its arms run in the study,
    its k are evaluated, its library claims' arms run, its sections' claims have their section
    (``sections``: the keys of ``SECTIONS`` the spec sets)."""
    by_id = {c.id: c for c in CLAIMS}
    checks = []
    for d in claims:
        if d.check in SECTIONS:
            checks.append((f"claims.{d.id}.check", d.check in sections,
                           f"the {d.check} claims need {SECTIONS[d.check]} in the spec"))
        elif d.check:
            miss = [d.renames.get(n, n) for n in by_id[d.check].needs
                    if d.renames.get(n, n) not in arms]
            checks += [(f"claims.{d.id}.as.{a}", a in by_id[d.check].needs,
                        f"{d.check} names no arm {a!r} (its arms: "
                        f"{', '.join(by_id[d.check].needs)})") for a in d.renames]
            checks.append((f"claims.{d.id}.check", not miss,
                           f"{d.check} needs arms this study does not run: {', '.join(miss)}"))
        for j, c in enumerate(d.conditions):
            where = f"claims.{d.id}" + (f".conditions[{j}]" if len(d.conditions) > 1 else "")
            for key, name in (("arm", c.arm), ("vs", c.vs)):
                valid = arms + (["base"] if key == "vs" else [])
                if name is not None and name not in valid:
                    checks.append((f"{where}.{key}", False, f"{name!r} is not an arm of this "
                                   f"study{_closest(name, valid)} (arms: {', '.join(valid)})"))
            k = c.quantity.partition("@")[2]
            if k and k != "max":
                checks.append((f"{where}.quantity", int(k) in k_list,
                               f"{c.quantity}: k = {k} is not one of eval.k {k_list}"))
            if c.quantity.startswith("margin@"):
                checks.append((f"{where}.quantity", 1 in k_list and max(k_list) > 1,
                               "the coverage margin needs eval.k to hold 1 and a larger k"))
    return checks


def _k(q: str, ev: Evidence) -> int:
    k = q.partition("@")[2]
    return ev.k_max if k == "max" else int(k)


def measure(ev: Evidence, c: Condition) -> Interval | None:
    """The condition's interval (``QUANTITIES``); None with fewer than 2 seeds (runs the arm
    and ``vs`` both ran, or the arm's runs): one seed gives no spread over seeds, which on a
    real model can dwarf the problems' part."""
    q = c.quantity
    if _seeds(ev, c) < 2:
        return None
    if q.startswith("pass@"):
        return ev.pk(c.arm, c.vs, _k(q, ev))
    if q.startswith("margin@"):
        return ev.margin(c.arm, c.vs, _k(q, ev))
    key = q.partition(":")[2] or q
    if q.startswith("ratio:"):
        return with_mde(ev.ratio(c.arm, c.vs, key))
    get = lambda r: r.get(key)  # noqa: E731
    return with_mde(ev.one(c.arm, get) if c.vs is None else ev.pair(c.arm, c.vs, get))


def _seeds(ev: Evidence, c: Condition) -> int:
    """The seeds a condition's interval is over (a comparison with the base model, a single
    evaluation, counts the arm's)."""
    def seeds(name: str) -> set:
        return {r.get("seed") for r in ev.per_run.get(name, [])}

    mine = seeds(c.arm)
    return len(mine if c.vs is None or c.vs == "base" else mine & seeds(c.vs))


def with_mde(iv: Interval | None) -> Interval | None:
    """A per-run quantity's t interval over S seeds with its minimum detectable effect
    (``Power`` of a seeds-only design: (t_{0.975, S−1} + t_{0.8, S−1}) · SE); as it was with
    one seed (no spread)."""
    if iv is None or not iv.se or iv.df is None or not iv.terms:
        return iv
    n = int(round(iv.df)) + 1
    return dataclasses.replace(iv, power=Power(n, 1, 0.0, iv.se ** 2 * n, 0.0, se_obs=iv.se,
                                               df=iv.df, terms_obs=iv.terms))


def label(c: Condition, ev: Evidence) -> str:
    """The condition's label: its own, or the quantity's (``arm − vs, test pass@k``)."""
    if c.label:
        return c.label
    q = c.quantity
    who = c.arm if c.vs is None else f"{c.arm} {'÷' if q.startswith('ratio:') else '−'} {c.vs}"
    if q.startswith("pass@"):
        return f"{who}, test pass@{_k(q, ev)}"
    if q.startswith("margin@"):
        return f"{who}, test pass@{_k(q, ev)} − pass@1 (coverage margin)"
    if q == "entropy_ratio":
        return f"{who}, H last 10% / H first 10%"
    return f"{who}, {q.partition(':')[2]}"


def as_claim(d: Declared) -> Claim:
    """The ``Claim`` the judge runs: the library's for ``check``, else one whose conditions
    are the declared ones; it needs every arm it names (the baseline first)."""
    if d.check:
        lib = next(c for c in CLAIMS if c.id == d.check)
        if not d.renames:
            return lib
        return Claim(lib.id, lib.claim, lib.paper, tuple(d.renames.get(n, n) for n in lib.needs),
                     lambda ev: lib.check(renamed(ev, d.renames)))
    needs = list(dict.fromkeys(n for c in d.conditions for n in (c.vs, c.arm)
                               if n is not None and n != "base"))

    def check(ev: Evidence) -> list[Cond]:
        return [Cond(label(c, ev), measure(ev, c), c.side, c.null) for c in d.conditions]

    return Claim(d.id, d.claim, d.paper, tuple(needs), check)


def renamed(ev: Evidence, renames: dict[str, str]) -> Evidence:
    """``ev`` as a library claim reads it: each of its arm names (``grpo``) holding the
    study's arm of ``renames`` (``real-grpo``)."""
    def alias(d: dict) -> dict:
        return {**d, **{lib: d[own] for lib, own in renames.items() if own in d}}

    return dataclasses.replace(ev, per_run=alias(ev.per_run), passk=alias(ev.passk),
                               seeds=alias(ev.seeds), base_for=alias(ev.base_for),
                               passk_t={t: alias(p) for t, p in ev.passk_t.items()})

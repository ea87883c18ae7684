"""Audits: every attack that applies to a protocol against every applicable defense.

:func:`run_audit` answers "what leaks, how much, and what does each defense cost" for one
protocol:

- **attacks**: every registered attack whose ``protocols`` names the protocol (or that names
  none); whether it *applies* is decided by the attack itself from what it declares it needs
  (:meth:`Attack.applicable` on the undefended server view: its ``requires`` message kinds in
  plaintext), never by a hand-written table;
- **defenses**: every registered defense whose ``applies_to`` is None or names the protocol
  and that has a ``strength`` with a ``default_grid``; each is run at every grid value (a
  defense without a grid, e.g. a consistency check, runs as one cell when named in
  ``defenses``). A named cell may be a stack, ``a[:k=v]+b[:k=v]`` (:class:`DefenseCell`,
  :func:`parse_cell`): its members run together, the last one swept;
- for every (defense, grid value, seed) — plus the undefended run per seed — the protocol runs
  once and *every* attack is evaluated on that transcript (``attack.evaluate``: metrics,
  baselines), with the protocol's utility, the defense's ``privacy_spent`` and timings.

Seeds and randomness follow :mod:`privaudit.experiment`: the protocol runs with the integer
seed (common random numbers across defenses and strengths), each attack draws from
``SeedSequence([seed, defense index, value index, attack index])``. The runs are spread with
joblib (``jobs``), or on a Dask cluster (``scheduler``: an address or ``local:N``) through
joblib's Dask backend; the numbers do not depend on either.

The matrix (attack x defense, :func:`privaudit.results.audit_matrix`) reports the
*advantage* of the attack's ``primary_metric`` over the stronger of its prior-only and
random-guess baselines (in the direction its ``metric_specs`` declares) with no defense and at
each defense's strongest grid value (the last one: grids run from weakest to strongest), a
verdict per cell (a test over every declared metric: :data:`privaudit.results.CELL_VERDICTS`), the utility
cost there, the claimed total epsilon and the empirical epsilon lower bound. ``audit.json``
holds everything; :mod:`privaudit.reports.audit` renders ``audit.html`` from it.

Threat axis (``threat``: ``honest-but-curious``, ``malicious`` or ``both``, default both). An
attack declares its threat model (:attr:`Attack.threat`). The runs above are the honest
server's and evaluate the honest-but-curious attacks only. A ``malicious`` attack also declares
the protocol settings its deviation needs (``plan``: a dict, or a string naming the protocol's
``server`` plan) and its ``deviations``; for each distinct plan the protocol runs again with the plan set,
undefended and at each swept defense's strongest grid value (the cells of the matrix; not the
whole grid, to keep the audit's cost), and only the attacks of that plan are evaluated there.
A malicious run attacks one target, so these cells run at least
:data:`privaudit.results.MIN_VERDICT_VICTIMS` seeds (the honest runs' seeds first), the fewest
victims a verdict is decided from; the seeds' targets of a cell are pooled into one
cluster bootstrap (:func:`_pool_targets`). Nothing malicious runs when no selected attack of the
protocol is malicious. Every run, attack, matrix cell and verdict records its ``threat``;
``threat_verdicts`` holds one sentence per matrix column naming both threat models
(:func:`threat_verdicts`), e.g. "secagg (dropout = 0.3): protected against an
honest-but-curious server (no attack applies under it); leaks to a malicious server
(ncf-model-inconsistency, 1 round of model inconsistency, 0 sybils; Holm over ...)".

Adaptive servers: when a malicious server is audited, a countermeasure stands on the defense it
protects (its ``protects``, e.g. ``model-consistency`` on ``secagg``), and without named
defenses the protected defense and each countermeasure on it are cells of their own. A plan's
runs deviate in every round the protocol allows (its ``deviation_budget``), and each malicious
attack with a ``rounds`` parameter is read at every value of :func:`round_grid` (one matrix row
per value, ``<attack>:rounds=<r>``). A column's malicious verdict decides every test of every
such attack together (Holm, :func:`malicious_family`): "protected" only when all fail and the
family leaks without the defense; otherwise the sentence names the crafts that still win.

Every DP cell (a defense whose ``privacy_spent`` reports an epsilon) of a protocol with a canary
kit also runs once more, at the cell's first seed, on a canary-augmented dataset (:mod:`privaudit.canary`: randomized
canaries, one run, Steinke et al. NeurIPS 2023); its run entry holds ``canary_audit``:
``{"epsilon_lb", "epsilon", "delta", "neighbour", "canaries", "guesses", "correct",
"confidence", "rounds_observed", "seconds"}`` (the one-run lower bound beside the accounted
epsilon) or ``{"error"}``. One run per cell, not one per seed: the largest of several 95 % lower
bounds would hold at less than 95 %.

"protected" means the mechanism protects (:func:`gate_dp_cells`): a DP cell reads "protected"
only when, besides the attack's test, its canaries are not all distinguished, their bound is at
most :data:`WEAK_PRIVACY_EPSILON`, and the attack is shown to have power at that strength: the
cell's transcript holds every round the claim covers (``rounds_recorded`` of the run), or, when
it holds fewer, the cell's planted-signal control (``planted_control`` of its first-seed run,
:func:`privaudit.canary.planted_control`: the cell's config and noise on data with 200 planted
canary users, the attack scored on them) finds the planted leak with a lower bound above the
margin. Without that evidence the cell reads :data:`NO_POWER_LABEL` ("inconclusive (attack
without power at this noise)"); with it but weak canaries "no evidence of leakage"; the reasons
are in ``dp_gate`` and the attack's verdict is recomputed without that row. Every DP cell has
``dp_statement`` (the attack test, its control and the canary test in one sentence) and ``dp_violation``
(the canary bound above the claim it tests, or the attack's decisions' held-out bound above the
claimed epsilon; ``dp_violation_source`` names which).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import __version__, canary, registry, runner
from privaudit import results as rs
from privaudit.api import AuditResults, default_audit_dir
from privaudit.defenses.base import Defense
from privaudit.errors import PrivauditError
from privaudit.plan import audit_to_toml
from privaudit.results import audit_matrix as build_matrix
from privaudit.results import audit_series as pair_series
from privaudit.runner import scheduler_context
from privaudit.transcript import is_client

AUDIT_JSON = "audit.json"
AUDIT_HTML = "audit.html"
DEFAULT_AUDIT_SEEDS = 2
HONEST = "honest-but-curious"
MALICIOUS = "malicious"
#: values of :attr:`Audit.threat`
THREATS = (HONEST, MALICIOUS, "both")
#: how a verdict names a deviation (keys of :data:`privaudit.attacks.ncf.malicious.DEVIATIONS`),
#: in order of preference when an attack declares several
DEVIATION_NOUNS = {
    "inconsistent-models": "model inconsistency",
    "isolated-decryption": "isolated decryption",
    "sybils": "sybil cohorts",
    "craft-items": "crafted items",
    "craft-network": "crafted network weights",
    "choose-cohorts": "chosen cohorts",
}

__all__ = [
    "Audit",
    "run_audit",
    "write_audit",
    "applicable_attacks",
    "applicable_defenses",
    "build_matrix",
    "pair_series",
    "scheduler_context",
    "default_out_dir",
    "attack_threat",
    "attack_plan",
    "threat_verdicts",
    "THREATS",
]


# ------------------------------------------------------------------------------ selection


def applicable_attacks(protocol: str) -> list[type]:
    """Registered attacks that read ``protocol``'s transcripts (declared ``protocols``)."""
    out = []
    for cls in registry.available("attack").values():
        targets = tuple(getattr(cls, "protocols", ()) or ())
        if not targets or protocol in targets:
            out.append(cls)
    return out


def attack_threat(cls: type) -> str:
    """An attack's declared threat model (:data:`HONEST` unless it declares ``malicious``)."""
    return MALICIOUS if getattr(cls, "threat", HONEST) == MALICIOUS else HONEST


def attack_plan(cls: type) -> dict[str, Any]:
    """The protocol settings a malicious attack's deviation needs: its ``plan`` (a dict, or a
    string naming the protocol's ``server`` plan); empty for an honest-but-curious attack."""
    plan = getattr(cls, "plan", None)
    if attack_threat(cls) != MALICIOUS or not plan:
        return {}
    return dict(plan) if isinstance(plan, Mapping) else {"server": str(plan)}


def deviation_noun(cls: type) -> str:
    """How a verdict names what a malicious attack's server does (:data:`DEVIATION_NOUNS`)."""
    declared = tuple(getattr(cls, "deviations", ()) or ())
    return next((DEVIATION_NOUNS[d] for d in DEVIATION_NOUNS if d in declared), ", ".join(declared) or "deviation")


def defense_grid(cls: type) -> tuple:
    """The values a defense is swept at: its ``default_grid``, or ``(None,)`` (one cell with
    its defaults) for a defense without a strength."""
    return tuple(cls.default_grid) if getattr(cls, "strength", None) else (None,)


def _defense_params(cls: type, value: Any) -> dict[str, Any]:
    return {cls.strength: value} if getattr(cls, "strength", None) else {}


def applicable_defenses(
    protocol: str, include_hiding: bool = False, selected: Sequence[str] = ()
) -> tuple[list[type], list[tuple[str, str]]]:
    """(defenses to sweep, [(name, why skipped)]) for ``protocol``.

    Defenses that hide per-client plaintext (``hides_plaintext()``: encryption, secure
    aggregation) are skipped unless ``include_hiding``: plaintext attacks score their baseline
    against them by construction, and their cryptography makes every run slow (secure
    aggregation on 200 FedMVMF clients: minutes per epoch). A defense without a strength grid
    is skipped unless ``selected`` names it (then it is one cell, :func:`defense_grid`)."""
    swept, skipped = [], []
    schema = registry.get("protocol", protocol).schema
    for name, cls in registry.available("defense").items():
        applies = cls.applies_to
        if applies is not None and protocol not in applies:
            skipped.append((name, f"applies only to {', '.join(applies)}"))
        elif schema is not None and not cls.acts_on_schema(schema):
            acts = ", ".join(f"{k}.{f}" for k, f in cls.acts_on) or "none declared"
            skipped.append((name, f"changes no payload of a {protocol} message (acts on: {acts})"))
        elif name not in selected and (
            not getattr(cls, "strength", None) or not tuple(getattr(cls, "default_grid", ()) or ())
        ):
            skipped.append((name, "no strength grid to sweep"))
        elif not include_hiding and _hides_plaintext(cls):
            skipped.append((name, "hides per-client plaintext (cryptographic, slow): add it with --defense " + name))
        else:
            swept.append(cls)
    return swept, skipped


def _hides_plaintext(cls: type) -> bool:
    try:
        return bool(cls().hides_plaintext())
    except Exception:  # a defense that cannot be built with its defaults is not skipped here
        return False


# ------------------------------------------------------------------------------ defense cells


@dataclass(frozen=True)
class DefenseCell:
    """One column of the audit: a defense, or a stack of defenses that run together.

    Written ``name[:k=v,...]`` and stacked with ``+`` (``secagg+model-consistency``,
    ``paillier:cohort_size=1+model-consistency``). A countermeasure that declares the defense it
    protects (``protects``: protocol -> defense, e.g. ``model-consistency`` protects ``secagg``
    on FedNCF) gets that defense under it when a malicious server is audited (``auto``: the label
    names it, ``secagg+model-consistency``). The last member is swept over its ``default_grid``
    when it has a strength that the spec does not fix; every other member keeps the parameters
    given (or its defaults)."""

    name: str
    members: tuple[tuple[type, tuple[tuple[str, Any], ...]], ...]
    swept: bool

    @property
    def cls(self) -> type:
        return self.members[-1][0]

    @property
    def stacked(self) -> bool:
        return len(self.members) > 1 or bool(self.members[-1][1])

    @property
    def strength(self) -> str | None:
        return self.cls.strength if self.swept else None

    @property
    def grid(self) -> tuple:
        return defense_grid(self.cls) if self.swept else (None,)

    def specs(self, value: Any) -> list[tuple[type, dict[str, Any]]]:
        """(class, params) of every member at grid ``value``."""
        out = [(cls, dict(params)) for cls, params in self.members]
        if self.swept:
            out[-1][1].update(_defense_params(self.cls, value))
        return out

    def entry(self) -> dict[str, Any]:
        """The cell's entry in ``audit.json``'s ``defenses``."""
        out = {
            "name": self.name,
            "description": " + ".join(registry.describe(cls) for cls, _ in self.members),
            "strength": self.strength,
            "grid": list(self.grid),
            "params": {**dict(self.cls.params), **dict(self.members[-1][1])},
        }
        if self.stacked:
            out["stack"] = [{"name": cls.name, "params": dict(params)} for cls, params in self.members]
        return out


def _member_text(name: str, params: Mapping[str, Any]) -> str:
    return name + (":" + ",".join(f"{k}={rs.fmt_value(v)}" for k, v in params.items()) if params else "")


def parse_cell(spec: str, protocol: str, auto_base: bool = False) -> DefenseCell:
    """A :class:`DefenseCell` from ``spec`` (``a[:k=v]+b[:k=v]``; parameters coerced and checked;
    an unknown name or parameter is a :class:`PrivauditError`). ``auto_base``: put under it the
    defense a member protects on ``protocol`` (``protects``) when the stack lacks it."""
    from privaudit.params import parse_spec

    parts = [p.strip() for p in str(spec).split("+")]
    if not all(parts):
        raise PrivauditError(f"--defense: empty member in the stack {spec!r}")
    members: list[tuple[type, tuple[tuple[str, Any], ...]]] = []
    for part in parts:
        name, raw = parse_spec(part, "--defense")
        cls = registry.get("defense", name)
        owner = f"defense {name!r}"
        unknown = [k for k in raw if k not in cls.declared]
        if unknown:
            raise PrivauditError(f"{owner}: unknown parameter {unknown[0]!r} (known: {', '.join(cls.declared)})")
        params = {k: cls.declared[k].coerce(cls.declared[k].parse(v, owner), owner) for k, v in raw.items()}
        cls(**params)  # validates the combination
        members.append((cls, tuple(params.items())))
    names = [cls.name for cls, _ in members]
    if len(set(names)) != len(names):
        raise PrivauditError(f"--defense: a defense appears twice in the stack {spec!r}")
    if auto_base:
        for cls, _ in list(members):
            base = (getattr(cls, "protects", None) or {}).get(protocol)
            if base and base not in names:
                members.insert(0, (registry.get("defense", base), ()))
                names.insert(0, base)
    registry.get("protocol", protocol).check_stack([cls(**dict(params)) for cls, params in members])
    last, fixed = members[-1]
    swept = bool(getattr(last, "strength", None)) and bool(defense_grid(last)) and last.strength not in dict(fixed)
    label = "+".join(_member_text(cls.name, dict(params)) for cls, params in members)
    return DefenseCell(label, tuple(members), swept and defense_grid(last) != (None,))


# ------------------------------------------------------------------------------ runs


@dataclass
class _Run:
    """One protocol run (a defense at one value, or none) and every attack on it."""

    protocol_cls: type
    config: dict[str, Any]
    defense_index: int  # 0 = no defense, k = k-th swept defense
    defense_cls: type | None
    defense_params: dict[str, Any]
    value_index: int
    value: Any
    seed: int
    attacks: list[tuple[str, type]] = field(default_factory=list)  # (registered name, class)
    defense_name: str | None = None
    protocol_name: str = ""
    canaries: int | None = None  # per DP cell's canary run (None: the kit's default, 0: no run)
    threat: str = HONEST
    plan: dict[str, Any] = field(default_factory=dict)  # the malicious server's protocol settings
    #: a stacked cell's every member (class, params at this run's value), in order; empty: the one defense
    stack: tuple = ()
    #: attack parameters by registered name (round-sweep variants); default: the class's ``audit_params``
    attack_params: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def group_key(self) -> tuple[int, str]:
        """Runs of one seed and server plan share their undefended protocol run (:func:`_is_undefended`)."""
        return self.seed, repr(sorted(self.plan.items()))


def _is_undefended(cls: type | None, params: Mapping[str, Any], stack: Sequence = ()) -> bool:
    """A noise defense at scale 0 is the undefended run (the convention of noise sweeps): it
    returns every upload unchanged and draws nothing, so only the public config differs."""
    return not stack and cls is not None and getattr(cls, "strength", None) == "scale" and params.get("scale") == 0


def _shared_run(run: _Run, undefended: Any) -> tuple[Any, list[Any]]:
    """The undefended run's result as ``run``'s: the same messages and utility, the public
    config listing ``run``'s defense as its own run would (:func:`public_defenses`)."""
    import dataclasses

    from privaudit.protocols.base import public_defenses

    defenses = [run.defense_cls(**dict(run.defense_params))]
    active = run.protocol_cls().prepare_defenses(run.protocol_cls.resolve_config(run.config), defenses)
    config = {**undefended.transcript.config, "defenses": public_defenses(active)}
    transcript = dataclasses.replace(undefended.transcript, config=config)
    return dataclasses.replace(undefended, transcript=transcript), defenses


def _execute_group(group: list[_Run], dataset: Any) -> list[dict[str, Any]]:
    """The undefended run ``group[0]``, then the runs that share its protocol run."""
    kept: dict[str, Any] = {}
    outs = [_execute(group[0], dataset, keep=kept)]
    for run in group[1:]:
        outs.append(_execute(run, dataset, shared=kept.get("result")))
    return outs


def _execute(run: _Run, dataset: Any, keep: dict | None = None, shared: Any = None) -> dict[str, Any]:
    """One protocol run and every attack on it; ``shared``: the undefended run's result to
    reuse instead of running (:func:`_is_undefended`); ``keep`` receives this run's result."""
    specs = [(run.defense_cls, dict(run.defense_params))] if run.defense_cls is not None else []
    if run.stack:
        specs = [(cls, dict(params)) for cls, params in run.stack]
    task = runner.Task(run.protocol_cls, run.config, specs, object, run.seed)
    out: dict[str, Any] = {
        "defense": run.defense_name,
        "value": run.value,
        "seed": run.seed,
        "threat": run.threat,
    }
    if run.plan:
        out["plan"] = dict(run.plan)
    # resolved in the main process: each defense class of the cell (one, or a stack) by its own name
    task.names = [run.protocol_name, "", *(registry.name_of(cls) for cls, _ in specs)]
    for attack_name, attack_cls in run.attacks:
        # a class re-imported in a worker process, under its registered name (an entry of a swept
        # attack parameter is named "name:param=value")
        registry.adopt("attack", attack_name.partition(":")[0], attack_cls)
    try:
        if shared is not None:
            result, defenses = _shared_run(run, shared)
            protocol_seconds = 0.0
            out["protocol_shared"] = True  # the undefended run of the same seed
        else:
            result, defenses, protocol_seconds = runner.run_protocol(task, dataset)
    except Exception as exc:  # one failing pair must not end the audit; it is reported
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=3) if not isinstance(exc, PrivauditError) else ""
        return out
    if keep is not None:
        keep["result"] = result
    out["utility"] = rs.floats(result.utility)
    main = rs.main_utility({"points": [out], "utility_metric": run.protocol_cls.main_utility})
    users = rs.stored_user_utility(getattr(result, "user_utility", None), main)
    if users:  # the main utility's per-user contributions: its cost's paired bootstrap over users
        out["utility_users"] = users
    out["protocol_seconds"] = protocol_seconds
    privacy = runner.defense_privacy(defenses, result.transcript)
    if privacy and run.defense_name:
        # keyed by the registered name (a class's own ``name`` may be unset in a worker process)
        privacy = {run.defense_name: next(iter(privacy.values()))}
        out["privacy"] = privacy
        out["rounds_recorded"] = _rounds_recorded(result.transcript)
        if (
            run.canaries != 0
            and canary.claimed_privacy(privacy)
            and canary.canary_kit(run.protocol_name, run.defense_name)
        ):
            out["canary_audit"] = _canary_audit(run, specs, dataset)
    attacks = {}
    for a_index, (attack_name, attack_cls) in enumerate(run.attacks):
        ss = np.random.SeedSequence([run.seed, run.defense_index, run.value_index, a_index])
        try:
            params = dict(run.attack_params.get(attack_name, getattr(attack_cls, "audit_params", {})) or {})
            scored, seconds = runner.evaluate_attack(
                attack_cls, params, result.transcript, np.random.default_rng(ss), privacy
            )
        except Exception as exc:
            attacks[attack_name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        scored["seconds"] = seconds
        attacks[attack_name] = scored
    out["attacks"] = attacks
    return out


def _controls_needed(out: Mapping[str, Any], runs: Sequence[_Run]) -> list[tuple[int, list[str]]]:
    """(run index, attacks) of the planted-signal controls an audit needs: a first-seed DP run
    with a canary audit whose transcript holds fewer rounds than its claim covers, for the honest
    attacks whose own test reads "protected" at its value (only there can a control change a
    verdict: the gate asks for evidence of the attack's power before "protected")."""
    honest = {a["name"] for a in out.get("attacks") or [] if a.get("threat", HONEST) == HONEST}
    need = []
    for i, r in enumerate(out.get("runs") or []):
        claim = _claim_rounds(r.get("privacy"))
        if (
            "epsilon_lb" not in (r.get("canary_audit") or {})
            or not claim
            or r.get("rounds_recorded") is None
            or r["rounds_recorded"] >= claim
            or r.get("threat", HONEST) != HONEST
        ):
            continue
        names = [
            a
            for a in sorted(honest)
            if any(
                row.get("value") == r.get("value") and row.get("verdict") == "protected"
                for row in pair_series(out, a, r.get("defense"))
            )
        ]
        if names:
            need.append((i, names))
    return need


def _planted_control(item: tuple[_Run, list[str]], dataset: Any) -> dict[str, Any]:
    """The planted-signal control of a DP cell (:func:`privaudit.canary.planted_control`) for
    the named attacks of the run, or ``{"error"}``."""
    run, names = item
    specs = [(run.defense_cls, dict(run.defense_params))] if run.defense_cls is not None else []
    if run.stack:
        specs = [(cls, dict(params)) for cls, params in run.stack]
    for attack_name, attack_cls in run.attacks:
        registry.adopt("attack", attack_name.partition(":")[0], attack_cls)
    attacks = [
        (name, cls, dict(run.attack_params.get(name, getattr(cls, "audit_params", {})) or {}))
        for name, cls in run.attacks
        if name in names
    ]
    try:
        return canary.planted_control(
            run.protocol_cls,
            run.config,
            specs,
            dataset,
            run.seed,
            attacks,
            names=[run.defense_name or ""],
        )
    except Exception as exc:  # reported on the point, like a failing attack
        return {"error": f"{type(exc).__name__}: {exc}"}


def _canary_audit(run: _Run, specs: list[tuple[Any, dict[str, Any]]], dataset: Any) -> dict[str, Any]:
    """The one-run canary bound of a DP cell (:func:`privaudit.canary.canary_audit`) with its
    ``seconds``, or ``{"error"}``."""
    t0 = time.perf_counter()
    try:
        out = canary.canary_audit(
            run.protocol_cls, run.config, specs, dataset, run.seed, run.canaries, names=[run.defense_name or ""]
        )
    except Exception as exc:  # reported on the point, like a failing attack
        return {"error": f"{type(exc).__name__}: {exc}"}
    out["seconds"] = time.perf_counter() - t0
    return out


@dataclass
class Audit:
    """An audit of one protocol (see the module docstring).

    Parameters
    ----------
    protocol : str
    data : str | Path | RatingsDataset
        ``"synthetic"`` (default), a path, or a dataset.
    users : int | None
        Subsample this many users (seeded by ``seed``).
    sets : dict
        Protocol config overrides.
    seeds, seed : int
        Seeds ``seed .. seed + seeds - 1``.
    jobs : int
        joblib processes (-1: all cores); ignored with ``scheduler``.
    scheduler : str | None
        Dask scheduler address or ``local:N``.
    attacks, defenses : sequence of str | None
        Restrict to these names (default: every applicable one). A defense may be a spec with
        parameters or a stack (``secagg+model-consistency``, :func:`parse_cell`).
    progress : bool | None
    canaries : int | None
        Canaries of the extra canary run of every DP cell (None: the protocol's canary kit's
        default; 0: no canary runs).
    threat : str
        ``honest-but-curious``, ``malicious`` or ``both`` (:data:`THREATS`): which attacks run
        (the malicious ones on runs with their plan set; module docstring).
    """

    protocol: str
    data: Any = "synthetic"
    users: int | None = None
    sets: dict[str, Any] = field(default_factory=dict)
    seeds: int = DEFAULT_AUDIT_SEEDS
    seed: int = 0
    jobs: int = 1
    scheduler: str | None = None
    attacks: Sequence[str] | None = None
    defenses: Sequence[str] | None = None
    progress: bool | None = None
    canaries: int | None = None
    threat: str = "both"


def check(audit: Audit) -> None:
    """Refuse a bad audit before any compute (one-line :class:`PrivauditError`): unknown or
    inapplicable attacks and defenses, bad parameters, stacks the protocol refuses."""
    _selected_attacks(audit, audit.protocol)
    _selected_defenses(audit, audit.protocol)


def _selected_attacks(audit: Audit, protocol: str) -> list[type]:
    """The attacks an audit runs: those reading ``protocol``, narrowed to ``audit.attacks`` and
    to ``audit.threat``; a name that is unknown or reads another protocol is an error."""
    attacks = applicable_attacks(protocol)
    if audit.attacks:
        for name in audit.attacks:
            registry.get("attack", name)
        attacks = [a for a in attacks if a.name in set(audit.attacks)]
        missing = sorted(set(audit.attacks) - {a.name for a in attacks})
        if missing:
            raise PrivauditError(f"attack(s) {', '.join(missing)} do not read {protocol!r} transcripts")
    if not attacks:
        raise PrivauditError(f"no registered attack reads {protocol!r} transcripts")
    if audit.threat not in THREATS:
        raise PrivauditError(f"threat must be one of {', '.join(THREATS)}, got {audit.threat!r}")
    if audit.threat != "both":
        attacks = [a for a in attacks if attack_threat(a) == audit.threat]
        if not attacks:
            raise PrivauditError(f"no selected {audit.threat} attack reads {protocol!r} transcripts")
    return attacks


def _selected_defenses(audit: Audit, protocol: str) -> tuple[list[DefenseCell], list[tuple[str, str]]]:
    """The defense cells an audit sweeps (every grid value validated) and the skipped defenses
    with why. Named cells may be stacks (:class:`DefenseCell`); when a malicious server is
    audited every countermeasure stands on the defense it protects (``protects``), and without
    named defenses the protected defense and each of its countermeasures get a cell of their own."""
    malicious = audit.threat != HONEST
    named = [parse_cell(spec, protocol, auto_base=malicious) for spec in audit.defenses or ()]
    wanted = {cls.name for c in named for cls, _ in c.members}
    defenses, skipped = applicable_defenses(
        protocol, include_hiding=audit.defenses is not None, selected=tuple(sorted(wanted))
    )
    allowed = {d.name for d in defenses}
    if audit.defenses is not None:
        for cell in named:
            missing = sorted({cls.name for cls, _ in cell.members} - allowed)
            if missing:
                raise PrivauditError(f"defense(s) {', '.join(missing)} cannot be swept on {protocol!r}")
        skipped += [(d.name, "not selected") for d in defenses if d.name not in wanted]
        order = {name: i for i, name in enumerate(registry.available("defense"))}
        cells = sorted(named, key=lambda c: order.get(c.cls.name, len(order)))  # registry order, as before
    else:
        cells = [parse_cell(d.name, protocol, auto_base=malicious) for d in defenses]
        if malicious:
            cells += _countermeasure_cells(protocol, {c.name for c in cells})
    seen: set[str] = set()
    protocol_cls = registry.get("protocol", protocol)
    config = protocol_cls.resolve_config(audit.sets)
    for cell in cells:
        if cell.name in seen:
            raise PrivauditError(f"defense {cell.name!r} is named twice")
        seen.add(cell.name)
        for value in cell.grid:
            built = [cls(**params) for cls, params in cell.specs(value)]  # validates each member
            if cell.stacked:  # the protocol's own checks of the combination (e.g. a refused cohort size)
                protocol_cls().prepare_defenses(config, built)
    return cells, skipped


def _countermeasure_cells(protocol: str, have: set[str]) -> list[DefenseCell]:
    """The malicious axis's default cells: each defense a countermeasure protects on
    ``protocol`` alone, and each countermeasure on top of it (not already in ``have``)."""
    out: list[DefenseCell] = []
    schema = registry.get("protocol", protocol).schema
    for name, cls in registry.available("defense").items():
        base = (getattr(cls, "protects", None) or {}).get(protocol)
        if not base or (cls.applies_to is not None and protocol not in cls.applies_to):
            continue
        if schema is not None and not cls.acts_on_schema(schema):
            continue
        for spec in (base, name):
            cell = parse_cell(spec, protocol, auto_base=True)
            if cell.name not in have:
                have.add(cell.name)
                out.append(cell)
    return out


def _plan(audit: Audit, n_users: int | None = None) -> tuple[list[_Run], dict[str, Any]]:
    """The audit's runs and the header of its ``audit.json``; ``n_users``: the dataset's users
    (the malicious runs' deviation budget; None before the data is loaded)."""
    protocol_cls = registry.get("protocol", audit.protocol)
    config = protocol_cls.resolve_config(audit.sets)
    runner.check_run_settings(audit.seeds, audit.seed, audit.jobs)
    attacks = _selected_attacks(audit, protocol_cls.name)
    defenses, skipped = _selected_defenses(audit, protocol_cls.name)
    seeds = list(range(int(audit.seed), int(audit.seed) + int(audit.seeds)))
    runs: list[_Run] = []
    honest = [(a.name, a) for a in attacks if attack_threat(a) == HONEST]
    plans: dict[str, tuple[dict[str, Any], list[tuple[str, type]]]] = {}
    for a in attacks:
        if attack_threat(a) == MALICIOUS:
            plan = attack_plan(a)
            plans.setdefault(repr(sorted(plan.items())), (plan, []))[1].append((a.name, a))
    if honest:
        runs += _runs(protocol_cls, config, defenses, seeds, honest, audit.canaries, None)
    entries = [(a.name, a, None) for a in attacks if attack_threat(a) == HONEST]
    unplanned: dict[str, str] = {}
    for plan, named in plans.values():
        try:
            planned, budget = _planned_config(protocol_cls, audit.sets, plan, n_users)
        except PrivauditError as exc:
            names = ", ".join(n for n, _ in named)
            if audit.attacks:  # named by the user: its plan must fit the protocol's settings
                raise PrivauditError(f"the malicious server's plan of {names} ({_plan_text(plan)}): {exc}") from None
            for n, _ in named:  # a craft the settings exclude (e.g. an MLP unit of a GMF model)
                unplanned[n] = f"its server plan ({_plan_text(plan)}) does not fit the protocol's settings: {exc}"
            entries += [(n, a, None) for n, a in named]
            continue
        variants, params = _variants(named, budget)
        entries += [(n, a, params.get(n)) for n, a in variants]
        # one target per malicious run: at least MIN_VERDICT_VICTIMS seeds (the fewest victims a
        # verdict is decided from), the honest runs' seeds first
        more = list(range(seeds[0], seeds[0] + max(len(seeds), rs.MIN_VERDICT_VICTIMS)))
        runs += _runs(protocol_cls, planned, defenses, more, variants, audit.canaries, plan, params)
    header = _header(audit, protocol_cls, config, seeds, entries, defenses, skipped)
    header["_unplanned"] = unplanned
    return runs, header


def _header(
    audit: Audit,
    protocol_cls: type,
    config: dict[str, Any],
    seeds: list[int],
    attacks: list[tuple[str, type, dict[str, Any] | None]],
    defenses: list[DefenseCell],
    skipped: list[tuple[str, str]],
) -> dict[str, Any]:
    """The audit dict's header: protocol, config, seeds, the attacks and defenses it runs."""
    return {
        "privaudit_version": __version__,
        "protocol": protocol_cls.name,
        "protocol_config": config,
        "seeds": seeds,
        "attacks": [_attack_entry(a, name, params) for name, a, params in attacks],
        "defenses": [d.entry() for d in defenses],
        "skipped_defenses": [{"name": n, "reason": r} for n, r in skipped],
        "threat": audit.threat,
        "utility_metric_declared": protocol_cls.main_utility,
        "utility_specs": {k: rs.spec_to_dict(s) for k, s in protocol_cls.utility_specs.items()},
    }


def _attack_entry(a: type, name: str | None = None, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    entry = {
        "name": name or a.name,
        "description": registry.describe(a),
        "party": getattr(a, "party", "server"),
        "requires": list(getattr(a, "requires", ()) or ()),
        "primary_metric": getattr(a, "primary_metric", "accuracy"),
        "audit_params": dict(params if params is not None else getattr(a, "audit_params", {}) or {}),
        "threat": attack_threat(a),
    }
    if name and name != a.name:
        entry["variant_of"] = a.name
    if attack_threat(a) == MALICIOUS:
        entry.update(plan=attack_plan(a), deviations=list(a.deviations), deviation=deviation_noun(a))
    return entry


def _plan_text(plan: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in plan.items())


def _runs(
    protocol_cls: type,
    config: dict[str, Any],
    defenses: list[DefenseCell],
    seeds: list[int],
    named: list[tuple[str, type]],
    canaries: int | None,
    plan: dict[str, Any] | None,
    attack_params: dict[str, dict[str, Any]] | None = None,
) -> list[_Run]:
    """The runs of one server: honest (``plan`` None: undefended and every grid value) or
    malicious (undefended and each defense cell's strongest value, with ``plan`` set)."""
    threat = HONEST if plan is None else MALICIOUS
    extra = {"threat": threat, "plan": dict(plan or {}), "attack_params": dict(attack_params or {})}
    own = canaries if plan is None else 0  # malicious runs: no canary run (the DP claim is the honest runs')
    runs = [
        _Run(
            protocol_cls,
            config,
            0,
            None,
            {},
            0,
            None,
            seed,
            named,
            None,
            protocol_cls.name,
            None if plan is None else 0,
            **extra,
        )
        for seed in seeds
    ]
    for d_index, cell in enumerate(defenses, start=1):
        grid = list(enumerate(cell.grid))
        for v_index, value in grid if plan is None else grid[-1:]:
            specs = cell.specs(value)
            for seed in seeds:
                runs.append(
                    _Run(
                        protocol_cls,
                        config,
                        d_index,
                        cell.cls,
                        specs[-1][1],
                        v_index,
                        value,
                        seed,
                        named,
                        cell.name,
                        protocol_cls.name,
                        own if seed == seeds[0] and not cell.stacked else 0,  # one canary run per cell
                        stack=tuple(specs) if cell.stacked else (),
                        **extra,
                    )
                )
    return runs


def round_grid(budget: int) -> list[int]:
    """Deviation rounds an attack is read at: 1, 4, 16, ... and ``budget`` (the protocol's rounds)."""
    out, r = [], 1
    while r < budget:
        out.append(r)
        r *= 4
    return out + [int(budget)]


def _deviation_budget(protocol_cls: type, config: Mapping[str, Any], n_users: int | None) -> int | None:
    """The most deviation rounds a malicious server of ``protocol_cls`` can run: the protocol's
    ``deviation_budget`` (e.g. FedNCF: its aggregation rounds), None when it declares none."""
    budget = getattr(protocol_cls, "deviation_budget", None)
    if budget is None or "deviation_rounds" not in config:
        return None
    out = budget(config, n_users)
    return int(out) if out else None


def _planned_config(
    protocol_cls: type, sets: Mapping[str, Any], plan: Mapping[str, Any], n_users: int | None
) -> tuple[dict[str, Any], int | None]:
    """The protocol config of a malicious plan's runs and its deviation budget: the server
    deviates in as many rounds as the protocol runs (unless the plan or ``--set`` fixes
    ``deviation_rounds``), and the recorded rounds cover them."""
    planned = protocol_cls.resolve_config({**dict(sets), **dict(plan)})
    if "deviation_rounds" in sets or "deviation_rounds" in plan:
        return planned, planned.get("deviation_rounds")
    budget = _deviation_budget(protocol_cls, planned, n_users)
    if budget is None:
        return planned, None
    extra: dict[str, Any] = {"deviation_rounds": budget}
    record = planned.get("record_rounds")
    if "record_rounds" not in sets and isinstance(record, int) and record >= 0:
        extra["record_rounds"] = int(planned.get("deviation_start", 0)) + budget + 1
    return protocol_cls.resolve_config({**dict(sets), **dict(plan), **extra}), budget


def _variants(named: list[tuple[str, type]], budget: int | None) -> tuple[list[tuple[str, type]], dict]:
    """A malicious attack with a ``rounds`` parameter, read at every value of
    :func:`round_grid` (one matrix row each, ``<attack>:rounds=<r>``); others as they are."""
    out, params = [], {}
    for name, cls in named:
        if budget is None or "rounds" not in getattr(cls, "declared", {}):
            out.append((name, cls))
            continue
        for r in round_grid(budget):
            variant = f"{name}:rounds={r}"
            out.append((variant, cls))
            params[variant] = {**dict(getattr(cls, "audit_params", {}) or {}), "rounds": r}
    return out, params


def _cost_rank(run: _Run) -> int:
    """0 for a run that may add a canary run (a defense that accounts privacy and a canary kit), 1 for another defended run, 2 for the
    undefended ones: the order in which the audit hands its runs to the workers, so that with
    few workers the costliest runs do not end up alone at the end (the longest-first rule)."""
    if run.defense_cls is None:
        return 2
    accounts = getattr(run.defense_cls, "privacy_spent", None) is not Defense.privacy_spent
    if accounts and run.canaries != 0 and canary.canary_kit(run.protocol_name, run.defense_name) is not None:
        return 0
    return 1


def run_audit(audit: Audit, dataset: Any = None) -> AuditResults:
    """Run ``audit`` -> its :class:`~privaudit.api.AuditResults` (the ``audit.json`` dict with
    typed attributes; ``plan_toml`` set)."""
    runs, header = _plan(audit)
    t0 = time.perf_counter()
    source = audit.data if isinstance(audit.data, str) else str(audit.data)
    if dataset is None:
        dataset = runner.load_data(audit.data)
    else:
        source = getattr(dataset, "name", "dataset")
    dataset = runner.subsample_users(dataset, audit.users, audit.seed)
    runs, header = _plan(audit, int(dataset.n_users))  # the deviation budget needs the number of users
    load_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    # a run whose defense leaves the undefended run unchanged shares that run's protocol run
    # (same seed), in the same task; its attacks are still evaluated with its own streams
    groups: list[list[int]] = []
    first: dict[tuple[int, str], list[int]] = {}
    for i, r in enumerate(runs):
        if r.defense_cls is None:
            first[r.group_key] = [i]
            groups.append(first[r.group_key])
    for i, r in enumerate(runs):
        if r.defense_cls is not None:
            if _is_undefended(r.defense_cls, r.defense_params, r.stack) and r.group_key in first:
                first[r.group_key].append(i)
            else:
                groups.append([i])
    groups.sort(key=lambda g: _cost_rank(runs[g[0]]))  # longest first: no long run left for the end
    with scheduler_context(audit.scheduler) as backend:
        jobs = -1 if audit.scheduler is not None else int(audit.jobs)
        parallel = audit.scheduler is not None or (jobs != 1 and len(groups) > 1)
        grouped = runner.parallel_map(
            _execute_group,
            [[runs[i] for i in g] for g in groups],
            dataset,
            jobs=jobs,
            progress=audit.progress,
            desc=f"audit {header['protocol']}",
            parallel=parallel,
            backend="active" if audit.scheduler else None,
        )
    results: list[dict[str, Any]] = [{} for _ in runs]
    for g, outs in zip(groups, grouped):
        for i, o in zip(g, outs):
            results[i] = o
    run_seconds = time.perf_counter() - t1
    out = dict(header)
    unplanned = out.pop("_unplanned", {})
    declared_utility = out.pop("utility_metric_declared")
    out["dataset"] = dict(dataset.summary(), source=source)
    if audit.users is not None:
        out["dataset"]["subsampled_users"] = int(audit.users)
    out["runs"] = results
    for a in out["attacks"]:
        names = rs.ordered_keys(
            [r["attacks"][a["name"]] for r in results if a["name"] in r.get("attacks", {})], "attack_metrics"
        )
        attack_cls = registry.get("attack", a.get("variant_of") or a["name"])  # names, never classes, in results
        a["metric_specs"] = rs.declared_specs(attack_cls, names or [a["primary_metric"]])
    if declared_utility:
        out["utility_metric"] = declared_utility
    out["utility_metric"] = rs.audit_utility(out)
    _pool_targets(out)
    _mark_applicability(out)
    for a in out["attacks"]:
        if a["name"] in unplanned:
            a["applies"], a["reason"] = False, unplanned[a["name"]]
    decide(out)
    need = _controls_needed(out, runs)
    if need:  # "protected" at a DP cell whose rounds the attack does not all read: planted-signal controls
        t2 = time.perf_counter()
        with scheduler_context(audit.scheduler) as backend2:
            jobs = -1 if audit.scheduler is not None else int(audit.jobs)
            controls = runner.parallel_map(
                _planted_control,
                [(runs[i], names) for i, names in need],
                dataset,
                jobs=jobs,
                progress=audit.progress,
                desc=f"planted-signal controls {header['protocol']}",
                parallel=audit.scheduler is not None or (jobs != 1 and len(need) > 1),
                backend="active" if audit.scheduler else None,
            )
        backend = backend or backend2
        for (i, _), control in zip(need, controls):
            results[i]["planted_control"] = control
        out.pop("matrix", None)
        decide(out)
        run_seconds += time.perf_counter() - t2
    out["timing"] = {
        "total_seconds": time.perf_counter() - t0,
        "load_seconds": load_seconds,
        "run_seconds": run_seconds,
        "runs": len(runs),
        "backend": backend or (f"joblib ({audit.jobs} jobs)" if int(audit.jobs) != 1 else "sequential"),
    }
    return AuditResults(out, plan_toml=audit_to_toml(audit))


def _pool_targets(out: dict[str, Any]) -> None:
    """One target per malicious run: a run's own bootstrap has too few victims
    (:data:`privaudit.results.MIN_VICTIMS`), so the seeds' targets of one cell are the victims
    of a cluster bootstrap (the seed-mean advantage's standard error, paired with the prior),
    written into each run's ``bootstrap`` (in place; runs with a bootstrap of their own are kept)."""
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in out["runs"]:
        if r.get("threat") != MALICIOUS:
            continue
        for name, scored in (r.get("attacks") or {}).items():
            if scored.get("supported") and not scored.get("bootstrap"):
                cells.setdefault((name, str(r.get("defense")), repr(r.get("value"))), []).append(scored)
    for group in cells.values():
        rs.pool_targets(group)


def _mark_applicability(out: dict[str, Any]) -> None:
    """An attack applies when it ran on the undefended view (its declared needs were met)."""
    for a in out["attacks"]:
        undefended = [
            r["attacks"][a["name"]]
            for r in out["runs"]
            if r.get("defense") is None and a["name"] in (r.get("attacks") or {})
        ]
        supported = [s.get("supported", False) for s in undefended if "error" not in s]
        a["applies"] = bool(supported) and all(supported)
        a["reason"] = "; ".join(sorted({s.get("reason", "") for s in undefended if s.get("reason")}))
        errors = sorted({s["error"] for s in undefended if "error" in s})
        if errors:  # the attack crashed (a bug or a degenerate run), reported as such
            a["errors"] = errors
            a["reason"] = "; ".join(filter(None, [a["reason"], "failed: " + "; ".join(errors)]))


# ------------------------------------------------------------------------------ DP cells

#: a DP cell whose canaries give a 95 % lower bound above this epsilon has weak privacy at best
#: (a canary's bit is guessed at odds above e : 1 somewhere): it never reads "protected"
WEAK_PRIVACY_EPSILON = 1.0
#: what a gated DP row or cell reads instead of "protected"
GATED_VERDICT = "no evidence of leakage"


def _rounds_recorded(transcript: Any) -> int:
    """Rounds of a transcript that hold a client's message (what any attack can read)."""
    return len({int(m.round) for m in transcript.messages if is_client(str(m.sender))})


def _claim_rounds(privacy: Mapping[str, Any] | None) -> int | None:
    """Rounds a run's DP claim covers (its releases over releases per round), None if unknown."""
    for v in (privacy or {}).values():
        if isinstance(v, Mapping) and "epsilon" in v and v.get("releases") and v.get("releases_per_round"):
            return int(round(float(v["releases"]) / float(v["releases_per_round"])))
    return None


def _dp_runs(out: Mapping[str, Any], defense: str, value: Any) -> list[Mapping[str, Any]]:
    return [
        r
        for r in out.get("runs") or []
        if r.get("threat", HONEST) == HONEST
        and r.get("defense") == defense
        and r.get("value") == value
        and canary.claimed_privacy(r.get("privacy") or {})
    ]


def _planted(runs: Sequence[Mapping[str, Any]], attack: str | None) -> dict[str, Any] | None:
    """``attack``'s entry in the planted-signal control of a DP cell's runs (None: no control)."""
    for r in runs:
        ctl = r.get("planted_control")
        if not isinstance(ctl, Mapping):
            continue
        if "error" in ctl:
            return {"error": ctl["error"]}
        if attack is not None and attack in (ctl.get("attacks") or {}):
            return dict(ctl["attacks"][attack])
    return None


def dp_gate(
    out: Mapping[str, Any], defense: str | None, value: Any, attack: str | None = None
) -> dict[str, Any] | None:
    """Why a DP cell (``defense`` at ``value`` with an accounted epsilon) cannot read
    "protected", with its canary audit: ``{"reasons": [...], "canary", "claim_rounds",
    "rounds_read", "canary_violation", "power", "planted"}``; None when the cell is not a DP cell.

    Reasons: every canary distinguished (the bound at its ceiling says only "at least this");
    the canary bound above :data:`WEAK_PRIVACY_EPSILON`; no evidence that ``attack`` had power
    at this strength. Power is shown when its transcripts hold every round the claim covers, or
    when the cell's planted-signal control (:func:`privaudit.canary.planted_control`: a run at the
    same noise whose data carries planted canary users) shows that it finds the planted signal;
    ``power`` is True / False (the control shows none) / None (no control: not shown)."""
    if defense is None:
        return None
    runs = _dp_runs(out, defense, value)
    if not runs:
        return None
    audits = [r["canary_audit"] for r in runs if isinstance(r.get("canary_audit"), Mapping)]
    audits = [a for a in audits if "epsilon_lb" in a]
    can = max(audits, key=lambda a: float(a["epsilon_lb"]), default=None)
    reasons = []
    if can is not None:
        if canary.at_ceiling(can):
            reasons.append(canary.canary_sentence(can))
        elif float(can["epsilon_lb"]) > WEAK_PRIVACY_EPSILON:
            reasons.append(
                f"canaries show ε ≥ {float(can['epsilon_lb']):.2f}, above the weak-privacy level {WEAK_PRIVACY_EPSILON:g}"
            )
    claim = [c for c in (_claim_rounds(r.get("privacy")) for r in runs) if c]
    read = [int(r["rounds_recorded"]) for r in runs if r.get("rounds_recorded") is not None]
    claim_rounds = max(claim) if claim else None
    rounds_read = min(read) if read else None
    power: bool | None = True
    planted = None
    if claim_rounds and rounds_read is not None and rounds_read < claim_rounds:
        planted = _planted(runs, attack)
        if planted and "lower" in planted:  # the audit's margin decides (a found leak larger than it)
            margin = rs.verdict_margin(out)
            planted = {**planted, "margin": margin, "power": bool(float(planted["lower"]) > margin)}
        why = f"the attack reads {rounds_read} of the {claim_rounds} rounds the claim covers"
        power = bool(planted["power"]) if planted and "power" in planted else None
        if power is None:  # no control (a run's own record, or no "protected" to check) or a failed one
            note = canary.planted_sentence(planted) if planted and attack is not None else None
            reasons.append(f"{why}; {note}" if note else why)
        elif not power:
            reasons.append(f"{why}; {canary.planted_sentence(planted)}")
    violated = can is not None and float(can["epsilon_lb"]) > float(can.get("epsilon", np.inf))
    return {
        "reasons": reasons,
        "canary": can,
        "claim_rounds": claim_rounds,
        "rounds_read": rounds_read,
        "canary_violation": bool(violated),
        "power": power,
        "planted": planted,
    }


#: what a "protected" DP row or cell reads when the attack's power at its noise is not shown
NO_POWER_LABEL = "inconclusive (attack without power at this noise)"


def dp_statement(cell: Mapping[str, Any], gate: Mapping[str, Any]) -> str:
    """One sentence on a DP cell combining the attack test, its planted-signal control and the
    canary test."""
    verdict = cell.get("verdict")
    attack = {
        "leaks": "the attack leaks",
        "protected": "the attack stays under the margin",
        GATED_VERDICT: "the attack shows no leak",
        "inconclusive": "the attack test is inconclusive",
        "attack below prior": "the attack scores below its prior",
    }.get(str(verdict), f"the attack: {verdict}")
    if cell.get("gated_from") == "protected" and verdict == "inconclusive":
        attack = "the attack stays under the margin"
    can = gate.get("canary")
    if can is None:
        canaries = "no canary audit"
    else:
        text = canary.canary_sentence(can)
        claim = "violated" if gate.get("canary_violation") else "consistent"
        canaries = f"canaries: {text}, DP claim {claim}"
    planted = canary.planted_sentence(gate.get("planted"))
    if gate.get("power") and planted:
        attack += f" ({planted})"
    if verdict == "protected":
        end = "protected"
    elif verdict == "leaks" or gate.get("canary_violation"):
        end = "not protected"
    elif gate.get("power") is not True and cell.get("gated_from") == "protected":
        end = (
            "inconclusive, the attack's power at this noise not shown ("
            + "; ".join(r for r in gate["reasons"] if not r.startswith("all "))
            + ")"
        )
        end = end.replace(" ()", "")
    elif gate["reasons"]:
        end = "not shown to protect (" + "; ".join(r for r in gate["reasons"] if not r.startswith("all ")) + ")"
        end = end.replace(" ()", "")
    else:
        end = "not shown to protect"
    return f"{attack}; {canaries}: {end}."


def _gated(verdict: Any, gate: Mapping[str, Any]) -> tuple[str, str] | None:
    """(verdict, label) of a "protected" DP row or cell that ``gate`` does not let stand: without
    evidence of the attack's power at this noise :data:`NO_POWER_LABEL`, else
    :data:`GATED_VERDICT`; None when it stands (or is not "protected")."""
    if verdict != "protected" or not gate["reasons"]:
        return None
    if gate.get("power") is not True:
        return "inconclusive", NO_POWER_LABEL
    return GATED_VERDICT, f"{GATED_VERDICT} (mechanism not shown to protect)"


def _gate_rows(out: dict[str, Any], attack: str, defense: str) -> tuple[list[dict[str, Any]], bool]:
    """The decided rows of ``attack`` against ``defense``, every gated "protected" row turned
    into :data:`GATED_VERDICT` or "inconclusive" (:func:`_gated`; its ``dp_gate`` reasons
    attached); whether any row changed."""
    rows = [r for r in pair_series(out, attack, defense) if "tests" in r]
    changed = False
    for row in rows:
        gate = dp_gate(out, defense, row.get("value"), attack)
        if gate is None:
            continue
        row["dp_gate"] = gate["reasons"]
        new = _gated(row.get("verdict"), gate)
        if new is not None:
            row["verdict"] = new[0]
            row["verdict_label"] = new[1]
            row["gated_from"] = "protected"
            changed = True
    return rows, changed


def _gate_note(parameter: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """ "Not counted as protection at <parameter> = a, b: <reason>; = c: <reason>." for the gated
    rows, values sharing their reasons named together."""
    groups: dict[str, list[str]] = {}
    for r in rows:
        groups.setdefault("; ".join(r["dp_gate"]), []).append(rs.fmt_value(r["value"]))
    parts = [f"{', '.join(values)}: {why}" for why, values in groups.items()]
    return f"Not counted as protection at {parameter} = " + "; = ".join(parts) + "."


def _regated_verdict(
    out: dict[str, Any], v: dict[str, Any], gated: Mapping[str, tuple[list[dict[str, Any]], bool]]
) -> dict[str, Any]:
    """An attack's audit verdict recomputed from its gated rows (``gated``: defense -> the
    attack's :func:`_gate_rows`; :func:`privaudit.results.attack_verdict` on them, each gated
    defense's sentence with its gate note) when a gate changed one of its rows; else ``v`` unchanged."""
    a = next(x for x in out.get("attacks") or [] if x["name"] == v["attack"])
    if not any(changed for _, changed in gated.values()):
        return v

    def note(parameter: str, rows: list[dict[str, Any]]) -> str:
        marked = [r for r in rows if r.get("gated_from")]
        return _gate_note(parameter, marked) if marked else ""

    w = rs.attack_verdict(out, a, rows_of=lambda d: gated[d][0], note=note)
    keep = ("defense", "strength", "utility_cost", "sentence")
    return {
        **v,
        **{k: w[k] for k in keep},
        "dp_violation": bool(v.get("dp_violation")) or w["dp_violation"],
        "dp_gated": True,
    }


def gate_dp_cells(out: dict[str, Any]) -> None:
    """ "protected" means the mechanism protects (in place, after the matrix and the verdicts):
    a DP cell (:func:`dp_gate`) with a reason against it reads :data:`GATED_VERDICT`, every
    DP cell gets ``dp_gate`` (reasons), ``dp_statement`` (the attack and canary tests in one
    sentence) and ``dp_violation`` also when its canary bound exceeds the accounted epsilon
    (``dp_violation_source``: "canary" and/or "attack decisions"); an attack verdict that
    rested on a gated row is recomputed (:func:`_regated_verdict`)."""
    threat = {a["name"]: a.get("threat", HONEST) for a in out.get("attacks") or []}
    for cell in out.get("matrix") or []:
        if threat.get(cell.get("attack"), HONEST) != HONEST:
            continue
        gate = dp_gate(out, cell.get("defense"), cell.get("value"), cell.get("attack"))
        if gate is None:
            continue
        new = _gated(cell.get("verdict"), gate)
        if new is not None:
            cell["verdict"], cell["verdict_label"] = new
            cell["gated_from"] = "protected"
        # like the attack's own bound (any grid value of the defense), a canary bound above its
        # claim at any value of the defense marks the cell
        canary_hit = any(
            (dp_gate(out, cell["defense"], r.get("value")) or {}).get("canary_violation")
            for r in out.get("runs") or []
            if r.get("defense") == cell["defense"] and isinstance(r.get("canary_audit"), Mapping)
        )
        sources = [s for s, hit in (("attack decisions", cell.get("dp_violation")), ("canary", canary_hit)) if hit]
        cell["dp_violation"] = bool(sources)
        cell["dp_violation_source"] = sources
        cell["dp_gate"] = gate["reasons"]
        cell["claim_rounds"] = gate["claim_rounds"]
        cell["rounds_read"] = gate["rounds_read"]
        cell["attack_power"] = gate["power"]
        if gate["planted"] is not None:
            cell["planted_control"] = gate["planted"]
        cell["dp_statement"] = dp_statement(cell, gate)
    for r in out.get("runs") or []:
        if isinstance(r.get("canary_audit"), Mapping) and r.get("threat", HONEST) == HONEST:
            gate = dp_gate(out, r.get("defense"), r.get("value")) or {}
            r["dp_gate"] = {k: gate.get(k) for k in ("reasons", "claim_rounds", "rounds_read")}
    gated = {  # every honest attack's rows against every defense, as the DP gate reads them
        a: {d["name"]: _gate_rows(out, a, d["name"]) for d in out.get("defenses") or []}
        for a, t in threat.items()
        if t == HONEST
    }
    out["verdicts"] = [
        _regated_verdict(out, v, gated[v["attack"]]) if v.get("attack") in gated else v
        for v in out.get("verdicts") or []
    ]
    for v in out["verdicts"]:
        if any(c.get("dp_violation") for c in out.get("matrix") or [] if c.get("attack") == v.get("attack")):
            v["dp_violation"] = True
    # the report's per-pair tables show the gated label too (reports read the document only)
    out["gated_rows"] = [
        {"attack": a, "defense": d, **{k: row[k] for k in _GATED_KEYS}}
        for a, by_defense in gated.items()
        for d, (rows, _) in by_defense.items()
        for row in rows
        if "gated_from" in row
    ]


#: what a gated series row of ``gated_rows`` keeps (its value and the gate's reading)
_GATED_KEYS = ("value", "verdict", "verdict_label", "gated_from", "dp_gate")


def decide(out: dict[str, Any]) -> None:
    """The matrix, the per-attack verdicts and the threat verdicts of an audit dict (in place),
    each cell and verdict with the ``threat`` of its attack."""
    out["matrix"] = build_matrix(out)
    out["verdicts"] = rs.audit_verdicts(out)
    gate_dp_cells(out)
    info = {a["name"]: a for a in out.get("attacks") or []}
    for cell in out["matrix"]:
        cell["threat"] = info[cell["attack"]].get("threat", HONEST)
    gridless = [d["name"] for d in out.get("defenses") or [] if not d.get("strength")]
    for v in out["verdicts"]:
        for name in gridless:  # results names a cell "<defense>.<strength> = <value>"
            v["sentence"] = v["sentence"].replace(f"{name}.None = -", name).replace(f"{name}.None", name)
        a = info[v["attack"]]
        v["threat"] = a.get("threat", HONEST)
        if v["threat"] == MALICIOUS:
            v["sentence"] = f"Malicious server ({_plan_text(a.get('plan') or {})}): {v['sentence']}"
    out["threat_verdicts"] = threat_verdicts(out)


def _column_label(out: Mapping[str, Any], defense: str | None) -> tuple[str, Any]:
    if defense is None:
        return "no defense", None
    d = next(x for x in out.get("defenses") or [] if x["name"] == defense)
    value = d["grid"][-1] if d.get("grid") else None
    if not d.get("strength"):
        return str(defense), value
    return f"{defense} ({d['strength']} = {rs.fmt_value(value)})", value


def _deviation_text(out: Mapping[str, Any], a: Mapping[str, Any], defense: str | None, value: Any) -> str:
    """ "<attack>, N round(s) of <deviation>, S sybil(s)" from the attack's ``rounds_used`` and
    ``sybils`` (seed means) in the cell's malicious runs."""
    metrics = [
        (r.get("attacks") or {}).get(a["name"], {}).get("attack_metrics") or {}
        for r in out.get("runs") or []
        if r.get("threat") == MALICIOUS and r.get("defense") == defense and r.get("value") == value
    ]

    def mean(key: str) -> float:
        vals = [rs.num(m.get(key)) for m in metrics if m.get(key) is not None]
        vals = [v for v in vals if np.isfinite(v)]
        return float(np.mean(vals)) if vals else float("nan")

    def count(x: float, noun: str) -> str:
        if not np.isfinite(x):
            return f"? {noun}s"
        text = f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"
        return f"{text} {noun}" + ("" if text == "1" else "s")

    rounds, sybils = mean("rounds_used"), mean("sybils")
    return f"{a['name']}, {count(rounds, 'round')} of {a.get('deviation', 'deviation')}, {count(sybils, 'sybil')}"


def _threat_part(out: Mapping[str, Any], threat: str, defense: str | None, value: Any) -> str | None:
    """What one column says about one threat model (None when none of its attacks is audited)."""
    attacks = [a for a in out.get("attacks") or [] if a.get("threat", HONEST) == threat]
    if not attacks:
        return None
    server = "an honest-but-curious server" if threat == HONEST else "a malicious server"
    applying = [a for a in attacks if a.get("applies")]
    if not applying:
        return f"no {threat} attack applies"
    cells = {
        c["attack"]: c
        for c in out.get("matrix") or []
        if c["defense"] == defense and c["attack"] in {a["name"] for a in applying}
    }
    verdicts = {name: c.get("verdict", "not applicable") for name, c in cells.items()}
    if threat == MALICIOUS:
        return _malicious_part(out, applying, verdicts, defense, value)
    leaking = [a for a in applying if verdicts.get(a["name"]) == "leaks"]
    if leaking:
        names = [a["name"] for a in leaking]
        stopped = [f"{n} ({v})" for n, v in sorted(verdicts.items()) if v in ("protected", "not applicable")]
        return f"leaks to {server} ({'; '.join(names)})" + (f"; stopped: {', '.join(stopped)}" if stopped else "")
    if verdicts and all(v in ("protected", "not applicable") for v in verdicts.values()):
        na = all(v == "not applicable" for v in verdicts.values())
        return f"protected against {server}" + (" (no attack applies under it)" if na and defense else "")
    shown = "; ".join(f"{n}: {v}" for n, v in sorted(verdicts.items()))
    return f"not shown to leak to {server} ({shown})"


#: test statuses (:func:`privaudit.results.decide_tests`) of an attack that failed: its upper bound
#: is below the margin, or its baseline is already perfect (an attack below its prior is not
#: adapted: never evidence of protection)
FAILED = ("under margin", "at ceiling")


def malicious_family(out: Mapping[str, Any], defense: str | None, attacks: Sequence[Mapping[str, Any]]) -> dict:
    """The adaptive family of a column: every test of every applicable malicious attack (each
    deviation-round variant its own member) at the column's strongest value, decided together
    (Holm over the whole family, :func:`privaudit.results.decide_tests`). ``leaking``: the
    attacks with a rejected test, strongest (smallest p) first; ``failed``: whether every
    attack that ran failed on every metric (an attack that did not apply counts as failed);
    ``family``: the number of tests."""
    import copy

    tests: list[tuple[str, dict[str, Any]]] = []
    for a in attacks:
        series = [r for r in rs.audit_series(out, a["name"], defense) if r.get("tests")]
        if not series:
            continue
        for t in series[-1]["tests"].values():
            tests.append((a["name"], copy.deepcopy(dict(t))))
    rs.decide_tests([t for _, t in tests])  # thresholds already hold the audit's margin
    best: dict[str, float] = {}
    for name, t in tests:
        if t.get("status") == "leaks":
            best[name] = min(best.get(name, 1.0), float(t["p"]))
    leaking = sorted(best, key=lambda n: best[n])
    failed = all(t.get("status") in FAILED for _, t in tests)
    return {"leaking": leaking, "failed": failed, "family": len(tests)}


def _malicious_part(
    out: Mapping[str, Any],
    applying: list[Mapping[str, Any]],
    verdicts: Mapping[str, str],
    defense: str | None,
    value: Any,
) -> str:
    """The malicious column: "protected" only when every adaptive attack fails (Holm over the
    family, :func:`malicious_family`); otherwise the crafts that still win, strongest first."""
    server = "a malicious server"
    family = malicious_family(out, defense, applying)
    info = {a["name"]: a for a in applying}
    stopped = [f"{n} ({v})" for n, v in sorted(verdicts.items()) if v in ("protected", "not applicable")]
    if family["leaking"]:
        shown: dict[str, str] = {}  # each attack once, at its strongest deviation-round variant
        for n in family["leaking"]:
            shown.setdefault(info[n].get("variant_of", n), n)
        names = [_deviation_text(out, info[n], defense, value) for n in shown.values()]
        n, k = family["family"], len(applying)
        held = f"Holm over {n} test{'' if n == 1 else 's'} of {k} attack{'' if k == 1 else 's'}"
        return f"leaks to {server} ({'; '.join(names)}; {held})" + (
            f"; stopped: {', '.join(stopped)}" if stopped else ""
        )
    if verdicts and all(v == "not applicable" for v in verdicts.values()):
        family_names = ", ".join(sorted({a.get("variant_of", a["name"]) for a in applying}))
        return f"protected against {server}" + (
            f" (no attack of the family applies under it: {family_names})" if defense else ""
        )
    control = defense is not None and bool(malicious_family(out, None, applying)["leaking"])
    if family["failed"] and verdicts and control:
        return f"protected against {server} (every adaptive attack fails: {family['family']} tests, Holm)"
    shown = "; ".join(f"{n}: {v}" for n, v in sorted(verdicts.items()))
    return f"not shown to leak to {server} ({shown})"


def threat_verdicts(out: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per matrix column (no defense, then each defense at its strongest value): the verdict
    under each audited threat model and one sentence naming them (module docstring); empty
    when no malicious attack is audited (the per-attack verdicts say it all)."""
    if not any(a.get("threat") == MALICIOUS for a in out.get("attacks") or []):
        return []
    rows = []
    for defense in [None] + [d["name"] for d in out.get("defenses") or []]:
        label, value = _column_label(out, defense)
        parts = {t: _threat_part(out, t, defense, value) for t in (HONEST, MALICIOUS)}
        parts = {t: p for t, p in parts.items() if p is not None}
        sentence = f"{label}: {'; '.join(parts.values())}."
        rows.append({"defense": defense, "value": value, "column": label, **parts, "sentence": sentence})
    return rows


def default_out_dir(protocol: str) -> Path:
    return default_audit_dir(protocol)


def write_audit(audit: Mapping[str, Any], out_dir: Path | str | None = None, plan_toml: str | None = None) -> Path:
    """Write ``audit.json``, ``audit.html`` (:mod:`privaudit.reports.audit`) and, when given,
    the audit's ``plan.toml`` into ``out_dir``; the folder."""
    from privaudit.reports.audit import write_audit_report

    out = Path(out_dir) if out_dir is not None else default_out_dir(audit["protocol"])
    return write_audit_report(audit, out, plan_toml=plan_toml)


def format_matrix(audit: Mapping[str, Any]) -> str:
    """The matrix as plain text (what the CLI prints)."""
    from privaudit.reports.audit import format_matrix as _format

    return _format(audit)

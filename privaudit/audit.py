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
  ``defenses``);
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
(ncf-model-inconsistency, 1 round of model inconsistency, 0 sybils)".

Every DP cell (a defense whose ``privacy_spent`` reports an epsilon) of a protocol with a canary
kit also runs once more, at the cell's first seed, on a canary-augmented dataset (:mod:`privaudit.canary`: randomized
canaries, one run, Steinke et al. NeurIPS 2023); its run entry holds ``canary_audit``:
``{"epsilon_lb", "epsilon", "delta", "neighbour", "canaries", "guesses", "correct",
"confidence", "rounds_observed", "seconds"}`` (the one-run lower bound beside the accounted
epsilon) or ``{"error"}``. One run per cell, not one per seed: the largest of several 95 % lower
bounds would hold at less than 95 %.
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
from privaudit.defenses.base import Defense
from privaudit.errors import PrivauditError
from privaudit.results import audit_matrix as build_matrix
from privaudit.results import audit_series as pair_series
from privaudit.runner import scheduler_context

AUDIT_JSON = "audit.json"
AUDIT_HTML = "audit.html"
DEFAULT_AUDIT_SEEDS = 2
HONEST = "honest-but-curious"
MALICIOUS = "malicious"
#: values of :attr:`Audit.threat`
THREATS = (HONEST, MALICIOUS, "both")
#: how a verdict names a deviation (keys of :data:`privaudit.attacks.malicious_fedncf.DEVIATIONS`),
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

    @property
    def group_key(self) -> tuple[int, str]:
        """Runs of one seed and server plan share their undefended protocol run (:func:`_is_undefended`)."""
        return self.seed, repr(sorted(self.plan.items()))


def _is_undefended(cls: type | None, params: Mapping[str, Any]) -> bool:
    """A noise defense at scale 0 is the undefended run (the convention of noise sweeps): it
    returns every upload unchanged and draws nothing, so only the public config differs."""
    return cls is not None and getattr(cls, "strength", None) == "scale" and params.get("scale") == 0


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
    task = runner.Task(run.protocol_cls, run.config, specs, object, run.seed)
    out: dict[str, Any] = {
        "defense": run.defense_name,
        "value": run.value,
        "seed": run.seed,
        "threat": run.threat,
    }
    if run.plan:
        out["plan"] = dict(run.plan)
    task.names = [run.protocol_name, "", run.defense_name or ""]  # resolved in the main process
    for attack_name, attack_cls in run.attacks:
        if not getattr(attack_cls, "name", ""):
            attack_cls.name = attack_name  # a class re-imported in a worker process
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
    out["protocol_seconds"] = protocol_seconds
    privacy = runner.defense_privacy(defenses, result.transcript)
    if privacy and run.defense_name:
        # keyed by the registered name (a class's own ``name`` may be unset in a worker process)
        privacy = {run.defense_name: next(iter(privacy.values()))}
        out["privacy"] = privacy
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
            params = dict(getattr(attack_cls, "audit_params", {}) or {})
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
        Restrict to these names (default: every applicable one).
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


def _selected_defenses(audit: Audit, protocol: str) -> tuple[list[type], list[tuple[str, str]]]:
    """The defenses an audit sweeps (every grid value validated) and the skipped ones with why."""
    defenses, skipped = applicable_defenses(
        protocol, include_hiding=audit.defenses is not None, selected=tuple(audit.defenses or ())
    )
    if audit.defenses is not None:
        for name in audit.defenses:
            registry.get("defense", name)
        wanted = set(audit.defenses)
        missing = sorted(wanted - {d.name for d in defenses})
        if missing:
            raise PrivauditError(f"defense(s) {', '.join(missing)} cannot be swept on {protocol!r}")
        skipped += [(d.name, "not selected") for d in defenses if d.name not in wanted]
        defenses = [d for d in defenses if d.name in wanted]
    for cls in defenses:
        for value in defense_grid(cls):
            cls(**_defense_params(cls, value))  # validates
    return defenses, skipped


def _plan(audit: Audit) -> tuple[list[_Run], dict[str, Any]]:
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
    for plan, named in plans.values():
        try:
            planned = protocol_cls.resolve_config({**dict(audit.sets), **plan})
        except PrivauditError as exc:
            names = ", ".join(n for n, _ in named)
            raise PrivauditError(f"the malicious server's plan of {names} ({_plan_text(plan)}): {exc}") from None
        # one target per malicious run: at least MIN_VERDICT_VICTIMS seeds (the fewest victims a
        # verdict is decided from), the honest runs' seeds first
        more = list(range(seeds[0], seeds[0] + max(len(seeds), rs.MIN_VERDICT_VICTIMS)))
        runs += _runs(protocol_cls, planned, defenses, more, named, audit.canaries, plan)
    return runs, _header(audit, protocol_cls, config, seeds, attacks, defenses, skipped)


def _header(
    audit: Audit,
    protocol_cls: type,
    config: dict[str, Any],
    seeds: list[int],
    attacks: list[type],
    defenses: list[type],
    skipped: list[tuple[str, str]],
) -> dict[str, Any]:
    """The audit dict's header: protocol, config, seeds, the attacks and defenses it runs."""
    return {
        "privaudit_version": __version__,
        "protocol": protocol_cls.name,
        "protocol_config": config,
        "seeds": seeds,
        "attacks": [_attack_entry(a) for a in attacks],
        "defenses": [
            {
                "name": d.name,
                "description": registry.describe(d),
                "strength": d.strength,
                "grid": list(defense_grid(d)),
                "params": dict(d.params),
            }
            for d in defenses
        ],
        "skipped_defenses": [{"name": n, "reason": r} for n, r in skipped],
        "threat": audit.threat,
        "utility_metric_declared": protocol_cls.main_utility,
        "utility_specs": {k: rs.spec_to_dict(s) for k, s in protocol_cls.utility_specs.items()},
        "_attack_classes": {a.name: a for a in attacks},
    }


def _attack_entry(a: type) -> dict[str, Any]:
    entry = {
        "name": a.name,
        "description": registry.describe(a),
        "party": getattr(a, "party", "server"),
        "requires": list(getattr(a, "requires", ()) or ()),
        "primary_metric": getattr(a, "primary_metric", "accuracy"),
        "audit_params": dict(getattr(a, "audit_params", {}) or {}),
        "threat": attack_threat(a),
    }
    if attack_threat(a) == MALICIOUS:
        entry.update(plan=attack_plan(a), deviations=list(a.deviations), deviation=deviation_noun(a))
    return entry


def _plan_text(plan: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in plan.items())


def _runs(
    protocol_cls: type,
    config: dict[str, Any],
    defenses: list[type],
    seeds: list[int],
    named: list[tuple[str, type]],
    canaries: int | None,
    plan: dict[str, Any] | None,
) -> list[_Run]:
    """The runs of one server: honest (``plan`` None: undefended and every grid value) or
    malicious (undefended and each defense's strongest value, with ``plan`` set)."""
    threat = HONEST if plan is None else MALICIOUS
    extra = {"threat": threat, "plan": dict(plan or {})}
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
    for d_index, cls in enumerate(defenses, start=1):
        grid = list(enumerate(defense_grid(cls)))
        for v_index, value in grid if plan is None else grid[-1:]:
            for seed in seeds:
                runs.append(
                    _Run(
                        protocol_cls,
                        config,
                        d_index,
                        cls,
                        _defense_params(cls, value),
                        v_index,
                        value,
                        seed,
                        named,
                        cls.name,
                        protocol_cls.name,
                        own if seed == seeds[0] else 0,  # one canary run per cell: its own 95 % bound
                        **extra,
                    )
                )
    return runs


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


def run_audit(audit: Audit, dataset: Any = None) -> dict[str, Any]:
    """Run ``audit`` -> the ``audit.json`` dict."""
    runs, header = _plan(audit)
    t0 = time.perf_counter()
    source = audit.data if isinstance(audit.data, str) else str(audit.data)
    if dataset is None:
        dataset = runner.load_data(audit.data)
    else:
        source = getattr(dataset, "name", "dataset")
    dataset = runner.subsample_users(dataset, audit.users, audit.seed)
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
            if _is_undefended(r.defense_cls, r.defense_params) and r.group_key in first:
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
    classes = out.pop("_attack_classes")
    declared_utility = out.pop("utility_metric_declared")
    out["dataset"] = dict(dataset.summary(), source=source)
    if audit.users is not None:
        out["dataset"]["subsampled_users"] = int(audit.users)
    out["runs"] = results
    for a in out["attacks"]:
        names = rs.ordered_keys(
            [r["attacks"][a["name"]] for r in results if a["name"] in r.get("attacks", {})], "attack_metrics"
        )
        a["metric_specs"] = rs.declared_specs(classes[a["name"]], names or [a["primary_metric"]])
    if declared_utility:
        out["utility_metric"] = declared_utility
    out["utility_metric"] = rs.audit_utility(out)
    _pool_targets(out)
    _mark_applicability(out)
    decide(out)
    out["timing"] = {
        "total_seconds": time.perf_counter() - t0,
        "load_seconds": load_seconds,
        "run_seconds": run_seconds,
        "runs": len(runs),
        "backend": backend or (f"joblib ({audit.jobs} jobs)" if int(audit.jobs) != 1 else "sequential"),
    }
    return out


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


def decide(out: dict[str, Any]) -> None:
    """The matrix, the per-attack verdicts and the threat verdicts of an audit dict (in place),
    each cell and verdict with the ``threat`` of its attack."""
    out["matrix"] = build_matrix(out)
    out["verdicts"] = rs.audit_verdicts(out)
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
    leaking = [a for a in applying if verdicts.get(a["name"]) == "leaks"]
    if leaking:
        names = [_deviation_text(out, a, defense, value) if threat == MALICIOUS else a["name"] for a in leaking]
        stopped = [f"{n} ({v})" for n, v in sorted(verdicts.items()) if v in ("protected", "not applicable")]
        return f"leaks to {server} ({'; '.join(names)})" + (f"; stopped: {', '.join(stopped)}" if stopped else "")
    if verdicts and all(v in ("protected", "not applicable") for v in verdicts.values()):
        na = all(v == "not applicable" for v in verdicts.values())
        return f"protected against {server}" + (" (no attack applies under it)" if na and defense else "")
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
    return Path("privaudit-report") / f"{protocol}-audit"


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

"""Conformance checks for protocol, attack and defense classes, built-in or plugin.

In the spirit of scikit-learn's ``check_estimator``: a plugin author calls them from a test, and
each raises :class:`ConformanceError` (an ``AssertionError``) naming the class, the check and
what is wrong, at the first check a class fails::

    from privaudit import testing

    def test_my_plugin():
        testing.check_protocol(MyProtocol)
        testing.check_attack(MyAttack, protocol=MyProtocol)
        testing.check_defense(MyDefense, protocol=MyProtocol)

What is checked
---------------
Every class: it is registered (``registry.name_of``), its declared parameters (:class:`Param`)
each have a help text and their defaults resolve.

:func:`check_protocol`: a run on a small synthetic dataset gives a transcript labelled with the
protocol's name, valid against its schema (:func:`privaudit.schema.validate`) and equal after a
round trip through a ``.ptx`` file (read back through the same validation); finite utility
numbers, the declared ``main_utility`` among them; ``release_count`` a non-negative int or None.
A protocol that declares its clients in blocks (``block_round``, for sharded runs), on a config
its block round accepts: ``upload_kinds`` are client uploads its schema declares, what a sharded
run sends its workers (the round's settings, a block) pickles, and its run in blocks of 7 clients
in this process (:class:`~privaudit.protocols.base.LocalBlocks`) is valid against its schema with
one ``private`` message per client.

:func:`check_attack`: its ``metric_specs`` declare ``primary_metric``; on a run of ``protocol``
(or a given ``transcript``) the attack evaluated on the transcript read back from a file gives
the same metrics as in memory; the uniform-random and the prior-only baselines give the primary metric
(the prior-only one no metric score does not); a victim table (:meth:`Attack.victim_table`), when given, reproduces
the metrics and the prior-only values (ratio of sums) and is required unless
``victim_table=False`` (without one every verdict reads "inconclusive"); decision scores are finite; and the null calibration smoke test: on the same transcript with the victims'
private data deranged among them (their uploads then carry no information about the truth they
are scored against), the primary metric's advantage over the stronger of the two
message-free guesses has no lower bound above 0, i.e. would not read "leaks".

:func:`check_defense`: a strength that is a declared parameter with a default grid it accepts;
capabilities and a :class:`~privaudit.schema.DefenseSchema` declared; ``privacy_spent`` (when
implemented) gives ``epsilon``, ``delta`` and ``unit``; a run of ``protocol`` with the defense
(every ``default_grid`` value, or the defaults) gives a transcript that lists it and is valid
against the protocol's schema composed with the defense's declaration, in memory and after a
file round trip.

The runs are small (``DATASET``: 40 users, 60 items) so that a suite of checks stays fast.
"""

from __future__ import annotations

import math
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import registry, schema
from privaudit.errors import PrivauditError

__all__ = ["DATASET", "ConformanceError", "check_attack", "check_defense", "check_protocol", "null_transcript"]

#: the synthetic dataset the checks run protocols on (arguments of :func:`privaudit.data.synthetic`)
DATASET: dict[str, Any] = {"n_users": 40, "n_items": 60, "min_ratings": 6, "density": 0.15, "seed": 0}
#: one-sided normal quantile of the null smoke test (5 %)
NULL_Z = 1.645
#: relative tolerance of a victim table's ratios against the reported metrics
TABLE_RTOL = 1e-9


class ConformanceError(AssertionError):
    """A class fails a conformance check (the message names the class and the check)."""


def _fail(cls: Any, check: str, text: str) -> ConformanceError:
    return ConformanceError(f"{getattr(cls, '__name__', cls)} ({check}): {text}")


def _need(ok: bool, cls: Any, check: str, text: str) -> None:
    if not ok:
        raise _fail(cls, check, text)


def _registered(cls: type, kind: str) -> str:
    name = registry.name_of(cls)
    _need(
        bool(name) and registry.available(kind).get(name) is cls,
        cls,
        "registered",
        f"not registered as a {kind} (registry.register_{kind}(name) or an entry point)",
    )
    return name


def _check_parameters(cls: type) -> None:
    from privaudit.params import Param, declared_of

    declared = declared_of(cls)
    for p in getattr(cls, "parameters", ()):
        _need(isinstance(p, Param), cls, "parameters", f"{p!r} is not a Param")
        _need(bool(p.help and p.help.strip()), cls, "parameters", f"parameter {p.name!r} has no help text")
    _need(len(declared) == len(getattr(cls, "parameters", ())), cls, "parameters", "a parameter name is declared twice")


def _dataset(dataset: Any) -> Any:
    from privaudit.data import synthetic

    return synthetic(**DATASET) if dataset is None else dataset


def _protocol_cls(protocol: Any) -> type:
    return registry.get("protocol", protocol) if isinstance(protocol, str) else protocol


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return bool(a == b)


def round_trip(transcript: Any) -> Any:
    """``transcript`` written to a ``.ptx`` file and read back through the schema check
    (:func:`privaudit.transcript.load_validated`)."""
    from privaudit.transcript import load_validated

    with tempfile.TemporaryDirectory(prefix="privaudit-check-") as folder:
        path = Path(folder) / "run.ptx"
        transcript.save(path)
        return load_validated(path)


def _check_round_trip(cls: type, transcript: Any) -> Any:
    try:
        back = round_trip(transcript)
    except PrivauditError as exc:
        raise _fail(cls, "file round trip", f"the transcript read back is refused: {exc}") from None
    _need(back.protocol == transcript.protocol, cls, "file round trip", "protocol label changed")
    _need(len(back.messages) == len(transcript.messages), cls, "file round trip", "message count changed")
    for a, b in zip(transcript.messages, back.messages):
        same = (a.round, a.sender, a.receiver, a.kind) == (b.round, b.sender, b.receiver, b.kind)
        same = same and set(a.payload) == set(b.payload)
        same = same and all(_same(a.payload[k], b.payload[k]) for k in a.payload)
        _need(same, cls, "file round trip", f"message {a.seq} ({a.kind!r} from {a.sender!r}) differs when read back")
    return back


def _validate(cls: type, transcript: Any, check: str) -> None:
    try:
        schema.validate(transcript)
    except PrivauditError as exc:
        raise _fail(cls, check, str(exc)) from None


def _run(protocol_cls: type, dataset: Any, config: Mapping[str, Any] | None, defenses: list, seed: int) -> Any:
    return protocol_cls().run(_dataset(dataset), dict(config or {}), defenses, seed)


def check_protocol(
    cls: type,
    *,
    dataset: Any = None,
    config: Mapping[str, Any] | None = None,
    defenses: list | None = None,
    seed: int = 0,
) -> Any:
    """Check a :class:`~privaudit.protocols.base.Protocol` subclass (see the module docstring);
    returns the transcript of its run. ``config`` overrides its defaults (keep runs small);
    ``defenses`` (instances) for a protocol that always runs some (PrivMVMF: a short test key)."""
    from privaudit.protocols.base import Protocol

    _need(isinstance(cls, type) and issubclass(cls, Protocol), cls, "interface", "not a Protocol subclass")
    name = _registered(cls, "protocol")
    _check_parameters(cls)
    try:
        resolved = cls.resolve_config(config)
    except PrivauditError as exc:
        raise _fail(cls, "parameters", f"the defaults (with the given config) do not resolve: {exc}") from None
    count = cls.release_count(resolved)
    _need(
        count is None or (isinstance(count, int) and not isinstance(count, bool) and count >= 0),
        cls,
        "release count",
        f"release_count returned {count!r} (a non-negative int or None)",
    )
    if not defenses:  # a run in blocks has none
        _check_blocks(cls, resolved, dataset, seed)
    result = _run(cls, dataset, config, list(defenses or []), seed)
    t = result.transcript
    _need(t.protocol == name, cls, "transcript", f"labelled {t.protocol!r}, registered as {name!r}")
    _need(isinstance(cls.schema_for(t), schema.ProtocolSchema), cls, "schema", "declares no ProtocolSchema (schema)")
    _validate(cls, t, "schema")
    _check_round_trip(cls, t)
    for key, value in result.utility.items():
        _need(isinstance(value, (int, float)) and not isinstance(value, bool), cls, "utility", f"{key!r} not a number")
    if cls.main_utility is not None:
        _need(cls.main_utility in result.utility, cls, "utility", f"main_utility {cls.main_utility!r} not reported")
        _need(math.isfinite(float(result.utility[cls.main_utility])), cls, "utility", "main utility is not finite")
    return t


def _check_blocks(cls: type, config: Mapping[str, Any], dataset: Any, seed: int) -> None:
    """The block round of a protocol that declares one (module docstring); none: nothing."""
    from privaudit.protocols.base import BlockRound, LocalBlocks, RunSetup

    rounds = cls.block_round
    if rounds is None:
        return
    _need(isinstance(rounds, type) and issubclass(rounds, BlockRound), cls, "block round", "not a BlockRound subclass")
    try:
        rounds.check(config)
    except PrivauditError:
        return  # this config does not run in blocks (its refusal is the declared one)
    declared = {m.kind for m in cls.schema.messages if m.upload and m.sender == "client"} if cls.schema else set()
    kinds = tuple(rounds.upload_kinds)
    _need(
        bool(kinds) and set(kinds) <= declared,
        cls,
        "block round",
        f"upload_kinds {kinds} must be client uploads the schema declares ({', '.join(sorted(declared))})",
    )
    run = rounds.open(cls(), RunSetup(dict(config), _dataset(dataset), [], seed))
    try:
        pickle.dumps((run.rounds, run.block(0, 0, min(7, run.n_clients))))
    except Exception as exc:  # whatever the pickler raises, the class is at fault
        raise _fail(cls, "block round", f"what a sharded run sends its workers does not pickle ({exc})") from None
    t = run.train(LocalBlocks(run, 7)).transcript
    _validate(cls, t, "block round")
    private = [m.sender for m in t.messages if m.kind == "private"]
    _need(
        private == [f"client:{u}" for u in range(run.n_clients)],
        cls,
        "block round",
        f"expected one private message per client in client order ({run.n_clients}), got {len(private)}",
    )


def null_transcript(transcript: Any, seed: int = 0) -> Any:
    """A copy of ``transcript`` whose clients' ``private`` messages are deranged among them
    (every client gets another client's private data; the uploads are kept): the uploads then
    carry no information about the truth each victim is scored against."""
    from privaudit.transcript import Transcript, is_client

    owners = [m.sender for m in transcript.messages if m.kind == "private" and is_client(m.sender)]
    clients = list(dict.fromkeys(owners))
    if len(clients) < 2:
        return transcript
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(clients))
    shift = {clients[order[i]]: clients[order[(i + 1) % len(clients)]] for i in range(len(clients))}
    out = Transcript(
        transcript.protocol,
        dict(transcript.config),
        transcript.seed,
        dict(transcript.dataset),
        list(transcript.parties),
    )
    for m in transcript.messages:
        if m.kind == "private" and m.sender in shift:
            continue
        out.add(m.round, m.sender, m.receiver, m.kind, m.payload, m.meta)
    for m in transcript.messages:
        if m.kind == "private" and m.sender in shift:
            new = shift[m.sender]  # m.sender's data becomes new's
            out.add(m.round, new, new, m.kind, m.payload, m.meta)
    return out


def _advantage_bound(cls: type, outcome: Any) -> tuple[float, float] | None:
    """(advantage of the primary metric over the stronger message-free guess, its one-sided
    lower bound), in the direction of a more successful attack; None without an interval."""
    from privaudit.results import point_bootstrap

    metric = cls.primary_metric
    spec = cls.metric_specs.get(metric)
    sign = 1.0 if spec is None or spec.higher_is_better else -1.0
    value = float(outcome.metrics.get(metric, math.nan))
    guesses = [float(g[metric]) for g in (outcome.baseline, outcome.baseline_prior) if metric in (g or {})]
    guesses = [g for g in guesses if math.isfinite(g)]
    if not math.isfinite(value) or not guesses:
        return None
    best = max(sign * g for g in guesses)
    adv = sign * value - best
    boot = point_bootstrap(outcome.metrics, outcome.victims, outcome.decisions).get(metric)
    if not boot or boot.get("se") is None:
        return None
    se = boot["se_vs_prior"] if boot.get("se_vs_prior") is not None else boot["se"]
    return adv, adv - NULL_Z * float(se)


def check_attack(
    cls: type,
    *,
    protocol: Any = None,
    transcript: Any = None,
    dataset: Any = None,
    config: Mapping[str, Any] | None = None,
    defenses: list | None = None,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
    null: bool = True,
    victim_table: bool = True,
) -> Any:
    """Check an :class:`~privaudit.attacks.base.Attack` subclass against a run of ``protocol``
    (a class or registered name; ``config``/``defenses`` for that run) or against a given
    ``transcript``; returns the attack's outcome on it. ``null=False`` skips the null
    calibration smoke test (for attacks whose truth is not in per-client ``private`` messages);
    ``victim_table=False`` accepts an attack without per-victim scores (its verdicts then read
    "inconclusive")."""
    import inspect

    from privaudit.attacks.base import Attack
    from privaudit.results import Decisions, MetricSpec

    _need(isinstance(cls, type) and issubclass(cls, Attack), cls, "interface", "not an Attack subclass")
    _need(not inspect.isabstract(cls), cls, "interface", "abstract methods left unimplemented")
    _registered(cls, "attack")
    _check_parameters(cls)
    _need(
        all(isinstance(s, MetricSpec) for s in cls.metric_specs.values()) and cls.primary_metric in cls.metric_specs,
        cls,
        "metric specs",
        f"metric_specs must declare primary_metric {cls.primary_metric!r} as a MetricSpec",
    )
    if transcript is None:
        _need(protocol is not None, cls, "setup", "give a protocol or a transcript")
        transcript = _run(_protocol_cls(protocol), dataset, config, list(defenses or []), seed).transcript
    _validate(cls, transcript, "transcript")
    back = _check_round_trip(cls, transcript)
    attack = cls(**dict(params or {}))
    outcome = attack.evaluate(transcript, np.random.default_rng(seed))
    again = cls(**dict(params or {})).evaluate(back, np.random.default_rng(seed))
    _need(
        set(outcome.metrics) == set(again.metrics)
        and all(_same(float(outcome.metrics[k]), float(again.metrics[k])) for k in outcome.metrics),
        cls,
        "file round trip",
        "the metrics on the transcript read back from a file differ from those in memory",
    )
    recon = outcome.reconstruction
    _need(recon.supported, cls, "applies", f"the attack does not apply to this run: {recon.reason}")
    _need(cls.primary_metric in outcome.metrics, cls, "metrics", f"score lacks {cls.primary_metric!r}")
    primary = cls.primary_metric
    _need(primary in outcome.baseline, cls, "baseline", f"the random-guess baseline lacks {primary!r}")
    _need(
        primary in (outcome.baseline_prior or {}) and set(outcome.baseline_prior) <= set(outcome.metrics),
        cls,
        "prior-only baseline",
        f"prior_baseline must return {primary!r} and only metrics score returns",
    )
    _need(
        outcome.victims is not None or not victim_table,
        cls,
        "victim table",
        "victim_table returned None, so every verdict on this attack reads 'inconclusive (no per-victim scores)'",
    )
    _check_victim_table(cls, outcome)
    for key, d in (outcome.decisions or {}).items():
        _need(isinstance(d, Decisions), cls, "decisions", f"{key!r} is not a Decisions")
        _need(bool(np.isfinite(d.scores).all()), cls, "decisions", f"{key!r} holds non-finite scores")
    if null:
        _check_null(cls, transcript, params, seed)
    return outcome


def _check_victim_table(cls: type, outcome: Any) -> None:
    """The victim table, when given, reproduces the metrics and the prior-only values (ratio of sums)."""
    from privaudit.results import VictimTable

    table = outcome.victims
    if table is None:
        return
    _need(isinstance(table, VictimTable), cls, "victim table", "victim_table must return a VictimTable")
    for m in [*table.attack, *table.harmonic]:
        for which, ref in (("attack", outcome.metrics), ("prior", outcome.baseline_prior)):
            if which == "prior" and not all(p in table.prior for p in table.harmonic.get(m, (m,))):
                continue
            got, want = table.value(m, which), float(ref.get(m, math.nan))
            ok = (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=TABLE_RTOL, abs_tol=1e-12)
            _need(ok, cls, "victim table", f"{which} {m!r}: table gives {got!r}, the reported value is {want!r}")


def _check_null(cls: type, transcript: Any, params: Mapping[str, Any] | None, seed: int) -> None:
    """The null calibration smoke test (module docstring)."""
    outcome = cls(**dict(params or {})).evaluate(null_transcript(transcript, seed), np.random.default_rng(seed))
    bound = _advantage_bound(cls, outcome) if outcome.reconstruction.supported else None
    _need(
        bound is None or bound[1] <= 0,
        cls,
        "null calibration",
        f"on a view without information about the victims the advantage of {cls.primary_metric!r} is "
        f"{bound[0] if bound else 0:.4g} with lower bound {bound[1] if bound else 0:.4g} > 0 (would read 'leaks')",
    )


def check_defense(
    cls: type,
    *,
    protocol: Any,
    dataset: Any = None,
    config: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    grid: bool = True,
    seed: int = 0,
) -> Any:
    """Check a :class:`~privaudit.defenses.base.Defense` subclass on runs of ``protocol`` (a
    class or registered name; ``config`` for its runs): one run per ``default_grid`` value of
    its strength (``grid=False``: one run with ``params``); returns the last transcript."""
    from privaudit.defenses.base import CAPABILITIES, Defense

    _need(isinstance(cls, type) and issubclass(cls, Defense), cls, "interface", "not a Defense subclass")
    name = _registered(cls, "defense")
    _check_parameters(cls)
    _need(set(cls.capabilities) <= set(CAPABILITIES), cls, "capabilities", "unknown capability")
    _need(
        isinstance(cls.schema_contribution, schema.DefenseSchema),
        cls,
        "schema contribution",
        "schema_contribution must be a privaudit.schema.DefenseSchema",
    )
    values: list[dict[str, Any]] = [dict(params or {})]
    if cls.strength is not None:
        _need(cls.strength in cls.declared, cls, "strength", f"strength {cls.strength!r} is not a declared parameter")
        if grid and cls.default_grid:
            values = [{**dict(params or {}), cls.strength: v} for v in cls.default_grid]
    protocol_cls = _protocol_cls(protocol)
    transcript = None
    for p in values:
        try:
            defense = cls(**p)
        except PrivauditError as exc:
            raise _fail(cls, "strength", f"default grid value {p} refused: {exc}") from None
        if type(defense).privacy_spent is not Defense.privacy_spent:
            spent = defense.privacy_spent(2)
            _need(
                spent is None or {"epsilon", "delta", "unit"} <= set(spent),
                cls,
                "privacy claim",
                "privacy_spent must give epsilon, delta and unit",
            )
        transcript = _run(protocol_cls, dataset, config, [defense], seed).transcript
        listed = [d.get("name") if isinstance(d, Mapping) else d for d in transcript.config.get("defenses", [])]
        _need(name in listed, cls, "transcript", f"the run's public config does not list {name!r}")
        _validate(cls, transcript, "schema")
        _check_round_trip(cls, transcript)
    return transcript

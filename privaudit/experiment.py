"""Experiments: protocol x swept parameter x seeds -> attack metrics, baselines, utility.

An :class:`Experiment` names a protocol, an attack, the active defenses and at most one swept
parameter (:class:`Sweep`): a defense parameter (``laplace.scale``), an attack parameter
(``attack.aux_fraction``) or a protocol config key (``protocol.K``). For every swept value and
every seed it

1. builds the defenses (with the swept value where the sweep targets a defense),
2. runs the protocol, ``Protocol().run(dataset, config, defenses, rng)``,
3. runs ``attack.evaluate(transcript, rng)`` on the attacker's view and records the attack
   metrics, the baselines, the protocol's utility metrics (and the main one's per-user
   contributions, ``utility_users``: the paired bootstrap of a defense's utility cost) and the
   seconds taken,

and returns the results as a :class:`~privaudit.api.Results`: the JSON-able dict of the
``results.json`` schema (documented in ``docs/results-schema.md``; :func:`assemble` builds it)
with typed attributes (:mod:`privaudit.results.typed`). NaN metrics are kept as ``float('nan')``
here and written as ``null`` by :func:`privaudit.reports.write_report`. The results hold names,
never classes: what needs the attack class looks its name up in the registry.

Names are looked up once: :func:`build_experiment` takes objects (names, classes, instances,
``{"name": ..., **params}``; the command line parses its ``NAME:k=v`` strings into those) and
gives an :class:`Experiment`, :func:`privaudit.plan.resolve` turns it into a :class:`~privaudit.plan.Plan`
(classes, validated parameters, grid, seeds, backend) and :func:`run_plan` executes the plan
through :mod:`privaudit.runner` without consulting the registry again.

Randomness and determinism
--------------------------
The protocol of point (seed ``s``, value index ``i``) is run with the integer seed ``s`` —
the same for every swept value (common random numbers: one seed keeps the data split, the
initial model and the noise draws fixed while the strength varies, which is what protocols
such as ``fedmvmf`` expect from a noise sweep). The attack draws from
``numpy.random.SeedSequence([s, i]).spawn(2)[1]`` (:func:`point_streams`). Results therefore
depend on neither ``jobs`` nor the order points finish in. An attack sweep runs the protocol
once per seed and attacks its transcript once per value. The transcript of a point records
``seed = s``; :func:`attack_transcript` uses the attack stream of point ``(seed, 0)``, so a
transcript written by ``privaudit run --seed s`` and attacked from the file scores exactly
like the in-memory run of ``privaudit attack --seed s`` without a sweep. ``--users N``
subsamples the dataset once per experiment, seeded by the base seed (:func:`subsample_users`),
so every point sees the same users.

(Departure from a per-point protocol stream derived from ``(s, i)``: that would re-draw the
split and initial model at every noise scale and blur the accuracy-vs-noise curve.)

Parallelism (:func:`privaudit.runner.parallel_map`): points run in parallel with joblib
(``jobs``); with a single point (or ``jobs=1``) the points run in this process and an attack that declares a ``jobs`` parameter
gets the experiment's ``jobs`` for its per-user work instead. Progress is shown with tqdm on
a terminal and nothing is printed when stderr is not a TTY.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import __version__, registry
from privaudit import results as rs
from privaudit.api import Results
from privaudit.errors import PrivauditError
from privaudit.plan import (
    DEFAULT_SEEDS,
    Plan,
    Sweep,
    parse_sweep,
    plan_to_toml,
    resolve,
)
from privaudit.results import accuracy_metrics, main_utility, summarize_points
from privaudit.runner import (
    Task,
    default_jobs,
    defense_privacy,
    evaluate_attack,
    load_data,
    parallel_map,
    point_streams,
    run_protocol,
    scheduler_context,
    subsample_users,
)
from privaudit.schema import validate as validate_transcript

#: Attack parameters through which an experiment hands its ``jobs`` to per-user attack work.
_JOBS_PARAMS = ("jobs", "n_jobs")

__all__ = [
    "DEFAULT_SEEDS",
    "default_jobs",
    "Sweep",
    "Experiment",
    "build_experiment",
    "run_experiment",
    "run_plan",
    "attack_transcript",
    "run_transcript",
    "load_data",
    "subsample_users",
    "point_streams",
    "component",
    "summarize_points",
    "accuracy_metrics",
    "main_utility",
]


# ------------------------------------------------------------------------------ experiment


@dataclass
class Experiment:
    """A sweep of one parameter over seeds, by names (see the module docstring).

    Parameters
    ----------
    protocol : str
        Registered protocol name.
    attack : str | None
        Registered attack name; None -> the protocol's ``default_attack``.
    attack_params : dict
        Attack parameter overrides (strings are coerced).
    defenses : list of (name, params)
        Active defenses in upload order.
    sweep : Sweep | None
        None -> the attack's ``default_sweep``, else the first defense's strength grid when
        that strength was not set explicitly, else a single point (``value`` None).
    protocol_config : dict
        Protocol config overrides (``--set``).
    data : str | Path | RatingsDataset
        ``"synthetic"`` (default), a path, or a dataset object.
    users : int | None
        Subsample this many users (seeded by ``seed``).
    seeds : int
        Seeds ``seed .. seed + seeds - 1``.
    seed : int
        Base seed.
    jobs : int
        Parallel points (joblib; -1 = all cores).
    noise : bool
        The sweep is a noise-scale sweep (figures named ``accuracy_vs_noise``).
    progress : bool | None
        tqdm progress bar; None -> only when stderr is a terminal.
    scheduler : str | None
        Run the points on Dask (a scheduler address or ``local:N``) through joblib's Dask
        backend (:func:`privaudit.runner.scheduler_context`); same numbers as locally.
    """

    protocol: str
    attack: str | None = None
    attack_params: dict[str, Any] = field(default_factory=dict)
    defenses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sweep: Sweep | None = None
    protocol_config: dict[str, Any] = field(default_factory=dict)
    data: Any = "synthetic"
    users: int | None = None
    seeds: int = 1
    seed: int = 0
    jobs: int = 1
    noise: bool = False
    progress: bool | None = None
    scheduler: str | None = None

    def plan(self) -> Plan:
        """The resolved :class:`~privaudit.plan.Plan` (names looked up, parameters validated)."""
        return resolve(**self.__dict__)

    def run(self, dataset: Any = None) -> Results:
        """Run every point; the :class:`~privaudit.api.Results` (``results.json`` schema)."""
        return run_experiment(self, dataset=dataset)


#: What names an attack or a defense in the Python API: its registered name, its class, an
#: instance (its parameters are taken), or ``{"name": NAME, **params}``.
Component = Any


def component(value: Component, kind: str) -> tuple[str, dict[str, Any]]:
    """``(name, params)`` of an attack or defense given as a name, a registered class, an
    instance (its ``config``) or a ``{"name": ..., **params}`` mapping; one line otherwise."""
    if isinstance(value, str):
        return value, {}
    if isinstance(value, type):
        return str(getattr(value, "name", "") or value.__name__), {}
    if isinstance(value, Mapping):
        if not isinstance(value.get("name"), str):
            raise PrivauditError(f"{kind}: a mapping needs 'name' (got keys {', '.join(map(str, value)) or 'none'})")
        return value["name"], {k: v for k, v in value.items() if k != "name"}
    config = getattr(value, "config", None)
    if isinstance(getattr(value, "name", None), str) and isinstance(config, Mapping):
        return value.name, dict(config)
    raise PrivauditError(f"{kind}: expected a name, a class, an instance or {{'name': ...}}, got {value!r}")


def build_experiment(
    *,
    protocol: str | type,
    attack: Component | None = None,
    defenses: Sequence[Component] = (),
    sweep: Sweep | None = None,
    noise: Component | None = None,
    scales: Sequence[float] | None = None,
    protocol_config: Mapping[str, Any] | None = None,
    data: Any = "synthetic",
    users: int | None = None,
    seeds: int = 1,
    seed: int = 0,
    jobs: int = 1,
    progress: bool | None = None,
    scheduler: str | None = None,
) -> Experiment:
    """An :class:`Experiment` from objects (keyword arguments only).

    Parameters
    ----------
    protocol : str or Protocol subclass
    attack : name, Attack subclass or instance, ``{"name": ..., **params}``, optional
        Default: the protocol's ``default_attack``.
    defenses : sequence of the same forms (Defense), in upload order
    sweep : Sweep or str, optional
        ``privaudit.Sweep(target, param, values)``: target ``"attack"``, ``"protocol"`` or a
        defense name; or the CLI's text ``"laplace.scale=0,1"``.
    noise : a noise defense with a ``scale`` parameter, optional
        Shorthand for that defense swept over ``scales`` (floats; default its ``default_grid``),
        reported as a noise sweep; not combined with ``sweep``.
    protocol_config : mapping, optional
        Protocol parameter values.
    data, users, seeds, seed, jobs, progress, scheduler
        As :class:`Experiment`.
    """
    protocol_name = protocol if isinstance(protocol, str) else component(protocol, "protocol")[0]
    registry.get("protocol", protocol_name)
    attack_name, attack_params = component(attack, "attack") if attack is not None else (None, {})
    defense_list = [component(d, "defense") for d in defenses or ()]
    if isinstance(sweep, str):  # the CLI's --sweep text
        sweep = parse_sweep(sweep)
    if sweep is not None and not isinstance(sweep, Sweep):
        raise PrivauditError(
            f"sweep: expected privaudit.Sweep(target, param, values) or 'TARGET.PARAM=V1,V2,...', got {sweep!r}"
        )
    if scales is not None and noise is None:
        raise PrivauditError("scales need a noise defense (noise=...)")
    if noise is not None:
        if sweep is not None:
            raise PrivauditError("use either noise= or sweep=, not both")
        noise_name, noise_params = component(noise, "noise")
        cls = registry.get("defense", noise_name)
        if "scale" not in cls.declared:
            raise PrivauditError(f"--noise needs a noise defense with a 'scale' parameter; {noise_name!r} has none")
        values = tuple(cls.default_grid if scales is None else scales)
        if noise_name not in [name for name, _ in defense_list]:
            defense_list.append((noise_name, noise_params))
        sweep = Sweep(noise_name, "scale", values)
    return Experiment(
        protocol=protocol_name,
        attack=attack_name,
        attack_params=dict(attack_params),
        defenses=defense_list,
        sweep=sweep,
        protocol_config=dict(protocol_config or {}),
        data=data,
        users=users,
        seeds=seeds,
        seed=seed,
        jobs=jobs,
        noise=noise is not None,
        progress=progress,
        scheduler=scheduler,
    )


# ------------------------------------------------------------------------------ tasks


def _reference_needed(plan: Plan) -> bool:
    """An undefended reference run per seed is needed when the sweep varies a defense and no
    swept value is the undefended run (for a noise sweep, scale 0 is)."""
    if plan.swept_defense() is None:
        return False
    return not (plan.noise and any(v == 0 for v in plan.values))


def tasks_of(plan: Plan) -> list[Task]:
    """The protocol runs of ``plan`` (one per seed and value; one per seed for attack sweeps),
    then the undefended reference runs (value index -1) when :func:`_reference_needed`."""
    tasks: list[Task] = []
    shared: dict[int, Task] = {}  # attack sweeps: one protocol run per seed
    attack_sweep = plan.sweep is not None and plan.sweep.target == "attack"
    for index, value, config, attack_params, specs in plan.grid():
        for seed in plan.seeds:
            if attack_sweep:
                if seed not in shared:
                    shared[seed] = Task(plan.protocol_cls, config, specs, plan.attack_cls, seed)
                    tasks.append(shared[seed])
                shared[seed].variants.append((index, value, attack_params))
            else:
                tasks.append(
                    Task(plan.protocol_cls, config, specs, plan.attack_cls, seed, [(index, value, attack_params)])
                )
    if _reference_needed(plan):
        swept = plan.swept_defense()
        specs = [(cls, dict(params)) for cls, params in plan.defenses if cls is not swept]
        for seed in plan.seeds:
            tasks.append(
                Task(
                    plan.protocol_cls,
                    dict(plan.config),
                    specs,
                    plan.attack_cls,
                    seed,
                    [(-1, None, dict(plan.attack_params))],
                )
            )
    return tasks


def header_of(plan: Plan) -> dict[str, Any]:
    """The results keys fixed by the plan (before any run)."""
    return {
        "privaudit_version": __version__,
        "protocol": plan.protocol_cls.name,
        "protocol_config": dict(plan.config),
        "attack": plan.attack_cls.name,
        "attack_params": dict(plan.attack_params),
        "sweep": plan.sweep.label if plan.sweep is not None else None,
        "sweep_values": list(plan.values),
        "noise": plan.noise,
        "defenses": [{"name": cls.name, **params} for cls, params in plan.defenses],
        "defense_strengths": {
            cls.name: {
                "strength": cls.strength,
                "description": registry.describe(cls),
                "help": cls.param_help.get(cls.strength or "", ""),
            }
            for cls, _ in plan.defenses
        },
        "seeds": list(plan.seeds),
        "primary_metric": plan.attack_cls.primary_metric,
        "utility_metric_declared": plan.protocol_cls.main_utility,
        "utility_specs": {k: rs.spec_to_dict(s) for k, s in plan.protocol_cls.utility_specs.items()},
        "attack_description": registry.describe(plan.attack_cls),
    }


def _run_point(task: Task, dataset: Any, attack_jobs: int | None = None) -> list[dict[str, Any]]:
    """One protocol run and its attack variants -> their ``points`` entries."""
    result, defenses, protocol_seconds = run_protocol(task, dataset)
    privacy = defense_privacy(defenses, result.transcript)
    utility = rs.floats(result.utility)
    # the main utility's per-user contributions (compact): its cost's paired bootstrap over users
    main = main_utility({"points": [{"utility": utility}], "utility_metric": task.protocol_cls.main_utility})
    users = rs.stored_user_utility(getattr(result, "user_utility", None), main)
    points = []
    for index, value, attack_params in task.variants:
        params = dict(attack_params)
        if attack_jobs is not None:
            for key in _JOBS_PARAMS:
                if key in params and params[key] == task.attack_cls.params.get(key):
                    params[key] = attack_jobs
        _, attack_ss = point_streams(task.seed, max(index, 0))
        scored, attack_seconds = evaluate_attack(
            task.attack_cls, params, result.transcript, np.random.default_rng(attack_ss), privacy
        )
        share = protocol_seconds / len(task.variants)
        point = {
            "value": value,
            "seed": task.seed,
            **scored,
            "utility": dict(utility),
            **({"utility_users": users} if users else {}),
            "seconds": share + attack_seconds,
            "protocol_seconds": share,
            "attack_seconds": attack_seconds,
            "_index": index,
        }
        if privacy:
            point["privacy"] = privacy
        if index < 0:
            point["reference"] = True
        points.append(point)
    return points


def _in_order(points: list[dict]) -> list[dict]:
    """Points sorted by (value index, seed), the private index key dropped."""
    points = sorted(points, key=lambda p: (p["_index"], p["seed"]))
    for p in points:
        del p["_index"]
    return points


def run_plan(plan: Plan, dataset: Any = None) -> Results:
    """Execute a resolved plan (on ``dataset`` if given, else on ``plan.data``) -> its
    :class:`~privaudit.api.Results` (``plan_toml`` set: ``write_report`` writes the plan too)."""
    tasks, header = tasks_of(plan), header_of(plan)
    t0 = time.perf_counter()
    if dataset is None:
        dataset = load_data(plan.data)
    dataset = subsample_users(dataset, plan.users, plan.seed)
    desc = f"{header['protocol']} {header['sweep'] or ''}".strip()
    jobs = -1 if plan.scheduler else int(plan.jobs)
    parallel = jobs != 1 and len(tasks) > 1
    # run in this process: an attack with a jobs parameter gets the experiment's jobs instead
    attack_jobs = jobs if (not parallel and jobs != 1) else None
    with scheduler_context(plan.scheduler):
        chunks = parallel_map(
            _run_point,
            tasks,
            dataset,
            attack_jobs,
            jobs=jobs,
            progress=plan.progress,
            desc=desc,
            parallel=parallel,
            backend="active" if plan.scheduler else None,
        )
    points = _in_order([p for chunk in chunks for p in chunk])
    results = assemble(header, dataset.summary(), points, time.perf_counter() - t0, source=plan.data, users=plan.users)
    return Results(results, plan_toml=plan_to_toml(plan))


def run_experiment(experiment: Experiment, dataset: Any = None) -> Results:
    """Resolve and run ``experiment`` (on ``dataset`` if given, else on ``experiment.data``)."""
    return run_plan(experiment.plan(), dataset=dataset)


def assemble(
    header: dict,
    dataset_summary: dict,
    points: list[dict],
    seconds: float,
    *,
    source: Any = None,
    users: int | None = None,
) -> dict[str, Any]:
    """The results dict from the plan's header and the points (summaries, verdicts added); the
    wire format the typed :class:`~privaudit.api.Results` wraps. The attack's class (its threat
    and declared metric specs) is looked up by its name in the registry."""
    header = dict(header)
    attack_cls = registry.get("attack", header["attack"])
    declared_utility = header.pop("utility_metric_declared", None)
    dataset = dict(dataset_summary)
    if source is not None and "source" not in dataset:
        dataset["source"] = (
            source if isinstance(source, str) else (str(source) if isinstance(source, Path) else dataset.get("name"))
        )
    if users is not None:
        dataset["subsampled_users"] = int(users)
    reference = [p for p in points if p.get("reference")]
    points = [p for p in points if not p.get("reference")]
    if getattr(attack_cls, "threat", "") == "malicious":  # one target per run: pool the seeds' targets
        for group in (reference, *rs.group_by_value(points)[1].values()):
            rs.pool_targets([p for p in group if p.get("supported") and not p.get("bootstrap")])
    results = {
        "privaudit_version": header["privaudit_version"],
        "protocol": header["protocol"],
        "protocol_config": header["protocol_config"],
        "attack": header["attack"],
        "sweep": header["sweep"],
        "defenses": header["defenses"],
        "dataset": dataset,
        "points": points,
    }
    if reference:
        results["reference"] = reference
    results.update(
        {
            "attack_params": header.get("attack_params", {}),
            "attack_description": header.get("attack_description", ""),
            "sweep_values": header.get("sweep_values", [None]),
            "defense_strengths": header.get("defense_strengths", {}),
            "noise": header.get("noise", False),
            "seeds": header.get("seeds", []),
            "primary_metric": header.get("primary_metric"),
            "utility_specs": header.get("utility_specs", {}),
            "total_seconds": seconds,
        }
    )
    results["metric_specs"] = rs.declared_specs(attack_cls, rs.ordered_keys(points, "attack_metrics"))
    if declared_utility:
        results["utility_metric"] = declared_utility
    rs.add_advantages(results)
    results["summary"] = summarize_points(points)
    results["figure_metrics"] = accuracy_metrics(results)
    results["utility_metric"] = main_utility(results)
    results["verdicts"] = rs.experiment_verdicts(results)
    first = [
        "privaudit_version",
        "protocol",
        "protocol_config",
        "attack",
        "sweep",
        "defenses",
        "dataset",
        "points",
        "summary",
        "verdicts",
    ]
    return {**{k: results[k] for k in first}, **{k: v for k, v in results.items() if k not in first}}


# ------------------------------------------------------------------------------ transcripts


def run_transcript(
    *,
    protocol: str | type,
    defenses: Sequence[Component] = (),
    protocol_config: Mapping[str, Any] | None = None,
    data: Any = "synthetic",
    users: int | None = None,
    seed: int = 0,
    dataset: Any = None,
) -> Any:
    """Run ``protocol`` once, as point (``seed``, 0) of an experiment; the :class:`RunResult`.

    The arguments are those of :func:`build_experiment` (keyword only); ``dataset`` replaces
    ``data`` when given. ``privaudit run`` writes the transcript; attacking that file with
    :func:`attack_transcript` reproduces the in-memory scores of the same point.
    """
    exp = build_experiment(
        protocol=protocol,
        defenses=defenses,
        protocol_config=protocol_config,
        data=data,
        users=users,
        seeds=1,
        seed=seed,
        jobs=1,
    )
    plan = _run_plan_of(exp)
    if dataset is None:
        dataset = load_data(data)
    dataset = subsample_users(dataset, users, seed)
    task = Task(plan.protocol_cls, dict(plan.config), [(cls, dict(p)) for cls, p in plan.defenses], object, int(seed))
    result, _, _ = run_protocol(task, dataset)
    return result


def _run_plan_of(exp: Experiment) -> Plan:
    """The plan of a single protocol run: protocol, config, defenses and seed validated (the
    attack is not needed to run a protocol, so none is resolved)."""
    from privaudit.runner import check_run_settings

    check_run_settings(1, exp.seed, 1)
    protocol_cls = registry.get("protocol", exp.protocol)
    config = protocol_cls.resolve_config(exp.protocol_config)
    defenses = [registry.get("defense", name)(**params) for name, params in exp.defenses]
    protocol_cls.check_defenses(protocol_cls.name, defenses)
    return Plan(
        protocol_cls=protocol_cls,
        attack_cls=object,
        config=config,
        attack_params={},
        defenses=[(type(d), dict(d.config)) for d in defenses],
        sweep=None,
        seeds=[int(exp.seed)],
        data=exp.data,
        users=exp.users,
    )


def attack_transcript(
    transcript: Any,
    attack: Component | None = None,
    *,
    progress: bool | None = None,
    max_bytes: int | None = None,
) -> Results:
    """Attack one transcript (a :class:`~privaudit.transcript.Transcript` or a ``.ptx`` path)
    -> :class:`~privaudit.api.Results` with a single point (``"value": null``, no utility).

    The transcript is checked against its protocol's declared schema (:mod:`privaudit.schema`)
    before the attack sees it; ``max_bytes`` is the loading budget (default
    :data:`~privaudit.transcript.DEFAULT_MAX_BYTES`).

    ``attack`` is a name, an Attack class or instance, or ``{"name": ..., **params}``; default:
    the protocol's ``default_attack``. The attack's random stream is that of point
    (``transcript.seed``, 0) of an experiment.
    """
    from privaudit import transcript as tr
    from privaudit.plan import resolve_attack

    t0 = time.perf_counter()
    if isinstance(transcript, (str, Path)):
        path = Path(transcript)
        if not path.exists():
            raise PrivauditError(f"{path}: no such transcript file")
        transcript = tr.load(path, **({} if max_bytes is None else {"max_bytes": max_bytes}))
    protocol_cls = registry.get("protocol", transcript.protocol)
    validate_transcript(transcript)
    name, params = component(attack, "attack") if attack is not None else (None, {})
    attack_cls = resolve_attack(protocol_cls, name)
    attack_params = attack_cls(**params).config
    if not transcript.has_private:
        raise PrivauditError(
            "the transcript holds no private messages (saved with --no-private), so the attack cannot be scored"
        )
    seed = int(transcript.seed) if transcript.seed is not None else 0
    _, attack_ss = point_streams(max(seed, 0), 0)
    scored, seconds = evaluate_attack(attack_cls, attack_params, transcript, np.random.default_rng(attack_ss))
    point = {
        "value": None,
        "seed": transcript.seed,
        **scored,
        "utility": {},
        "seconds": seconds,
        "attack_seconds": seconds,
    }
    header = {
        "privaudit_version": __version__,
        "protocol": transcript.protocol,
        "protocol_config": dict(transcript.config),
        "attack": attack_cls.name,
        "attack_params": attack_params,
        "attack_description": registry.describe(attack_cls),
        "sweep": None,
        "sweep_values": [None],
        "noise": False,
        "defenses": list(transcript.config.get("defenses", []) or []),
        "seeds": [transcript.seed],
        "primary_metric": attack_cls.primary_metric,
        "utility_metric_declared": protocol_cls.main_utility,
        "utility_specs": {k: rs.spec_to_dict(s) for k, s in protocol_cls.utility_specs.items()},
    }
    results = assemble(header, dict(transcript.dataset), [point], time.perf_counter() - t0)
    results["transcript"] = True
    return Results(results)

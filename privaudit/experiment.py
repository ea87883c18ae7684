"""Experiments: protocol x swept parameter x seeds -> attack metrics, baselines, utility.

An :class:`Experiment` names a protocol, an attack, the active defenses and at most one swept
parameter (:class:`Sweep`): a defense parameter (``laplace.scale``), an attack parameter
(``attack.aux_fraction``) or a protocol config key (``protocol.K``). For every swept value and
every seed it

1. builds the defenses (with the swept value where the sweep targets a defense),
2. runs the protocol, ``Protocol().run(dataset, config, defenses, rng)``,
3. runs ``attack.evaluate(transcript, rng)`` on the attacker's view and records the attack
   metrics, the baselines, the protocol's utility metrics and the seconds taken,

and returns the results as the JSON-able dict of DESIGN.md ("Experiments and reports")::

    {"privaudit_version", "protocol", "protocol_config", "attack", "sweep", "defenses",
     "dataset", "points": [{"value", "seed", "attack_metrics", "baseline", "utility",
     "seconds"}], "summary": [{"value", "metric", "mean", "ci95"}]}

plus a few extra keys the reports use (``attack_params``, ``figure_metrics``,
``utility_metric``, ``noise``, ``seeds``). NaN metrics are kept as ``float('nan')`` here and
written as ``null`` by :func:`privaudit.reports.write_results`.

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

Parallelism: points run in parallel with joblib (``jobs``); with a single point (or
``jobs=1``) the points run in this process and an attack that declares a ``jobs`` parameter
gets the experiment's ``jobs`` for its per-user work instead. Progress is shown with tqdm on
a terminal and nothing is printed when stderr is not a TTY.
"""

from __future__ import annotations

import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from privaudit import __version__
from privaudit import registry
from privaudit.errors import PrivauditError
from privaudit.params import coerce, parse_spec
from privaudit.schema import validate as validate_transcript

#: Default noise scales of ``--noise KIND`` (DESIGN.md "Experiments and reports").
DEFAULT_NOISE_SCALES: tuple[float, ...] = (0.0, 1e-4, 1e-3, 1e-2, 1e-1, 0.5, 1.0)

#: Default number of seeds of ``privaudit attack`` (95 % bands need at least two).
DEFAULT_SEEDS = 3

#: Attack parameters through which an experiment hands its ``jobs`` to per-user attack work.
_JOBS_PARAMS = ("jobs", "n_jobs")

#: Name tokens (split at non-alphanumerics) of metrics that are counts or sizes, not
#: accuracies (never plotted).
_COUNT_TOKENS = frozenset(
    {"victims", "count", "counts", "n", "num", "seconds", "rounds", "users", "items", "size", "groups", "ci95", "ci", "std"}
)

__all__ = [
    "DEFAULT_NOISE_SCALES",
    "DEFAULT_SEEDS",
    "default_jobs",
    "Sweep",
    "Experiment",
    "build_experiment",
    "run_experiment",
    "attack_transcript",
    "run_transcript",
    "load_data",
    "subsample_users",
    "point_streams",
    "parse_sweep",
    "parse_assignments",
    "parse_values",
    "summarize_points",
    "accuracy_metrics",
]


def default_jobs() -> int:
    """Default ``--jobs``: every core this process may use."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


# ------------------------------------------------------------------------------ parsing


def parse_values(text: str, what: str) -> list[str]:
    """Split ``"v1,v2,..."`` into stripped strings (at least one)."""
    values = [v.strip() for v in str(text).split(",")]
    if not text or any(v == "" for v in values):
        raise PrivauditError(f"{what}: expected a comma-separated list of values, got {text!r}")
    return values


@dataclass(frozen=True)
class Sweep:
    """One swept parameter.

    Attributes
    ----------
    target : str
        ``"attack"``, ``"protocol"`` or the name of a defense.
    param : str
        Parameter (or protocol config key) swept.
    values : tuple
        The values, in order (already coerced to the parameter's type once resolved).
    """

    target: str
    param: str
    values: tuple

    @property
    def label(self) -> str:
        """``target.param`` as written on the command line and in ``results.json``."""
        return f"{self.target}.{self.param}"


def parse_sweep(text: str) -> Sweep:
    """Parse ``TARGET.PARAM=V1,V2,...`` (values stay strings until resolved)."""
    lhs, eq, rhs = str(text).partition("=")
    target, dot, param = lhs.strip().partition(".")
    if not eq or not dot or not target.strip() or not param.strip():
        raise PrivauditError(
            f"--sweep: expected TARGET.PARAM=V1,V2,... (e.g. laplace.scale=0,0.1 or attack.aux_fraction=0.1,0.5), got {text!r}"
        )
    return Sweep(target.strip(), param.strip(), tuple(parse_values(rhs, f"--sweep {lhs.strip()}")))


def parse_assignments(items: Sequence[str] | None, what: str = "--set") -> dict[str, str]:
    """Parse ``["KEY=VALUE", ...]`` into a dict (later keys win)."""
    out: dict[str, str] = {}
    for item in items or ():
        key, eq, value = str(item).partition("=")
        if not eq or not key.strip():
            raise PrivauditError(f"{what}: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


# ------------------------------------------------------------------------------ data


def load_data(data: Any = "synthetic") -> Any:
    """The dataset named by ``data``: ``"synthetic"`` (the built-in generator), a path
    (:func:`privaudit.data.load_dataset`) or a :class:`~privaudit.data.RatingsDataset` as is."""
    if data is None or (isinstance(data, str) and data.strip().lower() == "synthetic"):
        from privaudit.data import synthetic

        return synthetic()
    if isinstance(data, (str, Path)):
        from privaudit.data import load_dataset

        return load_dataset(data)
    return data


def subsample_users(dataset: Any, users: int | None, seed: int) -> Any:
    """``users`` users drawn without replacement (kept in their original order), seeded by
    ``seed``; the dataset unchanged when ``users`` is None or equal to its size; more users
    than it has is an error."""
    if users is None:
        return dataset
    users = int(users)
    if users < 1:
        raise PrivauditError(f"--users must be at least 1, got {users}")
    n = int(dataset.n_users)
    if users > n:
        raise PrivauditError(f"--users {users}: the dataset has only {n} users")
    if users == n:
        return dataset
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5EED]))
    idx = np.sort(rng.choice(n, size=users, replace=False))
    return dataset.subset_users(idx)


def point_streams(seed: int, index: int) -> tuple[np.random.SeedSequence, np.random.SeedSequence]:
    """Seed sequences of point (``seed``, value ``index``): (spare, attack). The protocol itself
    runs with the integer ``seed`` (common random numbers across swept values)."""
    protocol_ss, attack_ss = np.random.SeedSequence([int(seed), int(index)]).spawn(2)
    return protocol_ss, attack_ss


# ------------------------------------------------------------------------------ experiment


@dataclass
class Experiment:
    """A sweep of one parameter over seeds (see the module docstring).

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
        backend (:func:`privaudit.audit.scheduler_context`); same numbers as locally.
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

    def run(self, dataset: Any = None) -> dict[str, Any]:
        """Run every point; the results dict (``results.json`` schema)."""
        return run_experiment(self, dataset=dataset)


@dataclass
class _Task:
    """One protocol run and the attacks on its transcript (classes travel by reference to
    worker processes). ``variants``: (value index, value, attack params) per attack run; more
    than one only for attack sweeps, whose points share the protocol run of their seed."""

    protocol_cls: type
    config: dict[str, Any]
    defense_specs: list[tuple[type, dict[str, Any]]]
    attack_cls: type
    seed: int
    variants: list[tuple[int, Any, dict[str, Any]]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    def _classes(self) -> list[type]:
        return [self.protocol_cls, self.attack_cls] + [cls for cls, _ in self.defense_specs]

    def __post_init__(self) -> None:
        # registered names, resolved here in the main process: a plugin class registered under
        # an entry-point name has no ``name`` of its own when a worker process re-imports it
        self.names = [getattr(c, "name", "") or "" for c in self._classes()]

    def restore_names(self) -> None:
        """Give classes re-imported in a worker process their registered names back."""
        for cls, name in zip(self._classes(), self.names):
            if name and not getattr(cls, "name", ""):
                cls.name = name


def build_experiment(
    protocol: str,
    attack: str | None = None,
    noise: str | None = None,
    scales: str | Sequence[float] | None = None,
    defenses: Sequence[str] = (),
    sweep: str | None = None,
    sets: Sequence[str] = (),
    data: Any = "synthetic",
    users: int | None = None,
    seeds: int = 1,
    seed: int = 0,
    jobs: int = 1,
    progress: bool | None = None,
    scheduler: str | None = None,
) -> Experiment:
    """An :class:`Experiment` from command-line strings.

    ``attack`` is ``NAME[:k=v,...]``; ``noise`` a noise defense with a ``scale`` parameter
    (``--noise laplace [--scales L]`` = ``--defense laplace --sweep laplace.scale=L``);
    ``defenses`` are ``NAME[:k=v,...]``; ``sweep`` ``TARGET.PARAM=V1,...``; ``sets``
    ``KEY=VALUE`` protocol config overrides.
    """
    registry.get("protocol", protocol)
    attack_name, attack_params = (None, {})
    if attack:
        attack_name, attack_params = parse_spec(attack, "--attack")
    defense_list = [parse_spec(d, "--defense") for d in defenses or ()]
    parsed_sweep = parse_sweep(sweep) if sweep else None
    is_noise = False
    if scales is not None and not noise:
        raise PrivauditError("--scales needs --noise KIND (e.g. --noise laplace --scales 0,0.1,1)")
    if noise:
        if parsed_sweep is not None:
            raise PrivauditError("use either --noise or --sweep, not both")
        cls = registry.get("defense", noise)
        if "scale" not in getattr(cls, "params", {}):
            raise PrivauditError(f"--noise needs a noise defense with a 'scale' parameter; {noise!r} has none")
        if scales is None:
            values = tuple(repr(float(v)) for v in DEFAULT_NOISE_SCALES)
        elif isinstance(scales, str):
            values = tuple(parse_values(scales, "--scales"))
        else:
            values = tuple(scales)
        if noise not in [name for name, _ in defense_list]:
            defense_list.append((noise, {}))
        parsed_sweep = Sweep(noise, "scale", values)
        is_noise = True
    return Experiment(
        protocol=protocol,
        attack=attack_name,
        attack_params=dict(attack_params),
        defenses=defense_list,
        sweep=parsed_sweep,
        protocol_config=parse_assignments(sets),
        data=data,
        users=users,
        seeds=seeds,
        seed=seed,
        jobs=jobs,
        noise=is_noise,
        progress=progress,
        scheduler=scheduler,
    )


def _resolve_attack(protocol_cls: type, attack: str | None) -> type:
    name = attack or getattr(protocol_cls, "default_attack", None)
    if not name:
        raise PrivauditError(f"protocol {protocol_cls.name!r} has no default attack; name one with --attack")
    attack_cls = registry.get("attack", name)
    targets = tuple(getattr(attack_cls, "protocols", ()) or ())
    if targets and protocol_cls.name not in targets:
        raise PrivauditError(
            f"attack {name!r} does not apply to protocol {protocol_cls.name!r} (it reads: {', '.join(targets)})"
        )
    return attack_cls


def _resolve_sweep(exp: Experiment, protocol_cls: type, attack_cls: type, defense_specs: list[tuple[type, dict]]) -> Sweep | None:
    """The sweep with values coerced to the parameter's type (default sweeps applied)."""
    sweep = exp.sweep
    if sweep is None:
        default = getattr(attack_cls, "default_sweep", None)
        if default and default[0] not in exp.attack_params:
            sweep = Sweep("attack", str(default[0]), tuple(default[1]))
        else:
            for cls, params in defense_specs:
                strength = getattr(cls, "strength", None)
                grid = tuple(getattr(cls, "default_grid", ()) or ())
                if strength and grid and strength not in params:
                    sweep = Sweep(cls.name, strength, grid)
                    break
    if sweep is None:
        return None
    if sweep.target == "attack":
        params, owner = attack_cls.params, f"attack {attack_cls.name!r}"
    elif sweep.target == "protocol":
        params, owner = protocol_cls.default_config, f"protocol {protocol_cls.name!r}"
    else:
        matches = [cls for cls, _ in defense_specs if cls.name == sweep.target]
        if not matches:
            raise PrivauditError(
                f"--sweep {sweep.label}: {sweep.target!r} is not 'attack', 'protocol' or an active defense "
                f"(active: {', '.join(c.name for c, _ in defense_specs) or 'none'})"
            )
        params, owner = matches[0].params, f"defense {sweep.target!r}"
    if sweep.param not in params:
        known = ", ".join(params) or "none"
        raise PrivauditError(f"--sweep {sweep.label}: {owner} has no parameter {sweep.param!r} (known: {known})")
    default = params[sweep.param]
    values = tuple(coerce(v, default, sweep.param, owner) for v in sweep.values)
    if not values:
        raise PrivauditError(f"--sweep {sweep.label}: no values")
    return Sweep(sweep.target, sweep.param, values)


def _plan(exp: Experiment) -> tuple[list[_Task], dict[str, Any]]:
    """Validate everything up front and list the points; also the results header."""
    protocol_cls = registry.get("protocol", exp.protocol)
    attack_cls = _resolve_attack(protocol_cls, exp.attack)
    defense_specs: list[tuple[type, dict]] = []
    for name, params in exp.defenses:
        defense_specs.append((registry.get("defense", name), dict(params)))
    if exp.sweep is not None and exp.sweep.target not in ("attack", "protocol"):
        if exp.sweep.target not in [cls.name for cls, _ in defense_specs]:
            # a defense named only by the sweep is activated with its defaults
            defense_specs.append((registry.get("defense", exp.sweep.target), {}))
    if int(exp.seeds) < 1:
        raise PrivauditError(f"--seeds must be at least 1, got {exp.seeds}")
    if int(exp.seed) < 0:
        raise PrivauditError(f"--seed must be non-negative, got {exp.seed}")
    if int(exp.jobs) == 0 or int(exp.jobs) < -1:
        raise PrivauditError(f"--jobs must be a positive number of processes or -1 (all cores), got {exp.jobs}")
    sweep = _resolve_sweep(exp, protocol_cls, attack_cls, defense_specs)
    values: tuple = sweep.values if sweep is not None else (None,)

    base_config = protocol_cls.resolve_config(exp.protocol_config)
    base_attack = attack_cls(**exp.attack_params).config
    base_defenses = [cls(**params) for cls, params in defense_specs]
    protocol_cls.check_defenses(protocol_cls.name, base_defenses)

    tasks: list[_Task] = []
    shared: dict[int, _Task] = {}  # attack sweeps: one protocol run per seed
    for index, value in enumerate(values):
        config_overrides = dict(exp.protocol_config)
        attack_params = dict(exp.attack_params)
        specs = [(cls, dict(params)) for cls, params in defense_specs]
        if sweep is not None:
            if sweep.target == "protocol":
                config_overrides[sweep.param] = value
            elif sweep.target == "attack":
                attack_params[sweep.param] = value
            else:
                for cls, params in specs:
                    if cls.name == sweep.target:
                        params[sweep.param] = value
        config = protocol_cls.resolve_config(config_overrides)
        attack_params = attack_cls(**attack_params).config  # validates
        for cls, params in specs:
            cls(**params)  # validates
        for s in range(int(exp.seeds)):
            seed = int(exp.seed) + s
            if sweep is not None and sweep.target == "attack":
                if seed not in shared:
                    shared[seed] = _Task(protocol_cls, config, specs, attack_cls, seed)
                    tasks.append(shared[seed])
                shared[seed].variants.append((index, value, attack_params))
            else:
                tasks.append(_Task(protocol_cls, config, specs, attack_cls, seed, [(index, value, attack_params)]))

    header = {
        "privaudit_version": __version__,
        "protocol": protocol_cls.name,
        "protocol_config": base_config,
        "attack": attack_cls.name,
        "attack_params": base_attack,
        "sweep": sweep.label if sweep is not None else None,
        "sweep_values": list(values) if sweep is not None else [None],
        "noise": bool(exp.noise or (sweep is not None and sweep.param == "scale" and sweep.target not in ("attack", "protocol"))),
        "defenses": [{"name": d.name, **d.config} for d in base_defenses],
        "seeds": list(range(int(exp.seed), int(exp.seed) + int(exp.seeds))),
        "primary_metric": getattr(attack_cls, "primary_metric", None),
    }
    return tasks, header


def _defense_privacy(defenses: Sequence[Any], transcript: Any, names: Sequence[str] | None = None) -> dict[str, Any]:
    """``privacy_spent`` of every defense that reports one, for the rounds a client took part in:
    the most distinct rounds any client uploaded in the transcript, or the protocol's public
    ``epochs``/``rounds``/``global_rounds``/``n_rounds`` when larger (rounds run but not
    recorded). Keyed by ``names`` when given (the registered names)."""
    rounds_by_client: dict[str, set[int]] = {}
    for m in transcript.messages:
        if m.sender != m.receiver and m.sender.startswith("client:"):
            rounds_by_client.setdefault(m.sender, set()).add(m.round)
    rounds = max((len(r) for r in rounds_by_client.values()), default=0)
    # protocols record only some rounds (e.g. fedmvmf's record_rounds): count the rounds run
    for key in ("epochs", "rounds", "global_rounds", "n_rounds"):
        value = (transcript.config or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > rounds:
            rounds = value
            break
    out: dict[str, Any] = {}
    for k, d in enumerate(defenses):
        spent = d.privacy_spent(rounds)
        if spent:
            name = names[k] if names is not None and k < len(names) and names[k] else d.name
            out[name] = {"rounds": rounds, **{key: v if isinstance(v, str) else float(v) for key, v in spent.items()}}
    return out


def _floats(d: Mapping[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in (d or {}).items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def _run_protocol(task: _Task, dataset: Any) -> tuple[Any, list[Any], float]:
    task.restore_names()
    defenses = [cls(**params) for cls, params in task.defense_specs]
    t0 = time.perf_counter()
    # common random numbers: the protocol (and the defenses' noise) draw from the seed alone
    result = task.protocol_cls().run(dataset, dict(task.config), defenses, int(task.seed))
    result.transcript.seed = task.seed
    return result, defenses, time.perf_counter() - t0


def _evaluate(attack_cls: type, attack_params: dict, transcript: Any, rng: np.random.Generator) -> tuple[dict, float]:
    t0 = time.perf_counter()
    outcome = attack_cls(**attack_params).evaluate(transcript, rng)
    recon = outcome.reconstruction
    out = {
        "attack_metrics": _floats(outcome.metrics),
        "baseline": _floats(outcome.baseline),
        "supported": bool(recon.supported),
    }
    if not recon.supported:
        out["reason"] = recon.reason
    return out, time.perf_counter() - t0


def _run_point(task: _Task, dataset: Any, attack_jobs: int | None = None) -> list[dict[str, Any]]:
    """One protocol run and its attack variants -> their ``points`` entries."""
    result, defenses, protocol_seconds = _run_protocol(task, dataset)
    privacy = _defense_privacy(defenses, result.transcript)
    utility = _floats(result.utility)
    points = []
    for index, value, attack_params in task.variants:
        params = dict(attack_params)
        if attack_jobs is not None:
            for key in _JOBS_PARAMS:
                if key in params and params[key] == task.attack_cls.params.get(key):
                    params[key] = attack_jobs
        _, attack_ss = point_streams(task.seed, index)
        scored, attack_seconds = _evaluate(task.attack_cls, params, result.transcript, np.random.default_rng(attack_ss))
        share = protocol_seconds / len(task.variants)
        point = {
            "value": value,
            "seed": task.seed,
            "attack_metrics": scored["attack_metrics"],
            "baseline": scored["baseline"],
            "utility": dict(utility),
            "seconds": share + attack_seconds,
            "protocol_seconds": share,
            "attack_seconds": attack_seconds,
            "supported": scored["supported"],
            "_index": index,
        }
        if "reason" in scored:
            point["reason"] = scored["reason"]
        if privacy:
            point["privacy"] = privacy
        points.append(point)
    return points


def _show_progress(progress: bool | None) -> bool:
    if progress is None:
        try:
            return sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False
    return bool(progress)


def _map_points(tasks: list[_Task], dataset: Any, jobs: int, progress: bool | None, desc: str) -> list[dict]:
    from tqdm.auto import tqdm

    show = _show_progress(progress)
    parallel = jobs != 1 and len(tasks) > 1
    bar = tqdm(total=len(tasks), desc=desc, unit="run", disable=not show, leave=False, file=sys.stderr)
    try:
        if not parallel:
            out = []
            for task in tasks:
                out += _run_point(task, dataset, attack_jobs=jobs if jobs != 1 else None)
                bar.update(1)
            return _in_order(out)
        from joblib import Parallel, delayed

        runner = Parallel(n_jobs=jobs, return_as="generator")
        out = []
        for points in runner(delayed(_run_point)(task, dataset) for task in tasks):
            out += points
            bar.update(1)
        return _in_order(out)
    finally:
        bar.close()


def _in_order(points: list[dict]) -> list[dict]:
    """Points sorted by (value index, seed), the private index key dropped."""
    points = sorted(points, key=lambda p: (p["_index"], p["seed"]))
    for p in points:
        del p["_index"]
    return points


def run_experiment(experiment: Experiment, dataset: Any = None) -> dict[str, Any]:
    """Run ``experiment`` (on ``dataset`` if given, else on ``experiment.data``) -> results dict."""
    tasks, header = _plan(experiment)
    t0 = time.perf_counter()
    if dataset is None:
        dataset = load_data(experiment.data)
    dataset = subsample_users(dataset, experiment.users, experiment.seed)
    desc = f"{header['protocol']} {header['sweep'] or ''}".strip()
    if experiment.scheduler:
        from privaudit.audit import scheduler_context

        with scheduler_context(experiment.scheduler):
            points = _map_points(tasks, dataset, -1, experiment.progress, desc)
    else:
        points = _map_points(tasks, dataset, int(experiment.jobs), experiment.progress, desc)
    return _assemble(header, dataset.summary(), points, time.perf_counter() - t0, source=experiment.data, users=experiment.users)


def _assemble(header: dict, dataset_summary: dict, points: list[dict], seconds: float, source: Any = None, users: int | None = None) -> dict[str, Any]:
    dataset = dict(dataset_summary)
    if source is not None and "source" not in dataset:
        dataset["source"] = source if isinstance(source, str) else (str(source) if isinstance(source, Path) else dataset.get("name"))
    if users is not None:
        dataset["subsampled_users"] = int(users)
    results = {
        "privaudit_version": header["privaudit_version"],
        "protocol": header["protocol"],
        "protocol_config": header["protocol_config"],
        "attack": header["attack"],
        "sweep": header["sweep"],
        "defenses": header["defenses"],
        "dataset": dataset,
        "points": points,
        "summary": summarize_points(points),
        # extra keys (allowed by the schema) used by the reports
        "attack_params": header.get("attack_params", {}),
        "sweep_values": header.get("sweep_values", [None]),
        "noise": header.get("noise", False),
        "seeds": header.get("seeds", []),
        "primary_metric": header.get("primary_metric"),
        "total_seconds": seconds,
    }
    results["figure_metrics"] = accuracy_metrics(results)
    results["utility_metric"] = main_utility(results)
    return results


# ------------------------------------------------------------------------------ summaries


def _value_key(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


def _ordered_keys(points: Sequence[Mapping], field_name: str) -> list[str]:
    keys: list[str] = []
    for p in points:
        for k in p.get(field_name) or {}:
            if k not in keys:
                keys.append(k)
    return keys


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def summarize_points(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Seed-mean and 95 % CI half-width (Student t) per value and metric.

    Attack metrics keep their names; baselines and utility metrics are listed as
    ``baseline.<name>`` and ``utility.<name>``.
    """
    from privaudit.metrics import mean_ci95

    groups: dict[str, list[Mapping]] = {}
    order: list[tuple[str, Any]] = []
    for p in points:
        key = _value_key(p.get("value"))
        if key not in groups:
            groups[key] = []
            order.append((key, p.get("value")))
        groups[key].append(p)
    fields = [("attack_metrics", ""), ("baseline", "baseline."), ("utility", "utility.")]
    summary = []
    for key, value in order:
        group = groups[key]
        for field_name, prefix in fields:
            for metric in _ordered_keys(group, field_name):
                vals = [_num((p.get(field_name) or {}).get(metric)) for p in group]
                mean, ci = mean_ci95(vals)
                summary.append({"value": value, "metric": prefix + metric, "mean": mean, "ci95": ci})
    return summary


def accuracy_metrics(results: Mapping[str, Any]) -> list[str]:
    """Attack metrics worth plotting: accuracy-like (every value in [0, 1]), not counts.

    The attack's primary metric (``results["primary_metric"]``) comes first and always
    qualifies (it may be an error, e.g. FedSPLIT's relative error); so does a metric with a
    baseline of the same name, unless its name marks it as a count or an interval
    (``victims``, ``n_groups``, ``*_ci95``).
    """
    points = results.get("points") or []
    baseline_keys = set(_ordered_keys(points, "baseline"))
    primary = results.get("primary_metric")
    out = []
    for metric in _ordered_keys(points, "attack_metrics"):
        if metric == primary:
            out.insert(0, metric)
            continue
        tokens = set(re.split(r"[^a-z0-9]+", metric.lower()))
        if tokens & _COUNT_TOKENS:
            continue
        if metric in baseline_keys:
            out.append(metric)
            continue
        vals = np.array([_num((p.get("attack_metrics") or {}).get(metric)) for p in points], dtype=float)
        finite = vals[np.isfinite(vals)]
        if finite.size and finite.min() >= 0.0 and finite.max() <= 1.0:
            out.append(metric)
    return out


def main_utility(results: Mapping[str, Any]) -> str | None:
    """The utility metric shown in tables and on the figures' second axis: the protocol's
    ``main_utility`` if it declares one and the points report it, else the first of a fixed
    preference list."""
    keys = _ordered_keys(results.get("points") or [], "utility")
    declared = None
    if results.get("protocol"):
        from privaudit import registry

        try:
            declared = getattr(registry.get("protocol", str(results["protocol"])), "main_utility", None)
        except PrivauditError:  # an unknown (plugin) protocol of a results file: fall back
            declared = None
    for preferred in ((declared,) if declared else ()) + ("ndcg@10", "ndcg", "rmse", "hr@10", "f1", "auc"):
        for k in keys:
            if k.lower() == preferred:
                return k
    return keys[0] if keys else None


# ------------------------------------------------------------------------------ transcripts


def run_transcript(
    protocol: str,
    defenses: Sequence[str] = (),
    sets: Sequence[str] = (),
    data: Any = "synthetic",
    users: int | None = None,
    seed: int = 0,
    dataset: Any = None,
) -> Any:
    """Run ``protocol`` once, as point (``seed``, 0) of an experiment; the :class:`RunResult`.

    ``privaudit run`` writes its transcript; attacking that file with
    :func:`attack_transcript` reproduces the in-memory scores of the same point.
    """
    exp = build_experiment(protocol, defenses=defenses, sets=sets, data=data, users=users, seeds=1, seed=seed, jobs=1)
    protocol_cls = registry.get("protocol", exp.protocol)
    specs = [(registry.get("defense", name), dict(params)) for name, params in exp.defenses]
    config = protocol_cls.resolve_config(exp.protocol_config)
    protocol_cls.check_defenses(protocol_cls.name, [cls(**p) for cls, p in specs])
    if dataset is None:
        dataset = load_data(data)
    dataset = subsample_users(dataset, users, seed)
    task = _Task(protocol_cls, config, specs, object, int(seed))
    result, _, _ = _run_protocol(task, dataset)
    return result


def attack_transcript(
    transcript: Any,
    attack: str | None = None,
    progress: bool | None = None,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Attack one transcript (a :class:`~privaudit.transcript.Transcript` or a ``.ptx`` path)
    -> results dict with a single point (``"value": null``, no utility).

    The transcript is checked against its protocol's declared schema (:mod:`privaudit.schema`)
    before the attack sees it; ``max_bytes`` is the loading budget (default
    :data:`~privaudit.transcript.DEFAULT_MAX_BYTES`).

    ``attack`` is ``NAME[:k=v,...]``; default: the protocol's ``default_attack``. The attack's
    random stream is that of point (``transcript.seed``, 0) of an experiment.
    """
    from privaudit import transcript as tr

    t0 = time.perf_counter()
    if isinstance(transcript, (str, Path)):
        path = Path(transcript)
        if not path.exists():
            raise PrivauditError(f"{path}: no such transcript file")
        transcript = tr.load(path, **({} if max_bytes is None else {"max_bytes": max_bytes}))
    protocol_cls = registry.get("protocol", transcript.protocol)
    validate_transcript(transcript)
    name, params = parse_spec(attack, "--attack") if attack else (None, {})
    attack_cls = _resolve_attack(protocol_cls, name)
    attack_params = attack_cls(**params).config
    if not transcript.has_private:
        raise PrivauditError(
            "the transcript holds no private messages (saved with --no-private), so the attack cannot be scored"
        )
    seed = int(transcript.seed) if transcript.seed is not None else 0
    _, attack_ss = point_streams(seed, 0)
    scored, seconds = _evaluate(attack_cls, attack_params, transcript, np.random.default_rng(attack_ss))
    point = {
        "value": None,
        "seed": transcript.seed,
        "attack_metrics": scored["attack_metrics"],
        "baseline": scored["baseline"],
        "utility": {},
        "seconds": seconds,
        "attack_seconds": seconds,
        "supported": scored["supported"],
    }
    if "reason" in scored:
        point["reason"] = scored["reason"]
    header = {
        "privaudit_version": __version__,
        "protocol": transcript.protocol,
        "protocol_config": dict(transcript.config),
        "attack": attack_cls.name,
        "attack_params": attack_params,
        "sweep": None,
        "sweep_values": [None],
        "noise": False,
        "defenses": list(transcript.config.get("defenses", []) or []),
        "seeds": [transcript.seed],
        "primary_metric": getattr(attack_cls, "primary_metric", None),
    }
    results = _assemble(header, dict(transcript.dataset), [point], time.perf_counter() - t0)
    results["transcript"] = True
    return results

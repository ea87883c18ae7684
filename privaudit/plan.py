"""A resolved experiment plan: classes, validated parameters, grid, seeds and backend, fixed
once up front (from the command line, the Python API or a ``plan.toml``) so that execution
never consults the registry.

:func:`resolve` turns an :class:`~privaudit.experiment.Experiment` (names and strings) into a
:class:`Plan`; :func:`plan_to_toml` writes the plan every report folder records as
``plan.toml``; :func:`load_plan` reads one back (``privaudit attack --config DIR/plan.toml``
reruns it with the same numbers).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privaudit import _safejson, registry
from privaudit.errors import PrivauditError

__all__ = [
    "DEFAULT_SEEDS",
    "PLAN_TOML",
    "Sweep",
    "Plan",
    "parse_values",
    "parse_sweep",
    "parse_assignments",
    "resolve",
    "plan_to_toml",
    "load_plan",
    "audit_to_toml",
    "load_audit_fields",
]

#: Default number of seeds of ``privaudit attack`` (95 % bands need at least two).
DEFAULT_SEEDS = 3

#: File name of the plan recorded in every report folder.
PLAN_TOML = "plan.toml"

#: Upper bounds of a run's size, checked before any work (command line, Python API, plan files).
MAX_SEEDS = 1000
MAX_JOBS = 1024
MAX_USERS = 10_000_000
MAX_SWEEP_POINTS = 1000

_LOCAL_SCHEDULER = re.compile(r"local:\d{1,4}")


def check_bounds(
    seeds: Any = None, jobs: Any = None, users: Any = None, *, points: int | None = None, where: str = ""
) -> None:
    """One-line refusal of a number of seeds, jobs, users or sweep points above its cap."""
    prefix = f"{where}: " if where else ""
    for name, value, cap in (
        ("seeds", seeds, MAX_SEEDS),
        ("jobs", jobs, MAX_JOBS),
        ("users", users, MAX_USERS),
        ("sweep values", points, MAX_SWEEP_POINTS),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            raise PrivauditError(f"{prefix}{name} = {value} is more than privaudit's cap of {cap}")


def check_plan_scheduler(value: Any, path: Path | str) -> None:
    """A plan file may name ``local:N`` workers, never a scheduler address: a plan received from
    someone else must not choose where privaudit connects (only ``--scheduler`` does)."""
    if value is None:
        return
    if not isinstance(value, str) or not _LOCAL_SCHEDULER.fullmatch(value.strip()):
        raise PrivauditError(
            f"{path}: the plan names scheduler {value!r}; a plan file cannot choose where privaudit connects "
            "(remove it and give --scheduler ADDRESS on the command line)"
        )
    from privaudit._local_cluster import local_workers

    local_workers(value, f"{path}: scheduler")  # the same worker cap as --scheduler


# ------------------------------------------------------------------------------ parsing


def parse_values(text: str, what: str) -> list[str]:
    """Split ``"v1,v2,..."`` into stripped strings (at least one)."""
    text = str(text)
    if text.count(",") >= MAX_SWEEP_POINTS:
        raise PrivauditError(f"{what}: more than {MAX_SWEEP_POINTS} values (privaudit's cap)")
    values = [v.strip() for v in text.split(",")]
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
            "--sweep: expected TARGET.PARAM=V1,V2,... (e.g. laplace.scale=0,0.1 or attack.aux_fraction=0.1,0.5), "
            f"got {text!r}"
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


# ------------------------------------------------------------------------------ the plan


@dataclass
class Plan:
    """Everything an experiment runs, resolved and validated.

    Attributes
    ----------
    protocol_cls, attack_cls : type
        The classes (looked up once, by :func:`resolve`).
    config : dict
        The protocol config with the overrides applied (validated).
    attack_params : dict
        The attack's full parameters (validated).
    defenses : list of (type, dict)
        Active defenses in upload order with their full parameters.
    sweep : Sweep | None
        The swept parameter, values coerced to its type.
    seeds : list of int
        The seeds run.
    jobs : int
        joblib processes (-1: all cores).
    scheduler : str | None
        Dask scheduler address or ``local:N``.
    data : str | RatingsDataset
        ``"synthetic"``, a path, or a dataset object (not recordable in ``plan.toml``).
    users : int | None
        Subsample this many users (seeded by the first seed).
    noise : bool
        The sweep is a noise-scale sweep (the strength 0 is the undefended run).
    progress : bool | None
        tqdm progress bar; None: only on a terminal.
    """

    protocol_cls: type
    attack_cls: type
    config: dict[str, Any]
    attack_params: dict[str, Any]
    defenses: list[tuple[type, dict[str, Any]]]
    sweep: Sweep | None
    seeds: list[int]
    jobs: int = 1
    scheduler: str | None = None
    data: Any = "synthetic"
    users: int | None = None
    noise: bool = False
    progress: bool | None = None
    names: dict[str, Any] = field(default_factory=dict)

    @property
    def seed(self) -> int:
        """The base seed (the first)."""
        return self.seeds[0]

    @property
    def values(self) -> tuple:
        """The swept values (``(None,)`` without a sweep)."""
        return self.sweep.values if self.sweep is not None else (None,)

    def grid(self) -> Iterator[tuple[int, Any, dict[str, Any], dict[str, Any], list[tuple[type, dict[str, Any]]]]]:
        """(value index, value, protocol config, attack params, defense specs) per swept value."""
        for index, value in enumerate(self.values):
            config = dict(self.config)
            attack_params = dict(self.attack_params)
            specs = [(cls, dict(params)) for cls, params in self.defenses]
            if self.sweep is not None:
                if self.sweep.target == "protocol":
                    config = self.protocol_cls.resolve_config({**config, self.sweep.param: value})
                elif self.sweep.target == "attack":
                    attack_params = self.attack_cls(**{**attack_params, self.sweep.param: value}).config
                else:
                    for k, (cls, params) in enumerate(specs):
                        if cls.name == self.sweep.target:
                            specs[k] = (cls, cls(**{**params, self.sweep.param: value}).config)
            yield index, value, config, attack_params, specs

    def swept_defense(self) -> type | None:
        """The defense class whose parameter the sweep varies (None for attack/protocol sweeps)."""
        if self.sweep is None or self.sweep.target in ("attack", "protocol"):
            return None
        return next((cls for cls, _ in self.defenses if cls.name == self.sweep.target), None)


def resolve_attack(protocol_cls: type, attack: str | None) -> type:
    name = attack or protocol_cls.default_attack
    if not name:
        raise PrivauditError(f"protocol {protocol_cls.name!r} has no default attack; name one with --attack")
    attack_cls = registry.get("attack", name)
    targets = tuple(attack_cls.protocols)
    if targets and protocol_cls.name not in targets:
        raise PrivauditError(
            f"attack {name!r} does not apply to protocol {protocol_cls.name!r} (it reads: {', '.join(targets)})"
        )
    return attack_cls


def _resolve_sweep(
    sweep: Sweep | None,
    attack_params: Mapping[str, Any],
    protocol_cls: type,
    attack_cls: type,
    defense_specs: list[tuple[type, dict]],
) -> Sweep | None:
    """The sweep with values coerced to the parameter's type (default sweeps applied)."""
    if sweep is None:
        default = attack_cls.default_sweep
        if default and default[0] not in attack_params:
            sweep = Sweep("attack", str(default[0]), tuple(default[1]))
        else:
            for cls, params in defense_specs:
                strength, grid = cls.strength, tuple(cls.default_grid)
                if strength and grid and strength not in params:
                    sweep = Sweep(cls.name, strength, grid)
                    break
    if sweep is None:
        return None
    if sweep.target == "attack":
        declared, owner = attack_cls.declared, f"attack {attack_cls.name!r}"
    elif sweep.target == "protocol":
        declared, owner = protocol_cls.declared, f"protocol {protocol_cls.name!r}"
    else:
        matches = [cls for cls, _ in defense_specs if cls.name == sweep.target]
        if not matches:
            raise PrivauditError(
                f"--sweep {sweep.label}: {sweep.target!r} is not 'attack', 'protocol' or an active defense "
                f"(active: {', '.join(c.name for c, _ in defense_specs) or 'none'})"
            )
        declared, owner = matches[0].declared, f"defense {sweep.target!r}"
    if sweep.param not in declared:
        known = ", ".join(declared) or "none"
        raise PrivauditError(f"--sweep {sweep.label}: {owner} has no parameter {sweep.param!r} (known: {known})")
    # each value is checked by the owning declaration (type, bounds, choices): one line naming it
    param = declared[sweep.param]
    values = tuple(param.coerce(param.parse(v, owner), owner) for v in sweep.values)
    if not values:
        raise PrivauditError(f"--sweep {sweep.label}: no values")
    return Sweep(sweep.target, sweep.param, values)


def resolve(
    *,
    protocol: str,
    attack: str | None = None,
    attack_params: Mapping[str, Any] | None = None,
    defenses: Sequence[tuple[str, Mapping[str, Any]]] = (),
    sweep: Sweep | None = None,
    protocol_config: Mapping[str, Any] | None = None,
    data: Any = "synthetic",
    users: int | None = None,
    seeds: int = 1,
    seed: int = 0,
    jobs: int = 1,
    noise: bool = False,
    progress: bool | None = None,
    scheduler: str | None = None,
) -> Plan:
    """Look every name up once, validate every parameter and every grid point; the :class:`Plan`.

    The fields are those of :class:`~privaudit.experiment.Experiment` (names, parameter
    overrides as strings or values; keyword arguments only).
    """
    from privaudit.runner import check_run_settings

    check_bounds(seeds, jobs, users, points=len(sweep.values) if sweep is not None else None)
    check_run_settings(seeds, seed, jobs)
    if users is not None and int(users) < 1:
        raise PrivauditError(f"--users must be at least 1, got {users}")
    protocol_cls = registry.get("protocol", protocol)
    attack_cls = resolve_attack(protocol_cls, attack)
    defense_specs = [(registry.get("defense", name), dict(params)) for name, params in defenses]
    if sweep is not None and sweep.target not in ("attack", "protocol"):
        if sweep.target not in [cls.name for cls, _ in defense_specs]:
            # a defense named only by the sweep is activated with its defaults
            defense_specs.append((registry.get("defense", sweep.target), {}))
    attack_params = dict(attack_params or {})
    sweep = _resolve_sweep(sweep, attack_params, protocol_cls, attack_cls, defense_specs)
    config = protocol_cls.resolve_config(dict(protocol_config or {}))
    attack_params = attack_cls(**attack_params).config
    built = [cls(**params) for cls, params in defense_specs]
    protocol_cls.check_defenses(protocol_cls.name, built)
    plan = Plan(
        protocol_cls=protocol_cls,
        attack_cls=attack_cls,
        config=config,
        attack_params=attack_params,
        defenses=[(type(d), dict(d.config)) for d in built],
        sweep=sweep,
        seeds=list(range(int(seed), int(seed) + int(seeds))),
        jobs=int(jobs),
        scheduler=scheduler,
        data=data,
        users=None if users is None else int(users),
        noise=bool(
            noise or (sweep is not None and sweep.param == "scale" and sweep.target not in ("attack", "protocol"))
        ),
        progress=progress,
    )
    for _ in plan.grid():  # validates every grid point up front
        pass
    return plan


# ------------------------------------------------------------------------------ TOML


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    return json.dumps(str(v))


def _toml_table(name: str, d: Mapping[str, Any]) -> list[str]:
    lines = [f"[{name}]"]
    # None has no TOML form: such keys are left out and take their (None) default on reload
    lines += [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in d.items() if v is not None]
    return lines + [""]


def _data_source(data: Any) -> str:
    if data is None or (isinstance(data, str) and data.strip().lower() == "synthetic"):
        return "synthetic"
    if isinstance(data, (str, Path)):
        return str(data)  # as given (a rerun reads it from where the command ran, like --data)
    raise PrivauditError("this plan ran on an in-memory dataset, which plan.toml cannot record")


def _recorded_scheduler(scheduler: str | None) -> str | None:
    """``local:N`` is recorded in a plan; an address never is (a plan cannot choose where to connect)."""
    if isinstance(scheduler, str) and _LOCAL_SCHEDULER.fullmatch(scheduler.strip()):
        return scheduler.strip()
    return None


def plan_to_toml(plan: Plan) -> str:
    """The TOML text of ``plan`` (read back by :func:`load_plan`)."""
    try:
        data = _data_source(plan.data)
    except PrivauditError:
        data = None
    lines = ["# privaudit experiment plan: rerun with `privaudit attack --config plan.toml`", ""]
    run = {
        "protocol": plan.protocol_cls.name,
        "attack": plan.attack_cls.name,
        "data": data,
        "users": plan.users,
        "seeds": len(plan.seeds),
        "seed": plan.seed,
        "jobs": plan.jobs,
        "scheduler": _recorded_scheduler(plan.scheduler),
        "noise": plan.noise,
    }
    if data is None:
        lines.append("# the data was an in-memory dataset: give `data` before rerunning")
    lines += _toml_table("run", run)
    lines += _toml_table("protocol", plan.config)
    lines += _toml_table("attack", plan.attack_params)
    for cls, params in plan.defenses:
        lines += ["[[defenses]]", f"name = {json.dumps(cls.name)}", ""]
        lines += _toml_table("defenses.params", params)
    if plan.sweep is not None:
        lines += _toml_table(
            "sweep", {"target": plan.sweep.target, "param": plan.sweep.param, "values": list(plan.sweep.values)}
        )
    return "\n".join(lines)


def _table(doc: Mapping[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise PrivauditError(f"{path}: [{key}] must be a table")
    return value


def _read_plan_toml(path: Path | str) -> tuple[Path, dict[str, Any]]:
    """The plan file (``path`` or ``path/plan.toml``) and its parsed tables; one-line errors."""
    path = Path(path)
    if path.is_dir():
        path = path / PLAN_TOML
    if not path.is_file():
        raise PrivauditError(f"{path}: no such plan file")
    try:
        if path.stat().st_size > _safejson.TOML_MAX_BYTES:
            raise _safejson.JSONLimitError(f"more than {_safejson.TOML_MAX_BYTES} bytes")
        return path, _safejson.toml_loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, _safejson.JSONLimitError) as exc:
        raise PrivauditError(f"{path}: not a valid plan.toml ({exc})") from None


def load_plan(
    path: Path | str, jobs: int | None = None, scheduler: str | None = None, progress: bool | None = None
) -> Plan:
    """Read a ``plan.toml`` (a file, or a report folder holding one) and resolve it.

    ``jobs`` and ``scheduler`` replace the recorded backend (they never change the numbers).
    """
    path, doc = _read_plan_toml(path)
    unknown = sorted(set(doc) - {"run", "protocol", "attack", "defenses", "sweep"})
    if unknown:
        raise PrivauditError(f"{path}: unknown table(s) {', '.join(unknown)}")
    run = _table(doc, "run", path)
    allowed = {"protocol", "attack", "data", "users", "seeds", "seed", "jobs", "scheduler", "noise"}
    if set(run) - allowed:
        raise PrivauditError(f"{path}: unknown key(s) in [run]: {', '.join(sorted(set(run) - allowed))}")
    if not isinstance(run.get("protocol"), str):
        raise PrivauditError(f'{path}: [run] needs protocol = "NAME"')
    for key, kind in (("attack", str), ("data", str), ("scheduler", str)):
        if key in run and not isinstance(run[key], kind):
            raise PrivauditError(f"{path}: [run] {key} must be a string")
    for key in ("users", "seeds", "seed", "jobs"):
        if key in run and (isinstance(run[key], bool) or not isinstance(run[key], int)):
            raise PrivauditError(f"{path}: [run] {key} must be an integer")
    if "data" not in run:
        raise PrivauditError(f'{path}: [run] needs data = "synthetic" or a path')
    check_plan_scheduler(run.get("scheduler"), path)
    check_bounds(run.get("seeds"), run.get("jobs"), run.get("users"), where=str(path))
    defenses = doc.get("defenses", [])
    if not isinstance(defenses, list) or not all(
        isinstance(d, dict) and isinstance(d.get("name"), str) for d in defenses
    ):
        raise PrivauditError(f'{path}: [[defenses]] entries need name = "NAME"')
    defense_list = []
    for d in defenses:
        params = d.get("params", {})
        if not isinstance(params, dict) or set(d) - {"name", "params"}:
            raise PrivauditError(f"{path}: defense {d['name']!r}: expected name and a [defenses.params] table")
        defense_list.append((d["name"], dict(params)))
    sweep = None
    if "sweep" in doc:
        s = _table(doc, "sweep", path)
        if not (
            isinstance(s.get("target"), str)
            and isinstance(s.get("param"), str)
            and isinstance(s.get("values"), list)
            and s["values"]
        ):
            raise PrivauditError(f"{path}: [sweep] needs target, param and a non-empty values list")
        check_bounds(points=len(s["values"]), where=str(path))
        sweep = Sweep(s["target"], s["param"], tuple(s["values"]))
    return resolve(
        protocol=run["protocol"],
        attack=run.get("attack"),
        attack_params=_table(doc, "attack", path),
        defenses=defense_list,
        sweep=sweep,
        protocol_config=_table(doc, "protocol", path),
        data=run["data"],
        users=run.get("users"),
        seeds=run.get("seeds", DEFAULT_SEEDS),
        seed=run.get("seed", 0),
        jobs=run.get("jobs", 1) if jobs is None else jobs,
        noise=bool(run.get("noise", False)),
        progress=progress,
        scheduler=run.get("scheduler") if scheduler is None else scheduler,
    )


# ------------------------------------------------------------------------------ audits


def audit_to_toml(audit: Any) -> str:
    """The TOML text of an :class:`~privaudit.audit.Audit` (its fields; read back by
    :func:`load_audit_fields`, rerun with ``privaudit audit --config``)."""
    try:
        data = _data_source(audit.data)
    except PrivauditError:
        data = None
    lines = ["# privaudit audit plan: rerun with `privaudit audit --config plan.toml`", ""]
    fields = {
        "protocol": audit.protocol,
        "data": data,
        "users": audit.users,
        "seeds": int(audit.seeds),
        "seed": int(audit.seed),
        "jobs": int(audit.jobs),
        "scheduler": _recorded_scheduler(audit.scheduler),
        "attacks": list(audit.attacks) if audit.attacks is not None else None,
        "defenses": list(audit.defenses) if audit.defenses is not None else None,
        "threat": getattr(audit, "threat", "both"),
    }
    if data is None:
        lines.append("# the data was an in-memory dataset: give `data` before rerunning")
    lines += _toml_table("audit", fields)
    lines += _toml_table("protocol", dict(audit.sets))
    return "\n".join(lines)


def load_audit_fields(path: Path | str) -> dict[str, Any]:
    """The :class:`~privaudit.audit.Audit` fields of an audit ``plan.toml`` (a file or a folder
    holding one), checked for types; one-line errors."""
    path, doc = _read_plan_toml(path)
    if "audit" not in doc:
        raise PrivauditError(f"{path}: not an audit plan (no [audit] table; run it with privaudit attack --config)")
    unknown = sorted(set(doc) - {"audit", "protocol"})
    if unknown:
        raise PrivauditError(f"{path}: unknown table(s) {', '.join(unknown)}")
    a = _table(doc, "audit", path)
    allowed = {"protocol", "data", "users", "seeds", "seed", "jobs", "scheduler", "attacks", "defenses", "threat"}
    if set(a) - allowed:
        raise PrivauditError(f"{path}: unknown key(s) in [audit]: {', '.join(sorted(set(a) - allowed))}")
    for key in ("protocol", "data"):
        if not isinstance(a.get(key), str):
            raise PrivauditError(f'{path}: [audit] needs {key} = "..."')
    for key in ("users", "seeds", "seed", "jobs"):
        if key in a and (isinstance(a[key], bool) or not isinstance(a[key], int)):
            raise PrivauditError(f"{path}: [audit] {key} must be an integer")
    for key in ("attacks", "defenses"):
        if key in a and not (isinstance(a[key], list) and all(isinstance(x, str) for x in a[key])):
            raise PrivauditError(f"{path}: [audit] {key} must be a list of names")
    if a.get("threat", "both") not in ("honest-but-curious", "malicious", "both"):
        raise PrivauditError(f'{path}: [audit] threat must be "honest-but-curious", "malicious" or "both"')
    check_plan_scheduler(a.get("scheduler"), path)
    check_bounds(a.get("seeds"), a.get("jobs"), a.get("users"), where=str(path))
    fields = {k: v for k, v in a.items()}
    fields["sets"] = _table(doc, "protocol", path)
    return fields

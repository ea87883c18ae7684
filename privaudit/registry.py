"""Name -> class registries for protocols, attacks and defenses.

Built-ins register themselves with the decorators below; every module of
``privaudit.protocols``, ``privaudit.attacks`` and ``privaudit.defenses`` (except ``base`` and
private ``_`` modules) is imported on first lookup, so adding a module is all it takes to add a
built-in. Third-party packages add theirs through entry points in the groups
``privaudit.protocols``, ``privaudit.attacks`` and ``privaudit.defenses``; each entry point
names a class, registered under the entry point's name.

Registering never changes a class: the name a class answers to (``cls.name`` on the base
classes, :class:`RegisteredName`) is looked up here, so a plugin class need not spell its own
name and a class re-imported in a worker process is named once it is registered there
(:func:`adopt`).

Modules that need optional dependencies (torch, opacus) must import them lazily, inside the
functions that use them, so that registration never requires an extra.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar

from privaudit.errors import PrivauditError, did_you_mean

KINDS = ("protocol", "attack", "defense")
_PACKAGES = {"protocol": "privaudit.protocols", "attack": "privaudit.attacks", "defense": "privaudit.defenses"}
_GROUPS = {"protocol": "privaudit.protocols", "attack": "privaudit.attacks", "defense": "privaudit.defenses"}

_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}
#: the reverse index of _REGISTRY: class -> the name it is registered under
_NAMES: dict[type, str] = {}
_LOADED = {"builtins": False, "plugins": False}
_PLUGIN_ERRORS: list[str] = []

T = TypeVar("T", bound=type)


def _register(kind: str, name: str | None = None) -> Callable[[T], T]:
    def decorator(cls: T) -> T:
        own = cls.__dict__.get("name")
        own = own if isinstance(own, str) and own else None
        key = name or own
        if not key:
            raise TypeError(f"{cls.__name__} needs a 'name' to be registered as a {kind}")
        if own is not None and own != key:
            raise ValueError(f"{cls.__name__} declares name {own!r} but is registered as {kind} {key!r}")
        existing = _REGISTRY[kind].get(key)
        if existing is not None and existing is not cls:
            raise ValueError(f"{kind} {key!r} is registered twice ({existing.__module__} and {cls.__module__})")
        previous = _NAMES.get(cls)
        if previous is not None and previous != key:
            raise ValueError(f"{cls.__name__} is registered as {previous!r} already, not also as {key!r}")
        _REGISTRY[kind][key] = cls
        _NAMES[cls] = key
        return cls

    return decorator


def adopt(kind: str, name: str, cls: type) -> None:
    """Register ``cls`` as ``name`` unless it is already (a worker process that received a class
    registered in the main process, e.g. by a test, names it the same way)."""
    if name and _REGISTRY[kind].get(name) is not cls:
        _register(kind, name)(cls)


def name_of(cls: type) -> str:
    """The name ``cls`` (or its nearest registered base class) is registered under; ``""`` when
    none is. What ``cls.name`` answers on the base classes (:class:`RegisteredName`)."""
    for klass in cls.__mro__:
        key = _NAMES.get(klass)
        if key is not None:
            return key
    return ""


class RegisteredName:
    """Descriptor of ``name`` on the Protocol/Attack/Defense base classes: the registered name of
    the class (:func:`name_of`), read-only for the class; a subclass may still declare
    ``name = "..."`` itself (then it must be registered under that name)."""

    def __get__(self, obj: Any, owner: type) -> str:
        return name_of(owner)


def register_protocol(name: str | None = None):
    """Class decorator registering a :class:`~privaudit.protocols.base.Protocol`."""
    return _register("protocol", name)


def register_attack(name: str | None = None):
    """Class decorator registering an :class:`~privaudit.attacks.base.Attack`."""
    return _register("attack", name)


def register_defense(name: str | None = None):
    """Class decorator registering a :class:`~privaudit.defenses.base.Defense`."""
    return _register("defense", name)


def unregister(kind: str, name: str) -> type | None:
    """Remove ``name`` from the ``kind`` registry (for tests registering throwaway classes);
    the class removed, or None."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown registry kind {kind!r}")
    cls = _REGISTRY[kind].pop(name, None)
    if cls is not None and _NAMES.get(cls) == name:
        del _NAMES[cls]
    return cls


def _load_builtins() -> None:
    if _LOADED["builtins"]:
        return
    _LOADED["builtins"] = True
    for package_name in _PACKAGES.values():
        _import_public(package_name)


def _import_public(package_name: str) -> None:
    """Import every public module of a built-in package, family subpackages included."""
    package = importlib.import_module(package_name)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name == "base" or info.name.startswith("_"):
            continue
        if info.ispkg:
            _import_public(f"{package_name}.{info.name}")
        else:
            importlib.import_module(f"{package_name}.{info.name}")


def _load_plugins() -> None:
    if _LOADED["plugins"]:
        return
    _LOADED["plugins"] = True
    for kind, group in _GROUPS.items():
        for ep in entry_points(group=group):
            if ep.name in _REGISTRY[kind]:
                continue
            try:
                cls = ep.load()
            except Exception as exc:  # a broken plugin must not break the toolkit
                _PLUGIN_ERRORS.append(f"{group}:{ep.name}: {type(exc).__name__}: {exc}")
                continue
            _register(kind, ep.name)(cls)


def available(kind: str) -> dict[str, type]:
    """All registered classes of ``kind`` ("protocol", "attack", "defense"), by name."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown registry kind {kind!r}")
    _load_builtins()
    _load_plugins()
    return dict(sorted(_REGISTRY[kind].items()))


def get(kind: str, name: str) -> type:
    """The class registered as ``name``; a :class:`PrivauditError` listing the choices if none."""
    classes = available(kind)
    if name not in classes:
        choices = ", ".join(classes) or "none"
        raise PrivauditError(f"unknown {kind} {name!r}{did_you_mean(name, classes)} (available: {choices})")
    return classes[name]


def find(name: str) -> list[tuple[str, type]]:
    """Every ``(kind, class)`` registered as ``name`` (a name may be, e.g., both an attack and a defense)."""
    return [(kind, available(kind)[name]) for kind in KINDS if name in available(kind)]


def close_matches(name: str, n: int = 3) -> list[str]:
    """Registered names (any kind) spelled like ``name``."""
    import difflib

    names = sorted({key for kind in KINDS for key in available(kind)})
    lowered = {key.lower(): key for key in names}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)
    return [lowered[h] for h in hits]


def plugin_errors() -> list[str]:
    """Entry points that failed to load, as one-line descriptions."""
    _load_plugins()
    return list(_PLUGIN_ERRORS)


def describe(cls: Any) -> str:
    """First line of a class's ``description`` or docstring."""
    text = getattr(cls, "description", None) or (cls.__doc__ or "")
    return text.strip().splitlines()[0] if text.strip() else ""


def summary(kind: str, cls: Any) -> dict[str, Any]:
    """What ``privaudit describe`` shows of a registered class: its description, the facts of
    its kind (default attack; protocols read; strength and grid) and its declared parameters."""
    from privaudit.params import declared_of, describe_parameters

    facts: dict[str, Any] = {}
    if kind == "protocol":
        schema = cls.schema
        utility = [
            f"{m} ({'higher' if s.higher_is_better else 'lower'} is better)" for m, s in cls.utility_specs.items()
        ]
        facts = {
            "default attack": cls.default_attack,
            "attacker": cls.attacker,
            "messages": ", ".join(dict.fromkeys(m.kind for m in schema.messages)) if schema else "per transcript",
            "utility metrics": ", ".join(utility) or None,
            "main utility": cls.main_utility,
            "default sweep": cls.default_sweep_spec,
            "default defenses": ", ".join(cls.default_defense_specs) or None,
            "default users": cls.default_users,
        }
    elif kind == "attack":
        sweep = cls.default_sweep
        facts = {
            "party": cls.party,
            "threat": cls.threat,
            "deviations": ", ".join(getattr(cls, "deviations", ()) or ()) or None,
            "protocols": ", ".join(cls.protocols) or "any",
            "requires": ", ".join(cls.requires) or "nothing",
            "primary metric": cls.primary_metric,
            "default sweep": f"{sweep[0]} = {', '.join(map(str, sweep[1]))}" if sweep else None,
        }
    elif kind == "defense":
        applies = cls.applies_to
        grid = tuple(cls.default_grid)
        facts = {
            "strength": cls.strength,
            "default grid": ", ".join(map(str, grid)) if grid else None,
            "applies to": ", ".join(applies) if applies else "any protocol",
            "acts on": ", ".join(f"{k}.{f}" for k, f in cls.acts_on) or "no declared payload (joins no audit)",
            "capabilities": ", ".join(sorted(cls.capabilities)) or None,
            "adds to transcripts": _contribution(getattr(cls, "schema_contribution", None)),
            "privacy claim": cls.privacy_claim,
        }
    return {
        "kind": kind,
        "name": getattr(cls, "name", ""),
        "description": describe(cls),
        "facts": {k: v for k, v in facts.items() if v is not None},
        "parameters": describe_parameters(declared_of(cls)),
    }


def _contribution(declared: Any) -> str | None:
    """A defense's schema contribution in words (``privaudit describe``), or None if empty."""
    if declared is None:
        return None
    parts = [f"{m.kind} messages" for m in dict.fromkeys(declared.messages)]
    parts += [f"{kind}.{field} as {dtype}" for (kind, field), dtype in dict(declared.payload_dtypes).items()]
    parts += [f"{form} uploads" for form in declared.upload_forms]
    return ", ".join(dict.fromkeys(parts)) or None

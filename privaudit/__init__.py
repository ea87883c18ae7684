"""privaudit: privacy attacks and audits for federated recommender systems.

Protocols simulate a federated recommender and record a :class:`~privaudit.transcript.Transcript`
of everything each party sees; attacks play one party and reconstruct others' private data;
defenses change what is sent; experiments sweep a defense's strength and report attack accuracy
next to model utility.

The names used by the README's Python example are exported here (imported on first use, so
``import privaudit`` stays light): :func:`load_dataset`, :func:`synthetic`,
:class:`RatingsDataset`, :class:`Transcript`, :func:`get_protocol`, :func:`get_attack`,
:func:`get_defense`, :func:`build_experiment`, :func:`run_experiment`.
"""

__version__ = "0.1.0"

from privaudit.errors import DataError, MissingDependencyError, PrivauditError

__all__ = [
    "DataError",
    "MissingDependencyError",
    "PrivauditError",
    "RatingsDataset",
    "Transcript",
    "__version__",
    "build_experiment",
    "get_attack",
    "get_defense",
    "get_protocol",
    "load_dataset",
    "run_experiment",
    "synthetic",
]

_LAZY = {
    "load_dataset": ("privaudit.data", "load_dataset"),
    "synthetic": ("privaudit.data", "synthetic"),
    "RatingsDataset": ("privaudit.data", "RatingsDataset"),
    "Transcript": ("privaudit.transcript", "Transcript"),
    "build_experiment": ("privaudit.experiment", "build_experiment"),
    "run_experiment": ("privaudit.experiment", "run_experiment"),
}


def get_protocol(name: str) -> type:
    """The registered protocol class ``name`` (built-in or plugin); ``PrivauditError`` if unknown."""
    from privaudit import registry

    return registry.get("protocol", name)


def get_attack(name: str) -> type:
    """The registered attack class ``name``; ``PrivauditError`` if unknown."""
    from privaudit import registry

    return registry.get("attack", name)


def get_defense(name: str) -> type:
    """The registered defense class ``name``; ``PrivauditError`` if unknown."""
    from privaudit import registry

    return registry.get("defense", name)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'privaudit' has no attribute {name!r}")

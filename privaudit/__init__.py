"""privaudit: privacy attacks and audits for federated recommender systems.

Protocols simulate a federated recommender and record a :class:`~privaudit.transcript.Transcript`
of everything each party sees; attacks play one party and reconstruct others' private data;
defenses change what is sent; experiments sweep a defense's strength and report attack accuracy
next to model utility.

The names used by the README's Python example are exported here (imported on first use, so
``import privaudit`` stays light): :func:`load_dataset`, :func:`synthetic`,
:class:`RatingsDataset`, :class:`Transcript`, :func:`get_protocol`, :func:`get_attack`,
:func:`get_defense`, :class:`Sweep`, :func:`build_experiment`, :func:`run_experiment` and
:func:`write_report` (the report folder ``privaudit attack`` writes); what the runs return,
:class:`Results` and :class:`AuditResults` (:mod:`privaudit.api`), and :class:`Audit` /
:func:`run_audit` (what ``privaudit audit`` runs).
"""

__version__ = "0.1.0"

from privaudit.errors import DataError, MissingDependencyError, PrivauditError

__all__ = [
    "Audit",
    "AuditResults",
    "DataError",
    "MissingDependencyError",
    "PrivauditError",
    "RatingsDataset",
    "Results",
    "Sweep",
    "Transcript",
    "__version__",
    "build_experiment",
    "get_attack",
    "get_defense",
    "get_protocol",
    "load_dataset",
    "run_audit",
    "run_experiment",
    "synthetic",
    "write_report",
]

_LAZY = {
    "load_dataset": ("privaudit.data", "load_dataset"),
    "synthetic": ("privaudit.data", "synthetic"),
    "RatingsDataset": ("privaudit.data", "RatingsDataset"),
    "Sweep": ("privaudit.plan", "Sweep"),
    "Transcript": ("privaudit.transcript", "Transcript"),
    "build_experiment": ("privaudit.experiment", "build_experiment"),
    "run_experiment": ("privaudit.experiment", "run_experiment"),
    "Results": ("privaudit.api", "Results"),
    "AuditResults": ("privaudit.api", "AuditResults"),
    "Audit": ("privaudit.audit", "Audit"),
    "run_audit": ("privaudit.audit", "run_audit"),
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


def write_report(results, out_dir=None, *, experiment=None, force: bool = False):
    """Write the report folder ``privaudit attack`` writes for the same run: ``results.json``,
    ``results.csv``, the figures, ``report.md``, ``report.html`` and, given the ``experiment``
    (from :func:`build_experiment`) that produced ``results``, or when ``results`` is the
    :class:`Results` a plan returned, its ``plan.toml``; the folder (a :class:`pathlib.Path`).

    ``out_dir`` defaults to the CLI's ``privaudit-report/<protocol>-<sweep>-<dataset>/``. A folder
    that already holds files is refused (``PrivauditError``) unless ``force=True``, as on the CLI.

    >>> exp = privaudit.build_experiment(protocol="fedmvmf", noise="laplace", seeds=1, jobs=1)
    >>> privaudit.write_report(exp.run(), "report", experiment=exp)  # doctest: +SKIP
    """
    from privaudit import api

    return api.write_report(results, out_dir, experiment=experiment, force=force)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'privaudit' has no attribute {name!r}")

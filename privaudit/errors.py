"""Exception types and the optional-dependency check.

:class:`PrivauditError` marks a *user* mistake (bad flag, missing or malformed file, invalid
parameter). The CLI prints its message as one line on stderr and exits with code 2; anything
else that escapes is a bug and keeps its traceback.

Protocols, attacks and defenses that need an optional extra declare it as a class attribute
``requires_extras = ("ncf",)``; :func:`check_extras` refuses a plan that uses one whose modules
are not installed, before any work, and :func:`missing_dependency` maps an ``ImportError``
raised later (e.g. inside a worker process) to the same one-line error.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

#: Modules of each optional extra (``pip install "privaudit[EXTRA]"``).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "ncf": ("torch", "opacus"),
    "dask": ("dask", "distributed"),
}


class PrivauditError(ValueError):
    """A user-facing error: one clear line, exit code 2 from the CLI."""


class TranscriptError(PrivauditError):
    """A transcript file is malformed, unsafe or of an unknown format."""


class DataError(PrivauditError):
    """A dataset file or folder is missing or malformed."""


class MissingDependencyError(PrivauditError):
    """An optional dependency (an extra) is not installed."""

    def __init__(self, package: str, extra: str, what: str = "this feature"):
        super().__init__(f'{package} is required for {what}: pip install "privaudit[{extra}]"')
        self.package = package
        self.extra = extra
        self.what = what

    def __reduce__(self):  # picklable across worker processes (joblib, Dask)
        return (type(self), (self.package, self.extra, self.what))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or sys.modules[module] = None
        return False


def _edits(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def did_you_mean(name: str, choices: Iterable[str], distance: int = 2) -> str:
    """``"; did you mean `epochs`?"`` for the choices (ranked by :mod:`difflib`) within
    ``distance`` edits of ``name`` (case-insensitive; at most half of ``name``'s length, so a
    one-letter typo is only matched up to case); "" when none is that close."""
    import difflib

    lowered = {str(c).lower(): str(c) for c in choices}
    key = str(name).lower()
    limit = min(distance, len(key) // 2)
    ranked = difflib.get_close_matches(key, list(lowered), n=len(lowered), cutoff=0.0)
    close = [lowered[c] for c in ranked if _edits(key, c) <= limit][:3]
    return "; did you mean " + " or ".join(f"`{c}`" for c in close) + "?" if close else ""


def extra_installed(extra: str) -> bool:
    """Whether every module of the optional extra ``extra`` is importable (none is imported)."""
    return all(_installed(module) for module in EXTRA_MODULES.get(extra, ()))


def check_extras(objects: Iterable[object]) -> None:
    """Raise :class:`MissingDependencyError` if a class in ``objects`` declares an extra
    (``requires_extras``) whose modules are not importable; cheap (no module is imported)."""
    for obj in objects:
        for extra in getattr(obj, "requires_extras", ()) or ():
            for module in EXTRA_MODULES.get(extra, ()):
                if not _installed(module):
                    name = getattr(obj, "name", "") or getattr(obj, "__name__", "this feature")
                    raise MissingDependencyError(module, extra, repr(name))


def missing_dependency(exc: BaseException) -> MissingDependencyError | None:
    """The :class:`MissingDependencyError` of an ``ImportError`` of an optional extra's module
    (also one re-raised from a worker process), else None."""
    if isinstance(exc, MissingDependencyError):
        return exc
    if not isinstance(exc, ImportError):
        return None
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if not name:  # "import of torch halted; None in sys.modules" carries no name
        text = str(exc)
        name = next((m for mods in EXTRA_MODULES.values() for m in mods if f" {m}" in f" {text}"), "")
    for extra, modules in EXTRA_MODULES.items():
        if name in modules:
            return MissingDependencyError(name, extra)
    return None

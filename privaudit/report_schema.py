"""The versioned JSON Schemas of ``audit.json`` and ``results.json``, and the bounded reader of
both (what ``privaudit compare`` accepts).

The schemas ship inside the package (``privaudit/schemas/*.json``, the one source of truth;
``docs/audit-schema.json`` and ``docs/results-schema.json`` are copies a test keeps identical).
Every file privaudit writes carries ``schema_version`` (the constants below) and
``privaudit_version`` first (:func:`stamped`). A schema requires the stable core keys with their
types and allows additional properties in every object, so a new field is not a schema change;
removing or retyping a required key is, and bumps the version (a test pins each version's digest).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from privaudit import __version__, _safejson
from privaudit.errors import PrivauditError

__all__ = [
    "AUDIT_SCHEMA_VERSION",
    "RESULTS_SCHEMA_VERSION",
    "SCHEMA_FILES",
    "VERSIONS",
    "kind_of",
    "load",
    "problem",
    "schema",
    "stamped",
    "validate",
]

AUDIT_SCHEMA_VERSION = 1
RESULTS_SCHEMA_VERSION = 2
#: file kind -> the schema file in ``privaudit/schemas`` (and ``docs/``)
SCHEMA_FILES = {"audit": "audit-schema.json", "results": "results-schema.json"}
VERSIONS = {"audit": AUDIT_SCHEMA_VERSION, "results": RESULTS_SCHEMA_VERSION}
#: what a file read for a comparison may be: size, nesting depth, number of JSON values
MAX_BYTES = _safejson.RESULTS_MAX_BYTES
MAX_DEPTH = 64
MAX_VALUES = 4_000_000


@cache
def _schema_text(kind: str) -> str:
    return resources.files("privaudit").joinpath("schemas", SCHEMA_FILES[kind]).read_text(encoding="utf-8")


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of ``kind`` (``"audit"`` or ``"results"``), a fresh copy."""
    return json.loads(_schema_text(kind))


def stamped(doc: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """``doc`` with ``schema_version`` and ``privaudit_version`` as its first keys (what is written)."""
    rest = {k: v for k, v in doc.items() if k not in ("schema_version", "privaudit_version")}
    return {"schema_version": VERSIONS[kind], "privaudit_version": doc.get("privaudit_version") or __version__, **rest}


def kind_of(doc: Mapping[str, Any]) -> str | None:
    """``"results"`` (a sweep's points), ``"audit"`` (a matrix, or a transcript audit's rows) or None."""
    if "points" in doc:
        return "results"
    if "matrix" in doc or "rows" in doc:
        return "audit"
    return None


@cache
def _validator(kind: str):
    import jsonschema

    cls = jsonschema.validators.validator_for(schema(kind))
    return cls(schema(kind))


def problem(doc: Any, kind: str) -> str | None:
    """The most relevant schema error of ``doc`` as one line (``at /path: message``), or None."""
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator(kind).iter_errors(doc))
    if error is None:
        return None
    where = "/" + "/".join(str(p) for p in error.absolute_path)
    message = " ".join(str(error.message).split())
    if len(message) > 160:
        message = message[:157] + "..."
    return f"at {where}: {message}"


def validate(doc: Any, kind: str, where: str = "document") -> None:
    """Refuse ``doc`` unless it validates against the ``kind`` schema (one-line error)."""
    found = problem(doc, kind)
    if found is not None:
        raise PrivauditError(f"{where}: not a valid {kind}.json (schema {VERSIONS[kind]}) {found}")


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (a FIFO or device is never opened
    for a blocking read: opened non-blocking, checked with fstat)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PrivauditError(f"{path}: no such file") from None
    except OSError as exc:
        raise PrivauditError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise PrivauditError(f"{path}: is a folder (give the audit.json or results.json inside it)")
    if not stat.S_ISREG(st.st_mode):
        raise PrivauditError(f"{path}: not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise PrivauditError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):  # replaced between the two checks
            raise PrivauditError(f"{path}: not a regular file")
        if st.st_size > max_bytes:
            raise PrivauditError(f"{path}: {st.st_size} bytes, more than the limit of {max_bytes}")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PrivauditError(f"{path}: more than the limit of {max_bytes} bytes")
    return data


def load(path: str | Path, *, max_bytes: int = MAX_BYTES, legacy: bool = False) -> tuple[dict[str, Any], str]:
    """Read an ``audit.json`` or ``results.json`` -> (document, kind), refusing in one line a
    missing file, a folder, a FIFO or device, a file over ``max_bytes``, JSON nested deeper than
    :data:`MAX_DEPTH`, a non-object, a file of another schema version, or one that does not
    validate. ``legacy``: accept a file written before versioned schemas (no ``schema_version``;
    validated as the current version), for comparing with older trees."""
    path = Path(path)
    data = _read_bounded(path, max_bytes)
    try:
        doc = _safejson.loads(data, max_bytes=max_bytes, max_depth=MAX_DEPTH, max_values=MAX_VALUES)
    except _safejson.JSONLimitError as exc:
        raise PrivauditError(f"{path}: not a valid audit.json or results.json ({exc})") from None
    if not isinstance(doc, dict):
        raise PrivauditError(f"{path}: not an audit.json or results.json (expected a JSON object)")
    kind = kind_of(doc)
    if kind is None:
        raise PrivauditError(f"{path}: neither an audit.json (matrix or rows) nor a results.json (points)")
    version = doc.get("schema_version")
    if version is None and legacy:
        validate(stamped(doc, kind), kind, str(path))
        return doc, kind
    if version is None:
        writer = doc.get("privaudit_version")
        by = f" (written by privaudit {writer!s:.40})" if writer is not None else ""
        raise PrivauditError(
            f"{path}: has no schema_version{by}: written before versioned schemas; rerun it with this privaudit"
        )
    elif version != VERSIONS[kind] or isinstance(version, bool):
        raise PrivauditError(
            f"{path}: {kind}.json schema version {json.dumps(version)[:40]}, this privaudit reads version "
            f"{VERSIONS[kind]}"
        )
    validate(doc, kind, str(path))
    return doc, kind

"""The private side channel of a recording: each node's training data as .npy files (no pickle)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from privaudit.errors import PrivauditError

__all__ = ["merge_defenses", "merge_private", "write_defenses", "write_private"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MAX_PRIVATE_BYTES = 256 * 1024**2
#: Largest description of one node's DP mods (a few small dicts).
_MAX_DEFENSES_BYTES = 64 * 1024


def write_private(run_dir: str | Path, node_id: int, loader: Callable[[], dict]) -> None:
    """Write a node's private arrays once: ``run_dir/private/<node_id>/<name>.npy`` + ``fields.json``."""
    final = Path(run_dir) / "private" / str(int(node_id))
    if final.exists():
        return
    data = loader()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{int(node_id)}-", dir=final.parent))
    names = []
    for name, value in data.items():
        if not _NAME.match(str(name)):
            raise PrivauditError(f"private data field {name!r}: use letters, digits, '_', '-', '.'")
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            raise PrivauditError(f"private data field {name!r} is an object array")
        np.save(tmp / f"{name}.npy", arr, allow_pickle=False)
        names.append(str(name))
    (tmp / "fields.json").write_text(json.dumps({"fields": names}))
    try:
        os.rename(tmp, final)
    except OSError:  # another process of the same node won the race
        shutil.rmtree(tmp, ignore_errors=True)


def merge_private(run_dir: str | Path) -> dict[int, dict[str, np.ndarray]]:
    """Read every node's private files back (validated, ``allow_pickle=False``): node id -> arrays."""
    root = Path(run_dir) / "private"
    out: dict[int, dict[str, np.ndarray]] = {}
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or not d.is_dir():
            continue
        if not d.name.isdigit():
            raise PrivauditError(f"{d}: unexpected folder in the private side channel")
        try:
            fields = json.loads((d / "fields.json").read_text())["fields"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PrivauditError(f"{d}: unreadable fields.json ({exc})") from None
        arrays = {}
        for name in fields:
            if not isinstance(name, str) or not _NAME.match(name):
                raise PrivauditError(f"{d}: invalid private field name {name!r}")
            f = d / f"{name}.npy"
            if not f.is_file() or f.stat().st_size > _MAX_PRIVATE_BYTES:
                raise PrivauditError(f"{f}: missing or larger than {_MAX_PRIVATE_BYTES} bytes")
            try:
                arrays[name] = np.load(f, allow_pickle=False)
            except ValueError as exc:
                raise PrivauditError(f"{f}: not a plain .npy array ({exc})") from None
        out[int(d.name)] = arrays
    return out


def write_defenses(run_dir: str | Path, node_id: int, entries: list[dict]) -> None:
    """Write once what a node says of its DP mods: ``run_dir/defenses/<node_id>.json``."""
    final = Path(run_dir) / "defenses" / f"{int(node_id)}.json"
    if final.exists():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{int(node_id)}-", dir=final.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(entries, f)
    os.replace(tmp, final)


def merge_defenses(run_dir: str | Path) -> tuple[dict[str, dict], dict[str, set[int]]]:
    """Every node's DP mod descriptions (:func:`write_defenses`): distinct entry (keyed by its
    JSON) -> entry, and -> the node ids that reported it. Entries must be objects with a string
    ``name``; anything else is left out."""
    root = Path(run_dir) / "defenses"
    entries: dict[str, dict] = {}
    reported: dict[str, set[int]] = {}
    if not root.is_dir():
        return entries, reported
    for f in sorted(root.glob("*.json")):
        if not f.stem.isdigit() or not f.is_file() or f.stat().st_size > _MAX_DEFENSES_BYTES:
            continue
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for e in data if isinstance(data, list) else []:
            if isinstance(e, dict) and isinstance(e.get("name"), str):
                key = json.dumps(e, sort_keys=True)
                entries.setdefault(key, e)
                reported.setdefault(key, set()).add(int(f.stem))
    return entries, reported

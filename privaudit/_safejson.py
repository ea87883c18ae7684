"""Bounded JSON parsing for files that come from outside (transcript manifests, results.json).

``json.loads`` recurses once per nesting level (a document nested 100,000 levels deep ends in
``RecursionError``) and builds one Python object per value (a 250 MiB document of ``[{},{},...]``
takes several GB). :func:`loads` checks the size, the nesting depth, the number of containers
and the number of values on the raw bytes first, at C speed and in memory proportional to the
number of brackets, and only then calls ``json.loads``. Leaf module: stdlib and numpy only.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

__all__ = ["DEFAULT_MAX_DEPTH", "RESULTS_MAX_BYTES", "JSONLimitError", "load_file", "loads"]

DEFAULT_MAX_DEPTH = 64
RESULTS_MAX_BYTES = 256 * 1024**2  # results.json / audit.json read back by `privaudit report`

# a JSON string literal (escapes included); brackets and commas inside strings are not structure
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STRUCTURE = bytes(c for c in range(256) if c not in b"[]{}")  # deleted to keep only brackets


class JSONLimitError(ValueError):
    """A document is not valid JSON or exceeds a limit (message: one line, no traceback)."""


def _depth(brackets: bytes) -> int:
    """Maximum nesting depth of a string of ``[]{}`` characters."""
    if not brackets:
        return 0
    b = np.frombuffer(brackets, dtype=np.uint8)
    step = np.where((b == ord("[")) | (b == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(step, dtype=np.int32).max())


def loads(
    data: bytes | str,
    *,
    max_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_containers: int | None = None,
    max_values: int | None = None,
) -> Any:
    """Parse ``data`` as UTF-8 JSON after checking its size and shape.

    Parameters
    ----------
    data : bytes or str
        The document.
    max_bytes : int
        Refuse documents longer than this (bytes, UTF-8).
    max_depth : int
        Refuse documents nested deeper than this (objects and arrays count one level each).
    max_containers, max_values : int or None
        Refuse documents holding more objects/arrays, or more values (array elements and object
        members), than this; ``None``: no limit besides ``max_bytes``.

    Raises
    ------
    JSONLimitError
        One line naming the limit or the JSON syntax error.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > max_bytes:
        raise JSONLimitError(f"{len(data)} bytes, more than the limit of {max_bytes}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONLimitError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    depth = _depth(_STRING.sub(b"", data).translate(None, _STRUCTURE))
    if depth > max_depth:
        raise JSONLimitError(f"nested {depth} levels deep, more than the limit of {max_depth}")
    bare = _STRING.sub(b'""', data)
    containers = bare.count(b"{") + bare.count(b"[")
    if max_containers is not None and containers > max_containers:
        raise JSONLimitError(f"{containers} objects/arrays, more than the limit of {max_containers}")
    if max_values is not None:
        values = bare.count(b",") + containers
        if values > max_values:
            raise JSONLimitError(f"about {values} values, more than the limit of {max_values}")
    del bare
    try:
        return json.loads(text)
    except RecursionError:  # pragma: no cover - the depth check above runs first
        raise JSONLimitError(f"nested more than {max_depth} levels deep") from None
    except ValueError as exc:
        raise JSONLimitError(f"not valid JSON ({exc})") from None


def load_file(path: Any, *, max_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH, **limits: Any) -> Any:
    """Read and parse a JSON file with :func:`loads`; the size is checked before reading."""
    from pathlib import Path

    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise JSONLimitError(f"{size} bytes, more than the limit of {max_bytes}")
        data = path.read_bytes()
    except OSError as exc:
        raise JSONLimitError(f"cannot be read ({exc.strerror or exc})") from None
    return loads(data, max_bytes=max_bytes, max_depth=max_depth, **limits)

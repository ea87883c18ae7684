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

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "RESULTS_MAX_BYTES",
    "TOML_MAX_BYTES",
    "JSONLimitError",
    "load_file",
    "loads",
    "toml_loads",
]

DEFAULT_MAX_DEPTH = 64
#: Longest run of digits a number may have (a float64 needs 17 significant digits and 3 of exponent).
MAX_NUMBER_DIGITS = 40
RESULTS_MAX_BYTES = 256 * 1024**2  # results.json / audit.json read back by `privaudit report`
TOML_MAX_BYTES = 1024**2  # plan.toml, a Flower app's pyproject.toml
TOML_MAX_DEPTH = 32

# a JSON string literal (escapes included); brackets and commas inside strings are not structure
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STRUCTURE = bytes(c for c in range(256) if c not in b"[]{}")  # deleted to keep only brackets


class JSONLimitError(ValueError):
    """A document is not valid JSON or exceeds a limit (message: one line, no traceback)."""


def _depth(brackets: bytes, chunk: int = 1 << 22) -> int:
    """Maximum nesting depth of a string of ``[]{}`` characters (in chunks: memory stays a few
    times ``chunk`` bytes however many brackets there are)."""
    deepest, level = 0, 0
    for start in range(0, len(brackets), chunk):
        b = np.frombuffer(brackets, dtype=np.uint8, count=min(chunk, len(brackets) - start), offset=start)
        step = (b == ord("[")).view(np.int8) + (b == ord("{")).view(np.int8)
        step = 2 * step.astype(np.int64) - 1
        running = np.cumsum(step) + level
        deepest = max(deepest, int(running.max()))
        level = int(running[-1])
    return deepest


def loads(
    data: bytes | str,
    *,
    max_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_containers: int | None = None,
    max_values: int | None = None,
    max_number_digits: int | None = MAX_NUMBER_DIGITS,
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
    max_number_digits : int or None
        Refuse a number with a run of more digits than this (``MAX_NUMBER_DIGITS``; a 401-digit
        integer overflows every float conversion downstream).

    Raises
    ------
    JSONLimitError
        One line naming the limit or the JSON syntax error.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > max_bytes:
        raise JSONLimitError(f"{len(data)} bytes, more than the limit of {max_bytes}")
    bare = _STRING.sub(b'""', data)  # strings emptied: what is left is structure and numbers
    depth = _depth(bare.translate(None, _STRUCTURE))
    if depth > max_depth:
        raise JSONLimitError(f"nested {depth} levels deep, more than the limit of {max_depth}")
    containers = bare.count(b"{") + bare.count(b"[")
    if max_containers is not None and containers > max_containers:
        raise JSONLimitError(f"{containers} objects/arrays, more than the limit of {max_containers}")
    if max_values is not None:
        values = bare.count(b",") + containers
        if values > max_values:
            raise JSONLimitError(f"about {values} values, more than the limit of {max_values}")
    if max_number_digits is not None:
        long = re.search(rb"[0-9]{%d}" % (max_number_digits + 1), bare)
        if long:
            raise JSONLimitError(f"a number has more than {max_number_digits} digits")
    del bare
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONLimitError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text)
    except RecursionError:  # pragma: no cover - the depth check above runs first
        raise JSONLimitError(f"nested more than {max_depth} levels deep") from None
    except ValueError as exc:
        raise JSONLimitError(f"not valid JSON ({exc})") from None


# TOML strings (multi-line first) and comments: brackets inside them are not structure
_TOML_SKIP = re.compile(r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*', re.DOTALL)


def _object_depth(value: Any, limit: int) -> int:
    """Nesting depth of parsed dicts/lists (iterative; stops counting past ``limit``)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            d += 1
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack.extend((x, d) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def toml_loads(text: str, *, max_bytes: int = TOML_MAX_BYTES, max_depth: int = TOML_MAX_DEPTH) -> dict:
    """``tomllib.loads`` after checking the size and the bracket nesting depth (arrays and inline
    tables nested 1,000 deep make tomllib recurse into ``RecursionError``); dotted keys and table
    headers are checked on the parsed result."""
    import tomllib

    data = text.encode("utf-8", "surrogatepass")
    if len(data) > max_bytes:
        raise JSONLimitError(f"{len(data)} bytes, more than the limit of {max_bytes}")
    stripped = _TOML_SKIP.sub("", text).encode("utf-8", "surrogatepass").translate(None, _STRUCTURE)
    depth = _depth(stripped)
    if depth > max_depth:
        raise JSONLimitError(f"nested {depth} levels deep, more than the limit of {max_depth}")
    try:
        doc = tomllib.loads(text)
    except RecursionError:
        raise JSONLimitError(f"nested more than {max_depth} levels deep") from None
    except tomllib.TOMLDecodeError as exc:
        raise JSONLimitError(f"not valid TOML ({exc})") from None
    if _object_depth(doc, max_depth) > max_depth:
        raise JSONLimitError(f"tables nested more than {max_depth} levels deep")
    return doc


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

"""Reader of delimited text files (CSV, TSV, ``::`` and ``|`` separated): rows with a fixed
number of fields, an all-numeric file parsed in one vectorized pass, and every malformed line
reported as one :class:`~privaudit.errors.DataError` naming the file and its 1-based line."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from operator import methodcaller
from pathlib import Path

import numpy as np

from privaudit.errors import DataError

SEP_NAMES = {"\t": "tab", "::": "'::'", "|": "'|'", ",": "comma", ";": "semicolon"}


INT_LIMIT = 2.0**53  # integers above this are not exact in float64


class Table:
    """Parsed rows of a delimited text file with a fixed number of fields per row.

    Either ``flat`` (all str fields, row-major: field ``j`` of row ``k`` is
    ``flat[k * nfields + j]``) or ``numeric`` (an (n, nfields) int64/float64 array of an
    all-numeric file, parsed in one vectorized pass) holds the data; ``line_no[k]`` is the
    1-based line of row ``k``. A flat list of strings (rather than one list per row) keeps
    parsing fast: str objects are not tracked by the cyclic garbage collector.
    """

    def __init__(
        self,
        path: Path,
        line_no: np.ndarray,
        nfields: int,
        flat: list[str] | None = None,
        numeric: np.ndarray | None = None,
    ):
        self.path = path
        self.line_no = line_no
        self.nfields = nfields
        self.flat = flat
        self.numeric = numeric

    def __len__(self) -> int:
        return int(self.line_no.size)

    def error(self, k: int, msg: str) -> DataError:
        return DataError(f"{self.path} line {int(self.line_no[k])}: {msg}")

    def field(self, k: int, j: int) -> str:
        """Text of field ``j`` on row ``k`` (for messages)."""
        if self.flat is not None:
            return self.flat[k * self.nfields + j].strip()
        return str(self.numeric[k, j]) if self.numeric.dtype.kind == "i" else f"{self.numeric[k, j]:.15g}"

    def column(self, j: int) -> list[str]:
        if self.flat is None:
            return [self.field(k, j) for k in range(len(self))]
        return self.flat[j :: self.nfields]

    def row(self, k: int) -> list[str]:
        """All fields of row ``k``."""
        return [self.field(k, j) for j in range(self.nfields)]

    def ints(self, j: int, what: str) -> np.ndarray:
        """Column ``j`` as int64 (one-line DataError at the first bad value)."""
        if self.numeric is not None:  # integrality checked when parsed
            return self.numeric[:, j].astype(np.int64)
        col = self.column(j)
        try:
            return np.fromiter(map(int, col), dtype=np.int64, count=len(col))
        except (ValueError, OverflowError):
            for k, v in enumerate(col):
                try:
                    if not -(2**63) <= int(v) < 2**63:
                        raise ValueError
                except ValueError:
                    raise self.error(k, f"{what} {v.strip()!r} is not an integer") from None
            raise  # pragma: no cover

    def floats(self, j: int, what: str) -> np.ndarray:
        """Column ``j`` as finite float64 (one-line DataError at the first bad value)."""
        if self.numeric is not None:  # finiteness checked when parsed
            return self.numeric[:, j].astype(np.float64)
        col = self.column(j)
        try:
            out = np.fromiter(map(float, col), dtype=np.float64, count=len(col))
        except ValueError:
            for k, v in enumerate(col):
                try:
                    float(v)
                except ValueError:
                    raise self.error(k, f"{what} {v.strip()!r} is not a number") from None
            raise  # pragma: no cover
        bad = np.flatnonzero(~np.isfinite(out))
        if bad.size:
            raise self.error(bad[0], f"{what} {col[bad[0]].strip()!r} is not a finite number")
        return out

    def timestamps(self, j: int) -> np.ndarray:
        """Column ``j`` as int64 unix times (integers, or whole-valued floats)."""
        try:
            return self.ints(j, "timestamp")
        except DataError:
            vals = self.floats(j, "timestamp")
            frac = np.flatnonzero((vals != np.floor(vals)) | (np.abs(vals) >= INT_LIMIT))
            if frac.size:
                raise self.error(frac[0], f"timestamp {self.field(frac[0], j)!r} is not a whole number") from None
            return vals.astype(np.int64)


def read_lines(path: Path, encoding: str) -> list[str]:
    """Lines of a text file (BOM stripped); DataError if missing, unreadable or badly encoded."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path} line {line}: not valid {encoding} text") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.splitlines()


def parse_numeric(lines: list[str], sep: str, nfields: int, int_cols: Sequence[int]) -> np.ndarray | None:
    """Vectorized parse of all-numeric lines with exactly ``nfields`` fields each.

    Returns the (n, nfields) int64 (all integers) or float64 array, or None when anything is
    unusual (empty or space-padded fields, non-numbers, non-finite values, non-integral ids):
    the caller then falls back to the per-line parser, which reports the exact line.
    """
    body = "\n".join(lines)
    other_space = set(" \t\r\x0b\x0c") - set(sep)
    if (
        any(c in body for c in other_space)
        or sep + sep in body
        or ("\n" + sep) in body
        or (sep + "\n") in body
        or body.startswith(sep)
        or body.endswith(sep)
    ):
        return None
    if sep != "\t":
        body = body.replace(sep, " ")
    expected = len(lines) * nfields
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:  # integer parsing is much faster than float parsing
            flat = np.fromstring(body, dtype=np.int64, sep=" ")
        except (ValueError, DeprecationWarning):
            flat = None
        if flat is not None:
            info = np.iinfo(np.int64)
            if flat.size != expected or (flat == info.max).any() or (flat == info.min).any():
                return None
            return flat.reshape(len(lines), nfields)
        try:
            flat = np.fromstring(body, dtype=np.float64, sep=" ")
        except (ValueError, DeprecationWarning):
            return None
    if flat.size != expected or not np.isfinite(flat).all():
        return None
    out = flat.reshape(len(lines), nfields)
    ints = out[:, [j for j in int_cols if j < nfields]]
    if (ints != np.floor(ints)).any() or (np.abs(ints) >= INT_LIMIT).any():
        return None
    return out


def read_table(
    path: Path,
    sep: str,
    nfields: int | Sequence[int],
    *,
    encoding: str = "utf-8",
    skip_header: bool = False,
    int_cols: Sequence[int] | None = None,
) -> Table:
    """Split every non-blank line of ``path`` on ``sep`` and check the field count.

    Args:
        nfields: allowed field count(s); all rows must have the same count.
        skip_header: drop the first non-blank line.
        int_cols: if given, the file is expected to be all-numeric with these integer columns
            and is parsed with a fast vectorized path (falling back to per-line parsing).
    """
    lines = read_lines(path, encoding)
    allowed = np.array([nfields] if isinstance(nfields, int) else list(nfields), dtype=np.int64)
    numbered = np.arange(1, len(lines) + 1)
    sizes = np.fromiter(map(methodcaller("count", sep), lines), dtype=np.int64, count=len(lines)) + 1
    odd = np.flatnonzero(~np.isin(sizes, allowed))
    blank = [k for k in odd if not lines[k].strip()]
    first = next((k for k, line in enumerate(lines) if line.strip()), None) if skip_header else None
    if first is not None:
        blank.append(first)
    if blank:
        keep = np.setdiff1d(numbered - 1, blank)
        lines = [lines[k] for k in keep]
        numbered, sizes = keep + 1, sizes[keep]
        odd = np.flatnonzero(~np.isin(sizes, allowed))
    if odd.size:
        k = int(odd[0])
        want = " or ".join(str(a) for a in allowed)
        raise DataError(
            f"{path} line {numbered[k]}: expected {want} {SEP_NAMES.get(sep, repr(sep))}-separated "
            f"fields, got {sizes[k]}"
        )
    nf = int(sizes[0]) if lines else int(allowed[0])
    mixed = np.flatnonzero(sizes != nf)
    if mixed.size:
        k = int(mixed[0])
        raise DataError(f"{path} line {numbered[k]}: expected {nf} fields like line {numbered[0]}, got {sizes[k]}")
    if int_cols is not None and lines:
        numeric = parse_numeric(lines, sep, nf, int_cols)
        if numeric is not None:
            return Table(path, numbered, nf, numeric=numeric)
    return Table(path, numbered, nf, flat=sep.join(lines).split(sep) if lines else [])

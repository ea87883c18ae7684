"""Transcript format version 2 (columnar): one member per (kind, round, field) column.

The payload arrays of every message of one ``(kind, round, field)`` that share a dtype and a
trailing shape are concatenated along their first axis into one ``.npy`` member
(``columns/<c>.npy``, shape ``(rows, *trailing)``), with an int64 offsets member
(``columns/<c>.offsets.npy``, ``n + 1`` entries for ``n`` messages: message ``k``'s rows are
``offsets[k]:offsets[k+1]``). A 0-d payload is one row of a ``scalar`` column. The manifest lists
each column (``kind``, ``round``, ``field``, ``dtype``, trailing ``shape``, ``rows``, ``messages``,
``scalar``, ``stored``, member names) and, per message, each payload as ``[column, slot, rows]``.

Columns of 1 MiB or more and float columns of 1,024 elements or more are stored uncompressed and
memory-mapped read-only on load (the payloads are views: loading touches no payload data); the
others are deflated and inflated on load under the byte budget. :class:`TranscriptWriter` writes
columns as they complete, so a protocol run can stream its rounds to disk.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from privaudit.transcript import Message, Transcript
from privaudit.transcript_io import v1
from privaudit.transcript_io._safe import (
    _fail,
    _open_npy,
    _read_npy,
    _safe_member,
    _shape_list,
    _simple_dtype,
    commit_temp,
    member_data_offset,
    message_fields,
    npy_header_bytes,
    open_temp,
)

VERSION = 2
STORED_MIN_BYTES = 1 << 20  # a column this large is stored (memory-mapped on load) whatever its dtype
STORED_MIN_FLOATS = 1024  # float columns deflate by ~3 %: stored from this many elements
CHUNK_BYTES = 256 * 1024**2  # a streamed column this large is written at once, as a part of its column


class _Column:
    """A column being gathered: the arrays of one (kind, round, field, dtype, trailing shape)."""

    __slots__ = ("arrays", "dtype", "field", "index", "kind", "nbytes", "owners", "round", "rows", "scalar", "trailing")

    def __init__(self, kind: str, rnd: int, name: str, arr: np.ndarray) -> None:
        self.kind, self.round, self.field = kind, rnd, name
        self.dtype, self.scalar = arr.dtype, arr.ndim == 0
        self.trailing = () if self.scalar else tuple(arr.shape[1:])
        self.arrays: list[np.ndarray] = []
        self.owners: list[Message] = []
        self.rows = self.nbytes = 0
        self.index = -1

    def add(self, arr: np.ndarray, owner: Message) -> tuple[int, int]:
        """Append one message's array; its ``(slot, rows)``."""
        rows = 1 if self.scalar else arr.shape[0]
        self.arrays.append(arr)
        self.owners.append(owner)
        self.rows += rows
        self.nbytes += arr.nbytes
        return len(self.arrays) - 1, rows

    @property
    def stored(self) -> bool:
        floats = self.dtype.kind in "fc" and self.nbytes // self.dtype.itemsize >= STORED_MIN_FLOATS
        return floats or self.nbytes >= STORED_MIN_BYTES


def _key(kind: str, rnd: int, name: str, arr: np.ndarray) -> tuple:
    return (kind, rnd, name, arr.dtype.str, arr.ndim == 0, tuple(arr.shape[1:]))


class TranscriptWriter:
    """Writes a version-2 ``.ptx`` file message by message (a context manager).

    Parameters
    ----------
    path : the file to write; it appears (atomically, by rename) when :meth:`close` succeeds.
    include_private : bool
        Whether ``private`` messages are written.
    stream : bool
        Write each round's columns when a message of another round arrives (and a column reaching
        ``chunk_bytes`` at once), then point the written messages' stored payloads at the file
        (read-only memory maps), so that the arrays of finished rounds need not stay in memory.
        Without it every column is written by :meth:`close` (fewest members).
    chunk_bytes : int
        Size at which a streamed column is written before its round ends.
    """

    def __init__(
        self, path: str | Path, *, include_private: bool = True, stream: bool = False, chunk_bytes: int = CHUNK_BYTES
    ) -> None:
        self.path = Path(path)
        self.include_private, self.stream, self.chunk_bytes = include_private, stream, chunk_bytes
        self._tmp, self._fh = open_temp(self.path)
        self._zf = zipfile.ZipFile(self._fh, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True)
        self._pending: dict[tuple, _Column] = {}
        self._columns: list[dict[str, Any]] = []
        self._records: list[tuple[Message, dict[str, tuple[_Column, int, int]]]] = []
        self._round: int | None = None
        self._last_seq = -1
        self.closed = False

    # -------------------------------------------------------------- messages
    def append(self, m: Message) -> None:
        """Add one message (its ``seq`` must increase); its payload arrays must not change later."""
        if self.closed:
            raise ValueError("the transcript writer is closed")
        if m.seq <= self._last_seq:
            raise ValueError(f"message seq {m.seq} does not increase (previous {self._last_seq})")
        self._last_seq = m.seq
        if m.kind == "private" and not self.include_private:
            return
        if self.stream and self._round is not None and m.round != self._round:
            self.end_round()
        self._round = m.round
        refs = {}
        for name, value in m.payload.items():
            arr = np.asarray(value)
            if arr.dtype.hasobject:
                raise TypeError(f"message {m.seq} payload {name!r} is an object array")
            key = _key(m.kind, m.round, name, arr)
            col = self._pending.get(key)
            if col is None:
                col = self._pending[key] = _Column(m.kind, m.round, name, arr)
            refs[name] = (col, *col.add(arr, m))
            if self.stream and col.nbytes >= self.chunk_bytes:
                self._flush(self._pending.pop(key))
        self._records.append((m, refs))

    def add(
        self,
        round: int,
        sender: str,
        receiver: str,
        kind: str,
        payload: dict[str, np.ndarray] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Message:
        """Add a message built here (``seq`` = the next one) and return it."""
        m = Message(self._last_seq + 1, int(round), sender, receiver, kind, dict(payload or {}), dict(meta or {}))
        self.append(m)
        return m

    def end_round(self) -> None:
        """Write every column gathered so far."""
        for col in list(self._pending.values()):
            self._flush(col)
        self._pending.clear()

    # -------------------------------------------------------------- columns
    def _flush(self, col: _Column) -> None:
        col.index = index = len(self._columns)
        data_name, offsets_name = f"columns/{index}.npy", f"columns/{index}.offsets.npy"
        shape = (col.rows, *col.trailing)
        header = npy_header_bytes(col.dtype, shape)
        stored = col.stored
        target: str | zipfile.ZipInfo = data_name
        if stored:
            target = zipfile.ZipInfo(data_name, date_time=time.localtime()[:6])
            target.compress_type = zipfile.ZIP_STORED
            target.external_attr = 0o600 << 16  # as ZipFile.open gives a member opened by name
        with self._zf.open(target, "w", force_zip64=len(header) + col.nbytes > 2**31) as out:
            out.write(header)
            for arr in col.arrays:
                out.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
        info = self._zf.getinfo(data_name)
        offsets = np.zeros(len(col.arrays) + 1, dtype=np.int64)
        np.cumsum([1 if col.scalar else a.shape[0] for a in col.arrays], out=offsets[1:])
        with self._zf.open(offsets_name, "w") as out:
            np.lib.format.write_array(out, offsets, allow_pickle=False)
        self._columns.append(
            {
                "kind": col.kind,
                "round": int(col.round),
                "field": col.field,
                "dtype": col.dtype.str,
                "shape": list(col.trailing),
                "scalar": col.scalar,
                "rows": int(col.rows),
                "messages": len(col.arrays),
                "stored": stored,
                "data": data_name,
                "offsets": offsets_name,
            }
        )
        if self.stream and stored and col.nbytes:
            self._remap(col, info, len(header), offsets)
        col.arrays, col.owners = [], []

    def _remap(self, col: _Column, info: zipfile.ZipInfo, header_len: int, offsets: np.ndarray) -> None:
        """Point the column's messages at their rows in the file being written (read-only maps)."""
        self._fh.flush()
        fd = self._fh.fileno()
        start = member_data_offset(self._tmp, fd, info, os.fstat(fd).st_size) + header_len
        data = np.memmap(self._tmp, dtype=col.dtype, mode="r", offset=start, shape=(col.rows, *col.trailing))
        data = data.view(np.ndarray)
        for k, m in enumerate(col.owners):
            view = data[offsets[k] : offsets[k + 1]]
            if m.payload.get(col.field) is col.arrays[k]:
                m.payload[col.field] = view.reshape(()) if col.scalar else view

    # -------------------------------------------------------------- closing
    def close(self, transcript: Transcript) -> Path:
        """Write the remaining columns and the manifest (header fields from ``transcript``:
        protocol, config, seed, dataset, parties) and move the file into place."""
        if self.closed:
            raise ValueError("the transcript writer is closed")
        try:
            self.end_round()
            header = v1.header_record(transcript, VERSION, self.include_private)
            header["private_included"] = any(m.kind == "private" for m, _ in self._records)
            messages = [
                v1.message_record(m, {name: [col.index, slot, rows] for name, (col, slot, rows) in refs.items()})
                for m, refs in self._records
            ]
            manifest = header | {"columns": self._columns, "messages": messages}
            self._zf.writestr("manifest.json", json.dumps(manifest, separators=(",", ":")))
            self._zf.close()
            commit_temp(self._tmp, self._fh, self.path)
        except BaseException:
            self.abort()
            raise
        self.closed = True
        return self.path

    def abort(self) -> None:
        """Drop the file being written (the file already at ``path`` is left untouched)."""
        self.closed = True
        try:
            self._zf.close()
        except Exception:  # noqa: BLE001, S110 - the archive is being thrown away
            pass
        self._fh.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None and not self.closed:
            self.abort()
        elif not self.closed:
            raise ValueError("close(transcript) the writer before leaving its block (it holds no header)")


def save(transcript: Transcript, path: Path, include_private: bool) -> Path:
    """Write ``transcript`` as a version-2 archive (every column written at the end)."""
    writer = TranscriptWriter(path, include_private=include_private)
    try:
        for m in transcript.messages:
            writer.append(m)
    except BaseException:
        writer.abort()
        raise
    return writer.close(transcript)


# ------------------------------------------------------------------------------ reading


@dataclass
class _Spec:
    """One column of the manifest, checked against the archive."""

    kind: str
    round: int
    field: str
    dtype: np.dtype
    trailing: list[int]
    scalar: bool
    rows: int
    messages: int
    stored: bool
    data: str
    offsets: str


_SPEC_TYPES = {
    "kind": str,
    "round": int,
    "field": str,
    "rows": int,
    "messages": int,
    "scalar": bool,
    "stored": bool,
    "data": str,
    "offsets": str,
}


def _spec(path: Path, c: int, raw: Any, infos: dict[str, zipfile.ZipInfo], used: set[str]) -> _Spec:
    where = f"{path}: column {c}"
    if not isinstance(raw, dict):
        raise _fail(where, "must be an object")
    for key, types in _SPEC_TYPES.items():
        value = raw.get(key)
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            raise _fail(where, f"field {key!r} is missing or has the wrong type")
    dtype, trailing = _simple_dtype(raw.get("dtype")), _shape_list(raw.get("shape"))
    if dtype is None:
        raise _fail(where, "invalid dtype in the manifest")
    if trailing is None or (raw["scalar"] and trailing):
        raise _fail(where, "invalid shape in the manifest")
    if raw["rows"] < 0 or raw["messages"] < 0:
        raise _fail(where, "rows and messages must not be negative")
    for key in ("data", "offsets"):
        member = _safe_member(raw[key], where)
        if member not in infos or member == "manifest.json":
            raise _fail(where, f"{key} member {member!r} is missing from the archive")
        if member in used:
            raise _fail(where, f"member {member!r} is used by two columns")
        used.add(member)
    keys = ("kind", "round", "field", "scalar", "rows", "messages", "stored", "data", "offsets")
    return _Spec(dtype=dtype, trailing=list(trailing), **{k: raw[k] for k in keys})


def _check_offsets(path: Path, c: int, spec: _Spec, offsets: np.ndarray) -> None:
    where = f"{path}: column {c} (member {spec.offsets!r})"
    if offsets.size and offsets.min() < 0:
        raise _fail(where, f"negative offset {int(offsets.min())}")
    if offsets[0] != 0:
        raise _fail(where, f"offsets start at {int(offsets[0])}, not 0")
    steps = np.diff(offsets)
    if steps.size and steps.min() < 0:
        k = int(np.argmax(steps < 0))
        raise _fail(where, f"offsets are not monotone (slot {k}: {int(offsets[k])} then {int(offsets[k + 1])})")
    if offsets[-1] > spec.rows:
        raise _fail(where, f"offsets run to row {int(offsets[-1])}, out of range of the column's {spec.rows} rows")
    if offsets[-1] != spec.rows:
        raise _fail(where, f"offsets end at row {int(offsets[-1])} but the manifest says the column has {spec.rows}")
    if spec.scalar and steps.size and (steps != 1).any():
        raise _fail(where, "a scalar column holds one row per message")


def _mapped(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, expected: dict, budget: int) -> np.ndarray:
    """A stored member as a read-only memory map (header checked first); read into memory when
    the file cannot be mapped."""
    fh, shape, fortran, dtype, header_len = _open_npy(path, zf, info, expected, budget)
    fh.close()
    if fortran and len(shape) > 1:
        raise _fail(path, f"member {info.filename!r}: a column must be C-ordered")
    if not info.file_size - header_len:
        return np.zeros(shape, dtype)
    try:
        with open(path, "rb") as raw:
            fd = raw.fileno()
            start = member_data_offset(path, fd, info, os.fstat(fd).st_size) + header_len
        return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=shape).view(np.ndarray)
    except (OSError, ValueError):  # a file that cannot be mapped (a pipe-backed FUSE file, ...): read it
        return _read_npy(path, zf, info, expected, budget)


def _column(path: Path, zf: zipfile.ZipFile, c: int, spec: _Spec, infos: dict, budget: int) -> np.ndarray:
    info = infos[spec.data]
    is_stored = info.compress_type == zipfile.ZIP_STORED
    if spec.stored and not is_stored:
        raise _fail(path, f"member {spec.data!r} is compressed but column {c} says stored (never memory-mapped)")
    if is_stored and not spec.stored:
        raise _fail(path, f"member {spec.data!r} is stored but column {c} says compressed")
    expected = {"dtype": spec.dtype.str, "shape": [spec.rows, *spec.trailing]}
    if spec.stored:
        return _mapped(path, zf, info, expected, budget)
    arr = _read_npy(path, zf, info, expected, budget)
    arr.setflags(write=False)
    return arr


def _read_columns(path: Path, zf: zipfile.ZipFile, infos: dict, manifest: dict, max_bytes: int) -> list:
    """``[(spec, data, offsets)]`` of every column, each checked; every member must belong to one."""
    raw_columns = manifest.get("columns")
    if not isinstance(raw_columns, list):
        raise _fail(f"{path}: manifest", "field 'columns' is missing or has the wrong type")
    used: set[str] = set()
    out = []
    budget = max_bytes
    for c, raw in enumerate(raw_columns):
        spec = _spec(path, c, raw, infos, used)
        offsets = _read_npy(path, zf, infos[spec.offsets], {"dtype": "<i8", "shape": [spec.messages + 1]}, budget)
        budget -= offsets.nbytes
        _check_offsets(path, c, spec, offsets)
        data = _column(path, zf, c, spec, infos, budget)
        budget -= data.nbytes
        out.append((spec, data, offsets))
    stray = sorted(set(infos) - used - {"manifest.json"})
    if stray:
        raise _fail(path, f"member {stray[0]!r} belongs to no column of the manifest ({len(stray)} such members)")
    return out


def _payload(mwhere: str, refs: dict, m_kind: str, m_round: int, columns: list, next_slot: list) -> dict:
    payload = {}
    for name, ref in refs.items():
        if not (isinstance(ref, list) and len(ref) == 3 and all(type(v) is int for v in ref)):
            raise _fail(mwhere, f"payload {name!r} must be [column, slot, rows]")
        c, slot, rows = ref
        if not 0 <= c < len(columns):
            raise _fail(mwhere, f"payload {name!r} points at missing column {c}")
        spec, data, offsets = columns[c]
        if (spec.kind, spec.round, spec.field) != (m_kind, m_round, name):
            raise _fail(mwhere, f"payload {name!r} points at column {c} of {spec.kind}/{spec.round}/{spec.field}")
        if slot != next_slot[c]:
            problem = "overlaps an earlier message's" if 0 <= slot < next_slot[c] else "is out of order or out of range"
            raise _fail(mwhere, f"payload {name!r}: slot {slot} of column {c} {problem} (next is {next_slot[c]})")
        if slot >= spec.messages:
            raise _fail(mwhere, f"payload {name!r}: slot {slot} is past column {c}'s {spec.messages} messages")
        next_slot[c] += 1
        lo, hi = int(offsets[slot]), int(offsets[slot + 1])
        if hi - lo != rows:
            raise _fail(mwhere, f"payload {name!r}: the manifest says {rows} rows, column {c}'s offsets give {hi - lo}")
        payload[name] = data[lo:hi].reshape(()) if spec.scalar else data[lo:hi]
    return payload


def read(path: Path, zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo], manifest: dict, max_bytes: int) -> list:
    """The messages of a version-2 manifest; payloads are views of the columns."""
    columns = _read_columns(path, zf, infos, manifest, max_bytes)
    raw_messages = manifest.get("messages")
    if not isinstance(raw_messages, list):
        raise _fail(f"{path}: manifest", "field 'messages' is missing or has the wrong type")
    next_slot = [0] * len(columns)
    messages = []
    last_seq = -1
    for i, raw in enumerate(raw_messages):
        mwhere = f"{path}: message {i}"
        seq, rnd, sender, receiver, kind, refs, meta = message_fields(raw, mwhere, last_seq)
        last_seq = seq
        messages.append(
            Message(seq, rnd, sender, receiver, kind, _payload(mwhere, refs, kind, rnd, columns, next_slot), meta)
        )
    for c, (spec, _, _) in enumerate(columns):
        if next_slot[c] != spec.messages:
            raise _fail(path, f"column {c} holds {spec.messages} messages but the manifest uses {next_slot[c]}")
    return messages


__all__ = ["TranscriptWriter", "VERSION", "read", "save"]

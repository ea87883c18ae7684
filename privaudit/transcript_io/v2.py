"""Transcript format version 2 (columnar): one member per (kind, round, field) column.

The payload arrays of every message of one ``(kind, round, field)`` that share a dtype and a
trailing shape are concatenated along their first axis into one ``.npy`` member
(``columns/<c>.npy``, shape ``(rows, *trailing)``), with two int64 members: the offsets
(``columns/<c>.offsets.npy``, ``n + 1`` entries for ``n`` messages: slot ``k``'s rows are
``offsets[k]:offsets[k+1]``) and the owners (``columns/<c>.owners.npy``: slot ``k`` belongs to
message ``owners[k]``). A 0-d payload is one row of a ``scalar`` column. The messages themselves
are one int64 table (``messages.npy``, one row ``seq, round, sender, receiver, kind`` per message,
the last three indexing the manifest's ``names``); the manifest holds the header, ``names``, the
non-empty ``meta`` of messages as ``[index, meta]`` pairs and the column table (``kind``,
``round``, ``field``, ``dtype``, trailing ``shape``, ``rows``, ``messages``, ``scalar``,
``stored``, member names). Loading costs O(columns) reads plus one slice per payload.

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
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np

from privaudit.transcript import Message, Transcript
from privaudit.transcript_io import _sigbus, v1
from privaudit.transcript_io._safe import (
    commit_temp,
    fail,
    jsonable,
    member_data_offset,
    npy_header_bytes,
    open_npy,
    open_temp,
    read_npy,
    safe_member,
    shape_list,
    simple_dtype,
)

VERSION = 2
STORED_MIN_BYTES = 1 << 20  # a column this large is stored (memory-mapped on load) whatever its dtype
STORED_MIN_FLOATS = 1024  # float columns barely deflate: stored from this many elements
CHUNK_BYTES = 256 * 1024**2  # a streamed column this large is written at once, as a part of its column
#: Python objects a loaded message costs (Message, payload and meta dicts, index entries), and a
#: payload slot (a view and its dict entry), a column (spec, three arrays): counted against
#: ``max_bytes`` with the members' declared sizes, from the manifest, before anything is built.
MESSAGE_OBJECT_BYTES = 512
SLOT_OBJECT_BYTES = 256
COLUMN_OBJECT_BYTES = 4096
#: Stored columns are read into memory (CRC checked) while a file's copies stay under this many
#: bytes; larger ones are memory-mapped (their CRC is not checked: that would read them).
COPY_STORED_BYTES = 64 * 1024**2


class _Column:
    """A column being gathered: the arrays of one (kind, round, field, dtype, trailing shape)."""

    __slots__ = ("arrays", "dtype", "field", "kind", "nbytes", "owners", "round", "scalar", "trailing")

    def __init__(self, kind: str, rnd: int, name: str, arr: np.ndarray) -> None:
        self.kind, self.round, self.field = kind, rnd, name
        self.dtype, self.scalar = arr.dtype, arr.ndim == 0
        self.trailing = () if self.scalar else tuple(arr.shape[1:])
        self.arrays: list[np.ndarray] = []
        self.owners: list[int] = []  # message positions
        self.nbytes = 0

    @property
    def stored(self) -> bool:
        floats = self.dtype.kind in "fc" and self.nbytes // self.dtype.itemsize >= STORED_MIN_FLOATS
        return floats or self.nbytes >= STORED_MIN_BYTES

    def row_counts(self) -> list[int]:
        return [1] * len(self.arrays) if self.scalar else [a.shape[0] for a in self.arrays]


def _owner(arr: np.ndarray) -> np.ndarray:
    """The array at the root of ``arr``'s chain of views."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


def _address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


def _flat(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def _run(first: np.ndarray, second: np.ndarray) -> list | None:
    """``[owner, owner's address, first byte, end byte]`` if ``second`` follows ``first`` back to
    back in their common C-ordered owner, else None."""
    owner = _owner(first)
    if not owner.flags.c_contiguous or _owner(second) is not owner:
        return None
    start = _address(first)
    if _address(second) != start + first.nbytes:
        return None
    return [owner, _address(owner), start, start + first.nbytes + second.nbytes]


def _pieces(arrays: list[np.ndarray]) -> Iterator[np.ndarray]:
    """The arrays as flat bytes in order; arrays lying back to back in one C-ordered buffer (a
    protocol's per-client slices of one round's array) come out as one view of it, uncopied.

    An array's address is looked up only when it shares its base with the previous array, so
    arrays that own their data cost no lookup."""
    run: list | None = None  # [owner, owner's address, first byte, end byte] of a back-to-back run
    pending: np.ndarray | None = None  # a C-ordered view that may start a run with the next array

    def view(r: list) -> np.ndarray:
        return r[0].reshape(-1).view(np.uint8)[r[2] - r[1] : r[3] - r[1]]

    for arr in arrays:
        if not arr.nbytes:
            continue
        base, contiguous = arr.base, arr.flags.c_contiguous
        if run is not None:
            if base is run[0] and contiguous and _address(arr) == run[3]:
                run[3] += arr.nbytes
                continue
            yield view(run)
            run = None
        elif pending is not None:
            if base is pending.base and contiguous:
                run = _run(pending, arr)
            if run is not None:
                pending = None
                continue
            yield _flat(pending)
            pending = None
        if contiguous and isinstance(base, np.ndarray):
            pending = arr
        else:
            yield _flat(arr)
    if run is not None:
        yield view(run)
    if pending is not None:
        yield _flat(pending)


def _batches(arrays: list[np.ndarray], small: int = 65536, limit: int = 16 * 1024**2) -> Iterator[np.ndarray]:
    """The column's bytes in few writes: pieces of ``small`` bytes or more as they are, smaller
    ones joined in copies of up to ``limit`` bytes."""
    group: list[np.ndarray] = []
    size = 0
    for piece in _pieces(arrays):
        if piece.nbytes >= small or size + piece.nbytes > limit:
            if group:
                yield np.concatenate(group)
                group, size = [], 0
            if piece.nbytes >= small:
                yield piece
                continue
        group.append(piece)
        size += piece.nbytes
    if group:
        yield np.concatenate(group)


IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 16


def _writev_all(fd: int, bufs: list[np.ndarray], total: int) -> None:
    """``os.writev`` until every byte of ``bufs`` (C-ordered arrays, ``total`` bytes) is written."""
    while total:
        done = os.writev(fd, bufs)
        if done <= 0:
            raise OSError(f"writev wrote {done} of {total} bytes")
        total -= done
        k = 0
        while k < len(bufs) and done >= bufs[k].nbytes:
            done -= bufs[k].nbytes
            k += 1
        bufs = [bufs[k].reshape(-1).view(np.uint8)[done:], *bufs[k + 1 :]] if total else []


class _Sink:
    """Writes a stored column's arrays to the file with ``os.writev`` (the kernel gathers them
    from the payloads themselves: no copy, no per-array work in Python beyond a flag check),
    while a worker thread computes their CRC-32 (zlib releases the GIL on large buffers), so
    the checksum costs no time beside the write.

    Arrays go out in batches of at most ``iov`` arrays and about ``batch_bytes`` bytes; the
    buffered file ``fh`` is flushed before and re-synchronised (``seek``) after.
    """

    def __init__(
        self, fh: BinaryIO, pool: ThreadPoolExecutor, crc: int, iov: int = IOV_MAX, batch_bytes: int = 64 << 20
    ):
        self.fh, self.pool, self.crc, self.iov, self.batch_bytes = fh, pool, crc, iov, batch_bytes

    def _checksum(self, batch: list[np.ndarray]) -> None:
        crc = self.crc  # the single worker runs these in submission order
        for arr in batch:
            crc = zlib.crc32(arr, crc)
        self.crc = crc

    def write(self, arrays: list[np.ndarray]) -> tuple[int, int]:
        """Write the arrays in order, C-ordered; ``(bytes written, CRC-32 of the member so far)``."""
        self.fh.flush()
        fd = self.fh.fileno()
        batch: list[np.ndarray] = []
        size = written = 0
        last: Future | None = None
        for arr in arrays:
            if not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
            batch.append(arr)
            size += arr.nbytes
            if len(batch) >= self.iov or size >= self.batch_bytes:
                last = self.pool.submit(self._checksum, batch)
                _writev_all(fd, batch, size)
                written += size
                batch, size = [], 0
        if batch:
            last = self.pool.submit(self._checksum, batch)
            _writev_all(fd, batch, size)
            written += size
        if last is not None:
            last.result()
        self.fh.seek(os.lseek(fd, 0, os.SEEK_CUR))  # the buffered file's idea of its position
        return written, self.crc


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
        self._names: dict[str, int] = {}
        self._table: list[tuple[int, int, int, int, int]] = []  # seq, round, sender, receiver, kind
        self._messages: list[Message] = []  # kept only while their columns are pending (streaming)
        self._meta: list[tuple[int, int, dict]] = []
        self._round: int | None = None
        self._first = 0  # table position of self._messages[0]
        self._last_seq = -1
        self.closed = False

    # -------------------------------------------------------------- messages
    def append(self, m: Message) -> None:
        """Add one message (its ``seq`` must increase); its payload arrays must not change later."""
        if self.closed:
            raise ValueError("the transcript writer is closed")
        seq, rnd, kind = m.seq, m.round, m.kind
        if seq <= self._last_seq:
            raise ValueError(f"message seq {seq} does not increase (previous {self._last_seq})")
        self._last_seq = seq
        if kind == "private" and not self.include_private:
            return
        stream = self.stream
        if stream and self._round is not None and rnd != self._round:
            self.end_round()
        self._round = rnd
        position = len(self._table)
        names = self._names
        sender = names.setdefault(m.sender, len(names))
        receiver = names.setdefault(m.receiver, len(names))
        self._table.append((seq, rnd, sender, receiver, names.setdefault(kind, len(names))))
        if m.meta:
            self._meta.append((position, seq, m.meta))  # made JSON at close: a run may still add to it
        if stream:
            self._messages.append(m)
        pending = self._pending
        for name, value in m.payload.items():
            arr = value if type(value) is np.ndarray else np.asarray(value)
            dtype, shape = arr.dtype, arr.shape
            if dtype.hasobject:
                raise TypeError(f"message {seq} payload {name!r} is an object array")
            key = (kind, rnd, name, dtype, shape[1:] if shape else None)  # None: a 0-d payload
            col = pending.get(key)
            if col is None:
                col = pending[key] = _Column(kind, rnd, name, arr)
            col.arrays.append(arr)
            col.owners.append(position)
            col.nbytes += arr.nbytes
            if stream and col.nbytes >= self.chunk_bytes:
                self._flush(pending.pop(key))

    def add(
        self,
        round: int,
        sender: str,
        receiver: str,
        kind: str,
        payload: dict[str, np.ndarray] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Message:
        """Add a message built here (``seq`` = the next one) and return it. A ``payload`` dict is
        kept, not copied: a streaming writer replaces its written arrays with views of the file."""
        payload = payload if isinstance(payload, dict) else dict(payload or {})
        m = Message(self._last_seq + 1, int(round), sender, receiver, kind, payload, dict(meta or {}))
        self.append(m)
        return m

    def end_round(self) -> None:
        """Write every column gathered so far."""
        for col in list(self._pending.values()):
            self._flush(col)
        self._pending.clear()
        self._messages = []  # positions before this point are no longer referenced by a pending column
        self._first = len(self._table)

    # -------------------------------------------------------------- columns
    def _write(self, name: str, header: bytes, arrays: list[np.ndarray], nbytes: int, stored: bool) -> None:
        target: str | zipfile.ZipInfo = name
        if stored:
            target = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
            target.compress_type = zipfile.ZIP_STORED
            target.external_attr = 0o600 << 16  # as ZipFile.open gives a member opened by name
        with self._zf.open(target, "w", force_zip64=len(header) + nbytes > 2**31) as out:
            out.write(header)
            fast = hasattr(os, "writev") and isinstance(getattr(out, "_crc", None), int)
            if stored and nbytes and fast and hasattr(out, "_file_size"):
                # CPython's member writer: the data bypasses it (written straight to the file, its
                # CRC in a thread), then its size and CRC are set as its own writes would have
                with ThreadPoolExecutor(1) as pool:
                    written, out._crc = _Sink(self._fh, pool, out._crc).write(arrays)
                out._file_size += written
                return
            for chunk in _batches(arrays):
                out.write(chunk)

    def _small(self, name: str, arr: np.ndarray) -> None:
        self._write(name, npy_header_bytes(arr.dtype, arr.shape), [arr], arr.nbytes, False)

    def _flush(self, col: _Column) -> None:
        index = len(self._columns)
        data_name = f"columns/{index}.npy"
        shape = (sum(col.row_counts()), *col.trailing)
        header = npy_header_bytes(col.dtype, shape)
        stored = col.stored
        self._write(data_name, header, col.arrays, col.nbytes, stored)
        offsets = np.zeros(len(col.arrays) + 1, dtype=np.int64)
        np.cumsum(col.row_counts(), out=offsets[1:])
        self._small(f"columns/{index}.offsets.npy", offsets)
        self._small(f"columns/{index}.owners.npy", np.asarray(col.owners, dtype=np.int64))
        self._columns.append(
            {
                "kind": col.kind,
                "round": int(col.round),
                "field": col.field,
                "dtype": col.dtype.str,
                "shape": list(col.trailing),
                "scalar": col.scalar,
                "rows": int(shape[0]),
                "messages": len(col.arrays),
                "stored": stored,
                "data": data_name,
                "offsets": f"columns/{index}.offsets.npy",
                "owners": f"columns/{index}.owners.npy",
            }
        )
        if self.stream and stored and col.nbytes:
            self._remap(col, self._zf.getinfo(data_name), len(header), shape, offsets)
        col.arrays, col.owners = [], []

    def _remap(self, col: _Column, info: zipfile.ZipInfo, header_len: int, shape: tuple, offsets: np.ndarray) -> None:
        """Point the column's messages at their rows in the file being written (read-only maps)."""
        self._fh.flush()
        fd = self._fh.fileno()
        start = member_data_offset(self._tmp, fd, info, os.fstat(fd).st_size) + header_len
        data = np.memmap(self._tmp, dtype=col.dtype, mode="r", offset=start, shape=shape).view(np.ndarray)
        first = self._first
        for k, position in enumerate(col.owners):
            m = self._messages[position - first]
            if m.payload.get(col.field) is col.arrays[k]:
                view = data[offsets[k] : offsets[k + 1]]
                m.payload[col.field] = view.reshape(()) if col.scalar else view

    # -------------------------------------------------------------- closing
    def close(self, transcript: Transcript) -> Path:
        """Write the remaining columns, the message table and the manifest (header fields from
        ``transcript``: protocol, config, seed, dataset, parties) and move the file into place."""
        if self.closed:
            raise ValueError("the transcript writer is closed")
        try:
            self.end_round()
            table = np.asarray(self._table, dtype=np.int64).reshape(-1, 5)
            self._small("messages.npy", table)
            header = v1.header_record(transcript, VERSION, self.include_private)
            header["private_included"] = "private" in self._names and bool(
                (table[:, 4] == self._names["private"]).any()
            )
            manifest = header | {
                "names": list(self._names),
                "messages": len(self._table),
                "table": "messages.npy",
                "meta": [[i, jsonable(meta, f"message {seq} meta")] for i, seq, meta in self._meta],
                "columns": self._columns,
            }
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
    owners: str


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
    "owners": str,
}


def _spec(path: Path, c: int, raw: Any, infos: dict[str, zipfile.ZipInfo], used: set[str]) -> _Spec:
    where = f"{path}: column {c}"
    if not isinstance(raw, dict):
        raise fail(where, "must be an object")
    for key, types in _SPEC_TYPES.items():
        value = raw.get(key)
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            raise fail(where, f"field {key!r} is missing or has the wrong type")
    dtype, trailing = simple_dtype(raw.get("dtype")), shape_list(raw.get("shape"))
    if dtype is None:
        raise fail(where, "invalid dtype in the manifest")
    if trailing is None or (raw["scalar"] and trailing):
        raise fail(where, "invalid shape in the manifest")
    if raw["rows"] < 0 or raw["messages"] < 0:
        raise fail(where, "rows and messages must not be negative")
    for key in ("data", "offsets", "owners"):
        member = safe_member(raw[key], where)
        if member not in infos or member == "manifest.json":
            raise fail(where, f"{key} member {member!r} is missing from the archive")
        if member in used:
            raise fail(where, f"member {member!r} is used twice")
        used.add(member)
    keys = ("kind", "round", "field", "scalar", "rows", "messages", "stored", "data", "offsets", "owners")
    return _Spec(dtype=dtype, trailing=list(trailing), **{k: raw[k] for k in keys})


def _check_offsets(path: Path, c: int, spec: _Spec, offsets: np.ndarray) -> None:
    where = f"{path}: column {c} (member {spec.offsets!r})"
    if offsets.size and offsets.min() < 0:
        raise fail(where, f"negative offset {int(offsets.min())}")
    if offsets[0] != 0:
        raise fail(where, f"offsets start at {int(offsets[0])}, not 0")
    steps = np.diff(offsets)
    if steps.size and steps.min() < 0:
        k = int(np.argmax(steps < 0))
        raise fail(
            where,
            f"offsets are not monotone (slot {k}: {int(offsets[k])} then {int(offsets[k + 1])}: overlapping rows)",
        )
    if offsets[-1] > spec.rows:
        raise fail(where, f"offsets run to row {int(offsets[-1])}, out of range of the column's {spec.rows} rows")
    if offsets[-1] != spec.rows:
        raise fail(where, f"offsets end at row {int(offsets[-1])} but the manifest says the column has {spec.rows}")
    if spec.scalar and steps.size and (steps != 1).any():
        raise fail(where, "a scalar column holds one row per message")


def _check_owners(path: Path, c: int, spec: _Spec, owners: np.ndarray, table: np.ndarray, names: list) -> None:
    """Each slot belongs to a message of the column's kind and round, in message order."""
    where = f"{path}: column {c} (member {spec.owners!r})"
    if owners.size and (owners.min() < 0 or owners.max() >= len(table)):
        bad = int(owners.min() if owners.min() < 0 else owners.max())
        raise fail(where, f"message {bad} is out of range of the {len(table)} messages")
    steps = np.diff(owners)
    if steps.size and steps.min() <= 0:
        k = int(np.argmax(steps <= 0))
        raise fail(where, f"owners do not increase (slot {k + 1}: message {int(owners[k + 1])}; overlapping payloads)")
    rows = table[owners]
    kind_id = names.index(spec.kind) if spec.kind in names else -1
    wrong = (rows[:, 4] != kind_id) | (rows[:, 1] != spec.round)
    if wrong.any():
        i = int(owners[int(np.argmax(wrong))])
        raise fail(
            where,
            f"message {i} ({names[table[i, 4]]}, round {int(table[i, 1])}) is not of the column's "
            f"{spec.kind}/{spec.round}/{spec.field}",
        )


def _next_starts(zf: zipfile.ZipFile) -> dict[int, int]:
    """Local header offset of each member -> where the next member (or the central directory)
    starts: the end no member's data may run past."""
    starts = sorted({i.header_offset for i in zf.infolist()})
    ends = starts[1:] + [int(getattr(zf, "start_dir", 0)) or 2**63]
    return dict(zip(starts, ends))


def _stored(
    path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, expected: dict, budget: int, copy: bool, limits: dict
) -> np.ndarray:
    """A stored member, its extent checked against the file and its neighbours first: read into
    memory with its CRC checked when ``copy`` (or when the file cannot be mapped), else a
    read-only memory map."""
    where = f"member {info.filename!r}"
    fh, shape, fortran, dtype, header_len = open_npy(path, zf, info, expected, budget)
    fh.close()
    if fortran and len(shape) > 1:
        raise fail(path, f"{where}: a column must be C-ordered")
    if info.compress_size != info.file_size:
        raise fail(path, f"{where}: stored, but declares {info.compress_size} bytes in the file for {info.file_size}")
    try:
        with open(path, "rb") as raw:
            fd = raw.fileno()
            start = member_data_offset(path, fd, info, os.fstat(fd).st_size)
    except OSError as exc:
        raise fail(path, f"cannot be read ({exc.strerror or exc})") from None
    if start + info.compress_size > limits.get(info.header_offset, 2**63):
        raise fail(path, f"{where}: its declared size runs into the next member (overlapping data)")
    if not info.file_size - header_len:
        return np.zeros(shape, dtype)
    if not copy:
        try:
            mapped = np.memmap(path, dtype=dtype, mode="r", offset=start + header_len, shape=shape)
            _sigbus.install()  # the file truncated under the mapping: one line, exit 2, not a silent crash
            return mapped.view(np.ndarray)
        except (OSError, ValueError):  # a file that cannot be mapped (a pipe-backed FUSE file, ...): read it
            pass
    try:
        arr = read_npy(path, zf, info, expected, budget)
    except MemoryError:
        raise fail(path, f"{where}: not enough memory to read {info.file_size} bytes (lower --max-bytes)") from None
    arr.setflags(write=False)
    return arr


def _column(
    path: Path, zf: zipfile.ZipFile, c: int, spec: _Spec, infos: dict, budget: int, copy: bool, limits: dict
) -> np.ndarray:
    info = infos[spec.data]
    is_stored = info.compress_type == zipfile.ZIP_STORED
    if spec.stored and not is_stored:
        raise fail(path, f"member {spec.data!r} is compressed but column {c} says stored (never memory-mapped)")
    if is_stored and not spec.stored:
        raise fail(path, f"member {spec.data!r} is stored but column {c} says compressed")
    expected = {"dtype": spec.dtype.str, "shape": [spec.rows, *spec.trailing]}
    if spec.stored:
        return _stored(path, zf, info, expected, budget, copy, limits)
    arr = read_npy(path, zf, info, expected, budget)
    arr.setflags(write=False)
    return arr


class _Budget:
    """The bytes of ``max_bytes`` not yet read into memory."""

    def __init__(self, total: int) -> None:
        self.left = total

    def read(self, path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, expected: dict) -> np.ndarray:
        arr = read_npy(path, zf, info, expected, self.left)
        self.left -= arr.nbytes
        return arr


def _read_table(path: Path, zf: zipfile.ZipFile, infos: dict, manifest: dict, budget: _Budget) -> tuple:
    """``(table, names)``: the message table (n x 5 int64: seq, round, sender, receiver, kind), checked."""
    where = f"{path}: manifest"
    names, n, member = manifest.get("names"), manifest.get("messages"), manifest.get("table")
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
        raise fail(where, "'names' must be a list of strings")
    if type(n) is not int or n < 0:
        raise fail(where, "'messages' must be a non-negative integer (the number of messages)")
    if not isinstance(member, str) or safe_member(member, where) not in infos or member == "manifest.json":
        raise fail(where, f"message table {member!r} is missing from the archive")
    table = budget.read(path, zf, infos[member], {"dtype": "<i8", "shape": [n, 5]})
    if (n and table[:, 0].min() < 0) or (n > 1 and np.diff(table[:, 0]).min() <= 0):
        raise fail(f"{path}: member {member!r}", "seq must be non-negative and increase")
    ids = table[:, 2:]
    if ids.size and (ids.min() < 0 or ids.max() >= len(names)):
        raise fail(f"{path}: member {member!r}", f"a name index is out of range of the {len(names)} names")
    return table, names


def _read_meta(path: Path, manifest: dict, n: int) -> dict[int, dict]:
    raw = manifest.get("meta", [])
    where = f"{path}: manifest"
    if not isinstance(raw, list):
        raise fail(where, "'meta' must be a list of [message, object] pairs")
    out: dict[int, dict] = {}
    last = -1
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and isinstance(pair[1], dict)):
            raise fail(where, "'meta' must be a list of [message, object] pairs")
        if not last < pair[0] < n:
            raise fail(where, f"meta of message {pair[0]} is out of order or out of range")
        last = pair[0]
        out[last] = pair[1]
    return out


def _read_columns(path: Path, zf: zipfile.ZipFile, infos: dict, manifest: dict, max_bytes: int) -> tuple:
    """``(table, names, [(spec, data, offsets, owners)])``, each checked; every member must be used."""
    raw_columns = manifest.get("columns")
    if not isinstance(raw_columns, list):
        raise fail(f"{path}: manifest", "field 'columns' is missing or has the wrong type")
    budget = _Budget(max_bytes - _object_cost(path, infos, manifest, raw_columns, max_bytes))
    table, names = _read_table(path, zf, infos, manifest, budget)
    used: set[str] = {"manifest.json", manifest["table"]}
    out = []
    limits = _next_starts(zf)
    copy_left = COPY_STORED_BYTES
    for c, raw in enumerate(raw_columns):
        spec = _spec(path, c, raw, infos, used)
        offsets = budget.read(path, zf, infos[spec.offsets], {"dtype": "<i8", "shape": [spec.messages + 1]})
        _check_offsets(path, c, spec, offsets)
        owners = budget.read(path, zf, infos[spec.owners], {"dtype": "<i8", "shape": [spec.messages]})
        _check_owners(path, c, spec, owners, table, names)
        copy = infos[spec.data].file_size <= copy_left
        data = _column(path, zf, c, spec, infos, budget.left, copy, limits)
        if spec.stored and copy:
            copy_left -= data.nbytes
        budget.left -= data.nbytes  # memory-mapped columns count too: the budget bounds what loading can touch
        out.append((spec, data, offsets, owners))
    stray = sorted(set(infos) - used)
    if stray:
        raise fail(path, f"member {stray[0]!r} belongs to no column of the manifest ({len(stray)} such members)")
    return table, names, out


def _object_cost(path: Path, infos: dict, manifest: dict, raw_columns: list, max_bytes: int) -> int:
    """The Python objects loading would build (per message, payload slot and column, from the
    manifest's counts), refused with the members' declared sizes when over ``max_bytes``."""
    n = manifest.get("messages")
    n = n if type(n) is int and n > 0 else 0
    slots = sum(
        r["messages"]
        for r in raw_columns
        if isinstance(r, dict) and type(r.get("messages")) is int and r["messages"] > 0
    )
    cost = n * MESSAGE_OBJECT_BYTES + slots * SLOT_OBJECT_BYTES + len(raw_columns) * COLUMN_OBJECT_BYTES
    declared = sum(info.file_size for info in infos.values())
    if declared + cost > max_bytes:
        raise fail(
            path,
            f"{n} messages, {slots} payloads and {len(raw_columns)} columns would take about {declared + cost} bytes "
            f"in memory ({declared} declared + {cost} of objects), more than the budget of {max_bytes} bytes "
            "(raise it with --max-bytes)",
        )
    return cost


def read(path: Path, zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo], manifest: dict, max_bytes: int) -> tuple:
    """``(messages, codes, names)``: the messages of a version-2 archive (payloads are views of
    the columns), and their sender, receiver and kind as positions in ``names`` (n x 3)."""
    table, names, columns = _read_columns(path, zf, infos, manifest, max_bytes)
    meta = _read_meta(path, manifest, len(table))
    payloads: list[dict[str, np.ndarray]] = [{} for _ in range(len(table))]
    for c, (spec, data, offsets, owners) in enumerate(columns):
        name, bounds = spec.field, offsets.tolist()
        for k, i in enumerate(owners.tolist()):
            p = payloads[i]
            if name in p:
                raise fail(path, f"message {i} gets payload {name!r} twice (column {c} and an earlier one)")
            view = data[bounds[k] : bounds[k + 1]]
            p[name] = view.reshape(()) if spec.scalar else view
    messages = [
        Message(seq, rnd, names[s], names[r], names[k], payloads[i], meta.get(i, {}))
        for i, (seq, rnd, s, r, k) in enumerate(table.tolist())
    ]
    return messages, table[:, 2:], names


__all__ = ["TranscriptWriter", "VERSION", "read", "save"]

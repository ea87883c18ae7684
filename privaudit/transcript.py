"""Transcripts: every message of a federated run, and each party's view of it.

A :class:`Transcript` is the ordered list of :class:`Message` objects a protocol emitted, plus
the public configuration every party knows. A party's own knowledge is a message to itself
(kind ``state`` for a server's model, kind ``private`` for a client's raw data).
:meth:`Transcript.view` returns a :class:`View` holding only the messages that party received;
attacks get a view, never the transcript.

File format (version 1, suffix ``.ptx``): a ZIP archive with ``manifest.json`` and one ``.npy``
member per array under ``arrays/``. The manifest lists protocol, config, seed, dataset summary,
parties and messages (payload name -> member path), and an ``arrays`` table (member path ->
``{"dtype", "shape"}``) so that a member contradicting the manifest is detected before it is
read. Transcripts written by other tools may omit that table; their arrays are then checked
only for safety (plain numeric dtype, size within the budget).

Loading never unpickles and treats the file as hostile: memory is bounded by ``max_bytes``
(members are inflated chunk by chunk into arrays preallocated from their headers; the member
count and the manifest's size, depth and value count have limits derived from it), and every
malformed archive is refused with a one-line :class:`~privaudit.errors.TranscriptError` naming
the member (docs/transcript-format.md, "Validation and limits"). Whether the content fits the
protocol is checked separately, by :func:`privaudit.schema.validate`.
"""

from __future__ import annotations

import io
import json
import math
import os
import posixpath
import re
import secrets
import stat
import struct
import time
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import _safejson
from privaudit._escape import printable
from privaudit.errors import TranscriptError

FORMAT_NAME = "privaudit-transcript"
FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 512 * 1024**2  # byte budget of a loaded archive (uncompressed): 512 MiB; --max-bytes

__all__ = [
    "CLIENT_PREFIX",
    "is_client",
    "load_validated",
    "Message",
    "Transcript",
    "View",
    "load",
    "save",
    "FORMAT_VERSION",
    "DEFAULT_MAX_BYTES",
]


#: Party ids of clients (users, groups or silos) are this prefix and an index: ``client:<k>``.
CLIENT_PREFIX = "client:"


def is_client(party: str) -> bool:
    """Whether ``party`` names a client (``client:<k>``): the one place that reads party ids."""
    return party.startswith(CLIENT_PREFIX)


@dataclass
class Message:
    """One message of a run.

    Attributes
    ----------
    seq : int
        Position in the transcript (0-based, strictly increasing).
    round : int
        Protocol round (epoch) the message belongs to.
    sender, receiver : str
        Party ids (``server``, ``item-server``, ``client:<k>``, ``decryptor:<k>``).
    kind : str
        What the message carries (``grad_V``, ``state``, ``private``, ...).
    payload : dict[str, numpy.ndarray]
        Named arrays. Never object arrays.
    meta : dict
        Small JSON-able metadata.
    """

    seq: int
    round: int
    sender: str
    receiver: str
    kind: str
    payload: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Total size of the payload arrays in bytes."""
        return int(sum(a.nbytes for a in self.payload.values()))


class _Index:
    """Positions of messages by kind, sender, receiver and (party, kind); built once per log.

    Every list holds message positions in increasing order, so a query answered from the
    shortest matching list keeps transcript order and touches only the candidate messages.
    """

    __slots__ = ("by_kind", "by_receiver", "by_receiver_kind", "by_sender", "by_sender_kind", "last", "n", "private")

    def __init__(self, messages: list[Message]) -> None:
        self.n = 0
        self.last: Message | None = None
        self.by_kind: dict[str, list[int]] = {}
        self.by_sender: dict[str, list[int]] = {}
        self.by_receiver: dict[str, list[int]] = {}
        self.by_sender_kind: dict[tuple[str, str], list[int]] = {}
        self.by_receiver_kind: dict[tuple[str, str], list[int]] = {}
        self.private: dict[str, list[int]] = {}
        for m in messages:
            self.append(m)

    def append(self, m: Message) -> None:
        pos = self.n
        self.by_kind.setdefault(m.kind, []).append(pos)
        self.by_sender.setdefault(m.sender, []).append(pos)
        self.by_receiver.setdefault(m.receiver, []).append(pos)
        self.by_sender_kind.setdefault((m.sender, m.kind), []).append(pos)
        self.by_receiver_kind.setdefault((m.receiver, m.kind), []).append(pos)
        if m.kind == "private" and m.sender == m.receiver:
            self.private.setdefault(m.sender, []).append(pos)
        self.n = pos + 1
        self.last = m

    def candidates(self, kind: str | None, sender: str | None, receiver: str | None) -> list[int] | None:
        """The shortest position list matching the given fields (None: no field given)."""
        lists = []
        if receiver is not None:
            by = self.by_receiver.get(receiver, []) if kind is None else self.by_receiver_kind.get((receiver, kind), [])
            lists.append(by)
        if sender is not None:
            lists.append(
                self.by_sender.get(sender, []) if kind is None else self.by_sender_kind.get((sender, kind), [])
            )
        if kind is not None and not lists:
            lists.append(self.by_kind.get(kind, []))
        return min(lists, key=len) if lists else None


class _MessageLog:
    """Shared behaviour of a transcript and a view: an ordered message list with queries.

    Queries go through an index (:class:`_Index`) built on first use and kept up to date by
    :meth:`Transcript.add`; a query costs O(messages it returns), not O(all messages). The
    message list is append-only: the index is rebuilt when its length or last message changed
    behind its back, never trusted for a list edited in place.
    """

    messages: list[Message]

    def _messages_index(self) -> _Index:
        idx = self.__dict__.get("_index")
        msgs = self.messages
        if idx is None or idx.n != len(msgs) or (idx.n and msgs[-1] is not idx.last):
            idx = _Index(msgs)
            self.__dict__["_index"] = idx
        return idx

    def select(
        self,
        kind: str | None = None,
        *,
        sender: str | None = None,
        receiver: str | None = None,
        round: int | None = None,
    ) -> list[Message]:
        """Messages matching every given field, in transcript order."""
        positions = self._messages_index().candidates(kind, sender, receiver)
        msgs = self.messages
        pool = msgs if positions is None else [msgs[i] for i in positions]
        return [
            m
            for m in pool
            if (kind is None or m.kind == kind)
            and (sender is None or m.sender == sender)
            and (receiver is None or m.receiver == receiver)
            and (round is None or m.round == round)
        ]

    def kinds(self) -> Counter:
        """Count of messages per kind."""
        return Counter({kind: len(pos) for kind, pos in self._messages_index().by_kind.items()})

    def rounds(self, kind: str | None = None) -> list[int]:
        """Sorted distinct rounds (of messages of ``kind`` if given)."""
        pool = self.messages if kind is None else self.select(kind)
        return sorted({m.round for m in pool})

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_index", None)  # rebuilt on first query after unpickling
        return state

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)


@dataclass
class View(_MessageLog):
    """What one party knows: the public config and the messages it received.

    Built by :meth:`Transcript.view`. ``messages`` holds every message whose receiver is
    ``party`` (its own ``state``/``private`` messages included), in transcript order.
    """

    party: str
    protocol: str
    config: dict[str, Any]
    dataset: dict[str, Any]
    parties: list[str]
    messages: list[Message]


@dataclass
class Transcript(_MessageLog):
    """Everything that happened in one run.

    Attributes
    ----------
    protocol : str
        Registered protocol name.
    config : dict
        Public configuration (every hyperparameter all parties know), JSON-able.
    seed : int | None
        Seed of the simulation.
    dataset : dict
        Dataset summary (``name``, ``users``, ``items``, ``ratings``, ...).
    parties : list[str]
        Every party id of the run.
    messages : list[Message]
        Ordered messages.
    """

    protocol: str
    config: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    dataset: dict[str, Any] = field(default_factory=dict)
    parties: list[str] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    def add(
        self,
        round: int,
        sender: str,
        receiver: str,
        kind: str,
        payload: Mapping[str, np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Message:
        """Append a message (``seq`` assigned here) and return it.

        Payload arrays are stored as given (not copied); callers must not mutate them later.
        """
        arrays = {}
        for name, value in (payload or {}).items():
            arr = np.asarray(value)
            if arr.dtype.hasobject:
                raise TypeError(f"payload {name!r} of {kind!r} is an object array")
            arrays[str(name)] = arr
        index = self._messages_index()
        msg = Message(len(self.messages), int(round), sender, receiver, kind, arrays, dict(meta or {}))
        self.messages.append(msg)
        index.append(msg)
        return msg

    def view(self, party: str) -> View:
        """The messages ``party`` received (its own knowledge included) and the public config."""
        if self.parties and party not in self.parties:
            raise TranscriptError(f"no party {party!r} in this transcript")
        return View(
            party=party,
            protocol=self.protocol,
            config=dict(self.config),
            dataset=dict(self.dataset),
            parties=list(self.parties),
            messages=[self.messages[i] for i in self._messages_index().by_receiver.get(party, [])],
        )

    def clients(self) -> list[str]:
        """The client parties (:func:`is_client`), in :attr:`parties` order."""
        return [p for p in self.parties if is_client(p)]

    def private(self, party: str) -> dict[str, np.ndarray]:
        """The ``private`` payload of ``party`` (ground truth for scoring); empty if absent."""
        merged: dict[str, np.ndarray] = {}
        for i in self._messages_index().private.get(party, []):
            merged.update(self.messages[i].payload)
        return merged

    @property
    def has_private(self) -> bool:
        return "private" in self._messages_index().by_kind

    def without_private(self) -> Transcript:
        """A shareable copy without ``private`` messages (sequence numbers kept)."""
        return Transcript(
            self.protocol,
            dict(self.config),
            self.seed,
            dict(self.dataset),
            list(self.parties),
            [m for m in self.messages if m.kind != "private"] if self.has_private else list(self.messages),
        )

    def save(self, path: str | Path, include_private: bool = True) -> Path:
        """Write this transcript to ``path`` (``.ptx``); see :func:`save`."""
        return save(self, path, include_private=include_private)

    @staticmethod
    def load(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Transcript:
        """Read a transcript file; see :func:`load`."""
        return load(path, max_bytes=max_bytes)


# --------------------------------------------------------------------------------------
# writing


def _jsonable(value: Any, where: str) -> Any:
    """Check (and normalise numpy scalars in) a config/meta value for JSON."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return [_jsonable(v, where) for v in value.tolist()]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{where}: {type(value).__name__} is not JSON-able")


#: float arrays of at least this many elements are stored uncompressed (smaller ones, e.g. a
#: client's ratings on a 1-5 grid, still deflate well)
_STORED_MIN_FLOATS = 1024


def _write_archive(fh: Any, transcript: Transcript, messages: list[Message], include_private: bool) -> None:
    manifest_messages = []
    arrays_table: dict[str, dict[str, Any]] = {}
    counter = 0
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True) as zf:
        for m in messages:
            payload_refs = {}
            for name, arr in m.payload.items():
                arr = np.asarray(arr)
                if arr.dtype.hasobject:
                    raise TypeError(f"message {m.seq} payload {name!r} is an object array")
                member = f"arrays/{counter}.npy"
                counter += 1
                target: str | zipfile.ZipInfo = member
                if arr.dtype.kind in "fc" and arr.size >= _STORED_MIN_FLOATS:
                    # float payloads (gradients, factors) barely deflate: stored, not compressed
                    target = zipfile.ZipInfo(member, date_time=time.localtime()[:6])
                    target.compress_type = zipfile.ZIP_STORED
                    target.external_attr = 0o600 << 16  # as ZipFile.open gives a member opened by name
                with zf.open(target, "w", force_zip64=arr.nbytes > 2**31) as out:
                    np.lib.format.write_array(out, arr, allow_pickle=False)
                payload_refs[name] = member
                arrays_table[member] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
            manifest_messages.append(
                {
                    "seq": int(m.seq),
                    "round": int(m.round),
                    "sender": m.sender,
                    "receiver": m.receiver,
                    "kind": m.kind,
                    "payload": payload_refs,
                    "meta": _jsonable(m.meta, f"message {m.seq} meta"),
                }
            )
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "protocol": transcript.protocol,
            "config": _jsonable(transcript.config, "config"),
            "seed": transcript.seed,
            "dataset": _jsonable(transcript.dataset, "dataset"),
            "parties": list(transcript.parties),
            "private_included": bool(include_private and transcript.has_private),
            "messages": manifest_messages,
            "arrays": arrays_table,
        }
        zf.writestr("manifest.json", json.dumps(manifest, separators=(",", ":")))


def save(transcript: Transcript, path: str | Path, include_private: bool = True) -> Path:
    """Write ``transcript`` as a ``.ptx`` v1 archive and return the path.

    Arrays are streamed into the archive one at a time (never the whole archive in memory).
    The archive is written under a temporary name in the target folder and renamed into place
    (``os.replace``), so a reader never sees half a file and a failed save leaves the file
    already at ``path`` untouched. With ``include_private=False`` the ``private`` messages are
    left out, which makes a transcript that can be shared without the clients' raw data.
    """
    path = Path(path)
    messages = [m for m in transcript.messages if include_private or m.kind != "private"]
    folder = path.parent
    tmp = folder / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise TranscriptError(printable(f"{path}: cannot write the transcript ({exc.strerror or exc})")) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_archive(fh, transcript, messages, include_private)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise TranscriptError(printable(f"{path}: cannot write the transcript ({exc.strerror or exc})")) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


# --------------------------------------------------------------------------------------
# reading
#
# Every limit below is checked before the memory it guards is allocated: the central
# directory's size before zipfile parses it, the sum of the members' declared sizes before any
# member is read, the manifest's size/depth/containers before json.loads, and each array's size
# (from its .npy header, which must agree with the member's declared size) before it is
# allocated. Members are inflated in 1 MiB chunks straight into the preallocated array; zipfile
# stops at the declared size and checks the CRC, so a member can never inflate past its budget.

_CHUNK = 1 << 20
_MAX_NDIM = 32
_MAX_NPY_HEADER = 10_000  # bytes: numpy's own limit for parsing a header safely
#: the header numpy's writer produces: matched directly (any other form goes to numpy's parser)
_NPY_HEADER = re.compile(
    r"\{'descr': '([<>|][a-z]\d{1,2})', 'fortran_order': (False|True), 'shape': \(([\d, ]*)\), \} *\n"
)
_NPY_SHAPE = re.compile(r"(?:\d+, )*\d+,?|")
_MANIFEST_DEPTH = 64
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    OSError,
    EOFError,
    ValueError,
    struct.error,
    OverflowError,
    IndexError,
    KeyError,
    NotImplementedError,
    RuntimeError,
)


def _limits(max_bytes: int, n_members: int) -> dict[str, int]:
    """Limits derived from the byte budget and the archive's member count (documented in
    docs/transcript-format.md, "Validation and limits")."""
    return {
        "members": max(1024, max_bytes // 4096),
        "central_directory": max(1024, max_bytes // 4096) * 160,
        "manifest_bytes": min(max(max_bytes // 32, 64 * 1024), 1024**2 + 2048 * n_members),
        "manifest_containers": 4096 + 32 * n_members,
        "manifest_values": 16384 + 256 * n_members,
    }


def _fail(path: Any, text: str) -> TranscriptError:
    return TranscriptError(printable(f"{path}: {text}"))


def _describe_zip_error(exc: BaseException) -> str:
    if isinstance(exc, zlib.error):
        return f"corrupt deflate data ({exc})"
    if isinstance(exc, EOFError):
        return "truncated (the compressed data ends early)"
    if isinstance(exc, zipfile.BadZipFile):
        return f"corrupt ({exc})"
    return f"unreadable ({type(exc).__name__}: {exc})"


def _safe_member(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise _fail(where, "member name must be a non-empty string")
    if name.startswith(("/", "\\")) or "\\" in name or (len(name) > 1 and name[1] == ":"):
        raise _fail(where, f"absolute member path {name!r} refused")
    parts = name.split("/")
    if ".." in parts or posixpath.normpath(name) != name:
        raise _fail(where, f"member path {name!r} refused (path traversal)")
    return name


def _check_info(path: Path, info: zipfile.ZipInfo) -> None:
    """Refuse member flags zipfile would trip over later (or silently honour)."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise _fail(path, f"member {name!r} is encrypted (not supported)")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise _fail(path, f"member {name!r} uses compression method {info.compress_type} (only stored and deflate)")
    if info.create_system == 3 and stat.S_ISLNK(info.external_attr >> 16):
        raise _fail(path, f"member {name!r} is a symbolic link (refused)")


def _simple_dtype(value: Any) -> np.dtype | None:
    """A plain numeric dtype (bool, int, uint, float, complex) from a dtype string, else None."""
    if not isinstance(value, str) or len(value) > 16:
        return None
    try:
        dtype = np.dtype(value)
    except Exception:  # noqa: BLE001 - any malformed dtype string is refused the same way
        return None
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None or dtype.itemsize == 0:
        return None
    return dtype


def _shape_list(value: Any) -> list[int] | None:
    if not isinstance(value, list) or len(value) > _MAX_NDIM:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        return None
    return value


def _npy_header(fh: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of a ``.npy`` stream at its start; leaves it at the data.

    The canonical header numpy writes is parsed by a strict pattern (much faster than
    numpy's ``ast``-based parser, which matters for transcripts of 10^5 members); any other
    header, up to :data:`_MAX_NPY_HEADER` bytes, is handed to numpy's parser. Raises
    ``ValueError`` (or ``EOFError``) for a malformed one.
    """
    version = np.lib.format.read_magic(fh)
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise ValueError(f"unsupported .npy version {version}")
    size = 2 if version == (1, 0) else 4
    raw_len = fh.read(size)
    if len(raw_len) != size:
        raise EOFError("truncated .npy header length")
    header_len = int.from_bytes(raw_len, "little")
    if header_len > _MAX_NPY_HEADER:
        raise ValueError(f"header of {header_len} bytes (more than {_MAX_NPY_HEADER})")
    header = fh.read(header_len)
    if len(header) != header_len:
        raise EOFError("truncated .npy header")
    text = header.decode("utf8" if version == (3, 0) else "latin1")
    m = _NPY_HEADER.fullmatch(text)
    if m and _NPY_SHAPE.fullmatch(m.group(3)):
        shape = tuple(int(d) for d in m.group(3).replace(",", " ").split())
        return shape, m.group(2) == "True", np.dtype(m.group(1))
    stream = io.BytesIO(raw_len + header)  # numpy's parser reads from the length on
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read(stream, max_header_size=_MAX_NPY_HEADER)


def _read_npy(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, expected: dict | None, budget: int) -> np.ndarray:
    """Parse one ``.npy`` member safely: header checks before any data is read, then the data
    inflated chunk by chunk into an array preallocated from the header."""
    name = info.filename
    where = f"member {name!r}"
    try:
        fh = zf.open(info)
    except _ZIP_ERRORS as exc:
        raise _fail(path, f"{where}: {_describe_zip_error(exc)}") from None
    with fh:
        try:
            shape, fortran, dtype = _npy_header(fh)
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise _fail(path, f"{where}: {_describe_zip_error(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - numpy parses the header with ast; any failure is a bad header
            raise _fail(path, f"{where}: not a valid .npy member ({type(exc).__name__}: {exc})") from None
        if dtype.hasobject:
            raise _fail(path, f"{where}: object arrays are refused (a pickle is never loaded)")
        if _simple_dtype(dtype.str) != dtype:
            raise _fail(path, f"{where}: dtype {dtype} refused (only plain bool/int/uint/float/complex arrays)")
        if len(shape) > _MAX_NDIM or any(d < 0 for d in shape):
            raise _fail(path, f"{where}: invalid shape {shape}")
        if expected is not None and (np.dtype(expected["dtype"]) != dtype or expected["shape"] != list(shape)):
            raise _fail(
                path,
                f"{where}: array is {dtype.str} {list(shape)} but the manifest says "
                f"{expected['dtype']} {expected['shape']}",
            )
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        header_len = fh.tell()
        if info.file_size != header_len + nbytes:
            raise _fail(path, f"{where}: member holds {info.file_size - header_len} data bytes, header needs {nbytes}")
        if nbytes > budget:
            raise _fail(path, f"{where}: {nbytes} bytes exceed the remaining budget of {budget} bytes (--max-bytes)")
        # np.zeros maps fresh zero pages; all-zero chunks are skipped so they never become resident
        arr = np.zeros(count, dtype=dtype)
        raw = arr.view(np.uint8)
        chunk = bytearray(min(_CHUNK, max(nbytes, 1)))
        chunk_view = memoryview(chunk)
        chunk_arr = np.frombuffer(chunk, dtype=np.uint8)
        got = 0
        try:
            while got < nbytes:
                n = fh.readinto(chunk_view[: min(len(chunk), nbytes - got)])
                if not n:
                    raise _fail(path, f"{where}: truncated array data")
                if chunk_arr[:n].any():
                    raw[got : got + n] = chunk_arr[:n]
                got += n
            if fh.read(1):  # reaching the end also makes zipfile check the CRC
                raise _fail(path, f"{where}: data beyond the array")
        except TranscriptError:
            raise
        except _ZIP_ERRORS as exc:
            raise _fail(path, f"{where}: {_describe_zip_error(exc)}") from None
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def _require(obj: Mapping, key: str, types: type | tuple, where: str) -> Any:
    if key not in obj:
        raise _fail(where, f"missing field {key!r}")
    value = obj[key]
    if not isinstance(value, types) or (isinstance(value, bool) and types is int):
        raise _fail(where, f"field {key!r} has the wrong type")
    return value


def _open_archive(path: Path, max_bytes: int) -> zipfile.ZipFile:
    """Open the ZIP after checking that it is a regular file and its central directory's declared
    size and entry count (a FIFO or a device such as /dev/zero is refused before it is opened)."""
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})") from None
    if not regular:
        raise _fail(path, "not a regular file (a transcript is a .ptx file)")
    try:
        with open(path, "rb") as fh:
            endrec = zipfile._EndRecData(fh)  # the same end record zipfile itself reads
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})") from None
    except _ZIP_ERRORS:
        endrec = None  # zipfile below reports the problem
    if endrec:
        limits = _limits(max_bytes, 0)
        entries, cd_size = int(endrec[zipfile._ECD_ENTRIES_TOTAL]), int(endrec[zipfile._ECD_SIZE])
        if entries > limits["members"] or cd_size > limits["central_directory"]:
            raise _fail(
                path,
                f"the archive declares {entries} members in a {cd_size}-byte directory; the limit is "
                f"{limits['members']} members (raise --max-bytes for larger transcripts)",
            )
    try:
        return zipfile.ZipFile(path, "r")
    except _ZIP_ERRORS as exc:
        raise _fail(path, f"not a transcript archive ({_describe_zip_error(exc)})") from None


def _read_manifest(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, limits: dict[str, int]) -> dict:
    if info.file_size > limits["manifest_bytes"]:
        raise _fail(
            path,
            f"manifest.json declares {info.file_size} bytes, more than the limit of {limits['manifest_bytes']} "
            f"for an archive of {limits['n_members']} members",
        )
    try:
        with zf.open(info) as fh:
            data = fh.read(limits["manifest_bytes"] + 1)
    except _ZIP_ERRORS as exc:
        raise _fail(path, f"member 'manifest.json': {_describe_zip_error(exc)}") from None
    try:
        manifest = _safejson.loads(
            data,
            max_bytes=limits["manifest_bytes"],
            max_depth=_MANIFEST_DEPTH,
            max_containers=limits["manifest_containers"],
            max_values=limits["manifest_values"],
        )
    except _safejson.JSONLimitError as exc:
        raise _fail(path, f"manifest.json: {exc}") from None
    if not isinstance(manifest, dict):
        raise _fail(path, "manifest.json must hold an object")
    return manifest


def load(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Transcript:
    """Read a ``.ptx`` transcript, refusing anything malformed or unsafe.

    Parameters
    ----------
    path : path to the archive.
    max_bytes : int
        Byte budget: the members' total uncompressed size must not exceed it; the member count,
        the central directory and the manifest get limits derived from it (see
        docs/transcript-format.md). Peak memory is about ``max_bytes`` plus the interpreter.

    Raises
    ------
    TranscriptError
        One line naming the member and the problem: not a ZIP, a corrupt, truncated, encrypted,
        symlinked, duplicated or unsupported-compression member, no/invalid/oversized/too deeply
        nested manifest, unknown format or version, a member name with ``..`` or an absolute
        path, a message pointing at a missing member, a member that is not a plain numeric
        ``.npy`` array, a shape or dtype that contradicts the manifest, or an archive larger
        than ``max_bytes`` uncompressed. Control characters in the message are escaped.
    """
    path = Path(path)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise TranscriptError(f"max_bytes must be a positive integer, got {max_bytes!r}")
    if not path.exists():
        raise _fail(path, "no such transcript file")
    if path.is_dir():
        raise _fail(path, "is a directory, not a transcript file")
    zf = _open_archive(path, max_bytes)
    with zf:
        infos: dict[str, zipfile.ZipInfo] = {}
        total = 0
        for info in zf.infolist():
            if info.is_dir() and info.file_size == 0:
                continue
            _safe_member(info.filename, str(path))
            if info.filename in infos:
                raise _fail(path, f"member {info.filename!r} appears twice in the archive (ambiguous; refused)")
            _check_info(path, info)
            infos[info.filename] = info
            total += info.file_size
        limits = _limits(max_bytes, len(infos))
        limits["n_members"] = len(infos)
        if len(infos) > limits["members"]:
            raise _fail(path, f"{len(infos)} members, more than the limit of {limits['members']} (--max-bytes)")
        if total > max_bytes:
            raise _fail(
                path,
                f"uncompressed size {total} bytes exceeds the limit of {max_bytes} bytes (raise it with --max-bytes)",
            )
        if "manifest.json" not in infos:
            raise _fail(path, "no manifest.json (not a privaudit transcript)")
        manifest = _read_manifest(path, zf, infos["manifest.json"], limits)
        if manifest.get("format") != FORMAT_NAME:
            raise _fail(path, f"unknown format {manifest.get('format')!r} (expected {FORMAT_NAME!r})")
        version = manifest.get("version")
        if type(version) is not int or version != FORMAT_VERSION:  # 1.0 and true are not the integer 1
            raise _fail(
                path,
                f"unsupported transcript version {version!r} (this privaudit reads version {FORMAT_VERSION})",
            )
        where = f"{path}: manifest"
        protocol = _require(manifest, "protocol", str, where)
        config = manifest.get("config", {})
        dataset = manifest.get("dataset", {})
        parties = manifest.get("parties", [])
        if not isinstance(config, dict) or not isinstance(dataset, dict):
            raise _fail(where, "config and dataset must be objects")
        if not isinstance(parties, list) or not all(isinstance(p, str) for p in parties):
            raise _fail(where, "parties must be a list of strings")
        seed = manifest.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
            raise _fail(where, "seed must be an integer in [0, 2**63) or null")
        arrays_table = manifest.get("arrays")
        if arrays_table is not None and not isinstance(arrays_table, dict):
            raise _fail(where, "'arrays' must be an object")
        raw_messages = _require(manifest, "messages", list, where)
        messages = []
        cache: dict[str, np.ndarray] = {}
        budget = max_bytes
        last_seq = -1
        for i, raw in enumerate(raw_messages):
            mwhere = f"{path}: message {i}"
            if not isinstance(raw, dict):
                raise _fail(mwhere, "must be an object")
            seq = _require(raw, "seq", int, mwhere)
            rnd = _require(raw, "round", int, mwhere)
            sender = _require(raw, "sender", str, mwhere)
            receiver = _require(raw, "receiver", str, mwhere)
            kind = _require(raw, "kind", str, mwhere)
            if seq <= last_seq:
                raise _fail(mwhere, f"seq {seq} does not increase (previous {last_seq})")
            last_seq = seq
            refs = raw.get("payload", {})
            meta = raw.get("meta", {})
            if not isinstance(refs, dict) or not isinstance(meta, dict):
                raise _fail(mwhere, "payload and meta must be objects")
            payload = {}
            for name, member in refs.items():
                _safe_member(member, mwhere)
                if member not in infos or member == "manifest.json":
                    raise _fail(mwhere, f"payload {name!r} points at missing array {member!r}")
                if member not in cache:
                    expected = None
                    if arrays_table is not None:
                        expected = arrays_table.get(member)
                        if not isinstance(expected, dict):
                            raise _fail(mwhere, f"array {member!r} is not described in the manifest")
                        if _simple_dtype(expected.get("dtype")) is None:
                            raise _fail(mwhere, f"array {member!r} has an invalid dtype in the manifest")
                        if _shape_list(expected.get("shape")) is None:
                            raise _fail(mwhere, f"array {member!r} has an invalid shape in the manifest")
                    cache[member] = _read_npy(path, zf, infos[member], expected, budget)
                    budget -= cache[member].nbytes
                payload[name] = cache[member]
            messages.append(Message(seq, rnd, sender, receiver, kind, payload, meta))
    return Transcript(protocol, config, seed, dataset, parties, messages)


def load_validated(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Transcript:
    """:func:`load` then :func:`privaudit.schema.validate` against the schema of the protocol the
    transcript names: the one path every command reads a transcript through, before any work."""
    from privaudit.schema import validate

    if not Path(path).exists():
        raise TranscriptError(printable(f"{path}: no such transcript file"))
    t = load(path, max_bytes=max_bytes)
    validate(t)
    return t


def summarize(transcript: Transcript) -> dict[str, Any]:
    """A JSON-able summary: parties, rounds, per-kind counts and bytes, private data present."""
    kinds: dict[str, dict[str, int]] = {}
    for m in transcript.messages:
        entry = kinds.setdefault(m.kind, {"messages": 0, "bytes": 0})
        entry["messages"] += 1
        entry["bytes"] += m.nbytes
    rounds = transcript.rounds()
    n_clients = len(transcript.clients())
    return {
        "protocol": transcript.protocol,
        "seed": transcript.seed,
        "dataset": transcript.dataset,
        "parties": len(transcript.parties),
        "clients": n_clients,
        "other_parties": [p for p in transcript.parties if not is_client(p)],
        "rounds": [rounds[0], rounds[-1]] if rounds else [],
        "messages": len(transcript.messages),
        "kinds": kinds,
        "private_included": transcript.has_private,
        "config": transcript.config,
    }


def iter_payload_arrays(messages: Iterable[Message]) -> Iterator[np.ndarray]:
    """Every payload array of ``messages`` in order."""
    for m in messages:
        yield from m.payload.values()

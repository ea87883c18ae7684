"""Hostile-input primitives shared by the transcript readers: bounded ZIP, manifest and ``.npy``.

Every limit is checked before the memory it guards is allocated: the central directory's size
before zipfile parses it, the sum of the members' declared sizes before any member is read, the
manifest's size/depth/containers before json.loads, and each array's size (from its .npy header,
which must agree with the member's declared size) before it is allocated. Members are inflated in
1 MiB chunks straight into the preallocated array; zipfile stops at the declared size and checks
the CRC, so a member can never inflate past its budget.
"""

from __future__ import annotations

import io
import math
import os
import posixpath
import re
import secrets
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from privaudit import _safejson
from privaudit._escape import printable
from privaudit.errors import TranscriptError

FORMAT_NAME = "privaudit-transcript"

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


def fail(path: Any, text: str) -> TranscriptError:
    return TranscriptError(printable(f"{path}: {text}"))


def _describe_zip_error(exc: BaseException) -> str:
    if isinstance(exc, zlib.error):
        return f"corrupt deflate data ({exc})"
    if isinstance(exc, EOFError):
        return "truncated (the compressed data ends early)"
    if isinstance(exc, zipfile.BadZipFile):
        return f"corrupt ({exc})"
    return f"unreadable ({type(exc).__name__}: {exc})"


def safe_member(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise fail(where, "member name must be a non-empty string")
    if name.startswith(("/", "\\")) or "\\" in name or (len(name) > 1 and name[1] == ":"):
        raise fail(where, f"absolute member path {name!r} refused")
    parts = name.split("/")
    if ".." in parts or posixpath.normpath(name) != name:
        raise fail(where, f"member path {name!r} refused (path traversal)")
    return name


def _check_info(path: Path, info: zipfile.ZipInfo) -> None:
    """Refuse member flags zipfile would trip over later (or silently honour)."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise fail(path, f"member {name!r} is encrypted (not supported)")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise fail(path, f"member {name!r} uses compression method {info.compress_type} (only stored and deflate)")
    if info.create_system == 3 and stat.S_ISLNK(info.external_attr >> 16):
        raise fail(path, f"member {name!r} is a symbolic link (refused)")


def simple_dtype(value: Any) -> np.dtype | None:
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


def shape_list(value: Any) -> list[int] | None:
    if not isinstance(value, list) or len(value) > _MAX_NDIM:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        return None
    return value


def npy_header(fh: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
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


def _npy_checked(path: Path, fh: Any, where: str, expected: dict | None) -> tuple[tuple[int, ...], bool, np.dtype]:
    """The header of an open ``.npy`` member, refused unless it is a plain numeric array that
    agrees with ``expected`` (``{"dtype", "shape"}`` from the manifest) when given."""
    try:
        shape, fortran, dtype = npy_header(fh)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise fail(path, f"{where}: {_describe_zip_error(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - numpy parses the header with ast; any failure is a bad header
        raise fail(path, f"{where}: not a valid .npy member ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject:
        raise fail(path, f"{where}: object arrays are refused (a pickle is never loaded)")
    if simple_dtype(dtype.str) != dtype:
        raise fail(path, f"{where}: dtype {dtype} refused (only plain bool/int/uint/float/complex arrays)")
    if len(shape) > _MAX_NDIM or any(d < 0 for d in shape):
        raise fail(path, f"{where}: invalid shape {shape}")
    if expected is not None and (np.dtype(expected["dtype"]) != dtype or list(expected["shape"]) != list(shape)):
        raise fail(
            path,
            f"{where}: array is {dtype.str} {list(shape)} but the manifest says {expected['dtype']} {expected['shape']}",
        )
    return shape, fortran, dtype


def open_npy(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, expected: dict | None, budget: int) -> Any:
    """``(stream at the data, shape, fortran, dtype, header bytes)`` of a checked member whose
    declared size matches its header and fits ``budget``."""
    where = f"member {info.filename!r}"
    try:
        fh = zf.open(info)
    except _ZIP_ERRORS as exc:
        raise fail(path, f"{where}: {_describe_zip_error(exc)}") from None
    try:
        shape, fortran, dtype = _npy_checked(path, fh, where, expected)
        nbytes = math.prod(shape) * dtype.itemsize
        header_len = fh.tell()
        if info.file_size != header_len + nbytes:
            raise fail(path, f"{where}: member holds {info.file_size - header_len} data bytes, header needs {nbytes}")
        if nbytes > budget:
            raise fail(path, f"{where}: {nbytes} bytes exceed the remaining budget of {budget} bytes (--max-bytes)")
    except BaseException:
        fh.close()
        raise
    return fh, shape, fortran, dtype, header_len


def read_npy(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, expected: dict | None, budget: int) -> np.ndarray:
    """Parse one ``.npy`` member safely: header checks before any data is read, then the data
    inflated chunk by chunk into an array preallocated from the header."""
    where = f"member {info.filename!r}"
    fh, shape, fortran, dtype, _ = open_npy(path, zf, info, expected, budget)
    with fh:
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
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
                    raise fail(path, f"{where}: truncated array data")
                if chunk_arr[:n].any():
                    raw[got : got + n] = chunk_arr[:n]
                got += n
            if fh.read(1):  # reaching the end also makes zipfile check the CRC
                raise fail(path, f"{where}: data beyond the array")
        except TranscriptError:
            raise
        except _ZIP_ERRORS as exc:
            raise fail(path, f"{where}: {_describe_zip_error(exc)}") from None
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def member_data_offset(path: Path, fd: int, info: zipfile.ZipInfo, file_size: int) -> int:
    """Byte offset of a member's data in the file, from its local header (which must name the
    member and lie, with the data, inside the file)."""
    where = f"member {info.filename!r}"
    head = os.pread(fd, 30, info.header_offset)
    if len(head) != 30 or head[:4] != b"PK\x03\x04":
        raise fail(path, f"{where}: no local header at offset {info.header_offset}")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    name = os.pread(fd, name_len, info.header_offset + 30)
    if name != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace"):
        raise fail(path, f"{where}: local and central directory names differ")
    start = info.header_offset + 30 + name_len + extra_len
    if start + info.compress_size > file_size:
        raise fail(path, f"{where}: data runs past the end of the file")
    return start


def _require(obj: Mapping, key: str, types: type | tuple, where: str) -> Any:
    if key not in obj:
        raise fail(where, f"missing field {key!r}")
    value = obj[key]
    if not isinstance(value, types) or (isinstance(value, bool) and types is int):
        raise fail(where, f"field {key!r} has the wrong type")
    return value


def open_archive(path: Path, max_bytes: int) -> zipfile.ZipFile:
    """Open the ZIP after checking that it is a regular file and its central directory's declared
    size and entry count (a FIFO or a device such as /dev/zero is refused before it is opened)."""
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as exc:
        raise fail(path, f"cannot be read ({exc.strerror or exc})") from None
    if not regular:
        raise fail(path, "not a regular file (a transcript is a .ptx file)")
    try:
        with open(path, "rb") as fh:
            endrec = zipfile._EndRecData(fh)  # the same end record zipfile itself reads
    except OSError as exc:
        raise fail(path, f"cannot be read ({exc.strerror or exc})") from None
    except _ZIP_ERRORS:
        endrec = None  # zipfile below reports the problem
    if endrec:
        limits = _limits(max_bytes, 0)
        entries, cd_size = int(endrec[zipfile._ECD_ENTRIES_TOTAL]), int(endrec[zipfile._ECD_SIZE])
        if entries > limits["members"] or cd_size > limits["central_directory"]:
            raise fail(
                path,
                f"the archive declares {entries} members in a {cd_size}-byte directory; the limit is "
                f"{limits['members']} members (raise --max-bytes for larger transcripts)",
            )
    try:
        return zipfile.ZipFile(path, "r")
    except _ZIP_ERRORS as exc:
        raise fail(path, f"not a transcript archive ({_describe_zip_error(exc)})") from None


def read_manifest(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, limits: dict[str, int]) -> dict:
    if info.file_size > limits["manifest_bytes"]:
        raise fail(
            path,
            f"manifest.json declares {info.file_size} bytes, more than the limit of {limits['manifest_bytes']} "
            f"for an archive of {limits['n_members']} members",
        )
    try:
        with zf.open(info) as fh:
            data = fh.read(limits["manifest_bytes"] + 1)
    except _ZIP_ERRORS as exc:
        raise fail(path, f"member 'manifest.json': {_describe_zip_error(exc)}") from None
    try:
        manifest = _safejson.loads(
            data,
            max_bytes=limits["manifest_bytes"],
            max_depth=_MANIFEST_DEPTH,
            max_containers=limits["manifest_containers"],
            max_values=limits["manifest_values"],
        )
    except _safejson.JSONLimitError as exc:
        raise fail(path, f"manifest.json: {exc}") from None
    if not isinstance(manifest, dict):
        raise fail(path, "manifest.json must hold an object")
    return manifest


def list_members(path: Path, zf: zipfile.ZipFile, max_bytes: int) -> tuple[dict[str, zipfile.ZipInfo], dict[str, int]]:
    """The archive's members by name (each checked) and the limits for this archive, after the
    member count and the total declared size are checked against ``max_bytes``.

    The manifest's allowance grows with the members and with the message slots of the offsets
    members (``*.offsets.npy``, 8 bytes a slot) that a columnar archive holds.
    """
    infos: dict[str, zipfile.ZipInfo] = {}
    total = slots = 0
    for info in zf.infolist():
        if info.is_dir() and info.file_size == 0:
            continue
        safe_member(info.filename, str(path))
        if info.filename in infos:
            raise fail(path, f"member {info.filename!r} appears twice in the archive (ambiguous; refused)")
        _check_info(path, info)
        infos[info.filename] = info
        total += info.file_size
        if info.filename.endswith(".offsets.npy"):
            slots += info.file_size // 8
    limits = _limits(max_bytes, len(infos) + slots)
    limits["n_members"] = len(infos)
    if len(infos) > limits["members"]:
        raise fail(path, f"{len(infos)} members, more than the limit of {limits['members']} (--max-bytes)")
    if total > max_bytes:
        raise fail(
            path, f"uncompressed size {total} bytes exceeds the limit of {max_bytes} bytes (raise it with --max-bytes)"
        )
    if "manifest.json" not in infos:
        raise fail(path, "no manifest.json (not a privaudit transcript)")
    return infos, limits


def read_header(path: Path, manifest: dict, versions: tuple[int, ...]) -> dict[str, Any]:
    """Format, version, protocol, config, seed, dataset and parties of a manifest, checked."""
    if manifest.get("format") != FORMAT_NAME:
        raise fail(path, f"unknown format {manifest.get('format')!r} (expected {FORMAT_NAME!r})")
    version = manifest.get("version")
    if type(version) is not int or version not in versions:  # 1.0 and true are not the integer 1
        readable = " and ".join(str(v) for v in versions)
        raise fail(path, f"unsupported transcript version {version!r} (this privaudit reads versions {readable})")
    where = f"{path}: manifest"
    protocol = _require(manifest, "protocol", str, where)
    config = manifest.get("config", {})
    dataset = manifest.get("dataset", {})
    parties = manifest.get("parties", [])
    if not isinstance(config, dict) or not isinstance(dataset, dict):
        raise fail(where, "config and dataset must be objects")
    if not isinstance(parties, list) or not all(isinstance(p, str) for p in parties):
        raise fail(where, "parties must be a list of strings")
    seed = manifest.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
        raise fail(where, "seed must be an integer in [0, 2**63) or null")
    return {
        "version": version,
        "protocol": protocol,
        "config": config,
        "seed": seed,
        "dataset": dataset,
        "parties": parties,
    }


def message_fields(raw: Any, mwhere: str, last_seq: int) -> tuple[int, int, str, str, str, dict, dict]:
    """``(seq, round, sender, receiver, kind, payload refs, meta)`` of one manifest message."""
    if not isinstance(raw, dict):
        raise fail(mwhere, "must be an object")
    seq = _require(raw, "seq", int, mwhere)
    rnd = _require(raw, "round", int, mwhere)
    sender = _require(raw, "sender", str, mwhere)
    receiver = _require(raw, "receiver", str, mwhere)
    kind = _require(raw, "kind", str, mwhere)
    if seq <= last_seq:
        raise fail(mwhere, f"seq {seq} does not increase (previous {last_seq})")
    refs = raw.get("payload", {})
    meta = raw.get("meta", {})
    if not isinstance(refs, dict) or not isinstance(meta, dict):
        raise fail(mwhere, "payload and meta must be objects")
    return seq, rnd, sender, receiver, kind, refs, meta


def check_path(path: Path, max_bytes: int) -> None:
    """Refuse a bad budget, a missing file or a folder before the archive is opened."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise TranscriptError(f"max_bytes must be a positive integer, got {max_bytes!r}")
    if not path.exists():
        raise fail(path, "no such transcript file")
    if path.is_dir():
        raise fail(path, "is a directory, not a transcript file")


# --------------------------------------------------------------------------------------
# writing


_PLAIN = (str, int, float, bool, type(None))


def jsonable(value: Any, where: str) -> Any:
    """Check (and normalise numpy scalars in) a config/meta value for JSON."""
    if type(value) is dict and all(type(k) is str and type(v) in _PLAIN for k, v in value.items()):
        return value  # the common flat meta (``{"dataset_user": 3}``): nothing to normalise
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return [jsonable(v, where) for v in value.tolist()]
    if isinstance(value, dict):
        return {str(k): jsonable(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, where) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{where}: {type(value).__name__} is not JSON-able")


def npy_header_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header numpy writes for a C-ordered array of ``dtype`` and ``shape``."""
    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def open_temp(path: Path) -> tuple[Path, BinaryIO]:
    """A new hidden temporary file beside ``path`` (for an atomic :func:`commit_temp`)."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise TranscriptError(printable(f"{path}: cannot write the transcript ({exc.strerror or exc})")) from None
    return tmp, os.fdopen(fd, "w+b")


def commit_temp(tmp: Path, fh: BinaryIO, path: Path) -> None:
    """Flush and fsync ``fh``, close it and rename ``tmp`` onto ``path``."""
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()
    try:
        os.replace(tmp, path)
    except OSError as exc:
        raise TranscriptError(printable(f"{path}: cannot write the transcript ({exc.strerror or exc})")) from None


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Write ``path`` through a temporary file renamed into place (a reader never sees half a
    file; a failure leaves the file already at ``path`` untouched)."""
    tmp, fh = open_temp(path)
    try:
        yield fh
        commit_temp(tmp, fh, path)
    except BaseException:
        fh.close()
        tmp.unlink(missing_ok=True)
        raise

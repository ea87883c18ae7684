"""Hostile and malformed inputs to `privaudit inspect`, `attack --transcript` and `report`.

Each file is built directly with struct/zlib/zipfile (small on disk: a 3.5 GiB member is a
3.6 MB deflate stream) and handed to ``python -m privaudit`` in a subprocess. For every file:
exit code 2, exactly one line on stderr, nothing written (no report folder, no stray file
beside the input), peak RSS of the child under 1 GB (``os.wait4``'s ``ru_maxrss``, measured from a
small launcher so that pytest's own memory is not inherited), and no
score printed. The subprocesses run four at a time in one module fixture; the tests then
assert on each outcome.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import warnings
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from privaudit import transcript as tr
from tests.transcript_files import manifest_dict, npy_bytes

ROOT = Path(__file__).resolve().parents[1]
RSS_LIMIT = 1024**3  # 1 GB
GiB = 1024**3

# ------------------------------------------------------------------------------------ builders


def npy_header(descr: str, shape: str, fortran: str = "False") -> bytes:
    """A version 1.0 .npy header with the given literal ``descr`` and ``shape`` (no data)."""
    text = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}"
    pad = 64 - (10 + len(text) + 1) % 64
    text = text + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def repeated_deflate(head: bytes, chunk: bytes, times: int) -> bytes:
    """Raw deflate of ``head + chunk * times`` without materialising it: after a full flush the
    compressor forgets its history, so every chunk compresses to the same bytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    out = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH) == block
    return out + block * times + c.flush()


def _deflate_with_tail(head: bytes, chunk: bytes, times: int, tail: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    out = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    return out + block * times + c.compress(tail) + c.flush()


def raw_zip(entries: list[dict], eocd_entries: int | None = None, zip64_entries: int | None = None) -> bytes:
    """A ZIP archive from raw entries (fields: name, data (already compressed), usize, crc,
    method, flags, local_name, ext_attr, create_system, zip64_usize)."""
    out = io.BytesIO()
    central = []
    for e in entries:
        name = e["name"].encode("utf-8")
        local = e.get("local_name", e["name"]).encode("utf-8")
        method, flags = e.get("method", 8), e.get("flags", 0x800)
        crc, usize, data = e.get("crc", 0), e["usize"], e["data"]
        offset = out.tell()
        extra = b""
        c_usize, c_csize = usize, len(data)
        if "zip64_usize" in e:
            extra = struct.pack("<HHQQ", 1, 16, e["zip64_usize"], len(data))
            c_usize = c_csize = 0xFFFFFFFF
        out.write(
            struct.pack(
                "<IHHHHHIIIHH",
                0x04034B50,
                20,
                flags,
                method,
                0,
                0x21,
                crc,
                len(data),
                min(usize, 0xFFFFFFFF),
                len(local),
                0,
            )
            + local
            + data
        )
        central.append(
            struct.pack(
                "<IHHHHHHIIIHHHHHII",
                0x02014B50,
                (e.get("create_system", 0) << 8) | 45,
                45,
                flags,
                method,
                0,
                0x21,
                crc,
                c_csize,
                min(c_usize, 0xFFFFFFFF),
                len(name),
                len(extra),
                0,
                0,
                0,
                e.get("ext_attr", 0),
                offset,
            )
            + name
            + extra
        )
    cd_start = out.tell()
    for c in central:
        out.write(c)
    cd_size = out.tell() - cd_start
    n = len(entries) if eocd_entries is None else eocd_entries
    if zip64_entries is not None:
        z64 = out.tell()
        n64 = zip64_entries
        out.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n64, n64, cd_size, cd_start))
        out.write(struct.pack("<IIQI", 0x07064B50, 0, z64, 1))
        n = 0xFFFF
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), cd_size, cd_start, 0))
    return out.getvalue()


def entry(name: str, payload: bytes, **kw) -> dict:
    """A deflated member with a correct CRC (override any field with ``kw``)."""
    e = {"name": name, "data": deflate(payload), "usize": len(payload), "crc": zlib.crc32(payload)}
    e.update(kw)
    return e


def manifest(arrays: dict | None = None, **kw) -> bytes:
    return json.dumps(manifest_dict(arrays=arrays, **kw)).encode()


GOOD_ARRAY = npy_bytes(np.ones((3, 2)))


def archive(
    array_entry: dict | None = None, manifest_entry: dict | None = None, extra: list | None = None, **kw
) -> bytes:
    entries = [manifest_entry or entry("manifest.json", manifest()), array_entry or entry("arrays/0.npy", GOOD_ARRAY)]
    return raw_zip(entries + (extra or []), **kw)


def zero_bomb(mib: int = 3584, valid_crc: bool = False) -> bytes:
    """``mib`` MiB of float64 zeros (default 3.5 GiB, under the old 4 GiB cap) in a ~1 KB/MiB file;
    the CRC is only computed (1 s per GiB) when asked for."""
    n = mib * 2**20 // 8
    head = npy_header("'<f8'", f"({n},)")
    data = repeated_deflate(head, bytes(1 << 20), mib)
    crc = 0
    if valid_crc:
        crc, zeros = zlib.crc32(head), bytes(1 << 20)
        for _ in range(mib):
            crc = zlib.crc32(zeros, crc)
    member = {"name": "arrays/0.npy", "data": data, "usize": len(head) + n * 8, "crc": crc}
    m = manifest({"arrays/0.npy": {"dtype": "<f8", "shape": [n]}})
    return raw_zip([entry("manifest.json", m), member])


def manifest_bomb(lie: bool = False, mib: int = 250) -> bytes:
    """manifest.json inflating to ``mib`` MiB of ``[{},{},...]`` (~1 KB per MiB on disk); valid JSON."""
    head = b'{"format":"privaudit-transcript","version":1,"protocol":"fedmvmf","messages":[{}'
    chunk = b",{}" * (1 << 18)
    times = mib * 2**20 // len(chunk)
    data = _deflate_with_tail(head, chunk, times, b"]}")
    usize = len(head) + len(chunk) * times + 2
    crc = zlib.crc32(head)
    for _ in range(times):
        crc = zlib.crc32(chunk, crc)
    crc = zlib.crc32(b"]}", crc)
    return raw_zip(
        [
            {"name": "manifest.json", "data": data, "usize": 100 if lie else usize, "crc": crc},
            entry("arrays/0.npy", GOOD_ARRAY),
        ]
    )


def deep_manifest(depth: int = 150_000) -> bytes:
    text = b'{"format":"privaudit-transcript","version":1,"protocol":"fedmvmf","messages":[],"config":{"x":'
    text += b"[" * depth + b"]" * depth + b"}}"
    return archive(manifest_entry=entry("manifest.json", text))


def many_messages(n: int) -> bytes:
    """A manifest of ``n`` messages all pointing at the one array member (about 120 bytes each)."""
    msg = {
        "seq": 0,
        "round": 0,
        "sender": "server",
        "receiver": "server",
        "kind": "state",
        "payload": {"V": "arrays/0.npy"},
        "meta": {},
    }
    return manifest(messages=[dict(msg, seq=i) for i in range(n)])


def with_corrupt_deflate() -> bytes:
    e = entry("arrays/0.npy", GOOD_ARRAY)
    e["data"] = b"\xff" * 8 + e["data"][8:]
    return archive(e)


def duplicated(path: Path, out: Path) -> None:
    """Append a second copy of the private ratings of client:0 (changed) to a valid transcript."""
    with zipfile.ZipFile(path) as zf:
        m = json.loads(zf.read("manifest.json"))
        if m["version"] == 1:
            member = next(msg["payload"]["ratings"] for msg in m["messages"] if msg["kind"] == "private")
        else:  # the column of every client's private ratings
            member = next(c["data"] for c in m["columns"] if (c["kind"], c["field"]) == ("private", "ratings"))
        ratings = np.load(io.BytesIO(zf.read(member)))
    out.write_bytes(path.read_bytes())
    with warnings.catch_warnings(), zipfile.ZipFile(out, "a") as zf:
        warnings.simplefilter("ignore")
        zf.writestr(member, npy_bytes(np.clip(6.0 - ratings, 1.0, 5.0)))


# ------------------------------------------------------------------------- format 2 (columnar)


def v2_parts(tmp: Path) -> tuple[dict, dict[str, tuple[bytes, int]]]:
    """A valid version-2 file as (manifest, member -> (bytes, compression)): messages 0 and 1
    upload ids (column 0, 5 rows) and rows (column 1, 5 x 4, offsets [0, 3, 5], owners [0, 1]),
    message 2 a stored 300 x 4 state (column 2)."""
    t = tr.Transcript("fedmvmf", parties=["server", "client:0", "client:1"])
    t.add(0, "client:0", "server", "grad_V", {"items": np.arange(3), "values": np.ones((3, 4))})
    t.add(0, "client:1", "server", "grad_V", {"items": np.arange(2), "values": np.ones((2, 4))})
    t.add(0, "server", "server", "state", {"V": np.ones((300, 4))})
    with zipfile.ZipFile(t.save(tmp / "v2.ptx")) as zf:
        members = {i.filename: (zf.read(i), i.compress_type) for i in zf.infolist()}
    m = json.loads(members.pop("manifest.json")[0])
    assert [c["stored"] for c in m["columns"]] == [False, False, True]
    return m, members


def v2_archive(m: dict, members: dict[str, tuple[bytes, int]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("manifest.json", json.dumps(m), compress_type=zipfile.ZIP_DEFLATED)
        for name, (data, method) in members.items():
            zf.writestr(name, data, compress_type=method)
    return out.getvalue()


def v2_case(tmp: Path, edit) -> bytes:
    """The valid version-2 file after ``edit(manifest, members)`` (in place)."""
    m, members = v2_parts(tmp)
    edit(m, members)
    return v2_archive(m, members)


def _offsets(values: list[int]):
    def edit(m, members):
        members[m["columns"][1]["offsets"]] = (npy_bytes(np.array(values, dtype=np.int64)), zipfile.ZIP_DEFLATED)

    return edit


def _owners(values: list[int]):
    def edit(m, members):
        members[m["columns"][1]["owners"]] = (npy_bytes(np.array(values, dtype=np.int64)), zipfile.ZIP_DEFLATED)

    return edit


def _table(row: int, col: int, value: int):
    def edit(m, members):
        table = np.load(io.BytesIO(members["messages.npy"][0]))
        table[row, col] = value
        members["messages.npy"] = (npy_bytes(table), zipfile.ZIP_DEFLATED)

    return edit


def _column_field(c: int, key: str, value):
    def edit(m, members):
        m["columns"][c][key] = value

    return edit


def _deflated_state(m, members):
    name = m["columns"][2]["data"]
    members[name] = (members[name][0], zipfile.ZIP_DEFLATED)


def _many_members(m, members):
    for k in range(1100):
        members[f"columns/x{k}.npy"] = (b"", zipfile.ZIP_STORED)


V2_CASES = {  # name: (edit, extra inspect arguments, expected text)
    "v2 offsets out of range": (_offsets([0, 3, 9]), [], "out of range of the column's 5 rows"),
    "v2 offsets not monotone (overlapping rows)": (_offsets([0, 6, 5]), [], "not monotone (slot 1: 6 then 5"),
    "v2 negative offset": (_offsets([-1, 3, 5]), [], "negative offset -1"),
    "v2 overlapping payloads": (_owners([1, 1]), [], "owners do not increase (slot 1: message 1; overlapping"),
    "v2 owner out of range": (_owners([0, 7]), [], "message 7 is out of range of the 3 messages"),
    "v2 owner of another kind": (_owners([0, 2]), [], "message 2 (state, round 0) is not of the column's grad_V"),
    "v2 column rows disagree with the offsets": (_column_field(1, "rows", 6), [], "the manifest says the column has 6"),
    "v2 message count disagrees": (
        _column_field(1, "messages", 3),
        [],
        "array is <i8 [3] but the manifest says <i8 [4]",
    ),
    "v2 dtype mismatch": (_column_field(1, "dtype", "<f4"), [], "but the manifest says <f4 [5, 4]"),
    "v2 trailing shape mismatch": (_column_field(1, "shape", [5]), [], "but the manifest says <f8 [5, 5]"),
    "v2 seq not increasing": (_table(1, 0, 0), [], "seq must be non-negative and increase"),
    "v2 name index out of range": (_table(0, 2, 99), [], "a name index is out of range"),
    "v2 column member missing": (lambda m, mem: mem.pop("columns/1.npy"), [], "'columns/1.npy' is missing"),
    "v2 memmap of a compressed member": (_deflated_state, [], "compressed but column 2 says stored"),
    "v2 member outside the columns": (
        lambda m, mem: mem.update({"columns/9.npy": (npy_bytes(np.ones(2)), 8)}),
        [],
        "'columns/9.npy' belongs to no column",
    ),
    "v2 member count over the bound": (_many_members, ["--max-bytes", "1M"], "the limit is 1024 members"),
    "v2 budget counts the columns": (lambda m, mem: None, ["--max-bytes", "8K"], "exceeds the limit of 8192 bytes"),
}


# ------------------------------------------------------------------------------ schema cases


def _mutate(t: tr.Transcript, kind: str, name: str, fn, index: int = 0) -> tr.Transcript:
    msgs = [m for m in t.messages if m.kind == kind]
    m = msgs[index]
    m.payload = dict(m.payload)
    m.payload[name] = fn(np.array(m.payload[name]))
    return t


def _add_payload(t: tr.Transcript, kind: str, name: str, value: np.ndarray) -> tr.Transcript:
    m = next(m for m in t.messages if m.kind == kind)
    m.payload = dict(m.payload, **{name: value})
    return t


def _drop_payload(t: tr.Transcript, kind: str, name: str) -> tr.Transcript:
    m = next(m for m in t.messages if m.kind == kind)
    m.payload = {k: v for k, v in m.payload.items() if k != name}
    return t


def _set(arr: np.ndarray, value) -> np.ndarray:
    arr = arr.copy()
    arr.flat[0] = value
    return arr


SCHEMA_CASES = {
    "negative item id": (lambda t: _mutate(t, "grad_V", "items", lambda a: _set(a, -1)), "id -1 is outside"),
    "item id 1e9": (lambda t: _mutate(t, "grad_V", "items", lambda a: _set(a, 10**9)), "id 1000000000 is outside"),
    "private id out of range": (lambda t: _mutate(t, "private", "items", lambda a: _set(a, 10**6)), "is outside [0,"),
    "repeated item id": (lambda t: _mutate(t, "grad_V", "items", lambda a: np.r_[a[:1], a[:1], a[2:]]), "repeats"),
    "K mismatch": (lambda t: _mutate(t, "grad_V", "values", lambda a: a[:, :-1]), "expected K ="),
    "NaN upload": (lambda t: _mutate(t, "grad_V", "values", lambda a: _set(a, np.nan)), "NaN or infinite"),
    "Inf state": (lambda t: _mutate(t, "state", "V", lambda a: _set(a, np.inf)), "NaN or infinite"),
    "rows != items": (lambda t: _mutate(t, "grad_V", "values", lambda a: a[:-1]), "expected @r"),
    "rating out of range": (lambda t: _mutate(t, "private", "ratings", lambda a: _set(a, 99.0)), "values outside"),
    "relabelled fedsplit": (lambda t: setattr(t, "protocol", "fedsplit") or t, "fedsplit"),
    "relabelled fedrec": (lambda t: setattr(t, "protocol", "fedrec") or t, "fedrec"),
    "unknown protocol": (lambda t: setattr(t, "protocol", "nope\x1b[2K\rfake") or t, "unknown protocol"),
    "unknown kind": (
        lambda t: t.add(0, "server", "server", "debug", {"x": np.ones(2)}) and t,
        "not a fedmvmf message kind",
    ),
    "extra payload": (lambda t: _add_payload(t, "grad_P", "secret", np.ones(1)), "is not part of"),
    "float ids": (lambda t: _mutate(t, "grad_V", "items", lambda a: a.astype(np.float64)), "is not int"),
    "missing payload": (lambda t: _drop_payload(t, "grad_V", "items"), "is missing"),
}


# ------------------------------------------------------------------------------------- runner


# Linux counts the memory a process had before exec in its ru_maxrss, and a child forked from
# pytest starts with pytest's pages; so the CLI is started by this small interpreter, which
# writes its child's peak RSS (bytes) to the file named by its first argument.
_MEASURE = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss * 1024))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def measured_run(args: list[str], cwd: Path | str, pythonpath: Path | str = ROOT) -> dict:
    """Run ``python -m privaudit ARGS`` in ``cwd``: exit code, stdout, stderr and peak RSS (bytes)."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    env.pop("COLUMNS", None)
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe, tempfile.TemporaryDirectory() as tmp:
        rss_file = os.path.join(tmp, "rss")
        cmd = [sys.executable, "-c", _MEASURE, rss_file, sys.executable, "-m", "privaudit", *args]
        rc = subprocess.run(cmd, cwd=cwd, stdout=fo, stderr=fe, env=env, check=False).returncode
        fo.seek(0)
        fe.seek(0)
        with open(rss_file) as fh:
            rss = int(fh.read())
        out, err = fo.read().decode(errors="replace"), fe.read().decode(errors="replace")
        return {"rc": rc, "out": out, "err": err, "rss": rss}


_run = measured_run


def _folder(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


@pytest.fixture(scope="module")
def base_ptx(tmp_path_factory) -> Path:
    from privaudit.experiment import run_transcript

    folder = tmp_path_factory.mktemp("base")
    result = run_transcript(protocol="fedmvmf", protocol_config={"epochs": 2}, users=12)
    return result.transcript.save(folder / "base.ptx")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, base_ptx) -> dict:
    """Build every hostile file, run the CLI on each (four at a time), return name -> outcome."""
    root = tmp_path_factory.mktemp("hostile")
    jobs: dict[str, tuple[list[str], Path, str]] = {}

    def inspect_case(name: str, data: bytes, expect: str) -> None:
        d = root / _folder(name)
        d.mkdir()
        (d / "bad.ptx").write_bytes(data)
        jobs[name] = (["inspect", "bad.ptx"], d, expect)

    a0, good = "arrays/0.npy", GOOD_ARRAY
    big = npy_bytes(np.arange(4096.0))
    neg_offset = {"names": ["a"], "formats": ["<f8"], "offsets": [-8]}
    cases = [
        ("zero member 3.5 GiB", zero_bomb(), "exceeds the limit"),
        ("manifest bomb 250 MiB", manifest_bomb(), "manifest.json declares"),
        ("manifest bomb, size lies", manifest_bomb(lie=True), "manifest.json"),
        ("manifest nested 150k", deep_manifest(150_000), "levels deep"),
        ("manifest nested 100k", deep_manifest(100_000), "levels deep"),
        ("bad CRC", archive(entry(a0, good, crc=1234)), "Bad CRC-32"),
        ("corrupt deflate", with_corrupt_deflate(), "corrupt deflate data"),
        ("encrypted flag", archive(entry(a0, good, flags=0x801)), "is encrypted"),
        ("compression method 99", archive(entry(a0, good, method=99)), "compression method 99"),
        ("local/central name mismatch", archive(entry(a0, good, local_name="arrays/1.npy")), "differ"),
        # zipfile stops at the declared size, so the CRC (or, for large members, the .npy header) disagrees
        (
            "central size smaller than data",
            archive(entry(a0, good, usize=len(good) - 8)),
            "member 'arrays/0.npy': corrupt (Bad CRC-32",
        ),
        ("central size smaller than data (large member)", archive(entry(a0, big, usize=len(big) - 8)), "header needs"),
        ("npy shape (-1,-1)", archive(entry(a0, npy_header("'<f8'", "(-1, -1)") + bytes(8))), "invalid shape"),
        (
            "zero-itemsize dtype x 10^18",
            archive(entry(a0, npy_header("'|V0'", "(10**18,)"))),
            "not a valid .npy member",
        ),
        ("zero-itemsize dtype x 10^18 (literal)", archive(entry(a0, npy_header("'|V0'", f"({10**18},)"))), "refused"),
        (
            "table shape 18",
            archive(manifest_entry=entry("manifest.json", manifest({a0: {"dtype": "<f8", "shape": 18}}))),
            "invalid shape in the manifest",
        ),
        (
            "table dtype dict, negative offset",
            archive(manifest_entry=entry("manifest.json", manifest({a0: {"dtype": neg_offset, "shape": [3, 2]}}))),
            "invalid dtype in the manifest",
        ),
        (
            "npy dtype negative offset",
            archive(entry(a0, npy_header(repr(dict(neg_offset, itemsize=8)), "(1,)") + bytes(8))),
            "not a valid .npy member",
        ),
        ("object dtype", archive(entry(a0, npy_header("'|O'", "(1,)") + bytes(8))), "object arrays are refused"),
        ("duplicate member names", archive(extra=[entry(a0, npy_bytes(np.zeros((3, 2))))]), "appears twice"),
        ("symlink member", archive(entry(a0, good, create_system=3, ext_attr=0o120777 << 16)), "symbolic link"),
        ("absurd member count (zip64 end record)", archive(zip64_entries=10**9), "declares 1000000000 members"),
        ("zip64 size 2^62", archive(entry(a0, good, zip64_usize=2**62)), "exceeds the limit"),
        (
            "non-UTF-8 manifest",
            archive(manifest_entry=entry("manifest.json", manifest().replace(b"mvmf", b"\xffmvmf"))),
            "not UTF-8",
        ),
        ("truncated archive", archive()[:-30], "not a transcript archive"),
        (
            "absurd message count in the manifest",
            archive(manifest_entry=entry("manifest.json", many_messages(200_000))),
            "manifest.json declares",
        ),
        ("path traversal", archive(extra=[entry("../evil.npy", good)]), "path traversal"),
        (
            "control characters in a member name",
            archive(extra=[entry("arrays/\x1b[2K\rprivaudit: ok.npy", good, method=99)]),
            "compression method 99",
        ),
        # the three files of the first round that were still accepted
        ("negative seed", archive(manifest_entry=entry("manifest.json", manifest(seed=-1))), "seed must be"),
        ("version 1.0", archive(manifest_entry=entry("manifest.json", manifest(version=1.0))), "version 1.0"),
        ("version true", archive(manifest_entry=entry("manifest.json", manifest(version=True))), "version True"),
    ]
    for name, data, expect in cases:
        inspect_case(name, data, expect)
    for name, (edit, extra_args, expect) in V2_CASES.items():
        inspect_case(name, v2_case(root, edit), expect)
        jobs[name][0].extend(extra_args)

    dup = root / "duplicate_in_attack"
    dup.mkdir()
    duplicated(base_ptx, dup / "bad.ptx")
    jobs["duplicate member (attack)"] = (["attack", "--transcript", "bad.ptx", "--out", "rep"], dup, "appears twice")
    for name, (fn, expect) in SCHEMA_CASES.items():
        d = root / _folder(name)
        d.mkdir()
        fn(tr.load(base_ptx)).save(d / "bad.ptx")
        jobs[name] = (["attack", "--transcript", "bad.ptx", "--out", "rep"], d, expect)
    deep = root / "deep_results"
    deep.mkdir()
    head = '{"protocol":"x","attack":"y","sweep":null,"points":[],"x":'
    (deep / "results.json").write_text(head + "[" * 150_000 + "]" * 150_000 + "}")
    jobs["report on deeply nested results.json"] = (["report", "."], deep, "levels deep")

    before = {name: sorted(p.name for p in d.iterdir()) for name, (_, d, _) in jobs.items()}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run, args, d) for name, (args, d, _) in jobs.items()}
    results = {}
    for name, (_args, d, expect) in jobs.items():
        res = futures[name].result()
        res.update(expect=expect, before=before[name], after=sorted(p.name for p in d.iterdir()))
        results[name] = res
    return results


def _cases() -> list[str]:
    return [
        "zero member 3.5 GiB",
        "manifest bomb 250 MiB",
        "manifest bomb, size lies",
        "manifest nested 150k",
        "manifest nested 100k",
        "bad CRC",
        "corrupt deflate",
        "encrypted flag",
        "compression method 99",
        "local/central name mismatch",
        "central size smaller than data",
        "central size smaller than data (large member)",
        "npy shape (-1,-1)",
        "zero-itemsize dtype x 10^18",
        "zero-itemsize dtype x 10^18 (literal)",
        "table shape 18",
        "table dtype dict, negative offset",
        "npy dtype negative offset",
        "object dtype",
        "duplicate member names",
        "symlink member",
        "absurd member count (zip64 end record)",
        "zip64 size 2^62",
        "non-UTF-8 manifest",
        "truncated archive",
        "absurd message count in the manifest",
        "path traversal",
        "control characters in a member name",
        "negative seed",
        "version 1.0",
        "version true",
        "duplicate member (attack)",
        *V2_CASES,
        *SCHEMA_CASES,
        "report on deeply nested results.json",
    ]


@pytest.mark.parametrize("name", _cases())
def test_hostile_input_is_refused_in_one_line(outcomes, name):
    res = outcomes[name]
    lines = res["err"].splitlines()
    assert res["rc"] == 2, (res["rc"], res["err"][-2000:])
    assert len(lines) == 1, res["err"][-2000:]
    assert lines[0].startswith("privaudit: error: ")
    assert res["expect"] in lines[0], lines[0]
    assert "\x1b" not in res["err"] and "\r" not in res["err"]
    assert res["rss"] < RSS_LIMIT, f"peak RSS {res['rss'] / 2**20:.0f} MiB"
    assert res["after"] == res["before"], "the refused command wrote a file"
    assert "report written" not in res["out"] and "auc" not in res["out"].lower()


def test_the_memory_cases_stay_small(outcomes):
    """The two cases of the issue that took 10.8 GB and 6.3 GB: refused under 200 MB."""
    for name in ("zero member 3.5 GiB", "manifest bomb 250 MiB"):
        assert outcomes[name]["rss"] < 200 * 2**20, (name, outcomes[name]["rss"])


def test_untouched_base_transcript_attacks_fine(tmp_path, base_ptx):
    """Control: the base file of the schema cases passes validation and is attacked (exit 0)."""
    res = _run(["attack", "--transcript", str(base_ptx), "--out", str(tmp_path / "rep"), "--quiet"], tmp_path)
    assert res["rc"] == 0, res["err"]
    assert (tmp_path / "rep" / "results.json").exists()


def test_inspect_escapes_control_characters(tmp_path, base_ptx):
    """A dataset name holding ANSI escapes and CR prints as visible escapes; a kind that the
    schema refuses is named escaped in the one error line."""
    t = tr.load(base_ptx)
    t.dataset = dict(t.dataset, name="x\r\x1b[2Kprivaudit: error: fake")
    path = t.save(tmp_path / "esc.ptx")
    res = _run(["inspect", str(path)], tmp_path)
    assert res["rc"] == 0, res["err"]
    assert "\x1b" not in res["out"] and "\r" not in res["out"]
    assert "\\x1b[2K" in res["out"] and "\\x0d" in res["out"]
    t.add(0, "server", "server", "state\nkinds:\x1b[31m", {"V": np.ones(2)})
    bad = t.save(tmp_path / "bad.ptx")
    res = _run(["inspect", str(bad)], tmp_path)
    assert res["rc"] == 2 and len(res["err"].splitlines()) == 1 and "\x1b" not in res["err"]
    assert "is not a fedmvmf message kind" in res["err"] and "kinds:\\x1b[31m" in res["err"]


def test_max_bytes_option_raises_the_budget(tmp_path, base_ptx):
    size = sum(a.nbytes for a in tr.iter_payload_arrays(tr.load(base_ptx).messages))
    small = _run(["inspect", str(base_ptx), "--max-bytes", str(size // 2)], tmp_path)
    assert small["rc"] == 2 and "--max-bytes" in small["err"] and len(small["err"].splitlines()) == 1
    assert _run(["inspect", str(base_ptx), "--max-bytes", str(4 * size + 2**20)], tmp_path)["rc"] == 0


# ------------------------------------------------------------------ round two: recorded transcripts

RECORDED_MAP = {
    "round": "group_id",
    "round-base": 1,
    "public": {},
    "kinds": [
        {"kind": "model", "direction": "down", "when": ["item-emb/V"], "payload": {"V": "item-emb/V"}},
        {
            "kind": "item_update",
            "direction": "up",
            "when": ["item-rows/ids", "item-rows/rows"],
            "payload": {"items": "item-rows/ids", "values": "item-rows/rows"},
            "meta": {"values": "rows"},
        },
    ],
}


def recorded_transcript(clients: int = 12, m: int = 60, k: int = 4, rounds: int = 2) -> tr.Transcript:
    """A ``flower`` transcript as privaudit record writes it: FedAvg-MF uploads of each client's
    own 8 items (so generic-trained-items recovers them exactly), the sent models as ``state``."""
    rng = np.random.default_rng(0)
    config = {
        "n_items": m,
        "rating_min": 1.0,
        "rating_max": 5.0,
        "rating_step": 1.0,
        "schema_map": RECORDED_MAP,
        "defenses": [],
        "recorded_from": "flower",
    }
    names = [f"client:{i}" for i in range(clients)]
    t = tr.Transcript("flower", config, 0, {"name": "flower:toy", "users": clients, "items": m}, ["server", *names])
    own = {}
    for c in names:
        own[c] = np.sort(rng.choice(m, 8, replace=False)).astype(np.int64)
        t.add(0, c, c, "private", {"items": own[c], "ratings": rng.integers(1, 6, 8).astype(np.float64)})
    V = rng.normal(size=(m, k))
    for r in range(rounds):
        t.add(r, "server", "server", "state", {"V": V}, {"of": "model", "to": list(names)})
        for c in names:
            t.add(r, "server", c, "model", {"V": V})
        for c in names:
            rows = V[own[c]] + 0.1 * rng.normal(size=(8, k))
            t.add(r, c, "server", "item_update", {"items": own[c], "values": rows}, {"values": "rows"})
        V = V + 0.01 * rng.normal(size=V.shape)
    return t


def _upload(t: tr.Transcript, index: int = 0):
    return [m for m in t.messages if m.kind == "item_update"][index]


def _recorded_edit(fn):
    def edit(t: tr.Transcript) -> tr.Transcript:
        fn(t)
        return t

    return edit


def _set_item(t, value, dtype=np.int64):
    m = _upload(t)
    items = m.payload["items"].copy().astype(dtype)
    items[0] = value
    m.payload = dict(m.payload, items=items)


RECORDED_CASES = {
    "recorded: item id 5000, n_items 60": (_recorded_edit(lambda t: _set_item(t, 5000)), "id 5000 is outside [0, 60)"),
    "recorded: no schema map": (_recorded_edit(lambda t: t.config.pop("schema_map")), "no schema_map"),
    "recorded: no n_items, id 2^40": (
        _recorded_edit(lambda t: (t.config.pop("n_items"), _set_item(t, 2**40))),
        "an integer number of items is required",
    ),
    "recorded: n_items 2^31-1": (
        _recorded_edit(lambda t: t.config.update(n_items=2**31 - 1)),
        "n_items = 2147483647 is outside [1, 1048576]",
    ),
    "recorded: items 8 vs values 2x5": (
        _recorded_edit(lambda t: setattr(_upload(t), "payload", dict(_upload(t).payload, values=np.ones((2, 5))))),
        "axis 0 has length 2, expected @r = 8",
    ),
    "recorded: values K 5 vs V K 4": (
        _recorded_edit(lambda t: setattr(_upload(t), "payload", dict(_upload(t).payload, values=np.ones((8, 5))))),
        "axis 1 has length 5",
    ),
    "recorded: meta.to an int": (
        _recorded_edit(lambda t: next(m for m in t.messages if m.kind == "state").meta.update(to=7)),
        "meta 'to' must be a list",
    ),
    "recorded: meta.to names no party": (
        _recorded_edit(lambda t: next(m for m in t.messages if m.kind == "state").meta.update(to=["client:99"])),
        "meta 'to' names a party",
    ),
    "recorded: 3-D V": (
        _recorded_edit(
            lambda t: next(m for m in t.messages if m.kind == "model").payload.update(V=np.ones((60, 4, 2)))
        ),
        "3 axes",
    ),
    "recorded: negative id": (_recorded_edit(lambda t: _set_item(t, -1)), "id -1 is outside"),
    "recorded: rating_max 2e9": (_recorded_edit(lambda t: t.config.update(rating_max=2e9)), "levels, more than 1000"),
    "recorded: negative rating_step": (
        _recorded_edit(lambda t: t.config.update(rating_step=-0.5)),
        "rating_step = -0.5 must be positive",
    ),
    "recorded: string rating_min": (
        _recorded_edit(lambda t: t.config.update(rating_min="1")),
        "rating_min = '1' is not a finite number",
    ),
    "recorded: NaN upload": (
        _recorded_edit(lambda t: _upload(t).payload["values"].__setitem__((0, 0), np.nan)),
        "NaN or infinite",
    ),
    "recorded: defenses [x]": (_recorded_edit(lambda t: t.config.update(defenses=["x"])), "defenses must be a list"),
    "recorded: float ids": (
        _recorded_edit(lambda t: _set_item(t, 1.5, dtype=np.float64)),
        "is not int",
    ),
    "recorded: private rating off the scale": (
        _recorded_edit(
            lambda t: next(m for m in t.messages if m.kind == "private").payload["ratings"].__setitem__(0, 99.0)
        ),
        "values outside [1, 5]",
    ),
}


@pytest.fixture(scope="module")
def recorded_files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("recorded")
    files = {}
    for name, (fn, _) in RECORDED_CASES.items():
        d = root / _folder(name)
        d.mkdir()
        files[name] = fn(recorded_transcript()).save(d / "bad.ptx")
    return files


@pytest.fixture(scope="module")
def recorded_outcomes(recorded_files) -> dict:
    """``privaudit audit --transcript`` on each recorded case, in a child (peak RSS measured)."""
    before = {name: sorted(p.name for p in f.parent.iterdir()) for name, f in recorded_files.items()}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            name: pool.submit(_run, ["audit", "--transcript", "bad.ptx"], f.parent)
            for name, f in recorded_files.items()
        }
    out = {}
    for name, f in recorded_files.items():
        res = futures[name].result()
        res.update(before=before[name], after=sorted(p.name for p in f.parent.iterdir()))
        out[name] = res
    return out


def _assert_refused(res: dict, expect: str) -> None:
    lines = res["err"].splitlines()
    assert res["rc"] == 2, (res["rc"], res["err"][-2000:])
    assert len(lines) == 1 and lines[0].startswith("privaudit: error: "), res["err"][-2000:]
    assert expect in lines[0], lines[0]
    assert "\x1b" not in res["err"] and "\r" not in res["err"]


@pytest.mark.parametrize("name", list(RECORDED_CASES))
def test_recorded_transcript_is_refused_by_audit(recorded_outcomes, name):
    res = recorded_outcomes[name]
    _assert_refused(res, RECORDED_CASES[name][1])
    assert res["rss"] < RSS_LIMIT and res["after"] == res["before"], "the refused command wrote a file"
    assert "leaks" not in res["out"] and "written" not in res["out"]


@pytest.mark.parametrize("name", list(RECORDED_CASES))
def test_recorded_transcript_is_refused_by_attack_and_inspect(recorded_files, name, capsys, monkeypatch):
    """The same one-line refusal from attack --transcript and inspect (one validation path)."""
    from privaudit.cli import main

    monkeypatch.chdir(recorded_files[name].parent)
    for argv in (["attack", "--transcript", "bad.ptx"], ["inspect", "bad.ptx"]):
        rc = main(argv)
        captured = capsys.readouterr()
        _assert_refused({"rc": rc, "err": captured.err}, RECORDED_CASES[name][1])
        assert "written" not in captured.out
    assert sorted(p.name for p in recorded_files[name].parent.iterdir()) == ["bad.ptx"]


def test_valid_recorded_transcript_is_audited(tmp_path):
    """Control: the unedited base of the recorded cases passes and leaks its clients' items
    (generic-trained-items f1 1.0 against the prior-only baseline's lower f1)."""
    recorded_transcript().save(tmp_path / "ok.ptx")
    res = _run(["audit", "--transcript", "ok.ptx", "-o", "aud"], tmp_path)
    assert res["rc"] == 0, res["err"]
    rows = {r["attack"]: r for r in json.loads((tmp_path / "aud" / "audit.json").read_text())["rows"]}
    items = rows["generic-trained-items"]
    assert items["metrics"]["f1"] == pytest.approx(1.0) and items["verdict"] == "leaks"
    assert items["metrics"]["f1"] > items["baseline_prior"]["f1"] + 0.3


# ------------------------------------------------------------------ round two: plan files and bounds


def _main(argv: list[str], capsys) -> tuple[int, str, str]:
    from privaudit.cli import main

    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _plan_text() -> str:
    from privaudit.plan import plan_to_toml, resolve

    return plan_to_toml(resolve(protocol="fedmvmf", seeds=1, jobs=1))


def _with(text: str, table: str, line: str) -> str:
    """``text`` with ``line`` added at the top of ``[table]`` (replacing a key of the same name)."""
    key = line.split("=")[0].strip()
    out, inside = [], False
    for row in text.splitlines():
        if row.startswith("["):
            inside = row.strip() == f"[{table}]"
            out.append(row)
            if inside:
                out.append(line)
            continue
        if inside and row.split("=")[0].strip().strip('"') == key:
            continue
        out.append(row)
    return "\n".join(out) + "\n"


PLAN_CASES = {
    "seeds 10^9": (("run", "seeds = 1000000000"), "seeds = 1000000000 is more than privaudit's cap of 1000"),
    "jobs 10^6": (("run", "jobs = 1000000"), "jobs = 1000000 is more than privaudit's cap of 1024"),
    "users 10^9": (("run", "users = 1000000000"), "users = 1000000000 is more than privaudit's cap"),
    "K 10^6": (("protocol", "K = 1000000"), "K must be at most 4096"),
    "epochs 10^9": (("protocol", "epochs = 1000000000"), "epochs must be at most 100000"),
    "sweep of 2000 values": (None, "sweep values = 2000 is more than privaudit's cap of 1000"),
    "TOML nested 1000 deep": (("protocol", "x = " + "[" * 1000 + "]" * 1000), "nested 1000 levels deep"),
    "dotted keys 1000 deep": (("protocol", ".".join(["a"] * 1000) + " = 1"), "nested more than 32 levels deep"),
}


@pytest.mark.parametrize("name", list(PLAN_CASES))
def test_plan_file_bounds_are_checked_before_any_work(tmp_path, capsys, monkeypatch, name):
    edit, expect = PLAN_CASES[name]
    text = _plan_text()
    if edit is None:
        text += '\n[sweep]\ntarget = "protocol"\nparam = "K"\nvalues = [' + ", ".join(["2"] * 2000) + "]\n"
    else:
        text = _with(text, *edit)
    (tmp_path / "plan.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    rc, out, err = _main(["attack", "--config", "plan.toml"], capsys)
    _assert_refused({"rc": rc, "err": err}, expect)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.toml"]


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["--protocol", "fedrec", "--set", "T=1000000000"], "T must be at most 100000"),
        (["--protocol", "fedrec", "--set", "d=1000000"], "d must be at most 4096"),
        (["--protocol", "fedmvmf", "--seeds", "1000000000"], "seeds = 1000000000 is more than"),
        (["--protocol", "fedmvmf", "--jobs", "1000000"], "jobs = 1000000 is more than"),
        (["--protocol", "fedmvmf", "--sweep", "protocol.K=" + ",".join(["2"] * 10**6)], "more than 1000 values"),
    ],
)
def test_command_line_bounds(tmp_path, capsys, monkeypatch, argv, expect):
    monkeypatch.chdir(tmp_path)
    rc, _, err = _main(["attack", *argv], capsys)
    _assert_refused({"rc": rc, "err": err}, expect)
    assert list(tmp_path.iterdir()) == []


def _listener():
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.settimeout(1.0)
    return sock


def _connections(sock) -> int:

    seen = 0
    while True:
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            return seen
        conn.close()
        seen += 1


def test_a_plan_cannot_choose_where_privaudit_connects(tmp_path, capsys, monkeypatch):
    """A plan (attack or audit) naming tcp://127.0.0.1:PORT is refused in one line; the local
    listener sees no connection. local:N workers stay allowed in a plan."""
    from privaudit.plan import load_plan

    sock = _listener()
    port = sock.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    try:
        attack_plan = _with(_plan_text(), "run", f'scheduler = "tcp://127.0.0.1:{port}"')
        (tmp_path / "attack.toml").write_text(attack_plan)
        audit_plan = f'[audit]\nprotocol = "fedmvmf"\ndata = "synthetic"\nseeds = 1\nscheduler = "127.0.0.1:{port}"\n'
        (tmp_path / "audit.toml").write_text(audit_plan)
        for argv in (["attack", "--config", "attack.toml"], ["audit", "--config", "audit.toml"]):
            rc, _, err = _main(argv, capsys)
            _assert_refused({"rc": rc, "err": err}, "a plan file cannot choose where privaudit connects")
        assert _connections(sock) == 0
    finally:
        sock.close()
    (tmp_path / "local.toml").write_text(_with(_plan_text(), "run", 'scheduler = "local:2"'))
    assert load_plan(tmp_path / "local.toml").scheduler == "local:2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attack.toml", "audit.toml", "local.toml"]


def test_app_pyproject_nesting_is_capped(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text("[tool.flwr.app]\nx = " + "[" * 1000 + "]" * 1000 + "\n")
    rc, _, err = _main(["record", "--flower", str(tmp_path), "-o", str(tmp_path / "run.ptx")], capsys)
    _assert_refused({"rc": rc, "err": err}, "nested 1000 levels deep")
    assert not (tmp_path / "run.ptx").exists()


# ------------------------------------------------------------------ round two: --force and safe writes


def test_force_is_needed_with_or_without_out(tmp_path, capsys, monkeypatch, base_ptx):
    """attack --config, audit --config, audit --transcript, record and run: an existing output
    (the default folder too) is refused without --force, before any work."""
    from privaudit.plan import load_plan
    from privaudit.reports.render import default_out_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.toml").write_text(_plan_text())
    plan = load_plan("plan.toml")
    sweep = plan.sweep.label if plan.sweep else None
    folders = [
        (["attack", "--config", "plan.toml"], default_out_dir({"protocol": "fedmvmf", "sweep": sweep})),
        (["audit", "--config", "audit.toml"], Path("privaudit-report/fedmvmf-audit")),
        (["audit", "--transcript", str(base_ptx)], Path(f"privaudit-report/{Path(base_ptx).stem}-audit")),
    ]
    (tmp_path / "audit.toml").write_text('[audit]\nprotocol = "fedmvmf"\ndata = "synthetic"\nseeds = 1\n')
    for argv, folder in folders:
        folder.mkdir(parents=True)
        (folder / "keep.txt").write_text("mine")
        rc, _, err = _main(argv, capsys)
        _assert_refused({"rc": rc, "err": err}, "already exists; pass --force")
        assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]
    (tmp_path / "old.ptx").write_text("mine")
    for argv in (
        ["record", "--flower", str(ROOT / "examples" / "flower-fedavg-mf"), "-o", "old.ptx"],
        ["run", "--protocol", "fedmvmf", "-o", "old.ptx"],
    ):
        rc, _, err = _main(argv, capsys)
        _assert_refused({"rc": rc, "err": err}, "old.ptx already exists; pass --force")
    assert (tmp_path / "old.ptx").read_text() == "mine"


def test_report_rerender_needs_force(tmp_path, capsys, report_dir):
    """report DIR replaces rendered files only with --force; without it nothing changes."""
    rep = _copy_report(report_dir, tmp_path / "rep")
    (rep / "report.md").write_text("mine")
    rc, _, err = _main(["report", str(rep)], capsys)
    _assert_refused({"rc": rc, "err": err}, "re-render with --force")
    assert (rep / "report.md").read_text() == "mine"
    rc, _, err = _main(["report", str(rep), "--force"], capsys)
    assert rc == 0, err
    assert (rep / "report.md").read_text() != "mine"


def test_only_regular_files_are_replaced(tmp_path, capsys, monkeypatch):
    """A device node or a symbolic link as -o is refused even with --force."""
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "link.ptx").symlink_to(victim)
    app = str(ROOT / "examples" / "flower-fedavg-mf")
    for target, expect in (("/dev/null", "not a regular file"), ("link.ptx", "symbolic link")):
        for argv in (
            ["record", "--flower", app, "-o", target, "--force"],
            ["run", "--protocol", "fedmvmf", "-o", target, "--force"],
        ):
            rc, _, err = _main(argv, capsys)
            _assert_refused({"rc": rc, "err": err}, expect)
    assert victim.read_text() == "mine" and Path("/dev/null").is_char_device()


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, base_ptx) -> Path:
    """A real report folder (attack --transcript on the base transcript)."""
    folder = tmp_path_factory.mktemp("report")
    res = _run(["attack", "--transcript", str(base_ptx), "--out", "rep", "--quiet"], folder)
    assert res["rc"] == 0, res["err"]
    return folder / "rep"


def _copy_report(report_dir: Path, dest: Path) -> Path:
    import shutil

    return Path(shutil.copytree(report_dir, dest))


def test_planted_symlinks_are_never_written_through(tmp_path, capsys, monkeypatch, report_dir, base_ptx):
    """Symlinks planted where report, audit and reconstruction files go (and under the old
    predictable temporary names) are refused; their targets stay untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    rep = _copy_report(report_dir, tmp_path / "rep")
    for pid in range(os.getpid(), os.getpid() + 200):  # the former .NAME.<pid>.tmp.SUFFIX names
        (rep / f".report.md.{pid}.tmp.md").symlink_to(victim)
    rc, out, err = _main(["report", str(rep), "--force"], capsys)
    assert rc == 0, err
    assert victim.read_text() == "mine"
    (rep / "results.csv").unlink()
    (rep / "results.csv").symlink_to(victim)
    rc, out, err = _main(["report", str(rep), "--force"], capsys)
    _assert_refused({"rc": rc, "err": err}, "is a symbolic link")
    aud = tmp_path / "aud"
    aud.mkdir()
    (aud / "audit.json").symlink_to(victim)
    rc, _, err = _main(["audit", "--transcript", str(base_ptx), "-o", str(aud), "--force"], capsys)
    _assert_refused({"rc": rc, "err": err}, "is a symbolic link")
    bare = tr.load(base_ptx).without_private().save(tmp_path / "bare.ptx")
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "reconstruction.json").symlink_to(victim)
    rc, _, err = _main(["attack", "--transcript", str(bare), "-o", str(rec), "--force"], capsys)
    _assert_refused({"rc": rc, "err": err}, "is a symbolic link")
    (tmp_path / "linked").symlink_to(tmp_path / "rec", target_is_directory=True)
    rc, _, err = _main(["audit", "--transcript", str(base_ptx), "-o", str(tmp_path / "linked"), "--force"], capsys)
    _assert_refused({"rc": rc, "err": err}, "is a symbolic link")
    assert victim.read_text() == "mine"
    assert not [p for p in tmp_path.rglob("*.tmp*") if not p.is_symlink()], "a temporary file was left behind"


# ------------------------------------------------------------------ round two: report inputs


def test_csv_formula_guard_covers_tab_and_cr():
    import csv as csv_module

    from privaudit.reports.render import csv_text

    cells = ["=1+1", "+1", "-1", "@SUM(A1)", "\t=2+2", "\r=2+2", "plain"]
    text = csv_text({"points": [{"value": v, "seed": 0, "reason": v} for v in cells]})
    rows = list(csv_module.DictReader(io.StringIO(text, newline="")))
    assert [r["reason"] for r in rows] == ["'" + c.replace("\r", "\\r") for c in cells[:-1]] + ["plain"]


def test_terminal_never_sees_control_characters(tmp_path, capsys, report_dir):
    """Metric and defense names with ESC/CR from a results.json print as visible escapes."""
    rep = _copy_report(report_dir, tmp_path / "rep")
    data = json.loads((rep / "results.json").read_text())
    for p in data["points"]:
        p["attack_metrics"]["\x1b[2K\rfake"] = 0.5
    data["defenses"] = [{"name": "x\x1b]0;title\x07"}]
    (rep / "results.json").write_text(json.dumps(data))
    rc, out, err = _main(["report", str(rep), "--force"], capsys)
    assert rc == 0, err
    assert "\x1b" not in out + err and "\r" not in out + err and "\x07" not in out + err


def _results_head() -> str:
    return '{"protocol":"x","attack":"y","sweep":null,'


def test_report_inputs_are_bounded(tmp_path):
    """20,000 metric names, 5*10^6 points and a 401-digit number: refused in one line, fast."""
    cases = {
        "metrics": (
            _results_head() + '"points":[{"attack_metrics":{' + ",".join(f'"m{i}":1' for i in range(20_000)) + "}}]}",
            "more than the limit of 500",
        ),
        "points": (_results_head() + '"points":[' + ",".join(["{}"] * 5_000_000) + "]}", "more than the limit"),
        "digits": (_results_head() + '"points":[{"value":' + "9" * 401 + "}]}", "more than 40 digits"),
    }
    jobs = {}
    for name, (text, expect) in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "results.json").write_text(text)
        jobs[name] = (d, expect)
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(_run, ["report", "."], d) for name, (d, _) in jobs.items()}
    for name, (d, expect) in jobs.items():
        res = futures[name].result()
        _assert_refused(res, expect)
        assert res["rss"] < RSS_LIMIT and sorted(p.name for p in d.iterdir()) == ["results.json"]


def test_inspect_refuses_non_regular_files(tmp_path):
    fifo = tmp_path / "pipe.ptx"
    os.mkfifo(fifo)
    for target in ("/dev/zero", str(fifo)):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run(
            [sys.executable, "-m", "privaudit", "inspect", target],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
        _assert_refused({"rc": proc.returncode, "err": proc.stderr}, "not a regular file")


# ------------------------------------------------------------------ round two: keys


def test_paillier_short_keys(tmp_path, capsys, monkeypatch):
    """1024 bits refused without insecure_test_key; 512 with it: a warning on the console and
    in the report header (Markdown and HTML)."""
    from privaudit.defenses.paillier import MIN_KEY_LENGTH
    from privaudit.reports.render import MIN_KEY_BITS

    assert MIN_KEY_BITS == MIN_KEY_LENGTH == 2048
    monkeypatch.chdir(tmp_path)
    rc, _, err = _main(["attack", "--protocol", "privmvmf", "--defense", "paillier:key_length=1024"], capsys)
    _assert_refused({"rc": rc, "err": err}, "key_length must be >= 2048")
    argv = ["attack", "--protocol", "privmvmf", "--defense", "paillier:key_length=512,insecure_test_key=true"]
    argv += ["--users", "6", "--set", "epochs=1", "--seeds", "1", "--jobs", "1", "--quiet", "-o", "rep"]
    rc, out, err = _main(argv, capsys)
    assert rc == 0, err
    assert "warning: paillier key_length = 512 bits is below 2048" in err
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.splitlines()[2].startswith("> **Warning.** paillier ran with a 512-bit key")
    assert "<strong>Warning.</strong> paillier ran with a 512-bit key" in (tmp_path / "rep" / "report.html").read_text()


# ------------------------------------------------------------------ round two: signals on record


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _processes() -> list[tuple[int, int, int, str]]:
    """(pid, ppid, pgid, args) of every process (ps)."""
    ps = ["ps", "-ww", "-eo", "pid=,ppid=,pgid=,args="]  # -ww: full command lines whatever COLUMNS says
    out = subprocess.run(ps, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        pid, ppid, pgid, *args = line.split(None, 3)
        rows.append((int(pid), int(ppid), int(pgid), args[0] if args else ""))
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_record_stops_and_leaves_no_ray_process(tmp_path, sig):
    """Ctrl-C (SIGINT) stops `privaudit record` in under 10 s with exit code 130; after SIGTERM or
    SIGKILL of the parent no process of the recording's group (raylet, GCS, agents, workers)
    is left, and Ray's session folder (in a private temporary folder) is removed."""
    import signal
    import time

    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    tmp_root = Path(tempfile.mkdtemp(prefix="pt", dir="/tmp"))  # short: Ray's socket paths
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_root))
    app = str(ROOT / "examples" / "flower-fedavg-mf")
    argv = [sys.executable, "-m", "privaudit", "record", "--flower", app, "--clients", "3", "--rounds", "100000"]
    proc = subprocess.Popen([*argv, "-o", "run.ptx"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 150
        group = []
        while time.monotonic() < deadline:
            rows = _processes()
            child = next((pid for pid, ppid, _, _ in rows if ppid == proc.pid), None)
            group = [pid for pid, _, pgid, _ in rows if child is not None and pgid == child]
            if any(str(tmp_root) in args and "raylet" in args for _, _, _, args in rows):
                break
            time.sleep(0.5)
        else:
            pytest.fail("Ray did not start")
        time.sleep(2)
        group = [pid for pid, _, pgid, _ in _processes() if pgid == child]
        assert len(group) >= 4, group  # the child, GCS, raylet, agents/workers
        t0 = time.monotonic()
        os.kill(proc.pid, getattr(signal, sig))
        if sig == "SIGKILL":
            proc.wait(timeout=10)
        else:
            _, err = proc.communicate(timeout=10)
            assert time.monotonic() - t0 < 10
            assert proc.returncode == (130 if sig == "SIGINT" else 128 + signal.SIGTERM)
            if sig == "SIGINT":
                assert err.splitlines()[-1] == "privaudit: interrupted", err[-500:]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in group):
            time.sleep(0.25)
        assert not [p for p in group if _alive(p)], "processes of the recording survived"
        while time.monotonic() < deadline and any(tmp_root.iterdir()):
            time.sleep(0.25)
        assert list(tmp_root.iterdir()) == [], "the private temporary folder was left behind"
        assert not (tmp_path / "run.ptx").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        import shutil

        shutil.rmtree(tmp_root, ignore_errors=True)


def test_record_help_says_the_app_code_runs(capsys):
    from privaudit.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["record", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0
    assert "recording executes the app's own Python code" in out and "record only apps you trust" in out
    assert "--force" in out
    doc = (ROOT / "docs" / "flower.md").read_text()
    assert "Warning: recording executes the app's own code." in doc


# ------------------------------------------------------------------ cigate: privaudit compare


def _compare_refuses(capsys, old, new, fragment, *extra):
    from privaudit.cli import main

    try:
        code = main(["compare", str(old), str(new), *extra])
    except SystemExit as exc:  # argparse usage errors exit directly
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and fragment in err, err
    return err


@pytest.fixture
def valid_audit(tmp_path):
    """A small audit.json that validates (the same shape as tests/test_gate.py's)."""
    from privaudit.report_schema import stamped

    doc = {
        "protocol": "p",
        "protocol_config": {},
        "seeds": [0],
        "attacks": [{"name": "a", "primary_metric": "m", "applies": True}],
        "defenses": [],
        "dataset": {},
        "runs": [],
        "matrix": [
            {
                "attack": "a",
                "defense": None,
                "value": None,
                "metric": "m",
                "verdict": "leaks",
                "advantage": 0.3,
                "dp_violation": False,
            }
        ],  # fmt: skip
        "verdicts": [],
    }
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(stamped(doc, "audit")))
    return path


def test_compare_refuses_hostile_files_in_one_line(tmp_path, capsys, valid_audit):
    ok = valid_audit
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _compare_refuses(capsys, deep, ok, "nested 100000 levels deep, more than the limit of 64")
    deep_obj = tmp_path / "deep_obj.json"
    deep_obj.write_text('{"matrix": ' + '{"a": ' * 80 + "1" + "}" * 80 + "}")
    _compare_refuses(capsys, ok, deep_obj, "more than the limit of 64")
    for name, text, fragment in (
        ("list.json", "[1, 2, 3]", "expected a JSON object"),
        ("string.json", '"audit"', "expected a JSON object"),
        ("broken.json", '{"matrix": [', "not valid JSON"),
        ("binary.json", "\udcff", "not UTF-8"),
        ("other.json", '{"hello": 1}', "neither an audit.json"),
        ("nan.json", '{"matrix": [], "schema_version": NaN}', "schema version"),
    ):
        path = tmp_path / name
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        _compare_refuses(capsys, ok, path, fragment)
    doc = json.loads(ok.read_text())
    for version in (2, "1", True, None):
        bad = dict(doc, schema_version=version)
        if version is None:
            del bad["schema_version"]
        path = tmp_path / f"v{version}.json"
        path.write_text(json.dumps(bad))
        fragment = "has no schema_version" if version is None else "this privaudit reads version 1"
        _compare_refuses(capsys, path, ok, fragment)
    wrong = dict(doc, matrix=[{"attack": "a", "verdict": 3}])  # validates nowhere: one line naming where
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    _compare_refuses(capsys, ok, tmp_path / "wrong.json", "not a valid audit.json (schema 1) at /matrix/0")
    _compare_refuses(capsys, ok, tmp_path / "missing.json", "missing.json: no such file")
    (tmp_path / "folder").mkdir()
    _compare_refuses(capsys, tmp_path / "folder", ok, "is a folder")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_compare_never_blocks_on_a_fifo_or_reads_a_huge_file(tmp_path, capsys, valid_audit):
    fifo = tmp_path / "audit.json"
    os.mkfifo(fifo)  # nobody writes: a blocking read would hang the test
    _compare_refuses(capsys, valid_audit, fifo, "not a regular file")
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:  # sparse: 300 MiB on paper, nothing on disk
        fh.truncate(300 * 1024**2)
    _compare_refuses(capsys, huge, valid_audit, "more than the limit of 268435456")
    padded = tmp_path / "padded.json"
    padded.write_text(valid_audit.read_text() + " " * 5000)
    _compare_refuses(capsys, padded, valid_audit, "more than the limit of 4096", "--max-bytes", "4K")
    _compare_refuses(capsys, valid_audit, valid_audit, "--max-bytes", "--max-bytes", "-1")


# ------------------------------------------------------------------ branch looks: typos, data errors, paths


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["attack", "--protocol", "fedmvmf", "--set", "epoch=3"], "unknown parameter 'epoch'; did you mean `epochs`?"),
        (["attack", "--protocol", "fedmvfm"], "unknown protocol 'fedmvfm'; did you mean `fedmvmf`?"),
        (["attack", "--protocol", "fedmvmf", "--noise", "laplce"], "unknown defense 'laplce'; did you mean `laplace`?"),
        (
            ["attack", "--protocol", "fedmvmf", "--set", "xyzzy=3"],
            "unknown parameter 'xyzzy' (known: K, ",
        ),  # none close
    ],
)
def test_typos_name_the_closest_valid_name(argv, expect, capsys, tmp_path):
    rc, out, err = _main([*argv, "--out", str(tmp_path / "r")], capsys)
    _assert_refused({"rc": rc, "err": err}, expect)
    assert out == "" and not (tmp_path / "r").exists()


def test_did_you_mean_is_within_two_edits():
    from privaudit.errors import did_you_mean

    assert did_you_mean("epoch", ["epochs", "eta", "K"]) == "; did you mean `epochs`?"
    assert did_you_mean("EPOCSH", ["epochs"]) == "; did you mean `epochs`?"  # a swap: two edits
    assert did_you_mean("epxxxs", ["epochs"]) == ""  # three edits
    assert did_you_mean("lamda", ["lam", "lambda", "alpha"]) == "; did you mean `lambda` or `lam`?"
    assert did_you_mean("b", ["a"]) == "" and did_you_mean("k", ["K", "lam"]) == "; did you mean `K`?"  # short names


def test_a_data_error_comes_before_any_banner(tmp_path, capsys):
    bad = tmp_path / "r.csv"
    bad.write_text("user,item,rating\n1,2,4\n1,3,nine\n")
    rc, out, err = _main(["attack", "--protocol", "fedmvmf", "--data", str(bad), "--out", str(tmp_path / "r")], capsys)
    _assert_refused({"rc": rc, "err": err}, "r.csv")
    assert out == ""  # no "fedmvmf defaults:" line before the error
    rc, out, err = _main(["attack", "--protocol", "fedmvmf", "--users", "5000", "--out", str(tmp_path / "s")], capsys)
    _assert_refused({"rc": rc, "err": err}, "5000")
    assert out == ""


@pytest.mark.usefixtures("dummy_registry")
def test_plan_records_the_data_path_as_given(tmp_path, capsys, monkeypatch):
    from tests.dummies import write_csv

    monkeypatch.chdir(tmp_path)
    write_csv(tmp_path / "ratings.csv", 24)
    argv = ["attack", "--protocol", "dummy-proto", "--data", "ratings.csv", "--seeds", "1", "--jobs", "1"]
    rc, _, err = _main([*argv, "--out", "aud"], capsys)
    assert rc == 0, err
    assert '"data" = "ratings.csv"' in (tmp_path / "aud" / "plan.toml").read_text()
    assert str(tmp_path) not in (tmp_path / "aud" / "plan.toml").read_text()


def test_transcript_audit_folder_is_named_after_the_transcript(tmp_path, capsys, monkeypatch, base_ptx):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _main(["audit", "--transcript", str(base_ptx)], capsys)
    assert rc == 0, err
    assert (tmp_path / "privaudit-report" / f"{base_ptx.stem}-audit" / "audit.json").is_file()
    assert f"privaudit-report/{base_ptx.stem}-audit/" in out


# ---------------------------------------------------------------- flowerdp: DP claims, canaries


@pytest.mark.parametrize("value", ["-2", "100001"])
def test_record_canaries_out_of_range_is_one_line_before_any_run(tmp_path, capsys, value):
    app = ROOT / "tests" / "flower_apps" / "localdp_mf"
    code, out, err = _main(["record", "--flower", str(app), "--canaries", value, "-o", str(tmp_path / "r.ptx")], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--canaries must be in [0, 100000]" in err and not (tmp_path / "r.ptx").exists()


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "flower-local-dp", "clipping_norm": "1", "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5},
        {"name": "flower-local-dp", "clipping_norm": 1.0, "sensitivity": 1.0, "epsilon": 0.0, "delta": 1e-5},
        {"name": "flower-local-dp", "clipping_norm": 1.0, "sensitivity": float("nan"), "epsilon": 1.0, "delta": 1e-5},
        {"name": "flower-local-dp", "clipping_norm": -1.0, "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5},
        {"name": "flower-local-dp", "clipping_norm": 1.0, "sensitivity": 1.0, "epsilon": 1.0, "delta": 2.0},
        {"name": "flower-dp-adaptive-clipping", "noise_multiplier": True, "clipped_count_stddev": 1.0, "rounds": 3},
        {"name": "flower-dp-server-fixed-clipping", "noise_multiplier": 1.0, "clipping_norm": 1.0},
    ],
)
def test_dp_claims_skip_malformed_recorded_entries(entry):
    from privaudit.integrations._flower_dp import check_claims

    assert check_claims([entry, None, "text"]) == []


@pytest.mark.parametrize(
    "canaries, bits",
    [
        ({"party": "client:0", "size": 40}, np.ones(10, dtype=np.int64)),  # no seed
        ({"party": "client:0", "seed": 0, "size": 40}, np.full(10, 3, dtype=np.int64)),  # bits not +-1
        ({"party": "client:0", "seed": 0, "size": 10}, np.ones(10, dtype=np.int64)),  # more bits than size / 2
        ({"party": "client:0", "seed": 0, "size": 40}, np.ones(10)),  # float bits
        ({"party": 3, "seed": 0, "size": 40}, np.ones(10, dtype=np.int64)),  # party not a string
    ],
)
def test_canary_check_ignores_a_hand_edited_canary_config(canaries, bits):
    from privaudit.integrations.flower_canary import canary_check
    from privaudit.transcript import Transcript

    t = Transcript("flower", config={"canaries": canaries, "n_items": 10}, parties=["server", "client:0"])
    t.add(0, "client:0", "client:0", "canary_bits", {"bits": bits})
    assert canary_check(t) is None


# ======================================================================================
# frontdoor (issue 39): recording stays on loopback, budgets per input, mapped data, worker
# caps, app hooks


_NETLOG_HOOK = """
import os, sys
_LOG = os.environ.get("PRIVAUDIT_TEST_NETLOG")
if _LOG:
    def _hook(event, args, _log=_LOG):
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            addr = args[1] if len(args) > 1 else None
        elif event == "socket.getaddrinfo":
            addr = (args[0], args[1])
        else:
            return
        try:
            with open(_log, "a") as fh:
                fh.write(f"{event}\\t{addr!r}\\n")
        except Exception:
            pass
    sys.addaudithook(_hook)
"""


def _loopback(host) -> bool:
    import ipaddress

    if host in (None, "", "localhost") or isinstance(host, bytes):
        return host not in (None, "")
    try:
        ip = ipaddress.ip_address(str(host).strip("[]"))
    except ValueError:
        return False
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def _socket_events(log: Path) -> list[tuple[str, object]]:
    import ast

    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        event, _, text = line.partition("\t")
        try:
            out.append((event, ast.literal_eval(text)))
        except (ValueError, SyntaxError):
            out.append((event, text))
    return out


def _is_local(event: str, addr) -> bool:
    if isinstance(addr, (str, bytes)):  # an AF_UNIX path
        return True
    if not isinstance(addr, tuple) or not addr:
        return False
    return _loopback(addr[0])


def _poll_sockets(root_pid: int, stop, seen: list) -> None:
    """Every 0.1 s: the TCP/UDP sockets of ``root_pid`` and its descendants (Ray's C++ GCS and
    raylet included, which no Python audit hook sees)."""
    import psutil

    while not stop.is_set():
        try:
            procs = [psutil.Process(root_pid), *psutil.Process(root_pid).children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                for c in p.net_connections(kind="inet"):
                    seen.append((p.pid, c.status, c.laddr, c.raddr))
            except psutil.Error:
                continue
        stop.wait(0.1)


def _network_recording(tmp_path: Path) -> dict:
    """`privaudit record --flower examples/flower-plain-mf` with an audit hook in every Python
    process of the recording (sitecustomize on PYTHONPATH) and psutil polling its descendants."""
    import threading

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_NETLOG_HOOK)
    log = tmp_path / "net.log"
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), str(ROOT)]))
    env.update(PRIVAUDIT_TEST_NETLOG=str(log), HOME=str(home), TMPDIR=str(tmp))
    env.pop("FLWR_HOME", None)
    argv = [sys.executable, "-m", "privaudit", "record", "--flower", str(ROOT / "examples" / "flower-plain-mf")]
    argv += ["--clients", "3", "--rounds", "1", "-o", str(tmp_path / "run.ptx")]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stop, seen = threading.Event(), []
    poller = threading.Thread(target=_poll_sockets, args=(proc.pid, stop, seen))
    poller.start()
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        stop.set()
        poller.join()
    return {
        "rc": proc.returncode,
        "err": err.decode(errors="replace"),
        "written": (tmp_path / "run.ptx").is_file(),
        "events": _socket_events(log),
        "seen": seen,
        "flwr_home": (home / ".flwr").exists(),
        "tmp": sorted(p.name for p in tmp.iterdir()),
    }


def test_record_listens_on_loopback_only_and_reaches_nothing(frontdoor_records):
    """`privaudit record --flower examples/flower-plain-mf`: every socket any process of the
    recording binds, connects or lists (audit hook in every Python process, psutil on every
    descendant, Ray's GCS and raylet included) is on a loopback address; no name but localhost
    is looked up; nothing is left in ~/.flwr or $TMPDIR."""
    res = frontdoor_records["network"]
    assert res["rc"] == 0 and res["written"], res["err"][-2000:]
    events = res["events"]
    assert any(e == "socket.bind" for e, _ in events), "the audit hook saw nothing (not installed?)"
    outside = [(e, a) for e, a in events if not _is_local(e, a)]
    assert not outside, outside[:10]
    seen = res["seen"]
    assert seen, "no socket of the recording was seen"
    listeners = [s for s in seen if s[1] == "LISTEN" and not _loopback(s[2].ip)]
    assert not listeners, listeners[:5]
    remote = [s for s in seen if s[3] and not _loopback(s[3].ip)]
    assert not remote, remote[:5]
    assert not res["flwr_home"] and res["tmp"] == []


# ------------------------------------------------------------------ frontdoor: budgets per input


def _patch_member_sizes(data: bytes, name: str, csize: int | None = None, usize: int | None = None) -> bytes:
    """``data`` (a ZIP) with the sizes ``name`` declares in its local and central headers replaced."""
    buf = bytearray(data)
    raw = name.encode()
    for sig, csize_at, name_len_at, name_at in ((b"PK\x03\x04", 18, 26, 30), (b"PK\x01\x02", 20, 28, 46)):
        pos = buf.find(sig)
        while pos >= 0:
            n = struct.unpack_from("<H", buf, pos + name_len_at)[0]
            if bytes(buf[pos + name_at : pos + name_at + n]) == raw:
                if csize is not None:
                    struct.pack_into("<I", buf, pos + csize_at, csize)
                if usize is not None:
                    struct.pack_into("<I", buf, pos + csize_at + 4, usize)
            pos = buf.find(sig, pos + 4)
    return bytes(buf)


def _npy_with_rows(npy: bytes, rows: int) -> bytes:
    """A .npy member's bytes with the header's row count replaced (header length kept)."""
    head_len = 10 + struct.unpack_from("<H", npy, 8)[0]
    text = npy[10:head_len].decode("latin1")
    start, end = text.index("'shape': (") + len("'shape': ("), text.index(")", text.index("'shape': ("))
    new = (text[:start] + f"{rows}, " + text[start:end].split(",", 1)[1].strip() + text[end:]).rstrip("\n ")
    new = new + " " * (len(text) - len(new) - 1) + "\n"
    assert len(new) == len(text)
    return npy[:10] + new.encode("latin1") + npy[head_len:]


def _stored_rows(tmp: Path, rows: int) -> tuple[bytes, str, int]:
    """The valid version-2 file with its stored column (2) declaring ``rows`` rows of 4 floats
    (manifest, offsets and the .npy header agree); its data is still 300 rows."""
    m, members = v2_parts(tmp)
    col = m["columns"][2]
    col["rows"] = rows
    members[col["offsets"]] = (npy_bytes(np.array([0, rows], dtype=np.int64)), zipfile.ZIP_DEFLATED)
    npy = members[col["data"]][0]
    patched = _npy_with_rows(npy, rows)
    members[col["data"]] = (patched, zipfile.ZIP_STORED)
    header = len(patched) - 300 * 32
    return v2_archive(m, members), col["data"], header


def _declared_39gb(tmp: Path) -> bytes:
    rows = 3_900_000_000 // 32
    data, name, header = _stored_rows(tmp, rows)
    return _patch_member_sizes(data, name, usize=header + rows * 32)


def _runs_into_next(tmp: Path) -> bytes:
    data, name, header = _stored_rows(tmp, 302)  # 64 bytes more than the member holds
    return _patch_member_sizes(data, name, csize=header + 302 * 32, usize=header + 302 * 32)


def _flipped_bit(tmp: Path) -> bytes:
    m, members = v2_parts(tmp)
    name = m["columns"][2]["data"]
    npy = members[name][0]
    members[name] = (np.arange(1200.0).reshape(300, 4).tobytes(), 0)  # distinctive bytes to find
    members[name] = (npy[: len(npy) - 9600] + members[name][0], zipfile.ZIP_STORED)
    data = bytearray(v2_archive(m, members))
    at = bytes(data).find(np.float64(617.0).tobytes())
    data[at + 3] ^= 0x10
    return bytes(data)


def _message_table(rows: int) -> bytes:
    """A version-2 file whose message table declares ``rows`` rows (deflated zeros: ~5 MB)."""
    head = npy_header("'<i8'", f"({rows}, 5)")
    chunk = bytes(40 * 1024)
    times = rows // 1024
    table = {"name": "messages.npy", "data": repeated_deflate(head, chunk, times), "usize": len(head) + rows * 40}
    m = {
        "format": "privaudit-transcript",
        "version": 2,
        "protocol": "fedmvmf",
        "parties": ["server"],
        "names": ["server", "state"],
        "messages": rows,
        "table": "messages.npy",
        "columns": [],
        "meta": [],
    }
    return raw_zip([entry("manifest.json", json.dumps(m).encode()), table])


def _sharded_folder(root: Path, manifest: dict, shards: dict[str, bytes]) -> Path:
    root.mkdir()
    server = tr.Transcript("fedmvmf", {"K": 2}, 0, {"name": "synthetic"}, ["server"])
    server.save(root / "server.ptx")
    (root / "manifest.json").write_text(json.dumps(manifest))
    for name, data in shards.items():
        (root / name).write_bytes(data)
    return root


def _sharded_manifest(clients: int, block_size: int, rounds: list[int], private: bool = False) -> dict:
    blocks = []
    for b in range(-(-clients // block_size)):
        lo, hi = b * block_size, min((b + 1) * block_size, clients)
        names = [f"c{b:06d}-r{r:06d}.ptx" for r in rounds]
        blocks.append({"lo": lo, "hi": hi, "private": f"c{b:06d}-private.ptx" if private else None, "rounds": names})
    return {
        "format": "privaudit-sharded-run",
        "version": 1,
        "protocol": "fedmvmf",
        "clients": clients,
        "block_size": block_size,
        "rounds": rounds,
        "blocks": blocks,
        "server": "server.ptx",
    }


def _bomb_shard(mib: int) -> bytes:
    """A shard whose one member declares ``mib`` MiB (deflated zeros, ~1 KB per MiB on disk)."""
    n = mib * 2**20 // 8
    head = npy_header("'<f8'", f"({n},)")
    member = {"name": "arrays/0.npy", "data": repeated_deflate(head, bytes(1 << 20), mib), "usize": len(head) + n * 8}
    return raw_zip([entry("manifest.json", manifest({"arrays/0.npy": {"dtype": "<f8", "shape": [n]}})), member])


def _int_attributes(folder: Path, names=7) -> Path:
    t = recorded_transcript()
    t.config["attribute_names"] = names
    return t.save(folder / "bad.ptx")


FRONTDOOR_INPUT_CASES = {  # name: (build(tmp) -> (argv, folder), expected text)
    "sharded: 1e9 clients in a 200-byte manifest": (
        lambda d: (
            ["attack", "--transcript", "run"],
            _sharded_folder(d / "run", _sharded_manifest(10**9, 10**9, []), {}),
        ),
        "names 1000000000 clients but its shards declare 0 bytes",
    ),
    "sharded: four shards of 480 MiB": (
        lambda d: (
            ["attack", "--transcript", "run"],
            _sharded_folder(
                d / "run", _sharded_manifest(4, 1, [0]), {f"c{b:06d}-r000000.ptx": _bomb_shard(480) for b in range(4)}
            ),
        ),
        "client parties would take more than 536870912 bytes",
    ),
    "v2: message table of 2.5M rows": (
        lambda d: (["attack", "--transcript", "bad.ptx"], (d / "bad.ptx").write_bytes(_message_table(2_500_000))),
        "2500000 messages, 0 payloads and 0 columns would take about",
    ),
    "v2: 3.9 GB stored column, --max-bytes 4G": (
        lambda d: (["inspect", "bad.ptx", "--max-bytes", "4G"], (d / "bad.ptx").write_bytes(_declared_39gb(d))),
        "stored, but declares",
    ),
    "v2: stored column runs 64 bytes into the next member": (
        lambda d: (["attack", "--transcript", "bad.ptx"], (d / "bad.ptx").write_bytes(_runs_into_next(d))),
        "runs into the next member",
    ),
    "v2: stored column with a flipped bit": (
        lambda d: (["attack", "--transcript", "bad.ptx"], (d / "bad.ptx").write_bytes(_flipped_bit(d))),
        "Bad CRC-32",
    ),
    "recorded: attribute_names an integer (audit)": (
        lambda d: (["audit", "--transcript", "bad.ptx"], _int_attributes(d)),
        "config attribute_names must be a list of at most 10000 strings",
    ),
    "recorded: attribute_names an integer (attack)": (
        lambda d: (["attack", "--transcript", "bad.ptx"], _int_attributes(d)),
        "config attribute_names must be a list of at most 10000 strings",
    ),
    "recorded: attribute_names integers (audit)": (
        lambda d: (["audit", "--transcript", "bad.ptx"], _int_attributes(d, [0, 1, 2])),
        "config attribute_names must be a list of at most 10000 strings",
    ),
    "attack --scheduler local:100000": (
        lambda d: (["attack", "--protocol", "fedmvmf", "--scheduler", "local:100000"], None),
        "local:N needs 1 <= N <= 256, got 100000",
    ),
    "audit --scheduler local:1000": (
        lambda d: (["audit", "--protocol", "fedmvmf", "--scheduler", "local:1000"], None),
        "local:N needs 1 <= N <= 256, got 1000",
    ),
    "plan scheduler local:1000": (
        lambda d: (
            ["attack", "--config", "plan.toml"],
            (d / "plan.toml").write_text('[run]\nprotocol = "fedmvmf"\ndata = "synthetic"\nscheduler = "local:1000"\n'),
        ),
        "scheduler: local:N needs 1 <= N <= 256, got 1000",
    ),
}


@pytest.fixture(scope="module")
def frontdoor_input_outcomes(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("frontdoor-inputs")
    jobs = {}
    for name, (build, _) in FRONTDOOR_INPUT_CASES.items():
        d = root / _folder(name)
        d.mkdir()
        argv, _ = build(d)
        jobs[name] = (argv, d, sorted(p.name for p in d.iterdir()))

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(_run, argv, d) for name, (argv, d, _) in jobs.items()}
    out = {}
    for name, (_, d, before) in jobs.items():
        res = futures[name].result()
        res.update(before=before, after=sorted(p.name for p in d.iterdir()))
        out[name] = res
    return out


@pytest.mark.parametrize("name", list(FRONTDOOR_INPUT_CASES))
def test_frontdoor_inputs_are_refused_in_one_line(frontdoor_input_outcomes, name):
    res = frontdoor_input_outcomes[name]
    _assert_refused(res, FRONTDOOR_INPUT_CASES[name][1])
    assert res["rss"] < RSS_LIMIT, res["rss"]
    assert res["after"] == res["before"], "the refused command wrote a file"


# ------------------------------------------------------------------ frontdoor: app hooks

_HOSTILE_HOOKS = """
import os
import sys

import numpy as np


def text(run_config):
    return "not an object"


def huge(run_config):
    return {"n_items": 10**12}


def nan(run_config):
    return {"n_items": 5, "lr": float("nan")}


def upside_down(run_config):
    return {"n_items": 5, "rating_min": 5.0, "rating_max": 1.0}


def text_private(context):
    return "not arrays"


def wide_private(context):
    return {"items": np.arange(10**6, 10**6 + 3), "ratings": np.ones(3)}


def die(run_config):
    sys.stdout.write("\\x1b[31mboom\\x1b[0m\\n")
    sys.stdout.flush()
    os._exit(3)
"""

HOOK_CASES = {  # name: (private-data, public-info, expected text): `privaudit record` on the app
    "public-info returns a string": (None, "plain_mf.hostile:text", "returned a str, not an object"),
    "private-data os:system": ("os:system", None, "'os:system' is a builtin, not a Python function"),
    "private-data returns a string": ("plain_mf.hostile:text_private", None, "returned a str, not a dict of arrays"),
    "the child dies printing escapes": (
        None,
        "plain_mf.hostile:die",
        "the recording failed (exit code 3): \\x1b[31mboom",
    ),
}


def _hostile_app(folder: Path, private: str | None, public: str | None) -> Path:
    import shutil

    app = folder / "app"
    shutil.copytree(ROOT / "examples" / "flower-plain-mf", app, ignore=shutil.ignore_patterns("__pycache__", "*.egg*"))
    (app / "plain_mf" / "hostile.py").write_text(_HOSTILE_HOOKS)
    text = (app / "pyproject.toml").read_text()
    lines = [
        f'private-data = "{private}"' if private and line.startswith("private-data") else line
        for line in text.splitlines()
    ]
    lines = [f'public-info = "{public}"' if public and line.startswith("public-info") else line for line in lines]
    (app / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return app


@pytest.fixture(scope="module")
def frontdoor_records(tmp_path_factory) -> dict:
    """The network recording and the hostile-hook recordings, three at a time."""
    root = tmp_path_factory.mktemp("frontdoor-records")
    jobs = {}
    for name, (private, public, _) in HOOK_CASES.items():
        d = root / _folder(name)
        d.mkdir()
        _hostile_app(d, private, public)
        jobs[name] = d

    def record(d):
        res = _run(["record", "--flower", "app", "--clients", "3", "--rounds", "1", "-o", "run.ptx"], d)
        res["after"] = sorted(p.name for p in d.iterdir())
        return res

    (root / "network").mkdir()
    with ThreadPoolExecutor(max_workers=3) as pool:
        network = pool.submit(_network_recording, root / "network")
        futures = {name: pool.submit(record, d) for name, d in jobs.items()}
    return {"network": network.result(), **{name: f.result() for name, f in futures.items()}}


@pytest.mark.parametrize("name", list(HOOK_CASES))
def test_app_hooks_are_checked_before_the_simulation(frontdoor_records, name):
    """A hostile [tool.privaudit] hook ends `privaudit record` in one line, exit 2, within
    seconds (checked before the simulation starts), writing no transcript; a child that dies
    leaves its log beside -o, never on the terminal."""
    res = frontdoor_records[name]
    _assert_refused(res, HOOK_CASES[name][2])
    assert res["rss"] < RSS_LIMIT, res["rss"]
    assert "run.ptx" not in res["after"]
    if name == "the child dies printing escapes":
        assert res["after"] == ["app", "privaudit-record.log"] and "(its log: privaudit-record.log)" in res["err"]
    else:
        assert res["after"] == ["app"]


@pytest.mark.parametrize(
    "value, expect",
    [
        ({"n_items": 10**12}, "n_items must be an integer in [1, 1048576]"),
        ({"n_items": True}, "n_items must be an integer"),
        ({"n_items": 5, "lr": float("nan")}, "not plain JSON"),
        ({"n_items": 5, "x": object()}, "not plain JSON"),
        ({"n_items": 5, "rating_min": 5.0, "rating_max": 1.0}, "rating_min must be below rating_max"),
        ({1: 2, "n_items": 5}, "returned a key 1: keys must be strings"),
        ({"lr": "0.1"}, "lr must be a finite number"),
        ({"local_steps": 10**9}, "local_steps must be an integer in [1, 1000000]"),
        ({"rating_min": 1.0, "rating_max": 5.0, "rating_step": 1e-9}, "the rating scale has 4e+09 values"),
        ({"rating_min": "1"}, "rating_min must be a finite number"),
        ({"attribute_names": [1, 2]}, "attribute_names must be a list of at most 10000 strings"),
        ({"blob": "x" * (2 * 1024**2)}, "bytes of JSON, more than 1048576"),
        ({"matrix": [[0.0] * 8] * (2 * 10**5)}, "returned more than 100000 values"),
        ({"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}, "levels of nesting"),
        ([1, 2], "returned a list, not an object"),
    ],
)
def test_public_info_is_checked(value, expect):
    """What `privaudit record` checks of the public-info hook's result before the simulation
    (the same function the record path above runs; one-line PrivauditError)."""
    from privaudit.errors import PrivauditError
    from privaudit.integrations._isolation import check_public_info

    with pytest.raises(PrivauditError) as exc:
        check_public_info(value, "app.task:info")
    assert expect in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "value, expect",
    [
        ({"items": np.arange(10**6, 10**6 + 3), "ratings": np.ones(3)}, "field 'items' holds ids outside [0, 300)"),
        ({"items": np.arange(3), "ratings": np.ones(4)}, "'items' and 'ratings' must have the same length"),
        ({"items": np.arange(3.0)}, "field 'items' must be a 1-D integer array"),
        ({"x": np.array(["a"])}, "field 'x': a <U1 array"),
        ({"x": np.ones((2, 2, 2))}, "of 3 dims"),
        ({"x": np.array([np.inf])}, "NaN or infinite"),
        ({"x": "text"}, "field 'x' is a str, not an array"),
        ({f"f{i}": np.zeros(1) for i in range(100)}, "returned 100 fields"),
    ],
)
def test_private_data_is_checked(value, expect):
    from privaudit.errors import PrivauditError
    from privaudit.integrations._isolation import check_private_data

    with pytest.raises(PrivauditError) as exc:
        check_private_data(value, n_items=300)
    assert expect in str(exc.value)


def test_hooks_must_be_python_functions():
    import os as _os

    from privaudit.errors import PrivauditError
    from privaudit.integrations._isolation import check_hook

    for obj, kind in ((_os.system, "a builtin"), (np, "a module"), (int, "a type"), (3, "a int")):
        with pytest.raises(PrivauditError, match=f"is {kind}, not a Python function"):
            check_hook(obj, "m:f", "private-data", "app/pyproject.toml")
    assert check_hook(test_hooks_must_be_python_functions, "m:f", "public-info", "x") is not None


# ------------------------------------------------------------------ frontdoor: mapped data

_TRUNCATE_AFTER_LOAD = """
import os, sys
import numpy as np
from privaudit import transcript as tr
t = tr.Transcript("p", parties=["server"])
t.add(0, "server", "server", "state", {"V": np.arange(300000.0).reshape(100000, 3)})
path = t.save(sys.argv[1])
back = tr.load(path)
os.truncate(path, 0)
print(float(sum(m.payload["V"].sum() for m in back.messages)))
"""


def test_a_file_truncated_after_loading_is_harmless(tmp_path):
    """A file's stored columns (up to 64 MiB of them) are read on load with their CRCs checked:
    truncating the file afterwards (which made a memory-mapped column end the process with
    SIGBUS) changes nothing."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, "-c", _TRUNCATE_AFTER_LOAD, str(tmp_path / "t.ptx")], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    assert float(res.stdout) == np.arange(300000.0).sum()


_TRUNCATE_UNDER_MAPPING = """
import os, sys
import numpy as np
from privaudit import transcript as tr
from privaudit.transcript_io import v2
v2.COPY_STORED_BYTES = 0  # every stored column memory-mapped
t = tr.Transcript("p", parties=["server"])
t.add(0, "server", "server", "state", {"V": np.arange(3000000.0).reshape(1000000, 3)})
path = t.save(sys.argv[1])
back = tr.load(path)
os.truncate(path, 0)
print(float(sum(m.payload["V"].sum() for m in back.messages)))
"""


def test_a_file_truncated_under_a_mapping_ends_in_one_line(tmp_path):
    """A memory-mapped column whose file is truncated while it is read: one line, exit 2 (the
    SIGBUS handler), not a silent crash with -7."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, "-c", _TRUNCATE_UNDER_MAPPING, str(tmp_path / "t.ptx")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert res.stderr.splitlines() == [
        "privaudit: error: a memory-mapped transcript file changed or was truncated while it was read (SIGBUS); "
        "leave the file unchanged while privaudit reads it"
    ]
    assert res.stdout == ""


def test_inspect_says_which_columns_are_mapped(base_ptx, capsys, monkeypatch):
    from privaudit.transcript_io import mapped_bytes, v2

    rc, out, _ = _main(["inspect", str(base_ptx)], capsys)
    assert rc == 0 and "mapped" not in out  # every stored column read, CRC checked
    monkeypatch.setattr(v2, "COPY_STORED_BYTES", 0)
    n, size = mapped_bytes(tr.load(base_ptx))
    assert n >= 1 and size > 0
    rc, out, _ = _main(["inspect", str(base_ptx)], capsys)
    assert rc == 0 and f"mapped      {n} stored columns (" in out and "CRCs not checked; do not change the file" in out


def test_local_clusters_listen_on_loopback_and_leave_no_scratch(tmp_path, monkeypatch):
    """A local:N Dask cluster (run, attack, audit): scheduler, nannies and workers listen on
    127.0.0.1 only; dask-scratch-space lives in a private folder removed on close."""
    import psutil

    from privaudit._local_cluster import local_cluster

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    me = psutil.Process()
    with local_cluster(1) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        assert [p.name for p in tmp_path.iterdir()][0].startswith("privaudit-dask-")
        listening = []
        for p in [me, *me.children(recursive=True)]:
            try:
                listening += [c.laddr.ip for c in p.net_connections(kind="inet") if c.status == "LISTEN"]
            except psutil.Error:
                continue
    assert listening and all(ip in ("127.0.0.1", "::1") for ip in listening), listening
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- adaptive (issue 38): audit defense stacks


@pytest.mark.parametrize(
    "spec, expect",
    [
        ("secagg+", "empty member in the stack"),
        ("secagg+nope", "nope"),
        ("secagg+model-consistency:min_cohort=0", "min_cohort"),
        ("feature-bounds:max_score=abc", "max_score"),
        ("model-consistency+model-consistency", "appears twice"),
        ("secagg:dropout=0.1,dropout", "expected key=value"),
        ("secagg+dp-prototypes", "cannot be swept on 'fedncf'"),
    ],
)
def test_audit_defense_stack_is_refused_in_one_line(spec, expect, tmp_path, capsys, monkeypatch):
    """A malformed or impossible --defense stack: one line on stderr, exit 2, before any run."""
    from privaudit.cli import main

    monkeypatch.chdir(tmp_path)
    rc = main(["audit", "--protocol", "fedncf", "--threat", "malicious", "--defense", spec, "-o", "rep"])
    captured = capsys.readouterr()
    _assert_refused({"rc": rc, "err": captured.err}, expect)
    assert not (tmp_path / "rep").exists()


def test_privmvmf_singleton_cohorts_are_refused_by_model_consistency(tmp_path, capsys, monkeypatch):
    """The server posting one-client Paillier cohorts under model-consistency: refused up front."""
    from privaudit.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["audit", "--protocol", "privmvmf", "--threat", "malicious", "--seeds", "5", "-o", "rep"]
    rc = main(argv + ["--defense", "paillier:cohort_size=1+model-consistency"])
    captured = capsys.readouterr()
    _assert_refused({"rc": rc, "err": captured.err}, "refuses posted cohorts of 1 client(s), below min_cohort 5")
    assert not (tmp_path / "rep").exists()


# ------------------------------------------------------------------ branch canaries: canary kit and audit rows


@pytest.mark.parametrize("per_user, items", [(3, 16), (0, 16), (2, 15), (4, 6)])
def test_fedmvmf_canary_kit_rejects_a_bad_grouping(per_user, items):
    from privaudit import canary, runner
    from privaudit.errors import PrivauditError

    kit = canary.FedMVMFCanaries(canaries=10, items=items, per_user=per_user)
    with pytest.raises(PrivauditError, match="per_user .* must be even, >= 2 and divide items"):
        kit.insert(runner.load_data("synthetic"), np.random.default_rng(0))


def test_audit_rows_stay_one_short_line_on_hostile_names():
    """An attack or defense name with newlines, control characters or great length still prints
    one line of at most 100 characters per attack."""
    from privaudit.reports.audit import ROW_CHARS, verdict_lines

    for name in ("evil\nname\x1b[31m" + "x" * 300, "e\x1b[2Jvil\nname"):
        audit = {"attacks": [{"name": name}], "defenses": [], "matrix": [{"attack": name, "verdict": "leaks"}]}
        line, detail = verdict_lines(audit, {"attack": name, "metric": "m\rn", "defense": None, "sentence": "s\x00"})
        assert "\n" not in line and "\r" not in line and "\x1b" not in line and len(line) <= ROW_CHARS
        assert line.startswith("verdict: e") and "\x00" not in detail


# ------------------------------------------------------------------------------ plugins branch
# Defense schema declarations, composed validation on files, declared release counts.


def _fedmvmf_listing(*defenses: str) -> tr.Transcript:
    """A small FedMVMF run whose public config is made to list ``defenses``."""
    from privaudit.data import synthetic
    from privaudit.registry import get

    data = synthetic(n_users=6, n_items=12, min_ratings=3, seed=0)
    t = get("protocol", "fedmvmf")().run(data, {"epochs": 1, "K": 2}, [], 0).transcript
    t.config["defenses"] = [{"name": d} for d in defenses]
    t.parties.append("decryptor:0")
    return t


def _grad_v_upload(t: tr.Transcript):
    return t.select("grad_V")[0]


HOSTILE_DEFENSE_CASES = {
    # a paillier kind under a transcript that lists only secagg: no component declares it
    "foreign defense kind": (
        ("secagg",),
        lambda t: t.add(0, "server", "decryptor:0", "ciphertext_sum", {"ciphertexts": np.zeros((1, 1, 4), np.uint8)}),
        "nor one a listed defense declares (secagg)",
    ),
    # a payload the paillier declaration does not hold: the defense is named, not the protocol label
    "extra payload in a defense kind": (
        ("paillier",),
        lambda t: t.add(0, "decryptor:0", "server", "plaintext_sum", {"values": np.ones((1, 2)), "junk": np.ones(1)}),
        "'junk' is not part of a 'plaintext_sum' message as defense 'paillier' declares it",
    ),
    # masked upload without a defense that declares the masked form
    "masked without secagg": (
        ("paillier",),
        lambda t: _grad_v_upload(t).meta.update(masked=True),
        "masked upload, but no defense the config lists declares masked uploads",
    ),
    # an int8 upload no listed defense declares
    "int8 rows": (
        ("dp-laplace",),
        lambda t: _grad_v_upload(t).payload.__setitem__("values", _grad_v_upload(t).payload["values"].astype(np.int8)),
        "dtype int8 is not float",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_DEFENSE_CASES))
def test_defense_declarations_refuse_hostile_transcript_files(case, tmp_path):
    """Through the CLI: one line on stderr naming the component, exit code 2, before any attack."""
    defenses, mutate, expected = HOSTILE_DEFENSE_CASES[case]
    t = _fedmvmf_listing(*defenses)
    mutate(t)
    path = t.save(tmp_path / "hostile.ptx")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "privaudit", "attack", "--transcript", str(path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-800:]
    assert len(proc.stderr.strip().splitlines()) == 1 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_hostile_declarations_fail_at_class_definition():
    from privaudit.schema import DefenseSchema, MessageSchema, PayloadField

    with pytest.raises(TypeError, match="unknown upload form 'plain'"):
        DefenseSchema(upload_forms=("plain",))
    with pytest.raises(TypeError, match="payload dtype 'int4'"):
        DefenseSchema(payload_dtypes={("*", "values"): "int4"})
    with pytest.raises(TypeError, match="k.x: dtype 'complex'"):
        DefenseSchema(messages=(MessageSchema("k", "client", "server", (PayloadField("x", "complex"),)),))


def test_a_hostile_release_count_is_refused():
    from privaudit import registry
    from privaudit.defenses import accounting
    from privaudit.errors import PrivauditError
    from privaudit.protocols.fedrec import FedRec

    class Liar(FedRec):
        @classmethod
        def release_count(cls, config):
            return -3

    registry.adopt("protocol", "liar-rec", Liar)
    try:
        with pytest.raises(PrivauditError, match="release_count must be a non-negative int or None, got -3"):
            accounting.declared_releases("liar-rec", {})
    finally:
        registry.unregister("protocol", "liar-rec")


# ------------------------------------------------------------------ lead: defenses a protocol cannot run


@pytest.mark.parametrize("protocol", ["fedsplit", "fedproto"])
def test_paillier_on_a_protocol_whose_server_reads_plaintexts_is_refused_before_compute(protocol, capsys, no_compute):
    from privaudit.cli import main

    code = main(["attack", "--protocol", protocol, "--defense", "paillier", "--seeds", "1", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"defense 'paillier' does not apply to protocol '{protocol}'" in err[0]


# ------------------------------------------------------------------ shard branch: sharding through the protocol interface


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--protocol", "privmvmf"], "--scheduler: protocol 'privmvmf' does not run in client blocks"),
        (["--protocol", "fedncf"], "protocols that can: fedmvmf, fedrec"),
        (["--protocol", "fedrec", "--set", "model=pmf-sgd"], "runs the federated pmf-batch model only"),
        (["--protocol", "fedrec", "--set", "federated=false"], "runs the federated pmf-batch model only"),
    ],
)
def test_a_sharded_run_of_a_protocol_without_client_blocks_is_refused_before_compute(
    argv, expected, capsys, tmp_path, monkeypatch
):
    """``run --scheduler`` drives only protocols that declare a block_round (and configs their
    block round accepts): one line, exit 2, before any data is built, cluster started or file written."""
    import privaudit.experiment
    from privaudit import sharded
    from privaudit.cli import main

    monkeypatch.setattr(privaudit.experiment, "load_data", lambda *a, **k: pytest.fail("data built"))
    monkeypatch.setattr(sharded, "dask_client", lambda *a, **k: pytest.fail("cluster started"))
    code = main(["run", *argv, "--scheduler", "local:1", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert expected in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("protocol", ["privmvmf", ["fedmvmf"], "fedmvmf\n", None])
def test_a_sharded_folder_naming_a_protocol_without_client_blocks_is_refused(protocol, tmp_path):
    """The manifest's protocol picks the upload kinds a shard may hold: only a registered protocol
    that declares a block_round is read (no other name, no non-string)."""
    from privaudit.errors import TranscriptError
    from privaudit.sharded import load

    manifest = _sharded_manifest(4, 2, [0])
    manifest["protocol"] = protocol
    folder = _sharded_folder(tmp_path / "run", manifest, {})
    with pytest.raises(TranscriptError, match="is not one a sharded run supports"):
        load(folder)


# ------------------------------------------------------------------ branch typed: Results / AuditResults


def test_typed_results_refuse_hostile_files_in_one_line(tmp_path):
    import os

    from privaudit.api import AuditResults, Results
    from privaudit.errors import PrivauditError

    audit = tmp_path / "audit.json"
    audit.write_text(
        '{"schema_version": 1, "privaudit_version": "0", "protocol": "p", "defenses": [], '
        '"private_included": false, "rows": []}'
    )
    cases = {
        audit: "a audit.json, not a results.json",  # the other kind
        tmp_path / "missing.json": "no such file",
        tmp_path: "is a folder",
    }
    bad = tmp_path / "bad.json"
    bad.write_text("[" * 100_000)
    cases[bad] = "not a valid audit.json or results.json"
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases[fifo] = "not a regular file"
    for path, message in cases.items():
        with pytest.raises(PrivauditError, match=message) as info:
            Results.read(path)
        assert "\n" not in str(info.value)
    assert AuditResults.read(audit)["rows"] == []
    with pytest.raises(PrivauditError, match="needs a mapping, got list"):
        AuditResults.from_dict([])
    with pytest.raises(PrivauditError, match="needs a mapping, got str"):
        Results.from_dict("points")


def test_typed_results_escape_every_string_in_the_notebook_view():
    from privaudit.api import AuditResults, Results

    evil = "<script>x()</script>"
    results = Results.from_dict(
        {
            "protocol": evil,
            "attack": evil,
            "sweep": evil,
            "points": [{"value": evil, "seed": 0, "attack_metrics": {evil: 0.5}}],
            "verdicts": [{"attack": evil, "metric": evil, "sentence": evil, "plain": evil, "detail": evil}],
        }
    )
    page = results._repr_html_()
    assert "<script>" not in page and page.count("&lt;script&gt;") >= 4
    audit = AuditResults.from_dict(
        {
            "protocol": evil,
            "matrix": [{"attack": evil, "defense": evil, "value": evil, "verdict": evil, "advantage": None}],
            "verdicts": [{"attack": evil, "sentence": evil, "dp_violation": False}],
        }
    )
    page = audit._repr_html_()
    assert "<script>" not in page and page.count("&lt;script&gt;") >= 4


# ------------------------------------------------------------------------------ dphook branch
# A plugin defense written against the removed upload hooks: refused by name when it loads.


def test_a_plugin_defense_with_a_removed_hook_is_refused_by_name(tmp_path):
    (tmp_path / "stale_plugin.py").write_text(
        "from privaudit.defenses.base import Defense\n\n\n"
        "class Stale(Defense):\n"
        "    def aggregate(self, batch, channel, rows):\n"
        "        return None\n"
    )
    dist = tmp_path / "stale_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: stale-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[privaudit.defenses]\nstale = stale_plugin:Stale\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    proc = subprocess.run(
        [sys.executable, "-m", "privaudit", "list"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-800:]  # the toolkit still works
    assert (
        "plugin failed to load: privaudit.defenses:stale: TypeError: Stale: aggregate is no longer a defense "
        "hook; override process_uploads(uploads, ctx, call_next)" in proc.stderr
    ), proc.stderr
    assert "stale" not in proc.stdout.split()


# ------------------------------------------------------------------ branch utilci: per-user utility in results.json


def _results_doc(utility_users):
    point = {"value": None, "seed": 0, "attack_metrics": {}, "utility": {"ndcg@10": 0.3}}
    if utility_users is not None:
        point["utility_users"] = utility_users
    return {
        "schema_version": 2,
        "privaudit_version": "0",
        "protocol": "p",
        "protocol_config": {},
        "attack": "a",
        "sweep": None,
        "defenses": [],
        "dataset": {},
        "points": [point],
        "summary": [],
        "verdicts": [],
    }


@pytest.mark.parametrize(
    "stored, fragment",
    [
        ({"ndcg@10": {"values": "0.3"}}, "/points/0/utility_users/ndcg@10"),
        ({"ndcg@10": {"num": [1.0], "den": [-1.0]}}, "/points/0/utility_users/ndcg@10"),
        ({"ndcg@10": {"num": ["x"], "den": [1]}}, "/points/0/utility_users/ndcg@10"),
        ({"ndcg@10": {"over": "users"}}, "/points/0/utility_users/ndcg@10"),
        ({"ndcg@10": [0.1, 0.2]}, "/points/0/utility_users/ndcg@10"),
        ({"ndcg@10": {"values": [0.1], "over": "victims"}}, "/points/0/utility_users/ndcg@10"),
    ],
)
def test_compare_refuses_hostile_per_user_utility_in_one_line(stored, fragment, tmp_path, capsys):
    ok, bad = tmp_path / "ok.json", tmp_path / "bad.json"
    ok.write_text(json.dumps(_results_doc({"ndcg@10": {"values": [0.3, None], "over": "users"}})))
    bad.write_text(json.dumps(_results_doc(stored)))
    _compare_refuses(capsys, ok, bad, fragment)


@pytest.mark.parametrize(
    "stored",
    [
        {"values": "0.3"},
        {"values": [[1]] * 12},
        {"num": [1.0] * 12, "den": [1.0] * 11},
        {"num": [float("nan")] * 12, "den": [1.0] * 12},
        {"num": [1.0] * 12, "den": [-1.0] * 12},
        {"values": [True] * 12},
        {"values": [1e308] * 12},
        "x",
        None,
        {"values": [0.2] * 12, "root": "yes"},
    ],
)
def test_hostile_per_user_utility_only_costs_the_interval(stored):
    """A results dict with malformed per-user utility (Python API, an edited file re-rendered)
    never raises: the cost keeps its seed-paired value and loses only the bootstrap interval."""
    from privaudit import results as rs

    good = {"values": [0.3] * 6 + [0.2] * 6}
    cost = rs.utility_cost_interval({"0": 0.25}, {"0": 0.2}, "ndcg@10", None, {"0": good}, {"0": stored})
    assert cost["cost"] == pytest.approx(0.05) and cost["seeds"] == 1
    bootstrap = cost["method"].startswith("paired bootstrap over 12 users")
    assert bootstrap or cost["method"].startswith("no interval: one seed")
    assert bootstrap == math.isfinite(cost["low"])


# ------------------------------------------------------------------ ncfdp: benchmarks/fedncf_dp_point.py


@pytest.mark.parametrize(
    "args, message",
    [
        (["--points", "nosuchpoint"], "unknown point(s) nosuchpoint"),
        (["--saturate-rounds", "0"], "--saturate-rounds and --saturate-seeds must be at least 1"),
        (["--csv", "exists.csv"], "exists.csv exists; name a new file"),
        (["--render", "missing.csv"], "missing.csv: no such file"),
        (["--render", "exists.csv"], "exists.csv: not a CSV written by --csv"),
        (["--sign-reading", "10,-1"], "--sign-reading takes positive epsilons or none"),
        (["--sign-reading", "ten"], "--sign-reading takes positive epsilons or none"),
    ],
)
def test_fedncf_dp_point_mistakes_exit_2_in_one_line_and_overwrite_nothing(tmp_path, args, message):
    (tmp_path / "exists.csv").write_text("keep")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fedncf_dp_point.py"), "--small", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and message in err[0], proc.stderr
    assert proc.stdout == "" and (tmp_path / "exists.csv").read_text() == "keep"


# ------------------------------------------------------------------ belowprior: the decoders' parameters


@pytest.mark.parametrize(
    "protocol, attack, expect",
    [
        ("fedrec", "fedrec-rated-items:decoder=bayes", "decoder"),
        ("fedncf", "ncf-update-leak:decoder=all", "decoder"),
        ("fedsplit", "fedsplit-inference:prior_blend=maybe", "prior_blend"),
    ],
)
def test_a_bad_decoder_parameter_is_one_line_before_compute(protocol, attack, expect, capsys, no_compute):
    from privaudit.cli import main

    code = main(["attack", "--protocol", protocol, "--attack", attack, "--seeds", "1", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert expect in err[0] and "Traceback" not in err[0]

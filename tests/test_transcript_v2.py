"""Format version 2 (columnar) and streaming writes: round trips against version 1 and memory.

``tests/fixtures/transcript_v1.ptx`` is a version-1 file written by the version-1 writer
(``transcript_io.save(_fixture(), path, version=1)``) and committed, so that reading version 1
is checked against bytes the current writer no longer produces by default.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from privaudit import transcript_io
from privaudit.errors import TranscriptError
from privaudit.transcript import Transcript, load
from privaudit.transcript_io import TranscriptWriter, streaming

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "transcript_v1.ptx"


def _fixture() -> Transcript:
    """Two rounds of ragged uploads (ids, K = 3 rows), a dense state, 0-d and bool payloads."""
    rng = np.random.default_rng(7)
    t = Transcript("fedmvmf", {"n_items": 400, "K": 3}, 5, {"name": "toy"}, ["server", "client:0", "client:1"])
    for c in range(2):
        t.add(0, f"client:{c}", f"client:{c}", "private", {"items": np.arange(c, 9 + c), "ratings": np.full(9, 4.0)})
    for r in range(2):
        t.add(r, "server", "server", "state", {"V": rng.normal(size=(400, 3)), "step": np.array(r)})
        for c in range(2):
            n = 3 + 2 * c + r
            payload = {"items": rng.choice(40, n, replace=False), "values": rng.normal(size=(n, 3))}
            t.add(r, f"client:{c}", "server", "grad_V", payload, {"masked": bool(c)})
        t.add(r, "client:1", "server", "flags", {"seen": np.array([True, False, True])})
    t.add(1, "client:0", "server", "grad_V", {"items": np.zeros(0, np.int64), "values": np.zeros((0, 3))})
    return t


def _same(a: Transcript, b: Transcript) -> None:
    assert (a.protocol, a.config, a.seed, a.dataset, a.parties) == (b.protocol, b.config, b.seed, b.dataset, b.parties)
    assert len(a) == len(b)
    for x, y in zip(a.messages, b.messages):
        assert (x.seq, x.round, x.sender, x.receiver, x.kind, x.meta) == (
            y.seq,
            y.round,
            y.sender,
            y.receiver,
            y.kind,
            y.meta,
        )
        assert list(x.payload) == list(y.payload)
        for name in x.payload:
            u, v = np.asarray(x.payload[name]), np.asarray(y.payload[name])
            assert (u.dtype, u.shape) == (v.dtype, v.shape), name
            assert np.array_equal(u, v), name


def _uploads(t: Transcript) -> list[tuple[int, int]]:
    """(position, client) of every grad_V message with a meta (all but the empty last one)."""
    return [(i, int(m.sender.split(":")[1])) for i, m in enumerate(t.messages) if m.meta]


def _manifest(path: Path) -> dict:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("manifest.json"))


def test_committed_version1_file_still_loads():
    _same(load(FIXTURE), _fixture())
    assert _manifest(FIXTURE)["version"] == 1


def test_version2_round_trip_equals_version1(tmp_path):
    t = _fixture()
    v2 = t.save(tmp_path / "t2.ptx")
    v1 = transcript_io.save(t, tmp_path / "t1.ptx", version=1)
    _same(load(v2), t)
    _same(load(v1), load(v2))
    m = _manifest(v2)
    assert m["version"] == 2
    # one column per (kind, round, field, dtype, trailing shape): 3 members each (data, offsets,
    # owners), plus the message table and the manifest
    keys = {(c["kind"], c["round"], c["field"]) for c in m["columns"]}
    assert len(keys) == len(m["columns"]) == 12
    assert m["messages"] == len(t) == 11 and m["meta"] == [[i, {"masked": c % 2 == 1}] for i, c in _uploads(t)]
    with zipfile.ZipFile(v2) as zf, zipfile.ZipFile(v1) as zf1:
        assert len(zf.namelist()) == 3 * len(m["columns"]) + 2 == 38
        assert len(zf1.namelist()) == 1 + sum(len(x.payload) for x in t.messages) == 21
    # the 0-d payload comes back 0-d, the empty upload empty
    back = load(v2)
    assert back.select("state")[1].payload["step"].shape == ()
    assert back.select("grad_V", round=1)[-1].payload["values"].shape == (0, 3)


def _root(arr):
    while arr.base is not None and not isinstance(arr, np.memmap):
        arr = arr.base
    return arr


def test_stored_columns_are_memory_mapped_and_read_only(tmp_path, monkeypatch):
    from privaudit.transcript_io import v2

    t = Transcript("p", parties=["server"])
    big = np.arange(6000.0).reshape(2000, 3)
    t.add(0, "server", "server", "state", {"V": big, "ids": np.arange(10)})
    path = t.save(tmp_path / "t.ptx")
    # a small file's stored columns are read (CRC checked): the file may change afterwards
    copied = load(path).messages[0].payload["V"]
    assert not isinstance(_root(copied), np.memmap) and not copied.flags.writeable
    monkeypatch.setattr(v2, "COPY_STORED_BYTES", 1000)  # past the copy allowance: mapped
    back = load(path)
    v, ids = back.messages[0].payload["V"], back.messages[0].payload["ids"]
    assert isinstance(_root(v), np.memmap)  # a view of the file: loading read none of its data
    assert not v.flags.writeable and not ids.flags.writeable
    assert np.array_equal(v, big) and np.array_equal(ids, np.arange(10))
    with pytest.raises(ValueError, match="read-only"):
        v[0, 0] = 1.0


def test_without_private_leaves_the_private_columns_out(tmp_path):
    path = _fixture().save(tmp_path / "shared.ptx", include_private=False)
    m = _manifest(path)
    assert m["private_included"] is False
    assert all(c["kind"] != "private" for c in m["columns"])
    _same(load(path), _fixture().without_private())


def test_streaming_writer_points_finished_rounds_at_the_file(tmp_path):
    t = _fixture()
    out = tmp_path / "s.ptx"
    copy = Transcript(t.protocol, t.config, t.seed, t.dataset, t.parties)
    writer = TranscriptWriter(out, stream=True)
    copy.stream_into(writer)
    for m in t.messages:
        copy.add(m.round, m.sender, m.receiver, m.kind, m.payload, m.meta)
        if m.round == 1 and m.kind == "state":
            # round 0 is written: its stored state is a read-only map of the file being written
            assert not copy.select("state", round=0)[0].payload["V"].flags.writeable
            assert not out.exists()  # nothing at the final path before close
    copy.stream_into(None)
    writer.close(copy)
    _same(load(out), t)
    _same(copy, t)  # the streamed transcript still holds every payload (views of the file)
    assert [c["round"] for c in _manifest(out)["columns"]] == sorted(c["round"] for c in _manifest(out)["columns"])


def test_streamed_columns_are_split_at_chunk_bytes(tmp_path):
    t = Transcript("p", parties=["server", "client:0"])
    rows = [np.full((200, 4), float(i)) for i in range(5)]  # 6,400 bytes each
    for r in rows:
        t.add(0, "client:0", "server", "grad_V", {"values": r})
    with TranscriptWriter(tmp_path / "c.ptx", stream=True, chunk_bytes=15_000) as w:
        for m in t.messages:
            w.append(m)
        w.close(t)
    m = _manifest(tmp_path / "c.ptx")
    assert [c["messages"] for c in m["columns"]] == [3, 2]  # written at 19,200 bytes, then the rest
    _same(load(tmp_path / "c.ptx"), t)


def test_a_failed_write_leaves_no_file(tmp_path):
    t = _fixture()
    out = tmp_path / "x.ptx"
    with pytest.raises(RuntimeError), TranscriptWriter(out, stream=True) as w:
        w.append(t.messages[0])
        raise RuntimeError("the run failed")
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="does not increase"):
        w2 = TranscriptWriter(out)
        try:
            w2.append(t.messages[1])
            w2.append(t.messages[0])
        finally:
            w2.abort()
    assert os.listdir(tmp_path) == []


def test_streaming_block_writes_what_a_protocol_run_records(tmp_path):
    from privaudit.experiment import run_transcript

    expected = run_transcript(
        protocol="fedmvmf", protocol_config={"epochs": 3, "record_rounds": 3}, users=20, seed=0
    ).transcript
    with streaming(tmp_path / "run.ptx") as stream:
        result = run_transcript(protocol="fedmvmf", protocol_config={"epochs": 3, "record_rounds": 3}, users=20, seed=0)
        assert stream.writer is not None  # fedmvmf claimed the stream
        path = stream.finish(result.transcript)
    _same(load(path), expected)
    assert "_sink" not in result.transcript.__dict__
    # a protocol that does not stream is saved at the end instead
    with streaming(tmp_path / "fedrec.ptx") as stream:
        other = run_transcript(protocol="fedrec", users=10, seed=0).transcript
        assert stream.writer is None
        _same(load(stream.finish(other)), other)


def test_unsupported_version_is_named():
    with pytest.raises(ValueError, match="not 3"):
        transcript_io.save(_fixture(), "never.ptx", version=3)
    with pytest.raises(TranscriptError, match="no such transcript file"):
        load("never.ptx")


def test_column_bytes_are_written_in_order_with_back_to_back_slices_uncopied():
    from privaudit.transcript_io.v2 import _batches

    rng = np.random.default_rng(0)
    buf = rng.normal(size=(1000, 4))
    arrays = [buf[0:3], buf[3:10], buf[10:10], buf[10:500], np.ones((2, 4)), buf[600:1000], buf[::2][:5]]
    arrays.append(rng.normal(size=(20000, 4)))
    want = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    for small, limit in ((65536, 16 * 2**20), (100, 200), (1, 1)):
        pieces = list(_batches(arrays, small, limit))
        assert b"".join(p.tobytes() for p in pieces) == want
    # slices 0:3, 3:10, 10:500 of one buffer are one view of it (no copy), and so is 600:1000
    pieces = list(_batches(arrays, small=1024))
    assert [p.nbytes for p in pieces] == [500 * 32, 2 * 32, 400 * 32, 5 * 32, 20000 * 32]
    assert np.shares_memory(pieces[0], buf) and np.shares_memory(pieces[2], buf)


def test_sink_writes_every_byte_in_order_with_zlib_crc(tmp_path):
    """Every byte in order in batches of any size (non-C-ordered arrays copied first, behind a
    header the buffered file still held); the CRC computed in the worker thread is zlib's over
    the whole stream, from the given start value; the file's position follows."""
    from concurrent.futures import ThreadPoolExecutor

    from privaudit.transcript_io.v2 import _Sink

    rng = np.random.default_rng(1)
    buf = rng.normal(size=(3000, 4))
    rows = [rng.normal(size=(int(n), 4)) for n in rng.integers(0, 40, size=300)]
    rows[10:10] = [buf[0:5], buf[5:2000], buf[2000:2001], buf[::3], np.asfortranarray(buf[:7])]
    scalars = [np.array(float(v)) for v in rng.normal(size=50)]  # a column of 0-d payloads
    for arrays in (rows, scalars):
        want = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
        for iov, batch_bytes in ((1024, 64 << 20), (7, 1000), (1, 64), (3, 1)):
            with open(tmp_path / "out.bin", "w+b") as fh, ThreadPoolExecutor(1) as pool:
                fh.write(b"head")
                written, crc = _Sink(fh, pool, 12345, iov=iov, batch_bytes=batch_bytes).write(arrays)
                assert fh.tell() == 4 + len(want)
                fh.write(b"tail")
            assert (tmp_path / "out.bin").read_bytes() == b"head" + want + b"tail"
            assert written == len(want) and crc == zlib.crc32(want, 12345)


def test_writev_all_finishes_partial_writes(tmp_path, monkeypatch):
    """A write the kernel cuts short (a signal, a 2 GiB single call) resumes where it stopped."""
    from privaudit.transcript_io import v2

    real = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, bufs: real(fd, [bytes(memoryview(bufs[0]).cast("B"))[:5]]))
    arrays = [np.arange(4.0), np.zeros(0), np.arange(3, dtype=np.int64).reshape(3, 1), np.array(2.5)]
    want = b"".join(a.tobytes() for a in arrays)
    with open(tmp_path / "out.bin", "wb") as fh:
        v2._writev_all(fh.fileno(), arrays, len(want))
    assert (tmp_path / "out.bin").read_bytes() == want


def test_stored_members_carry_their_crc(tmp_path):
    t = Transcript("p", parties=["server", "client:0", "client:1"])
    rng = np.random.default_rng(2)
    for c in range(40):
        t.add(0, f"client:{c % 2}", "server", "grad_V", {"values": rng.normal(size=(int(rng.integers(1, 9)), 20))})
    t.add(0, "server", "server", "state", {"V": rng.normal(size=(70000, 4))})
    path = t.save(tmp_path / "t.ptx")
    with zipfile.ZipFile(path) as zf:
        stored = [i for i in zf.infolist() if i.compress_type == zipfile.ZIP_STORED]
        assert len(stored) == 2 and zf.testzip() is None  # every member's CRC and size agree
        for info in stored:
            assert info.CRC == zlib.crc32(zf.read(info))
    _same(load(path), t)


class _Array:
    def __init__(self, a):
        self.a = a

    def numpy(self):
        return self.a


class _Msg:
    """The parts of a Flower message the recorder reads (no flwr needed)."""

    def __init__(self, node: int, group: str, arrays: dict, direction: str):
        from types import SimpleNamespace

        self.metadata = SimpleNamespace(dst_node_id=node, src_node_id=node, message_type="train", group_id=group)
        self.content = SimpleNamespace(
            array_records={"arrays": {k: _Array(v) for k, v in arrays.items()}}, config_records={}, metric_records={}
        )

    def has_error(self):
        return False


def test_flower_recorder_spills_each_recorded_round_to_a_streaming_writer(tmp_path):
    from privaudit.integrations.flower import FlowerRecorder
    from privaudit.integrations.schema_map import SchemaMap

    rec = FlowerRecorder(SchemaMap.auto_map(), tmp_path)
    rec.spill = TranscriptWriter(tmp_path / "rounds.ptx", stream=True)
    rng = np.random.default_rng(0)
    sent = {r: rng.normal(size=(300, 8)) for r in (1, 2)}  # 2,400 floats: a stored column
    for r in (1, 2):
        rec.record([_Msg(n, str(r), {"0": sent[r]}, "down") for n in (11, 12)], "down")
    first = rec.events[0].payload["arrays/0"]
    assert not first.flags.writeable and np.array_equal(first, sent[1])  # round 1 is a view of the file
    assert rec.events[-1].payload["arrays/0"].flags.writeable  # round 2 is still pending
    rec.spill.abort()
    assert os.listdir(tmp_path) == [] and np.array_equal(first, sent[1])  # the view outlives the file


def test_without_writev_stored_columns_go_through_zipfile(tmp_path, monkeypatch):
    """Where ``os.writev`` is missing (Windows) the bytes go through ``zipfile``: the same file."""
    t = _fixture()
    t.add(2, "server", "server", "state", {"V": np.arange(9000.0).reshape(3000, 3)})
    fast = t.save(tmp_path / "fast.ptx")
    monkeypatch.delattr(os, "writev")
    slow = t.save(tmp_path / "slow.ptx")
    with zipfile.ZipFile(fast) as a, zipfile.ZipFile(slow) as b:
        assert a.testzip() is None and b.testzip() is None
        assert [(i.filename, i.CRC, i.file_size) for i in a.infolist()] == [
            (i.filename, i.CRC, i.file_size) for i in b.infolist()
        ]
        assert any(i.compress_type == zipfile.ZIP_STORED for i in a.infolist())
    _same(load(slow), t)

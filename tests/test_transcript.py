"""Transcript model, views, and the .ptx file format: round trips and every refusal case."""

from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from privaudit.errors import TranscriptError
from privaudit.transcript import Transcript, load, save, summarize
from tests.transcript_files import manifest_dict as _manifest
from tests.transcript_files import npy_bytes as _npy_bytes


def small_transcript() -> Transcript:
    t = Transcript(
        "fedmvmf",
        {"K": 2, "alpha": 0.5},
        seed=7,
        dataset={"name": "toy", "users": 2},
        parties=["server", "client:0", "client:1"],
    )
    t.add(0, "client:0", "client:0", "private", {"items": np.array([1, 3]), "ratings": np.array([4.0, 5.0])})
    t.add(0, "client:1", "client:1", "private", {"items": np.array([0]), "ratings": np.array([2.0])})
    t.add(0, "server", "server", "state", {"V": np.ones((4, 2)), "P": np.zeros((3, 2))})
    t.add(0, "client:0", "server", "grad_V", {"items": np.array([1, 3]), "values": np.arange(4.0).reshape(2, 2)})
    t.add(0, "client:1", "server", "grad_V", {"items": np.array([0]), "values": np.ones((1, 2))}, {"note": "x"})
    t.add(0, "server", "client:0", "model", {"V": np.ones((4, 2))})
    return t


def assert_same(a: Transcript, b: Transcript) -> None:
    assert (a.protocol, a.config, a.seed, a.dataset, a.parties) == (b.protocol, b.config, b.seed, b.dataset, b.parties)
    assert len(a.messages) == len(b.messages)
    for x, y in zip(a.messages, b.messages):
        assert (x.seq, x.round, x.sender, x.receiver, x.kind, x.meta) == (
            y.seq,
            y.round,
            y.sender,
            y.receiver,
            y.kind,
            y.meta,
        )
        assert x.payload.keys() == y.payload.keys()
        for k in x.payload:
            assert x.payload[k].dtype == y.payload[k].dtype
            assert x.payload[k].shape == y.payload[k].shape
            np.testing.assert_array_equal(x.payload[k], y.payload[k])


def test_view_holds_only_what_the_party_received():
    t = small_transcript()
    server = t.view("server")
    assert [m.kind for m in server] == ["state", "grad_V", "grad_V"]
    assert server.config == {"K": 2, "alpha": 0.5}
    c0 = t.view("client:0")
    assert [m.kind for m in c0] == ["private", "model"]
    assert all(m.receiver == "client:0" for m in c0)
    with pytest.raises(TranscriptError, match="no party"):
        t.view("client:9")
    assert t.private("client:0")["ratings"].tolist() == [4.0, 5.0]
    assert t.private("server") == {}


def test_round_trip_and_no_private(tmp_path):
    t = small_transcript()
    path = save(t, tmp_path / "run.ptx")
    assert_same(t, load(path))
    shared = load(save(t, tmp_path / "shared.ptx", include_private=False))
    assert not shared.has_private
    assert [m.kind for m in shared] == ["state", "grad_V", "grad_V", "model"]
    assert [m.seq for m in shared] == [2, 3, 4, 5]
    s = summarize(load(path))
    assert s["clients"] == 2 and s["private_included"] is True
    assert s["kinds"]["grad_V"] == {"messages": 2, "bytes": 2 * 8 + 4 * 8 + 8 + 2 * 8}


_dtypes = st.sampled_from([np.float64, np.float32, np.int64, np.int32, np.uint8, np.bool_, np.complex128])
_arrays = _dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5)))
_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_party = st.sampled_from(["server", "item-server", "client:0", "client:1", "decryptor:0"])
_meta = st.dictionaries(
    _names,
    st.one_of(
        st.integers(-(10**6), 10**6),
        st.booleans(),
        st.text(max_size=5),
        st.floats(allow_nan=False, allow_infinity=False),
    ),
    max_size=3,
)
_message = st.tuples(st.integers(0, 50), _party, _party, _names, st.dictionaries(_names, _arrays, max_size=3), _meta)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(_message, max_size=6), seed=st.one_of(st.none(), st.integers(0, 2**31)))
def test_round_trip_is_exact_hypothesis(tmp_path, messages, seed):
    t = Transcript(
        "proto",
        {"K": 3, "names": ["a", "b"]},
        seed,
        {"name": "h"},
        ["server", "client:0", "client:1", "item-server", "decryptor:0"],
    )
    for rnd, sender, receiver, kind, payload, meta in messages:
        t.add(rnd, sender, receiver, kind, payload, meta)
    path = tmp_path / "h.ptx"
    save(t, path)
    assert_same(t, load(path))


def test_fortran_order_and_big_endian_arrays_survive(tmp_path):
    t = Transcript("p", parties=["server"])
    t.add(
        0,
        "server",
        "server",
        "state",
        {
            "F": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
            "B": np.arange(5, dtype=">i8"),
            "C": np.zeros((3, 256), np.uint8),
        },
    )
    back = load(save(t, tmp_path / "f.ptx"))
    np.testing.assert_array_equal(back.messages[0].payload["F"], np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(back.messages[0].payload["B"], np.arange(5))


def test_object_arrays_cannot_be_added_or_saved(tmp_path):
    t = Transcript("p")
    with pytest.raises(TypeError, match="object array"):
        t.add(0, "a", "a", "k", {"x": np.array([{"a": 1}], dtype=object)})


# ------------------------------------------------------------------------- refusal cases


def _write_archive(path, manifest, members):
    with zipfile.ZipFile(path, "w") as zf:
        if manifest is not None:
            zf.writestr("manifest.json", json.dumps(manifest) if not isinstance(manifest, str) else manifest)
        for name, data in members.items():
            zf.writestr(name, data)
    return path


class _Exploit:
    """Unpickling this would create a file: the loader must never execute it."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_pickled_npy_member_is_refused_and_never_executed(tmp_path):
    target = tmp_path / "pwned.txt"
    evil = np.empty(1, dtype=object)
    evil[0] = _Exploit(str(target))
    data = _npy_bytes(evil, allow_pickle=True)
    assert not target.exists()
    path = _write_archive(tmp_path / "evil.ptx", _manifest(), {"arrays/0.npy": data})
    with pytest.raises(TranscriptError, match="object arrays are refused"):
        load(path)
    assert not target.exists()
    # also when the manifest claims a harmless dtype
    path2 = _write_archive(
        tmp_path / "evil2.ptx",
        _manifest(arrays={"arrays/0.npy": {"dtype": "<f8", "shape": [1]}}),
        {"arrays/0.npy": data},
    )
    with pytest.raises(TranscriptError):
        load(path2)
    assert not target.exists()


@pytest.mark.parametrize(
    "manifest, members, message",
    [
        (None, {"arrays/0.npy": _npy_bytes(np.ones(2))}, "no manifest.json"),
        ("{not json", {}, "not valid JSON"),
        (_manifest(format="other"), {"arrays/0.npy": _npy_bytes(np.ones(2))}, "unknown format"),
        (_manifest(version=3), {"arrays/0.npy": _npy_bytes(np.ones(2))}, "unsupported transcript version 3"),
        (_manifest(payload={"V": "../etc/passwd"}), {}, "path traversal"),
        (_manifest(payload={"V": "/abs/0.npy"}), {}, "absolute member path"),
        (
            _manifest(payload={"V": "arrays/9.npy"}),
            {"arrays/0.npy": _npy_bytes(np.ones(2))},
            "missing array 'arrays/9.npy'",
        ),
        (_manifest(), {"arrays/0.npy": b"this is not numpy"}, "not a valid .npy member"),
        (
            _manifest(arrays={"arrays/0.npy": {"dtype": "<f8", "shape": [3]}}),
            {"arrays/0.npy": _npy_bytes(np.ones(2))},
            r"array is <f8 \[2\] but the manifest says <f8 \[3\]",
        ),
        (
            _manifest(arrays={"arrays/0.npy": {"dtype": "<i8", "shape": [2]}}),
            {"arrays/0.npy": _npy_bytes(np.ones(2))},
            "but the manifest says <i8",
        ),
        (_manifest(arrays={}), {"arrays/0.npy": _npy_bytes(np.ones(2))}, "not described in the manifest"),
        (_manifest(), {"arrays/0.npy": _npy_bytes(np.ones(4))[:-8]}, "data bytes, header needs"),
        (_manifest(messages=[{"seq": "0"}]), {}, "field 'seq' has the wrong type"),
        (_manifest(messages=[{"seq": 0, "round": 0, "sender": "a", "receiver": "a"}]), {}, "missing field 'kind'"),
    ],
)
def test_malformed_archives_are_refused_with_one_line(tmp_path, manifest, members, message):
    path = _write_archive(tmp_path / "bad.ptx", manifest, members)
    with pytest.raises(TranscriptError, match=message) as info:
        load(path)
    assert "\n" not in str(info.value)


def test_member_name_with_traversal_in_the_archive_is_refused(tmp_path):
    path = _write_archive(
        tmp_path / "zipslip.ptx",
        _manifest(),
        {"arrays/0.npy": _npy_bytes(np.ones(2)), "../../evil.npy": _npy_bytes(np.ones(1))},
    )
    with pytest.raises(TranscriptError, match="path traversal"):
        load(path)


def test_oversized_archive_is_refused_before_reading(tmp_path):
    path = save(small_transcript(), tmp_path / "ok.ptx")
    with pytest.raises(TranscriptError, match="exceeds the limit of 100 bytes"):
        load(path, max_bytes=100)
    assert load(path, max_bytes=10**6).protocol == "fedmvmf"


def test_not_a_zip_and_missing_file(tmp_path):
    (tmp_path / "x.ptx").write_bytes(b"hello")
    with pytest.raises(TranscriptError, match="not a transcript archive"):
        load(tmp_path / "x.ptx")
    with pytest.raises(TranscriptError, match="no such transcript file"):
        load(tmp_path / "missing.ptx")


def test_save_streams_and_removes_partial_file_on_error(tmp_path):
    t = Transcript("p")
    t.add(0, "a", "a", "k", {"x": np.ones(3)}, {"bad": object()})
    with pytest.raises(TypeError):
        save(t, tmp_path / "partial.ptx")
    assert not os.path.exists(tmp_path / "partial.ptx")


def test_large_float_payloads_are_stored_and_the_rest_deflated(tmp_path):
    rng = np.random.default_rng(0)
    tr = Transcript(protocol="fedmvmf", parties=["server", "client:0"])
    grads = rng.normal(size=(300, 20))  # 6,000 floats: incompressible, stored
    tr.add(0, "client:0", "server", "grad_V", {"items": np.arange(300), "values": grads})
    tr.add(0, "client:0", "client:0", "private", {"ratings": np.full(50, 4.0)})  # small: deflated
    path = tr.save(tmp_path / "t.ptx")
    with zipfile.ZipFile(path) as zf:
        kinds = {i.file_size: i.compress_type for i in zf.infolist() if i.filename.startswith("columns/")}
    assert kinds[grads.nbytes + 128] == zipfile.ZIP_STORED
    assert set(kinds.values()) == {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED}
    assert not load(path).messages[0].payload["values"].flags.writeable  # a read-only memory map
    back = load(path)
    assert np.array_equal(back.messages[0].payload["values"], grads)
    assert np.array_equal(back.messages[1].payload["ratings"], np.full(50, 4.0))


def test_npy_header_fast_path_agrees_with_numpy():
    from privaudit.transcript_io._safe import npy_header

    arrays = [
        np.zeros((167, 20)),
        np.arange(5, dtype=np.int64),
        np.float32(3.5) * np.ones(()),
        np.zeros((0, 3), dtype=np.uint8),
        np.ones((2, 3, 4), dtype=bool),
        np.asfortranarray(np.ones((3, 2), dtype=np.complex128)),
        np.zeros((4,), dtype=">i4"),
    ]
    for arr in arrays:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, arr)
        raw = buf.getvalue()
        ref = io.BytesIO(raw)
        np.lib.format.read_magic(ref)
        want = np.lib.format.read_array_header_1_0(ref)
        fast = io.BytesIO(raw)
        assert npy_header(fast) == want
        assert fast.tell() == ref.tell()  # left at the data
    # a header numpy accepts but that is not in its writer's form: numpy's parser decides
    header = b"{'shape':(2,),'fortran_order':False,'descr':'<f8'}"
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    raw = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    assert npy_header(io.BytesIO(raw)) == ((2,), False, np.dtype("<f8"))
    big = b"\x93NUMPY\x02\x00" + (20_000).to_bytes(4, "little") + b" " * 20_000
    with pytest.raises(ValueError, match="more than"):
        npy_header(io.BytesIO(big))
    with pytest.raises(EOFError):
        npy_header(io.BytesIO(b"\x93NUMPY\x01\x00\x50\x00{'descr'"))

"""Declared schemas: every simulated transcript (each protocol, each payload-changing defense)
validates, survives a save/load round trip, and each violation is refused in one line; atomic
saves and the bounded loaders."""

from __future__ import annotations

import json
import os
import re
import zipfile

import numpy as np
import pytest

from privaudit import _safejson, schema
from privaudit._escape import printable
from privaudit.errors import TranscriptError
from privaudit.experiment import run_transcript
from privaudit.params import parse_spec
from privaudit.plan import parse_assignments
from privaudit.transcript import Transcript, load

# (protocol, defenses, config): small runs; every defense that changes what is sent
SIMULATED = [
    ("fedmvmf", [], ["epochs=2"]),
    ("fedmvmf", [], ["epochs=2", "update=sgd", "unrated=inclunc"]),
    ("fedmvmf", ["laplace:scale=0.1"], ["epochs=2"]),
    ("fedmvmf", ["gaussian:scale=0.1"], ["epochs=2"]),
    ("fedmvmf", ["dp-laplace:epsilon=1"], ["epochs=2"]),
    ("fedmvmf", ["sampling:rho=1"], ["epochs=2"]),
    ("fedmvmf", ["secagg"], ["epochs=2"]),
    ("fedmvmf", ["paillier:key_length=512,insecure_test_key=true"], ["epochs=2"]),
    ("privmvmf", ["paillier:key_length=512,insecure_test_key=true"], ["epochs=2"]),
    ("fedsplit", [], []),
    ("fedsplit", ["laplace:scale=0.1"], []),
    ("fedncf", [], []),
    ("fedncf", [], ["model=neumf"]),
    ("fedncf", ["secagg"], []),
    ("fedncf", ["dp-sgd"], []),
    ("fedproto", [], []),
    ("fedproto", ["dp-prototypes"], []),
    ("fedrec", [], []),
    ("fedrec", [], ["model=svdpp-sgd"]),
    ("fedrec", ["sampling:rho=1"], []),
    ("fedrec", ["secagg"], []),
]


@pytest.mark.parametrize("protocol,defenses,sets", SIMULATED, ids=lambda v: ",".join(v) if isinstance(v, list) else v)
def test_simulated_transcripts_validate(tmp_path, protocol, defenses, sets):
    specs = [{"name": n, **p} for n, p in (parse_spec(d, "--defense") for d in defenses)]
    t = run_transcript(
        protocol=protocol, defenses=specs, protocol_config=parse_assignments(sets), data="synthetic", users=10
    ).transcript
    schema.validate(t)
    again = load(t.save(tmp_path / "t.ptx"))
    schema.validate(again)
    assert again.kinds() == t.kinds()


def test_csv_data_without_attributes_validates(tmp_path):
    """FedMVMF on a ratings CSV: no attribute columns (p = 0) is a valid dimension."""
    from tests.dummies import write_csv

    data = write_csv(tmp_path / "r.csv", 30)
    for protocol, sets in (("fedmvmf", ["epochs=2"]), ("fedrec", []), ("fedsplit", [])):
        schema.validate(
            run_transcript(protocol=protocol, protocol_config=parse_assignments(sets), data=data).transcript
        )


def _fedmvmf() -> Transcript:
    t = Transcript(
        "fedmvmf",
        {
            "K": 2,
            "n_items": 4,
            "attribute_names": ["a", "b"],
            "alpha": 1.0,
            "lam": 1.0,
            "update": "semials",
            "unrated": "obsonly",
            "rating_min": 1.0,
            "rating_max": 5.0,
        },
        0,
        {"users": 1, "items": 4},
        ["server", "client:0", "item-server"],
    )
    t.add(
        0,
        "client:0",
        "client:0",
        "private",
        {"items": np.array([1, 3]), "ratings": np.array([4.0, 5.0]), "attributes": np.array([0.0, 1.0])},
    )
    t.add(0, "server", "server", "state", {"V": np.ones((4, 2)), "P": np.ones((2, 2))})
    t.add(0, "client:0", "server", "grad_V", {"items": np.array([1, 3]), "values": np.ones((2, 2))})
    t.add(0, "client:0", "server", "grad_P", {"values": np.ones((2, 2))})
    return t


def test_hand_built_transcript_validates_and_each_violation_is_named():
    schema.validate(_fedmvmf())
    cases = {
        "id -1 is outside [0, 4)": lambda t: t.messages[2].payload.__setitem__("items", np.array([-1, 3])),
        "id 4 is outside": lambda t: t.messages[0].payload.__setitem__("items", np.array([1, 4])),
        "expected K = 2": lambda t: t.messages[3].payload.__setitem__("values", np.ones((2, 3))),
        "expected @r = 2": lambda t: t.messages[2].payload.__setitem__("values", np.ones((3, 2))),
        "NaN or infinite": lambda t: t.messages[1].payload.__setitem__("V", np.full((4, 2), np.nan)),
        "values outside [0, 1]": lambda t: t.messages[0].payload.__setitem__("attributes", np.array([0.0, 2.0])),
        "lacks 'K'": lambda t: t.config.pop("K"),
        "no 'grad_V' message": lambda t: t.messages.pop(2),
        "does not go from": lambda t: setattr(t.messages[3], "receiver", "client:0"),
        "not a party": lambda t: setattr(t.messages[3], "sender", "client:7"),
        "masked upload, but no defense the config lists declares masked uploads": lambda t: t.messages[3].meta.update(
            masked=True
        ),
        "encrypted upload, but no defense the config lists declares encrypted uploads": lambda t: t.messages[
            3
        ].meta.update(encrypted=True),
    }
    for expected, mutate in cases.items():
        t = _fedmvmf()
        mutate(t)
        with pytest.raises(TranscriptError, match=re.escape(expected)) as info:
            schema.validate(t)
        assert "\n" not in str(info.value)


def test_a_protocol_without_schema_is_refused(monkeypatch):
    from privaudit import registry

    cls = registry.get("protocol", "fedrec")
    monkeypatch.setattr(cls, "schema", None)
    with pytest.raises(TranscriptError, match="declares no transcript schema"):
        schema.validate(Transcript("fedrec"))


def test_failed_save_keeps_the_existing_file(tmp_path):
    path = tmp_path / "run.ptx"
    good = _fedmvmf()
    good.save(path)
    before = path.read_bytes()
    bad = _fedmvmf()
    bad.messages[0].meta["x"] = object()  # not JSON-able: save fails after the arrays are written
    with pytest.raises(TypeError):
        bad.save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ptx"]  # no temporary file left
    with pytest.raises(TranscriptError, match="cannot write"):
        good.save(tmp_path / "missing-folder" / "x.ptx")


def test_saved_file_has_normal_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = _fedmvmf().save(tmp_path / "run.ptx")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_bounded_json_limits():
    doc = b'{"a": [1, 2, {"b": "[[[[[["}]}'
    assert _safejson.loads(doc, max_bytes=100, max_depth=3) == {"a": [1, 2, {"b": "[[[[[["}]}
    with pytest.raises(_safejson.JSONLimitError, match="nested 4 levels"):
        _safejson.loads(b"[[[[]]]]", max_bytes=100, max_depth=3)
    with pytest.raises(_safejson.JSONLimitError, match="objects/arrays"):
        _safejson.loads(b"[" + b"{}," * 50 + b"{}]", max_bytes=1000, max_containers=10)
    with pytest.raises(_safejson.JSONLimitError, match="values"):
        _safejson.loads(b"[" + b"0," * 50 + b"0]", max_bytes=1000, max_values=10)
    with pytest.raises(_safejson.JSONLimitError, match="not UTF-8"):
        _safejson.loads(b'{"a": "\xff"}', max_bytes=100)
    with pytest.raises(_safejson.JSONLimitError, match="more than the limit of 5"):
        _safejson.loads(b"[1, 2, 3]", max_bytes=5)
    escaped = json.dumps('x\\"[[[')  # escaped quote inside a string with brackets after it
    assert _safejson.loads(escaped.encode(), max_bytes=100, max_depth=0) == 'x\\"[[['


def test_manifest_limit_scales_with_members(tmp_path):
    """A manifest of 2 MiB in an archive of 2 members is refused; the same with --max-bytes large
    but few members still is (the limit follows the member count, not only the budget)."""
    path = tmp_path / "m.ptx"
    m = {
        "format": "privaudit-transcript",
        "version": 1,
        "protocol": "fedmvmf",
        "messages": [],
        "config": {"pad": "x" * (2 * 2**20)},
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("manifest.json", json.dumps(m))
    for budget in (2**29, 2**33):
        with pytest.raises(TranscriptError, match="manifest.json declares"):
            load(path, max_bytes=budget)


def test_printable_escapes_controls():
    assert printable("a\x1b[2K\rb\nc\u202e") == "a\\x1b[2K\\x0db\\x0ac\\u202e"
    assert printable("plain ünïcode") == "plain ünïcode"


@pytest.mark.parametrize("value", ["nope", "0", "-5", "1.5G", ""])
def test_max_bytes_option_refuses_bad_sizes(capsys, value):
    from privaudit.cli import main

    with pytest.raises(SystemExit) as info:
        main(["inspect", "x.ptx", "--max-bytes", value])
    assert info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_max_bytes_units():
    from privaudit._cli_common import byte_size

    sizes = [byte_size(v) for v in ("512", "2K", "512M", "4G", "1GiB", "3mb")]
    assert sizes == [512, 2048, 512 * 2**20, 4 * 2**30, 2**30, 3 * 2**20]

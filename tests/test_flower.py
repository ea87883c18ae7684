"""The Flower recorder: schema maps, the private side channel, and a real simulation of the
FedAvg-MF reference app recorded and attacked (skipped without ``privaudit[flower]``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from privaudit import registry
from privaudit.cli import main
from privaudit.errors import PrivauditError
from privaudit.integrations.flower import load_app, merge_private, record, write_private
from privaudit.integrations.schema_map import SchemaMap, SchemaMapError
from privaudit.transcript import Transcript

APP = Path(__file__).resolve().parents[1] / "examples" / "flower-fedavg-mf"

MAP = {
    "kinds": [
        {"kind": "model", "direction": "down", "when": ["emb/V"], "payload": {"V": "emb/V"}},
        {
            "kind": "item_update",
            "direction": "up",
            "when": ["rows"],
            "payload": {"items": "rows/ids", "values": "rows/v"},
        },
    ]
}


# ------------------------------------------------------------------ schema maps (no flwr needed)


def test_schema_map_names_entries_and_rounds():
    sm = SchemaMap.from_dict(MAP)
    kind, payload, meta = sm.classify("up", "train", {"rows/ids": 1, "rows/v": 2, "metrics/n": 3})
    assert (kind, payload, meta) == ("item_update", {"items": 1, "values": 2, "metrics/n": 3}, {})
    assert sm.classify("down", "evaluate", {"x/y": 0})[0] == "flower.evaluate"
    assert sm.classify("up", "query", {})[0] == "flower.query.reply"
    assert sm.round_of("3", {}) == 2 and sm.round_of("", {}) is None
    assert SchemaMap.from_dict(sm.to_dict()) == sm


@pytest.mark.parametrize(
    "spec, message",
    [
        ({}, "lacks 'kinds'"),
        (
            {"kinds": [{"kind": "item_update", "direction": "up", "when": ["r"], "payload": {"items": "r/i"}}]},
            "(kind 'item_update') lacks payload 'values'",
        ),
        ({"kinds": [{"kind": "model", "when": ["r"]}]}, "kinds[0] lacks 'direction'"),
        (
            {"kinds": [{"kind": "model", "direction": "sideways", "when": ["r"], "payload": {"V": "r/V"}}]},
            "'direction' must be",
        ),
        ({"kinds": MAP["kinds"], "rounds": 1}, "unknown key 'rounds'"),
    ],
)
def test_schema_map_errors_name_what_is_missing(spec, message):
    with pytest.raises(SchemaMapError) as exc:
        SchemaMap.from_dict(spec)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(SchemaMapError, match="lacks a rule for kind 'grad_V'"):
        SchemaMap.from_dict(MAP).require("grad_V")


def test_private_side_channel_round_trip_and_refuses_pickles(tmp_path):
    write_private(tmp_path, 42, lambda: {"items": np.array([3, 1]), "ratings": np.array([4.0, 5.0])})
    write_private(tmp_path, 42, lambda: pytest.fail("written twice"))  # once per node
    got = merge_private(tmp_path)
    assert list(got) == [42] and got[42]["items"].tolist() == [3, 1] and got[42]["ratings"].tolist() == [4.0, 5.0]
    np.save(tmp_path / "private" / "42" / "items.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(PrivauditError, match="not a plain .npy array"):
        merge_private(tmp_path)
    with pytest.raises(PrivauditError, match="object array"):
        write_private(tmp_path, 7, lambda: {"x": np.array([None], dtype=object)})


def test_app_folder_is_validated(tmp_path):
    app = load_app(APP)
    assert app.schema.kinds[0].kind == "model" and app.private_data.endswith(":private_data")
    (tmp_path / "pyproject.toml").write_text('[tool.flwr.app.components]\nserverapp = "a:b"\nclientapp = "a:c"\n')
    assert load_app(tmp_path).schema.auto  # no map: the item-embedding matrix is detected by shape
    assert main(["record", "--flower", str(tmp_path / "nope"), "-o", str(tmp_path / "x.ptx")]) == 2


def test_record_without_flower_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr -> ImportError
    with pytest.raises(PrivauditError, match=r'pip install "privaudit\[flower\]"'):
        record(APP, clients=3, rounds=1)


def test_recorded_protocol_is_not_simulated(capsys):
    assert main(["run", "--protocol", "flower", "-o", "x.ptx"]) == 2
    assert "recorded, not simulated" in capsys.readouterr().err


# ------------------------------------------------------------------ a real Flower simulation


NO_FLOWER = 'Flower is not installed: pip install "privaudit[flower]"'


def _need_flower() -> None:
    pytest.importorskip("flwr", reason=NO_FLOWER)
    pytest.importorskip("ray", reason=NO_FLOWER)


@pytest.fixture(scope="module")
def recorded():
    """FedAvg-MF, 5 clients (the fewest a victim bootstrap gives a verdict on), 2 rounds,
    recorder and ground-truth Mod on."""
    _need_flower()
    return record(APP, clients=5, rounds=2)


def _evaluate(name: str, t: Transcript):
    return registry.get("attack", name)().evaluate(t, np.random.default_rng(0))


def test_transcript_of_a_recorded_run(recorded, tmp_path, capsys):
    t = recorded.transcript
    assert t.protocol == "flower" and t.parties == ["server"] + [f"client:{k}" for k in range(5)]
    kinds = t.kinds()
    assert kinds["private"] == 5 and kinds["item_update"] == 10 and kinds["model"] == 10
    assert t.rounds("item_update") == [0, 1]
    assert t.config["lr"] == 0.05 and t.config["n_items"] == 300 and t.config["defenses"] == []
    # the uploads are exactly the clients' train items (ground truth from the Mod)
    for m in t.select("item_update"):
        assert m.receiver == "server" and m.meta["values"] == "rows"
        assert np.array_equal(np.sort(m.payload["items"]), np.sort(t.private(m.sender)["items"]))
    path = t.save(tmp_path / "run.ptx")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "protocol    flower" in out and "item_update" in out and "private     included" in out


def test_generic_attacks_on_the_recorded_run(recorded):
    t = recorded.transcript
    items = _evaluate("generic-trained-items", t)
    assert items.metrics["precision"] >= 0.9 and items.metrics["recall"] >= 0.9
    prior = registry.get("attack", "generic-trained-items")().prior_baseline(t, {})
    assert items.metrics["f1"] > prior["f1"] + 0.3 and items.metrics["f1"] > items.baseline["f1"] + 0.5
    ratings = _evaluate("generic-mf-ratings", t)
    # one-step uploads: every client claimed, every rating exact
    assert ratings.metrics["claimed"] == 1.0 and ratings.metrics["accuracy"] == 1.0 and ratings.metrics["rmse"] == 0.0
    majority = registry.get("attack", "generic-mf-ratings")().prior_baseline(t, {})
    assert majority["accuracy"] < 0.6 and ratings.baseline["accuracy"] == pytest.approx(0.2)
    attrs = _evaluate("generic-attribute-inference", t)
    assert attrs.reconstruction.supported and attrs.metrics["targets"] + attrs.metrics["aux"] == 5


def test_audit_and_unscored_attack_from_the_cli(recorded, tmp_path, capsys):
    t = recorded.transcript
    full = t.save(tmp_path / "run.ptx")
    assert main(["audit", "--transcript", str(full), "--out", str(tmp_path / "aud")]) == 0
    out = capsys.readouterr().out
    assert "generic-mf-ratings            accuracy    1.000   0.200" in out
    rows = {r["attack"]: r for r in json.loads((tmp_path / "aud" / "audit.json").read_text())["rows"]}
    assert rows["generic-trained-items"]["verdict"] == "leaks" and rows["generic-mf-ratings"]["verdict"] == "leaks"
    bare = t.save(tmp_path / "bare.ptx", include_private=False)
    argv = ["attack", "--transcript", str(bare), "--attack", "generic-mf-ratings", "--out", str(tmp_path / "rec")]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "holds no private messages: nothing to score generic-mf-ratings against" in out[0]
    doc = json.loads((tmp_path / "rec" / "reconstruction.json").read_text())
    assert doc["scored"] is False and len(doc["victims"]) == 5
    assert main(["audit", "--transcript", str(bare), "--out", str(tmp_path / "aud2")]) == 0
    assert "unscored" in capsys.readouterr().out


@pytest.mark.slow
def test_recording_changes_nothing(recorded):
    _need_flower()
    plain = record(APP, clients=5, rounds=2, recorder=False)
    assert plain.transcript is None
    a = recorded.context.state.array_records["final-model"]["V"].numpy()
    b = plain.context.state.array_records["final-model"]["V"].numpy()
    assert a.shape == (300, 8) and np.array_equal(a, b)


@pytest.mark.slow
def test_secaggplus_hides_the_uploads():
    _need_flower()
    rec = record(APP, clients=3, rounds=2, run_config={"secaggplus": True})
    t = rec.transcript
    assert "item_update" not in t.kinds() and t.kinds()["masked_update"] == 6
    assert t.config["defenses"][0]["name"] == "flower-secaggplus"
    for name in ("generic-trained-items", "generic-mf-ratings", "generic-attribute-inference"):
        out = _evaluate(name, t)
        assert not out.reconstruction.supported and out.metrics == out.baseline
        assert "active defense: flower-secaggplus" in out.reconstruction.reason

"""Whole-matrix replies (Flower's stock FedAvg, no item ids, no schema map): detection of the
item-embedding matrix, conversion of the replies, and the generic attacks on them.

The fast tests simulate the plain FedAvg MF app (examples/flower-plain-mf: its numpy training
code, no Flower) and feed the recorder flattened messages as Flower's Grid would; the slow test
records the app itself under Flower's simulation engine.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from privaudit import registry
from privaudit.cli import main
from privaudit.integrations import dense
from privaudit.integrations.flower import FlowerRecorder, _Event, load_app, write_private
from privaudit.integrations.recorded import audit_transcript, format_audit
from privaudit.integrations.schema_map import SchemaMap, SchemaMapError
from privaudit.transcript import Transcript, load

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "flower-plain-mf"
NO_MATRIX_APP = Path(__file__).resolve().parent / "flower_no_matrix_app"
GENERIC = ("generic-trained-items", "generic-mf-ratings", "generic-mf-ratings-estimated", "generic-attribute-inference")


def _task():
    """The example app's numpy-only task module (its local training and data split)."""
    spec = importlib.util.spec_from_file_location("plain_mf_task", APP / "plain_mf" / "task.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TASK = _task()
CFG = {
    "lr": 0.05,
    "lam": 0.05,
    "ridge": 1.0,
    "local-epochs": 5,
    "batch-size": 16,
    "global-mean": 3.5,
    "data": "synthetic",
    "data-users": 60,
    "data-items": 120,
    "seed": 0,
    "dim": 8,
}


class _Ctx:
    def __init__(self, user: int, cfg: dict):
        self.node_config = {"partition-id": user}
        self.run_config = cfg


def simulate(
    tmp_path: Path,
    clients: int = 12,
    rounds: int = 2,
    updates: str = "rows",
    cfg: dict | None = None,
    schema: SchemaMap | None = None,
):
    """A transcript of the plain FedAvg MF app as the recorder builds it from Flower's messages:
    ``arrays/0`` (the whole item matrix) down in train and evaluate messages, the whole
    returned matrix (``updates="rows"``) or its difference to the sent one up, FedAvg weighted
    by ``num-examples``; group ids empty, the round in ``config/server-round``."""
    cfg = dict(CFG, **(cfg or {}))
    ds = TASK.dataset_of(cfg)
    V = TASK.init_items(0, ds.n_items, cfg["dim"])
    rec = FlowerRecorder(schema or SchemaMap.auto_map(), tmp_path)
    rec.start(cfg, TASK.public_info(cfg))
    nodes = [1000 + 7 * k for k in range(clients)]
    for user, node in enumerate(nodes):
        write_private(tmp_path, node, lambda user=user: TASK.private_data(_Ctx(user, cfg)))
    for rnd in range(1, rounds + 1):
        total, weight = np.zeros_like(V), 0.0
        for user, node in enumerate(nodes):
            rec.record([_message(node, "train", [V.copy()], {"server-round": rnd})], "down")
            (items, ratings), _ = TASK.user_split(ds, user, cfg["seed"])
            new, _, _ = TASK.local_train(V, items, ratings, cfg, np.random.default_rng([user, rnd]))
            back = new if updates == "rows" else new - V
            rec.record([_message(node, "train", [back], metrics={"num-examples": int(items.size)})], "up")
            total += items.size * new
            weight += items.size
        V = total / weight
        for node in nodes:  # evaluate messages carry the aggregated matrix, replies only metrics
            rec.record([_message(node, "evaluate", [V.copy()], {"server-round": rnd})], "down")
            rec.record([_message(node, "evaluate", [], metrics={"eval-rmse": 1.0})], "up")
    return rec.transcript(app="plain-mf-sim", seed=0)


class _Array:
    def __init__(self, a: np.ndarray):
        self._a = a

    def numpy(self) -> np.ndarray:
        return self._a


def _message(node: int, mtype: str, arrays: list, config: dict | None = None, metrics: dict | None = None):
    """A stand-in for a Flower Message of the stock strategies: ``ArrayRecord([...])`` under
    "arrays", the config under "config", an empty group id."""
    from types import SimpleNamespace

    md = SimpleNamespace(dst_node_id=node, src_node_id=node, message_type=mtype, group_id="")
    content = SimpleNamespace(
        array_records={"arrays": {str(i): _Array(a) for i, a in enumerate(arrays)}} if arrays else {},
        config_records={"config": config} if config else {},
        metric_records={"metrics": metrics} if metrics else {},
    )
    return SimpleNamespace(metadata=md, content=content, has_error=lambda: False)


def _evaluate(name: str, t: Transcript):
    return registry.get("attack", name)().evaluate(t, np.random.default_rng(0))


# ------------------------------------------------------------------ detection and conversion


def test_dense_schema_map_round_trips_and_names_its_errors():
    sm = SchemaMap.from_dict({"item-embeddings": "arrays/0", "user-params": ["arrays/1"]})
    assert sm.dense and not sm.auto and SchemaMap.from_dict(sm.to_dict()) == sm
    # the dense rules are for the recorded schema only: messages are converted by dense.py
    assert sm.classify("up", "train", {"arrays/0": 1})[0] == "flower.train.reply"
    assert {(r.kind, r.direction) for r in sm.kinds} == {("model", "down"), ("item_update", "up")}
    assert SchemaMap.auto_map().round_of("", {"config/server-round": 3}) == 2
    for spec, message in [
        ({"updates": "rows"}, "'updates' needs 'item-embeddings'"),
        ({"item-embeddings": ["auto", "arrays/0"]}, "either"),
        ({"item-embeddings": "arrays/0", "updates": "sums"}, "'updates' must be one of"),
        ({"item-embeddings": 3}, "'item-embeddings' must name entries"),
    ]:
        with pytest.raises(SchemaMapError, match=message):
            SchemaMap.from_dict(spec)


def test_detect_picks_the_matrix_with_n_items_rows_sent_and_returned():
    V, bias, head = np.zeros((50, 4)), np.zeros(50), np.zeros((4, 4))
    ev = [
        _Event("down", 1, 0, "flower.train", {"arrays/0": V, "arrays/1": bias, "arrays/2": head}, {}),
        _Event("up", 1, 0, "flower.train.reply", {"arrays/0": V, "arrays/1": bias, "arrays/2": head}, {}),
        _Event("down", 1, 0, "flower.evaluate", {"arrays/0": V}, {}),
    ]
    assert dense.detect(ev, 50) == ("train", ("arrays/0",))
    assert dense.detect(ev, 51) == ("", ())
    assert dense.detect(ev, None) == ("train", ("arrays/0",))  # the largest 2-D float array
    # NCF-like: two item tables side by side, in the order of their keys
    ncf = [_Event(d, 1, 0, k, {"arrays/10": V, "arrays/2": V[:, :2]}, {}) for d, k in DIRS]
    assert dense.detect(ncf, 50) == ("train", ("arrays/2", "arrays/10"))
    assert dense.updates_mode([(np.ones((3, 2)), np.array([[1, 1], [2, 2], [1, 1.0]]))]) == "rows"
    assert dense.updates_mode([(np.ones((3, 2)), np.array([[0, 0], [2, 2], [0, 0.0]]))]) == "deltas"


DIRS = (("down", "flower.train"), ("up", "flower.train.reply"))


@pytest.mark.parametrize("updates", ["rows", "deltas"])
def test_whole_matrix_replies_become_item_updates_of_the_changed_rows(tmp_path, updates):
    t = simulate(tmp_path, clients=4, rounds=2, updates=updates)
    assert t.config["dense"]["entries"] == ["arrays/0"] and t.config["dense"]["updates"] == updates
    assert t.config["schema_map"]["item-embeddings"] == ["arrays/0"]
    ups = t.select("item_update")
    assert len(ups) == 8 and {m.round for m in ups} == {0, 1}
    for m in ups:
        truth = np.sort(t.private(m.sender)["items"])
        assert np.array_equal(m.payload["items"], truth) and m.meta["values"] == updates
        assert m.payload["values"].shape == (truth.size, CFG["dim"])
    # the sent model is known per round (train messages only; evaluate messages stay as they were)
    models = [m for m in t.select("state") if m.meta["of"] == "model"]
    assert len(models) == 2 and len(t.select("flower.evaluate")) == 8
    t2 = load(t.save(tmp_path / "run.ptx"))  # the recorded protocol's schema admits it
    assert len(t2.select("item_update")) == 8


def test_a_dense_map_names_the_matrix_and_the_update_form(tmp_path):
    sm = SchemaMap.from_dict({"item-embeddings": "arrays/0", "updates": "deltas"})
    t = simulate(tmp_path, clients=3, rounds=1, updates="deltas", schema=sm)
    assert t.config["dense"] == {
        "entries": ["arrays/0"],
        "message_type": "train",
        "updates": "deltas",
        "converted": 3,
        "detected": False,
    }
    for m in t.select("item_update"):
        assert np.array_equal(m.payload["items"], np.sort(t.private(m.sender)["items"]))


MODEL_RULE = {"kind": "model", "direction": "down", "message-type": "train", "when": ["arrays/0"]}


@pytest.mark.parametrize(
    "kinds",
    [
        [{**MODEL_RULE, "payload": {"V": "arrays/0"}}],  # a model rule only: replies return its V entry
        [
            {**MODEL_RULE, "payload": {"V": "arrays/0"}},
            {"kind": "item_update", "direction": "up", "when": ["arrays/0"], "payload": {"values": "arrays/0"}},
        ],  # an item_update rule naming only values (the app has no ids)
    ],
)
def test_kinds_maps_of_whole_matrix_apps_are_converted(tmp_path, kinds):
    sm = SchemaMap.from_dict({"kinds": kinds})
    assert sm.whole_matrix and not sm.dense
    t = load(simulate(tmp_path, clients=4, rounds=1, schema=sm).save(tmp_path / "run.ptx"))
    assert t.config["dense"]["converted"] == 4 and t.config["dense"]["updates"] == "rows"
    for m in t.select("item_update"):
        assert np.array_equal(m.payload["items"], np.sort(t.private(m.sender)["items"]))
    assert _evaluate("generic-trained-items", t).metrics["f1"] == 1.0


def test_several_item_tables_are_side_by_side(tmp_path):
    """NCF-like replies: two item tables (GMF width 2, MLP width 3) and a head; one client
    trains items 1 and 4 in the first table and item 2 in the second."""
    gmf, mlp, head = np.zeros((6, 2)), np.ones((6, 3)), np.zeros(4)
    new_gmf, new_mlp = gmf.copy(), mlp.copy()
    new_gmf[[1, 4]] += 0.5
    new_mlp[2] -= 0.25
    down = {"arrays/0": gmf, "arrays/1": mlp, "arrays/2": head}
    up = {"arrays/0": new_gmf, "arrays/1": new_mlp, "arrays/2": head + 1}
    events = [_Event("down", 1, 0, "flower.train", down, {}), _Event("up", 1, 0, "flower.train.reply", up, {})]
    out, schema, summary = dense.convert(events, SchemaMap.auto_map(), {"n_items": 6})
    assert summary["entries"] == ["arrays/0", "arrays/1"] and schema.item_embeddings == ("arrays/0", "arrays/1")
    assert out[0].kind == "model" and out[0].payload["V"].shape == (6, 5) and "arrays/2" in out[0].payload
    assert out[1].kind == "item_update" and out[1].payload["items"].tolist() == [1, 2, 4]
    assert np.array_equal(out[1].payload["values"], np.hstack([new_gmf, new_mlp])[[1, 2, 4]])
    assert events[1].kind == "flower.train.reply"  # the input is not modified
    # a map naming an entry no reply returns converts nothing and says so
    _, _, summary = dense.convert(events, SchemaMap.from_dict({"item-embeddings": "arrays/7"}), {})
    assert summary["converted"] == 0 and "no 'train' reply returns arrays/7" in summary["reason"]


# ------------------------------------------------------------------ the attacks on whole-matrix replies


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return simulate(tmp_path_factory.mktemp("plain"))


def test_trained_items_from_whole_matrix_replies(plain):
    out = _evaluate("generic-trained-items", plain)
    assert out.metrics["precision"] >= 0.95 and out.metrics["recall"] >= 0.95
    assert out.metrics["f1"] > out.baseline_prior["f1"] + 0.2


def test_mf_ratings_with_local_epochs_l2_and_a_public_mean(plain):
    out = _evaluate("generic-mf-ratings", plain)
    # clients without a rating of 1 have an exact mirror under mean 3.5 (see below): not claimed
    assert out.metrics["accuracy"] >= 0.9 and out.metrics["accuracy_claimed"] == 1.0 and out.metrics["claimed"] >= 0.5
    assert out.metrics["accuracy"] > out.baseline_prior["accuracy"] + 0.3
    # a one-step decode (the old model) is wrong on the same uploads: the local epochs matter
    wrong = copy.copy(plain)
    wrong.config = {**plain.config, "local_steps": 1}
    one_step = _evaluate("generic-mf-ratings", wrong).metrics
    assert one_step["claimed"] == 0 and one_step["accuracy"] < 0.7


def test_mirrored_ratings_fit_too_when_the_mean_makes_the_grid_symmetric():
    """(u, y) and (-u, -y) upload the same rows: with mean 3.5 and no rating of 1 both signs sit
    on the grid, so the decode is not claimed (the tie goes to more ratings above the mean)."""
    from privaudit.attacks.generic.mf_ratings import LocalSteps, decode

    rng = np.random.default_rng(3)
    V0, u = rng.normal(0, 0.1, (30, 8)), rng.normal(0, 1, 8)
    r = rng.choice([2.0, 3.0, 4.0, 4.0, 5.0, 5.0], 30)
    hp = LocalSteps(0.05, 0.05, 5)
    for mu, unique in ((3.5, False), (3.53, True)):
        V = V0.copy()
        for _ in range(hp.steps):
            V -= hp.lr * (-np.outer(r - mu - V @ u, u) + hp.lam * V)
        y, res, other, rank = decode(hp.change(V0, V - V0), V0, np.arange(1.0, 6.0) - mu, hp)
        assert res < 1e-6 and rank < 1e-9 and np.allclose(y + mu, r) and (other >= 1e-3) == unique


def test_mf_ratings_estimated_without_public_hyperparameters(plain):
    hidden = copy.copy(plain)
    drop = ("lr", "lam", "local_steps", "flower_run_config")  # the run config names them too
    hidden.config = {k: v for k, v in plain.config.items() if k not in drop}
    ok, reason = registry.get("attack", "generic-mf-ratings")().applicable(hidden.view("server"))
    assert not ok and "the clients' learning rate (looked for 'lr', 'learning-rate'" in reason
    out = _evaluate("generic-mf-ratings-estimated", hidden)
    assert out.metrics["accuracy"] >= 0.9 and out.metrics["accuracy"] > out.baseline_prior["accuracy"] + 0.3
    decay = (1 - CFG["lr"] * CFG["lam"]) ** CFG["local-epochs"]
    assert out.reconstruction.meta["decay"] == pytest.approx(decay, abs=1e-6)


def test_mf_ratings_estimated_fits_one_mean_for_every_client():
    """A mean fitted per client is ambiguous by whole steps (ratings 2..5 decode as well as 1..4)
    and mirrored about the grid's centre; the mean the clients share is not: it is found to 1e-6
    and every client, the one rating only 3..5 and the one rating 2..5 too, decodes exactly."""
    from types import SimpleNamespace

    from privaudit.attacks.generic.mf_ratings import EstimatedSteps, LocalSteps, estimate_common_mean, estimate_decay

    rng, hp, mu = np.random.default_rng(5), LocalSteps(0.05, 0.05, 3), 3.53
    ups, truth = {}, {}
    for c, low in enumerate([1, 1, 1, 1, 1, 2, 3, 1]):
        V0, u = rng.normal(0, 0.1, (40, 8)), rng.normal(0, 1, 8)
        u = u / np.linalg.norm(u) * rng.uniform(0.5, 2.0)
        r = rng.integers(low, 6, 40).astype(float)
        r[:2] = (low, 5)
        V = V0.copy()
        for _ in range(hp.steps):
            V -= hp.lr * (-np.outer(r - mu - V @ u, u) + hp.lam * V)
        ups[f"client:{c}"] = [SimpleNamespace(sent=V0, delta=V - V0, items=np.arange(40))]
        truth[f"client:{c}"] = r
    grid = np.arange(1.0, 6.0)
    est = EstimatedSteps(*estimate_decay(ups), fit_mean=True)
    assert est.decay == pytest.approx(hp.decay, abs=1e-6)
    common = estimate_common_mean(ups, est, grid)
    assert common == pytest.approx(mu, abs=1e-6)
    known = EstimatedSteps(est.decay, est.rank_ratio)
    for party, (up,) in ups.items():
        y, res, *_ = known.decode(known.change(up.sent, up.delta), up.sent, grid - common)
        assert res < 1e-6 and np.allclose(y + common, truth[party]), party
    # clients centring by their own means share none: each keeps its own
    own = {}
    for party, (up,) in ups.items():
        r, V0 = truth[party], up.sent
        u = rng.normal(0, 1, 8)
        V = V0.copy()
        for _ in range(hp.steps):
            V -= hp.lr * (-np.outer(r - r.mean() - V @ u, u) + hp.lam * V)
        own[party] = [SimpleNamespace(sent=V0, delta=V - V0, items=np.arange(40))]
    assert estimate_common_mean(own, est, grid) is None
    assert estimate_common_mean({}, est, grid) is None


def test_an_app_without_an_item_matrix_is_not_applicable_with_the_reason(tmp_path):
    rec = FlowerRecorder(SchemaMap.auto_map(), tmp_path)
    rec.start({}, {"n_items": 30})
    for node in (5, 9, 13):
        write_private(tmp_path, node, lambda: {"items": np.arange(3), "ratings": np.ones(3)})
        rec.events.append(_Event("down", node, 0, "flower.train", {"arrays/0": np.zeros((3, 3))}, {}))
        rec.events.append(_Event("up", node, 0, "flower.train.reply", {"arrays/0": np.ones((3, 3))}, {}))
    t = rec.transcript(app="numpy-template")
    rows = {r["attack"]: r for r in audit_transcript(t)["rows"]}
    for name in GENERIC:
        assert rows[name]["verdict"] == "not applicable"
        assert "no item-embedding matrix: no 2-D float array with n_items = 30 rows" in rows[name]["reason"]


def test_load_app_without_a_schema_table():
    app = load_app(APP)
    assert app.schema.auto and app.public_info == "plain_mf.task:public_info"
    assert "schema" not in (APP / "pyproject.toml").read_text().split("[tool.privaudit]")[1]


# ------------------------------------------------------------------ real Flower runs (slow)


def _need_flower() -> None:
    pytest.importorskip("flwr", reason='Flower is not installed: pip install "privaudit[flower]"')
    pytest.importorskip("ray", reason='Flower is not installed: pip install "privaudit[flower]"')


@pytest.mark.slow
def test_record_and_audit_the_plain_app(tmp_path, capsys, ml100k_path):
    """6 MovieLens users, 2 rounds of the stock FedAvg app, recorded with the CLI, audited."""
    _need_flower()
    ptx = tmp_path / "run.ptx"
    argv = ["record", "--flower", str(APP), "--clients", "6", "--rounds", "2", "-o", str(ptx)]
    assert main([*argv, "--run-config", f"data={ml100k_path}", "--cpus-per-client", "1"]) == 0
    capsys.readouterr()
    assert main(["audit", "--transcript", str(ptx), "--out", str(tmp_path / "audit")]) == 0
    out = capsys.readouterr().out
    rows = {r["attack"]: r for r in json.loads((tmp_path / "audit" / "audit.json").read_text())["rows"]}
    items, ratings = rows["generic-trained-items"], rows["generic-mf-ratings"]
    assert items["metrics"]["precision"] >= 0.95 and items["metrics"]["recall"] >= 0.95
    assert ratings["metrics"]["accuracy"] >= 0.9
    assert items["verdict"] == "leaks" and ratings["verdict"] == "leaks" and "leaks" in out


@pytest.mark.slow
def test_record_an_app_without_an_item_matrix(tmp_path, capsys):
    """A NumPy-template-like app (a small dense model, no item table) records and is reported
    not applicable by every attack, with the reason."""
    _need_flower()
    ptx = tmp_path / "run.ptx"
    argv = ["record", "--flower", str(NO_MATRIX_APP), "--clients", "3", "--rounds", "1", "-o", str(ptx)]
    assert main([*argv, "--cpus-per-client", "1"]) == 0
    t = load(ptx)
    assert t.config["dense"]["entries"] == [] and t.select("flower.train.reply")
    rows = audit_transcript(t)["rows"]
    assert rows and all(r["verdict"] == "not applicable" for r in rows), format_audit({"rows": rows})
    assert all("no item-embedding matrix" in r["reason"] for r in rows if r["attack"] in GENERIC)
    sys.modules.pop("no_matrix_app", None)

"""Model inconsistency against Flower's SecAgg+ (examples/flower-secagg-malicious-mf): the
neutral model, the ``flower-model-inconsistency`` attack on hand-built and recorded
transcripts, and the ``model_consistency_mod`` countermeasure."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from privaudit import registry
from privaudit.transcript import Transcript

APP = Path(__file__).resolve().parents[1] / "examples" / "flower-secagg-malicious-mf"
STEP = 16.0 / 4194304  # SecAgg+ quantization step: 2 clipping_range / target_range
SECAGG = {"name": "flower-secaggplus", "clipping_range": 8.0, "target_range": 4194304}


def _task():
    sys.path.insert(0, str(APP))
    try:
        return importlib.import_module("secagg_mal_mf.task")
    finally:
        sys.path.remove(str(APP))


def _evaluate(t: Transcript, **params):
    return registry.get("attack", "flower-model-inconsistency")(**params).evaluate(t, np.random.default_rng(0))


def _run(n_clients=6, m=120, k=8, plan="inconsistent", aggregate=True, seed=0) -> Transcript:
    """One SecAgg+ round of the example's clients (its ``local_train``), as the recorder writes
    it: the server's ``state`` of each distinct model sent (with receivers), the secure sum
    with SecAgg+'s quantization noise, and each client's private train items and ratings.
    Item popularity is skewed, so the popularity prior is a real competitor."""
    task = _task()
    rng = np.random.default_rng(seed)
    lr, lam = 0.05, 0.01
    cfg = {"lr": lr, "lam": lam, "local_steps": 1, "n_items": m, "rating_min": 1.0, "rating_max": 5.0}
    cfg["rating_step"], cfg["defenses"] = 1.0, [SECAGG]
    parties = [f"client:{c}" for c in range(n_clients)]
    t = Transcript("flower", config=cfg, parties=["server", *parties])
    V, h = rng.normal(0.0, 0.1, (m, k)), np.ones(k)
    weights = 1.0 / np.arange(1, m + 1)
    total_V = np.zeros((m, k))
    sent = {}
    for c, party in enumerate(parties):
        items = np.sort(rng.choice(m, size=int(rng.integers(10, 25)), replace=False, p=weights / weights.sum()))
        ratings = rng.integers(1, 6, items.size).astype(float)
        t.add(0, party, party, "private", {"items": items, "ratings": ratings})
        crafted = plan == "inconsistent" and c != 0  # client:0 is the target
        Vc, hc = (np.zeros_like(V), np.zeros_like(h)) if crafted else (V, h)
        sent.setdefault(crafted, (Vc, hc, []))[2].append(party)
        _, V_new, _ = task.local_train(rng.normal(0.0, 0.1, k), Vc, hc, items, ratings, lr, lam, 1)
        total_V += V_new - Vc + rng.uniform(-STEP, STEP, (m, k))  # stochastic rounding of each value
    for Vc, hc, to in sent.values():
        t.add(0, "server", "server", "state", {"V": Vc, "h": hc}, {"of": "model", "to": to})
        for party in to:
            t.add(0, "server", party, "model", {"V": Vc, "h": hc})
    if aggregate:
        t.add(0, "server", "server", "state", {"V": total_V, "h": np.zeros(k)}, {"of": "aggregate", "n": n_clients})
    return t


def test_the_neutral_model_leaves_every_upload_unchanged():
    task = _task()
    rng = np.random.default_rng(1)
    V, h = np.zeros((30, 4)), np.zeros(4)
    u0 = rng.normal(size=4)
    u, V_new, h_new = task.local_train(u0, V, h, np.array([2, 5, 7]), np.array([5.0, 1.0, 3.0]), 0.1, 0.01, 5)
    assert not V_new.any() and not h_new.any()
    assert np.allclose(u, u0 * (1 - 0.1 * 0.01) ** 5)  # only the private u decays
    _, V_true, _ = task.local_train(u0, rng.normal(size=(30, 4)), np.ones(4), np.array([2]), np.array([5.0]), 0.1, 0, 1)
    assert V_true.any()  # the real model does move


def test_the_secure_sum_is_the_targets_delta():
    out = _evaluate(_run())
    assert out.reconstruction.supported
    assert list(out.reconstruction.victims) == ["client:0"]
    assert out.metrics["precision"] == 1.0 and out.metrics["recall"] == 1.0
    assert out.metrics["rating_accuracy"] == 1.0
    assert out.metrics["rounds_used"] == 1.0 and out.metrics["sybils"] == 0.0
    prior = out.baseline_prior
    assert out.metrics["f1"] >= prior["f1"] + 0.3 and out.metrics["f1"] > out.baseline["f1"]
    assert out.metrics["rating_accuracy"] > prior["rating_accuracy"]
    roc = out.decisions["positive"]
    assert roc.groups is not None and roc.labels.sum() == out.reconstruction.victims["client:0"]["items"].size


def test_consistent_models_are_not_applicable():
    out = _evaluate(_run(plan="honest"))
    assert not out.reconstruction.supported
    assert "same model" in out.reconstruction.reason


def test_an_aborted_round_leaves_nothing():
    t = _run(aggregate=False)
    t.add(0, "client:1", "server", "flower.error", {}, {"error": "model-consistency: 2 different models"})
    out = _evaluate(t)
    assert not out.reconstruction.supported and "aborted" in out.reconstruction.reason


def _message(stage: str, V: np.ndarray | None, group: str = "1"):
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    content = RecordDict({"secaggplus_configs": ConfigRecord({"stage": stage})})
    if V is not None:
        content["fitins.parameters"] = ArrayRecord({"0": Array(V)})
    # the Mod reads only the content and the run and round ids (a Message needs a running SuperLink)
    return SimpleNamespace(content=content, metadata=SimpleNamespace(run_id=7, group_id=group))


def test_the_consistency_mod_refuses_to_unmask_on_different_models(tmp_path):
    pytest.importorskip("flwr")
    from privaudit.integrations.flower_consistency import model_consistency_mod

    mod = model_consistency_mod(tmp_path)
    calls = []

    def call_next(msg, ctx):
        calls.append(ctx.node_id)
        return msg

    def node(k):
        return SimpleNamespace(node_id=k)

    V = np.arange(6.0).reshape(3, 2)
    for k in (1, 2):
        mod(_message("collect_masked_vectors", V), node(k), call_next)
    mod(_message("unmask", None), node(1), call_next)  # same digests: passes
    assert calls == [1, 2, 1]
    # a third client given another model, under another group id (the server's to choose)
    mod(_message("collect_masked_vectors", np.zeros_like(V), group="1b"), node(3), call_next)
    with pytest.raises(RuntimeError, match="1 of 2 other clients received another model"):
        mod(_message("unmask", None), node(1), call_next)
    # the next round: node 1 alone has posted a second digest, nothing to compare yet
    mod(_message("collect_masked_vectors", V, group="2"), node(1), call_next)
    mod(_message("unmask", None, group="2"), node(1), call_next)
    assert calls[-1] == 1


@pytest.mark.slow
def test_recorded_malicious_server_app(tmp_path):
    pytest.importorskip("flwr")
    from privaudit.integrations.flower import record

    honest = record(APP, clients=4, rounds=2).transcript
    assert not _evaluate(honest).reconstruction.supported
    generic = registry.get("attack", "generic-trained-items")().evaluate(honest, np.random.default_rng(0))
    assert not generic.reconstruction.supported  # masked uploads under SecAgg+
    mal = record(APP, clients=4, rounds=2, run_config={"server-plan": "inconsistent", "target": 2}).transcript
    out = _evaluate(mal)
    assert list(out.reconstruction.victims) == ["client:2"]
    assert out.metrics["precision"] >= 0.9 and out.metrics["recall"] >= 0.9
    assert out.metrics["f1"] > out.baseline_prior["f1"]
    board = tmp_path / "board"
    overrides = {"server-plan": "inconsistent", "consistency-bulletin": str(board)}
    checked = record(APP, clients=4, rounds=2, run_config=overrides).transcript
    aborted = _evaluate(checked)
    assert not aborted.reconstruction.supported and "aborted" in aborted.reconstruction.reason


@pytest.mark.parametrize(
    "edit, reason",
    [
        (lambda agg: agg.payload.update(V=agg.payload["V"][:, :-1]), "readable aggregate"),
        (lambda agg: agg.payload.update(V=np.full_like(agg.payload["V"], np.nan)), "readable aggregate"),
        (lambda agg: agg.payload.pop("V"), "readable aggregate"),
        (lambda agg: agg.meta.update(n="many"), ""),  # an invalid count falls back to the receivers
    ],
)
def test_a_malformed_aggregate_is_refused_in_one_line(edit, reason):
    t = _run()
    agg = next(m for m in t.messages if m.kind == "state" and m.meta.get("of") == "aggregate")
    edit(agg)
    out = _evaluate(t)
    if reason:
        assert not out.reconstruction.supported and reason in out.reconstruction.reason
        assert "\n" not in out.reconstruction.reason
    else:
        assert out.metrics["precision"] == 1.0 and out.metrics["recall"] == 1.0


def test_a_wrong_item_count_is_refused():
    t = _run()
    t.config["n_items"] = 10**6
    out = _evaluate(t)
    assert not out.reconstruction.supported and "n_items" in out.reconstruction.reason


def test_the_transcript_audit_keeps_the_threat_axis_asked_for(tmp_path, capsys):
    from privaudit.cli import main

    t = _run()
    from privaudit.integrations.flower import load_app

    t.config["schema_map"] = load_app(APP).schema.to_dict()  # as the recorder writes it
    ptx = t.save(tmp_path / "mal.ptx")
    assert main(["audit", "--transcript", str(ptx), "--threat", "malicious", "--out", str(tmp_path / "m")]) == 0
    rows = capsys.readouterr().out
    assert "flower-model-inconsistency" in rows and "generic-trained-items" not in rows
    assert (
        main(["audit", "--transcript", str(ptx), "--threat", "honest-but-curious", "--out", str(tmp_path / "h")]) == 0
    )
    rows = capsys.readouterr().out
    assert "flower-model-inconsistency" not in rows and "generic-trained-items" in rows

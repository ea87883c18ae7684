"""Active data manipulation on FedNCF (server=saturate, ncf-active-saturation) and feature-bounds."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from privaudit import registry  # noqa: E402
from privaudit.attacks.ncf.active_saturation import NCFActiveSaturation, NCFUnitSaturation  # noqa: E402
from privaudit.attacks.ncf.malicious import DEVIATIONS  # noqa: E402
from privaudit.attacks.ncf.update_leak import NCFUpdateLeak  # noqa: E402
from privaudit.data import synthetic  # noqa: E402
from privaudit.defenses.consistency import ModelConsistency  # noqa: E402
from privaudit.defenses.feature_bounds import FeatureBounds  # noqa: E402
from privaudit.defenses.secagg import SecAgg  # noqa: E402
from privaudit.errors import PrivauditError  # noqa: E402
from privaudit.metrics import roc_summary  # noqa: E402
from privaudit.protocols.fedncf import FedNCF  # noqa: E402


@pytest.fixture(scope="module")
def ds():
    return synthetic(n_users=40, n_items=120, seed=3)


def _run(ds, defenses=(), **cfg):
    config = {"server": "saturate", "clients_per_round": 4, "global_rounds": 0, "deviation_rounds": 2, **cfg}
    return FedNCF().run(ds, config, list(defenses), rng=0).transcript


def _evaluate(transcript, **params):
    return NCFActiveSaturation(**params).evaluate(transcript, np.random.default_rng(0))


@pytest.mark.parametrize("model", ["gmf", "mlp", "neumf"])
def test_one_saturated_round_reveals_the_target_positives_in_its_upload(ds, model):
    tr = _run(ds, model=model)
    out = _evaluate(tr, rounds=1)
    assert out.reconstruction.meta["source"] == "upload"
    assert out.metrics["precision"] == 1.0 and out.metrics["recall"] == 1.0
    assert out.metrics["rounds_used"] == 1 and out.metrics["sybils"] == 0
    # the same round read as an honest server (every uploaded row: positives and ~4x negatives)
    assert out.metrics["honest_f1"] < 0.5
    assert out.metrics["f1"] > out.baseline_prior["f1"] + 0.5
    assert out.metrics["f1"] > out.baseline["f1"] + 0.5
    roc = roc_summary(out.decisions["positive"].labels, out.decisions["positive"].scores)
    assert roc["auc"] == 1.0 and roc["tpr@0.01"] == 1.0
    assert out.victims is not None
    assert out.victims.value("f1") == out.metrics["f1"]
    assert out.victims.value("f1", "prior") == pytest.approx(out.baseline_prior["f1"])
    state = [m for m in tr.messages if m.kind == "state" and (m.meta or {}).get("deviation")]
    assert {m.meta["deviation"] for m in state} == {"saturate"} and "predict.bias -50" in state[0].meta["crafted"]


def test_secure_aggregate_of_a_small_cohort_leaks_and_the_honest_reading_does_not(ds):
    tr = _run(ds, [SecAgg()], clients_per_round=2, deviation_rounds=5)
    assert NCFUpdateLeak().applicable(tr.view("server"))[0] is False  # masked uploads
    out = _evaluate(tr)
    assert out.reconstruction.meta["source"] == "aggregate" and out.metrics["rounds_used"] == 4
    assert out.metrics["recall"] == 1.0 and out.metrics["precision"] >= 0.9
    assert out.metrics["f1"] >= out.baseline_prior["f1"] + 0.4
    # an honest server's reading of the same aggregates (rows in counts) stays near the prior
    assert out.metrics["honest_f1"] <= out.baseline_prior["f1"] + 0.1
    one = _evaluate(tr, rounds=1)  # one round: the union of the two members' positives
    assert one.metrics["recall"] == 1.0 and one.metrics["precision"] < out.metrics["precision"]


def test_a_consistent_crafted_model_passes_the_consistency_check(ds):
    check = ModelConsistency(min_cohort=2)
    out = _evaluate(_run(ds, [check, SecAgg()], clients_per_round=2, deviation_rounds=3))
    assert out.reconstruction.supported and out.metrics["f1"] >= out.baseline_prior["f1"] + 0.4
    # the default min_cohort (5) aborts the two-member rounds: nothing to read
    small = _evaluate(_run(ds, [ModelConsistency(), SecAgg()], clients_per_round=2, deviation_rounds=3))
    assert not small.reconstruction.supported and "fewer than min_cohort 5" in small.reconstruction.reason


def test_honest_plan_and_bounds_within_range_leave_the_run_unchanged(ds):
    base = {"clients_per_round": 8, "global_rounds": 1}
    a = FedNCF().run(ds, base, [], rng=0)
    b = FedNCF().run(ds, {**base, "craft_items": "keep", "craft_bias": 7.0}, [], rng=0)
    c = FedNCF().run(ds, base, [FeatureBounds(max_norm=100.0)], rng=0)  # the default max_bias 5 too
    for other in (b, c):
        np.testing.assert_array_equal(a.model["items"], other.model["items"])
        assert a.utility["hr@10"] == other.utility["hr@10"]
    assert not any((m.meta or {}).get("deviation") for m in a.transcript.messages)
    assert not NCFActiveSaturation().applicable(a.transcript.view("server"))[0]


def test_feature_bounds_clip_rows_and_bias():
    rng = np.random.default_rng(0)
    items = rng.normal(size=(50, 6)).astype(np.float32)
    out = FeatureBounds(max_norm=1.5, max_bias=2.0).on_download({"items": items, "bias": np.array([-9.0])}, None)
    norms = np.linalg.norm(items.astype(np.float64), axis=1)
    got = np.linalg.norm(out["items"].astype(np.float64), axis=1)
    np.testing.assert_allclose(got, np.minimum(norms, 1.5), rtol=1e-6)
    cos = np.sum(out["items"] * items, axis=1) / (got * norms)
    np.testing.assert_allclose(cos, 1.0, rtol=1e-6)  # clipping keeps each row's direction
    assert out["bias"].tolist() == [-2.0]
    assert registry.get("defense", "feature-bounds").capabilities == {"download"}


@pytest.mark.parametrize(
    "bounds, closed",
    [({"max_norm": 0.5, "max_bias": -1.0}, False), ({"max_bias": 20.0}, False), ({"max_bias": 10.0}, True)],
)
@pytest.mark.parametrize("craft_items", ["zero", "keep"])
def test_feature_bounds_close_the_saturation_only_through_the_bias(ds, bounds, closed, craft_items):
    out = _evaluate(_run(ds, [FeatureBounds(**bounds)], craft_items=craft_items), rounds=1)
    if closed:  # every trained row moves again: the crafted reading is the honest one
        assert out.metrics["f1"] == out.metrics["honest_f1"] and out.metrics["precision"] < 0.5
    else:  # an item-row bound alone, or a loose bias bound, leaves the rows of negatives still
        assert out.metrics["precision"] == 1.0 and out.metrics["recall"] == 1.0


@pytest.mark.parametrize("model", ["mlp", "neumf"])
def test_an_mlp_unit_saturates_past_the_bias_bound_and_a_score_bound_stops_it(ds, model):
    """craft_via=mlp-unit leaves predict.bias alone: max_bias and max_norm pass it; max_score
    (the adaptive server crafts at 0.9 x the public bound) closes it at 15 and not at 20."""

    def read(**bounds):
        tr = _run(ds, [FeatureBounds(**bounds)], model=model, craft_via="mlp-unit")
        return NCFUnitSaturation(rounds=1).evaluate(tr, np.random.default_rng(0)), tr

    out, tr = read(max_bias=5.0, max_norm=1.0)
    assert out.metrics["precision"] == 1.0 and out.metrics["recall"] == 1.0 and out.metrics["honest_f1"] < 0.5
    (state, *_) = [m for m in tr.messages if m.kind == "state" and (m.meta or {}).get("deviation")]
    assert "MLP unit 0 of the last layer: weights 0, bias +50, output weight -1" in state.meta["crafted"]
    closed, tr = read(max_bias=-1.0, max_score=15.0)
    assert "bias +13.5" in [m for m in tr.messages if m.kind == "state"][0].meta["crafted"]
    assert closed.metrics["f1"] == closed.metrics["honest_f1"] and closed.metrics["precision"] < 0.5
    still, _ = read(max_bias=-1.0, max_score=20.0)
    assert still.metrics["precision"] == 1.0


def test_max_score_refuses_a_saturated_model_and_leaves_honest_runs_unchanged(ds):
    bounds = FeatureBounds(max_score=15.0)
    assert bounds.refuse_scores(np.array([[-3.0, 14.9]])) is None
    assert (
        bounds.refuse_scores(np.array([[-50.0]])) == "feature-bounds: a received model scores 50, beyond max_score 15"
    )
    base = {"clients_per_round": 8, "global_rounds": 1, "model": "neumf"}
    a = FedNCF().run(ds, base, [], rng=0)
    b = FedNCF().run(ds, base, [bounds], rng=0)  # honest synthetic scores stay below 10
    np.testing.assert_array_equal(a.model["items"], b.model["items"])
    with pytest.raises(PrivauditError, match="craft_via=mlp-unit needs an MLP tower"):
        FedNCF.resolve_config({"server": "saturate", "craft_via": "mlp-unit"})


def test_audit_names_the_craft_that_passes_feature_bounds():
    """The audit's malicious column: the bias saturation's one-round cell reads protected under
    secagg + feature-bounds, but the MLP-unit saturation over all rounds leaks, so the column
    names it (tiny NeuMF, 5 seeds)."""
    from privaudit import audit as au

    spec = au.Audit(
        "fedncf",
        seeds=5,
        jobs=1,
        threat="malicious",
        defenses=["feature-bounds:max_bias=5"],
        attacks=["ncf-unit-saturation"],
        sets={"clients_per_round": 4, "global_rounds": 1, "model": "neumf"},
    )
    out = au.run_audit(spec, dataset=synthetic(n_users=16, n_items=60, seed=3))
    assert [d["name"] for d in out["defenses"]] == ["secagg+feature-bounds:max_bias=5"]
    assert [a["name"] for a in out["attacks"]] == [f"ncf-unit-saturation:rounds={r}" for r in (1, 4)]
    (none, fb) = out["threat_verdicts"]
    assert fb["malicious"].startswith("leaks to a malicious server (ncf-unit-saturation:rounds=4, 4 rounds")
    assert "protected" not in fb["malicious"].split(";")[0]


def test_declarations(ds):
    a = NCFActiveSaturation
    assert a.threat == "malicious" and set(a.deviations) <= set(DEVIATIONS) and "craft-items" in a.deviations
    assert a.rounds_needed == 1 and a.sybils_needed == 0
    with pytest.raises(PrivauditError, match="malicious server plan"):
        FedNCF.resolve_config({"server": "saturate", "selection": "adversarial"})


@pytest.mark.slow
def test_ml100k_saturation_plain_and_secure_aggregate(ml100k_path):
    """ML-100K, FedGMF, one target: one saturated round gives its item set exactly from its
    upload; under secagg with cohorts of 3, four rounds give precision >= 0.9 (docs/active-manipulation.md)."""
    from privaudit.data import load_dataset

    ds = load_dataset(ml100k_path)
    plain = _evaluate(_run(ds, clients_per_round=20), rounds=1)
    assert plain.metrics["f1"] == 1.0 and plain.metrics["honest_f1"] < 0.5
    agg = _evaluate(_run(ds, [SecAgg()], clients_per_round=3, deviation_rounds=5))
    assert agg.metrics["precision"] >= 0.9 and agg.metrics["recall"] == 1.0
    assert agg.metrics["f1"] >= agg.baseline_prior["f1"] + 0.3

"""Malicious server against FedNCF's secure aggregation: sybils, model inconsistency, countermeasures."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from privaudit import registry  # noqa: E402
from privaudit.attacks.ncf.malicious import (  # noqa: E402
    DEVIATIONS,
    NCFModelInconsistency,
    NCFSybilIsolation,
)
from privaudit.attacks.ncf.update_leak import NCFUpdateLeak  # noqa: E402
from privaudit.data import synthetic  # noqa: E402
from privaudit.defenses.consistency import ModelConsistency, VerifiedCohort  # noqa: E402
from privaudit.defenses.secagg import SecAgg  # noqa: E402
from privaudit.errors import PrivauditError  # noqa: E402
from privaudit.protocols.fedncf import FedNCF  # noqa: E402


@pytest.fixture(scope="module")
def ds():
    return synthetic(n_users=40, n_items=120, seed=3)


def _run(ds, plan, defenses=(), model="gmf", rounds=2, **cfg):
    # global_rounds 0: only the deviation rounds; the last one has no next state, so `rounds`
    # deviation rounds leave rounds - 1 usable aggregates
    config = {"server": plan, "clients_per_round": 8, "global_rounds": 0, "deviation_rounds": rounds, "model": model}
    return FedNCF().run(ds, {**config, **cfg}, list(defenses), rng=0).transcript


def _evaluate(attack, transcript):
    return attack.evaluate(transcript, np.random.default_rng(0))


@pytest.mark.parametrize("plan, attack", [("sybil", NCFSybilIsolation), ("inconsistent", NCFModelInconsistency)])
def test_one_deviation_round_recovers_the_target_items_under_secagg(ds, plan, attack):
    tr = _run(ds, plan, [SecAgg()])
    assert NCFUpdateLeak().applicable(tr.view("server"))[0] is False  # honest-but-curious: masked
    out = _evaluate(attack(), tr)
    assert out.reconstruction.supported, out.reconstruction.reason
    assert out.metrics["rounds_used"] == 1
    assert out.metrics["precision"] >= 0.9 and out.metrics["recall"] >= 0.9
    # far above the popularity prior and the random guess
    assert out.metrics["f1"] > out.baseline_prior["f1"] + 0.4
    assert out.metrics["precision"] > out.baseline["precision"] + 0.5
    assert out.metrics["sybils"] == (7 if plan == "sybil" else 0)
    assert out.victims is not None and out.victims.victims == [f"client:{tr.config['target']}"]
    for metric in ("precision", "recall"):  # the victim table agrees with score and prior_baseline
        assert out.victims.value(metric) == out.metrics[metric]
        assert out.victims.value(metric, "prior") == out.baseline_prior[metric]


@pytest.mark.parametrize("model", ["gmf", "mlp", "neumf"])
def test_crafted_model_zeroes_the_other_members_item_updates(ds, model):
    tr = _run(ds, "inconsistent", model=model, rounds=1)  # no secagg: the uploads are plaintext
    target = f"client:{tr.config['target']}"
    ups = {m.sender: np.asarray(m.payload["values"]) for m in tr.select("item_update")}
    assert len(ups) == 8 and np.abs(ups[target]).max() > 1e-4
    assert all(np.all(v == 0) for p, v in ups.items() if p != target)


def test_deviation_after_regular_training_still_isolates_the_target(ds):
    # 40 clients in cohorts of 8: a global round (5 regular rounds) trains the model first
    tr = _run(ds, "inconsistent", [SecAgg()], model="neumf", global_rounds=2, deviation_start=5)
    dev = [m.round for m in tr.select("state") if m.meta.get("deviation")]
    assert dev == [5, 6]
    out = _evaluate(NCFModelInconsistency(), tr)
    assert out.metrics["rounds_used"] == 2
    assert out.metrics["precision"] >= 0.9 and out.metrics["recall"] >= 0.9


def test_rounds_the_target_drops_out_of_are_skipped(ds):
    tr = _run(ds, "sybil", [SecAgg(drop=[5])], rounds=3, target=5)  # the target never uploads
    out = _evaluate(NCFSybilIsolation(), tr)
    meta = out.reconstruction.meta
    assert meta["rounds_used"] == 0 and meta["rounds_unchanged"] == 2
    assert out.metrics["recall"] == 0.0 and out.reconstruction.victims["client:5"]["items"].size == 0


def test_intersect_method_needs_more_rounds_than_direction(ds):
    tr = _run(ds, "sybil", [SecAgg()], rounds=4)
    direction = _evaluate(NCFSybilIsolation(rounds=1), tr).metrics
    inter = [_evaluate(NCFSybilIsolation(rounds=r, method="intersect"), tr).metrics for r in (1, 3)]
    assert inter[0]["recall"] == 1.0 and inter[0]["precision"] < 0.5  # positives + sampled negatives
    assert inter[1]["precision"] > inter[0]["precision"]  # negatives re-drawn: intersecting removes them
    assert direction["precision"] > inter[1]["precision"]


@pytest.mark.parametrize("digest", ["sha256", "sha3_256", "blake2b"])
def test_round_checks_compare_content_and_count_verified_members(digest):
    check = ModelConsistency(digest=digest, min_cohort=3)
    same = [bytes(8), bytes(8), bytes(8)]  # equal content, distinct objects
    assert check.abort_reason(0, ["client:0", "client:1", "client:2"], same, np.ones(3, bool)) is None
    # a consistent cohort below min_cohort aborts (a one-client "cohort" would pass a digest check)
    small = ModelConsistency(digest=digest).abort_reason(0, ["a", "b"], same[:2], np.ones(2, bool))
    assert small == "model-consistency: 2 members, fewer than min_cohort 5"
    other = same[:2] + [b"\x01" + bytes(7)]
    assert "2 different model digests among 3" in check.abort_reason(0, ["a", "b", "c"], other, np.ones(3, bool))
    verified = VerifiedCohort(min_clients=2)
    assert verified.abort_reason(0, ["a", "b", "c"], same, np.array([True, True, False])) is None
    assert "1 verified members" in verified.abort_reason(0, ["a", "b", "c"], same, np.array([True, False, False]))


def test_model_consistency_check_aborts_the_inconsistent_rounds(ds):
    tr = _run(ds, "inconsistent", [SecAgg(), ModelConsistency()])
    out = _evaluate(NCFModelInconsistency(), tr)
    assert not out.reconstruction.supported
    assert "aborted every deviation round" in out.reconstruction.reason
    assert out.metrics == out.baseline
    aggs = [m for m in tr.select("aggregate") if m.meta.get("aborted")]
    assert aggs and all(int(m.payload["counts"].sum()) == 0 for m in aggs)


def test_model_consistency_does_not_stop_sybils(ds):
    # every member of a sybil cohort gets the same model: the digests agree
    out = _evaluate(NCFSybilIsolation(), _run(ds, "sybil", [SecAgg(), ModelConsistency()]))
    assert out.metrics["precision"] >= 0.9 and out.metrics["recall"] >= 0.9


def test_verified_cohort_forces_honest_members_into_the_sybil_aggregate(ds):
    blocked = _run(ds, "sybil", [SecAgg(), VerifiedCohort(min_clients=2)], sybils=7)
    out = _evaluate(NCFSybilIsolation(), blocked)
    assert not out.reconstruction.supported and "verified-cohort" in out.reconstruction.reason
    # the adaptive server (sybils -1) reads the public min_clients: k - min_clients sybils and
    # honest covers re-drawn every round
    adapted = _run(ds, "sybil", [SecAgg(), VerifiedCohort(min_clients=4)], rounds=2)
    one = _evaluate(NCFSybilIsolation(), adapted).metrics
    full = _evaluate(NCFSybilIsolation(), _run(ds, "sybil", [SecAgg()])).metrics
    assert one["sybils"] == 4 and one["precision"] < full["precision"] - 0.3


def test_countermeasures_leave_honest_secagg_runs_unchanged(ds):
    cfg = {"clients_per_round": 8, "global_rounds": 1, "model": "gmf", "record_rounds": 2}
    plain = FedNCF().run(ds, cfg, [SecAgg()], rng=0)
    checked = FedNCF().run(ds, cfg, [SecAgg(), ModelConsistency(), VerifiedCohort(min_clients=2)], rng=0)
    np.testing.assert_array_equal(plain.model["items"], checked.model["items"])
    assert not [m for m in checked.transcript.select("aggregate") if m.meta.get("aborted")]
    # every honest-but-curious FedNCF attack stays "not applicable" under secagg
    honest = [
        cls
        for cls in registry.available("attack").values()
        if "fedncf" in cls.protocols and cls.threat == "honest-but-curious"
    ]
    assert NCFUpdateLeak in honest
    for cls in honest:
        assert cls().applicable(checked.transcript.view(cls.party))[0] is False, cls.name
    # and the malicious attacks do not apply to an honest server's transcript
    for cls in (NCFSybilIsolation, NCFModelInconsistency):
        ok, reason = cls().applicable(checked.transcript.view("server"))
        assert not ok and "server=" in reason


def test_threat_models_are_declared():
    attacks = registry.available("attack")
    malicious = {n for n, cls in attacks.items() if cls.threat == "malicious"}
    assert {"ncf-sybil-isolation", "ncf-model-inconsistency"} <= malicious
    assert all(cls.threat in ("honest-but-curious", "malicious") for cls in attacks.values())
    for name in malicious:
        assert attacks[name].deviations and set(attacks[name].deviations) <= set(DEVIATIONS)
    assert registry.get("defense", "model-consistency").capabilities == {"round-check"}
    facts = registry.summary("attack", NCFModelInconsistency)["facts"]
    assert facts["threat"] == "malicious" and facts["deviations"] == "inconsistent-models, craft-items"


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"server": "sybil", "selection": "adversarial"}, "exclude each other"),
        ({"server": "sybil", "clients_per_round": 4, "sybils": 4}, "at most clients_per_round - 1"),
        ({"server": "evil"}, "server"),
    ],
)
def test_malicious_plan_config_errors(cfg, message):
    with pytest.raises(PrivauditError, match=message):
        FedNCF.resolve_config(cfg)


def test_audit_plans_each_malicious_attack_on_its_server_plan():
    from privaudit import audit as au

    runs, header = au._plan(au.Audit("fedncf", seeds=2, defenses=["secagg", "model-consistency"]), n_users=200)
    info = {a["name"]: a for a in header["attacks"]}
    # each malicious attack with a rounds parameter is read at 1, 4, 16 and all 50 deviation rounds
    assert info["ncf-model-inconsistency:rounds=1"]["plan"] == {"server": "inconsistent"}
    assert [n for n in info if n.startswith("ncf-sybil-isolation")] == [
        f"ncf-sybil-isolation:rounds={r}" for r in (1, 4, 16, 50)
    ]
    assert info["ncf-sybil-isolation:rounds=16"]["deviation"] == "sybil cohorts"
    assert info["ncf-sybil-isolation:rounds=16"]["audit_params"]["rounds"] == 16
    assert info["ncf-update-leak"]["threat"] == "honest-but-curious"
    # model-consistency stands on the secure aggregation it protects (the threat axis includes a malicious server)
    assert [d["name"] for d in header["defenses"]] == ["secagg+model-consistency", "secagg"]
    assert header["defenses"][0]["stack"] == [
        {"name": "secagg", "params": {}},
        {"name": "model-consistency", "params": {}},
    ]
    honest = [r for r in runs if r.threat == "honest-but-curious"]
    # secagg's 4 dropout values and the stack's one cell, plus the undefended run, per seed
    assert len(honest) == 2 * (1 + 4 + 1) and all(r.config["server"] == "honest" for r in honest)
    assert all(not any(a.threat == "malicious" for _, a in r.attacks) for r in honest)
    for plan in ("sybil", "inconsistent"):
        mine = [r for r in runs if r.plan == {"server": plan}]
        # undefended, secagg at dropout 0.3 and the stack, 10 seeds each (one target per run,
        # the fewest victims a verdict is decided from)
        assert sorted({(r.defense_name, r.value) for r in mine}, key=str) == sorted(
            {(None, None), ("secagg", 0.3), ("secagg+model-consistency", None)}, key=str
        )
        assert len(mine) == 30 and {r.seed for r in mine} == set(range(10))
        # the server deviates in every round the protocol runs (50), recorded
        assert all(r.config["deviation_rounds"] == 50 and r.config["record_rounds"] == 51 for r in mine)
        assert all(r.config["server"] == plan and len(r.attacks) == 4 for r in mine)
        assert all(r.canaries == 0 for r in mine)  # no canary run: the DP claim is checked on the honest runs
        stacked = [r for r in mine if r.defense_name == "secagg+model-consistency"]
        assert all([c.name for c, _ in r.stack] == ["secagg", "model-consistency"] for r in stacked)


def test_defense_stacks_parse_and_refuse_bad_specs():
    from privaudit import audit as au

    cell = au.parse_cell("secagg:dropout=0.1+feature-bounds", "fedncf")
    assert cell.name == "secagg:dropout=0.1+feature-bounds" and cell.swept and cell.strength == "max_bias"
    assert cell.specs(10.0) == [
        (registry.get("defense", "secagg"), {"dropout": 0.1}),
        (registry.get("defense", "feature-bounds"), {"max_bias": 10.0}),
    ]
    fixed = au.parse_cell("feature-bounds:max_bias=5,max_score=15", "fedncf", auto_base=True)
    assert fixed.name == "secagg+feature-bounds:max_bias=5,max_score=15" and not fixed.swept
    assert au.parse_cell("verified-cohort", "fedncf").name == "verified-cohort"  # no malicious axis: alone
    for spec, message in [
        ("secagg+", "empty member"),
        ("secagg+nope", "unknown defense"),
        ("secagg:dropout=2", "dropout"),
        ("feature-bounds:max_scor=3", "unknown parameter 'max_scor'"),
        ("secagg+secagg", "appears twice"),
    ]:
        with pytest.raises(PrivauditError, match=message):
            au.parse_cell(spec, "fedncf")


def test_attack_pools_the_seeds_targets_into_one_tested_verdict(ds):
    """``privaudit attack`` on a malicious plan: one target per run, so a run alone has no
    interval; five seeds' targets are pooled into one cluster bootstrap (an interval; from 5 to 9
    victims only a leak is decided, on Student's t; two seeds: no interval)."""
    from privaudit import experiment as ex
    from privaudit import results as rs

    def verdict(seeds: int) -> dict:
        exp = ex.build_experiment(
            protocol="fedncf",
            attack={"name": "ncf-model-inconsistency", "rounds": 1},
            protocol_config={"server": "inconsistent"},
            seeds=seeds,
        )
        return exp.run(ds)["verdicts"][0]

    pooled = verdict(5)
    assert "over 5 victims" in pooled["sentence"]
    assert pooled["rows"][0]["tests"]["f1"]["low"] > 0.3  # F1 1.0 against a popularity prior near 0.4
    # 5 pooled targets: a leak this clear is decided on Student's t (4 degrees of freedom); a
    # "protected" never is below 10 victims (tests/test_verdicts.py)
    assert rs.verdict_label(pooled["rows"][0]) == "leaks (f1)"
    assert pooled["rows"][0]["tests"]["f1"]["n"] == 5
    assert "inconclusive" in verdict(2)["sentence"]

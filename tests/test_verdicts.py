"""Verdicts as tests: the cluster bootstrap over victims (against a direct loop), Holm over a
grid's points and metrics, "leaks" on any metric, "protected" only with a positive control,
"attack below prior", "inconclusive" without per-victim scores, the margin as a share of the
gap to a perfect attack, the utility cost with its interval, the canary-audit text, and a
null simulation bounding the false "leaks" rate."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from privaudit import audit as au
from privaudit import experiment as ex
from privaudit import registry
from privaudit import results as rs
from privaudit.cli import main
from tests.dummies import DummyAttack, tiny_dataset, verdict_registry  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("verdict_registry")

Z = rs.norm_isf  # one-sided normal quantile: Z(a) = Phi^-1(1 - a)


@pytest.fixture(scope="module")
def big():
    return tiny_dataset(200, n_items=12)


class EchoAttack(DummyAttack):
    """Outputs the prior's majority guess for every bit and reads no message."""

    description = "test attack: echoes the prior (majority bit)"

    def prior_knowledge(self, transcript, rng):
        return {"bias": float(transcript.config.get("bias", 0.5))}

    def run(self, view, knowledge, rng):
        recon = super().run(view, knowledge, rng)
        majority = 1.0 if knowledge["bias"] > 0.5 else 0.0
        for g in recon.victims.values():
            g["bits"] = np.full_like(g["bits"], majority)
            g["scores"] = np.zeros_like(g["scores"])
        return recon


@pytest.fixture
def echo():
    registry._register("attack", "dummy-echo-attack")(EchoAttack)
    try:
        yield "dummy-echo-attack"
    finally:
        registry.unregister("attack", "dummy-echo-attack")


def test_points_carry_both_baselines_advantage_and_roc(big):
    res = ex.build_experiment(
        protocol="dummy-proto", noise="dummy-noise", scales=(0, 1), seeds=2, protocol_config={"p": 8}
    ).run(big)
    p = res["points"][0]
    assert p["baseline_random"] == {"accuracy": 0.5} and p["baseline_prior"] == {"accuracy": 0.5}
    assert p["advantage"]["accuracy"] == pytest.approx(p["attack_metrics"]["accuracy"] - 0.5)
    roc = p["roc"]["bit"]
    assert roc["n_pos"] + roc["n_neg"] == 200 * 8 and roc["auc"] == 1.0  # noise-free: the sign separates
    assert roc["tpr@0.01"] == 1.0 and math.isnan(roc["tpr@0.001"])  # fewer than 1,000 negatives
    assert roc["fpr"][0] == 0.0 and roc["tpr"][-1] == 1.0
    assert res["metric_specs"]["accuracy"]["declared"] is True and res["metric_specs"]["victims"]["plotted"] is False
    assert [v["attack"] for v in res["verdicts"]] == ["dummy-attack"]
    assert set(res["verdicts"][0]) >= {"attack", "metric", "strength", "utility_cost", "sentence"}


def test_undeclared_metrics_use_the_explicit_fallback(big):
    res = ex.build_experiment(
        protocol="dummy-proto", attack="dummy-aux-attack", sweep=ex.Sweep("attack", "aux_fraction", (0, 1)), seeds=1
    ).run(big)
    assert res["metric_specs"]["accuracy"] == rs.spec_to_dict(rs.FALLBACK_SPEC, declared=False)
    assert res["figure_metrics"] == ["accuracy"]  # "victims" (200) is not in [0, 1]: not plotted
    assert "not a defense strength" in res["verdicts"][0]["sentence"]


# ------------------------------------------------------------------------------ hand-made results


def point(value, seed, metrics, se=0.01, utility=None, bootstrap=True, prior=0.5):
    """A point whose attack metrics are ``metrics`` against a prior of ``prior`` (random 0.5)."""
    p = {
        "value": value,
        "seed": seed,
        "attack_metrics": dict(metrics),
        "baseline_random": {m: 0.5 for m in metrics},
        "baseline_prior": {m: prior for m in metrics},
        "supported": True,
        "utility": {} if utility is None else {"ndcg@10": utility},
    }
    if bootstrap:
        p["bootstrap"] = {
            m: {"attack": v, "prior": prior, "se": se, "se_vs_prior": se, "n": 100, "over": "victims"}
            for m, v in metrics.items()
        }
    return p


SPECS = {m: rs.spec_to_dict(rs.MetricSpec(True, True, "fraction", m)) for m in ("a", "b")}


def results(points, reference=(), sweep="dp.epsilon", noise=False):
    return {
        "attack": "x",
        "primary_metric": "a",
        "metric_specs": SPECS,
        "points": list(points),
        "reference": list(reference),
        "sweep": sweep,
        "noise": noise,
    }


# ------------------------------------------------------------------------------ bootstrap


def test_cluster_bootstrap_matches_a_direct_loop():
    rng = np.random.default_rng(3)
    n = 7
    table = rs.VictimTable(
        [f"v{i}" for i in range(n)],
        {"acc": rng.integers(1, 9, n), "rmse": rng.integers(1, 9, n)},
        {"acc": rng.integers(0, 5, n), "rmse": rng.random(n) * 4},
        {"acc": rng.integers(0, 5, n), "rmse": rng.random(n) * 4},
        root=frozenset({"rmse"}),
    )
    counts = rs.bootstrap_counts(n, 50, np.random.default_rng(0))
    assert counts.shape == (50, n) and (counts.sum(axis=1) == n).all()
    for metric in ("acc", "rmse"):
        for which in ("attack", "prior"):
            fast = rs.table_replicates(table, metric, which, counts.astype(float))
            loop = [table.value(metric, which, np.repeat(np.arange(n), c)) for c in counts]
            assert fast == pytest.approx(loop)


def test_weighted_auc_matches_sklearn_and_groups_resample_victims():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    scores = np.round(rng.normal(size=60), 1)  # ties
    labels = rng.random(60) < 0.4
    w = rng.integers(0, 3, size=(4, 60)).astype(float)
    got = rs.weighted_auc(scores, labels, w)
    assert got == pytest.approx([roc_auc_score(labels, scores, sample_weight=wi) for wi in w])
    d = rs.Decisions(scores, labels, groups=np.repeat(np.arange(6), 10))
    reps, over = rs.decision_replicates(d, np.random.default_rng(0), 200)
    assert over == "victims" and reps.shape == (200,) and np.isfinite(reps).all()
    _, over = rs.decision_replicates(rs.Decisions(scores, labels), np.random.default_rng(0), 10)
    assert over == "records"  # no victim ids: says so
    boot = rs.point_bootstrap({"auc": roc_auc_score(labels, scores)}, None, {"bit": d}, replicates=200)
    assert boot["auc"]["over"] == "victims" and boot["auc"]["n"] == 6
    assert boot["auc"]["se"] == pytest.approx(np.std(reps, ddof=1), rel=0.3)


def test_points_carry_a_bootstrap_of_every_victim_table_metric(big):
    res = ex.build_experiment(
        protocol="dummy-proto", noise="dummy-noise", scales=(1,), seeds=1, protocol_config={"p": 8}
    ).run(big)
    p = res["points"][0]
    b = p["bootstrap"]["accuracy"]
    assert b["n"] == 200 and b["over"] == "victims" and b["attack"] == pytest.approx(p["attack_metrics"]["accuracy"])
    assert b["prior"] == 0.5 and 0.005 < b["se"] < 0.05  # 200 victims x 8 bits: sd ~ 0.18 / sqrt(200)
    assert b["se_vs_prior"] == pytest.approx(b["se"])  # the prior is the same on every resample


# ------------------------------------------------------------------------------ tests and rules


def test_holm_steps_down_and_names_each_level():
    rejected, levels = rs.holm([0.01, 0.04, 0.03, 0.005, math.nan])
    assert rejected == [True, False, False, True, False]
    assert levels[3] == pytest.approx(0.05 / 4) and levels[0] == pytest.approx(0.05 / 3)
    assert levels[2] == pytest.approx(0.05 / 2)  # first acceptance: compared with alpha / 2
    assert levels[1] == pytest.approx(0.05 / 4)  # after it: alpha / m
    assert rs.holm([0.02, 0.03])[0] == [True, True]  # Holm rejects both, Bonferroni (0.025) only one


def test_leaks_needs_the_corrected_lower_bound_above_zero():
    # one point, two metrics: z = 1.8 gives p = 0.036 > 0.05 / 2 (Holm's first level): not a leak
    rows = rs.experiment_verdicts(results([point(1.0, 0, {"a": 0.518, "b": 0.5})]))[0]["rows"]
    t = rows[0]["tests"]["a"]
    assert t["p"] == pytest.approx(1 - NormalDist().cdf(1.8)) and t["family"] == 2
    assert t["low"] == pytest.approx(0.018 - Z(0.025) * 0.01) and t["low"] < 0
    assert rows[0]["verdict"] == "inconclusive"
    # alone (family of one) the same advantage leaks: its lower bound at 5 % is above 0
    res = results([point(1.0, 0, {"a": 0.518})])
    res["metric_specs"] = {"a": SPECS["a"]}
    row = rs.experiment_verdicts(res)[0]["rows"][0]
    assert row["verdict"] == "leaks" and row["advantage_low"] == pytest.approx(0.018 - Z(0.05) * 0.01)


def test_leaks_on_any_declared_metric_and_the_sentence_names_it():
    v = rs.experiment_verdicts(results([point(1.0, 0, {"a": 0.5, "b": 0.9})], sweep=None))[0]
    row = v["rows"][0]
    assert row["verdict"] == "leaks" and row["leak_metrics"] == ["b"]
    assert row["advantage"] == 0.0  # the table's advantage column stays on the primary metric
    assert rs.verdict_label(row) == "leaks (b)"
    assert "leaks on b (lower bound" in v["sentence"] and "Holm over 2 tests" in v["sentence"]
    # the Holm family is stated once, with its level, inside the interval's bound text
    assert (
        v["sentence"].count("Holm over") == 1 and "Holm over 2 tests at 0.05; family: this experiment)" in v["sentence"]
    )


def test_protected_needs_every_metric_under_the_margin_and_a_positive_control():
    leak = point(None, 0, {"a": 0.9, "b": 0.9}, utility=0.9)
    quiet = point(1.0, 0, {"a": 0.5, "b": 0.5}, se=0.001, utility=0.8)
    half = point(1.0, 0, {"a": 0.5, "b": 0.6}, se=0.1, utility=0.8)  # b: upper bound far above the margin
    v = rs.experiment_verdicts(results([quiet], reference=[leak]))[0]
    assert v["rows"][0]["verdict"] == "protected" and v["strength"] == 1.0
    assert v["sentence"].startswith("x (a): protected from dp.epsilon = 1 on")
    t = v["rows"][0]["tests"]["a"]
    assert t["threshold"] == pytest.approx(0.05 * 0.5)  # 5 % of the gap between the prior 0.5 and 1
    # without the positive control (no undefended leak): no evidence, never protected
    v = rs.experiment_verdicts(results([quiet], reference=[point(None, 0, {"a": 0.5, "b": 0.5}, se=0.001)]))[0]
    assert v["rows"][0]["verdict"] == "no evidence of leakage" and v["strength"] is None
    assert rs.NO_POWER in v["sentence"] and "protected" not in v["sentence"].replace("shown to protect", "")
    # one metric inconclusive: not protected
    v = rs.experiment_verdicts(results([half], reference=[leak]))[0]
    assert v["rows"][0]["verdict"] == "inconclusive" and v["strength"] is None
    # no run without a defense reads protected, even after a leak (noise scale 0 = no defense)
    v = rs.experiment_verdicts(
        results([point(0, 0, {"a": 0.9, "b": 0.9}), point(0, 1, {"a": 0.5, "b": 0.5}, se=0.001)], noise=True)
    )[0]
    assert v["rows"][0]["verdict"] != "protected"
    undefended = rs.experiment_verdicts(results([quiet], sweep=None))[0]
    assert undefended["rows"][0]["verdict"] == "no evidence of leakage"


def test_below_prior_is_never_protection_or_a_crossover():
    leak = point(None, 0, {"a": 0.9, "b": 0.9})
    below = point(1.0, 0, {"a": 0.4, "b": 0.4}, se=0.01)
    v = rs.experiment_verdicts(results([below], reference=[leak]))[0]
    assert v["rows"][0]["verdict"] == "attack below prior" and v["strength"] is None
    assert "never counted as protection" in v["sentence"]


def test_a_metric_whose_baseline_is_already_perfect_is_not_tested():
    # b: attack 1.0 and prior 1.0 (se 0): nothing to beat, so it neither blocks nor counts
    leak = point(None, 0, {"a": 0.9, "b": 1.0}, prior=1.0)
    leak["baseline_prior"]["a"] = 0.5
    quiet = point(1.0, 0, {"a": 0.5, "b": 1.0}, se=0.001, prior=1.0)
    quiet["baseline_prior"]["a"] = 0.5
    for p in (leak, quiet):
        p["bootstrap"]["a"]["prior"] = 0.5
    v = rs.experiment_verdicts(results([quiet], reference=[leak]))[0]
    t = v["rows"][0]["tests"]["b"]
    assert t["status"] == "at ceiling" and t["family"] == 2  # a at two rows; b not counted
    assert v["rows"][0]["verdict"] == "protected"


def test_no_per_victim_scores_is_at_best_inconclusive():
    # two seeds that agree closely (a Student-t interval would call it a leak): no bootstrap, no verdict
    pts = [point(1.0, s, {"a": 0.9 + 0.001 * s}, bootstrap=False) for s in range(2)]
    res = results(pts, reference=[point(None, 0, {"a": 0.9}, bootstrap=False)])
    res["metric_specs"] = {"a": SPECS["a"]}
    v = rs.experiment_verdicts(res)[0]
    assert [r["verdict"] for r in v["rows"]] == ["inconclusive"]
    assert rs.verdict_label(v["rows"][0]) == "inconclusive (no per-victim scores)"
    assert "no per-victim scores" in v["sentence"] and rs.fmt_advantage(0.9, math.nan) == "0.900 (no interval)"


def test_margin_is_a_share_of_the_gap_to_a_perfect_attack():
    # a relative error around 0.08 (lower is better, perfect 0): 0.05 of it is 0.004, not 0.05
    spec = rs.MetricSpec(False, True, "fraction", "relative error")
    assert rs.spec_perfect(spec) == 0.0 and rs.spec_perfect(rs.MetricSpec(True, True, "rating")) is None
    p = point(None, 0, {"a": 0.07}, se=0.002, prior=0.08)
    p["baseline_random"] = {"a": 0.09}
    res = results([p], sweep=None)
    res["metric_specs"] = {"a": rs.spec_to_dict(spec)}
    row = rs.experiment_verdicts(res)[0]["rows"][0]
    t = row["tests"]["a"]
    assert t["against"] == "prior" and t["advantage"] == pytest.approx(0.01)
    assert t["threshold"] == pytest.approx(0.05 * 0.08) and row["verdict"] == "leaks"
    res["margin"] = 0.5  # --margin 0.5: half the gap
    assert rs.experiment_verdicts(res)[0]["rows"][0]["tests"]["a"]["threshold"] == pytest.approx(0.04)


def test_utility_cost_carries_its_interval_or_reads_within_noise():
    leak = [point(None, s, {"a": 0.9}, utility=u) for s, u in enumerate((0.30, 0.25))]
    # within noise only when the interval holds 0 AND lies inside +- 5 % of the reference (0.01375)
    quiet = [point(1.0, s, {"a": 0.5}, se=0.001, utility=u) for s, u in enumerate((0.2995, 0.2505))]
    res = results(quiet, reference=leak)
    res["metric_specs"] = {"a": SPECS["a"]}
    v = rs.experiment_verdicts(res)[0]
    assert v["utility_cost"] == pytest.approx(0.0) and v["utility_cost_within_noise"] is True
    assert "where the ndcg@10 cost is within noise (0.0000, 95 % interval [" in v["sentence"]
    assert "Student t over 2 paired seeds: inside ± 0.0138 = 5 % of the reference)" in v["sentence"]
    # a 2-seed Student-t interval (1 df) far wider than the margin: not resolved, never "within noise"
    wide = rs.utility_cost_interval({"0": 0.30, "1": 0.25}, {"0": 0.26, "1": 0.29}, "ndcg@10")
    assert wide["low"] < -0.4 and wide["high"] > 0.4 and wide["margin"] == pytest.approx(0.01375)
    assert wide["unresolved"] and not wide["within_noise"]
    quiet = [point(1.0, s, {"a": 0.5}, se=0.001, utility=u) for s, u in enumerate((0.26, 0.29))]
    v = rs.experiment_verdicts({**res, "points": quiet})[0]
    assert v["utility_cost_within_noise"] is False and "ndcg@10 cost is not resolved" in v["sentence"]
    quiet = [point(1.0, s, {"a": 0.5}, se=0.001, utility=u) for s, u in enumerate((0.20, 0.16))]
    v = rs.experiment_verdicts({**res, "points": quiet})[0]
    cost = rs.utility_cost_interval({"0": 0.30, "1": 0.25}, {"0": 0.20, "1": 0.16}, "ndcg@10")
    assert cost["seeds"] == 2 and cost["low"] > 0 and not cost["within_noise"]
    assert cost["resolved"] and cost["method"] == "Student t over 2 paired seeds"
    assert f"where ndcg@10 costs {rs.fmt(cost['cost'], 4)} (95 % interval [{rs.fmt(cost['low'], 4)}" in v["sentence"]
    assert v["rows"][0]["utility_cost"]["label"] == "costs"


def test_canary_audit_text_and_display(big):
    ok = {"epsilon_lb": 0.41, "epsilon": 1.0, "delta": 1e-5, "neighbour": "rating", "canaries": 100}
    assert rs.canary_text(ok) == "DP claim consistent (ε_lb 0.41 ≤ ε 1.00, rating-level)"
    bad = {**ok, "epsilon_lb": 2.5, "neighbour": "user", "confidence": 0.95}
    assert rs.canary_text(bad) == "DP claim violated (ε_lb 2.50 > ε 1.00, user-level, 95 % confidence)"
    assert rs.canary_text({"epsilon": 1.0}) is None
    leak = point(None, 0, {"a": 0.9})
    p = {**point(1.0, 0, {"a": 0.5}), "canary_audit": bad}
    res = results([p], reference=[leak])
    res["metric_specs"] = {"a": SPECS["a"]}
    v = rs.experiment_verdicts(res)[0]
    assert v["dp_violation"] is True and "Canary audit: dp.epsilon = 1: DP claim violated" in v["sentence"]
    from privaudit.reports.render import table_rows

    _, rows = table_rows({**res, "verdicts": [v], "summary": rs.summarize_points(res["points"])})
    assert any("DP claim violated" in str(c) for r in rows for c in r)
    audit = au.run_audit(
        au.Audit("dummy-proto", sets={"p": "8"}, seeds=1, attacks=["dummy-attack"], defenses=["dummy-dp"], jobs=1),
        dataset=big,
    )
    for r in audit["runs"]:
        if r.get("defense") == "dummy-dp":
            r["canary_audit"] = ok
    audit["matrix"] = rs.audit_matrix(audit)
    assert "DP-ok" in au.format_matrix(audit)
    from privaudit.reports.audit import render_html

    assert "DP claim consistent (ε_lb 0.41 ≤ ε 1.00, rating-level)" in render_html(audit)


# ------------------------------------------------------------------------------ end to end


def test_noise_sweep_is_protected_only_after_a_leak(big):
    res = ex.build_experiment(
        protocol="dummy-proto", noise="dummy-noise", scales=(0, 1, 1000), seeds=2, protocol_config={"p": 32}
    ).run(big)
    v = res["verdicts"][0]
    rows = {r["value"]: r for r in v["rows"]}
    assert rows[0.0]["verdict"] == "leaks" and rows[1.0]["verdict"] == "leaks"
    t = rows[1000.0]["tests"]["accuracy"]
    # the upper bound is the smallest over the message-free guesses (null arm, prior, random),
    # Bonferroni over them inside Holm's alpha / m; the SE pools within- and between-seed variance
    arms = t["arms"]
    assert t["family"] == 3 and set(arms) == {"null", "prior", "random"} and t["against"] in arms
    assert t["high"] == pytest.approx(min(a + Z(0.05 / (3 * len(arms))) * se for a, se in arms.values()))
    points = [p for p in res["points"] if p["value"] == 1000.0]
    advs = [p["attack_metrics"]["accuracy"] - p["baseline_null"]["accuracy"] for p in points]
    ses = [rs.NULL_SE_INFLATION * p["bootstrap"]["accuracy"]["se_vs_null"] for p in points]
    within = np.mean(np.square(ses))
    expect = np.sqrt((within + max(0.0, np.var(advs, ddof=1) - within)) / 2)
    assert arms["null"][0] == pytest.approx(np.mean(advs)) and arms["null"][1] == pytest.approx(expect)
    assert rows[1000.0]["verdict"] == "protected" and v["strength"] == 1000.0
    assert v["sentence"].startswith("dummy-attack (accuracy): protected from dummy-noise.scale = 1000 on")
    assert "ndcg@10" in v["sentence"] and "95 % interval" in v["sentence"]


def test_majority_echo_attack_is_never_protected(big, echo):
    res = ex.build_experiment(
        protocol="dummy-proto",
        attack=echo,
        sweep=ex.Sweep("dummy-dp", "epsilon", (1, 0.01)),
        defenses=["dummy-dp"],
        seeds=1,
        protocol_config={"p": 8, "bias": 0.8},
    ).run(big)
    v = res["verdicts"][0]
    assert v["reference_row"]["verdict"] == "no evidence of leakage"  # no defense: never protected
    assert all(r["verdict"] == "no evidence of leakage" for r in v["rows"]) and v["strength"] is None
    assert rs.NO_POWER in v["sentence"]


def test_attack_below_its_prior_reads_below_prior(big, tmp_path):
    audit = au.run_audit(
        au.Audit(
            "dummy-proto",
            sets={"p": "8", "bias": "0.8"},
            seeds=2,
            attacks=["dummy-minority-attack", "dummy-attack"],
            defenses=["dummy-noise"],
            jobs=1,
        ),
        dataset=big,
    )
    cells = [c for c in audit["matrix"] if c["attack"] == "dummy-minority-attack"]
    assert cells and all(c["verdict"] == "attack below prior" for c in cells)
    assert all(c["against"] == "prior" for c in cells)  # the majority (0.8) beats the random guess (0.5)
    v = next(v for v in audit["verdicts"] if v["attack"] == "dummy-minority-attack")
    assert v["strength"] is None and "attack below prior" in v["sentence"]
    out = au.write_audit(audit, tmp_path / "a")
    page = (out / "audit.html").read_text()
    below = [c for c in audit["matrix"] if c["verdict"] == "attack below prior"]
    assert page.count('class="verdict-not-adapted"') == len(below) >= len(cells)  # hatched, never green
    assert "BELOW-PRIOR" in au.format_matrix(audit)


def test_broken_dp_is_shown_but_no_longer_forces_the_verdict(big):
    audit = au.run_audit(
        au.Audit(
            "dummy-proto",
            sets={"p": "8"},
            seeds=1,
            attacks=["dummy-attack"],
            defenses=["dummy-broken-dp", "dummy-dp"],
            jobs=1,
        ),
        dataset=big,
    )
    cell = {c["defense"]: c for c in audit["matrix"]}
    broken, correct = cell["dummy-broken-dp"], cell["dummy-dp"]
    assert broken["dp_violation"] is True and correct["dp_violation"] is False
    assert broken["epsilon_lb"] > broken["epsilon"] == pytest.approx(2 * 0.5)  # 2 rounds x 0.5 claimed
    assert broken["verdict"] == "leaks" and broken["advantage_low"] > 0  # from its own interval
    assert correct["verdict"] in ("inconclusive", "leaks") and correct["verdict"] == (
        "leaks" if correct["advantage_low"] > 0 else "inconclusive"
    )
    from privaudit.reports.audit import render_html

    page = render_html(audit)
    assert "ε total over the run (δ=0, per one secret bit, basic)" in page and "DP VIOLATION" in page


def test_margin_option_is_recorded_and_checked(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["attack", "--protocol", "dummy-proto", "--seeds", "1", "--margin", "0.2", "--out", str(out)]) == 0
    import json

    data = json.loads((out / "results.json").read_text())
    assert data["margin"] == 0.2 and data["verdicts"][0]["margin"] == 0.2
    args = ["audit", "--protocol", "dummy-proto", "--seeds", "1", "--jobs", "1", "--attack", "dummy-attack"]
    assert main([*args, "--defense", "dummy-dp", "--margin", "0.2", "--out", str(tmp_path / "a")]) == 0
    audit = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert audit["margin"] == 0.2 and "0.2 of the gap" in (tmp_path / "a" / "audit.html").read_text()
    capsys.readouterr()
    assert main(["attack", "--protocol", "dummy-proto", "--margin", "1.5", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "privaudit: error: --margin must lie strictly between 0 and 1, got 1.5"
    ]


# ------------------------------------------------------------------------------ null calibration


def test_null_victim_tables_rarely_read_leaks():
    """Attack guesses independent of the truth (VictimTable level, fixed seed): the family-wise
    rate of "leaks" over a 3-point grid stays at most 2 x the nominal 5 % over 80 repetitions."""
    rng = np.random.default_rng(7)
    false = 0
    for _ in range(80):
        points = []
        for value in (1.0, 2.0, 3.0):
            n, bits = 60, rng.integers(2, 12, size=60).astype(float)
            right = rng.binomial(bits.astype(int), 0.5).astype(float)
            table = rs.VictimTable([str(i) for i in range(n)], {"a": bits}, {"a": right}, {"a": bits / 2})
            boot = rs.point_bootstrap({"a": table.value("a")}, table, replicates=200, seed=int(rng.integers(1 << 30)))
            p = point(value, 0, {"a": table.value("a")})
            p["bootstrap"] = boot
            points.append(p)
        res = results(points, sweep=None)
        res["metric_specs"] = {"a": SPECS["a"]}
        false += any(r["verdict"] == "leaks" for r in rs.experiment_verdicts(res)[0]["rows"])
    assert false / 80 <= 0.10


def test_negative_seed_is_one_line_error(tmp_path, capsys):
    assert main(["attack", "--protocol", "dummy-proto", "--seed", "-1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["privaudit: error: --seed must be non-negative, got -1"]
    assert main(["run", "--protocol", "dummy-proto", "--seed", "-2", "-o", str(tmp_path / "x.ptx")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["privaudit: error: --seed must be non-negative, got -2"]
    assert not (tmp_path / "r").exists()


def test_one_half_of_a_trade_off_is_not_tested():
    """Recall is maximised by guessing every item without any message: a metric declared
    ``tested=False`` is reported but never decides a verdict; F1 beside it does."""
    from privaudit.results import MetricSpec, privacy_metrics, spec_from_dict, spec_to_dict

    point = {
        "attack_metrics": {"recall": 1.0, "precision": 0.07, "f1": 0.12},
        "baseline_random": {"recall": 0.5, "precision": 0.1, "f1": 0.17},
        "baseline_prior": {"recall": 0.16, "precision": 0.18, "f1": 0.17},
    }
    half = MetricSpec(True, True, "fraction", "share of the positives guessed", tested=False)
    specs = {"recall": spec_to_dict(half), "precision": spec_to_dict(half), "f1": spec_to_dict(MetricSpec())}
    assert privacy_metrics([point], specs) == ["f1"]
    assert spec_from_dict(specs["recall"]).tested is False and spec_from_dict(specs["f1"]).tested is True


def test_harmonic_metric_of_a_victim_table_is_resampled_with_its_parts():
    """F1 of the mean precision and mean recall: the table's value is the harmonic mean of
    its parts, and every bootstrap replicate is the harmonic mean of the replicated parts."""
    from privaudit.results import VictimTable, bootstrap_counts, table_replicates

    p = np.array([1.0, 0.5, 0.0, 0.25, 1.0, 0.5])
    r = np.array([1.0, 1.0, 0.0, 0.5, 0.5, 1.0])
    ones = np.ones(6)
    table = VictimTable(
        [f"client:{k}" for k in range(6)],
        {"precision": ones, "recall": ones},
        {"precision": p, "recall": r},
        {"precision": ones * 0.2, "recall": ones * 0.4},
        harmonic={"f1": ("precision", "recall")},
    )
    mp, mr = p.mean(), r.mean()  # 3.25 / 6, 4 / 6
    assert table.value("f1") == pytest.approx(2 * mp * mr / (mp + mr))
    assert table.value("f1", "prior") == pytest.approx(2 * 0.2 * 0.4 / 0.6)
    counts = bootstrap_counts(6, 50, np.random.default_rng(1)).astype(float)
    reps = table_replicates(table, "f1", "attack", counts)
    for row, got in zip(counts, reps):
        bp, br = row @ p / row.sum(), row @ r / row.sum()
        assert got == pytest.approx(0.0 if bp + br == 0 else 2 * bp * br / (bp + br))
    with pytest.raises(ValueError, match="harmonic"):
        VictimTable(["a"], {"precision": [1.0]}, {"precision": [1.0]}, {}, harmonic={"f1": ("precision", "recall")})


def test_dummy_protocol_null_end_to_end_calibration():
    """End to end on the dummy protocol (full experiments, the null arm included): uploads
    drowned in Laplace noise of scale 1e6 carry nothing; over 30 experiments at fresh seeds the
    share reading "leaks" and the share reading "attack below prior" each stay at most 10 %
    (nominal 5 %; benchmarks/verdict_calibration.py measures it at 200 experiments)."""
    data = tiny_dataset(40, n_items=12)
    leaks = below = 0
    for rep in range(30):
        res = ex.build_experiment(
            protocol="dummy-proto",
            noise="dummy-noise",
            scales=(1e6,),
            seeds=1,
            seed=97 * rep + 1,
            protocol_config={"p": 8},
        ).run(data)
        rows = [r for r in res["verdicts"][0]["rows"] if r["value"] == 1e6]
        assert rows and all("null" in r["tests"]["accuracy"]["arms"] for r in rows)
        leaks += any(r["verdict"] == "leaks" for r in rows)
        below += any(r["verdict"] == "attack below prior" for r in rows)
    assert leaks <= 3 and below <= 3


def test_null_view_keeps_ids_and_shapes_and_takes_values_from_other_clients():
    from privaudit.attacks.null_view import derangement, null_view
    from privaudit.transcript import Transcript

    t = Transcript("x", parties=["server", "client:0", "client:1", "client:2"])
    rows = {0: [1, 2], 1: [2, 3], 2: [1, 3]}
    for c, items in rows.items():
        vals = np.array([[10.0 * c + i] for i in items])
        t.add(0, f"client:{c}", "server", "grad_V", {"items": np.array(items), "values": vals})
        t.add(0, f"client:{c}", "server", "grad_P", {"values": np.full((2, 1), float(c))})
    view = t.view("server")
    nv = null_view(view, np.random.default_rng(0))
    for m, n in zip(view.messages, nv.messages):
        assert (m.sender, m.kind, m.round) == (n.sender, n.kind, n.round)
        assert all(n.payload[k].shape == m.payload[k].shape for k in m.payload)
        own = int(m.sender.split(":")[1])
        if m.kind == "grad_V":
            assert np.array_equal(n.payload["items"], m.payload["items"])  # ids kept
            # every row is another client's row of the same item
            for item, row in zip(n.payload["items"], n.payload["values"][:, 0]):
                who = int(row // 10)
                assert who != own and row == 10.0 * who + item
        else:
            assert n.payload["values"][0, 0] != own  # a donor's whole array
    donors = null_view(view, np.random.default_rng(1), keep_ids=False)
    assert any(
        not np.array_equal(a.payload["items"], b.payload["items"])
        for a, b in zip(view.messages, donors.messages)
        if a.kind == "grad_V"
    )
    d = derangement(7, np.random.default_rng(3))
    assert sorted(d) == list(range(7)) and not np.any(d == np.arange(7))


def test_few_victims_decide_only_a_leak_on_student_t():
    """From MIN_VICTIMS to MIN_VERDICT_VICTIMS victims a test can read "leaks" (Student's t with
    n - 1 degrees of freedom, floored SE) but never "protected" or "attack below prior"; below
    MIN_VICTIMS nothing is decided."""
    from statistics import NormalDist

    from privaudit.results import stats

    def test(adv: float, se: float, n: int) -> dict:
        z = adv / se
        return {"advantage": adv, "se": se, "threshold": 0.05, "n": n, "p": stats._tail(z, n)}

    assert stats.MIN_VICTIMS == 5 and stats.MIN_VERDICT_VICTIMS == 10
    big, null, neg = test(0.6, 0.05, 6), test(0.0, 0.001, 6), test(-0.3, 0.01, 6)
    stats.decide_tests([big, null, neg])
    assert big["status"] == "leaks" and null["status"] == neg["status"] == "too few victims"
    # the t quantile is wider than the normal one: 6 victims, 5 degrees of freedom
    z = 0.6 / 0.05
    assert big["low"] < 0.6 - NormalDist().inv_cdf(1 - big["level"]) * 0.05
    assert stats._tail(z, 6) > 0.5 * math.erfc(z / math.sqrt(2))
    # t = 1.9 over 6 victims: one-sided p 0.058 on t with 5 degrees of freedom (0.029 on the normal)
    weak = test(0.19, 0.1, 6)
    stats.decide_tests([weak])
    assert weak["status"] == "too few victims"
    few = test(0.6, 0.05, 4)
    stats.decide_tests([few])
    assert few["status"] == "too few victims"
    many = test(0.0, 0.001, 12)
    stats.decide_tests([many])
    assert many["status"] == "under margin"

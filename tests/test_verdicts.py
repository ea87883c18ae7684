"""Verdicts: prior and random baselines, advantage bounds, the verdict sentence, "attack not
adapted", ROC numbers, the empirical epsilon and a deliberately broken DP defense."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privaudit import audit as au
from privaudit import experiment as ex
from privaudit import results as rs
from privaudit.cli import main
from privaudit.metrics import clopper_pearson, mean_ci95
from tests.dummies import tiny_dataset, verdict_registry  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("verdict_registry")


@pytest.fixture(scope="module")
def big():
    return tiny_dataset(200, n_items=12)


def test_points_carry_both_baselines_advantage_and_roc(big):
    res = ex.build_experiment("dummy-proto", noise="dummy-noise", scales="0,1", seeds=2, sets=["p=8"]).run(big)
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
    res = ex.build_experiment("dummy-proto", attack="dummy-aux-attack", sweep="attack.aux_fraction=0,1", seeds=1).run(
        big
    )
    assert res["metric_specs"]["accuracy"] == rs.spec_to_dict(rs.FALLBACK_SPEC, declared=False)
    assert res["figure_metrics"] == ["accuracy"]  # "victims" (200) is not in [0, 1]: not plotted
    assert "not a defense strength" in res["verdicts"][0]["sentence"]


def test_noise_sweep_verdict_names_the_crossover_and_its_utility_cost(big):
    res = ex.build_experiment("dummy-proto", noise="dummy-noise", scales="0,1,10,100", seeds=3, sets=["p=8"]).run(big)
    v = res["verdicts"][0]
    rows = {r["value"]: r for r in v["rows"]}
    # the advantage bound by hand: mean + t(0.975, 2) * sd / sqrt(3) over the seeds
    for value, row in rows.items():
        adv = [p["attack_metrics"]["accuracy"] - 0.5 for p in res["points"] if p["value"] == value]
        m, h = mean_ci95(adv)
        assert row["advantage_high"] == pytest.approx(m + h) and row["bound"] == "student-t over 3 seeds"
    first = next(value for value in (0.0, 1.0, 10.0, 100.0) if rows[value]["advantage_high"] < 0.05)
    assert v["strength"] == first and rows[0.0]["verdict"] == "leaks"
    u0 = np.mean([p["utility"]["ndcg@10"] for p in res["points"] if p["value"] == 0.0])
    u1 = np.mean([p["utility"]["ndcg@10"] for p in res["points"] if p["value"] == first])
    assert v["utility_cost"] == pytest.approx(u0 - u1)
    assert v["sentence"].startswith(
        f"dummy-attack (accuracy): stopped from dummy-noise.scale = {rs.fmt_value(first)} on"
    )
    assert f"ndcg@10 costs {rs.fmt(u0 - u1, 4)}" in v["sentence"]


def test_one_seed_uses_a_clopper_pearson_bound(big):
    res = ex.build_experiment("dummy-proto", noise="dummy-noise", scales="1", seeds=1, sets=["p=8"]).run(big)
    row = res["verdicts"][0]["rows"][0]
    acc = res["points"][0]["attack_metrics"]["accuracy"]
    lo, hi = clopper_pearson(int(round(acc * 1600)), 1600)
    assert row["bound"] == "clopper-pearson, one seed, 1600 records"
    assert row["advantage_high"] == pytest.approx(hi - 0.5) and row["advantage_low"] == pytest.approx(lo - 0.5)


def test_one_seed_without_a_record_count_shows_no_bound():
    spec = rs.MetricSpec(higher_is_better=True, unit="fraction")
    interval = rs.advantage_interval([0.9], [0.3], spec)  # no record count: the point estimate only
    assert interval["low"] == interval["high"] == pytest.approx(0.6)
    assert rs.fmt_advantage(interval["mean"], interval["high"]) == "0.600 (no interval)"
    assert rs.fmt_advantage(0.6, 0.65) == "0.600 (≤ 0.650)"
    row = {"advantage": 0.6, "advantage_high": 0.6, "bound": interval["method"], "against": "prior"}
    assert rs._adv_text(row) == "advantage over the prior-only baseline 0.600 (one seed: point estimate, no interval)"


def test_non_noise_defense_sweep_runs_an_undefended_reference(big):
    res = ex.build_experiment("dummy-proto", sweep="dummy-dp.epsilon=0.05,0.01", defenses=["dummy-dp"], seeds=2).run(
        big
    )
    assert len(res["reference"]) == 2 and all(p.get("reference") for p in res["reference"])
    assert all(p["utility"]["ndcg@10"] == 1.0 for p in res["reference"])  # undefended: uploads exact
    v = res["verdicts"][0]
    if v["strength"] is not None:
        u = np.mean([p["utility"]["ndcg@10"] for p in res["points"] if p["value"] == v["strength"]])
        assert v["utility_cost"] == pytest.approx(1.0 - u)


def test_broken_dp_defense_is_flagged_and_correct_one_is_not(big):
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
    assert broken["dp_violation"] is True and broken["verdict"] == "leaks"
    assert broken["epsilon_lb"] > broken["epsilon"] == pytest.approx(2 * 0.5)  # 2 rounds x 0.5 claimed
    assert correct["dp_violation"] is False and correct["epsilon_lb"] < correct["epsilon"]
    # at its strongest value (claimed 1; at claimed 4 the held-out half resolves only e^3.7)
    runs = [r for r in audit["runs"] if r.get("defense") == "dummy-broken-dp" and r["value"] == 0.5]
    assert runs and all(r["attacks"]["dummy-attack"]["empirical_epsilon"]["bit"]["violation"] for r in runs)
    assert "DP violation" in audit["verdicts"][0]["sentence"]
    text = au.format_matrix(audit)
    assert "DP-VIOLATION" in text
    # one epsilon per report: the total over the run, its unit and delta in the header
    from privaudit.reports.audit import render_html

    page = render_html(audit)
    assert "ε total over the run (δ=0, per one secret bit, basic)" in page and "DP VIOLATION" in page


def test_attack_below_its_prior_is_not_adapted_never_protection(big, tmp_path):
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
    info = {a["name"]: a for a in audit["attacks"]}
    assert info["dummy-minority-attack"]["applies"]
    cells = [c for c in audit["matrix"] if c["attack"] == "dummy-minority-attack"]
    assert cells and all(c["verdict"] == "attack not adapted" for c in cells)
    assert all(c["against"] == "prior" for c in cells)  # the majority (0.8) beats the random guess (0.5)
    below = [c for c in audit["matrix"] if c["advantage"] < 0]
    assert below and all(c["verdict"] == "attack not adapted" for c in below)  # never shown as protected
    v = next(v for v in audit["verdicts"] if v["attack"] == "dummy-minority-attack")
    assert v["strength"] is None and "attack not adapted" in v["sentence"]
    out = au.write_audit(audit, tmp_path / "a")
    page = (out / "audit.html").read_text()
    not_adapted = [c for c in audit["matrix"] if c["verdict"] == "attack not adapted"]
    assert page.count('class="verdict-not-adapted"') == len(not_adapted) >= len(cells)  # hatched, never green
    assert 'class="verdict-not-adapted" style=' not in page


def test_negative_seed_is_one_line_error(tmp_path, capsys):
    assert main(["attack", "--protocol", "dummy-proto", "--seed", "-1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["privaudit: error: --seed must be non-negative, got -1"]
    assert main(["run", "--protocol", "dummy-proto", "--seed", "-2", "-o", str(tmp_path / "x.ptx")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["privaudit: error: --seed must be non-negative, got -2"]
    assert not (tmp_path / "r").exists()

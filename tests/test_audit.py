"""Audit: attack/defense selection, the matrix, audit.json/html, dp-laplace, Dask, determinism."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from privaudit import audit as au
from privaudit import experiment as ex
from privaudit import registry
from privaudit.cli import main
from privaudit.errors import PrivauditError
from tests.dummies import tiny_dataset, write_csv

DEFENSES = ["dummy-noise", "dp-laplace"]


def strip_timings(obj):
    """``obj`` without timing entries (keys mentioning seconds/timing, tracebacks)."""
    if isinstance(obj, dict):
        return {k: strip_timings(v) for k, v in obj.items() if not re.search(r"seconds|timing|traceback", k)}
    if isinstance(obj, list):
        return [strip_timings(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None  # NaN (e.g. a TPR at an FPR too small for the negatives): compare as missing
    return obj


@pytest.fixture(scope="module")
def ds():
    return tiny_dataset(30)


@pytest.fixture
def small_audit(dummy_registry, ds):
    return au.run_audit(au.Audit("dummy-proto", seeds=2, defenses=DEFENSES, jobs=1), dataset=ds)


def test_selection_from_declarations(dummy_registry):
    names = [a.name for a in au.applicable_attacks("dummy-proto")]
    assert names == ["dummy-attack", "dummy-aux-attack", "dummy-needs-attack"]  # declared protocols
    assert "mvmf-analytic" not in names
    swept, skipped = au.applicable_defenses("dummy-proto")
    swept = [d.name for d in swept]
    assert "dummy-noise" in swept and "dp-laplace" in swept and "laplace" in swept
    reasons = dict(skipped)
    assert reasons["dummy-encrypt"] == "no strength grid to sweep"
    if "dp-sgd" in registry.available("defense"):
        assert reasons["dp-sgd"].startswith("applies only to fedncf")
    if "secagg" in registry.available("defense"):
        assert reasons["secagg"].startswith("hides per-client plaintext")


def test_matrix_numbers(small_audit):
    a = small_audit
    assert [x["name"] for x in a["attacks"]] == ["dummy-attack", "dummy-aux-attack", "dummy-needs-attack"]
    assert [d["name"] for d in a["defenses"]] == ["dp-laplace", "dummy-noise"]  # registry order
    needs = a["attacks"][2]
    assert needs["applies"] is False and "grad_X" in needs["reason"]
    assert a["attacks"][0]["applies"] is True
    cell = {(c["attack"], c["defense"]): c for c in a["matrix"]}
    # exact sign attack (1.0) against the strongest message-free guess: the random 0.5 or the same
    # attack on the null view (donors' messages: about 0.5, by chance a little more)
    undefended = [r["attacks"]["dummy-attack"] for r in a["runs"] if r.get("defense") is None]
    null = np.mean([r["baseline_null"]["accuracy"] for r in undefended])
    assert cell[("dummy-attack", None)]["advantage"] == pytest.approx(1.0 - max(0.5, null))
    assert cell[("dummy-attack", None)]["against"] == ("null" if null > 0.5 else "random")
    assert cell[("dummy-attack", "dummy-noise")]["value"] == 10.0  # the strongest grid value
    assert cell[("dummy-attack", "dummy-noise")]["advantage"] < 0.25
    assert cell[("dummy-attack", "dummy-noise")]["utility_cost"] > 0.5
    assert cell[("dummy-attack", "dp-laplace")]["value"] == 0.3
    assert cell[("dummy-attack", "dp-laplace")]["epsilon"] == pytest.approx(0.6)  # 2 rounds x 0.3
    assert cell[("dummy-needs-attack", None)]["verdict"] == "not applicable"  # never ran: no advantage claimed
    assert np.isnan(cell[("dummy-needs-attack", None)]["advantage"])
    # one protocol run per (defense, value, seed) plus the undefended ones
    assert len(a["runs"]) == 2 * (1 + 4 + 6)
    assert all(set(r["attacks"]) == {"dummy-attack", "dummy-aux-attack", "dummy-needs-attack"} for r in a["runs"])


def test_audit_files_self_contained(small_audit, tmp_path):
    out = au.write_audit(small_audit, tmp_path / "audit")
    data = json.loads((out / "audit.json").read_text())
    for key in (
        "privaudit_version",
        "protocol",
        "protocol_config",
        "dataset",
        "seeds",
        "attacks",
        "defenses",
        "runs",
        "matrix",
        "timing",
    ):
        assert key in data
    page = (out / "audit.html").read_text()
    # one figure per (attack, defense) pair, and one ROC figure (only dummy-attack makes decisions)
    assert page.count('class="pa-figure"') == 3 * 2 + 1
    assert page.count("<svg") == 7
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page) and "<link" not in page
    # one name per number: the per-round parameter and the total over the run are named apart
    assert "dp-laplace.epsilon (ε per round) = 0.3" in page and "ε total 0.60" in page
    assert "(epsilon=" not in page and "does not apply" in page and "privaudit 0.1.0" in page


def test_audit_is_deterministic_and_independent_of_jobs(dummy_registry, ds):
    a = au.run_audit(au.Audit("dummy-proto", seeds=2, defenses=DEFENSES, jobs=1), dataset=ds)
    b = au.run_audit(au.Audit("dummy-proto", seeds=2, defenses=DEFENSES, jobs=1), dataset=ds)
    c = au.run_audit(au.Audit("dummy-proto", seeds=2, defenses=DEFENSES, jobs=2), dataset=ds)
    assert strip_timings(a) == strip_timings(b)
    assert strip_timings(a)["runs"] == strip_timings(c)["runs"]


def test_dask_cluster_reproduces_local_numbers(dummy_registry, ds):
    distributed = pytest.importorskip("dask.distributed")
    local = au.run_audit(au.Audit("dummy-proto", seeds=2, defenses=["dummy-noise"], jobs=1), dataset=ds)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        remote = au.run_audit(
            au.Audit("dummy-proto", seeds=2, defenses=["dummy-noise"], scheduler=cluster.scheduler_address), dataset=ds
        )
        exp = ex.build_experiment(protocol="dummy-proto", noise="dummy-noise", scales=(0, 1, 10), seeds=2)
        sweep_dask = ex.run_experiment(
            ex.Experiment(**{**exp.__dict__, "scheduler": cluster.scheduler_address}), dataset=ds
        )
    assert remote["timing"]["backend"].startswith("dask scheduler")
    assert strip_timings(local)["runs"] == strip_timings(remote)["runs"]
    assert strip_timings(local)["matrix"] == strip_timings(remote)["matrix"]
    sweep_local = ex.run_experiment(exp, dataset=ds)
    assert strip_timings(sweep_local["points"]) == strip_timings(sweep_dask["points"])


def test_experiment_results_json_deterministic(dummy_registry, ds, tmp_path):
    from privaudit import reports

    for name in ("a", "b"):
        exp = ex.build_experiment(protocol="dummy-proto", noise="dummy-noise", scales=(0, 1), seeds=2)
        reports.write_report(ex.run_experiment(exp, dataset=ds), tmp_path / name)
    a, b = (json.loads((tmp_path / n / "results.json").read_text()) for n in ("a", "b"))
    assert strip_timings(a) == strip_timings(b)
    assert (tmp_path / "a" / "accuracy_vs_noise.svg").read_bytes() != b"" and a["points"] != []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"protocol": "nope"}, "unknown protocol 'nope'"),
        ({"defenses": ["nope"]}, "unknown defense 'nope'"),
        ({"defenses": ["dp-prototypes"]}, "cannot be swept"),  # applies only to fedproto
        ({"attacks": ["mvmf-analytic"]}, "do not read 'dummy-proto'"),
        ({"seeds": 0}, "--seeds must be at least 1"),
        ({"scheduler": "local:x", "defenses": ["dummy-noise"]}, "expected local:N"),
    ],
)
def test_audit_bad_input(dummy_registry, ds, kwargs, message):
    kwargs = dict(kwargs)
    protocol = kwargs.pop("protocol", "dummy-proto")
    with pytest.raises(PrivauditError, match=re.escape(message)):
        au.run_audit(au.Audit(protocol, **kwargs), dataset=ds)


def test_audit_cli(dummy_registry, capsys, tmp_path):
    csv = write_csv(tmp_path / "r.csv", 20)
    out = tmp_path / "aud"
    code = main(
        [
            "audit",
            "--protocol",
            "dummy-proto",
            "--defense",
            "dummy-noise",
            "--data",
            csv,
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = [line for line in captured.out.splitlines() if not line.startswith("verdict: ")]
    assert captured.out.startswith("verdict: dummy-attack (accuracy): ")
    assert lines[0].split()[:5] == ["attack", "(advantage,", "verdict)", "no", "defense"]
    # the exact sign attack (1.0) against the strongest message-free guess: the random 0.5 or the
    # same attack on the null view (few clients here: the donors' bits agree by chance more often)
    runs = json.loads((out / "audit.json").read_text())["runs"]
    null = np.mean([r["attacks"]["dummy-attack"]["baseline_null"]["accuracy"] for r in runs if r["defense"] is None])
    assert lines[2].split()[0] == "dummy-attack" and lines[2].split()[2] == "leaks"
    assert float(lines[2].split()[1]) == pytest.approx(1.0 - max(0.5, null), abs=5e-4)
    assert "note: dummy-needs-attack does not apply" in captured.out
    assert (out / "audit.json").exists() and (out / "audit.html").exists()


def test_audit_help_lists_every_protocol(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in registry.available("protocol"):
        assert name in text


# ------------------------------------------------------------------------------ dp-laplace


class _Chan:
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)


def test_dp_laplace_clips_rows_and_calibrates_noise():
    from privaudit.defenses.base import UploadBatch
    from privaudit.defenses.dp_laplace import DPLaplace, clip_l1_rows

    rows = np.array([[3.0, -1.0], [0.2, 0.1], [0.0, 0.0]])
    clipped = clip_l1_rows(rows, 2.0)
    assert np.allclose(np.abs(clipped).sum(axis=1), [2.0, 0.3, 0.0])
    assert np.allclose(clipped[0], [1.5, -0.5])
    assert np.allclose(clip_l1_rows(np.array([4.0, 4.0]), 1.0), [0.5, 0.5])

    d = DPLaplace(epsilon=0.5, clip=2.0)
    assert d.noise_scale == 8.0  # sensitivity 2C / epsilon
    big = {"values": np.zeros((400, 50)), "items": np.arange(400)}
    out = d.on_upload(UploadBatch(0, "grad_V", ["client:0"], [big]), _Chan())
    noise = out.payloads[0]["values"]
    assert np.array_equal(out.payloads[0]["items"], np.arange(400))  # ints untouched
    assert np.mean(np.abs(noise)) == pytest.approx(8.0, rel=0.03)  # E|Laplace(b)| = b
    spent = d.privacy_spent(20)
    assert {k: spent[k] for k in ("epsilon", "delta", "accountant", "epsilon_basic", "epsilon_per_round")} == {
        "epsilon": 10.0,
        "delta": 0.0,
        "accountant": "basic",
        "epsilon_basic": 10.0,
        "epsilon_per_round": 0.5,
    }
    assert spent["neighbour"] == "rating" and spent["epsilon_pld"] < 10.0  # PLD at delta 1e-5 is tighter


def test_dp_laplace_upload_clipping_and_validation():
    from privaudit.defenses.base import UploadBatch
    from privaudit.defenses.dp_laplace import DPLaplace

    d = DPLaplace(epsilon=1e9, clip=1.0, clip_per="upload")  # negligible noise
    payload = {"values": np.array([[1.0, 1.0]]), "P": np.array([2.0])}
    out = d.on_upload(UploadBatch(0, "u", ["client:0"], [payload]), _Chan()).payloads[0]
    total = np.abs(out["values"]).sum() + np.abs(out["P"]).sum()
    assert total == pytest.approx(1.0, abs=1e-6)
    for bad in ({"epsilon": 0}, {"clip": -1.0}, {"clip_per": "item"}):
        with pytest.raises(PrivauditError):
            DPLaplace(**bad)
    assert DPLaplace.strength == "epsilon" and DPLaplace.default_grid[0] > DPLaplace.default_grid[-1]


def test_runs_with_a_canary_run_are_handed_out_first():
    """The DP cells' runs with a canary run go to the workers first, the undefended runs last."""
    runs, _ = au._plan(au.Audit(protocol="fedmvmf", seeds=1))
    ranks = {(r.defense_name, au._cost_rank(r)) for r in runs}
    assert ("dp-gaussian", 0) in ranks and ("dp-laplace", 0) in ranks
    assert ("laplace", 1) in ranks and ("sampling", 1) in ranks and (None, 2) in ranks
    two, _ = au._plan(au.Audit(protocol="fedmvmf", seeds=2))  # one canary run per DP cell, at its first seed
    dp = [r for r in two if r.defense_name in ("dp-gaussian", "dp-laplace")]
    assert {(r.seed, au._cost_rank(r)) for r in dp} == {(0, 0), (1, 1)}
    assert all(r.canaries == 0 for r in dp if r.seed == 1) and all(r.canaries != 0 for r in dp if r.seed == 0)
    no_canaries, _ = au._plan(au.Audit(protocol="fedmvmf", seeds=1, canaries=0))
    assert {au._cost_rank(r) for r in no_canaries if r.defense_cls is not None} == {1}


def test_a_wide_matrix_prints_in_column_groups_of_at_most_100_characters():
    """Six defense columns do not fit 100 columns: the matrix is printed as several tables, each
    repeating the attack column, every cell whole."""
    from privaudit.reports.audit import ROW_CHARS, format_matrix

    defenses = [{"name": f"defense-{k}", "strength": "noise_multiplier", "grid": [30.0]} for k in range(6)]
    attacks = [{"name": f"attack-{k}", "applies": True} for k in range(3)]
    matrix = [
        {"attack": a["name"], "defense": d, "verdict": "attack below prior", "advantage": -0.163}
        for a in attacks
        for d in [None] + [x["name"] for x in defenses]
    ]
    text = format_matrix({"attacks": attacks, "defenses": defenses, "matrix": matrix, "verdicts": []})
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= ROW_CHARS
    heads = [line for line in lines if line.startswith("attack (advantage, verdict)")]
    assert len(heads) >= 2 and all(f"defense-{k}.noise_multiplier=30" in text for k in range(6))
    assert text.count("-0.163 BELOW-PRIOR") == 3 * 7  # every cell, none cut

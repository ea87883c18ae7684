"""Experiments: sweeps, seeds, default sweeps, determinism, transcripts, input errors."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from privaudit import experiment as ex
from privaudit.errors import PrivauditError
from tests.dummies import tiny_dataset

pytestmark = pytest.mark.usefixtures("dummy_registry")


@pytest.fixture(scope="module")
def ds():
    return tiny_dataset(30)


def _acc(results, value):
    return [p["attack_metrics"]["accuracy"] for p in results["points"] if p["value"] == value]


def test_noise_sweep_points_summary_and_schema(ds):
    exp = ex.build_experiment(protocol="dummy-proto", noise="dummy-noise", scales=(0, 0.1, 10), seeds=3, seed=5)
    res = exp.run(ds)
    assert res["sweep"] == "dummy-noise.scale" and res["noise"] is True
    assert res["attack"] == "dummy-attack"  # the protocol's default attack
    assert res["defenses"] == [{"name": "dummy-noise", "scale": 0.0}]
    assert [(p["value"], p["seed"]) for p in res["points"]] == [(v, s) for v in (0.0, 0.1, 10.0) for s in (5, 6, 7)]
    assert _acc(res, 0.0) == [1.0, 1.0, 1.0]  # noise-free: the sign attack is exact
    assert np.mean(_acc(res, 10.0)) < 0.7  # Laplace(10) on +-1 uploads: near the 0.5 baseline
    assert all(p["baseline_random"] == {"accuracy": 0.5} for p in res["points"])
    assert all(p["utility"]["ndcg@10"] == 1.0 for p in res["points"] if p["value"] == 0.0)
    assert all(p["seconds"] > 0 for p in res["points"])
    rows = {(r["value"], r["metric"]): r for r in res["summary"]}
    r = rows[(10.0, "accuracy")]
    m, c = np.mean(_acc(res, 10.0)), 4.302652729911275 * np.std(_acc(res, 10.0), ddof=1) / math.sqrt(3)
    assert r["mean"] == pytest.approx(m) and r["ci95"] == pytest.approx(c)
    assert rows[(0.0, "accuracy")]["ci95"] == 0.0
    assert (0.0, "baseline.accuracy") in rows and (0.0, "utility.ndcg@10") in rows
    assert res["figure_metrics"] == ["accuracy"]  # "victims" is a count, not plotted
    assert res["utility_metric"] == "ndcg@10"
    assert res["dataset"]["users"] == 30 and res["dataset"]["name"] == "tiny"
    for key in (
        "privaudit_version",
        "protocol",
        "protocol_config",
        "attack",
        "sweep",
        "defenses",
        "dataset",
        "points",
        "summary",
    ):
        assert key in res
    assert res["protocol_config"] == {"p": 4, "rounds": 2, "signal": 1.0, "delay": 0.0, "bias": 0.5}


def test_results_do_not_depend_on_jobs(ds):
    exp1 = ex.build_experiment(protocol="dummy-proto", noise="dummy-noise", scales=(0.5, 1, 2), seeds=2, jobs=1)
    exp2 = ex.build_experiment(protocol="dummy-proto", noise="dummy-noise", scales=(0.5, 1, 2), seeds=2, jobs=2)
    a, b = exp1.run(ds), exp2.run(ds)
    strip = lambda r: [(p["value"], p["seed"], p["attack_metrics"], p["utility"]) for p in r["points"]]  # noqa: E731
    assert strip(a) == strip(b)
    assert len({p["attack_metrics"]["accuracy"] for p in a["points"]}) > 1  # noise really drawn


def test_point_streams_depend_on_seed_and_index():
    a = np.random.default_rng(ex.point_streams(0, 0)[0]).random()
    assert a == np.random.default_rng(ex.point_streams(0, 0)[0]).random()
    assert a != np.random.default_rng(ex.point_streams(0, 1)[0]).random()
    assert a != np.random.default_rng(ex.point_streams(1, 0)[0]).random()
    assert a != np.random.default_rng(ex.point_streams(0, 0)[1]).random()


def test_attack_default_sweep_is_used(ds):
    res = ex.build_experiment(protocol="dummy-proto", attack="dummy-aux-attack", seeds=2).run(ds)
    assert res["sweep"] == "attack.aux_fraction" and res["noise"] is False
    assert [p["value"] for p in res["points"]] == [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
    assert _acc(res, 1.0) == [1.0, 1.0]
    assert 0.3 < np.mean(_acc(res, 0.0)) < 0.7
    # an explicit attack parameter switches the default sweep off
    one = ex.build_experiment(
        protocol="dummy-proto", attack={"name": "dummy-aux-attack", "aux_fraction": 1}, seeds=1
    ).run(ds)
    assert one["sweep"] is None and [p["value"] for p in one["points"]] == [None]
    assert one["attack_params"] == {"aux_fraction": 1.0}


def test_defense_strength_grid_is_the_default_sweep(ds):
    res = ex.build_experiment(protocol="dummy-proto", defenses=["dummy-noise"], seeds=1).run(ds)
    assert res["sweep"] == "dummy-noise.scale"
    assert [p["value"] for p in res["points"]] == [0.0, 0.1, 1.0, 10.0]
    fixed = ex.build_experiment(protocol="dummy-proto", defenses=[{"name": "dummy-noise", "scale": 0.1}], seeds=1).run(
        ds
    )
    assert fixed["sweep"] is None and fixed["defenses"] == [{"name": "dummy-noise", "scale": 0.1}]


def test_protocol_and_defense_sweeps(ds):
    res = ex.build_experiment(protocol="dummy-proto", sweep=ex.Sweep("protocol", "p", (2, 6)), seeds=1).run(ds)
    assert res["sweep"] == "protocol.p" and [p["value"] for p in res["points"]] == [2, 6]
    res = ex.build_experiment(
        protocol="dummy-proto", defenses=["dummy-noise"], sweep=ex.Sweep("dummy-noise", "scale", (0, 100)), seeds=2
    ).run(ds)
    assert res["sweep"] == "dummy-noise.scale" and _acc(res, 0.0) == [1.0, 1.0]
    assert np.mean(_acc(res, 100.0)) < 0.75
    # a defense named only by the sweep is activated
    res = ex.build_experiment(protocol="dummy-proto", sweep=ex.Sweep("dummy-noise", "scale", (0,)), seeds=1).run(ds)
    assert res["defenses"] == [{"name": "dummy-noise", "scale": 0.0}]


def test_unsupported_attack_scores_as_baseline(ds):
    res = ex.build_experiment(protocol="dummy-proto", defenses=["dummy-encrypt"], seeds=1).run(ds)
    (p,) = res["points"]
    assert p["attack_metrics"] == p["baseline_random"] == {"accuracy": 0.5}
    assert p["supported"] is False and "ciphertexts" in p["reason"]


def test_privacy_spent_recorded_per_point(ds):
    res = ex.build_experiment(
        protocol="dummy-proto", noise="dummy-noise", scales=(0, 2), seeds=1, protocol_config={"rounds": 3}
    ).run(ds)
    p0, p2 = res["points"]
    assert "privacy" not in p0
    assert p2["privacy"] == {"dummy-noise": {"rounds": 3, "rounds_source": "protocol", "epsilon": 1.5}}


def test_users_subsample_is_seeded(ds):
    a = ex.subsample_users(ds, 10, seed=0)
    b = ex.subsample_users(ds, 10, seed=0)
    c = ex.subsample_users(ds, 10, seed=1)
    assert a.n_users == 10 and np.array_equal(a.user_ids, b.user_ids)
    assert not np.array_equal(a.user_ids, c.user_ids)
    assert ex.subsample_users(ds, ds.n_users, 0) is ds
    with pytest.raises(PrivauditError, match=rf"--users {ds.n_users + 1}: the dataset has only {ds.n_users} users"):
        ex.subsample_users(ds, ds.n_users + 1, 0)
    res = ex.build_experiment(protocol="dummy-proto", users=7, seeds=1).run(ds)
    assert res["dataset"]["users"] == 7 and res["dataset"]["subsampled_users"] == 7
    assert res["points"][0]["attack_metrics"]["victims"] == 7.0


def test_transcript_reattack_matches_in_memory(ds, tmp_path):
    spec = {"name": "dummy-aux-attack", "aux_fraction": 0.5}  # the attack draws from its rng
    mem = ex.build_experiment(
        protocol="dummy-proto", attack=spec, defenses=[{"name": "dummy-noise", "scale": 0.5}], seeds=1, seed=4
    ).run(ds)
    run = ex.run_transcript(
        protocol="dummy-proto", defenses=[{"name": "dummy-noise", "scale": 0.5}], seed=4, dataset=ds
    )
    assert run.transcript.seed == 4
    path = run.transcript.save(tmp_path / "run.ptx")
    res = ex.attack_transcript(path, spec)
    assert res["points"][0]["attack_metrics"] == mem["points"][0]["attack_metrics"]
    assert res["points"][0]["value"] is None and res["sweep"] is None
    assert res["defenses"] == [{"name": "dummy-noise", "scale": 0.5}]
    assert res["attack"] == "dummy-aux-attack"
    # the default attack, from the transcript's protocol
    assert ex.attack_transcript(run.transcript)["attack"] == "dummy-attack"
    with pytest.raises(PrivauditError, match="no private messages"):
        ex.attack_transcript(run.transcript.without_private())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"protocol": "nope"}, "unknown protocol 'nope'"),
        ({"attack": "nope"}, "unknown attack 'nope'"),
        ({"attack": {"name": "dummy-attack", "bogus": 1}}, "unknown parameter 'bogus'"),
        ({"attack": {"name": "dummy-attack", "threshold": "abc"}}, "threshold must be a number"),
        ({"attack": 3}, "attack: expected a name, a class, an instance or {'name': ...}, got 3"),
        ({"defenses": ["nope"]}, "unknown defense 'nope'"),
        ({"defenses": [{"scale": 1}]}, "defense: a mapping needs 'name'"),
        ({"sweep": ("dummy-noise", "scale")}, "sweep: expected privaudit.Sweep(target, param, values) or"),
        ({"sweep": "dummy-noise=1"}, "--sweep: expected TARGET.PARAM=V1,V2,..."),
        ({"sweep": ex.Sweep("dummy-noise", "sigma", (1, 2))}, "has no parameter 'sigma'"),
        ({"sweep": ex.Sweep("attack", "nope", (1,))}, "has no parameter 'nope'"),
        ({"sweep": ex.Sweep("protocol", "K", (1,))}, "has no parameter 'K'"),
        ({"sweep": ex.Sweep("protocol", "p", (1, "x"))}, "p must be an integer"),
        ({"sweep": ex.Sweep("protocol", "p", (0, 1))}, "p must be an integer >= 1, got 0"),
        ({"protocol_config": {"bogus": 1}}, "unknown parameter 'bogus'"),
        ({"scales": (0, 1)}, "scales need a noise defense (noise=...)"),
        ({"noise": "dummy-noise", "sweep": ex.Sweep("protocol", "p", (1,))}, "either noise= or sweep="),
        ({"noise": "dummy-encrypt"}, "with a 'scale' parameter"),
        ({"noise": "dummy-noise", "scales": (0, "a")}, "scale must be a number"),
        ({"seeds": 0}, "--seeds must be at least 1"),
        ({"jobs": 0}, "--jobs must be"),
        ({"users": 0}, "--users must be at least 1"),
    ],
)
def test_bad_input_is_a_privaudit_error(ds, kwargs, message):
    kwargs = dict(kwargs)
    protocol = kwargs.pop("protocol", "dummy-proto")
    with pytest.raises(PrivauditError, match=re.escape(message)):
        ex.build_experiment(protocol=protocol, **kwargs).run(ds)


def test_the_api_takes_classes_and_instances(ds):
    """A registered class or a configured instance names an attack or defense like its name."""
    from privaudit import registry

    noise = registry.get("defense", "dummy-noise")(scale=0.5)
    attack = registry.get("attack", "dummy-aux-attack")
    by_object = ex.build_experiment(protocol=registry.get("protocol", "dummy-proto"), attack=attack, defenses=[noise])
    assert (by_object.protocol, by_object.attack, by_object.defenses) == (
        "dummy-proto",
        "dummy-aux-attack",
        [("dummy-noise", {"scale": 0.5})],
    )
    with pytest.raises(TypeError):
        ex.build_experiment("dummy-proto")  # keyword arguments only


def test_missing_data_path_is_a_privaudit_error(tmp_path):
    with pytest.raises(PrivauditError, match="no such file"):
        ex.build_experiment(protocol="dummy-proto", data=str(tmp_path / "missing")).run()


def test_attack_sweep_runs_the_protocol_once_per_seed(ds, monkeypatch):
    from tests.dummies import DummyProtocol

    calls = []
    original = DummyProtocol.run

    def counting(self, dataset, config=None, defenses=(), rng=None):
        calls.append(rng)
        return original(self, dataset, config, defenses, rng)

    monkeypatch.setattr(DummyProtocol, "run", counting)
    res = ex.build_experiment(protocol="dummy-proto", attack="dummy-aux-attack", seeds=2, seed=3, jobs=1).run(ds)
    assert calls == [3, 4]  # the protocol runs with the integer seed (common random numbers)
    assert len(res["points"]) == 6
    calls.clear()
    ex.build_experiment(protocol="dummy-proto", noise="dummy-noise", scales=(0, 1), seeds=1, seed=2, jobs=1).run(ds)
    assert calls == [2, 2]

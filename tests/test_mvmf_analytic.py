"""Tests of the closed-form FedMVMF attack ``mvmf-analytic`` (privaudit/attacks/mvmf/analytic.py).

Transcripts come from the real FedMVMF protocol on the synthetic MovieLens-like dataset
(fast) and on MovieLens 100K (``-m slow``, every user).
"""

from __future__ import annotations

import numpy as np
import pytest

from privaudit import registry
from privaudit.attacks.mvmf.analytic import MVMFAnalytic
from privaudit.data import load_dataset, synthetic
from privaudit.defenses.paillier import TEST_KEY_LENGTH
from privaudit.transcript import load

SCENARIOS = [(u, c) for u in ("semials", "sgd") for c in ("obsonly", "inclunc")]


@pytest.fixture
def no_null_arm(monkeypatch):
    """The cache-counting tests count the decodes of the real view: the null arm (the attack on
    a null view, other inputs, so decoded on its own) is switched off for them."""
    from privaudit.attacks.base import Attack

    monkeypatch.setattr(Attack, "null_arm", False)


def _run(dataset, update, unrated, defenses=(), epochs=2, record_rounds=2, seed=0, **extra):
    proto = registry.get("protocol", "fedmvmf")()
    cfg = {
        "update": update,
        "unrated": unrated,
        "epochs": epochs,
        "record_rounds": record_rounds,
        "cold_user_fraction": 0.0,
        **extra,
    }
    return proto.run(dataset, cfg, list(defenses), rng=seed).transcript


def _laplace(scale):
    return registry.get("defense", "laplace")(scale=scale)


@pytest.fixture(scope="module")
def small():
    return synthetic(n_users=80, n_items=120, seed=3)


def _attack(transcript, **params):
    return MVMFAnalytic(**params).evaluate(transcript, np.random.default_rng(0))


def test_declaration_and_default_attack():
    cls = registry.get("attack", "mvmf-analytic")
    assert cls is MVMFAnalytic
    assert cls.party == "server"
    assert cls.protocols == ("fedmvmf", "privmvmf")
    assert cls.requires == ("grad_V", "grad_P", "state")
    assert cls.primary_metric == "rating_accuracy"
    assert registry.get("protocol", "fedmvmf").default_attack == "mvmf-analytic"


@pytest.mark.parametrize("update,unrated", SCENARIOS)
def test_exact_without_noise(small, update, unrated):
    tr = _run(small, update, unrated)
    out = _attack(tr)
    m = out.metrics
    assert out.reconstruction.supported
    assert m["victims"] == 80
    assert m["rating_accuracy"] >= 0.999
    assert m["attribute_accuracy"] >= 0.999
    assert m["rated_rating_accuracy"] >= 0.999
    assert m["rated_detection_accuracy"] >= 0.999
    # well above both baselines
    assert m["rating_accuracy"] > out.baseline["rating_accuracy"] + 0.5


@pytest.mark.parametrize("update", ["semials", "sgd"])
def test_exact_from_one_pair_and_from_many_rounds(small, update):
    tr = _run(small, update, "obsonly", epochs=4, record_rounds=4)
    for rounds in (2, -1):
        m = _attack(tr, max_rounds=rounds).metrics
        assert m["rating_accuracy"] >= 0.999 and m["attribute_accuracy"] >= 0.999


def test_sgd_obsonly_needs_two_rounds(small):
    tr = _run(small, "sgd", "obsonly", epochs=1, record_rounds=1)
    out = _attack(tr)
    assert not out.reconstruction.supported
    assert "two consecutive" in out.reconstruction.reason
    assert out.metrics["rating_accuracy"] == out.baseline["rating_accuracy"]


@pytest.mark.parametrize("update,rho,w", [("semials", 1.0, None), ("semials", 1.0, 0.05), ("sgd", 0.5, None)])
def test_sampling_defense_virtual_items_decided(small, update, rho, w):
    """PrivMVMF-style sampling without encryption: sampled items (weight w, rating 0) are told apart exactly."""
    samp = registry.get("defense", "sampling")(rho=rho, w=w)
    tr = _run(small, update, "obsonly", defenses=[samp])
    m = _attack(tr).metrics
    assert m["rated_detection_accuracy"] >= 0.999
    assert m["rating_accuracy"] >= 0.999 and m["attribute_accuracy"] >= 0.999


@pytest.mark.parametrize("unrated", ["obsonly", "inclunc"])
def test_noise_degrades_gracefully(small, unrated):
    scales = [1e-4, 1e-2, 1e-1, 1.0]
    accs, base = [], None
    for b in scales:
        out = _attack(_run(small, "semials", unrated, defenses=[_laplace(b)]))
        accs.append((out.metrics["rating_accuracy"], out.metrics["attribute_accuracy"]))
        base = out.baseline
    r = [a[0] for a in accs]
    x = [a[1] for a in accs]
    # monotone-ish: never improves by more than 2 points as the noise grows
    assert all(r[i + 1] <= r[i] + 0.02 for i in range(len(r) - 1)), r
    assert all(x[i + 1] <= x[i] + 0.02 for i in range(len(x) - 1)), x
    # tiny noise: still (almost) exact; small noise: far above the random guess
    assert r[0] >= 0.99 and x[0] >= 0.99
    assert r[1] >= base["rating_accuracy"] + 0.3 and x[1] >= base["attribute_accuracy"] + 0.3
    # never collapses below the uniform random guess, even at b = 1
    assert r[-1] >= base["rating_accuracy"] and x[-1] >= base["attribute_accuracy"]


def test_noise_sgd_inclunc_above_baseline(small):
    out = _attack(_run(small, "sgd", "inclunc", defenses=[_laplace(1e-3)]))
    assert out.metrics["rating_accuracy"] >= 0.95
    assert out.metrics["attribute_accuracy"] >= out.baseline["attribute_accuracy"] + 0.3
    # InclUnc: the majority guess ("unrated" everywhere) is itself near 0.95 -- beat it, and the
    # attribute majority guess
    assert out.metrics["rating_accuracy"] > out.baseline["rating_accuracy_majority"]
    assert out.metrics["rated_rating_accuracy"] >= 0.95
    assert out.metrics["attribute_accuracy"] > out.baseline["attribute_accuracy_majority"]


def test_encrypted_view_falls_back_to_baseline():
    ds = synthetic(n_users=12, n_items=30, seed=1)
    pail = registry.get("defense", "paillier")(key_length=TEST_KEY_LENGTH, insecure_test_key=True)
    tr = _run(ds, "semials", "obsonly", defenses=[pail], epochs=1, record_rounds=1)
    out = _attack(tr)
    assert not out.reconstruction.supported
    assert "ciphertext" in out.reconstruction.reason or "no grad_V" in out.reconstruction.reason
    assert out.metrics == out.baseline


def test_view_without_private_messages(small, tmp_path):
    tr = _run(small, "sgd", "inclunc")
    path = tr.save(tmp_path / "shared.ptx", include_private=False)
    shared = load(path)
    assert not shared.has_private
    attack = MVMFAnalytic()
    ok, _ = attack.applicable(shared.view("server"))
    assert ok
    recon = attack.run(shared.view("server"), {}, np.random.default_rng(0))
    assert recon.supported and len(recon.victims) == 80
    m = attack.score(recon, tr)  # scored against the original (private) transcript
    assert m["rating_accuracy"] >= 0.999 and m["attribute_accuracy"] >= 0.999


def test_missing_config_is_unsupported(small):
    tr = _run(small, "semials", "obsonly", epochs=1, record_rounds=1)
    del tr.config["lam"]
    out = _attack(tr)
    assert not out.reconstruction.supported and "lam" in out.reconstruction.reason


@pytest.mark.slow
@pytest.mark.parametrize("update,unrated", SCENARIOS)
def test_ml100k_exact_all_users(ml100k_path, update, unrated):
    """PrivMVMF paper Table 3 scenarios on MovieLens 100K, all 943 users (no cold-start hold-out)."""
    ds = load_dataset(ml100k_path)
    tr = _run(ds, update, unrated)
    out = _attack(tr)
    m = out.metrics
    # noise-free: the first round decides everything (SGD ObsOnly needs the pair of rounds)
    assert out.reconstruction.meta["shortcut"] is ((update, unrated) != ("sgd", "obsonly"))
    assert m["victims"] == 943
    assert m["rating_accuracy"] >= 0.999
    assert m["attribute_accuracy"] >= 0.999
    assert m["rated_detection_accuracy"] >= 0.999


def _same_reconstruction(r1, r2) -> bool:
    return r1.victims.keys() == r2.victims.keys() and all(
        np.array_equal(r1.victims[v][key], r2.victims[v][key])
        for v in r1.victims
        for key in ("items", "ratings", "attributes")
    )


@pytest.mark.parametrize("update,unrated", SCENARIOS)
@pytest.mark.parametrize("scale", [0.0, 1e-4, 0.5])
def test_shortcut_matches_full_estimator(small, update, unrated, scale):
    """The first-round shortcut is taken noise-free (not for SGD ObsOnly, which needs a pair) and
    declined under real noise; whenever taken, the reconstruction equals the full estimator's."""
    tr = _run(small, update, unrated, defenses=[_laplace(scale)] if scale else [])
    view = tr.view("server")
    fast = MVMFAnalytic().run(view, {}, np.random.default_rng(0))
    full = MVMFAnalytic(shortcut=False).run(view, {}, np.random.default_rng(0))
    assert full.meta["shortcut"] is False and len(full.meta["rounds"]) == 2
    expect = scale == 0.0 and (update, unrated) != ("sgd", "obsonly")
    if scale == 0.5:
        assert fast.meta["shortcut"] is False
    if expect:
        assert fast.meta["shortcut"] is True and fast.meta["rounds"] == [0]
        assert fast.meta["max_residual"] < 1e-9
    assert _same_reconstruction(fast, full)


def test_shortcut_with_sampling_defense(small):
    """Sampled virtual items (ObsOnly + sampling, unequal upload lengths) through the shortcut."""
    samp = registry.get("defense", "sampling")(rho=1.0, w=None)
    tr = _run(small, "semials", "obsonly", defenses=[samp])
    view = tr.view("server")
    fast = MVMFAnalytic().run(view, {}, np.random.default_rng(0))
    assert fast.meta["shortcut"] is True
    assert _same_reconstruction(fast, MVMFAnalytic(shortcut=False).run(view, {}, np.random.default_rng(0)))
    m = MVMFAnalytic().score(fast, tr)
    assert m["rated_detection_accuracy"] >= 0.999 and m["rating_accuracy"] >= 0.999


@pytest.mark.parametrize("unrated", ["obsonly", "inclunc"])
def test_shortcut_declines_when_one_upload_is_off(small, unrated):
    """One client's first-round grad_V rows scaled by 1.3 (still rank one, but its ratings no longer
    on the grid) are enough to decline the shortcut: the full estimator runs on every round."""
    tr = _run(small, "semials", unrated)
    msg = next(m for m in tr.messages if m.kind == "grad_V" and m.sender == "client:5" and m.round == 0)
    msg.payload["values"] = 1.3 * np.array(msg.payload["values"], dtype=np.float64)
    out = MVMFAnalytic().run(tr.view("server"), {}, np.random.default_rng(0))
    assert out.meta["shortcut"] is False and len(out.meta["rounds"]) == 2


def test_grad_V_dots_same_from_memory_and_from_disk(small, tmp_path, monkeypatch):
    from privaudit.attacks.mvmf import _core as _mvmf
    from privaudit.attacks.mvmf import _view as _mvmf_view
    from privaudit.models import mvmf as mvmf_math

    tr = _run(small, "semials", "obsonly")
    monkeypatch.setattr(mvmf_math, "_BLOCK", 64)  # several blocks even on small data
    monkeypatch.setattr(_mvmf_view, "_DOT_ROWS", 100)
    loaded = load(tr.save(tmp_path / "run.ptx"))
    rng = np.random.default_rng(1)
    results = []
    for transcript in (tr, loaded):
        R = _mvmf.parse_view_flat(transcript.view("server")).rounds[0]
        n, K = len(R.users), 20
        d = rng.normal(size=(n, K)) if not results else results[0][1]
        seg = np.repeat(np.arange(n), R.lengths)
        fast = R.grad_V_dots(d, seg)  # before grad_V is concatenated: a view (memory) or blocks (disk)
        assert "grad_V" not in R.__dict__
        full = np.einsum("nk,nk->n", R.grad_V, d[seg])
        np.testing.assert_allclose(fast, full, rtol=0, atol=1e-12)
        results.append((fast, d))
    # the same rows in memory and on disk, dotted in blocks of other shapes: equal to rounding
    # (numpy promises no bit identity across batch shapes; docs/scale.md)
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("unrated", ["obsonly", "inclunc"])
@pytest.mark.parametrize("scale", [0.0, 2.0])
def test_victim_table_equals_score_and_prior(small, unrated, scale):
    """Per-victim numerators / denominators sum to score() and prior_baseline() on every ratio metric."""
    t = _run(small, "semials", unrated, [_laplace(scale)] if scale else [])
    out = MVMFAnalytic().evaluate(t, np.random.default_rng(0))
    vt = out.victims
    expected = {"rating_accuracy", "rated_rating_accuracy", "rated_detection_accuracy", "attribute_accuracy"}
    assert vt is not None and set(vt.weight) == expected
    assert len(vt.victims) == out.metrics["victims"]
    for m in expected:
        assert vt.value(m) == pytest.approx(out.metrics[m], abs=1e-12), m
        assert vt.value(m, "prior") == pytest.approx(out.baseline_prior[m], abs=1e-12), m
    if unrated == "inclunc":  # rated decisions carry the victim's row of the table
        dec = out.decisions["rated"]
        assert dec.groups.shape == dec.labels.shape
        counts = np.bincount(dec.groups, minlength=len(vt.victims))
        assert np.array_equal(counts, vt.weight["rated_detection_accuracy"])


@pytest.mark.parametrize("unrated", ["obsonly", "inclunc"])
def test_posterior_decoder_is_the_prior_under_huge_noise_and_exact_without(small, unrated):
    """With the population prior in its knowledge the decoder's guess is the prior library's when
    the uploads carry nothing (Laplace scale 1e4), and exact without noise (full estimator, no shortcut)."""
    t = _run(small, "semials", unrated, [_laplace(1e4)])
    out = MVMFAnalytic().evaluate(t, np.random.default_rng(0))
    assert out.reconstruction.meta["prior"] == "population"
    for m in ("rating_accuracy", "attribute_accuracy", "rated_detection_accuracy", "rated_rating_accuracy"):
        assert out.metrics[m] == pytest.approx(out.baseline_prior[m], abs=1e-12), m
    # the same victims, item by item: the difference is 0 for every victim, not only on average
    vt = out.victims
    assert np.array_equal(vt.attack["rating_accuracy"], vt.prior["rating_accuracy"])
    clean = _run(small, "semials", unrated)
    exact = MVMFAnalytic(shortcut=False).evaluate(clean, np.random.default_rng(0))
    assert exact.reconstruction.meta["shortcut"] is False and exact.reconstruction.meta["prior"] == "population"
    assert exact.metrics["rating_accuracy"] == 1.0 and exact.metrics["attribute_accuracy"] == 1.0


def test_joint_clip_is_decoded_with_a_scale_per_user():
    """dp-laplace's default clip (one factor per client round) multiplies a user's estimates by
    sqrt(factor): decoded with a fitted scale per user, near-exact when the noise is small, and at
    the population prior (not below it) when the noise swamps the uploads."""
    ds = synthetic()
    proto = registry.get("protocol", "fedmvmf")()
    weak = proto.run(ds, {}, [registry.get("defense", "dp-laplace")(epsilon=1e5)], 0).transcript
    out = MVMFAnalytic().evaluate(weak, np.random.default_rng(0))
    assert out.reconstruction.meta["clip_scale_median"] < 0.5  # the clip shrank the uploads
    assert out.metrics["rating_accuracy"] > 0.95 and out.metrics["attribute_accuracy"] > 0.99
    strong = proto.run(ds, {}, [registry.get("defense", "dp-laplace")(epsilon=100.0)], 0).transcript
    out = MVMFAnalytic().evaluate(strong, np.random.default_rng(0))
    for m in ("rating_accuracy", "attribute_accuracy"):
        assert abs(out.metrics[m] - out.baseline_prior[m]) <= 0.01, m


@pytest.fixture(scope="module")
def dp_gaussian_run():
    proto = registry.get("protocol", "fedmvmf")()
    return proto.run(synthetic(), {}, [registry.get("defense", "dp-gaussian")(noise_multiplier=0.5)], 0).transcript


def _same_victims(new, old):
    assert new.victims.keys() == old.victims.keys()
    for party, rec in old.victims.items():
        for key, arr in rec.items():
            assert np.array_equal(new.victims[party][key], arr), (party, key)


def test_logsumexp_rows_is_scipy_bit_for_bit(dp_gaussian_run, monkeypatch):
    """The row-wise logsumexp of the clip-scale search equals scipy's (the oracle) bit for bit,
    ties and large magnitudes included, and the joint-clip decode is unchanged with scipy's."""
    from scipy.special import logsumexp

    from privaudit.attacks.mvmf import _decode as _mvmf_decode

    rng = np.random.default_rng(0)
    for shape in [(20000, 5), (7, 1), (500, 6), (0, 3)] + [(3000, h) for h in range(2, 12)]:
        a = rng.normal(size=shape) * 40.0
        a[::5] = np.round(a[::5])  # ties with the maximum
        a[::9] = -3.0
        a[::13] *= 1e6
        assert np.array_equal(_mvmf_decode.logsumexp_rows(a), logsumexp(a, axis=1)), shape
    inf = np.array([[0.0, -np.inf], [-np.inf, -np.inf]])
    np.testing.assert_array_equal(_mvmf_decode.logsumexp_rows(inf), logsumexp(inf, axis=1))
    dp_gaussian_run.derived("mvmf clip scales").clear()
    fast = MVMFAnalytic().evaluate(dp_gaussian_run, np.random.default_rng(0)).reconstruction
    monkeypatch.setattr(_mvmf_decode, "logsumexp_rows", lambda a: logsumexp(a, axis=1))
    dp_gaussian_run.derived("mvmf clip scales").clear()
    slow = MVMFAnalytic().evaluate(dp_gaussian_run, np.random.default_rng(0)).reconstruction
    assert "clip_scale_median" in fast.meta
    _same_victims(fast, slow)


@pytest.mark.usefixtures("no_null_arm")
def test_clip_scales_computed_once_for_analytic_and_aggregate(dp_gaussian_run, monkeypatch):
    """Under a joint clip (dp-gaussian) mvmf-analytic and the mvmf-analytic inside mvmf-aggregate
    decode the same evidence: clip_scales runs once for both, and every reconstruction is the one
    computed without the cache (the uncached function on every call)."""
    from privaudit.attacks.mvmf import _decode as _mvmf_decode
    from privaudit.attacks.mvmf import analytic as mvmf_analytic

    tr = dp_gaussian_run
    aggregate = registry.get("attack", "mvmf-aggregate")
    calls = []
    uncached = _mvmf_decode.clip_scales_uncached

    def counted(*args):
        calls.append(1)
        return uncached(*args)

    monkeypatch.setattr(mvmf_analytic, "RESULTS_KEPT", 0)  # every analytic run decodes

    def recons():
        tr.derived("mvmf clip scales").clear()
        tr.derived("mvmf-analytic results").clear()
        a = MVMFAnalytic().evaluate(tr, np.random.default_rng(0)).reconstruction
        b = aggregate().evaluate(tr, np.random.default_rng(1)).reconstruction
        return a, b

    monkeypatch.setattr(_mvmf_decode, "clip_scales_uncached", counted)
    cached = recons()
    assert len(calls) == 1
    assert "clip_scale_median" in cached[0].meta and "clip_scale_median" in cached[1].meta["inner"]
    monkeypatch.setattr(_mvmf_decode, "CLIP_KEPT", 0)  # every call computes
    fresh = recons()
    assert len(calls) == 3
    for new, old in zip(cached, fresh):
        _same_victims(new, old)


def test_prior_table_and_baselines_once_per_transcript(dp_gaussian_run, monkeypatch):
    """The prior library and the random/majority baselines are computed once per transcript for
    the three MVMF attacks, equal to the uncached computation; a transcript that grew (a message
    appended) is computed afresh."""
    from privaudit.attacks.mvmf import _core as _mvmf
    from privaudit.attacks.mvmf import _prior as _mvmf_prior

    tr = dp_gaussian_run
    calls = []
    build = _mvmf_prior.prior_table.uncached

    def counted(transcript):
        calls.append(1)
        return build(transcript)

    memo = _mvmf_prior.per_transcript(counted)
    monkeypatch.setattr(_mvmf_prior, "prior_table", memo)
    monkeypatch.setattr(_mvmf, "prior_table", memo)
    outs = [
        registry.get("attack", name)(**({"users": 10} if name == "mvmf-nonlinear" else {})).evaluate(
            tr, np.random.default_rng(0)
        )
        for name in ("mvmf-aggregate", "mvmf-analytic", "mvmf-nonlinear")
    ]
    assert len(calls) == 1
    fresh = build(tr)
    table = memo(tr)
    for m in fresh.hits:
        assert np.array_equal(table.hits[m], fresh.hits[m]) and np.array_equal(table.weight[m], fresh.weight[m])
    expected = _mvmf_prior.prior_baselines(tr, fresh)
    for out in outs:
        for m, v in expected.items():
            assert out.baseline_prior[m] == v or (np.isnan(v) and np.isnan(out.baseline_prior[m])), m
        assert out.baseline == _mvmf._baselines.uncached(tr)
    assert _mvmf.baselines(tr) is not _mvmf.baselines(tr)  # copies of the memo's dict
    tr.add(10**6, "server", "server", "note", {})
    memo(tr)
    assert len(calls) == 2
    tr.messages.pop()  # leave the module fixture as it was


@pytest.mark.usefixtures("no_null_arm")
def test_victim_scores_once_per_evaluation(dp_gaussian_run, monkeypatch):
    """score() and victim_table() of one evaluation share one victim_scores; the metrics and the
    table equal the ones computed from scratch."""
    from privaudit.attacks.mvmf import _core as _mvmf

    calls = []
    plain = _mvmf.victim_scores

    def counted(recon, transcript):
        calls.append(1)
        return plain(recon, transcript)

    monkeypatch.setattr(_mvmf, "victim_scores", counted)
    out = MVMFAnalytic().evaluate(dp_gaussian_run, np.random.default_rng(0))
    assert len(calls) == 1
    monkeypatch.setattr(_mvmf, "victim_scores", plain)
    assert out.metrics == _mvmf.score_reconstruction(out.reconstruction, dp_gaussian_run)
    victims, weight, hits = plain(out.reconstruction, dp_gaussian_run)
    assert out.victims.victims == victims
    for m in out.victims.weight:
        assert np.array_equal(out.victims.weight[m], weight[m]) and np.array_equal(out.victims.attack[m], hits[m])


@pytest.mark.parametrize("defended", [False, True])
def test_aggregate_single_member_cohorts_pass_uploads_through(small, dp_gaussian_run, defended, monkeypatch):
    """mvmf-aggregate with one-member cohorts (plain views, cohort_size 1) takes each upload as
    its sum directly: the reconstruction and diagnostics equal the general path's (per-item sums
    of one member) exactly."""
    from privaudit.attacks.mvmf import aggregate as mvmf_aggregate
    from privaudit.attacks.mvmf import analytic as mvmf_analytic

    monkeypatch.setattr(mvmf_analytic, "RESULTS_KEPT", 0)  # every analytic run decodes
    tr = dp_gaussian_run if defended else _run(small, "semials", "obsonly")
    tr.derived("mvmf-analytic results").clear()
    attack = registry.get("attack", "mvmf-aggregate")
    fast = attack().evaluate(tr, np.random.default_rng(0))
    monkeypatch.setattr(mvmf_aggregate, "_single_upload", lambda co, up, r: False)
    slow = attack().evaluate(tr, np.random.default_rng(0))
    assert fast.reconstruction.supported and fast.reconstruction.meta["mean_cohort_size"] == 1.0
    _same_victims(fast.reconstruction, slow.reconstruction)
    assert fast.metrics == slow.metrics
    drop = ("seconds",)
    inner = {k: v for k, v in fast.reconstruction.meta["inner"].items() if k not in drop}
    assert inner == {k: v for k, v in slow.reconstruction.meta["inner"].items() if k not in drop}


@pytest.mark.usefixtures("no_null_arm")
def test_aggregate_reuses_the_analytic_reconstruction_of_the_same_uploads(dp_gaussian_run, monkeypatch):
    """mvmf-analytic then mvmf-aggregate (one-member cohorts) on one run: the inner mvmf-analytic
    reads the same uploads and takes the stored reconstruction (one decode), equal to decoding
    again; another transcript with the same uploads (a different population prior) decodes."""
    import copy

    from privaudit.attacks.mvmf import analytic as mvmf_analytic

    decodes = []
    plain = MVMFAnalytic._decode_view

    def counted(self, fv, tic):
        decodes.append(1)
        return plain(self, fv, tic)

    monkeypatch.setattr(MVMFAnalytic, "_decode_view", counted)
    dp_gaussian_run.derived("mvmf-analytic results").clear()
    aggregate = registry.get("attack", "mvmf-aggregate")
    first = MVMFAnalytic().evaluate(dp_gaussian_run, np.random.default_rng(0))
    inner = aggregate().evaluate(dp_gaussian_run, np.random.default_rng(0))
    assert len(decodes) == 1
    monkeypatch.setattr(mvmf_analytic, "RESULTS_KEPT", 0)
    dp_gaussian_run.derived("mvmf-analytic results").clear()
    again = aggregate().evaluate(dp_gaussian_run, np.random.default_rng(0))
    assert len(decodes) == 2
    _same_victims(inner.reconstruction, again.reconstruction)
    _same_victims(first.reconstruction, again.reconstruction)
    assert inner.metrics == again.metrics == first.metrics
    monkeypatch.setattr(mvmf_analytic, "RESULTS_KEPT", 2)
    dp_gaussian_run.derived("mvmf-analytic results").clear()
    MVMFAnalytic().evaluate(dp_gaussian_run, np.random.default_rng(0))
    MVMFAnalytic().evaluate(copy.copy(dp_gaussian_run), np.random.default_rng(0))
    assert len(decodes) == 4


@pytest.mark.usefixtures("no_null_arm")
def test_large_inputs_are_not_digested(dp_gaussian_run, monkeypatch):
    """Above DIGEST_MAX_BYTES neither cache hashes its inputs (hashing would cost more than the
    repeat it saves): every run decodes and computes clip_scales, with the same reconstruction."""
    from privaudit.attacks.mvmf import _decode as _mvmf_decode
    from privaudit.attacks.mvmf import analytic as mvmf_analytic

    dp_gaussian_run.derived("mvmf clip scales").clear()
    dp_gaussian_run.derived("mvmf-analytic results").clear()
    cached = MVMFAnalytic().evaluate(dp_gaussian_run, np.random.default_rng(0)).reconstruction
    digests, clips = [], []
    digest, uncached = _mvmf_decode.inputs_digest, _mvmf_decode.clip_scales_uncached
    monkeypatch.setattr(_mvmf_decode, "inputs_digest", lambda *a: digests.append(1) or digest(*a))
    monkeypatch.setattr(mvmf_analytic, "inputs_digest", lambda *a: digests.append(1) or digest(*a))
    monkeypatch.setattr(_mvmf_decode, "clip_scales_uncached", lambda *a: clips.append(1) or uncached(*a))
    for module in (_mvmf_decode, mvmf_analytic):
        monkeypatch.setattr(module, "DIGEST_MAX_BYTES", 0)
    for _ in range(2):
        big = MVMFAnalytic().evaluate(dp_gaussian_run, np.random.default_rng(0)).reconstruction
        _same_victims(big, cached)
    assert digests == [] and len(clips) == 2

"""Noise defenses ``laplace`` and ``gaussian``: what the server receives is plaintext + i.i.d. noise."""

from __future__ import annotations

import numpy as np
import pytest

from privaudit.data import synthetic
from privaudit.defenses.base import UploadBatch
from privaudit.defenses.noise import GaussianNoise, LaplaceNoise
from privaudit.errors import PrivauditError
from privaudit.protocols.base import Channel
from privaudit.protocols.fedmvmf import FedMVMF
from privaudit.registry import get
from privaudit.transcript import Transcript


@pytest.fixture(scope="module")
def dataset():
    return synthetic(n_users=120, n_items=150, seed=1)


def _round0_uploads(transcript):
    out = {}
    for msg in transcript.select(round=0):
        if msg.kind in ("grad_V", "grad_P"):
            out[msg.sender, msg.kind] = msg.payload
    return out


@pytest.mark.parametrize("name, factor", [("laplace", np.sqrt(2.0)), ("gaussian", 1.0)])
@pytest.mark.parametrize("unrated", ["obsonly", "inclunc"])
def test_protocol_uploads_carry_noise_of_the_right_scale(dataset, name, factor, unrated):
    scale = 0.05
    cfg = {"unrated": unrated, "epochs": 2, "record_rounds": 1}
    clean = FedMVMF().run(dataset, cfg, rng=3).transcript
    defense = get("defense", name)(scale=scale)
    noisy = FedMVMF().run(dataset, cfg, defenses=[defense], rng=3).transcript
    assert noisy.config["defenses"] == [{"name": name, "scale": scale}]
    a, b = _round0_uploads(clean), _round0_uploads(noisy)
    assert a.keys() == b.keys() and len(a) == 2 * clean.config["n_users"]
    diffs = []
    for key in a:
        if "items" in a[key]:
            assert b[key]["items"].dtype == np.int64
            np.testing.assert_array_equal(a[key]["items"], b[key]["items"])
        assert a[key]["values"].shape == b[key]["values"].shape
        diffs.append((b[key]["values"] - a[key]["values"]).ravel())
    d = np.concatenate(diffs)
    assert d.size > 20_000
    assert abs(d.mean()) < 5 * factor * scale / np.sqrt(d.size)
    assert abs(d.std() / (factor * scale) - 1.0) < 0.05
    # private ground truth is untouched
    for party in clean.parties[2:6]:
        for key, value in clean.private(party).items():
            np.testing.assert_array_equal(value, noisy.private(party)[key])


@pytest.mark.parametrize("cls", [LaplaceNoise, GaussianNoise])
def test_batch_level_noise_and_integer_entries(cls):
    rng = np.random.default_rng(0)
    items = [np.arange(5, dtype=np.int64), np.array([2, 7], dtype=np.int64)]
    payloads = [
        {"items": items[0], "values": rng.normal(size=(5, 3)), "other": np.ones(4)},
        {"items": items[1], "values": rng.normal(size=(2, 3)), "other": np.ones(4)},
    ]
    batch = UploadBatch(0, "grad_V", ["client:0", "client:1"], payloads)
    channel = Channel([cls(scale=0.5)], Transcript("test"), np.random.default_rng(1))
    out = channel.send(0, "grad_V", batch.senders, batch.payloads)
    for before, after in zip(payloads, out.payloads):
        assert after["items"] is before["items"] or np.array_equal(after["items"], before["items"])
        assert after["items"].dtype == np.int64
        assert not np.array_equal(after["values"], before["values"])
        assert not np.array_equal(after["other"], before["other"])  # every float entry
    # the inputs are not modified in place
    assert np.array_equal(payloads[0]["other"], np.ones(4))
    # the transcript records what the server received
    recorded = channel.transcript.select("grad_V")
    np.testing.assert_array_equal(recorded[0].payload["values"], out.payloads[0]["values"])
    # noisy_keys restricts the perturbed entries
    out2 = channel.send(0, "grad_V", batch.senders, batch.payloads, noisy_keys=("values",))
    np.testing.assert_array_equal(out2.payloads[0]["other"], np.ones(4))


@pytest.mark.parametrize("cls", [LaplaceNoise, GaussianNoise])
def test_zero_scale_is_identity(cls):
    payloads = [{"values": np.arange(6.0).reshape(2, 3)}]
    channel = Channel([cls()], Transcript("test"), np.random.default_rng(0))
    out = channel.send(0, "grad_P", ["client:0"], payloads, record=False)
    np.testing.assert_array_equal(out.payloads[0]["values"], payloads[0]["values"])


def test_registry_and_defaults():
    for name in ("laplace", "gaussian"):
        cls = get("defense", name)
        assert cls.strength == "scale"
        assert tuple(cls.default_grid) == (0.0, 0.1, 0.5, 1.0, 2.0, 4.0)
        assert cls().scale == 0.0
        assert cls(scale="0.5").scale == 0.5
        assert not cls().hides_plaintext()


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "abc"])
def test_bad_scale_is_a_user_error(bad):
    with pytest.raises(PrivauditError, match="scale"):
        LaplaceNoise(scale=bad)


def test_noise_is_reproducible(dataset):
    cfg = {"epochs": 2, "record_rounds": 1}
    a = FedMVMF().run(dataset, cfg, defenses=[LaplaceNoise(scale=0.1)], rng=9).transcript
    b = FedMVMF().run(dataset, cfg, defenses=[LaplaceNoise(scale=0.1)], rng=9).transcript
    for x, y in zip(a.select("grad_V"), b.select("grad_V")):
        np.testing.assert_array_equal(x.payload["values"], y.payload["values"])


@pytest.mark.parametrize("cls", [LaplaceNoise, GaussianNoise])
def test_send_round_equals_one_send_per_kind_for_per_batch_defenses(cls):
    """Channel.send_round with defenses that only act per batch: the same draws, payloads and
    transcript as one send per kind (so the joint hook changes nothing for them)."""
    rng = np.random.default_rng(0)
    uploads = [
        ("grad_V", [{"items": np.arange(3), "values": rng.normal(size=(3, 2))} for _ in range(2)]),
        ("grad_P", [{"values": rng.normal(size=(4, 2))} for _ in range(2)]),
    ]
    senders = ["client:0", "client:1"]
    a = Channel([cls(scale=0.3)], Transcript("test"), np.random.default_rng(7))
    b = Channel([cls(scale=0.3)], Transcript("test"), np.random.default_rng(7))
    joint = a.send_round(0, senders, uploads)
    apart = [b.send(0, kind, senders, payloads) for kind, payloads in uploads]
    for x, y in zip(joint, apart):
        assert x.kind == y.kind
        for p, q in zip(x.payloads, y.payloads):
            np.testing.assert_array_equal(p["values"], q["values"])
    assert [(m.kind, m.sender) for m in a.transcript.messages] == [(m.kind, m.sender) for m in b.transcript.messages]


def test_laplace_noise_is_laplace():
    """The exponential-times-random-sign sampler against the Laplace law (scipy as the oracle)
    and against numpy's own Laplace sampler: KS tests, moments, a fair sign."""
    from scipy import stats

    from privaudit.defenses.noise import laplace_noise

    b = 0.7
    x = laplace_noise(np.random.default_rng(11), 200_000, b)
    assert x.dtype == np.float64 and x.shape == (200_000,)
    assert stats.kstest(x, stats.laplace(scale=b).cdf).pvalue > 1e-3
    ref = np.random.default_rng(12).laplace(0.0, b, 200_000)
    assert stats.ks_2samp(x, ref).pvalue > 1e-3
    assert abs(x.mean()) < 5 * b * np.sqrt(2 / 200_000)
    assert np.std(x) == pytest.approx(np.sqrt(2) * b, rel=0.01)
    assert abs((x < 0).mean() - 0.5) < 5 * 0.5 / np.sqrt(200_000)
    assert laplace_noise(np.random.default_rng(1), 0, b).shape == (0,)

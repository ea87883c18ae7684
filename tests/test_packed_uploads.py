"""Packed uploads (:class:`~privaudit.defenses.base.PackedBatch`): FedMVMF hands a round's
uploads to the channel as one array per entry; the defenses that take them packed (noise, DP
under ``clip_per="user"``, client-data-only defenses) give what the per-client path gives, bit
for bit: same transcript, model and utility; the packed sum equals the plain sum. An unrecorded
round is only summed (:meth:`Channel.sum_round_packed`): its noise is drawn on the sums, equal in
law to the per-sender noise summed (KS tests here), the clip and release counts unchanged."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from privaudit import registry
from privaudit.data.synthetic import synthetic
from privaudit.defenses.base import Defense, PackedBatch, RoundUploads, UploadBatch
from privaudit.defenses.dp_gaussian import DPGaussian
from privaudit.defenses.dp_laplace import DPLaplace
from privaudit.protocols import fedmvmf
from privaudit.protocols.base import Channel, packed_sum, plain_sum


@pytest.fixture(scope="module")
def data():
    return synthetic(n_users=120, n_items=70, min_ratings=5, density=0.08, seed=3)


def _digest(result) -> str:
    h = hashlib.sha256()
    for m in result.transcript.messages:
        h.update(f"{m.seq}|{m.round}|{m.sender}|{m.receiver}|{m.kind}|{sorted(m.meta.items())}".encode())
        for k in sorted(m.payload):
            h.update(k.encode() + str(m.payload[k].dtype).encode() + str(m.payload[k].shape).encode())
            h.update(np.ascontiguousarray(m.payload[k]).tobytes())
    for k in ("U", "V", "P", "Q"):
        h.update(np.ascontiguousarray(result.model[k]).tobytes())
    h.update(repr(sorted((k, v) for k, v in result.utility.items() if k != "epoch_seconds")).encode())
    return h.hexdigest()


DEFENSES = [
    (None, {}),
    ("laplace", {"scale": 0.5}),
    ("gaussian", {"scale": 0.5}),
    ("dp-laplace", {"epsilon": 3.0}),
    ("dp-gaussian", {"noise_multiplier": 1.0}),
    ("dp-laplace", {"target_epsilon": 5.0}),
    ("dp-gaussian", {"noise_multiplier": 1.0, "clip_per": "upload"}),  # declines: unpacked
    ("sampling", {}),
]
SETTINGS = [{"update": "semials", "unrated": "obsonly"}, {"update": "sgd", "unrated": "inclunc", "eta": 0.01}]


@pytest.mark.parametrize("settings", SETTINGS, ids=["semials-obsonly", "sgd-inclunc"])
@pytest.mark.parametrize("name, params", DEFENSES, ids=lambda v: v if isinstance(v, str) else None)
def test_fedmvmf_packed_equals_per_client_path(data, name, params, settings, monkeypatch):
    cfg = {"epochs": 3, "record_rounds": 2, "K": 4, **settings}

    def run():
        defenses = [registry.get("defense", name)(**params)] if name else []
        return fedmvmf.FedMVMF().run(data, cfg, rng=7, defenses=defenses)

    # every round sent (none only summed), so that the packed and per-client paths draw alike
    monkeypatch.setattr(Channel, "sum_round_packed", lambda self, *a, **k: None)
    unpacked_calls = []
    unpacked = RoundUploads.unpacked
    monkeypatch.setattr(RoundUploads, "unpacked", lambda self: unpacked_calls.append(1) or unpacked(self))
    packed = run()
    monkeypatch.setattr(RoundUploads, "unpacked", unpacked)
    declines = name == "dp-gaussian" and "clip_per" in params
    assert bool(unpacked_calls) == declines  # the others took the packed path all the way
    send_round = Channel.send_round

    def per_client(self, round, batches, record=True):
        return send_round(self, round, batches[0].senders, [(b.kind, b.payloads()) for b in batches], record=record)

    monkeypatch.setattr(Channel, "send_round_packed", per_client)
    assert _digest(packed) == _digest(run())
    assert packed.transcript.config == run().transcript.config  # the public record (calibrated epsilon too)


def _packed_round(rng: np.random.Generator, n: int, m: int = 30, K: int = 4, p: int = 3) -> list[PackedBatch]:
    """A round of ragged grad_V (random item subsets, some empty) and stacked grad_P, heavy-tailed
    values so that some senders clip and some do not."""
    senders = [f"client:{u}" for u in range(n)]
    items, lengths = [], []
    scales = np.where(rng.random(n) < 0.3, 1e-7, 10 ** rng.uniform(-1, 1, n))
    for _ in range(n):
        k = int(rng.integers(0, m))
        items.append(np.sort(rng.choice(m, size=k, replace=False)))
        lengths.append(k)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.standard_cauchy((int(bounds[-1]), K)) * np.repeat(scales, lengths)[:, None]
    grad_p = rng.standard_cauchy((n, p, K)) * scales[:, None, None]
    return [
        PackedBatch(0, "grad_V", senders, {"items": np.concatenate(items).astype(np.int64), "values": values}, bounds),
        PackedBatch(0, "grad_P", senders, {"values": grad_p}),
    ]


class _Channel:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.transcript = type("T", (), {"config": {"n_items": 30}})()


@pytest.mark.parametrize("cls", [DPLaplace, DPGaussian])
@pytest.mark.parametrize("seed", range(3))
def test_dp_packed_round_equals_unpacked_round(cls, seed):
    batches = _packed_round(np.random.default_rng(seed), n=50)
    a, b = cls(clip=0.5), cls(clip=0.5)
    assert a.takes_packed
    got = a.on_round(batches, _Channel(3))
    assert all(isinstance(g, PackedBatch) for g in got)
    want = b.on_round([x.unpacked() for x in batches], _Channel(3))
    for g, w in zip(got, want):
        for gp, wp in zip(g.payloads(), w.payloads):
            assert gp.keys() == wp.keys()
            for k in gp:
                np.testing.assert_array_equal(gp[k], wp[k], strict=True)
    assert a.claim(1) == b.claim(1)
    for x in batches:  # the clients' plaintext is not touched
        assert not any(np.shares_memory(x.arrays["values"], g.arrays["values"]) for g in got)


def test_packed_path_declines_layouts_it_cannot_order():
    assert not DPLaplace(clip=1.0, clip_per="row").takes_packed
    assert not DPLaplace(clip=1.0, dense=True).takes_packed
    assert not registry.get("defense", "secagg")().takes_packed  # sums itself
    transcript = type("T", (), {"config": {"n_items": 4}, "add": lambda *a, **k: None})()
    two = [PackedBatch(0, "x", ["client:0"], {"a": np.zeros((1, 2)), "b": np.ones((1, 2))})]
    for d in (DPLaplace(clip=1.0), registry.get("defense", "laplace")(scale=1.0)):  # two float entries
        assert Channel([d], transcript, np.random.default_rng(0)).sum_round_packed(0, two, [None]) is None
    # a defense that changes client data only is not in the upload chain: the round stays packed
    ch = Channel([registry.get("defense", "sampling")()], transcript, np.random.default_rng(0))
    assert all(isinstance(b, PackedBatch) for b in ch.send_round_packed(0, _small_round(1), record=False))
    # one that takes no packed batches gets them unpacked, the same messages
    seen = []

    class Look(Defense):
        def process_uploads(self, uploads, ctx, call_next):
            seen.extend(type(b).__name__ for b in uploads.batches)
            return call_next(uploads)

    Channel([Look()], transcript, np.random.default_rng(0)).send_round_packed(0, _small_round(1), record=False)
    assert seen == ["UploadBatch", "UploadBatch"]


@pytest.mark.parametrize("per_sender", [2, 25])
@pytest.mark.parametrize("repeats", [False, True])
def test_packed_sum_equals_plain_sum(per_sender, repeats):
    """The packed sum (one sparse selector product) against plain_sum of the unpacked payloads,
    bit for bit (signed zeros too), with distinct and with repeated row ids inside a sender, few
    and many rows per sender, float64 and float32 values."""
    rng = np.random.default_rng(per_sender + repeats)
    n, m, K = 80, 40, 3
    lengths = rng.integers(0, per_sender + 1, n)
    items = [
        rng.integers(0, m, k) if repeats else np.sort(rng.choice(m, size=min(int(k), m), replace=False))
        for k in lengths
    ]
    bounds = np.concatenate([[0], np.cumsum([len(i) for i in items])]).astype(np.int64)
    values = rng.normal(size=(int(bounds[-1]), K)) * 1e3
    values[::7] = -0.0
    if per_sender == 2:
        values = values.astype(np.float32)
    batch = PackedBatch(
        0, "grad_V", [f"client:{u}" for u in range(n)], {"items": np.concatenate(items), "values": values}, bounds
    )
    got, want = packed_sum(batch, m), plain_sum(batch.unpacked().payloads, m)
    assert got.keys() == want.keys()
    for k in got:
        np.testing.assert_array_equal(got[k], want[k], strict=True)
        assert np.array_equal(np.signbit(got[k]), np.signbit(want[k]))
    stacked = PackedBatch(0, "grad_P", batch.senders, {"values": rng.normal(size=(n, 2, K))})
    np.testing.assert_array_equal(
        packed_sum(stacked, None)["values"], plain_sum(stacked.unpacked().payloads, None)["values"]
    )


def test_unpacked_batch_is_the_same_messages():
    batches = _packed_round(np.random.default_rng(1), n=6)
    u = batches[0].unpacked()
    assert isinstance(u, UploadBatch) and u.senders == batches[0].senders and len(u.payloads) == 6
    for j, p in enumerate(u.payloads):
        lo, hi = batches[0].bounds[j], batches[0].bounds[j + 1]
        np.testing.assert_array_equal(p["values"], batches[0].arrays["values"][lo:hi])
    np.testing.assert_array_equal(batches[1].unpacked().payloads[4]["values"], batches[1].arrays["values"][4])
    assert batches[0].entry_sizes("values").tolist() == [
        (hi - lo) * 4 for lo, hi in zip(batches[0].bounds[:-1], batches[0].bounds[1:])
    ]


def _small_round(seed: int) -> list[PackedBatch]:
    """Three senders, fixed uploads: rows 0 and 2 of grad_V sent by two, row 1 by one, row 3 by none."""
    rng = np.random.default_rng(seed)
    items = np.array([0, 2, 0, 1, 2], dtype=np.int64)
    bounds = np.array([0, 2, 3, 5], dtype=np.int64)
    values = rng.normal(size=(5, 2)) * 3
    return [
        PackedBatch(0, "grad_V", ["client:0", "client:1", "client:2"], {"items": items, "values": values}, bounds),
        PackedBatch(0, "grad_P", ["client:0", "client:1", "client:2"], {"values": rng.normal(size=(3, 2, 2))}),
    ]


NOISES = [
    ("laplace", {"scale": 0.8}),
    ("gaussian", {"scale": 0.8}),
    ("dp-laplace", {"epsilon": 2.0, "clip": 1.0}),
    ("dp-gaussian", {"noise_multiplier": 0.7, "clip": 1.0}),
]


@pytest.mark.parametrize("name, params", NOISES, ids=[n for n, _ in NOISES])
def test_summed_round_is_per_sender_noise_summed_in_law(name, params):
    """The receiver's sums of an unrecorded round against sending every upload and summing,
    2,000 rounds each: every element's two samples agree (KS, p > 1e-3), the noise-free part
    (the clipped plaintext sum) is the same, and an untouched row gets no noise."""
    from scipy import stats

    transcript = type("T", (), {"config": {"n_items": 4}, "add": lambda *a, **k: None})()
    summed, sent = [], []
    for rep in range(2000):
        defense = registry.get("defense", name)(**params)
        ch = Channel([defense], transcript, np.random.default_rng(rep))
        s = ch.sum_round_packed(0, _small_round(1), [4, None])
        summed.append(np.concatenate([s[0]["values"].ravel(), s[1]["values"].ravel()]))
        defense = registry.get("defense", name)(**params)
        ch = Channel([defense], transcript, np.random.default_rng(10_000 + rep))
        b = ch.send_round_packed(0, _small_round(1), record=False)
        sent.append(np.concatenate([ch.sum(b[0], rows=4)["values"].ravel(), ch.sum(b[1])["values"].ravel()]))
    summed, sent = np.array(summed), np.array(sent)
    assert np.all(summed[:, 6:8] == 0) and np.all(sent[:, 6:8] == 0)  # row 3: nobody sent it
    for j in [0, 1, 2, 3, 4, 5, 8, 9, 10, 11]:
        assert stats.ks_2samp(summed[:, j], sent[:, j]).pvalue > 1e-3, j
    se = np.sqrt((summed.var(axis=0) + sent.var(axis=0)) / len(sent)) + 1e-12
    assert np.all(np.abs(summed.mean(axis=0) - sent.mean(axis=0)) < 5 * se)  # same plaintext sum
    assert np.allclose(summed.std(axis=0), sent.std(axis=0), rtol=0.1)


def test_summed_round_without_noise_is_the_plain_sum(data):
    """A defense that adds no noise (sampling): summing an unrecorded round is bit for bit the
    send-then-sum path (same transcript, model and utility)."""
    cfg = {"epochs": 4, "record_rounds": 1, "K": 4}
    a = fedmvmf.FedMVMF().run(data, cfg, rng=3, defenses=[registry.get("defense", "sampling")()])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Channel, "sum_round_packed", lambda self, *a, **k: None)
        b = fedmvmf.FedMVMF().run(data, cfg, rng=3, defenses=[registry.get("defense", "sampling")()])
    assert _digest(a) == _digest(b)


@pytest.mark.parametrize("name, params", NOISES[2:], ids=[n for n, _ in NOISES[2:]])
def test_summed_rounds_count_every_release(data, name, params):
    """A DP run whose unrecorded rounds are only summed states the same releases, epsilon and
    public record as one that sends every round."""
    cfg = {"epochs": 4, "record_rounds": 1, "K": 4}
    a = fedmvmf.FedMVMF().run(data, cfg, rng=3, defenses=[registry.get("defense", name)(**params)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Channel, "sum_round_packed", lambda self, *a, **k: None)
        defense = registry.get("defense", name)(**params)
        b = fedmvmf.FedMVMF().run(data, cfg, rng=3, defenses=[defense])
    assert a.transcript.config == b.transcript.config
    da, db = a.transcript.config["defenses"][0], b.transcript.config["defenses"][0]
    assert da == db
    from privaudit import runner

    pa = runner.defense_privacy([registry.get("defense", name)(**params)], a.transcript, None)
    pb = runner.defense_privacy([registry.get("defense", name)(**params)], b.transcript, None)
    assert pa == pb and pa

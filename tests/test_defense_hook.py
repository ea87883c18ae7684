"""The one defense upload hook, ``Defense.process_uploads(uploads, ctx, call_next)``: the channel
composes the defenses as middleware in order, a defense sees the model the clients downloaded,
old-style classes are adapted (``on_upload``) or refused (the removed hooks), and the receiver's
sum travels with the batch a hiding defense makes."""

from __future__ import annotations

import numpy as np
import pytest

from privaudit.defenses.base import AGGREGATION, UPLOAD, Defense, PackedBatch, RoundUploads, UploadBatch
from privaudit.protocols.base import Channel


class _Transcript:
    config: dict = {}

    def __init__(self):
        self.added = []

    def add(self, *args):
        self.added.append(args)


class Tag(Defense):
    """Writes its name into every payload, before and after the later defenses."""

    def __init__(self, tag: str, log: list):
        super().__init__()
        self.tag, self.log = tag, log

    def process_uploads(self, uploads, ctx, call_next):
        self.log.append(f"{self.tag}:in:{len(uploads.batches)}")
        for b in uploads.batches:
            for p in b.payloads:
                p["values"] = p["values"] * 10 + int(self.tag)
        out = call_next(uploads)
        self.log.append(f"{self.tag}:out")
        return out


def _send(channel, kinds=("a", "b")):
    return channel.send_round(3, ["client:0", "client:1"], [(k, [{"values": np.ones(2)}] * 2) for k in kinds])


def test_defenses_compose_as_middleware_in_order_one_batch_at_a_time():
    log: list = []
    tr = _Transcript()
    out = _send(Channel([Tag("1", log), Tag("2", log)], tr, np.random.default_rng(0)))
    # defense 1 wraps defense 2; without a joint_round defense, each message kind goes through alone
    assert log == ["1:in:1", "2:in:1", "2:out", "1:out"] * 2
    np.testing.assert_array_equal(out[0].payloads[0]["values"], [112.0, 112.0])  # (1 * 10 + 1) * 10 + 2
    assert [a[3] for a in tr.added] == ["a", "a", "b", "b"]  # recorded after the chain, as received


def test_a_joint_round_defense_sees_every_kind_of_the_round_together():
    log: list = []

    class Joint(Tag):
        joint_round = True

    _send(Channel([Tag("1", log), Joint("2", log)], _Transcript(), np.random.default_rng(0)))
    assert log == ["1:in:2", "2:in:2", "2:out", "1:out"]


def test_a_defense_sees_the_model_the_clients_downloaded():
    """As Flower's LocalDpMod: clip each upload's distance to the downloaded model."""

    class ClipToModel(Defense):
        def process_uploads(self, uploads, ctx, call_next):
            V = ctx.model["V"]
            for b in uploads.batches:
                for p in b.payloads:
                    p["values"] = V + np.clip(p["values"] - V, -0.5, 0.5)
            return call_next(uploads)

    channel = Channel([ClipToModel()], _Transcript(), np.random.default_rng(0))
    assert channel.model is None
    channel.download({"V": np.array([1.0, -1.0])})
    out = channel.send(0, "grad_V", ["client:0"], [{"values": np.array([3.0, -1.2])}])
    np.testing.assert_allclose(out.payloads[0]["values"], [1.5, -1.2])
    assert ClipToModel.capabilities == {UPLOAD}


def test_old_style_on_upload_is_adapted_with_a_warning_and_removed_hooks_are_refused():
    with pytest.warns(DeprecationWarning, match="Old.on_upload: override process_uploads"):

        class Old(Defense):
            def on_upload(self, batch, channel):
                for p in batch.payloads:
                    p["values"] = p["values"] + 1.0
                return batch

    assert Old.capabilities == {UPLOAD}
    out = _send(Channel([Old()], _Transcript(), np.random.default_rng(0)))
    np.testing.assert_array_equal(out[1].payloads[1]["values"], [2.0, 2.0])
    for hook in ("on_round", "packs", "on_upload_packed", "on_round_packed", "on_round_summed", "summed_noise"):
        with pytest.raises(TypeError, match=f"{hook} is no longer a defense hook; override process_uploads"):
            type("Stale", (Defense,), {hook: lambda self, *a: None})
    with pytest.raises(TypeError, match="aggregate is no longer a defense hook"):
        type("Stale", (Defense,), {"aggregate": lambda self, *a: None})


def test_the_receiver_sum_travels_with_the_batch_a_hiding_defense_makes():
    class Sealed(Defense):
        capabilities = frozenset({UPLOAD, AGGREGATION})

        def process_uploads(self, uploads, ctx, call_next):
            def seal(b: UploadBatch) -> UploadBatch:
                total = np.sum([p["values"] for p in b.payloads], axis=0)
                sealed = [{"values": np.zeros_like(p["values"])} for p in b.payloads]
                return UploadBatch(b.round, b.kind, b.senders, sealed, receiver_sum=lambda *_: {"values": total})

            return call_next(uploads.map(seal))

    channel = Channel([Sealed()], _Transcript(), np.random.default_rng(0))
    sent = channel.send(0, "x", ["client:0", "client:1"], [{"values": np.ones(2)}, {"values": 2 * np.ones(2)}])
    assert not sent.payloads[0]["values"].any()
    np.testing.assert_array_equal(channel.sum(sent)["values"], [3.0, 3.0])


def test_noise_goes_on_the_sums_only_in_a_summed_round():
    uploads = RoundUploads(0, [])
    with pytest.raises(ValueError, match="only in a round the receiver only sums"):
        uploads.noise_on_sums(lambda rng, counts: counts)


@pytest.mark.parametrize("keys", [("values",), ("values", "extra")])
def test_with_floats_gives_the_same_numbers_packed_and_unpacked(keys):
    """The floats a defense changes come in (payload, key) order on either form."""
    rng = np.random.default_rng(4)
    bounds = np.array([0, 2, 2, 5])
    arrays = {"items": np.array([0, 3, 1, 2, 3]), **{k: rng.normal(size=(5, 2)) for k in keys}}
    packed = PackedBatch(0, "grad_V", ["client:0", "client:1", "client:2"], arrays, bounds)
    before = {k: v.copy() for k, v in arrays.items()}

    def ramp(flat):
        flat += np.arange(flat.size)
        return flat

    got, want = packed.with_floats(ramp), packed.unpacked().with_floats(ramp)
    assert isinstance(got, PackedBatch) == (len(keys) == 1)
    got_payloads = got.payloads() if isinstance(got, PackedBatch) else got.payloads
    for g, w in zip(got_payloads, want.payloads):
        assert g.keys() == w.keys()
        for k in g:
            np.testing.assert_array_equal(g[k], w[k], strict=True)
    assert all(np.array_equal(arrays[k], before[k]) for k in arrays)  # the clients' plaintext untouched

"""The batched clip-and-noise of dp-laplace / dp-gaussian (``clip_per="user"``) equals the
per-client loop it replaced, bit for bit, on random ragged uploads; so does the batched run
check of the channel's plain sum.

The reference below is the per-sender loop the defenses ran before (kept here as the oracle):
every float entry of every sender gathered in (batch, payload, key) order, the joint norm as a
Python sum of per-entry ``np.sum``, one factor min(1, C / norm), then one noise draw over every
float in that order, added entry by entry.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privaudit.defenses.base import UploadBatch
from privaudit.defenses.dp_gaussian import DPGaussian
from privaudit.defenses.dp_laplace import DPLaplace, JointClip, segment_sums
from privaudit.protocols.base import _increasing_within


def _reference_clip(batches: list[UploadBatch], C: float, ord: int) -> list[list[dict]]:
    """The old per-sender loop of ``ClippedNoise.clip`` under ``clip_per="user"``."""
    out = [[dict(p) for p in b.payloads] for b in batches]
    groups: dict[str, list[tuple[int, int, str]]] = {}
    for i, b in enumerate(batches):
        for j, (sender, p) in enumerate(zip(b.senders, b.payloads)):
            groups.setdefault(sender, []).extend((i, j, k) for k in b.float_keys(p))
    for slots in groups.values():
        arrays = [np.asarray(batches[i].payloads[j][k], dtype=np.float64) for i, j, k in slots]
        if ord == 1:
            total = float(sum(np.abs(a).sum() for a in arrays))
        else:
            total = math.sqrt(float(sum(np.sum(a * a) for a in arrays)))
        factor = min(1.0, C / total) if total > 0 else 1.0
        for (i, j, k), a in zip(slots, arrays):
            out[i][j][k] = a * factor
    return out


def _reference_noise(out: list[list[dict]], batches: list[UploadBatch], draw) -> list[list[dict]]:
    """The old noise loop: one draw over every float entry in (batch, payload, key) order."""
    slots = [(i, j, k) for i, b in enumerate(batches) for j, p in enumerate(out[i]) for k in b.float_keys(p)]
    noise = draw(sum(np.asarray(out[i][j][k]).size for i, j, k in slots))
    offset = 0
    for i, j, k in slots:
        arr = np.asarray(out[i][j][k], dtype=np.float64)
        out[i][j][k] = arr + noise[offset : offset + arr.size].reshape(arr.shape)
        offset += arr.size
    return out


def _ragged_round(rng: np.random.Generator, n: int, m: int = 30, K: int = 4, p: int = 3) -> list[UploadBatch]:
    """grad_V rows of a random (possibly empty) item subset per client, grad_P (p x K, sometimes
    float32 or (0, K)), an integer count entry; heavy-tailed values so that some clients clip and
    some do not; one sender appears twice in grad_V (a repeated sender is one clip unit)."""
    senders = [f"client:{u}" for u in range(n)]
    grad_v, grad_p = [], []
    for _ in range(n):
        scale = 1e-7 if rng.random() < 0.3 else 10 ** rng.uniform(-1, 1)  # tiny ones stay unclipped
        items = np.sort(rng.choice(m, size=int(rng.integers(0, m)), replace=False)).astype(np.int64)
        grad_v.append({"items": items, "values": rng.standard_cauchy((len(items), K)) * scale})
        rows = p if rng.random() > 0.1 else 0
        values = rng.standard_cauchy((rows, K)) * scale
        grad_p.append({"values": values.astype(np.float32) if rng.random() < 0.2 else values, "count": np.int64(3)})
    grad_v.append({"items": np.array([1, 4], dtype=np.int64), "values": rng.normal(size=(2, K))})
    return [
        UploadBatch(0, "grad_V", senders + [senders[0]], grad_v),
        UploadBatch(0, "grad_P", senders, grad_p),
    ]


def _keys(batches):
    return [[b.float_keys(p) for p in b.payloads] for b in batches]


@pytest.mark.parametrize("ord", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_joint_clip_equals_per_client_loop(ord, seed):
    rng = np.random.default_rng(seed)
    batches = _ragged_round(rng, n=int(rng.integers(20, 60)))
    clip = float(10 ** rng.uniform(-1, 0))
    ref = _reference_clip(batches, clip, ord)
    got = JointClip.of(batches, _keys(batches), clip, ord).payloads()
    clipped = unclipped = 0
    for i, b in enumerate(batches):
        for j, p in enumerate(b.payloads):
            assert set(got[i].payloads[j]) == set(ref[i][j])
            for k in p:
                np.testing.assert_array_equal(got[i].payloads[j][k], ref[i][j][k], strict=True)
            if "values" in p and np.asarray(p["values"]).size:
                same = np.array_equal(np.asarray(p["values"], dtype=np.float64), ref[i][j]["values"])
                unclipped += same
                clipped += not same
    assert clipped and unclipped  # both branches of min(1, C / norm) were exercised


@pytest.mark.parametrize("cls", [DPLaplace, DPGaussian])
def test_on_round_equals_reference_clip_then_noise(cls):
    """The defense's whole round (clip, one draw, add) against the old loop with the same generator."""
    rng = np.random.default_rng(7)
    batches = _ragged_round(rng, n=40)
    defense = cls(clip=0.5)
    channel = type("Chan", (), {})()
    channel.rng = np.random.default_rng(3)
    channel.transcript = type("T", (), {"config": {"n_items": 30}})()
    got = defense.on_round(batches, channel)
    draws = np.random.default_rng(3)
    ref = _reference_noise(_reference_clip(batches, 0.5, defense.clip_ord), batches, lambda n: defense.draw(draws, n))
    for i in range(len(batches)):
        for j in range(len(batches[i].payloads)):
            for k, v in ref[i][j].items():
                np.testing.assert_array_equal(got[i].payloads[j][k], v, strict=True)
    assert defense.claim(1)["releases_per_round"] == 1
    assert defense.claim(1)["unnoised"] == "grad_P.count"


def test_segment_sums_are_per_segment_numpy_sums():
    """Bit for bit np.sum of each segment (np.add.reduceat rounds differently on long segments)."""
    rng = np.random.default_rng(1)
    for sizes in ([5, 0, 300, 1, 4000, 0], [160] * 9, [0, 0], [2000]):
        values = np.abs(rng.normal(size=sum(sizes))) * 1e3
        got = segment_sums(values, np.asarray(sizes, dtype=np.int64))
        ends = np.cumsum(sizes)
        want = np.array([values[e - s : e].sum() for s, e in zip(sizes, ends)])
        np.testing.assert_array_equal(got, want)


def test_plain_sum_run_check_equals_per_payload_check():
    """The batched check that every payload's row ids increase (plain sum's fast path) against
    the per-payload check it replaced, on random runs with repeats, empties and decreases."""
    rng = np.random.default_rng(2)
    for _ in range(300):
        runs = [np.sort(rng.choice(9, size=int(rng.integers(0, 5)), replace=False)) for _ in range(rng.integers(1, 5))]
        if rng.random() < 0.5:
            k = int(rng.integers(len(runs)))
            runs[k] = rng.integers(0, 9, size=len(runs[k]))  # maybe a repeat or a decrease inside
        want = all(len(r) < 2 or bool(np.all(r[1:] > r[:-1])) for r in runs)
        index = np.concatenate(runs).astype(np.int64)
        assert _increasing_within(index, [len(r) for r in runs]) == want

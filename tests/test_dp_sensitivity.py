"""The sensitivity dp-laplace and dp-gaussian account with bounds what a client releases.

For neighbouring inputs (one rating replaced: rating level; one user's data removed or replaced,
rated-item set included, with ``dense=true``: user level) the L1 (Laplace) / L2 (Gaussian)
distance of the released PRE-NOISE uploads of one client in one round -- grad_V and grad_P
together -- never exceeds the ``sensitivity`` of ``privacy_spent``: on random uploads through
the defense's own clip, and in small FedMVMF runs whose noise is switched off (so the
transcript records the clipped release). Without the joint clip the same check fails (the
baseline at the end): one rating moves every row a FedMVMF client uploads.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privaudit.data import synthetic
from privaudit.defenses.base import UploadBatch
from privaudit.defenses.dp_gaussian import DPGaussian
from privaudit.defenses.dp_laplace import DPLaplace, joint_norm
from privaudit.protocols.fedmvmf import FedMVMF

ORD = {"l1": 1, "l2": 2}
RUN = {"epochs": 2, "K": 3, "record_rounds": -1, "test_fraction": 0.0, "cold_user_fraction": 0.0}
RUN["cold_item_fraction"] = 0.0
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Silent:
    """Mixin: no noise, so a run's transcript records the clipped (pre-noise) release."""

    def draw(self, rng, size):
        return np.zeros(size)


class SilentLaplace(_Silent, DPLaplace):
    pass


class SilentGaussian(_Silent, DPGaussian):
    pass


SILENT = {"dp-laplace": SilentLaplace, "dp-gaussian": SilentGaussian}


def _distance(a: dict, b: dict, ord: int) -> float:
    """Joint norm of the difference of two releases {kind: payload} (item ids must agree)."""
    diffs = []
    for kind in a:
        if "items" in a[kind]:
            np.testing.assert_array_equal(a[kind]["items"], b[kind]["items"])
        diffs.append(np.asarray(a[kind]["values"]) - np.asarray(b[kind]["values"]))
    return joint_norm(diffs, ord)


def _releases(transcript) -> dict[tuple[int, str], dict]:
    out: dict[tuple[int, str], dict] = {}
    for m in transcript.messages:
        if m.kind in ("grad_V", "grad_P") and m.sender.startswith("client:"):
            out.setdefault((m.round, m.sender), {})[m.kind] = m.payload
    return out


class _Chan:
    def __init__(self, n_items: int):
        self.rng = np.random.default_rng(0)
        self.transcript = type("T", (), {"config": {"n_items": n_items}})()


def _upload(rng, n_items, K, p, scale):
    """One client's round: grad_V rows of a proper subset of the items, grad_P (heavy-tailed values)."""
    items = np.sort(rng.choice(n_items, size=int(rng.integers(1, n_items)), replace=False)).astype(np.int64)
    return [
        UploadBatch(
            0, "grad_V", ["client:0"], [{"items": items, "values": scale * rng.standard_cauchy((len(items), K))}]
        ),
        UploadBatch(0, "grad_P", ["client:0"], [{"values": scale * rng.standard_cauchy((p, K))}]),
    ]


@pytest.mark.parametrize("name", ["dp-laplace", "dp-gaussian"])
@given(
    seed=st.integers(0, 2**31),
    clip=st.floats(0.01, 100.0),
    scale=st.floats(1e-3, 1e3),
    user_level=st.booleans(),
)
@SETTINGS
def test_clip_of_random_uploads_is_within_the_sensitivity(name, seed, clip, scale, user_level):
    """Two random uploads (same item set: rating level; any item sets, dense: user level)."""
    rng = np.random.default_rng(seed)
    n_items, K, p = int(rng.integers(2, 30)), int(rng.integers(1, 6)), int(rng.integers(0, 5))
    a = _upload(rng, n_items, K, p, scale)
    b = _upload(rng, n_items, K, p, scale)
    if not user_level:  # rating level: the same rated items, every float may change
        b[0].payloads[0]["items"] = a[0].payloads[0]["items"]
        b[0].payloads[0]["values"] = scale * rng.standard_cauchy(a[0].payloads[0]["values"].shape)
    chan = _Chan(n_items)
    rb = {x.kind: x.payloads[0] for x in SILENT[name](clip=clip, dense=user_level).on_round(b, chan)}
    d = SILENT[name](clip=clip, dense=user_level)
    ra = {x.kind: x.payloads[0] for x in d.on_round(a, chan)}
    spent = d.privacy_spent(1)
    assert spent["neighbour"] == ("user" if user_level else "rating")
    assert spent["releases"] == 1 and spent["sensitivity"] == pytest.approx(2 * clip)
    ord = ORD[spent["norm"]]
    assert joint_norm([ra[k]["values"] for k in ra], ord) <= clip * (1 + 1e-9)
    assert _distance(ra, rb, ord) <= spent["sensitivity"] * (1 + 1e-9)


def _change_one_rating(ds, rng):
    R = ds.ratings.tocsr(copy=True)
    k = int(rng.integers(R.nnz))
    R.data[k] = ds.rating_max if R.data[k] != ds.rating_max else ds.rating_min
    return ds.with_ratings(R), int(np.searchsorted(R.indptr, k, side="right") - 1)


def _remove_one_user(ds, rng):
    """The user's ratings and attributes removed; it still takes part (the server sees who sends)."""
    u = int(rng.integers(ds.n_users))
    R = ds.ratings.tolil(copy=True)
    R.rows[u], R.data[u] = [], []
    X = np.array(ds.user_attributes, dtype=np.float64)
    X[u] = 0.0
    return ds.with_ratings(R.tocsr())._replace(user_attributes=X), u


@pytest.mark.parametrize("name", ["dp-laplace", "dp-gaussian"])
@pytest.mark.parametrize("level", ["rating", "user"])
@given(seed=st.integers(0, 2**31), clip=st.sampled_from([0.05, 1.0, 20.0]))
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fedmvmf_release_moves_at_most_the_sensitivity(name, level, seed, clip):
    rng = np.random.default_rng(seed)
    ds = synthetic(n_users=12, n_items=40, seed=int(rng.integers(1000)))
    other, victim = (_change_one_rating if level == "rating" else _remove_one_user)(ds, rng)
    user_level = level == "user"
    runs = []
    for data in (ds, other):
        d = SILENT[name](clip=clip, dense=user_level)
        runs.append((FedMVMF().run(data, RUN, [d], seed), d))
    (a, d), (b, _) = runs
    spent = d.privacy_spent(RUN["epochs"])
    assert spent["neighbour"] == level and spent["item_set_covered"] is user_level
    assert spent["releases"] == RUN["epochs"]  # grad_V and grad_P: one joint release per round
    ra, rb = _releases(a.transcript), _releases(b.transcript)
    assert ra.keys() == rb.keys() and len(ra) == RUN["epochs"] * ds.n_users
    ord = ORD[spent["norm"]]
    moved = [_distance(ra[key], rb[key], ord) for key in ra]
    assert max(moved) <= spent["sensitivity"] * (1 + 1e-9)
    assert _distance(ra[0, f"client:{victim}"], rb[0, f"client:{victim}"], ord) > 0  # the victim's release moved


def test_without_the_joint_clip_one_rating_moves_the_release_beyond_2c():
    """Baseline: clip_per=row (each row to C) lets one rating move a client's release far past
    2C -- which is why that mode is accounted as one release per row."""
    ds = synthetic(n_users=12, n_items=40, seed=3)
    other, victim = _change_one_rating(ds, np.random.default_rng(4))
    cfg = {**RUN, "epochs": 1}
    out = []
    for data in (ds, other):
        d = SilentLaplace(clip=1.0, clip_per="row")
        out.append(_releases(FedMVMF().run(data, cfg, [d], 0).transcript))
    moved = _distance(out[0][0, f"client:{victim}"], out[1][0, f"client:{victim}"], 1)
    assert moved > 2.0 * 2.0
    rows = sum(len(p["values"]) for p in out[0][0, f"client:{victim}"].values())
    assert d.privacy_spent(1)["releases"] >= rows  # every clipped row is counted as a release


def test_dense_upload_hides_the_item_set_and_keeps_the_sum():
    """dense=true: every grad_V upload covers all items (zeros where the client rated nothing,
    before noise) and the server's sums -- hence the model -- equal the sparse upload's."""
    ds = synthetic(n_users=12, n_items=40, seed=5)
    runs = {dense: FedMVMF().run(ds, RUN, [SilentLaplace(clip=0.5, dense=dense)], 0) for dense in (False, True)}
    m = runs[True].transcript.config["n_items"]
    for msg in runs[True].transcript.select("grad_V"):
        assert np.array_equal(msg.payload["items"], np.arange(m))
        rated = runs[False].transcript.private(msg.sender)["items"]
        unrated = np.setdiff1d(np.arange(m), rated)
        assert len(unrated) > 0 and not np.any(msg.payload["values"][unrated])
    np.testing.assert_allclose(runs[True].model["V"], runs[False].model["V"], rtol=1e-9, atol=1e-12)
    spent = {dense: r.transcript.config["defenses"][0] for dense, r in runs.items()}
    assert spent[True]["dense"] is True and spent[False]["dense"] is False

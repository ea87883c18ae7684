"""DP accounting of dp-laplace and dp-gaussian against dp-accounting itself; target_epsilon round trips."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from privaudit.data import synthetic
from privaudit.defenses import accounting
from privaudit.defenses.base import UploadBatch
from privaudit.defenses.dp_gaussian import DPGaussian
from privaudit.defenses.dp_laplace import DPLaplace
from privaudit.errors import PrivauditError
from privaudit.protocols.fedmvmf import FedMVMF


def _oracle(event, rounds, delta):
    """The library's own PLD at its default (finer) discretization."""
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(event, rounds)
    return acc.get_epsilon(delta)


class _Chan:
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)


@pytest.mark.parametrize("eps,rounds", [(1.0, 40), (0.3, 10), (3.0, 5)])
def test_laplace_pld_matches_the_library_and_beats_basic(eps, rounds):
    d = DPLaplace(epsilon=eps, delta=1e-5)
    spent = d.privacy_spent(rounds)
    oracle = _oracle(dp_accounting.LaplaceDpEvent(1.0 / eps), rounds, 1e-5)
    assert spent["epsilon"] == pytest.approx(oracle, rel=0.01)
    assert spent["epsilon_basic"] == pytest.approx(rounds * eps)
    assert spent["epsilon"] < spent["epsilon_basic"]
    assert spent["accountant"] == "pld" and spent["delta"] == 1e-5 and spent["epsilon_per_round"] == eps
    # delta = 0 (default): pure epsilon by basic composition, the PLD number beside it
    pure = DPLaplace(epsilon=eps).privacy_spent(rounds)
    assert pure["epsilon"] == pytest.approx(rounds * eps) and pure["accountant"] == "basic" and pure["delta"] == 0.0
    assert pure["epsilon_pld"] == pytest.approx(spent["epsilon"])


@pytest.mark.parametrize("sigma,rounds", [(1.0, 40), (3.0, 10), (0.8, 1)])
def test_gaussian_pld_matches_the_library_and_rdp_is_looser(sigma, rounds):
    spent = DPGaussian(noise_multiplier=sigma, delta=1e-5).privacy_spent(rounds)
    oracle = _oracle(dp_accounting.GaussianDpEvent(sigma), rounds, 1e-5)
    assert spent["epsilon"] == pytest.approx(oracle, rel=0.01)
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(sigma), rounds)
    assert spent["epsilon"] <= rdp.get_epsilon(1e-5) * 1.001
    assert spent["epsilon"] <= spent["epsilon_basic"] + 1e-9
    assert spent["neighbour"] == "rating" and spent["item_set_covered"] is False  # no upload seen, not dense
    assert spent["accountant"] == "pld" and spent["releases"] == rounds and spent["sensitivity"] == 2.0


def test_target_epsilon_round_trip():
    d = DPLaplace(target_epsilon=8.0, rounds=40, delta=1e-5)
    assert d.privacy_spent(40)["epsilon"] == pytest.approx(8.0, rel=1e-3)
    assert d.config["epsilon"] > 8.0 / 40  # PLD lets each round spend more than basic composition would
    basic = DPLaplace(target_epsilon=8.0, rounds=40)
    assert basic.config["epsilon"] == pytest.approx(0.2, rel=1e-6)
    g = DPGaussian(target_epsilon=4.0, rounds=10, delta=1e-6)
    assert g.privacy_spent(10)["epsilon"] == pytest.approx(4.0, rel=1e-3)
    with pytest.raises(PrivauditError):
        accounting.calibrate(lambda x: 5.0, 1.0, 1e-3, 1e3, True)


def test_target_epsilon_reads_the_rounds_from_the_public_config():
    ds = synthetic(n_users=30, n_items=60, seed=2)
    d = DPLaplace(target_epsilon=6.0)
    res = FedMVMF().run(ds, {"epochs": 3, "K": 4}, [d], 0)
    (entry,) = [e for e in res.transcript.config["defenses"] if e["name"] == "dp-laplace"]
    assert entry["epsilon"] == pytest.approx(2.0) == d.config["epsilon"]  # 6 over 3 epochs, basic composition
    assert entry["noise_scale"] == pytest.approx(1.0)  # 2C / epsilon, public with the calibrated epsilon
    assert d.privacy_spent(3)["epsilon"] == pytest.approx(6.0)


def test_upload_clipping_counts_both_messages_of_every_round():
    """clip_per=upload clips grad_V and grad_P separately: 2 releases per epoch, 6 in 3 epochs,
    reported by basic composition as 6 epsilon (not 3); the joint clip (clip_per=user) makes 3."""
    ds = synthetic(n_users=30, n_items=60, seed=2)
    spent = {}
    for per in ("upload", "user"):
        d = DPLaplace(epsilon=1.0, clip_per=per)
        FedMVMF().run(ds, {"epochs": 3, "K": 4}, [d], 0)
        spent[per] = d.privacy_spent(3)
    assert spent["upload"]["releases"] == 6 and spent["upload"]["epsilon"] == pytest.approx(6.0)
    assert spent["upload"]["epsilon_per_round"] == pytest.approx(2.0)
    assert spent["user"]["releases"] == 3 and spent["user"]["epsilon"] == pytest.approx(3.0)
    g = DPGaussian(noise_multiplier=2.0, clip_per="upload")
    FedMVMF().run(ds, {"epochs": 3, "K": 4}, [g], 0)
    oracle = _oracle(dp_accounting.GaussianDpEvent(2.0), 6, 1e-5)
    assert g.privacy_spent(3)["releases"] == 6 and g.privacy_spent(3)["epsilon"] == pytest.approx(oracle, rel=0.01)
    with pytest.raises(PrivauditError, match="clip_per=user"):
        DPLaplace(target_epsilon=6.0, clip_per="upload")


def test_dp_gaussian_clips_rows_in_l2_and_adds_sigma_2c_noise():
    d = DPGaussian(noise_multiplier=1e-9, clip=2.0, clip_per="row")
    rows = np.array([[3.0, 4.0], [0.3, 0.4]])
    out = d.on_upload(UploadBatch(0, "grad_V", ["client:0"], [{"values": rows, "items": np.arange(2)}]), _Chan())
    assert np.allclose(np.linalg.norm(out.payloads[0]["values"], axis=1), [2.0, 0.5])
    d = DPGaussian(noise_multiplier=0.5, clip=2.0)
    out = d.on_upload(UploadBatch(0, "grad_V", ["client:0"], [{"values": np.zeros((500, 40))}]), _Chan())
    assert np.std(out.payloads[0]["values"]) == pytest.approx(2.0, rel=0.02)  # sigma x sensitivity 2C
    for bad in ({"noise_multiplier": 0}, {"delta": 0.0}, {"clip_per": "item"}, {"rounds": -1}):
        with pytest.raises(PrivauditError):
            DPGaussian(**bad)


def test_an_exact_entry_limits_the_claim_to_rating_level():
    """An integer count goes out without noise: one user's data (which changes it) is not covered."""
    d = DPLaplace(dense=True)
    payload = {"sum": np.array([3.0]), "count": np.array([2], dtype=np.int64)}
    out = d.on_upload(UploadBatch(0, "mean", ["client:0"], [payload]), _Chan())
    assert out.payloads[0]["count"] is payload["count"]  # released as is
    spent = d.privacy_spent(1)
    assert spent["item_set_covered"] is True and spent["neighbour"] == "rating" and spent["unnoised"] == "mean.count"
    clean = DPLaplace(dense=True)
    clean.on_upload(UploadBatch(0, "mean", ["client:0"], [{"sum": np.array([3.0])}]), _Chan())
    assert clean.privacy_spent(1)["neighbour"] == "user" and clean.privacy_spent(1)["unnoised"] == ""


def test_target_epsilon_stops_a_run_with_two_releases_per_round():
    """A protocol that sends a round's messages separately makes two releases per round: the
    calibration to one release per round would under-count, so the run stops (one line)."""
    d = DPLaplace(target_epsilon=2.0, rounds=2)
    d.on_upload(UploadBatch(0, "grad_V", ["client:0"], [{"values": np.ones((2, 2))}]), _Chan())
    with pytest.raises(PrivauditError, match="2 separately noised releases in one round"):
        d.on_upload(UploadBatch(0, "grad_P", ["client:0"], [{"values": np.ones((3, 2))}]), _Chan())


def test_a_reused_defense_accounts_its_last_run_only():
    ds = synthetic(n_users=30, n_items=60, seed=2)
    d = DPLaplace(epsilon=1.0)
    for _ in range(2):
        FedMVMF().run(ds, {"epochs": 2, "K": 4}, [d], 0)
        assert d.privacy_spent(2)["releases"] == 2 and d.privacy_spent(2)["epsilon"] == pytest.approx(2.0)

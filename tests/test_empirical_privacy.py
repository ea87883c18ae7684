"""Empirical epsilon from an attack's decisions flags a DP defense that adds too little noise."""

from __future__ import annotations

import numpy as np
import pytest

from privaudit.defenses.dp_laplace import DPLaplace
from privaudit.metrics import empirical_epsilon
from tests.broken_dp import BitScoreAttack, BrokenDPLaplace, broken_dp_registry  # noqa: F401 (a fixture)
from tests.dummies import DummyProtocol, tiny_dataset

CLAIMED = 1.0


@pytest.fixture(scope="module")
def many_clients():
    return tiny_dataset(n_users=3_000, n_items=12, seed=5)


def _bound(defense, dataset):
    res = DummyProtocol().run(dataset, {"p": 1, "rounds": 1, "signal": 0.5}, [defense], 0)
    out = BitScoreAttack().evaluate(res.transcript, np.random.default_rng(0))
    dec = out.decisions["bit"]
    return empirical_epsilon(dec.labels, dec.scores), defense.privacy_spent(1)["epsilon"]


@pytest.mark.usefixtures("broken_dp_registry")
def test_broken_defense_is_flagged_and_the_correct_one_is_not(many_clients):
    bound, claimed = _bound(BrokenDPLaplace(epsilon=CLAIMED, clip=1.0), many_clients)
    assert claimed == CLAIMED
    # true epsilon 10: one-sided tail TPR / FPR ratio e^10; 1,500 negatives resolve about e^4.8
    assert bound["epsilon_lb"] > 3.0 * claimed
    ok, claimed = _bound(DPLaplace(epsilon=CLAIMED, clip=1.0), many_clients)
    assert ok["epsilon_lb"] <= claimed
    assert ok["epsilon_lb"] > 0.3  # the attack does see the signal (a bound, not a vacuous 0)

"""Set precision/recall/F1 and AUC of privaudit.metrics against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import precision_recall_fscore_support, roc_auc_score

from privaudit import metrics


@pytest.mark.parametrize("seed", range(5))
def test_set_prf_matches_sklearn_on_indicator_vectors(seed):
    rng = np.random.default_rng(seed)
    m = 50
    truth = np.flatnonzero(rng.random(m) < 0.3)
    pred = np.flatnonzero(rng.random(m) < 0.4)
    y_true, y_pred = np.zeros(m, bool), np.zeros(m, bool)
    y_true[truth], y_pred[pred] = True, True
    p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, average="binary", zero_division=0)
    assert metrics.set_prf(pred, truth) == pytest.approx((p, r, f), abs=1e-12)


def test_set_prf_edge_cases_and_the_trivial_all_items_guess():
    assert metrics.set_prf(np.array([], int), np.array([1, 2])) == (0.0, 0.0, 0.0)
    p, r, f = metrics.set_prf(np.array([1]), np.array([], int))
    assert p == 0.0 and np.isnan(r) and f == 0.0
    # guessing every item: recall 1, precision the density, F1 far from 1
    assert metrics.set_prf(np.arange(10), np.array([0, 5])) == pytest.approx((0.2, 1.0, 1 / 3))
    assert metrics.f1_score(0.5, 0.5) == 0.5 and metrics.f1_score(0.0, 0.0) == 0.0


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(3)
    labels = rng.random(200) < 0.4
    scores = np.round(rng.random(200) + 0.3 * labels, 1)  # ties on purpose
    assert metrics.auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_attack_metrics_are_reexported_by_metrics():
    from privaudit import attack_metrics

    for name in attack_metrics.__all__:
        assert getattr(metrics, name) is getattr(attack_metrics, name) and name in metrics.__all__

"""``generic-interaction-inference`` on recorded implicit-feedback uploads: positives told from
sampled negatives by the sign of each changed row, against the popularity prior."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from privaudit import registry
from privaudit.transcript import Transcript

APP = Path(__file__).resolve().parents[1] / "examples" / "flower-fedncf-gmf"


def _gmf_like(n_clients=12, m=200, k=8, negatives=4, rounds=2, noise=0.05, seed=0) -> Transcript:
    """Uploads as a GMF client makes them: each trained row moves along +-(its user vector),
    positives one way, that round's fresh negatives the other, plus noise. Popular items are
    everyone's positives, so the popularity prior is strong."""
    rng = np.random.default_rng(seed)
    t = Transcript("flower", config={"negatives": negatives, "n_items": m}, parties=["server"])
    weights = 1.0 / np.arange(1, m + 1)
    for c in range(n_clients):
        party = f"client:{c}"
        t.parties.append(party)
        pos = np.sort(rng.choice(m, size=k, replace=False, p=weights / weights.sum()))
        t.add(0, party, party, "private", {"items": pos})
        p_u = rng.standard_normal(16)
        for r in range(rounds):
            neg = rng.choice(np.setdiff1d(np.arange(m), pos), size=negatives * k, replace=False)
            items = np.concatenate([pos, neg])
            sign = np.r_[np.ones(k), -np.ones(negatives * k)]
            scale = rng.uniform(0.2, 1.0, items.size)
            values = (sign * scale)[:, None] * p_u + noise * rng.standard_normal((items.size, 16))
            t.add(r, party, "server", "item_update", {"items": items, "values": values})
    return t


def _evaluate(name, t, **params):
    return registry.get("attack", name)(**params).evaluate(t, np.random.default_rng(0))


def test_one_upload_separates_positives_where_the_changed_rows_cannot():
    t = _gmf_like()
    out = _evaluate("generic-interaction-inference", t)
    assert out.metrics["precision"] == 1.0 and out.metrics["recall"] == 1.0
    prior = out.baseline_prior["f1"]
    assert out.metrics["f1"] >= prior + 0.2
    trained = _evaluate("generic-trained-items", t, rounds=1)
    assert trained.metrics["f1"] == pytest.approx(2 * 0.2 / 1.2)  # 1 positive in 5 changed rows
    roc = out.decisions["positive"]
    assert roc.groups is not None and roc.labels.sum() == 12 * 8


def test_the_negative_ratio_is_estimated_from_the_uploads_without_a_config_key():
    t = _gmf_like(rounds=3)
    t.config.pop("negatives")
    out = _evaluate("generic-interaction-inference", t)
    assert out.reconstruction.meta["negatives_from"] == "estimated from the uploads"
    assert out.reconstruction.meta["negatives"] == 4 and out.metrics["f1"] == 1.0
    # an app's own name for it in the recorded Flower run config
    t.config["flower_run_config"] = {"num-negatives": 4}
    assert (
        _evaluate("generic-interaction-inference", t).reconstruction.meta["negatives_from"]
        == "run config 'num-negatives'"
    )
    # one upload per client: nothing to estimate it from
    once = _gmf_like(rounds=1)
    once.config.pop("negatives")
    out = _evaluate("generic-interaction-inference", once)
    assert not out.reconstruction.supported and "no client uploaded twice" in out.reconstruction.reason
    assert _evaluate("generic-interaction-inference", once, negatives=4).metrics["f1"] == 1.0


@pytest.mark.slow
def test_recorded_flower_fedncf_gmf_app():
    """The example app, recorded (5 clients, 2 rounds): every positive found from one upload,
    where the changed rows of both uploads intersected stay far from that."""
    pytest.importorskip("flwr", reason='Flower is not installed: pip install "privaudit[flower]"')
    pytest.importorskip("ray", reason='Flower is not installed: pip install "privaudit[flower]"')
    from privaudit.integrations.flower import record

    t = record(APP, clients=5, rounds=2).transcript
    out = _evaluate("generic-interaction-inference", t)
    assert out.metrics["f1"] >= 0.95 and out.metrics["f1"] >= out.baseline_prior["f1"] + 0.2
    assert out.metrics["f1"] >= _evaluate("generic-trained-items", t).metrics["f1"] + 0.2

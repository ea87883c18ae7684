"""A deliberately broken DP defense and an attack whose per-record decisions test it.

``broken-dp-laplace`` claims what ``dp-laplace`` claims (``epsilon`` per round, same public
config, same ``privacy_spent``) but adds Laplace noise 10x smaller than that epsilon needs:
scale 2C / (10 epsilon) against the correct 2C / epsilon (the sensitivity of a joint L1 clip
to C is 2C). Its true per-round epsilon is 10x the claimed one. An audit must flag it from an
attack's decisions alone (empirical epsilon lower bound above the claimed epsilon).

Why this protocol and attack: the test needs decisions whose two hypotheses are exactly
neighbouring inputs of the mechanism, so that the bound can reach the true epsilon. In the
``dummy-proto`` protocol (tests/dummies.py) with ``p=1``, ``signal=C`` and one round, each
client uploads one float, +C or -C by its secret bit: the two values differ by exactly the
L1 sensitivity 2C and are never clipped, so the Laplace mechanism's likelihood ratio between
them is exactly e^epsilon in the tails (e^(10 epsilon) for the broken one). With
``signal=C/2`` they differ by C, half the sensitivity: the ratio is e^(epsilon/2).
``dummy-bit-scores`` scores each client by its noisy upload (higher = bit 1). With MVMF rows or
prototypes the decisions differ by much less than the sensitivity (the mechanism protects a
whole clipped row or a silo), so their lower bounds stay far below the claimed epsilon even for
a broken defense.
"""

from __future__ import annotations

import numpy as np
import pytest

from privaudit import registry
from privaudit.defenses.dp_laplace import DPLaplace
from privaudit.results import Decisions
from tests.dummies import DummyAttack, DummyProtocol


class BrokenDPLaplace(DPLaplace):
    """dp-laplace whose noise is 10x smaller than its claimed epsilon needs (true epsilon 10x)."""

    description = "test defense: claims dp-laplace's epsilon, adds 10x too little noise"
    #: the true per-round epsilon over the claimed one
    factor = 10.0

    @property
    def noise_scale(self) -> float:
        return self.sensitivity / (self.factor * self.config["epsilon"])


class BitScoreAttack(DummyAttack):
    """``dummy-attack`` that also returns its per-client decisions: score = the first upload."""

    description = "test attack: sign of the upload, with per-record scores"

    def run(self, view, knowledge, rng):
        recon = super().run(view, knowledge, rng)
        for m in view.select("upload"):
            recon.victims[m.sender].setdefault("score", np.asarray(m.payload["values"], dtype=np.float64))
        return recon

    def decisions(self, reconstruction, transcript):
        bits = {m.sender: m.payload["bits"] for m in transcript.messages if m.kind == "private"}  # one pass
        labels = [bits[p] for p in reconstruction.victims]
        scores = [v["score"] for v in reconstruction.victims.values()]
        return {"bit": Decisions(np.concatenate(scores), np.concatenate(labels) > 0.5, positive="secret bit 1")}


BROKEN = {
    ("protocol", "dummy-proto"): DummyProtocol,
    ("attack", "dummy-bit-scores"): BitScoreAttack,
    ("defense", "broken-dp-laplace"): BrokenDPLaplace,
}


@pytest.fixture
def broken_dp_registry():
    """Register the broken defense, the dummy protocol and the scoring attack for one test."""
    registry.available("protocol")
    for (kind, name), cls in BROKEN.items():
        registry._register(kind, name)(cls)
    try:
        yield BROKEN
    finally:
        for kind, name in BROKEN:
            registry.unregister(kind, name)

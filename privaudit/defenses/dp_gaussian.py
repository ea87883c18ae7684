"""``dp-gaussian``: one joint L2 clip of what a client releases, the Gaussian mechanism, PLD accounting.

Everything a client sends in one round is clipped as in :mod:`privaudit.defenses.dp_laplace`
but in the L2 norm: with ``clip_per="user"`` (default) one factor scales all the round's float
arrays to joint L2 norm <= C, so two releases differ by at most the sensitivity Delta = 2C in
L2 (one rating replaced; with ``dense=true`` one user's whole data, rated-item set included).
I.i.d. N(0, (noise_multiplier x Delta)^2) noise is added to every float: ``noise_multiplier``
is the ratio noise standard deviation / sensitivity of ``dp-accounting``'s Gaussian event.
``clip_per="upload"`` / ``"row"`` and messages a protocol sends separately are separate
releases, each of sensitivity 2C; the defense counts them (see ``dp-laplace``).

The total (epsilon, delta) over the run's releases comes from ``dp-accounting``'s PLD
accountant (releases self-compositions of the Gaussian mechanism; its RDP accountant below
noise multiplier 0.25, where epsilon is in the hundreds per release) at the defense's
``delta`` (default 1e-5); ``epsilon_basic`` is releases times the one-release epsilon at
delta / releases (basic composition of (epsilon, delta) releases, same total delta).

``target_epsilon > 0`` calibrates ``noise_multiplier`` to a total epsilon at ``delta`` over
the run (``rounds``, or the protocol's public round count at the first upload, as in
:mod:`privaudit.defenses.dp_laplace`; ``clip_per="user"`` only).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.defenses import accounting
from privaudit.defenses.dp_laplace import CLAIM, CLIP_PER_PARAM, DENSE_PARAM, ClippedNoise
from privaudit.defenses.noise import gaussian_sums
from privaudit.params import Param
from privaudit.registry import register_defense


@register_defense("dp-gaussian")
class DPGaussian(ClippedNoise):
    """Jointly L2-clip what a client releases in a round to C, add N(0, (sigma 2C)^2) noise; PLD over every release."""

    description = (
        "(epsilon, delta)-DP Gaussian mechanism: joint L2 clip to C, sensitivity 2C, "
        "N(0, (noise_multiplier 2C)^2) noise, PLD over every release"
    )
    privacy_claim = CLAIM.format(norm="L2")
    parameters = (
        Param("noise_multiplier", 1.0, "noise standard deviation / sensitivity 2C (sigma)", gt=0),
        Param("clip", 1.0, "joint L2 clipping norm C (sensitivity 2C)", gt=0),
        CLIP_PER_PARAM,
        DENSE_PARAM,
        Param("delta", 1e-5, "delta of the reported (epsilon, delta)", gt=0, lt=1),
        Param(
            "target_epsilon",
            0.0,
            "> 0: calibrate noise_multiplier so that the total epsilon over the run is this",
            ge=0,
        ),
        Param("rounds", 0, "rounds of the run for target_epsilon (0: the release count the protocol declares)", ge=0),
    )
    strength = "noise_multiplier"
    default_grid = (0.3, 1.0, 3.0, 10.0, 30.0)
    clip_ord = 2
    calibrated = "noise_multiplier"
    calibrated_increasing = False
    calibration_range = (0.2, 1e3)

    @property
    def noise_std(self) -> float:
        """Standard deviation of the added noise, noise_multiplier x 2C."""
        return self.config["noise_multiplier"] * self.sensitivity

    def public_noise(self) -> dict[str, float]:
        return {"noise_std": self.noise_std}

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.normal(0.0, self.noise_std, size)

    def noise_sums(self, rng: np.random.Generator, counts: np.ndarray) -> np.ndarray:
        return gaussian_sums(rng, counts, self.noise_std)

    def total_epsilon(self, value: float, rounds: int) -> float:
        return accounting.gaussian_epsilon(value, rounds, self.config["delta"])

    def privacy_spent(self, rounds: int) -> dict[str, Any]:
        """Total (epsilon, delta) over every release by the PLD accountant, basic composition
        beside it; plus the claim (:meth:`ClippedNoise.claim`)."""
        sigma, delta = self.config["noise_multiplier"], self.config["delta"]
        claim = self.claim(rounds)
        releases = claim["releases"]
        per_release = accounting.gaussian_epsilon(sigma, 1, delta / max(releases, 1)) if releases else 0.0
        return {
            "epsilon": accounting.gaussian_epsilon(sigma, releases, delta),
            "delta": delta,
            "unit": claim.pop("unit"),
            "accountant": accounting.gaussian_accountant(sigma),
            "epsilon_basic": releases * per_release,
            "epsilon_per_round": accounting.gaussian_epsilon(sigma, claim["releases_per_round"], delta),
            "epsilon_per_release": accounting.gaussian_epsilon(sigma, 1, delta),
            "noise_std": self.noise_std,
            **claim,
        }

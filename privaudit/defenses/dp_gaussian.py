"""``dp-gaussian``: L2 clipping and the Gaussian mechanism, (epsilon, delta) by the PLD accountant.

In every round each uploaded float array is clipped like ``dp-laplace`` but in the L2 norm
(``clip_per="row"``: every row to L2 norm <= C; ``"upload"``: one client's message as one
vector), then i.i.d. N(0, (noise_multiplier x C)^2) noise is added to every float (the
Gaussian mechanism for L2 sensitivity C). The total (epsilon, delta) over T rounds comes from
``dp-accounting``'s PLD accountant (T self-compositions of the Gaussian mechanism; its RDP
accountant below noise multiplier 0.25, where epsilon is in the hundreds per round) at the
defense's ``delta`` (default 1e-5); ``epsilon_basic`` is T times the one-round epsilon at
delta / T (basic composition of (epsilon, delta) rounds, same total delta).

``target_epsilon > 0`` calibrates ``noise_multiplier`` to a total epsilon at ``delta`` over
the run (``rounds``, or the protocol's public round count at the first upload, as in
:mod:`privaudit.defenses.dp_laplace`). The unit protected is one row (``clip_per="row"``) or
one user's upload in every round.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.defenses import accounting
from privaudit.defenses.dp_laplace import CLIP_PER, ClippedNoise
from privaudit.params import Param
from privaudit.registry import register_defense


@register_defense("dp-gaussian")
class DPGaussian(ClippedNoise):
    """L2-clip every upload (per row or per upload) to C and add N(0, (sigma C)^2) noise; PLD accounting."""

    description = (
        "(epsilon, delta)-DP Gaussian mechanism: L2 clipping to C, N(0, (noise_multiplier C)^2) noise, PLD accountant"
    )
    parameters = (
        Param("noise_multiplier", 1.0, "noise standard deviation / clipping norm (sigma)", gt=0),
        Param("clip", 1.0, "L2 clipping norm C", gt=0),
        Param(
            "clip_per", "row", "'row' (each row / 1-D array) or 'upload' (one client's whole message)", choices=CLIP_PER
        ),
        Param("delta", 1e-5, "delta of the reported (epsilon, delta)", gt=0, lt=1),
        Param(
            "target_epsilon",
            0.0,
            "> 0: calibrate noise_multiplier so that the total epsilon over the run is this",
            ge=0,
        ),
        Param("rounds", 0, "rounds of the run for target_epsilon (0: the protocol's public epochs/rounds)", ge=0),
    )
    strength = "noise_multiplier"
    default_grid = (0.3, 1.0, 3.0, 10.0, 30.0)
    clip_ord = 2
    calibrated = "noise_multiplier"
    calibrated_increasing = False
    calibration_range = (0.2, 1e3)

    @property
    def noise_std(self) -> float:
        """Standard deviation of the added noise, noise_multiplier x C."""
        return self.config["noise_multiplier"] * self.config["clip"]

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.normal(0.0, self.noise_std, size)

    def total_epsilon(self, value: float, rounds: int) -> float:
        return accounting.gaussian_epsilon(value, rounds, self.config["delta"])

    def privacy_spent(self, rounds: int) -> dict[str, Any]:
        """Total (epsilon, delta) over ``rounds`` rounds by the PLD accountant, with basic composition beside it."""
        sigma, delta = self.config["noise_multiplier"], self.config["delta"]
        rounds = max(int(rounds), 0)
        per_round = accounting.gaussian_epsilon(sigma, 1, delta / max(rounds, 1)) if rounds else 0.0
        return {
            "epsilon": accounting.gaussian_epsilon(sigma, rounds, delta),
            "delta": delta,
            "unit": "one rating row" if self.config["clip_per"] == "row" else "one user's upload",
            "accountant": accounting.gaussian_accountant(sigma),
            "epsilon_basic": rounds * per_round,
            "epsilon_per_round": accounting.gaussian_epsilon(sigma, 1, delta),
        }

"""``dp-sgd``: differentially private local training of FedNCF clients (Abadi et al. 2016).

Each client clips every per-sample gradient (all of its parameters the sample touches: its
user vector, the item row, the network) to L2 norm ``max_grad_norm``, sums the batch, adds
N(0, (noise_multiplier * max_grad_norm)^2) to *every* parameter (all m item rows, so the set of
uploaded rows no longer reveals the training items) and divides by the batch size -- Opacus's
``DPOptimizer`` step. The per-sample gradients are computed batched over the cohort with
``torch.func.vmap(grad(...))`` inside :func:`privaudit.models.ncf.train_clients` (Opacus's
``GradSampleModule`` wraps one module per optimizer and cannot batch clients); the accounting is
Opacus's ``RDPAccountant``: a client with n instances takes ``local_epochs * ceil(n / B)`` steps
of sampling rate q = B / n per round it takes part in (the accountant's Poisson-sampling
analysis applied to shuffled fixed-size batches, as Opacus does without ``poisson_sampling``).

Neighbour relation (what the accounting covers): replacing the content of ONE training instance
(a positive or a sampled negative) by another, the client's instance count fixed. FedNCF uploads
``n_instances`` exactly and (``mf-fedavg``, ``fedavg``) weights its updates by it, so adding or
removing an instance -- the relation of Opacus's accountant -- is visible to the server and not
covered; for a replacement the sum of clipped per-sample gradients moves by up to 2 C, so the
accountant is run at the effective noise multiplier ``noise_multiplier / 2`` (sensitivity 2C).
Neither one rating (a positive changes the user's negative-sampling distribution, so more than
one instance can differ) nor one user is covered. Every row of the item table is noised, so the
uploaded item ids reveal nothing (``item_set_covered``). Each round's upload is post-processing
of that round's noisy steps: the steps are the releases composed.

The protocol finds this defense by its ``local-training`` capability (:meth:`local_training`
gives the clipping and noise), hands it the clients' instance
counts and participation after the run (:meth:`account`), and reports the largest epsilon over
the clients as ``utility["epsilon"]``; :meth:`privacy_spent` gives the epsilon of the worst-case
client size after a given number of rounds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privaudit.defenses.base import LOCAL_TRAINING, Defense, LocalTraining
from privaudit.errors import MissingDependencyError
from privaudit.params import Param
from privaudit.registry import register_defense

#: replace-one neighbours move a sum of per-sample gradients clipped to C by up to 2 C
REPLACE_SENSITIVITY = 2.0


def rdp_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """Epsilon of ``steps`` DP-SGD steps by Opacus's RDP accountant."""
    if steps <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return float("inf")
    try:
        from opacus.accountants import RDPAccountant
    except ImportError:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("opacus", "ncf") from None
    acc = RDPAccountant()
    acc.history = [(float(noise_multiplier), float(min(sample_rate, 1.0)), int(steps))]
    return float(acc.get_epsilon(delta=delta))


@register_defense("dp-sgd")
class DPSGD(Defense):
    """Per-sample clipping + Gaussian noise in the clients' local Adam steps; Opacus RDP accounting."""

    requires_extras = ("ncf",)  # torch and opacus

    description = (
        "DP-SGD on FedNCF local training (per-sample clipping, Gaussian noise), epsilon by Opacus's RDP accountant"
    )
    parameters = (
        Param("noise_multiplier", 1.0, "noise standard deviation / clip norm (sigma)", ge=0),
        Param("max_grad_norm", 1.0, "per-sample gradient clip norm C", gt=0),
        Param("delta", 1e-5, "delta of the reported (epsilon, delta)", gt=0, lt=1),
    )
    strength = "noise_multiplier"
    default_grid = (0.3, 0.5, 0.7, 1.0, 2.0)
    applies_to = ("fedncf",)
    acts_on = (("item_update", "values"), ("net_update", "delta"))  # through the clients' optimizer
    capabilities = frozenset({LOCAL_TRAINING})
    privacy_claim = (
        "replace one training instance (count public: n_instances is uploaded exactly, so add/remove is "
        "not covered), per-step L2 sensitivity 2C, RDP over every local step; not rating- or user-level"
    )

    def validate(self) -> None:
        self._clients: dict[str, Any] | None = None

    def local_training(self) -> LocalTraining:
        """Per-sample clipping to ``max_grad_norm`` and Gaussian noise ``noise_multiplier * max_grad_norm``."""
        return LocalTraining(float(self.noise_multiplier), float(self.max_grad_norm))

    def account(
        self, n_positives: np.ndarray, participation: np.ndarray, batch_size: int, epochs: int, negatives: int
    ) -> None:
        """Record every client's local data size and the rounds it took part in (called by FedNCF)."""
        n_inst = np.asarray(n_positives, dtype=np.int64) * (1 + int(negatives))
        self._clients = {
            "n": n_inst,
            "rounds": np.asarray(participation, dtype=np.int64),
            "B": int(batch_size),
            "E": int(epochs),
        }

    def _steps(self, n: int, rounds: int) -> int:
        return rounds * self._clients["E"] * math.ceil(n / self._clients["B"])

    def _eps(self, n: int, rounds: int) -> float:
        """Epsilon of a client with ``n`` instances after ``rounds`` rounds (replace-one: noise
        multiplier / 2)."""
        B = self._clients["B"]
        return rdp_epsilon(self.noise_multiplier / REPLACE_SENSITIVITY, B / n, self._steps(n, rounds), self.delta)

    def spent_by_clients(self) -> dict[str, float]:
        """Largest and median epsilon over the clients that trained, for the rounds each took part in."""
        if self._clients is None:
            return {"epsilon": float("nan"), "delta": self.delta}
        n, rounds = self._clients["n"], self._clients["rounds"]
        active = (rounds > 0) & (n > 0)
        cache: dict[tuple[int, int], float] = {}
        eps = []
        for ni, ri in zip(n[active], rounds[active]):
            key = (int(ni), int(ri))
            if key not in cache:
                cache[key] = self._eps(*key)
            eps.append(cache[key])
        if not eps:
            return {"epsilon": 0.0, "epsilon_median": 0.0, "delta": self.delta}
        return {"epsilon": float(np.max(eps)), "epsilon_median": float(np.median(eps)), "delta": self.delta}

    def privacy_spent(self, rounds: int) -> dict[str, Any] | None:
        """Epsilon of the worst-case client (over the recorded client sizes) after ``rounds`` rounds
        (Opacus RDP); ``epsilon_basic`` composes the one-round epsilon of the smallest client
        linearly (its delta then adds up to rounds x delta)."""
        if self._clients is None or rounds <= 0:
            return None
        n = self._clients["n"]
        sizes = np.unique(n[n > 0])
        if sizes.size == 0:
            return None
        worst = int(sizes.min())  # fewest instances: largest sampling rate, largest epsilon
        total = max(self._eps(int(s), int(rounds)) for s in sizes)
        per_round = self._eps(worst, 1)
        return {
            "epsilon": total,
            "delta": self.delta,
            "unit": "one training instance replaced (instance count public)",
            "accountant": "rdp",
            "epsilon_basic": per_round * int(rounds),
            "epsilon_per_round": per_round,
            "neighbour": "instance",
            "item_set_covered": True,
            "releases": self._steps(worst, int(rounds)),
            "sensitivity": REPLACE_SENSITIVITY * float(self.max_grad_norm),
            "norm": "l2",
        }

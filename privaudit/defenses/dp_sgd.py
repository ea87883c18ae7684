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

The protocol finds this defense by its ``local_dp_sgd`` flag, hands it the clients' instance
counts and participation after the run (:meth:`account`), and reports the largest epsilon over
the clients as ``utility["epsilon"]``; :meth:`privacy_spent` gives the epsilon of the worst-case
client size after a given number of rounds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privaudit.defenses.base import Defense
from privaudit.errors import MissingDependencyError, PrivauditError
from privaudit.registry import register_defense


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

    description = "DP-SGD on FedNCF local training (per-sample clipping, Gaussian noise), epsilon by Opacus's RDP accountant"
    params = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-5}
    param_help = {
        "noise_multiplier": "noise standard deviation / clip norm (sigma)",
        "max_grad_norm": "per-sample gradient clip norm C",
        "delta": "delta of the reported (epsilon, delta)",
    }
    strength = "noise_multiplier"
    default_grid = (0.3, 0.5, 0.7, 1.0, 2.0)
    applies_to = ("fedncf",)
    local_dp_sgd = True

    def validate(self) -> None:
        if not (np.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise PrivauditError(f"defense 'dp-sgd': noise_multiplier must be >= 0, got {self.noise_multiplier!r}")
        if not (np.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise PrivauditError(f"defense 'dp-sgd': max_grad_norm must be > 0, got {self.max_grad_norm!r}")
        if not 0 < self.delta < 1:
            raise PrivauditError(f"defense 'dp-sgd': delta must be in (0, 1), got {self.delta!r}")
        self._clients: dict[str, Any] | None = None

    def account(self, n_positives: np.ndarray, participation: np.ndarray, batch_size: int, epochs: int, negatives: int) -> None:
        """Record every client's local data size and the rounds it took part in (called by FedNCF)."""
        n_inst = np.asarray(n_positives, dtype=np.int64) * (1 + int(negatives))
        self._clients = {"n": n_inst, "rounds": np.asarray(participation, dtype=np.int64), "B": int(batch_size), "E": int(epochs)}

    def _eps(self, n: int, rounds: int) -> float:
        B, E = self._clients["B"], self._clients["E"]
        steps = rounds * E * math.ceil(n / B)
        return rdp_epsilon(self.noise_multiplier, B / n, steps, self.delta)

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

    def privacy_spent(self, rounds: int) -> dict[str, float] | None:
        """Epsilon of the worst-case client (over the recorded client sizes) after ``rounds`` rounds."""
        if self._clients is None or rounds <= 0:
            return None
        n = self._clients["n"]
        sizes = np.unique(n[n > 0])
        if sizes.size == 0:
            return None
        return {"epsilon": max(self._eps(int(s), int(rounds)) for s in sizes), "delta": self.delta}

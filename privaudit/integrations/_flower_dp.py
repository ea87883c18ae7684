"""Flower's DP mods as privaudit ``defenses`` entries: the claim of one upload and its
composition over the rounds a client uploaded in (shared by the simulation and deployment
recorders)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["client_reported"]


def _gaussian_claim(noise_multiplier: float, rounds: int, delta: float) -> dict[str, Any]:
    """Accounted epsilon at ``delta`` of ``rounds`` Gaussian mechanisms (dp-accounting)."""
    from privaudit.defenses.accounting import gaussian_accountant, gaussian_epsilon

    if rounds <= 0:
        return {"rounds": 0}
    eps = gaussian_epsilon(noise_multiplier, rounds, delta)
    return {
        "rounds": int(rounds),
        "accounted_epsilon": float(eps) if math.isfinite(eps) else "inf",
        "accounted_delta": float(delta),
        "accountant": f"dp-accounting {gaussian_accountant(noise_multiplier)}, Gaussian x {int(rounds)} rounds",
    }


def _local_dp(mod: Any, rounds: int) -> dict[str, Any]:
    eps, delta, sens = float(mod.epsilon), float(mod.delta), float(mod.sensitivity)
    entry: dict[str, Any] = {
        "name": "flower-local-dp",
        "mod": "LocalDpMod",
        "side": "client",
        "clipping_norm": float(mod.clipping_norm),
        "sensitivity": sens,
        "epsilon": eps,
        "delta": delta,
        "neighbour": "local: one client's upload vs. any other of its uploads (L2 distance <= sensitivity)",
        "claim": "(epsilon, delta) per upload, Flower's classical Gaussian mechanism (valid for epsilon < 1)",
    }
    if eps > 0 and 0 < delta < 1 and sens > 0:
        z = math.sqrt(2.0 * math.log(1.25 / delta)) / eps  # noise std / sensitivity
        entry["noise_std"] = sens * z
        entry["noise_multiplier"] = z
        if rounds > 0:
            entry["basic_epsilon"] = rounds * eps
            entry["basic_delta"] = rounds * delta
            entry.update(_gaussian_claim(z, rounds, delta))
    return entry


class _Params:
    """A described LocalDpMod's parameters read back as attributes."""

    def __init__(self, entry: dict[str, Any]):
        self.clipping_norm = entry["clipping_norm"]
        self.sensitivity = entry["sensitivity"]
        self.epsilon = entry["epsilon"]
        self.delta = entry["delta"]


def client_reported(
    entries: dict[str, dict[str, Any]], reported: dict[str, set[int]], client_rounds: int
) -> list[dict[str, Any]]:
    """The DP mods the clients described (one entry per distinct description), each with the
    number of clients that reported it; a LocalDpMod's claim composed over ``client_rounds``
    (the most train replies of one client)."""
    out = []
    for key, entry in entries.items():
        entry = dict(entry)
        if entry.get("mod") == "LocalDpMod" and client_rounds:
            entry.update({k: v for k, v in _local_dp(_Params(entry), client_rounds).items() if k not in entry})
        entry["reported_by_clients"] = len(reported[key])
        out.append(entry)
    return out

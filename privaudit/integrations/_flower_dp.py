"""Flower's DP mods as privaudit ``defenses`` entries: the claim of one upload and its
composition over the rounds a client uploaded in (shared by the simulation and deployment
recorders)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["DEFAULT_DELTA", "adaptive_clipping", "check_claims", "client_reported", "defense_label", "describe"]

#: delta of the accounted epsilon when neither the app nor Flower gives one
DEFAULT_DELTA = 1e-5


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
        "neighbour": "claimed: one client's upload vs. any other of its uploads (L2 distance <= sensitivity)",
        "claim": "(epsilon, delta) per upload, Flower's classical Gaussian mechanism (valid for epsilon < 1)",
        "mechanism_sensitivity": 2.0 * float(mod.clipping_norm),
        "mechanism_neighbour": "one client's data replaced: two clipped updates differ by <= 2 clipping_norm (L2)",
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


# --------------------------------------------------------------------------- claims checked

#: a delivered epsilon this far above the claimed one (relative) breaks the claim
_TOLERANCE = 1e-6


def _num(entry: dict[str, Any], key: str) -> float | None:
    v = entry.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _eps(z: float, rounds: int, delta: float) -> float:
    from privaudit.defenses.accounting import gaussian_epsilon

    return float(gaussian_epsilon(z, max(int(rounds), 1), delta)) if z > 0 else math.inf


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "unbounded"
    return f"{x:.3g}"


def _claim(component: str, claimed: float | None, delivered: float, holds: bool, reason: str) -> dict[str, Any]:
    return {
        "component": component,
        "claimed_epsilon": claimed,
        "delivered_epsilon": float(delivered) if math.isfinite(delivered) else None,
        "holds": bool(holds),
        "reason": reason,
    }


def _check_local_dp(e: dict[str, Any]) -> dict[str, Any] | None:
    """LocalDpMod: Flower clips the update (sent model to reply) to L2 <= clipping_norm and adds
    N(0, std^2) with std = sensitivity sqrt(2 ln(1.25/delta)) / epsilon to every entry. Two
    clipped updates of one client (its data replaced) differ by at most 2 clipping_norm in L2:
    that is the mechanism's sensitivity, whatever ``sensitivity`` the app passed."""
    clip, sens, eps, delta = (_num(e, k) for k in ("clipping_norm", "sensitivity", "epsilon", "delta"))
    if clip is None or sens is None or eps is None or delta is None or not 0 < delta < 1:
        return None
    if not (clip > 0 and sens >= 0 and eps > 0):  # Flower refuses these (or divides by zero)
        return None
    rounds = int(_num(e, "rounds") or 1)
    true_sens = 2.0 * clip
    std = sens * math.sqrt(2.0 * math.log(1.25 / delta)) / eps if eps > 0 else math.inf
    z = std / true_sens
    per_upload = _eps(z, 1, delta) if std > 0 else math.inf
    composed = _eps(z, rounds, delta) if std > 0 else math.inf
    holds = per_upload <= eps * (1 + _TOLERANCE)
    unit = "unit: one client's data replaced, its clipped update (L2 over every uploaded array)"
    ratio = true_sens / sens if sens > 0 else math.inf
    head = "DP claim does not hold: " if not holds else "DP claim holds: "
    if sens < true_sens:
        cause = f"noise calibrated to sensitivity {sens:g}, the clipped update's sensitivity is {true_sens:g}"
        cause += f" ({_fmt(ratio)} x larger)"
    else:
        cause = f"noise calibrated to sensitivity {sens:g} >= the clipped update's {true_sens:g}"
    reason = (
        f"{head}LocalDpMod: {cause}: delivered epsilon per upload ~ {_fmt(per_upload)} vs claimed {eps:g} "
        f"(delta {delta:g}; over {rounds} upload{'s' if rounds != 1 else ''}: {_fmt(composed)}; "
        f"dp-accounting {'RDP' if z < 0.25 else 'PLD'} of noise multiplier {z:.3g}; {unit})"
    )
    if eps >= 1:
        reason += f"; Flower's classical Gaussian formula is used at epsilon {eps:g} >= 1, where it is not valid"
    return _claim("LocalDpMod", eps, per_upload, holds, reason)


def _check_fixed(e: dict[str, Any]) -> dict[str, Any] | None:
    """Fixed clipping wrappers: noise std z C / n on the mean of n clipped updates; one client
    added or removed moves the sum by at most C, so the noise multiplier is z (with n replies)."""
    z, clip, n = (_num(e, k) for k in ("noise_multiplier", "clipping_norm", "num_sampled_clients"))
    if z is None or clip is None or not n:
        return None
    rounds = int(_num(e, "rounds") or 0)
    delta = _num(e, "accounted_delta") or 1e-5
    replies = _num(e, "min_replies") or n
    z_eff = z * replies / n  # the mean divides by the replies, the noise by num_sampled_clients
    delivered = _eps(z_eff, rounds, delta) if rounds else math.nan
    flower = e.get("flower_accountant") if isinstance(e.get("flower_accountant"), dict) else {}
    claimed = _num(flower, "epsilon") if flower and int(flower.get("releases", 0) or 0) > 0 else None
    holds = claimed is None or not math.isfinite(delivered) or delivered <= claimed * (1 + _TOLERANCE)
    side = str(e.get("side", ""))
    sees = "the server sees every raw upload" if side == "server" else "the server sees every clipped upload unnoised"
    reason = (
        f"{'DP claim does not hold: ' if not holds else ''}{e.get('strategy', 'fixed clipping')}: "
        f"noise multiplier {z:g} on sensitivity {clip:g} (one client added or removed, clipping norm C)"
        f"{'' if replies == n else f', {int(replies)} of {int(n)} replies'}: delivered epsilon "
        f"{_fmt(delivered) if rounds else 'not accounted (no rounds)'} over {rounds} rounds at delta {delta:g}"
        f"{'' if claimed is None else f' vs Flower accountant {claimed:.3g}'}; protects the released aggregate "
        f"only: {sees} (epsilon against the server: unbounded)"
    )
    return _claim(str(e.get("strategy", "fixed clipping")), claimed, delivered if rounds else math.inf, holds, reason)


def _check_adaptive(e: dict[str, Any]) -> dict[str, Any] | None:
    """Adaptive clipping (Andrew et al., NeurIPS 2021): Flower noises the update sum with
    multiplier z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2 and the count of clipped clients with
    std sigma_b, so that the pair composes to the requested z when one client moves the count by
    1/2. Flower counts 0/1 bits: one client moves the count by 1, the pair composes to
    (z_delta^-2 + sigma_b^-2)^-1/2."""
    zd, sb = _num(e, "noise_multiplier"), _num(e, "clipped_count_stddev")
    if zd is None or sb is None or zd <= 0 or sb <= 0:
        return None
    rounds = int(_num(e, "rounds") or 0)
    delta = _num(e, "accounted_delta") or 1e-5
    z_req = (zd**-2 + (2 * sb) ** -2) ** -0.5
    z_eff = (zd**-2 + sb**-2) ** -0.5
    if not rounds:
        return None
    claimed, delivered = _eps(z_req, rounds, delta), _eps(z_eff, rounds, delta)
    holds = delivered <= claimed * (1 + _TOLERANCE)
    reason = (
        f"{'DP claim does not hold: ' if not holds else ''}{e.get('strategy')}: effective noise multiplier "
        f"{z_req:.3g} requested, {z_eff:.3g} delivered (Flower noises the uncentred count of 0/1 clipping "
        f"bits: one client moves it by 1, the requested multiplier assumes 1/2): delivered epsilon {_fmt(delivered)} vs {_fmt(claimed)} over "
        f"{rounds} rounds at delta {delta:g} (one client added or removed); protects the released "
        "aggregate only, not the uploads the server sees"
    )
    return _claim(str(e.get("strategy")), claimed, delivered, holds, reason)


def check_claims(defenses: list[Any]) -> list[dict[str, Any]]:
    """Every recorded Flower DP mod or wrapper checked against the mechanism it runs:
    ``{"component", "claimed_epsilon", "delivered_epsilon", "holds", "reason"}`` each (the
    ``dp_claims`` list of an audit). The sensitivity comes from what the mechanism clips, the
    delivered epsilon from dp-accounting (PLD, RDP at tiny noise multipliers) of the noise it
    actually adds; a claim holds when the delivered epsilon is at most the claimed one."""
    out = []
    for e in defenses or []:
        if not isinstance(e, dict):
            continue
        name = e.get("name")
        check = {
            "flower-local-dp": _check_local_dp,
            "flower-dp-server-fixed-clipping": _check_fixed,
            "flower-dp-client-fixed-clipping": _check_fixed,
            "flower-dp-adaptive-clipping": _check_adaptive,
        }.get(str(name))
        entry = check(e) if check else None
        if entry is not None:
            out.append(entry)
    return out


def adaptive_clipping(strategy: Any, rounds: int, delta: float) -> dict[str, Any]:
    """The ``defenses`` entry of a Flower adaptive-clipping wrapper (its parameters at the end)."""
    cls = type(strategy).__name__
    side = "server" if "ServerSide" in cls else "client"
    entry: dict[str, Any] = {
        "name": "flower-dp-adaptive-clipping",
        "strategy": cls,
        "side": side,
        "noise_multiplier": float(strategy.noise_multiplier),
        "clipped_count_stddev": float(strategy.clipped_count_stddev),
        "clipping_norm": float(strategy.clipping_norm),
        "num_sampled_clients": int(strategy.num_sampled_clients),
        "neighbour": "user-level: add or remove one client's whole update",
        "protects": "the aggregate (the released model), not the uploads",
        "rounds": int(rounds),
        "accounted_delta": float(delta),
    }
    return entry


def defense_label(entry: dict[str, Any]) -> str:
    """A short label of a ``defenses`` entry: ``LocalDpMod (clipping_norm=1.0, ...)``."""
    if not isinstance(entry, dict):
        return str(entry)
    keys = {
        "flower-local-dp": ("clipping_norm", "sensitivity", "epsilon", "delta"),
        "flower-dp-server-fixed-clipping": ("noise_multiplier", "clipping_norm", "num_sampled_clients"),
        "flower-dp-client-fixed-clipping": ("noise_multiplier", "clipping_norm", "num_sampled_clients"),
        "flower-dp-adaptive-clipping": ("noise_multiplier", "clipped_count_stddev", "num_sampled_clients"),
    }.get(str(entry.get("name")), ())
    head = str(entry.get("mod") or entry.get("strategy") or entry.get("workflow") or entry.get("name"))
    params = ", ".join(f"{k}={entry[k]:g}" if isinstance(entry.get(k), float) else f"{k}={entry.get(k)}" for k in keys)
    return f"{head} ({params})" if params else head


def describe(obj: Any, rounds: int = 0, delta: float | None = None) -> list[dict[str, Any]]:
    """The ``defenses`` entries of a Flower DP object (a strategy wrapper chain or a client mod).

    Parameters
    ----------
    obj : LocalDpMod, DifferentialPrivacy{Server,Client}SideFixedClipping, strategy, mod or None
        Strategies are followed through their ``strategy`` attribute (wrappers of wrappers).
    rounds : int
        Rounds a client uploaded in (LocalDpMod) or training rounds run (fixed clipping): the
        accounted epsilon composes that many Gaussian mechanisms (0: no accounting).
    delta : float, optional
        delta of the accounted epsilon for fixed clipping (default: the target delta of the
        strategy's Flower accountant if it has one, else :data:`DEFAULT_DELTA`).
    """
    out: list[dict[str, Any]] = []
    seen = 0
    while obj is not None and seen < 16:
        seen += 1
        cls = type(obj).__name__
        if cls == "LocalDpMod":
            out.append(_local_dp(obj, rounds))
        elif cls in ("DifferentialPrivacyServerSideFixedClipping", "DifferentialPrivacyClientSideFixedClipping"):
            out.append(_fixed_clipping(obj, rounds, DEFAULT_DELTA if delta is None else float(delta)))
        elif getattr(obj, "__name__", "") in ("fixedclipping_mod", "adaptiveclipping_mod"):
            out.append({"name": "flower-client-clipping", "mod": obj.__name__, "side": "client"})
        elif cls in ("DifferentialPrivacyServerSideAdaptiveClipping", "DifferentialPrivacyClientSideAdaptiveClipping"):
            out.append(adaptive_clipping(obj, rounds, DEFAULT_DELTA if delta is None else float(delta)))
        elif "DifferentialPrivacy" in cls:  # future wrappers: named, not accounted
            out.append({"name": "flower-dp", "strategy": cls, "note": "parameters not read by privaudit"})
        obj = getattr(obj, "strategy", None)
    return out


def _fixed_clipping(strategy: Any, rounds: int, delta: float) -> dict[str, Any]:
    cls = type(strategy).__name__
    side = "server" if "ServerSide" in cls else "client"
    z, clip, n = float(strategy.noise_multiplier), float(strategy.clipping_norm), int(strategy.num_sampled_clients)
    trust = (
        "the server clips and adds the noise: it sees the raw uploads"
        if side == "server"
        else "clients clip, the server adds the noise: it sees the clipped uploads"
    )
    entry: dict[str, Any] = {
        "name": f"flower-dp-{side}-fixed-clipping",
        "strategy": cls,
        "side": side,
        "noise_multiplier": z,
        "clipping_norm": clip,
        "num_sampled_clients": n,
        "noise_std": z * clip / n,
        "neighbour": "user-level: add or remove one client's whole update (clipped to clipping_norm)",
        "protects": f"the aggregate (the released model), not the uploads; {trust}",
        "sampling": "no amplification: every round counted in full",
    }
    accountant = getattr(strategy, "accountant", None)
    if accountant is not None:  # Flower's own accountant: its delta, its epsilon beside ours
        cfg = accountant.config
        delta = float(cfg.target_delta)
        spent = strategy.privacy_spent()
        entry["flower_accountant"] = {
            "epsilon": float(spent.epsilon),
            "delta": float(spent.delta),
            "releases": int(spent.num_releases),
            "method": str(spent.accounting_method),
            "neighbouring": str(getattr(cfg.neighboring_relation, "value", cfg.neighboring_relation)),
        }
    if z > 0 and rounds > 0:
        entry.update(_gaussian_claim(z, rounds, delta))
    return entry

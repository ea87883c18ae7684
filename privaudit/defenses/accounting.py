"""Privacy accounting of the DP defenses over a run, by Google's ``dp-accounting`` library.

Pure functions over (noise multiplier, rounds, delta); the defenses (``dp-laplace``,
``dp-gaussian``) only call them. Two accountants:

- **basic** sequential composition of pure epsilon-DP rounds: ``rounds * epsilon`` (delta 0);
- **pld**: the privacy loss distribution accountant (Koskela et al.; Doroshenko et al., "Connect
  the Dots", PETS 2022), ``dp_accounting.pld.PLDAccountant`` with the Laplace or Gaussian
  mechanism self-composed ``rounds`` times. Its discretization is pessimistic, so the epsilon
  is an upper bound; ``value_discretization_interval`` 1e-2 (library default 1e-4) keeps a
  call fast at large total epsilon and moves the result by < 1 % (docs/verdicts.md).

:func:`calibrate` inverts either accountant with :func:`scipy.optimize.brentq`: the per-round
noise that spends a target total epsilon over the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from privaudit.errors import PrivauditError

PLD_DISCRETIZATION = 1e-2
#: above this per-round epsilon the Laplace PLD gains < 1 % over basic composition and its
#: discretized loss distribution grows large: basic composition is returned
PLD_MAX_EPSILON_ROUND = 200.0
#: below this Gaussian noise multiplier the RDP accountant is used instead of the PLD
RDP_BELOW_NOISE_MULTIPLIER = 0.25


def _dp_accounting():
    try:
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant
    except ImportError:  # pragma: no cover - a base dependency
        raise PrivauditError(
            "the dp-accounting package is required for DP accounting: pip install dp-accounting"
        ) from None
    return dp_accounting, pld_privacy_accountant


def _pld_epsilon(event, rounds: int, delta: float) -> float:
    dp_accounting, pld = _dp_accounting()
    acc = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    acc.compose(event, int(rounds))
    return float(acc.get_epsilon(float(delta)))


def laplace_epsilon(epsilon_round: float, rounds: int, delta: float = 0.0) -> float:
    """Total epsilon of ``rounds`` Laplace mechanisms of per-round epsilon ``epsilon_round``.

    ``delta = 0``: basic composition, ``rounds * epsilon_round``. ``delta > 0``: the PLD
    accountant (Laplace noise multiplier = 1 / epsilon_round), never above the basic bound.
    """
    if rounds <= 0:
        return 0.0
    basic = float(rounds) * float(epsilon_round)
    if delta <= 0 or epsilon_round >= PLD_MAX_EPSILON_ROUND:
        return basic
    dp_accounting, _ = _dp_accounting()
    return min(basic, _pld_epsilon(dp_accounting.LaplaceDpEvent(1.0 / float(epsilon_round)), rounds, delta))


def gaussian_accountant(noise_multiplier: float) -> str:
    """``"pld"``, or ``"rdp"`` below :data:`RDP_BELOW_NOISE_MULTIPLIER` (where the PLD's loss
    distribution grows large and slow while the epsilon is far beyond any meaningful guarantee)."""
    return "rdp" if noise_multiplier < RDP_BELOW_NOISE_MULTIPLIER else "pld"


def gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """Total epsilon at ``delta`` of ``rounds`` Gaussian mechanisms (std = noise_multiplier x
    L2 sensitivity), by the accountant :func:`gaussian_accountant` picks."""
    if rounds <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    dp_accounting, _ = _dp_accounting()
    event = dp_accounting.GaussianDpEvent(float(noise_multiplier))
    if gaussian_accountant(noise_multiplier) == "rdp":
        from dp_accounting.rdp import rdp_privacy_accountant

        acc = rdp_privacy_accountant.RdpAccountant()
        acc.compose(event, int(rounds))
        return float(acc.get_epsilon(float(delta)))
    return _pld_epsilon(event, rounds, delta)


def gaussian_epsilon_per_round(noise_multiplier: float, delta: float) -> float:
    """Epsilon of one Gaussian round at ``delta`` (PLD)."""
    return gaussian_epsilon(noise_multiplier, 1, delta)


def calibrate(total: Callable[[float], float], target: float, lo: float, hi: float, increasing: bool) -> float:
    """The parameter x in [lo, hi] (log-scale search) with ``total(x) = target``.

    ``increasing``: whether ``total`` grows with x (epsilon per round) or falls (noise multiplier).
    Raises :class:`PrivauditError` when the target is outside ``[total(lo), total(hi)]``.
    """
    from scipy.optimize import brentq

    def f(logx: float) -> float:
        return math.log(total(math.exp(logx))) - math.log(target)

    a, b = math.log(lo), math.log(hi)
    fa, fb = f(a), f(b)
    if fa * fb > 0:
        lo_eps, hi_eps = sorted((total(lo), total(hi)))
        raise PrivauditError(
            f"target_epsilon {target:g} is outside what the accountant reaches here ({lo_eps:.3g} .. {hi_eps:.3g})"
        )
    return math.exp(brentq(f, a, b, xtol=1e-6, rtol=1e-8))


def declared_releases(protocol: str, config: Mapping[str, Any]) -> int | None:
    """Rounds in which every client releases its uploads in a run of the registered protocol
    ``protocol`` with public config ``config``, as the protocol declares it
    (:meth:`~privaudit.protocols.base.Protocol.release_count`); None when the protocol is not
    registered here or its release count is not fixed by its config (the accounting then counts
    the rounds recorded in the transcript, and says so)."""
    from privaudit import registry

    try:
        cls = registry.get("protocol", protocol)
    except PrivauditError:
        return None
    count = cls.release_count(config or {})
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise PrivauditError(f"protocol {protocol!r}: release_count must be a non-negative int or None, got {count!r}")
    return count

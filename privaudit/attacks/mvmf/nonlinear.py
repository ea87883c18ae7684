"""``mvmf-nonlinear``: the paper's server reconstruction attack on FedMVMF (PrivMVMF paper §4, §6.2).

The honest-but-curious FL server knows the V and P it sent in a round, the public config, and
each client's uploads ``grad_V`` (one row per item sent) and ``grad_P``. For every victim it
builds a *square* nonlinear system "uploads simulated from candidate (ratings r, attributes x,
latent u) = observed uploads", restricted to one random latent coordinate k, and solves it
with :func:`scipy.optimize.root`.

Unknowns ``z = [r (n), x (p), u (K)]`` where n is the number of items the client uploaded
(ObsOnly: its rated items; InclUnc: all m items; with ``sampling`` the rated plus the virtual
ones). Equations, with ``c_i = c(r_i)`` and ``s_i = v_i . u``:

* items (PrivMVMF paper eqs. 18, 22):  ``-2 c_i (r_i - s_i) u_k = grad_V[i, k]``           (n)
* attributes (eqs. 18, 22):          ``-2 alpha (x_j - P_j . u) u_k = grad_P[j, k]``      (p)
* SemiALS user update (eqs. 8, 19, 23), as the stationarity of the local loss::

      V_S^T (c * (V_S u - r)) + alpha P^T (P u - x) + lam u = 0                           (K)

  (the paper substitutes ``u = A^-1 b`` into the first two blocks; keeping u as an unknown
  with these K equations has the same solutions and an exact, cheap Jacobian);
* SGD (eqs. 25-31, 33, appendix .1): u is the latent vector used for the *first* recorded
  epoch (V, P); the next epoch (V', P') updates it once, ``u2 = u - eta grad_u(u; V', P')``
  with ``grad_u = -2 V'_S^T (c * (r - V'_S u)) - 2 alpha P'^T (x - P' u) + 2 lam u``
  (eqs. 9-10), and the K equations are the epoch-2 upload of one random item i*::

      -2 c_i* (r_i* - v'_i* . u2) u2 = grad_V'[i*, :]                                      (K)

  (the paper fixes a random item the same way; its elimination of r, x through the epoch-1
  equations gives the same solutions).

InclUnc (and PrivMVMF's weighted sampling): the client weighs unrated items by w with r = 0, so
c jumps from w to 1 between r = 0 and r = 1. The paper smooths it (eq. 42, lost in
extraction); here ``c(r) = 1 - (1 - w) exp(-(smooth r)^2)`` (param ``smooth``, default 3: c(0)
= w exactly, c(1) = 1 - 1e-4 (1 - w)). We use this symmetric bump rather than a sigmoid in r: with
a sigmoid every rated item with r_i < v_i.u also has a spurious root far below 0 (weight w),
which clipping turns into "unrated"; the bump leaves only the |r| < 0.5 window to weight w.

Formulations (param ``formulation``): ``full`` is the system above (m + p + K unknowns under
InclUnc). ``reduced`` (InclUnc/sampling only) eliminates r item by item: given u, the exact-weight
item equation has a low root s_i + e_i / w (taken when |.| < 0.5, i.e. unrated) and a high root
s_i + e_i; the remaining unknowns are (x, u), p + K of them, with the same roots -- the paper
eliminates unknowns the same way for SGD (eqs. 31-35). ``auto`` uses ``reduced`` when a victim
uploads more than 200 weighted items (dense solvers on ~1700 unknowns per MovieLens user are
too slow), else ``full``.

Model check: each solution is re-simulated on *all* K coordinates of the uploads (both epochs
for SGD); its relative misfit decides between roots. Noise-free, if no solve reproduces the
uploads (misfit <= 1e-6) up to ``retries`` more (k, i*) are tried; solutions with more than twice
the best misfit (another branch of the system) are dropped before averaging.

Equation scaling: the gradient blocks are divided by the RMS of the observed column(s) they
match (a constant; the solutions are unchanged) so that all solvers see residuals of order 1.

Initial guess (documented, no use of the closed-form attack): ratings at the rating midpoint
(ObsOnly) or 0 (InclUnc/sampling: most uploaded items are unrated, r = 0), attributes 0.5, and
u from the client's own update rule at those ratings (ridge solution of the local loss with
every uploaded item at the rating midpoint and attributes 0.5) -- the "average user".

Noise (any ``laplace``/``gaussian``/``dp-gaussian`` defense listed in the public config): the
system is solved ``solves`` times for different k (drawn without replacement) and, for SGD,
random items i*; each solution is clipped to the value domains, the clipped solutions are
averaged and rounded (PrivMVMF paper §6.2 "Robustness Check": SemiALS "for each k", so the default
is K solves; SGD "from a randomly chosen set of items" of unstated size, default also K, each with
its own k; noise-free 1); more solves recover more under noise (docs/reproduction.md). A solve
that raises, returns non-finite values or ends with a larger residual than its start is counted in
``meta["failed_solves"]`` and replaced by the clipped initial guess; a victim is never dropped.

SemiALS ObsOnly (c = 1): eliminating r and x leaves K equations ``a / (2 u_k) + lam u = 0`` with a
known vector a, so ``u_k^2 = -a_k / (2 lam)`` (:meth:`UserSystem.exact_root`) and hybr's root is
computed in closed form. A system with ``a_k > 0`` has no real root (only under noise; 27-51 % of
the systems on the noisy runs of the ML-100K audit); its estimate is the least-squares point of
the reduced system, ``|u_k| = sqrt(a_k / (2 lam))``, ``u_j = -a_j / (2 lam u_k)`` for j != k
(:meth:`UserSystem.least_squares_point`; param ``no_root="hybr"``: iterate hybr on the full
system instead, as before). hybr stops unconverged there, near u_k = 0 with a misfit far above
the roots', so the model check dropped those solves whenever a root existed. The least-squares
point fits about as well as a root, but averaged with the roots it lowered rating accuracy on
the noisy ML-100K audit runs (docs/scale.md), so it stands in the same place as hybr's stop did:
a victim's least-squares points are averaged only when none of its systems has a real root
(counted in ``meta["unconverged_solves"]``).

Departures: the least-squares point of the reduced system for SemiALS ObsOnly systems without a
real root (the paper does not say what its solver returns there), the equation scaling, the preconditioning of the Jacobian-free methods (param
``precondition``: solve ``J(z0)^-1 F(z) = 0``, same roots), the reduced formulation and the
model check are ours. SGD requires the client to upload the same item set in the two epochs used (true
for ObsOnly and InclUnc; not for re-drawn sampling, which PrivMVMF only pairs with SemiALS).
The smoothing function is ours (eq. 42 was lost). The sign: (r, x, u) -> (-r, -x, -u) maps roots
to roots when c is constant; a solution with negative mean rating is replaced by its mirror. Victims are attacked in parallel with joblib
(param ``jobs``), in chunks; per-victim seeds are drawn up front so results do not depend on
``jobs``.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from privaudit.attacks.base import Reconstruction
from privaudit.attacks.mvmf import _core
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.transcript import View

METHODS = ("hybr", "broyden2", "linearmixing", "anderson", "df-sane")
NOISE_DEFENSES = ("laplace", "gaussian", "dp-gaussian", "dp-laplace")

#: Per-scenario default solver, (update, unrated) -> method: the best of the five by rating +
#: attribute accuracy (ties: fewer failed/unconverged solves) on a 40-user ML-100K sample, current
#: FedMVMF defaults, noise-free (benchmarks/mvmf_solver_selection.py; the accuracies are in
#: docs/reproduction.md, "mvmf-nonlinear").
DEFAULT_METHOD = {
    ("semials", "obsonly"): "hybr",
    ("semials", "inclunc"): "hybr",
    ("sgd", "obsonly"): "hybr",
    ("sgd", "inclunc"): "hybr",
}


def scenario(config: dict[str, Any]) -> tuple[str, str]:
    """(update, unrated) of a FedMVMF config, e.g. ``("semials", "obsonly")``."""
    return str(config.get("update", "semials")).lower(), str(config.get("unrated", "obsonly")).lower()


def is_noisy(config: dict[str, Any]) -> bool:
    """Whether the public config lists an active noise defense (Kerckhoffs: defenses are public)."""
    for d in config.get("defenses", []) or []:
        if not isinstance(d, dict) or d.get("name") not in NOISE_DEFENSES:
            continue
        strength = [v for k, v in d.items() if k in ("scale", "sigma", "noise_multiplier", "std", "b")]
        if not strength or any(isinstance(v, (int, float)) and v > 0 for v in strength):
            return True
    return False


def weighted_unrated(config: dict[str, Any]) -> bool:
    """True when uploads include unrated items weighted by w (InclUnc or weighted sampling)."""
    if scenario(config)[1] == "inclunc":
        return True
    return any(isinstance(d, dict) and d.get("name") == "sampling" for d in config.get("defenses", []) or [])


@dataclass
class Victim:
    """One victim's uploads used by the attack.

    Attributes
    ----------
    party : str
    items : numpy.ndarray   int64 (n,), item ids of the first epoch used
    g1 : numpy.ndarray      (n x K) grad_V of that epoch
    h1 : numpy.ndarray      (p x K) grad_P of that epoch
    g2 : numpy.ndarray|None (n x K) grad_V of the next epoch (SGD), rows in ``items`` order
    """

    party: str
    items: np.ndarray
    g1: np.ndarray
    h1: np.ndarray
    g2: np.ndarray | None = None


@dataclass
class Setting:
    """Everything shared by the victims of one attack run (public knowledge of the server).

    ``V1, P1``: state of the first epoch used (m x K, p x K); ``V2, P2``: of the next epoch (SGD).
    """

    V1: np.ndarray
    P1: np.ndarray
    V2: np.ndarray | None
    P2: np.ndarray | None
    update: str
    weighted: bool
    alpha: float
    lam: float
    w: float
    eta: float
    lo: float
    hi: float
    smooth: float
    method: str
    solves: int
    maxiter: int
    tol: float
    noisy: bool = False
    retries: int = 2
    precondition: bool = True
    reduced: bool = False
    no_root: str = "least-squares"


class UserSystem:
    """The square system of one victim for latent coordinate ``k`` (and SGD item ``istar``).

    ``fun(z)`` returns the residual vector (n + p + K), ``jac(z)`` its exact Jacobian.
    """

    def __init__(self, st: Setting, victim: Victim, k: int, istar: int = 0):
        self.st = st
        self.k = int(k)
        self.items = victim.items
        self.Vs = st.V1[victim.items]
        self.P = st.P1
        self.g = victim.g1[:, k]
        self.h = victim.h1[:, k]
        self.n, self.p, self.K = len(victim.items), st.P1.shape[0], st.P1.shape[1]
        col = np.concatenate([self.g, self.h])
        self.sigma = float(np.sqrt(np.mean(col**2))) or 1.0
        self.sgd = st.update == "sgd"
        if self.sgd:
            self.V2s = st.V2[victim.items]
            self.P2 = st.P2
            self.istar = int(istar)
            self.g2 = victim.g2[istar]
            self.sigma2 = float(np.sqrt(np.mean(victim.g2**2))) or 1.0

    # c(r) and its derivative: 1 for ObsOnly, the smoothed step for InclUnc/sampling
    def weights(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        st = self.st
        if not st.weighted:
            return np.ones_like(r), np.zeros_like(r)
        bump = np.exp(-((st.smooth * r) ** 2))
        return 1.0 - (1.0 - st.w) * bump, (1.0 - st.w) * 2.0 * st.smooth**2 * r * bump

    def split(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, p = self.n, self.p
        return z[:n], z[n : n + p], z[n + p :]

    def initial_guess(self) -> np.ndarray:
        st = self.st
        mid = 0.5 * (float(st.lo if not st.weighted else 1.0) + st.hi)
        r0 = np.full(self.n, 0.0 if st.weighted else mid)
        x0 = np.full(self.p, 0.5)
        A = self.Vs.T @ self.Vs + st.alpha * self.P.T @ self.P + st.lam * np.eye(self.K)
        b = self.Vs.T @ np.full(self.n, mid) + st.alpha * self.P.T @ x0
        u0 = np.linalg.solve(A, b)
        return np.concatenate([r0, x0, u0])

    def reduced_update(self) -> np.ndarray | None:
        """``a = Vs^T g + P^T h`` (K,) of a SemiALS ObsOnly system, None in the other scenarios.

        With c = 1 the item and attribute equations give ``r = Vs u - g / (2 u_k)`` and
        ``x = P u - h / (2 alpha u_k)``; the update equations then read ``a / (2 u_k) + lam u = 0``.
        """
        st = self.st
        if st.weighted or self.sgd or not st.alpha > 0:
            return None
        return self.Vs.T @ self.g + self.P.T @ self.h

    def exact_root(self) -> np.ndarray | None:
        """The root of a SemiALS ObsOnly system in closed form; None in the other scenarios or
        when it has no real root.

        The reduced system ``a / (2 u_k) + lam u = 0`` (:meth:`reduced_update`) gives
        ``u_k^2 = -a_k / (2 lam)`` (real iff ``a_k < 0``) and ``u = -a / (2 lam u_k)``. Of the
        mirror pair ``+-z`` the one with a non-negative rating sum, as :func:`solve_system` keeps.
        """
        a = self.reduced_update()
        if a is None or not a[self.k] < 0:
            return None
        uk = float(np.sqrt(-a[self.k] / (2.0 * self.st.lam)))
        return self._from_u(-a / (2.0 * self.st.lam * uk), uk)

    def least_squares_point(self) -> np.ndarray | None:
        """The least-squares point of the reduced SemiALS ObsOnly system when it has no real root
        (``a_k > 0``); None otherwise (a root exists, another scenario, or ``a_k = 0``).

        Component k's residual ``a_k / (2 u_k) + lam u_k`` is at least ``sqrt(2 lam a_k)`` in
        absolute value, attained at ``|u_k| = sqrt(a_k / (2 lam))``; every other component is then
        solved exactly by ``u_j = -a_j / (2 lam u_k)``. r and x follow from their (exact) equations;
        of the mirror pair the one with a non-negative rating sum.
        """
        a = self.reduced_update()
        if a is None or not a[self.k] > 0 or not self.st.lam > 0:
            return None
        uk = float(np.sqrt(a[self.k] / (2.0 * self.st.lam)))
        u = -a / (2.0 * self.st.lam * uk)
        u[self.k] = uk
        return self._from_u(u, uk)

    def _from_u(self, u: np.ndarray, uk: float) -> np.ndarray | None:
        """``z = [r, x, u]`` with r and x from the item and attribute equations at u (c = 1,
        ``uk = u[k]``); the mirror with a non-negative rating sum; None if not finite."""
        st = self.st
        r = self.Vs @ u - self.g / (2.0 * uk)
        x = self.P @ u - self.h / (2.0 * st.alpha * uk)
        z = np.concatenate([r, x, u])
        if not np.all(np.isfinite(z)):
            return None
        return -z if np.sum(r) < 0 else z

    def _u2(self, r, x, u, c):
        st = self.st
        s2 = self.V2s @ u
        G = -2 * self.V2s.T @ (c * (r - s2)) - 2 * st.alpha * self.P2.T @ (x - self.P2 @ u) + 2 * st.lam * u
        return u - st.eta * G

    def misfit(self, z: np.ndarray, victim: Victim) -> float:
        """RMS of (all uploads simulated from z) - (observed uploads), over every coordinate.

        Relative to the RMS of the observations. A root of the one-coordinate system that is
        not the client's data (another branch) shows up here.
        """
        st = self.st
        r, x, u = UserSystem.split(self, z)
        c, _ = self.weights(r)
        sim = [(-2.0 * c * (r - self.Vs @ u))[:, None] * u, (-2.0 * st.alpha * (x - self.P @ u))[:, None] * u]
        obs = [victim.g1, victim.h1]
        if self.sgd:
            u2 = self._u2(r, x, u, c)
            sim.append((-2.0 * c * (r - self.V2s @ u2))[:, None] * u2)
            obs.append(victim.g2)
        num = sum(float(np.sum((a - b) ** 2)) for a, b in zip(sim, obs))
        den = sum(float(np.sum(b**2)) for b in obs) or 1.0
        return float(np.sqrt(num / den)) if np.isfinite(num) else float("inf")

    def _attr_and_update(self, r, x, u, c, s=None) -> tuple[np.ndarray, np.ndarray]:
        """Residuals of the attribute uploads (p) and of the user update (K): SemiALS its
        stationarity condition, SGD the second round's upload of item ``istar``. ``s = Vs u``
        when the caller has it already."""
        st = self.st
        f_attr = (-2.0 * st.alpha * (x - self.P @ u) * u[self.k] - self.h) / self.sigma
        if not self.sgd:
            s = self.Vs @ u if s is None else s
            f_u = self.Vs.T @ (c * (s - r)) + st.alpha * self.P.T @ (self.P @ u - x) + st.lam * u
        else:
            u2 = self._u2(r, x, u, c)
            i = self.istar
            q = c[i] * (r[i] - self.V2s[i] @ u2)
            f_u = (-2.0 * q * u2 - self.g2) / self.sigma2
        return f_attr, f_u

    def fun(self, z: np.ndarray) -> np.ndarray:
        r, x, u = self.split(z)
        c, _ = self.weights(r)
        s = self.Vs @ u
        f_items = (-2.0 * c * (r - s) * u[self.k] - self.g) / self.sigma
        return np.concatenate([f_items, *self._attr_and_update(r, x, u, c, s)])

    def jac(self, z: np.ndarray) -> np.ndarray:
        st, k, n, p, K = self.st, self.k, self.n, self.p, self.K
        r, x, u = self.split(z)
        c, dc = self.weights(r)
        s = self.Vs @ u
        e = c * (r - s)
        ax = x - self.P @ u
        N = n + p + K
        J = np.zeros((N, N))
        iu = slice(n + p, N)
        idx_r = np.arange(n)
        J[idx_r, idx_r] = -2.0 * u[k] * (c + dc * (r - s)) / self.sigma
        J[:n, iu] = (2.0 * (c * u[k]) / self.sigma)[:, None] * self.Vs
        J[:n, n + p + k] += -2.0 * e / self.sigma
        idx_x = np.arange(n, n + p)
        J[idx_x, idx_x] = -2.0 * st.alpha * u[k] / self.sigma
        J[n : n + p, iu] = (2.0 * st.alpha * u[k] / self.sigma) * self.P
        J[n : n + p, n + p + k] += -2.0 * st.alpha * ax / self.sigma
        if not self.sgd:
            J[n + p :, :n] = self.Vs.T * (dc * (s - r) - c)[None, :]
            J[n + p :, n : n + p] = -st.alpha * self.P.T
            J[n + p :, iu] = (self.Vs.T * c) @ self.Vs + st.alpha * self.P.T @ self.P + st.lam * np.eye(K)
            return J
        s2 = self.V2s @ u
        dG = np.empty((K, N))
        dG[:, :n] = -2.0 * self.V2s.T * (c + dc * (r - s2))[None, :]
        dG[:, n : n + p] = -2.0 * st.alpha * self.P2.T
        dG[:, iu] = 2.0 * (self.V2s.T * c) @ self.V2s + 2.0 * st.alpha * self.P2.T @ self.P2 + 2.0 * st.lam * np.eye(K)
        du2 = -st.eta * dG
        du2[:, iu] += np.eye(K)
        u2 = self._u2(r, x, u, c)
        i = self.istar
        v2 = self.V2s[i]
        resid = r[i] - v2 @ u2
        q = c[i] * resid
        dq = -c[i] * (v2 @ du2)
        dq[i] += dc[i] * resid + c[i]
        J[n + p :, :] = (-2.0 / self.sigma2) * (np.outer(u2, dq) + q * du2)
        return J


class ReducedSystem(UserSystem):
    """InclUnc/sampling system with the rating block eliminated item by item (size p + K).

    Given u, each item equation ``c(r_i) (r_i - s_i) = e_i`` (``e_i = -grad_V[i, k] / (2 u_k)``)
    has, with the exact weight (w below rating 1, 1 above), a low root ``s_i + e_i / w`` (valid
    when it rounds to 0, i.e. |.| < 0.5) and a high root ``s_i + e_i``; the low root is taken
    when valid (the unrated start r = 0 of the full system), else the high one. The unknowns
    are then ``z = [x (p), u (K)]`` with the attribute and user-update equations of
    :class:`UserSystem` (the paper eliminates unknowns the same way for SGD, eqs. 31-35). Same
    roots as the full system, but p + K unknowns instead of m + p + K, which makes the dense
    solvers usable for InclUnc on MovieLens (m ~ 1600). Jacobian: finite differences.
    """

    jac = None  # type: ignore[assignment]

    def ratings(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        st = self.st
        s = self.Vs @ u
        uk = u[self.k] if abs(u[self.k]) > 1e-300 else 1e-300
        e = -self.g / (2.0 * uk)
        low = s + e / max(st.w, 1e-12)
        use_low = np.abs(low) < 0.5
        r = np.where(use_low, 0.0, s + e)
        c = np.where(use_low, st.w, 1.0)
        return r, c

    def split(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x, u = z[: self.p], z[self.p :]
        return self.ratings(u)[0], x, u

    def full(self, z: np.ndarray) -> np.ndarray:
        r, x, u = self.split(z)
        return np.concatenate([r, x, u])

    def initial_guess(self) -> np.ndarray:
        return super().initial_guess()[self.n :]

    def weights(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = np.where(np.abs(r) < 0.5, self.st.w, 1.0)
        return c, np.zeros_like(r)

    def fun(self, z: np.ndarray) -> np.ndarray:
        x, u = z[: self.p], z[self.p :]
        r, c = self.ratings(u)
        return np.concatenate(self._attr_and_update(r, x, u, c))

    def misfit(self, z: np.ndarray, victim: Victim) -> float:
        return super().misfit(self.full(z), victim)

    def numeric_jac(self, z: np.ndarray) -> np.ndarray:
        f0 = self.fun(z)
        J = np.empty((len(f0), len(z)))
        for j in range(len(z)):
            h = 1e-7 * max(1.0, abs(z[j]))
            dz = z.copy()
            dz[j] += h
            J[:, j] = (self.fun(dz) - f0) / h
        return J


def _root_options(method: str, maxiter: int, tol: float) -> dict[str, Any]:
    if method == "hybr":
        return {"maxfev": maxiter * 10, "xtol": 1e-10}
    if method == "df-sane":
        return {"maxfev": maxiter * 10, "fatol": tol, "fnorm": lambda f: float(np.sqrt(np.mean(f * f)))}
    return {"maxiter": maxiter, "fatol": tol}


def solve_system(
    system: UserSystem,
    method: str,
    maxiter: int = 200,
    tol: float = 1e-8,
    precondition: bool = True,
    no_root: str = "least-squares",
) -> tuple[np.ndarray, bool, bool]:
    """Solve one user system from its initial guess with ``scipy.optimize.root``.

    ``hybr`` gets the exact Jacobian. The Jacobian-free methods (``broyden2``, ``linearmixing``,
    ``anderson``, ``df-sane``) start from a scalar Jacobian guess, which does not fit this
    system (its diagonal carries the unknown sign of u_k); with ``precondition`` they solve
    the equivalent system ``J(z0)^-1 F(z) = 0`` (same roots; Jacobian I at the start).

    ``hybr`` on a SemiALS ObsOnly system with a real root returns that root
    (:meth:`UserSystem.exact_root`) without iterating: hybr converges to it (or its mirror).
    Without a real root (``a_k > 0``), ``no_root="least-squares"`` returns the least-squares
    point of the reduced system (:meth:`UserSystem.least_squares_point`, counted as not
    converged); ``no_root="hybr"`` iterates hybr on the full system, where it stops unconverged.

    Returns ``(z, ok, converged)``: ``ok`` is False when the solver failed outright (exception,
    non-finite result, residual above the start) and ``z`` is then the initial guess.
    """
    from scipy.linalg import lu_factor, lu_solve
    from scipy.optimize import root

    exact = system.exact_root() if method == "hybr" else None
    if exact is not None:
        return exact, True, True
    closest = system.least_squares_point() if method == "hybr" and no_root == "least-squares" else None
    if closest is not None:
        return closest, True, False
    z0 = system.initial_guess()
    f0 = float(np.linalg.norm(system.fun(z0)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with np.errstate(all="ignore"):
                if method == "hybr":
                    res = root(
                        system.fun, z0, jac=system.jac, method="hybr", options=_root_options(method, maxiter, tol)
                    )
                else:
                    options = _root_options(method, maxiter, tol)
                    if precondition:
                        J0 = system.jac(z0) if system.jac is not None else system.numeric_jac(z0)
                        lu = lu_factor(J0, check_finite=True)

                        def fun(z, _lu=lu):
                            return lu_solve(_lu, system.fun(z), check_finite=False)
                    else:
                        fun = system.fun

                        if method != "df-sane":
                            options["jac_options"] = {"alpha": 1.0}
                    res = root(fun, z0, method=method, options=options)
        z = np.asarray(res.x, dtype=np.float64)
        if not np.all(np.isfinite(z)):
            return z0, False, False
        f = float(np.linalg.norm(system.fun(z)))
        if not np.isfinite(f) or f > f0:
            return z0, False, False
        if np.sum(system.split(z)[0]) < 0:
            # the system is odd in (r, x, u) when c is constant: (-r, -x, -u) solves it too, and
            # ratings are positive; take the mirrored solution when it fits as well
            f_neg = float(np.linalg.norm(system.fun(-z)))
            if f_neg <= max(1.01 * f, tol):
                z, f = -z, f_neg
        converged = bool(res.success) or f <= tol * max(1.0, np.sqrt(len(z)))
        return z, True, converged
    except (ValueError, ArithmeticError, np.linalg.LinAlgError, RuntimeError):
        return z0, False, False


#: relative misfit of the full uploads below which a solution is taken as exact (noise-free)
EXACT_FIT = 1e-6


def attack_victim(st: Setting, victim: Victim, seed: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Reconstruct one victim (PrivMVMF paper §6.2): solve, clip, keep the solutions that fit, average.

    ``st.solves`` systems (random coordinate k, SGD: random item i*) are solved; noise-free,
    up to ``st.retries`` more are tried while none reproduces all uploads (relative misfit
    <= EXACT_FIT). Solutions whose misfit on *all* uploads exceeds twice the best one (another
    branch of the system) are dropped; the rest are clipped and averaged. Least-squares points of
    systems without a real root are averaged only when no system of the victim has a root.

    Returns ``(ratings, attributes, failed, unconverged)`` (clipped averages, not yet rounded).
    """
    rng = np.random.default_rng(seed)
    K = st.P1.shape[1]
    coords = rng.permutation(K)  # coordinates without replacement (SemiALS under noise: each k once)
    n = len(victim.items)
    sols: list[tuple[float, np.ndarray, np.ndarray]] = []
    failed = unconverged = 0
    attempts = 0
    lsq = st.method == "hybr" and st.no_root == "least-squares"
    while attempts < st.solves or (
        not st.noisy and attempts < st.solves + st.retries and min(s[0] for s in sols) > EXACT_FIT
    ):
        k = int(coords[attempts % K])
        attempts += 1
        istar = int(rng.integers(n)) if n else 0
        system = (ReducedSystem if st.reduced else UserSystem)(st, victim, k, istar)
        z, ok, conv = solve_system(system, st.method, st.maxiter, st.tol, st.precondition, st.no_root)
        failed += not ok
        unconverged += ok and not conv
        r, x, _ = system.split(z)
        fit = system.misfit(z, victim) if ok else float("inf")
        # a least-squares point (SemiALS ObsOnly without a real root) is a fallback, not a root
        fallback = lsq and ok and not conv and system.reduced_update() is not None
        sols.append((fit, np.clip(r, st.lo, st.hi), np.clip(x, 0.0, 1.0), fallback))
    if not all(s[3] for s in sols):
        sols = [s for s in sols if not s[3]]  # least-squares points only when no system has a root
    best = min(s[0] for s in sols)
    keep = [s for s in sols if s[0] <= max(2.0 * best, EXACT_FIT)] if np.isfinite(best) else sols
    r = np.mean([s[1] for s in keep], axis=0)
    x = np.mean([s[2] for s in keep], axis=0)
    return r, x, failed, unconverged


def _attack_chunk(
    st: Setting, victims: list[Victim], seeds: list[int]
) -> list[tuple[np.ndarray, np.ndarray, int, int]]:
    return [attack_victim(st, v, s) for v, s in zip(victims, seeds)]


def _victims(fv: Any, r1: int, r2: int | None) -> tuple[list[Victim], int]:
    """The clients with uploads in round ``r1`` (and, SGD, the same items in ``r2``), in client
    order, and the number skipped."""
    victims: list[Victim] = []
    skipped = 0
    for party in sorted(fv.clients, key=_core.client_sort_key):
        up = fv.clients[party]
        if r1 not in up.rounds:
            skipped += 1
            continue
        a = up.rounds.index(r1)
        v = Victim(party, up.items[a], up.grad_V[a], up.grad_P[a])
        if r2 is not None:
            if r2 not in up.rounds:
                skipped += 1
                continue
            b = up.rounds.index(r2)
            order = np.argsort(up.items[b])
            pos = np.searchsorted(up.items[b][order], v.items)
            pos = np.minimum(pos, len(order) - 1)
            if len(up.items[b]) != len(v.items) or not np.array_equal(up.items[b][order][pos], v.items):
                skipped += 1
                continue
            v.g2 = up.grad_V[b][order][pos]
        if len(v.items) == 0:
            skipped += 1
            continue
        victims.append(v)
    return victims, skipped


def _solve_victims(
    st: Setting, victims: list[Victim], seeds: list[int], jobs: int, chunk: int
) -> list[tuple[np.ndarray, np.ndarray, int, int]]:
    """:func:`attack_victim` of every victim, in chunks of ``chunk`` over ``jobs`` joblib workers."""
    batches = [(victims[i : i + chunk], seeds[i : i + chunk]) for i in range(0, len(victims), chunk)]
    if jobs == 1 or len(batches) <= 1:
        outs = [_attack_chunk(st, vs, ss) for vs, ss in batches]
    else:
        from joblib import Parallel, delayed

        outs = Parallel(n_jobs=jobs)(delayed(_attack_chunk)(st, vs, ss) for vs, ss in batches)
    return [o for out in outs for o in out]


@register_attack("mvmf-nonlinear")
class MVMFNonlinear(_core.MVMFAttack):
    """The paper's nonlinear-system reconstruction attack (PrivMVMF paper §4, §6.2)."""

    description = "FedMVMF server attack: per user, solve the square nonlinear system of its uploads (scipy root)"
    requires = ("grad_V", "grad_P", "state")
    #: ``privaudit audit`` attacks a random sample of 60 victims per run: with K solves per
    #: victim under noise this attack is ~90 % of an audit's time otherwise.
    audit_params = {"users": 60}
    parameters = (
        Param(
            "method",
            "auto",
            "scipy.optimize.root method: hybr, broyden2, linearmixing, anderson, df-sane, or auto "
            "(the per-scenario best of the selection run)",
            choices=("auto",) + METHODS,
        ),
        Param(
            "solves",
            0,
            "solves per victim (coordinates k drawn without replacement / SGD item) averaged after "
            "clipping; 0 = 1 noise-free; under noise K (SemiALS: every coordinate once; SGD: K random (k, item) pairs)",
            ge=0,
        ),
        Param("users", None, "attack at most this many victims (random sample; None = all)", type=int, ge=1),
        Param("jobs", 1, "parallel joblib workers across victims (-1 = all cores)"),
        Param("smooth", 3.0, "steepness of the smoothed InclUnc weight c(r) = 1 - (1-w) exp(-(smooth r)^2)", gt=0),
        Param("maxiter", 200, "iteration budget of the solver (hybr/df-sane: 10x function evaluations)", ge=1),
        Param("tol", 1e-9, "residual tolerance of the solver"),
        Param("retries", 2, "noise-free: extra solves (new k / item) while no solution reproduces all uploads", ge=0),
        Param("precondition", True, "Jacobian-free methods solve J(z0)^-1 F(z) = 0 (same roots) instead of F(z) = 0"),
        Param(
            "formulation",
            "auto",
            "full (unknowns r, x, u; smoothed c(r)) or reduced (InclUnc/sampling: r eliminated "
            "item by item, unknowns x, u); auto = reduced when a victim uploads more than 200 items with weights",
            choices=("auto", "full", "reduced"),
        ),
        Param("chunk", 16, "victims per joblib task", ge=1),
        Param(
            "no_root",
            "least-squares",
            "SemiALS ObsOnly with hybr, a system without a real root (under noise): least-squares = "
            "the least-squares point of the reduced system in closed form; hybr = iterate hybr on the full system",
            choices=("least-squares", "hybr"),
        ),
    )

    def applicable(self, view: View) -> tuple[bool, str]:
        ok, reason = super().applicable(view)
        if not ok:
            return ok, reason
        missing = _core.missing_config(view)
        if missing:
            return False, f"the public config lacks {', '.join(missing)}"
        update, unrated = scenario(view.config)
        if update not in ("semials", "sgd") or unrated not in ("obsonly", "inclunc"):
            return False, f"unknown FedMVMF scenario update={update!r}, unrated={unrated!r}"
        return True, ""

    def resolved_method(self, config: dict[str, Any]) -> str:
        method = self.config["method"]
        return DEFAULT_METHOD.get(scenario(config), "hybr") if method == "auto" else method

    def _setting(self, fv: Any, r1: int, r2: int | None, update: str, noisy: bool, method: str, solves: int) -> Setting:
        """The public knowledge of rounds ``r1`` (and ``r2``, SGD) and this attack's solver settings."""
        cfg = fv.config
        lo, hi = _core.rating_domain(cfg)
        return Setting(
            V1=fv.V[r1],
            P1=fv.P[r1],
            V2=fv.V.get(r2) if r2 is not None else None,
            P2=fv.P.get(r2) if r2 is not None else None,
            update=update,
            weighted=weighted_unrated(cfg),
            alpha=float(cfg["alpha"]),
            lam=float(cfg["lam"]),
            w=float(cfg.get("w", 0.0) or 0.0),
            eta=float(cfg.get("eta", 0.0) or 0.0),
            lo=lo,
            hi=hi,
            smooth=float(self.config["smooth"]),
            method=method,
            solves=solves,
            maxiter=int(self.config["maxiter"]),
            tol=float(self.config["tol"]),
            noisy=noisy,
            retries=int(self.config["retries"]),
            precondition=bool(self.config["precondition"]),
            no_root=str(self.config["no_root"]),
        )

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        t0 = time.perf_counter()
        fv = _core.parse_view(view)
        cfg = fv.config
        update, unrated = scenario(cfg)
        rounds = fv.rounds
        if not rounds:
            return self.unsupported("the server's view holds no round with both state and uploads")
        r1 = rounds[0]
        r2 = next((r for r in rounds if r > r1), None)
        if update == "sgd" and r2 is None:
            return self.unsupported("the SGD attack needs two recorded epochs (state and uploads of both)")
        noisy = is_noisy(cfg)
        method = self.resolved_method(cfg)
        # PrivMVMF paper §6.2 Robustness Check: SemiALS "for each k" (all K coordinates), SGD "a
        # randomly chosen set of items" (size not given; K here too); noise-free one solve (plus
        # model-check retries)
        solves = self.config["solves"] or (fv.P[r1].shape[1] if noisy else 1)
        st = self._setting(fv, r1, r2, update, noisy, method, int(solves))
        victims, skipped = _victims(fv, r1, r2 if update == "sgd" else None)
        form = self.config["formulation"]
        if form == "auto":
            form = "reduced" if st.weighted and victims and max(len(v.items) for v in victims) > 200 else "full"
        st.reduced = form == "reduced" and st.weighted
        available = len(victims)
        users = self.config["users"]
        if users is not None and users < len(victims):
            pick = np.sort(rng.choice(len(victims), size=users, replace=False))
            victims = [victims[i] for i in pick]
        seeds = [int(s) for s in rng.integers(0, 2**63 - 1, size=len(victims))]
        outs = _solve_victims(st, victims, seeds, int(self.config["jobs"]), int(self.config["chunk"]))
        recon: dict[str, dict[str, np.ndarray]] = {}
        for v, (r, x, _, _) in zip(victims, outs):
            recon[v.party] = {
                "items": v.items.copy(),
                "ratings": _core.round_ratings(r, cfg),
                "attributes": _core.round_attributes(x),
            }
        meta = {
            "method": method,
            "formulation": "reduced" if st.reduced else "full",
            "scenario": f"{update}/{unrated}",
            "rounds": [r1] + ([r2] if update == "sgd" else []),
            "solves_per_victim": int(solves),
            "noisy": bool(noisy),
            "victims": len(recon),
            "victims_available": available,
            "skipped_clients": skipped,
            "failed_solves": int(sum(o[2] for o in outs)),
            "unconverged_solves": int(sum(o[3] for o in outs)),
            "smooth": float(self.config["smooth"]) if st.weighted else None,
            "seconds": time.perf_counter() - t0,
        }
        return Reconstruction(self.name, self.party, recon, meta=meta)

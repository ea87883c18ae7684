r"""``mvmf-analytic``: closed-form server reconstruction attack on FedMVMF (DESIGN.md "Attacks").

The paper (privmvmf.txt §4, §6.2) solves one nonlinear system per user with iterative root
finders (``mvmf-nonlinear``). This attack needs no root finding: every FedMVMF upload row is a
scalar multiple of the user's latent vector, and the user's own update rule pins the scalar
down in closed form. It is exact without noise, a least-squares / empirical-Bayes estimator
under noise, and batched over users (concatenated rows with segment sums, batched K x K
eigen-problems; no per-user solver loop).

Notation (one user, one round t, items S it uploaded)
----------------------------------------------------
``grad_V[i] = g_i u`` with ``g_i = -2 c_i (r_i - u.v_i)`` and ``grad_P[j] = h_j u`` with
``h_j = -2 alpha (x_j - P_j.u)`` (DESIGN.md FedMVMF, eqs. 5 and 7 of the paper). So the stacked
rows ``[grad_V; grad_P]`` ((|S| + p) x K) have rank one: ``u = t d`` with ``d`` the top right
singular vector (top eigenvector of the K x K Gram matrix; unit norm, sign arbitrary) and an
unknown scalar ``t``. Write ``a_i = grad_V[i].d = t g_i``, ``b_j = grad_P[j].d = t h_j``,
``dv_i = d.v_i``, ``pd_j = P_j.d``. Solving the two upload formulas for the private data::

    r_i = t dv_i - a_i / (2 t c_i)           x_j = t pd_j - b_j / (2 alpha t)        (1)

so everything reduces to the scalar ``t`` (and, where c_i is unknown, to c_i in {1, w}).
Flipping the sign of t flips every r_i and x_j, so the sign is the one that makes the ratings
(and attribute dummies) positive.

SemiALS (ObsOnly and InclUnc)
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
u is the minimiser of the client's loss, so its gradient vanishes::

    sum_{i in S} g_i v_i + P^T h + 2 lam u = 0.

(S is exactly the set of items in the client's loss: its rated items for ObsOnly, all items for
InclUnc, rated + sampled items under a ``sampling`` defense.) Multiplying by t and dotting with
d: ``t^2 = -d.(V_S^T a + P^T b) / (2 lam)`` -- the least-squares solution of the K-vector
equation ``V_S^T a + P^T b = -2 lam t^2 d``; it needs no c_i, so it holds for InclUnc too.

SGD, ObsOnly (two consecutive rounds)
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Round t uploads with u1 and (V, P); round t+1 with ``u2 = u1 - eta grad_u(u1; V', P')``.
The residuals under the new factors are known linear functions of u1:
``-2 c_i (r_i - u1.v'_i) = g_i + 2 c_i u1.(v'_i - v_i)`` and
``-2 alpha (x_j - P'_j u1) = h_j + 2 alpha (P'_j - P_j).u1``, so with u1 = t1 d1, u2 = t2 d2::

    u2 = t1 c1 + (1/t1) c2,
    c1 = d1 + 2 eta V'_S^T C (V_S - V'_S) d1 + 2 eta alpha P'^T (P - P') d1 - 2 eta lam d1
    c2 = -eta (V'_S^T a1 + P'^T b1)                                       (C = diag c_i)

i.e. ``t1 c1 + s c2 - t2 d2 = 0`` with s = 1/t1. Instead of the 3-vector null space of
``[c1, c2, -d2]`` (DESIGN.md) we use the equivalent constrained least-squares form: with
``e = (I - d2 d2^T) c`` (the components that t2 d2 cannot absorb), minimise
``||t1 e1 + e2 / t1||^2`` over tau = t1^2: ``tau = |e2| / |e1|`` (exact without noise, where
e2 = -tau e1; always positive, so noise never makes it fail), then ``t2 = d2.(t1 c1 + c2/t1)``.
Ratings and attributes follow from (1) with c_i = 1, in every round whose scale is known
(both rounds of a pair; interior rounds get two estimates of |t|, which are averaged).

InclUnc and sampled virtual items: which c_i? (both updates)
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
An unrated item (r_i = 0, c_i = w; likewise an item a ``sampling`` defense added, with its
weight and rating 0) has ``a_i = -2 w t (0 - t dv_i) = 2 w t^2 dv_i``: all unrated items share
the ratio ``a_i / dv_i = 2 w t^2``, which gives t^2 directly from one round (no second round,
no stationarity). A rated item would match only if ``r_i = (1 - w) t dv_i`` (probability 0).
Implementation: an initial t^2 (SemiALS: the stationarity formula; SGD: the densest cluster of
the ratios ``a_i / (2 w dv_i)``, a shortest-half style mode estimate that is exact when the
unrated items form the largest exact-tie cluster), then three rounds of (decide rated/unrated
per item, refit ``t^2 = sum_U a_i dv_i / (2 w sum_U dv_i^2)`` over the items decided unrated;
SemiALS: combined with the stationarity estimate by inverse variance). Decision per item, in
rating units: the rated hypothesis value ``rhat_i = t dv_i - a_i / (2 t)`` must lie on the
rating grid, the unrated hypothesis says ``rhat_i = z_i = (1 - w) t dv_i``.

SGD-InclUnc by the two-round route (derived "the same way", for the record): the equations
above hold with ``C = w I + (1 - w) diag(rated)`` in c1, so the pair needs the rated set first;
since the one-round unrated shortcut already fixes t (and the rated set) exactly, the
implementation uses the shortcut and does not need the pair for InclUnc.

Noise (Laplace/Gaussian defenses): the estimator
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
* d: rank-1 least-squares fit of the stacked rows (top eigenvector of the Gram matrix);
  ``a``, ``b``: least-squares coefficients of the rows on d.
* noise level: the rows' energy orthogonal to d is pure noise, so the per-coordinate noise
  variance is estimated as ``sum (trace G - lambda_max) / sum (rows (K - 1))`` pooled over users;
  then ``a_i`` has standard deviation sigma, ``rhat_i`` sigma / (2|t|), ``xhat_j``
  sigma / (2 alpha |t|).
* scale: least squares as above (stationarity, unrated regression, or the pair equation).
* every round of the view is used: per (user, item) the rounds' ``rhat`` are combined by inverse
  variance (weights ~ t^2), and the rated/unrated decision multiplies the rounds' likelihoods.
* decoding: maximum a posteriori on the grid. Hypotheses: each rating value on the grid
  (rating_min..rating_max, step rating_step) and -- for InclUnc / sampling -- "unrated" (0);
  Gaussian likelihoods with the variances above; the prior over hypotheses is fitted by EM on
  all victims' items (empirical Bayes). Attributes: per ``group=value`` block of
  ``attribute_names`` one-hot (or all-zero) decoding with a fitted prior per block (each
  column on its own if the names carry no group). Without noise the likelihoods are sharp and
  this is exactly "clip to the domain and round" (eq. 43); as the noise grows it degrades
  gracefully to the majority guess instead of falling below it. The result is passed through
  :func:`privaudit.attacks._mvmf.round_ratings` / ``round_attributes`` (clip and round).

Noise-adaptive use of rounds (the first-round shortcut)
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Extra rounds improve the estimate only where noise makes a decision uncertain. So the attack
first decodes round 1 alone (:func:`_shortcut_first_round`; SemiALS both cases, SGD with
unrated or sampled items -- SGD ObsOnly needs the pair of rounds for its scale): d from the
grad_P rows, ``a = grad_V.d`` in one batched product, t^2 from stationarity (SemiALS) or the
median unrated ratio (SGD), nearest hypothesis per item and attribute. If every value lies
within ``0.01`` rating step (absolute for attributes) of its hypothesis and every competing
hypothesis is ``>= 10`` times farther than the worst such residual, no further round can change
a decision and this is the result (``meta["shortcut"] = True``); otherwise (real noise) the full
estimator below runs on every round. Noise-free this is exact and gives the same reconstruction
as the full estimator (checked on ML-100K and synthetic transcripts, tests); a noisy view pays
only the declined first-round pass. Parameter ``shortcut=false`` always runs the full estimator.

Implementation notes: the view is parsed into concatenated per-round arrays
(:func:`privaudit.attacks._mvmf.parse_view_flat`; zero-copy when the uploads were recorded as
consecutive slices of one array; a round is concatenated only when first read); per-row quantities (``a``, ``dv``, ``rhat``) live in that
CSR-like layout (user after user) with segment sums (``bincount``/``reduceat``), and padded
(n, L) views are built only where a per-user sort or mask needs them (free for InclUnc, where
every client sends the same m' rows and the uploads are one (n, m', K) tensor). The rank-1 fit
is a batched power iteration on the K x K Gram matrices with an eigenvector error bound, falling
back to ``eigh`` where it does not converge (noise); for ObsOnly the direction is first taken
from the grad_P rows and checked against the full Gram matrix by one product with the
concatenated grad_V rows, so the padded Gram matrices are formed only for the users failing the
check. BLAS is limited to one thread inside the attack (the products are small; thread spinning
made the attack >10x slower on a busy machine). The weight of items added by a ``sampling``
defense is its public ``w`` if numeric, else the registered defense's own rule. Measured on
MovieLens 100K (docs/reproduction.md, "mvmf-analytic"): exact in all four scenarios for all
943 users, ~0.03-0.1 s CPU per scenario noise-free.

Departures from DESIGN.md: the SGD null space is solved in the constrained least-squares form
above (same solution without noise); SGD-InclUnc uses the one-round shortcut; decoding is MAP
with an empirical prior rather than plain rounding (identical without noise); when the first
recorded round decides every value (see "Noise-adaptive use of rounds") the other rounds are not
read, and then the direction d comes from the grad_P rows alone (the grad_V rows' components
orthogonal to d are not inspected: they change no decoded value).
Reads only the FedMVMF message kinds of DESIGN.md and the public config keys ``K``, ``alpha``,
``lam``, ``w``, ``eta``, ``update``, ``unrated``, ``rating_min``, ``rating_max``
(``rating_step``, ``attribute_names``, ``defenses`` if present).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from privaudit.attacks._mvmf import (
    FlatFedMVMFView,
    MVMFAttack,
    RoundUploads,
    missing_config,
    parse_view_flat,
    round_attributes,
    round_ratings,
)
from privaudit.attacks.base import Reconstruction
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.transcript import View

_CHUNK_ELEMENTS = 1 << 23  # padded (users x items x K) elements processed at once
_TINY = 1e-300
# shortcut acceptance: every first-round value within this many rating steps of its hypothesis,
# every competing hypothesis (InclUnc: rated vs unrated) this many times farther than the worst fit
_SHORTCUT_TOL = 0.01
_SHORTCUT_MARGIN = 10.0


# --------------------------------------------------------------------------------------
# per-round statistics


@dataclass
class _Round:
    """Projected uploads of the clients that took part in one round.

    users (n,) indices into the sorted client list; d (n, K) unit direction of u;
    b (n, p) = grad_P.d; pd (n, p) = P.d; resid (n,) energy off d; rows (n,) uploaded rows.
    Per uploaded row, concatenated user after user (CSR-like): offsets (n + 1,), seg (N,) row ->
    user position, itemsf (N,) item ids, af (N,) = grad_V.d, dvf (N,) = V_i.d. The padded
    (n, L) views ``items`` (-1 = padding), ``mask``, ``a``, ``dv`` are built on first use (free
    when every user sent the same number of rows, InclUnc).
    """

    round: int
    users: np.ndarray
    d: np.ndarray
    b: np.ndarray
    pd: np.ndarray
    resid: np.ndarray
    rows: np.ndarray
    offsets: np.ndarray
    seg: np.ndarray
    itemsf: np.ndarray
    af: np.ndarray
    dvf: np.ndarray

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @functools.cached_property
    def mask(self) -> np.ndarray:
        L = int(self.lengths.max()) if len(self.lengths) else 0
        return np.arange(L)[None, :] < self.lengths[:, None]

    def _padded(self, flat: np.ndarray, fill) -> np.ndarray:
        n, L = self.mask.shape
        if len(flat) == n * L:
            return flat.reshape(n, L)
        out = np.full((n, L), fill, dtype=flat.dtype)
        out[self.mask] = flat
        return out

    @functools.cached_property
    def items(self) -> np.ndarray:
        return self._padded(self.itemsf, -1)

    @functools.cached_property
    def a(self) -> np.ndarray:
        return self._padded(self.af, 0.0)

    @functools.cached_property
    def dv(self) -> np.ndarray:
        return self._padded(self.dvf, 0.0)


def _chunks(lengths: np.ndarray, K: int) -> list[slice]:
    """Slices of users such that each padded chunk holds about ``_CHUNK_ELEMENTS`` floats."""
    n = len(lengths)
    L = int(lengths.max()) if n else 0
    per = max(1, _CHUNK_ELEMENTS // max(1, L * K))
    return [slice(s, min(n, s + per)) for s in range(0, n, per)]


def _buckets(lengths: np.ndarray, K: int, ratio: float = 1.3) -> list[np.ndarray]:
    """Groups of users with similar upload lengths (max/min <= ``ratio``), each small enough to pad.

    Padding a group to its longest member then wastes at most ``ratio - 1`` of the work, whatever
    the spread of the users' item counts (ObsOnly: 20..737 items per MovieLens user).
    """
    order = np.argsort(lengths, kind="stable")
    bins = np.floor(np.log(np.maximum(lengths[order], 1)) / np.log(ratio)).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
    ends = np.r_[starts[1:], len(order)]
    groups = []
    for s0, e0 in zip(starts, ends):
        L = int(lengths[order[e0 - 1]])
        per = max(1, _CHUNK_ELEMENTS // max(1, L * K))
        for s1 in range(s0, e0, per):
            groups.append(order[s1 : min(e0, s1 + per)])
    return groups


def _top_eigvec(G: np.ndarray, iters: int = 8, tol: float = 1e-13) -> tuple[np.ndarray, np.ndarray]:
    """Top eigenpair of a stack of symmetric PSD matrices G (n, K, K): (vectors (n, K), values (n,)).

    Batched power iteration from each matrix's column of largest diagonal (exact after one step
    when G has rank one, the noise-free case), accepted where the eigenvector error bound
    ``|G x - lambda x| / (2 lambda - trace G)`` (the gap to the second eigenvalue is at least
    ``lambda_1 - (trace - lambda_1)``) is below ``tol``; the remaining matrices (noisy uploads
    with a small spectral gap) go to ``numpy.linalg.eigh``. Same vectors as ``eigh`` up to sign
    and floating tolerance, ~10x cheaper for the noise-free rank-1 case.
    """
    n, K = G.shape[0], G.shape[1]
    if n == 0:
        return np.zeros((0, K)), np.zeros(0)
    diag = np.einsum("nii->ni", G)
    tr = diag.sum(axis=1)
    x = np.take_along_axis(G, np.argmax(diag, axis=1)[:, None, None], axis=2)[:, :, 0]
    todo = np.ones(n, dtype=bool)
    lam = np.zeros(n)
    for _ in range(iters):
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), _TINY)
        gx = np.einsum("nij,nj->ni", G, x)
        lam = np.einsum("ni,ni->n", x, gx)
        err = np.linalg.norm(gx - lam[:, None] * x, axis=1)
        gap = 2.0 * lam - tr
        todo = ~(((gap > 0) & (err <= tol * gap)) | (tr <= 0))
        if not todo.any():
            break
        x = np.where(todo[:, None], gx, x)
    if todo.any():
        evals, evecs = np.linalg.eigh(G[todo])
        x[todo] = evecs[:, :, -1]
        lam[todo] = evals[:, -1]
    return x, lam


def _round_stats(fv: FlatFedMVMFView, R: RoundUploads, K: int) -> _Round | None:
    """Rank-1 fit of every participating client's uploads of round ``R.round``.

    The Gram matrices ``G_u = GV_u^T GV_u + GP_u^T GP_u`` (n, K, K) come from batched matmuls:
    on the concatenated uploads reshaped to (n, L, K) without a copy when every client sent the
    same number of rows (InclUnc), else per bucket of similar lengths padded from the
    concatenated rows. ``a = grad_V.d`` and ``dv = V_i.d`` are computed on the concatenated rows
    (one gather of d per row) and scattered into the padded (n, L) layout of :class:`_Round`.
    """
    n = len(R.users)
    if n == 0:
        return None
    V, P = fv.V[R.round], fv.P[R.round]
    p = P.shape[0]
    lengths = R.lengths
    L = int(lengths.max())
    GP = R.grad_P.reshape(n, p, K)
    G = np.matmul(GP.transpose(0, 2, 1), GP)
    uniform = bool(np.all(lengths == L))
    if uniform:
        GV = R.grad_V.reshape(n, L, K)
        G += np.matmul(GV.transpose(0, 2, 1), GV)
        d, top = _top_eigvec(G)
        resid = np.maximum(np.trace(G, axis1=1, axis2=2) - top, 0.0)
    else:
        # Without noise every row is a multiple of u, so the grad_P rows alone give d: take their
        # top direction and check it against the full Gram matrix G = GV^T GV + GP^T GP without
        # forming G, from one product with the concatenated rows: G d = GV^T (GV d) + GP^T GP d.
        # Users that fail the check (noise) get G from padded buckets and the generic eigen-solve.
        seg = np.repeat(np.arange(n), lengths)
        d, _ = _top_eigvec(G)
        drow = d[seg]
        af = np.einsum("nk,nk->n", R.grad_V, drow)
        Gd = _segment_sum(R.grad_V * af[:, None], R.offsets) + np.einsum("nij,nj->ni", G, d)
        top = np.einsum("ni,ni->n", d, Gd)
        tr = np.bincount(seg, weights=np.einsum("nk,nk->n", R.grad_V, R.grad_V), minlength=n)
        tr += np.trace(G, axis1=1, axis2=2)
        err = np.linalg.norm(Gd - top[:, None] * d, axis=1)
        gap = 2.0 * top - tr
        bad = ~(((gap > 0) & (err <= 1e-13 * gap)) | (tr <= 0))
        if bad.any():
            sub = np.flatnonzero(bad)
            for idx in _buckets(lengths[sub], K):
                idx = sub[idx]
                Lg = int(lengths[idx].max())
                m_ = np.arange(Lg)[None, :] < lengths[idx][:, None]
                buf = np.zeros((len(idx), Lg, K))
                buf[m_] = R.grad_V[(R.offsets[idx][:, None] + np.arange(Lg)[None, :])[m_]]
                G[idx] += np.matmul(buf.transpose(0, 2, 1), buf)
            d[sub], top[sub] = _top_eigvec(G[sub])
            tr[sub] = np.trace(G[sub], axis1=1, axis2=2)
            drow = d[seg]
            af = np.einsum("nk,nk->n", R.grad_V, drow)
        resid = np.maximum(tr - top, 0.0)
    b = np.matmul(GP, d[:, :, None])[:, :, 0]
    pd = d @ P.T
    if uniform:
        items = R.items.reshape(n, L)
        a = np.matmul(GV, d[:, :, None])[:, :, 0]
        if np.all(items == items[0]):  # every client sent the same item list (InclUnc): one product
            dv = d @ V[items[0]].T
        else:
            dv = np.einsum("nlk,nk->nl", V[items], d)
        seg = np.repeat(np.arange(n), L)
        af, dvf = a.reshape(-1), dv.reshape(-1)
    else:
        dvf = np.einsum("nk,nk->n", V[R.items], drow)
    rows = lengths + p
    return _Round(R.round, R.users, d, b, pd, resid, rows, R.offsets, seg, R.items, af, dvf)


# --------------------------------------------------------------------------------------
# scale estimation


def _classify_virtual(rhat: np.ndarray, z: np.ndarray, grid: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sign-free nearest-hypothesis decision: True where 'unrated' (rhat ~ z) beats 'rated on the grid'."""
    # the grid is positive, so the better sign is that of |rhat|
    _, dist = _grid_distance(np.abs(rhat), grid)
    return (np.abs(rhat - z) < dist) & mask


def _shorth_tau(a: np.ndarray, dv: np.ndarray, mask: np.ndarray, w: float, frac: float) -> np.ndarray:
    """Mode of the ratios a_i / (2 w dv_i) per user: centre of the tightest window of frac * count values."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(mask & (dv != 0), a / (2.0 * w * dv), np.inf)
    s = np.sort(ratio, axis=1)
    count = np.isfinite(s).sum(axis=1)
    k = np.maximum(2, np.ceil(frac * count)).astype(np.int64)
    k = np.minimum(k, np.maximum(count, 1))
    L = s.shape[1]
    start = np.arange(L)[None, :]
    end = np.minimum(start + k[:, None] - 1, L - 1)
    with np.errstate(invalid="ignore"):
        spread = np.take_along_axis(s, end, axis=1) - s
    spread[(start + k[:, None] - 1) >= count[:, None]] = np.inf
    spread[~np.isfinite(spread)] = np.inf
    i0 = np.argmin(spread, axis=1)
    mid = np.minimum(i0 + (k - 1) // 2, L - 1)
    tau = s[np.arange(len(s)), mid]
    return np.where(np.isfinite(tau), tau, np.nan)


def _stationarity_tau(R: _Round, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """SemiALS: t^2 = -d.(V_S^T a + P^T b) / (2 lam) and its variance / sigma^2."""
    n = len(R.users)
    if len(R.af) == R.mask.size:  # no padding (InclUnc): row sums of the (n, L) views
        sva, svv = np.sum(R.dv * R.a, axis=1), np.sum(R.dv**2, axis=1)
    else:
        sva = np.bincount(R.seg, weights=R.dvf * R.af, minlength=n)
        svv = np.bincount(R.seg, weights=R.dvf**2, minlength=n)
    num = sva + np.sum(R.pd * R.b, axis=1)
    tau = -num / (2.0 * lam)
    var = (svv + np.sum(R.pd**2, axis=1)) / (4.0 * lam**2)
    return tau, var


def _regression_tau(R: _Round, virt: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """t^2 = sum_U a dv / (2 w sum_U dv^2) over the items decided unrated, and variance / sigma^2."""
    dv2 = np.where(virt, R.dv**2, 0.0)
    svv = np.sum(dv2, axis=1)
    dv2 *= w
    den = np.sum(dv2, axis=1)
    num = np.sum(np.where(virt, R.a * R.dv, 0.0), axis=1)
    wmean = den / np.maximum(svv, _TINY)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = num / (2.0 * den)
        var = 1.0 / (4.0 * wmean**2 * svv)
    ok = den > 0
    return np.where(ok, tau, np.nan), np.where(ok, var, np.inf)


def _segment_rows(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated row ranges ``starts[k]:starts[k] + lengths[k]`` and the segment id of each row."""
    seg = np.repeat(np.arange(len(lengths)), lengths)
    first = np.cumsum(lengths) - lengths
    return starts[seg] + (np.arange(len(seg)) - first[seg]), seg


def _segment_sum(X: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Row sums of ``X`` (N x K) per segment ``offsets[k]:offsets[k + 1]`` (empty segments give 0)."""
    out = np.zeros((len(offsets) - 1,) + X.shape[1:])
    nz = np.diff(offsets) > 0
    if nz.any():
        out[nz] = np.add.reduceat(X, offsets[:-1][nz], axis=0)
    return out


def _pair_tau(
    fv: FlatFedMVMFView, R1: _Round, R2: _Round, eta: float, alpha: float, lam: float, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SGD, ObsOnly: (users, tau1, tau2) from two consecutive rounds (module docstring).

    Only clients present in both rounds with the same item set are solved.
    """
    common, i1, i2 = np.intersect1d(R1.users, R2.users, return_indices=True)
    if not len(common):
        return common, np.empty(0), np.empty(0)
    # same item list in both rounds (compared on the concatenated rows)
    len1, len2 = np.diff(R1.offsets)[i1], np.diff(R2.offsets)[i2]
    keep = len1 == len2
    i1, i2, common, lengths = i1[keep], i2[keep], common[keep], len1[keep]
    rows1, seg = _segment_rows(R1.offsets[i1], lengths)
    rows2, _ = _segment_rows(R2.offsets[i2], lengths)
    items = R1.itemsf[rows1]
    bad = np.bincount(seg, weights=items != R2.itemsf[rows2], minlength=len(common)) > 0
    if bad.any():
        keep = ~bad
        i1, i2, common, lengths = i1[keep], i2[keep], common[keep], lengths[keep]
        rows1, seg = _segment_rows(R1.offsets[i1], lengths)
        items = R1.itemsf[rows1]
    V, Vn = fv.V[R1.round], fv.V[R2.round]
    P, Pn = fv.P[R1.round], fv.P[R2.round]
    d1, d2 = R1.d[i1], R2.d[i2]
    b1 = R1.b[i1]
    off = np.zeros(len(common) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    # one pass over the concatenated rows: V'_S^T (V_S - V'_S) d1 and V'_S^T a1 per user
    VnI = Vn[items]
    diff = np.einsum("nk,nk->n", V[items] - VnI, d1[seg])
    c1 = 2.0 * eta * _segment_sum(VnI * diff[:, None], off)
    c2 = -eta * _segment_sum(VnI * R1.af[rows1][:, None], off)
    c1 += d1 + 2.0 * eta * alpha * ((d1 @ (P - Pn).T) @ Pn) - 2.0 * eta * lam * d1
    c2 += -eta * (b1 @ Pn)
    e1 = c1 - d2 * np.sum(d2 * c1, axis=1, keepdims=True)
    e2 = c2 - d2 * np.sum(d2 * c2, axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau1 = np.linalg.norm(e2, axis=1) / np.linalg.norm(e1, axis=1)
        t1 = np.sqrt(tau1)
        t2 = np.sum(d2 * (t1[:, None] * c1 + c2 / t1[:, None]), axis=1)
    return common, tau1, t2**2


# --------------------------------------------------------------------------------------
# shortcut: one round decides everything (noise-free or noise far below the grid)


@dataclass
class _Shortcut:
    """Decoded first round: CSR rows as in :class:`_Round` (items concatenated, or one array per
    user), ratings (N,) on the grid (0 = unrated), attributes (n, p) in {0, 1}."""

    round: int
    offsets: np.ndarray
    items: np.ndarray | list
    ratings: np.ndarray
    attributes: np.ndarray
    residual: float
    noise_sigma: float


def _grid_distance(x: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nearest grid value of clip(x), |x - it|) elementwise; the grid is evenly spaced."""
    lo, hi = grid[0], grid[-1]
    step = grid[1] - grid[0] if len(grid) > 1 else 1.0
    q = np.clip(x, lo, hi)
    q -= lo
    q /= step
    np.round(q, out=q)
    q *= step
    q += lo
    return q, np.abs(x - q)


def _shortcut_first_round(
    fv: FlatFedMVMFView, R: RoundUploads, K: int, update: str, unknown_c: bool, w: float, alpha: float,
    lam: float, grid: np.ndarray, tol: float, margin: float,
) -> _Shortcut | None:
    """Decode every client from round ``R`` alone, or ``None`` if that round does not decide everything.

    Same formulas as the full estimator on one round: d from the grad_P rows (top eigenvector of
    the (n, K, K) Gram matrices of the p attribute rows), ``a = grad_V.d`` (one batched
    matrix-vector product; InclUnc: (n, m', K) @ (n, K, 1)), ``dv``, ``b``, ``pd``; t^2 from
    the SemiALS stationarity condition or (SGD with unrated/sampled items, every client sending
    the same number of rows) the median of the unrated ratios ``a_i / (2 w dv_i)`` (exact when
    more than half a client's items are unrated: they share that ratio exactly); eq. (1) of
    the module docstring; sign; nearest hypothesis (grid value, or "unrated" where that is
    nearer, as :func:`_classify_virtual`). Accepted only if every decoded rating and attribute
    lies within ``tol`` (rating units / absolute) of its hypothesis and every competing
    hypothesis (InclUnc: rated vs unrated) is at least ``margin`` times the largest such
    residual away: then further rounds cannot change a decision (the MAP decision of the full
    estimator is the nearest hypothesis), and the result equals the full estimator's. A wrong
    direction or scale (noise, an unsupported layout) scatters the values off the grid and fails
    the check. When the largest residual is at float precision (<= 1e-9 step: noise-free), the
    rival of the items decided unrated is not evaluated: the two hypotheses of an item coincide
    only if ``r_i = (1 - w) t dv_i`` (probability 0), and the nearest one is exact anyway.

    Cost (InclUnc, noise-free): one pass over the grad_V rows for ``a`` and ~7 elementwise
    passes over the (n, m') arrays; the rated/grid work runs only on the items not fitting
    "unrated" (the rated ones).
    """
    n = len(R.users)
    V, P = fv.V[R.round], fv.P[R.round]
    p = P.shape[0]
    if n == 0 or n != len(fv.parties) or p == 0:
        return None
    if update != "semials" and not unknown_c:
        return None  # SGD ObsOnly: the scale needs a pair of rounds
    lengths = R.lengths
    L = int(lengths.max())
    uniform = bool(np.all(lengths == L))
    if update != "semials" and not uniform:
        return None
    step = grid[1] - grid[0] if len(grid) > 1 else 1.0
    GP = R.grad_P.reshape(n, p, K)
    G = np.matmul(GP.transpose(0, 2, 1), GP)
    d, top = _top_eigvec(G)
    tr = np.trace(G, axis1=1, axis2=2)
    noise_sigma = math.sqrt(max(float(np.sum(tr - top)), 0.0) / max(n * p * (K - 1), 1))
    b = np.matmul(GP, d[:, :, None])[:, :, 0]
    pd = d @ P.T
    if uniform:  # (n, L) arrays; per-user scalars broadcast
        a = np.matmul(R.grad_V.reshape(n, L, K), d[:, :, None])[:, :, 0]
        common = R.common_items
        if common is not None:
            dv = d @ V[common].T
        else:
            dv = np.einsum("nlk,nk->nl", V[R.items.reshape(n, L)], d)
        seg = None

        def per_row(x):
            return x[:, None]
    else:  # concatenated rows (N,)
        seg = np.repeat(np.arange(n), lengths)
        drow = d[seg]
        a = np.einsum("nk,nk->n", R.grad_V, drow)
        dv = np.einsum("nk,nk->n", V[R.items], drow)

        def per_row(x):
            return np.repeat(x, lengths)
    if update == "semials":
        sva = np.einsum("nl,nl->n", dv, a) if seg is None else np.bincount(seg, weights=dv * a, minlength=n)
        tau = -(sva + np.sum(pd * b, axis=1)) / (2.0 * lam)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            tau = np.median(a / (2.0 * w * dv), axis=1)
    if not np.all(np.isfinite(tau) & (tau > 0)):
        return None
    t = np.sqrt(tau)
    xhat = t[:, None] * pd - b / (2.0 * alpha * t[:, None])
    af, dvf = a.reshape(-1), dv.reshape(-1)
    if unknown_c:
        # |rhat - z| = |a / (2t) - w t dv| per item (rating units): "unrated" fits where it is <= tol
        e = per_row(0.5 / t) * a
        e -= per_row(w * t) * dv
        np.abs(e, out=e)
        ef = e.reshape(-1)
        idx = np.flatnonzero(ef > tol)  # the items "unrated" does not fit: rated (or a failed fit)
        e_idx = ef[idx]
        ef[idx] = 0.0
        s_unrated = float(ef.max()) if ef.size else 0.0  # worst residual of the items decided unrated
    else:
        idx, e_idx, s_unrated = None, None, 0.0
    # the remaining items: rated hypothesis (nearest grid value) unless "unrated" is nearer
    users = (idx // L if seg is None else seg[idx]) if idx is not None else (
        np.repeat(np.arange(n), L) if seg is None else seg)
    tr_ = t[users]
    a_r = af if idx is None else af[idx]
    dv_r = dvf if idx is None else dvf[idx]
    rh = tr_ * dv_r - a_r / (2.0 * tr_)
    if unknown_c:
        _, e_free = _grid_distance(np.abs(rh), grid)
        unr = e_idx < e_free
        score = np.bincount(users, weights=np.where(unr, 0.0, rh), minlength=n)
    else:
        unr = None
        score = np.bincount(users, weights=rh, minlength=n)
    score += np.sum(xhat, axis=1)
    sign = np.where(score < 0, -1.0, 1.0)
    rh *= sign[users]
    xhat *= sign[:, None]
    q, e_rated = _grid_distance(rh, grid)
    xq = np.round(np.clip(xhat, 0.0, 1.0))
    s_x = float(np.max(np.abs(xhat - xq))) if xhat.size else 0.0
    if unr is None:
        s_r = float(np.max(e_rated)) if e_rated.size else 0.0
        ok = s_r <= tol and s_x <= tol
        est = q
    else:
        s_r = max(s_unrated, float(np.max(np.where(unr, e_idx, e_rated))) if len(rh) else 0.0)
        floor = max(s_r, 1e-12 * step)
        rival = float(np.min(np.where(unr, e_free, e_idx))) if len(rh) else np.inf
        ok = s_r <= tol and s_x <= tol and rival > margin * floor
        if ok and s_r > 1e-9 * step:  # noisy but small: the items decided unrated must not fit the grid too
            _, dist = _grid_distance(np.abs(per_row((1.0 - w) * t) * dv).reshape(-1), grid)
            dist[idx] = np.inf
            ok = float(dist.min()) > (margin + 1.0) * floor if dist.size else True
        est = np.zeros(len(af))
        est[idx] = np.where(unr, 0.0, q)
    if not ok:
        return None
    items = [common] * n if uniform and common is not None else R.items
    return _Shortcut(R.round, R.offsets, items, est, xq, max(s_r, s_x), noise_sigma)


# --------------------------------------------------------------------------------------
# decoding


def _em_prior(loglik: np.ndarray, iters: int = 30, max_rows: int = 200_000) -> np.ndarray:
    """Empirical-Bayes prior over the hypotheses (columns) of ``loglik`` (N x H), by EM."""
    H = loglik.shape[1]
    pi = np.full(H, 1.0 / H)
    if not len(loglik):
        return pi
    if len(loglik) > max_rows:  # the prior needs no more than a large even subsample
        loglik = loglik[:: int(math.ceil(len(loglik) / max_rows))]
    N = len(loglik)
    # column by column (H is small; per-row reductions over H columns are slow in numpy)
    mx = loglik[:, 0].copy()
    for h in range(1, H):
        np.maximum(mx, loglik[:, h], out=mx)
    lik = np.zeros((H, N))
    for h in range(H):
        dl = loglik[:, h] - mx
        # exp only where it does not underflow to 0 (most noise-free likelihoods)
        keep = dl > -746.0
        lik[h, keep] = np.exp(dl[keep])
    # rows whose likelihood is one-hot (noise-free items: every other hypothesis underflows to 0)
    # have a one-hot posterior whatever the prior: count them once instead of every iteration
    nonzero = lik != 0
    onehot = np.count_nonzero(nonzero, axis=0) == 1
    counts = np.array([np.count_nonzero(nonzero[h] & onehot) for h in range(H)], dtype=np.float64)
    lik = lik[:, ~onehot].T
    for _ in range(iters):
        post = lik * pi
        post /= np.maximum(post.sum(axis=1, keepdims=True), _TINY)
        new = (counts + post.sum(axis=0)) / N
        new = np.maximum(new, 1e-6)
        new /= new.sum()
        if np.max(np.abs(new - pi)) < 1e-6:
            pi = new
            break
        pi = new
    return pi


def _attribute_groups(names: Any, p: int) -> list[np.ndarray]:
    """Column blocks of one-hot dummies from ``group=value`` names (else one column per block)."""
    if not isinstance(names, (list, tuple)) or len(names) != p:
        return [np.array([j]) for j in range(p)]
    groups: dict[str, list[int]] = {}
    order: list[str] = []
    for j, name in enumerate(names):
        key = str(name).split("=", 1)[0] if "=" in str(name) else f"\x00{j}"
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(j)
    return [np.asarray(groups[k]) for k in order]


def _sampling_weight(entry: dict, w: float) -> float:
    """Confidence c of the items a ``sampling`` defense added, from its public config entry.

    A numeric ``w`` (or ``weight``) is used as is; otherwise the registered defense's own rule
    (its ``weight`` property, e.g. FedMVMF's default w), else the protocol's ``w``.
    """
    for key in ("w", "weight"):
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    try:
        from privaudit.registry import get

        params = {k: v for k, v in entry.items() if k != "name"}
        return float(get("defense", "sampling")(**params).weight)
    except Exception:  # a foreign or older sampling entry: the protocol's w
        return w


@register_attack("mvmf-analytic")
class MVMFAnalytic(MVMFAttack):
    """Closed-form FedMVMF reconstruction: exact without noise, least squares + MAP under noise."""

    description = "Closed-form FedMVMF server reconstruction (rank-1 fit + scale in closed form; exact without noise)"
    requires = ("grad_V", "grad_P", "state")
    parameters = (
        Param("max_rounds", -1, "use at most this many recorded rounds (-1: every round the view holds)"),
        Param("prior", True, "MAP decoding with an empirical prior fitted by EM (false: plain clip-and-round)"),
        Param("refits", 3, "InclUnc/sampling: decide-rated/refit-scale iterations per round", ge=0),
        Param("shortcut", True, "decode from the first round alone when it decides every value with a residual far "
              "below the rating step (noise-free or near it); false: always the full estimator"),
    )

    # ------------------------------------------------------------------ public API
    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        # The work is batches of tiny (K x K, K x L) products: BLAS threads only add overhead,
        # and on a busy machine their spinning multiplied the attack's time by >10 (measured).
        try:
            from threadpoolctl import threadpool_limits  # installed with scikit-learn
        except ImportError:  # pragma: no cover
            return self._run(view)
        with threadpool_limits(limits=1, user_api="blas"):
            return self._run(view)

    def _run(self, view: View) -> Reconstruction:
        tic = time.perf_counter()
        missing = missing_config(view)
        if missing:
            return self.unsupported(f"the view's config lacks {', '.join(missing)}")
        fv = parse_view_flat(view)
        if not fv.rounds:
            return self.unsupported("the view holds no client uploads with the server state of their round")
        cfg = fv.config
        parties = fv.parties
        K = int(cfg["K"])
        alpha, lam = float(cfg["alpha"]), float(cfg["lam"])
        w = float(cfg.get("w", 0.0) or 0.0)
        eta = float(cfg.get("eta", 0.0) or 0.0)
        update = str(cfg["update"])
        sampling = [dd for dd in cfg.get("defenses", []) if isinstance(dd, dict) and dd.get("name") == "sampling"]
        w_virtual = w
        for dd in sampling:
            w_virtual = _sampling_weight(dd, w)
        unknown_c = cfg["unrated"] == "inclunc" or bool(sampling)
        if unknown_c and w_virtual <= 0:
            return self.unsupported("unrated items with weight w = 0 carry no gradient (nothing to separate)")
        rounds = fv.rounds
        if self.max_rounds is not None and self.max_rounds >= 0:
            rounds = rounds[: self.max_rounds]
        lo, hi = float(cfg["rating_min"]), float(cfg["rating_max"])
        step = float(cfg.get("rating_step", 1.0) or 1.0)
        grid = np.arange(lo, hi + step / 2, step)
        scenario = f"{update}-{cfg['unrated']}" + ("+sampling" if sampling else "")

        if self.shortcut and rounds:
            # noise-adaptive use of rounds: when the first round alone decides every value with
            # a residual far below the grid step, further rounds cannot change a decision
            fast = _shortcut_first_round(fv, rounds[0], K, update, unknown_c, w_virtual, alpha, lam, grid,
                                         tol=_SHORTCUT_TOL * step, margin=_SHORTCUT_MARGIN)
            if fast is not None:
                victims = self._victims(cfg, parties, fast.offsets, fast.items, fast.ratings, fast.attributes,
                                        rounded=True)
                meta = {
                    "scenario": scenario,
                    "rounds": [fast.round],
                    "shortcut": True,
                    "max_residual": fast.residual,
                    "noise_sigma": fast.noise_sigma,
                    "seconds": time.perf_counter() - tic,
                }
                return Reconstruction(self.name, self.party, victims, meta=meta)

        stats = [s for s in (_round_stats(fv, R, K) for R in rounds) if s is not None]
        if not stats:
            return self.unsupported("no round holds both the server state and client uploads")

        # pooled noise variance per coordinate (energy of the rows off the rank-1 fit)
        dof = sum(float(np.sum(s.rows)) for s in stats) * max(K - 1, 0)
        sigma2 = sum(float(np.sum(s.resid)) for s in stats) / dof if dof > 0 else 0.0
        scale2 = np.mean([np.mean(s.af**2) if len(s.af) else 0.0 for s in stats]) + _TINY
        sigma2 = max(sigma2, 1e-24 * scale2)

        taus = self._scales(fv, stats, update, unknown_c, w_virtual, eta, alpha, lam, K, grid)
        if all(np.all(~np.isfinite(t)) for t in taus):
            return self.unsupported(
                "SGD with ObsOnly needs two consecutive recorded rounds from the same clients to fix the scale"
            )
        victims, diag = self._decode(cfg, fv, parties, stats, taus, sigma2, unknown_c, w_virtual, alpha, grid)
        meta = {
            "scenario": scenario,
            "rounds": [s.round for s in stats],
            "shortcut": False,
            "noise_sigma": math.sqrt(sigma2),
            "seconds": time.perf_counter() - tic,
            **diag,
        }
        return Reconstruction(self.name, self.party, victims, meta=meta)

    # ------------------------------------------------------------------ scale per round
    def _scales(self, fv, stats, update, unknown_c, w, eta, alpha, lam, K, grid) -> list[np.ndarray]:
        """t^2 per round and participating user (NaN where unknown)."""
        taus = [np.full(len(s.users), np.nan) for s in stats]
        if update == "semials":
            for k, s in enumerate(stats):
                taus[k], _ = _stationarity_tau(s, lam)
        elif not unknown_c:
            est: list[list[np.ndarray]] = [[] for _ in stats]
            for k in range(len(stats) - 1):
                s1, s2 = stats[k], stats[k + 1]
                users, t1, t2 = _pair_tau(fv, s1, s2, eta, alpha, lam, K)
                for s, tt, kk in ((s1, t1, k), (s2, t2, k + 1)):
                    full = np.full(len(s.users), np.nan)
                    full[np.searchsorted(s.users, users)] = np.sqrt(np.abs(tt))
                    est[kk].append(full)
            for k in range(len(stats)):
                if est[k]:
                    with np.errstate(invalid="ignore"):
                        mean_t = np.nanmean(np.vstack(est[k]), axis=0) if len(est[k]) > 1 else est[k][0]
                    taus[k] = mean_t**2
            return taus
        else:
            frac = 0.25
            for k, s in enumerate(stats):
                taus[k] = _shorth_tau(s.a, s.dv, s.mask, w, frac)
        if not unknown_c:
            return taus
        # InclUnc / sampling: decide unrated items, refit t^2 on them (plus stationarity for SemiALS)
        for k, s in enumerate(stats):
            tau = taus[k]
            tau_stat, var_stat = _stationarity_tau(s, lam) if update == "semials" else (None, None)
            prev = None
            for _ in range(max(1, int(self.refits))):
                t = np.sqrt(np.abs(np.nan_to_num(tau, nan=1.0))) + _TINY
                rhat = t[:, None] * s.dv - s.a / (2.0 * t[:, None])
                z = (1.0 - w) * t[:, None] * s.dv
                virt = _classify_virtual(rhat, z, grid, s.mask)
                if prev is not None and np.array_equal(virt, prev):
                    break  # the decision is stable: the refit would not change t^2
                prev = virt
                wv = np.full_like(s.a, w)
                tau_reg, var_reg = _regression_tau(s, virt, wv)
                if tau_stat is not None:
                    wr = np.where(np.isfinite(tau_reg), 1.0 / var_reg, 0.0)
                    ws = 1.0 / np.maximum(var_stat, _TINY)
                    tau = (ws * tau_stat + wr * np.nan_to_num(tau_reg)) / (ws + wr)
                else:
                    tau = np.where(np.isfinite(tau_reg), tau_reg, tau)
            taus[k] = tau
        return taus

    # ------------------------------------------------------------------ decoding
    @staticmethod
    def _victims(cfg, parties, offsets, items, ratings, attributes, rounded=False) -> dict[str, dict[str, np.ndarray]]:
        """Per-party reconstructions from CSR rows: ``items`` (concatenated array or per-user list),
        ``ratings`` (N,) and ``attributes`` (n, p), clipped and rounded as eq. 43 (unless ``rounded``:
        already on the grid and in the domain)."""
        if not rounded:
            ratings = round_ratings(ratings, cfg)
            attributes = round_attributes(attributes)
        bounds = np.asarray(offsets).tolist()
        if isinstance(items, np.ndarray):
            items = [items[bounds[u] : bounds[u + 1]] for u in range(len(parties))]
        return {
            party: {"items": items[u], "ratings": ratings[bounds[u] : bounds[u + 1]], "attributes": attributes[u]}
            for u, party in enumerate(parties)
        }

    def _decode(self, cfg, fv, parties, stats, taus, sigma2, unknown_c, w, alpha, grid):
        """Combine the rounds per (user, item) and decode ratings and attributes (MAP / rounding)."""
        n = len(parties)
        # reference item list per user: the first round with a known scale (else its first upload)
        ref_items: list[np.ndarray | None] = [None] * n
        for s, tau in zip(stats, taus):
            for j in np.flatnonzero(np.isfinite(tau)):
                u = s.users[j]
                if ref_items[u] is None:
                    ref_items[u] = s.itemsf[s.offsets[j] : s.offsets[j + 1]]
        for R in fv.rounds:  # users without a known scale: the items of their first upload
            for k in np.flatnonzero([ref_items[u] is None for u in R.users]):
                ref_items[R.users[k]] = R.items[R.offsets[k] : R.offsets[k + 1]]
        # the reference layout, flat (CSR-like): user u's items at ref_off[u]:ref_off[u + 1]
        lengths = np.fromiter((len(x) for x in ref_items), dtype=np.int64, count=n)
        ref_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=ref_off[1:])
        ref_flat = np.concatenate(ref_items) if n else np.empty(0, np.int64)
        Nr = len(ref_flat)
        p = stats[0].b.shape[1]
        S0, S1, S2, SU = (np.zeros(Nr) for _ in range(4))
        X0, X1 = np.zeros((n, p)), np.zeros((n, p))
        lookup = None  # lazily built (user, item) -> position table for rounds with other item lists
        for s, tau in zip(stats, taus):
            ok = np.isfinite(tau) & (tau != 0)
            if not ok.any():
                continue
            t = np.sqrt(np.abs(tau[ok]))
            b, pd, users = s.b[ok], s.pd[ok], s.users[ok]
            if ok.all():
                seg, af, dvf, itf, off = s.seg, s.af, s.dvf, s.itemsf, s.offsets
            else:  # keep the rows of the users with a known scale, renumbered
                rows_ok = ok[s.seg]
                seg = (np.cumsum(ok) - 1)[s.seg[rows_ok]]
                af, dvf, itf = s.af[rows_ok], s.dvf[rows_ok], s.itemsf[rows_ok]
                off = np.zeros(len(t) + 1, dtype=np.int64)
                np.cumsum(np.diff(s.offsets)[ok], out=off[1:])
            nk = len(t)
            rlen = np.diff(off)
            ts = np.repeat(t, rlen)  # == t[seg] (rows are grouped by user), sequential
            rhat = ts * dvf - af / (2.0 * ts)
            xhat = t[:, None] * pd - b / (2.0 * alpha * t[:, None])
            # sign: ratings (of the items that look rated) and attribute dummies positive
            if unknown_c:
                looks_rated = ~_classify_virtual(rhat, (1.0 - w) * ts * dvf, grid, True)
                score = np.bincount(seg, weights=np.where(looks_rated, rhat, 0.0), minlength=nk)
            else:
                score = np.bincount(seg, weights=rhat, minlength=nk)
            score += np.sum(xhat, axis=1)
            sign = np.where(score < 0, -1.0, 1.0)
            t = t * sign
            ts = np.repeat(t, rlen)
            rhat *= np.repeat(sign, rlen)
            xhat *= sign[:, None]
            Wr = 4.0 * t**2 / sigma2  # 1 / var(rhat)
            X0[users] += (alpha**2 * Wr)[:, None]
            X1[users] += (alpha**2 * Wr)[:, None] * xhat
            # where does each row go in the reference layout? same item list as the reference: by position
            if nk == n and len(itf) == Nr and np.array_equal(users, np.arange(n)) and np.array_equal(itf, ref_flat):
                target, rows_same, same_all = slice(None), slice(None), True
            else:
                same_all = False
                pos = ref_off[users][seg] + (np.arange(len(seg)) - off[seg])
                samelen = rlen == lengths[users]
                cand = samelen[seg]
                bad = np.zeros(len(seg), dtype=bool)
                bad[cand] = itf[cand] != ref_flat[pos[cand]]
                same = samelen & (np.bincount(seg, weights=bad, minlength=nk) == 0)
                rows_same = same[seg]
                target = pos[rows_same]
            Wrow = np.repeat(Wr, rlen)
            wr = Wrow if same_all else Wrow[rows_same]
            rh = rhat if same_all else rhat[rows_same]
            S0[target] += wr
            w1 = wr * rh
            S1[target] += w1
            S2[target] += w1 * rh
            if unknown_c:
                e = rhat - (1.0 - w) * ts * dvf
                np.square(e, out=e)
                e *= Wrow
                SU[target] += e if same_all else e[rows_same]
            if not same_all and not rows_same.all():  # other item lists: align through a sorted (user, item) key table
                if lookup is None:
                    big = np.int64(max(int(ref_flat.max()), max(int(x.itemsf.max()) for x in stats)) + 2)
                    keys = ref_flat + np.repeat(np.arange(n), lengths) * big
                    order = np.argsort(keys, kind="stable")
                    lookup = (big, keys[order], order)
                big, keys_sorted, pos_sorted = lookup
                sel = ~rows_same
                key = itf[sel] + users[seg[sel]] * big
                pos2 = np.minimum(np.searchsorted(keys_sorted, key), len(keys_sorted) - 1)
                hit = keys_sorted[pos2] == key
                tgt = pos_sorted[pos2[hit]]
                wr2 = Wrow[sel][hit]
                rh2 = rhat[sel][hit]
                S0[tgt] += wr2
                S1[tgt] += wr2 * rh2
                S2[tgt] += wr2 * rh2**2
                if unknown_c:
                    SU[tgt] += wr2 * (rh2 - ((1.0 - w) * ts * dvf)[sel][hit]) ** 2

        # ratings: hypotheses = grid values (+ "unrated" = 0), Gaussian log-likelihoods
        have = S0 > 0
        if have.all():
            s0, s1, s2, su = S0, S1, S2, SU
        else:
            s0, s1, s2, su = S0[have], S1[have], S2[have], SU[have]
        values = np.concatenate([[0.0], grid]) if unknown_c else grid

        def loglik(h: int, rows=slice(None)) -> np.ndarray:
            """Log-likelihood of hypothesis ``values[h]`` per kept item (up to a shared constant)."""
            if unknown_c and h == 0:
                return -0.5 * su[rows]
            g = values[h]
            return -0.5 * (s2[rows] - 2.0 * s1[rows] * g + s0[rows] * g**2)

        H = len(values)
        if self.prior:
            step_rows = int(math.ceil(len(s0) / 200_000)) if len(s0) else 1
            sub = slice(None, None, step_rows)
            pi = _em_prior(np.stack([loglik(h, sub) for h in range(H)], axis=1), max_rows=len(s0) + 1)
        else:
            pi = np.full(H, 1.0 / H)
        if self.prior or unknown_c:  # MAP: running argmax over the hypotheses (first maximum wins)
            logpi = np.log(pi)
            best = loglik(0) + logpi[0]
            pick = np.zeros(len(s0), dtype=np.int64)
            s1x2 = 2.0 * s1
            sc, tmp = np.empty_like(s0), np.empty_like(s0)
            for h in range(1, H):
                if unknown_c and h == 0:
                    continue
                g = values[h]  # sc = -0.5 * (s2 - 2 s1 g + s0 g^2), same operations as loglik(h), in place
                np.multiply(s1x2, g, out=sc)
                np.subtract(s2, sc, out=sc)
                np.multiply(s0, g**2, out=tmp)
                sc += tmp
                sc *= -0.5
                sc += logpi[h]
                better = sc > best
                pick[better] = h
                np.maximum(best, sc, out=best)
            est = values[pick]
        else:  # plain eq. 43: clip the inverse-variance average of the rounds' estimates and round
            est = s1 / s0
        rating_guess = np.full(Nr, values[int(np.argmax(pi))])
        rating_guess[have] = est

        # attributes: per one-hot block, hypothesis "none" or one category; ll(1) - ll(0) = S1 - S0 / 2
        have_x = X0[:, 0] > 0 if p else np.zeros(n, bool)
        delta = X1 - 0.5 * X0
        attrs = np.zeros((n, p))
        for cols in _attribute_groups(cfg.get("attribute_names"), p):
            sc = np.concatenate([np.zeros((n, 1)), delta[:, cols]], axis=1)  # none, cat_1..cat_g
            pi_g = _em_prior(sc[have_x]) if self.prior else np.full(sc.shape[1], 1.0 / sc.shape[1])
            pick = np.argmax(sc + np.log(pi_g), axis=1)
            block = np.zeros((n, len(cols)))
            hit_rows = np.flatnonzero(pick > 0)
            block[hit_rows, pick[hit_rows] - 1] = 1.0
            # a column decided with near certainty on its own keeps that decision (keeps
            # non-exclusive blocks exact without noise)
            sure = np.abs(delta[:, cols]) > 50.0
            block = np.where(sure, (delta[:, cols] > 0).astype(float), block)
            if not self.prior:  # plain eq. 43: clip the averaged estimate and round
                block = X1[:, cols] / np.maximum(X0[:, cols], _TINY)
            if (~have_x).any():
                block[~have_x] = (np.argmax(pi_g) - 1 == np.arange(len(cols))).astype(float)
            attrs[:, cols] = block
        victims = self._victims(cfg, parties, ref_off, ref_items, rating_guess, attrs)
        diag = {
            "users_without_scale": int(np.sum(~have_x)) if p else 0,
            "prior_ratings": [float(v) for v in pi],
        }
        return victims, diag

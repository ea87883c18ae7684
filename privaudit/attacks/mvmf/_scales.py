"""Scale estimators of the ``mvmf-analytic`` attack: the scalar t^2 of each client's latent vector
u = t d per round, from SemiALS stationarity, a pair of SGD rounds, or the ratio shared by the
unrated items (InclUnc / sampling); and the first-round shortcut that decodes everything from one
round when it decides every value (derivation: ``docs/mvmf-analytic.md``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from privaudit.attacks.mvmf._core import FlatFedMVMFView, RoundUploads
from privaudit.attacks.mvmf._rounds import (
    TINY,
    Round,
    UpdateModel,
    classify_virtual,
    grid_distance,
    segment_rows,
    segment_sum,
    top_eigvec,
)
from privaudit.models import mvmf

# shortcut acceptance: every first-round value within this many rating steps of its hypothesis,
# every competing hypothesis (InclUnc: rated vs unrated) this many times farther than the worst fit
SHORTCUT_TOL = 0.01
SHORTCUT_MARGIN = 10.0


def shorth_tau(a: np.ndarray, dv: np.ndarray, mask: np.ndarray, w: float, frac: float) -> np.ndarray:
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


def stationarity_tau(R: Round, lam: float) -> tuple[np.ndarray, np.ndarray]:
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


def regression_tau(R: Round, virt: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """t^2 = sum_U a dv / (2 w sum_U dv^2) over the items decided unrated, and variance / sigma^2."""
    dv2 = np.where(virt, R.dv**2, 0.0)
    svv = np.sum(dv2, axis=1)
    dv2 *= w
    den = np.sum(dv2, axis=1)
    num = np.sum(np.where(virt, R.a * R.dv, 0.0), axis=1)
    wmean = den / np.maximum(svv, TINY)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = num / (2.0 * den)
        var = 1.0 / (4.0 * wmean**2 * svv)
    ok = den > 0
    return np.where(ok, tau, np.nan), np.where(ok, var, np.inf)


def pair_tau(
    fv: FlatFedMVMFView, R1: Round, R2: Round, model: UpdateModel
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SGD, ObsOnly: (users, tau1, tau2) from two consecutive rounds (docs/mvmf-analytic.md).

    Only clients present in both rounds with the same item set are solved.
    """
    eta, alpha, lam = model.eta, model.alpha, model.lam
    common, i1, i2 = np.intersect1d(R1.users, R2.users, return_indices=True)
    if not len(common):
        return common, np.empty(0), np.empty(0)
    # same item list in both rounds (compared on the concatenated rows)
    len1, len2 = np.diff(R1.offsets)[i1], np.diff(R2.offsets)[i2]
    keep = len1 == len2
    i1, i2, common, lengths = i1[keep], i2[keep], common[keep], len1[keep]
    rows1, seg = segment_rows(R1.offsets[i1], lengths)
    rows2, _ = segment_rows(R2.offsets[i2], lengths)
    items = R1.itemsf[rows1]
    bad = np.bincount(seg, weights=items != R2.itemsf[rows2], minlength=len(common)) > 0
    if bad.any():
        keep = ~bad
        i1, i2, common, lengths = i1[keep], i2[keep], common[keep], lengths[keep]
        rows1, seg = segment_rows(R1.offsets[i1], lengths)
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
    c1 = 2.0 * eta * segment_sum(VnI * diff[:, None], off)
    c2 = -eta * segment_sum(VnI * R1.af[rows1][:, None], off)
    c1 += d1 + 2.0 * eta * alpha * ((d1 @ (P - Pn).T) @ Pn) - 2.0 * eta * lam * d1
    c2 += -eta * (b1 @ Pn)
    e1 = c1 - d2 * np.sum(d2 * c1, axis=1, keepdims=True)
    e2 = c2 - d2 * np.sum(d2 * c2, axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau1 = np.linalg.norm(e2, axis=1) / np.linalg.norm(e1, axis=1)
        t1 = np.sqrt(tau1)
        t2 = np.sum(d2 * (t1[:, None] * c1 + c2 / t1[:, None]), axis=1)
    return common, tau1, t2**2


@dataclass
class Shortcut:
    """Decoded first round: CSR rows as in :class:`Round` (items concatenated, or one array per
    user), ratings (N,) on the grid (0 = unrated), attributes (n, p) in {0, 1}."""

    round: int
    offsets: np.ndarray
    items: np.ndarray | list
    ratings: np.ndarray
    attributes: np.ndarray
    residual: float
    noise_sigma: float


@dataclass
class _FirstRound:
    """Projections of one round's uploads on each client's direction d: ``a = grad_V.d`` and
    ``dv = V_i.d`` as (n, L) arrays when every client sent L rows (``seg`` None), else
    concatenated rows (N,) with their client ``seg``; ``b = grad_P.d``, ``pd = P.d`` (n, p)."""

    a: np.ndarray
    dv: np.ndarray
    b: np.ndarray
    pd: np.ndarray
    seg: np.ndarray | None
    lengths: np.ndarray
    common: np.ndarray | None
    noise_sigma: float

    def per_row(self, x: np.ndarray) -> np.ndarray:
        """A per-client value (n,) broadcast to the rows."""
        return x[:, None] if self.seg is None else np.repeat(x, self.lengths)


def _first_round(fv: FlatFedMVMFView, R: RoundUploads, model: UpdateModel) -> _FirstRound | None:
    """The projections of round ``R`` with d from the grad_P rows alone, or None when the round
    cannot decide every client on its own (a client missing, no attribute, SGD ObsOnly, or SGD
    with clients of different upload lengths)."""
    n, K = len(R.users), model.K
    V, P = fv.V[R.round], fv.P[R.round]
    p = P.shape[0]
    if n == 0 or n != len(fv.parties) or p == 0:
        return None
    if model.update != "semials" and not model.unknown_c:
        return None  # SGD ObsOnly: the scale needs a pair of rounds
    lengths = R.lengths
    L = int(lengths.max())
    uniform = bool(np.all(lengths == L))
    if model.update != "semials" and not uniform:
        return None
    GP = R.grad_P.reshape(n, p, K)
    G = np.matmul(GP.transpose(0, 2, 1), GP)
    d, top = top_eigvec(G)
    tr = np.trace(G, axis1=1, axis2=2)
    noise_sigma = math.sqrt(max(float(np.sum(tr - top)), 0.0) / max(n * p * (K - 1), 1))
    b = np.matmul(GP, d[:, :, None])[:, :, 0]
    pd = d @ P.T
    common = None
    if uniform:  # (n, L) arrays; per-user scalars broadcast
        a = np.matmul(R.grad_V.reshape(n, L, K), d[:, :, None])[:, :, 0]
        common = R.common_items
        if common is not None:
            dv = d @ V[common].T
        else:
            dv = np.einsum("nlk,nk->nl", V[R.items.reshape(n, L)], d)
        seg = None
    else:  # concatenated rows (N,)
        seg = np.repeat(np.arange(n), lengths)
        a = R.grad_V_dots(d, seg)  # blockwise: no (N x K) gathers or copies
        dv = mvmf.row_dots(V, d, R.items, seg)
    return _FirstRound(a, dv, b, pd, seg, lengths, common, noise_sigma)


def _first_round_tau(fr: _FirstRound, model: UpdateModel) -> np.ndarray:
    """t^2 per client: SemiALS stationarity, else the median unrated ratio ``a_i / (2 w dv_i)``."""
    if model.update == "semials":
        n = len(fr.b)
        if fr.seg is None:
            sva = np.einsum("nl,nl->n", fr.dv, fr.a)
        else:
            sva = np.bincount(fr.seg, weights=fr.dv * fr.a, minlength=n)
        return -(sva + np.sum(fr.pd * fr.b, axis=1)) / (2.0 * model.lam)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.median(fr.a / (2.0 * model.w * fr.dv), axis=1)


def _unrated_residuals(fr: _FirstRound, t: np.ndarray, w: float, tol: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(rows that "unrated" does not fit within ``tol``: rated or a failed fit, their residuals
    |rhat - z| = |a / (2t) - w t dv| in rating units, the worst residual of the rows decided unrated)."""
    e = fr.per_row(0.5 / t) * fr.a
    e -= fr.per_row(w * t) * fr.dv
    np.abs(e, out=e)
    ef = e.reshape(-1)
    idx = np.flatnonzero(ef > tol)
    e_idx = ef[idx]
    ef[idx] = 0.0
    return idx, e_idx, float(ef.max()) if ef.size else 0.0


def _unrated_rows_clear(
    fr: _FirstRound, t: np.ndarray, idx: np.ndarray, model: UpdateModel, margin: float, floor: float
) -> bool:
    """Noisy but small residuals: the rows decided unrated must not fit the grid too."""
    _, dist = grid_distance(np.abs(fr.per_row((1.0 - model.w) * t) * fr.dv).reshape(-1), model.grid)
    dist[idx] = np.inf
    return float(dist.min()) > (margin + 1.0) * floor if dist.size else True


def shortcut_first_round(
    fv: FlatFedMVMFView, R: RoundUploads, model: UpdateModel, *, tol: float, margin: float
) -> Shortcut | None:
    """Decode every client from round ``R`` alone, or ``None`` if that round does not decide everything.

    Same formulas as the full estimator on one round (d from the grad_P rows, t^2 from
    stationarity or the median unrated ratio, the sign, the nearest hypothesis). Accepted only
    if every decoded rating and attribute lies within ``tol`` (rating units / absolute) of its
    hypothesis and every competing hypothesis (InclUnc: rated vs unrated) is at least
    ``margin`` times the largest such residual away: then further rounds cannot change a
    decision and the result equals the full estimator's (``docs/mvmf-analytic.md``).
    """
    fr = _first_round(fv, R, model)
    if fr is None:
        return None
    grid, n = model.grid, len(fr.b)
    tau = _first_round_tau(fr, model)
    if not np.all(np.isfinite(tau) & (tau > 0)):
        return None
    t = np.sqrt(tau)
    xhat = t[:, None] * fr.pd - fr.b / (2.0 * model.alpha * t[:, None])
    af, dvf = fr.a.reshape(-1), fr.dv.reshape(-1)
    idx, e_idx, s_unrated = _unrated_residuals(fr, t, model.w, tol) if model.unknown_c else (None, None, 0.0)
    # the remaining items: rated hypothesis (nearest grid value) unless "unrated" is nearer
    L = fr.a.shape[1] if fr.seg is None else 0
    every = np.repeat(np.arange(n), L) if fr.seg is None else fr.seg
    users = every if idx is None else (idx // L if fr.seg is None else fr.seg[idx])
    tr_ = t[users]
    a_r = af if idx is None else af[idx]
    dv_r = dvf if idx is None else dvf[idx]
    rh = tr_ * dv_r - a_r / (2.0 * tr_)
    unr = e_free = None
    if model.unknown_c:
        _, e_free = grid_distance(np.abs(rh), grid)
        unr = e_idx < e_free
        score = np.bincount(users, weights=np.where(unr, 0.0, rh), minlength=n)
    else:
        score = np.bincount(users, weights=rh, minlength=n)
    score += np.sum(xhat, axis=1)
    sign = np.where(score < 0, -1.0, 1.0)
    rh *= sign[users]
    xhat *= sign[:, None]
    q, e_rated = grid_distance(rh, grid)
    xq = np.round(np.clip(xhat, 0.0, 1.0))
    s_x = float(np.max(np.abs(xhat - xq))) if xhat.size else 0.0
    if unr is None:
        s_r = float(np.max(e_rated)) if e_rated.size else 0.0
        ok = s_r <= tol and s_x <= tol
        est = q
    else:
        s_r = max(s_unrated, float(np.max(np.where(unr, e_idx, e_rated))) if len(rh) else 0.0)
        floor = max(s_r, 1e-12 * model.step)
        rival = float(np.min(np.where(unr, e_free, e_idx))) if len(rh) else np.inf
        ok = s_r <= tol and s_x <= tol and rival > margin * floor
        if ok and s_r > 1e-9 * model.step:
            ok = _unrated_rows_clear(fr, t, idx, model, margin, floor)
        est = np.zeros(len(af))
        est[idx] = np.where(unr, 0.0, q)
    if not ok:
        return None
    items = [fr.common] * n if fr.seg is None and fr.common is not None else R.items
    return Shortcut(R.round, R.offsets, items, est, xq, max(s_r, s_x), fr.noise_sigma)


def _pair_scales(fv: FlatFedMVMFView, stats: list[Round], model: UpdateModel) -> list[np.ndarray]:
    """SGD ObsOnly: t^2 per round and user from every pair of consecutive rounds (the mean t of
    the pairs a round is part of; NaN where none)."""
    taus = [np.full(len(s.users), np.nan) for s in stats]
    est: list[list[np.ndarray]] = [[] for _ in stats]
    for k in range(len(stats) - 1):
        s1, s2 = stats[k], stats[k + 1]
        users, t1, t2 = pair_tau(fv, s1, s2, model)
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


def _refit_unrated(s: Round, tau: np.ndarray, model: UpdateModel, refits: int) -> np.ndarray:
    """InclUnc / sampling: decide the unrated items, refit t^2 on them (combined with the
    stationarity estimate for SemiALS by inverse variance), until the decision is stable."""
    w = model.w
    tau_stat, var_stat = stationarity_tau(s, model.lam) if model.update == "semials" else (None, None)
    prev = None
    for _ in range(max(1, int(refits))):
        t = np.sqrt(np.abs(np.nan_to_num(tau, nan=1.0))) + TINY
        rhat = t[:, None] * s.dv - s.a / (2.0 * t[:, None])
        z = (1.0 - w) * t[:, None] * s.dv
        virt = classify_virtual(rhat, z, model.grid, s.mask)
        if prev is not None and np.array_equal(virt, prev):
            break  # the decision is stable: the refit would not change t^2
        prev = virt
        tau_reg, var_reg = regression_tau(s, virt, np.full_like(s.a, w))
        if tau_stat is not None:
            wr = np.where(np.isfinite(tau_reg), 1.0 / var_reg, 0.0)
            ws = 1.0 / np.maximum(var_stat, TINY)
            tau = (ws * tau_stat + wr * np.nan_to_num(tau_reg)) / (ws + wr)
        else:
            tau = np.where(np.isfinite(tau_reg), tau_reg, tau)
    return tau


def round_scales(fv: FlatFedMVMFView, stats: list[Round], model: UpdateModel, refits: int) -> list[np.ndarray]:
    """t^2 per round (list over ``stats``) and participating user (n_k,), NaN where unknown."""
    if model.update != "semials" and not model.unknown_c:
        return _pair_scales(fv, stats, model)
    if model.update == "semials":
        taus = [stationarity_tau(s, model.lam)[0] for s in stats]
    else:
        taus = [shorth_tau(s.a, s.dv, s.mask, model.w, 0.25) for s in stats]
    if not model.unknown_c:
        return taus
    return [_refit_unrated(s, tau, model, refits) for s, tau in zip(stats, taus)]

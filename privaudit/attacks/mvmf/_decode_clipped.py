"""Decoding of the ``mvmf-analytic`` attack under a per-row clipping DP defense: rows at the
clipping bound are censored observations (:mod:`privaudit.attacks.mvmf._clipped`), summed per
(user, item) over the rounds whose item list matches the user's first round."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import logsumexp

from privaudit.attacks.mvmf._clipped import (
    Clipping,
    attribute_scale,
    attribute_scale_ml,
    censored_loglik,
    decode_with_residual_prior,
    projection_bound,
    stationarity_posterior,
)
from privaudit.attacks.mvmf._core import FlatFedMVMFView
from privaudit.attacks.mvmf._decode import KAPPAS, Layout, flat_prior
from privaudit.attacks.mvmf._rounds import Round, UpdateModel


def first_round_layout(stats: list[Round], n: int) -> Layout:
    """Per user, the item list of its first recorded round (empty without one), flat (CSR)."""
    ref: list[np.ndarray | None] = [None] * n
    for s in stats:
        for k, u in enumerate(s.users):
            if ref[u] is None:
                ref[u] = s.itemsf[s.offsets[k] : s.offsets[k + 1]]
    items = [x if x is not None else np.empty(0, np.int64) for x in ref]
    lengths = np.fromiter((len(x) for x in items), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Layout(items, lengths, offsets, np.concatenate(items) if n else np.empty(0, np.int64))


@dataclass
class ClippedEvidence:
    """Sums over the rounds in the reference layout: ``LL`` (Nr, H) censored log-likelihoods of
    every rating hypothesis, ``pred_sum``/``pred_cnt`` (Nr,) the model's predicted ratings,
    ``XL`` (n, p, 2) attribute log-likelihoods of x = 0 / 1, ``scales`` (round, signed t, whether
    the user's list is its reference) per round, and counts of rows at the clipping bound."""

    LL: np.ndarray
    pred_sum: np.ndarray
    pred_cnt: np.ndarray
    XL: np.ndarray
    scales: list = field(default_factory=list)
    clipped_rows: int = 0
    rows_total: int = 0
    clipped_attr: int = 0
    attr_total: int = 0

    def diagnostics(self, clip: Clipping) -> dict[str, Any]:
        """Share of grad_V rows and of attribute rows at the clipping bound."""
        rows, attr = self.rows_total, self.attr_total
        return {
            "clipping": clip.name,
            "clipped_row_share": self.clipped_rows / rows if rows else float("nan"),
            "clipped_attribute_share": self.clipped_attr / attr if attr else float("nan"),
        }


def _signed_scale(s: Round, tau: np.ndarray, censored_user: np.ndarray, A: np.ndarray, var: float, alpha: float):
    """(signed t (n_k,), which users have a usable scale): the attribute-view estimate where a
    user has a censored row or no scale, the sign making the predicted ratings positive."""
    tau_attr = attribute_scale_ml(s.b, s.pd, A, var, alpha, attribute_scale(s.b, s.pd, A, var, alpha))
    tau = np.where(censored_user | ~np.isfinite(tau), tau_attr, tau)
    ok = np.isfinite(tau) & (tau > 0)
    t = np.sqrt(np.where(ok, tau, 1.0))
    sign = np.where(np.bincount(s.seg, weights=t[s.seg] * s.dvf, minlength=len(t)) < 0, -1.0, 1.0)
    return t * sign, ok


def _same_list(s: Round, layout: Layout, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per user of round ``s``: its item list equals its reference list, per row: its position
    in the reference layout)."""
    seg = s.seg
    rlen = np.diff(s.offsets)
    pos = layout.offsets[s.users][seg] + (np.arange(len(seg)) - s.offsets[seg])
    samelen = (rlen == layout.lengths[s.users]) & ok
    cand = samelen[seg]
    bad = np.zeros(len(seg), dtype=bool)
    bad[cand] = s.itemsf[cand] != layout.flat[pos[cand]]
    return samelen & (np.bincount(seg, weights=bad, minlength=len(s.users)) == 0), pos


def clipped_evidence(
    stats: list[Round], taus: list[np.ndarray], clip: Clipping, layout: Layout, model: UpdateModel, values: np.ndarray
) -> ClippedEvidence:
    """Censored log-likelihoods of every round, summed in the reference ``layout``."""
    n, p = len(layout.items), stats[0].b.shape[1]
    var = max(clip.noise_var, 1e-24)
    sd = math.sqrt(var)
    conf = np.where(values == 0.0, model.w, 1.0) if model.unknown_c else np.ones(len(values))
    Nr = len(layout.flat)
    ev = ClippedEvidence(np.zeros((Nr, len(values))), np.zeros(Nr), np.zeros(Nr), np.zeros((n, p, 2)))
    for s, tau in zip(stats, taus):
        A = projection_bound(clip, s.d)
        seg, af, dvf = s.seg, s.af, s.dvf
        margin = np.minimum(2.0 * sd, 0.5 * A)  # a row this close to the bound counts as censored
        cens_v = np.abs(af) >= (A - margin)[seg]
        cens_p = np.abs(s.b) >= (A - margin)[:, None]
        ev.clipped_rows += int(cens_v.sum())
        ev.rows_total += len(af)
        ev.clipped_attr += int(cens_p.sum())
        ev.attr_total += cens_p.size
        censored_user = (np.bincount(seg, weights=cens_v, minlength=len(s.users)) + cens_p.sum(axis=1)) > 0
        t, ok = _signed_scale(s, tau, censored_user, A, var, model.alpha)
        m = t[seg] * dvf  # the model's predicted rating u.v_i per row
        ll = np.stack(
            [censored_loglik(af, -2.0 * c * t[seg] * (g - m), A[seg], var) for g, c in zip(values, conf)], axis=1
        )
        same_user, pos = _same_list(s, layout, ok)
        ev.scales.append((s, t, same_user))
        keep = same_user[seg]
        target = pos[keep]
        ev.LL[target] += ll[keep]
        ev.pred_sum[target] += m[keep]
        ev.pred_cnt[target] += 1.0
        for x in (0, 1):
            bpred = -2.0 * model.alpha * t[:, None] * (x - t[:, None] * s.pd)
            ev.XL[s.users[ok], :, x] += censored_loglik(s.b, bpred, A[:, None], var)[ok]
    return ev


def decide_clipped(
    ev: ClippedEvidence, values: np.ndarray, logprior: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(MAP hypothesis index, log posterior, diagnostics) of the reference rows with evidence,
    under the population prior ``logprior`` (Nr, H) with the likelihood inflation of the best
    marginal likelihood, or a flat prior (an EM-fitted one collapsed onto a single rating
    wherever noise biased the scale, docs/verdicts.md)."""
    have = ev.pred_cnt > 0
    pred = ev.pred_sum[have] / ev.pred_cnt[have]
    if logprior is None:
        return decode_with_residual_prior(ev.LL[have], pred, values, flat_prior)
    best = None
    n_obs = float(np.sum(ev.pred_cnt[have]))
    for kappa in KAPPAS:
        res = decode_with_residual_prior(ev.LL[have] / kappa + logprior[have], pred, values, flat_prior)
        evidence = float(np.sum(logsumexp(res[1], axis=1))) - 0.5 * math.log(kappa) * n_obs
        if best is None or evidence > best[0]:
            best = (evidence, kappa, res)
    _, kappa, (pick, post, diag) = best
    diag["likelihood_inflation"] = kappa
    return pick, post, diag


def stationarity_ratings(
    fv: FlatFedMVMFView, ev: ClippedEvidence, layout: Layout, attrs: np.ndarray, model: UpdateModel
) -> dict[str, Any]:
    """SemiALS ObsOnly under clipping: add the ratings' Gaussian posterior from the user's
    stationarity ``V_S^T r = (V_S^T V_S + lam I) u + alpha P^T (P u - x)`` (u = t d, x decoded),
    K equations per recorded round, to the per-item log-likelihoods ``ev.LL`` (in place)."""
    ref, lengths, grid = layout.items, layout.lengths, model.grid
    n = len(ref)
    K = next(iter(fv.V.values())).shape[1]
    L = int(lengths.max()) if n else 0
    if L == 0:
        return {}
    mask = np.arange(L)[None, :] < lengths[:, None]
    items = np.zeros((n, L), dtype=np.int64)
    items[mask] = np.concatenate(ref)
    E = K * len(ev.scales)
    M = np.zeros((n, E, L))
    y = np.zeros((n, E))
    for j, (s, t, same) in enumerate(ev.scales):
        users = s.users[same]
        u = t[same, None] * s.d[same]
        V, P = fv.V[s.round], fv.P[s.round]
        Vs = V[items[users]] * mask[users][:, :, None]  # (nu, L, K)
        M[users, j * K : (j + 1) * K, :] = Vs.transpose(0, 2, 1)
        VtVu = np.einsum("nlk,nl->nk", Vs, np.einsum("nlk,nk->nl", Vs, u))
        y[users, j * K : (j + 1) * K] = VtVu + model.lam * u + model.alpha * ((u @ P.T - attrs[users]) @ P)
    span = float(grid[-1] - grid[0]) or 1.0
    mus = tuple(float(v) for v in np.linspace(grid[0], grid[-1], 9))
    scale_y = float(np.sqrt(np.mean(y[y != 0] ** 2))) if np.any(y != 0) else 1.0
    mean, var, diag = stationarity_posterior(
        M, y, mus, (span / 4.0, span / 2.0), tuple(scale_y * f for f in (0.003, 0.01, 0.03, 0.1, 0.3, 1.0))
    )
    flat_mean, flat_var = mean[mask], var[mask]
    ev.LL += -0.5 * (grid[None, :] - flat_mean[:, None]) ** 2 / flat_var[:, None]
    return diag

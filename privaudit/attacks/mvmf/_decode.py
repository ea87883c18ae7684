"""Decoding of the ``mvmf-analytic`` attack: the rounds' estimates combined per (user, item) by
inverse variance, then Bayes decisions on the rating grid and the attribute dummies under a
population or EM-fitted prior, with the likelihood inflation chosen by marginal likelihood."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from scipy.special import logsumexp

from privaudit.attacks.mvmf._core import FlatFedMVMFView
from privaudit.attacks.mvmf._rounds import TINY, Round, classify_virtual


def em_prior(loglik: np.ndarray, iters: int = 30, max_rows: int = 200_000) -> np.ndarray:
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
        post /= np.maximum(post.sum(axis=1, keepdims=True), TINY)
        new = (counts + post.sum(axis=0)) / N
        new = np.maximum(new, 1e-6)
        new /= new.sum()
        if np.max(np.abs(new - pi)) < 1e-6:
            pi = new
            break
        pi = new
    return pi


def flat_prior(loglik: np.ndarray) -> np.ndarray:
    """The uniform prior over the hypotheses (columns) of ``loglik`` (N x H)."""
    return np.full(loglik.shape[1], 1.0 / loglik.shape[1])


def attribute_groups(names: Any, p: int) -> list[np.ndarray]:
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


@dataclass(frozen=True)
class DecodeSettings:
    """What decoding needs besides the rounds.

    unknown_c : bool      InclUnc or sampling: every item is "unrated" (0, weight w) or a grid value
    w : float             weight of the unrated / sampled items
    alpha : float         weight of the attribute view
    grid : numpy.ndarray  rating values (rating_min..rating_max by rating_step)
    sigma2 : float        noise variance per coordinate (pooled estimate)
    prior : bool          MAP with an EM-fitted prior (else plain clip-and-round, eq. 43)
    """

    unknown_c: bool
    w: float
    alpha: float
    grid: np.ndarray
    sigma2: float
    prior: bool

    @property
    def values(self) -> np.ndarray:
        """Rating hypotheses: the grid, with "unrated" (0) first when c is unknown."""
        return np.concatenate([[0.0], self.grid]) if self.unknown_c else self.grid


@dataclass
class Layout:
    """Reference item list per user, flat (CSR-like): user u's items at ``offsets[u]:offsets[u + 1]``."""

    items: list[np.ndarray]
    lengths: np.ndarray
    offsets: np.ndarray
    flat: np.ndarray


@dataclass
class Evidence:
    """Inverse-variance sums over rounds: per reference item (Nr,) S0 = sum W, S1 = sum W rhat,
    S2 = sum W rhat^2, SU = sum W (rhat - z)^2 (the "unrated" residual), SC = number of rounds;
    per user and attribute (n, p) X0 = sum W', X1 = sum W' xhat, X2 = sum W' xhat^2; per user
    (n,) XC = number of rounds."""

    S0: np.ndarray
    S1: np.ndarray
    S2: np.ndarray
    SU: np.ndarray
    SC: np.ndarray
    X0: np.ndarray
    X1: np.ndarray
    X2: np.ndarray
    XC: np.ndarray


def reference_layout(fv: FlatFedMVMFView, stats: list[Round], taus: list[np.ndarray], n: int) -> Layout:
    """Per user, the item list of its first round with a known scale (else of its first upload)."""
    ref_items: list[np.ndarray | None] = [None] * n
    for s, tau in zip(stats, taus):
        for j in np.flatnonzero(np.isfinite(tau)):
            u = s.users[j]
            if ref_items[u] is None:
                ref_items[u] = s.itemsf[s.offsets[j] : s.offsets[j + 1]]
    for R in fv.rounds:  # users without a known scale: the items of their first upload
        for k in np.flatnonzero([ref_items[u] is None for u in R.users]):
            ref_items[R.users[k]] = R.items[R.offsets[k] : R.offsets[k + 1]]
    lengths = np.fromiter((len(x) for x in ref_items), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(ref_items) if n else np.empty(0, np.int64)
    return Layout(ref_items, lengths, offsets, flat)


def signed_estimates(s: Round, tau: np.ndarray, st: DecodeSettings) -> dict[str, Any] | None:
    """One round's per-row rating estimates ``rhat`` and per-user attribute estimates ``xhat`` of the
    users with a known scale, with the sign of t that makes ratings (of items that look rated) and
    attribute dummies positive; rows renumbered to those users (``seg``, ``off``)."""
    ok = np.isfinite(tau) & (tau != 0)
    if not ok.any():
        return None
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
    xhat = t[:, None] * pd - b / (2.0 * st.alpha * t[:, None])
    if st.unknown_c:
        looks_rated = ~classify_virtual(rhat, (1.0 - st.w) * ts * dvf, st.grid, True)
        score = np.bincount(seg, weights=np.where(looks_rated, rhat, 0.0), minlength=nk)
    else:
        score = np.bincount(seg, weights=rhat, minlength=nk)
    score += np.sum(xhat, axis=1)
    sign = np.where(score < 0, -1.0, 1.0)
    t = t * sign
    rhat *= np.repeat(sign, rlen)
    xhat *= sign[:, None]
    return {
        "t": t,
        "ts": np.repeat(t, rlen),
        "users": users,
        "seg": seg,
        "off": off,
        "rlen": rlen,
        "dvf": dvf,
        "itf": itf,
        "rhat": rhat,
        "xhat": xhat,
    }


def accumulate(layout: Layout, stats: list[Round], taus: list[np.ndarray], st: DecodeSettings) -> Evidence:
    """Inverse-variance sums of every round's estimates in the reference layout (:class:`Evidence`)."""
    n, Nr = len(layout.items), len(layout.flat)
    p = stats[0].b.shape[1]
    ev = Evidence(*(np.zeros(Nr) for _ in range(5)), *(np.zeros((n, p)) for _ in range(3)), np.zeros(n))
    lookup = None  # lazily built (user, item) -> position table for rounds with other item lists
    for s, tau in zip(stats, taus):
        r = signed_estimates(s, tau, st)
        if r is None:
            continue
        t, ts, users, seg, off, rlen = r["t"], r["ts"], r["users"], r["seg"], r["off"], r["rlen"]
        dvf, itf, rhat, xhat = r["dvf"], r["itf"], r["rhat"], r["xhat"]
        nk = len(t)
        Wr = 4.0 * t**2 / st.sigma2  # 1 / var(rhat)
        ev.X0[users] += (st.alpha**2 * Wr)[:, None]
        ev.X1[users] += (st.alpha**2 * Wr)[:, None] * xhat
        ev.X2[users] += (st.alpha**2 * Wr)[:, None] * xhat**2
        ev.XC[users] += 1.0
        # where does each row go in the reference layout? same item list as the reference: by position
        if nk == n and len(itf) == Nr and np.array_equal(users, np.arange(n)) and np.array_equal(itf, layout.flat):
            target, rows_same, same_all = slice(None), slice(None), True
        else:
            same_all = False
            pos = layout.offsets[users][seg] + (np.arange(len(seg)) - off[seg])
            samelen = rlen == layout.lengths[users]
            cand = samelen[seg]
            bad = np.zeros(len(seg), dtype=bool)
            bad[cand] = itf[cand] != layout.flat[pos[cand]]
            same = samelen & (np.bincount(seg, weights=bad, minlength=nk) == 0)
            rows_same = same[seg]
            target = pos[rows_same]
        Wrow = np.repeat(Wr, rlen)
        wr = Wrow if same_all else Wrow[rows_same]
        rh = rhat if same_all else rhat[rows_same]
        ev.S0[target] += wr
        ev.SC[target] += 1.0
        w1 = wr * rh
        ev.S1[target] += w1
        ev.S2[target] += w1 * rh
        if st.unknown_c:
            e = rhat - (1.0 - st.w) * ts * dvf
            np.square(e, out=e)
            e *= Wrow
            ev.SU[target] += e if same_all else e[rows_same]
        if not same_all and not rows_same.all():  # other item lists: align through a sorted (user, item) key table
            if lookup is None:
                big = np.int64(max(int(layout.flat.max()), max(int(x.itemsf.max()) for x in stats)) + 2)
                keys = layout.flat + np.repeat(np.arange(n), layout.lengths) * big
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
            ev.S0[tgt] += wr2
            ev.SC[tgt] += 1.0
            ev.S1[tgt] += wr2 * rh2
            ev.S2[tgt] += wr2 * rh2**2
            if st.unknown_c:
                ev.SU[tgt] += wr2 * (rh2 - ((1.0 - st.w) * ts * dvf)[sel][hit]) ** 2
    return ev


#: likelihood inflation factors kappa tried (variance of every estimate times kappa): the
#: estimated noise misses the error of the fitted direction and scale, which grows with the noise
KAPPAS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0)


EVIDENCE_ROWS = 200_000  # rows a marginal likelihood is evaluated on (an even subsample beyond)


def calibrated(ll: np.ndarray, counts: np.ndarray, logprior: np.ndarray | None) -> tuple[float, np.ndarray, np.ndarray]:
    """Inflation kappa of the Gaussian likelihoods ``ll`` (N, H; sums over ``counts`` (N,)
    observations) chosen by marginal likelihood, with the log prior ``logprior`` (N, H) or, when
    None, a prior over the hypotheses fitted by EM for each kappa.

    Returns (kappa, log prior used (N, H) or (1, H), log posterior up to a per-row constant (N, H)).
    Under ``N(h, kappa var)`` an observation's log density is ``ll / kappa - log(kappa) / 2`` up
    to a constant, so the evidence is ``sum_rows logsumexp_h(ll / kappa + log pi) - log(kappa) / 2
    * sum(counts)``.
    """
    step = int(math.ceil(len(ll) / EVIDENCE_ROWS)) if len(ll) else 1
    sub = slice(None, None, step)
    ll_s, n_obs = ll[sub], float(np.sum(counts[sub]))
    best = None
    for kappa in KAPPAS:
        scaled = ll_s / kappa
        if logprior is None:
            lp = np.log(em_prior(scaled - scaled.max(axis=1, keepdims=True), max_rows=len(scaled) + 1))[None, :]
        else:
            lp = logprior[sub]
        ev = float(np.sum(logsumexp(scaled + lp, axis=1))) - 0.5 * math.log(kappa) * n_obs
        if best is None or ev > best[0]:
            best = (ev, kappa, lp)
    _, kappa, lp = best
    if logprior is not None:
        lp = logprior
    return kappa, lp, ll / kappa + lp


def rating_loglik(ev: Evidence, st: DecodeSettings, have: np.ndarray, beta: np.ndarray | float = 1.0) -> np.ndarray:
    """Gaussian log-likelihood (up to a constant) of every hypothesis per item with evidence
    (N_have, H); ``beta`` (scalar or (N_have,)) scales the rated hypotheses' means (a joint clip
    multiplies a user's uploads by s, which scales its fitted t by sqrt(s) and every estimate by
    beta = sqrt(s); the "unrated" mean (1 - w) t dv scales with t and is unchanged)."""
    s0, s1, s2 = ev.S0[have], ev.S1[have], ev.S2[have]
    ll = np.empty((len(s0), len(st.values)))
    for h, g in enumerate(st.values):
        if st.unknown_c and h == 0:
            ll[:, h] = -0.5 * ev.SU[have]
        else:
            A = beta * g
            ll[:, h] = -0.5 * (s2 - 2.0 * A * s1 + A * A * s0)
    return ll


def attribute_loglik(
    names: Any, ev: Evidence, have_x: np.ndarray, beta: np.ndarray | None = None
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per dummy block of ``names``: (columns, log-likelihood (n_have, g + 1) of "none" and each
    category for the users with evidence, ll(1) - ll(0) per column (n_have, g)); ``beta`` (n,)
    scales the means as in :func:`rating_loglik`."""
    blocks = []
    for cols in attribute_groups(names, ev.X0.shape[1]):
        X0, X1, X2 = ev.X0[have_x][:, cols], ev.X1[have_x][:, cols], ev.X2[have_x][:, cols]
        bt = 1.0 if beta is None else beta[have_x][:, None]
        delta = bt * X1 - 0.5 * bt * bt * X0
        base = -0.5 * X2.sum(axis=1, keepdims=True)
        blocks.append((cols, np.concatenate([base, base + delta], axis=1), delta))
    return blocks


#: joint-clip scale factors beta = sqrt(s) tried per user, and the inflations tried with them
CLIP_BETAS = tuple(float(b) for b in np.geomspace(1e-3, 1.0, 31))


CLIP_KAPPAS = (1.0, 2.0, 4.0, 8.0, 16.0, 64.0)


#: clip_scales results kept in the cache its caller passes (by the digest of their inputs, the
#: last few): mvmf-analytic and the mvmf-analytic inside mvmf-aggregate decode the same evidence
#: of one run (unaggregated uploads) and pass the store of that transcript
CLIP_KEPT = 4


#: inputs above this many bytes are not digested for the caches below (hashing them costs more
#: than the repeat it saves: the caches serve audits, which attack many small runs twice)
DIGEST_MAX_BYTES = 256 * 2**20


def inputs_digest(*parts: Any) -> bytes:
    """A digest of arrays (dtype, shape and bytes) and other values (their repr)."""
    h = hashlib.blake2b(digest_size=20)
    for part in parts:
        if isinstance(part, np.ndarray):
            a = np.ascontiguousarray(part)
            h.update(repr((a.dtype.str, a.shape)).encode())
            h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
        else:
            h.update(repr(part).encode())
        h.update(b"\x00")
    return h.digest()


def logsumexp_rows(a: np.ndarray) -> np.ndarray:
    """``scipy.special.logsumexp(a, axis=1)`` of a finite real 2-D array (N, H) -> (N,), by the
    same operations in the same order (maximum, its ties counted and left out of the shifted sum,
    ``log1p(s / m) + log(m) + max``), without scipy's generic-array overhead; falls back to scipy
    when ``a`` is empty or not finite.

    Rows of fewer than 8 values are reduced column by column (N-long operations instead of N
    short reductions): the maximum and the tie count exactly, the sum left to right, which is
    numpy's own order for rows that short (bit-identical; tested against scipy)."""
    if a.ndim != 2 or a.size == 0 or not np.isfinite(a).all():
        return logsumexp(a, axis=1)
    H = a.shape[1]
    if H >= 8:
        a_max = np.max(a, axis=1, keepdims=True)
    else:
        a_max = a[:, :1].copy()
        for h in range(1, H):
            np.maximum(a_max, a[:, h : h + 1], out=a_max)
    keep = a != a_max
    e = np.exp(a - a_max)
    e *= keep  # the maxima leave the sum (scipy sets them to -inf: exp gives 0)
    if H >= 8:
        m = np.sum(~keep, axis=1, keepdims=True, dtype=a.dtype)
        s = np.sum(e, axis=1, keepdims=True, dtype=e.dtype)
    else:
        m = np.full((len(a), 1), float(H))
        s = e[:, :1].copy()
        for h in range(H):
            m -= keep[:, h : h + 1]
            if h:
                s += e[:, h : h + 1]
    s = np.where(s == 0, s, s / m)
    return (np.log1p(s) + np.log(m) + a_max)[:, 0]


def clip_scales(
    ev: Evidence,
    st: DecodeSettings,
    seg: np.ndarray,
    joint: np.ndarray,
    names: Any,
    shares: np.ndarray | None,
    cache: dict[Any, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`clip_scales_uncached`, computed once for equal inputs kept in ``cache`` (a dict the
    caller owns, e.g. its transcript's :meth:`~privaudit.transcript.Transcript.derived` store; a
    digest of every argument -> the last :data:`CLIP_KEPT` results, returned as copies). Without
    a cache, or for inputs over :data:`DIGEST_MAX_BYTES`, computed every time."""
    arrays = [getattr(ev, f.name) for f in fields(ev)] + [seg, joint, shares]
    if cache is None or sum(a.nbytes for a in arrays if isinstance(a, np.ndarray)) > DIGEST_MAX_BYTES:
        return clip_scales_uncached(ev, st, seg, joint, names, shares)
    key = inputs_digest(
        *(getattr(ev, f.name) for f in fields(ev)),
        *(getattr(st, f.name) for f in fields(st)),
        seg,
        joint,
        names,
        shares,
    )
    out = cache.pop(key, None)
    if out is None:
        out = clip_scales_uncached(ev, st, seg, joint, names, shares)
    cache[key] = out  # most recently used last
    while len(cache) > CLIP_KEPT:
        del cache[next(iter(cache))]
    return out[0].copy(), out[1].copy()


def clip_scales_uncached(
    ev: Evidence,
    st: DecodeSettings,
    seg: np.ndarray,
    joint: np.ndarray,
    names: Any,
    shares: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Under a joint clip of each client's uploads (``clip_per`` user/upload): per user (n,), the
    scale factor beta (``CLIP_BETAS``) and likelihood inflation (``CLIP_KAPPAS``) with the
    largest marginal likelihood of its ratings (prior ``joint`` (Nr, H) over its reference rows,
    ``seg`` their user) and attribute blocks (prior from ``shares``): the clip factor is the
    user's own (its upload's norm before clipping is not public)."""
    n = ev.X0.shape[0]
    have = ev.S0 > 0
    lp, sh = joint[have], seg[have]
    counts = np.bincount(sh, weights=ev.SC[have], minlength=n)
    have_x = ev.X0[:, 0] > 0 if ev.X0.shape[1] else np.zeros(n, bool)
    groups = attribute_groups(names, ev.X0.shape[1])
    block_lp = [block_log_prior(shares[have_x][:, cols]) for cols in groups] if shares is not None else []
    best = np.full(n, -np.inf)
    beta_u, kappa_u = np.ones(n), np.ones(n)
    for beta in CLIP_BETAS:
        ll = rating_loglik(ev, st, have, beta)
        blocks = attribute_loglik(names, ev, have_x, np.full(n, beta)) if block_lp else []
        for kappa in CLIP_KAPPAS:
            E = np.bincount(sh, weights=logsumexp_rows(ll / kappa + lp), minlength=n)
            E -= 0.5 * math.log(kappa) * counts
            for (cols, llx, _), lpx in zip(blocks, block_lp):
                if len(llx):
                    E[have_x] += logsumexp_rows(llx / kappa + lpx)
                    E[have_x] -= 0.5 * math.log(kappa) * len(cols) * ev.XC[have_x]
            better = E > best
            best[better], beta_u[better], kappa_u[better] = E[better], beta, kappa
    return beta_u, kappa_u


def decode_ratings(
    ev: Evidence,
    st: DecodeSettings,
    prior: dict[str, np.ndarray] | None = None,
    scales: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], float]:
    """Bayes decisions per reference item under Gaussian likelihoods (hypotheses: grid values, plus
    "unrated" = 0 when c is unknown) inflated by a factor chosen by marginal likelihood.

    Priors: ``prior`` (the population's, :meth:`MVMFAnalytic._population_rows`: ``joint`` (Nr, H)
    log prior over the hypotheses; with c unknown also ``rated`` (Nr, H - 1) over the grid given
    rated and ``rated_logit`` (Nr,)) or, without it, one fitted by EM. The rating is the MAP
    hypothesis; with c unknown the rated/unrated decision is posterior P(rated) > 1/2 and the
    rating given rated the MAP grid value (each metric's Bayes decision). Items without evidence
    get the prior's decisions.

    With ``prior``, ``scales`` (beta, kappa per reference row, :func:`clip_scales`) replaces the
    one inflation for all rows.

    Returns (ratings (Nr,), mean prior over the hypotheses, extras: ``rated_score`` (posterior
    log-odds of rated), ``rated``, ``rated_ratings`` (Nr,) when c is unknown, (median) kappa).
    """
    have = ev.S0 > 0
    values = st.values
    H = len(values)
    if not st.prior:  # plain eq. 43: clip the inverse-variance average of the rounds' estimates and round
        est = np.full(len(ev.S0), values[H // 2])
        est[have] = ev.S1[have] / ev.S0[have]
        return est, np.full(H, 1.0 / H), {}, 1.0
    joint = prior["joint"] if prior is not None else None
    if scales is not None and joint is not None:
        ll = rating_loglik(ev, st, have, scales[0][have]) / scales[1][have][:, None]
        kappa, lp = float(np.median(scales[1])) if len(scales[1]) else 1.0, joint[have]
        post = ll + lp
    else:
        ll = rating_loglik(ev, st, have)
        kappa, lp, post = calibrated(ll, ev.SC[have], joint[have] if joint is not None else None)
        ll /= kappa
    pi = np.exp(lp).mean(axis=0)
    if joint is not None:
        guess = values[np.argmax(joint, axis=1)]
    else:
        guess = np.full(len(ev.S0), values[int(np.argmax(pi))])
    guess[have] = values[np.argmax(post, axis=1)]
    extras: dict[str, np.ndarray] = {}
    if st.unknown_c:
        if prior is not None:
            cond_all = prior["rated"].copy()
            cond_all[have] += ll[:, 1:]
            score = prior["rated_logit"] + logsumexp(cond_all, axis=1)
            score[have] -= ll[:, 0]
        else:
            cond_all = np.tile(lp[:, 1:], (len(ev.S0), 1)) if len(lp) == 1 else lp[:, 1:].copy()
            cond_all[have] = post[:, 1:]
            score = logsumexp(cond_all, axis=1) - (lp[0, 0] if len(lp) == 1 else lp[:, 0])
            score[have] = logsumexp(post[:, 1:], axis=1) - post[:, 0]
        extras = {
            "rated_score": score,
            "rated": score > 0,
            "rated_ratings": values[1 + np.argmax(cond_all, axis=1)],
        }
    return guess, pi / pi.sum(), extras, kappa


def block_log_prior(shares: np.ndarray) -> np.ndarray:
    """Log prior (n, g + 1) over "none" and the g categories of a dummy block from each user's
    population share of every category (n, g)."""
    none = np.maximum(1.0 - shares.sum(axis=1, keepdims=True), 1e-3)
    pr = np.concatenate([none, np.maximum(shares, 1e-6)], axis=1)
    return np.log(pr / pr.sum(axis=1, keepdims=True))


def decode_attributes(
    names: Any,
    ev: Evidence,
    st: DecodeSettings,
    shares: np.ndarray | None = None,
    scales: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Attribute dummies (n, p): per one-hot block of ``names``, hypothesis "none" or one category
    (ll(x) = -(X2 - 2 x X1 + x X0) / 2), MAP under the population's shares ``shares`` (n, p) or,
    without them, an EM prior per block, with one likelihood inflation for every block chosen by
    marginal likelihood (with ``shares``, ``scales``: beta and kappa per user, :func:`clip_scales`);
    and which users had evidence, and the (median) inflation."""
    n, p = ev.X0.shape
    have_x = ev.X0[:, 0] > 0 if p else np.zeros(n, bool)
    attrs = np.zeros((n, p))
    if not st.prior:  # plain eq. 43: clip the averaged estimate and round
        attrs = ev.X1 / np.maximum(ev.X0, TINY)
        return attrs, have_x, 1.0
    if scales is not None and shares is not None:
        k_have = scales[1][have_x][:, None]
        for cols, ll, delta in attribute_loglik(names, ev, have_x, scales[0]):
            full_lp = block_log_prior(shares[:, cols])
            block = np.zeros((n, len(cols)))
            if len(ll):
                block[have_x] = dummy_decisions(ll / k_have + full_lp[have_x])
                sure = np.abs(delta / k_have) > 50.0  # as below
                block[have_x] = np.where(sure, (delta > 0).astype(float), block[have_x])
            if (~have_x).any():
                block[~have_x] = dummy_decisions(full_lp[~have_x])
            attrs[:, cols] = block
        return attrs, have_x, float(np.median(scales[1])) if n else 1.0
    blocks = [(cols, ll, ev.X1[:, cols] - 0.5 * ev.X0[:, cols]) for cols, ll, _ in attribute_loglik(names, ev, have_x)]
    best = None
    for kappa in KAPPAS if p else (1.0,):
        total = 0.0
        priors = []
        for cols, ll, _ in blocks:
            scaled = ll / kappa
            if shares is not None:
                lp = block_log_prior(shares[have_x][:, cols])
            else:
                lp = np.log(em_prior(scaled - scaled.max(axis=1, keepdims=True)))[None, :]
            priors.append(lp)
            total += float(np.sum(logsumexp(scaled + lp, axis=1))) if len(ll) else 0.0
            total -= 0.5 * math.log(kappa) * len(cols) * float(np.sum(ev.XC[have_x]))
        if best is None or total > best[0]:
            best = (total, kappa, priors)
    _, kappa, priors = best
    for (cols, ll, delta), lp in zip(blocks, priors):
        full_lp = block_log_prior(shares[:, cols]) if shares is not None else np.broadcast_to(lp, (n, lp.shape[1]))
        block = np.zeros((n, len(cols)))
        if len(ll):
            block[have_x] = dummy_decisions(ll / kappa + full_lp[have_x])
            # a column decided with near certainty on its own keeps that decision (keeps
            # non-exclusive blocks exact without noise)
            sure = np.abs(delta[have_x] / kappa) > 50.0
            block[have_x] = np.where(sure, (delta[have_x] > 0).astype(float), block[have_x])
        if (~have_x).any():
            block[~have_x] = dummy_decisions(full_lp[~have_x])
        attrs[:, cols] = block
    return attrs, have_x, kappa


def dummy_decisions(logpost: np.ndarray) -> np.ndarray:
    """Dummies (n, g) from a block's log posterior (n, g + 1) over "none" and g categories: 1 where
    the category's posterior probability exceeds 1/2 (the decision that maximizes the expected
    number of correctly guessed dummies; without noise, the MAP category)."""
    post = np.exp(logpost - logsumexp(logpost, axis=1, keepdims=True))
    return (post[:, 1:] > 0.5).astype(float)


def decode_attribute_blocks(
    names: Any, XL: np.ndarray, shares: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """MAP attribute dummies (n, p) from summed log-likelihoods ``XL`` (n, p, 2) of x = 0 / 1,
    one-hot blocks of ``names`` decoded jointly under the population's shares ``shares`` (n, p)
    or, without them, an EM prior per block; and which users had data (n,)."""
    n, p = XL.shape[:2]
    delta = XL[:, :, 1] - XL[:, :, 0]
    have_x = np.abs(XL).sum(axis=(1, 2)) > 0
    attrs = np.zeros((n, p))
    for cols in attribute_groups(names, p):
        sc = np.concatenate([np.zeros((n, 1)), delta[:, cols]], axis=1)
        if shares is not None:
            lp = block_log_prior(shares[:, cols])
        else:
            lp = np.broadcast_to(np.log(em_prior(sc[have_x])), sc.shape)
        block = dummy_decisions(sc + lp)
        if (~have_x).any():
            block[~have_x] = dummy_decisions(np.array(lp[~have_x]))
        attrs[:, cols] = block
    return attrs, have_x

"""Per-round statistics of the ``mvmf-analytic`` attack: the rank-1 fit of every client's FedMVMF
uploads in one round (direction d of its latent vector and the projections a = grad_V.d,
b = grad_P.d), and the public model settings the estimators read."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from privaudit.attacks.mvmf._core import FlatFedMVMFView, RoundUploads

CHUNK_ELEMENTS = 1 << 23  # padded (users x items x K) elements processed at once
TINY = 1e-300


@dataclass(frozen=True)
class UpdateModel:
    """The public FedMVMF settings the scale estimators and decoders read.

    K : int               latent dimension
    update : str          "semials" or "sgd"
    unknown_c : bool      InclUnc or sampling: every uploaded item is "unrated" (weight w) or rated
    w : float             weight of the unrated / sampled items
    eta, alpha, lam : float  learning rate, attribute-view weight, L2 penalty
    grid : numpy.ndarray  rating values (rating_min..rating_max by rating_step)
    """

    K: int
    update: str
    unknown_c: bool
    w: float
    eta: float
    alpha: float
    lam: float
    grid: np.ndarray

    @property
    def step(self) -> float:
        """Spacing of the rating grid."""
        return float(self.grid[1] - self.grid[0]) if len(self.grid) > 1 else 1.0


@dataclass
class Round:
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


def buckets(lengths: np.ndarray, K: int, ratio: float = 1.3) -> list[np.ndarray]:
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
        per = max(1, CHUNK_ELEMENTS // max(1, L * K))
        for s1 in range(s0, e0, per):
            groups.append(order[s1 : min(e0, s1 + per)])
    return groups


def top_eigvec(G: np.ndarray, iters: int = 8, tol: float = 1e-13) -> tuple[np.ndarray, np.ndarray]:
    """Top eigenpair of a stack of symmetric PSD matrices G (n, K, K): (vectors (n, K), values (n,)).

    Batched power iteration from each matrix's column of largest diagonal (exact after one step
    when G has rank one, the noise-free case), accepted where the eigenvector error bound
    ``|G x - lambda x| / (2 lambda - trace G)`` (the gap to the second eigenvalue is at least
    ``lambda_1 - (trace - lambda_1)``) is below ``tol``; the remaining matrices (noisy uploads
    with a small spectral gap) go to ``numpy.linalg.eigh``. Same vectors as ``eigh`` up to sign
    and floating tolerance; most of the cost is saved in the noise-free rank-1 case.
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
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), TINY)
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


def segment_rows(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated row ranges ``starts[k]:starts[k] + lengths[k]`` and the segment id of each row."""
    seg = np.repeat(np.arange(len(lengths)), lengths)
    first = np.cumsum(lengths) - lengths
    return starts[seg] + (np.arange(len(seg)) - first[seg]), seg


def segment_sum(X: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Row sums of ``X`` (N x K) per segment ``offsets[k]:offsets[k + 1]`` (empty segments give 0)."""
    out = np.zeros((len(offsets) - 1,) + X.shape[1:])
    nz = np.diff(offsets) > 0
    if nz.any():
        out[nz] = np.add.reduceat(X, offsets[:-1][nz], axis=0)
    return out


def round_stats(fv: FlatFedMVMFView, R: RoundUploads, K: int) -> Round | None:
    """Rank-1 fit of every participating client's uploads of round ``R.round``.

    The Gram matrices ``G_u = GV_u^T GV_u + GP_u^T GP_u`` (n, K, K) come from batched matmuls:
    on the concatenated uploads reshaped to (n, L, K) without a copy when every client sent the
    same number of rows (InclUnc), else per bucket of similar lengths padded from the
    concatenated rows. ``a = grad_V.d`` and ``dv = V_i.d`` are computed on the concatenated rows
    (one gather of d per row) and scattered into the padded (n, L) layout of :class:`Round`.
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
        d, top = top_eigvec(G)
        resid = np.maximum(np.trace(G, axis1=1, axis2=2) - top, 0.0)
    else:
        # Without noise every row is a multiple of u, so the grad_P rows alone give d: take their
        # top direction and check it against the full Gram matrix G = GV^T GV + GP^T GP without
        # forming G, from one product with the concatenated rows: G d = GV^T (GV d) + GP^T GP d.
        # Users that fail the check (noise) get G from padded buckets and the generic eigen-solve.
        seg = np.repeat(np.arange(n), lengths)
        d, _ = top_eigvec(G)
        drow = d[seg]
        af = np.einsum("nk,nk->n", R.grad_V, drow)
        Gd = segment_sum(R.grad_V * af[:, None], R.offsets) + np.einsum("nij,nj->ni", G, d)
        top = np.einsum("ni,ni->n", d, Gd)
        tr = np.bincount(seg, weights=np.einsum("nk,nk->n", R.grad_V, R.grad_V), minlength=n)
        tr += np.trace(G, axis1=1, axis2=2)
        err = np.linalg.norm(Gd - top[:, None] * d, axis=1)
        gap = 2.0 * top - tr
        bad = ~(((gap > 0) & (err <= 1e-13 * gap)) | (tr <= 0))
        if bad.any():
            sub = np.flatnonzero(bad)
            for idx in buckets(lengths[sub], K):
                idx = sub[idx]
                Lg = int(lengths[idx].max())
                m_ = np.arange(Lg)[None, :] < lengths[idx][:, None]
                buf = np.zeros((len(idx), Lg, K))
                buf[m_] = R.grad_V[(R.offsets[idx][:, None] + np.arange(Lg)[None, :])[m_]]
                G[idx] += np.matmul(buf.transpose(0, 2, 1), buf)
            d[sub], top[sub] = top_eigvec(G[sub])
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
    return Round(R.round, R.users, d, b, pd, resid, rows, R.offsets, seg, R.items, af, dvf)


def grid_distance(x: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def classify_virtual(rhat: np.ndarray, z: np.ndarray, grid: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sign-free nearest-hypothesis decision: True where 'unrated' (rhat ~ z) beats 'rated on the grid'."""
    # the grid is positive, so the better sign is that of |rhat|
    _, dist = grid_distance(np.abs(rhat), grid)
    return (np.abs(rhat - z) < dist) & mask

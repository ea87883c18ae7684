"""Collaborative NMF with biases (CNMF) for missing-value completion, FedSPLIT paper §3.2.

The model (eq. 7) predicts the rating of user ``i`` for item ``j`` as

    X̂_ij = W_i: H_:j + b_W[i] + b_H[j] + mu,      W >= 0 (n x k), H >= 0 (k x m)

and is fitted on the observed (non-zero) entries only by minimising eq. 9,

    sum_{(i,j) observed} (X_ij - X̂_ij)^2 + alpha ||W||^2 + beta ||H||^2 + gamma ||b_W||^2 + delta ||b_H||^2,

with, per iteration (eqs. 10-13, the paper's adaptation of Surprise's ``NMF(biased=True)``):

- b_W <- b_W + s_W * sum_j (err_ij - gamma b_W[i])               (eq. 10, gradient step)
- b_H <- b_H + s_H * sum_i (err_ij - delta b_H[j])               (eq. 11, gradient step)
- W   <- W * (X H^T) / (X̂ H^T + alpha n_i W)                    (eq. 12, multiplicative)
- H   <- H * (W^T X) / (W^T X̂ + beta n_j H)                     (eq. 13, multiplicative)

followed by the non-negative projection ``W, H <- max(W, 0), max(H, 0)``; ``err = X - X̂``
and X̂ are evaluated on the observed entries only. ``mu`` is the mean rating (eq. 6) or, in
FedSPLIT, the global mean mu^Global received from the server (eq. 14).

Vectorisation: the whole fit works on the CSR arrays of the observed ratings; X̂ on the
observed entries is a row/column gather (``einsum('nk,nk->n', W[rows], H.T[cols])``), the
products X H^T, X̂ H^T, X^T W, X̂^T W are sparse-dense products with the same sparsity.
Several independent CNMFs (FedSPLIT's groups) are fitted in one pass by :func:`block_columns`,
which gives every group its own copy of the item columns, so that users of different groups
never share an item factor or bias; per-row ranks (``row_rank``/``col_rank``) let each group
use its own latent dimension k^g (inactive components start at 0 and stay 0 under the
multiplicative updates).

Departures from the paper's equations (all as in Surprise's ``NMF``, whose code the paper
modified, so that matched hyperparameters mean the same thing):

- The regularisation of W and H is scaled by the number of ratings of the row/column
  (``alpha n_i W``, ``beta n_j H``), as in Surprise; eqs. 12-13 print ``alpha W``/``beta H``.
- The bias steps of eqs. 10-11 are batch sums; Surprise takes one SGD step per rating, i.e.
  n_i sequential steps of size ``eta`` per epoch. A literal batch step ``eta * sum_j`` diverges
  on rows with more than ~2/eta ratings (400 for eta = 0.005), so the step size per row is the
  one that moves b as far as n_i sequential SGD steps would with the residual held fixed:
  ``s_i = (1 - (1 - eta (1 + gamma))^{n_i}) / (n_i (1 + gamma))`` (= eta for n_i = 1, never
  overshooting for large n_i). b_W is updated first, then b_H with the refreshed residual
  (Gauss-Seidel), then W, then H with X̂ recomputed from the new W (alternating, as the
  paper's "updates are performed alternately").
- Rows/columns without any observed rating get zero factors and zero bias (the limit of eqs.
  12-13 with the paper's uncounted regularisation, which drives them to 0); this is what an
  unrated item of a group uploads in FedSPLIT.
- :meth:`CNMF.predict` clips to the rating range (Surprise's default); training uses the
  unclipped estimate.

Default hyperparameters are Surprise's ``NMF`` defaults (k = 15, alpha = beta = 0.06,
gamma = delta = 0.02, eta_W = eta_H = 0.005, 50 iterations, init uniform [0, 1]); the paper
tunes per group with Optuna within alpha, beta in [0.04, 0.08], gamma, delta in [0.01, 0.04],
eta in [0.002, 0.009], k in [2, min(n^g, 21) - 1], 100 iterations, then 500 final iterations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["CNMF", "block_columns", "observed", "fit_row_factors"]


def observed(X: Any) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray, np.ndarray]:
    """Canonical CSR copy of ``X`` and its observed entries ``(rows, cols, values)``.

    ``X``: (n, m) ratings, dense or sparse; stored entries (explicit zeros included for CSR
    input) are the observed ratings. Returns int64 rows/cols and float64 values, CSR order.
    """
    Xc = sp.csr_matrix(X, dtype=np.float64, copy=True)
    Xc.sum_duplicates()
    Xc.sort_indices()
    rows = np.repeat(np.arange(Xc.shape[0], dtype=np.int64), np.diff(Xc.indptr))
    return Xc, rows, Xc.indices.astype(np.int64), Xc.data


def block_columns(X: Any, row_block: np.ndarray, n_blocks: int) -> sp.csr_matrix:
    """Give each block of rows its own copy of the columns: (n, m) -> (n, n_blocks * m).

    Entry (i, j) of ``X`` moves to column ``row_block[i] * m + j``. Fitting one :class:`CNMF`
    on the result fits ``n_blocks`` independent CNMFs at once (FedSPLIT's groups): no column
    is shared between blocks, and the block-g slice of H is group g's H^g.
    """
    Xc = sp.csr_matrix(X, dtype=np.float64)
    Xc.sort_indices()
    n, m = Xc.shape
    row_block = np.asarray(row_block, dtype=np.int64)
    if row_block.shape != (n,):
        raise ValueError(f"row_block must have shape ({n},), got {row_block.shape}")
    if n and (row_block.min() < 0 or row_block.max() >= n_blocks):
        raise ValueError("row_block values must lie in [0, n_blocks)")
    offset = np.repeat(row_block * m, np.diff(Xc.indptr))
    out = sp.csr_matrix(
        (Xc.data.copy(), Xc.indices.astype(np.int64) + offset, Xc.indptr.copy()), shape=(n, n_blocks * m)
    )
    out.has_sorted_indices = True
    return out


def _rank_mask(rank: np.ndarray | None, size: int, k: int) -> np.ndarray | None:
    if rank is None:
        return None
    rank = np.asarray(rank, dtype=np.int64)
    if rank.shape != (size,):
        raise ValueError(f"rank array must have shape ({size},), got {rank.shape}")
    return np.arange(k)[None, :] < rank[:, None]


def _bias_step(counts: np.ndarray, eta: float, reg: float) -> np.ndarray:
    """Per-row step of eqs. 10-11 equivalent to ``counts`` sequential SGD steps of size eta."""
    c = 1.0 - eta * (1.0 + reg)
    if not 0.0 < c < 1.0:
        raise ValueError("learning rate too large: need 0 < eta (1 + reg) < 1")
    safe = np.maximum(counts, 1)
    step = (1.0 - c ** safe.astype(np.float64)) / (safe * (1.0 + reg))
    return np.where(counts > 0, step, 0.0)


def _dot(W: np.ndarray, Ht: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``(W H)_ij`` at the observed (i, j): a row/column gather and a row-wise dot product."""
    return np.einsum("nk,nk->n", np.take(W, rows, axis=0), np.take(Ht, cols, axis=0))


def _mult_update(F: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``F * num / den`` where den > 0 (else unchanged), projected onto F >= 0."""
    ratio = np.divide(num, den, out=np.ones_like(F), where=den > 0)
    out = F * ratio
    np.maximum(out, 0.0, out=out)
    return out


@dataclass
class _Data:
    X: sp.csr_matrix
    XT: sp.csr_matrix
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    n_row: np.ndarray
    n_col: np.ndarray
    T: sp.csr_matrix  # X-shaped holder for X̂ (CSR order)
    TT_perm: np.ndarray  # permutation CSR data -> CSR-of-transpose data


def _prepare(X: Any) -> _Data:
    Xc, rows, cols, vals = observed(X)
    n, m = Xc.shape
    XT = Xc.T.tocsr()
    XT.sort_indices()
    # permutation mapping the CSR data order of X to that of X^T (stable by (col, row))
    perm = np.lexsort((rows, cols))
    T = Xc.copy()
    return _Data(
        Xc,
        XT,
        rows,
        cols,
        vals,
        np.bincount(rows, minlength=n),
        np.bincount(cols, minlength=m),
        T,
        perm,
    )


def _est_products(d: _Data, est: np.ndarray, Ht: np.ndarray | None, W: np.ndarray | None):
    if Ht is not None:
        d.T.data = est
        return d.T @ Ht
    TT = d.XT.copy()
    TT.data = est[d.TT_perm]
    return TT @ W


class CNMF:
    """Collaborative NMF with user/item biases (FedSPLIT paper eqs. 7-13); see the module docstring.

    Parameters
    ----------
    n_components : int
        Latent dimension k.
    alpha, beta : float
        Regularisation of W and H (eq. 9; scaled by the row/column rating counts as Surprise's
        ``reg_pu``/``reg_qi``).
    gamma, delta : float
        Regularisation of b_W and b_H (Surprise's ``reg_bu``/``reg_bi``).
    eta_W, eta_H : float
        Learning rates of the bias steps, eqs. 10-11 (Surprise's ``lr_bu``/``lr_bi``).
    n_iter : int
        Number of iterations (Surprise's ``n_epochs``).
    biased : bool
        Fit the biases (eq. 7); without, X̂ = W H (and mu is ignored), as Surprise's unbiased NMF.
    init_low, init_high : float
        W and H start uniform in [init_low, init_high] (Surprise's defaults 0 and 1).
    rating_range : (float, float) | None
        :meth:`predict` clips to it; None disables clipping.

    Attributes (after :meth:`fit`)
    ------------------------------
    W_ : (n, k) float64 >= 0, H_ : (k, m) float64 >= 0, b_W_ : (n,), b_H_ : (m,), mu_ : float
    """

    def __init__(
        self,
        n_components: int = 15,
        alpha: float = 0.06,
        beta: float = 0.06,
        gamma: float = 0.02,
        delta: float = 0.02,
        eta_W: float = 0.005,
        eta_H: float = 0.005,
        n_iter: int = 50,
        biased: bool = True,
        init_low: float = 0.0,
        init_high: float = 1.0,
        rating_range: tuple[float, float] | None = (1.0, 5.0),
    ):
        if n_components < 1:
            raise ValueError("n_components must be >= 1")
        if n_iter < 0:
            raise ValueError("n_iter must be >= 0")
        if min(alpha, beta, gamma, delta) < 0:
            raise ValueError("regularisation parameters must be >= 0")
        if not (0 <= init_low <= init_high):
            raise ValueError("need 0 <= init_low <= init_high")
        self.n_components = int(n_components)
        self.alpha, self.beta, self.gamma, self.delta = float(alpha), float(beta), float(gamma), float(delta)
        self.eta_W, self.eta_H = float(eta_W), float(eta_H)
        self.n_iter = int(n_iter)
        self.biased = bool(biased)
        self.init_low, self.init_high = float(init_low), float(init_high)
        self.rating_range = rating_range
        _bias_step(np.ones(1), self.eta_W, self.gamma)
        _bias_step(np.ones(1), self.eta_H, self.delta)

    # ------------------------------------------------------------------ fitting
    def fit(
        self,
        X: Any,
        mu: float | None = None,
        rng: np.random.Generator | int | None = None,
        row_rank: np.ndarray | None = None,
        col_rank: np.ndarray | None = None,
    ) -> CNMF:
        """Fit W, H, b_W, b_H on the observed entries of ``X`` (n x m, 0/absent = missing).

        ``mu``: the bias term of eq. 7 (default: mean of the observed ratings, eq. 6).
        ``row_rank``/``col_rank``: optional (n,)/(m,) numbers of active components per row/column
        (components beyond them are 0); used to fit groups with different k^g at once.
        """
        rng = np.random.default_rng(rng)
        d = _prepare(X)
        n, m = d.X.shape
        k = self.n_components
        if d.vals.size == 0:
            raise ValueError("X has no observed ratings")
        active = np.flatnonzero(d.n_col > 0)
        if active.size < m:
            # columns without ratings end at H = 0, b_H = 0: fit the rated columns only (this is
            # what keeps the batched fit of many groups, mostly empty blocks, cheap)
            sub_rank = None if col_rank is None else np.asarray(col_rank)[active]
            self.fit(d.X[:, active], mu, rng, row_rank, sub_rank)
            H = np.zeros((k, m))
            H[:, active] = self.H_
            b_H = np.zeros(m)
            b_H[active] = self.b_H_
            self.H_, self.b_H_ = H, b_H
            return self
        self.mu_ = float(np.mean(d.vals)) if mu is None else float(mu)
        mu_eff = self.mu_ if self.biased else 0.0
        W = rng.uniform(self.init_low, self.init_high, size=(n, k))
        Ht = rng.uniform(self.init_low, self.init_high, size=(m, k))
        W[d.n_row == 0] = 0.0
        Ht[d.n_col == 0] = 0.0
        for F, rank, size in ((W, row_rank, n), (Ht, col_rank, m)):
            mask = _rank_mask(rank, size, k)
            if mask is not None:
                F[~mask] = 0.0
        b_W = np.zeros(n)
        b_H = np.zeros(m)
        step_W = _bias_step(d.n_row, self.eta_W, self.gamma)
        step_H = _bias_step(d.n_col, self.eta_H, self.delta)
        rows, cols, vals = d.rows, d.cols, d.vals
        for _ in range(self.n_iter):
            est = mu_eff + _dot(W, Ht, rows, cols)
            if self.biased:
                est += b_W[rows] + b_H[cols]
                # eq. 10
                g = np.bincount(rows, vals - est, minlength=n) - self.gamma * d.n_row * b_W
                delta = step_W * g
                b_W += delta
                est += delta[rows]
                # eq. 11
                g = np.bincount(cols, vals - est, minlength=m) - self.delta * d.n_col * b_H
                delta = step_H * g
                b_H += delta
                est += delta[cols]
            # eq. 12
            num = d.X @ Ht
            den = _est_products(d, est, Ht, None) + self.alpha * d.n_row[:, None] * W
            W_new = _mult_update(W, num, den)
            est += _dot(W_new - W, Ht, rows, cols)
            W = W_new
            # eq. 13
            num = d.XT @ W
            den = _est_products(d, est, None, W) + self.beta * d.n_col[:, None] * Ht
            Ht = _mult_update(Ht, num, den)
        self.W_ = W
        self.H_ = np.ascontiguousarray(Ht.T)
        self.b_W_ = b_W
        self.b_H_ = b_H
        return self

    def fit_rows(
        self,
        X: Any,
        H: np.ndarray,
        b_H: np.ndarray,
        mu: float,
        rng: np.random.Generator | int | None = None,
        row_rank: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """W and b_W for the rows of ``X`` with H, b_H and mu fixed (eqs. 12 and 10 only).

        This is the fedsplit-inference adversary's fit (FedSPLIT paper §4.4). Returns
        ``(W (n x k), b_W (n,))``; rows without observed entries get W = 0, b_W = 0.
        """
        return fit_row_factors(self, X, H, b_H, mu, rng, row_rank)

    # ------------------------------------------------------------------ prediction
    def predict(self, rows: Any, cols: Any, clip: bool = True) -> np.ndarray:
        """X̂ (eq. 7) at the given (row, column) index pairs, clipped to ``rating_range``."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        est = np.einsum("nk,kn->n", self.W_[rows], self.H_[:, cols])
        if self.biased:
            est = est + self.mu_ + self.b_W_[rows] + self.b_H_[cols]
        if clip and self.rating_range is not None:
            est = np.clip(est, *self.rating_range)
        return est

    def rmse(self, X: Any) -> float:
        """RMSE (eq. 8 over the observed entries) of :meth:`predict` on the stored entries of ``X``."""
        _, rows, cols, vals = observed(X)
        return float(np.sqrt(np.mean((self.predict(rows, cols) - vals) ** 2)))


def fit_row_factors(
    model: CNMF,
    X: Any,
    H: np.ndarray,
    b_H: np.ndarray,
    mu: float,
    rng: np.random.Generator | int | None = None,
    row_rank: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Fit W (eq. 12) and b_W (eq. 10) of ``model``'s hyperparameters with H, b_H, mu fixed.

    ``X``: (n, m) observed ratings; ``H``: (k, m) >= 0; ``b_H``: (m,). ``model.n_iter``
    iterations from W uniform in [init_low, init_high], b_W = 0. Returns ``(W, b_W)``.
    """
    rng = np.random.default_rng(rng)
    d = _prepare(X)
    n, m = d.X.shape
    H = np.asarray(H, dtype=np.float64)
    if H.ndim != 2 or H.shape[1] != m:
        raise ValueError(f"H must have shape (k, {m}), got {H.shape}")
    Ht = np.ascontiguousarray(np.maximum(H, 0.0).T)
    k = Ht.shape[1]
    b_H = np.asarray(b_H, dtype=np.float64).reshape(m)
    W = rng.uniform(model.init_low, model.init_high, size=(n, k))
    W[d.n_row == 0] = 0.0
    mask = _rank_mask(row_rank, n, k)
    if mask is not None:
        W[~mask] = 0.0
    b_W = np.zeros(n)
    step_W = _bias_step(d.n_row, model.eta_W, model.gamma)
    rows, cols, vals = d.rows, d.cols, d.vals
    mu_eff = float(mu) if model.biased else 0.0
    base = mu_eff + (b_H[cols] if model.biased else 0.0)
    num = d.X @ Ht
    for _ in range(model.n_iter):
        est = base + _dot(W, Ht, rows, cols)
        if model.biased:
            est += b_W[rows]
            g = np.bincount(rows, vals - est, minlength=n) - model.gamma * d.n_row * b_W
            delta = step_W * g
            b_W += delta
            est += delta[rows]
        den = _est_products(d, est, Ht, None) + model.alpha * d.n_row[:, None] * W
        W = _mult_update(W, num, den)
    return W, b_W

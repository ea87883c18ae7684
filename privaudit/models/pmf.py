"""PMF (batch and stochastic) and SVD++ (stochastic) kernels of FedRec (FedRec paper §2-3).

No parties, no I/O: :mod:`privaudit.protocols.fedrec` wires these functions into the
federated protocol. Notation of FedRec paper Table 1: ``U`` (n x d, client-local), ``V`` (m x d),
``W`` (m x d, SVD++ implicit factors), learning rate ``lr`` (gamma), ``lam`` (lambda).

Local data is a flat list of *entries* (user ``rows``, item ``cols``, rating ``vals``), sorted
by user with CSR ``indptr`` (n + 1,); it holds the real ratings and, under a sampling defense,
the virtual entries (filled with the user average, eq. 5, or the local prediction, eq. 6).

Predictions (eqs. 1, 2)::

    PMF:    r_ui = U_u . V_i
    SVD++:  r_ui = (U_u + |N_u \\ {i}|^-1/2 sum_{j in N_u \\ {i}} W_j) . V_i

(eq. 2 as extracted reads ``... W_i' . V_i'``; we use Koren's form with V_i, which is what the
paper's "users with similar rated items" sentence describes.)

Batch style (Algorithms 1-2), all users in parallel:

* eq. 7: ``grad U_u = mean_{i in I_u ∪ I'_u} (U_u.V_i - r_ui) V_i + lam U_u``;
* eq. 8: ``grad V(u, i) = (U_u.V_i - r_ui) U_u + lam V_i`` with the *updated* U_u;
* eq. 9: the server averages eq. 8 over the users that (really or virtually) rated i.

Stochastic style (Algorithms 4-5): a client walks its entries in random order, stepping
``U_u <- U_u - lr ((U_u.V_i - r_ui) V_i + lam U_u)`` and computing eq. 8 after each step with
the V it downloaded; the server then applies ``V_i <- V_i - lr grad V(u, i)``. The kernels
here run a *chunk* of clients in lock-step (one entry of every client of the chunk per numpy
step) against one V snapshot, so the server applies the chunk's uploads together — exactly
Algorithm 4 with chunk size 1, a staleness of one chunk otherwise (see the protocol).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass
class Entries:
    """Flat training entries sorted by user.

    Attributes
    ----------
    rows, cols : (nnz,) int64 user and item of every entry.
    vals : (nnz,) float64 rating (real, or the virtual filling).
    virtual : (nnz,) bool, True on virtual entries (sampling defense).
    indptr : (n + 1,) int64 CSR row pointer.
    shape : (n, m).
    """

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    virtual: np.ndarray
    indptr: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def from_csr(cls, ratings: sp.csr_matrix, virtual: sp.csr_matrix | None = None) -> Entries:
        r = sp.csr_matrix(ratings, dtype=np.float64)
        r.sort_indices()
        n = r.shape[0]
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(r.indptr))
        if virtual is None or sp.csr_matrix(virtual).nnz == 0:
            virt = np.zeros(r.nnz, dtype=bool)
        else:
            v = sp.csr_matrix(virtual)
            v.sort_indices()
            if v.nnz != r.nnz or not np.array_equal(v.indices, r.indices):
                raise ValueError("virtual must have the sparsity of ratings")
            virt = np.asarray(v.data, dtype=bool)
        return cls(rows, r.indices.astype(np.int64), r.data.copy(), virt, r.indptr.astype(np.int64), r.shape)

    @property
    def counts(self) -> np.ndarray:
        """(n,) entries per user |I_u ∪ I'_u|."""
        return np.diff(self.indptr)

    def matrix(self, values: np.ndarray) -> sp.csr_matrix:
        """CSR (n x m) with ``values`` (nnz,) on the entries."""
        return sp.csr_matrix((values, self.cols, self.indptr), shape=self.shape)


def init_factors(rng: np.random.Generator, shape: tuple[int, int], scale: float) -> np.ndarray:
    """Small random values (FedRec paper §3.1): ``(rand - 0.5) * scale``, uniform on (-scale/2, scale/2)."""
    return (rng.random(shape) - 0.5) * scale


# ---------------------------------------------------------------------------- predictions
def implicit_sum(W: np.ndarray, implicit: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Per user ``S_u = sum_{j in N_u} W_j`` (n x d) and ``|N_u|`` (n,)."""
    imp = sp.csr_matrix(implicit, dtype=np.float64)
    imp.data = np.ones_like(imp.data)
    return np.asarray(imp @ W), np.diff(imp.indptr)


def predict(
    U: np.ndarray,
    V: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    W: np.ndarray | None = None,
    implicit: sp.csr_matrix | None = None,
    exclude_self: bool = False,
) -> np.ndarray:
    """Predicted ratings of the (rows, cols) pairs: eq. 1, or eq. 2 when ``W`` is given.

    For SVD++ ``implicit`` (n x m csr) gives N_u; with ``exclude_self`` the item itself is
    removed from N_u when it belongs to it (training entries), else N_u is used whole (test).
    """
    P = U[rows]
    if W is not None:
        S, cnt = implicit_sum(W, implicit)
        S = S[rows]
        cnt = cnt[rows].astype(np.float64)
        if exclude_self:
            imp = sp.csr_matrix(implicit)
            member = np.asarray(imp[rows, cols]).ravel() != 0
            S = S - member[:, None] * W[cols]
            cnt = cnt - member
        P = P + S / np.sqrt(np.maximum(cnt, 1.0))[:, None]
    return np.einsum("ij,ij->i", P, V[cols])


# ---------------------------------------------------------------------------- batch style
def batch_user_gradient(U: np.ndarray, V: np.ndarray, E: Entries, lam: float) -> np.ndarray:
    """Eq. 7 for every user (n x d); users without entries get ``lam U_u``."""
    err = np.einsum("ij,ij->i", U[E.rows], V[E.cols]) - E.vals
    g = np.asarray(E.matrix(err) @ V) / np.maximum(E.counts, 1)[:, None]
    return g + lam * U


def batch_local_steps(
    U: np.ndarray, V: np.ndarray, E: Entries, lam: float, lr: float, steps: int, max_step: float | None = None
) -> np.ndarray:
    """``steps`` local updates ``U <- U - lr grad U`` (eq. 7) — Algorithm 3 lines 2-5 (each row's
    step clipped to ``max_step``, see :func:`clip_rows`)."""
    U = U.copy()
    has = E.counts > 0
    for _ in range(int(steps)):
        U[has] -= clip_rows(lr * batch_user_gradient(U, V, E, lam)[has], max_step)[0]
    return U


def clip_rows(step: np.ndarray, max_norm: float | None) -> tuple[np.ndarray, int]:
    """Rows of ``step`` (k x d) scaled down to Euclidean norm <= ``max_norm``; (clipped, count).

    A divergence guard (not in FedRec paper): batch GD at the paper's lr 0.8 is unstable once
    lr |U_u|^2 > 2 for an item with one rater (or lr * lambda_max(mean V_i V_i^T) > 2 for a
    user), which happens on small data before the 0.9 decay has brought lr down; clipping
    each row's step keeps the growth linear until the decay makes the step contract.
    ``None`` or 0 disables it. Computable locally: clients clip their U step, the server its
    V step.
    """
    if not max_norm or step.size == 0:
        return step, 0
    norms = np.sqrt(np.einsum("ij,ij->i", step, step))
    over = ~(norms <= max_norm)  # NaN counts as over (then scaled to NaN; the protocol's guard reports it)
    k = int(over.sum())
    if k == 0:
        return step, 0
    step = step.copy()
    step[over] *= (max_norm / norms[over])[:, None]
    return step, k


def grad_V_entries(U: np.ndarray, V: np.ndarray, E: Entries, lam: float) -> np.ndarray:
    """Eq. 8 for every entry: ``(U_u.V_i - r_ui) U_u + lam V_i`` (nnz x d)."""
    Ur = U[E.rows]
    err = np.einsum("ij,ij->i", Ur, V[E.cols]) - E.vals
    return err[:, None] * Ur + lam * V[E.cols]


def item_average(sum_grad: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Eq. 9: the summed uploads divided by |U_i ∪ U'_i| (rows without uploads stay 0)."""
    return sum_grad / np.maximum(counts, 1)[:, None]


def batch_centralized_step(
    U: np.ndarray, V: np.ndarray, E: Entries, lam: float, lr: float, max_step: float | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """One unfederated batch iteration with the same math as Algorithms 1-2: every U_u steps
    with eq. 7, then V steps with eq. 9 computed from the updated U (sparse products, no
    per-client messages). Steps clipped row-wise to ``max_step`` (:func:`clip_rows`).
    Returns (U, V, number of clipped rows)."""
    has_u = E.counts > 0
    stepU, k1 = clip_rows(lr * batch_user_gradient(U, V, E, lam) * has_u[:, None], max_step)
    U = U - stepU
    err = np.einsum("ij,ij->i", U[E.rows], V[E.cols]) - E.vals
    icount = np.bincount(E.cols, minlength=V.shape[0])
    gV = np.asarray(E.matrix(err).T @ U) / np.maximum(icount, 1)[:, None] + lam * V
    stepV, k2 = clip_rows(lr * gV * (icount > 0)[:, None], max_step)
    return U, V - stepV, k1 + k2


# ---------------------------------------------------------------------------- stochastic style
def entry_order(E: Entries, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random order of every user's entries: (order (nnz,), rank within the user (nnz,)).

    ``order`` lists entry positions grouped by user (users ascending), random within a user;
    ``rank[k]`` is the position of ``order[k]`` in its user's walk.
    """
    keys = rng.random(len(E.rows))
    order = np.lexsort((keys, E.rows))
    rank = np.arange(len(order)) - E.indptr[E.rows[order]]
    return order, rank


def user_chunks(counts: np.ndarray, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Every user with entries once, in chunks of ``size`` users of similar walk length, chunks
    in random order (ties in length broken at random).

    Grouping by length keeps the lock-step walks of a chunk nearly equally long (the cost of a
    chunk is its longest walk); the visiting order is random at the chunk level.
    """
    users = np.flatnonzero(counts > 0)
    users = users[np.lexsort((rng.random(len(users)), -counts[users]))]
    chunks = [users[i : i + size] for i in range(0, len(users), size)]
    return [chunks[j] for j in rng.permutation(len(chunks))]


def padded_chunk(E: Entries, order: np.ndarray, users: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entry positions of ``users`` as a padded matrix, longest walk first.

    Returns (users sorted by walk length descending, lengths, P) with P (B x L) int64 entry
    positions in walk order, -1 as padding. Row b walks ``order[indptr[u]:indptr[u+1]]``.
    """
    lengths = E.counts[users]
    srt = np.argsort(-lengths, kind="stable")
    users, lengths = users[srt], lengths[srt]
    L = int(lengths.max()) if len(users) else 0
    P = np.full((len(users), L), -1, dtype=np.int64)
    if L:
        b = np.repeat(np.arange(len(users)), lengths)
        k = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        starts = E.indptr[users]
        P[b, k] = order[np.repeat(starts, lengths) + k]
    return users, lengths, P


def active_counts(lengths: np.ndarray, L: int) -> np.ndarray:
    """For lengths sorted descending: number of walks still running at each step k < L."""
    return np.searchsorted(-lengths, -np.arange(L), side="left") if L else np.zeros(0, np.int64)


def _walk(E: Entries, P: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    valid = P >= 0
    Pi = np.where(valid, P, 0)
    return valid, E.cols[Pi], np.where(valid, E.vals[Pi], 0.0)


def sgd_chunk(
    Uc: np.ndarray,
    V: np.ndarray,
    E: Entries,
    P: np.ndarray,
    lengths: np.ndarray,
    lam: float,
    lr: float,
    W: np.ndarray | None = None,
    federated: bool = True,
) -> dict[str, np.ndarray]:
    """Stochastic PMF / SVD++ for a chunk of clients walking their entries in lock-step.

    Parameters
    ----------
    Uc : (B x d) the chunk's user factors, updated in place.
    V : (m x d) item factors. Federated (Algorithm 5): the downloaded snapshot, not modified;
        centralized: updated in place after every step (standard SGD, both U_u and V_i from
        the same residual; duplicate items of one step summed).
    P, lengths : from :func:`padded_chunk` (B x L walk matrix; walk lengths).
    W : (m x d) SVD++ implicit factors (snapshot, not modified), or None for PMF. The
        implicit set N_u of eq. 2 is the walk itself (I_u ∪ I'_u).

    Returns
    -------
    dict with (B x L x d arrays in walk order, 0 on padding)
    ``grad_V``: federated only — eq. 8 after each U step:
    ``(p_u.V_i - r_ui) p_u + lam V_i`` with ``p_u = U_u`` (PMF) or ``U_u + |N_u\\{i}|^-1/2
    sum_{j in N_u\\{i}} W_j`` (SVD++);
    ``grad_W`` (SVD++): ``(|N_u|-1)^-1/2 sum_{i in N_u, i != j} e_ui V_i + lam W_j`` for every
    walked item j, with e_ui the residual of entry i (federated: after the U step, as eq. 8).
    """
    B, L = P.shape
    valid, items, r = _walk(E, P)
    act = active_counts(lengths, L)
    # position-major (L x B ...) so that the running walks of step k are a contiguous prefix
    itT = np.ascontiguousarray(items.T)
    rT = np.ascontiguousarray(r.T)
    vT = valid.T
    implicit = _Implicit.of(W, itT, vT, lengths) if W is not None else None
    if federated:
        return _federated_walk(Uc, V, itT, rT, vT, act, lam, lr, implicit)
    own = _central_walk(Uc, V, itT, rT, act, lam, lr, implicit)
    return {} if implicit is None else {"grad_W": implicit.grad_W(own, lam, vT)}


@dataclass
class _Implicit:
    """SVD++'s implicit terms of a chunk (position-major, L x B ...): the walked rows ``WT`` of W
    (0 on padding), ``EXTRA`` = |N_u\\{i}|^-1/2 sum_{j in N_u\\{i}} W_j per entry, ``norm`` (B,)."""

    WT: np.ndarray
    EXTRA: np.ndarray
    norm: np.ndarray

    @classmethod
    def of(cls, W: np.ndarray, itT: np.ndarray, vT: np.ndarray, lengths: np.ndarray) -> _Implicit:
        WT = W[itT] * vT[..., None]
        norm = 1.0 / np.sqrt(np.maximum(lengths - 1.0, 1.0))
        return cls(WT, (WT.sum(axis=0)[None, :, :] - WT) * norm[None, :, None], norm)

    def grad_W(self, own: np.ndarray, lam: float, vT: np.ndarray) -> np.ndarray:
        """``grad_W`` (B x L x d) from the per-entry ``e_ui V_i`` (L x B x d)."""
        acc = own.sum(axis=0)
        gw = ((acc[None, :, :] - own) * self.norm[None, :, None] + lam * self.WT) * vT[..., None]
        return gw.transpose(1, 0, 2)


def _federated_walk(Uc, V, itT, rT, vT, act, lam, lr, implicit) -> dict[str, np.ndarray]:
    """Algorithm 5's walk on the downloaded V: U steps, then eq. 8's grad_V (and grad_W)."""
    L, B = itT.shape
    vdot = np.vecdot
    decay = 1.0 - lr * lam
    VT = V[itT]
    X = vdot(implicit.EXTRA, VT) if implicit is not None else np.zeros((L, B))
    VV = vdot(VT, VT)
    Uh = np.zeros((L, B, V.shape[1]))  # U_u after the step of entry k
    E2 = np.zeros((L, B))  # residual after the step (eq. 8)
    for k in range(L):
        a = int(act[k])
        u = Uc[:a]
        v = VT[k, :a]
        uv = vdot(u, v)
        e = uv + (X[k, :a] - rT[k, :a])
        u *= decay
        u -= (lr * e)[:, None] * v
        Uh[k, :a] = u
        E2[k, :a] = decay * uv - lr * e * VV[k, :a] + X[k, :a] - rT[k, :a]
    Ph = Uh + implicit.EXTRA if implicit is not None else Uh
    G = (E2[..., None] * Ph + lam * VT) * vT[..., None]
    out = {"grad_V": G.transpose(1, 0, 2)}
    if implicit is not None:
        out["grad_W"] = implicit.grad_W(E2[..., None] * VT * vT[..., None], lam, vT)
    return out


def _central_walk(Uc, V, itT, rT, act, lam, lr, implicit) -> np.ndarray | None:
    """Centralized SGD: U and V updated after every step; returns SVD++'s ``e_ui V_i`` (L x B x d)."""
    L, B = itT.shape
    decay = 1.0 - lr * lam
    own = np.zeros((L, B, V.shape[1])) if implicit is not None else None
    for k in range(L):
        a = int(act[k])
        u = Uc[:a]
        it = itT[k, :a]
        v = V[it]
        p = u + implicit.EXTRA[k, :a] if implicit is not None else u
        e = np.vecdot(p, v) - rT[k, :a]
        gv = e[:, None] * p
        gv += lam * v
        u *= decay
        u -= (lr * e)[:, None] * v
        np.subtract.at(V, it, lr * gv)
        if own is not None:
            np.multiply(e[:, None], v, out=own[k, :a])
    return own


def scatter_rows(target: np.ndarray, items: np.ndarray, rows: np.ndarray, scale: float) -> None:
    """``target[items] -= scale * rows`` with duplicate items summed (in place)."""
    m, d = target.shape
    for j in range(d):
        target[:, j] -= scale * np.bincount(items, weights=rows[:, j], minlength=m)


def rmse_mae(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    err = pred - truth
    return float(np.sqrt(np.mean(err**2))), float(np.mean(np.abs(err)))

"""Multi-view matrix factorization (MVMF) kernels: the math of FedMVMF, batched over users.

No parties, no I/O: :mod:`privaudit.protocols.fedmvmf` wires these functions into the
federated protocol. Notation follows the FedMVMF section of docs/reproduction.md (the restated PrivMVMF paper §3;
the paper's equation numbers are given where the restated formula corresponds to one):

* ``R`` ratings (n x m, 0 = unrated), ``C`` confidences c_ui, ``X`` user attributes (n x p),
  ``Y`` item features (m x q);
* ``U`` (n x K, client-local), ``V`` (m x K), ``P`` (p x K), ``Q`` (q x K);
* loss (eq. 3)::

    J = sum_{u,i} c_ui (r_ui - u_u.v_i)^2 + alpha sum_u ||x_u - P u_u||^2
        + alpha sum_i ||y_i - Q v_i||^2 + lam (||U||^2 + ||V||^2 + ||P||^2 + ||Q||^2)

  with c_ui = 1 on rated items and, for ``unrated="obsonly"``, 0 elsewhere, for
  ``unrated="inclunc"``, ``w`` elsewhere (r_ui = 0 there).

Every client's local normal equations are ``A_u u = b_u`` with (eq. 8)::

    A_u = sum_i c_ui v_i v_i^T + alpha P^T P + lam I      (K x K)
    b_u = sum_i c_ui r_ui v_i + alpha P^T x_u             (K,)

so the gradient of the client's part of J in u is ``grad_u = 2 (A_u u - b_u)`` (eq. 10) and
SemiALS sets ``u = A_u^-1 b_u`` while SGD steps ``u <- u - eta grad_u`` (eq. 9). For InclUnc
``sum_i c_ui v_i v_i^T = w V^T V + sum_{explicit i} (c_ui - w) v_i v_i^T`` keeps the cost
proportional to the number of stored entries. All ``A_u`` come from one sparse-dense product
``C @ vec(v_i v_i^T)`` and are solved with one stacked ``numpy.linalg.solve``.

Local data is given as CSR matrices ``ratings`` and ``weights`` of the same sparsity (see
:class:`privaudit.defenses.base.ClientData`): the explicit entries are the items a client
"knows" (its rated items plus any virtual items of a sampling defense, whose rating is 0 and
weight is ``w``); for InclUnc every other item has weight ``w`` and rating 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

__all__ = [
    "normal_equations",
    "solve_users",
    "sgd_users",
    "user_gradient",
    "row_dots",
    "entry_predictions",
    "entry_coefficients",
    "dense_coefficients",
    "grad_V_rows",
    "grad_P",
    "summed_uploads",
    "solve_Q",
    "grad_Q",
    "item_grad_V",
    "loss",
    "cold_start_users",
    "cold_start_items",
    "Adam",
]


def _weighted_outer_sums(C: sp.csr_matrix, V: np.ndarray) -> np.ndarray:
    """``sum_i C[u, i] v_i v_i^T`` for every row u: (n x K x K), from the upper triangle only."""
    K = V.shape[1]
    iu, ju = np.triu_indices(K)
    upper = np.asarray(C @ (V[:, iu] * V[:, ju]))
    out = np.empty((C.shape[0], K, K))
    out[:, iu, ju] = upper
    out[:, ju, iu] = upper
    return out


def normal_equations(
    V: np.ndarray,
    P: np.ndarray,
    X: np.ndarray,
    ratings: sp.csr_matrix,
    weights: sp.csr_matrix,
    alpha: float,
    lam: float,
    w: float,
    unrated: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Every user's ``A_u`` (n x K x K) and ``b_u`` (n x K) of eq. 8 (see module docstring).

    ``ratings``/``weights``: (n x m) CSR with the same sparsity; ``X``: (n x p).
    ``unrated``: ``"obsonly"`` (c = weight on explicit entries, 0 elsewhere) or ``"inclunc"``
    (c = weight on explicit entries, ``w`` elsewhere).
    """
    n = ratings.shape[0]
    m, K = V.shape
    C = sp.csr_matrix((weights.data, ratings.indices, ratings.indptr), shape=(n, m))
    if unrated == "inclunc":
        # explicit entries contribute (c - w), every item contributes w
        C = sp.csr_matrix((weights.data - w, ratings.indices, ratings.indptr), shape=(n, m))
    A = _weighted_outer_sums(C, V)
    if unrated == "inclunc":
        A += w * (V.T @ V)
    A += alpha * (P.T @ P) + lam * np.eye(K)
    CR = sp.csr_matrix((weights.data * ratings.data, ratings.indices, ratings.indptr), shape=(n, m))
    b = np.asarray(CR @ V) + alpha * (X @ P)
    return A, b


def solve_users(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """SemiALS user update (eq. 8): ``u_u = A_u^-1 b_u`` for all users at once. Returns (n x K)."""
    return np.linalg.solve(A, b[:, :, None])[:, :, 0]


def user_gradient(U: np.ndarray, A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``grad_u = 2 (A_u u_u - b_u)`` (eq. 10), (n x K)."""
    return 2.0 * (np.einsum("nij,nj->ni", A, U) - b)


def sgd_users(U: np.ndarray, A: np.ndarray, b: np.ndarray, eta: float) -> np.ndarray:
    """SGD user update (eq. 9): ``u_u <- u_u - eta grad_u``. Returns a new (n x K) array."""
    return U - eta * user_gradient(U, A, b)


_BLOCK = 1 << 15  # rows per block of row_dots (two 5 MiB gathers at K = 20)


def row_dots(A: np.ndarray, B: np.ndarray, a_index: np.ndarray | None, b_index: np.ndarray) -> np.ndarray:
    """``A[a_index[e]] . B[b_index[e]]`` for every e: (len(b_index),) float64.

    ``A`` (rows x K), ``B`` (rows' x K); ``a_index`` None means ``A``'s own rows in order. The
    rows are gathered in blocks of ``_BLOCK`` into two reused buffers, so the cost is linear
    with no (len x K) temporaries; each value is the same ``einsum`` dot product as over the
    whole gather (bit-identical).
    """
    n_out = len(b_index)
    out = np.empty(n_out)
    if n_out == 0:
        return out
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    size = min(_BLOCK, n_out)
    ba, bb = np.empty((size, A.shape[1])), np.empty((size, B.shape[1]))
    for lo in range(0, n_out, size):
        hi = min(lo + size, n_out)
        n_b = hi - lo
        if a_index is None:
            rows_a = A[lo:hi]
        else:
            rows_a = ba[:n_b]
            np.take(A, a_index[lo:hi], axis=0, out=rows_a)
        np.take(B, b_index[lo:hi], axis=0, out=bb[:n_b])
        np.einsum("ek,ek->e", rows_a, bb[:n_b], out=out[lo:hi])
    return out


def entry_predictions(U: np.ndarray, V: np.ndarray, ratings: sp.csr_matrix) -> np.ndarray:
    """``u_u . v_i`` for every explicit entry (u, i) of ``ratings``: (nnz,) float64, in CSR
    order, by :func:`row_dots` (no (nnz x K) temporaries)."""
    rows = np.repeat(np.arange(ratings.shape[0]), np.diff(ratings.indptr))
    return row_dots(U, V, rows, ratings.indices)


def entry_coefficients(U: np.ndarray, V: np.ndarray, ratings: sp.csr_matrix, weights: sp.csr_matrix) -> np.ndarray:
    """Per explicit entry (u, i): ``-2 c_ui (r_ui - u_u.v_i)`` (nnz,), in CSR order.

    The uploaded gradient row of that entry is this scalar times ``u_u`` (eq. 7).
    """
    return -2.0 * weights.data * (ratings.data - entry_predictions(U, V, ratings))


def dense_coefficients(
    U: np.ndarray, V: np.ndarray, ratings: sp.csr_matrix, weights: sp.csr_matrix, w: float
) -> np.ndarray:
    """InclUnc: ``-2 c_ui (r_ui - u_u.v_i)`` for every (u, i), (n x m); c = w, r = 0 off the entries."""
    coef = (2.0 * w) * (U @ V.T)
    rows = np.repeat(np.arange(ratings.shape[0]), np.diff(ratings.indptr))
    coef[rows, ratings.indices] = entry_coefficients(U, V, ratings, weights)
    return coef


def grad_V_rows(coef: np.ndarray, U: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Upload rows ``coef[e] * u_{row(e)}``.

    With ``rows`` (nnz,) and ``coef`` (nnz,): (nnz x K) rows for explicit entries. Without
    ``rows`` and ``coef`` (n x m): (n x m x K) rows for every user and item (InclUnc).
    """
    if rows is None:
        return coef[:, :, None] * U[:, None, :]
    out = np.take(np.asarray(U, dtype=np.float64), rows, axis=0)  # the only (nnz x K) allocation
    out *= np.asarray(coef, dtype=np.float64)[:, None]
    return out


def summed_uploads(
    U: np.ndarray,
    V: np.ndarray,
    P: np.ndarray,
    X: np.ndarray,
    ratings: sp.csr_matrix,
    weights: sp.csr_matrix,
    alpha: float,
    w: float,
    unrated: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Sums over all clients of their ``grad_V`` (m x K, scattered by item) and ``grad_P`` (p x K).

    Equal (up to rounding) to summing the per-client uploads of :func:`grad_V_rows` and
    :func:`grad_P`, at the cost of two matrix products.
    """
    n, m = ratings.shape
    coef = entry_coefficients(U, V, ratings, weights)
    if unrated == "inclunc":
        # off the explicit entries the coefficient is 2 w u.v: sum_u 2 w (u.v_i) u = 2 w (U^T U) v_i
        coef = coef - 2.0 * w * entry_predictions(U, V, ratings)
    sum_V = np.asarray(sp.csr_matrix((coef, ratings.indices, ratings.indptr), shape=(n, m)).T @ U)
    if unrated == "inclunc":
        sum_V += 2.0 * w * (V @ (U.T @ U))
    sum_P = -2.0 * alpha * (X - U @ P.T).T @ U
    return sum_V, sum_P


def grad_P(U: np.ndarray, P: np.ndarray, X: np.ndarray, alpha: float) -> np.ndarray:
    """Per-user gradient of ``alpha ||x_u - P u_u||^2`` in P (eq. 5): ``-2 alpha (x_u - P u_u) u_u^T``, (n x p x K)."""
    resid = X - U @ P.T
    return -2.0 * alpha * resid[:, :, None] * U[:, None, :]


def solve_Q(V: np.ndarray, Y: np.ndarray, alpha: float, lam: float) -> np.ndarray:
    """SemiALS item-feature update (eq. 11): ``Q = alpha Y^T V (alpha V^T V + lam I)^-1``, (q x K)."""
    K = V.shape[1]
    G = alpha * (V.T @ V) + lam * np.eye(K)
    return np.linalg.solve(G, alpha * (V.T @ Y)).T


def grad_Q(Q: np.ndarray, V: np.ndarray, Y: np.ndarray, alpha: float, lam: float) -> np.ndarray:
    """Gradient of ``alpha ||Y - V Q^T||^2 + lam ||Q||^2`` in Q (eq. 13): (q x K)."""
    return -2.0 * alpha * (Y - V @ Q.T).T @ V + 2.0 * lam * Q


def item_grad_V(V: np.ndarray, Q: np.ndarray, Y: np.ndarray, alpha: float) -> np.ndarray:
    """The item server's part of V's gradient, ``-2 alpha Q^T (y_i - Q v_i)`` per item: (m x K)."""
    return -2.0 * alpha * (Y - V @ Q.T) @ Q


def loss(
    U: np.ndarray,
    V: np.ndarray,
    P: np.ndarray,
    Q: np.ndarray,
    ratings: sp.csr_matrix,
    weights: sp.csr_matrix,
    X: np.ndarray,
    Y: np.ndarray,
    alpha: float,
    lam: float,
    w: float,
    unrated: str,
) -> float:
    """The training objective J of eq. 3 (module docstring)."""
    pred = entry_predictions(U, V, ratings)
    total = float(np.sum(weights.data * (ratings.data - pred) ** 2))
    if unrated == "inclunc":
        # every item has weight w and rating 0; remove the explicit entries' w * pred^2.
        # sum_{u,i} (u_u.v_i)^2 = sum((U^T U) * (V^T V))
        total += w * (float(np.sum((U.T @ U) * (V.T @ V))) - float(np.sum(pred**2)))
    total += alpha * float(np.sum((X - U @ P.T) ** 2)) + alpha * float(np.sum((Y - V @ Q.T) ** 2))
    total += lam * float(np.sum(U**2) + np.sum(V**2) + np.sum(P**2) + np.sum(Q**2))
    return total


def _ridge_map(F: np.ndarray, Z: np.ndarray, alpha: float, lam: float) -> np.ndarray:
    K = F.shape[1]
    G = alpha * (F.T @ F) + lam * np.eye(K)
    return np.linalg.solve(G, alpha * (F.T @ Z.T)).T


def cold_start_users(P: np.ndarray, X: np.ndarray, alpha: float, lam: float) -> np.ndarray:
    """Latent factors of new users from their attributes (eq. 15): ``(alpha P^T P + lam I)^-1 alpha P^T x``, (n_new x K)."""
    return _ridge_map(P, X, alpha, lam)


def cold_start_items(Q: np.ndarray, Y: np.ndarray, alpha: float, lam: float) -> np.ndarray:
    """Latent factors of new items from their features (eq. 17): ``(alpha Q^T Q + lam I)^-1 alpha Q^T y``, (m_new x K)."""
    return _ridge_map(Q, Y, alpha, lam)


@dataclass
class Adam:
    """Adam (Kingma & Ba) on a dict of named arrays; the FL server's optimizer (PrivMVMF paper §3.3).

    ``step(params, grads)`` returns updated copies; moments are kept per name.
    """

    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    m: dict = field(default_factory=dict)
    v: dict = field(default_factory=dict)

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.t += 1
        out = {}
        c1 = 1.0 - self.beta1**self.t
        c2 = 1.0 - self.beta2**self.t
        for name, p in params.items():
            g = grads[name]
            m = self.m.get(name)
            v = self.v.get(name)
            m = (1 - self.beta1) * g if m is None else self.beta1 * m + (1 - self.beta1) * g
            v = (1 - self.beta2) * g * g if v is None else self.beta2 * v + (1 - self.beta2) * g * g
            self.m[name], self.v[name] = m, v
            out[name] = p - self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)
        return out

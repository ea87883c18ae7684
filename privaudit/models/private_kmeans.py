"""Differentially private prototypes: private k-means of Balcan et al. (2017) with the sparse
recovery of DP-prototypes paper (Algorithms 2-6), pure epsilon-DP per silo.

:func:`private_prototypes` projects a silo's clipped rows (JL), draws candidate centres from
private partitions of shifted grids, picks k of them by localswap, and releases noisy sparse
sums of the clusters over a noisy silo size; :func:`budget_split` divides epsilon so that the
whole composes to epsilon. The pipeline, the budget proof, the reading of "n" in Algorithm 3
and the departures from the paper are in ``docs/private-kmeans.md``. All randomness comes from
the simulation ``numpy.random.Generator`` passed in (DP noise, not cryptographic material).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = [
    "BudgetSplit",
    "budget_split",
    "n_trials",
    "jl_project",
    "inclusion_probability",
    "private_partition",
    "candidate",
    "swap_log_weights",
    "localswap",
    "gumbel_top_s",
    "sequential_exponential",
    "sparse_recovery",
    "clustering_loss",
    "clip_rows",
    "private_prototypes",
]


# ------------------------------------------------------------------------------ budget


@dataclass(frozen=True)
class BudgetSplit:
    """Per-step budgets of :func:`private_prototypes` (module docstring).

    Attributes: ``epsilon`` total; ``trials`` T; ``count`` (the silo's noisy row count, once);
    ``selection`` (final trial choice); per trial ``candidate``, ``localswap``, ``support``,
    ``values``.
    """

    epsilon: float
    trials: int
    count: float
    selection: float
    candidate: float
    localswap: float
    support: float
    values: float

    @property
    def per_trial(self) -> float:
        return self.candidate + self.localswap + self.support + self.values

    @property
    def total(self) -> float:
        """Sequential composition over the steps: equals ``epsilon``."""
        return self.count + self.selection + self.trials * self.per_trial


COUNT_SHARE = 1.0 / 20.0
"""Share of epsilon spent once on the silo's noisy row count (the prototypes' normaliser)."""


def n_trials(delta: float) -> int:
    """T = ceil(2 ln(1/delta)), at least 1 (Algorithm 2 line 1)."""
    return max(1, int(math.ceil(2.0 * math.log(1.0 / float(delta)))))


def budget_split(epsilon: float, trials: int) -> BudgetSplit:
    """The split of ``epsilon`` across the steps (module docstring, "Budget split")."""
    eps, T = float(epsilon), int(trials)
    cnt = eps * COUNT_SHARE
    sel = (eps - cnt) / 3.0 if T > 1 else 0.0
    eps_t = (eps - cnt - sel) / T
    return BudgetSplit(eps, T, cnt, sel, eps_t / 8.0, eps_t / 8.0, 3.0 * eps_t / 8.0, 3.0 * eps_t / 8.0)


# ------------------------------------------------------------------------------ helpers


def clip_rows(X: Any, s: int, Lambda: float, rng: np.random.Generator) -> sp.csr_matrix:
    """Rows with at most ``s`` non-zeros (a uniformly random subset kept) and values clipped
    to [0, Lambda]; (n x m) CSR float64. A per-record map: it costs no privacy."""
    A = sp.csr_matrix(X, dtype=np.float64, copy=True)
    A.data = np.clip(A.data, 0.0, float(Lambda))
    A.eliminate_zeros()
    counts = np.diff(A.indptr)
    if (counts > s).any():
        rows = np.repeat(np.arange(A.shape[0]), counts)
        order = np.lexsort((rng.random(rows.size), rows))
        rank = np.empty(rows.size, dtype=np.int64)
        rank[order] = np.arange(rows.size) - A.indptr[rows[order]]
        keep = rank < s
        A = sp.csr_matrix((A.data[keep], A.indices[keep], np.r_[0, np.cumsum(np.minimum(counts, s))]), shape=A.shape)
    return A


def jl_project(X: Any, p: int, rng: np.random.Generator) -> np.ndarray:
    """Y = X G^T / sqrt(p) with G ~ N(0,1)^{p x m} (Algorithm 2 line 3); (n x p)."""
    G = rng.standard_normal((int(p), X.shape[1]))
    Y = X @ G.T if sp.issparse(X) else np.asarray(X) @ G.T
    return np.asarray(Y) / math.sqrt(p)


def _clip_norm(Y: np.ndarray, bound: float) -> np.ndarray:
    norms = np.linalg.norm(Y, axis=1, keepdims=True)
    return Y * np.minimum(1.0, bound / np.maximum(norms, 1e-300))


def _sqdist(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances (len(A) x len(B)), dense inputs."""
    d = (A * A).sum(1)[:, None] - 2.0 * A @ B.T + (B * B).sum(1)[None, :]
    return np.maximum(d, 0.0)


def clustering_loss(X: Any, Z: np.ndarray) -> float:
    """k-means loss L(Z; X) = sum_i min_j ||x_i - z_j||^2 (eq. 3)."""
    Z = np.asarray(Z, dtype=np.float64)
    if sp.issparse(X):
        x2 = np.asarray(X.multiply(X).sum(1)).ravel()
        cross = np.asarray(X @ Z.T)
    else:
        X = np.asarray(X, dtype=np.float64)
        x2 = (X * X).sum(1)
        cross = X @ Z.T
    d = x2[:, None] - 2.0 * cross + (Z * Z).sum(1)[None, :]
    return float(np.maximum(d, 0.0).min(axis=1).sum())


# ------------------------------------------------------------------------------ Algorithms 4-5


def inclusion_probability(count: np.ndarray, eps_prime: float, gamma: float) -> np.ndarray:
    """f(m) of Algorithm 4 line 10: P(m + Lap(1/eps') >= gamma). f(m+1) / f(m) <= exp(eps')."""
    m = np.asarray(count, dtype=np.float64)
    z = eps_prime * (gamma - m)
    return np.where(m <= gamma, 0.5 * np.exp(-np.abs(z)), 1.0 - 0.5 * np.exp(-np.abs(z)))


def _pack_bits(bits: np.ndarray) -> np.ndarray:
    """Rows of a bool matrix as hashable keys (uint64 when p <= 63, else bytes)."""
    p = bits.shape[1]
    if p <= 63:
        return bits.astype(np.uint64) @ (np.uint64(1) << np.arange(p, dtype=np.uint64))
    packed = np.packbits(bits, axis=1)
    return packed.view(np.dtype((np.void, packed.shape[1]))).ravel()


def _nonempty_children(
    pair_cube: np.ndarray, keys: np.ndarray, bits: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The non-empty children (unique (cube, code) of the (cube, point) pairs): per pair its
    child, per child its point count, parent cube and (p,) side bits."""
    if not pair_cube.size:
        p = bits.shape[1]
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros((0, p), dtype=bool)
    order = np.lexsort((keys, pair_cube))
    c_sorted, k_sorted = pair_cube[order], keys[order]
    new = np.r_[True, (c_sorted[1:] != c_sorted[:-1]) | (k_sorted[1:] != k_sorted[:-1])]
    child_of_pair = np.empty(pair_cube.size, dtype=np.int64)
    child_of_pair[order] = np.cumsum(new) - 1
    first = order[new]
    return child_of_pair, np.bincount(child_of_pair), pair_cube[first], bits[first]


def _empty_children(
    rng: np.random.Generator, child_parent: np.ndarray, n_cubes: int, p: int, f0: float
) -> tuple[np.ndarray, np.ndarray]:
    """Empty children kept: Binomial(2^p - nonempty, f(0)) per active cube (Poisson beyond int64),
    at uniform positions -> (parent cube, (p,) side bits) per kept empty child."""
    n_children = 2.0**p
    nonempty = np.bincount(child_parent, minlength=n_cubes).astype(np.float64)
    if n_children <= 2.0**62:
        n_empty = rng.binomial((n_children - nonempty).astype(np.int64), f0)
    else:
        n_empty = rng.poisson((n_children - nonempty) * f0)
    e_parent = np.repeat(np.arange(n_cubes), n_empty)
    return e_parent, rng.random((e_parent.size, p)) < 0.5


def private_partition(
    Y: np.ndarray,
    lows: np.ndarray,
    side: float,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    n_public: int | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Algorithm 4 on G grids at once; the candidate centres (c x p) and diagnostics.

    ``lows`` (G x p): lower corners of the initial cubes Q (side ``side``); every grid runs with
    budget ``epsilon`` (eps' = epsilon / max(1, 2 ln n), depth capped at floor(max(1, 2 ln n))
    so the levels compose to <= epsilon), gamma = 20 ln(n / delta) / eps'. ``n_public``: the
    n of those formulas (a privatised row count; None: the true one, for tests).
    """
    Y = np.asarray(Y, dtype=np.float64)
    n, p = Y.shape
    n_eff = int(n_public) if n_public else n
    G = lows.shape[0]
    log_term = max(1.0, 2.0 * math.log(max(n_eff, 1)))
    eps_prime = float(epsilon) / log_term
    gamma = 20.0 / eps_prime * math.log(max(n_eff, 1) / float(delta))
    max_depth = int(math.floor(log_term))
    f0 = float(inclusion_probability(0, eps_prime, gamma))

    cube_low = np.asarray(lows, dtype=np.float64).copy()  # active cubes
    cube_side = float(side)
    # membership: (grid, point) pairs whose point lies in active cube `pair_cube`
    inside = np.all((Y[None, :, :] >= cube_low[:, None, :]) & (Y[None, :, :] < cube_low[:, None, :] + side), axis=2)
    pair_cube, pair_point = np.nonzero(inside)  # cube index == grid index at depth 0
    centers = [cube_low + cube_side / 2.0]
    added_total = 0
    depth = 0
    while depth < max_depth and cube_low.shape[0] > 0:
        depth += 1
        half = cube_side / 2.0
        mid = cube_low + half
        bits = Y[pair_point] >= mid[pair_cube]
        keys = _pack_bits(bits) if bits.size else np.zeros(0, dtype=np.uint64)
        child_of_pair, counts, child_parent, child_bits = _nonempty_children(pair_cube, keys, bits)
        keep = rng.random(counts.size) < inclusion_probability(counts, eps_prime, gamma)
        e_parent, e_bits = _empty_children(rng, child_parent, cube_low.shape[0], p, f0)
        added_total += int(keep.sum()) + int(e_parent.size)
        kept_index = -np.ones(counts.size, dtype=np.int64)
        kept_index[keep] = np.arange(int(keep.sum()))
        new_low = np.vstack(
            [cube_low[child_parent[keep]] + child_bits[keep] * half, cube_low[e_parent] + e_bits * half]
        )
        mapped = kept_index[child_of_pair] if child_of_pair.size else child_of_pair
        stay = mapped >= 0
        pair_cube, pair_point = mapped[stay], pair_point[stay]
        cube_low, cube_side = new_low, half
        if cube_low.shape[0]:
            centers.append(cube_low + cube_side / 2.0)
    C = np.vstack(centers)
    return C, {
        "eps_prime": eps_prime,
        "gamma": gamma,
        "max_depth": max_depth,
        "depth": depth,
        "added": added_total,
        "grids": G,
    }


def candidate(
    Y: np.ndarray,
    k: int,
    epsilon: float,
    delta: float,
    Lambda: float,
    rng: np.random.Generator,
    n_grids: int | None = None,
    n_public: int | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Algorithm 5: the union of ``private_partition`` over T_c = ceil(25 k ln(n/delta)) shifted
    grids, each with budget epsilon / T_c and delta / T_c (sequential composition: epsilon);
    ``n_public`` as in :func:`private_partition`."""
    n, p = Y.shape
    n_eff = int(n_public) if n_public else n
    T_c = int(n_grids) if n_grids else max(1, int(math.ceil(25 * k * math.log(max(n_eff, 2) / float(delta)))))
    v = rng.uniform(-Lambda, Lambda, size=(T_c, p))
    lows = -Lambda + v
    C, info = private_partition(Y, lows, 2.0 * Lambda, epsilon / T_c, delta / T_c, rng, n_public)
    info.update(n_grids=T_c, eps_grid=epsilon / T_c, eps_used=T_c * info["eps_prime"] * info["max_depth"])
    return C, info


# ------------------------------------------------------------------------------ Algorithm 6


def swap_log_weights(D: np.ndarray, Z: np.ndarray, eps_step: float, Lambda: float) -> tuple[np.ndarray, float]:
    """Log-probabilities (up to a constant) of every swap (x = Z[j] out, y in) of Algorithm 6
    line 4, shape (k x |C|) with -inf where y is already in Z; and L(Z).

    ``D``: (n x |C|) squared distances of the data to the candidates.
    """
    Dz = D[:, Z]
    k = Z.size
    order = np.argsort(Dz, axis=1)
    best = order[:, 0]
    d1 = Dz[np.arange(D.shape[0]), best]
    d2 = Dz[np.arange(D.shape[0]), order[:, 1]] if k > 1 else np.full(D.shape[0], np.inf)
    loss = float(d1.sum())
    # L(Z - Z[j] + y) = sum_i min(m_j[i], D[i, y]) with m_j = d1 except d2 on cluster j:
    # a common term over all points plus a correction over cluster j's points only (O(n |C|))
    base = np.minimum(d1[:, None], D)
    L = np.broadcast_to(base.sum(axis=0), (k, D.shape[1])).copy()
    corr = np.minimum(d2[:, None], D) - base
    np.add.at(L, best, corr)
    logw = -eps_step * (L - loss) / (8.0 * Lambda**2)
    logw[:, Z] = -np.inf
    return logw, loss


def localswap(
    Y: np.ndarray, C: np.ndarray, k: int, epsilon: float, Lambda: float, rng: np.random.Generator, iters: int = 100
) -> tuple[np.ndarray, dict[str, Any]]:
    """Algorithm 6: indices of k centres among the candidates ``C``.

    T_s = ``iters`` swaps and the final choice are T_s + 1 exponential mechanisms with
    eps_step = epsilon / (T_s + 1) each (sequential composition: epsilon).
    """
    D = _sqdist(np.asarray(Y, dtype=np.float64), np.asarray(C, dtype=np.float64))
    nC = C.shape[0]
    k = int(min(k, nC))
    T_s = int(iters)
    eps_step = float(epsilon) / (T_s + 1)
    Z = rng.choice(nC, size=k, replace=False)
    history, losses = [], []
    for _ in range(T_s):
        logw, loss = swap_log_weights(D, Z, eps_step, Lambda)
        if k >= nC:
            break
        flat = logw.ravel() + rng.gumbel(size=logw.size)
        j, y = divmod(int(np.argmax(flat)), nC)
        Z = Z.copy()
        Z[j] = y
        history.append(Z)
        losses.append(float(D[:, Z].min(axis=1).sum()))
    if not history:
        return Z, {"eps_step": eps_step, "iters": 0}
    losses_a = np.asarray(losses)
    pick = int(np.argmax(-eps_step * losses_a / (8.0 * Lambda**2) + rng.gumbel(size=losses_a.size)))
    return history[pick], {"eps_step": eps_step, "iters": T_s, "eps_used": eps_step * (T_s + 1), "loss": losses[pick]}


# ------------------------------------------------------------------------------ Algorithm 3


def gumbel_top_s(utility: np.ndarray, s: int, scale: np.ndarray | float, rng: np.random.Generator) -> np.ndarray:
    """Indices of the top-s of ``utility + Gumbel(0, scale)`` along the last axis, in order
    (largest first); shape (..., s). Equal in distribution to s sequential exponential
    mechanisms without replacement with weights exp(utility / scale) (Durfee & Rogers 2019)."""
    u = np.asarray(utility, dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64)
    if scale.ndim:
        scale = scale.reshape(scale.shape + (1,) * (u.ndim - scale.ndim))
    noisy = u + scale * rng.gumbel(size=u.shape)
    s = int(min(s, u.shape[-1]))
    part = (
        np.argpartition(-noisy, s - 1, axis=-1)[..., :s]
        if s < u.shape[-1]
        else np.broadcast_to(np.arange(u.shape[-1]), u.shape).copy()
    )
    vals = np.take_along_axis(noisy, part, axis=-1)
    return np.take_along_axis(part, np.argsort(-vals, axis=-1), axis=-1)


def sequential_exponential(utility: np.ndarray, s: int, scale: float, rng: np.random.Generator) -> np.ndarray:
    """Reference: s exponential-mechanism draws without replacement, P(i) proportional to
    exp(utility_i / scale) over the items not yet drawn (the authors' public code); (s,)."""
    u = np.asarray(utility, dtype=np.float64).ravel()
    avail = np.ones(u.size, dtype=bool)
    out = []
    for _ in range(int(min(s, u.size))):
        logits = np.where(avail, u / scale, -np.inf)
        w = np.exp(logits - logits.max())
        i = int(rng.choice(u.size, p=w / w.sum()))
        out.append(i)
        avail[i] = False
    return np.asarray(out, dtype=np.int64)


def sparse_recovery(
    X: Any,
    labels: np.ndarray,
    k: int,
    s: int,
    Lambda: float,
    eps_support: float,
    eps_values: float,
    rng: np.random.Generator,
    normaliser: float = 1.0,
) -> np.ndarray:
    """Algorithm 3 for all k clusters at once, on cluster SUMS; prototypes (k x m) in [0, Lambda].

    ``X``: (n x m) rows with entries in [0, Lambda] and ||x||_0 <= s; ``labels``: (n,) cluster
    of each row; ``normaliser``: a public (or already privatised) divisor turning sums into
    means — :func:`private_prototypes` passes the noisy silo size over k.

    Cluster j with sum S_j = sum of its rows (m,): adding or removing one row moves every
    coordinate of one S_j by at most Lambda, in the same direction (monotone utility), and
    moves S_j by at most s Lambda in L1. So

    - support I_j = Gumbel top-s of S_j with scale s Lambda / eps_support: by Durfee & Rogers
      (2019) the s sequential exponential mechanisms exp(eps' S_ji / Lambda) with eps' =
      eps_support / s each, which for a monotone utility are eps'-DP each (no factor 2);
    - values S_ji + Laplace(s Lambda / eps_values) on I_j (L1 sensitivity of S_j restricted to
      s coordinates is s Lambda), 0 elsewhere;
    - prototype = clip(values / normaliser, 0, Lambda) (post-processing).

    The scales do not depend on the cluster sizes n_j (data-dependent: the paper's and our
    former 2 s Lambda / (eps n_j) made the noise scale itself depend on the private partition).
    In mean units the noise is s Lambda / (eps normaliser), half the paper's 2 s Lambda / (eps n)
    for clusters of the average size.
    """
    n, m = X.shape
    ind = sp.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(k, n))
    sums = ind @ X
    S = sums.toarray() if sp.issparse(sums) else np.asarray(sums, dtype=np.float64)
    s = int(min(s, m))
    support = gumbel_top_s(S, s, s * float(Lambda) / eps_support, rng)
    rows = np.repeat(np.arange(k), s)
    cols = support.ravel()
    noisy = S[rows, cols] + rng.laplace(0.0, s * float(Lambda) / eps_values, size=cols.size)
    P = np.zeros((k, m))
    P[rows, cols] = np.clip(noisy / float(normaliser), 0.0, Lambda)
    return P


# ------------------------------------------------------------------------------ Algorithm 2


@dataclass
class PrototypeResult:
    """Output of :func:`private_prototypes`: ``prototypes`` (k x m) and ``info`` (JSON-able)."""

    prototypes: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)


def private_prototypes(
    X: Any,
    k: int,
    epsilon: float,
    delta: float,
    Lambda: float,
    s: int,
    rng: np.random.Generator,
    trials: int | None = None,
    swap_iters: int = 100,
    n_grids: int | None = None,
) -> PrototypeResult:
    """Algorithm 2: k epsilon-DP prototypes (k x m) of the rows of ``X`` (n x m, non-negative).

    ``Lambda``: public bound on every entry; ``s``: public bound on non-zeros per row (rows are
    clipped to both first, :func:`clip_rows`); ``trials``: T (None: ceil(2 ln(1/delta)));
    ``swap_iters``: localswap length; ``n_grids``: T_c (None: ceil(25 k ln(n/delta))).
    """
    A = clip_rows(X, int(s), float(Lambda), rng)
    n, m = A.shape
    T = int(trials) if trials else n_trials(delta)
    budget = budget_split(epsilon, T)
    Lambda_Y = float(Lambda) * math.sqrt(max(int(s), 1))
    # noisy silo size (sensitivity 1, budget.count): the divisor of the cluster sums, and the n of
    # every structural formula (p, T_c, depth, eps', gamma), which must not use the private n
    n_noisy = n + rng.laplace(0.0, 1.0 / budget.count)
    normaliser = max(float(n_noisy), float(k)) / float(k)
    n_pub = max(2, int(round(n_noisy)))
    p = max(1, int(math.ceil(8.0 * math.log(n_pub))))
    outs, losses, infos = [], [], []
    for _ in range(T):
        Y = _clip_norm(jl_project(A, p, rng), Lambda_Y)
        C, cinfo = candidate(Y, k, budget.candidate, delta, Lambda_Y, rng, n_grids, n_pub)
        # candidates are DP outputs; pulling them into the Lambda_Y ball (post-processing) is what
        # bounds localswap's loss sensitivity by 4 Lambda_Y^2 (grid centres reach 2 Lambda_Y sqrt(p))
        C = _clip_norm(C, Lambda_Y)
        Zi, linfo = localswap(Y, C, k, budget.localswap, Lambda_Y, rng, swap_iters)
        labels = np.argmin(_sqdist(Y, C[Zi]), axis=1) if n else np.zeros(0, dtype=np.int64)
        P = sparse_recovery(A, labels, int(k), int(s), float(Lambda), budget.support, budget.values, rng, normaliser)
        outs.append(P)
        losses.append(clustering_loss(A, P))
        infos.append(
            {
                "candidates": int(C.shape[0]),
                "grids": cinfo["n_grids"],
                "partition_cubes_added": cinfo["added"],
                "gamma": cinfo["gamma"],
                "cluster_sizes": np.bincount(labels, minlength=int(k)).tolist(),
            }
        )
    losses_a = np.asarray(losses)
    if T > 1:
        sens = 4.0 * float(Lambda) ** 2 * max(int(s), 1)
        pick = int(np.argmax(-budget.selection * losses_a / (2.0 * sens) + rng.gumbel(size=T)))
    else:
        pick = 0
    info = {
        "trials": T,
        "p": p,
        "picked": pick,
        "loss": float(losses_a[pick]),
        "budget": {
            k_: getattr(budget, k_)
            for k_ in ("epsilon", "count", "selection", "candidate", "localswap", "support", "values")
        },
        "normaliser": normaliser,
        "n_public": n_pub,
        **infos[pick],
    }
    return PrototypeResult(outs[pick], info)

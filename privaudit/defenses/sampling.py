"""Defense ``sampling``: every client adds random unrated items to what it trains on and uploads.

Each client u with rated items I_u draws ``k_u = round(rho * |I_u|)`` unrated items S_u and
uploads gradients for I_u ∪ S_u, so that an observer of the item sets alone picks a rated item
with chance about 1 / (1 + rho) (PrivMVMF paper §5; FedRec paper §4). The virtual entries are
filled as PrivMVMF (rating 0, weight w) or FedRec (user average, hybrid) do. Items are drawn
uniformly (the papers'), by popularity, or ``matched`` to the items' rating counts
(:func:`sample_matched`); :func:`item_set_guess` measures what the item sets still leak. The
matched-sampling derivation and what it does not hide: ``docs/sampling.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.defenses.base import ClientData, Defense, VirtualRatings
from privaudit.params import Param
from privaudit.registry import register_defense

FILLINGS = ("weight", "ua", "hf")
DISTRIBUTIONS = ("uniform", "popularity", "matched")
DEFAULT_W = 0.2  # FedMVMF's default w (a test keeps them equal): the weight when the defense sets none


def sample_unrated(
    rated: sp.csr_matrix,
    rho: float,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
    chunk_entries: int = 20_000_000,
    n_rated: np.ndarray | None = None,
) -> sp.csr_matrix:
    """Boolean csr (n x m) of sampled unrated items, ``round(rho * |I_u|)`` per user.

    Parameters
    ----------
    rated : csr (n x m); its explicit entries are the rated items.
    rho : sampling ratio (>= 0).
    weights : optional (m,) positive item weights (sampling without replacement proportional
        to them); ``None`` = uniform.
    chunk_entries : bound on the size of the random-key block (users x items) drawn at once.
    n_rated : optional (n,) counts |I_u| that set k_u (default: the entries of ``rated``, which
        are always excluded from the sample).
    """
    rated = sp.csr_matrix(rated)
    n, m = rated.shape
    present = np.diff(rated.indptr)
    n_rated = present if n_rated is None else np.asarray(n_rated, dtype=np.int64)
    k = np.minimum(np.floor(rho * n_rated + 0.5).astype(np.int64), m - present)
    rows_out, cols_out = [], []
    logw = None if weights is None else np.log(np.asarray(weights, dtype=np.float64))
    for start, stop in _row_blocks(n, m, chunk_entries):
        kk = k[start:stop]
        if kk.sum() == 0:
            continue
        keys = rng.random((stop - start, m))
        if logw is not None:
            # Gumbel top-k: smallest of -(log w + Gumbel) == largest log w + Gumbel
            keys = -(logw[None, :] - np.log(-np.log(keys)))
        block = rated[start:stop]
        r_rows = np.repeat(np.arange(stop - start), np.diff(block.indptr))
        keys[r_rows, block.indices] = np.inf
        kmax = int(kk.max())
        part = np.argpartition(keys, kmax - 1, axis=1)[:, :kmax] if kmax < m else np.argsort(keys, axis=1)
        part_keys = np.take_along_axis(keys, part, axis=1)
        order = np.argsort(part_keys, axis=1)
        part = np.take_along_axis(part, order, axis=1)
        take = np.arange(part.shape[1])[None, :] < kk[:, None]
        rr, cc = np.nonzero(take)
        rows_out.append(rr + start)
        cols_out.append(part[rr, cc])
    return _bool_csr(rows_out, cols_out, (n, m))


# ------------------------------------------------------------------ distribution=matched

MATCHED_W_CAP = 1e12  # weight of items that cannot be matched (sampled by every non-rater)


def _row_blocks(n: int, m: int, chunk_entries: int):
    step = max(1, chunk_entries // max(m, 1))
    for start in range(0, n, step):
        yield start, min(n, start + step)


def _bool_csr(rows_out: list[np.ndarray], cols_out: list[np.ndarray], shape: tuple[int, int]) -> sp.csr_matrix:
    """Boolean csr of the concatenated (row, column) blocks, indices sorted."""
    rows = np.concatenate(rows_out) if rows_out else np.empty(0, np.int64)
    cols = np.concatenate(cols_out) if cols_out else np.empty(0, np.int64)
    out = sp.csr_matrix((np.ones(len(rows), dtype=bool), (rows, cols)), shape=shape)
    out.sort_indices()
    return out


def _unrated_mask(present: sp.csr_matrix, start: int, stop: int) -> np.ndarray:
    block = present[start:stop]
    mask = np.ones(block.shape, dtype=bool)
    mask[np.repeat(np.arange(stop - start), np.diff(block.indptr)), block.indices] = False
    return mask


def water_fill(mask: np.ndarray, w: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per-row lambda with ``sum_j mask_uj * min(1, lambda_u * w_j) = k_u`` (vectorized).

    mask : bool (b x m) items a row may draw; w : (m,) positive weights; k : (b,) sample sizes
    with ``k_u <= mask[u].sum()``. Returns lambda (b,), ``inf`` where every allowed item is
    taken with probability 1, ``0`` where k_u = 0.
    """
    order = np.argsort(-w, kind="stable")
    ws = w[order]
    ms = mask[:, order]
    wm = ms * ws[None, :]
    tail = np.cumsum(wm[:, ::-1], axis=1)[:, ::-1]  # sum_{i >= t} of allowed weights
    capped_before = np.cumsum(ms, axis=1) - ms  # allowed items ranked before t (taken with prob. 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lam_t = (k[:, None] - capped_before) / tail
        ok = ms & (lam_t * ws[None, :] <= 1.0 + 1e-12) & (k[:, None] - capped_before >= 0)
    first = np.argmax(ok, axis=1)
    any_ok = ok[np.arange(len(k)), first]
    lam = np.where(any_ok, lam_t[np.arange(len(k)), first], np.inf)
    return np.where(k > 0, lam, 0.0)


def inclusion_probabilities(mask: np.ndarray, w: np.ndarray, k: np.ndarray) -> np.ndarray:
    """pi (b x m): ``min(1, lambda_u w_j)`` on the allowed items (``mask``), 0 elsewhere, with
    lambda_u from :func:`water_fill` so that each row sums to k_u."""
    lam = water_fill(mask, w, k)
    with np.errstate(over="ignore", invalid="ignore"):
        pi = np.minimum(1.0, np.nan_to_num(lam[:, None] * w[None, :], nan=0.0, posinf=1.0))
    return pi * mask


def matched_weights(
    present: sp.csr_matrix,
    k: np.ndarray,
    target: np.ndarray,
    iters: int = 200,
    tol: float = 1e-3,
    chunk_entries: int = 20_000_000,
    stall: int = 20,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Item weights w (m,) whose per-client inclusion probabilities match per-item targets.

    Client u draws k_u of its unrated items (``present`` csr n x m marks the others) with
    inclusion probabilities ``pi_uj = min(1, lambda_u w_j)``, lambda_u fitted locally by
    :func:`water_fill` so that sum_j pi_uj = k_u. Iterative proportional fitting on w makes the
    expected number of clients sampling item j, ``A_j = sum_u pi_uj``, equal ``target_j``
    (= rho n_j). Items whose target exceeds the number of clients who can sample them
    (``target_j > N - n_j``, i.e. n_j > N / (1 + rho)) cannot be matched: they get the weight
    :data:`MATCHED_W_CAP` (every non-rater samples them); items whose target is below the
    number of clients forced to sample every unrated item (k_u = all of them: heavy raters at
    large rho) cannot be matched either (``floored``: weight ~0, sampled only by those clients).

    Each iteration needs only per-item sums over clients (A_j) — what one secure-aggregation
    round (Paillier sum) returns; lambda_u is each client's own.

    Returns
    -------
    w : (m,) weights; info : dict with ``expected`` (A, m), ``target``, ``capped`` (bool m),
    ``iterations``, ``max_rel_error`` (over matchable items with target > 0).
    """
    present = sp.csr_matrix(present)
    n, m = present.shape
    k = np.asarray(k, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    avail = n - np.bincount(present.indices, minlength=m)
    capped = target > avail
    # clients with k_u = all their unrated items sample every item they did not rate
    allowed = m - np.diff(present.indptr)
    forced = np.flatnonzero((k >= allowed) & (k > 0))
    floor = len(forced) - np.bincount(present[forced].indices, minlength=m) if len(forced) else np.zeros(m)
    floored = ~capped & (target < floor)
    active = (target > 0) & ~capped & ~floored
    w = np.where(active, np.maximum(target, 1e-9) / np.maximum(avail, 1), 1e-12)
    w[floored] = 1e-300
    w[capped] = MATCHED_W_CAP
    err = np.inf
    it = 0
    history: list[float] = []
    for it in range(1, iters + 1):  # noqa: B007 (it is read after the loop)
        A = np.zeros(m)
        for start, stop in _row_blocks(n, m, chunk_entries):
            A += inclusion_probabilities(_unrated_mask(present, start, stop), w, k[start:stop]).sum(0)
        # the matchable items share what the others leave of sum_u k_u: rescale their targets to
        # that mass, so that s_j stays proportional to n_j (one common posterior) when the
        # unmatchable items or the clients' caps make rho x n_j infeasible in total
        scale = max(float(k.sum() - A[~active].sum()), 0.0) / max(float(target[active].sum()), 1e-300)
        goal = target * scale
        rel = np.abs(A[active] - goal[active]) / goal[active]
        err = float(rel.max()) if rel.size else 0.0
        if err < tol:
            break
        history.append(err)
        if len(history) > stall and history[-1] > 0.99 * history[-1 - stall]:
            break  # infeasible (client caps): no progress over ``stall`` rounds
        ratio = np.where(active, goal / np.maximum(A, 1e-300), 1.0)
        w = np.where(active, np.clip(w * np.clip(ratio, 0.1, 10.0), 1e-300, MATCHED_W_CAP), w)
    return w, {
        "expected": A,
        "target": target,
        "scale": scale,
        "capped": capped,
        "floored": floored,
        "iterations": it,
        "max_rel_error": err,
    }


def sample_with_probabilities(
    present: sp.csr_matrix, w: np.ndarray, k: np.ndarray, rng: np.random.Generator, chunk_entries: int = 20_000_000
) -> sp.csr_matrix:
    """Boolean csr (n x m): k_u unrated items per client, item j with probability min(1, lambda_u w_j).

    Systematic sampling in a fresh random item order per client (Madow): exact first-order
    inclusion probabilities and exactly k_u items (k_u <= number of unrated items).
    """
    present = sp.csr_matrix(present)
    n, m = present.shape
    k = np.asarray(k, dtype=np.float64)
    rows_out, cols_out = [], []
    for start, stop in _row_blocks(n, m, chunk_entries):
        kk = k[start:stop]
        if kk.sum() == 0:
            continue
        pi = inclusion_probabilities(_unrated_mask(present, start, stop), w, kk)
        total = pi.sum(1)
        pi *= np.where(total > 0, kk / np.where(total > 0, total, 1.0), 0.0)[:, None]  # remove rounding drift
        perm = np.argsort(rng.random(pi.shape), axis=1)
        cs = np.cumsum(np.take_along_axis(pi, perm, axis=1), axis=1)
        u = rng.random((stop - start, 1))
        hits = np.floor(cs + u - 1e-9) - np.floor(
            np.concatenate([np.zeros((stop - start, 1)), cs[:, :-1]], axis=1) + u - 1e-9
        )
        rr, cc = np.nonzero(hits > 0)
        rows_out.append(rr + start)
        cols_out.append(perm[rr, cc])
    return _bool_csr(rows_out, cols_out, (n, m))


def sample_matched(
    present: sp.csr_matrix,
    real: sp.csr_matrix,
    rho: float,
    rng: np.random.Generator,
    groups: int = 4,
    iters: int = 200,
    min_samplers: float = 0.0,
) -> tuple[sp.csr_matrix, dict[str, Any]]:
    """``distribution=matched``: per activity group, item j is sampled by ~rho x its raters.

    Clients are split into ``groups`` quantile groups of |I_u| (public: the server sees
    |I_u ∪ S_u| = (1 + rho)|I_u|). In group b, :func:`matched_weights` fits the weights to the
    group's rating counts n_jb (target s_jb = rho n_jb), then each client draws
    round(rho |I_u|) unrated items with :func:`sample_with_probabilities`. The server's
    posterior that an uploaded item j of a group-b client is rated is then n_jb / (n_jb + s_jb)
    = 1 / (1 + rho) for every matchable item, whatever it ranks the items by.
    ``min_samplers`` adds that many expected samplers (over all groups) to every rated item:
    an item uploaded by a single client exposes that client's gradient row to a server that
    sees only sums (``mvmf-aggregate``); the floor lowers the posterior of rare items below
    1 / (1 + rho) (they look less rated, not more).

    present : csr (n x m) every entry already trained on (never sampled); real : csr (n x m)
    the real ratings (their per-group column counts are the aggregate n_jb).

    Returns the boolean csr (n x m) of sampled items and a dict: ``groups`` (per group:
    ``users``, ``iterations``, ``max_rel_error``, ``scale``, ``capped``, ``floored`` counts),
    ``capped_uploads`` (share of the expected sampled uploads that go to capped items).
    """
    present = sp.csr_matrix(present)
    real = sp.csr_matrix(real)
    n, m = present.shape
    n_real = np.diff(real.indptr)
    k = np.minimum(np.floor(rho * n_real + 0.5), m - np.diff(present.indptr)).astype(np.float64)
    groups = max(1, min(int(groups), n))
    rated_any = np.bincount(real.indices, minlength=m) > 0
    edges = np.quantile(n_real, np.linspace(0.0, 1.0, groups + 1)[1:-1]) if groups > 1 else np.empty(0)
    group = np.searchsorted(edges, n_real, side="right")
    rows_out, cols_out, per_group = [], [], []
    capped_mass = 0.0
    for b in np.unique(group):
        idx = np.flatnonzero(group == b)
        counts = np.bincount(real[idx].indices, minlength=m).astype(np.float64)
        # + a floor of min_samplers expected samplers per rated item (shared by the groups in
        # proportion to their size), so that rarely rated items are not uploaded by one client only
        target = rho * counts + min_samplers * (len(idx) / n) * rated_any
        w, info = matched_weights(present[idx], k[idx], target, iters=iters)
        s = sample_with_probabilities(present[idx], w, k[idx], rng).tocoo()
        rows_out.append(idx[s.row])
        cols_out.append(s.col)
        capped_mass += float(info["expected"][info["capped"]].sum())
        per_group.append(
            {
                "users": int(len(idx)),
                "iterations": int(info["iterations"]),
                "max_rel_error": float(info["max_rel_error"]),
                "scale": float(info["scale"]),
                "capped": int(info["capped"].sum()),
                "floored": int(info["floored"].sum()),
            }
        )
    return _bool_csr(rows_out, cols_out, (n, m)), {
        "groups": per_group,
        "capped_uploads": capped_mass / max(float(k.sum()), 1.0),
    }


def add_virtual(data: ClientData, sampled: sp.csr_matrix, values: np.ndarray, weight: float | np.ndarray) -> ClientData:
    """``data`` plus virtual entries at the True entries of ``sampled``.

    values : (n,) virtual rating per user; weight : scalar or (n,) confidence per user.
    """
    s = sp.csr_matrix(sampled)
    rows = np.repeat(np.arange(s.shape[0]), np.diff(s.indptr))
    cols = s.indices
    vals = np.asarray(values, dtype=np.float64)[rows]
    wts = np.broadcast_to(np.asarray(weight, dtype=np.float64), (s.shape[0],))[rows]
    r0 = data.ratings.tocoo()
    w0 = data.weights.tocoo()
    v0 = data.virtual.tocoo()

    def merged(base, extra, dtype):
        m = sp.csr_matrix(
            (
                np.concatenate([base.data.astype(dtype), extra.astype(dtype)]),
                (np.concatenate([base.row, rows]), np.concatenate([base.col, cols])),
            ),
            shape=data.ratings.shape,
        )
        m.sort_indices()
        return m

    # build the three matrices on one common sparsity pattern (explicit zeros kept)
    ratings = merged(r0, vals, np.float64)
    weights = merged(w0, wts, np.float64)
    virtual = merged(v0, np.ones(len(rows), dtype=bool), bool)
    return ClientData(ratings, weights, virtual)


@register_defense("sampling")
class SamplingDefense(Defense):
    """Each client adds round(rho x |rated|) random unrated items (PrivMVMF eq. 36, FedRec UA/HF)."""

    description = "clients upload for random unrated items too (rho x |rated|): PrivMVMF weight w, FedRec UA/HF filling"
    parameters = (
        Param("rho", 1.0, "sampled unrated items per rated item (0 = off)", ge=0),
        Param(
            "filling",
            "weight",
            "virtual ratings: weight (0 with confidence w, PrivMVMF eq. 36), ua (user average), hf (hybrid, FedRec)",
            choices=FILLINGS,
        ),
        Param(
            "w",
            None,
            "confidence of sampled items for filling=weight (default: privmvmf's w, else FedMVMF's default w)",
            type=float,
            ge=0,
        ),
        Param(
            "distribution",
            "uniform",
            "uniform (papers), popularity (weights 1 + rating count) or matched (expected "
            "samplers of item j = rho x its raters, so every uploaded item is rated with probability ~1/(1+rho); "
            "extensions)",
            choices=DISTRIBUTIONS,
        ),
        Param("popularity_floor", 1.0, "added to every item's rating count for distribution=popularity", gt=0),
        Param(
            "matched_iters",
            200,
            "distribution=matched: most fitting rounds (each = one per-item aggregate in a deployment)",
            ge=1,
        ),
        Param(
            "matched_groups",
            4,
            "distribution=matched: match per group of clients with similar |rated| (quantiles; 1 = all)",
            ge=1,
        ),
        Param(
            "matched_min_samplers",
            1.0,
            "distribution=matched: extra expected samplers of every rated item (no item uploaded by one client only)",
            ge=0,
        ),
        Param(
            "t_predict",
            None,
            "FedRec HF: round after which virtual ratings become local predictions (default: the "
            "protocol's, FedRec 10)",
            type=int,
            ge=0,
        ),
        Param(
            "t_local",
            None,
            "FedRec HF: local rounds between prediction refreshes (default: the protocol's, FedRec 5)",
            type=int,
            ge=1,
        ),
    )
    strength = "rho"
    acts_on = (("grad_V", "items"), ("grad_W", "items"))  # the virtual items join the uploaded rows
    default_grid = (0, 1, 2, 3)

    @property
    def weight(self) -> float:
        """Confidence of sampled items (filling=weight).

        ``w`` if set; otherwise FedMVMF's default ``w`` (``privmvmf`` fills in its own ``w``
        before training; with ``fedmvmf`` and a non-default ``w``, set the defense's ``w`` too).
        """
        if self.config["w"] is not None:
            return float(self.config["w"])
        return DEFAULT_W

    def virtual_ratings(self) -> VirtualRatings:
        """The clients' filling rule for the sampled items (FedRec's Algorithm 3 reads it)."""
        c = self.config
        return VirtualRatings(str(c["filling"]), c["t_predict"], c["t_local"])

    def with_protocol_defaults(self, values: Mapping[str, Any]) -> SamplingDefense:
        """With filling=weight and no ``w`` of its own: a copy weighing sampled items by the protocol's ``w``."""
        if self.config["filling"] == "weight" and self.config["w"] is None and values.get("w") is not None:
            return type(self)(**{**self.config, "w": values["w"]})
        return self

    def on_client_data(self, data: Any, rng: np.random.Generator) -> Any:
        """Add the virtual entries to a :class:`ClientData` (other data passes unchanged)."""
        if not isinstance(data, ClientData) or self.config["rho"] == 0:
            return data
        present = sp.csr_matrix(data.ratings)  # every entry already trained on (excluded from sampling)
        real = present.copy()
        if data.virtual.nnz:  # same sparsity pattern as ratings: drop earlier virtual entries
            real.data = np.where(data.virtual.data, np.nan, real.data)
            keep = ~np.isnan(real.data)
            coo = real.tocoo()
            real = sp.csr_matrix((coo.data[keep], (coo.row[keep], coo.col[keep])), shape=real.shape)
        weights = None
        rho = float(self.config["rho"])
        n_real = np.diff(real.indptr)
        if self.config["distribution"] == "matched":
            sampled, self.matched_info = sample_matched(
                present,
                real,
                rho,
                rng,
                int(self.config["matched_groups"]),
                int(self.config["matched_iters"]),
                float(self.config["matched_min_samplers"]),
            )
        else:
            if self.config["distribution"] == "popularity":
                counts = np.bincount(real.indices, minlength=real.shape[1]).astype(np.float64)
                weights = counts + self.config["popularity_floor"]
            sampled = sample_unrated(present, rho, rng, weights, n_rated=n_real)
        if self.config["filling"] == "weight":
            values = np.zeros(real.shape[0])
            weight: float | np.ndarray = self.weight
        else:
            nnz = np.diff(real.indptr)
            sums = np.add.reduceat(real.data, real.indptr[:-1]) if real.nnz else np.zeros(real.shape[0])
            values = np.where(nnz > 0, sums / np.maximum(nnz, 1), 0.0)
            weight = 1.0
        return add_virtual(data, sampled, values, weight)


#: Rankings an observer of the uploaded item sets may use (:func:`item_set_guess`).
GUESS_STRATEGIES = ("uniform", "popularity", "rarity", "counts", "cooccurrence", "lowrank", "lowrank_centered")


def _upload_matrix(sets: list[np.ndarray], m: int) -> sp.csr_matrix:
    """The (n_users, m) 0/1 indicator of the uploaded item sets."""
    lens = np.array([len(x) for x in sets])
    return sp.csr_matrix(
        (np.ones(int(lens.sum())), (np.repeat(np.arange(len(sets)), lens), np.concatenate(sets) if sets else [])),
        shape=(len(sets), m),
    )


def _cooccurrence_scorer(S: sp.csr_matrix):
    """score(u, items): the lift of each item with the user's other uploaded items in the other
    users' sets (dense (m, m) co-upload counts)."""
    C = (S.T @ S).toarray()
    c = np.diag(C).copy()
    inv = np.where(c > 1, 1.0 / np.maximum(c - 1, 1), 0.0)  # 1 / c_-u for an item in u's set
    SA = S.multiply(inv[None, :]).tocsr()
    AC = np.asarray(SA @ C)  # AC[u, j] = sum_{l in set_u} C[l, j] / c_-u[l]
    rowsum = np.asarray(SA.sum(axis=1)).ravel()

    def score_of(u, items):
        # remove l = j and user u's own co-upload (C_-u[l, j] = C[l, j] - 1 for l, j in set_u)
        num = AC[u, items] - c[items] * inv[items] - (rowsum[u] - inv[items])
        return num * inv[items]

    return score_of


def _lowrank_scorer(S: sp.csr_matrix, rank: int, centered: bool):
    """score(u, items) from the rank-``rank`` truncated SVD of the upload indicator ``S``
    (``centered``: of its residual after the independence term, dense)."""
    r = min(int(rank), min(S.shape) - 1)
    if not centered:
        from scipy.sparse.linalg import svds

        U, s, Vt = svds(S, k=r, random_state=0)
    else:
        dense = S.toarray()
        dense -= np.outer(dense.sum(1), dense.sum(0)) / max(dense.sum(), 1.0)
        U, s, Vt = np.linalg.svd(dense, full_matrices=False)
        U, s, Vt = U[:, :r], s[:r], Vt[:r]
    US = U * s[None, :]
    return lambda u, items: US[u] @ Vt[:, items]


def item_set_guess(
    item_sets: list[np.ndarray],
    rated_sets: list[np.ndarray],
    rho: float,
    strategy: str = "uniform",
    item_counts: np.ndarray | None = None,
    rank: int = 20,
) -> dict[str, float]:
    """How well an observer of the uploaded item sets alone picks out rated items.

    Parameters
    ----------
    item_sets : per user, the uploaded item ids I_u ∪ S_u (what the server sees).
    rated_sets : per user, the truly rated items I_u (ground truth).
    rho : the public sampling ratio (the observer guesses |I_u| = |set| / (1 + rho)).
    strategy : the observer's ranking of each user's uploaded items; it guesses the top
        round(|set| / (1 + rho)) (ties broken by item id):

        - ``uniform`` — no item prior: any uploaded item is rated with probability
          |I_u| / |set| (the expected precision is returned exactly);
        - ``popularity`` — by c_j, how many users uploaded item j (public from the item ids);
        - ``rarity`` — by -c_j (the reverse; beats chance where sampling over-corrects);
        - ``counts`` — by ``item_counts`` (m,), e.g. the true rating counts n_j if the server
          knew them (an aggregate count round, ``distribution=matched``, reveals them);
        - ``cooccurrence`` — by how strongly item j co-occurs with the user's other uploaded
          items in the other users' sets: score(u, j) = sum over l in set_u, l != j of
          C_-u[j, l] / (c_-u[j] c_-u[l]) (a lift; C = item co-upload counts, c its diagonal,
          ``_-u`` = without user u's own set). Rated items share tastes, sampled ones do not.
          Dense (m x m) co-upload matrix;
        - ``lowrank`` — by the rank-``rank`` truncated SVD of the n x m upload-indicator
          matrix (implicit-feedback collaborative filtering on the sets: rated items follow
          the users' tastes, sampled ones do not); ``lowrank_centered`` — the same on the
          residual after the independence term r_u c_j / total (taste without the margins;
          dense n x m).

    Returns
    -------
    dict with ``precision`` (fraction of guessed items that are rated, averaged over users),
    ``chance`` (= 1 / (1 + rho)) and ``users``.
    """
    if strategy not in GUESS_STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(GUESS_STRATEGIES)}")
    sets = [np.asarray(x, dtype=np.int64) for x in item_sets]
    m = int(max((int(x.max()) for x in sets if len(x)), default=-1)) + 1
    if item_counts is not None:
        m = max(m, len(item_counts))
    score_of = None
    if strategy in ("popularity", "rarity"):
        allitems = np.concatenate(sets) if sets else np.empty(0, np.int64)
        pop = np.bincount(allitems, minlength=m).astype(np.float64)
        sign = 1.0 if strategy == "popularity" else -1.0
        score_of = lambda u, items: sign * pop[items]  # noqa: E731
    elif strategy == "counts":
        if item_counts is None:
            raise ValueError("strategy counts needs item_counts")
        cnt = np.asarray(item_counts, dtype=np.float64)
        score_of = lambda u, items: cnt[items]  # noqa: E731
    elif strategy == "cooccurrence":
        score_of = _cooccurrence_scorer(_upload_matrix(sets, m))
    elif strategy in ("lowrank", "lowrank_centered"):
        score_of = _lowrank_scorer(_upload_matrix(sets, m), rank, centered=strategy == "lowrank_centered")

    precisions = []
    for u, (items, rated) in enumerate(zip(sets, rated_sets)):
        if len(items) == 0:
            continue
        is_rated = np.isin(items, np.asarray(rated, dtype=np.int64))
        if strategy == "uniform":
            precisions.append(is_rated.mean())
        else:
            k = max(1, int(np.floor(len(items) / (1.0 + rho) + 0.5)))
            order = np.lexsort((items, -score_of(u, items)))[:k]
            precisions.append(is_rated[order].mean())
    return {
        "precision": float(np.mean(precisions)) if precisions else float("nan"),
        "chance": 1.0 / (1.0 + rho),
        "users": float(len(precisions)),
    }

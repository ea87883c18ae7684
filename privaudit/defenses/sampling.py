"""Defense ``sampling``: every client adds random unrated items to what it trains on and uploads.

Each client u with rated items I_u draws ``k_u = round(rho * |I_u|)`` items S_u uniformly
without replacement among its unrated items (capped at their number; round half up) and
uploads gradients for I_u ∪ S_u, so an observer of the item sets alone cannot tell a rated
item from a sampled one beyond chance |I_u| / (|I_u| + k_u) ≈ 1 / (1 + rho)
(privmvmf.txt §5, the paragraph after eq. 36; fedrec.txt §4 for FedRec).

Fillings of the virtual entries (what the client trains on):

- ``weight`` (PrivMVMF, privmvmf.txt eq. 36): rating 0 with confidence ``c_ui = w``;
- ``ua`` (FedRec user-average filling): rating = the user's mean real rating, confidence 1;
- ``hf`` (FedRec hybrid filling): as ``ua`` at the start; the FedRec protocol replaces the
  virtual ratings by its local predictions after round ``t_predict`` (public config carried
  here: ``t_predict``, ``t_local``).

Vectorized: one pass over all users (random keys for every (user, item) pair, rated pairs
excluded, per-row selection of the k_u smallest keys), chunked by users for large catalogs.
``distribution="popularity"`` (an extension, not in the papers) samples unrated items with
probability proportional to ``popularity_floor + (number of users who rated them)`` (Gumbel
top-k = successive sampling without replacement), so that sampled items look like rated ones
to an observer who ranks uploaded items by popularity; the uniform default is the papers'.

:func:`item_set_guess` measures what the item sets leak (tests, docs/reproduction.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.defenses.base import ClientData, Defense
from privaudit.errors import PrivauditError
from privaudit.registry import register_defense

FILLINGS = ("weight", "ua", "hf")
DISTRIBUTIONS = ("uniform", "popularity")
DEFAULT_W = 0.2  # last resort when neither the defense nor FedMVMF's defaults give the weight


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
    step = max(1, chunk_entries // max(m, 1))
    logw = None if weights is None else np.log(np.asarray(weights, dtype=np.float64))
    for start in range(0, n, step):
        stop = min(n, start + step)
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
    if rows_out:
        rows = np.concatenate(rows_out)
        cols = np.concatenate(cols_out)
    else:
        rows = cols = np.empty(0, dtype=np.int64)
    out = sp.csr_matrix((np.ones(len(rows), dtype=bool), (rows, cols)), shape=(n, m))
    out.sort_indices()
    return out


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
            (np.concatenate([base.data.astype(dtype), extra.astype(dtype)]),
             (np.concatenate([base.row, rows]), np.concatenate([base.col, cols]))),
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
    params = {
        "rho": 1.0,
        "filling": "weight",
        "w": None,
        "distribution": "uniform",
        "popularity_floor": 1.0,
        "t_predict": None,
        "t_local": None,
    }
    param_help = {
        "rho": "sampled unrated items per rated item (0 = off)",
        "filling": "virtual ratings: weight (0 with confidence w, PrivMVMF eq. 36), ua (user average), hf (hybrid, FedRec)",
        "w": "confidence of sampled items for filling=weight (default: privmvmf's w, else FedMVMF's default w)",
        "distribution": "uniform (papers) or popularity (sample unrated items like rated ones; extension)",
        "popularity_floor": "added to every item's rating count for distribution=popularity",
        "t_predict": "FedRec HF: round after which virtual ratings become local predictions (default: the protocol's, FedRec 10)",
        "t_local": "FedRec HF: local rounds between prediction refreshes (default: the protocol's, FedRec 5)",
    }
    strength = "rho"
    default_grid = (0, 1, 2, 3)

    def validate(self) -> None:
        c = self.config
        if c["rho"] is None or not c["rho"] >= 0:
            raise PrivauditError("defense 'sampling': rho must be >= 0")
        if c["filling"] not in FILLINGS:
            raise PrivauditError(f"defense 'sampling': filling must be one of {', '.join(FILLINGS)}, got {c['filling']!r}")
        if c["distribution"] not in DISTRIBUTIONS:
            raise PrivauditError(
                f"defense 'sampling': distribution must be one of {', '.join(DISTRIBUTIONS)}, got {c['distribution']!r}"
            )
        if c["w"] is not None:
            try:
                c["w"] = float(c["w"])
            except (TypeError, ValueError):
                raise PrivauditError(f"defense 'sampling': w must be a number, got {c['w']!r}") from None
            if c["w"] < 0:
                raise PrivauditError("defense 'sampling': w must be >= 0")
        if not c["popularity_floor"] > 0:
            raise PrivauditError("defense 'sampling': popularity_floor must be positive")
        if (c["t_predict"] is not None and c["t_predict"] < 0) or (c["t_local"] is not None and c["t_local"] < 1):
            raise PrivauditError("defense 'sampling': t_predict must be >= 0 and t_local >= 1")

    @property
    def weight(self) -> float:
        """Confidence of sampled items (filling=weight).

        ``w`` if set; otherwise FedMVMF's default ``w`` (``privmvmf`` fills in its own ``w``
        before training; with ``fedmvmf`` and a non-default ``w``, set the defense's ``w`` too).
        """
        if self.config["w"] is not None:
            return float(self.config["w"])
        try:
            from privaudit.protocols.fedmvmf import FedMVMF

            return float(FedMVMF.default_config["w"])
        except Exception:  # pragma: no cover - fedmvmf ships with privaudit
            return DEFAULT_W

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
        if self.config["distribution"] == "popularity":
            counts = np.bincount(real.indices, minlength=real.shape[1]).astype(np.float64)
            weights = counts + self.config["popularity_floor"]
        sampled = sample_unrated(present, float(self.config["rho"]), rng, weights, n_rated=np.diff(real.indptr))
        if self.config["filling"] == "weight":
            values = np.zeros(real.shape[0])
            weight: float | np.ndarray = self.weight
        else:
            nnz = np.diff(real.indptr)
            sums = np.add.reduceat(real.data, real.indptr[:-1]) if real.nnz else np.zeros(real.shape[0])
            values = np.where(nnz > 0, sums / np.maximum(nnz, 1), 0.0)
            weight = 1.0
        return add_virtual(data, sampled, values, weight)


def item_set_guess(
    item_sets: list[np.ndarray], rated_sets: list[np.ndarray], rho: float, strategy: str = "uniform"
) -> dict[str, float]:
    """How well an observer of the uploaded item sets alone picks out rated items.

    Parameters
    ----------
    item_sets : per user, the uploaded item ids I_u ∪ S_u (what the server sees).
    rated_sets : per user, the truly rated items I_u (ground truth).
    rho : the public sampling ratio (the observer guesses |I_u| = |set| / (1 + rho)).
    strategy : ``uniform`` — the observer has no item prior: any uploaded item is rated with
        probability |I_u| / |set| (the expected precision is returned exactly);
        ``popularity`` — the observer ranks each user's uploaded items by how many users
        uploaded them (public from the item ids) and guesses the top round(|set| / (1 + rho)).

    Returns
    -------
    dict with ``precision`` (fraction of guessed items that are rated, averaged over users),
    ``chance`` (= 1 / (1 + rho)) and ``users``.
    """
    if strategy not in ("uniform", "popularity"):
        raise ValueError("strategy must be uniform or popularity")
    if strategy == "popularity":
        allitems = np.concatenate([np.asarray(s, dtype=np.int64) for s in item_sets]) if item_sets else np.empty(0, np.int64)
        pop = np.bincount(allitems, minlength=int(allitems.max()) + 1 if len(allitems) else 0)
    precisions = []
    for items, rated in zip(item_sets, rated_sets):
        items = np.asarray(items, dtype=np.int64)
        if len(items) == 0:
            continue
        is_rated = np.isin(items, np.asarray(rated, dtype=np.int64))
        if strategy == "uniform":
            precisions.append(is_rated.mean())
        else:
            k = max(1, int(np.floor(len(items) / (1.0 + rho) + 0.5)))
            # rank by popularity, ties broken by item id (deterministic)
            order = np.lexsort((items, -pop[items]))[:k]
            precisions.append(is_rated[order].mean())
    return {
        "precision": float(np.mean(precisions)) if precisions else float("nan"),
        "chance": 1.0 / (1.0 + rho),
        "users": float(len(precisions)),
    }

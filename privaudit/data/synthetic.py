"""A MovieLens-like synthetic dataset, so every command runs without a download.

Generative model (all draws from one ``numpy.random.Generator`` seeded by ``seed``):

* user factors ``U`` (n x k) and item factors ``V`` (m x k), standard normal;
* user attributes: four one-hot blocks (7 age groups, gender, 5 occupations, 10 ZIP regions
  plus a rare ``region=unknown``); each category is drawn by the Gumbel-max trick from logits
  linear in ``u_u``, so attributes are correlated with (learnable from) the latent factors;
* item genres: multi-hot, ``genre j`` on when a logit linear in ``v_i`` plus logistic noise is
  positive (every item gets at least its most likely genre);
* which items a user rates: Zipf-like item popularity (exponent ~0.9, popular items also have
  higher biases) times a mild preference for items the user likes, sampled without
  replacement (Gumbel top-c); each user rates ``c_u >= min_ratings`` items, with
  ``c_u - min_ratings`` log-normal so that the mean density is about ``density``;
* ratings: ``2.9 + b_u + b_i + 0.75 u_u.v_i / sqrt(k) + N(0, 0.7^2)``, rounded and clipped
  to 1..5 (with the selection effect, roughly the MovieLens rating histogram, mean ~3.5);
* timestamps: each user starts between 2000 and 2004 and rates in a random order with
  exponential gaps (mean 3 days).
"""

from __future__ import annotations

import numpy as np

from privaudit.data.dataset import RatingsDataset, build_csr
from privaudit.errors import DataError

__all__ = ["synthetic"]

_AGE_GROUPS = ["7-16", "17-25", "26-35", "36-44", "45-54", "55-63", "64-73"]
_AGE_PRIOR = np.log([0.04, 0.28, 0.30, 0.17, 0.12, 0.06, 0.03])
_GENDERS = ["F", "M"]
_GENDER_PRIOR = np.log([0.3, 0.7])
_OCCUPATIONS = ["educator", "engineer", "other", "student", "writer"]
_OCCUPATION_PRIOR = np.log([0.15, 0.2, 0.2, 0.35, 0.1])
_REGIONS = [str(d) for d in range(10)] + ["unknown"]
_REGION_PRIOR = np.log(np.r_[np.full(10, 0.098), 0.02])
_GENRES = [
    "Action", "Adventure", "Children's", "Comedy", "Crime", "Drama",
    "Horror", "Romance", "Sci-Fi", "Thriller",
]
_MU = 2.9  # global mean before the selection effect (rated items skew towards liked ones)
_T0 = 946684800  # 2000-01-01 UTC
_DAY = 86400


def _categorical(rng: np.random.Generator, U: np.ndarray, prior: np.ndarray, strength: float) -> np.ndarray:
    """One category per row of ``U`` by Gumbel-max over ``prior + strength * U B`` (B random)."""
    B = rng.normal(size=(U.shape[1], prior.size)) / np.sqrt(U.shape[1])
    logits = prior + strength * (U @ B)
    return np.argmax(logits + rng.gumbel(size=logits.shape), axis=1)


def synthetic(
    n_users: int = 200,
    n_items: int = 300,
    k: int = 5,
    min_ratings: int = 20,
    density: float = 0.08,
    seed: int = 0,
) -> RatingsDataset:
    """Generate a MovieLens-like :class:`RatingsDataset` named ``"synthetic"``.

    Args:
        n_users, n_items: matrix shape (n_users x n_items).
        k: rank of the latent model.
        min_ratings: every user rates at least max(min_ratings, 1) items (<= n_items).
        density: target mean fraction of items rated per user (at least min_ratings / n_items).
        seed: seed of the ``numpy.random.Generator``; the output is a pure function of the
            arguments.

    Returns:
        ratings 1..5 (step 1), user_attributes (n_users x 25: 7 age + 2 gender + 5 occupation
        + 11 region dummies, each row sums to 4), item_features (n_items x 10 genres),
        timestamps, user_region in -1..9, user_ids 1..n_users and item_ids 1..n_items.
    """
    n, m, k = int(n_users), int(n_items), int(k)
    if n < 1 or m < 1 or k < 1:
        raise DataError(f"synthetic: n_users, n_items and k must be >= 1 (got {n_users}, {n_items}, {k})")
    if not 0 <= min_ratings <= m:
        raise DataError(f"synthetic: min_ratings must be in 0..n_items={m}, got {min_ratings}")
    if not 0 < density <= 1:
        raise DataError(f"synthetic: density must be in (0, 1], got {density}")
    rng = np.random.default_rng(seed)

    # latent model and biases
    U = rng.normal(size=(n, k))
    V = rng.normal(size=(m, k))
    b_user = rng.normal(0.0, 0.35, size=n)
    b_item = rng.normal(0.0, 0.45, size=m)

    # user attributes correlated with U
    blocks = [
        ("age", _AGE_GROUPS, _categorical(rng, U, _AGE_PRIOR, 2.0)),
        ("gender", _GENDERS, _categorical(rng, U, _GENDER_PRIOR, 2.5)),
        ("occupation", _OCCUPATIONS, _categorical(rng, U, _OCCUPATION_PRIOR, 2.0)),
        ("region", _REGIONS, _categorical(rng, U, _REGION_PRIOR, 2.0)),
    ]
    p = sum(len(cats) for _, cats, _ in blocks)
    attributes = np.zeros((n, p))
    names: list[str] = []
    offset = 0
    for group, cats, codes in blocks:
        attributes[np.arange(n), offset + codes] = 1.0
        names += [f"{group}={c}" for c in cats]
        offset += len(cats)
    region_codes = blocks[3][2]
    user_region = np.where(region_codes == 10, -1, region_codes).astype(np.int64)

    # item genres correlated with V
    G = len(_GENRES)
    C = rng.normal(size=(k, G)) * (2.0 / np.sqrt(k))
    g_logits = V @ C - 1.5
    genres = (g_logits + rng.logistic(size=(m, G)) > 0).astype(np.float64)
    genres[np.arange(m), np.argmax(g_logits, axis=1)] = 1.0

    # popularity: Zipf-like weights, ranks correlated with item bias
    rank = np.empty(m, dtype=np.int64)
    rank[np.argsort(-(b_item + rng.normal(0.0, 0.45, size=m)))] = np.arange(m)
    log_pop = -0.9 * np.log1p(rank)

    # number of ratings per user
    extra_mean = max(density * m - min_ratings, 0.0)
    extra = rng.lognormal(np.log(extra_mean) - 0.5, 1.0, size=n) if extra_mean > 0 else np.zeros(n)
    counts = np.clip(min_ratings + np.rint(extra).astype(np.int64), max(min_ratings, 1), m)

    # which items: Gumbel top-c_u of log popularity + preference (row chunks bound memory)
    chunk = max(1, 2_000_000 // m)
    picked = []
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        keys = U[lo:hi] @ V.T
        keys *= 0.5 / np.sqrt(k)
        keys += log_pop
        keys -= np.log(rng.standard_exponential(size=(hi - lo, m)))  # + Gumbel(0, 1) noise
        c = counts[lo:hi]
        top = np.argpartition(-keys, int(c.max()) - 1, axis=1)[:, : c.max()]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(keys, top, 1), axis=1), 1)
        picked.append(top[np.arange(c.max()) < c[:, None]])
    rows = np.repeat(np.arange(n), counts)
    cols = np.concatenate(picked).astype(np.int64)

    # ratings
    affinity = np.einsum("ij,ij->i", U[rows], V[cols]) / np.sqrt(k)
    mean = _MU + b_user[rows] + b_item[cols] + 0.75 * affinity
    values = np.clip(np.rint(mean + rng.normal(0.0, 0.7, size=rows.size)), 1.0, 5.0)

    # timestamps: random order within each user, exponential gaps from a per-user start
    start = _T0 + rng.integers(0, 4 * 365 * _DAY, size=n)
    position = np.lexsort((rng.random(rows.size), rows))  # random order inside each user block
    gaps = np.empty(rows.size)
    gaps[position] = rng.exponential(3.0 * _DAY, size=rows.size)
    seg_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    cum = np.empty(rows.size)
    cum[position] = np.cumsum(gaps[position])
    first = cum[position[seg_start]] - gaps[position[seg_start]]
    ts = (start[rows] + cum - first[rows]).astype(np.int64)

    shape = (n, m)
    return RatingsDataset(
        name="synthetic",
        ratings=build_csr(rows, cols, values, shape),
        user_attributes=attributes,
        attribute_names=names,
        item_features=genres,
        feature_names=[f"genre={g}" for g in _GENRES],
        user_ids=np.arange(1, n + 1, dtype=np.int64),
        item_ids=np.arange(1, m + 1, dtype=np.int64),
        timestamps=build_csr(rows, cols, ts, shape, dtype=np.int64),
        user_region=user_region,
        rating_min=1.0,
        rating_max=5.0,
        rating_step=1.0,
    )

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

__all__ = ["PRESETS", "parse_spec", "synthetic", "synthetic_from_spec"]

_AGE_GROUPS = ["7-16", "17-25", "26-35", "36-44", "45-54", "55-63", "64-73"]
_AGE_PRIOR = np.log([0.04, 0.28, 0.30, 0.17, 0.12, 0.06, 0.03])
_GENDERS = ["F", "M"]
_GENDER_PRIOR = np.log([0.3, 0.7])
_OCCUPATIONS = ["educator", "engineer", "other", "student", "writer"]
_OCCUPATION_PRIOR = np.log([0.15, 0.2, 0.2, 0.35, 0.1])
_REGIONS = [str(d) for d in range(10)] + ["unknown"]
_REGION_PRIOR = np.log(np.r_[np.full(10, 0.098), 0.02])
_GENRES = [
    "Action",
    "Adventure",
    "Children's",
    "Comedy",
    "Crime",
    "Drama",
    "Horror",
    "Romance",
    "Sci-Fi",
    "Thriller",
]
_MU = 2.9  # global mean before the selection effect (rated items skew towards liked ones)
_T0 = 946684800  # 2000-01-01 UTC
_DAY = 86400
_BLOCK = 1 << 20  # entries per block where a per-rating temporary would be (ratings x k)
_EXACT_CELLS = 1 << 31  # users x items up to which items are drawn by the exact Gumbel top-c


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
    # latent model and biases, then the users' attributes and the items' genres that follow them
    U = rng.normal(size=(n, k))
    V = rng.normal(size=(m, k))
    b_user = rng.normal(0.0, 0.35, size=n)
    b_item = rng.normal(0.0, 0.45, size=m)
    attributes, names, user_region = _user_attributes(rng, U)
    genres = _genres(rng, V)
    # popularity: Zipf-like weights, ranks correlated with item bias
    rank = np.empty(m, dtype=np.int64)
    rank[np.argsort(-(b_item + rng.normal(0.0, 0.45, size=m)))] = np.arange(m)
    log_pop = -0.9 * np.log1p(rank)
    # number of ratings per user, then which items (every entry's user in ``rows``, sorted)
    extra_mean = max(density * m - min_ratings, 0.0)
    extra = rng.lognormal(np.log(extra_mean) - 0.5, 1.0, size=n) if extra_mean > 0 else np.zeros(n)
    counts = np.clip(min_ratings + np.rint(extra).astype(np.int64), max(min_ratings, 1), m)
    del extra
    cols = _pick_items(rng, U, V, log_pop, counts)
    rows = np.repeat(np.arange(n, dtype=np.int64 if n > 2**31 - 1 else np.int32), counts)
    values = _ratings(rng, U, V, b_user, b_item, rows, cols)
    ts = _timestamps(rng, rows, counts)
    shape = (n, m)
    order = np.argsort(rows.astype(np.int64) * m + cols)  # row-major; the (row, col) pairs are distinct
    ratings = build_csr(rows, cols, values, shape, order=order)
    del values
    return RatingsDataset(
        name="synthetic",
        ratings=ratings,
        user_attributes=attributes,
        attribute_names=names,
        item_features=genres,
        feature_names=[f"genre={g}" for g in _GENRES],
        user_ids=np.arange(1, n + 1, dtype=np.int64),
        item_ids=np.arange(1, m + 1, dtype=np.int64),
        timestamps=build_csr(rows, cols, ts, shape, dtype=np.int64, order=order),
        user_region=user_region,
        rating_min=1.0,
        rating_max=5.0,
        rating_step=1.0,
    )


def _user_attributes(rng: np.random.Generator, U: np.ndarray) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Four one-hot blocks correlated with ``U`` (n x 25), their names and the region code (-1..9)."""
    n = U.shape[0]
    blocks = [
        ("age", _AGE_GROUPS, _categorical(rng, U, _AGE_PRIOR, 2.0)),
        ("gender", _GENDERS, _categorical(rng, U, _GENDER_PRIOR, 2.5)),
        ("occupation", _OCCUPATIONS, _categorical(rng, U, _OCCUPATION_PRIOR, 2.0)),
        ("region", _REGIONS, _categorical(rng, U, _REGION_PRIOR, 2.0)),
    ]
    attributes = np.zeros((n, sum(len(cats) for _, cats, _ in blocks)))
    names: list[str] = []
    for group, cats, codes in blocks:
        attributes[np.arange(n), len(names) + codes] = 1.0
        names += [f"{group}={c}" for c in cats]
    region_codes = blocks[3][2]
    return attributes, names, np.where(region_codes == 10, -1, region_codes).astype(np.int64)


def _genres(rng: np.random.Generator, V: np.ndarray) -> np.ndarray:
    """Multi-hot genres (m x 10): a logit linear in ``v_i`` plus logistic noise, at least the likeliest."""
    m, k = V.shape
    C = rng.normal(size=(k, len(_GENRES))) * (2.0 / np.sqrt(k))
    g_logits = V @ C - 1.5
    genres = (g_logits + rng.logistic(size=(m, len(_GENRES))) > 0).astype(np.float64)
    genres[np.arange(m), np.argmax(g_logits, axis=1)] = 1.0
    return genres


def _pick_items(
    rng: np.random.Generator, U: np.ndarray, V: np.ndarray, log_pop: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Each user's ``counts[u]`` items (int32, best first) by a Gumbel top-c of log popularity plus
    preference, over row chunks of at most ~2 M cells (never a users x items matrix)."""
    (n, k), m = U.shape, V.shape[0]
    if n * m > _EXACT_CELLS:
        return _pick_candidates(rng, U, V, log_pop, counts)
    chunk = max(1, 2_000_000 // m)
    cols = np.empty(int(counts.sum()), dtype=np.int32)
    at = 0
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        keys = U[lo:hi] @ V.T
        keys *= 0.5 / np.sqrt(k)
        keys += log_pop
        keys -= np.log(rng.standard_exponential(size=(hi - lo, m)))  # + Gumbel(0, 1) noise
        c = counts[lo:hi]
        top = np.argpartition(-keys, int(c.max()) - 1, axis=1)[:, : c.max()]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(keys, top, 1), axis=1), 1)
        picked = top[np.arange(c.max()) < c[:, None]]
        cols[at : at + picked.size] = picked
        at += picked.size
    return cols


def _pick_candidates(
    rng: np.random.Generator, U: np.ndarray, V: np.ndarray, log_pop: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Above :data:`_EXACT_CELLS` users x items: each user's items are the ``c_u`` best distinct
    ones of ``2 c_u`` candidates drawn by popularity (with replacement), ranked by the same
    preference plus Gumbel noise (cost O(ratings); close to the exact Gumbel top-c); a user with
    fewer distinct candidates than ``c_u`` gets the exact draw over all items."""
    (n, k), m = U.shape, V.shape[0]
    draw = _InverseCDF(np.cumsum(np.exp(log_pop - log_pop.max())))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    cols = np.empty(int(offsets[-1]), dtype=np.int32)
    lo = 0
    while lo < n:
        hi = min(n, max(lo + 1, int(np.searchsorted(offsets, offsets[lo] + (1 << 21), side="right")) - 1))
        users = np.repeat(np.arange(hi - lo), 2 * counts[lo:hi])  # chunk-local user ids
        items = np.minimum(draw(rng.random(users.size)), m - 1)
        keys = np.einsum("ij,ij->i", np.repeat(U[lo:hi], 2 * counts[lo:hi], axis=0), V[items]) * (0.5 / np.sqrt(k))
        keys -= np.log(rng.standard_exponential(users.size))
        order = np.argsort(users * 128.0 + (40.0 - np.clip(keys, -80.0, 40.0)))  # by user, best key first
        kept = order[_first_of_each(users[order] * np.int64(m) + items[order])]
        # each distinct (user, item) once, by user, best key first
        u = users[kept]
        rank = np.arange(u.size) - np.searchsorted(u, np.arange(hi - lo))[u]
        short = np.bincount(u, minlength=hi - lo) < counts[lo:hi]
        take = (rank < counts[lo + u]) & ~short[u]
        cols[offsets[lo + u[take]] + rank[take]] = items[kept[take]]
        for user in lo + np.flatnonzero(short):  # the exact draw for a user the candidates do not cover
            key = U[user] @ V.T * (0.5 / np.sqrt(k)) + log_pop - np.log(rng.standard_exponential(m))
            cols[offsets[user] : offsets[user + 1]] = np.argsort(-key)[: counts[user]]
        lo = hi
    return cols


def _first_of_each(values: np.ndarray) -> np.ndarray:
    """Ascending positions of the first occurrence of each distinct value of ``values`` (>= 0):
    ``np.sort(np.unique(values, return_index=True)[1])``, by one plain sort of value x size +
    position when that fits in int64."""
    size = np.int64(values.size)
    if not size or int(values.max()) >= (2**63 - 1) // int(size) - 1:
        return np.sort(np.unique(values, return_index=True)[1])
    packed = np.sort(values * size + np.arange(size))
    value = packed // size
    new = np.ones(values.size, dtype=bool)
    new[1:] = value[1:] != value[:-1]
    return np.sort(packed[new] - value[new] * size)


class _InverseCDF:
    """``searchsorted(cdf, u * cdf[-1], side="right")`` for uniforms ``u``, bit for bit, in O(1)
    per draw: a guide table of ``4 m`` equal-mass buckets gives a start index, then a few
    vectorized unit steps reach the first ``i`` with ``cdf[i] > x``."""

    def __init__(self, cdf: np.ndarray) -> None:
        self.cdf, self.total = cdf, cdf[-1]
        self.buckets = 4 * cdf.size
        self.guide = np.searchsorted(cdf, np.arange(self.buckets + 1) * (self.total / self.buckets), side="right")
        self.padded = np.append(cdf, np.inf)

    def __call__(self, u: np.ndarray) -> np.ndarray:
        x = u * self.total
        at = self.guide[np.minimum((x * (self.buckets / self.total)).astype(np.int64), self.buckets - 1)]
        while True:  # up while cdf[at] <= x
            up = self.padded[at] <= x
            if not up.any():
                break
            at += up
        while True:  # down while cdf[at - 1] > x (a bucket edge rounded above x)
            down = (at > 0) & (self.cdf[np.maximum(at - 1, 0)] > x)
            if not down.any():
                break
            at -= down
        return at


def _ratings(rng, U, V, b_user, b_item, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``clip(rint(2.9 + b_u + b_i + 0.75 u.v / sqrt(k) + N(0, 0.7^2)), 1, 5)`` per entry, in blocks
    of entries (the noise is drawn block after block: the same stream as one draw)."""
    k = U.shape[1]
    values = np.empty(rows.size)
    blocks = range(0, rows.size, _BLOCK)
    for lo in blocks:
        r, c = rows[lo : lo + _BLOCK], cols[lo : lo + _BLOCK]
        affinity = np.einsum("ij,ij->i", U[r], V[c])
        affinity /= np.sqrt(k)
        values[lo : lo + _BLOCK] = _MU + b_user[r] + b_item[c] + 0.75 * affinity
    for lo in blocks:
        part = values[lo : lo + _BLOCK]
        np.clip(np.rint(part + rng.normal(0.0, 0.7, size=part.size)), 1.0, 5.0, out=part)
    return values


def _timestamps(rng: np.random.Generator, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per user: a start in 2000-2004, then its entries in a random order with exponential gaps
    (mean 3 days). int64 seconds per entry.

    ``rows`` is sorted, so the order ``lexsort((random, rows))`` only permutes inside each user's
    segment: it is found on chunks of whole users, and the gaps drawn in that order have their
    running sums in draw order, put back by one scatter."""
    n = counts.size
    start = _T0 + rng.integers(0, 4 * 365 * _DAY, size=n)
    key = rng.random(rows.size)
    seg_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    position = np.empty(rows.size, dtype=np.int64)
    edges = [*seg_start[np.unique(np.searchsorted(seg_start, np.arange(0, rows.size, _BLOCK)))], rows.size]
    for lo, hi in zip(edges[:-1], edges[1:]):  # the lexsort by an argsort then a stable pass, per chunk
        part = np.argsort(key[lo:hi])  # (the same order unless two draws of a user tie)
        position[lo:hi] = lo + part[np.argsort(rows[lo:hi][part], kind="stable")]
    del key
    gaps = rng.exponential(3.0 * _DAY, size=rows.size)  # in draw order
    cum = np.cumsum(gaps)
    first = cum[seg_start] - gaps[seg_start]
    del gaps
    cum += start[rows]  # the draw order keeps the user segments in place
    cum -= first[rows]
    out = np.empty(rows.size, dtype=np.int64)
    out[position] = cum
    return out


#: Named sizes for ``synthetic:<preset>``: MovieLens shapes, density giving about the same ratings.
PRESETS: dict[str, dict[str, float | int]] = {
    "ml-100k-size": {"n_users": 943, "n_items": 1682, "density": 0.063},  # ~100,000 ratings
    "ml-1m-size": {"n_users": 6040, "n_items": 3706, "density": 0.045},  # ~1.0 M ratings
    "ml-10m-size": {"n_users": 69878, "n_items": 10677, "density": 0.0134},  # ~10 M ratings
    "netflix-size": {"n_users": 480189, "n_items": 17770, "density": 0.011776},  # ~100 M ratings (Netflix Prize)
}
_SPEC_KEYS = {
    "users": "n_users",
    "items": "n_items",
    "k": "k",
    "min_ratings": "min_ratings",
    "density": "density",
    "seed": "seed",
}
_SPEC_MAX = {"users": 10**7, "items": 10**6, "k": 256}
_MAX_CELLS = 10**10  # users x items: the item draw costs O(users x items) time
SPEC_HELP = (
    "synthetic[:PRESET][,KEY=VALUE...] with PRESET one of "
    + ", ".join(PRESETS)
    + " and KEY one of "
    + ", ".join(_SPEC_KEYS)
    + " (e.g. synthetic:users=6040,items=3706,density=0.045)"
)


def parse_spec(spec: str) -> dict[str, float | int]:
    """Keyword arguments of :func:`synthetic` from ``synthetic[:PRESET][,KEY=VALUE...]``.

    ``PRESET`` is a key of :data:`PRESETS`; ``KEY`` is ``users``, ``items``, ``k``,
    ``min_ratings``, ``density`` or ``seed`` and overrides the preset. Raises
    :class:`~privaudit.errors.DataError` (one line) for anything else, before any data is made.
    """
    head, _, tail = str(spec).strip().partition(":")
    if head.strip().lower() != "synthetic":
        raise DataError(f"{spec!r}: a synthetic dataset spec starts with 'synthetic' ({SPEC_HELP})")
    kwargs: dict[str, float | int] = {}
    for n, item in enumerate(p.strip() for p in tail.split(",")):
        if not item:
            if tail.strip():
                raise DataError(f"{spec!r}: empty field in the synthetic spec ({SPEC_HELP})")
            continue
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq:
            if n != 0 or key not in PRESETS:
                raise DataError(f"{spec!r}: unknown preset {key!r} ({SPEC_HELP})")
            kwargs.update(PRESETS[key])
            continue
        if key not in _SPEC_KEYS:
            raise DataError(f"{spec!r}: unknown key {key!r} ({SPEC_HELP})")
        kwargs[_SPEC_KEYS[key]] = _spec_number(spec, key, value.strip())
    n_users, n_items = int(kwargs.get("n_users", 200)), int(kwargs.get("n_items", 300))
    if n_users * n_items > _MAX_CELLS:
        raise DataError(f"{spec!r}: users x items = {n_users * n_items} exceeds the limit of {_MAX_CELLS}")
    if not 0 <= int(kwargs.get("min_ratings", 20)) <= n_items:
        raise DataError(f"{spec!r}: min_ratings must be in 0..items={n_items}")
    return kwargs


def _spec_number(spec: str, key: str, value: str) -> float | int:
    try:
        number: float | int = float(value) if key == "density" else int(value)
    except ValueError:
        what = "a number" if key == "density" else "an integer"
        raise DataError(f"{spec!r}: {key} must be {what}, got {value!r}") from None
    if key == "density" and not 0 < number <= 1:
        raise DataError(f"{spec!r}: density must be in (0, 1], got {value}")
    if key in _SPEC_MAX and not 1 <= number <= _SPEC_MAX[key]:
        raise DataError(f"{spec!r}: {key} must be in 1..{_SPEC_MAX[key]}, got {value}")
    if key in ("min_ratings", "seed") and number < 0:
        raise DataError(f"{spec!r}: {key} must be >= 0, got {value}")
    return number


def synthetic_from_spec(spec: str) -> RatingsDataset:
    """The dataset a ``synthetic[:PRESET][,KEY=VALUE...]`` spec names (see :func:`parse_spec`)."""
    return synthetic(**parse_spec(spec))

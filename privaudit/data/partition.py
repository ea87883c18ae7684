"""Federation partitioners: which users each client (a user, a group or a silo) holds.

A partition is a plain ``list[np.ndarray]``: element ``c`` is the sorted int64 array of user
indices held by client ``c``. Every function returns a partition that covers every user
exactly once.
"""

from __future__ import annotations

import numpy as np

from privaudit.data.dataset import RatingsDataset
from privaudit.errors import DataError

__all__ = ["one_client_per_user", "random_groups", "zip_silos"]


def _n_users(ds: RatingsDataset | int) -> int:
    return int(ds) if isinstance(ds, (int, np.integer)) else ds.n_users


def one_client_per_user(ds: RatingsDataset | int) -> list[np.ndarray]:
    """Cross-device federation: client ``u`` holds exactly user ``u`` (n_users arrays of length 1)."""
    return list(np.arange(_n_users(ds), dtype=np.int64).reshape(-1, 1))


def random_groups(
    ds: RatingsDataset | int,
    low: int = 3,
    high: int = 30,
    rng: np.random.Generator | int | None = None,
) -> list[np.ndarray]:
    """Users assigned at random to groups whose sizes are uniform integers in ``[low, high]``.

    Users are shuffled and cut into consecutive groups of sizes drawn uniformly from
    ``low..high`` (inclusive). The last group takes the remainder; if fewer than ``low`` users
    are left over, they are spread one each over random earlier groups that still have room,
    or, when all are full, the last group is topped up to ``low`` with one user each from
    random larger groups. Every group size is therefore in ``[low, high]`` except in two
    corner cases: with ``n_users < low`` the single group holds everyone, and when neither fix
    is possible (only if ``high - low`` is tiny, e.g. ``low == high`` and ``n_users`` not a
    multiple of it) the leftover users form a short last group.

    Args:
        ds: the dataset (or its number of users).
        low, high: group size bounds, 1 <= low <= high.
        rng: ``numpy.random.Generator``, int seed or None (fresh entropy).

    Returns:
        list of sorted int64 user-index arrays, in random order, covering all users once.
    """
    low, high = int(low), int(high)
    if not 1 <= low <= high:
        raise DataError(f"random_groups: need 1 <= low <= high, got low={low}, high={high}")
    rng = np.random.default_rng(rng)
    n = _n_users(ds)
    if n == 0:
        return []
    perm = rng.permutation(n).astype(np.int64)
    draws = rng.integers(low, high + 1, size=n // low + 1)
    cum = np.cumsum(draws)
    g = int(np.searchsorted(cum, n))  # index of the group that reaches n
    sizes = draws[: g + 1].copy()
    sizes[-1] = n - (cum[g - 1] if g > 0 else 0)
    if sizes[-1] < low and g > 0:
        sizes = _rebalance(sizes, low, high, rng)
    return [np.sort(group) for group in np.split(perm, np.cumsum(sizes)[:-1])]


def _rebalance(sizes: np.ndarray, low: int, high: int, rng: np.random.Generator) -> np.ndarray:
    """Fix a last group smaller than ``low`` by moving single users between groups.

    The ``left = sizes[-1]`` leftover users go one each to random earlier groups below
    ``high``; if there is not enough room, the last group is instead filled up to ``low``
    with one user each from random groups above ``low``; if neither is possible (only when
    ``high - low`` is tiny relative to the leftover), the short group is kept.
    """
    left, sizes = int(sizes[-1]), sizes[:-1].copy()
    if (high - sizes).sum() >= left:
        while left:
            room = np.flatnonzero(sizes < high)
            take = rng.choice(room, size=min(left, room.size), replace=False)
            sizes[take] += 1
            left -= take.size
        return sizes
    need = low - left
    if (sizes - low).sum() >= need:
        while need:
            surplus = np.flatnonzero(sizes > low)
            take = rng.choice(surplus, size=min(need, surplus.size), replace=False)
            sizes[take] -= 1
            need -= take.size
        return np.append(sizes, low)
    return np.append(sizes, left)


def zip_silos(ds: RatingsDataset) -> list[np.ndarray]:
    """Cross-silo federation by region (first ZIP digit, ``ds.user_region``).

    One silo per region present, ordered by region (0..9), then one silo for all users with
    an unknown region (``user_region < 0``) if any; empty silos are dropped.

    Returns:
        list of sorted int64 user-index arrays covering all users once.
    """
    region = np.asarray(ds.user_region, dtype=np.int64)
    known = np.unique(region[region >= 0])
    silos = [np.flatnonzero(region == r).astype(np.int64) for r in known]
    unknown = np.flatnonzero(region < 0).astype(np.int64)
    if unknown.size:
        silos.append(unknown)
    return silos

"""Datasets: MovieLens loaders, a synthetic generator, splits and federation partitioners.

Public API::

    RatingsDataset                      # container (ratings CSR, attributes, features, ids, ...)
    load_dataset(path)                  # MovieLens 100K / 1M / latest-small folder or CSV file
    synthetic(n_users, n_items, k, min_ratings, density, seed)
    holdout_split, leave_one_out, cold_start_users, cold_start_items,
    kfold_ratings, filter_min_ratings   # splits (rng: Generator, int seed or None)
    one_client_per_user, random_groups, zip_silos   # partitions: list of user-index arrays
"""

from privaudit.data.dataset import RatingsDataset
from privaudit.data.movielens import load_dataset
from privaudit.data.partition import one_client_per_user, random_groups, zip_silos
from privaudit.data.splits import (
    cold_start_items,
    cold_start_users,
    filter_min_ratings,
    holdout_split,
    kfold_ratings,
    leave_one_out,
)
from privaudit.data.synthetic import synthetic

__all__ = [
    "RatingsDataset",
    "load_dataset",
    "synthetic",
    "holdout_split",
    "leave_one_out",
    "cold_start_users",
    "cold_start_items",
    "kfold_ratings",
    "filter_min_ratings",
    "one_client_per_user",
    "random_groups",
    "zip_silos",
]

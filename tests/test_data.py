"""Tests for privaudit.data: loaders, synthetic generator, splits and partitions."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from privaudit.data import (
    RatingsDataset,
    cold_start_items,
    cold_start_users,
    filter_min_ratings,
    holdout_split,
    kfold_ratings,
    leave_one_out,
    load_dataset,
    one_client_per_user,
    random_groups,
    synthetic,
    zip_silos,
)
from privaudit.errors import DataError


@pytest.fixture(scope="module")
def ml100k(ml100k_path) -> RatingsDataset:
    return load_dataset(ml100k_path)


@pytest.fixture(scope="module")
def syn() -> RatingsDataset:
    return synthetic()


def _ml100k_copy(tmp_path: Path, source: Path) -> Path:
    dst = tmp_path / "ml-100k"
    dst.mkdir()
    for name in ("u.data", "u.user", "u.item", "u.genre", "u.occupation"):
        shutil.copy(source / name, dst / name)
    return dst


def _replace_line(path: Path, line_no: int, new: str, encoding: str = "latin-1") -> None:
    lines = path.read_text(encoding=encoding).splitlines()
    lines[line_no - 1] = new
    path.write_text("\n".join(lines) + "\n", encoding=encoding)


def _assert_consistent(ds: RatingsDataset) -> None:
    """Structural invariants every dataset must satisfy."""
    n, m = ds.n_users, ds.n_items
    assert sp.isspmatrix_csr(ds.ratings) and ds.ratings.dtype == np.float64
    assert ds.ratings.has_canonical_format
    assert not (ds.ratings.data == 0).any()
    assert ds.user_attributes.shape == (n, len(ds.attribute_names))
    assert ds.item_features.shape == (m, len(ds.feature_names))
    assert ds.user_ids.shape == (n,) and ds.item_ids.shape == (m,)
    assert ds.user_region.shape == (n,) and ds.user_region.dtype == np.int64
    if ds.timestamps is not None:
        assert ds.timestamps.dtype == np.int64
        np.testing.assert_array_equal(ds.timestamps.indptr, ds.ratings.indptr)
        np.testing.assert_array_equal(ds.timestamps.indices, ds.ratings.indices)


# ---------------------------------------------------------------------------- ML-100K
def test_ml100k_shape_and_names(ml100k: RatingsDataset) -> None:
    ds = ml100k
    _assert_consistent(ds)
    assert ds.name == "ml-100k"
    assert (ds.n_users, ds.n_items, ds.n_ratings) == (943, 1682, 100000)
    assert ds.summary() == {
        "name": "ml-100k",
        "users": 943,
        "items": 1682,
        "ratings": 100000,
        "attributes": len(ds.attribute_names),
        "item_features": 19,
    }
    names = ds.attribute_names
    occupations = [a for a in names if a.startswith("occupation=")]
    assert len(occupations) == 21
    assert {
        "gender=F",
        "gender=M",
        "occupation=writer",
        "occupation=none",
        "region=0",
        "region=9",
        "region=unknown",
        "age=7-16",
    } <= set(names)
    assert len([a for a in names if a.startswith("age=")]) == 7
    assert names[-1] == "region=unknown"
    assert len(ds.feature_names) == 19
    assert ds.feature_names[0] == "genre=unknown" and "genre=Film-Noir" in ds.feature_names
    assert (ds.rating_min, ds.rating_max, ds.rating_step) == (1.0, 5.0, 1.0)
    # one category per block: age, gender, occupation, region
    np.testing.assert_array_equal(ds.user_attributes.sum(axis=1), 4.0)
    assert set(np.unique(ds.user_attributes)) == {0.0, 1.0}
    assert set(np.unique(ds.ratings.data)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert ds.item_features.sum() > 1682 and set(np.unique(ds.item_features)) == {0.0, 1.0}


def test_ml100k_values_match_files(ml100k: RatingsDataset) -> None:
    ds = ml100k
    np.testing.assert_array_equal(ds.user_ids, np.arange(1, 944))
    np.testing.assert_array_equal(ds.item_ids, np.arange(1, 1683))
    # first line of u.data: 196 242 3 881250949
    u, i = 195, 241
    assert ds.ratings[u, i] == 3.0 and ds.timestamps[u, i] == 881250949
    items, ratings = ds.user_items(u)
    assert items.dtype == np.int64 and ratings.dtype == np.float64
    assert np.all(np.diff(items) > 0) and 241 in items
    # user 1: 24|M|technician|85711 ; user 74 has ZIP T8H1N
    col = {a: j for j, a in enumerate(ds.attribute_names)}
    row = ds.user_attributes[0]
    assert row[col["gender=M"]] == 1 and row[col["occupation=technician"]] == 1
    assert row[col["region=8"]] == 1 and row[col["age=17-25"]] == 1
    assert ds.user_region[0] == 8
    assert ds.user_region[73] == -1 and ds.user_attributes[73, col["region=unknown"]] == 1
    assert (ds.user_region == -1).sum() == 18
    # item 1 Toy Story: Animation, Children's, Comedy
    fcol = {f: j for j, f in enumerate(ds.feature_names)}
    assert {f for f in ds.feature_names if ds.item_features[0, fcol[f]]} == {
        "genre=Animation",
        "genre=Children's",
        "genre=Comedy",
    }


def test_ml100k_short_line_names_file_and_line(tmp_path: Path, ml100k_path: Path) -> None:
    folder = _ml100k_copy(tmp_path, ml100k_path)
    _replace_line(folder / "u.data", 17, "1\t2\t3")
    with pytest.raises(DataError, match=r"u\.data line 17: expected 4 tab-separated fields, got 3"):
        load_dataset(folder)


def test_ml100k_non_numeric_rating_names_file_and_line(tmp_path: Path, ml100k_path: Path) -> None:
    folder = _ml100k_copy(tmp_path, ml100k_path)
    _replace_line(folder / "u.data", 5, "1\t2\tgood\t881250949")
    with pytest.raises(DataError) as err:
        load_dataset(folder)
    msg = str(err.value)
    assert "u.data line 5" in msg and "'good'" in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("file", "line", "text", "pattern"),
    [
        ("u.data", 3, "1\t2\t7\t881250949", r"u\.data line 3: rating '7' is outside the range 1\.\.5"),
        ("u.data", 4, "1\t2\t3.5\t881250949", r"u\.data line 4: rating '3\.5' is not a multiple of 1"),
        ("u.data", 9, "x1\t2\t3\t881250949", r"u\.data line 9: user id 'x1' is not an integer"),
        ("u.data", 10, "196\t242\t4\t881250949", r"u\.data line 10: duplicate rating for user 196 and item 242"),
        ("u.user", 2, "2|53|F|astronaut|94043", r"u\.user line 2: occupation 'astronaut' is not listed"),
        ("u.user", 6, "6|42|M", r"u\.user line 6: expected 5 '\|'-separated fields, got 3"),
        (
            "u.item",
            8,
            "8|Babe (1995)|01-Jan-1995||url|0|0|0|0|1|0|0|0|0|0|0|0|0|0|0|0|0|0|2",
            r"u\.item line 8: genre flags must be 0 or 1",
        ),
    ],
)
def test_ml100k_other_corruptions(
    tmp_path: Path, file: str, line: int, text: str, pattern: str, ml100k_path: Path
) -> None:
    folder = _ml100k_copy(tmp_path, ml100k_path)
    _replace_line(folder / file, line, text)
    with pytest.raises(DataError, match=pattern):
        load_dataset(folder)


def test_ml100k_missing_user_entry(tmp_path: Path, ml100k_path: Path) -> None:
    folder = _ml100k_copy(tmp_path, ml100k_path)
    lines = (folder / "u.user").read_text(encoding="latin-1").splitlines()
    (folder / "u.user").write_text("\n".join(lines[1:]) + "\n", encoding="latin-1")
    with pytest.raises(DataError, match=r"u\.user: no entry for user 1 \(rated in u\.data\)"):
        load_dataset(folder)


def test_missing_and_unrecognised_paths(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file or folder"):
        load_dataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not a MovieLens folder"):
        load_dataset(tmp_path / "empty")
    assert issubclass(DataError, ValueError)


# ---------------------------------------------------------------------------- ML-1M, latest-small, CSV
def test_ml1m_tiny(tmp_path: Path) -> None:
    folder = tmp_path / "ml-1m"
    folder.mkdir()
    (folder / "ratings.dat").write_text(
        "1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978298413\n10::3408::1::978300275\n",
        encoding="latin-1",
    )
    (folder / "users.dat").write_text(
        "1::F::1::10::48067\n2::M::56::16::70072\n10::F::35::1::V5A2B\n", encoding="latin-1"
    )
    (folder / "movies.dat").write_text(
        "661::James and the Giant Peach (1996)::Animation|Children's|Musical\n"
        "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n"
        "3408::Erin Brockovich (2000)::Drama\n",
        encoding="latin-1",
    )
    ds = load_dataset(folder)
    _assert_consistent(ds)
    assert ds.name == "ml-1m" and (ds.n_users, ds.n_items, ds.n_ratings) == (3, 3, 4)
    np.testing.assert_array_equal(ds.item_ids, [661, 1193, 3408])
    col = {a: j for j, a in enumerate(ds.attribute_names)}
    assert len([a for a in ds.attribute_names if a.startswith("occupation=")]) == 21
    assert len([a for a in ds.attribute_names if a.startswith("age=")]) == 7
    assert ds.user_attributes[0, col["age=1-17"]] == 1
    assert ds.user_attributes[0, col["occupation=K-12 student"]] == 1
    assert ds.user_attributes[1, col["age=56+"]] == 1
    assert ds.user_attributes[1, col["occupation=self-employed"]] == 1
    assert ds.user_attributes[2, col["region=unknown"]] == 1
    np.testing.assert_array_equal(ds.user_region, [4, 7, -1])
    np.testing.assert_array_equal(ds.user_attributes.sum(axis=1), 4.0)
    assert ds.feature_names == ["genre=Animation", "genre=Children's", "genre=Drama", "genre=Musical"]
    assert ds.ratings[0, 1] == 5.0 and ds.timestamps[2, 2] == 978300275

    (folder / "ratings.dat").write_text("1::1193::5::978300760\n1::661\n", encoding="latin-1")
    with pytest.raises(DataError, match=r"ratings\.dat line 2: expected 4 '::'-separated fields, got 2"):
        load_dataset(folder)


def _write_latest(folder: Path) -> None:
    folder.mkdir()
    (folder / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n"
        "1,1,4.0,964982703\n"
        "1,3,3.5,964981247\n"
        "2,1,0.5,964982224\n"
        "2,50,5.0,964983815\n"
        "7,3,2.5,964982931\n"
    )
    (folder / "movies.csv").write_text(
        "movieId,title,genres\n"
        "1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy\n"
        '3,"American President, The (1995)",Comedy|Drama|Romance\n'
        "50,Usual Suspects (1995),(no genres listed)\n"
        "99,Never Rated (1999),Horror\n"
    )


def test_latest_small_half_stars(tmp_path: Path) -> None:
    folder = tmp_path / "ml-latest-small"
    _write_latest(folder)
    ds = load_dataset(folder)
    _assert_consistent(ds)
    assert ds.name == "ml-latest-small"
    assert (ds.n_users, ds.n_items, ds.n_ratings) == (3, 3, 5)
    assert (ds.rating_min, ds.rating_max, ds.rating_step) == (0.5, 5.0, 0.5)
    assert ds.user_attributes.shape == (3, 0) and ds.attribute_names == []
    np.testing.assert_array_equal(ds.user_region, -1)
    np.testing.assert_array_equal(ds.item_ids, [1, 3, 50])
    dense = ds.ratings.toarray()
    np.testing.assert_array_equal(dense, [[4.0, 3.5, 0], [0.5, 0, 5.0], [0, 2.5, 0]])
    assert ds.timestamps[2, 1] == 964982931
    fcol = {f: j for j, f in enumerate(ds.feature_names)}
    assert ds.item_features[1, fcol["genre=Romance"]] == 1
    assert ds.item_features[2].tolist() == [1.0 if f == "genre=unknown" else 0.0 for f in ds.feature_names]

    _replace_line(folder / "ratings.csv", 4, "2,1,0.25,964982224", encoding="utf-8")
    with pytest.raises(DataError, match=r"ratings\.csv line 4: rating '0\.25' is outside the range 0\.5\.\.5"):
        load_dataset(folder)


def test_csv_without_header(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("10,5,4\n10,7,2.5\n3,5,1\n\n")
    with pytest.raises(DataError, match=r"r\.csv line 2: rating '2\.5' is not a multiple of 1 .*--rating-scale"):
        load_dataset(path)  # a CSV's default scale is 1..5 whole stars
    ds = load_dataset(path, rating_scale="1,4,0.5")
    _assert_consistent(ds)
    assert ds.name == "csv" and ds.timestamps is None
    np.testing.assert_array_equal(ds.user_ids, [3, 10])
    np.testing.assert_array_equal(ds.item_ids, [5, 7])
    np.testing.assert_array_equal(ds.ratings.toarray(), [[1.0, 0], [4.0, 2.5]])
    assert (ds.rating_min, ds.rating_max, ds.rating_step) == (1.0, 4.0, 0.5)
    assert ds.summary()["attributes"] == 0 and ds.summary()["item_features"] == 0


def test_csv_with_header_string_ids_and_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating,timestamp\nalice,m1,4,100\nbob,m2,5,200\nalice,m2,3,300\n")
    ds = load_dataset(path)
    _assert_consistent(ds)
    assert ds.user_ids.tolist() == ["alice", "bob"] and ds.item_ids.tolist() == ["m1", "m2"]
    np.testing.assert_array_equal(ds.ratings.toarray(), [[4, 3], [0, 5]])
    np.testing.assert_array_equal(ds.timestamps.toarray(), [[100, 300], [0, 200]])


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ("1,2,4\n1,3,x\n", r"r\.csv line 2: rating 'x' is not a number"),
        ("user,item,rating\n1,2,4\n1,3\n", r"r\.csv line 3: expected 3 comma-separated fields, got 2"),
        ("1,2,4\n1,3\n", r"r\.csv line 2: expected 3 or 4 comma-separated fields, got 2"),
        ("1,2,4\n1,3,5,100\n", r"r\.csv line 2: expected 3 fields like line 1, got 4"),
        ("1,2,4\n1,2,5\n", r"r\.csv line 2: duplicate rating for user 1 and item 2"),
        ("1,2,4\n1,3,0\n", r"r\.csv line 2: rating '0' must be positive"),
        ("1,2,4\n1,3,nan\n", r"r\.csv line 2: rating 'nan' is not a finite number"),
        ("", r"r\.csv: file is empty"),
    ],
)
def test_csv_errors(tmp_path: Path, content: str, pattern: str) -> None:
    path = tmp_path / "r.csv"
    path.write_text(content)
    with pytest.raises(DataError, match=pattern):
        load_dataset(path)


# ---------------------------------------------------------------------------- synthetic
def test_synthetic_properties(syn: RatingsDataset) -> None:
    ds = syn
    _assert_consistent(ds)
    assert ds.name == "synthetic" and (ds.n_users, ds.n_items) == (200, 300)
    assert np.diff(ds.ratings.indptr).min() >= 20
    assert set(np.unique(ds.ratings.data)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert 0.06 < ds.n_ratings / (200 * 300) < 0.10
    assert 3.0 < ds.ratings.data.mean() < 4.0
    np.testing.assert_array_equal(ds.user_attributes.sum(axis=1), 4.0)
    assert {"gender=F", "gender=M", "region=unknown"} <= set(ds.attribute_names)
    assert ds.item_features.sum(axis=1).min() >= 1 and ds.feature_names[0].startswith("genre=")
    assert set(np.unique(ds.user_region)) <= set(range(-1, 10))
    # popularity skew: the top 10 % of items hold far more than 10 % of the ratings
    pop = np.sort(np.bincount(ds.ratings.indices, minlength=ds.n_items))[::-1]
    assert pop[:30].sum() > 0.2 * ds.n_ratings
    # attributes correlate with ratings behaviour: they are not independent of the rows
    assert ds.user_attributes.std(axis=0).max() > 0


def test_synthetic_deterministic() -> None:
    a = synthetic(seed=5)
    b = synthetic(seed=5)
    c = synthetic(seed=6)
    assert (a.ratings != b.ratings).nnz == 0 and (a.timestamps != b.timestamps).nnz == 0
    np.testing.assert_array_equal(a.user_attributes, b.user_attributes)
    np.testing.assert_array_equal(a.item_features, b.item_features)
    assert a.ratings.shape == c.ratings.shape and (a.ratings != c.ratings).nnz > 0


def test_synthetic_parameters() -> None:
    ds = synthetic(n_users=30, n_items=40, k=3, min_ratings=35, density=0.5, seed=1)
    assert np.diff(ds.ratings.indptr).min() >= 35 and ds.ratings.shape == (30, 40)
    with pytest.raises(DataError, match="min_ratings"):
        synthetic(n_items=10, min_ratings=20)
    with pytest.raises(DataError, match="density"):
        synthetic(density=0)


# ---------------------------------------------------------------------------- dataset methods
def test_subset_and_with_ratings(syn: RatingsDataset) -> None:
    ds = syn
    idx = np.array([5, 0, 17])
    sub = ds.subset_users(idx)
    _assert_consistent(sub)
    assert sub.n_users == 3 and sub.n_items == ds.n_items
    np.testing.assert_array_equal(sub.ratings.toarray(), ds.ratings[idx].toarray())
    np.testing.assert_array_equal(sub.timestamps.toarray(), ds.timestamps[idx].toarray())
    np.testing.assert_array_equal(sub.user_attributes, ds.user_attributes[idx])
    np.testing.assert_array_equal(sub.user_ids, ds.user_ids[idx])

    items = np.arange(0, ds.n_items, 3)
    subi = ds.subset_items(items)
    _assert_consistent(subi)
    np.testing.assert_array_equal(subi.ratings.toarray(), ds.ratings[:, items].toarray())
    np.testing.assert_array_equal(subi.timestamps.toarray(), ds.timestamps[:, items].toarray())
    np.testing.assert_array_equal(subi.item_features, ds.item_features[items])
    assert ds.subset_users(np.zeros(ds.n_users, dtype=bool)).n_users == 0
    assert ds.subset_users([]).n_users == 0 and ds.subset_items([]).n_items == 0

    half = ds.ratings.copy()
    half.data[::2] = 0
    new = ds.with_ratings(half)
    _assert_consistent(new)
    assert new.n_ratings == ds.n_ratings - len(ds.ratings.data[::2])
    assert new.timestamps is not None  # a subset of the pattern keeps its timestamps
    other = ds.with_ratings(sp.csr_matrix(np.ones(ds.ratings.shape)))
    assert other.timestamps is None and other.n_ratings == ds.n_users * ds.n_items
    with pytest.raises(DataError):
        ds.with_ratings(sp.csr_matrix((2, 2)))

    u_items, u_ratings = ds.user_items(3)
    np.testing.assert_array_equal(u_items, ds.ratings[3].indices)
    np.testing.assert_array_equal(u_ratings, ds.ratings[3].data)
    assert "synthetic" in repr(ds)


# ---------------------------------------------------------------------------- splits
def _dense_pair(train: RatingsDataset, test: RatingsDataset | sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    t = test.ratings if isinstance(test, RatingsDataset) else test
    return train.ratings.toarray(), t.toarray()


def test_holdout_split(syn: RatingsDataset) -> None:
    train, test = holdout_split(syn, 0.2, np.random.default_rng(0))
    _assert_consistent(train)
    _assert_consistent(test)
    tr, te = _dense_pair(train, test)
    assert not ((tr != 0) & (te != 0)).any()  # disjoint
    np.testing.assert_array_equal(tr + te, syn.ratings.toarray())  # cover
    assert np.diff(train.ratings.indptr).min() >= 1
    frac = test.n_ratings / syn.n_ratings
    assert 0.17 < frac < 0.23
    again, _ = holdout_split(syn, 0.2, 0)
    same, _ = holdout_split(syn, 0.2, 0)
    assert (again.ratings != same.ratings).nnz == 0
    with pytest.raises(DataError):
        holdout_split(syn, 1.5, 0)


def test_leave_one_out(syn: RatingsDataset) -> None:
    train, test = leave_one_out(syn)
    assert isinstance(test, sp.csr_matrix) and test.shape == syn.ratings.shape
    np.testing.assert_array_equal(np.diff(test.indptr), 1)
    tr, te = _dense_pair(train, test)
    assert not ((tr != 0) & (te != 0)).any()
    np.testing.assert_array_equal(tr + te, syn.ratings.toarray())
    for u in range(0, syn.n_users, 37):
        lo, hi = syn.timestamps.indptr[u], syn.timestamps.indptr[u + 1]
        latest = syn.timestamps.data[lo:hi].max()
        assert syn.timestamps[u, test.indices[u]] == latest
        assert train.timestamps.data[train.timestamps.indptr[u] : train.timestamps.indptr[u + 1]].max() <= latest
    # without timestamps, ties="highest": the highest item index
    no_ts = RatingsDataset.from_triples([1, 1, 1, 2, 2], [1, 4, 2, 3, 1], [5, 4, 3, 2, 1])
    train2, test2 = leave_one_out(no_ts, ties="highest")
    np.testing.assert_array_equal(test2.indices, [3, 2])
    assert train2.n_ratings == 3
    # timestamp ties: the highest item index among the latest
    tied = RatingsDataset.from_triples([1, 1, 1], [1, 2, 3], [5, 4, 3], timestamps=[9, 9, 1])
    np.testing.assert_array_equal(leave_one_out(tied, ties="highest")[1].indices, [1])
    with pytest.raises(DataError, match="ties"):
        leave_one_out(tied, ties="first")


def test_leave_one_out_random_ties_uniform_and_seeded() -> None:
    # 3000 users, each with items 0..2 tied at the latest timestamp and item 3 earlier
    n = 3000
    users = np.repeat(np.arange(n), 4)
    items = np.tile([0, 1, 2, 3], n)
    ts = np.tile([5, 5, 5, 1], n)
    ds = RatingsDataset.from_triples(users, items, np.ones(4 * n), timestamps=ts)
    _, test = leave_one_out(ds, 0)
    held = test.indices
    assert held.size == n and not np.any(held == 3)  # never the earlier rating
    share = np.bincount(held, minlength=3)[:3] / n
    np.testing.assert_allclose(share, 1 / 3, atol=0.03)  # uniform among the tied (not always the highest id)
    np.testing.assert_array_equal(leave_one_out(ds, 0)[1].indices, held)  # seeded
    assert np.any(leave_one_out(ds, 1)[1].indices != held)


def test_cold_start_and_kfold(syn: RatingsDataset) -> None:
    warm, cold = cold_start_users(syn, 0.1, 1)
    assert cold.size == 20 and np.intersect1d(warm, cold).size == 0
    np.testing.assert_array_equal(np.sort(np.r_[warm, cold]), np.arange(syn.n_users))
    warm_i, cold_i = cold_start_items(syn, 0.1, np.random.default_rng(1))
    assert cold_i.size == 30
    np.testing.assert_array_equal(np.sort(np.r_[warm_i, cold_i]), np.arange(syn.n_items))

    total = np.zeros(syn.ratings.shape)
    folds = list(kfold_ratings(syn, 5, 3))
    assert len(folds) == 5
    for train, test in folds:
        tr, te = _dense_pair(train, test)
        assert not ((tr != 0) & (te != 0)).any()
        np.testing.assert_array_equal(tr + te, syn.ratings.toarray())
        assert abs(test.n_ratings - syn.n_ratings / 5) <= 1
        total += te
    np.testing.assert_array_equal(total, syn.ratings.toarray())  # each rating tested once
    with pytest.raises(DataError, match="k must be"):
        kfold_ratings(syn, 1, 0)


def test_filter_min_ratings(syn: RatingsDataset) -> None:
    out = filter_min_ratings(syn, min_user=20, min_item=5)
    _assert_consistent(out)
    assert 0 < out.n_users < syn.n_users and 0 < out.n_items < syn.n_items
    assert np.diff(out.ratings.indptr).min() >= 20
    assert np.bincount(out.ratings.indices, minlength=out.n_items).min() >= 5
    assert filter_min_ratings(out, 20, 5).ratings.shape == out.ratings.shape  # stable
    kept = syn.subset_users(np.searchsorted(syn.user_ids, out.user_ids))
    kept = kept.subset_items(np.searchsorted(syn.item_ids, out.item_ids))
    assert (kept.ratings != out.ratings).nnz == 0
    assert filter_min_ratings(syn, 500, 0).n_users == 0  # everything can be filtered away
    assert np.all(np.isin(out.user_ids, syn.user_ids)) and np.all(np.diff(out.user_ids) > 0)
    assert filter_min_ratings(syn) is syn


# ---------------------------------------------------------------------------- partitions
def _assert_cover(groups: list[np.ndarray], n: int) -> None:
    allu = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    np.testing.assert_array_equal(np.sort(allu), np.arange(n))
    assert all(g.dtype == np.int64 and np.all(np.diff(g) > 0) for g in groups)


def test_partitions(syn: RatingsDataset) -> None:
    clients = one_client_per_user(syn)
    assert len(clients) == syn.n_users and all(c.tolist() == [u] for u, c in enumerate(clients))
    groups = random_groups(syn, 3, 30, np.random.default_rng(0))
    _assert_cover(groups, syn.n_users)
    assert all(3 <= g.size <= 30 for g in groups)
    silos = zip_silos(syn)
    _assert_cover(silos, syn.n_users)
    assert all(np.unique(syn.user_region[s]).size == 1 for s in silos)


def test_zip_silos_ml100k(ml100k: RatingsDataset) -> None:
    silos = zip_silos(ml100k)
    _assert_cover(silos, ml100k.n_users)
    assert len(silos) == 11 and set(ml100k.user_region[silos[-1]]) == {-1}
    assert silos[-1].size == 18


@settings(max_examples=80, deadline=None)
@given(n=st.integers(3, 700), seed=st.integers(0, 2**31))
def test_random_group_sizes_within_bounds(n: int, seed: int) -> None:
    groups = random_groups(n, 3, 30, seed)
    _assert_cover(groups, n)
    sizes = [g.size for g in groups]
    assert min(sizes) >= 3 and max(sizes) <= 30


def test_random_groups_corner_cases() -> None:
    # n = 31 forces a leftover whenever the first draw is 30: checked for many seeds
    for seed in range(300):
        sizes = [g.size for g in random_groups(31, 3, 30, seed)]
        assert sum(sizes) == 31 and min(sizes) >= 3 and max(sizes) <= 30
    assert [g.size for g in random_groups(2, 3, 30, 0)] == [2]  # fewer users than low
    assert random_groups(0, 3, 30, 0) == []
    sizes = sorted(g.size for g in random_groups(7, 3, 3, 0))  # low == high: short last group
    assert sizes == [1, 3, 3]
    with pytest.raises(DataError):
        random_groups(10, 5, 4, 0)

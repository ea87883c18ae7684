"""Sized synthetic datasets from a spec string (``--data synthetic:...``)."""

from __future__ import annotations

import numpy as np
import pytest

from privaudit.cli import main
from privaudit.data import load_dataset, synthetic
from privaudit.data.synthetic import PRESETS, parse_spec
from privaudit.errors import DataError


def _same(a, b) -> None:
    assert (a.n_users, a.n_items) == (b.n_users, b.n_items)
    for x, y in ((a.ratings, b.ratings), (a.timestamps, b.timestamps)):
        np.testing.assert_array_equal(x.indptr, y.indptr)
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.data, y.data)
    np.testing.assert_array_equal(a.user_attributes, b.user_attributes)
    np.testing.assert_array_equal(a.item_features, b.item_features)


def test_presets_have_movielens_shapes_and_rating_counts():
    assert parse_spec("synthetic:ml-1m-size") == {"n_users": 6040, "n_items": 3706, "density": 0.045}
    assert parse_spec("synthetic:ml-10m-size")["n_users"] == 69878
    assert parse_spec("synthetic:ml-10m-size")["n_items"] == 10677
    # expected ratings = users x items x density: 1.007 M and 10.0 M
    assert parse_spec("synthetic:netflix-size")["n_users"] == 480189
    assert parse_spec("synthetic:netflix-size")["n_items"] == 17770
    for name, target in (("ml-1m-size", 1.0e6), ("ml-10m-size", 1.0e7), ("netflix-size", 1.0048e8)):
        p = PRESETS[name]
        assert abs(p["n_users"] * p["n_items"] * p["density"] / target - 1) < 0.01
    ds = load_dataset("synthetic:ml-100k-size")
    assert (ds.n_users, ds.n_items) == (943, 1682)
    assert abs(ds.n_ratings / 100_000 - 1) < 0.02


def test_spec_equals_the_direct_call_and_keys_override_the_preset():
    _same(
        load_dataset("synthetic:users=120,items=90,density=0.2,k=3,min_ratings=5,seed=4"),
        synthetic(n_users=120, n_items=90, density=0.2, k=3, min_ratings=5, seed=4),
    )
    assert parse_spec("synthetic:ml-1m-size,users=10,seed=2") == {
        "n_users": 10,
        "n_items": 3706,
        "density": 0.045,
        "seed": 2,
    }
    _same(load_dataset("synthetic:"), synthetic())


@pytest.mark.parametrize(
    "spec, message",
    [
        ("synthetic:users=0", "users must be in 1..10000000"),
        ("synthetic:ml-2m-size", "unknown preset 'ml-2m-size'"),
        ("synthetic:users=10,ml-1m-size", "unknown preset"),
        ("synthetic:users=ten", "users must be an integer"),
        ("synthetic:density=1.5", "density must be in (0, 1]"),
        ("synthetic:colour=red", "unknown key 'colour'"),
        ("synthetic:users=100,,items=3", "empty field"),
        ("synthetic:users=10000000,items=1000000", "exceeds the limit"),
        ("synthetic:items=10,min_ratings=20", "min_ratings must be in 0..items=10"),
    ],
)
def test_bad_specs_are_one_line_exit_2_before_any_compute(spec, message, capsys, tmp_path):
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_spec(spec)
    out = tmp_path / "t.ptx"
    with pytest.raises(SystemExit) as exc:
        main(["run", "--protocol", "fedmvmf", "--data", spec, "-o", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and not out.exists()


def test_help_documents_the_spec_and_presets(capsys):
    with pytest.raises(SystemExit):
        main(["attack", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "ml-1m-size" in text and "ml-10m-size" in text and "density=D" in text


@pytest.mark.slow
def test_scale_benchmark_runs_and_prints_every_stage():
    """The command docs/scale.md quotes, at its smallest size, twice (the fastest run per stage)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "scale.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--sizes", "100k", "--repeat", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "2 run(s) per size" in out and "s/GiB (first touch, again)" in out
    for stage in ("dataset", "protocol", "of which utility", "save", "load", "attack", "scoring"):
        assert any(line.strip().startswith(f"{stage} ") for line in out.splitlines())
    assert "rating_accuracy 1.0000" in out and "attribute_accuracy 1.0000" in out  # the attack is exact


def test_candidate_item_draw_of_large_sizes_matches_the_exact_draw(monkeypatch):
    """Above 2^31 users x items (netflix-size) items come from popularity-drawn candidates: the same
    per-user counts, distinct items, and ratings and popularity close to the exact Gumbel top-c."""
    import importlib

    module = importlib.import_module("privaudit.data.synthetic")
    exact = synthetic(n_users=2000, n_items=800, density=0.05, seed=6)
    monkeypatch.setattr(module, "_EXACT_CELLS", 0)
    fast = synthetic(n_users=2000, n_items=800, density=0.05, seed=6)
    a, b = exact.ratings, fast.ratings
    np.testing.assert_array_equal(a.indptr, b.indptr)
    assert all(
        len(np.unique(b.indices[b.indptr[u] : b.indptr[u + 1]])) == b.indptr[u + 1] - b.indptr[u] for u in range(2000)
    )
    assert abs(a.data.mean() - b.data.mean()) < 0.2
    pop_a, pop_b = np.bincount(a.indices, minlength=800), np.bincount(b.indices, minlength=800)
    assert np.corrcoef(pop_a, pop_b)[0, 1] > 0.95
    np.testing.assert_array_equal(exact.user_attributes, fast.user_attributes)


def test_fast_draw_pieces_equal_their_reference_computations():
    """The generator's faster pieces give the reference ones' values bit for bit (the data of
    every size depend on them)."""
    import importlib

    syn = importlib.import_module("privaudit.data.synthetic")  # the module (the package exports the function)
    rng = np.random.default_rng(4)
    # inverse-CDF draw by guide table == searchsorted, also on the bucket edges and flat runs
    weights = np.exp(-0.9 * np.log1p(rng.permutation(500)))
    weights[100:140] = 1e-12
    cdf = np.cumsum(weights)
    u = np.concatenate([rng.random(200_000), np.arange(2001) / 2000, [0.0, np.nextafter(1.0, 0)]])
    expected = np.searchsorted(cdf, u * cdf[-1], side="right")
    assert np.array_equal(syn._InverseCDF(cdf)(u), expected) and expected.max() == cdf.size  # u = 1 too
    # first occurrences == np.unique's return_index, sorted
    for values in (rng.integers(0, 30, 5000), rng.integers(0, 2**40, 1000), np.array([7]), np.array([3, 3, 3])):
        assert np.array_equal(syn._first_of_each(values), np.sort(np.unique(values, return_index=True)[1]))
    # timestamps == the former lexsort-based computation (chunks of whole users: > _BLOCK entries)
    counts = rng.integers(1, 400, size=9000)
    rows = np.repeat(np.arange(counts.size, dtype=np.int32), counts)
    assert rows.size > syn._BLOCK
    a, b = np.random.default_rng(9), np.random.default_rng(9)
    start = syn._T0 + a.integers(0, 4 * 365 * syn._DAY, size=counts.size)
    position = np.lexsort((a.random(rows.size), rows))
    gaps = np.empty(rows.size)
    gaps[position] = a.exponential(3.0 * syn._DAY, size=rows.size)
    seg = np.concatenate(([0], np.cumsum(counts)[:-1]))
    cum = np.empty(rows.size)
    cum[position] = np.cumsum(gaps[position])
    first = cum[position[seg]] - gaps[position[seg]]
    reference = (cum + start[rows] - first[rows]).astype(np.int64)
    assert np.array_equal(syn._timestamps(b, rows, counts), reference)

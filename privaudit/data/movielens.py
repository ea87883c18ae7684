"""Loaders for MovieLens 100K, 1M, latest-small folders and plain rating CSV files.

:func:`load_dataset` detects the format from the files present:

* ``u.data`` -> MovieLens 100K (``u.user``, ``u.item``, ``u.genre``, ``u.occupation``);
* ``ratings.dat`` -> MovieLens 1M (``users.dat``, ``movies.dat``; ``::`` separated, latin-1);
* ``ratings.csv`` -> MovieLens latest(-small) (``movies.csv``; no user attributes);
* a file -> plain CSV ``user,item,rating[,timestamp]``: a header naming the columns (common
  aliases accepted, :data:`CSV_COLUMNS`) or none (read by position); ratings on 1..5 whole
  stars unless another scale is declared (``--rating-scale MIN,MAX[,STEP]``).

Users and items are those that appear in the ratings file, indexed 0.. in the order of their
raw ids. User attributes are one-hot blocks: 7 age groups, gender, occupation, region (first
ZIP digit ``region=0``..``region=9`` plus ``region=unknown``), so each row sums to 4. Item
features are the genre flags. Every malformed input raises :class:`DataError` with one line
naming the file and the 1-based line number. Parsing is plain Python/numpy (no pandas, no
pickle; the reader is :mod:`privaudit.data.delimited`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from privaudit.data.dataset import RatingsDataset, build_csr, sort_coo
from privaudit.data.delimited import Table, read_lines, read_table
from privaudit.errors import DataError

__all__ = ["CSV_COLUMNS", "CSV_DEFAULT_SCALE", "ML1M_AGES", "ML1M_OCCUPATIONS", "load_dataset", "parse_rating_scale"]

#: ML-1M age codes -> group names (the 7 groups of the ML-1M README).
ML1M_AGES: dict[int, str] = {
    1: "1-17",
    18: "18-24",
    25: "25-34",
    35: "35-44",
    45: "45-49",
    50: "50-55",
    56: "56+",
}

#: ML-1M occupation codes 0..20 -> names (from the ML-1M README).
ML1M_OCCUPATIONS: list[str] = [
    "other",
    "academic/educator",
    "artist",
    "clerical/admin",
    "college/grad student",
    "customer service",
    "doctor/health care",
    "executive/managerial",
    "farmer",
    "homemaker",
    "K-12 student",
    "lawyer",
    "programmer",
    "retired",
    "sales/marketing",
    "scientist",
    "self-employed",
    "technician/engineer",
    "tradesman/craftsman",
    "unemployed",
    "writer",
]

#: Fallback genre list of ML-100K when ``u.genre`` is absent (order of the u.item flags).
ML100K_GENRES: list[str] = [
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
]

N_AGE_GROUPS = 7
REGION_NAMES = [f"region={d}" for d in range(10)] + ["region=unknown"]


class _Ratings(NamedTuple):
    """Validated ratings of a file: raw ids, (nnz,) int64 indices, values and row-major order."""

    user_ids: np.ndarray
    item_ids: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    order: np.ndarray


def _ratings_from_table(
    table: Table,
    user_col: np.ndarray,
    item_col: np.ndarray,
    *,
    scale: tuple[float, float, float] | None = None,
    rating_col: int = 2,
    hint: str = "",
) -> _Ratings:
    """Map raw ids to indices; validate ratings (numeric, > 0, on ``scale`` = (min, max, step);
    step 0 = continuous) and duplicates. ``hint`` is appended to a scale error."""
    if len(table) == 0:
        raise DataError(f"{table.path}: no ratings")
    values = table.floats(rating_col, "rating")

    def reject(mask: np.ndarray, why: str) -> None:
        bad = np.flatnonzero(mask)
        if bad.size:
            raise table.error(bad[0], f"rating {table.field(bad[0], rating_col)!r} {why}")

    reject(values <= 0, "must be positive (0 means unrated)")
    if scale is not None:
        lo, hi, step = scale
        reject((values < lo - 1e-9) | (values > hi + 1e-9), f"is outside the range {lo:g}..{hi:g}{hint}")
        if step > 0:
            q = (values - lo) / step
            reject(np.abs(q - np.round(q)) > 1e-9, f"is not a multiple of {step:g}{hint}")
    user_ids, rows = _index_ids(user_col)
    item_ids, cols = _index_ids(item_col)
    order, dup = sort_coo(rows, cols, item_ids.size)
    if dup.size:
        k = int(dup[0])
        raise table.error(k, f"duplicate rating for user {user_col[k]} and item {item_col[k]}")
    return _Ratings(user_ids, item_ids, rows, cols, values, order)


def _index_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique raw ids, (n,) int64 index of each entry into them); O(n) for small ints."""
    if ids.dtype.kind in "iu" and ids.size and ids.min() >= 0 and ids.max() < 4 * ids.size + 1_000_000:
        present = np.zeros(int(ids.max()) + 1, dtype=bool)
        present[ids] = True
        index = np.cumsum(present, dtype=np.int64) - 1
        return np.flatnonzero(present).astype(ids.dtype), index[ids]
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique, inverse.astype(np.int64).ravel()


def _ids(table: Table, j: int) -> np.ndarray:
    """Id column: int64 when every id is an integer, else stripped str."""
    if table.numeric is not None:
        return table.ints(j, "id")
    col = table.column(j)
    try:
        return np.array(col).astype(np.int64)
    except (ValueError, OverflowError):
        return np.array([c.strip() for c in col], dtype=str)


def _lookup(raw_ids: np.ndarray, wanted: np.ndarray, table: Table, what: str, src: str) -> np.ndarray:
    """Row positions in ``table`` (whose ids are ``raw_ids``) of every id in ``wanted``."""
    order = np.argsort(raw_ids, kind="stable")
    sorted_ids = raw_ids[order]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if dup.size:
        k = int(order[dup[0] + 1])
        raise table.error(k, f"duplicate {what} id {raw_ids[k]}")
    if sorted_ids.size == 0:
        raise DataError(f"{table.path}: no {what} entries (expected one per {what} rated in {src})")
    pos = np.minimum(np.searchsorted(sorted_ids, wanted), sorted_ids.size - 1)
    missing = np.flatnonzero(sorted_ids[pos] != wanted)
    if missing.size:
        raise DataError(f"{table.path}: no entry for {what} {wanted[missing[0]]} (rated in {src})")
    return order[pos]


# ---------------------------------------------------------------------------- attributes
def _age_groups(ages: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """7 equal-width integer age groups over the observed range -> (group index (n,), names)."""
    lo, hi = int(ages.min()), int(ages.max())
    edges = np.linspace(lo, hi, N_AGE_GROUPS + 1)
    starts = np.unique(np.concatenate(([lo], np.ceil(edges[1:-1]).astype(np.int64))))
    starts = starts[starts <= hi]
    ends = np.concatenate((starts[1:] - 1, [hi]))
    names = [f"age={a}-{b}" if a != b else f"age={a}" for a, b in zip(starts, ends)]
    return np.searchsorted(starts, ages, side="right") - 1, names


def _zip_region(zips: Sequence[str]) -> np.ndarray:
    """First ZIP digit 0..9 for numeric ZIPs (an optional ``-`` suffix allowed), else -1."""
    out = np.full(len(zips), -1, dtype=np.int64)
    for k, z in enumerate(zips):
        head = z.strip().split("-", 1)[0]
        if head.isascii() and head.isdigit():
            out[k] = int(head[0])
    return out


def _one_hot_blocks(blocks: list[tuple[np.ndarray, list[str]]]) -> tuple[np.ndarray, list[str]]:
    """Stack one-hot blocks given as (category index per row (n,), column names)."""
    n = blocks[0][0].size
    widths = [len(names) for _, names in blocks]
    out = np.zeros((n, sum(widths)), dtype=np.float64)
    offset = 0
    names: list[str] = []
    for (codes, cols), w in zip(blocks, widths):
        out[np.arange(n), offset + codes] = 1.0
        names += cols
        offset += w
    return out, names


def _user_block(
    ages_codes: np.ndarray,
    age_names: list[str],
    genders: list[str],
    occ_codes: np.ndarray,
    occ_names: list[str],
    regions: np.ndarray,
) -> tuple[np.ndarray, list[str]]:
    gender_names = sorted(set(genders) | {"F", "M"})
    g_codes = np.searchsorted(np.array(gender_names), np.array(genders))
    r_codes = np.where(regions < 0, 10, regions)
    return _one_hot_blocks(
        [
            (ages_codes, [n if n.startswith("age=") else f"age={n}" for n in age_names]),
            (g_codes, [f"gender={g}" for g in gender_names]),
            (occ_codes, [f"occupation={o}" for o in occ_names]),
            (r_codes, REGION_NAMES),
        ]
    )


def _genres_from_strings(strings: Sequence[str], no_genre: str = "(no genres listed)") -> tuple[np.ndarray, list[str]]:
    """Multi-hot genre matrix (m, q) from ``A|B`` strings; ``no_genre`` maps to ``genre=unknown``."""
    split = [[("unknown" if g == no_genre else g) for g in s.strip().split("|") if g] for s in strings]
    names = sorted({g for gs in split for g in gs})
    col = {g: j for j, g in enumerate(names)}
    out = np.zeros((len(split), len(names)), dtype=np.float64)
    rows = np.repeat(np.arange(len(split)), [len(gs) for gs in split])
    cols = np.fromiter((col[g] for gs in split for g in gs), dtype=np.int64, count=rows.size)
    out[rows, cols] = 1.0
    return out, [f"genre={g}" for g in names]


def _assemble(
    name: str,
    r: _Ratings,
    ts: np.ndarray | None,
    attributes: np.ndarray | None,
    attribute_names: list[str],
    regions: np.ndarray | None,
    features: np.ndarray | None,
    feature_names: list[str],
    scale: tuple[float, float, float],
) -> RatingsDataset:
    """The dataset from validated ratings (``ts``: (nnz,) int64 or None) and side information."""
    shape = (r.user_ids.size, r.item_ids.size)
    return RatingsDataset(
        name=name,
        ratings=build_csr(r.rows, r.cols, r.values, shape, order=r.order),
        user_attributes=attributes if attributes is not None else np.zeros((shape[0], 0)),
        attribute_names=attribute_names,
        item_features=features if features is not None else np.zeros((shape[1], 0)),
        feature_names=feature_names,
        user_ids=r.user_ids,
        item_ids=r.item_ids,
        timestamps=None if ts is None else build_csr(r.rows, r.cols, ts, shape, dtype=np.int64, order=r.order),
        user_region=regions if regions is not None else np.full(shape[0], -1, dtype=np.int64),
        rating_min=scale[0],
        rating_max=scale[1],
        rating_step=scale[2],
    )


# ---------------------------------------------------------------------------- ML-100K
def _load_ml100k(folder: Path, scale: tuple[float, float, float] | None = None) -> RatingsDataset:
    scale = (1.0, 5.0, 1.0) if scale is None else scale
    data = read_table(folder / "u.data", "\t", 4, int_cols=(0, 1, 3))
    user_col, item_col = data.ints(0, "user id"), data.ints(1, "item id")
    r = _ratings_from_table(data, user_col, item_col, scale=scale)
    ts = data.timestamps(3)
    src = "u.data"

    attributes, attr_names, regions = None, [], None
    if (folder / "u.user").exists():
        users = read_table(folder / "u.user", "|", 5, encoding="latin-1")
        uid = users.ints(0, "user id")
        ages = users.ints(1, "age")
        if ages.size and ages.min() < 0:
            k = int(np.argmin(ages))
            raise users.error(k, f"age {ages[k]} is negative")
        if (folder / "u.occupation").exists():
            occ_names = [line.strip() for line in read_lines(folder / "u.occupation", "latin-1") if line.strip()]
        else:
            occ_names = sorted({o.strip() for o in users.column(3)})
        occ_index = {o: j for j, o in enumerate(occ_names)}
        occ_codes = np.empty(len(users), dtype=np.int64)
        for k, o in enumerate(users.column(3)):
            j = occ_index.get(o.strip())
            if j is None:
                raise users.error(k, f"occupation {o.strip()!r} is not listed in u.occupation")
            occ_codes[k] = j
        genders = [g.strip() for g in users.column(2)]
        for k, g in enumerate(genders):
            if not g:
                raise users.error(k, "empty gender")
        pos = _lookup(uid, r.user_ids, users, "user", src)
        age_codes, age_names = _age_groups(ages[pos])
        regions = _zip_region([users.field(k, 4) for k in pos])
        attributes, attr_names = _user_block(
            age_codes, age_names, [genders[k] for k in pos], occ_codes[pos], occ_names, regions
        )

    features, feat_names = None, []
    if (folder / "u.item").exists():
        if (folder / "u.genre").exists():
            gtab = read_table(folder / "u.genre", "|", 2, encoding="latin-1")
            gidx = gtab.ints(1, "genre index")
            genre_names = [gtab.field(k, 0) for k in np.argsort(gidx, kind="stable")]
        else:
            genre_names = list(ML100K_GENRES)
        q = len(genre_names)
        items = read_table(folder / "u.item", "|", 5 + q, encoding="latin-1")
        iid = items.ints(0, "item id")
        flags = np.array(items.flat, dtype=str).reshape(len(items), 5 + q)[:, 5:]
        ok = (flags == "0") | (flags == "1")
        if not ok.all():  # tolerate padding spaces
            flags = np.char.strip(flags)
            ok = (flags == "0") | (flags == "1")
        if not ok.all():
            k = int(np.flatnonzero(~ok.all(axis=1))[0])
            raise items.error(k, f"genre flags must be 0 or 1, got {'|'.join(items.row(k)[5:])!r}")
        pos = _lookup(iid, r.item_ids, items, "item", src)
        features = (flags[pos] == "1").astype(np.float64)
        feat_names = [f"genre={g}" for g in genre_names]

    return _assemble("ml-100k", r, ts, attributes, attr_names, regions, features, feat_names, scale)


# ---------------------------------------------------------------------------- ML-1M
def _load_ml1m(folder: Path, scale: tuple[float, float, float] | None = None) -> RatingsDataset:
    scale = (1.0, 5.0, 1.0) if scale is None else scale
    data = read_table(folder / "ratings.dat", "::", 4, encoding="latin-1", int_cols=(0, 1, 3))
    user_col, item_col = data.ints(0, "user id"), data.ints(1, "movie id")
    r = _ratings_from_table(data, user_col, item_col, scale=scale)
    ts = data.timestamps(3)
    src = "ratings.dat"

    attributes, attr_names, regions = None, [], None
    if (folder / "users.dat").exists():
        users = read_table(folder / "users.dat", "::", 5, encoding="latin-1")
        uid = users.ints(0, "user id")
        genders = [g.strip() for g in users.column(1)]
        age_raw = users.ints(2, "age code")
        age_codes_known = np.array(sorted(ML1M_AGES))
        a_pos = np.searchsorted(age_codes_known, age_raw)
        bad = np.flatnonzero((a_pos >= age_codes_known.size) | (age_codes_known[np.minimum(a_pos, 6)] != age_raw))
        if bad.size:
            raise users.error(bad[0], f"age code {age_raw[bad[0]]} is not one of {sorted(ML1M_AGES)}")
        occ = users.ints(3, "occupation code")
        bad = np.flatnonzero((occ < 0) | (occ >= len(ML1M_OCCUPATIONS)))
        if bad.size:
            raise users.error(bad[0], f"occupation code {occ[bad[0]]} is not in 0..20")
        pos = _lookup(uid, r.user_ids, users, "user", src)
        regions = _zip_region([users.field(k, 4) for k in pos])
        attributes, attr_names = _user_block(
            a_pos[pos],
            [ML1M_AGES[c] for c in age_codes_known],
            [genders[k] for k in pos],
            occ[pos],
            ML1M_OCCUPATIONS,
            regions,
        )

    features, feat_names = None, []
    if (folder / "movies.dat").exists():
        movies = read_table(folder / "movies.dat", "::", 3, encoding="latin-1")
        mid = movies.ints(0, "movie id")
        pos = _lookup(mid, r.item_ids, movies, "movie", src)
        features, feat_names = _genres_from_strings([movies.field(k, 2) for k in pos])

    return _assemble("ml-1m", r, ts, attributes, attr_names, regions, features, feat_names, scale)


# ---------------------------------------------------------------------------- ML latest(-small)
def _has_header(first_line: list[str]) -> bool:
    """A header line is one whose rating field is not a number."""
    if len(first_line) < 3:
        return False
    try:
        float(first_line[2])
        return False
    except ValueError:
        return True


def _load_latest(folder: Path, scale: tuple[float, float, float] | None = None) -> RatingsDataset:
    scale = (0.5, 5.0, 0.5) if scale is None else scale
    path = folder / "ratings.csv"
    head = _first_line(path)
    data = read_table(path, ",", 4, skip_header=_has_header(head.split(",")), int_cols=(0, 1, 3))
    user_col, item_col = data.ints(0, "userId"), data.ints(1, "movieId")
    r = _ratings_from_table(data, user_col, item_col, scale=scale)
    ts = data.timestamps(3)

    features, feat_names = None, []
    movies_path = folder / "movies.csv"
    if movies_path.exists():
        text = "\n".join(read_lines(movies_path, "utf-8"))
        reader = csv.reader(io.StringIO(text))
        records: list[list[str]] = []
        numbers: list[int] = []
        try:
            for record in reader:
                if record and any(f.strip() for f in record):
                    records.append(record)
                    numbers.append(reader.line_num)
        except csv.Error as exc:
            raise DataError(f"{movies_path} line {reader.line_num}: {exc}") from None
        if records and records[0][0].strip().lower() == "movieid":
            records, numbers = records[1:], numbers[1:]
        for k, record in enumerate(records):
            if len(record) != 3:
                raise DataError(
                    f"{movies_path} line {numbers[k]}: expected 3 comma-separated fields "
                    f"(movieId,title,genres), got {len(record)}"
                )
        flat = [f for record in records for f in record]
        movies = Table(movies_path, np.array(numbers, dtype=np.int64), 3, flat=flat)
        mid = movies.ints(0, "movieId")
        pos = _lookup(mid, r.item_ids, movies, "movie", "ratings.csv")
        features, feat_names = _genres_from_strings([movies.field(k, 2) for k in pos])

    return _assemble("ml-latest-small", r, ts, None, [], None, features, feat_names, scale)


# ---------------------------------------------------------------------------- plain CSV
def _first_line(path: Path) -> str:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                line = raw.decode("utf-8", errors="replace").lstrip("\ufeff").strip()
                if line:
                    return line
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return ""


#: Accepted header names (lower case) of the plain CSV columns.
CSV_COLUMNS: dict[str, tuple[str, ...]] = {
    "user": ("user", "user_id", "userid", "uid", "user id", "users"),
    "item": ("item", "item_id", "itemid", "iid", "item id", "movie", "movie_id", "movieid", "items"),
    "rating": ("rating", "ratings", "score", "value", "stars"),
    "timestamp": ("timestamp", "time", "ts", "unix_time"),
}

#: Rating scale of a plain CSV unless declared otherwise: 1..5 whole stars (MovieLens 100K/1M).
CSV_DEFAULT_SCALE: tuple[float, float, float] = (1.0, 5.0, 1.0)

_ALIAS = {alias: col for col, names in CSV_COLUMNS.items() for alias in names}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv_columns(path: Path, head: list[str]) -> dict[str, int] | None:
    """Column positions from a header line, or None for a headerless file.

    A first line is a header when one of its fields is a known column name or its third field
    is not a number; a headerless file is read by position as ``user,item,rating[,timestamp]``.
    """
    names = [h.strip().strip('"').strip("'").strip().lower() for h in head]
    if not any(n in _ALIAS for n in names) and (len(head) < 3 or _is_number(head[2].strip())):
        return None
    known = "; ".join(f"{col}: {', '.join(a for a in aliases if ' ' not in a)}" for col, aliases in CSV_COLUMNS.items())
    cols: dict[str, int] = {}
    for j, name in enumerate(names):
        col = _ALIAS.get(name)
        if col is None:
            raise DataError(
                f"{path} line 1: unknown column {head[j].strip()!r} in the header "
                f"{','.join(h.strip() for h in head)!r} (accepted names: {known})"
            )
        if col in cols:
            raise DataError(
                f"{path} line 1: two {col} columns in the header ({head[cols[col]].strip()!r}, {head[j].strip()!r})"
            )
        cols[col] = j
    missing = [c for c in ("user", "item", "rating") if c not in cols]
    if missing:
        raise DataError(
            f"{path} line 1: the header {','.join(h.strip() for h in head)!r} has no {' or '.join(missing)} column "
            f"(accepted names: {known})"
        )
    return cols


def parse_rating_scale(text: str | Sequence[float]) -> tuple[float, float, float]:
    """``"MIN,MAX[,STEP]"`` (or a 2/3-sequence) -> (min, max, step); step 0 = continuous, default 1.

    Raises:
        DataError: not two or three numbers, min not positive, max below min, step negative.
    """
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    try:
        vals = [float(p) for p in parts]
    except (TypeError, ValueError):
        vals = []
    if len(vals) not in (2, 3) or not all(np.isfinite(vals)):
        raise DataError(f"--rating-scale: expected MIN,MAX[,STEP] (e.g. 1,5 or 0.5,5,0.5), got {text!r}")
    lo, hi = vals[0], vals[1]
    step = vals[2] if len(vals) == 3 else 1.0
    if lo <= 0:
        raise DataError(f"--rating-scale: MIN must be positive (0 means unrated), got {lo:g}")
    if hi < lo or step < 0:
        raise DataError(f"--rating-scale: expected MIN <= MAX and STEP >= 0, got {text!r}")
    if step > 0 and abs((hi - lo) / step - round((hi - lo) / step)) > 1e-9:
        raise DataError(f"--rating-scale: MAX - MIN must be a multiple of STEP, got {text!r}")
    return lo, hi, step


#: MovieLens files that are not ratings (lower-case name -> what they hold), for ``--data FILE``
_SIDE_FILES = {
    **{f"u.{n}": "MovieLens 100K's " + w for n, w in (("item", "item list"), ("user", "user list"))},
    **{f"u.{n}": f"MovieLens 100K's {n} names" for n in ("genre", "occupation")},
    "u.info": "MovieLens 100K's counts",
    "movies.dat": "MovieLens 1M's item list",
    "users.dat": "MovieLens 1M's user list",
    "movies.csv": "MovieLens latest-small's item list",
    "tags.csv": "MovieLens latest-small's tags",
    "links.csv": "MovieLens latest-small's links",
}
_CSV_LINES = "expected lines user,item,rating[,timestamp]"


def _load_csv(path: Path, scale: tuple[float, float, float] | None = None) -> RatingsDataset:
    side = _SIDE_FILES.get(path.name.lower())
    if side is not None:
        raise DataError(f"{path}: not a ratings file ({side}); give the folder: --data {path.parent}")
    raw = b""
    try:
        raw = path.read_bytes()
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path} line {line}: not a ratings file (not utf-8 text; {_CSV_LINES})") from None
    except OSError:
        pass  # _first_line names the read error
    del raw  # the table is read again line by line below
    head = _first_line(path)
    if not head:
        raise DataError(f"{path}: file is empty (expected lines user,item,rating[,timestamp])")
    sep = next((s for s in (",", "\t", ";") if s in head), ",")
    cols = _csv_columns(path, head.split(sep))
    header = cols is not None
    nfields = len(head.split(sep)) if header else (3, 4)
    if cols is None:
        cols = {"user": 0, "item": 1, "rating": 2, "timestamp": 3}
    int_cols = tuple(cols[c] for c in ("user", "item", "timestamp") if c in cols)
    data = read_table(path, sep, nfields, skip_header=header, int_cols=int_cols)
    if len(data) == 0:
        raise DataError(f"{path}: no ratings (expected lines user,item,rating[,timestamp])")
    user_col, item_col = _ids(data, cols["user"]), _ids(data, cols["item"])
    declared = scale is not None
    scale = CSV_DEFAULT_SCALE if scale is None else scale
    hint = "" if declared else " (the default scale of a CSV; declare another with --rating-scale MIN,MAX[,STEP])"
    r = _ratings_from_table(data, user_col, item_col, scale=scale, rating_col=cols["rating"], hint=hint)
    ts = data.timestamps(cols["timestamp"]) if "timestamp" in cols and data.nfields > cols["timestamp"] else None
    return _assemble("csv", r, ts, None, [], None, None, [], scale)


# ---------------------------------------------------------------------------- entry point
def load_dataset(path: str | Path, rating_scale: str | Sequence[float] | None = None) -> RatingsDataset:
    """Load a MovieLens 100K / 1M / latest-small folder or a plain ``user,item,rating[,ts]`` CSV.

    A plain CSV (comma, tab or semicolon separated) either starts with a header naming its
    columns (any order; :data:`CSV_COLUMNS` lists the accepted names, e.g. ``user_id``,
    ``userId``, ``movieId``, ``score``, ``ts``) or has none and is read by position as
    ``user,item,rating[,timestamp]``. Its ratings must lie on 1..5 whole stars unless
    ``rating_scale`` declares another scale; a MovieLens folder's scale is the one of its
    release (1..5 step 1; latest-small 0.5..5 step 0.5) unless ``rating_scale`` is given.

    Args:
        path: a folder holding ``u.data`` (100K), ``ratings.dat`` (1M) or ``ratings.csv``
            (latest-small), or a path to a CSV/TSV file of ratings (header optional); or a
            sized synthetic spec ``synthetic:...`` (:func:`privaudit.data.synthetic.parse_spec`).
        rating_scale: ``"MIN,MAX[,STEP]"`` or ``(min, max[, step])``; step 0 = continuous,
            default step 1 (:func:`parse_rating_scale`). Ratings off the scale are refused.

    Returns:
        A :class:`RatingsDataset` (users and items are those with ratings, ordered by raw id).

    Raises:
        DataError: missing path, unrecognised folder, malformed line (file and line named).
    """
    if str(path).strip().lower().startswith("synthetic:"):  # a sized synthetic dataset, not a path
        from privaudit.data.synthetic import synthetic_from_spec

        return synthetic_from_spec(str(path))
    scale = None if rating_scale is None else parse_rating_scale(rating_scale)
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_file():
        return _load_csv(path, scale)
    if (path / "u.data").is_file():
        return _load_ml100k(path, scale)
    if (path / "ratings.dat").is_file():
        return _load_ml1m(path, scale)
    if (path / "ratings.csv").is_file():
        return _load_latest(path, scale)
    raise DataError(
        f"{path}: not a MovieLens folder (expected u.data for 100K, ratings.dat for 1M or "
        f"ratings.csv for latest-small) nor a ratings CSV file"
    )

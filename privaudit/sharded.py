"""One protocol run over a Dask cluster: the clients' blocks on the workers, shards on disk.

A sharded run (``privaudit run --scheduler local:N|tcp://HOST:PORT -o DIR``) cuts the clients
into the blocks of :mod:`privaudit.protocols.blocks` and gives each Dask worker consecutive whole
blocks, held by a Dask actor. Every round the server broadcasts its state to the actors; each
computes its blocks' client updates with the same per-block functions as the single-process run,
writes its recorded uploads as one transcript shard per (block, round) through
:meth:`Transcript.save`, and returns the blocks' partial sums; the server adds them in block
order and takes its step. Per-client random draws come from the seed and the block index, so
the run equals the single-process run at the same seed (arrays, utility, attack metrics).

Output directory: ``manifest.json``, ``server.ptx`` (the run's header and the servers'
messages), ``c<block>-private.ptx`` (the block's private messages) and ``c<block>-r<round>.ptx``
(its uploads of one recorded round). :func:`load` checks the manifest and every shard and
returns the transcript in the single-process message order.

Supported: FedMVMF (every setting) and FedRec's ``pmf-batch`` model, without defenses (a
defense draws its noise in client order over a whole round, which a partition would change).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import _safejson
from privaudit._escape import printable
from privaudit._local_cluster import local_cluster, local_workers
from privaudit._shard_scores import histograms, majority
from privaudit.errors import MissingDependencyError, PrivauditError, TranscriptError
from privaudit.protocols.base import RunResult, RunSetup
from privaudit.protocols.blocks import (
    CLIENT_BLOCK,
    Accumulator,
    MVMFBlock,
    block_ranges,
    entries_block,
    mvmf_block_round,
)
from privaudit.transcript import CLIENT_PREFIX, DEFAULT_MAX_BYTES, Message, Transcript, is_client
from privaudit.transcript import load as load_transcript
from privaudit.transcript_io import TranscriptWriter, declared_size

__all__ = [
    "MANIFEST",
    "SUPPORTED",
    "attack_shards",
    "dask_client",
    "load",
    "load_validated",
    "parse_scheduler",
    "read_manifest",
    "run_sharded",
]

MANIFEST = "manifest.json"
FORMAT = "privaudit-sharded-run"
VERSION = 1
#: protocols a sharded run supports
SUPPORTED = ("fedmvmf", "fedrec")
_MANIFEST_MAX_BYTES = 64 * 1024**2
_MAX_BLOCKS = 1 << 20
_SHARD_NAME = re.compile(r"c(\d{6})-(private|r(\d{6}))\.ptx")
_LOCAL = re.compile(r"local(?::\d{1,12})?")
_ADDRESS = re.compile(
    r"(tcp|tls)://([A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]):(\d{1,5})"
)


# ------------------------------------------------------------------------- the cluster


def parse_scheduler(text: str) -> tuple[str, Any]:
    """``("local", N)`` for ``local[:N]`` (1 <= N <= MAX_LOCAL_WORKERS = 256; default 2) or ``("address", text)`` for
    ``tcp://HOST:PORT`` / ``tls://HOST:PORT``; anything else raises a one-line PrivauditError."""
    value = str(text).strip()
    workers = local_workers(value) if _LOCAL.fullmatch(value) else None
    if workers is not None:
        return "local", workers
    address = _ADDRESS.fullmatch(value)
    if address and 1 <= int(address.group(3)) <= 65535:
        return "address", value
    raise PrivauditError(f"--scheduler: expected local:N or tcp://HOST:PORT (port 1-65535), got {str(text)[:80]!r}")


@contextmanager
def dask_client(scheduler: str) -> Iterator[Any]:
    """A ``dask.distributed.Client``: a LocalCluster of N single-threaded worker processes
    (``local:N``) or a connection to a running scheduler (10 s timeout; one-line error)."""
    how, value = parse_scheduler(scheduler)
    try:
        from dask.distributed import Client
    except ImportError:  # pragma: no cover - dask is a declared extra
        raise MissingDependencyError("dask[distributed]", "dask") from None
    if how == "local":
        with local_cluster(value) as cluster:  # loopback only, scratch removed (privaudit._local_cluster)
            client = Client(cluster)
            try:
                client.wait_for_workers(value, timeout="60s")
            except TimeoutError:
                client.close()
                raise PrivauditError(f"--scheduler local:{value}: the workers did not start within 60 s") from None
            try:
                yield client
            finally:
                client.close()
        return
    try:
        client = Client(value, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise PrivauditError(f"--scheduler: cannot connect to Dask scheduler {value!r} ({exc})") from None
    try:
        yield client
    finally:
        client.close()


# ------------------------------------------------------------------------- the workers


def _shard_header(header: Mapping[str, Any], parties: list[str]) -> Transcript:
    return Transcript(header["protocol"], dict(header["config"]), header["seed"], dict(header["dataset"]), parties)


def _write_shard(
    path: Path, header: Mapping[str, Any], senders: list[str], uploads: list, round: int, metas: list | None = None
) -> None:
    """A shard straight through a :class:`TranscriptWriter`: per ``(kind, payloads)`` of
    ``uploads`` one message per sender (to the server; a ``private`` one to the sender itself),
    the file :meth:`Channel.send_round` into a :class:`Transcript` and its ``save`` write
    without defenses, without the transcript's per-message copies and indexes."""
    writer = TranscriptWriter(path)
    try:
        for kind, payloads in uploads:
            for u, (sender, payload) in enumerate(zip(senders, payloads, strict=True)):
                receiver = sender if kind == "private" else "server"
                writer.add(round, sender, receiver, kind, payload, metas[u] if metas else None)
    except BaseException:
        writer.abort()
        raise
    writer.close(_shard_header(header, ["server", *senders]))


def _block_name(index: int, round: int | None) -> str:
    return f"c{index:06d}-private.ptx" if round is None else f"c{index:06d}-r{round:06d}.ptx"


class MVMFShard:
    """A Dask actor holding consecutive FedMVMF client blocks (their data and u_u).

    ``spec``: ``blocks`` (list of ``(index, lo, ratings, weights, X, train_users)``), ``settings``
    (:class:`MVMFSettings`), ``seed``, ``init_scale``, ``out`` (the run's directory), ``header``
    (protocol, config, seed, dataset of the run) and ``private`` (write the private shards).
    """

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.st, self.out, self.header = spec["settings"], Path(spec["out"]), spec["header"]
        self.blocks: list[MVMFBlock] = []
        self.indices: list[int] = []
        for index, lo, R, W, X, train_users in spec["blocks"]:
            self.blocks.append(MVMFBlock.initial(index, lo, R, W, X, self.st.K, spec["seed"], spec["init_scale"]))
            self.indices.append(index)
            if spec["private"]:
                self._write_private(index, lo, R, X, train_users)

    def _senders(self, block: MVMFBlock) -> list[str]:
        return [f"client:{u}" for u in range(block.lo, block.lo + block.ratings.shape[0])]

    def _write_private(self, index: int, lo: int, R: Any, X: np.ndarray, train_users: np.ndarray) -> None:
        """The block's ``private`` messages (the single-process run's: items, ratings, attributes,
        meta ``dataset_user``); each field's payloads are back-to-back rows of one array."""
        senders = [f"client:{lo + u}" for u in range(R.shape[0])]
        ip, items, ratings, X = R.indptr, R.indices.astype(np.int64), R.data.copy(), np.ascontiguousarray(X)
        payloads = [
            {"items": items[ip[u] : ip[u + 1]], "ratings": ratings[ip[u] : ip[u + 1]], "attributes": X[u]}
            for u in range(len(senders))
        ]
        metas = [{"dataset_user": int(train_users[u])} for u in range(len(senders))]
        _write_shard(self.out / _block_name(index, None), self.header, senders, [("private", payloads)], 0, metas)

    def round(
        self, t: int, V: np.ndarray, P: np.ndarray, record: bool, with_loss: bool = True
    ) -> list[tuple[int, Any, Any, float]]:
        """One epoch of every block: ``(block index, sum_V, sum_P, loss part)`` per block; the
        recorded uploads are written to ``c<block>-r<t>.ptx``."""
        out = []
        for index, block in zip(self.indices, self.blocks):
            part = mvmf_block_round(block, V, P, self.st, record, with_loss)
            if record:
                senders = self._senders(block)
                uploads = [(b.kind, b.payloads()) for b in part.uploads.batches(t, senders)]
                _write_shard(self.out / _block_name(index, t), self.header, senders, uploads, t)
                part.uploads = None
            out.append((index, part.sum_V, part.sum_P, part.loss))
        return out

    def users(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate([b.U for b in self.blocks]), np.concatenate([b.U_init for b in self.blocks])

    def memory(self) -> int:
        return _peak_rss()


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (``ru_maxrss``)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class ShardedClients:
    """The server's side of a sharded FedMVMF run: the actors, one epoch at a time."""

    def __init__(self, actors: list[Any], n_blocks: int) -> None:
        self.actors, self.n_blocks = actors, n_blocks

    def round(
        self, t: int, V: np.ndarray, P: np.ndarray, record: bool, with_loss: bool = True
    ) -> tuple[np.ndarray, np.ndarray, float]:
        sum_V, sum_P, loss = _folded([a.round(t, V, P, record, with_loss) for a in self.actors], self.n_blocks)
        return sum_V, sum_P, loss

    def users(self) -> tuple[np.ndarray, np.ndarray]:
        got = [a.users().result() for a in self.actors]
        return np.concatenate([u for u, _ in got]), np.concatenate([u0 for _, u0 in got])


class PMFShard:
    """A Dask actor holding consecutive FedRec client blocks (pmf-batch): their entries, U rows
    and test entries. ``spec``: ``blocks`` (list of ``(index, lo, entries, U, test rows, test
    cols, test ratings)``), ``settings`` (lam, max_step, rating range, clip), ``out``, ``header``,
    ``private``."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.st, self.out, self.header = spec["settings"], Path(spec["out"]), spec["header"]
        self.blocks = list(spec["blocks"])
        for index, lo, E, *_ in self.blocks if spec["private"] else ():
            senders = [f"client:{lo + u}" for u in range(E.shape[0])]
            ip, items, ratings = E.indptr, E.cols.astype(np.int64), E.vals.copy()
            payloads = [
                {"items": items[ip[u] : ip[u + 1]], "ratings": ratings[ip[u] : ip[u + 1]]} for u in range(len(senders))
            ]
            _write_shard(self.out / _block_name(index, None), self.header, senders, [("private", payloads)], 0)

    def round(self, t: int, V: np.ndarray, lr: float, record: bool) -> list[tuple[int, Any, Any, float]]:
        """One batch iteration of every block: ``(index, total, counts, clipped)`` per block; the
        recorded uploads go to ``c<block>-r<t>.ptx``."""
        from privaudit.protocols.blocks import pmf_block_round

        out = []
        for j, (index, lo, E, U, *tests) in enumerate(self.blocks):
            part = pmf_block_round(U, E, V, self.st.lam, lr, self.st.max_step, record)
            self.blocks[j] = (index, lo, E, part.U, *tests)
            if record:
                senders = [f"client:{lo + u}" for u in range(E.shape[0])]
                _write_shard(self.out / _block_name(index, t), self.header, senders, [("grad_V", part.payloads)], t)
            out.append((index, part.total, part.counts, float(part.clipped)))
        return out

    def tests(self, V: np.ndarray) -> list[tuple[int, float, float, bool]]:
        """Per block: its test error sums (:func:`error_sums`) and whether its U is finite."""
        from privaudit.models import pmf
        from privaudit.protocols.blocks import error_sums

        st = self.st
        out = []
        for index, _lo, _E, U, rows, cols, vals in self.blocks:
            sq, ab = error_sums(pmf.predict(U, V, rows, cols), vals, st.rating_min, st.rating_max, st.clip)
            out.append((index, sq, ab, bool(np.isfinite(U).all())))
        return out

    def users(self) -> np.ndarray:
        return np.concatenate([b[3] for b in self.blocks])

    def memory(self) -> int:
        return _peak_rss()


def _fedrec_sharded(
    dataset: Any, config: Mapping[str, Any] | None, seed: int, client: Any, out: Path, private: bool, block_size: int
) -> tuple[RunResult, Any]:
    """FedRec pmf-batch over the workers: the single-process loop (:meth:`FedRec.simulate`) with
    the blocks' iteration (:func:`pmf_block_round`) and test errors on the workers."""
    import time

    from privaudit.models import pmf
    from privaudit.protocols import fedrec

    proto = fedrec.FedRec()
    cfg = proto.resolve_config(config)
    if cfg["model"] != "pmf-batch" or not cfg["federated"]:
        raise PrivauditError(
            "--scheduler runs fedrec's federated pmf-batch model only (the stochastic ones walk clients in turn)"
        )
    setup = RunSetup(cfg, dataset, [], int(seed))
    split_rng, init_rng, _, _ = setup.streams(4)
    st = fedrec.FedRecSettings.of(cfg, [])
    fold = fedrec._Fold.of(dataset, cfg, split_rng)
    transcript = proto.open_transcript(cfg, dataset, [], int(seed), ["server"], **fold.public(), **st.public())
    del dataset
    f = fedrec._Factors.initial(init_rng, fold.R_train.shape, st)
    entries = [pmf.Entries.from_csr(fold.R_train)]
    ranges = block_ranges(fold.R_train.shape[0], block_size)
    header = {k: getattr(transcript, k) for k in ("protocol", "config", "seed", "dataset")}
    settings = _PMFSettings(st.lam, st.max_step, fold.rmin, fold.rmax, st.clip)

    def block(b: int) -> tuple:
        lo, hi = ranges[b]
        return (b, lo, entries_block(entries[0], lo, hi), f.U[lo:hi].copy(), *fold.block_tests(lo, hi))

    actors = _start(
        client,
        PMFShard,
        len(ranges),
        block,
        {"settings": settings, "out": str(out.resolve()), "header": header, "private": private},
    )
    entries.clear()
    rmse, mae, seconds = [], [], 0.0
    clipped = 0
    for t in range(st.T):
        tic = time.perf_counter()
        record = t in st.recorded
        if record:
            transcript.add(t, "server", "server", "state", {"V": f.V.copy()})
        total = _folded([a.round(t, f.V, st.lr, record) for a in actors], len(ranges))
        grad, counts, k = total if total else (np.zeros_like(f.V), np.zeros(len(f.V)), 0.0)
        stepV, k2 = pmf.clip_rows(st.lr * pmf.item_average(grad, counts), st.max_step)
        f.V = f.V - stepV
        clipped += int(k) + k2
        st.lr *= st.decay
        seconds += time.perf_counter() - tic
        parts = sorted((p for a in actors for p in a.tests(f.V).result()), key=lambda p: p[0])
        f.U = f.U if all(p[3] for p in parts) else np.full_like(f.U, np.nan)
        f.check(t, st)
        r_, m_ = fedrec.rmse_mae([(p[1], p[2]) for p in parts], len(fold.test_vals))
        rmse.append(r_)
        mae.append(m_)
    f.U = np.concatenate([a.users().result() for a in actors])
    utility = {"rmse": rmse[-1], "mae": mae[-1], "iteration_seconds": seconds / st.T, "clipped_steps": clipped}
    model = {
        "U": f.U,
        "V": f.V,
        "W": None,
        "train": fold.R_train,
        "test": fold.test,
        "test_rmse": np.asarray(rmse),
        "test_mae": np.asarray(mae),
        "lam": st.lam,
    }
    transcript.parties = ["server", *fold.senders]
    return RunResult(transcript, model, utility), actors


@dataclass(frozen=True)
class _PMFSettings:
    lam: float
    max_step: float
    rating_min: float
    rating_max: float
    clip: bool


def _folded(futures: list[Any], n_blocks: int) -> list:
    """The blocks' partials from the actors' futures, added in block order."""
    parts = sorted((p for f in futures for p in f.result()), key=lambda p: p[0])
    if [p[0] for p in parts] != list(range(n_blocks)):
        raise RuntimeError("a sharded round did not return every block once")
    total = Accumulator()
    for _, *values in parts:
        total.add(*values)
    return total.values


def _workers(client: Any) -> list[str]:
    """The addresses of the cluster's workers, asked of the scheduler now.

    ``client.scheduler_info()`` is not used: the client's periodic refresh may replace its cache
    with one that lists no workers between the fetch and the read (seen in CI)."""
    return sorted(client.nthreads())


def _start(client: Any, cls: type, n_blocks: int, block: Any, common: Mapping[str, Any]) -> list[Any]:
    """One actor of ``cls`` per worker, holding consecutive blocks (``block(b)`` builds block b's data)."""
    workers = _workers(client)
    if not workers:
        raise PrivauditError("--scheduler: the Dask cluster has no workers")
    actors = []
    for address, chunk in zip(workers, _assign(n_blocks, len(workers))):
        spec = {"blocks": [block(b) for b in chunk], **common}
        [data] = client.scatter([spec], workers=[address], direct=True)
        actors.append(client.submit(cls, data, actor=True, workers=[address]).result())
        del spec, data
    return actors


def _assign(n_blocks: int, n_workers: int) -> list[list[int]]:
    """Consecutive blocks per worker, as even as possible (no empty worker unless blocks run out)."""
    bounds = np.linspace(0, n_blocks, min(n_workers, n_blocks) + 1).round().astype(int)
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass
class ShardedRun:
    """What :func:`run_sharded` returns: the run's result (its transcript holds the servers'
    messages only), the output directory and the peak memory of each worker (bytes)."""

    result: RunResult
    out: Path
    worker_peak: list[int]


def run_sharded(
    protocol: str,
    dataset: Any,
    config: Mapping[str, Any] | None,
    seed: int,
    client: Any,
    out: str | Path,
    include_private: bool = True,
    block_size: int | None = None,
) -> ShardedRun:
    """Run ``protocol`` on ``dataset`` with its client blocks on ``client``'s workers; the shards
    go to the existing empty directory ``out`` (on a filesystem every worker can write)."""
    if protocol not in SUPPORTED:
        raise PrivauditError(f"--scheduler runs {', '.join(SUPPORTED)} sharded, not {protocol!r}")
    out = Path(out)
    block_size = CLIENT_BLOCK if block_size is None else int(block_size)
    if protocol == "fedmvmf":
        result, actors = _fedmvmf_sharded(dataset, config, seed, client, out, include_private, block_size)
    else:
        result, actors = _fedrec_sharded(dataset, config, seed, client, out, include_private, block_size)
    del dataset
    server = result.transcript
    # the servers' file names the servers only (a file's JSON is bounded by its members; the
    # manifest's ``clients`` gives the client parties back to :func:`load`)
    own = [p for p in server.parties if not is_client(p)]
    Transcript(server.protocol, server.config, server.seed, server.dataset, own, server.messages).save(
        out / "server.ptx"
    )
    n = len(server.parties) - len(own)
    rounds = sorted({m.round for m in server.messages})
    _write_manifest(out, protocol, block_ranges(n, block_size), rounds, include_private, block_size)
    return ShardedRun(result, out, [a.memory().result() for a in actors])


def _fedmvmf_sharded(
    dataset: Any, config: Mapping[str, Any] | None, seed: int, client: Any, out: Path, private: bool, block_size: int
) -> tuple[RunResult, Any]:
    """FedMVMF over the workers: :meth:`FedMVMF.train` with :class:`ShardedClients`."""
    from privaudit.protocols.fedmvmf import FedMVMF

    proto = FedMVMF()
    cfg = proto.resolve_config(config)
    run = proto.open_run(RunSetup(cfg, dataset, [], int(seed)), private=False)
    del dataset  # the split holds what the server needs; a caller that lets go of it saves its memory
    header = {k: getattr(run.transcript, k) for k in ("protocol", "config", "seed", "dataset")}
    ranges = block_ranges(run.ratings.shape[0], block_size)
    X, users = run.views.X_train, run.split["train_users"]

    def block(b: int) -> tuple:
        part = slice(*ranges[b])
        return (b, ranges[b][0], run.ratings[part], run.weights[part], X[part], users[part])

    common = {"settings": run.st, "seed": int(seed), "init_scale": float(cfg["init_scale"])}
    common.update(out=str(out.resolve()), header=header, private=private)
    actors = _start(client, MVMFShard, len(ranges), block, common)
    run.ratings = run.weights = None  # the workers hold the clients' data now
    return proto.train(run, ShardedClients(actors, len(ranges))), actors


# ------------------------------------------------------------------------- the directory


def _write_manifest(out: Path, protocol: str, ranges, rounds: list[int], private: bool, block_size: int) -> None:
    blocks = [
        {
            "lo": lo,
            "hi": hi,
            "private": _block_name(b, None) if private else None,
            "rounds": [_block_name(b, r) for r in rounds],
        }
        for b, (lo, hi) in enumerate(ranges)
    ]
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "protocol": protocol,
        "clients": ranges[-1][1] if ranges else 0,
        "block_size": block_size,
        "server": "server.ptx",
        "rounds": rounds,
        "blocks": blocks,
    }
    tmp = out / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out / MANIFEST)


def _short(value: Any) -> str:
    return printable(repr(value)[:60])


def _fail(path: Path, text: str) -> TranscriptError:
    return TranscriptError(f"{path}: {text}")


def _int(value: Any, lo: int, hi: int, what: str, path: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(path, f"{what} must be an integer in {lo}..{hi}, got {_short(value)}")
    return value


def _member(folder: Path, name: Any, pattern: re.Pattern, path: Path) -> Path:
    """``folder/name`` for a plain file name matching ``pattern`` that is a regular file inside
    ``folder`` (no separators, no links)."""
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise _fail(path, f"shard file name {_short(name)} is not of the form the manifest allows")
    target = folder / name
    if target.is_symlink() or not target.is_file():
        raise _fail(path, f"shard {name} is missing or not a regular file")
    if target.resolve().parent != folder.resolve():
        raise _fail(path, f"shard {name} is outside the run's directory")
    return target


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The checked manifest of a sharded run's directory: format, version, contiguous blocks
    covering the clients, file names confined to the directory and present. Raises a one-line
    :class:`TranscriptError` otherwise."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir() or path.is_symlink() or not path.is_file():
        raise _fail(folder, f"not a sharded run (no {MANIFEST})")
    try:
        doc = _safejson.load_file(path, max_bytes=_MANIFEST_MAX_BYTES, max_depth=8)
    except (ValueError, OSError) as exc:
        raise _fail(path, f"unreadable manifest ({str(exc)[:120]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _fail(path, f"not a {FORMAT} manifest")
    if doc.get("version") != VERSION:
        raise _fail(
            path, f"manifest version {_short(doc.get('version'))} is not supported (this privaudit reads {VERSION})"
        )
    if doc.get("protocol") not in SUPPORTED:
        raise _fail(path, f"protocol {_short(doc.get('protocol'))} is not one a sharded run supports")
    clients = _int(doc.get("clients"), 0, 10**9, "clients", path)
    size = _int(doc.get("block_size"), 1, 10**9, "block_size", path)
    rounds = doc.get("rounds")
    if not isinstance(rounds, list) or len(rounds) > 1_000_000:
        raise _fail(path, "rounds must be a list")
    rounds = [_int(r, 0, 10**9, "a round", path) for r in rounds]
    if rounds != sorted(set(rounds)):
        raise _fail(path, "rounds must be strictly increasing")
    blocks = doc.get("blocks")
    if not isinstance(blocks, list) or len(blocks) > _MAX_BLOCKS or len(blocks) != -(-clients // size):
        raise _fail(path, f"blocks must list ceil(clients / block_size) = {-(-clients // size)} blocks")
    checked, lo = [], 0
    for b, block in enumerate(blocks):
        if not isinstance(block, dict) or set(block) != {"lo", "hi", "private", "rounds"}:
            raise _fail(path, f"block {b} must have exactly lo, hi, private and rounds")
        hi = min(lo + size, clients)
        if (
            _int(block["lo"], 0, clients, f"block {b} lo", path) != lo
            or _int(block["hi"], 0, clients, f"block {b} hi", path) != hi
        ):
            raise _fail(path, f"block {b} must hold clients {lo}..{hi - 1} (lo {lo}, hi {hi})")
        names = block["rounds"]
        if not isinstance(names, list) or names != [_block_name(b, r) for r in rounds]:
            raise _fail(path, f"block {b} must list its shard of every round, named c{b:06d}-rNNNNNN.ptx")
        private = block["private"]
        if private is not None and private != _block_name(b, None):
            raise _fail(path, f"block {b}: its private shard must be named {_block_name(b, None)}")
        files = [_member(folder, n, _SHARD_NAME, path) for n in names]
        checked.append(
            {
                "lo": lo,
                "hi": block["hi"],
                "private": private and _member(folder, private, _SHARD_NAME, path),
                "rounds": files,
            }
        )
        lo = hi
    server = _member(folder, doc.get("server"), re.compile(r"server\.ptx"), path)
    return {"protocol": doc["protocol"], "clients": clients, "rounds": rounds, "blocks": checked, "server": server}


def _check_shard(
    shard: Transcript, server: Transcript, lo: int, hi: int, kinds: set[str], round: int | None, path: Path
) -> None:
    if (shard.protocol, shard.config, shard.seed) != (server.protocol, server.config, server.seed):
        raise _fail(path, "the shard belongs to another run (protocol, config or seed differ from server.ptx)")
    for m in shard.messages:
        sender = m.sender
        index = sender[len(CLIENT_PREFIX) :]
        if not is_client(sender) or not index.isdigit() or len(index) > 10 or not lo <= int(index) < hi:
            raise _fail(path, f"message {m.seq}: sender {sender[:40]!r} is not a client of this block ({lo}..{hi - 1})")
        if m.kind not in kinds or (round is not None and m.round != round):
            raise _fail(path, f"message {m.seq}: {m.kind[:40]!r} of round {m.round} does not belong in this shard")


#: Bytes a client party costs in a loaded run (its name and index entries), and the fewest bytes
#: of shard data a client can have (one row of a message table: five int64).
_PARTY_BYTES = 128
_MIN_CLIENT_BYTES = 40


def _check_budget(manifest: Mapping[str, Any], chosen: list[dict], max_bytes: int) -> None:
    """One budget for the whole folder, from the shards' central directories before anything is
    loaded: the declared sizes of the server's and the chosen blocks' shards plus the party list
    must fit ``max_bytes``, and no block may name more clients than its shards can hold."""
    server = manifest["server"]
    total = declared_size(server, max_bytes)
    for block in chosen:
        files = [block["private"], *block["rounds"]] if block["private"] else list(block["rounds"])
        own = sum(declared_size(f, max_bytes) for f in files)
        clients = block["hi"] - block["lo"]
        if clients * _MIN_CLIENT_BYTES > own:
            raise _fail(
                files[0] if files else server,
                f"block {block['lo']}..{block['hi'] - 1} names {clients} clients but its shards declare {own} bytes "
                f"(at least {_MIN_CLIENT_BYTES} per client)",
            )
        total += own
        if total > max_bytes:
            break
    total += manifest["clients"] * _PARTY_BYTES
    if total > max_bytes:
        raise _fail(
            server.parent,
            f"the run's shards and {manifest['clients']} client parties would take more than {max_bytes} bytes "
            f"(at least {total}; raise it with --max-bytes)",
        )


def load(folder: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, blocks: Sequence[int] | None = None) -> Transcript:
    """The transcript of a sharded run's directory, in the single-process run's message order:
    the private messages, then per round the server's ``state``, every block's uploads (one kind
    after the other) and the remaining servers' messages. ``max_bytes`` bounds the whole folder
    (the declared sizes of the shards read and the client parties, checked before any is loaded);
    ``blocks``: only these blocks' clients (their messages; the header is the whole run's)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    chosen = manifest["blocks"] if blocks is None else [manifest["blocks"][b] for b in blocks]
    _check_budget(manifest, chosen, max_bytes)
    server = load_transcript(manifest["server"], max_bytes=max_bytes)
    if any(is_client(p) for p in server.parties):
        raise _fail(manifest["server"], "server.ptx must not list client parties (the manifest counts them)")
    parties = [*server.parties, *(f"{CLIENT_PREFIX}{u}" for u in range(manifest["clients"]))]
    merged = Transcript(server.protocol, dict(server.config), server.seed, dict(server.dataset), parties)
    out = merged.messages

    def add(messages: Any) -> None:  # renumbered in merged order (the loaded messages are not shared)
        for m in messages:
            out.append(Message(len(out), m.round, m.sender, m.receiver, m.kind, m.payload, m.meta))

    for block in chosen:
        if block["private"]:
            shard = load_transcript(block["private"], max_bytes=max_bytes)
            _check_shard(shard, server, block["lo"], block["hi"], {"private"}, 0, block["private"])
            add(shard.messages)
    by_round: dict[int, list] = {}
    for m in server.messages:
        by_round.setdefault(m.round, []).append(m)
    for j, r in enumerate(manifest["rounds"]):
        own = by_round.pop(r, [])
        add(m for m in own if m.sender == "server")
        shards = []
        for block in chosen:
            shard = load_transcript(block["rounds"][j], max_bytes=max_bytes)
            _check_shard(shard, server, block["lo"], block["hi"], _UPLOADS[manifest["protocol"]], r, block["rounds"][j])
            shards.append(shard)
        for kind in _UPLOADS_ORDER[manifest["protocol"]]:
            for shard in shards:
                add(m for m in shard.messages if m.kind == kind)
        del shards
        add(m for m in own if m.sender != "server")
    if by_round:
        raise _fail(manifest["server"], f"messages of rounds {sorted(by_round)[:5]} that the manifest does not list")
    return merged


def load_validated(folder: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Transcript:
    """:func:`load` then :func:`privaudit.schema.validate` (what ``privaudit attack --transcript
    DIR`` reads a sharded run's folder through)."""
    from privaudit.schema import validate

    merged = load(folder, max_bytes=max_bytes)
    validate(merged)
    return merged


# ------------------------------------------------------------------------- attacks per shard


def _attack_blocks(folder: str, blocks: list[int], attack: str, max_bytes: int) -> dict[str, Any]:
    """On a worker: the attack on each block's transcript (:func:`load` of that block), scored per
    victim (:func:`privaudit.attacks._mvmf.victim_scores`); the sums and the truth histograms."""
    from privaudit import registry
    from privaudit.attacks._mvmf import victim_scores

    out: dict[str, Any] = {"victims": 0, "hits": {}, "weight": {}, "ratings": {}, "attributes": {}}
    for b in blocks:
        transcript = load(folder, max_bytes, blocks=[b])
        att = registry.get("attack", attack)()
        rng = np.random.default_rng(0)
        recon = att.run(transcript.view(att.party), att.prior_knowledge(transcript, rng), rng)
        if not recon.supported:
            raise PrivauditError(f"attack {attack!r} does not apply to this run: {recon.reason}")
        victims, weight, hits = victim_scores(recon, transcript)
        out["victims"] += len(victims)
        for metric in weight:
            out["hits"][metric] = out["hits"].get(metric, 0.0) + float(hits[metric].sum())
            out["weight"][metric] = out["weight"].get(metric, 0.0) + float(weight[metric].sum())
        histograms(transcript, out)
    return out


def attack_shards(
    folder: str | Path, client: Any, attack: str = "mvmf-analytic", max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, Any]:
    """A per-victim FedMVMF attack on a sharded run, block by block on ``client``'s workers (each
    worker reads its blocks' shards): the metrics of :func:`privaudit.attacks._mvmf.score_reconstruction`
    (hits and weights summed over the blocks), and the uniform and majority-value baselines of
    :func:`privaudit.attacks._mvmf.baselines` from the merged histograms of true values.

    Equal to the attack on the merged transcript when each victim's reconstruction depends on its
    own messages only (without noise); under noise the attack's population prior is the block's.
    """
    from privaudit import registry
    from privaudit.attacks._mvmf import MVMFAttack, rating_domain
    from privaudit.metrics import uniform_guess_accuracy

    if not issubclass(registry.get("attack", attack), MVMFAttack):
        raise PrivauditError(f"attack {attack!r}: a sharded run is attacked per shard by the FedMVMF attacks only")
    folder = Path(folder).resolve()
    manifest = read_manifest(folder)
    workers = _workers(client)
    futures = [
        client.submit(_attack_blocks, str(folder), chunk, attack, max_bytes, workers=[w], pure=False)
        for w, chunk in zip(workers, _assign(len(manifest["blocks"]), len(workers)))
    ]
    parts = client.gather(futures)
    hits = {m: sum(p["hits"].get(m, 0.0) for p in parts) for m in parts[0]["hits"]}
    weight = {m: sum(p["weight"].get(m, 0.0) for p in parts) for m in parts[0]["weight"]}
    metrics = {m: hits[m] / weight[m] if weight[m] > 0 else float("nan") for m in hits}
    metrics["victims"] = float(sum(p["victims"] for p in parts))
    config = load_transcript(manifest["server"], max_bytes=max_bytes).config
    lo, hi = rating_domain(config)
    step = float(config.get("rating_step", 1.0) or 1.0)
    baseline = {
        "rating_accuracy": uniform_guess_accuracy(int(round((hi - lo) / step)) + 1),
        "attribute_accuracy": uniform_guess_accuracy(2),
        "rating_accuracy_majority": majority(parts, "ratings"),
        "attribute_accuracy_majority": majority(parts, "attributes"),
    }
    return {"attack": attack, "metrics": metrics, "baseline": baseline, "blocks": len(manifest["blocks"])}


_UPLOADS_ORDER: dict[str, Sequence[str]] = {"fedmvmf": ("grad_V", "grad_P"), "fedrec": ("grad_V",)}
_UPLOADS = {k: set(v) for k, v in _UPLOADS_ORDER.items()}


# ------------------------------------------------------------------------- command line


def _prepare_output(folder: Path, force: bool) -> None:
    """``-o DIR`` of a sharded run: a new or empty folder; with ``force`` an earlier sharded run's
    files in it are removed (nothing else is touched)."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise PrivauditError(f"{folder}: exists and is not a folder (a sharded run writes a folder of shards)")
    if folder.is_dir():
        entries = list(folder.iterdir())
        ours = [p for p in entries if p.name in (MANIFEST, "server.ptx") or _SHARD_NAME.fullmatch(p.name)]
        if entries and not force:
            raise PrivauditError(
                f"{folder}/ is not empty; pass --force to replace a sharded run there or choose another -o DIR"
            )
        if len(ours) != len(entries):
            raise PrivauditError(f"{folder}/ holds files that are not a sharded run's; choose another -o DIR")
        for p in ours:
            if p.is_file() and not p.is_symlink():
                p.unlink()
    folder.mkdir(parents=True, exist_ok=True)


def cmd_run(args: Any, dataset_of: Any) -> int:
    """``privaudit run --scheduler ...``: checks the address, the protocol, the defenses and the
    output folder, connects, then builds the dataset (``dataset_of(args)``: ``--data`` and
    ``--rating-scale`` as the command line reads them) and runs sharded."""
    from privaudit.experiment import _run_plan_of, build_experiment, load_data, subsample_users
    from privaudit.plan import parse_assignments

    parse_scheduler(args.scheduler)
    if args.protocol not in SUPPORTED:
        raise PrivauditError(f"--scheduler runs {', '.join(SUPPORTED)} sharded, not {args.protocol!r}")
    if args.defense:
        raise PrivauditError(
            "--scheduler runs a protocol without defenses (a defense's noise is drawn over a whole round)"
        )
    exp = build_experiment(
        protocol=args.protocol,
        protocol_config=parse_assignments(args.set),
        data=args.data,
        users=args.users,
        seeds=1,
        seed=args.seed,
        jobs=1,
    )
    plan = _run_plan_of(exp)
    out = Path(args.output)
    _prepare_output(out, args.force)
    with dask_client(args.scheduler) as client:
        dataset = subsample_users(load_data(dataset_of(args)), args.users, args.seed)
        done = run_sharded(args.protocol, dataset, plan.config, args.seed, client, out, not args.no_private)
    n_files = sum(1 for _ in out.iterdir())
    print(f"sharded run written to {out}/ ({n_files} files; workers' peak memory {_mib(done.worker_peak)} MiB)")
    for k, v in done.result.utility.items():
        print(f"  {k:<20} {v:.4f}" if isinstance(v, float) else f"  {k:<20} {v}")
    return 0


def _mib(values: Sequence[int]) -> str:
    return ", ".join(f"{v / 1024**2:.0f}" for v in values)

"""One protocol run over a Dask cluster: the clients' blocks on the workers, shards on disk.

A sharded run (``privaudit run --scheduler local:N|tcp://HOST:PORT -o DIR``) drives any protocol
that declares its client round in blocks (``Protocol.block_round``, a
:class:`~privaudit.protocols.base.BlockRound`; ``privaudit run --scheduler`` refuses the others
in one line): the protocol opens the run and cuts its clients into blocks of consecutive
clients; each Dask worker holds consecutive whole blocks in a Dask actor. Every round the
server's loop (the protocol's) sends its state to the actors; each runs the protocol's round on
its blocks, writes their recorded uploads as one transcript shard per (block, round) and returns
the blocks' partials, which the server adds in block order. Per-client random draws come from
the seed and the block index, so the run equals the same protocol's run with every block in one
process (:meth:`Protocol.simulate_blocks`; FedMVMF's and FedRec's single-process runs) at the
same seed: arrays, utility, attack metrics.

Output directory: ``manifest.json``, ``server.ptx`` (the run's header and the servers'
messages), ``c<block>-private.ptx`` (the block's private messages) and ``c<block>-r<round>.ptx``
(its uploads of one recorded round). :func:`load` checks the manifest and every shard and
returns the transcript in the single-process message order.

Runs go without defenses (a defense draws its noise in client order over a whole round, which
a partition would change). Built-in protocols in blocks: FedMVMF (every setting) and FedRec's
federated ``pmf-batch`` model (:func:`shardable` lists the registered ones).
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

from privaudit._escape import printable
from privaudit._local_cluster import local_cluster, local_workers
from privaudit._safejson import load_file
from privaudit.errors import MissingDependencyError, PrivauditError, TranscriptError
from privaudit.protocols.base import BlockClients, Protocol, RunResult, RunSetup
from privaudit.protocols.blocks import CLIENT_BLOCK, Accumulator, block_ranges
from privaudit.transcript import CLIENT_PREFIX, DEFAULT_MAX_BYTES, Message, Transcript, is_client
from privaudit.transcript import load as load_transcript
from privaudit.transcript_io import TranscriptWriter, declared_size

__all__ = [
    "MANIFEST",
    "attack_shards",
    "block_protocol",
    "dask_client",
    "load",
    "load_validated",
    "parse_scheduler",
    "read_manifest",
    "run_sharded",
    "shardable",
]

MANIFEST = "manifest.json"
FORMAT = "privaudit-sharded-run"
VERSION = 1
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


class BlockShard:
    """A Dask actor holding consecutive client blocks of a run in blocks.

    ``spec``: ``rounds`` (the protocol's :class:`~privaudit.protocols.base.BlockRound` with the
    run's settings), ``blocks`` (list of ``(index, lo, hi, block state)``), ``out`` (the run's
    directory), ``header`` (protocol, config, seed, dataset of the run) and ``private`` (write
    the blocks' private shards, from :meth:`BlockRound.private`).
    """

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.rounds, self.out, self.header = spec["rounds"], Path(spec["out"]), spec["header"]
        self.blocks: list[tuple[int, int, int, Any]] = list(spec["blocks"])
        for index, lo, hi, block in self.blocks if spec["private"] else ():
            messages = self.rounds.private(block)
            payloads, metas = [p for p, _ in messages], [m for _, m in messages]
            path = self.out / _block_name(index, None)
            _write_shard(path, self.header, _senders(lo, hi), [("private", payloads)], 0, metas)

    def round(self, t: int, record: bool, state: tuple) -> list[tuple]:
        """Round ``t`` of every block: ``(block index, *partials)`` per block; a recorded round's
        uploads are written to ``c<block>-r<t>.ptx``."""
        out = []
        for index, lo, hi, block in self.blocks:
            part = self.rounds.round(block, t, record, *state)
            if record:
                _write_shard(self.out / _block_name(index, t), self.header, _senders(lo, hi), part.uploads or [], t)
                part.uploads = None
            out.append((index, *part.partials))
        return out

    def each(self, method: str, args: tuple) -> list[tuple[int, Any]]:
        """``(block index, rounds.<method>(block, *args))`` per block."""
        return [(index, getattr(self.rounds, method)(block, *args)) for index, _lo, _hi, block in self.blocks]

    def memory(self) -> int:
        return _peak_rss()


def _senders(lo: int, hi: int) -> list[str]:
    return [f"{CLIENT_PREFIX}{u}" for u in range(lo, hi)]


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (``ru_maxrss``)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class ShardedClients(BlockClients):
    """The server's side of a sharded run: the actors, one round at a time."""

    def __init__(self, actors: list[Any], n_blocks: int) -> None:
        self.actors, self.n_blocks = actors, n_blocks
        self.recorded: set[int] = set()  # the rounds whose uploads the blocks' shards hold

    def round(self, t: int, record: bool, *state: Any) -> list:
        if record:
            self.recorded.add(int(t))
        parts = _in_block_order([a.round(t, record, state) for a in self.actors], self.n_blocks)
        total = Accumulator()
        for _, *values in parts:
            total.add(*values)
        return total.values

    def each(self, method: str, *args: Any) -> list:
        return [value for _, value in _in_block_order([a.each(method, args) for a in self.actors], self.n_blocks)]


def _in_block_order(futures: list[Any], n_blocks: int) -> list:
    """The blocks' ``(index, ...)`` results from the actors' futures, in block order."""
    parts = sorted((p for f in futures for p in f.result()), key=lambda p: p[0])
    if [p[0] for p in parts] != list(range(n_blocks)):
        raise RuntimeError("a sharded round did not return every block once")
    return parts


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


def block_protocol(protocol: str) -> type[Protocol]:
    """The registered protocol ``protocol`` if it declares a ``block_round`` (its clients run in
    blocks); otherwise a one-line :class:`PrivauditError` naming those that do."""
    from privaudit import registry

    cls = registry.get("protocol", protocol)
    if cls.block_round is None:
        raise PrivauditError(
            f"--scheduler: protocol {protocol!r} does not run in client blocks (it declares no block_round), "
            f"so it cannot be sharded; protocols that can: {', '.join(shardable()) or 'none'}"
        )
    return cls


def shardable() -> list[str]:
    """The registered protocols whose clients run in blocks (a ``block_round`` declared)."""
    from privaudit import registry

    return sorted(name for name, cls in registry.available("protocol").items() if cls.block_round is not None)


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
    """Run ``protocol`` (one that declares a ``block_round``) on ``dataset`` with its client
    blocks on ``client``'s workers, without defenses; the shards go to the existing empty
    directory ``out`` (on a filesystem every worker can write)."""
    cls = block_protocol(protocol)
    out = Path(out)
    block_size = CLIENT_BLOCK if block_size is None else int(block_size)
    proto = cls()
    cfg = proto.resolve_config(config)
    cls.block_round.check(cfg)
    run = cls.block_round.open(proto, RunSetup(cfg, dataset, [], int(seed)))
    del dataset  # the run holds what the server needs; a caller that lets go of it saves its memory
    header = {k: getattr(run.transcript, k) for k in ("protocol", "config", "seed", "dataset")}
    ranges = block_ranges(run.n_clients, block_size)

    def block(b: int) -> tuple:
        lo, hi = ranges[b]
        return (b, lo, hi, run.block(b, lo, hi))

    common = {"rounds": run.rounds, "out": str(out.resolve()), "header": header, "private": include_private}
    actors = _start(client, BlockShard, len(ranges), block, common)
    clients = ShardedClients(actors, len(ranges))
    result = run.train(clients)
    server = result.transcript
    # the servers' file names the servers only (a file's JSON is bounded by its members; the
    # manifest's ``clients`` gives the client parties back to :func:`load`)
    own = [p for p in server.parties if not is_client(p)]
    Transcript(server.protocol, server.config, server.seed, server.dataset, own, server.messages).save(
        out / "server.ptx"
    )
    rounds = sorted({m.round for m in server.messages} | clients.recorded)
    for r in sorted(set(rounds) - clients.recorded):  # servers' messages only: every block's shard is empty
        for b, (lo, hi) in enumerate(ranges):
            _write_shard(out / _block_name(b, r), header, _senders(lo, hi), [], r)
    _write_manifest(out, cls.name, ranges, rounds, include_private, block_size)
    return ShardedRun(result, out, [a.memory().result() for a in actors])


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
        doc = load_file(path, max_bytes=_MANIFEST_MAX_BYTES, max_depth=8)
    except (ValueError, OSError) as exc:
        raise _fail(path, f"unreadable manifest ({str(exc)[:120]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _fail(path, f"not a {FORMAT} manifest")
    if doc.get("version") != VERSION:
        raise _fail(
            path, f"manifest version {_short(doc.get('version'))} is not supported (this privaudit reads {VERSION})"
        )
    kinds = _upload_kinds(doc.get("protocol"))
    if kinds is None:
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
    return {
        "protocol": doc["protocol"],
        "upload_kinds": kinds,
        "clients": clients,
        "rounds": rounds,
        "blocks": checked,
        "server": server,
    }


def _upload_kinds(protocol: Any) -> tuple[str, ...] | None:
    """The upload kinds a registered protocol's block declares, in transcript order (None when
    ``protocol`` is no registered protocol that runs in client blocks)."""
    from privaudit import registry

    cls = registry.available("protocol").get(protocol) if isinstance(protocol, str) else None
    return None if cls is None or cls.block_round is None else tuple(cls.block_round.upload_kinds)


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
            kinds = set(manifest["upload_kinds"])
            _check_shard(shard, server, block["lo"], block["hi"], kinds, r, block["rounds"][j])
            shards.append(shard)
        for kind in manifest["upload_kinds"]:
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


def _attack_blocks(folder: str, blocks: list[int], attack: str, max_bytes: int) -> list[dict[str, Any]]:
    """On a worker: the attack on each block's transcript (:func:`load` of that block) and what
    its scores contribute (:meth:`Attack.shard_part`), one part per block."""
    from privaudit import registry

    parts = []
    for b in blocks:
        transcript = load(folder, max_bytes, blocks=[b])
        att = registry.get("attack", attack)()
        rng = np.random.default_rng(0)
        recon = att.run(transcript.view(att.party), att.prior_knowledge(transcript, rng), rng)
        if not recon.supported:
            raise PrivauditError(f"attack {attack!r} does not apply to this run: {recon.reason}")
        parts.append(att.shard_part(recon, transcript))
    return parts


def attack_shards(
    folder: str | Path, client: Any, attack: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, Any]:
    """An attack on a sharded run, block by block on ``client``'s workers (each worker reads its
    blocks' shards), for an attack that declares per-shard scoring (:meth:`Attack.shard_part`,
    :meth:`Attack.merge_shards`; the FedMVMF attacks do). ``attack``: default the run's
    protocol's ``default_attack``. Returns ``attack``, ``metrics`` and ``baseline`` (what
    ``merge_shards`` makes of the blocks' parts) and ``blocks``.

    Equal to the attack on the merged transcript when each victim's reconstruction depends on its
    own messages only (without noise); under noise the attack's population prior is the block's.
    """
    from privaudit import registry
    from privaudit.attacks.base import Attack

    folder = Path(folder).resolve()
    manifest = read_manifest(folder)
    attack = attack or registry.get("protocol", manifest["protocol"]).default_attack
    cls = registry.get("attack", attack)
    if cls.shard_part is Attack.shard_part:
        raise PrivauditError(f"attack {attack!r} is not scored per shard (it declares no shard_part)")
    workers = _workers(client)
    futures = [
        client.submit(_attack_blocks, str(folder), chunk, attack, max_bytes, workers=[w], pure=False)
        for w, chunk in zip(workers, _assign(len(manifest["blocks"]), len(workers)))
    ]
    parts = [part for chunk in client.gather(futures) for part in chunk]
    merged = cls.merge_shards(parts, load_transcript(manifest["server"], max_bytes=max_bytes).config)
    return {"attack": attack, **merged, "blocks": len(manifest["blocks"])}


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
    from privaudit.experiment import build_experiment, load_data, subsample_users
    from privaudit.plan import parse_assignments
    from privaudit.runner import check_run_settings

    parse_scheduler(args.scheduler)
    protocol_cls = block_protocol(args.protocol)
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
    check_run_settings(1, exp.seed, 1)
    config = protocol_cls.resolve_config(exp.protocol_config)
    protocol_cls.block_round.check(config)
    out = Path(args.output)
    _prepare_output(out, args.force)
    with dask_client(args.scheduler) as client:
        dataset = subsample_users(load_data(dataset_of(args)), args.users, args.seed)
        done = run_sharded(args.protocol, dataset, config, args.seed, client, out, not args.no_private)
    n_files = sum(1 for _ in out.iterdir())
    print(f"sharded run written to {out}/ ({n_files} files; workers' peak memory {_mib(done.worker_peak)} MiB)")
    for k, v in done.result.utility.items():
        print(f"  {k:<20} {v:.4f}" if isinstance(v, float) else f"  {k:<20} {v}")
    return 0


def _mib(values: Sequence[int]) -> str:
    return ", ".join(f"{v / 1024**2:.0f}" for v in values)

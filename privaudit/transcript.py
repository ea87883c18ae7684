"""Transcripts: every message of a federated run, and each party's view of it.

A :class:`Transcript` is the ordered list of :class:`Message` objects a protocol emitted, plus
the public configuration every party knows. A party's own knowledge is a message to itself
(kind ``state`` for a server's model, kind ``private`` for a client's raw data).
:meth:`Transcript.view` returns a :class:`View` holding only the messages that party received;
attacks get a view, never the transcript.

Files (suffix ``.ptx``) are written and read by :mod:`privaudit.transcript_io`: format version 2
stores the payloads of each (kind, round, field) as one column with an offsets array, version 1
(still read) one member per array; loading treats the file as hostile and refuses anything
malformed with a one-line :class:`~privaudit.errors.TranscriptError` (docs/transcript-format.md).
Whether the content fits the protocol is checked separately, by :func:`privaudit.schema.validate`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privaudit._escape import printable
from privaudit.errors import TranscriptError

FORMAT_NAME = "privaudit-transcript"
FORMAT_VERSION = 2  # written by save(); versions 1 and 2 are read
DEFAULT_MAX_BYTES = 512 * 1024**2  # byte budget of a loaded archive (uncompressed): 512 MiB; --max-bytes

__all__ = [
    "CLIENT_PREFIX",
    "is_client",
    "load_validated",
    "Message",
    "Transcript",
    "View",
    "load",
    "save",
    "FORMAT_VERSION",
    "DEFAULT_MAX_BYTES",
]


#: Party ids of clients (users, groups or silos) are this prefix and an index: ``client:<k>``.
CLIENT_PREFIX = "client:"


def is_client(party: str) -> bool:
    """Whether ``party`` names a client (``client:<k>``): the one place that reads party ids."""
    return party.startswith(CLIENT_PREFIX)


@dataclass
class Message:
    """One message of a run.

    Attributes
    ----------
    seq : int
        Position in the transcript (0-based, strictly increasing).
    round : int
        Protocol round (epoch) the message belongs to.
    sender, receiver : str
        Party ids (``server``, ``item-server``, ``client:<k>``, ``decryptor:<k>``).
    kind : str
        What the message carries (``grad_V``, ``state``, ``private``, ...).
    payload : dict[str, numpy.ndarray]
        Named arrays. Never object arrays.
    meta : dict
        Small JSON-able metadata.
    """

    seq: int
    round: int
    sender: str
    receiver: str
    kind: str
    payload: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Total size of the payload arrays in bytes."""
        return int(sum(a.nbytes for a in self.payload.values()))


def _groups(keys: np.ndarray, positions: np.ndarray) -> list[tuple[int, list[int]]]:
    """``(key, positions with that key in increasing order)`` per distinct key, in order of
    each key's first position (``positions`` increasing)."""
    if not keys.size:
        return []
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    ends = np.append(starts[1:], ordered.size).tolist()
    flat = positions[order].tolist()
    first_seen = np.argsort(positions[order[starts]], kind="stable").tolist()
    begin, key = starts.tolist(), ordered[starts].tolist()
    return [(key[g], flat[begin[g] : ends[g]]) for g in first_seen]


class _Index:
    """Positions of messages by kind, sender, receiver and (party, kind); built once per log.

    Every list holds message positions in increasing order, so a query answered from the
    shortest matching list keeps transcript order and touches only the candidate messages.
    """

    __slots__ = ("by_kind", "by_receiver", "by_receiver_kind", "by_sender", "by_sender_kind", "last", "n", "private")

    def __init__(self, messages: list[Message]) -> None:
        self.n = 0
        self.last: Message | None = None
        self.by_kind: dict[str, list[int]] = {}
        self.by_sender: dict[str, list[int]] = {}
        self.by_receiver: dict[str, list[int]] = {}
        self.by_sender_kind: dict[tuple[str, str], list[int]] = {}
        self.by_receiver_kind: dict[tuple[str, str], list[int]] = {}
        self.private: dict[str, list[int]] = {}
        for m in messages:
            self.append(m)

    def append(self, m: Message) -> None:
        pos = self.n
        self.by_kind.setdefault(m.kind, []).append(pos)
        self.by_sender.setdefault(m.sender, []).append(pos)
        self.by_receiver.setdefault(m.receiver, []).append(pos)
        self.by_sender_kind.setdefault((m.sender, m.kind), []).append(pos)
        self.by_receiver_kind.setdefault((m.receiver, m.kind), []).append(pos)
        if m.kind == "private" and m.sender == m.receiver:
            self.private.setdefault(m.sender, []).append(pos)
        self.n = pos + 1
        self.last = m

    @classmethod
    def from_codes(cls, messages: list[Message], codes: np.ndarray, names: list[str]) -> _Index:
        """The index of ``messages`` whose sender, receiver and kind are ``names[codes[i, 0:3]]``
        (``codes``: n x 3 integers, ``names`` distinct), grouped by numpy sorts instead of one
        :meth:`append` per message; the same lists, keys in order of first appearance."""
        idx = cls([])
        n, m = len(messages), len(names)
        pos = np.arange(n)
        s, r, k = (np.asarray(codes[:, j], dtype=np.int64) for j in range(3))
        idx.by_kind = {names[c]: p for c, p in _groups(k, pos)}
        idx.by_sender = {names[c]: p for c, p in _groups(s, pos)}
        idx.by_receiver = {names[c]: p for c, p in _groups(r, pos)}
        idx.by_sender_kind = {(names[c // m], names[c % m]): p for c, p in _groups(s * m + k, pos)}
        idx.by_receiver_kind = {(names[c // m], names[c % m]): p for c, p in _groups(r * m + k, pos)}
        if "private" in names:
            own = (k == names.index("private")) & (s == r)
            idx.private = {names[c]: p for c, p in _groups(s[own], pos[own])}
        idx.n, idx.last = n, messages[-1] if n else None
        return idx

    def candidates(self, kind: str | None, sender: str | None, receiver: str | None) -> list[int] | None:
        """The shortest position list matching the given fields (None: no field given)."""
        lists = []
        if receiver is not None:
            by = self.by_receiver.get(receiver, []) if kind is None else self.by_receiver_kind.get((receiver, kind), [])
            lists.append(by)
        if sender is not None:
            lists.append(
                self.by_sender.get(sender, []) if kind is None else self.by_sender_kind.get((sender, kind), [])
            )
        if kind is not None and not lists:
            lists.append(self.by_kind.get(kind, []))
        return min(lists, key=len) if lists else None


class _MessageLog:
    """Shared behaviour of a transcript and a view: an ordered message list with queries.

    Queries go through an index (:class:`_Index`) built on first use and kept up to date by
    :meth:`Transcript.add`; a query costs O(messages it returns), not O(all messages). The
    message list is append-only: the index is rebuilt when its length or last message changed
    behind its back, never trusted for a list edited in place.
    """

    messages: list[Message]

    def _messages_index(self) -> _Index:
        idx = self.__dict__.get("_index")
        msgs = self.messages
        if idx is None or idx.n != len(msgs) or (idx.n and msgs[-1] is not idx.last):
            idx = _Index(msgs)
            self.__dict__["_index"] = idx
        return idx

    def index_from_codes(self, codes: np.ndarray, names: list[str]) -> None:
        """Build the query index now from the messages' name codes (``codes``: n x 3 integers,
        sender, receiver and kind as positions in ``names``, which must be distinct), as a
        columnar file's reader has them, instead of from the messages on the first query."""
        if len(set(names)) != len(names) or codes.shape != (len(self.messages), 3):
            raise ValueError("the codes must be one (sender, receiver, kind) row per message of distinct names")
        self.__dict__["_index"] = _Index.from_codes(self.messages, codes, names)

    def select(
        self,
        kind: str | None = None,
        *,
        sender: str | None = None,
        receiver: str | None = None,
        round: int | None = None,
    ) -> list[Message]:
        """Messages matching every given field, in transcript order."""
        positions = self._messages_index().candidates(kind, sender, receiver)
        msgs = self.messages
        pool = msgs if positions is None else [msgs[i] for i in positions]
        return [
            m
            for m in pool
            if (kind is None or m.kind == kind)
            and (sender is None or m.sender == sender)
            and (receiver is None or m.receiver == receiver)
            and (round is None or m.round == round)
        ]

    def kinds(self) -> Counter:
        """Count of messages per kind."""
        return Counter({kind: len(pos) for kind, pos in self._messages_index().by_kind.items()})

    def rounds(self, kind: str | None = None) -> list[int]:
        """Sorted distinct rounds (of messages of ``kind`` if given)."""
        pool = self.messages if kind is None else self.select(kind)
        return sorted({m.round for m in pool})

    def derived(self, name: str) -> dict[Any, Any]:
        """A dict owned by this transcript for values computed from it under ``name`` (the
        attacks evaluated on one run share their decodes through it: no module-level cache). It
        lives as long as the transcript, is emptied when the messages change (count or last
        message, as the query index checks) and is never pickled or saved."""
        msgs = self.messages
        stamp = (len(msgs), msgs[-1] if msgs else None)
        held = self.__dict__.get("_derived")
        if held is None or held[0][0] != stamp[0] or held[0][1] is not stamp[1]:
            held = (stamp, {})
            self.__dict__["_derived"] = held
        return held[1].setdefault(name, {})

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_index", None)  # rebuilt on first query after unpickling
        state.pop("_derived", None)  # values derived in this process stay with it
        state.pop("_sink", None)  # an open file stays with the process that writes it
        return state

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)


@dataclass
class View(_MessageLog):
    """What one party knows: the public config and the messages it received.

    Built by :meth:`Transcript.view`. ``messages`` holds every message whose receiver is
    ``party`` (its own ``state``/``private`` messages included), in transcript order.
    """

    party: str
    protocol: str
    config: dict[str, Any]
    dataset: dict[str, Any]
    parties: list[str]
    messages: list[Message]


@dataclass
class Transcript(_MessageLog):
    """Everything that happened in one run.

    Attributes
    ----------
    protocol : str
        Registered protocol name.
    config : dict
        Public configuration (every hyperparameter all parties know), JSON-able.
    seed : int | None
        Seed of the simulation.
    dataset : dict
        Dataset summary (``name``, ``users``, ``items``, ``ratings``, ...).
    parties : list[str]
        Every party id of the run.
    messages : list[Message]
        Ordered messages.
    """

    protocol: str
    config: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    dataset: dict[str, Any] = field(default_factory=dict)
    parties: list[str] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    def add(
        self,
        round: int,
        sender: str,
        receiver: str,
        kind: str,
        payload: Mapping[str, np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Message:
        """Append a message (``seq`` assigned here) and return it.

        Payload arrays are stored as given (not copied); callers must not mutate them later.
        """
        arrays = {}
        for name, value in (payload or {}).items():
            arr = np.asarray(value)
            if arr.dtype.hasobject:
                raise TypeError(f"payload {name!r} of {kind!r} is an object array")
            arrays[str(name)] = arr
        index = self._messages_index()
        msg = Message(len(self.messages), int(round), sender, receiver, kind, arrays, dict(meta or {}))
        self.messages.append(msg)
        index.append(msg)
        sink = self.__dict__.get("_sink")
        if sink is not None:
            sink.append(msg)
        return msg

    def stream_into(self, writer: Any) -> None:
        """Send every message added from now on to ``writer`` (a streaming
        :class:`~privaudit.transcript_io.TranscriptWriter`; None stops). Once a round is written,
        its stored payloads become read-only views of the file, so the finished rounds' arrays
        leave memory; :func:`privaudit.transcript_io.streaming` sets this up for a protocol run."""
        if writer is None:
            self.__dict__.pop("_sink", None)
        else:
            self.__dict__["_sink"] = writer

    def view(self, party: str) -> View:
        """The messages ``party`` received (its own knowledge included) and the public config."""
        if self.parties and party not in self.parties:
            raise TranscriptError(f"no party {party!r} in this transcript")
        return View(
            party=party,
            protocol=self.protocol,
            config=dict(self.config),
            dataset=dict(self.dataset),
            parties=list(self.parties),
            messages=[self.messages[i] for i in self._messages_index().by_receiver.get(party, [])],
        )

    def clients(self) -> list[str]:
        """The client parties (:func:`is_client`), in :attr:`parties` order."""
        return [p for p in self.parties if is_client(p)]

    def private(self, party: str) -> dict[str, np.ndarray]:
        """The ``private`` payload of ``party`` (ground truth for scoring); empty if absent."""
        merged: dict[str, np.ndarray] = {}
        for i in self._messages_index().private.get(party, []):
            merged.update(self.messages[i].payload)
        return merged

    @property
    def has_private(self) -> bool:
        return "private" in self._messages_index().by_kind

    def without_private(self) -> Transcript:
        """A shareable copy without ``private`` messages (sequence numbers kept)."""
        return Transcript(
            self.protocol,
            dict(self.config),
            self.seed,
            dict(self.dataset),
            list(self.parties),
            [m for m in self.messages if m.kind != "private"] if self.has_private else list(self.messages),
        )

    def save(self, path: str | Path, include_private: bool = True) -> Path:
        """Write this transcript to ``path`` (``.ptx``); see :func:`save`."""
        return save(self, path, include_private=include_private)

    @staticmethod
    def load(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Transcript:
        """Read a transcript file; see :func:`load`."""
        return load(path, max_bytes=max_bytes)


# --------------------------------------------------------------------------------------
# files: privaudit.transcript_io (formats 1 and 2, the hostile-input checks, streaming writes)


def save(transcript: Transcript, path: str | Path, include_private: bool = True) -> Path:
    """Write ``transcript`` as a ``.ptx`` archive (format version 2, columnar) and return the path.

    The archive is written under a temporary name in the target folder and renamed into place
    (``os.replace``), so a reader never sees half a file and a failed save leaves the file
    already at ``path`` untouched. With ``include_private=False`` the ``private`` messages are
    left out, which makes a transcript that can be shared without the clients' raw data.
    """
    from privaudit import transcript_io

    return transcript_io.save(transcript, path, include_private=include_private)


def load(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Transcript:
    """Read a ``.ptx`` transcript (format version 1 or 2), refusing anything malformed or unsafe.

    Parameters
    ----------
    path : path to the archive.
    max_bytes : int
        Byte budget: the members' total uncompressed size must not exceed it; the member count,
        the central directory and the manifest get limits derived from it (see
        docs/transcript-format.md). Peak memory is at most about ``max_bytes`` plus the
        interpreter; stored columns of a version-2 file are memory-mapped, not read.

    Raises
    ------
    TranscriptError
        One line naming the member and the problem: not a ZIP, a corrupt, truncated, encrypted,
        symlinked, duplicated or unsupported-compression member, no/invalid/oversized/too deeply
        nested manifest, unknown format or version, a member name with ``..`` or an absolute
        path, a message pointing at a missing member or column, a member that is not a plain
        numeric ``.npy`` array, a shape or dtype that contradicts the manifest, offsets that are
        negative, not monotone, out of range or disagree with the manifest, or an archive larger
        than ``max_bytes`` uncompressed. Control characters in the message are escaped.
    """
    from privaudit import transcript_io

    return transcript_io.load(path, max_bytes=max_bytes)


def load_validated(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Transcript:
    """:func:`load` then :func:`privaudit.schema.validate` against the schema of the protocol the
    transcript names: the one path every command reads a transcript through, before any work."""
    from privaudit.schema import validate

    if not Path(path).exists():
        raise TranscriptError(printable(f"{path}: no such transcript file"))
    t = load(path, max_bytes=max_bytes)
    validate(t)
    return t


def summarize(transcript: Transcript) -> dict[str, Any]:
    """A JSON-able summary: parties, rounds, per-kind counts and bytes, private data present."""
    kinds: dict[str, dict[str, int]] = {}
    for m in transcript.messages:
        entry = kinds.setdefault(m.kind, {"messages": 0, "bytes": 0})
        entry["messages"] += 1
        entry["bytes"] += m.nbytes
    rounds = transcript.rounds()
    n_clients = len(transcript.clients())
    return {
        "protocol": transcript.protocol,
        "seed": transcript.seed,
        "dataset": transcript.dataset,
        "parties": len(transcript.parties),
        "clients": n_clients,
        "other_parties": [p for p in transcript.parties if not is_client(p)],
        "rounds": [rounds[0], rounds[-1]] if rounds else [],
        "messages": len(transcript.messages),
        "kinds": kinds,
        "private_included": transcript.has_private,
        "config": transcript.config,
    }


def iter_payload_arrays(messages: Iterable[Message]) -> Iterator[np.ndarray]:
    """Every payload array of ``messages`` in order."""
    for m in messages:
        yield from m.payload.values()

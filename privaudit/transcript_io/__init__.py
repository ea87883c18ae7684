"""Reading and writing transcript files (``.ptx``): format versions 1 and 2, streaming writes.

:func:`save` writes version 2 (columnar, :mod:`privaudit.transcript_io.v2`) unless asked for
version 1 (one member per array, :mod:`privaudit.transcript_io.v1`); :func:`load` reads both,
treating the file as hostile (:mod:`privaudit.transcript_io._safe`). :func:`streaming` lets a
protocol run write its transcript while it runs (:class:`TranscriptWriter`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from privaudit.transcript import DEFAULT_MAX_BYTES, Transcript
from privaudit.transcript_io import v1, v2
from privaudit.transcript_io._safe import (
    atomic_file,
    check_path,
    list_members,
    open_archive,
    read_header,
    read_manifest,
)
from privaudit.transcript_io.v2 import TranscriptWriter

FORMAT_VERSION = v2.VERSION
READS = (v1.VERSION, v2.VERSION)

__all__ = [
    "FORMAT_VERSION",
    "READS",
    "TranscriptWriter",
    "claim_stream",
    "declared_size",
    "load",
    "mapped_bytes",
    "save",
    "streaming",
]


def save(transcript: Transcript, path: str | Path, include_private: bool = True, version: int = FORMAT_VERSION) -> Path:
    """Write ``transcript`` to ``path`` (atomically: temporary file, then rename); the path."""
    path = Path(path)
    if version == v1.VERSION:
        messages = [m for m in transcript.messages if include_private or m.kind != "private"]
        with atomic_file(path) as fh:
            v1.write(fh, transcript, messages, include_private)
        return path
    if version != v2.VERSION:
        raise ValueError(f"privaudit writes transcript versions {READS}, not {version!r}")
    with _collector_paused():
        return v2.save(transcript, path, include_private)


def load(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Transcript:
    """Read a version-1 or version-2 ``.ptx`` file, refusing anything malformed or unsafe
    (:func:`privaudit.transcript.load` documents the checks)."""
    path = Path(path)
    check_path(path, max_bytes)
    zf = open_archive(path, max_bytes)
    with zf, _collector_paused():
        infos, limits = list_members(path, zf, max_bytes)
        manifest = read_manifest(path, zf, infos["manifest.json"], limits)
        header = read_header(path, manifest, READS)
        codes = None
        if header["version"] == v1.VERSION:
            messages = v1.read(path, zf, infos, manifest, max_bytes)
        else:
            messages, codes, names = v2.read(path, zf, infos, manifest, max_bytes)
        t = Transcript(*(header[k] for k in ("protocol", "config", "seed", "dataset", "parties")), messages)
        if codes is not None and len(set(names)) == len(names):
            t.index_from_codes(codes, names)  # from the message table: no pass over the messages
    return t


def declared_size(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """The total uncompressed size a ``.ptx`` file's central directory declares (its members
    checked as :func:`load` checks them, nothing inflated): what loading it may cost in bytes."""
    path = Path(path)
    check_path(path, max_bytes)
    with open_archive(path, max_bytes) as zf:
        infos, _ = list_members(path, zf, max_bytes)
    return sum(info.file_size for info in infos.values())


def mapped_bytes(transcript: Transcript) -> tuple[int, int]:
    """``(columns, bytes)`` of the memory-mapped stored columns a loaded transcript's payloads
    view: their CRCs are not checked, and the file must not change while they are in use."""
    import numpy as np

    seen: dict[int, int] = {}
    for m in transcript.messages:
        for arr in m.payload.values():
            root = arr
            while isinstance(root, np.ndarray) and not isinstance(root, np.memmap) and root.base is not None:
                root = root.base
            if isinstance(root, np.memmap):
                seen[id(root)] = root.nbytes
    return len(seen), sum(seen.values())


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: loading creates millions of acyclic objects
    (messages, payload dicts, views, index lists), each batch of which would otherwise make the
    collector walk every live object again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ------------------------------------------------------------------------------ streaming

_STREAM: ContextVar[_Stream | None] = ContextVar("privaudit_transcript_stream", default=None)


class _Stream:
    """The file a protocol run streams its transcript into (see :func:`streaming`)."""

    def __init__(self, path: Path, include_private: bool, chunk_bytes: int) -> None:
        self.path, self.include_private, self.chunk_bytes = path, include_private, chunk_bytes
        self.writer: TranscriptWriter | None = None
        self.transcript: Transcript | None = None

    def attach(self, transcript: Transcript) -> None:
        self.writer = TranscriptWriter(
            self.path, include_private=self.include_private, stream=True, chunk_bytes=self.chunk_bytes
        )
        self.transcript = transcript
        transcript.stream_into(self.writer)

    def finish(self, transcript: Transcript) -> Path:
        """Close the streamed file if ``transcript`` is the one that streamed, else save it."""
        if self.writer is not None and transcript is self.transcript:
            transcript.stream_into(None)
            return self.writer.close(transcript)
        return save(transcript, self.path, include_private=self.include_private)


@contextmanager
def streaming(path: str | Path, include_private: bool = True, chunk_bytes: int = v2.CHUNK_BYTES) -> Iterator[_Stream]:
    """Within this block, the first transcript a protocol opens (:func:`claim_stream`) writes its
    messages to ``path`` round by round; ``stream.finish(result.transcript)`` completes the file
    (or, for a protocol that did not stream, saves the transcript there). On an error the
    partial file is removed."""
    stream = _Stream(Path(path), include_private, chunk_bytes)
    token = _STREAM.set(stream)
    try:
        yield stream
    except BaseException:
        if stream.writer is not None and not stream.writer.closed:
            stream.writer.abort()
        raise
    finally:
        _STREAM.reset(token)
        if stream.writer is not None and not stream.writer.closed:
            stream.writer.abort()  # the block ended without finish(): no half file is left


def claim_stream(transcript: Transcript) -> bool:
    """Attach ``transcript`` to the open :func:`streaming` block, if any has no transcript yet."""
    stream: Any = _STREAM.get()
    if stream is None or stream.writer is not None:
        return False
    stream.attach(transcript)
    return True

"""Transcript format version 1: one ``.npy`` member per payload array.

``manifest.json`` lists each message's payload as name -> member path (``arrays/<n>.npy``) and,
in an ``arrays`` table, each member's ``{"dtype", "shape"}``, so that a member contradicting the
manifest is detected before it is read. Transcripts written by other tools may omit the table;
their arrays are then checked only for safety (plain numeric dtype, size within the budget).
Version 1 is still read; privaudit writes it only when asked (``save(..., version=1)``).
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from privaudit.transcript import Message, Transcript
from privaudit.transcript_io._safe import (
    FORMAT_NAME,
    fail,
    jsonable,
    message_fields,
    read_npy,
    safe_member,
    shape_list,
    simple_dtype,
)

VERSION = 1

#: float arrays of at least this many elements are stored uncompressed (smaller ones, e.g. a
#: client's ratings on a 1-5 grid, still deflate well)
STORED_MIN_FLOATS = 1024


def write(fh: Any, transcript: Transcript, messages: list[Message], include_private: bool) -> None:
    """Write ``messages`` of ``transcript`` as a version-1 archive to the open file ``fh``."""
    manifest_messages = []
    arrays_table: dict[str, dict[str, Any]] = {}
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True) as zf:
        for m in messages:
            payload_refs = {}
            for name, arr in m.payload.items():
                arr = np.asarray(arr)
                if arr.dtype.hasobject:
                    raise TypeError(f"message {m.seq} payload {name!r} is an object array")
                member = f"arrays/{len(arrays_table)}.npy"
                target: str | zipfile.ZipInfo = member
                if arr.dtype.kind in "fc" and arr.size >= STORED_MIN_FLOATS:
                    target = zipfile.ZipInfo(member, date_time=time.localtime()[:6])
                    target.compress_type = zipfile.ZIP_STORED
                    target.external_attr = 0o600 << 16  # as ZipFile.open gives a member opened by name
                with zf.open(target, "w", force_zip64=arr.nbytes > 2**31) as out:
                    np.lib.format.write_array(out, arr, allow_pickle=False)
                payload_refs[name] = member
                arrays_table[member] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
            manifest_messages.append(message_record(m, payload_refs))
        manifest = header_record(transcript, VERSION, include_private) | {
            "messages": manifest_messages,
            "arrays": arrays_table,
        }
        zf.writestr("manifest.json", json.dumps(manifest, separators=(",", ":")))


def header_record(transcript: Transcript, version: int, include_private: bool) -> dict[str, Any]:
    """The manifest's fields before ``messages``."""
    return {
        "format": FORMAT_NAME,
        "version": version,
        "protocol": transcript.protocol,
        "config": jsonable(transcript.config, "config"),
        "seed": transcript.seed,
        "dataset": jsonable(transcript.dataset, "dataset"),
        "parties": list(transcript.parties),
        "private_included": bool(include_private and transcript.has_private),
    }


def message_record(m: Message, payload_refs: dict[str, Any]) -> dict[str, Any]:
    """One entry of the manifest's ``messages``."""
    return {
        "seq": int(m.seq),
        "round": int(m.round),
        "sender": m.sender,
        "receiver": m.receiver,
        "kind": m.kind,
        "payload": payload_refs,
        "meta": jsonable(m.meta, f"message {m.seq} meta"),
    }


def _expected(mwhere: str, arrays_table: dict | None, member: str) -> dict | None:
    if arrays_table is None:
        return None
    expected = arrays_table.get(member)
    if not isinstance(expected, dict):
        raise fail(mwhere, f"array {member!r} is not described in the manifest")
    if simple_dtype(expected.get("dtype")) is None:
        raise fail(mwhere, f"array {member!r} has an invalid dtype in the manifest")
    if shape_list(expected.get("shape")) is None:
        raise fail(mwhere, f"array {member!r} has an invalid shape in the manifest")
    return expected


def read(path: Path, zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo], manifest: dict, max_bytes: int) -> list:
    """The messages of a version-1 manifest, every array read (and checked) once."""
    arrays_table = manifest.get("arrays")
    if arrays_table is not None and not isinstance(arrays_table, dict):
        raise fail(f"{path}: manifest", "'arrays' must be an object")
    raw_messages = manifest.get("messages")
    if not isinstance(raw_messages, list):
        raise fail(
            f"{path}: manifest",
            "missing field 'messages'" if raw_messages is None else "field 'messages' has the wrong type",
        )
    messages = []
    cache: dict[str, np.ndarray] = {}
    budget = max_bytes
    last_seq = -1
    for i, raw in enumerate(raw_messages):
        mwhere = f"{path}: message {i}"
        seq, rnd, sender, receiver, kind, refs, meta = message_fields(raw, mwhere, last_seq)
        last_seq = seq
        payload = {}
        for name, member in refs.items():
            safe_member(member, mwhere)
            if member not in infos or member == "manifest.json":
                raise fail(mwhere, f"payload {name!r} points at missing array {member!r}")
            if member not in cache:
                expected = _expected(mwhere, arrays_table, member)
                cache[member] = read_npy(path, zf, infos[member], expected, budget)
                budget -= cache[member].nbytes
            payload[name] = cache[member]
        messages.append(Message(seq, rnd, sender, receiver, kind, payload, meta))
    return messages

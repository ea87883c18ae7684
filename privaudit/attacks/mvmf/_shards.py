"""The FedMVMF attacks' truth counts per shard of a sharded run (:meth:`MVMFAttack.shard_part`
and ``merge_shards``, which :func:`privaudit.sharded.attack_shards` calls): histograms of the
true values behind the majority baselines, summed over blocks."""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attacks.mvmf._view import private_payloads
from privaudit.errors import PrivauditError
from privaudit.transcript import Transcript

__all__ = ["histograms", "majority", "true_values"]

#: uploaded (client, item) pairs looked up at once (bounds the temporaries of an InclUnc block)
_CHUNK = 1 << 22


def histograms(transcript: Transcript, out: dict[str, Any]) -> None:
    """Add to ``out["ratings"]`` the counts of every uploaded item's true rating (0 = unrated)
    over the first ``grad_V`` upload of each client, and to ``out["attributes"]`` those of every
    attribute dummy (value -> count)."""
    private = private_payloads(transcript)
    firsts: dict[str, np.ndarray] = {}
    for m in transcript.select("grad_V"):
        if m.sender not in firsts and "items" in m.payload:
            firsts[m.sender] = np.asarray(m.payload["items"], dtype=np.int64).reshape(-1)
    senders, none = list(firsts), np.empty(0)
    rated = [np.asarray(private.get(p, {}).get("items", none), dtype=np.int64).reshape(-1) for p in senders]
    ratings = [np.asarray(private.get(p, {}).get("ratings", none), dtype=np.float64).reshape(-1) for p in senders]
    lo, used = 0, 0
    for c, p in enumerate(senders):  # chunks of clients holding about _CHUNK uploaded items
        used += firsts[p].size
        if used >= _CHUNK or c == len(senders) - 1:
            _count(
                out["ratings"],
                true_values([firsts[q] for q in senders[lo : c + 1]], rated[lo : c + 1], ratings[lo : c + 1]),
            )
            lo, used = c + 1, 0
    for payload in private.values():
        _count(out["attributes"], np.asarray(payload.get("attributes", []), dtype=np.float64))


def true_values(items: list[np.ndarray], rated: list[np.ndarray], ratings: list[np.ndarray]) -> np.ndarray:
    """Per client ``c`` its true ratings of ``items[c]`` (0 where ``rated[c]`` lacks the item), the
    clients' concatenated: :func:`privaudit.attacks.mvmf._view.true_ratings` of each, in one lookup of
    the (client, item) pairs among the sorted rated ones."""
    if any(a.size != b.size for a, b in zip(rated, ratings)):
        raise PrivauditError("a private message has ratings and items of different lengths")
    if not items:
        return np.empty(0)
    up, own = np.concatenate(items), np.concatenate(rated)
    span = int(max(up.max(initial=0), own.max(initial=0))) + 1
    if min(up.min(initial=0), own.min(initial=0)) < 0 or span * len(items) >= 2**62:
        raise PrivauditError("a shard's item ids must be non-negative and below 2**62 / clients")
    client = np.arange(len(items), dtype=np.int64)
    keys = np.repeat(client, [a.size for a in rated]) * span + own
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], np.concatenate(ratings)[order]
    if not keys.size:
        return np.zeros(up.size)
    wanted = np.repeat(client, [a.size for a in items]) * span + up
    pos = np.minimum(np.searchsorted(keys, wanted), keys.size - 1)
    return np.where(keys[pos] == wanted, values[pos], 0.0)


def _count(counts: dict[float, int], values: np.ndarray) -> None:
    found, times = np.unique(values, return_counts=True)
    for v, c in zip(found.tolist(), times.tolist()):
        counts[v] = counts.get(v, 0) + c


def majority(parts: list[dict[str, Any]], key: str) -> float:
    """The share of the most frequent value in the summed histograms ``part[key]`` (NaN if empty)."""
    counts: dict[float, int] = {}
    for p in parts:
        for v, c in p[key].items():
            counts[v] = counts.get(v, 0) + c
    total = sum(counts.values())
    return max(counts.values()) / total if total else float("nan")

"""FedNCF's client-side helpers: per-client Adam state, training instances and upload payloads
(:mod:`privaudit.protocols.fedncf` runs the rounds)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.models import ncf


@dataclasses.dataclass
class ClientData:
    """The clients' training data: positives (n x m CSR), excluded items (positives and the
    held-out item, for negative sampling), positives per client, number of items."""

    pos: sp.csr_matrix
    excl: sp.csr_matrix
    n_pos: np.ndarray
    m: int


def init_adam(n: int, m: int, Dt: int, net: dict[str, np.ndarray]) -> dict[str, Any]:
    """Zero per-client Adam moments (n x m x Dtot for the item rows) and step counts."""
    adam: dict[str, Any] = {"step": np.zeros(n, dtype=np.int64)}
    for mk in ("m", "v"):
        adam[f"{mk}_user"] = np.zeros((n, Dt), dtype=np.float32)
        adam[f"{mk}_item"] = np.zeros((n, m, Dt), dtype=np.float32)
        adam[f"{mk}_net"] = {k: np.zeros((n,) + v.shape, dtype=np.float32) for k, v in net.items()}
    return adam


def training_instances(cfg: Mapping[str, Any], cohort: np.ndarray, data: ClientData, all_rows: bool, rng) -> tuple:
    """Each member's local rows (sorted ids; every row with ``all_rows``), training instances
    (positives then sampled negatives), instance counts and positive counts."""
    npos = data.n_pos[cohort]
    nneg = cfg["negatives"] * npos
    n_inst = npos + nneg
    neg_all = (
        ncf.sample_negatives(np.repeat(cohort, nneg), data.excl, data.m, rng)
        if nneg.sum()
        else np.zeros(0, dtype=np.int64)
    )
    neg_split = np.split(neg_all, np.cumsum(nneg)[:-1])
    pos = data.pos
    pos_lists = [pos.indices[pos.indptr[u] : pos.indptr[u + 1]].astype(np.int64) for u in cohort]
    inst_items = [np.concatenate([p, q]) for p, q in zip(pos_lists, neg_split)]
    if all_rows:  # DP noise touches every row: the whole item table is local
        local = [np.arange(data.m, dtype=np.int64) for _ in range(len(cohort))]
    else:
        local = [np.unique(x) for x in inst_items]
    return local, inst_items, n_inst, npos


def adam_slice(adam: dict[str, Any], cohort: np.ndarray, local: list[np.ndarray], L: int, Dt: int) -> dict:
    """The cohort's persistent Adam state, item moments gathered to its local rows (C x L x Dtot)."""
    state: dict[str, Any] = {"step": adam["step"][cohort]}
    for mk in ("m", "v"):
        state[f"{mk}_user"] = adam[f"{mk}_user"][cohort]
        state[f"{mk}_net"] = {k: v[cohort] for k, v in adam[f"{mk}_net"].items()}
        it = np.zeros((len(cohort), L, Dt), dtype=np.float32)
        for c in range(len(cohort)):
            it[c, : len(local[c])] = adam[f"{mk}_item"][cohort[c], local[c]]
        state[f"{mk}_item"] = it
    return state


def adam_store(adam: dict[str, Any], new: dict[str, Any], cohort: np.ndarray, local: list[np.ndarray]) -> None:
    """Write the cohort's Adam state after local training back into ``adam``."""
    adam["step"][cohort] = new["step"]
    for mk in ("m", "v"):
        adam[f"{mk}_user"][cohort] = new[f"{mk}_user"]
        for k in adam[f"{mk}_net"]:
            adam[f"{mk}_net"][k][cohort] = new[f"{mk}_net"][k]
        for c in range(len(cohort)):
            adam[f"{mk}_item"][cohort[c], local[c]] = new[f"{mk}_item"][c, : len(local[c])]


def upload_payloads(cfg, arch, local, n_inst, item_rows, out, net_flat) -> dict[str, list]:
    """``item_update`` and ``net_update`` payloads of every member, weighted by ``aggregation``."""
    agg = cfg["aggregation"]
    item_payloads, net_payloads = [], []
    for c in range(len(local)):
        w_item = float(n_inst[c]) if agg == "fedavg" else 1.0
        w_net = 1.0 if agg == "simpleavg" else float(n_inst[c])
        Lc = len(local[c])
        delta = out["items"][c, :Lc].astype(np.float64) - item_rows[c, :Lc].astype(np.float64)
        item_payloads.append({"items": local[c], "values": w_item * delta})
        new_flat = np.concatenate([out["net"][k][c].astype(np.float64).ravel() for k in ncf.network_shapes(*arch)])
        net_payloads.append({"delta": w_net * (new_flat - net_flat), "n_instances": np.array([float(n_inst[c])])})
    return {"item_payloads": item_payloads, "net_payloads": net_payloads}


def model_bytes(items: np.ndarray, net_flat: np.ndarray) -> bytes:
    """A model as sent: float32 item rows (m x Dtot), then float64 network weights."""
    return np.ascontiguousarray(items, dtype=np.float32).tobytes() + np.ascontiguousarray(net_flat).tobytes()


def merge_uploads(first: np.ndarray, a: dict[str, list], b: dict[str, list]) -> dict[str, list]:
    """Interleave two clients' upload lists into cohort order (``first``: bool per member, True
    where the member's uploads are the next ones of ``a``)."""
    out: dict[str, list] = {}
    for key in a:
        ia, ib = iter(a[key]), iter(b[key])
        out[key] = [next(ia) if f else next(ib) for f in first]
    return out

"""Clients in fixed blocks: the per-partition math shared by single-process and sharded runs.

A run's clients ``0..n-1`` are cut into blocks of :data:`CLIENT_BLOCK` consecutive clients
(the last may be shorter). Everything a client computes is computed one block at a time by
the functions here, and the server adds the blocks' partial sums in block order
(:func:`fold`). A sharded run (:mod:`privaudit.sharded`) gives each worker whole blocks, so its
sums, like its per-client random draws (:func:`block_rng`: from the seed and the block index),
do not depend on how the blocks are spread over workers: the result equals the
single-process run's, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from privaudit.defenses.base import PackedBatch
from privaudit.models import mvmf, pmf

__all__ = [
    "CLIENT_BLOCK",
    "Accumulator",
    "MVMFSettings",
    "client_loss",
    "server_loss",
    "entries_block",
    "error_sums",
    "pmf_block_round",
    "PMFBlockRound",
    "MVMFBlock",
    "MVMFBlockRound",
    "block_ranges",
    "block_rng",
    "fold",
    "mvmf_block_round",
]

#: Clients per block (a 4,096-client block of ML-10M-like users holds ~0.6 M ratings).
CLIENT_BLOCK = 4096
#: ``spawn_key`` head of the per-block streams (the protocols' own streams use 0..3).
_BLOCK_STREAM = 16


def block_ranges(n: int, size: int = CLIENT_BLOCK) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]`` of consecutive blocks of ``size`` clients covering ``0..n-1``."""
    if size < 1:
        raise ValueError(f"block size must be >= 1, got {size}")
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def block_rng(seed: int, stream: int, block: int) -> np.random.Generator:
    """The generator of client block ``block`` for the protocol's stream ``stream``: a function of
    the seed and the block index only (``SeedSequence(seed, spawn_key=(16 + stream, block))``)."""
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(_BLOCK_STREAM + stream, int(block))))


class Accumulator:
    """The server's running sums of the blocks' partials (arrays or floats), added in block
    order: ``add`` them block after block; ``values`` is the list of sums."""

    def __init__(self) -> None:
        self.values: list = []

    def add(self, *parts: np.ndarray | float) -> None:
        if not self.values:
            self.values = [np.array(x, dtype=np.float64) if isinstance(x, np.ndarray) else float(x) for x in parts]
            return
        for j, x in enumerate(parts):
            if isinstance(x, np.ndarray):
                self.values[j] += x
            else:
                self.values[j] = self.values[j] + float(x)


def fold(parts: Sequence[Sequence[np.ndarray | float]]) -> list:
    """Element-wise sums of the blocks' partials in block order (:class:`Accumulator`)."""
    total = Accumulator()
    for part in parts:
        total.add(*part)
    return total.values


# ---------------------------------------------------------------------------------- FedMVMF


@dataclass(frozen=True)
class MVMFSettings:
    """The training hyperparameters of FedMVMF (from the config)."""

    K: int
    alpha: float
    lam: float
    w: float
    eta: float
    update: str
    unrated: str

    @classmethod
    def from_config(cls, cfg) -> MVMFSettings:
        return cls(
            int(cfg["K"]),
            float(cfg["alpha"]),
            float(cfg["lam"]),
            float(cfg["w"]),
            float(cfg["eta"]),
            cfg["update"],
            cfg["unrated"],
        )


@dataclass
class MVMFBlock:
    """One block of FedMVMF clients: rows ``lo..lo+len-1`` of the training data and their u_u.

    ``ratings``/``weights``: CSR (clients x m) of the same sparsity, sorted indices; ``X``:
    (clients x p) attributes; ``U``: (clients x K) current factors, ``U_init`` the initial ones.
    """

    lo: int
    ratings: sp.csr_matrix
    weights: sp.csr_matrix
    X: np.ndarray
    U: np.ndarray
    U_init: np.ndarray

    @classmethod
    def initial(
        cls,
        index: int,
        lo: int,
        ratings: sp.csr_matrix,
        weights: sp.csr_matrix,
        X: np.ndarray,
        K: int,
        seed: int,
        scale: float,
    ) -> MVMFBlock:
        """A block whose initial u_u are N(0, scale^2) draws of :func:`block_rng` (stream 0)."""
        U = block_rng(seed, 0, index).normal(0.0, scale, (ratings.shape[0], K))
        return cls(lo, ratings, weights, X, U, U.copy())


@dataclass
class MVMFBlockRound:
    """What one block returns in one epoch: the sums of its uploads (``sum_V`` m x K, ``sum_P``
    p x K; 0.0 when not asked), its clients' part of the loss J, and (when asked) the uploads."""

    sum_V: np.ndarray | float
    sum_P: np.ndarray | float
    loss: float
    uploads: MVMFUploads | None = None


@dataclass
class MVMFUploads:
    """A block's uploads packed: client u's ``grad_V`` is ``items``/``values`` rows
    ``indptr[u]:indptr[u + 1]`` (len x K), its ``grad_P`` is ``grad_P[u]`` (p x K)."""

    items: np.ndarray
    values: np.ndarray
    indptr: np.ndarray
    grad_P: np.ndarray

    def batches(self, round: int, senders: list[str]) -> list[PackedBatch]:
        """The round's two messages of every client (``senders``, in block order), packed."""
        return [
            PackedBatch(round, "grad_V", senders, {"items": self.items, "values": self.values}, self.indptr),
            PackedBatch(round, "grad_P", senders, {"values": self.grad_P}),
        ]

    @staticmethod
    def concatenate(parts: list[MVMFUploads]) -> MVMFUploads:
        """The blocks' uploads in block order, as one."""
        if len(parts) == 1:
            return parts[0]
        starts = np.cumsum([0] + [len(p.items) for p in parts[:-1]])
        indptr = np.concatenate([[0]] + [p.indptr[1:] + s for p, s in zip(parts, starts)]).astype(np.int64)
        return MVMFUploads(
            np.concatenate([p.items for p in parts]),
            np.concatenate([p.values for p in parts]),
            indptr,
            np.concatenate([p.grad_P for p in parts]),
        )


def mvmf_block_round(
    block: MVMFBlock,
    V: np.ndarray,
    P: np.ndarray,
    st: MVMFSettings,
    uploads: bool,
    with_loss: bool = True,
    sums: bool = True,
) -> MVMFBlockRound:
    """One epoch of a block's clients: update u_u (SemiALS or SGD, eq. 8-10) from the V, P they
    received, then their upload sums (0.0 without ``sums``: the caller sums what the defenses
    return), loss part (NaN without ``with_loss``) and (``uploads``) the clients' ``grad_V``/``grad_P``
    as one :class:`MVMFUploads`."""
    R, W, X = block.ratings, block.weights, block.X
    A, b = mvmf.normal_equations(V, P, X, R, W, st.alpha, st.lam, st.w, st.unrated)
    block.U = mvmf.solve_users(A, b) if st.update == "semials" else mvmf.sgd_users(block.U, A, b, st.eta)
    del A, b
    U = block.U
    sum_V, sum_P = mvmf.summed_uploads(U, V, P, X, R, W, st.alpha, st.w, st.unrated) if sums else (0.0, 0.0)
    out = MVMFBlockRound(sum_V, sum_P, client_loss(U, V, P, R, W, X, st) if with_loss else float("nan"))
    if uploads:
        out.uploads = mvmf_uploads(U, V, P, R, W, X, st)
    return out


def mvmf_uploads(U, V, P, R, W, X, st: MVMFSettings) -> MVMFUploads:
    """Every client's ``grad_V`` (eq. 7: its rated items' rows under ObsOnly, all m rows under
    InclUnc) and ``grad_P`` (eq. 5), packed."""
    n, m = R.shape
    if st.unrated == "obsonly":
        entry_rows = np.repeat(np.arange(n), np.diff(R.indptr))
        rows = mvmf.grad_V_rows(mvmf.entry_coefficients(U, V, R, W), U, entry_rows)
        items, indptr = R.indices.astype(np.int64), np.asarray(R.indptr, dtype=np.int64)
    else:
        rows = mvmf.grad_V_rows(mvmf.dense_coefficients(U, V, R, W, st.w), U).reshape(n * m, -1)
        items, indptr = np.tile(np.arange(m, dtype=np.int64), n), np.arange(n + 1, dtype=np.int64) * m
    return MVMFUploads(items, rows, indptr, mvmf.grad_P(U, P, X, st.alpha))


def client_loss(U, V, P, R: sp.csr_matrix, W: sp.csr_matrix, X, st: MVMFSettings) -> float:
    """The clients' terms of J (eq. 3): weighted squared errors, ``alpha ||x_u - P u_u||^2`` and
    ``lam ||u_u||^2``; :func:`server_loss` holds the rest."""
    pred = mvmf.entry_predictions(U, V, R)
    total = float(np.sum(W.data * (R.data - pred) ** 2))
    if st.unrated == "inclunc":
        total += st.w * (float(np.sum((U.T @ U) * (V.T @ V))) - float(np.sum(pred**2)))
    return total + st.alpha * float(np.sum((X - U @ P.T) ** 2)) + st.lam * float(np.sum(U**2))


def server_loss(V, P, Q, Y, st: MVMFSettings) -> float:
    """The servers' terms of J: ``alpha ||Y - V Q^T||^2 + lam (||V||^2 + ||P||^2 + ||Q||^2)``."""
    return st.alpha * float(np.sum((Y - V @ Q.T) ** 2)) + st.lam * float(np.sum(V**2) + np.sum(P**2) + np.sum(Q**2))


# ---------------------------------------------------------------------------------- FedRec


def entries_block(E: pmf.Entries, lo: int, hi: int) -> pmf.Entries:
    """The entries of clients ``lo..hi-1`` of ``E`` (rows renumbered from 0)."""
    a, b = int(E.indptr[lo]), int(E.indptr[hi])
    return pmf.Entries(
        E.rows[a:b] - lo, E.cols[a:b], E.vals[a:b], E.virtual[a:b], E.indptr[lo : hi + 1] - a, (hi - lo, E.shape[1])
    )


@dataclass
class PMFBlockRound:
    """One block's batch iteration: its new ``U`` rows, the sum of its eq.-8 uploads scattered by
    item (``total`` m x d), its uploads per item (``counts``), its clipped U steps, the payloads."""

    U: np.ndarray
    total: np.ndarray
    counts: np.ndarray
    clipped: int
    payloads: list[dict[str, np.ndarray]] | None


def pmf_block_round(
    U: np.ndarray, E: pmf.Entries, V: np.ndarray, lam: float, lr: float, max_step: float, uploads: bool
) -> PMFBlockRound:
    """FedRec Algorithm 2 for one block: U_u steps with eq. 7 (clipped to ``max_step``), then the
    eq.-8 gradient of every entry with the new U_u; (``uploads``) one payload per client."""
    m = V.shape[0]
    has = E.counts > 0
    U = U.copy()
    step, clipped = pmf.clip_rows(lr * pmf.batch_user_gradient(U, V, E, lam)[has], max_step)
    U[has] -= step
    G = pmf.grad_V_entries(U, V, E, lam)
    total = np.zeros((m, V.shape[1]))
    pmf.scatter_rows(total, E.cols, G, -1.0)
    counts = np.bincount(E.cols, minlength=m).astype(np.float64)
    payloads = None
    if uploads:
        ip = E.indptr
        payloads = [{"items": E.cols[ip[u] : ip[u + 1]], "values": G[ip[u] : ip[u + 1]]} for u in range(E.shape[0])]
    return PMFBlockRound(U, total, counts, clipped, payloads)


def error_sums(pred: np.ndarray, truth: np.ndarray, lo: float, hi: float, clip: bool) -> tuple[float, float]:
    """``(sum (p - r)^2, sum |p - r|)`` of one block's test entries (predictions clipped to
    ``lo..hi`` when ``clip``); :func:`fold` them in block order for RMSE and MAE."""
    err = (np.clip(pred, lo, hi) if clip else pred) - truth
    return float(np.sum(err**2)), float(np.sum(np.abs(err)))

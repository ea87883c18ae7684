"""The ``item-means`` protocol: federated item-mean rating prediction, every declaration a protocol has.

Each round the server sends its item means (recorded as a ``state`` message) and every client
uploads, for the items it rated, its rating minus the item's mean (a ``grad_V`` message of item
ids and one-column rows); the server averages them into the item means and predicts every
held-out rating by its item's mean. Not a recommender worth deploying: a small protocol that
shows each declaration of :class:`~privaudit.protocols.base.Protocol`, its client round in blocks
(``block_round``: ``privaudit run --scheduler local:2`` spreads the clients over Dask workers)
included.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.defenses.base import ClientData
from privaudit.params import Param
from privaudit.protocols.base import (
    BlockClients,
    BlockPart,
    BlockRound,
    BlockRun,
    Protocol,
    RunResult,
    RunSetup,
    plain_sum,
    utility_specs_of,
)
from privaudit.results import MetricSpec
from privaudit.schema import GRAD_ROWS, ITEMS, RATINGS, MessageSchema, PayloadField, ProtocolSchema

#: The messages a transcript of this protocol holds (checked before any attack reads one).
SCHEMA = ProtocolSchema(
    config_keys=("K", "n_items", "rating_min", "rating_max"),
    dims={"m": "n_items", "K": "K"},
    messages=(
        MessageSchema("private", "client", "self", (ITEMS, RATINGS)),
        MessageSchema("grad_V", "client", "server", GRAD_ROWS, upload=True, required=True),
        MessageSchema("state", "server", "self", (PayloadField("V", "float", ("m", "K")),)),
    ),
)


class ItemMeanBlocks(BlockRound):
    """The clients' round one block of consecutive clients at a time (what a sharded run spreads
    over Dask workers): a block is its clients' training rows; its round's partials are the sums
    and counts of its uploads by item, which the server adds block after block."""

    upload_kinds = ("grad_V",)

    def __init__(self, n_items: int) -> None:
        self.n_items = n_items

    @classmethod
    def open(cls, protocol: Protocol, setup: RunSetup) -> BlockRun:
        split = _Split(setup, setup.streams(2)[0])  # the channel's stream (the second) is not used
        transcript = protocol.open_transcript(
            setup.config, setup.dataset, [], setup.seed, ["server", *split.senders], **split.public
        )

        def train(clients: BlockClients) -> RunResult:
            means = split.initial_means()
            for r in range(setup.config["rounds"]):
                transcript.add(r, "server", "server", "state", {"V": means[:, None].copy()})
                values, counts = clients.round(r, True, means)
                seen = counts > 0
                means[seen] += values[seen] / counts[seen]
            return RunResult(transcript, means, split.utility(means))

        return BlockRun(cls(split.n_items), len(split.senders), transcript, lambda b, lo, hi: split.train[lo:hi], train)

    def private(self, rows: sp.csr_matrix) -> list[tuple[dict[str, np.ndarray], None]]:
        """Each client's training items and ratings."""
        return [({"items": items, "ratings": ratings}, None) for items, ratings in _rows(rows)]

    def round(self, rows: sp.csr_matrix, t: int, record: bool, means: np.ndarray) -> BlockPart:
        payloads = _residuals(_rows(rows), means)
        total = plain_sum(payloads, rows=self.n_items)
        return BlockPart(
            (total["values"][:, 0], total["counts"].astype(float)), [("grad_V", payloads)] if record else None
        )


class ItemMeans(Protocol):
    """Clients upload rating residuals per rated item; the server keeps the item means."""

    description = "federated item means: clients upload per-item rating residuals (plugin example)"
    parameters = (
        Param("rounds", 2, "upload rounds", ge=1),
        Param("test_fraction", 0.2, "share of each client's ratings held out to measure the RMSE", ge=0, lt=1),
    )
    schema = SCHEMA
    #: rmse is lower-is-better: declared, so a defense's utility cost has the right sign
    utility_specs = {
        **utility_specs_of("rmse"),
        "coverage": MetricSpec(True, True, "fraction", "share of held-out ratings whose item has a mean"),
    }
    main_utility = "rmse"
    default_attack = "uploaded-items"
    #: ``privaudit attack --protocol item-means`` alone sweeps the example defense's step
    default_sweep_spec = "quantize.step=0,0.5,1"
    default_defense_specs = ("quantize",)
    default_users = 50
    derived_keys = ("K", "n_items", "rating_min", "rating_max")
    #: its clients run in blocks: ``privaudit run --scheduler local:N`` spreads them over workers
    block_round = ItemMeanBlocks

    @classmethod
    def estimate_seconds(cls, n_users: int, sets: Any, defenses: Any = ()) -> float:
        """About a millisecond per user and round (printed only above two minutes)."""
        return 1e-3 * n_users * cls.resolve_config(sets)["rounds"]

    def simulate(self, setup: RunSetup) -> RunResult:
        if not setup.defenses:  # the blocks in this process: the run a sharded one equals
            return self.simulate_blocks(setup)
        split_rng, channel_rng = setup.streams(2)
        split = _Split(setup, split_rng)
        private = {s: {"items": i, "ratings": r} for s, (i, r) in zip(split.senders, _rows(split.train))}
        transcript, channel = self.start(setup, ["server", *split.senders], private, channel_rng, **split.public)
        # client-data defenses (sampling) may add virtual items, uploaded like rated ones
        local = _rows(channel.client_data(ClientData.from_ratings(split.train)).ratings.tocsr())
        means = split.initial_means()
        for r in range(setup.config["rounds"]):
            transcript.add(r, "server", "server", "state", {"V": means[:, None].copy()})
            sent = channel.send(r, "grad_V", split.senders, _residuals(local, means))
            total = channel.sum(sent, rows=split.n_items)
            seen = total["counts"] > 0
            means[seen] += total["values"][seen, 0] / total["counts"][seen]
        return RunResult(transcript, means, split.utility(means))


class _Split:
    """The run's training ratings (CSR users x items) and held-out test entries."""

    def __init__(self, setup: RunSetup, split_rng: np.random.Generator) -> None:
        data = setup.dataset
        R = sp.csr_matrix(data.ratings)
        self.test = split_rng.random(R.nnz) < setup.config["test_fraction"]
        self.coo = R.tocoo()
        coo, test = self.coo, self.test
        self.train = sp.csr_matrix((coo.data[~test], (coo.row[~test], coo.col[~test])), shape=R.shape)
        self.train.sort_indices()
        self.n_items = int(data.n_items)
        self.senders = [f"client:{u}" for u in range(data.n_users)]
        self.public = {"K": 1, "n_items": data.n_items, "rating_min": data.rating_min, "rating_max": data.rating_max}

    def initial_means(self) -> np.ndarray:
        return np.full(self.n_items, float(self.train.data.mean()) if self.train.nnz else 0.0)

    def utility(self, means: np.ndarray) -> dict[str, float]:
        """RMSE of the held-out ratings predicted by their item's mean; the share whose item has one."""
        coo, test = self.coo, self.test
        covered = np.bincount(self.train.indices, minlength=self.n_items)[coo.col[test]] > 0
        err = means[coo.col[test]] - coo.data[test]
        return {
            "rmse": float(np.sqrt(np.mean(err**2))) if test.any() else float("nan"),
            "coverage": float(covered.mean()) if test.any() else float("nan"),
        }


def _rows(m: sp.csr_matrix) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every row of a CSR matrix: its column ids (int64) and values."""
    return [
        (m.indices[m.indptr[u] : m.indptr[u + 1]].astype(np.int64), m.data[m.indptr[u] : m.indptr[u + 1]])
        for u in range(m.shape[0])
    ]


def _residuals(rows: list[tuple[np.ndarray, np.ndarray]], means: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Each client's upload: its items and its ratings minus their means (one column)."""
    return [{"items": items, "values": (values - means[items])[:, None]} for items, values in rows]

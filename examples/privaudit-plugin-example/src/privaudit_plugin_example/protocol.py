"""The ``item-means`` protocol: federated item-mean rating prediction, every declaration a protocol has.

Each round every client uploads, for the items it rated, its rating minus the running item
mean (a ``grad_V`` message of item ids and one-column rows); the server averages them into the
item means and predicts every held-out rating by its item's mean. Not a recommender worth
deploying: a small protocol that shows each declaration of :class:`~privaudit.protocols.base.Protocol`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.defenses.base import ClientData
from privaudit.params import Param
from privaudit.protocols.base import Protocol, RunResult, RunSetup, utility_specs_of
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

    @classmethod
    def estimate_seconds(cls, n_users: int, sets: Any, defenses: Any = ()) -> float:
        """About a millisecond per user and round (printed only above two minutes)."""
        return 1e-3 * n_users * cls.resolve_config(sets)["rounds"]

    def simulate(self, setup: RunSetup) -> RunResult:
        config, data = setup.config, setup.dataset
        split_rng, channel_rng = setup.streams(2)
        R = sp.csr_matrix(data.ratings)
        test = split_rng.random(R.nnz) < config["test_fraction"]
        coo = R.tocoo()
        train = sp.csr_matrix((coo.data[~test], (coo.row[~test], coo.col[~test])), shape=R.shape)
        train.sort_indices()
        senders = [f"client:{u}" for u in range(data.n_users)]
        private = {s: {"items": _row(train, u)[0], "ratings": _row(train, u)[1]} for u, s in enumerate(senders)}
        public = {"K": 1, "n_items": data.n_items, "rating_min": data.rating_min, "rating_max": data.rating_max}
        transcript, channel = self.start(setup, ["server", *senders], private, channel_rng, **public)
        # client-data defenses (sampling) may add virtual items, uploaded like rated ones
        local = channel.client_data(ClientData.from_ratings(train)).ratings.tocsr()
        rows, vals = zip(*(_row(local, u) for u in range(data.n_users)))
        means = np.full(data.n_items, float(train.data.mean()) if train.nnz else 0.0)
        for r in range(config["rounds"]):
            payloads = [{"items": rows[u], "values": (vals[u] - means[rows[u]])[:, None]} for u in range(data.n_users)]
            total = channel.sum(channel.send(r, "grad_V", senders, payloads), rows=data.n_items)
            seen = total["counts"] > 0
            means[seen] += total["values"][seen, 0] / total["counts"][seen]
            transcript.add(r, "server", "server", "state", {"V": means[:, None].copy()})
        covered = np.bincount(train.indices, minlength=data.n_items)[coo.col[test]] > 0
        err = means[coo.col[test]] - coo.data[test]
        utility = {
            "rmse": float(np.sqrt(np.mean(err**2))) if test.any() else float("nan"),
            "coverage": float(covered.mean()) if test.any() else float("nan"),
        }
        return RunResult(transcript, means, utility)


def _row(m: sp.csr_matrix, u: int) -> tuple[np.ndarray, np.ndarray]:
    """Row ``u`` of a CSR matrix: its column ids (int64) and values."""
    lo, hi = m.indptr[u], m.indptr[u + 1]
    return m.indices[lo:hi].astype(np.int64), m.data[lo:hi]

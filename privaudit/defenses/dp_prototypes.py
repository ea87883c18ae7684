"""``dp-prototypes``: FedProto's epsilon-DP prototype mechanism (DP-prototypes paper Algorithms 2-6).

The mechanism itself (JL projection, private-partition candidates over shifted grids,
localswap by the exponential mechanism, Gumbel top-s / Laplace sparse recovery, and the split
of epsilon across those steps with the argument that the whole is epsilon-DP, Theorem 3.1)
lives in :mod:`privaudit.models.private_kmeans`; read its docstring for the budget split.

How it plugs into ``fedproto``
------------------------------
A silo's prototype upload (kind ``prototypes``) passes through :meth:`Channel.send`. When the
protocol's prototypes are ``dp`` (``prototypes=auto`` picks ``dp`` whenever this defense is
active), each silo hands the channel its raw rows (``rows``: n_h x m dense float64, with the
public entry bound ``Lambda`` in the batch meta) and this defense's :meth:`process_uploads` replaces
them by k epsilon-DP prototypes (``prototypes``: k x m) before anything leaves the silo — the
server, and the transcript, see only the prototypes. ``k = 0`` (default) takes the protocol's
``k``; ``s = 0`` takes the protocol's public sparsity bound ``s``. ``epsilon`` is the strength
(default grid 10, 1, 0.1: weakest to strongest protection). ``privacy_spent`` is
(epsilon, 0) per upload of a silo, composed over the uploads it counts (FedProto makes one):
pure epsilon-DP per user of the silo under adding or removing that user's whole row -- values
and rated-item set (``neighbour="user"``, ``item_set_covered``); ``replace_epsilon`` = 2 epsilon
if a row is replaced; parallel composition over silos; delta only sets the number of trials and
grids. The noise scales do not depend on the private
cluster sizes: clusters release noisy sums, normalised by the silo's noisy size (see
:mod:`privaudit.models.private_kmeans`, "What n is in Algorithm 3").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from privaudit.defenses.base import ChannelContext, Defense, RoundUploads, UploadBatch
from privaudit.models.private_kmeans import private_prototypes
from privaudit.params import Param
from privaudit.registry import register_defense


@register_defense("dp-prototypes")
class DPPrototypes(Defense):
    """Each silo uploads k epsilon-DP prototypes of its rows instead of anything exact."""

    description = "epsilon-DP prototypes (private k-means of Balcan et al. + Gumbel/Laplace sparse recovery), FedProto"
    parameters = (
        Param("epsilon", 1.0, "total privacy budget of a silo's prototypes (pure epsilon-DP per user)", gt=0),
        Param(
            "delta",
            0.1,
            "sets the trials T = ceil(2 ln(1/delta)), grids and thresholds (utility knob, not a privacy loss)",
            gt=0,
            lt=1,
        ),
        Param("k", 0, "prototypes per silo (0: the protocol's k)", ge=0),
        Param("s", 0, "public bound on non-zeros per row / per prototype (0: the protocol's s)", ge=0),
        Param("trials", 0, "override T (0: ceil(2 ln(1/delta)); the authors' code uses 1)", ge=0),
        Param(
            "swap_iters",
            100,
            "localswap iterations (the paper's n/delta, capped for speed; total budget unchanged)",
            ge=0,
        ),
    )
    strength = "epsilon"
    default_grid = (10.0, 1.0, 0.1)
    applies_to = ("fedproto",)
    acts_on = (("prototypes", "prototypes"),)
    privacy_claim = (
        "add/remove one user's whole row (rated items and values) in a silo: pure epsilon per upload "
        "(2 epsilon if a row is replaced), every upload of a silo composed; the silo sees its rows"
    )

    def prototypes(self, rows: Any, k: int, s: int, Lambda: float, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
        """k (or this defense's k) DP prototypes of ``rows`` (n x m); (k x m) and info."""
        from threadpoolctl import threadpool_limits

        c = self.config
        with threadpool_limits(1):
            res = private_prototypes(
                rows,
                int(c["k"] or k),
                c["epsilon"],
                c["delta"],
                float(Lambda),
                int(c["s"] or s),
                rng,
                trials=c["trials"] or None,
                swap_iters=c["swap_iters"],
            )
        return res.prototypes, res.info

    def validate(self) -> None:
        self._seen: dict[str, int] = {}  # sender -> prototype uploads made
        self._uploads = 0  # the most any silo made

    def process_uploads(
        self, uploads: RoundUploads, ctx: ChannelContext, call_next: Callable[[RoundUploads], RoundUploads]
    ) -> RoundUploads:
        """Replace every silo's ``rows`` by its DP prototypes (one batch at a time)."""
        return call_next(uploads.map(lambda b: self.release(b, ctx)))

    def release(self, batch: UploadBatch, channel: ChannelContext) -> UploadBatch:
        """``batch`` with DP prototypes instead of rows (other batches unchanged)."""
        if batch.kind != "prototypes" or not any("rows" in p for p in batch.payloads):
            return batch
        for sender, p in zip(batch.senders, batch.payloads):
            if "rows" in p:
                self._seen[sender] = self._seen.get(sender, 0) + 1
                self._uploads = max(self._uploads, self._seen[sender])
        k = int(batch.meta.get("k", 10))
        s = int(batch.meta.get("s", 0))
        Lambda = float(batch.meta["Lambda"])
        payloads = []
        for p in batch.payloads:
            if "rows" not in p:
                payloads.append(p)
                continue
            rows = p["rows"]
            P, _ = self.prototypes(rows, k, s or rows.shape[1], Lambda, channel.rng)
            payloads.append({"prototypes": P})
        return dataclasses.replace(
            batch, payloads=payloads, meta={**batch.meta, "dp": True, "epsilon": self.config["epsilon"]}
        )

    def privacy_spent(self, rounds: int) -> dict[str, Any] | None:
        """Pure epsilon per user of a silo: ``epsilon`` per upload, composed over ``rounds`` uploads."""
        eps = float(self.config["epsilon"])
        releases = max(int(rounds), self._uploads, 0)
        total = eps * releases
        return {
            "epsilon": total,
            "delta": 0.0,
            "unit": "one user's row added or removed in a silo",
            "accountant": "basic",
            "epsilon_basic": total,
            "epsilon_per_round": eps,
            "neighbour": "user",
            "item_set_covered": True,
            "releases": releases,
            "replace_epsilon": 2.0 * total,
        }

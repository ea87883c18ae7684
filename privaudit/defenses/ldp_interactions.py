"""``ldp-interactions``: clip and noise every uploaded item row (the LDP defense of Yuan et al.).

Yuan et al., "Interaction-level Membership Inference Attack Against Federated Recommender
Systems" (WWW 2023) defend FedRecs with local differential privacy: each client clips the change
of every item row it uploads to L2 norm ``clip`` = C and adds i.i.d. N(0, sigma^2) noise to
every coordinate before sending it. Here it applies to the rows of ``item_update`` messages
(FedNCF: ``values``, one row per updated item id); other uploads pass unchanged. The authors'
code also clips and noises each row of the network weights' change; this defense leaves
``net_update`` alone (its instance count must stay exact for FedAvg weighting), so it protects
only what :mod:`privaudit.attacks.ncf.interaction_inference` reads. No privacy accounting: the
paper states noise scales, not an epsilon. Noise comes from the channel's simulation generator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from privaudit.defenses.base import ChannelContext, Defense, RoundUploads, UploadBatch
from privaudit.defenses.dp_laplace import clip_rows
from privaudit.params import Param
from privaudit.registry import register_defense

#: message kind whose ``values`` rows are clipped and noised
KIND = "item_update"


@register_defense("ldp-interactions")
class LDPInteractions(Defense):
    """L2-clip every uploaded item row to C and add N(0, sigma^2) per coordinate (module docstring)."""

    description = "LDP of Yuan et al. (WWW 2023): uploaded item-row changes clipped to L2 norm C, N(0, sigma^2) noise"
    parameters = (
        Param(
            "sigma", 0.0, "standard deviation of the Gaussian noise on every coordinate of an uploaded item row", ge=0
        ),
        Param("clip", 1.0, "L2 norm C every uploaded item row is clipped to", gt=0),
    )
    applies_to = ("fedncf",)
    acts_on = ((KIND, "values"),)
    strength = "sigma"
    #: no noise up to a scale past the attack's crossover with the popularity prior at FedNCF's default
    #: lr 0.01 (between 0.1 and 0.3 on the synthetic data); sqrt(1e-3) ~ 0.032 is the authors' code default
    default_grid = (0.0, 0.01, 0.032, 0.1, 0.3, 1.0)

    def process_uploads(
        self, uploads: RoundUploads, ctx: ChannelContext, call_next: Callable[[RoundUploads], RoundUploads]
    ) -> RoundUploads:
        """Clip and noise every uploaded item row (one batch at a time)."""
        return call_next(uploads.map(lambda b: self.perturb(b, ctx)))

    def perturb(self, batch: UploadBatch, channel: ChannelContext) -> UploadBatch:
        """``batch`` with its item rows clipped and noised (other kinds unchanged)."""
        if batch.kind != KIND or not batch.payloads:
            return batch
        sigma, clip = self.config["sigma"], self.config["clip"]
        payloads = []
        for payload in batch.payloads:
            out = dict(payload)
            values = clip_rows(np.asarray(payload["values"], dtype=np.float64), clip, ord=2)
            if sigma > 0 and values.size:
                values += channel.rng.normal(0.0, sigma, values.shape)
            out["values"] = values
            payloads.append(out)
        return dataclasses.replace(batch, payloads=payloads)

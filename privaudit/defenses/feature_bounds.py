"""``feature-bounds``: clients clip the item features and the score offset they receive.

Against active data manipulation (Pham, Kulkarni and Houmansadr, "RAIFLE: Reconstruction
Attacks on Interaction-based Federated Learning with Adversarial Data Manipulation", NDSS 2025;
:mod:`privaudit.attacks.ncf.active_saturation`) a client can refuse features outside public bounds
before it trains on them (capability ``download``): every received item row (FedNCF payload
``items``, m x Dtot) is scaled down to L2 norm ``max_norm`` when longer, and the prediction bias
(payload ``bias``, (1,)) is clamped to [-``max_bias``, ``max_bias``]. -1 switches a bound off.
The bounds are public constants of the protocol (e.g. set from honest training runs); the
server's own copy of the model is not changed, so a clipped client's upload is its change of
the clipped rows.

Within the bounds nothing changes (an honest run whose model stays inside them is
bit-identical). A server that saturates the scores through the bias (``server=saturate``) is
clamped back to an ordinary score range, where every row a client trains moves again; an upper
bound on item rows alone does not stop it (rows of norm 0 are within any upper bound, and the
``keep`` variant sends the global rows unchanged). What the bounds cost honest utility is the
HR@10 lost to clipping rows and bias that honest training would move past them (measured in
docs/active-manipulation.md).

The bias bound does not bound the score: a server can shift every score through any other
parameter that reaches the logit (e.g. one last-layer MLP unit with weights 0, bias +50 and
output weight -1, FedNCF ``craft_via=mlp-unit``). ``max_score`` bounds the score itself: before
training, each member computes its scores of the rows it is about to train under the model it
received and refuses the model (the round aborts, as a round check's) when one exceeds
``max_score``; honest scores stay far below it (docs/malicious-server.md gives the measured
range and the cost).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.defenses.base import DOWNLOAD, ChannelContext, Defense
from privaudit.params import Param
from privaudit.registry import register_defense


@register_defense("feature-bounds")
class FeatureBounds(Defense):
    """Clip received item rows to L2 norm ``max_norm`` and the prediction bias to +-``max_bias``."""

    description = (
        "Clients clip received item rows to a public L2 norm and the prediction bias to a public range "
        "(against crafted features, RAIFLE NDSS 2025)"
    )
    capabilities = frozenset({DOWNLOAD})
    applies_to = ("fedncf",)
    acts_on = (("state", "items"), ("state", "network"))  # the model the clients receive (the bias is in network)
    parameters = (
        Param("max_norm", -1.0, "L2 norm bound on every received item row (-1: no bound)", gt=0, also=(-1.0,)),
        Param("max_bias", 5.0, "bound on the absolute received prediction bias (-1: no bound)", gt=0, also=(-1.0,)),
        Param(
            "max_score",
            -1.0,
            "a member refuses the received model (the round aborts) when its score of a row it is about to train "
            "exceeds this in absolute value (-1: no check)",
            gt=0,
            also=(-1.0,),
        ),
    )
    #: the defense this check protects (the audit stacks it on top by default), per protocol
    protects = {"fedncf": "secagg"}
    strength = "max_bias"
    #: off, then bounds from far above FedNCF's honest bias (about -1 after 5 global rounds) down to it
    default_grid = (-1.0, 20.0, 10.0, 5.0)

    def refuse_scores(self, scores: np.ndarray) -> str | None:
        """Why a cohort refuses the model it received, given the members' scores (logits) of the
        rows they are about to train (None: train). Checked by FedNCF before local training."""
        if self.max_score <= 0 or scores.size == 0:
            return None
        top = float(np.max(np.abs(scores)))
        if top > self.max_score:
            return f"feature-bounds: a received model scores {top:.3g}, beyond max_score {self.max_score:g}"
        return None

    def on_download(self, payload: dict[str, np.ndarray], channel: ChannelContext) -> dict[str, np.ndarray]:
        out: dict[str, Any] = dict(payload)
        if self.max_norm > 0 and "items" in payload:
            items = np.asarray(payload["items"])
            norm = np.linalg.norm(items.astype(np.float64), axis=1)
            over = norm > self.max_norm
            if over.any():
                clipped = np.array(items, copy=True)
                clipped[over] = (items[over] * (self.max_norm / norm[over])[:, None]).astype(items.dtype)
                out["items"] = clipped
        if self.max_bias > 0 and "bias" in payload:
            bias = np.asarray(payload["bias"])
            if np.any(np.abs(bias) > self.max_bias):
                out["bias"] = np.clip(bias, -self.max_bias, self.max_bias).astype(bias.dtype)
        return out

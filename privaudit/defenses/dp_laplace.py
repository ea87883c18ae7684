"""``dp-laplace``: L1 clipping and Laplace noise with pure-epsilon accounting.

The pure-epsilon counterpart of ``dp-gaussian``. In every round each uploaded float array
(every entry named by :meth:`UploadBatch.float_keys`, e.g. ``grad_V.values`` and
``grad_P.values``) is clipped and noised:

- ``clip_per="row"`` (default): every row of a 2-D array (one item's gradient row, one
  attribute row) and every 1-D array as a whole is scaled to L1 norm at most ``clip`` = C;
- ``clip_per="upload"``: all floats of one client's upload (one message) form one vector,
  scaled to L1 norm at most C;

then i.i.d. Laplace(0, C / epsilon) noise is added to every float (the Laplace mechanism for
L1 sensitivity C under add/remove neighbouring, Dwork & Roth 2014, Thm 3.6), with
``epsilon`` the per-round budget.

Accounting (basic sequential composition): a client that took part in T rounds has spent
``privacy_spent(T) = {"epsilon": T * epsilon, "delta": 0}``. With ``clip_per="row"`` this
protects the content of one row (e.g. the gradient of one item); a client's whole upload of
r rows in a round composes to r * epsilon per round — use ``clip_per="upload"`` for a
user-level guarantee of T * epsilon (at a much larger utility cost).

Noise is drawn from the channel's simulation generator in one vectorized draw per batch.
``default_grid`` runs from the weakest to the strongest protection (large to small epsilon).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from privaudit.defenses.base import Defense, UploadBatch
from privaudit.errors import PrivauditError
from privaudit.registry import register_defense

if TYPE_CHECKING:  # pragma: no cover
    from privaudit.protocols.base import Channel


def clip_l1_rows(arr: np.ndarray, clip: float) -> np.ndarray:
    """Rows of a 2-D array (or a 1-D array as a whole; higher dims by leading axis) scaled
    to L1 norm <= ``clip``; float64 copy."""
    a = np.array(arr, dtype=np.float64)
    if a.ndim == 0:
        a = a.reshape(1)
        return np.clip(a, -clip, clip).reshape(())
    if a.size == 0:  # e.g. grad_P of a dataset without user attributes: (0, K)
        return a
    flat = a.reshape(1, -1) if a.ndim == 1 else a.reshape(a.shape[0], -1)
    norms = np.abs(flat).sum(axis=1, keepdims=True)
    factor = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return (flat * factor).reshape(a.shape)


@register_defense("dp-laplace")
class DPLaplace(Defense):
    """L1-clip every upload (per row or per upload) to C and add Laplace(C / epsilon) noise;
    epsilon composes linearly over rounds."""

    description = "epsilon-DP Laplace mechanism: L1 clipping to C, Laplace(C/epsilon) noise, basic composition"
    params = {"epsilon": 1.0, "clip": 1.0, "clip_per": "row"}
    param_help = {
        "epsilon": "per-round privacy budget (pure epsilon-DP per clipped unit)",
        "clip": "L1 clipping norm C (Laplace scale C / epsilon)",
        "clip_per": "'row' (each row / 1-D array) or 'upload' (one client's whole message)",
    }
    strength = "epsilon"
    default_grid = (100.0, 30.0, 10.0, 3.0, 1.0, 0.3)

    def validate(self) -> None:
        eps, clip = self.config["epsilon"], self.config["clip"]
        for name, v in (("epsilon", eps), ("clip", clip)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise PrivauditError(f"defense 'dp-laplace': {name} must be a positive number, got {v!r}")
        self.config["epsilon"], self.config["clip"] = float(eps), float(clip)
        if self.config["clip_per"] not in ("row", "upload"):
            raise PrivauditError(f"defense 'dp-laplace': clip_per must be 'row' or 'upload', got {self.config['clip_per']!r}")

    @property
    def noise_scale(self) -> float:
        """Laplace scale b = C / epsilon."""
        return self.config["clip"] / self.config["epsilon"]

    def _clip_payload(self, payload: dict, keys: list[str]) -> dict:
        out = dict(payload)
        clip = self.config["clip"]
        if self.config["clip_per"] == "row":
            for key in keys:
                out[key] = clip_l1_rows(payload[key], clip)
            return out
        arrays = [np.asarray(payload[k], dtype=np.float64) for k in keys]
        total = sum(float(np.abs(a).sum()) for a in arrays)
        factor = min(1.0, clip / total) if total > 0 else 1.0
        for key, a in zip(keys, arrays):
            out[key] = a * factor
        return out

    def on_upload(self, batch: UploadBatch, channel: "Channel") -> UploadBatch:
        if not batch.payloads:
            return batch
        payloads = []
        slots: list[tuple[int, str]] = []
        for j, payload in enumerate(batch.payloads):
            keys = batch.float_keys(payload)
            payloads.append(self._clip_payload(payload, keys))
            slots += [(j, k) for k in keys]
        total = sum(np.asarray(payloads[j][k]).size for j, k in slots)
        if total == 0:
            return dataclasses.replace(batch, payloads=payloads)
        noise = channel.rng.laplace(0.0, self.noise_scale, total)
        offset = 0
        for j, key in slots:
            arr = np.asarray(payloads[j][key], dtype=np.float64)
            payloads[j][key] = arr + noise[offset : offset + arr.size].reshape(arr.shape)
            offset += arr.size
        return dataclasses.replace(batch, payloads=payloads)

    def privacy_spent(self, rounds: int) -> dict[str, float]:
        """Basic composition: ``rounds * epsilon`` (delta 0) per clipped unit."""
        return {"epsilon": float(rounds) * self.config["epsilon"], "delta": 0.0, "epsilon_round": self.config["epsilon"]}

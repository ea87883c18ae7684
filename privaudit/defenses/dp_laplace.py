"""``dp-laplace``: L1 clipping and Laplace noise, accounted by basic composition and PLD.

In every round each uploaded float array (every entry named by :meth:`UploadBatch.float_keys`,
e.g. ``grad_V.values`` and ``grad_P.values``) is clipped and noised:

- ``clip_per="row"`` (default): every row of a 2-D array (one item's gradient row, one
  attribute row) and every 1-D array as a whole is scaled to L1 norm at most ``clip`` = C;
- ``clip_per="upload"``: all floats of one client's upload (one message) form one vector,
  scaled to L1 norm at most C;

then i.i.d. Laplace(0, C / epsilon) noise is added to every float (the Laplace mechanism for
L1 sensitivity C under add/remove neighbouring, Dwork & Roth 2014, Thm 3.6), with
``epsilon`` the per-round budget.

Accounting (:meth:`DPLaplace.privacy_spent`, :mod:`privaudit.defenses.accounting`): over T
rounds basic composition gives ``T * epsilon`` (delta 0, tight for pure DP); with ``delta > 0``
the PLD accountant gives a smaller epsilon at that delta. With ``clip_per="row"`` the unit
protected is one row (one rating's item-gradient row, or one attribute row) in every round;
a client's whole upload of r rows composes to r * epsilon per round -- ``clip_per="upload"``
protects one user's upload.

``target_epsilon > 0`` calibrates the per-round epsilon so that the total over the run (by the
accountant in use) equals it. The run's round count is ``rounds`` if given, else the protocol's
public ``epochs``/``rounds``/``global_rounds``/``n_rounds``, read from the transcript's public
config at the first upload; the calibrated epsilon is then written into this defense's entry of
that public config (what an attacker knows).

Noise is drawn from the channel's simulation generator in one vectorized draw per batch.
``default_grid`` runs from the weakest to the strongest protection (large to small epsilon).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from privaudit.defenses import accounting
from privaudit.defenses.base import ChannelContext, Defense, UploadBatch
from privaudit.errors import PrivauditError
from privaudit.params import Param
from privaudit.registry import register_defense

#: how a clip-then-noise defense clips: each row (or 1-D array), or a client's whole upload
CLIP_PER = ("row", "upload")

#: delta at which privacy_spent also reports the PLD epsilon when the defense's own delta is 0
REFERENCE_DELTA = 1e-5


def clip_rows(arr: np.ndarray, clip: float, ord: int = 1) -> np.ndarray:
    """Rows of a 2-D array (or a 1-D array as a whole; higher dims by leading axis) scaled
    to L``ord`` norm <= ``clip``; float64 copy."""
    a = np.array(arr, dtype=np.float64)
    if a.ndim == 0:
        a = a.reshape(1)
        return np.clip(a, -clip, clip).reshape(())
    if a.size == 0:  # e.g. grad_P of a dataset without user attributes: (0, K)
        return a
    flat = a.reshape(1, -1) if a.ndim == 1 else a.reshape(a.shape[0], -1)
    norms = np.abs(flat).sum(axis=1, keepdims=True) if ord == 1 else np.linalg.norm(flat, axis=1, keepdims=True)
    factor = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return (flat * factor).reshape(a.shape)


def clip_l1_rows(arr: np.ndarray, clip: float) -> np.ndarray:
    """:func:`clip_rows` in the L1 norm."""
    return clip_rows(arr, clip, 1)


class ClippedNoise(Defense):
    """Shared machinery of the clip-then-noise DP defenses (subclasses: norm, noise, accounting)."""

    clip_ord: int = 1
    #: the parameter :meth:`calibrate` solves for, and whether the total epsilon grows with it
    calibrated: str = "epsilon"
    calibrated_increasing: bool = True
    #: the interval searched for the calibrated parameter
    calibration_range: tuple[float, float] = (1e-4, 1e3)

    def validate(self) -> None:
        """Bounds and choices come from the declaration; a target epsilon with a known round
        count is calibrated at once (otherwise at the first upload)."""
        if self.config["target_epsilon"] and self.config["rounds"]:
            self.calibrate(self.config["rounds"])

    def _clip_payload(self, payload: dict, keys: list[str]) -> dict:
        out = dict(payload)
        clip = self.config["clip"]
        if self.config["clip_per"] == "row":
            for key in keys:
                out[key] = clip_rows(payload[key], clip, self.clip_ord)
            return out
        arrays = [np.asarray(payload[k], dtype=np.float64) for k in keys]
        if self.clip_ord == 1:
            total = sum(float(np.abs(a).sum()) for a in arrays)
        else:
            total = math.sqrt(sum(float(np.sum(a * a)) for a in arrays))
        factor = min(1.0, clip / total) if total > 0 else 1.0
        for key, a in zip(keys, arrays):
            out[key] = a * factor
        return out

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        raise NotImplementedError

    def on_upload(self, batch: UploadBatch, channel: ChannelContext) -> UploadBatch:
        if self.config.get("target_epsilon"):
            self._calibrate_from(channel)
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
        noise = self.draw(channel.rng, total)
        offset = 0
        for j, key in slots:
            arr = np.asarray(payloads[j][key], dtype=np.float64)
            payloads[j][key] = arr + noise[offset : offset + arr.size].reshape(arr.shape)
            offset += arr.size
        return dataclasses.replace(batch, payloads=payloads)

    # ------------------------------------------------------------------ target epsilon
    def total_epsilon(self, value: float, rounds: int) -> float:
        """Total epsilon over ``rounds`` with the calibrated parameter at ``value``."""
        raise NotImplementedError

    def calibrate(self, rounds: int) -> None:
        """Set the calibrated parameter so that the total epsilon over ``rounds`` is ``target_epsilon``."""
        if rounds <= 0:
            raise PrivauditError(f"defense {self.name!r}: target_epsilon needs the number of rounds (set rounds=N)")
        target = float(self.config["target_epsilon"])
        lo, hi = self.calibration_range
        value = accounting.calibrate(
            lambda x: self.total_epsilon(x, rounds), target, lo, hi, self.calibrated_increasing
        )
        self.config[self.calibrated] = value
        self._calibrated_rounds = rounds

    def _calibrate_from(self, channel: ChannelContext) -> None:
        if getattr(self, "_calibrated_rounds", None):
            return
        public = channel.transcript.config
        rounds = int(self.config.get("rounds") or 0) or accounting.rounds_of(public)
        before = {"name": self.name, **{k: v for k, v in self.config.items()}}
        self.calibrate(rounds)
        for entry in public.get("defenses", []) or []:  # the public record an attacker reads
            if isinstance(entry, dict) and entry == before:
                entry[self.calibrated] = self.config[self.calibrated]
                break


@register_defense("dp-laplace")
class DPLaplace(ClippedNoise):
    """L1-clip every upload (per row or per upload) to C and add Laplace(C / epsilon) noise;
    basic composition and PLD accounting."""

    description = "epsilon-DP Laplace mechanism: L1 clipping to C, Laplace(C/epsilon) noise, basic composition and PLD"
    parameters = (
        Param("epsilon", 1.0, "per-round privacy budget (pure epsilon-DP per clipped unit)", gt=0),
        Param("clip", 1.0, "L1 clipping norm C (Laplace scale C / epsilon)", gt=0),
        Param(
            "clip_per", "row", "'row' (each row / 1-D array) or 'upload' (one client's whole message)", choices=CLIP_PER
        ),
        Param(
            "delta",
            0.0,
            "0: report pure epsilon by basic composition; > 0: the PLD accountant's epsilon at this delta",
            ge=0,
            lt=1,
        ),
        Param("target_epsilon", 0.0, "> 0: calibrate epsilon per round so that the total over the run is this", ge=0),
        Param("rounds", 0, "rounds of the run for target_epsilon (0: the protocol's public epochs/rounds)", ge=0),
    )
    strength = "epsilon"
    default_grid = (100.0, 30.0, 10.0, 3.0, 1.0, 0.3)
    clip_ord = 1

    @property
    def noise_scale(self) -> float:
        """Laplace scale b = C / epsilon."""
        return self.config["clip"] / self.config["epsilon"]

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.laplace(0.0, self.noise_scale, size)

    def total_epsilon(self, value: float, rounds: int) -> float:
        return accounting.laplace_epsilon(value, rounds, self.config["delta"])

    @property
    def unit(self) -> str:
        return "one rating row" if self.config["clip_per"] == "row" else "one user's upload"

    def privacy_spent(self, rounds: int) -> dict[str, Any]:
        """Total epsilon over ``rounds`` rounds: ``epsilon`` by the tightest accountant at this
        defense's ``delta`` (basic composition when delta = 0), ``epsilon_basic`` = rounds x
        epsilon, ``epsilon_pld`` the PLD epsilon at ``delta_pld`` (the defense's delta, or
        :data:`REFERENCE_DELTA` when it is 0)."""
        eps, delta = self.config["epsilon"], self.config["delta"]
        basic = float(rounds) * eps
        delta_pld = delta if delta > 0 else REFERENCE_DELTA
        pld = accounting.laplace_epsilon(eps, rounds, delta_pld)
        return {
            "epsilon": pld if delta > 0 else basic,
            "delta": delta,
            "unit": self.unit,
            "accountant": "pld" if delta > 0 else "basic",
            "epsilon_basic": basic,
            "epsilon_per_round": eps,
            "epsilon_pld": pld,
            "delta_pld": delta_pld,
        }

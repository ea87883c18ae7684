"""PrivMVMF (PrivMVMF paper §5, Algorithm 2) = FedMVMF + ``paillier`` + ``sampling``.

The training algorithm, data split, public config, message kinds and utility are exactly
FedMVMF's (:mod:`privaudit.protocols.fedmvmf`, SemiALS by default as in the paper); what
changes is the channel:

- ``sampling`` (filling ``weight``): every client trains on and uploads its rated items plus
  round(rho x |rated|) random unrated items with rating 0 and confidence ``w`` (eq. 36); the
  sampling weight is the protocol's ``w`` unless the defense sets its own;
- ``paillier``: uploads are encrypted (fixed-point, packed), the server adds ciphertexts per
  item / P entry and decrypting clients return only the sums (eq. 37).

:meth:`PrivMVMF.prepare_defenses` adds a default ``sampling`` and/or ``paillier`` defense when the caller
gave none of that kind (``rho=1``; ``key_length=2048, obfuscation=djn``); other defenses (noise,
...) are kept and applied before encryption in the order given. Departure: the paper's Table 2
values of rho and the key length were lost in extraction; rho = 1 and 2048 bits are this
toolkit's defaults. Departure: the default Paillier obfuscator is Damgård–Jurik–Nielsen's
``h_s^r`` with a short random exponent (same ciphertexts and decryption as Paillier's ``r^n``;
security under DCR plus the short-exponent assumption, see :mod:`privaudit.defenses.paillier`),
much faster to encrypt (docs/scale.md, "Fast Paillier"); ``--defense paillier`` gives the paper's ``r^n``.
What the server sees, and so every attack result, does not depend on the obfuscator.

Departure: the default ``sampling`` draws unrated items with ``distribution=matched`` (item j
sampled by ~rho x its raters within each activity group), not uniformly as in the paper: with
uniform sampling a server that ranks each client's uploaded items by how many clients uploaded
them (the item ids are in the clear) picks rated items far above the paper's 1/(1+rho); with
matched sampling item-only observers stay near it, at a small NDCG@10 cost for cold-start users
and items (figures: docs/reproduction.md, "Sampling: what the item sets leak"). Matched sampling
needs the per-item rating counts as an aggregate (one extra Paillier sum before training, see
:mod:`privaudit.defenses.sampling`); ``--defense sampling`` gives the paper's uniform sampling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from privaudit.defenses.base import CLIENT_DATA, Defense
from privaudit.params import parse_spec
from privaudit.protocols.fedmvmf import FedMVMF
from privaudit.registry import get, register_protocol

#: sampling distribution of the default ``sampling`` defense (the defense's own default, the
#: papers', stays ``uniform``); see the module docstring
DEFAULT_DISTRIBUTION = "matched"
#: obfuscator of the default ``paillier`` defense (the defense's own default stays ``standard``)
DEFAULT_OBFUSCATION = "djn"


def privmvmf_defenses(defenses: Sequence[Defense], w: float) -> list[Defense]:
    """``defenses`` with a default ``sampling`` first and ``paillier`` last when absent.

    Decided by capability, not by name: without a ``client-data`` defense the default
    ``sampling`` (``rho=1, distribution=matched``, :data:`DEFAULT_DISTRIBUTION`) is added first;
    without a defense that hides plaintext the default ``paillier`` is added; defenses that hide
    plaintext go last (everything after encryption would see ciphertexts), in the order given.
    Every defense gets the protocol's ``w`` where it leaves it unset
    (:meth:`Defense.with_protocol_defaults`; a copy is made).
    """
    out: list[Defense] = []
    if not any(CLIENT_DATA in d.capabilities for d in defenses):
        out.append(get("defense", "sampling")(w=w, distribution=DEFAULT_DISTRIBUTION))
    out += [d.with_protocol_defaults({"w": w}) for d in defenses]
    if not any(d.hides_plaintext() for d in out):
        out.append(get("defense", "paillier")(obfuscation=DEFAULT_OBFUSCATION))
    return [d for d in out if not d.hides_plaintext()] + [d for d in out if d.hides_plaintext()]


@register_protocol("privmvmf")
class PrivMVMF(FedMVMF):
    """FedMVMF (SemiALS) with Paillier-encrypted uploads, decrypting clients and unrated-item sampling."""

    description = "PrivMVMF (PrivMVMF paper §5): FedMVMF SemiALS + paillier encryption + unrated-item sampling"
    schema = FedMVMF.schema  # FedMVMF's messages (paillier's key and sum messages are the defense's)
    default_attack = "mvmf-aggregate"
    # 2 epochs (FedMVMF: 40) and 10 users by default keep a 2048-bit run short;
    # the paper's setting: --set epochs=40 and --users N (an estimate is printed above 2 minutes)
    parameters = tuple(dataclasses.replace(p, default=2) if p.name == "epochs" else p for p in FedMVMF.parameters)
    default_users: int | None = 10
    default_defense_specs: tuple[str, ...] = (f"sampling:distribution={DEFAULT_DISTRIBUTION}",)
    default_sweep_spec: str | None = "sampling.rho=0,1"

    #: CPU seconds per user, epoch and uploaded item list (1 + rho) with a 2048-bit key, by
    #: obfuscator (calibration: docs/scale.md, "PrivMVMF run-time estimate"); the cost grows
    #: about with the cube of the key length
    SECONDS_PER_USER_EPOCH = {"standard": 0.25, "djn": 0.04}

    @classmethod
    def estimate_seconds(cls, n_users: int, sets: Mapping[str, Any], defenses: Sequence[str] = ()) -> float:
        """Rough CPU seconds of one run (printed by the CLI when a sweep would take > 2 minutes),
        from the key length, obfuscator and rho of the defenses the run would use
        (:func:`privmvmf_defenses` of the given ``--defense`` specs)."""
        cfg = cls.resolve_config(sets)
        given = [get("defense", name)(**params) for name, params in (parse_spec(str(d), "--defense") for d in defenses)]
        used = {d.name: d.config for d in privmvmf_defenses(given, float(cfg["w"]))}
        paillier, sampling = used.get("paillier", {}), used.get("sampling", {})
        key = int(paillier.get("key_length", 2048))
        per = cls.SECONDS_PER_USER_EPOCH.get(paillier.get("obfuscation"), cls.SECONDS_PER_USER_EPOCH["standard"])
        rho = float(sampling.get("rho", 0.0))
        return per * n_users * cfg["epochs"] * (1.0 + rho) * (key / 2048) ** 3

    def prepare_defenses(self, config: Mapping[str, Any], defenses: list[Defense]) -> list[Defense]:
        """The PrivMVMF defenses (see the module docstring and :func:`privmvmf_defenses`)."""
        return privmvmf_defenses(defenses, float(config["w"]))

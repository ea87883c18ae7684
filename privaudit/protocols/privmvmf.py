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

Malicious server (``server``, default ``honest``: the run is bit-identical to one without the
setting; docs/malicious-server.md). In the protocol as implemented the server sends each
decrypting client a ``ciphertext_sum`` (item rows or a dense entry) and gets its plaintext
back; a Paillier ciphertext of one upload is indistinguishable from a product of many, and the
decryptor checks nothing else, so it decrypts whatever the server sends. ``server=isolate``:
in the ``deviation_rounds`` rounds after ``deviation_start``, the server aggregates and has
decrypted the real sums as usual (training is unchanged) and also sends a decryptor the
``target``'s ``grad_V`` and ``grad_P`` ciphertexts alone as a "sum" (cohort -1); the
plaintext that comes back is the target's upload. The server records the deviation on the
round's ``state`` message and on its ``ciphertext_sum`` requests (meta ``deviation``,
``target``); the decryptor's ``plaintext_sum`` echoes the request's cohort label (-1). A
round-check defense with :meth:`check_decryption` (``model-consistency``: members post digests
of their ciphertexts to a bulletin and decryptors decrypt only the sum of a posted cohort)
makes the decryptor refuse the request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from privaudit.defenses.base import CLIENT_DATA, Defense, UploadBatch
from privaudit.errors import PrivauditError
from privaudit.params import Param, parse_spec
from privaudit.protocols.base import Channel, RunSetup
from privaudit.protocols.fedmvmf import FedMVMF
from privaudit.registry import get, register_protocol
from privaudit.transcript import Transcript, is_client

#: sampling distribution of the default ``sampling`` defense (the defense's own default, the
#: papers', stays ``uniform``); see the module docstring
DEFAULT_DISTRIBUTION = "matched"
#: obfuscator of the default ``paillier`` defense (the defense's own default stays ``standard``)
DEFAULT_OBFUSCATION = "djn"
#: the ``server`` plans: honest, or isolate (the target's ciphertexts decrypted alone)
SERVER_PLANS = ("honest", "isolate")
#: cohort label of the isolated decryption request (the honest cohorts are 0, 1, ...)
ISOLATED_COHORT = -1


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
    size = max(int((getattr(d, "config", {}) or {}).get("cohort_size", 0) or 0) for d in out if d.hides_plaintext())
    for d in out:  # a minimum posted cohort (model-consistency min_cohort) refuses smaller cohorts
        refuse = getattr(d, "refuse_cohort_size", None)
        why = refuse(size) if refuse is not None else None
        if why:
            raise PrivauditError(f"protocol 'privmvmf': {why}")
    return [d for d in out if not d.hides_plaintext()] + [d for d in out if d.hides_plaintext()]


@register_protocol("privmvmf")
class PrivMVMF(FedMVMF):
    """FedMVMF (SemiALS) with Paillier-encrypted uploads, decrypting clients and unrated-item sampling."""

    description = "PrivMVMF (PrivMVMF paper §5): FedMVMF SemiALS + paillier encryption + unrated-item sampling"
    schema = FedMVMF.schema  # FedMVMF's messages (paillier's key and sum messages are the defense's)
    block_round = None  # its clients encrypt every upload: no sharded run (FedMVMF's blocks are plaintext)
    default_attack = "mvmf-aggregate"
    # 2 epochs (FedMVMF: 40) and 10 users by default keep a 2048-bit run short;
    # the paper's setting: --set epochs=40 and --users N (an estimate is printed above 2 minutes)
    parameters = tuple(dataclasses.replace(p, default=2) if p.name == "epochs" else p for p in FedMVMF.parameters) + (
        Param(
            "server",
            "honest",
            "honest, or a malicious server's plan: isolate (a decryptor is sent the target's ciphertexts alone)",
            choices=SERVER_PLANS,
        ),
        Param("deviation_rounds", 1, "malicious server: rounds it deviates in (record_rounds must cover them)", ge=1),
        Param("deviation_start", 0, "malicious server: honest rounds before the deviation rounds", ge=0),
        Param("target", -1, "malicious server: the target's client number (-1: a random client)", ge=-1),
    )
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

    @classmethod
    def check_stack(cls, defenses: Sequence[Defense]) -> None:
        """:func:`privmvmf_defenses` at the default ``w``: a posted cohort below a member's
        minimum (model-consistency ``min_cohort``) is refused before any compute."""
        privmvmf_defenses(defenses, float(cls.resolve_config({})["w"]))

    def prepare_defenses(self, config: Mapping[str, Any], defenses: list[Defense]) -> list[Defense]:
        """The PrivMVMF defenses (see the module docstring and :func:`privmvmf_defenses`)."""
        return privmvmf_defenses(defenses, float(config["w"]))

    @classmethod
    def validate_config(cls, config: dict[str, Any]) -> None:
        super().validate_config(config)
        if config["server"] == "honest":
            return
        end = config["deviation_start"] + config["deviation_rounds"]
        if end > config["epochs"]:
            cls.config_fail(f"deviation_start + deviation_rounds = {end} exceeds epochs = {config['epochs']}")
        if 0 <= config["record_rounds"] < end:
            cls.config_fail(f"record_rounds = {config['record_rounds']} must cover the deviation rounds (>= {end})")

    def start(
        self, setup: RunSetup, parties: Sequence[str], private: Any, channel_rng: np.random.Generator, /, **public: Any
    ) -> tuple[Transcript, Channel]:
        """:meth:`Protocol.start`; with a malicious ``server`` plan, the target is drawn (from its
        own stream: the honest streams are unchanged), recorded in the public config
        (``target``), and the uplink is an :class:`IsolatingServer`."""
        cfg = setup.config
        if cfg["server"] == "honest":
            return super().start(setup, parties, private, channel_rng, **public)
        n = sum(1 for p in parties if is_client(p))
        target = int(cfg["target"])
        if target < 0:
            target = int(np.random.default_rng(np.random.SeedSequence(setup.seed).spawn(4)[3]).integers(n))
        elif target >= n:
            raise PrivauditError(f"protocol 'privmvmf': target {target} is not a training client (0..{n - 1})")
        transcript, channel = super().start(setup, parties, private, channel_rng, **public, target=target)
        start = int(cfg["deviation_start"])
        rounds = range(start, start + int(cfg["deviation_rounds"]))
        return transcript, IsolatingServer(channel.defenses, transcript, channel.rng, target, rounds)

    def epoch(self, run: Any, clients: Any, t: int, with_loss: bool = True) -> float:
        """FedMVMF's epoch; in a deviation round the server's ``state`` message records the deviation."""
        channel = run.channel
        if isinstance(channel, IsolatingServer) and t in channel.rounds:
            run = dataclasses.replace(run, transcript=_Tagged(run.transcript, channel.deviation, ("state",)))
        return super().epoch(run, clients, t, with_loss)


class _Tagged:
    """A transcript that adds ``meta`` to the messages of ``kinds`` the ``server`` sends; with
    ``isolated``, the cohort label of every ``ciphertext_sum`` / ``plaintext_sum`` is
    :data:`ISOLATED_COHORT`."""

    def __init__(self, transcript: Any, meta: Mapping[str, Any], kinds: tuple[str, ...], isolated: bool = False):
        self._transcript, self._meta, self._kinds, self._isolated = transcript, dict(meta), kinds, isolated

    def add(
        self,
        round: int,
        sender: str,
        receiver: str,
        kind: str,
        payload: Mapping[str, np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Any:
        meta = dict(meta or {})
        if self._isolated and kind in ("ciphertext_sum", "plaintext_sum"):
            meta["cohort"] = ISOLATED_COHORT
        if sender == "server" and kind in self._kinds:
            meta.update(self._meta)
        return self._transcript.add(round, sender, receiver, kind, payload, meta)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transcript, name)


class IsolatingServer(Channel):
    """The uplink of a server with plan ``isolate`` (module docstring): every sum as the honest
    server computes it; in ``rounds``, the ``target``'s ``grad_V`` / ``grad_P`` ciphertexts are
    then also sent alone to a decryptor, unless a defense's ``check_decryption`` refuses."""

    def __init__(
        self, defenses: Sequence[Defense], transcript: Transcript, rng: np.random.Generator, target: int, rounds: range
    ):
        super().__init__(defenses, transcript, rng)
        self.target_id, self.target, self.rounds = int(target), f"client:{int(target)}", rounds
        #: what the server records on its own messages of a deviation round
        self.deviation = {"deviation": "isolate", "target": self.target_id}

    def sum(self, batch: UploadBatch, rows: int | None = None, index_key: str = "items") -> dict[str, np.ndarray]:
        total = super().sum(batch, rows, index_key)
        if batch.round in self.rounds and batch.kind in ("grad_V", "grad_P") and self.target in batch.senders:
            self._isolate(batch, rows)
        return total

    def _isolate(self, batch: UploadBatch, rows: int | None) -> None:
        crypto = next((d for d in reversed(self.defenses) if d.hides_plaintext()), None)
        if crypto is None:
            return  # plaintext uploads: nothing to ask a decryptor
        members = [self.target]
        split = getattr(crypto, "_cohorts", None)  # the cohorts the server sums (posted to a bulletin)
        parts = split(len(batch.senders)) if split is not None else [range(len(batch.senders))]
        posted = [[batch.senders[i] for i in part] for part in parts]
        for d in self.defenses:
            check = getattr(d, "check_decryption", None)
            if check is not None and check(batch.round, batch.kind, members, posted) is not None:
                return  # the decryptor refuses: the server learns nothing more
        k = batch.senders.index(self.target)
        alone = dataclasses.replace(batch, senders=members, payloads=[batch.payloads[k]])
        tagged = _Tagged(self.transcript, self.deviation, ("ciphertext_sum",), isolated=True)
        if batch.receiver_sum is not None:  # the encrypting defense's sum (homomorphic, then decrypted)
            batch.receiver_sum(alone, SimpleNamespace(transcript=tagged, rng=self.rng, model=self.model), rows)

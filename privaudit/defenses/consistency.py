"""Countermeasures against a malicious server that defeats secure aggregation.

Secure aggregation hides each upload only from a server that follows the protocol. A server
may instead send the members of a cohort different models, so that all but a target upload
nothing (Pasquini, Francati and Ateniese, "Eluding Secure Aggregation in Federated Learning via
Model Inconsistency", ACM CCS 2022), or fill the target's cohort with sybil clients it runs.
Two checks the clients run before they upload (capability ``round-check``):

``model-consistency``: every member posts a digest (``digest``, SHA-256 by default) of the model it received to a
public bulletin (or an all-to-all exchange) and the round aborts, with no upload, unless all
digests agree. The server learns nothing from an aborted round. Under PrivMVMF (Paillier
aggregation, decrypting clients) the same bulletin carries each cohort's member list (committed
by the server before the round) and a digest of every member's ciphertexts; a decryptor
decrypts a ``ciphertext_sum`` only when it is the homomorphic sum of the ciphertexts of every
member of one posted cohort (it recomputes the product from the posted ciphertexts, one modular
multiplication per ciphertext, as the server did). A server asking for the decryption of one
client's ciphertexts alone (``privmvmf`` ``server=isolate``) is refused
(:meth:`ModelConsistency.check_decryption`).

Posted cohorts must hold at least ``min_cohort`` members (default 5): a digest check passes on a
cohort of one, and a server that posts one-client cohorts (``paillier:cohort_size=1``) or
one-client FedNCF rounds gets each client's upload as the "sum" of a consistent cohort. So a
FedNCF round of fewer members aborts, a decryptor refuses a sum over fewer members, and a
PrivMVMF run whose server is configured to post smaller cohorts is refused before it starts
(:meth:`ModelConsistency.refuse_cohort_size`). The check does not see a cohort's composition:
sybils the server runs pass it (``verified-cohort`` counts only verified members), and a
consistent crafted model passes it (``feature-bounds``).

``verified-cohort``: the round aborts unless at least ``min_clients`` members are verified
clients (enrolled through an identity the server cannot forge, e.g. a device attestation);
sybils are not verified. A server that still wants the round must put ``min_clients`` honest
clients in the aggregate (at most clients_per_round - min_clients sybils). Honest rounds of a
cohort smaller than ``min_clients`` (the last cohort of a pass) abort too.

Neither check changes an honest run's uploads: both only add an abort before upload.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from privaudit.defenses.base import ROUND_CHECK, Defense
from privaudit.params import Param
from privaudit.registry import register_defense

DIGESTS = ("sha256", "sha3_256", "blake2b")


@register_defense("model-consistency")
class ModelConsistency(Defense):
    """Clients compare digests of the model they received and abort the round if they differ."""

    description = (
        "Clients compare digests of the received model on a bulletin; differing models abort the round "
        "(PrivMVMF: decryptors decrypt only posted cohorts' sums)"
    )
    capabilities = frozenset({ROUND_CHECK})
    applies_to = ("fedncf", "privmvmf")
    #: fedncf: a round's uploads, withheld on abort; privmvmf: the encrypted uploads whose sums decryptors check
    acts_on = (("item_update", "*"), ("net_update", "*"), ("grad_V", "*"), ("grad_P", "*"))
    parameters = (
        Param("digest", "sha256", "hash of the received model posted to the bulletin", choices=DIGESTS),
        Param(
            "min_cohort",
            5,
            "members a posted cohort must hold: smaller FedNCF rounds abort, smaller PrivMVMF sums are not decrypted",
            ge=1,
        ),
    )
    #: the defense this check protects (the audit stacks it on top by default), per protocol
    protects = {"fedncf": "secagg"}

    def abort_reason(self, round: int, members: list[str], models: list[bytes], verified: Any) -> str | None:
        if len(members) < self.min_cohort:
            return f"model-consistency: {len(members)} members, fewer than min_cohort {self.min_cohort}"
        by_object: dict[int, str] = {}  # members handed the same object hash it once
        for model in models:
            if id(model) not in by_object:
                by_object[id(model)] = hashlib.new(self.digest, model).hexdigest()
        digests = [by_object[id(model)] for model in models]
        distinct = len(set(digests))
        if distinct > 1:
            return f"model-consistency: {distinct} different model digests among {len(members)} members"
        return None

    def check_decryption(self, round: int, kind: str, members: list[str], cohorts: list[list[str]]) -> str | None:
        """A decryptor's check of a requested sum over ``members`` against the ``cohorts`` posted
        to the bulletin for the round's ``kind`` uploads: None (decrypt) when the members are
        exactly one posted cohort, else the reason it refuses."""
        wanted = sorted(members)
        if len(wanted) < self.min_cohort:
            return (
                f"model-consistency: a {kind} sum over {len(members)} member(s) is below min_cohort "
                f"{self.min_cohort} (round {round})"
            )
        if any(sorted(c) == wanted for c in cohorts):
            return None
        return f"model-consistency: a {kind} sum over {len(members)} member(s) is no posted cohort's (round {round})"

    def refuse_cohort_size(self, cohort_size: int) -> str | None:
        """Why the members refuse a server configured to post cohorts of ``cohort_size`` (> 0)
        clients (None when it is at least ``min_cohort``)."""
        if 0 < cohort_size < self.min_cohort:
            return (
                f"model-consistency refuses posted cohorts of {cohort_size} client(s), below min_cohort "
                f"{self.min_cohort}: the decryptors would decrypt single clients' uploads"
            )
        return None


@register_defense("verified-cohort")
class VerifiedCohort(Defense):
    """Clients abort a round whose cohort holds fewer than ``min_clients`` verified clients."""

    description = "Clients abort a round with fewer than min_clients verified (non-sybil) members"
    capabilities = frozenset({ROUND_CHECK})
    applies_to = ("fedncf",)
    acts_on = (("item_update", "*"), ("net_update", "*"))  # a round's uploads, withheld on abort
    parameters = (Param("min_clients", 2, "verified (non-sybil) clients a cohort must hold", ge=1),)
    protects = {"fedncf": "secagg"}

    def abort_reason(self, round: int, members: list[str], models: list[bytes], verified: Any) -> str | None:
        n = int(np.count_nonzero(np.asarray(verified, dtype=bool)))
        if n < self.min_clients:
            return f"verified-cohort: {n} verified members, fewer than min_clients {self.min_clients}"
        return None

"""Small stand-in protocol, attacks and defenses for the experiment, report and CLI tests.

They are registered only inside the :func:`dummy_registry` fixture (and unregistered after),
so they never show up in ``privaudit list`` for other tests. Protocol ``dummy-proto``: each
client holds ``p`` secret bits and uploads ``signal * (2 bit - 1)`` per bit for ``rounds``
rounds; attack ``dummy-attack`` guesses bit = upload > threshold (so its accuracy falls from
1 to ~0.5 as Laplace noise grows); ``dummy-aux-attack`` is told a fraction of the bits
(``aux_fraction``, swept by default) and guesses the rest at random.
"""

from __future__ import annotations

import numpy as np
import pytest

from privaudit import registry
from privaudit.attacks.base import Attack, Reconstruction
from privaudit.data.dataset import RatingsDataset
from privaudit.defenses.base import Defense, UploadBatch
from privaudit.params import Param
from privaudit.protocols.base import Protocol, RunResult
from privaudit.schema import MessageSchema, PayloadField, ProtocolSchema


def tiny_dataset(n_users: int = 30, n_items: int = 12, seed: int = 0) -> RatingsDataset:
    rng = np.random.default_rng(seed)
    users, items, ratings = [], [], []
    for u in range(n_users):
        chosen = rng.choice(n_items, size=5, replace=False)
        users += [u] * 5
        items += chosen.tolist()
        ratings += rng.integers(1, 6, size=5).tolist()
    return RatingsDataset.from_triples(np.array(users), np.array(items), np.array(ratings, float), name="tiny")


def write_csv(path, n_users: int = 30) -> str:
    ds = tiny_dataset(n_users)
    coo = ds.ratings.tocoo()
    lines = [f"{ds.user_ids[r]},{ds.item_ids[c]},{v:g}" for r, c, v in zip(coo.row, coo.col, coo.data)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


class DummyProtocol(Protocol):
    """Clients upload their secret bits as +-signal."""

    description = "test protocol: clients upload +-signal per secret bit"
    parameters = (
        Param("p", 4, "secret bits per client", ge=1),
        Param("rounds", 2, "upload rounds", ge=1),
        Param("signal", 1.0, "magnitude of an upload", ge=0),
    )
    default_attack = "dummy-attack"
    schema = ProtocolSchema(
        config_keys=("p",),
        dims={"p": "p"},
        messages=(
            MessageSchema("private", "client", "self", (PayloadField("bits", "float", ("p",), value_range=(0, 1)),)),
            MessageSchema("upload", "client", "server", (PayloadField("values", "float", ("p",)),), upload=True, required=True),
        ),
    )

    def simulate(self, setup):
        config, n = setup.config, setup.dataset.n_users
        rng = np.random.default_rng(setup.seed)
        bits = rng.integers(0, 2, size=(n, config["p"])).astype(np.float64)
        senders = [f"client:{u}" for u in range(n)]
        private = {party: {"bits": bits[u]} for u, party in enumerate(senders)}
        t, channel = self.start(setup, ["server", *senders], private, rng)
        err = 0.0
        for r in range(config["rounds"]):
            payloads = [{"values": config["signal"] * (2 * bits[u] - 1)} for u in range(n)]
            batch = channel.send(r, "upload", senders, payloads)
            got = np.array([p["values"] for p in batch.payloads])
            err += float(np.mean(np.abs(got - config["signal"] * (2 * bits - 1))))
        utility = {"ndcg@10": 1.0 / (1.0 + err / config["rounds"]), "rmse": err / config["rounds"]}
        return RunResult(t, bits, utility)


class _BitsAttack(Attack):
    party = "server"
    protocols = ("dummy-proto",)
    requires = ("upload",)
    primary_metric = "accuracy"

    def score(self, recon, transcript):
        hits = total = 0
        for party, guess in recon.victims.items():
            truth = transcript.private(party)["bits"]
            hits += int(np.sum(guess["bits"] == truth))
            total += truth.size
        return {"accuracy": hits / total if total else float("nan"), "victims": float(len(recon.victims))}

    def baseline(self, transcript):
        return {"accuracy": 0.5}


class DummyAttack(_BitsAttack):
    """Guess each bit from the sign of the first upload."""

    description = "test attack: sign of the upload"
    parameters = (Param("threshold", 0.0, "guess 1 above this upload"), Param("jobs", 1, "unused"))

    def run(self, view, knowledge, rng):
        victims = {}
        first = {}
        for m in view.select("upload"):
            first.setdefault(m.sender, m.payload["values"])
        for party, values in first.items():
            victims[party] = {"bits": (np.asarray(values) > self.threshold).astype(np.float64)}
        return Reconstruction(self.name, self.party, victims)


class DummyAuxAttack(_BitsAttack):
    """Knows a fraction of each victim's bits, guesses the rest at random."""

    description = "test attack: auxiliary knowledge"
    parameters = (Param("aux_fraction", 0.5, "fraction of the bits the attacker is told", ge=0, le=1),)
    default_sweep = ("aux_fraction", (0.0, 0.5, 1.0))

    def prior_knowledge(self, transcript, rng):
        known = {}
        for party in transcript.parties:
            if party.startswith("client:"):
                bits = transcript.private(party)["bits"]
                known[party] = (rng.random(bits.size) < self.aux_fraction, bits)
        return known

    def run(self, view, knowledge, rng):
        victims = {}
        for party, (mask, bits) in knowledge.items():
            guess = rng.integers(0, 2, size=bits.size).astype(np.float64)
            guess[mask] = bits[mask]
            victims[party] = {"bits": guess}
        return Reconstruction(self.name, self.party, victims)


class DummyNeedsAttack(DummyAttack):
    """Declares a message kind the dummy protocol never sends (so it never applies)."""

    description = "test attack: needs grad_X uploads"
    requires = ("grad_X",)


class DummyNoise(Defense):
    """Laplace noise on every uploaded float."""

    description = "test defense: Laplace noise"
    parameters = (Param("scale", 0.0, "Laplace noise scale", ge=0),)
    strength = "scale"
    default_grid = (0.0, 0.1, 1.0, 10.0)

    def on_upload(self, batch: UploadBatch, channel) -> UploadBatch:
        if self.scale <= 0:
            return batch
        for payload in batch.payloads:
            for key in batch.float_keys(payload):
                payload[key] = payload[key] + channel.rng.laplace(0.0, self.scale, size=np.shape(payload[key]))
        return batch

    def privacy_spent(self, rounds):
        return {"epsilon": rounds / self.scale} if self.scale > 0 else None


class DummyEncrypt(Defense):
    """Marks uploads as encrypted (the attack then does not apply)."""

    description = "test defense: hides plaintext"

    def on_upload(self, batch, channel):
        batch.meta["encrypted"] = True
        return batch

    def hides_plaintext(self):
        return True


DUMMIES = {
    ("protocol", "dummy-proto"): DummyProtocol,
    ("attack", "dummy-attack"): DummyAttack,
    ("attack", "dummy-aux-attack"): DummyAuxAttack,
    ("attack", "dummy-needs-attack"): DummyNeedsAttack,
    ("defense", "dummy-noise"): DummyNoise,
    ("defense", "dummy-encrypt"): DummyEncrypt,
}


@pytest.fixture
def dummy_registry():
    """Register the dummies for one test, then remove them again."""
    registry.available("protocol")  # load built-ins first so names cannot clash later
    for (kind, name), cls in DUMMIES.items():
        registry._register(kind, name)(cls)
    try:
        yield DUMMIES
    finally:
        for kind, name in DUMMIES:
            registry.unregister(kind, name)

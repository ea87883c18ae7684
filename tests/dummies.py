"""Small stand-in protocol, attacks and defenses for the experiment, report and CLI tests.

They are registered only inside the :func:`dummy_registry` fixture (and unregistered after),
so they never show up in ``privaudit list`` for other tests. Protocol ``dummy-proto``: each
client holds ``p`` secret bits and uploads ``signal * (2 bit - 1)`` per bit for ``rounds``
rounds (bits are 1 with probability ``bias``); attack ``dummy-attack`` guesses bit = upload >
threshold (so its accuracy falls from 1 to ~0.5 as Laplace noise grows), declares its metrics,
a prior-only baseline (the majority bit) and per-bit decisions (score = first upload);
``dummy-aux-attack`` is told a fraction of the bits (``aux_fraction``, swept by default) and
guesses the rest at random (it declares no metrics: the fallback spec applies);
``dummy-minority-attack`` always guesses the minority bit (below its prior-only baseline:
"attack not adapted"). Defense ``dummy-broken-dp`` claims epsilon-DP per round but adds
Laplace noise 10x smaller than that epsilon needs (the audit must flag it); ``dummy-dp`` is its
correctly calibrated twin.
"""

from __future__ import annotations

import numpy as np
import pytest

from privaudit import registry
from privaudit.attacks.base import Attack, Reconstruction
from privaudit.data.dataset import RatingsDataset
from privaudit.defenses.base import Defense
from privaudit.params import Param
from privaudit.protocols.base import Protocol, RunResult
from privaudit.results import Decisions, MetricSpec, VictimTable
from privaudit.schema import ENCRYPTED, DefenseSchema, MessageSchema, PayloadField, ProtocolSchema


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
        Param("delay", 0.0, "seconds to sleep before the run (a slow protocol, for the process-cleanup tests)", ge=0),
        Param("bias", 0.5, "probability that a secret bit is 1", ge=0, le=1),
    )
    default_attack = "dummy-attack"
    schema = ProtocolSchema(
        config_keys=("p",),
        dims={"p": "p"},
        messages=(
            MessageSchema("private", "client", "self", (PayloadField("bits", "float", ("p",), value_range=(0, 1)),)),
            MessageSchema(
                "upload", "client", "server", (PayloadField("values", "float", ("p",)),), upload=True, required=True
            ),
        ),
    )

    @classmethod
    def release_count(cls, config):
        return config.get("rounds")  # every client uploads in every round

    def simulate(self, setup):
        config, n = setup.config, setup.dataset.n_users
        if config["delay"]:
            import time

            time.sleep(config["delay"])  # a slow protocol, for the process-cleanup tests
        rng = np.random.default_rng(setup.seed)
        if config["bias"] == 0.5:
            bits = rng.integers(0, 2, size=(n, config["p"])).astype(np.float64)
        else:
            bits = (rng.random((n, config["p"])) < config["bias"]).astype(np.float64)
        senders = [f"client:{u}" for u in range(n)]
        private = {party: {"bits": bits[u]} for u, party in enumerate(senders)}
        t, channel = self.start(setup, ["server", *senders], private, rng)
        err = 0.0
        for r in range(config["rounds"]):
            payloads = [{"values": config["signal"] * (2 * bits[u] - 1)} for u in range(n)]
            batch = channel.send(r, "upload", senders, payloads)
            if all("values" in p for p in batch.payloads):  # not encrypted
                got = np.array([p["values"] for p in batch.payloads])
                err += float(np.mean(np.abs(got - config["signal"] * (2 * bits - 1))))
        utility = {"ndcg@10": 1.0 / (1.0 + err / config["rounds"]), "rmse": err / config["rounds"]}
        return RunResult(t, bits, utility)


class _BitsAttack(Attack):
    party = "server"
    protocols = ("dummy-proto",)
    requires = ("upload",)
    primary_metric = "accuracy"
    metric_specs = {
        "accuracy": MetricSpec(True, True, "fraction", "share of the victims' secret bits guessed right"),
        "victims": MetricSpec(True, False, "count", "number of victims attacked"),
    }

    def applicable(self, view):
        return super().applicable(view)

    def evaluate(self, transcript, rng):
        """The base pipeline, plus the prior-only baseline and the per-bit decisions (filled here
        until ``Attack.evaluate`` fills them itself)."""
        outcome = super().evaluate(transcript, rng)
        if getattr(outcome, "baseline_prior", None) is None:
            outcome.baseline_prior = self.prior_baseline(transcript, {})
        if not getattr(outcome, "decisions", None):
            recon = outcome.reconstruction
            outcome.decisions = self.decisions(recon, transcript) if recon.supported else {}
        return outcome

    def _truth(self, transcript):
        return np.concatenate([transcript.private(p)["bits"] for p in transcript.parties if p.startswith("client:")])

    def prior_baseline(self, transcript, knowledge):
        """Always guess the majority bit of the public bit rate ``bias``."""
        bits = self._truth(transcript)
        bias = float(transcript.config.get("bias", 0.5))
        guess = 1.0 if bias > 0.5 else 0.0
        return {"accuracy": float(np.mean(bits == guess)) if bias != 0.5 else 0.5}

    def decisions(self, recon, transcript):
        scores, labels, groups = [], [], []
        for k, (party, guess) in enumerate(recon.victims.items()):
            if "scores" in guess:
                scores.append(guess["scores"])
                labels.append(transcript.private(party)["bits"] > 0.5)
                groups.append(np.full(len(guess["scores"]), k))
        if not scores:
            return {}
        return {
            "bit": Decisions(
                np.concatenate(scores), np.concatenate(labels), positive="bit = 1", groups=np.concatenate(groups)
            )
        }

    def victim_table(self, recon, transcript, knowledge):
        """Per victim: bits scored, bits guessed right, and right by the prior's majority guess."""
        bias = float(transcript.config.get("bias", 0.5))
        parties = list(recon.victims)
        truth = [transcript.private(p)["bits"] for p in parties]
        right = [float(np.sum(recon.victims[p]["bits"] == t)) for p, t in zip(parties, truth)]
        prior = [float(np.sum(t == (1.0 if bias > 0.5 else 0.0))) if bias != 0.5 else t.size / 2 for t in truth]
        sizes = [float(t.size) for t in truth]
        return VictimTable(parties, {"accuracy": sizes}, {"accuracy": right}, {"accuracy": prior})

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
            values = np.asarray(values, dtype=np.float64)
            victims[party] = {"bits": (values > self.threshold).astype(np.float64), "scores": values}
        return Reconstruction(self.name, self.party, victims)


class DummyAuxAttack(_BitsAttack):
    """Knows a fraction of each victim's bits, guesses the rest at random."""

    description = "test attack: auxiliary knowledge"
    metric_specs = {}  # declares nothing: reports use the explicit fallback spec
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


class DummyMinorityAttack(DummyAttack):
    """Always guesses the minority bit (scores below its prior-only baseline)."""

    description = "test attack: guesses the minority bit"

    def prior_knowledge(self, transcript, rng):
        return {"bias": float(transcript.config.get("bias", 0.5))}  # public config

    def run(self, view, knowledge, rng):
        recon = super().run(view, knowledge, rng)
        minority = 0.0 if knowledge["bias"] >= 0.5 else 1.0
        for g in recon.victims.values():
            g["bits"] = np.full_like(g["bits"], minority)
            g["scores"] = np.zeros_like(g["scores"])
        return recon


class DummyNeedsAttack(DummyAttack):
    """Declares a message kind the dummy protocol never sends (so it never applies)."""

    description = "test attack: needs grad_X uploads"
    requires = ("grad_X",)


class DummyNoise(Defense):
    """Laplace noise on every uploaded float."""

    description = "test defense: Laplace noise"
    parameters = (Param("scale", 0.0, "Laplace noise scale", ge=0),)
    strength = "scale"
    acts_on = (("upload", "values"),)
    default_grid = (0.0, 0.1, 1.0, 10.0)

    def process_uploads(self, uploads, ctx, call_next):
        if self.scale > 0:
            for batch in uploads.batches:
                for payload in batch.payloads:
                    for key in batch.float_keys(payload):
                        payload[key] = payload[key] + ctx.rng.laplace(0.0, self.scale, size=np.shape(payload[key]))
        return call_next(uploads)

    def privacy_spent(self, rounds):
        return {"epsilon": rounds / self.scale} if self.scale > 0 else None


class DummyEncrypt(Defense):
    """Marks uploads as encrypted (the attack then does not apply)."""

    description = "test defense: hides plaintext"
    acts_on = (("upload", "values"),)
    schema_contribution = DefenseSchema(upload_forms=(ENCRYPTED,))

    def process_uploads(self, uploads, ctx, call_next):
        for batch in uploads.batches:
            # stand-in ciphertexts: the plaintext's bytes (a test double, not encryption)
            batch.payloads = [
                {"ciphertexts": np.frombuffer(np.asarray(p["values"], np.float64).tobytes(), np.uint8).copy()}
                for p in batch.payloads
            ]
            batch.meta["encrypted"] = True
        return call_next(uploads)

    def hides_plaintext(self):
        return True


class DummyBrokenDP(Defense):
    """Claims epsilon-DP per round for each +-signal upload (sensitivity 2 signal) but adds
    Laplace noise of scale 2 signal / (10 epsilon): 10x too little."""

    description = "test defense: broken DP (noise 10x too small for its claim)"
    parameters = (
        Param("epsilon", 0.5, "claimed epsilon per round", gt=0),
        Param("signal", 1.0, "the protocol's upload magnitude (sensitivity 2 signal)", gt=0),
        Param("shortfall", 10.0, "factor by which the noise is too small", gt=0),
    )
    strength = "epsilon"
    acts_on = (("upload", "values"),)
    default_grid = (2.0, 0.5)

    def process_uploads(self, uploads, ctx, call_next):
        b = 2.0 * self.signal / (self.shortfall * self.epsilon)
        for batch in uploads.batches:
            for payload in batch.payloads:
                for key in batch.float_keys(payload):
                    payload[key] = payload[key] + ctx.rng.laplace(0.0, b, size=np.shape(payload[key]))
        return call_next(uploads)

    def privacy_spent(self, rounds):
        return {
            "epsilon": rounds * self.epsilon,
            "delta": 0.0,
            "unit": "one secret bit",
            "accountant": "basic",
            "epsilon_per_round": self.epsilon,
        }


class DummyDP(DummyBrokenDP):
    """The correctly calibrated twin of :class:`DummyBrokenDP` (noise 2 signal / epsilon)."""

    description = "test defense: correct DP"
    parameters = (
        Param("epsilon", 0.5, "claimed epsilon per round", gt=0),
        Param("signal", 1.0, "the protocol's upload magnitude (sensitivity 2 signal)", gt=0),
        Param("shortfall", 1.0, "factor by which the noise is too small (1: correct)", gt=0),
    )


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


#: Registered only by :func:`verdict_registry` (they would change the audits of other tests).
VERDICT_DUMMIES = {
    ("attack", "dummy-minority-attack"): DummyMinorityAttack,
    ("defense", "dummy-broken-dp"): DummyBrokenDP,
    ("defense", "dummy-dp"): DummyDP,
}


def register_dummies(extra: bool = False) -> None:
    """Register every dummy (built-ins are loaded first so names cannot clash later)."""
    registry.available("protocol")
    for (kind, name), cls in {**DUMMIES, **(VERDICT_DUMMIES if extra else {})}.items():
        registry._register(kind, name)(cls)


@pytest.fixture
def verdict_registry():
    """The dummies plus the verdict ones (minority attack, broken and correct DP), then removed."""
    register_dummies(extra=True)
    try:
        yield {**DUMMIES, **VERDICT_DUMMIES}
    finally:
        for kind, name in {**DUMMIES, **VERDICT_DUMMIES}:
            registry.unregister(kind, name)

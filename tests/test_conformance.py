"""``privaudit.testing``: every built-in protocol, simulated-protocol attack and defense passes the
conformance suite on tiny runs, and the suite fails classes that break its rules."""

from __future__ import annotations

import numpy as np
import pytest

from privaudit import registry, testing
from privaudit.attacks.base import Attack
from privaudit.data import synthetic
from privaudit.results import MetricSpec

KEY = {"key_length": 256, "insecure_test_key": True}  # PrivMVMF's Paillier key: breakable, tests only
NCF_DEVIATION = {"clients_per_round": 4, "global_rounds": 0, "deviation_rounds": 2}
#: tiny configs of the simulated protocols (the recorded "flower" protocol has no simulation)
CONFIGS = {
    "fedmvmf": {"epochs": 3},
    "privmvmf": {"epochs": 2},
    "fedrec": {"T": 3},
    "fedsplit": {"n_iter": 5, "server_max_iter": 20},
    "fedproto": {"max_iter": 20},
    "fedncf": {"max_rounds": 1},
}
#: attack -> (protocol, config of its run)
ATTACKS = {
    "mvmf-analytic": ("fedmvmf", CONFIGS["fedmvmf"]),
    "mvmf-nonlinear": ("fedmvmf", CONFIGS["fedmvmf"]),
    "mvmf-aggregate": ("fedmvmf", CONFIGS["fedmvmf"]),
    "fedrec-rated-items": ("fedrec", CONFIGS["fedrec"]),
    "fedsplit-inference": ("fedsplit", CONFIGS["fedsplit"]),
    "proto-membership": ("fedproto", CONFIGS["fedproto"]),
    "ncf-update-leak": ("fedncf", CONFIGS["fedncf"]),
    "ncf-interaction-inference": ("fedncf", CONFIGS["fedncf"]),
    "ncf-kanon-linking": ("fedncf", {"max_rounds": 2, "selection": "adversarial"}),
    "ncf-active-saturation": ("fedncf", {"server": "saturate", **NCF_DEVIATION}),
    "ncf-model-inconsistency": ("fedncf", {"server": "inconsistent", **NCF_DEVIATION}),
    "ncf-sybil-isolation": ("fedncf", {"server": "sybil", **NCF_DEVIATION}),
    "ncf-unit-saturation": (
        "fedncf",
        {"server": "saturate", "craft_via": "mlp-unit", "model": "neumf", **NCF_DEVIATION},
    ),
    "privmvmf-isolated-decryption": ("privmvmf", {"epochs": 2, "server": "isolate"}),
}
#: defense -> (protocol, whether every default_grid value runs; False: the defaults once)
DEFENSES = {
    "dp-gaussian": ("fedmvmf", True),
    "dp-laplace": ("fedmvmf", True),
    "gaussian": ("fedmvmf", False),
    "laplace": ("fedmvmf", False),
    "sampling": ("fedmvmf", True),
    "secagg": ("fedmvmf", False),
    "paillier": ("privmvmf", False),
    "dp-prototypes": ("fedproto", False),
    "dp-sgd": ("fedncf", False),
    "ldp-interactions": ("fedncf", False),
    "feature-bounds": ("fedncf", False),
    "verified-cohort": ("fedncf", False),
    "model-consistency": ("fedncf", False),
}
#: attacks of recorded (Flower) transcripts -> their parameters, checked on a recorded FedAvg MF run
RECORDED = {
    "generic-attribute-inference": {},
    "generic-interaction-inference": {"negatives": 1},
    "generic-mf-ratings": {},
    "generic-mf-ratings-estimated": {},
    "generic-trained-items": {},
}
#: needs a malicious recording (inconsistent models); tested on one in tests/test_flower_malicious.py
RECORDED_ONLY = {"flower-model-inconsistency"}


def _defenses(protocol: str) -> list:
    return [registry.get("defense", "paillier")(**KEY)] if protocol == "privmvmf" else []


def test_the_tables_cover_every_built_in_class():
    """A new built-in class must be added here (or to RECORDED_ONLY, with its reason)."""
    builtin = {
        k: {n for n, c in registry.available(k).items() if c.__module__.startswith("privaudit.")}
        for k in registry.KINDS
    }
    assert builtin["protocol"] == set(CONFIGS) | {"flower"}
    assert builtin["attack"] == set(ATTACKS) | set(RECORDED) | RECORDED_ONLY
    assert builtin["defense"] == set(DEFENSES)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_builtin_protocol_conforms(name):
    t = testing.check_protocol(registry.get("protocol", name), config=CONFIGS[name], defenses=_defenses(name))
    assert t.protocol == name and t.messages


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_builtin_attack_conforms(name):
    protocol, config = ATTACKS[name]
    out = testing.check_attack(
        registry.get("attack", name), protocol=protocol, config=config, defenses=_defenses(protocol)
    )
    assert out.reconstruction.supported and out.victims is not None  # every built-in gives per-victim scores


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A recorded run of the plain FedAvg MF Flower app (12 clients, 2 rounds), as the recorder writes it."""
    from tests.test_flower_dense import simulate

    return simulate(tmp_path_factory.mktemp("recorded"), clients=12, rounds=2)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_builtin_recorded_attack_conforms(name, recorded):
    out = testing.check_attack(registry.get("attack", name), transcript=recorded, params=RECORDED[name])
    assert out.reconstruction.supported and out.victims is not None


@pytest.mark.parametrize("name", sorted(DEFENSES))
def test_builtin_defense_conforms(name):
    protocol, grid = DEFENSES[name]
    params = KEY if name == "paillier" else None
    t = testing.check_defense(
        registry.get("defense", name), protocol=protocol, config=CONFIGS[protocol], params=params, grid=grid
    )
    assert name in {d["name"] for d in t.config["defenses"]}


def test_null_transcript_deranges_private_data():
    ds = synthetic(n_users=12, n_items=30, min_ratings=4, seed=1)
    t = registry.get("protocol", "fedmvmf")().run(ds, {"epochs": 2}, [], 0).transcript
    null = testing.null_transcript(t)
    clients = t.clients()
    moved = [not np.array_equal(t.private(c)["items"], null.private(c)["items"]) for c in clients]
    assert all(moved)  # every client scored against another client's data
    assert len(null.messages) == len(t.messages)
    assert all(
        a.sender == b.sender and np.array_equal(a.payload["values"], b.payload["values"])
        for a, b in zip(t.select("grad_V"), null.select("grad_V"))
    )  # the uploads are kept


class _Cheat(Attack):
    """Reads the victims' truth from the full transcript (prior_knowledge), so it 'leaks' on any view."""

    description = "a broken attack for the null smoke test"
    primary_metric = "accuracy"
    protocols = ("fedmvmf",)
    requires = ("grad_V",)
    metric_specs = {"accuracy": MetricSpec(True, True, "fraction", "share of rated items found")}

    def applicable(self, view):
        return super().applicable(view)

    def prior_knowledge(self, transcript, rng):
        return {"truth": {c: transcript.private(c)["items"] for c in transcript.clients()}}

    def run(self, view, knowledge, rng):
        from privaudit.attacks.base import Reconstruction

        return Reconstruction("cheat", "server", {c: {"items": i} for c, i in knowledge["truth"].items()})

    def _table(self, recon, transcript):
        from privaudit.results import VictimTable

        victims = sorted(recon.victims)
        hit = [float(np.isin(transcript.private(v)["items"], recon.victims[v]["items"]).sum()) for v in victims]
        weight = [float(transcript.private(v)["items"].size) for v in victims]
        rng = np.random.default_rng(0)
        prior = [float((rng.random(int(w)) < 0.15).sum()) for w in weight]
        return VictimTable(victims, {"accuracy": weight}, {"accuracy": hit}, {"accuracy": prior})

    def score(self, recon, transcript):
        return {"accuracy": self._table(recon, transcript).value("accuracy")}

    def baseline(self, transcript):
        return {"accuracy": 0.15}

    def prior_baseline(self, transcript, knowledge):
        recon = self.run(None, self.prior_knowledge(transcript, None), None)
        return {"accuracy": self._table(recon, transcript).value("accuracy", "prior")}

    def victim_table(self, recon, transcript, knowledge):
        return self._table(recon, transcript)


class _BadTable(_Cheat):
    """Its victim table disagrees with its score."""

    def score(self, recon, transcript):
        return {"accuracy": 0.5}


class _NoTable(_Cheat):
    """Gives no per-victim scores."""

    def victim_table(self, recon, transcript, knowledge):
        return None


@pytest.fixture
def cheats():
    registry.available("attack")
    for cls in (_Cheat, _BadTable, _NoTable):
        registry.adopt("attack", cls.__name__.lower(), cls)
    yield
    for cls in (_Cheat, _BadTable, _NoTable):
        registry.unregister("attack", cls.__name__.lower())


def test_the_suite_fails_what_breaks_its_rules(cheats):
    ds = synthetic(n_users=30, n_items=40, min_ratings=5, seed=2)
    with pytest.raises(testing.ConformanceError, match=r"_BadTable \(victim table\): attack 'accuracy'"):
        testing.check_attack(_BadTable, protocol="fedmvmf", config={"epochs": 2}, dataset=ds, null=False)
    with pytest.raises(testing.ConformanceError, match=r"_NoTable \(victim table\).*'inconclusive \(no per-victim"):
        testing.check_attack(_NoTable, protocol="fedmvmf", config={"epochs": 2}, dataset=ds, null=False)
    testing.check_attack(_NoTable, protocol="fedmvmf", config={"epochs": 2}, dataset=ds, null=False, victim_table=False)
    with pytest.raises(testing.ConformanceError, match=r"_Cheat \(null calibration\).*would read 'leaks'"):
        testing.check_attack(_Cheat, protocol="fedmvmf", config={"epochs": 2}, dataset=ds)

    class Unregistered(_Cheat):
        pass

    with pytest.raises(testing.ConformanceError, match=r"Unregistered \(registered\): not registered"):
        testing.check_attack(Unregistered, protocol="fedmvmf", config={"epochs": 2}, dataset=ds)


@pytest.fixture
def example_plugin(monkeypatch):
    """The shipped example, registered under its entry-point names through the registry API."""
    import importlib
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "examples" / "privaudit-plugin-example" / "src"
    monkeypatch.syspath_prepend(str(src))
    module = importlib.import_module("privaudit_plugin_example")
    names = {("protocol", "item-means"): module.ItemMeans, ("attack", "uploaded-items"): module.UploadedItems}
    names[("defense", "quantize")] = module.Quantize
    registry.available("protocol")
    for (kind, name), cls in names.items():
        registry.adopt(kind, name, cls)
    try:
        yield module
    finally:
        for kind, name in names:
            registry.unregister(kind, name)


def test_the_shipped_plugin_example_conforms(example_plugin):
    testing.check_protocol(example_plugin.ItemMeans)
    out = testing.check_attack(example_plugin.UploadedItems, protocol="item-means")
    assert out.metrics["accuracy"] == 1.0 and out.victims.value("accuracy") == 1.0
    testing.check_defense(example_plugin.Quantize, protocol="item-means")

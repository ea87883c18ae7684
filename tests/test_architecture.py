"""Architecture checks: seams, declared interfaces (parameters, schemas, utility specs, abstract attack methods, defense payloads)."""

from __future__ import annotations

import numpy as np
import pytest

# ------------------------------------------------------------------------------- seams


def test_defense_capabilities_are_declared_or_derived_from_hooks():
    from privaudit import registry
    from privaudit.defenses.base import AGGREGATION, CLIENT_DATA, LOCAL_TRAINING, UPLOAD, Defense

    caps = {name: cls.capabilities for name, cls in registry.available("defense").items()}
    assert caps["sampling"] == {CLIENT_DATA}
    assert caps["dp-sgd"] == {LOCAL_TRAINING}
    assert caps["paillier"] == caps["secagg"] == {UPLOAD, AGGREGATION}
    assert caps["laplace"] == {UPLOAD}

    class Echo(Defense):
        def on_download(self, payload, channel):
            return payload

    assert Echo.capabilities == {"download"}
    try:
        type("Bad", (Defense,), {"capabilities": frozenset({"teleport"})})
    except TypeError as exc:
        assert "unknown capabilities ['teleport']" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an unknown capability must be refused")


def test_protocols_ask_defenses_by_capability():
    from privaudit import registry
    from privaudit.protocols.fedrec import HF_DEFAULTS, hf_settings
    from privaudit.protocols.privmvmf import privmvmf_defenses

    sampling, paillier, laplace = (registry.get("defense", n) for n in ("sampling", "paillier", "laplace"))
    # FedRec reads the clients' filling rule from the client-data defense, defaults filled in
    assert hf_settings([laplace(scale=0.1)]) == (None, 0, 0)
    assert hf_settings([sampling(filling="hf", t_local=3)]) == ("hf", HF_DEFAULTS["t_predict"], 3)
    # DP-SGD's clients' optimizer
    lt = registry.get("defense", "dp-sgd")(noise_multiplier=0.7, max_grad_norm=2.0).local_training()
    assert (lt.noise_multiplier, lt.clip) == (0.7, 2.0)
    # PrivMVMF: default sampling (with the protocol's w) first, encryption last, given order kept
    key = paillier(key_length=512, insecure_test_key=True)
    out = privmvmf_defenses([key, laplace(scale=0.1)], w=0.3)
    assert [d.name for d in out] == ["sampling", "laplace", "paillier"] and out[-1] is key
    assert out[0].weight == 0.3
    own = sampling(rho=2.0)
    out = privmvmf_defenses([own], w=0.3)
    assert [d.name for d in out] == ["sampling", "paillier"] and out[0].config["w"] == 0.3 and own.config["w"] is None


def test_run_template_opens_transcript_with_private_messages_and_channel(dummy_registry):
    from tests.dummies import DummyProtocol, tiny_dataset

    result = DummyProtocol().run(
        tiny_dataset(6), {"p": "3"}, [dummy_registry[("defense", "dummy-noise")](scale=0.0)], 5
    )
    t = result.transcript
    assert t.seed == 5 and t.config["p"] == 3 and t.config["defenses"] == [{"name": "dummy-noise", "scale": 0.0}]
    assert [m.sender for m in t.select("private")] == [f"client:{u}" for u in range(6)]
    np.testing.assert_array_equal(t.private("client:2")["bits"], result.model[2])
    again = DummyProtocol().run(tiny_dataset(6), {"p": 3}, [], 5)
    np.testing.assert_array_equal(again.model, result.model)  # same seed, same run


def test_client_parties_are_named_in_one_place():
    """No module tests a party id for the ``client:`` prefix itself: ``transcript.is_client`` and
    ``Transcript.clients`` (over ``CLIENT_PREFIX``) are the one place that does."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "privaudit"
    readers = sorted(
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if 'startswith("client:")' in p.read_text(encoding="utf-8")
        or "startswith('client:')" in p.read_text(encoding="utf-8")
    )
    assert readers == [], readers
    from privaudit.transcript import CLIENT_PREFIX, is_client

    assert CLIENT_PREFIX == "client:" and is_client("client:3") and not is_client("server")


# ------------------------------------------------------------------------------- declarations


def _builtins(kind):
    from privaudit import registry

    return {n: c for n, c in registry.available(kind).items() if c.__module__.startswith("privaudit.")}


def test_every_registered_class_declares_its_parameters_through_param():
    from privaudit import registry
    from privaudit.params import Param

    for kind in registry.KINDS:
        for name, cls in registry.available(kind).items():
            own = [c.__dict__["parameters"] for c in cls.__mro__ if "parameters" in c.__dict__]
            assert own and all(isinstance(p, Param) for p in own[0]), f"{kind} {name}"
            assert list(cls.declared) == [p.name for p in own[0]], f"{kind} {name}"
            derived = cls.default_config if kind == "protocol" else cls.params
            assert derived == {p.name: p.default for p in own[0]}, f"{kind} {name}"


def test_every_protocol_declares_schema_utility_specs_and_defaults():
    from privaudit.protocols.base import Protocol
    from privaudit.results import MetricSpec
    from privaudit.schema import ProtocolSchema

    protocols = _builtins("protocol")
    assert set(protocols) >= {"fedmvmf", "fedncf", "fedproto", "fedrec", "fedsplit", "privmvmf", "flower"}
    for name, cls in protocols.items():
        if getattr(cls, "recorded", False):  # the schema travels in the recorded transcript
            assert cls.schema is None and cls.schema_for.__func__ is not Protocol.schema_for.__func__
            continue
        assert isinstance(cls.schema, ProtocolSchema) and cls.schema_for(None) is cls.schema, name
        assert cls.utility_specs and all(isinstance(s, MetricSpec) for s in cls.utility_specs.values()), name
        main = cls.main_utility
        assert main is None or main in cls.utility_specs, name
        assert cls.default_attack, name
        assert cls.default_sweep_spec is None or "=" in cls.default_sweep_spec, name
        assert isinstance(cls.default_defense_specs, tuple), name
        assert cls.default_users is None or cls.default_users >= 1, name
    # lower-is-better utility metrics are declared, never assumed
    assert protocols["fedrec"].utility_specs["rmse"].higher_is_better is False
    assert protocols["fedsplit"].utility_specs["rmse"].higher_is_better is False
    assert protocols["fedproto"].utility_specs["mean_rank"].higher_is_better is False
    assert protocols["privmvmf"].estimate_seconds(10, {}, ()) > 0
    # a defense's utility cost follows the declared direction: rmse up by 0.2 costs +0.2
    from privaudit import results as rs

    declared = {"rmse": rs.spec_to_dict(protocols["fedrec"].utility_specs["rmse"])}
    before, after = {"0": 1.0, "1": 1.1}, {"0": 1.2, "1": 1.3}
    assert rs.utility_cost_interval(before, after, "rmse", declared)["cost"] == pytest.approx(0.2)
    assert rs.utility_cost_interval(before, after, "rmse")["cost"] == pytest.approx(-0.2)  # undeclared: higher assumed
    assert "not declared" in rs.utility_spec("rmse").description
    assert protocols["fedmvmf"].estimate_seconds(10, {}, ()) is None


def test_every_attack_implements_the_abstract_methods():
    import inspect

    from privaudit.attacks.base import Attack

    assert Attack.__abstractmethods__ == {"applicable", "run", "score", "baseline", "prior_baseline"}
    for name, cls in _builtins("attack").items():
        assert not inspect.isabstract(cls), f"{name}: {sorted(cls.__abstractmethods__)}"
        cls()  # instantiates with its declared defaults

    class Half(Attack):
        name = "half"

        def run(self, view, knowledge, rng):
            return self.unsupported("never")

    try:
        Half()
    except TypeError as exc:
        assert "abstract" in str(exc) and "prior_baseline" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an attack without score/prior_baseline/applicable must not instantiate")


def test_defenses_declare_the_payloads_they_act_on_and_audits_skip_the_rest():
    from privaudit import audit, registry

    for name, cls in _builtins("defense").items():
        assert cls.acts_on, f"defense {name} declares no payload it acts on"
    sampling = registry.get("defense", "sampling")
    assert sampling.acts_on_schema(registry.get("protocol", "fedrec").schema)
    assert not sampling.acts_on_schema(registry.get("protocol", "fedsplit").schema)
    swept, skipped = audit.applicable_defenses("fedsplit")
    assert "sampling" not in {c.name for c in swept} and "laplace" in {c.name for c in swept}
    assert dict(skipped)["sampling"] == "changes no payload of a fedsplit message (acts on: grad_V.items, grad_W.items)"
    assert "sampling" in {c.name for c in audit.applicable_defenses("fedmvmf")[0]}

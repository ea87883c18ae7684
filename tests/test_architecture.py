"""Architecture checks: no import circle between privaudit's modules."""

from __future__ import annotations

import numpy as np

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

"""``Protocol.release_count``: the DP accounting counts the releases the protocol declares, not
config keys it guesses; the epsilon of the built-in protocols' DP cells is what the old key
guessing gave at these configs, except FedRec's, which the guess under-counted (its ``T``
iterations all upload). (FedNCF with ``max_rounds`` set now counts at most those rounds, where
the guess took ``global_rounds``.)"""

from __future__ import annotations

import math

import pytest

from privaudit import registry, runner
from privaudit.data import synthetic
from privaudit.transcript import is_client

KEY = {"key_length": 256, "insecure_test_key": True}
CONFIGS = {
    "fedmvmf": {"epochs": 3},
    "privmvmf": {"epochs": 2},
    "fedrec": {"T": 4},
    "fedsplit": {"n_iter": 5, "server_max_iter": 20},
    "fedproto": {"max_iter": 20},
    "fedncf": {"global_rounds": 2},
}


def _old_rounds(transcript) -> int:
    """The rule runner.defense_privacy had before release_count (recorded rounds, or the first of
    epochs/rounds/global_rounds/n_rounds that is larger)."""
    per: dict[str, set[int]] = {}
    for m in transcript.messages:
        if m.sender != m.receiver and is_client(m.sender):
            per.setdefault(m.sender, set()).add(m.round)
    rounds = max((len(r) for r in per.values()), default=0)
    for key in ("epochs", "rounds", "global_rounds", "n_rounds"):
        value = transcript.config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > rounds:
            return value
    return rounds


@pytest.fixture(scope="module")
def data():
    return synthetic(n_users=24, n_items=40, min_ratings=5, density=0.2, seed=3)


@pytest.mark.parametrize("protocol", sorted(CONFIGS))
@pytest.mark.parametrize("defense", ["dp-laplace", "dp-gaussian"])
def test_dp_epsilon_of_built_in_protocols(data, protocol, defense):
    dp = registry.get("defense", defense)()
    extra = [registry.get("defense", "paillier")(**KEY)] if protocol == "privmvmf" else []
    t = registry.get("protocol", protocol)().run(data, CONFIGS[protocol], [dp, *extra], 0).transcript
    entry = runner.defense_privacy([dp], t)[defense]
    declared = registry.get("protocol", protocol).release_count(t.config)
    old = _old_rounds(t)
    if protocol == "fedrec":  # T = 4 iterations upload, two of them recorded: the guess said 2
        assert (declared, old, entry["rounds"]) == (4, 2, 4)
    else:
        assert entry["rounds"] == old == declared and entry["rounds_source"] == "protocol"
        fresh = dp.privacy_spent(old)
        assert math.isclose(entry["epsilon"], float(fresh["epsilon"]), rel_tol=0, abs_tol=0)


def test_a_protocol_naming_its_rounds_otherwise_is_counted(data):
    """A protocol whose rounds are called ``iterations`` declares them: the guess would have
    counted only the recorded rounds."""
    from privaudit.protocols.fedrec import FedRec

    class Iterations(FedRec):
        @classmethod
        def release_count(cls, config):
            return 7

    registry.adopt("protocol", "iterations-rec", Iterations)
    try:
        t = Iterations().run(data, {"T": 3}, [registry.get("defense", "dp-laplace")()], 0).transcript
        assert t.protocol == "iterations-rec"
        entry = runner.defense_privacy([registry.get("defense", "dp-laplace")()], t)["dp-laplace"]
        assert entry["rounds"] == 7 and entry["rounds_source"] == "protocol"
    finally:
        registry.unregister("protocol", "iterations-rec")


def test_recorded_transcripts_fall_back_to_recorded_rounds_and_say_so():
    from privaudit.transcript import Transcript

    t = Transcript("flower", {}, 0, {}, ["server", "client:0"])
    for r in range(3):
        t.add(r, "client:0", "server", "item_update", {})
    entry = runner.defense_privacy([registry.get("defense", "dp-laplace")()], t)["dp-laplace"]
    assert entry["rounds"] == 3 and entry["rounds_source"] == "recorded"

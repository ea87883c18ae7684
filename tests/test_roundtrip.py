"""Every built-in simulated protocol's default run survives ``run -o``, ``inspect`` and
``attack --transcript``: the saved file passes its schema and every attack that reads the
protocol scores the same on the file as on the in-memory transcript.

Recorded protocols (``flower``) are not simulated; their round trip is in tests/test_flower.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from privaudit import audit, experiment, registry
from privaudit import transcript as tr
from privaudit.cli import main

#: users per run: the protocol's own default_users, else this many (keeps the module ~15 s)
SMALL_USERS = 60


def _simulated_builtins() -> list[str]:
    return [
        name
        for name, cls in registry.available("protocol").items()
        if cls.__module__.startswith("privaudit.protocols.") and not getattr(cls, "recorded", False)
    ]


def _users(name: str) -> int:
    return int(getattr(registry.get("protocol", name), "default_users", None) or SMALL_USERS)


def _scores(results: dict) -> dict[str, float]:
    """metric -> mean (results.json writes NaN as null)."""
    return {row["metric"]: math.nan if row["mean"] is None else row["mean"] for row in results["summary"]}


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    def eq(x, y):
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x):
            return math.isnan(y)
        return x == y

    return a.keys() == b.keys() and all(eq(a[k], b[k]) for k in a)


def test_every_simulated_builtin_is_covered():
    names = _simulated_builtins()
    assert {"fedmvmf", "fedncf", "fedproto", "fedrec", "fedsplit", "privmvmf"} <= set(names)


@pytest.mark.parametrize("protocol", _simulated_builtins())
def test_default_transcript_round_trips(protocol, tmp_path, capsys):
    users = _users(protocol)
    path = tmp_path / f"{protocol}.ptx"
    assert main(["run", "--protocol", protocol, "--users", str(users), "-o", str(path)]) == 0
    assert f"transcript written to {path}" in capsys.readouterr().out

    memory = experiment.run_transcript(protocol=protocol, users=users).transcript
    loaded = tr.load(path)
    assert (loaded.protocol, loaded.seed, loaded.config) == (memory.protocol, memory.seed, memory.config)
    assert len(loaded) == len(memory)
    for a, b in zip(loaded.messages, memory.messages):
        assert (a.kind, a.sender, a.receiver, a.round) == (b.kind, b.sender, b.receiver, b.round)
        assert a.payload.keys() == b.payload.keys()
        for k in a.payload:  # uint8: Paillier keys and ciphertexts, fresh OS randomness by design
            x, y = a.payload[k], b.payload[k]
            assert x.shape == y.shape and x.dtype == y.dtype
            assert x.dtype == np.uint8 or np.array_equal(x, y), (a.kind, k)

    assert main(["inspect", str(path)]) == 0
    shown = capsys.readouterr().out
    assert f"protocol    {protocol}" in shown and f"messages    {len(memory)}" in shown
    recorded = [d["name"] for d in memory.config.get("defenses", [])]
    defenses_line = next(line for line in shown.splitlines() if line.startswith("defenses"))
    if recorded:
        assert all(name in shown for name in recorded), shown
    else:
        assert defenses_line.endswith("none recorded")

    attacks = [cls.name for cls in audit.applicable_attacks(protocol)]
    assert attacks
    for attack in attacks:
        in_memory = _scores(experiment.attack_transcript(memory, attack))
        from_file = _scores(experiment.attack_transcript(loaded, attack))
        assert _same(in_memory, from_file), (attack, in_memory, from_file)
        assert any(not math.isnan(v) for v in in_memory.values())

    # the CLI path once per protocol: its report holds the in-memory numbers of the default attack
    default = registry.get("protocol", protocol).default_attack
    out = tmp_path / "report"
    assert main(["attack", "--transcript", str(path), "--attack", default, "--out", str(out), "--quiet"]) == 0
    written = json.loads((out / "results.json").read_text())
    assert _same(_scores(written), _scores(experiment.attack_transcript(memory, default)))

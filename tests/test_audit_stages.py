"""Audit runs that share the undefended protocol run give the numbers of a separate run."""

from __future__ import annotations

import math

from privaudit import audit, runner
from privaudit.data import synthetic


def _strip(entry: dict) -> dict:
    """An attack entry without its timing."""
    return {k: v for k, v in entry.items() if k != "seconds"}


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def test_zero_noise_shares_the_undefended_run_with_identical_numbers(monkeypatch):
    dataset = synthetic(n_users=60, seed=0)
    spec = audit.Audit(protocol="fedmvmf", defenses=["laplace"], attacks=["mvmf-analytic"], seeds=1, progress=False)
    calls = []
    real = runner.run_protocol

    def counting(task, data):
        calls.append(task.defense_specs)
        return real(task, data)

    monkeypatch.setattr(runner, "run_protocol", counting)
    result = audit.run_audit(spec, dataset=dataset)
    runs, _ = audit._plan(spec)
    assert len(runs) == 7 and len(calls) == 6  # undefended + laplace 0.1 .. 4; laplace 0 shared
    zero = next(r for r in result["runs"] if r["defense"] == "laplace" and r["value"] == 0.0)
    assert zero["protocol_shared"] and zero["protocol_seconds"] == 0.0
    alone = audit._execute(next(r for r in runs if r.defense_name == "laplace" and r.value == 0.0), dataset)
    timing = "epoch_seconds"
    assert "protocol_shared" not in alone and zero["utility"].pop(timing) > 0 and alone["utility"].pop(timing) > 0
    assert zero["utility"] == alone["utility"]
    assert _same(_strip(zero["attacks"]["mvmf-analytic"]), _strip(alone["attacks"]["mvmf-analytic"]))
    undefended = next(r for r in result["runs"] if r["defense"] is None)
    assert undefended["attacks"]["mvmf-analytic"]["attack_metrics"]["rating_accuracy"] == 1.0

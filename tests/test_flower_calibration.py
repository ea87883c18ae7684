"""The recorded-Flower calibration (benchmarks/flower_calibration.py) and what it fixed.

* generic-trained-items (and generic-interaction-inference on the implicit-feedback app) on a
  recording whose uploads carry nothing (a stock LocalDpMod with noise of standard deviation
  9.7e4 per float) falls back on its prior: F1 at the prior's, not 0 ("attack below prior" on
  every such recording before);
* the recorded-Flower audit's verdict has the null arm (``baseline_null``) and pools several
  recordings as seeds (``pooled_verdict``);
* the benchmark's in-process engine is deterministic per seed, its transcript comparison sees a
  different run, its table counts experiments of disjoint recordings, and bad flags exit 2.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason='Flower is not installed: pip install "privaudit[flower]"')

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import flower_calibration as fc  # noqa: E402

from privaudit import registry  # noqa: E402
from privaudit.errors import PrivauditError  # noqa: E402
from privaudit.integrations.recorded import audit_transcript, pooled_verdict, transcript_point  # noqa: E402


def _record(tmp: Path, eps: float, seed: int, clients: int = 12, app: str = "localdp_mf"):
    logging.disable(logging.WARNING)
    folder = fc.app_copy(tmp, eps, app)
    with contextlib.redirect_stdout(io.StringIO()):
        return fc.record_in_process(folder, clients, seed, **dict(fc.APP_SPECS[app].overrides))


@pytest.fixture(scope="module")
def null_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("null")
    return tmp, [_record(tmp, fc.NULL_EPSILON, seed) for seed in (0, 1)]


def test_trained_items_fall_back_on_the_prior_when_the_uploads_carry_nothing(null_runs):
    _, (t, _) = null_runs
    row = next(r for r in audit_transcript(t)["rows"] if r["attack"] == "generic-trained-items")
    # seed 0 of the 12-client null copy: prior F1 0.611; the changed rows alone gave 0.000
    assert row["baseline_prior"]["f1"] == pytest.approx(0.611, abs=0.001)
    assert abs(row["metrics"]["f1"] - row["baseline_prior"]["f1"]) <= 0.01, row
    assert row["verdict"] == "no evidence of leakage", row
    # the null arm is in the point, and the attack sits on it
    point, reason = transcript_point(registry.get("attack", "generic-trained-items"), t)
    assert reason == "" and point["baseline_null"]["f1"] == pytest.approx(point["attack_metrics"]["f1"], abs=0.01)
    # without the prior (a run without ground truth) the uploads alone show no trained row
    attack = registry.get("attack", "generic-trained-items")()
    recon = attack.run(t.view("server"), {}, None)
    assert all(v["items"].size == 0 for v in recon.victims.values())


def test_interaction_inference_falls_back_on_the_prior_on_an_implicit_null(tmp_path):
    t = _record(tmp_path, fc.NULL_EPSILON, 0, app="implicit_gmf")
    rows = {r["attack"]: r for r in audit_transcript(t)["rows"]}
    row = rows["generic-interaction-inference"]
    # seed 0 of the implicit GMF null copy: prior F1 0.280; the scored rows alone gave 0.000
    assert row["baseline_prior"]["f1"] == pytest.approx(0.280, abs=0.001)
    assert abs(row["metrics"]["f1"] - row["baseline_prior"]["f1"]) <= 0.02, row
    assert row["verdict"] == "no evidence of leakage", row
    assert rows["generic-trained-items"]["verdict"] == "no evidence of leakage"


def test_pooled_verdict_over_recordings(null_runs):
    _, runs = null_runs
    cls = registry.get("attack", "generic-trained-items")
    points = [transcript_point(cls, t)[0] for t in runs]
    one, two = pooled_verdict(cls, points[:1], defended=True), pooled_verdict(cls, points, defended=True)
    assert one["tests"]["f1"]["seeds"] == 1 and two["tests"]["f1"]["seeds"] == 2
    assert two["tests"]["f1"]["between_seeds"] and two["verdict"] == "no evidence of leakage"
    assert fc.experiment([{cls.name: p} for p in points], cls) == "no evidence of leakage"
    assert fc.experiment([{cls.name: points[0]}, {cls.name: {"reason": "x"}}], cls) == "not applicable"
    with pytest.raises(PrivauditError, match="no recorded points to judge"):
        pooled_verdict(cls, [], defended=True)


def test_in_process_engine_is_deterministic_and_the_comparison_sees_a_change(null_runs):
    tmp, (t0, t1) = null_runs
    again = _record(tmp, fc.NULL_EPSILON, 0)
    same = fc.compare(again, t0)
    assert same["same_structure"] and same["max_abs_diff"] == 0.0 and same["messages"] > 24
    assert not fc.compare(t1, t0)["same_structure"]  # another seed: other data


def test_table_counts_disjoint_experiments():
    cls = registry.get("attack", "generic-trained-items")
    fake = [{cls.name: {"reason": "n/a"}} for _ in range(7)]
    counts = fc.table(fake, [cls], 3)
    assert counts["any"]["n"] == 2 and counts[cls.name]["n"] == 0
    assert counts[cls.name]["verdicts"]["not applicable"] == 2


@pytest.mark.parametrize(
    "argv", [["--seed-counts", "1,x"], ["--clients", "1"], ["--seed-counts", "0"], ["--null-epsilon", "0"]]
)
def test_bad_flags_exit_2(argv, capsys):
    assert fc.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("--")


def test_without_null_arm_drops_only_the_null_arm(null_runs):
    _, (t, _) = null_runs
    cls = registry.get("attack", "generic-trained-items")
    point = transcript_point(cls, t)[0]
    bare = fc.without_null_arm(point)
    assert "baseline_null" not in bare and "null" not in bare["bootstrap"]["f1"]
    assert bare["baseline_prior"] == point["baseline_prior"] and "baseline_null" in point
    assert pooled_verdict(cls, [bare], defended=True)["tests"]["f1"]["arms"].keys() == {"prior", "random"}

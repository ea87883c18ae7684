"""benchmarks/fedncf_dp_point.py (docs/fedncf-dp.md): its small synthetic path runs end to end.

The dp-sgd point's noise multiplier is calibrated so that dp-sgd's own accountant spends the
target epsilon over the run; the protocol's accounted epsilon must then equal the target (the
calibration and the accounting agree), and the attacks print privaudit's verdicts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "fedncf_dp_point.py"


def run_script(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_small_dp_point_is_accounted_at_its_target_epsilon(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("opacus")
    csv_path = tmp_path / "points.csv"
    proc = run_script(
        ["--small", "--points", "dp10-lr03", "--saturate-seeds", "1", "--saturate-rounds", "1", "--csv", str(csv_path)],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.splitlines()[0])
    assert row["point"] == "dp10-lr03" and row["epsilon_target"] == 10.0
    assert row["epsilon"] == pytest.approx(10.0, rel=1e-6)  # the run's own accounting (Opacus RDP, q = 1)
    assert row["noise_multiplier"] == pytest.approx(1.498, abs=0.001)  # 2 full-batch steps at sigma / 2
    assert 0.0 <= row["hr@10"] <= 1.0
    attacks = {"ncf-update-leak", "ncf-interaction-inference", "ncf-active-saturation"}
    assert set(row["attacks"]) == attacks | {"interaction scores, top k (k known)"}
    ranked = row["attacks"]["interaction scores, top k (k known)"]
    assert 0.0 <= ranked["value"] <= 1.0 and 0.0 <= ranked["auc"] <= 1.0
    # the malicious server's target took part in 1 more round than the others: its epsilon is larger
    assert row["attacks"]["ncf-active-saturation"]["target_epsilon"] > 10.0
    assert "| dp10-lr03 | 1 | 2 | 0.03 |" in proc.stdout
    lines = csv_path.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == "point,json" and lines[1].startswith("dp10-lr03,")

"""`python benchmarks/reproduce.py all --quick`: every paper's subsampled checks pass (slow; ML-100K).

Each check recomputes a figure docs/reproduction.md states and compares it with the stated
tolerance; the script exits 1 with the failing rows otherwise. Also: a user mistake is one line
and exit code 2 before any compute.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "reproduce.py"


def _run(args: list[str], tmp_path: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["nosuchpaper"], "invalid choice"),
        (["fedrec", "--table", "nosuchtable"], "unknown table"),
        (["fedrec", "--data", "does-not-exist"], "MovieLens 100K not found"),
        (["all", "--table", "rho"], "--table needs a single PAPER"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(tmp_path, args, message):
    proc = _run(args, tmp_path, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_all_quick_checks_pass(tmp_path, ml100k_path):
    proc = _run(["all", "--quick", "--out", str(tmp_path / "out"), "--data", str(ml100k_path)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (tmp_path / "out" / "quick.md").read_text()
    for paper in ("privmvmf", "fedrec", "fedsplit", "fedncf", "fedproto"):
        assert f"| {paper} |" in table
    assert "FAIL" not in table

"""Worker pools end with their parent: SIGKILL or SIGTERM of a `--jobs 2` sweep leaves no
process behind within 10 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
from tests.dummies import register_dummies
from privaudit.cli import main
register_dummies()
sys.exit(main(sys.argv[1:]))
"""

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")


def _children() -> dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            out[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _descendants(pid: int) -> set[int]:
    tree = _children()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in tree.items() if p in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            state = (Path("/proc") / str(p) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(p)
    return alive


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_parent_of_a_parallel_sweep_leaves_no_process(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SCRIPT,
            "attack",
            "--protocol",
            "dummy-proto",
            "--noise",
            "dummy-noise",
            "--scales",
            "0,1,2,3,4,5,6,7",
            "--set",
            "delay=2",
            "--seeds",
            "2",
            "--jobs",
            "2",
            "--out",
            str(tmp_path / "r"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        workers: set[int] = set()
        deadline = time.time() + 60
        while time.time() < deadline and len(workers) < 2:  # wait for the pool
            time.sleep(0.5)
            workers = _descendants(proc.pid)
        assert len(workers) >= 2, "the worker pool did not start"
        time.sleep(1.0)
        workers = _descendants(proc.pid)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        deadline = time.time() + 10
        while time.time() < deadline and _alive(workers):
            time.sleep(0.25)
        assert _alive(workers) == set(), f"left behind after {sig.name}: {sorted(_alive(workers))}"
    finally:
        if proc.poll() is None:
            proc.kill()

"""The README's Python example runs as written and prints the scores it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_readme_python_example_runs(tmp_path: Path) -> None:
    blocks = python_blocks()
    assert len(blocks) == 1, "the README has one Python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0], encoding="utf-8")
    env_path = str(ROOT)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": env_path},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    ndcg = float(re.search(r"NDCG@10 ([0-9.]+)", out).group(1))
    acc, prior, guess = map(
        float, re.search(r"rating accuracy ([0-9.]+) prior-only guess ([0-9.]+) random guess ([0-9.]+)", out).groups()
    )
    assert guess < prior < acc  # the prior-only guess beats the random one; the attack beats both
    # a trained model (well above a random ranking's NDCG@10 on 300 items) and an attack far above
    # the random guess of 1 in 5 ratings under Laplace noise of scale 1
    assert ndcg > 0.15
    assert guess == 0.2 and acc > 0.6
    assert "same score from the file: True" in out
    assert (tmp_path / "fedmvmf.ptx").is_file()
    assert re.search(r"^mvmf-analytic \(rating_accuracy\): ", out, flags=re.M)  # the sweep's verdict
    assert {"report.html", "results.json", "plan.toml"} <= {p.name for p in (tmp_path / "report").iterdir()}


def test_exported_names() -> None:
    import privaudit

    for name in (
        "load_dataset",
        "synthetic",
        "RatingsDataset",
        "Transcript",
        "get_protocol",
        "get_attack",
        "get_defense",
        "build_experiment",
        "run_experiment",
        "write_report",
        "Sweep",
        "PrivauditError",
    ):
        assert name in privaudit.__all__ and getattr(privaudit, name) is not None
    assert privaudit.get_protocol("fedmvmf").name == "fedmvmf"

"""The figures README.md and docs/first-run.md quote about the main job (``privaudit attack
--protocol fedmvmf``, its default grid) match a fresh run: every number of each marked span
(``<!-- fr:KEY -->...<!-- /fr -->``) within benchmarks/first_run.py's TOLERANCE (0.002), its
words equal. After a change of the default noise draws, the verdicts or the baselines:
``PYTHONPATH=. python benchmarks/first_run.py --update-docs`` rewrites them."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from privaudit.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _first_run():
    spec = importlib.util.spec_from_file_location("first_run", ROOT / "benchmarks" / "first_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """The figures of a fresh default fedmvmf run (what README.md quotes)."""
    out = tmp_path_factory.mktemp("first-run") / "fedmvmf"
    assert main(["attack", "--protocol", "fedmvmf", "--out", str(out), "--quiet"]) == 0
    fr = _first_run()
    return fr, fr.figures_of("fedmvmf", json.loads((out / "results.json").read_text()))


def test_quoted_figures_match_a_fresh_run(fresh):
    fr, figures = fresh
    assert fr.check_docs(figures) == [], "run: PYTHONPATH=. python benchmarks/first_run.py --update-docs"


def test_the_readme_quotes_the_verdict_numbers(fresh):
    fr, _ = fresh
    keys = {k for k, _ in fr.doc_spans((ROOT / "README.md").read_text(encoding="utf-8"))}
    assert {"fedmvmf.last_attack", "fedmvmf.baseline", "fedmvmf.lower", "fedmvmf.verdict"} <= keys
    keys = {k for k, _ in fr.doc_spans((ROOT / "docs" / "first-run.md").read_text(encoding="utf-8"))}
    assert {"fedmvmf.attack", "fedmvmf.utility", "fedmvmf.advantage", "fedmvmf.prior"} <= keys


def test_check_sees_a_changed_figure_and_update_rewrites_it(fresh, tmp_path):
    fr, figures = fresh
    for name in fr.DOCS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    readme = tmp_path / "README.md"
    text = readme.read_text(encoding="utf-8")
    quoted = figures["fedmvmf.last_attack"]
    off = f"{float(quoted) + 0.003:.3f}"  # beyond the tolerance
    readme.write_text(
        text.replace(f"<!-- fr:fedmvmf.last_attack -->{quoted}<", f"<!-- fr:fedmvmf.last_attack -->{off}<"),
        encoding="utf-8",
    )
    bad = fr.check_docs(figures, root=tmp_path)
    assert bad == [f"README.md: fedmvmf.last_attack quotes {off!r}, a fresh run gives {quoted!r}"]
    assert fr.check_docs(figures, root=tmp_path, words_only=True) == []  # --update-docs: numbers only
    near = f"{float(quoted) + 0.001:.3f}"  # within it
    readme.write_text(readme.read_text(encoding="utf-8").replace(f"-->{off}<", f"-->{near}<"), encoding="utf-8")
    assert fr.check_docs(figures, root=tmp_path) == []
    assert "fedmvmf.last_attack" in fr.update_docs(figures, root=tmp_path)
    assert f"<!-- fr:fedmvmf.last_attack -->{quoted}<" in readme.read_text(encoding="utf-8")
    # a changed word (the verdict) is a mismatch whatever the numbers
    readme.write_text(
        readme.read_text(encoding="utf-8").replace(
            f"<!-- fr:fedmvmf.verdict -->{figures['fedmvmf.verdict']}<", "<!-- fr:fedmvmf.verdict -->protected<"
        ),
        encoding="utf-8",
    )
    for words_only in (False, True):  # --update-docs names the reworded span
        assert [line.split(" quotes ")[0] for line in fr.check_docs(figures, root=tmp_path, words_only=words_only)] == [
            "README.md: fedmvmf.verdict"
        ]

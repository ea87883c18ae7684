"""audit.html and report.html rendered in headless Chromium: every figure present with a
non-zero size, no table wider than the page at 1,280 px, the screenshot not blank, and an XSS
payload in a shared results.json never executes or appears unescaped.

Skipped when Chromium is absent locally; under CI (``CI=true``) its absence is a failure
(``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from privaudit import audit as au
from privaudit import experiment as ex
from privaudit import reports
from tests.dummies import tiny_dataset

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1280,2000",
]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("Chromium is required under CI (.ci/run installs Debian's chromium package)")
    pytest.skip("Chromium not installed (apt-get install chromium); the browser check runs in CI")


def _run(chrome: str, tmp_path, page, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    return subprocess.run(
        [chrome, *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )


def _check_page(chrome: str, tmp_path, page, n_figures: int) -> None:
    from PIL import Image

    dom = _run(chrome, tmp_path, page, "--virtual-time-budget=3000", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body and 'data-rendered="1"' in body.group(0), "the page script did not run"
    assert f'data-figures="{n_figures}"' in body.group(0)
    assert 'data-wide-tables="0"' in body.group(0), body.group(0)  # every table fits the page at 1,280 px
    assert int(re.search(r'data-tables="(\d+)"', body.group(0)).group(1)) >= 2
    assert "data-pwned" not in dom.stdout
    figs = re.findall(r'<figure class="pa-figure"[^>]*>', dom.stdout)
    assert len(figs) == n_figures
    for tag in figs:
        sizes = {k: int(v) for k, v in re.findall(r'data-(width|height|svg-width|svg-height)="(\d+)"', tag)}
        assert set(sizes) == {"width", "height", "svg-width", "svg-height"}, tag
        assert sizes["svg-width"] > 300 and sizes["svg-height"] > 150, tag
        assert sizes["width"] > 0 and sizes["height"] > 0, tag  # laid out on the page, not collapsed
    if page.name == "report.html":  # every figure the folder holds is shown
        assert len(list(page.parent.glob("*.svg"))) == len(list(page.parent.glob("*.png"))) == n_figures
    shot = tmp_path / (page.stem + ".png")
    res = _run(chrome, tmp_path, page, f"--screenshot={shot}")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert img.shape == (2000, 1280)
    assert img.std() > 20  # not a blank page
    assert (img < 128).mean() > 0.01  # text, lines and cells drawn


@pytest.mark.usefixtures("dummy_registry")
def test_audit_and_report_html_render_in_chromium(tmp_path):
    chrome = _chromium()
    ds = tiny_dataset(20)
    audit = au.run_audit(au.Audit("dummy-proto", seeds=2, defenses=["dummy-noise", "dp-laplace"], jobs=1), dataset=ds)
    out = au.write_audit(audit, tmp_path / "audit")
    _check_page(chrome, tmp_path, out / "audit.html", n_figures=3 * 2 + 1)  # pairs and one ROC
    res = ex.build_experiment(protocol="dummy-proto", noise="dummy-noise", scales=(0, 1, 10), seeds=2).run(ds)
    rep = reports.write_report(res, tmp_path / "report")
    # the accuracy figure, the accuracy-vs-epsilon figure (the noise records an epsilon) and the ROC
    assert (rep / "accuracy_vs_noise_epsilon.svg").exists()
    _check_page(chrome, tmp_path, rep / "report.html", n_figures=3)


PAYLOAD = '<script>document.body.setAttribute("data-pwned","1")</script><img src=x onerror="document.body.setAttribute(\'data-pwned\',\'1\')">'


def _poison(obj, depth=0):
    """Every string of a results dict (values and keys) with the payload appended."""
    if isinstance(obj, dict):
        return {(k + PAYLOAD if depth > 0 and k not in KEEP else k): _poison(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_poison(v, depth + 1) for v in obj]
    if isinstance(obj, str):
        return obj + PAYLOAD
    return obj


#: Keys that structure the file (poisoning them would only make it unreadable).
KEEP = {
    "value",
    "seed",
    "attack_metrics",
    "baseline_random",
    "baseline_prior",
    "utility",
    "privacy",
    "roc",
    "empirical_epsilon",
    "advantage",
    "advantage_against",
    "supported",
    "seconds",
    "epsilon",
    "delta",
    "fpr",
    "tpr",
    "auc",
    "tpr@0.01",
    "tpr@0.001",
    "n_pos",
    "n_neg",
    "fpr_floor",
    "rows",
    "advantage_high",
    "advantage_low",
    "verdict",
    "dp_violation",
    "epsilon_lb",
    "claimed_epsilon",
    "violation",
}


@pytest.mark.usefixtures("dummy_registry")
def test_xss_payload_in_results_json_never_executes(tmp_path):
    import json

    from privaudit.cli import main

    ds = tiny_dataset(20)
    res = ex.build_experiment(protocol="dummy-proto", noise="dummy-noise", scales=(0, 1), seeds=2).run(ds)
    rep = reports.write_report(res, tmp_path / "report")
    data = json.loads((rep / "results.json").read_text())
    poisoned = _poison(data)
    poisoned["sweep"] = data["sweep"] + PAYLOAD
    poisoned["points"][0]["reason"] = PAYLOAD
    (rep / "results.json").write_text(json.dumps(poisoned))
    assert main(["report", str(rep), "--force"]) == 0
    page = (rep / "report.html").read_text()
    md = (rep / "report.md").read_text()
    assert page.count("<script") == 1 and "<img" not in page and 'onerror="' not in page
    assert "<script" not in md and "<img" not in md
    assert "&lt;script&gt;" in page  # shown as text
    chrome = _chromium()
    dom = _run(chrome, tmp_path, rep / "report.html", "--virtual-time-budget=3000", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert 'data-rendered="1"' in body and "data-pwned" not in body

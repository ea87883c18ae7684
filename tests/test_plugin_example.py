"""The worked plugin of docs/extending.md installs, registers through entry points, lists and runs.

The package is installed with pip into a temporary folder (``--target``, no dependencies, no
build isolation, so it works offline and never touches the running environment); every
privaudit command then runs in a subprocess whose PYTHONPATH holds that folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "privaudit-plugin-example"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("plugin")
    source = work / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = work / "site"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--target",
        str(target),
        str(source),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (target / "privaudit_plugin_example").is_dir()
    return target


def _run(plugin_path: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin_path), str(ROOT)]))
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=plugin_path.parent, timeout=timeout
    )


def test_list_and_describe_show_the_plugin(plugin_path):
    proc = _run(plugin_path, "-m", "privaudit", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {(r["kind"], r["name"]): r["description"] for r in json.loads(proc.stdout)}
    assert rows[("defense", "quantize")].startswith("round every uploaded float")
    assert rows[("attack", "uploaded-items")].startswith("server: a client rated")
    assert "plugin failed to load" not in proc.stderr
    proc = _run(plugin_path, "-m", "privaudit", "describe", "quantize")
    assert proc.returncode == 0, proc.stderr
    assert "step : float = 0.0  (a number >= 0)" in proc.stdout and "capabilities: upload" in proc.stdout
    assert "acts on: *.*" in proc.stdout


def test_plugin_classes_behave(plugin_path):
    """Quantize rounds to the grid; the attack's prior (majority) baseline is 1 - density."""
    code = textwrap.dedent(
        """
        import json
        import numpy as np
        from privaudit.defenses.base import UploadBatch
        from privaudit.experiment import run_transcript
        from privaudit.registry import get
        q = get("defense", "quantize")(step=0.5)
        batch = UploadBatch(0, "grad_V", ["client:0"], [{"items": np.array([1, 2]), "values": np.array([0.26, -0.74])}])
        out = q.on_upload(batch, None).payloads[0]
        t = run_transcript(protocol="fedmvmf").transcript
        attack = get("attack", "uploaded-items")()
        outcome = attack.evaluate(t, np.random.default_rng(0))
        n_rated = sum(len(t.private(p)["items"]) for p in t.clients())
        density = n_rated / (t.config["n_items"] * len(t.clients()))
        print(json.dumps({"values": out["values"].tolist(), "items": out["items"].tolist(),
                          "metrics": outcome.metrics, "prior": attack.prior_baseline(t, {}), "density": density,
                          "round9": attack.__class__(round=9).applicable(t.view("server")),
                          "fedsplit": q.acts_on_schema(get("protocol", "fedsplit").schema)}))
        """
    )
    proc = _run(plugin_path, "-c", code)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["values"] == [0.5, -0.5] and r["items"] == [1, 2]  # floats rounded, item ids untouched
    assert r["round9"] == [False, "no grad_V uploads in round 9"] and r["fedsplit"] is True
    assert r["prior"]["accuracy"] == pytest.approx(1.0 - r["density"])
    # obsonly uploads name exactly the rated items: every (client, item) pair right, far above the
    # majority guess (1 - density) and the random guess (0.5)
    assert r["metrics"]["accuracy"] == 1.0 > r["prior"]["accuracy"] > 0.5


def test_attack_command_runs_the_plugin(plugin_path, tmp_path):
    out = tmp_path / "report"
    proc = _run(
        plugin_path,
        "-m",
        "privaudit",
        "attack",
        "--protocol",
        "fedmvmf",
        "--attack",
        "uploaded-items",
        "--defense",
        "quantize",
        "--seeds",
        "1",
        "--jobs",
        "1",
        "--quiet",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["attack"] == "uploaded-items"
    assert [p["value"] for p in results["points"]] == [0.0, 0.5]  # the defense's default grid
    for point in results["points"]:
        metrics = point.get("attack_metrics", point.get("metrics"))
        assert metrics["accuracy"] == 1.0  # rounding values hides no item id
        assert metrics["victims"] == 180.0


def test_plugin_protocol_declares_everything_and_runs_with_its_defaults(plugin_path, tmp_path):
    """``item-means``: its schema, utility specs (rmse lower-is-better), defaults and estimate
    are declared; ``privaudit attack --protocol item-means`` alone runs its default sweep."""
    proc = _run(plugin_path, "-m", "privaudit", "describe", "item-means")
    assert proc.returncode == 0, proc.stderr
    for line in (
        "protocol item-means: federated item means",
        "  default attack: uploaded-items",
        "  messages: private, grad_V, state",
        "  utility metrics: rmse (lower is better), coverage (higher is better)",
        "  default sweep: quantize.step=0,0.5,1",
        "  default users: 50",
    ):
        assert line in proc.stdout, proc.stdout
    out = tmp_path / "report"
    proc = _run(
        plugin_path, "-m", "privaudit", "attack", "--protocol", "item-means", "--seeds", "2", "--jobs", "1", "--quiet",
        "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "item-means defaults: 50 users" in proc.stdout and "--sweep quantize.step=0,0.5,1" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["utility_metric"] == "rmse" and results["utility_specs"]["rmse"]["higher_is_better"] is False
    assert [p["value"] for p in results["points"]] == [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
    for point in results["points"]:  # uploads name exactly the trained items: far above the majority prior
        assert point["attack_metrics"]["accuracy"] == 1.0 > point["baseline_prior"]["accuracy"] > 0.5
    # coarser rounding of the residuals makes the item means worse: the utility cost is positive
    rmse = {p["value"]: p["utility"]["rmse"] for p in results["points"] if p["seed"] == 0}
    assert rmse[1.0] > rmse[0.0]
    # the audit sweeps sampling here (the protocol passes client data through the channel) but
    # not dp-sgd (no item_update / net_update payload)
    code = "from privaudit import audit; s, k = audit.applicable_defenses('item-means'); print([c.name for c in s])"
    proc = _run(plugin_path, "-c", code)
    assert "sampling" in proc.stdout and "quantize" in proc.stdout and "dp-sgd" not in proc.stdout


def test_the_example_protocol_shards_over_a_local_cluster(plugin_path, tmp_path):
    """``item-means`` declares its client round in blocks: spread over a 2-worker LocalCluster
    (4 blocks of 16 clients) its folder loads to the transcript of the same blocks in one process,
    message for message, and ``privaudit attack --transcript DIR`` reads it."""
    pytest.importorskip("dask.distributed")
    code = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        from privaudit import sharded
        from privaudit.cli import main
        from privaudit.data import synthetic
        from privaudit.protocols.base import RunSetup
        from privaudit.registry import get
        out = sys.argv[1]
        data = synthetic(n_users=60, n_items=40, seed=2)
        cls = get("protocol", "item-means")
        config = cls.resolve_config({"rounds": 3})
        local = cls().simulate_blocks(RunSetup(config, data, [], 4), block_size=16)
        with sharded.dask_client("local:2") as client:
            done = sharded.run_sharded("item-means", data, config, 4, client, out, block_size=16)
        merged = sharded.load_validated(out)
        same = len(merged) == len(local.transcript) and all(
            (a.round, a.sender, a.receiver, a.kind) == (b.round, b.sender, b.receiver, b.kind)
            and all(np.array_equal(a.payload[k], b.payload[k]) for k in a.payload)
            for a, b in zip(local.transcript.messages, merged.messages)
        )
        code = main(["attack", "--transcript", out, "--out", out + "-report", "--quiet"])
        print(json.dumps({"same": same, "model": bool(np.array_equal(local.model, done.result.model)),
                          "utility": done.result.utility == local.utility, "code": code, "n": len(merged),
                          "blocks": len(sharded.read_manifest(out)["blocks"])}))
        """
    )
    (tmp_path / "run").mkdir()
    proc = _run(plugin_path, "-c", code, str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r == {"same": True, "model": True, "utility": True, "code": 0, "n": 60 + 3 * (1 + 60), "blocks": 4}
    results = json.loads((tmp_path / "run-report" / "results.json").read_text())
    point = results["points"][0]
    assert point["attack_metrics"]["accuracy"] == 1.0 > point["baseline_prior"]["accuracy"]  # uploads name the items

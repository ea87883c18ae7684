"""Flower apps as their authors write them (tests/flower_apps/: stock strategies and mods, the
hyperparameters in [tool.flwr.app.config], only the two [tool.privaudit] hooks).

* the DP claim of a stock ``LocalDpMod`` checked against the mechanism (``dp_claims``), and
  the canary client's one-run epsilon lower bound: the misconfigured app (sensitivity 1e-4 for
  an update clipped to 1.0) at the ceiling, the consistent one within chance;
* the stock mods and strategy wrappers found with no privaudit line in the app;
* the implicit-feedback GMF app's positives from its uploads with no ``negatives`` key;
* (slow) a plain FedAvg MF app on 6 MovieLens users, hyperparameters from its run config.

One recording goes through ``privaudit record`` (Flower's simulation engine, Ray); the others
run the apps' ServerApp in process on a loop-back Grid that calls their ClientApp (its mods
included) as the SuperNodes do, through the same recorder.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from privaudit.integrations._flower_dp import check_claims
from privaudit.integrations.recorded import audit_transcript
from privaudit.transcript import load
from tests import flower_loop

pytest.importorskip("flwr", reason='Flower is not installed: pip install "privaudit[flower]"')

APPS = Path(__file__).resolve().parent / "flower_apps"
MISCONFIGURED = "LocalDpMod(clipping_norm=1.0, sensitivity=1e-4, epsilon=10, delta=1e-5)"
CONSISTENT = "LocalDpMod(clipping_norm=1.0, sensitivity=2.0, epsilon=0.5, delta=1e-5)"


LoopGrid = functools.partial(flower_loop.LoopGrid, first_id=5000, stride=11, run_id=7)


def record_in_process(app_dir: Path, run_dir: Path, clients: int, canaries: int = 0, **overrides):
    """The transcript ``privaudit record`` builds, with the simulation replaced by a loop-back Grid."""
    from flwr.app import Context, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from privaudit.integrations import _flower_grid as fg
    from privaudit.integrations import flower
    from privaudit.integrations import flower_canary as fc
    from privaudit.integrations._flower_mods import dp_mods, with_innermost

    app = flower.load_app(app_dir)
    package = app.clientapp.split(".")[0]
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]  # a variant of the same app copied elsewhere was imported before
    cfg = {**app.config, **overrides}
    server_app, client_app = flower._attr(app, app.serverapp), flower._attr(app, app.clientapp)
    rec = flower.FlowerRecorder(app.schema, run_dir)
    rec.client_dp = dp_mods(client_app)
    truth = fg.private_data_mod(flower._attr(app, app.private_data), run_dir)
    if canaries:
        clip = min((float(m.clipping_norm) for m in rec.client_dp), default=1.0)
        rec.canary = (int(cfg["seed"]), clip)
        client_app = with_innermost(client_app, fc.canary_mod(run_dir, clients, canaries, clip, int(cfg["seed"])))
        truth = fc.skip_partition(truth, clients)
    client_app = fg.with_mods(client_app, [truth])
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
    grid = LoopGrid(client_app, cfg, clients + (1 if canaries else 0))
    rec.start(cfg, flower._attr(app, app.public_info)(cfg))
    context = Context(run_id=7, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=cfg)
    server_app(fg.RecordingGrid(grid, rec), context)
    return rec.transcript(app=app.name, seed=int(cfg["seed"]), defenses=flower.recorded_defenses(rec))


def _variant(tmp: Path, mod: str) -> Path:
    """The LocalDpMod app with its ClientApp's mod replaced by ``mod`` (a copy)."""
    dst = tmp / "localdp_mf"
    shutil.copytree(APPS / "localdp_mf", dst, ignore=shutil.ignore_patterns("__pycache__"))
    path = dst / "localdp_mf" / "client_app.py"
    text = path.read_text()
    assert MISCONFIGURED in text
    path.write_text(text.replace(MISCONFIGURED, mod))
    return dst


def _row(result: dict, attack: str) -> dict:
    return next(r for r in result["rows"] if r["attack"] == attack)


# --------------------------------------------------------------------------- DP claims, canaries


@pytest.fixture(scope="module")
def misconfigured(tmp_path_factory):
    """The stock LocalDpMod app recorded by ``privaudit record`` (Ray): its output and transcript."""
    import contextlib
    import io

    from privaudit.cli import main

    out = tmp_path_factory.mktemp("ldp") / "run.ptx"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(
            ["record", "--flower", str(APPS / "localdp_mf"), "--clients", "4", "--cpus-per-client", "1", "-o", str(out)]
        )
    assert code == 0, buf.getvalue()
    return buf.getvalue(), load(out)


def test_a_stock_local_dp_mod_is_recorded_and_its_claim_fails(misconfigured):
    output, t = misconfigured
    assert "Flower defenses: LocalDpMod (clipping_norm=1, sensitivity=0.0001, epsilon=10, delta=1e-05)" in output
    (entry,) = t.config["defenses"]
    assert entry["name"] == "flower-local-dp" and entry["detected"] == "the ClientApp's mods"
    assert entry["rounds"] == 2 and entry["mechanism_sensitivity"] == 2.0 and entry["reported_by_clients"] == 4
    result = audit_transcript(t, ["generic-trained-items"])  # dp_claims and canaries come with any audit
    (claim,) = result["dp_claims"]
    assert set(claim) == {"component", "claimed_epsilon", "delivered_epsilon", "holds", "reason"}
    assert claim["component"] == "LocalDpMod" and claim["holds"] is False and claim["claimed_epsilon"] == 10.0
    # noise multiplier 4.84e-5 / 2 = 2.42e-5 for the true sensitivity: RDP gives ~9.4e8 per upload
    assert 5e8 < claim["delivered_epsilon"] < 2e9
    assert claim["reason"].startswith(
        "DP claim does not hold: LocalDpMod: noise calibrated to sensitivity 0.0001, "
        "the clipped update's sensitivity is 2 (2e+04 x larger): delivered epsilon per upload ~ 9.37e+08 vs claimed 10"
    )
    assert "classical Gaussian formula is used at epsilon 10 >= 1" in claim["reason"]
    assert "dp claim: DP claim does not hold: LocalDpMod" in output
    json.dumps(result["dp_claims"])  # the shape `--fail-on dp-violation` reads
    # the canary client: every guess right, the bound at the ceiling of 1000 canaries
    c = result["canaries"]
    assert c["canaries"] == 1000 and c["rounds"] == 2 and c["correct"] == c["guesses"] >= 500
    # the ceiling depends on how balanced the secret bits are: 4.6 to 5.3 for 1000 canaries
    assert c["epsilon_lb"] == pytest.approx(c["ceiling"]) and 4.0 < c["ceiling"] < 5.5
    assert c["epsilon_lb"] < c["delivered_epsilon"]
    # the changed rows: the noise floor separates the trained rows from LocalDpMod's noise
    assert _row(result, "generic-trained-items")["metrics"]["f1"] == 1.0
    canary = t.config["canaries"]["party"]
    assert canary not in {m.sender for m in t.select("private")}


def _gate(t, tmp: Path, capsys) -> tuple[int, str]:
    """``privaudit audit --transcript FILE --fail-on dp-violation`` on ``t``: exit code and stderr."""
    from privaudit.cli import main

    t.save(tmp / "run.ptx")
    capsys.readouterr()
    argv = ["audit", "--transcript", str(tmp / "run.ptx"), "--attack", "generic-trained-items"]
    code = main([*argv, "--out", str(tmp / "audit"), "--fail-on", "dp-violation"])
    return code, capsys.readouterr().err


def test_fail_on_dp_violation_flags_the_misconfigured_local_dp_mod(misconfigured, tmp_path, capsys):
    code, err = _gate(misconfigured[1], tmp_path, capsys)
    (line,) = err.strip().splitlines()  # one line naming the component and the cause
    assert code == 1 and "LocalDpMod" in line and "dp-violation" in line and "sensitivity is 2" in line


def test_the_consistent_local_dp_mod_holds_and_its_canaries_are_within_chance(tmp_path, capsys):
    t = record_in_process(_variant(tmp_path, CONSISTENT), tmp_path / "run", clients=4, canaries=1000)
    (entry,) = t.config["defenses"]
    assert (entry["sensitivity"], entry["epsilon"]) == (2.0, 0.5)
    (claim,) = audit_transcript(t)["dp_claims"]
    assert claim["holds"] is True and claim["reason"].startswith("DP claim holds: LocalDpMod")
    assert 0.3 < claim["delivered_epsilon"] < 0.5  # PLD of noise multiplier 9.69 at delta 1e-5
    from privaudit.integrations.flower_canary import canary_check

    c = canary_check(t)
    assert c["rounds"] == 2 and c["epsilon_lb"] < 0.5 and c["epsilon_lb"] <= c["delivered_epsilon"]
    assert "within chance" in c["line"] or c["epsilon_lb"] < 0.5
    code, err = _gate(t, tmp_path, capsys)
    assert code == 0 and err == ""  # the consistent claim passes the gate


def test_the_same_canaries_are_found_in_process_without_dp(tmp_path):
    """No DP mod: the canary client's upload is its canary vector, every guess right."""
    from privaudit.integrations.flower_canary import canary_check

    src = APPS / "localdp_mf"
    t = record_in_process(_variant(tmp_path, "LocalDpMod(1.0, 2.0, 1e6, 0.5)"), tmp_path / "run", 3, canaries=200)
    assert src.is_dir()
    c = canary_check(t)
    assert c["correct"] == c["guesses"] and c["epsilon_lb"] == pytest.approx(c["ceiling"])


def test_check_claims_of_the_strategy_wrappers():
    from flwr.serverapp import strategy as st

    from privaudit.integrations.flower_deploy import describe

    fixed = describe(st.DifferentialPrivacyServerSideFixedClipping(st.FedAvg(), 1.0, 0.5, 10), 3)
    (claim,) = check_claims(fixed)
    assert claim["holds"] is True and claim["claimed_epsilon"] is None
    assert "protects the released aggregate only: the server sees every raw upload" in claim["reason"]
    # adaptive clipping: Flower's count noise is calibrated to sensitivity 1/2, its 0/1 count has 1
    adaptive = describe(st.DifferentialPrivacyServerSideAdaptiveClipping(st.FedAvg(), 1.0, 20), 3)
    (claim,) = check_claims(adaptive)
    z_delta = (1.0 - 0.25) ** -0.5
    assert adaptive[0]["noise_multiplier"] == pytest.approx(z_delta)
    assert claim["holds"] is False and claim["delivered_epsilon"] > claim["claimed_epsilon"]
    assert "1 requested, 0.756 delivered" in claim["reason"]
    # LocalDpMod consistent in sensitivity but epsilon >= 1: the classical formula under-noises
    (claim,) = check_claims(describe(__import__("flwr").clientapp.mod.LocalDpMod(0.5, 1.0, 10, 1e-5), 2))
    assert claim["holds"] is False and 10.0 < claim["delivered_epsilon"] < 11.0
    assert check_claims([{"name": "flower-local-dp"}, "junk", {"name": "flower-secaggplus"}]) == []


def test_stock_mods_and_wrappers_are_found_without_app_code():
    from flwr.app import Message
    from flwr.clientapp import ClientApp
    from flwr.clientapp.mod import LocalDpMod, fixedclipping_mod

    from privaudit.integrations._flower_mods import dp_mods

    ldp = LocalDpMod(1.0, 2.0, 0.5, 1e-5)
    app = ClientApp(mods=[ldp])

    @app.train(mods=[fixedclipping_mod])
    def train(msg: Message, context) -> Message:  # pragma: no cover - never called
        return msg

    found = dp_mods(app)
    assert found[0] is ldp and fixedclipping_mod in found and len(found) == 2


# --------------------------------------------------------------------------- implicit feedback


def test_implicit_gmf_positives_leak_without_a_negatives_key(tmp_path):
    t = record_in_process(APPS / "implicit_gmf", tmp_path / "run", clients=6)
    assert "negatives" not in t.config and t.config["flower_run_config"]["num-negatives"] == 4
    result = audit_transcript(t)
    row = _row(result, "generic-interaction-inference")
    assert row["verdict"] == "leaks", row
    assert row["metrics"]["f1"] >= row["baseline_prior"]["f1"] + 0.2
    for name in ("generic-mf-ratings", "generic-mf-ratings-estimated"):
        assert _row(result, name)["verdict"] == "not applicable"
        assert "implicit feedback" in _row(result, name)["reason"]
    reason = _row(result, "flower-model-inconsistency")["reason"]
    assert "secure sum hides" not in reason and "no secure aggregation" in reason
    assert result["dp_claims"] == [] and result["canaries"] is None


# --------------------------------------------------------------------------- MovieLens (slow)


@pytest.mark.slow
def test_plain_fedavg_mf_ratings_from_its_run_config_on_movielens(tmp_path, ml100k_path):
    """6 MovieLens users, 2 rounds, ridge user vectors, 3 local steps: lr, lam, local-steps and
    mean are read from [tool.flwr.app.config]; the public-info hook gives only the item count
    and the rating scale."""
    data = str(ml100k_path)  # $PRIVAUDIT_ML100K, else ../shared/data/ml-100k (skips when absent)
    from privaudit.integrations.flower import record

    t = record(APPS / "ridge_mf", clients=6, run_config={"data": data}, cpus_per_client=1).transcript
    assert "lr" not in t.config and t.config["flower_run_config"]["local-steps"] == 3
    result = audit_transcript(t)
    row = _row(result, "generic-mf-ratings")
    assert row["verdict"] == "leaks" and row["metrics"]["accuracy"] >= 0.8, row
    est = _row(result, "generic-mf-ratings-estimated")
    assert est["metrics"]["accuracy"] >= est["baseline_prior"]["accuracy"]
    assert "no per-victim scores" not in json.dumps(est)
    # the mean hidden too: the estimated variant fits it per client, still above its prior
    import copy

    from privaudit import registry

    hidden = copy.copy(t)
    run = {k: v for k, v in t.config["flower_run_config"].items() if k not in ("lr", "lam", "local-steps", "mean")}
    hidden.config = {**t.config, "flower_run_config": run}
    out = registry.get("attack", "generic-mf-ratings-estimated")().evaluate(hidden, np.random.default_rng(0))
    # one mean for all clients: per-client means read 0.72-1.0 as float noise moved a near tie
    meta = out.reconstruction.meta
    assert meta["mean_source"] == "estimated, common to the clients" and meta["global_mean"] == pytest.approx(3.53)
    assert out.metrics["accuracy"] >= 0.95 > out.baseline_prior["accuracy"] + 0.5  # measured 1.000 (prior 0.303)
    assert math.isfinite(out.metrics["rmse"])


# --------------------------------------------------------------------------- deployment engine

#: the test app's ServerApp with the deployment hook (record_run, strategy not given) and a DP wrapper
DEPLOY_SERVER = """
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

from localdp_mf.task import init_items, public_info
from privaudit.integrations.flower_deploy import record_run

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    nodes = len(list(grid.get_node_ids()))
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)
    strategy = DifferentialPrivacyServerSideFixedClipping(strategy, 0.8, 0.5, nodes)
    with record_run(grid, context, public_info=public_info) as grid:
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord([init_items(context.run_config)]),
            num_rounds=int(context.run_config["num-server-rounds"]),
            train_config=ConfigRecord(),
        )
"""


def test_deployment_hooks_find_the_stock_mod_and_the_strategy_wrapper(tmp_path):
    """The app with the deployment engine's two hooks (``client_mod(private_data)`` first in its
    mods, ``record_run`` without the strategy) run in process as SuperNodes run it: the stock
    LocalDpMod it does not list and the DP wrapper of its strategy are both recorded."""
    from flwr.app import Context, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    app = _variant(tmp_path, CONSISTENT)
    pkg = app / "localdp_mf"
    client = (pkg / "client_app.py").read_text()
    hook = "from privaudit.integrations.flower_deploy import client_mod\n\nfrom localdp_mf.task import private_data\n\n"
    client = client.replace("app = ClientApp(mods=[", hook + "app = ClientApp(mods=[client_mod(private_data), ")
    (pkg / "client_app.py").write_text(client)
    (pkg / "server_app.py").write_text(DEPLOY_SERVER)
    for name in [n for n in sys.modules if n == "localdp_mf" or n.startswith("localdp_mf.")]:
        del sys.modules[name]
    sys.path.insert(0, str(app))
    try:
        from localdp_mf import client_app, server_app
    finally:
        sys.path.remove(str(app))
    out = tmp_path / "deploy.ptx"
    from privaudit.integrations.flower import load_app

    cfg = {**load_app(app).config, "privaudit-out": str(out)}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
    grid = LoopGrid(client_app.app, cfg, 4)
    server_app.main(
        grid, Context(run_id=7, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=cfg)
    )
    t = load(out)
    names = sorted(d["name"] for d in t.config["defenses"])
    assert names == ["flower-dp-server-fixed-clipping", "flower-local-dp"], t.config["defenses"]
    local = next(d for d in t.config["defenses"] if d["name"] == "flower-local-dp")
    assert local["reported_by_clients"] == 4 and local["rounds"] == 2 and local["sensitivity"] == 2.0
    fixed = next(d for d in t.config["defenses"] if d["name"] == "flower-dp-server-fixed-clipping")
    assert fixed["noise_multiplier"] == 0.8 and fixed["rounds"] == 2
    claims = {c["component"]: c for c in check_claims(t.config["defenses"])}
    assert (
        claims["LocalDpMod"]["holds"]
        and "the server sees every raw upload" in claims["DifferentialPrivacyServerSideFixedClipping"]["reason"]
    )

"""Recording under Flower's deployment engine (privaudit.integrations.flower_deploy).

Fast tests run the reference app examples/flower-plain-mf in process: its ServerApp ``main``
on a loop-back ``Grid`` that calls its ClientApp (with the Mods) for each message, as the
SuperNodes would. The slow test starts a real SuperLink and five SuperNodes on localhost and
runs the app with ``flwr run``.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from privaudit.errors import PrivauditError
from privaudit.integrations.recorded import audit_transcript
from privaudit.transcript import load
from tests import flower_loop

pytest.importorskip("flwr", reason='Flower is not installed: pip install "privaudit[flower]"')

APP = Path(__file__).resolve().parent.parent / "examples" / "flower-plain-mf"
CONFIG = {
    "num-server-rounds": 2,
    "dim": 8,
    "lr": 0.05,
    "lam": 0.05,
    "ridge": 1.0,
    "local-epochs": 5,
    "batch-size": 16,
    "global-mean": 3.5,
    "data": "synthetic",
    "data-users": 200,
    "data-items": 300,
    "seed": 0,
    "dp": "none",
    "dp-epsilon": 1.0,
    "dp-delta": 1e-5,
    "dp-clipping-norm": 0.5,
    "privaudit-out": "",
}


def _import_app():
    if str(APP) not in sys.path:
        sys.path.insert(0, str(APP))
    from plain_mf import client_app, server_app

    return server_app, client_app


LoopGrid = functools.partial(flower_loop.LoopGrid, first_id=1000, stride=7, run_id=5)


def _run_in_process(tmp_path: Path, nodes: int = 5, **overrides) -> Path:
    from flwr.app import Context, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    server_app, client_app = _import_app()
    out = tmp_path / "run.ptx"
    cfg = {**CONFIG, "privaudit-out": str(out), **overrides}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 5, SUPERLINK_NODE_ID
    grid = LoopGrid(client_app.app, cfg, nodes)
    context = Context(run_id=5, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=cfg)
    server_app.main(grid, context)
    return out


def _row(result: dict, attack: str) -> dict:
    return next(r for r in result["rows"] if r["attack"] == attack)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return load(_run_in_process(tmp_path_factory.mktemp("plain")))


def test_recorded_run_has_ground_truth_and_strips_privaudit_records(plain):
    assert plain.protocol == "flower" and plain.config["deployment"]["nodes"] == 5
    assert plain.config["defenses"] == [] and not plain.select("flower.error")
    private = plain.select("private")
    assert len(private) == 5
    _, client_app = _import_app()
    from plain_mf.task import dataset_of, user_split

    ds = dataset_of(CONFIG)
    for k, m in enumerate(sorted(private, key=lambda m: m.sender)):
        (items, ratings), _ = user_split(ds, k, 0)
        np.testing.assert_array_equal(m.payload["items"], items)
    # no upload carries the ground truth or the defenses record
    for m in plain.messages:
        if m.kind != "private":
            assert not any(k.startswith("privaudit.") for k in m.payload), m.kind
            assert not any(k.startswith("privaudit.") for k in m.meta.get("entries", {}))


def test_trained_items_leak_from_the_deployment_transcript(plain):
    row = _row(audit_transcript(plain), "generic-trained-items")
    assert row["verdict"] == "leaks"
    best = max(row["baseline_random"]["f1"], row["baseline_prior"]["f1"])
    assert row["metrics"]["f1"] > best + 0.5


def test_local_dp_is_recorded_with_its_claim_and_hides_the_trained_items(tmp_path):
    t = load(_run_in_process(tmp_path, nodes=5, dp="local", **{"dp-epsilon": 0.5}))
    assert not t.select("flower.error")
    (entry,) = t.config["defenses"]
    assert entry["name"] == "flower-local-dp" and entry["reported_by_clients"] == 5
    assert (entry["epsilon"], entry["delta"], entry["clipping_norm"], entry["sensitivity"]) == (0.5, 1e-5, 0.5, 1.0)
    assert entry["rounds"] == 2
    assert entry["noise_std"] == pytest.approx(1.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5)
    assert entry["basic_epsilon"] == pytest.approx(1.0)
    # dp-accounting composes the two Gaussian uploads tighter than basic composition
    assert 0.5 < entry["accounted_epsilon"] < entry["basic_epsilon"]
    row = _row(audit_transcript(t), "generic-trained-items")
    assert row["verdict"] != "leaks", row


def test_describe_local_dp_against_dp_accounting():
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    from flwr.clientapp.mod import LocalDpMod

    from privaudit.integrations.flower_deploy import describe

    (entry,) = describe(LocalDpMod(1.0, 2.0, 0.8, 1e-6), rounds=5)
    z = math.sqrt(2 * math.log(1.25 / 1e-6)) / 0.8
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.GaussianDpEvent(z), 5)
    assert entry["noise_std"] == pytest.approx(2.0 * z)
    assert entry["accounted_epsilon"] == pytest.approx(acc.get_epsilon(1e-6), rel=0.02)
    assert entry["accounted_epsilon"] < entry["basic_epsilon"] == pytest.approx(4.0)


@pytest.mark.parametrize("side", ["Server", "Client"])
def test_describe_fixed_clipping_strategies_against_dp_accounting(side):
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant
    from flwr.serverapp import strategy as st

    from privaudit.integrations.flower_deploy import describe

    cls = getattr(st, f"DifferentialPrivacy{side}SideFixedClipping")
    (entry,) = describe(cls(st.FedAvg(), noise_multiplier=1.1, clipping_norm=0.7, num_sampled_clients=10), 20, 1e-5)
    assert entry["side"] == side.lower() and entry["neighbour"].startswith("user-level")
    assert entry["noise_std"] == pytest.approx(1.1 * 0.7 / 10)
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(1.1), 20)
    # the PLD is tighter than RDP and within 20 % of it here
    assert 0.8 * rdp.get_epsilon(1e-5) < entry["accounted_epsilon"] <= rdp.get_epsilon(1e-5)
    assert describe(st.FedAvg(), 20) == []


def test_fixed_clipping_with_flowers_accountant_uses_its_delta():
    from flwr.serverapp import strategy as st
    from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    from privaudit.integrations.flower_deploy import describe

    cfg = PrivacyConfig(1e-3, 50, NeighboringRelation.ADD_OR_REMOVE_ONE, SamplingMethod.NO_AMPLIFICATION)
    dp = st.DifferentialPrivacyServerSideFixedClipping(st.FedAvg(), 1.0, 0.5, 50, accountant=RdpAccountant(cfg))
    (entry,) = describe(dp, rounds=3)
    (plain,) = describe(st.DifferentialPrivacyServerSideFixedClipping(st.FedAvg(), 1.0, 0.5, 50), 3, 1e-3)
    assert entry["accounted_delta"] == 1e-3 and entry["accounted_epsilon"] == plain["accounted_epsilon"]
    assert (
        entry["flower_accountant"]["releases"] == 0
        and entry["flower_accountant"]["neighbouring"] == "add-or-remove-one"
    )


def test_record_run_is_a_no_op_without_privaudit_out_and_refuses_bad_paths(tmp_path):
    from flwr.app import Context, RecordDict

    from privaudit.integrations.flower_deploy import record_run

    grid = object()
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=dict(CONFIG))
    with record_run(grid, ctx) as g:
        assert g is grid
    ctx.run_config["privaudit-out"] = str(tmp_path / "missing" / "run.ptx")
    with pytest.raises(PrivauditError, match="does not exist"):
        with record_run(grid, ctx):
            pass
    from privaudit.integrations._flower_grid import RecordingGrid

    ctx.run_config["privaudit-out"] = str(tmp_path / "run.ptx")
    with pytest.raises(PrivauditError, match="privaudit record already records"):
        with record_run(RecordingGrid(grid, None), ctx):
            pass
    ctx.run_config["privaudit-out"] = "run.ptx"
    with pytest.raises(PrivauditError, match="absolute path"):
        with record_run(grid, ctx):
            pass


# --------------------------------------------------------------------------- real deployment


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_flwr_run_against_a_local_superlink_is_recorded_and_audited(tmp_path):
    bindir = Path(sys.executable).parent
    if not (bindir / "flower-superlink").exists():
        pytest.skip("flower-superlink is not installed next to this Python")
    link, *node_ports = _free_ports(6)  # 5 SuperNodes: the fewest clients a victim bootstrap judges
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{link}"\ninsecure = true\n'
    )
    app = tmp_path / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    repo = str(APP.parent.parent)
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "run.ptx"
    procs: list[subprocess.Popen] = []
    logs = []

    def start(name: str, args: list[str]) -> None:
        log = open(tmp_path / f"{name}.log", "w")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [str(bindir / args[0]), *args[1:]],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    try:
        start(
            "superlink",
            ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation", "--host", "127.0.0.1"]
            + ["--port", str(link), "--database", ":flwr-in-memory:"],
        )
        _wait_for(lambda: _listening(link), 180, "the SuperLink")
        for k, port in enumerate(node_ports):
            start(
                f"supernode{k}",
                ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{link}", "--host", "127.0.0.1"]
                + ["--port", str(port), "--node-config", f"partition-id={k} num-partitions={len(node_ports)}"],
            )
        run = subprocess.run(
            [str(bindir / "flwr"), "run", str(app), "test", "--stream", "--run-config", f'privaudit-out="{out}"'],
            env=env,
            cwd=app,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert out.is_file(), run.stdout[-2000:] + run.stderr[-2000:]
    finally:
        for p in reversed(procs):
            with_group = p.pid
            try:
                os.killpg(with_group, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        for log in logs:
            log.close()
    t = load(out)
    assert len(t.select("private")) == 5
    audit = subprocess.run(
        [sys.executable, "-m", "privaudit", "audit", "--transcript", str(out), "--out", str(tmp_path / "audit")],
        env={**os.environ, "PYTHONPATH": repo},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert audit.returncode == 0, audit.stderr
    line = next(x for x in audit.stdout.splitlines() if x.startswith("generic-trained-items"))
    assert line.rstrip().endswith("leaks (f1)"), audit.stdout


def test_side_channel_carries_the_clients_dp_mods(tmp_path):
    """Under `privaudit record` the client Mod writes its DP mods to the side channel; the
    recorder merges one entry per distinct description with the nodes that reported it, and
    leaves out a malformed file and entries that are not objects with a string name."""
    from privaudit.integrations._sidechannel import merge_defenses, write_defenses

    entry = {"name": "flower-local-dp", "mod": "LocalDpMod", "epsilon": 1.0}
    for node in (7, 9):
        write_defenses(tmp_path, node, [entry, {"name": 3}, "x"])
    write_defenses(tmp_path, 7, [{"name": "other"}])  # once per node: the first write stays
    (tmp_path / "defenses" / "11.json").write_text("{not json")
    entries, reported = merge_defenses(tmp_path)
    assert list(entries.values()) == [entry] and list(reported.values()) == [{7, 9}]


@pytest.mark.slow
def test_local_dp_under_the_simulation_engine_is_recorded(tmp_path):
    """`privaudit record` of the example with dp=local lists LocalDpMod in the transcript's
    defenses, composed over the rounds each client trained in."""
    pytest.importorskip("flwr")
    from privaudit.integrations.flower import record

    rec = record(APP, clients=5, rounds=2, run_config={"dp": "local"}, cpus_per_client=1.0)
    (entry,) = [d for d in rec.transcript.config["defenses"] if d["name"] == "flower-local-dp"]
    assert entry["reported_by_clients"] == 5 and entry["rounds"] == 2
    assert entry["basic_epsilon"] == pytest.approx(2 * entry["epsilon"])
    assert 0 < entry["accounted_epsilon"] < entry["basic_epsilon"]

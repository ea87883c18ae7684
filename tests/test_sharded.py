"""Sharded protocol runs (privaudit.sharded): a LocalCluster of 2 worker processes gives the
single-process run's transcript, model, utility and attack metrics; the shard directory is
checked like every input; ``privaudit run --scheduler`` refuses bad input in one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("dask.distributed")

from privaudit import sharded  # noqa: E402
from privaudit.cli import main  # noqa: E402
from privaudit.data.synthetic import synthetic  # noqa: E402
from privaudit.errors import PrivauditError, TranscriptError  # noqa: E402
from privaudit.experiment import attack_transcript  # noqa: E402
from privaudit.models import mvmf  # noqa: E402
from privaudit.protocols import fedmvmf  # noqa: E402
from privaudit.protocols.blocks import Accumulator, MVMFSettings, client_loss, server_loss  # noqa: E402

BLOCK = 40  # clients per block here: 7 blocks over the 2 workers


@pytest.fixture(scope="module")
def client():
    with sharded.dask_client("local:2") as c:
        yield c


@pytest.fixture(scope="module")
def data():
    return synthetic(n_users=300, n_items=120, min_ratings=8, density=0.08, seed=5)


def _same_transcript(a, b):
    assert len(a) == len(b) and len(a) > 0
    assert (a.protocol, a.config, a.seed, a.dataset, a.parties) == (b.protocol, b.config, b.seed, b.dataset, b.parties)
    for x, y in zip(a.messages, b.messages):
        assert (x.seq, x.round, x.sender, x.receiver, x.kind, x.meta) == (
            y.seq,
            y.round,
            y.sender,
            y.receiver,
            y.kind,
            y.meta,
        )
        assert x.payload.keys() == y.payload.keys()
        for key in x.payload:
            assert x.payload[key].dtype == y.payload[key].dtype
            assert np.array_equal(x.payload[key], y.payload[key]), (x.seq, x.kind, key)


CASES = [{"update": "semials", "unrated": "obsonly"}, {"update": "sgd", "unrated": "inclunc", "eta": 0.01}]


@pytest.mark.parametrize("settings", CASES, ids=["semials-obsonly", "sgd-inclunc"])
def test_fedmvmf_two_workers_equal_single_process(client, data, settings, tmp_path, monkeypatch):
    cfg = {"epochs": 3, "record_rounds": 2, "K": 6, **settings}
    monkeypatch.setattr(fedmvmf, "CLIENT_BLOCK", BLOCK)
    single = fedmvmf.FedMVMF().run(data, cfg, rng=11)
    done = sharded.run_sharded("fedmvmf", data, cfg, 11, client, tmp_path, block_size=BLOCK)
    assert len(client.nthreads()) == 2 and len(done.worker_peak) == 2
    merged = sharded.load(tmp_path)
    _same_transcript(single.transcript, merged)
    for key in ("U", "V", "P", "Q", "U_init", "U_cold", "V_cold", "loss"):
        assert np.array_equal(single.model[key], done.result.model[key]), key
    utility = {k: v for k, v in single.utility.items() if k != "epoch_seconds"}
    assert utility == {k: v for k, v in done.result.utility.items() if k != "epoch_seconds"}
    # and the attack is informative: it recovers the ratings better than the prior-only guess
    a = attack_transcript(single.transcript)["points"][0]
    b = attack_transcript(merged)["points"][0]
    assert a["attack_metrics"] == b["attack_metrics"] and a["baseline_prior"] == b["baseline_prior"]
    assert a["attack_metrics"]["rating_accuracy"] > a["baseline_prior"]["rating_accuracy"] + 0.05
    # the same attack per shard on the workers, its per-victim sums merged
    per_shard = sharded.attack_shards(tmp_path, client)
    assert per_shard["blocks"] == 7
    assert per_shard["metrics"] == {k: a["attack_metrics"][k] for k in per_shard["metrics"]}
    assert per_shard["baseline"] == {k: a["baseline_random"][k] for k in per_shard["baseline"]}


def test_fedrec_pmf_batch_two_workers_equal_single_process(client, data, tmp_path, monkeypatch):
    from privaudit.protocols import fedrec

    cfg = {"T": 4, "record_rounds": [0, -1], "d": 5}
    monkeypatch.setattr(fedrec, "CLIENT_BLOCK", BLOCK)
    single = fedrec.FedRec().run(data, cfg, rng=8)
    done = sharded.run_sharded("fedrec", data, cfg, 8, client, tmp_path, block_size=BLOCK)
    merged = sharded.load(tmp_path)
    _same_transcript(single.transcript, merged)
    assert {m.kind for m in merged.messages} == {"private", "state", "grad_V"}
    for key in ("U", "V", "test_rmse", "test_mae"):
        assert np.array_equal(single.model[key], done.result.model[key]), key
    utility = {k: v for k, v in single.utility.items() if k != "iteration_seconds"}
    assert utility == {k: v for k, v in done.result.utility.items() if k != "iteration_seconds"}
    a = attack_transcript(single.transcript)["points"][0]
    np.testing.assert_equal(a["attack_metrics"], attack_transcript(merged)["points"][0]["attack_metrics"])
    with pytest.raises(PrivauditError, match="pmf-batch model only"):
        sharded.run_sharded("fedrec", data, {"model": "pmf-sgd"}, 8, client, tmp_path / "x")
    # its default attack declares no per-shard scoring: refused before any block is read
    with pytest.raises(PrivauditError, match="'fedrec-rated-items' is not scored per shard"):
        sharded.attack_shards(tmp_path, client)


def test_block_partials_are_the_whole_sum(data):
    """The per-block sums and loss parts folded over blocks equal the all-clients formulas."""
    run = fedmvmf.FedMVMF().open_run(
        fedmvmf.RunSetup(fedmvmf.FedMVMF.resolve_config({"K": 5}), data, [], 3), private=False
    )
    whole = run.client_blocks(3, size=10**6)[0]
    blocks = run.client_blocks(3, size=17)
    st, V, P = run.st, run.state.V, run.state.P
    total = Accumulator()
    for b in blocks:
        part = fedmvmf.mvmf_block_round(b, V, P, st, uploads=True)
        grad_V, grad_P = (x.payloads() for x in part.uploads.batches(0, [f"client:{u}" for u in range(b.U.shape[0])]))
        got_V = np.zeros_like(V)
        for payload in grad_V:
            got_V[payload["items"]] += payload["values"]
        assert np.allclose(got_V, part.sum_V) and np.allclose(sum(p["values"] for p in grad_P), part.sum_P)
        total.add(part.sum_V, part.sum_P, part.loss)
    ref = fedmvmf.mvmf_block_round(whole, V, P, st, uploads=False)
    assert np.allclose(total.values[0], ref.sum_V) and np.allclose(total.values[1], ref.sum_P)
    # u_u is per client, but the batched solve of 17 systems and of 270 may round differently
    # (numpy promises no bit identity across batch shapes; seen: 2.8e-17): docs/scale.md's tolerance
    np.testing.assert_allclose(np.concatenate([b.U for b in blocks]), whole.U, rtol=1e-12, atol=1e-15)
    again = run.client_blocks(3, size=17)  # the same block size: bit for bit
    for b, c in zip(blocks, again):
        fedmvmf.mvmf_block_round(c, V, P, st, uploads=False)
        assert np.array_equal(b.U, c.U)
    R, W, X, Y, Q = whole.ratings, whole.weights, whole.X, run.views.Y_train, run.state.Q
    full = mvmf.loss(whole.U, V, P, Q, R, W, X, Y, st.alpha, st.lam, st.w, st.unrated)
    assert total.values[2] + server_loss(V, P, Q, Y, st) == pytest.approx(full, rel=1e-12)
    inclunc = MVMFSettings(st.K, st.alpha, st.lam, 0.3, st.eta, st.update, "inclunc")
    full = mvmf.loss(whole.U, V, P, Q, R, W, X, Y, st.alpha, st.lam, 0.3, "inclunc")
    assert client_loss(whole.U, V, P, R, W, X, inclunc) + server_loss(V, P, Q, Y, inclunc) == pytest.approx(full)


# ------------------------------------------------------------------------- hostile shard directories


@pytest.fixture(scope="module")
def shard_dir(client, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    sharded.run_sharded("fedmvmf", data, {"epochs": 2, "K": 4}, 2, client, out, block_size=100)
    return out


def _copy(shard_dir, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(shard_dir, target)
    return target


def _edit(folder, change):
    doc = json.loads((folder / sharded.MANIFEST).read_text())
    change(doc)
    (folder / sharded.MANIFEST).write_text(json.dumps(doc))


def _set(key, value):
    return lambda doc: doc.__setitem__(key, value)


def _block(key, value):
    return lambda doc: doc["blocks"][1].__setitem__(key, value)


HOSTILE = [
    (_set("format", "zip"), "not a privaudit-sharded-run manifest"),
    (_set("version", 2), "version 2 is not supported"),
    (_set("clients", True), "clients must be an integer"),
    (_set("clients", 10**12), "clients must be an integer"),
    (_set("rounds", [1, 0]), "strictly increasing"),
    (_set("blocks", []), "blocks must list"),
    (_set("protocol", "fedncf"), "not one a sharded run supports"),
    (_block("lo", 0), "block 1 must hold clients"),
    (_block("hi", 10**6), "block 1 hi must be an integer in 0..270"),
    (_block("private", "../c000001-private.ptx"), "private shard must be named"),
    (_block("rounds", ["../../etc/passwd", "c000001-r000001.ptx"]), "must list its shard of every round"),
    (lambda doc: doc["blocks"][0].__setitem__("extra", 1), "exactly lo, hi, private and rounds"),
    (_set("server", "/etc/passwd"), "not of the form the manifest allows"),
]


@pytest.mark.parametrize("change,fragment", HOSTILE)
def test_hostile_manifest_is_refused(shard_dir, tmp_path, change, fragment):
    folder = _copy(shard_dir, tmp_path)
    _edit(folder, change)
    with pytest.raises(TranscriptError, match=fragment.replace("(", r"\(")):
        sharded.load(folder)


def test_hostile_files_are_refused(shard_dir, tmp_path, data, client):
    folder = _copy(shard_dir, tmp_path)
    assert len(sharded.load(folder)) > 0
    (folder / sharded.MANIFEST).write_text("[" * 100 + "]" * 100)
    with pytest.raises(TranscriptError, match="unreadable manifest"):
        sharded.load(folder)
    folder = _copy(shard_dir, tmp_path / "b")
    victim = folder / "c000001-r000000.ptx"
    victim.unlink()
    victim.symlink_to(folder / "c000000-r000000.ptx")
    with pytest.raises(TranscriptError, match="missing or not a regular file"):
        sharded.load(folder)
    # a shard of block 0 in block 1's place: its senders are not block 1's clients
    folder = _copy(shard_dir, tmp_path / "d")
    shutil.copy(folder / "c000000-r000000.ptx", folder / "c000001-r000000.ptx")
    with pytest.raises(TranscriptError, match="is not a client of this block"):
        sharded.load(folder)
    # a round-1 shard in a round-0 place
    folder = _copy(shard_dir, tmp_path / "e")
    shutil.copy(folder / "c000001-r000001.ptx", folder / "c000001-r000000.ptx")
    with pytest.raises(TranscriptError, match="of round 1 does not belong in this shard"):
        sharded.load(folder)
    # a shard of another run (another seed) in its own block's place
    other = tmp_path / "other"
    other.mkdir()
    sharded.run_sharded("fedmvmf", data, {"epochs": 2, "K": 4}, 3, client, other, block_size=100)
    folder = _copy(shard_dir, tmp_path / "c")
    shutil.copy(other / "c000001-r000001.ptx", folder / "c000001-r000001.ptx")
    with pytest.raises(TranscriptError, match="belongs to another run"):
        sharded.load(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TranscriptError, match="not a sharded run"):
        sharded.load(tmp_path / "empty")


# ------------------------------------------------------------------------- command line


def _one_line_error(capsys, argv, fragment):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert fragment in err, err


@pytest.mark.parametrize(
    "address,fragment",
    [
        ("tcp://nohost", "expected local:N or tcp://HOST:PORT"),
        ("tcp://127.0.0.1:0", "expected local:N or tcp://HOST:PORT"),
        ("http://127.0.0.1:8786", "expected local:N or tcp://HOST:PORT"),
        ("local:0", "local:N needs 1 <= N <= 256"),
        ("local:x", "expected local:N"),
    ],
)
def test_bad_scheduler_is_one_line_before_any_compute(capsys, tmp_path, monkeypatch, address, fragment):
    import privaudit.experiment

    monkeypatch.setattr(privaudit.experiment, "load_data", lambda *a, **k: pytest.fail("data built"))
    argv = ["run", "--protocol", "fedmvmf", "--scheduler", address, "-o", str(tmp_path / "out")]
    _one_line_error(capsys, argv, fragment)


def test_unreachable_scheduler_and_unsupported_runs(capsys, tmp_path, monkeypatch):
    import privaudit.experiment

    monkeypatch.setattr(privaudit.experiment, "load_data", lambda *a, **k: pytest.fail("data built"))
    out = str(tmp_path / "out")
    _one_line_error(
        capsys, ["run", "--protocol", "fedmvmf", "--scheduler", "tcp://127.0.0.1:9", "-o", out], "cannot connect"
    )
    _one_line_error(
        capsys,
        ["run", "--protocol", "fedncf", "--scheduler", "local:1", "-o", out],
        "protocol 'fedncf' does not run in client blocks",
    )
    argv = ["run", "--protocol", "fedmvmf", "--defense", "laplace:scale=1", "--scheduler", "local:1", "-o", out]
    _one_line_error(capsys, argv, "without defenses")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    argv = ["run", "--protocol", "fedmvmf", "--scheduler", "local:1", "-o", str(tmp_path / "full"), "--force"]
    _one_line_error(capsys, argv, "not a sharded run's")


def test_cli_sharded_run_equals_cli_run(capsys, tmp_path):
    from privaudit.transcript import load

    args = ["--protocol", "fedmvmf", "--data", "synthetic:users=90,items=60", "--set", "epochs=2", "--seed", "4"]
    assert main(["run", *args, "-o", str(tmp_path / "one.ptx")]) == 0
    assert main(["run", *args, "--scheduler", "local:1", "-o", str(tmp_path / "dir")]) == 0
    out = capsys.readouterr().out
    assert "sharded run written to" in out and "ndcg@10" in out
    _same_transcript(load(tmp_path / "one.ptx"), sharded.load(tmp_path / "dir"))
    # privaudit attack --transcript reads the folder like the file
    for name in ("one.ptx", "dir"):
        assert (
            main(["attack", "--transcript", str(tmp_path / name), "--out", str(tmp_path / f"rep-{name}"), "--quiet"])
            == 0
        )
    points = [json.loads((tmp_path / f"rep-{n}" / "results.json").read_text())["points"][0] for n in ("one.ptx", "dir")]
    assert points[0]["attack_metrics"] == points[1]["attack_metrics"] and points[0]["attack_metrics"]["victims"] > 0
    with pytest.raises(PrivauditError, match="not empty"):
        sharded._prepare_output(tmp_path / "dir", force=False)


def test_true_values_equal_true_ratings_client_by_client():
    from privaudit.attacks.mvmf._core import true_ratings
    from privaudit.attacks.mvmf._shards import true_values

    rng = np.random.default_rng(3)
    items, rated, ratings, private = [], [], [], {}
    for c in range(40):
        own = rng.choice(50, size=int(rng.integers(0, 12)), replace=False)
        private[f"client:{c}"] = {"items": own, "ratings": rng.integers(1, 6, own.size).astype(float)}
        rated.append(own)
        ratings.append(private[f"client:{c}"]["ratings"])
        items.append(rng.choice(60, size=int(rng.integers(0, 20)), replace=False) if c % 3 else np.arange(60))
    expected = np.concatenate([true_ratings(private, f"client:{c}", items[c]) for c in range(40)])
    got = true_values(items, rated, ratings)
    assert np.array_equal(got, expected) and (got > 0).sum() > 50 and (got == 0).sum() > 50
    with pytest.raises(PrivauditError, match="non-negative"):
        true_values([np.array([-1])], [np.array([2])], [np.array([3.0])])

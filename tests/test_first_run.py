"""A new user's mistakes end in one line with exit code 2 before any compute; every advertised
input runs (a ratings CSV for all six protocols)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from privaudit import cli, experiment
from privaudit.cli import main
from privaudit.data import load_dataset
from privaudit.errors import DataError, MissingDependencyError, missing_dependency

ROOT = Path(__file__).resolve().parents[1]


def one_line_error(capsys, argv: list[str], pattern: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("privaudit: error: "), err
    assert __import__("re").search(pattern, lines[0]), lines[0]
    return lines[0]


# ---------------------------------------------------------------------------- CSV header


def test_csv_header_by_name_and_aliases(tmp_path: Path) -> None:
    a = tmp_path / "a.csv"
    a.write_text("userId,movieId,rating,timestamp\n1,10,4,100\n2,10,5,200\n2,11,1,300\n")
    b = tmp_path / "b.csv"  # same data, other aliases, other order, semicolons
    b.write_text("ts;iid;score;uid\n100;10;4;1\n200;10;5;2\n300;11;1;2\n")
    da, db = load_dataset(a), load_dataset(b)
    np.testing.assert_array_equal(da.ratings.toarray(), [[4, 0], [5, 1]])
    np.testing.assert_array_equal(db.ratings.toarray(), da.ratings.toarray())
    np.testing.assert_array_equal(db.timestamps.toarray(), da.timestamps.toarray())
    c = tmp_path / "c.csv"  # no header: read by position
    c.write_text("1,10,4,100\n2,10,5,200\n2,11,1,300\n")
    np.testing.assert_array_equal(load_dataset(c).ratings.toarray(), da.ratings.toarray())


@pytest.mark.parametrize(
    ("header", "pattern"),
    [
        ("usr,itm,score", r"line 1: unknown column 'usr' in the header 'usr,itm,score' \(accepted names: user: user, "),
        ("user,item", r"line 1: the header 'user,item' has no rating column"),
        ("user,item,rating,rating", r"line 1: two rating columns"),
    ],
)
def test_csv_bad_header(tmp_path, capsys, no_compute, header: str, pattern: str) -> None:
    path = tmp_path / "r.csv"
    n = header.count(",") + 1
    path.write_text(header + "\n" + ",".join(["1", "2", "3", "4"][:n]) + "\n")
    argv = ["attack", "--protocol", "fedmvmf", "--data", str(path), "--out", str(tmp_path / "o")]
    one_line_error(capsys, argv, pattern)


# ---------------------------------------------------------------------------- rating scale


@pytest.mark.parametrize("bad", ["9", "15", "1000", "4.5"])
def test_ratings_off_the_scale_are_refused(tmp_path, capsys, no_compute, bad: str) -> None:
    path = tmp_path / "r.csv"
    path.write_text(f"user,item,rating\n1,1,4\n1,2,{bad}\n")
    why = "is not a multiple of 1" if bad == "4.5" else r"is outside the range 1\.\.5"
    one_line_error(
        capsys,
        ["run", "--protocol", "fedmvmf", "--data", str(path), "-o", str(tmp_path / "t.ptx")],
        rf"r\.csv line 3: rating '{bad}' {why} .*--rating-scale MIN,MAX\[,STEP\]",
    )


def test_rating_scale_declares_another_scale(tmp_path, capsys, no_compute) -> None:
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n1,1,4\n1,2,4.5\n")
    ds = load_dataset(path, rating_scale="0.5,5,0.5")
    assert (ds.rating_min, ds.rating_max, ds.rating_step) == (0.5, 5.0, 0.5)
    assert load_dataset(path, rating_scale=(1, 10, 0)).rating_step == 0.0  # continuous
    with pytest.raises(DataError, match=r"rating '4\.5' is not a multiple of 1$"):
        load_dataset(path, rating_scale="1,5")  # declared: no hint about the CSV default
    one_line_error(
        capsys,
        ["attack", "--protocol", "fedmvmf", "--rating-scale", "1,5", "--out", str(tmp_path / "o")],
        r"--rating-scale applies to --data PATH",
    )
    for spec, pattern in (
        ("5", "expected MIN,MAX"),
        ("0,5", "MIN must be positive"),
        ("5,1", "MIN <= MAX"),
        ("1,5,0.3", "multiple of STEP"),
    ):
        one_line_error(
            capsys,
            [
                "attack",
                "--protocol",
                "fedmvmf",
                "--data",
                str(path),
                "--rating-scale",
                spec,
                "--out",
                str(tmp_path / "o"),
            ],
            pattern,
        )


# ---------------------------------------------------------------------------- --users


def test_users_above_the_data_is_an_error(tmp_path, capsys, no_compute) -> None:
    one_line_error(
        capsys,
        ["attack", "--protocol", "fedmvmf", "--users", "100000", "--out", str(tmp_path / "o")],
        r"--users 100000: the dataset has only 200 users",
    )
    one_line_error(
        capsys,
        ["run", "--protocol", "fedmvmf", "--users", "201", "-o", str(tmp_path / "t.ptx")],
        r"--users 201: the dataset has only 200 users",
    )


# ---------------------------------------------------------------------------- outputs


def test_output_in_a_missing_folder(tmp_path, capsys, no_compute) -> None:
    one_line_error(
        capsys,
        ["run", "--protocol", "fedmvmf", "-o", str(tmp_path / "nodir" / "x.ptx")],
        r"x\.ptx: the folder .*nodir does not exist",
    )
    (tmp_path / "file").write_text("x")
    one_line_error(
        capsys, ["attack", "--protocol", "fedmvmf", "--out", str(tmp_path / "file")], r"exists and is not a folder"
    )
    one_line_error(
        capsys,
        ["attack", "--protocol", "fedmvmf", "--out", str(tmp_path / "file" / "sub")],
        r"cannot create the report folder",
    )


def test_existing_outputs_need_force(tmp_path, capsys, no_compute) -> None:
    ptx = tmp_path / "t.ptx"
    ptx.write_bytes(b"old")
    one_line_error(capsys, ["run", "--protocol", "fedmvmf", "-o", str(ptx)], r"t\.ptx already exists; pass --force")
    assert ptx.read_bytes() == b"old"
    report = tmp_path / "rep"
    report.mkdir()
    (report / "results.json").write_text("{}")
    for command in ("attack", "audit"):
        argv = [command, "--protocol", "fedmvmf", "--out", str(report)]
        one_line_error(capsys, argv, r"rep/ already exists; pass --force")
    assert (report / "results.json").read_text() == "{}"


def test_default_report_folders_name_the_dataset(tmp_path) -> None:
    parser = cli.build_parser()

    def folder(*argv: str) -> str:
        return cli.default_report_dir(parser.parse_args(["attack", *argv]))

    syn = folder("--protocol", "fedmvmf", "--noise", "laplace")
    csv = folder("--protocol", "fedmvmf", "--noise", "laplace", "--data", str(tmp_path / "ratings.csv"))
    ml = folder("--protocol", "fedmvmf", "--noise", "laplace", "--data", "/x/ml-100k/", "--users", "50")
    assert Path(syn).name == "fedmvmf-laplace.scale-synthetic"
    assert Path(csv).name == "fedmvmf-laplace.scale-ratings"
    assert Path(ml).name == "fedmvmf-laplace.scale-ml-100k-u50"
    assert Path(folder("--transcript", "runs/a.ptx")).name == "a-transcript"


def test_force_replaces_a_transcript(tmp_path, capsys) -> None:
    ptx = tmp_path / "t.ptx"
    ptx.write_bytes(b"old")
    code = main(["run", "--protocol", "fedrec", "--users", "30", "--set", "T=2", "-o", str(ptx), "--force"])
    assert code == 0 and ptx.stat().st_size > 100


# ---------------------------------------------------------------------------- missing extras

BLOCKER = """
import sys


class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "opacus"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Block())
"""


@pytest.fixture
def without_torch(tmp_path) -> dict:
    """Environment whose interpreters (workers included) cannot import torch or opacus."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


@pytest.mark.parametrize(
    "argv",
    [
        ["attack", "--protocol", "fedncf"],
        ["audit", "--protocol", "fedncf"],
        ["run", "--protocol", "fedncf", "-o", "t.ptx"],
        ["attack", "--protocol", "fedmvmf", "--defense", "dp-sgd"],
    ],
)
def test_missing_extra_one_line_before_any_work(tmp_path, without_torch, argv) -> None:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "privaudit", *argv],
        cwd=tmp_path,
        env=without_torch,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and 'pip install "privaudit[ncf]"' in lines[0], proc.stderr
    assert "torch is required for" in lines[0] or "opacus is required" in lines[0]
    assert not list(tmp_path.glob("privaudit-report*")) and not (tmp_path / "t.ptx").exists()
    assert time.perf_counter() - t0 < 120


def test_missing_dask_extra_for_scheduler(tmp_path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.replace('("torch", "opacus")', '("dask", "distributed")'))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    for command in ("attack", "audit"):
        argv = [sys.executable, "-m", "privaudit", command, "--protocol", "fedmvmf", "--scheduler", "local:2"]
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 2, proc.stderr
        expected = "privaudit: error: dask is required for '--scheduler': pip install \"privaudit[dask]\""
        assert proc.stderr.strip() == expected
        assert not list(tmp_path.glob("privaudit-report*"))


def test_missing_extra_in_a_worker_process(tmp_path, without_torch) -> None:
    """No check in front (the library API): the worker's error reaches the caller as the same
    one-line MissingDependencyError, not a BrokenProcessPool."""
    code = (
        "from privaudit import experiment\n"
        "from privaudit.errors import MissingDependencyError\n"
        "exp = experiment.build_experiment(protocol='fedncf', seeds=2, jobs=2, users=20)\n"
        "try:\n"
        "    experiment.run_experiment(exp)\n"
        "except MissingDependencyError as e:\n"
        "    print('MDE', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=without_torch,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'MDE torch is required for this feature: pip install "privaudit[ncf]"' in proc.stdout


def test_import_errors_map_to_extras() -> None:
    import pickle

    e = missing_dependency(ModuleNotFoundError("No module named 'torch'", name="torch"))
    assert isinstance(e, MissingDependencyError) and e.extra == "ncf"
    assert missing_dependency(ImportError("import of distributed halted; None in sys.modules")).extra == "dask"
    assert missing_dependency(ModuleNotFoundError("No module named 'foo'", name="foo")) is None
    assert missing_dependency(ValueError("x")) is None
    copy = pickle.loads(pickle.dumps(MissingDependencyError("opacus", "ncf", "'dp-sgd'")))
    assert str(copy) == "opacus is required for 'dp-sgd': pip install \"privaudit[ncf]\""


# ---------------------------------------------------------------------------- CSV x every protocol


@pytest.fixture(scope="module")
def ml100k_csv(tmp_path_factory) -> Path:
    """MovieLens 100K's u.data exported as a ratings CSV with a header."""
    folder = Path(os.environ.get("PRIVAUDIT_ML100K") or ROOT.parent / "shared" / "data" / "ml-100k")
    if not (folder / "u.data").is_file():
        pytest.skip(f"MovieLens 100K not found at {folder} (set PRIVAUDIT_ML100K)")
    rows = np.loadtxt(folder / "u.data", dtype=np.int64)
    path = tmp_path_factory.mktemp("csv") / "ml100k.csv"
    with open(path, "w") as fh:
        fh.write("user_id,item_id,rating,timestamp\n")
        np.savetxt(fh, rows, fmt="%d", delimiter=",")
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("protocol", "extra"),
    [
        ("fedmvmf", ["--users", "60"]),
        (
            "privmvmf",
            ["--users", "8", "--set", "epochs=1", "--defense", "paillier:key_length=512,insecure_test_key=true"],
        ),
        ("fedsplit", ["--users", "60", "--attack", "fedsplit-inference:aux_fraction=0.5"]),
        ("fedncf", ["--users", "60"]),
        ("fedrec", ["--users", "60", "--set", "T=10", "--defense", "sampling:filling=ua,rho=1"]),
        ("fedproto", ["--users", "100"]),
    ],
)
def test_every_protocol_runs_on_a_ratings_csv(tmp_path, capsys, ml100k_csv, protocol, extra) -> None:
    out = tmp_path / "rep"
    code = main(
        [
            "attack",
            "--protocol",
            protocol,
            "--data",
            str(ml100k_csv),
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--quiet",
            "--out",
            str(out),
            *extra,
        ]
    )
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["dataset"]["name"] == "csv" and results["dataset"]["attributes"] == 0
    point = results["points"][0]
    primary = results["primary_metric"]
    assert point["supported"] and point["attack_metrics"][primary] is not None
    assert not any(k.startswith("attribute") for k in point["attack_metrics"]), point["attack_metrics"]
    assert not any(k.startswith("attribute") for k in point["baseline_random"]), point["baseline_random"]
    if protocol == "fedmvmf":  # exact without noise, also without the attribute view
        assert point["attack_metrics"]["rating_accuracy"] > 0.99 > point["baseline_random"]["rating_accuracy"]
    if protocol == "privmvmf":  # from the decrypted sums of all 8 users: far from exact, above the random guess
        assert 1.0 > point["attack_metrics"]["rating_accuracy"] > point["baseline_random"]["rating_accuracy"]
    if protocol == "fedproto":  # no ZIP codes: 10 random silos instead of one silo of unknown ZIPs
        assert point["utility"]["n_silos"] == 10


def test_from_triples_refuses_ratings_off_a_declared_scale() -> None:
    from privaudit.data import RatingsDataset

    ok = RatingsDataset.from_triples([1, 2], [1, 1], [4.0, 5.0], rating_min=1, rating_max=5, rating_step=1)
    assert (ok.rating_min, ok.rating_max, ok.rating_step) == (1.0, 5.0, 1.0)
    for bad in (9.0, 4.5):
        with pytest.raises(DataError, match=rf"rating {bad:g} \(entry 1\) is not on the scale 1\.\.5 step 1"):
            RatingsDataset.from_triples([1, 2], [1, 1], [4.0, bad], rating_min=1, rating_max=5, rating_step=1)


@pytest.mark.usefixtures("dummy_registry")
def test_estimate_printed_before_a_long_run(tmp_path, capsys, monkeypatch) -> None:
    """The estimate is calibrated on this machine (short runs of the same plan on fewer users),
    printed before the first run of the sweep, with how to shorten it; not a constant."""
    from privaudit import estimate

    started = []
    real = experiment.run_plan

    def stop(plan=None, *a, **k):
        if getattr(plan, "progress", None) is False and len(plan.seeds) == 1:  # the calibration runs
            return real(plan, *a, **k)
        started.append(capsys.readouterr().out)
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "run_plan", stop)
    monkeypatch.setattr(experiment, "run_experiment", stop)
    monkeypatch.setattr(experiment, "run_transcript", stop)
    monkeypatch.setattr(estimate, "ANNOUNCE_ABOVE", 5.0)  # a 0.3 s protocol run stands for a slow one
    csv = str(tmp_path / "r.csv")
    (tmp_path / "r.csv").write_text(
        "\n".join(f"{u},{i},{1 + (u + i) % 5}" for u in range(24) for i in range(0, 12, 2)) + "\n"
    )
    argv = ["attack", "--protocol", "dummy-proto", "--set", "delay=0.3", "--data", csv, "--jobs", "1"]
    main([*argv, "--noise", "dummy-noise", "--scales", "0,1,2,3,4,5,6,7", "--out", str(tmp_path / "a")])
    line = " ".join(started[0].split())
    found = re.search(r"estimated time on this machine: ~(\d+) s for 24 runs of dummy-proto with 24 users", line)
    assert found and 6 <= int(found.group(1)) <= 60, line  # 24 runs of >= 0.3 s, one at a time
    assert re.search(r"from a 24-user run: \d+\.\d s\); shorter: --seeds 1 \(~\d+ s\)", line), line
    assert "--jobs N runs N at a time (now 1)" in line
    assert max(len(x) for x in started[0].splitlines()) <= 100
    main([*argv, "--seeds", "1", "--out", str(tmp_path / "b")])  # one run: no estimate
    assert "estimated time" not in started[1]
    # Paillier's own r^n obfuscators: ~0.25 CPU s per user, epoch and (1 + rho) -> 12 x 40 x 2 x 0.25 s
    main(
        [
            "run",
            "--protocol",
            "privmvmf",
            "--users",
            "12",
            "--set",
            "epochs=40",
            "--defense",
            "paillier",
            "-o",
            str(tmp_path / "t.ptx"),
        ]
    )
    assert "estimated time: ~4 min (1 run of privmvmf with 12 users)" in started[2]


def test_a_plan_that_cannot_run_on_few_users_gets_no_estimate(monkeypatch) -> None:
    from privaudit import estimate
    from privaudit.errors import PrivauditError

    def refuse(plan, *a, **k):
        raise PrivauditError("a cohort needs 20 clients")

    monkeypatch.setattr(experiment, "run_plan", refuse)
    plan = experiment.build_experiment(protocol="fedmvmf", noise="laplace", seeds=3).plan()
    assert estimate.experiment_estimate(plan, experiment.load_data("synthetic")) is None

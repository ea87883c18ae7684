"""CLI: `privaudit attack`, `run`, `report` end to end; one-line errors with exit code 2."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from privaudit import registry
from privaudit.cli import main
from tests.dummies import write_csv


@pytest.fixture
def csv_data(tmp_path):
    return write_csv(tmp_path / "ratings.csv", 24)


def _one_line_error(capsys, argv, fragment):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors exit directly
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert fragment in err, err
    return err


@pytest.mark.usefixtures("dummy_registry")
def test_attack_noise_writes_report_and_prints_table(capsys, tmp_path, csv_data):
    out = tmp_path / "rep"
    code = main(
        [
            "attack",
            "--protocol",
            "dummy-proto",
            "--noise",
            "dummy-noise",
            "--scales",
            "0,1,10",
            "--data",
            csv_data,
            "--seeds",
            "2",
            "--jobs",
            "1",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err == ""  # no progress bar when stderr is not a terminal
    lines = captured.out.splitlines()
    # the plain verdict line comes first (<= 160 characters, wrapped at 100), the statistical detail beneath
    assert lines[0].startswith("verdict: Dummy-noise up to scale ")
    det = next(i for i, line in enumerate(lines) if line.startswith("  detail: "))
    assert len(" ".join(x.strip() for x in lines[:det])) <= len("verdict: ") + 160
    head = next(i for i, line in enumerate(lines) if line.startswith("dummy-noise.scale"))
    assert "dummy-noise.scale = " in " ".join(lines[det:head]) and "Holm over" in " ".join(lines[det:head])
    assert all(line.startswith("  ") for line in lines[1:head])  # the layers wrapped beneath
    assert lines[head].split() == ["dummy-noise.scale", "accuracy", "prior", "advantage", "[bounds]", "verdict"] + [
        "utility:",
        "ndcg@10",
    ]
    assert lines[head + 2].split()[:2] == ["0", "1.000"]
    assert lines[-1] == f"report written to {out}/"
    assert max(len(line) for line in lines) <= 100  # the first screen fits 100 columns
    data = json.loads((out / "results.json").read_text())
    assert data["dataset"]["users"] == 24 and data["dataset"]["source"] == csv_data
    assert len(data["points"]) == 6 and data["seeds"] == [0, 1]
    assert (out / "accuracy_vs_noise.svg").exists() and (out / "report.html").exists()


@pytest.mark.usefixtures("dummy_registry")
def test_attack_sweep_set_and_users(capsys, tmp_path, csv_data):
    out = tmp_path / "rep"
    code = main(
        [
            "attack",
            "--protocol",
            "dummy-proto",
            "--sweep",
            "protocol.signal=0.5,2",
            "--set",
            "rounds=1",
            "--defense",
            "dummy-noise:scale=0.1",
            "--users",
            "10",
            "--data",
            csv_data,
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert data["sweep"] == "protocol.signal" and data["protocol_config"]["rounds"] == 1
    assert data["dataset"]["users"] == 10
    assert (out / "accuracy_vs_signal.png").exists()
    assert capsys.readouterr().out.strip() == f"report written to {out}/"


@pytest.mark.usefixtures("dummy_registry")
def test_run_then_attack_transcript_matches_in_memory(capsys, tmp_path, csv_data):
    ptx = tmp_path / "run.ptx"
    args = ["--defense", "dummy-noise:scale=0.7", "--data", csv_data, "--seed", "3"]
    assert main(["run", "--protocol", "dummy-proto", *args, "-o", str(ptx)]) == 0
    assert f"transcript written to {ptx}" in capsys.readouterr().out
    mem, rec = tmp_path / "mem", tmp_path / "rec"
    attack = "dummy-aux-attack:aux_fraction=0.4"
    assert (
        main(["attack", "--protocol", "dummy-proto", "--attack", attack, *args, "--seeds", "1", "--out", str(mem)]) == 0
    )
    assert main(["attack", "--transcript", str(ptx), "--attack", attack, "--out", str(rec)]) == 0
    a = json.loads((mem / "results.json").read_text())["points"][0]
    b = json.loads((rec / "results.json").read_text())["points"][0]
    assert a["attack_metrics"] == b["attack_metrics"] and a["baseline_random"] == b["baseline_random"]
    assert b["value"] is None and b["seed"] == 3
    # a shareable transcript cannot be scored: the attack runs, writes its reconstruction, says so in one line
    shared = tmp_path / "shared.ptx"
    assert main(["run", "--protocol", "dummy-proto", *args, "-o", str(shared), "--no-private"]) == 0
    capsys.readouterr()
    assert main(["attack", "--transcript", str(shared), "--attack", attack, "--out", str(tmp_path / "unscored")]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 1 and "no private messages: nothing to score" in captured.out
    assert json.loads((tmp_path / "unscored" / "reconstruction.json").read_text())["scored"] is False


@pytest.mark.usefixtures("dummy_registry")
def test_report_rerenders(capsys, tmp_path, csv_data):
    out = tmp_path / "rep"
    assert (
        main(
            [
                "attack",
                "--protocol",
                "dummy-proto",
                "--noise",
                "dummy-noise",
                "--scales",
                "0,1",
                "--data",
                csv_data,
                "--seeds",
                "1",
                "--jobs",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    svg = (out / "accuracy_vs_noise.svg").read_bytes()
    (out / "accuracy_vs_noise.svg").unlink()
    (out / "report.html").unlink()
    capsys.readouterr()
    assert main(["report", str(out)]) == 2  # report.md and results.csv are still there
    assert "already holds report.md, results.csv: re-render with --force" in capsys.readouterr().err
    assert not (out / "report.html").exists()
    assert main(["report", str(out), "--force"]) == 0
    assert (out / "accuracy_vs_noise.svg").read_bytes() == svg and (out / "report.html").exists()
    assert f"re-rendered in {out}/" in capsys.readouterr().out


@pytest.mark.usefixtures("dummy_registry")
@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["attack", "--protocol", "nope"], "unknown protocol 'nope'"),
        (["attack", "--protocol", "dummy-proto", "--attack", "nope"], "unknown attack 'nope'"),
        (["attack", "--protocol", "dummy-proto", "--defense", "nope"], "unknown defense 'nope'"),
        (["attack", "--protocol", "dummy-proto", "--sweep", "nonsense"], "expected TARGET.PARAM=V1,V2"),
        (["attack", "--protocol", "dummy-proto", "--sweep", "dummy-noise.bogus=1"], "has no parameter 'bogus'"),
        (["attack", "--protocol", "dummy-proto", "--set", "novalue"], "expected KEY=VALUE"),
        (["attack", "--protocol", "dummy-proto", "--set", "p=x"], "p must be an integer"),
        (["attack", "--protocol", "dummy-proto", "--data", "/nonexistent/ml"], "no such file or folder"),
        (["attack", "--protocol", "dummy-proto", "--seeds", "0"], "--seeds must be at least 1"),
        (["attack", "--protocol", "dummy-proto", "--scales", "0,1"], "--scales needs --noise"),
        (
            ["attack", "--protocol", "dummy-proto", "--noise", "dummy-noise", "--sweep", "protocol.p=1"],
            "either --noise",
        ),
        (["attack", "--protocol", "dummy-proto", "--defense", "dummy-noise:scale"], "expected key=value"),
        (["attack", "--protocol", "dummy-proto", "--sweep", "dummy-noise.scale=1,,2"], "comma-separated list"),
        (
            ["attack", "--protocol", "dummy-proto", "--sweep", "dummy-noise.scale=0,-1"],
            "scale must be a number >= 0, got -1.0",
        ),
        (
            ["attack", "--protocol", "dummy-proto", "--noise", "dummy-noise", "--scales", "0,a"],
            "scale must be a number",
        ),
        (["attack", "--transcript", "/nonexistent.ptx"], "no such transcript file"),
        (["attack", "--transcript", "x.ptx", "--noise", "laplace"], "cannot be combined with --noise"),
        (["attack"], "give --protocol P (or --transcript FILE)"),
        (["attack", "--protocol", "dummy-proto", "--seeds", "x"], "invalid int value"),
        (["run", "--protocol", "dummy-proto"], "required: -o/--output"),
        (["run", "--protocol", "nope", "-o", "x.ptx"], "unknown protocol 'nope'"),
        (["report", "/nonexistent-dir"], "no such results file"),
    ],
)
def test_bad_input_one_line_exit_2(capsys, argv, fragment):
    _one_line_error(capsys, argv, fragment)


def test_bad_transcript_file(capsys, tmp_path):
    bad = tmp_path / "bad.ptx"
    bad.write_bytes(b"this is not a zip archive")
    _one_line_error(capsys, ["attack", "--transcript", str(bad)], "privaudit: error:")


def test_help_lists_the_commands():
    out = subprocess.run(
        [sys.executable, "-m", "privaudit", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in ("run", "attack", "report", "list", "inspect"):
        assert name in out
    out = subprocess.run(
        [sys.executable, "-m", "privaudit", "attack", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in (
        "--noise",
        "--scales",
        "--sweep",
        "--set",
        "--transcript",
        "--seeds",
        "--jobs",
        "--out",
        "--users",
        "--data",
    ):
        assert flag in out


def test_dummies_do_not_leak():
    assert not any(name.startswith("dummy-") for kind in registry.KINDS for name in registry.available(kind))


# ------------------------------------------------------------------ the real main job (fedmvmf)


def _has(kind, name):
    return name in registry.available(kind)


@pytest.mark.skipif(not _has("protocol", "fedmvmf"), reason="protocol fedmvmf not registered")
def test_fedmvmf_run_transcript_reattack_gives_in_memory_scores(capsys, tmp_path):
    """Issue 3 done-when: `privaudit run` -> `attack --transcript` == the in-memory run."""
    ptx = tmp_path / "fedmvmf.ptx"
    common = ["--defense", "laplace:scale=0.1", "--users", "40", "--seed", "2", "--set", "epochs=3"]
    assert main(["run", "--protocol", "fedmvmf", *common, "-o", str(ptx)]) == 0
    mem, rec = tmp_path / "mem", tmp_path / "rec"
    assert main(["attack", "--protocol", "fedmvmf", *common, "--seeds", "1", "--out", str(mem)]) == 0
    assert main(["attack", "--transcript", str(ptx), "--out", str(rec)]) == 0
    capsys.readouterr()
    a = json.loads((mem / "results.json").read_text())
    b = json.loads((rec / "results.json").read_text())
    assert a["attack"] == b["attack"] == "mvmf-analytic"
    assert a["points"][0]["attack_metrics"] == b["points"][0]["attack_metrics"]
    assert a["points"][0]["baseline_random"] == b["points"][0]["baseline_random"]
    assert b["defenses"] == [{"name": "laplace", "scale": 0.1}]
    assert 0.5 < a["points"][0]["attack_metrics"]["rating_accuracy"] <= 1.0


@pytest.mark.skipif(not _has("protocol", "fedmvmf"), reason="protocol fedmvmf not registered")
def test_fedmvmf_noise_command_end_to_end(tmp_path):
    """The README command, shrunk (2 scales, 2 seeds, 40 users), in a subprocess without a TTY."""
    out = tmp_path / "rep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "privaudit",
            "attack",
            "--protocol",
            "fedmvmf",
            "--noise",
            "laplace",
            "--scales",
            "0,0.5",
            "--seeds",
            "2",
            "--users",
            "40",
            "--set",
            "epochs=3",
            "--jobs",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # quiet when piped
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("verdict: Laplace noise up to scale ")
    det = next(i for i, line in enumerate(lines) if line.startswith("  detail: "))
    assert "rating_accuracy" in " ".join(lines[det : det + 3])
    assert any(line.split()[:2] == ["laplace.scale", "rating_accuracy"] for line in lines)
    assert max(len(line) for line in lines) <= 100  # the first screen fits 100 columns
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "accuracy_vs_noise.png",
        "accuracy_vs_noise.svg",
        "plan.toml",
        "report.html",
        "report.md",
        "results.csv",
        "results.json",
    ]
    data = json.loads((out / "results.json").read_text())
    assert [p["attack_metrics"]["rating_accuracy"] for p in data["points"][:2]] == [1.0, 1.0]  # noise-free: exact
    assert data["dataset"]["users"] == 40 and data["utility_metric"] == "ndcg@10"


def test_data_path_is_checked_before_any_work_and_tilde_expands(tmp_path, monkeypatch, capsys):
    import argparse

    from privaudit._cli_common import dataset_from_args
    from privaudit.errors import PrivauditError

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "r.csv").write_text("user,item,rating\n1,1,4\n")
    assert dataset_from_args(argparse.Namespace(data="~/r.csv", rating_scale=None)) == "~/r.csv"
    with pytest.raises(PrivauditError, match="no such file or folder"):
        dataset_from_args(argparse.Namespace(data="~/missing.csv", rating_scale=None))
    assert main(["attack", "--protocol", "fedmvmf", "--data", str(tmp_path / "missing.csv")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no defaults line before the error
    assert captured.err.strip().endswith("missing.csv: no such file or folder")


def test_recorded_audit_json_is_strict_json(tmp_path):
    """A transcript audit's audit.json holds no Infinity/NaN (not JSON) and takes numpy scalars."""
    from privaudit.integrations import recorded

    row = {
        "attack": "a",
        "metric": "f1",
        "metrics": {"f1": np.float64(0.5)},
        "verdict": "inconclusive",
        "applies": True,
    }
    result = {"protocol": "p", "defenses": [], "private_included": True, "rows": [row]}  # the audit schema's core
    result.update(victims=math.inf, flags=np.array([True, False]), ok=np.bool_(True))
    out = recorded.write_audit(result, tmp_path / "rep")

    def refuse(name):
        raise AssertionError(f"non-JSON constant {name}")

    doc = json.loads((out / "audit.json").read_text(), parse_constant=refuse)
    assert doc["victims"] is None and doc["flags"] == [True, False] and doc["ok"] is True
    assert doc["rows"][0]["metrics"]["f1"] == 0.5
    assert "0.500" in (out / "audit.txt").read_text()

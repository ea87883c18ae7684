"""The resolved plan: recorded as plan.toml in every report folder, rerun by --config with the
same numbers; malformed plans are one-line errors."""

from __future__ import annotations

import json

import pytest
import tomllib

from privaudit import plan as pl
from privaudit.cli import main
from privaudit.errors import PrivauditError
from tests.dummies import dummy_registry, write_csv  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("dummy_registry")


def _numbers(folder):
    data = json.loads((folder / "results.json").read_text())
    keys = ("value", "seed", "attack_metrics", "baseline_random", "baseline_prior", "advantage", "utility", "privacy")
    return [{k: p.get(k) for k in keys} for p in data["points"]], data["verdicts"][0]["sentence"]


def test_config_rerun_gives_identical_numbers(tmp_path, capsys):
    csv = write_csv(tmp_path / "r.csv", 20)
    first = tmp_path / "a"
    assert (
        main(
            [
                "attack",
                "--protocol",
                "dummy-proto",
                "--noise",
                "dummy-noise",
                "--scales",
                "0,0.5,4",
                "--set",
                "rounds=3",
                "--data",
                csv,
                "--seeds",
                "2",
                "--seed",
                "7",
                "--jobs",
                "1",
                "--out",
                str(first),
                "--quiet",
            ]
        )
        == 0
    )
    doc = tomllib.loads((first / "plan.toml").read_text())
    assert doc["run"]["protocol"] == "dummy-proto" and doc["run"]["seeds"] == 2 and doc["run"]["seed"] == 7
    assert doc["protocol"]["rounds"] == 3 and doc["sweep"]["values"] == [0.0, 0.5, 4.0]
    assert doc["defenses"] == [{"name": "dummy-noise", "params": {"scale": 0.0}}]
    second = tmp_path / "b"
    assert main(["attack", "--config", str(first / "plan.toml"), "--jobs", "2", "--out", str(second), "--quiet"]) == 0
    assert _numbers(first) == _numbers(second)
    assert (second / "plan.toml").read_text() != "" and len(_numbers(first)[0]) == 6


def test_plan_resolves_once_and_validates_the_grid():
    plan = pl.resolve(
        protocol="dummy-proto",
        defenses=[("dummy-noise", {})],
        sweep=pl.Sweep("dummy-noise", "scale", ("0", "1")),
        seeds=2,
    )
    assert [v for _, v, *_ in plan.grid()] == [0.0, 1.0]
    assert plan.attack_cls.name == "dummy-attack" and plan.seeds == [0, 1]
    with pytest.raises(PrivauditError, match="scale must be"):
        pl.resolve(
            protocol="dummy-proto", defenses=[("dummy-noise", {})], sweep=pl.Sweep("dummy-noise", "scale", ("0", "x"))
        )


@pytest.mark.parametrize(
    "text, message",
    [
        ("run = [", "not a valid plan.toml"),
        ("[run]\nprotocol = 'dummy-proto'\n", "needs data"),
        ("[run]\nprotocol = 'dummy-proto'\ndata = 'synthetic'\nseeds = 'two'\n", "seeds must be an integer"),
        ("[run]\nprotocol = 'dummy-proto'\ndata = 'synthetic'\n[bogus]\n", "unknown table"),
        (
            "[run]\nprotocol = 'dummy-proto'\ndata = 'synthetic'\n[protocol]\nrounds = 'x'\n",
            "rounds must be an integer",
        ),
        ("[run]\nprotocol = 'dummy-proto'\ndata = 'synthetic'\nseed = -3\n", "--seed must be non-negative"),
        (
            "[run]\nprotocol = 'dummy-proto'\ndata = 'synthetic'\nscheduler = 'tcp://10.0.0.1:8786'\n",
            "cannot choose where privaudit connects",
        ),
        ("[run]\nprotocol = 'dummy-proto'\ndata = 'synthetic'\nseeds = 1001\n", "cap of 1000"),
        ("[run]\nprotocol = 'dummy-proto'\ndata = 'synthetic'\n[protocol]\nrounds = 100001\n", "at most 100000"),
    ],
)
def test_bad_plans_are_one_line_errors(tmp_path, capsys, text, message):
    path = tmp_path / "plan.toml"
    path.write_text(text)
    assert main(["attack", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_config_refuses_other_plan_flags(tmp_path, capsys):
    assert main(["attack", "--config", str(tmp_path / "plan.toml"), "--protocol", "dummy-proto"]) == 2
    assert "--config cannot be combined with --protocol" in capsys.readouterr().err


def test_audit_folder_records_its_plan_and_config_reruns_it(tmp_path, capsys):
    csv = write_csv(tmp_path / "r.csv", 20)
    first = tmp_path / "a"
    assert (
        main(
            [
                "audit",
                "--protocol",
                "dummy-proto",
                "--defense",
                "dummy-noise",
                "--data",
                csv,
                "--set",
                "rounds=3",
                "--seeds",
                "1",
                "--jobs",
                "1",
                "--out",
                str(first),
            ]
        )
        == 0
    )
    doc = tomllib.loads((first / "plan.toml").read_text())
    assert doc["audit"]["defenses"] == ["dummy-noise"] and doc["protocol"] == {"rounds": "3"}
    second = tmp_path / "b"
    assert main(["audit", "--config", str(first), "--out", str(second)]) == 0
    a, b = (json.loads((d / "audit.json").read_text()) for d in (first, second))
    assert a["matrix"] == b["matrix"] and a["verdicts"] == b["verdicts"]
    assert main(["audit", "--config", str(first), "--seeds", "2"]) == 2
    assert "--config cannot be combined with --seeds" in capsys.readouterr().err


def test_plan_records_local_workers_but_never_a_scheduler_address():
    """A plan written with --scheduler ADDRESS does not carry the address (a plan read back
    cannot choose where to connect); local:N is kept."""
    for scheduler, recorded in (("tcp://10.0.0.1:8786", None), ("local:2", "local:2")):
        plan = pl.resolve(protocol="dummy-proto", seeds=1, scheduler=scheduler)
        doc = tomllib.loads(pl.plan_to_toml(plan))
        assert doc["run"].get("scheduler") == recorded


def test_bounds_are_inclusive_caps():
    pl.check_bounds(seeds=pl.MAX_SEEDS, jobs=pl.MAX_JOBS, users=pl.MAX_USERS, points=pl.MAX_SWEEP_POINTS)
    for field in ("seeds", "jobs", "users", "points"):
        cap = {"seeds": pl.MAX_SEEDS, "jobs": pl.MAX_JOBS, "users": pl.MAX_USERS, "points": pl.MAX_SWEEP_POINTS}[field]
        with pytest.raises(PrivauditError, match=f"cap of {cap}"):
            pl.check_bounds(**{field: cap + 1})
    assert len(pl.parse_values(",".join(["1"] * pl.MAX_SWEEP_POINTS), "--sweep x")) == pl.MAX_SWEEP_POINTS
    with pytest.raises(PrivauditError, match="more than 1000 values"):
        pl.parse_values(",".join(["1"] * (pl.MAX_SWEEP_POINTS + 1)), "--sweep x")

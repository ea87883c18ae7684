"""Registry (built-ins and entry-point plugins) and the CLI frame (list, inspect, errors)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from privaudit import __version__, registry
from privaudit.cli import main
from privaudit.errors import PrivauditError
from privaudit.params import Param, declare, parse_spec, resolve_declared
from privaudit.transcript import Transcript, save

PLUGIN = textwrap.dedent(
    '''
    from privaudit.protocols.base import Protocol
    from privaudit.attacks.base import Attack


    class EchoProtocol(Protocol):
        """Echo: a test plugin protocol that sends nothing."""


    class PeekAttack(Attack):
        description = "Peek: a test plugin attack"
    '''
)


def _install_plugin(root):
    (root / "echo_plugin.py").write_text(PLUGIN)
    dist = root / "echo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[privaudit.protocols]\necho = echo_plugin:EchoProtocol\n\n"
        "[privaudit.attacks]\npeek = echo_plugin:PeekAttack\n\n"
        "[privaudit.defenses]\nbroken = echo_plugin:DoesNotExist\n"
    )


def _run_cli(*args, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "privaudit", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_plugin_from_entry_point_shows_in_list(tmp_path):
    _install_plugin(tmp_path)
    proc = _run_cli("list", env_extra={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.split()[:2] == ["protocol", "echo"] and "Echo: a test plugin protocol" in line for line in lines)
    assert any(line.split()[:2] == ["attack", "peek"] and "Peek: a test plugin attack" in line for line in lines)
    # a broken plugin is reported, not fatal
    assert "plugin failed to load: privaudit.defenses:broken" in proc.stderr


def test_unknown_names_list_the_choices():
    with pytest.raises(PrivauditError, match=r"unknown protocol 'nope' \(available: "):
        registry.get("protocol", "nope")


def test_params_coercion_and_errors():
    declared = declare([Param("K", 10), Param("lam", 0.1), Param("on", False), Param("mode", "user")])
    assert resolve_declared(declared, {"K": "5", "lam": "1e-3", "on": "yes"}, "x") == {
        "K": 5,
        "lam": 1e-3,
        "on": True,
        "mode": "user",
    }
    with pytest.raises(PrivauditError, match="x: K must be an integer, got 'ten'"):
        resolve_declared(declared, {"K": "ten"}, "x")
    with pytest.raises(
        PrivauditError, match=r"x: unknown parameter 'k'; did you mean `K`\? \(known: K, lam, on, mode\)"
    ):
        resolve_declared(declared, {"k": "1"}, "x")
    assert parse_spec("laplace:scale=0.1,clip=2", "--defense") == ("laplace", {"scale": "0.1", "clip": "2"})
    with pytest.raises(PrivauditError, match="expected key=value"):
        parse_spec("laplace:scale", "--defense")


def test_version_and_usage_errors(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"privaudit {__version__}"
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "invalid choice: 'frobnicate'" in err


def test_inspect_summarizes_a_transcript(tmp_path, capsys):
    config = {"K": 2, "n_items": 4, "attribute_names": [], "alpha": 0.08, "lam": 0.1, "update": "semials"}
    config.update({"unrated": "obsonly", "rating_min": 1.0, "rating_max": 5.0})  # a valid fedmvmf config
    t = Transcript("fedmvmf", config, 3, {"name": "toy", "users": 2}, ["server", "client:0", "client:1"])
    t.add(
        0, "client:0", "client:0", "private", {"items": np.arange(3), "ratings": np.ones(3), "attributes": np.zeros(0)}
    )
    t.add(0, "server", "server", "state", {"V": np.zeros((4, 2)), "P": np.zeros((0, 2))})
    for r in range(3):
        t.add(r, "client:0", "server", "grad_V", {"items": np.arange(4), "values": np.zeros((4, 2))})
    path = save(t, tmp_path / "t.ptx")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "protocol    fedmvmf   seed 3" in out
    assert "3 (2 clients; server)" in out and "state" in out
    assert "rounds      0..2" in out
    assert "private     included" in out
    assert "grad_V" in out and "3 messages" in out and "288 B" in out  # 3 x (4*8 + 4*2*8)


def test_inspect_bad_file_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "bad.ptx").write_text("garbage")
    assert main(["inspect", str(tmp_path / "bad.ptx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("privaudit: error: ") and err.count("\n") == 1 and "not a transcript archive" in err
    proc = _run_cli("inspect", str(tmp_path / "missing.ptx"))
    assert proc.returncode == 2 and "no such transcript file" in proc.stderr and "Traceback" not in proc.stderr


def test_list_marks_the_extras_a_plugin_needs(capsys, monkeypatch):
    from privaudit import errors
    from privaudit.cli import main

    monkeypatch.setattr(errors, "extra_installed", lambda extra: extra != "ncf")  # as without torch
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    fedncf = next(line for line in lines if line.split()[:2] == ["protocol", "fedncf"])
    assert fedncf.endswith("[needs privaudit[ncf]: not installed]")
    fedmvmf = next(line for line in lines if line.split()[:2] == ["protocol", "fedmvmf"])
    assert "needs" not in fedmvmf
    monkeypatch.setattr(errors, "extra_installed", lambda extra: True)  # torch installed: no tag at all
    assert main(["list"]) == 0
    assert "needs privaudit" not in capsys.readouterr().out

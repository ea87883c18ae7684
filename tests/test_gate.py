"""The CI gate: ``--fail-on`` on attack and audit, the versioned schemas of audit.json and
results.json, ``privaudit compare`` (docs/ci.md)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from privaudit import gate, report_schema
from privaudit.cli import main
from tests.broken_dp import broken_dp_registry  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]

#: sha256 of each schema version's canonical JSON without its prose: a schema change without a version bump fails
#: here (bump AUDIT_/RESULTS_SCHEMA_VERSION in privaudit/report_schema.py, the "const" of
#: schema_version in the file, and add the new version's digest)
SCHEMA_DIGESTS = {
    ("audit", 1): "99c5b009596caedc08cfecf6d041df2331ccc53e86305168ad18bab49f47695e",
    ("results", 1): "c6bfd774d4928f4099f55f9ef3a4f5dc39ffcada087c9f000171f770bb520e63",
    # 2: per-user utility (point.utility_users), the utility cost's interval in verdicts and rows
    ("results", 2): "947c5c00ebb359da757853f7b0297af93b97aa7982bf01239301cd27c702c1af",
}


def _structure(v):
    """A schema without its prose (descriptions and titles are not a schema change)."""
    if isinstance(v, dict):
        return {k: _structure(x) for k, x in v.items() if k not in ("description", "title", "$comment")}
    return [_structure(x) for x in v] if isinstance(v, list) else v


def _digest(kind: str) -> str:
    text = json.dumps(_structure(report_schema.schema(kind)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------------------------ schemas


@pytest.mark.parametrize("kind", ["audit", "results"])
def test_schema_is_valid_versioned_and_the_docs_copy_is_identical(kind):
    import jsonschema

    name = report_schema.SCHEMA_FILES[kind]
    package = (ROOT / "privaudit" / "schemas" / name).read_bytes()
    assert (ROOT / "docs" / name).read_bytes() == package, f"docs/{name} differs from privaudit/schemas/{name}"
    s = report_schema.schema(kind)
    jsonschema.validators.validator_for(s).check_schema(s)
    version = report_schema.VERSIONS[kind]
    assert s["properties"]["schema_version"]["const"] == version
    assert s["$id"].endswith(f":{version}")
    assert SCHEMA_DIGESTS.get((kind, version)) == _digest(kind), (
        f"{name} changed: bump its version (report_schema.VERSIONS, the file's schema_version const and $id) "
        f"and record the digest {_digest(kind)}"
    )


def test_schemas_ship_in_the_package_and_jsonschema_is_a_dependency():
    text = (ROOT / "pyproject.toml").read_text()
    dependencies = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert '"jsonschema>=' in dependencies
    assert 'privaudit = ["py.typed", "schemas/*.json"]' in text


def test_stamped_puts_the_versions_first():
    doc = report_schema.stamped({"protocol": "p", "privaudit_version": "9.9", "schema_version": 0}, "audit")
    assert list(doc) == ["schema_version", "privaudit_version", "protocol"]
    assert doc["schema_version"] == report_schema.AUDIT_SCHEMA_VERSION and doc["privaudit_version"] == "9.9"


# ------------------------------------------------------------------------------------ the gate


def _audit_doc() -> dict:
    """A small audit.json: one attack, undefended (leaks), a defense that protects at its
    strongest value and one that leaks there; one DP claim that does not hold."""

    def cell(defense, value, verdict, adv, **kw):
        return {
            "attack": "a1",
            "defense": defense,
            "value": value,
            "metric": "accuracy",
            "verdict": verdict,
            "verdict_label": verdict,
            "advantage": adv,
            "advantage_low": adv - 0.01,
            "advantage_high": adv + 0.01,
            "dp_violation": False,
            **kw,
        }

    doc = {
        "protocol": "p",
        "protocol_config": {},
        "seeds": [0],
        "attacks": [{"name": "a1", "primary_metric": "accuracy", "applies": True}],
        "defenses": [
            {"name": "dp", "strength": "epsilon", "grid": [10.0, 1.0]},
            {"name": "noise", "strength": "scale", "grid": [1.0, 4.0]},
        ],
        "dataset": {},
        "runs": [{"defense": None, "value": None, "seed": 0, "attacks": {"a1": {"attack_metrics": {"accuracy": 0.9}}}}],
        "matrix": [
            cell(None, None, "leaks", 0.4),
            cell("dp", 1.0, "protected", 0.0),
            cell("noise", 4.0, "inconclusive", 0.02),
        ],
        "verdicts": [{"attack": "a1", "sentence": "a1: ...", "dp_violation": False}],
    }
    return report_schema.stamped(doc, "audit")


def test_gate_skips_the_undefended_control_and_names_each_failing_cell():
    doc = _audit_doc()
    assert report_schema.problem(doc, "audit") is None
    assert gate.failures(doc, "audit", ("leaks",)) == []  # the undefended column is the control
    assert gate.failures(doc, "audit", ("inconclusive",)) == [
        "a1 x noise scale=4: inconclusive, advantage 0.02 [0.01, 0.03]"
    ]
    doc["matrix"][2].update(verdict="leaks", verdict_label="leaks (accuracy)")
    assert gate.failures(doc, "audit", ("leaks", "inconclusive")) == [
        "a1 x noise scale=4: leaks (accuracy), advantage 0.02 [0.01, 0.03]"
    ]
    doc["matrix"][1]["errors"] = ["ValueError: boom"]  # a crashed run shows nothing either way
    assert gate.failures(doc, "audit", ("inconclusive",)) == [
        "a1 x dp epsilon=1: inconclusive: protected, advantage 0 [-0.01, 0.01] (failed: ValueError: boom)"
    ]
    # without a defended cell, the undefended ones are what the run tests
    alone = {**doc, "matrix": doc["matrix"][:1], "defenses": []}
    assert gate.failures(alone, "audit", ("leaks",)) == ["a1 x no defense: leaks, advantage 0.4 [0.39, 0.41]"]


def test_gate_dp_violation_reads_cells_canary_runs_and_dp_claims():
    doc = _audit_doc()
    assert gate.failures(doc, "audit", ("dp-violation",)) == []
    doc["matrix"][1]["canary"] = {"epsilon_lb": 2.5, "epsilon": 1.0, "neighbour": "rating"}
    doc["runs"].append({"defense": "dp", "value": 1.0, "seed": 0, "canary_audit": {"epsilon_lb": 2.5, "epsilon": 1.0}})
    doc["dp_claims"] = [
        {"component": "LocalDpMod", "claimed_epsilon": 1.0, "delivered_epsilon": 8.0, "holds": False, "reason": "r"},
        {"component": "other", "claimed_epsilon": None, "delivered_epsilon": None, "holds": True, "reason": ""},
    ]
    assert report_schema.problem(doc, "audit") is None
    assert gate.failures(doc, "audit", ("dp-violation",)) == [
        "a1 x dp epsilon=1: dp-violation: canary audit: ε lower bound 2.5 > claimed ε 1, rating-level",
        "dp=1 (canary run, seed 0): dp-violation: canary audit: ε lower bound 2.5 > claimed ε 1",
        "DP claim of LocalDpMod: dp-violation: does not hold (claimed ε 1, delivered ε 8): r",
    ]
    doc["dp_claims"][0]["holds"] = "no"
    assert "at /dp_claims/0/holds" in report_schema.problem(doc, "audit")


def test_gate_on_a_transcript_audit_and_a_sweep():
    rows = [
        {"attack": "a", "metric": "m", "applies": True, "verdict": "leaks", "leak_metrics": ["m"], "advantage": 0.5},
        {"attack": "b", "metric": "m", "applies": True, "verdict": "too few victims to judge (3)"},
        {"attack": "c", "metric": "m", "applies": False, "verdict": "not applicable", "reason": "x"},
    ]
    doc = report_schema.stamped({"protocol": "p", "defenses": [], "private_included": True, "rows": rows}, "audit")
    assert report_schema.problem(doc, "audit") is None
    assert gate.failures(doc, "audit", ("leaks", "inconclusive")) == [
        "a: leaks (m), advantage 0.5",
        "b: inconclusive: too few victims to judge (3)",
    ]
    verdict = {
        "attack": "a",
        "metric": "m",
        "parameter": "noise.scale",
        "sentence": "s",
        "dp_violation": False,
        "rows": [
            {"value": 0, "verdict": "leaks", "tests": {}, "defended": False},
            {"value": 1, "verdict": "leaks", "tests": {}, "defended": True, "dp_violation": True, "epsilon_lb": 3},
            {"value": 4, "verdict": "protected", "tests": {}, "defended": True, "epsilon": 1},
        ],
    }
    results = {"verdicts": [verdict]}
    assert gate.failures(results, "results", ("leaks", "dp-violation")) == [
        "a at noise.scale = 1: leaks; dp-violation: empirical ε lower bound 3 > claimed ε n/a"
    ]


def test_fail_on_values_are_checked_before_any_compute(capsys, no_compute):
    for argv in (
        ["audit", "--protocol", "fedmvmf", "--fail-on", "leaks,nope"],
        ["attack", "--protocol", "fedmvmf", "--fail-on", ""],
        ["compare", "a.json", "b.json", "--fail-on", "leak"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and "--fail-on" in err, err
    assert gate.named([("leaks", "dp-violation"), ("leaks",), ("inconclusive",)]) == (
        "leaks",
        "dp-violation",
        "inconclusive",
    )


# ----------------------------------------------------------------------------- end to end


def _fail_lines(capsys) -> list[str]:
    """The gate's lines on stderr (a progress line may share it)."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("privaudit: fail: ")]


DUMMY = ["--protocol", "dummy-proto", "--set", "p=1", "--set", "rounds=1", "--set", "signal=0.5", "--seeds", "1"]


@pytest.mark.usefixtures("broken_dp_registry")
def test_audit_fails_on_the_broken_dp_defense_and_passes_dp_laplace(tmp_path, capsys):
    argv = ["audit", *DUMMY, "--attack", "dummy-bit-scores", "--jobs", "1", "--fail-on", "dp-violation"]
    assert main([*argv, "--defense", "broken-dp-laplace", "-o", str(tmp_path / "broken")]) == 1
    err = _fail_lines(capsys)
    assert len(err) == 1, err
    assert err[0].startswith("privaudit: fail: dummy-bit-scores x broken-dp-laplace epsilon=0.3: dp-violation: at ")
    assert "empirical ε lower bound" in err[0] and "> claimed ε " in err[0] and "(bit decisions)" in err[0]
    assert main([*argv, "--defense", "dp-laplace", "-o", str(tmp_path / "ok")]) == 0
    captured = capsys.readouterr()
    assert "privaudit: fail" not in captured.err and "fail-on dp-violation: not met" in captured.out
    # compare: the broken audit's violation is new against the correct one's
    old, new = tmp_path / "ok" / "audit.json", tmp_path / "broken" / "audit.json"
    assert main(["compare", str(old), str(new), "--fail-on", "new-dp-violations"]) == 1
    out, err = capsys.readouterr()
    assert "new DP violation: dummy-bit-scores x broken-dp-laplace epsilon=0.3: at " in out
    assert len(err.strip().splitlines()) == 1 and "new-dp-violations: at " in err
    assert main(["compare", str(new), str(new), "--fail-on", "changed,new-leaks,new-dp-violations"]) == 0
    assert "identical apart from timings and version: True" in capsys.readouterr().out


@pytest.mark.usefixtures("broken_dp_registry")
def test_attack_sweep_and_transcript_take_fail_on(tmp_path, capsys):
    sweep = ["--defense", "broken-dp-laplace", "--sweep", "broken-dp-laplace.epsilon=1,0.3"]
    argv = ["attack", *DUMMY, "--attack", "dummy-bit-scores", *sweep, "--jobs", "1", "--quiet"]
    assert main([*argv, "-o", str(tmp_path / "sweep"), "--fail-on", "dp-violation"]) == 1
    err = _fail_lines(capsys)
    # the 10x-broken defense: its bit decisions show epsilon above the claim at epsilon = 1 (true
    # epsilon 10); at 0.3 (true 3) 40 one-bit victims may not, so that line is not required
    cells = [e.split(": dp-violation: ")[0] for e in err]
    assert cells[0] == "privaudit: fail: dummy-bit-scores at broken-dp-laplace.epsilon = 1"
    assert set(cells) <= {cells[0], "privaudit: fail: dummy-bit-scores at broken-dp-laplace.epsilon = 0.3"}
    from tests.dummies import DummyProtocol, tiny_dataset

    run = DummyProtocol().run(tiny_dataset(40), {"p": 1, "rounds": 1, "signal": 0.5}, [], 0)
    transcript = run.transcript.save(tmp_path / "t.ptx")
    assert main(["attack", "--transcript", str(transcript), "--attack", "dummy-bit-scores", "--quiet", "-o",
                 str(tmp_path / "t"), "--fail-on", "inconclusive"]) == 0  # fmt: skip
    assert main(["attack", "--transcript", str(transcript), "--attack", "dummy-bit-scores", "--quiet", "-o",
                 str(tmp_path / "t2"), "--fail-on", "leaks"]) == 1  # fmt: skip
    (line,) = _fail_lines(capsys)
    assert line.startswith("privaudit: fail: dummy-bit-scores: leaks (") and ", advantage 0.5" in line, line
    assert main(["audit", "--transcript", str(transcript), "--attack", "dummy-bit-scores", "-o",
                 str(tmp_path / "ta"), "--fail-on", "leaks"]) == 1  # fmt: skip
    doc, kind = report_schema.load(tmp_path / "ta" / "audit.json")
    assert kind == "audit" and list(doc)[:2] == ["schema_version", "privaudit_version"]


@pytest.mark.slow  # 15-35 s: five noise multipliers, each with its canary run
def test_fedmvmf_audit_with_a_protecting_defense_passes(tmp_path, capsys):
    """dp-gaussian (noise multiplier up to 30) stops mvmf-aggregate: no defended cell leaks, so
    ``--fail-on leaks,dp-violation`` passes; the undefended column leaks and is the positive
    control. The cell does not read "protected": the attack reads 2 of the 40 rounds the DP claim
    covers (without a planted-signal control showing its power), and one seed's interval is not
    under the margin."""
    argv = ["audit", "--protocol", "fedmvmf", "--seeds", "1", "--attack", "mvmf-aggregate", "--defense"]
    code = main([*argv, "dp-gaussian", "-o", str(tmp_path / "a"), "--fail-on", "leaks,dp-violation"])
    out, err = capsys.readouterr()
    assert code == 0 and "privaudit: fail" not in err, err  # stderr may hold the progress line
    assert "fail-on leaks,dp-violation: not met (1 of 2 cells gated" in out
    doc, _ = report_schema.load(tmp_path / "a" / "audit.json")
    (undefended, dp) = doc["matrix"]
    assert undefended["verdict"] == "leaks" and dp["verdict"] in ("inconclusive", "no evidence of leakage")
    assert any(r.startswith("the attack reads 2 of the 40 rounds the claim covers") for r in dp["dp_gate"])
    # the attack's own test does not read "protected" at 30 (one seed's interval is not under the
    # margin): no planted-signal control is run there (it runs only where it could change a verdict)
    assert dp["attack_power"] is None and "planted_control" not in dp


def test_fedmvmf_audit_fails_on_a_leaking_defense_one_line_per_cell(tmp_path, capsys):
    """``privaudit audit --protocol fedmvmf --seeds 1 --fail-on leaks`` (docs/ci.md: 7 leaking
    defended cells) narrowed to one attack and the defense that leaks most at its strongest value
    (sampling rho=3: advantage 0.246 [0.241, 0.250])."""
    argv = ["audit", "--protocol", "fedmvmf", "--seeds", "1", "--attack", "mvmf-aggregate", "--defense", "sampling"]
    code = main([*argv, "--jobs", "1", "-o", str(tmp_path / "a"), "--fail-on", "leaks"])
    err = _fail_lines(capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("privaudit: fail: mvmf-aggregate x sampling rho=3: leaks (")
    assert ", advantage 0.2" in err[0]
    doc, _ = report_schema.load(tmp_path / "a" / "audit.json")
    assert [(c["defense"], c["verdict"]) for c in doc["matrix"]] == [(None, "leaks"), ("sampling", "leaks")]


# --------------------------------------------------------------------------------- compare


def _write(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_compare_prints_changes_moves_and_gates(tmp_path, capsys):
    old = _audit_doc()
    new = copy.deepcopy(old)
    new["matrix"][1].update(verdict="leaks", verdict_label="leaks (accuracy)", advantage=0.2)
    new["runs"][0]["attacks"]["a1"]["attack_metrics"]["accuracy"] = 0.7
    new["privaudit_version"] = "0.2.0"
    a, b = _write(tmp_path / "old.json", old), _write(tmp_path / "new.json", new)
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        f"OLD {a}: audit.json, schema 1, written by privaudit {old['privaudit_version']}",
        f"NEW {b}: audit.json, schema 1, written by privaudit 0.2.0",
        "identical apart from timings and version: False",
    ]
    assert "changed: a1 x dp epsilon=1: protected -> leaks (accuracy)" in out
    assert "  0.2000  a1 (accuracy) x no defense: 0.9 -> 0.7" in out
    assert main(["compare", str(a), str(b), "--fail-on", "new-leaks", "--fail-on", "changed"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "privaudit: fail: a1 x dp epsilon=1: changed: protected -> leaks (accuracy); "
        "new-leaks: leaks (accuracy), advantage 0.2 [-0.01, 0.01]"
    ]
    assert main(["compare", str(b), str(a), "--fail-on", "new-leaks,new-dp-violations"]) == 0
    # results.json against audit.json: one line, exit 2
    res = _write(tmp_path / "r.json", report_schema.stamped({"points": []}, "results"))
    assert main(["compare", str(a), str(res)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# ------------------------------------------------------------------------------- docs/ci.md


def _ci_steps() -> list[dict]:
    yaml = pytest.importorskip("yaml")  # PyYAML comes with flwr (the test extra)
    text = (ROOT / "docs" / "ci.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    job = yaml.safe_load(block)
    (steps,) = [j["steps"] for j in job["jobs"].values()]
    return [s for s in steps if "run" in s]


def test_ci_job_of_docs_ci_md_installs_records_and_audits():
    runs = [s["run"] for s in _ci_steps()]
    assert runs[0] == 'python -m pip install ".[flower]"'
    assert runs[1].startswith("privaudit record --flower examples/flower-plain-mf ")
    assert runs[2].startswith("privaudit audit --transcript run.ptx ") and "--fail-on leaks,dp-violation" in runs[2]


@pytest.mark.slow  # a Flower recording: about 40 s on a loaded 2-core machine
def test_ci_job_of_docs_ci_md_runs(tmp_path):
    """The job's commands, in order, in a scratch folder holding the repository's examples: all but
    the install step (this environment has privaudit already). The reference app ships no
    defense, so the audit step fails the build (exit 1) naming the leaking attacks."""
    import os
    import subprocess
    import sys

    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    codes, outputs = [], []
    for step in _ci_steps()[1:]:
        command = step["run"].replace("privaudit ", f"{sys.executable} -m privaudit ", 1)
        proc = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        codes.append(proc.returncode)
        outputs.append(proc)
    assert codes == [0, 1], [p.stderr[-2000:] for p in outputs]
    failures = outputs[1].stderr.strip().splitlines()
    assert any(line.startswith("privaudit: fail: generic-trained-items: leaks (f1)") for line in failures), failures
    assert all(line.startswith("privaudit: fail: ") for line in failures) and "Traceback" not in outputs[1].stderr
    doc, kind = report_schema.load(tmp_path / "privacy-audit" / "audit.json")
    assert kind == "audit" and doc["schema_version"] == report_schema.AUDIT_SCHEMA_VERSION

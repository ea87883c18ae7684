"""Fingerprint of the result files: the ``results.json`` / ``audit.json`` of small built-in runs,
every timing left out, and whether each reads back through the typed records unchanged.

A change that should not change what privaudit writes (the typed results layer, a refactoring
of ``experiment.assemble`` or of the audit) must leave the output identical. Runs: one seed,
synthetic data, a small sweep per protocol (fedmvmf, fedsplit, fedncf, fedrec, fedproto,
privmvmf) and two small audits (fedmvmf with laplace, fedsplit with laplace). About two minutes
on one core.

Usage::

    python benchmarks/results_fingerprint.py > before.json
    ... change the code ...
    python benchmarks/results_fingerprint.py > after.json && diff before.json after.json
"""

from __future__ import annotations

import json
import sys

import privaudit
from privaudit import audit as au
from privaudit.report_schema import stamped
from privaudit.reports.files import dumps_json

try:  # absent before the typed results: the files are still fingerprinted (to compare with)
    from privaudit.results.typed import AuditRecord, ExperimentRun
except ImportError:
    AuditRecord = ExperimentRun = None

SWEEPS = {
    "fedmvmf": dict(protocol="fedmvmf", sweep="laplace.scale=0,1", users=30, protocol_config={"epochs": 2}),
    "fedsplit": dict(protocol="fedsplit", users=30),
    "fedncf": dict(protocol="fedncf", users=20),
    "fedrec": dict(protocol="fedrec", sweep="sampling.rho=0,1", users=30),
    "fedproto": dict(protocol="fedproto", sweep="protocol.k=2,5", users=30),
    "privmvmf": dict(protocol="privmvmf", sweep="sampling.rho=0,1", users=10),
}
AUDITS = {
    "fedmvmf": dict(attacks=["mvmf-analytic"], defenses=["laplace"], users=30, sets={"epochs": 2}),
    "fedsplit": dict(users=30, defenses=["laplace"]),
}


def untimed(obj):
    """``obj`` without timings: keys naming seconds, summary entries of a timing metric."""
    if isinstance(obj, dict):
        if "seconds" in str(obj.get("metric", "")):
            return None
        return {k: untimed(v) for k, v in obj.items() if "seconds" not in str(k) and k != "backend"}
    if isinstance(obj, list):
        return [x for x in (untimed(v) for v in obj) if x is not None]
    return obj


def fingerprint(doc, kind: str) -> dict:
    text = json.loads(dumps_json(stamped(doc, kind)))
    cls = ExperimentRun if kind == "results" else AuditRecord
    if cls is None:
        return {"file": untimed(text)}
    return {"round_trips": json.dumps(cls.from_dict(text).to_dict()) == json.dumps(text), "file": untimed(text)}


def main() -> None:
    out = {}
    for name, kw in SWEEPS.items():
        results = privaudit.build_experiment(seeds=1, jobs=1, progress=False, **kw).run()
        out[f"{name} results.json"] = fingerprint(results, "results")
        print(name, file=sys.stderr, flush=True)
    for name, kw in AUDITS.items():
        audit = au.run_audit(au.Audit(protocol=name, seeds=2, jobs=1, progress=False, **kw))
        out[f"{name} audit.json"] = fingerprint(audit, "audit")
        print(f"audit {name}", file=sys.stderr, flush=True)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

"""CPU seconds of the protocol runs alone of ``benchmarks/audit_stage_sample.py``'s sample.

The seed-0 FedMVMF runs of ``privaudit audit --protocol fedmvmf`` for no defense, laplace 1,
gaussian 1, dp-gaussian 3, dp-laplace 3, sampling 1 and 3 (``runner.run_protocol``, as the audit
runs them), plus the canary run of each DP cell (``canary.canary_audit``), each timed by
``time.process_time``; no attack. Each line also prints a digest of the run's transcript
payloads and final V, and its NDCG@10, so that two versions of the code can be checked for
identical results. Optional third argument: a comma-separated list of defense names (``None``:
the undefended run)::

    PYTHONPATH=. python benchmarks/protocol_sample.py ../shared/data/ml-100k [out.prof] [laplace,dp-laplace]
"""

import cProfile
import hashlib
import sys
import time

import numpy as np

from privaudit import audit, canary, runner

WANTED = [
    (None, None),
    ("laplace", 1.0),
    ("gaussian", 1.0),
    ("dp-gaussian", 3.0),
    ("dp-laplace", 3.0),
    ("sampling", 1),
    ("sampling", 3),
]


def digest(result) -> str:
    h = hashlib.sha1()
    for m in result.transcript.messages:
        for k in sorted(m.payload):
            h.update(np.ascontiguousarray(m.payload[k]).tobytes())
    h.update(np.ascontiguousarray(result.model["V"]).tobytes())
    return h.hexdigest()[:12]


def main(data: str, prof: str | None, only: list[str] | None) -> None:
    spec = audit.Audit(protocol="fedmvmf", data=data, jobs=1)
    runs, _ = audit._plan(spec)
    ds = runner.subsample_users(runner.load_data(spec.data), None, 0)
    pr = cProfile.Profile(time.process_time) if prof else None
    for name, value in WANTED:
        if only and str(name) not in only:
            continue
        r = next(r for r in runs if r.seed == 0 and (r.defense_name, r.value) == (name, value))
        specs = [(r.defense_cls, dict(r.defense_params))] if r.defense_cls is not None else []
        task = runner.Task(r.protocol_cls, dict(r.config), specs, object, r.seed)
        task.names = [r.protocol_name, "", r.defense_name or ""]
        if pr:
            pr.enable()
        t = time.process_time()
        result, _, _ = runner.run_protocol(task, ds)
        line = f"{name} {value}: protocol {time.process_time() - t:.2f} CPU s"
        if name and name.startswith("dp-"):
            t = time.process_time()
            out = canary.canary_audit(r.protocol_cls, r.config, specs, ds, r.seed, r.canaries, names=[name])
            line += f", canary run {time.process_time() - t:.2f} CPU s (epsilon_lb {out['epsilon_lb']:.3f})"
        if pr:
            pr.disable()
        print(f"{line}; digest {digest(result)} ndcg@10 {result.utility['ndcg@10']!r}", flush=True)
    if pr:
        pr.dump_stats(prof)


if __name__ == "__main__":
    args = sys.argv[1:] + ["", ""]
    main(args[0], args[1] or None, args[2].split(",") if args[2] else None)

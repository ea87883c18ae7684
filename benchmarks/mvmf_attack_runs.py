"""CPU seconds and metrics of the three FedMVMF attacks on seed-0 runs of the ML-100K audit.

For each chosen run of ``privaudit audit --protocol fedmvmf`` (seed 0, protocol run as the audit
does it; the transcript is cached as a ``.ptx`` file under ``--cache`` so that repeated measurements
attack the same uploads), every requested attack is evaluated as the audit does
(``runner.evaluate_attack`` with the audit's attack parameters and random stream). Prints one JSON
line per (run, attack): CPU seconds (``time.process_time``) and the attack's metrics. Extra
attack parameters: ``--param name=value`` (applied to every attack that declares it); ``--profile
out.prof``: a cProfile (CPU timer) of the attacks alone::

    PYTHONPATH=. python benchmarks/mvmf_attack_runs.py ../shared/data/ml-100k laplace=1 gaussian=1 \\
        dp-gaussian=3 dp-laplace=3 --attacks mvmf-nonlinear --cache /tmp/nl
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import time

import numpy as np

from privaudit import audit, runner
from privaudit import transcript as transcript_module


def _transcript(run, ds, cache: str | None, key: str):
    path = os.path.join(cache, f"{key}.ptx") if cache else None
    if path and os.path.exists(path):
        return transcript_module.load(path)
    specs = [(run.defense_cls, dict(run.defense_params))] if run.defense_cls is not None else []
    task = runner.Task(run.protocol_cls, run.config, specs, object, run.seed)
    task.names = [run.protocol_name, "", run.defense_name or ""]
    transcript = runner.run_protocol(task, ds)[0].transcript
    if path:
        transcript.save(path)
    return transcript


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("runs", nargs="+", help="defense=value, or none")
    ap.add_argument("--attacks", default="mvmf-nonlinear,mvmf-aggregate,mvmf-analytic")
    ap.add_argument("--param", action="append", default=[])
    ap.add_argument("--cache", default=None)
    ap.add_argument("--profile", default=None, help="write a cProfile (CPU timer) of the attacks here")
    args = ap.parse_args()
    extra = {}
    for p in args.param:
        k, _, v = p.partition("=")
        extra[k] = json.loads(v) if v[:1] in "0123456789-[{tfn" else v
    spec = audit.Audit(protocol="fedmvmf", data=args.data, jobs=1)
    runs, _ = audit._plan(spec)
    ds = runner.subsample_users(runner.load_data(args.data), None, 0)
    prof = cProfile.Profile(time.process_time) if args.profile else None
    for want in args.runs:
        name, _, value = want.partition("=")
        run = next(
            r
            for r in runs
            if r.seed == 0 and (r.defense_name or "none") == name and (not value or float(r.value) == float(value))
        )
        transcript = _transcript(run, ds, args.cache, want)
        names = [a for a, _ in run.attacks]
        for attack_name in args.attacks.split(","):
            index = names.index(attack_name)
            cls = run.attacks[index][1]
            params = dict(getattr(cls, "audit_params", {}) or {})
            declared = {p.name for p in cls.parameters}
            params.update({k: v for k, v in extra.items() if k in declared})
            rng = np.random.default_rng(np.random.SeedSequence([run.seed, run.defense_index, run.value_index, index]))
            t = time.process_time()
            if prof is not None:
                prof.enable()
            out, _ = runner.evaluate_attack(cls, params, transcript, rng)
            if prof is not None:
                prof.disable()
            cpu = time.process_time() - t
            metrics = {k: round(v, 6) for k, v in out["attack_metrics"].items() if isinstance(v, float)}
            print(
                json.dumps({"run": want, "attack": attack_name, "cpu_s": round(cpu, 2), "metrics": metrics}), flush=True
            )
    if prof is not None:
        prof.dump_stats(args.profile)


if __name__ == "__main__":
    main()

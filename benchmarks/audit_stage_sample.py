"""CPU seconds and a cProfile of a sample of ``privaudit audit --protocol fedmvmf``'s runs.

One seed-0 run per defense kind (no defense; dp-gaussian 3; dp-laplace 3; gaussian 1; laplace 1;
sampling 1 and 3), each executed as the audit does (``audit._execute``: protocol run, privacy,
every attack), timed by ``time.process_time``; the cProfile (CPU timer) goes to the first
argument. Quicker than the whole audit (:mod:`benchmarks.audit_stages`) when only the hot
spots are wanted::

    PYTHONPATH=. python benchmarks/audit_stage_sample.py sample.prof ../shared/data/ml-100k
"""

import collections
import cProfile
import json
import sys
import time

from protocol_sample import WANTED  # this script's folder is on sys.path

from privaudit import audit, runner

cpu = collections.defaultdict(float)
count = collections.Counter()
orig_run, orig_eval = runner.run_protocol, runner.evaluate_attack


def run_protocol(task, dataset):
    t = time.process_time()
    out = orig_run(task, dataset)
    key = "protocol:" + (task.defense_specs[0][0].name if task.defense_specs else "none")
    cpu[key] += time.process_time() - t
    count[key] += 1
    return out


def evaluate_attack(cls, params, transcript, rng, privacy=None):
    t = time.process_time()
    out = orig_eval(cls, params, transcript, rng, privacy)
    cpu["attack:" + cls.name] += time.process_time() - t
    count["attack:" + cls.name] += 1
    return out


runner.run_protocol, runner.evaluate_attack = run_protocol, evaluate_attack
spec = audit.Audit(protocol="fedmvmf", data=sys.argv[2], jobs=1)
runs, header = audit._plan(spec)
wanted = set(WANTED)  # the runs benchmarks/protocol_sample.py times too
picked = [r for r in runs if r.seed == 0 and (r.defense_name, r.value) in wanted]
pr = cProfile.Profile(time.process_time)
pr.enable()
t = time.process_time()
ds = runner.subsample_users(runner.load_data(spec.data), None, 0)
cpu["load"] = time.process_time() - t
for r in picked:
    t = time.process_time()
    out = audit._execute(r, ds)
    print(
        r.defense_name,
        r.value,
        f"{time.process_time() - t:.1f} CPU s",
        {k: round(v.get("seconds", 0), 1) for k, v in out.get("attacks", {}).items()},
        out.get("error"),
        flush=True,
    )
pr.disable()
pr.dump_stats(sys.argv[1])
print(json.dumps({"cpu": cpu, "count": count, "runs_in_audit": len(runs)}, indent=1))

"""``mvmf-nonlinear`` with and without the closed-form SemiALS ObsOnly root, on ML-100K audit runs.

For each chosen seed-0 run of ``privaudit audit --protocol fedmvmf`` (protocol run as the audit
does it), the attack is run with its audit parameters (60 victims) twice from the same random
stream: as shipped (hybr returns :meth:`UserSystem.exact_root` when the system has a real root)
and with ``exact_root`` disabled (hybr iterates on every system, the previous behaviour). Prints
CPU seconds (``time.process_time``) of both, the unconverged solves, and how many rounded ratings
and attributes differ::

    PYTHONPATH=. python benchmarks/nonlinear_exact_root.py ../shared/data/ml-100k none laplace=1 dp-gaussian=3
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from privaudit import audit, registry, runner
from privaudit.attacks.mvmf import nonlinear as mvmf_nonlinear


def _attack(transcript, run, exact: bool):
    saved = mvmf_nonlinear.UserSystem.exact_root
    if not exact:
        mvmf_nonlinear.UserSystem.exact_root = lambda self: None
    try:
        cls = registry.get("attack", "mvmf-nonlinear")
        attack = cls(**cls.audit_params)
        index = [name for name, _ in run.attacks].index("mvmf-nonlinear")
        rng = np.random.default_rng(np.random.SeedSequence([run.seed, run.defense_index, run.value_index, index]))
        t = time.process_time()
        recon = attack.run(transcript.view(attack.party), attack.prior_knowledge(transcript, rng), rng)
        return recon, time.process_time() - t
    finally:
        mvmf_nonlinear.UserSystem.exact_root = saved


def main() -> None:
    data, wanted = sys.argv[1], sys.argv[2:]
    spec = audit.Audit(protocol="fedmvmf", data=data, jobs=1)
    runs, _ = audit._plan(spec)
    ds = runner.subsample_users(runner.load_data(data), None, 0)
    for want in wanted:
        name, _, value = want.partition("=")
        run = next(
            r
            for r in runs
            if r.seed == 0 and (r.defense_name or "none") == name and (not value or float(r.value) == float(value))
        )
        specs = [(run.defense_cls, dict(run.defense_params))] if run.defense_cls is not None else []
        task = runner.Task(run.protocol_cls, run.config, specs, object, run.seed)
        task.names = [run.protocol_name, "", run.defense_name or ""]
        transcript = runner.run_protocol(task, ds)[0].transcript
        (new, cpu_new), (old, cpu_old) = _attack(transcript, run, True), _attack(transcript, run, False)
        differ = {
            key: sum(int(np.sum(old.victims[p][key] != new.victims[p][key])) for p in old.victims)
            for key in ("ratings", "attributes")
        }
        victims = sum(
            any(np.any(old.victims[p][k] != new.victims[p][k]) for k in ("ratings", "attributes")) for p in old.victims
        )
        out = {
            "run": want,
            "cpu_s_iterated": round(cpu_old, 2),
            "cpu_s_exact_root": round(cpu_new, 2),
            "unconverged_iterated": old.meta["unconverged_solves"],
            "unconverged_exact_root": new.meta["unconverged_solves"],
            "solves": new.meta["solves_per_victim"] * new.meta["victims"],
            "differing": differ,
            "entries": sum(len(v["ratings"]) for v in old.victims.values()),
            "victims_differing": victims,
        }
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

"""The cost of a sweep or an audit on this machine, said before the work.

The CLI runs the same plan once on a small sample of users (:data:`CALIBRATION_USERS`, one seed,
one swept value; for an audit every cell), times it, and scales the time linearly to the run's
users, seeds and points, divided by the processes that run at once. Above :data:`ANNOUNCE_ABOVE`
seconds it prints one line with the estimate and how to make it shorter (``--seeds 1``,
``--users N``, ``--jobs``). A plan that cannot run on so few users (a cohort rule, clients per
round) gets no estimate: the calibration is best effort and never stops the command.

The estimate is rough by design (a protocol's cost is not exactly linear in users, nor a
machine's load constant); the runner's progress line refines it once the first runs finish.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

#: users of the calibration run (fewer when the data has fewer)
CALIBRATION_USERS = 30
#: the estimate line is printed when the work is expected to take longer (seconds)
ANNOUNCE_ABOVE = 60.0


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Seconds expected for ``runs`` runs of ``users`` users, ``at_once`` at a time, from a
    calibration of ``calibration_seconds`` on ``calibration_users`` users."""

    seconds: float
    runs: int
    users: int
    at_once: int
    calibration_seconds: float
    calibration_users: int
    seeds: int
    at_least: bool = False

    def line(self, what: str) -> str:
        """The one line the CLI prints: the estimate, what it is from, how to shorten it."""
        hints = []
        if self.seeds > 1:
            hints.append(f"--seeds 1 (~{_duration(self.seconds / self.seeds)})")
        smaller = max(self.calibration_users, self.users // 4)
        if smaller < self.users:
            hints.append(f"--users {smaller} (~{_duration(self.seconds * smaller / self.users)})")
        hints.append(f"--jobs N runs N at a time (now {self.at_once})")
        return (
            f"estimated time on this machine: {'at least ' if self.at_least else ''}~{_duration(self.seconds)} "
            f"for {self.runs} runs of {what} with "
            f"{self.users} users (from a {self.calibration_users}-user run: {self.calibration_seconds:.1f} s); "
            f"shorter: {', '.join(hints)}"
        )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _calibrate(run, users: int, runs_of, at_once: int) -> tuple[float, float, int] | None:
    """(seconds of one calibration run at ``cal`` users, seconds per extra user, ``cal``), or
    None when the work is clearly short. The plan runs at a third of :data:`CALIBRATION_USERS`
    first (warming up imports and caches); when even that time scaled linearly to ``users`` and
    to every run (``runs_of()``, ``at_once`` at a time: an overestimate) stays under
    :data:`ANNOUNCE_ABOVE`, it stops there. Otherwise it runs at all of them and at the third
    again; the per-user slope is taken from the last two. None too when a calibration run fails
    (the plan may need more users than the sample has)."""
    cal = min(users, CALIBRATION_USERS)
    small = max(2, cal // 3) if cal > 2 else cal
    try:
        return _measure(run, users, runs_of, at_once, cal, small)
    except Exception:  # noqa: BLE001 - best effort: a plan that cannot run on few users has no estimate
        return None


def _measure(run, users: int, runs_of, at_once: int, cal: int, small: int) -> tuple[float, float, int] | None:
    first = _timed(run, small)
    if first * max(1.0, users / small) * math.ceil(runs_of() / max(1, at_once)) < ANNOUNCE_ABOVE:
        return None
    if small >= cal:
        return first, 0.0, cal
    big = _timed(run, cal)
    slope = max(0.0, (big - _timed(run, small)) / (cal - small))
    return big, slope, cal


def _timed(run, users: int) -> float:
    t0 = time.perf_counter()
    run(users)
    return time.perf_counter() - t0


def _scaled(
    big: float, slope: float, cal: int, users: int, runs: int, cal_runs: int, at_once: int, seeds: int
) -> Estimate:
    per_run = (big + slope * max(0, users - cal)) / max(1, cal_runs)
    at_once = max(1, min(at_once, runs))
    total = per_run * math.ceil(runs / at_once)
    return Estimate(total, runs, users, at_once, big, cal, seeds)


def _at_once(jobs: int, scheduler: str | None) -> int:
    from privaudit.runner import default_jobs

    if scheduler:
        text = str(scheduler)
        return int(text.partition(":")[2] or 2) if text.startswith("local") else default_jobs()
    return default_jobs() if jobs < 0 else max(1, min(jobs, default_jobs()))


def experiment_estimate(plan: Any, dataset: Any) -> Estimate | None:
    """Time ``plan`` (a :class:`~privaudit.plan.Plan`) on samples of ``dataset``'s users
    (already loaded and subsampled to the plan's users; :func:`_calibrate`), one seed, its last
    swept value (the strongest defense: often the costliest), and scale it to the whole plan."""
    from privaudit.experiment import run_plan
    from privaudit.runner import subsample_users

    sweep = plan.sweep
    one = dataclasses.replace(
        plan,
        seeds=list(plan.seeds[:1]),
        sweep=dataclasses.replace(sweep, values=tuple(sweep.values[-1:])) if sweep is not None else None,
        users=None,
        jobs=1,
        scheduler=None,
        progress=False,
    )
    users = int(dataset.n_users)
    runs = (len(sweep.values) if sweep is not None else 1) * len(plan.seeds)
    at_once = _at_once(int(plan.jobs), plan.scheduler)
    cal = _calibrate(
        lambda n: run_plan(one, dataset=subsample_users(dataset, n, plan.seed)), users, lambda: runs, at_once
    )
    if cal is None:
        return None
    return _scaled(*cal, users, runs, 1, at_once, len(plan.seeds))


def audit_estimate(audit: Any, dataset: Any) -> Estimate | None:
    """Time the undefended runs of ``audit`` (a :class:`~privaudit.audit.Audit`; one seed, no
    canary runs) on samples of ``dataset``'s users (:func:`_calibrate`) and scale them to every
    run of the audit: a lower bound (``Estimate.at_least``), as a defended run (noise, and above
    all encryption) costs at least as much as the undefended one."""
    from privaudit import audit as au
    from privaudit.runner import subsample_users

    one = dataclasses.replace(
        audit, users=None, seeds=1, jobs=1, scheduler=None, progress=False, canaries=0, defenses=[]
    )
    per_seed: list[int] = []

    def run(n: int) -> None:
        out = au.run_audit(one, dataset=subsample_users(dataset, n, audit.seed))
        per_seed.append(int(out["timing"]["runs"]))

    swept, _ = au.applicable_defenses(
        audit.protocol, include_hiding=audit.defenses is not None, selected=tuple(audit.defenses or ())
    )
    if audit.defenses is not None:
        swept = [d for d in swept if d.name in set(audit.defenses)]
    cells = 1 + sum(len(au.defense_grid(d)) for d in swept)
    users = int(dataset.n_users)
    at_once = _at_once(int(audit.jobs), audit.scheduler)
    cal = _calibrate(run, users, lambda: per_seed[-1] * int(audit.seeds) * cells, at_once)
    if cal is None:
        return None
    runs = per_seed[-1] * int(audit.seeds) * cells
    est = _scaled(*cal, users, runs, per_seed[-1], at_once, int(audit.seeds))
    return dataclasses.replace(est, at_least=True)

"""Benchmark: ``mvmf-analytic`` (closed form) vs ``mvmf-nonlinear`` (root finding) on FedMVMF.

Both attacks read the *same* server views: one FedMVMF transcript per scenario (SemiALS/SGD x
ObsOnly/InclUnc) on MovieLens 100K, every user a client (``cold_user_fraction=0``), two
recorded epochs (the protocol's default ``record_rounds``).

Part 1 (speed, noise-free): per scenario, users/second of each attack (wall clock of
``Attack.run`` on the server view; the analytic attack on all users, median of ``--repeats``
runs; the nonlinear attack once, on ``--users`` randomly chosen victims,
default 20 for ObsOnly and ``--users-inclunc``, default 3, for InclUnc, whose systems have
~m unknowns each), the ratio (by wall clock and by CPU time of the process, which is what
stays meaningful on a shared machine), and the accuracies
(PrivMVMF paper eq. 43; the analytic attack on all users and on the nonlinear attack's victims).

The analytic attack reports the rounds it read: ``[0]`` where the first round alone decided
every value (its noise-adaptive shortcut; noise-free SemiALS and InclUnc), else every round.

Part 2 (noise sweep): the same scenarios with a ``laplace`` defense of scale b in
``--scales`` (default 0, 1e-4, 1e-3, 1e-2, 1e-1, 0.5, 1; same seed, so the split and the
initial model are fixed), both attacks' rating and attribute accuracies side by side, scored on
the same victims (the nonlinear attack's sample).

Usage::

    python benchmarks/mvmf_attacks.py                       # everything (~15-30 min on 2 cores)
    python benchmarks/mvmf_attacks.py --users 50            # more victims for the nonlinear attack
    python benchmarks/mvmf_attacks.py --scenarios semials-obsonly --no-sweep
    python benchmarks/mvmf_attacks.py --data PATH           # another MovieLens folder / CSV

Prints only ratios and figures measured in this run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit import registry
from privaudit.attacks.base import Reconstruction
from privaudit.data import load_dataset

DEFAULT_DATA = ml100k_dir()
SCENARIOS = ("semials-obsonly", "semials-inclunc", "sgd-obsonly", "sgd-inclunc")
DEFAULT_SCALES = (0.0, 1e-4, 1e-3, 1e-2, 1e-1, 0.5, 1.0)


def transcript_for(dataset, scenario: str, scale: float, seed: int, epochs: int):
    update, unrated = scenario.split("-")
    defenses = [registry.get("defense", "laplace")(scale=scale)] if scale > 0 else []
    proto = registry.get("protocol", "fedmvmf")()
    cfg = {"update": update, "unrated": unrated, "epochs": epochs, "record_rounds": 2, "cold_user_fraction": 0.0}
    return proto.run(dataset, cfg, defenses, rng=seed).transcript


def timed_run(attack, transcript, seed: int, repeats: int = 1):
    """(reconstruction, wall seconds, CPU seconds) of ``attack.run`` on the server view.

    With ``repeats > 1`` the run is repeated on the same view and the *median* wall and CPU
    times are reported (the machine is shared; the median is robust to other jobs' bursts
    without picking the luckiest run).
    """
    view = transcript.view(attack.party)
    ok, reason = attack.applicable(view)
    if not ok:
        raise SystemExit(f"{attack.name}: not applicable ({reason})")
    walls, cpus = [], []
    for _ in range(max(1, repeats)):
        knowledge = attack.prior_knowledge(transcript, np.random.default_rng(seed))
        tic, cpu = time.perf_counter(), time.process_time()
        recon = attack.run(view, knowledge, np.random.default_rng(seed))
        walls.append(time.perf_counter() - tic)
        cpus.append(time.process_time() - cpu)
    return recon, float(np.median(walls)), float(np.median(cpus))


def restrict(recon: Reconstruction, victims) -> Reconstruction:
    return Reconstruction(
        recon.attack,
        recon.party,
        {v: recon.victims[v] for v in victims if v in recon.victims},
        recon.supported,
        recon.reason,
        recon.meta,
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="MovieLens folder or CSV (default: ML-100K)")
    ap.add_argument(
        "--users", type=int, default=20, help="victims of the (slow) nonlinear attack per ObsOnly transcript"
    )
    ap.add_argument(
        "--users-inclunc",
        type=int,
        default=3,
        help="victims of the nonlinear attack per InclUnc transcript (one system of ~m unknowns each)",
    )
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--scales", default=",".join(str(s) for s in DEFAULT_SCALES))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sweep", action="store_true", help="speed table only")
    ap.add_argument("--no-nonlinear", action="store_true", help="analytic attack only")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of the analytic attack per transcript; median wall/CPU time reported",
    )
    return ap


def _measure(args, dataset, scenario: str, scale: float, analytic_cls, nonlinear_cls, first: bool) -> dict:
    """One transcript: both attacks' victims, wall and CPU time and accuracies."""
    tic = time.perf_counter()
    tr = transcript_for(dataset, scenario, scale, args.seed, args.epochs)
    gen = time.perf_counter() - tic
    if first:
        keys = ("K", "alpha", "lam", "w", "eta", "epochs", "record_rounds", "lr", "init_scale")
        print("protocol config:", {k: tr.config.get(k) for k in keys})
    score = analytic_cls().score
    rec_a, t_a, c_a = timed_run(analytic_cls(), tr, args.seed, args.repeats)
    row = {
        "scenario": scenario,
        "scale": scale,
        "n_a": len(rec_a.victims),
        "t_a": t_a,
        "c_a": c_a,
        "acc_a": score(rec_a, tr),
        "gen": gen,
        "rounds_a": rec_a.meta.get("rounds"),
    }  # [first] when the first-round shortcut decided everything
    if nonlinear_cls is not None:
        users = args.users_inclunc if scenario.endswith("inclunc") else args.users
        rec_n, t_n, c_n = timed_run(nonlinear_cls(users=users), tr, args.seed)
        row.update(
            n_n=len(rec_n.victims),
            t_n=t_n,
            c_n=c_n,
            acc_n=score(rec_n, tr),
            acc_a_same=score(restrict(rec_a, rec_n.victims), tr),
        )
    return row


def _print_speed(rows: list[dict], repeats: int) -> None:
    print(
        "\n== speed (noise-free; Attack.run; users/second by wall clock and by CPU time of this process;"
        f" analytic: median of {repeats} runs) =="
    )
    print(
        f"{'scenario':18s} {'analytic u/s':>13s} {'(cpu)':>9s} {'nonlinear u/s':>14s} {'(cpu)':>8s} {'ratio':>7s} {'ratio(cpu)':>10s}"
        "  analytic acc (all users)  nonlinear acc (its victims) / analytic on them"
    )
    for r in rows:
        if r["scale"] != 0.0:
            continue
        ups_a = r["n_a"] / r["t_a"]
        cps_a = r["n_a"] / r["c_a"]
        line = f"{r['scenario']:18s} {ups_a:13.1f} {cps_a:9.1f} "
        if "t_n" in r:
            ups_n = r["n_n"] / r["t_n"]
            cps_n = r["n_n"] / r["c_n"]
            line += f"{ups_n:14.3f} {cps_n:8.3f} {ups_a / ups_n:6.0f}x {cps_a / cps_n:9.0f}x "
        else:
            line += f"{'-':>14s} {'-':>8s} {'-':>7s} {'-':>10s} "
        line += (
            f" r={r['acc_a']['rating_accuracy']:.4f} x={r['acc_a']['attribute_accuracy']:.4f}"
            f" ({r['n_a']} users, {r['t_a']:.3f} s wall, {r['c_a']:.3f} s cpu, rounds {r['rounds_a']})"
        )
        if "acc_n" in r:
            line += (
                f"   r={r['acc_n']['rating_accuracy']:.4f} x={r['acc_n']['attribute_accuracy']:.4f}"
                f" / r={r['acc_a_same']['rating_accuracy']:.4f} x={r['acc_a_same']['attribute_accuracy']:.4f}"
            )
        print(line)


def _print_sweep(rows: list[dict]) -> None:
    print("\n== Laplace noise sweep: rating / attribute accuracy (same victims; analytic on all users in brackets) ==")
    print(
        f"{'scenario':18s} {'b':>7s}  {'analytic r':>10s} {'nonlin r':>9s}  {'analytic x':>10s} {'nonlin x':>9s}   [analytic all users r / x]"
    )
    for r in rows:
        a = r.get("acc_a_same", r["acc_a"])
        n = r.get("acc_n")
        nr = f"{n['rating_accuracy']:9.4f}" if n else f"{'-':>9s}"
        nx = f"{n['attribute_accuracy']:9.4f}" if n else f"{'-':>9s}"
        print(
            f"{r['scenario']:18s} {r['scale']:7g}  {a['rating_accuracy']:10.4f} {nr}  {a['attribute_accuracy']:10.4f} {nx}"
            f"   [{r['acc_a']['rating_accuracy']:.4f} / {r['acc_a']['attribute_accuracy']:.4f}]"
        )


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if not Path(args.data).exists():
        print(f"dataset not found: {args.data}", file=sys.stderr)
        return 2
    dataset = load_dataset(args.data)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    scales = [float(s) for s in args.scales.split(",")]
    analytic_cls = registry.get("attack", "mvmf-analytic")
    nonlinear_cls = None if args.no_nonlinear else registry.available("attack").get("mvmf-nonlinear")
    if nonlinear_cls is None and not args.no_nonlinear:
        print("mvmf-nonlinear is not registered: analytic attack only")
    print(f"dataset: {dataset.summary()}; nonlinear victims per transcript: {args.users}")
    rows = []
    for scenario in scenarios:
        for scale in [0.0] if args.no_sweep else scales:
            rows.append(_measure(args, dataset, scenario, scale, analytic_cls, nonlinear_cls, first=not rows))
            _print_row(rows[-1])
            sys.stdout.flush()
    _print_speed(rows, args.repeats)
    if not args.no_sweep:
        _print_sweep(rows)
    return 0


def _print_row(r) -> None:
    msg = (
        f"[{r['scenario']} b={r['scale']:g}] transcript {r['gen']:.1f} s; analytic: {r['n_a']} users in {r['t_a']:.2f} s ({r['c_a']:.2f} s cpu)"
        f" r={r['acc_a']['rating_accuracy']:.4f} x={r['acc_a']['attribute_accuracy']:.4f}"
    )
    if "t_n" in r:
        msg += (
            f"; nonlinear: {r['n_n']} users in {r['t_n']:.1f} s ({r['c_n']:.1f} s cpu) r={r['acc_n']['rating_accuracy']:.4f}"
            f" x={r['acc_n']['attribute_accuracy']:.4f} (analytic on them r={r['acc_a_same']['rating_accuracy']:.4f}"
            f" x={r['acc_a_same']['attribute_accuracy']:.4f})"
        )
    print(msg)


if __name__ == "__main__":
    sys.exit(main())

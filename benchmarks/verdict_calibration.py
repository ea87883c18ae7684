"""How often each verdict rule says "leaks" on null data, and how often on a real leak.

End to end: every repetition runs a full experiment (``privaudit.experiment``) of the dummy
protocol of ``tests/dummies.py`` (each client holds ``p`` secret bits and uploads them as
+-1 per bit) attacked by ``dummy-attack`` (it guesses bit = upload > 0, and gives a victim
table), over a grid of three defense strengths, with a fresh base seed per repetition.

Scenarios (defense on every upload):

* ``null, independent``: ``null-noise`` replaces every uploaded float by independent N(0, 1)
  noise: the attack sees nothing about the truth (its accuracy is 0.5 in expectation).
* ``null, correlated``: the protocol draws one secret bit per client and repeats it over its
  ``p`` bits (``BlockProtocol``), and ``null-noise`` with ``shared=1`` replaces a client's upload
  by one N(0, 1) draw repeated over its bits (plus 1e-3 independent noise): still independent of
  the truth, but a victim's guesses are all right or all wrong together, so its records are
  perfectly correlated (60 independent units, not 480).
* ``leak``: ``dummy-noise`` (Laplace noise added to the +-1 uploads) at scales 1.5, 2, 3: a
  clear leak (accuracy 1 - exp(-1/b)/2, about 0.72-0.86).
* ``weak leak``: the same at scales 6, 8, 10 (accuracy about 0.58, 0.56, 0.55).

Rules, per experiment (a "leaks" anywhere in the grid counts once):

* ``verdict``: :func:`privaudit.results.experiment_verdicts` -- cluster bootstrap over
  victims, one-sided lower bound > 0 after Holm over the grid's points and metrics.
* ``record CP``: the former one-seed rule's interval -- a 95 % Clopper-Pearson interval over
  records as if independent -- lower bound > 0 at any grid point, no multiplicity correction.
* ``old rule``: the former verdict, "leaks" unless the upper bound (Clopper-Pearson, one seed;
  Student-t over seeds) is below 0.05.

Run: ``python benchmarks/verdict_calibration.py --reps 200`` (``--seeds 2`` for two seeds per
point; ``--users``/``--bits`` for the size).

Built-in protocols (``--protocol fedmvmf|fedrec|fedncf|fedsplit|fedproto``): each repetition is
one experiment of the protocol at a tiny size (:data:`PROTOCOLS`) with its default attack, one
grid point, a fresh base seed. Null: the ``null-replace`` defense replaces every uploaded float
by independent N(0, 1) noise (the messages carry nothing but their shapes and item ids); for
FedNCF, whose attack reads the uploaded id sets, ``null-dense`` makes every client upload every
item row, all noise. Weak
leak: the protocol's ``laplace`` noise at a scale where the attack still leaks a little. Printed
per seed count: the share of experiments reading "leaks" and "attack below prior" on the null
with 95 % Clopper-Pearson upper bounds, and the share reading "leaks" on the weak leak (power).
``--jobs`` runs repetitions in parallel processes (run it under ``nice``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from privaudit import experiment as ex  # noqa: E402
from privaudit import registry  # noqa: E402
from privaudit import results as rs  # noqa: E402
from privaudit.data.synthetic import synthetic  # noqa: E402
from privaudit.defenses.base import Defense, UploadBatch  # noqa: E402
from privaudit.metrics import clopper_pearson, mean_ci95  # noqa: E402
from privaudit.params import Param  # noqa: E402
from privaudit.protocols.base import RunResult  # noqa: E402
from tests.dummies import DummyProtocol, register_dummies, tiny_dataset  # noqa: E402


class BlockProtocol(DummyProtocol):
    """The dummy protocol with one secret bit per client repeated over its ``p`` bits."""

    def simulate(self, setup):
        config, n = setup.config, setup.dataset.n_users
        rng = np.random.default_rng(setup.seed)
        bits = np.repeat(rng.integers(0, 2, size=(n, 1)), config["p"], axis=1).astype(np.float64)
        senders = [f"client:{u}" for u in range(n)]
        private = {party: {"bits": bits[u]} for u, party in enumerate(senders)}
        t, channel = self.start(setup, ["server", *senders], private, rng)
        for r in range(config["rounds"]):
            channel.send(r, "upload", senders, [{"values": config["signal"] * (2 * bits[u] - 1)} for u in range(n)])
        return RunResult(t, bits, {"ndcg@10": 1.0})


class NullNoise(Defense):
    """Replaces every uploaded float by N(0, 1) noise independent of the truth (``shared``:
    one draw per client repeated over its values, plus 1e-3 independent noise)."""

    description = "benchmark defense: uploads replaced by independent noise"
    parameters = (
        Param("scale", 1.0, "unused strength (a grid for the verdicts)", ge=0),
        Param("shared", 0, "1: one noise draw per client", ge=0, le=1),
    )
    strength = "scale"
    default_grid = (1.0, 2.0, 3.0)

    def process_uploads(self, uploads, ctx, call_next):
        return call_next(uploads.map(lambda b: self.replaced(b, ctx.rng)))

    def replaced(self, batch: UploadBatch, rng) -> UploadBatch:
        for payload in batch.payloads:
            for key in batch.float_keys(payload):
                shape = np.shape(payload[key])
                if self.shared:
                    payload[key] = rng.normal() + 1e-3 * rng.normal(size=shape)
                else:
                    payload[key] = rng.normal(size=shape)
        return batch


#: name -> (protocol class, defense, its parameters, grid of its scale)
SCENARIOS = {
    "null, independent": (DummyProtocol, "null-noise", {}, "1,2,3"),
    "null, correlated": (BlockProtocol, "null-noise", {"shared": 1}, "1,2,3"),
    "leak": (DummyProtocol, "dummy-noise", {}, "1.5,2,3"),
    "weak leak": (DummyProtocol, "dummy-noise", {}, "6,8,10"),
}


def old_rule_leaks(points: list[dict], n_records: int) -> bool:
    """The former verdict: "leaks" unless the advantage's upper bound is below 0.05."""
    for value in sorted({p["value"] for p in points}):
        adv = [p["attack_metrics"]["accuracy"] - 0.5 for p in points if p["value"] == value]
        mean, half = mean_ci95(adv)
        if len(adv) == 1:
            hi = clopper_pearson(int(round((adv[0] + 0.5) * n_records)), n_records)[1] - 0.5
        else:
            hi = mean + half
        if mean >= 0 and hi >= rs.PROTECTION_MARGIN:
            return True
    return False


def record_cp_leaks(points: list[dict], n_records: int) -> bool:
    """Clopper-Pearson over records (as if independent): lower bound > 0 at any point."""
    for p in points:
        acc = p["attack_metrics"]["accuracy"]
        if clopper_pearson(int(round(acc * n_records)), n_records)[0] > 0.5:
            return True
    return False


def run(reps: int, seeds: int, users: int, bits: int) -> list[tuple[str, dict[str, float], float]]:
    register_dummies()
    registry._register("defense", "null-noise")(NullNoise)
    data = tiny_dataset(users, n_items=12)
    table = []
    for name, (protocol, defense, params, grid) in SCENARIOS.items():
        registry.unregister("protocol", "dummy-proto")
        registry._register("protocol", "dummy-proto")(protocol)
        hits = {"verdict": 0, "record CP": 0, "old rule": 0}
        t0 = time.perf_counter()
        for rep in range(reps):
            res = ex.build_experiment(
                protocol="dummy-proto",
                defenses=[{"name": defense, **(params or {})}],
                sweep=ex.Sweep(defense, "scale", tuple(float(v) for v in str(grid).split(","))),
                protocol_config={"p": bits, "rounds": 1},
                seeds=seeds,
                seed=1000 * rep,
            ).run(data)
            rows = res["verdicts"][0]["rows"]
            hits["verdict"] += any(r["verdict"] == "leaks" for r in rows)
            hits["record CP"] += record_cp_leaks(res["points"], users * bits) if seeds == 1 else 0
            hits["old rule"] += old_rule_leaks(res["points"], users * bits)
        table.append((name, {k: v / reps for k, v in hits.items()}, time.perf_counter() - t0))
    return table


class NullReplace(Defense):
    """Replaces every uploaded float by independent N(0, 1) noise (ids and shapes kept)."""

    description = "benchmark defense: every uploaded float replaced by independent N(0, 1) noise"
    parameters = (Param("scale", 1.0, "unused strength (a grid point for the verdicts)", ge=0),)
    strength = "scale"
    default_grid = (1.0,)

    def process_uploads(self, uploads, ctx, call_next):
        for batch in uploads.batches:
            for payload in batch.payloads:
                for key in batch.float_keys(payload):
                    payload[key] = ctx.rng.normal(size=np.shape(payload[key]))
        return call_next(uploads)


class NullDense(Defense):
    """Every upload with item ids becomes every item's row, each an independent N(0, 1) draw (the
    id set and the values carry nothing); other uploaded floats are replaced by N(0, 1) noise."""

    description = "benchmark defense: every client uploads every item row, all of them noise"
    parameters = (Param("scale", 1.0, "unused strength (a grid point for the verdicts)", ge=0),)
    strength = "scale"
    default_grid = (1.0,)

    def process_uploads(self, uploads, ctx, call_next):
        m = int(ctx.transcript.config.get("n_items", 0))
        for batch in uploads.batches:
            for payload in batch.payloads:
                if "items" in payload and "values" in payload and m > 0:
                    payload["items"] = np.arange(m, dtype=np.int64)
                    payload["values"] = ctx.rng.normal(size=(m, np.shape(payload["values"])[1]))
                for key in batch.float_keys(payload):
                    if key != "values" or "items" not in payload:
                        payload[key] = ctx.rng.normal(size=np.shape(payload[key]))
        return call_next(uploads)


#: protocol -> (tiny synthetic data, protocol config, laplace scale of the weak leak, defenses
#: always on -- fedrec's attack needs virtual items to tell apart)
SMALL = dict(n_users=40, n_items=60, min_ratings=8, density=0.15)
PROTOCOLS = {
    "fedmvmf": (SMALL, {"epochs": 2, "K": 4}, 1.0, []),
    "fedrec": (SMALL, {"T": 3, "d": 4}, 0.03, [{"name": "sampling", "rho": 1.0}]),
    "fedncf": (
        SMALL,
        {"D": 4, "local_epochs": 1, "max_rounds": 2, "clients_per_round": 40, "eval_negatives": 20},
        0.05,
        [],
    ),
    "fedsplit": ({**SMALL, "n_users": 80}, {"n_iter": 20, "centralized": False, "group_max": 6}, 0.3, []),
    "fedproto": ({**SMALL, "n_users": 60}, {"k": 3, "latent_dim": 4}, 0.3, []),
}


#: Protocols without a null configuration here, and why.
NO_NULL: dict[str, str] = {}

#: The null defense per protocol (default null-replace): FedNCF's attack reads which item rows a
#: client uploaded, so its null also makes every client upload every row.
NULL_DEFENSE = {"fedncf": "null-dense"}


def protocol_rep(protocol: str, scenario: str, seeds: int, rep: int, scale: float | None = None) -> tuple[bool, bool]:
    """One experiment of ``protocol``: ("leaks" on the tested row, "attack below prior" on it)."""
    if "null-replace" not in registry.available("defense"):
        registry._register("defense", "null-replace")(NullReplace)
    if "null-dense" not in registry.available("defense"):
        registry._register("defense", "null-dense")(NullDense)
    null = NULL_DEFENSE.get(protocol, "null-replace")
    data_kw, config, weak, always = PROTOCOLS[protocol]
    data = synthetic(seed=0, **data_kw)
    if scenario == "null":
        kw = dict(defenses=[*always, {"name": null}], sweep=ex.Sweep(null, "scale", (1.0,)))
    else:
        kw = dict(defenses=list(always), noise="laplace", scales=(weak if scale is None else scale,))
    res = ex.build_experiment(protocol=protocol, protocol_config=config, seeds=seeds, seed=1000 * rep + 7, **kw).run(
        data
    )
    rows = res["verdicts"][0]["rows"] if res["verdicts"] else []
    rows = [r for r in rows if r["value"] not in (0, 0.0)]
    return any(r["verdict"] == "leaks" for r in rows), any(r["verdict"] == "attack below prior" for r in rows)


def run_protocol(protocol: str, reps: int, power_reps: int, seeds: int, jobs: int) -> dict[str, float]:
    from joblib import Parallel, delayed

    t0 = time.perf_counter()
    null = Parallel(n_jobs=jobs)(delayed(protocol_rep)(protocol, "null", seeds, r) for r in range(reps))
    weak = Parallel(n_jobs=jobs)(delayed(protocol_rep)(protocol, "weak", seeds, r) for r in range(power_reps))
    leaks, below = sum(a for a, _ in null), sum(b for _, b in null)
    return {
        "leaks": leaks / reps,
        "leaks_cp": clopper_pearson(leaks, reps)[1],
        "below": below / reps,
        "below_cp": clopper_pearson(below, reps)[1],
        "power": sum(a for a, _ in weak) / max(1, power_reps),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--users", type=int, default=60)
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--protocol", choices=sorted(PROTOCOLS), help="a built-in protocol instead of the dummy")
    ap.add_argument("--seed-counts", default="1,2,3", help="--protocol: seeds per point to calibrate")
    ap.add_argument("--power-reps", type=int, default=50, help="--protocol: experiments of the weak leak")
    ap.add_argument("--jobs", type=int, default=1, help="--protocol: parallel processes")
    args = ap.parse_args()
    if args.protocol in NO_NULL:
        print(f"{args.protocol}: not calibrated: {NO_NULL[args.protocol]}")
        return
    if args.protocol:
        _, config, weak, _always = PROTOCOLS[args.protocol]
        print(
            f"{args.protocol} {config}, {args.reps} null experiments "
            f"({NULL_DEFENSE.get(args.protocol, 'null-replace')}) and {args.power_reps} "
            f"weak-leak experiments (laplace scale {weak}) per seed count; 95 % Clopper-Pearson upper bounds"
        )
        print(
            '| seeds | null "leaks" (CP upper) | null "attack below prior" (CP upper) | weak leak "leaks" | seconds |'
        )
        print("|---|---|---|---|---|")
        for s in [int(x) for x in args.seed_counts.split(",")]:
            r = run_protocol(args.protocol, args.reps, args.power_reps, s, args.jobs)
            print(
                f"| {s} | {r['leaks']:.3f} ({r['leaks_cp']:.3f}) | {r['below']:.3f} ({r['below_cp']:.3f}) | "
                f"{r['power']:.2f} | {r['seconds']:.0f} |",
                flush=True,
            )
        return
    table = run(args.reps, args.seeds, args.users, args.bits)
    print(
        f"{args.reps} repetitions, {args.seeds} seed(s) per point, {args.users} victims x {args.bits} bits, "
        '3 grid points; share of experiments with any "leaks"'
    )
    print("| scenario | verdict (cluster bootstrap, Holm) | record CP (no correction) | old rule | seconds |")
    print("|---|---|---|---|---|")
    for name, rates, seconds in table:
        cp = "n/a" if args.seeds != 1 else f"{rates['record CP']:.3f}"
        half = 1.96 * math.sqrt(max(rates["verdict"] * (1 - rates["verdict"]), 1e-12) / args.reps)
        print(f"| {name} | {rates['verdict']:.3f} (± {half:.3f}) | {cp} | {rates['old rule']:.3f} | {seconds:.0f} |")


if __name__ == "__main__":
    main()

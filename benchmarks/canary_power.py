"""Power of the one-run canary audit: how small a noise error it flags, per DP defense.

A broken mechanism claims a defense's epsilon (same public config, same ``privacy_spent``) but
adds noise ``factor`` times too small (Laplace scale or Gaussian standard deviation divided by
``factor``; for dp-laplace the true per-round epsilon is ``factor`` times the claim). For each
factor and seed, :func:`privaudit.canary.canary_audit` runs once on the synthetic data with the
kit's defaults (the canary count and design the audit uses) and flags the run when its 95 %
lower bound exceeds the accounted epsilon. Factor 1 is the correct mechanism (it must be
flagged in at most 5 % of seeds). Prints a Markdown table: per factor the share of seeds
flagged (with its Clopper-Pearson 95 % interval), the median bound and guesses, and the
smallest factor flagged in at least 80 % of seeds.

    python benchmarks/canary_power.py --defense dp-laplace
    python benchmarks/canary_power.py --defense dp-gaussian --value 1
    python benchmarks/canary_power.py --protocol fedproto --defense dp-laplace --value 1 --set '{}'
    python benchmarks/canary_power.py --factors 4 --canaries 1000 --items 8 --per-user 8

``--grid``: instead, the correct defense at every value of its default grid, one canary run each
at seed 0 with the protocol's default config (what ``privaudit audit`` runs for each DP cell), with
its CPU seconds::

    python benchmarks/canary_power.py --grid --defense dp-laplace --data ../shared/data/ml-100k

``--distances``: seed 0, the correct defense, the quantiles (10 / 50 / 90 / 99 %) of the distance
between each canary's two clipped uploads over the sensitivity 2C (a Markdown table row)::

    python benchmarks/canary_power.py --distances --defense dp-gaussian --value 3 --set '{}' --items 16 --per-user 2

FedMVMF default setting (the issue's): K = 1, 2 epochs, dp-laplace epsilon 0.25 per round
(accounted 0.50 at delta 1e-5), dp-gaussian noise multiplier 3 (accounted 2.7).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from scipy.stats import beta

from privaudit import canary, registry, runner
from privaudit.defenses.dp_gaussian import DPGaussian
from privaudit.defenses.dp_laplace import DPLaplace

STRENGTH = {"dp-laplace": "epsilon", "dp-gaussian": "noise_multiplier"}
DEFAULT_VALUE = {"dp-laplace": 0.25, "dp-gaussian": 3.0}


def broken(base: type, factor: float) -> type:
    """``base`` with its noise ``factor`` times too small, everything it claims unchanged."""
    if base is DPLaplace:

        class Broken(DPLaplace):
            @property
            def noise_scale(self) -> float:
                return self.sensitivity / self.config["epsilon"] / factor

        return Broken

    class BrokenGauss(DPGaussian):
        @property
        def noise_std(self) -> float:
            return self.config["noise_multiplier"] * self.sensitivity / factor

    return BrokenGauss


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    low = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return low, high


def design(items: int | None, per_user: int | None) -> None:
    """Use a FedMVMF canary design other than the kit's default (for the comparison in
    docs/canaries.md): ``items`` canary items in groups of ``per_user`` per canary user, against
    either clip norm (the kit's default picks one design per norm: ``for_defenses``)."""
    import dataclasses

    default = canary.FedMVMFCanaries()
    l1_items, l1_group = default.items, default.per_user
    n2_items, l2_group = default.l2_items, default.l2_per_user
    if items is not None:
        l1_items = n2_items = int(items)
    if per_user is not None:
        l1_group = l2_group = int(per_user)

    @dataclasses.dataclass
    class Design(canary.FedMVMFCanaries):
        items: int = l1_items
        per_user: int = l1_group
        l2_items: int = n2_items
        l2_per_user: int = l2_group

    canary.KITS["fedmvmf"] = (Design,)


def grid(protocol: type, base: type, args: argparse.Namespace) -> None:
    """One canary run per default-grid value of ``base`` (correct), seed 0, default config."""
    data = runner.load_data(args.data)
    print(f"{args.protocol} on {data.name}, {base.name}, default config, seed 0")
    print()
    print("| value | tested | claimed ε | ε_lb | ceiling | canaries kept | guesses (correct) | CPU s |")
    print("|---|---|---|---|---|---|---|---|")
    total = 0.0
    for value in base.default_grid:
        t = time.process_time()
        r = canary.canary_audit(
            protocol, {}, [(base, {base.strength: value})], data, 0, args.canaries, names=[base.name]
        )
        cpu = time.process_time() - t
        total += cpu
        print(
            f"| {value:g} | {r.get('tested', 'run')} | {r['epsilon']:.2f} | {r['epsilon_lb']:.2f} | "
            f"{r['ceiling']:.2f} | {r['canaries']} | {r['guesses']} ({r['correct']}) | {cpu:.1f} |"
        )
    print()
    print(f"canary runs: {total:.1f} CPU s")


def distances(protocol: type, base: type, params: dict, config: dict, args: argparse.Namespace) -> None:
    """Seed 0, the correct defense: the distance of each kept canary's two clipped uploads (its
    S = +1 and S = -1 upload, in the clip's norm) over the sensitivity 2C, the quantity the
    canary's likelihood ratio reads (first-round config when the audit would use it)."""
    data = runner.load_data(args.data)
    kit = canary.canary_kit(args.protocol, args.defense)
    defenses = [base(**params)]
    cfg, _ = canary.plan_run(kit, protocol, config, defenses, args.canaries)
    augmented, record = kit.insert(data, np.random.default_rng(np.random.SeedSequence([0, 0xCA7A])))
    result = protocol().run(augmented, kit.config(cfg, augmented.n_ratings), defenses, 0)
    _, clients, items = kit.locate(record, result.model)
    got: list[float] = []
    kit.scores(result.transcript, clients, items, record["half"], record["high"], record["low"], distances=got)
    q = np.quantile(np.asarray(got) / 2.0, [0.1, 0.5, 0.9, 0.99])
    items_, per_user = kit.design()
    print(
        f"| {items_} / {per_user} | K = {cfg['K']}, {cfg['epochs']} epoch(s) | {len(clients)} | "
        + " | ".join(f"{v:.2f}" for v in q)
        + " |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--protocol", default="fedmvmf")
    ap.add_argument("--defense", default="dp-laplace", choices=sorted(STRENGTH))
    ap.add_argument("--value", type=float, default=None, help="claimed strength (default: see docstring)")
    ap.add_argument("--set", default='{"K": 1, "epochs": 2}', help="protocol config (JSON)")
    ap.add_argument("--factors", default="1,2,3,4,6,10")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--canaries", type=int, default=None, help="default: the kit's")
    ap.add_argument("--items", type=int, default=None, help="FedMVMF canary items (default: the kit's)")
    ap.add_argument("--per-user", type=int, default=None, help="FedMVMF canary items per canary user")
    ap.add_argument("--grid", action="store_true", help="the audit's canary runs over the default grid")
    ap.add_argument(
        "--distances", action="store_true", help="seed 0: quantiles of the canaries' clipped-upload distance / 2C"
    )
    ap.add_argument("--data", default="synthetic")
    args = ap.parse_args()
    protocol = registry.get("protocol", args.protocol)
    base = registry.get("defense", args.defense)
    if args.items is not None or args.per_user is not None:
        design(args.items, args.per_user)
    if args.grid:
        grid(protocol, base, args)
        return
    value = DEFAULT_VALUE[args.defense] if args.value is None else args.value
    params = {STRENGTH[args.defense]: value}
    config = json.loads(args.set)
    if args.distances:
        distances(protocol, base, params, config, args)
        return
    data = runner.load_data("synthetic")
    t0 = time.perf_counter()
    print(f"{args.protocol}, {args.defense} {STRENGTH[args.defense]} = {value:g}, config {config}, {args.seeds} seeds")
    print()
    print("| noise too small by | flagged | 95 % interval | median ε_lb | accounted ε | median guesses (correct) |")
    print("|---|---|---|---|---|---|")
    smallest = None
    for factor in (float(f) for f in args.factors.split(",")):
        cls = base if factor == 1 else broken(base, factor)
        rows = [
            canary.canary_audit(protocol, config, [(cls, params)], data, seed, args.canaries, names=[args.defense])
            for seed in range(args.seeds)
        ]
        flagged = sum(r["epsilon_lb"] > r["epsilon"] for r in rows)
        low, high = clopper_pearson(flagged, len(rows))
        if factor > 1 and smallest is None and flagged >= 0.8 * len(rows):
            smallest = factor
        g = np.median([r["guesses"] for r in rows])
        c = np.median([r["correct"] for r in rows])
        print(
            f"| {'correct' if factor == 1 else f'{factor:g}x'} | {flagged} / {len(rows)} | [{low:.2f}, {high:.2f}] "
            f"| {np.median([r['epsilon_lb'] for r in rows]):.2f} | {rows[0]['epsilon']:.2f} | {g:.0f} ({c:.0f}) |"
        )
    print()
    print(f"smallest factor flagged in >= 80 % of seeds: {'none tested' if smallest is None else f'{smallest:g}x'}")
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

"""FedMVMF speed: seconds per epoch on MovieLens 100K (all 943 users) per scenario.

For each scenario (SemiALS/SGD x ObsOnly/InclUnc) runs the default configuration twice, without
recording (``record_rounds=0``) and with recorded rounds (``record_rounds=-1``: every epoch
builds and records all clients' uploads, the cost of an observed round), and with a Laplace
noise defense (uploads are materialized and perturbed every epoch). Prints seconds per epoch
and their ratio to the 1 s/epoch target, plus a full default run on the synthetic dataset
(target: well under 1 s).

    python benchmarks/fedmvmf_speed.py [--data PATH] [--epochs 5]
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.data import load_dataset, synthetic
from privaudit.defenses.noise import LaplaceNoise
from privaudit.protocols.fedmvmf import FedMVMF

ML100K = ml100k_dir()
SCENARIOS = [(u, c) for u in ("semials", "sgd") for c in ("obsonly", "inclunc")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ML100K))
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args(argv)
    ds = load_dataset(args.data)
    print(f"{ds}\n")
    print(f"{'scenario':<18}{'plain s/epoch':>15}{'recorded s/epoch':>18}{'laplace s/epoch':>17}{'worst / 1 s':>13}")
    for update, unrated in SCENARIOS:
        cfg = {"update": update, "unrated": unrated, "epochs": args.epochs}
        times = []
        for extra, defenses in (
            ({"record_rounds": 0}, []),
            ({"record_rounds": -1}, []),
            ({"record_rounds": 0}, [LaplaceNoise(scale=0.1)]),
        ):
            res = FedMVMF().run(ds, {**cfg, **extra}, defenses=defenses, rng=0)
            times.append(res.utility["epoch_seconds"])
            del res
        print(f"{update + '/' + unrated:<18}{times[0]:>15.3f}{times[1]:>18.3f}{times[2]:>17.3f}{max(times):>13.2f}")
    syn = synthetic()
    print()
    for update, unrated in SCENARIOS:
        tic = time.perf_counter()
        FedMVMF().run(syn, {"update": update, "unrated": unrated}, rng=0)
        sec = time.perf_counter() - tic
        print(f"synthetic default full run {update}/{unrated}: {sec:.3f} s (ratio to 1 s: {sec:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

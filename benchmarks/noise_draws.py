"""CPU time of the noise samplers on one array, measured in one run (best of 5, ``time.process_time``).

``noise.laplace_noise`` (an exponential with a random sign) against ``rng.laplace`` and the
difference of two exponentials, and the summed draws of an unrecorded round
(``noise.laplace_sums``, ``noise.gaussian_sums``: one draw per summed element) against drawing
every sender's noise::

    PYTHONPATH=. python benchmarks/noise_draws.py [--size 4000000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from privaudit.defenses.noise import gaussian_sums, laplace_noise, laplace_sums


def best(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4_000_000, help="floats per draw")
    n = ap.parse_args().size
    rng = np.random.default_rng(0)

    def two_exponentials():
        x = rng.standard_exponential(n)
        x -= rng.standard_exponential(n)
        return x

    ms = {
        "laplace_noise": best(lambda: laplace_noise(rng, n, 1.0)),
        "rng.laplace": best(lambda: rng.laplace(0.0, 1.0, n)),
        "two exponentials": best(two_exponentials),
        "rng.normal": best(lambda: rng.normal(0.0, 1.0, n)),
    }
    # a round's sums: n floats from senders of ~100 rows each on 1682 x 20 summed elements
    counts = np.full((1682, 20), max(1, n // (1682 * 20)), dtype=np.float64)
    ms["laplace_sums"] = best(lambda: laplace_sums(rng, counts, 1.0))
    ms["gaussian_sums"] = best(lambda: gaussian_sums(rng, counts, 1.0))
    for name, s in ms.items():
        print(f"{name:18s} {1000 * s:8.1f} ms")
    print(f"rng.laplace / laplace_noise: {ms['rng.laplace'] / ms['laplace_noise']:.2f}x")
    print(f"two exponentials / laplace_noise: {ms['two exponentials'] / ms['laplace_noise']:.2f}x")
    print(f"per-sender Laplace / laplace_sums: {ms['laplace_noise'] / ms['laplace_sums']:.1f}x")
    print(f"per-sender Gaussian / gaussian_sums: {ms['rng.normal'] / ms['gaussian_sums']:.1f}x")


if __name__ == "__main__":
    main()

"""Recording overhead of a Flower app: the same app with and without the recorder, in one run.

    python benchmarks/flower_overhead.py --clients 5 20 50 --rounds 3

For each client count, runs the app twice under Flower's simulation engine (recorder off, then on,
then off and on again when ``--repeat 2``), and prints the wall time of each, their ratio, and where
the recorder's own time goes: message batches recorded (the Grid wrapper's ``record`` calls, one per
send or pull of the server), building the
transcript (conversion of whole-matrix replies included) and the ground-truth side channel. Ray's
start-up is in both runs; the difference of the two wall times is the recorder's cost.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from privaudit.integrations import flower  # noqa: E402


class _Timed:
    """Wraps one method of a class and adds up its wall time (``seconds``) and calls."""

    def __init__(self, cls: type, name: str):
        self.cls, self.name, self.seconds, self.calls = cls, name, 0.0, 0
        self.original = getattr(cls, name)

    def __enter__(self) -> _Timed:
        original, timed = self.original, self

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timed.seconds += time.perf_counter() - t0
                timed.calls += 1

        setattr(self.cls, self.name, wrapper)
        return self

    def __exit__(self, *exc) -> None:
        setattr(self.cls, self.name, self.original)


def one(app: Path, clients: int, rounds: int, recorder: bool, cpus: float) -> dict:
    with _Timed(flower.FlowerRecorder, "record") as rec, _Timed(flower.FlowerRecorder, "transcript") as tr:
        t0 = time.perf_counter()
        flower.record(app, clients=clients, rounds=rounds, recorder=recorder, private=recorder, cpus_per_client=cpus)
        wall = time.perf_counter() - t0
    return {"wall": wall, "record": rec.seconds, "record_calls": rec.calls, "transcript": tr.seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default=str(ROOT / "examples" / "flower-plain-mf"))
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 20, 50])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1, help="off/on pairs per client count (fastest of each kept)")
    ap.add_argument("--cpus-per-client", type=float, default=1.0)
    args = ap.parse_args(argv)
    flower.require_flwr()
    app = Path(args.app)
    print(
        f"{'clients':>7} {'off s':>7} {'on s':>7} {'ratio':>6} {'record s':>9} {'batches':>8} {'ms/batch':>8} "
        f"{'transcript s':>12}"
    )
    for n in args.clients:
        off, on = [], []
        for _ in range(args.repeat):
            off.append(one(app, n, args.rounds, False, args.cpus_per_client))
            on.append(one(app, n, args.rounds, True, args.cpus_per_client))
        a = min(off, key=lambda r: r["wall"])
        b = min(on, key=lambda r: r["wall"])
        per = 1000 * b["record"] / max(b["record_calls"], 1)
        print(
            f"{n:>7} {a['wall']:>7.1f} {b['wall']:>7.1f} {b['wall'] / a['wall']:>6.2f} {b['record']:>9.2f} "
            f"{b['record_calls']:>8} {per:>8.2f} {b['transcript']:>12.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How far one changed rating moves what a FedMVMF client releases under dp-laplace / dp-gaussian.

``one-rating``: two runs with the same seed whose data differ in one rating of client 0 (its
first rating at the scale's minimum, else its lowest, set to the maximum). For every clipping
mode it prints the L1 (dp-laplace) or L2 (dp-gaussian) distance of client 0's release (grad_V
and grad_P together) in rounds 0 and 1 -- pre-noise (noise switched off) and as released (with
the same seed the round-0 noise is identical in both runs) -- next to the sensitivity and the
per-round epsilon the accountant uses, and distance / noise scale (for Laplace the privacy loss
of this pair in round 0, at most the accounted epsilon; for Gaussian the pair's mu).

``utility``: NDCG@10 (existing users, cold-start users) without a defense and under each mode
at each epsilon, with the mean seconds per epoch and the growth of the process's peak memory
(dense uploads).

    python benchmarks/dp_sensitivity.py one-rating [--data synthetic|PATH] [--defense dp-gaussian]
    python benchmarks/dp_sensitivity.py utility [--data synthetic|PATH] [--epochs 40] [--epsilon 1 10 ...]
"""

from __future__ import annotations

import argparse
import resource
import sys

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.data import load_dataset, synthetic
from privaudit.defenses.dp_gaussian import DPGaussian
from privaudit.defenses.dp_laplace import DPLaplace, joint_norm
from privaudit.protocols.fedmvmf import FedMVMF

MODES = {
    "row (main's clip)": {"clip_per": "row"},
    "upload": {"clip_per": "upload"},
    "user (joint)": {"clip_per": "user"},
    "user, dense": {"clip_per": "user", "dense": True},
}


class _Silent:
    def draw(self, rng, size):
        return np.zeros(size)


class SilentLaplace(_Silent, DPLaplace):
    pass


class SilentGaussian(_Silent, DPGaussian):
    pass


KINDS = ("grad_V", "grad_P")
DEFENSES = {"dp-laplace": (DPLaplace, SilentLaplace, 1), "dp-gaussian": (DPGaussian, SilentGaussian, 2)}


def _dataset(spec: str):
    return synthetic() if spec == "synthetic" else load_dataset(spec)


def _changed(ds, cfg):
    """``ds`` with client 0's first minimum rating (else its lowest) set to the maximum."""
    model = FedMVMF().run(ds, {**cfg, "epochs": 1, "record_rounds": 0}, rng=0).model
    u = int(model["train_users"][0])
    train_items = model["train_items"][model["train"][0].indices]
    values = np.asarray(model["train"][0].data)
    j = int(np.argmin(values))
    R = ds.ratings.tocsr(copy=True)
    lo, hi = R.indptr[u], R.indptr[u + 1]
    k = lo + int(np.searchsorted(R.indices[lo:hi], train_items[j]))
    before = float(R.data[k])
    R.data[k] = ds.rating_max
    return ds.with_ratings(R), before, float(ds.rating_max), int(values.size)


def _release(transcript, r: int, party: str = "client:0") -> dict:
    return {m.kind: m.payload for m in transcript.messages if m.round == r and m.sender == party and m.kind in KINDS}


def _distance(a: dict, b: dict, ord: int) -> float:
    for kind in a:
        if "items" in a[kind] and not np.array_equal(a[kind]["items"], b[kind]["items"]):
            return float("nan")
    return joint_norm([np.asarray(a[k]["values"]) - np.asarray(b[k]["values"]) for k in a], ord)


def one_rating(args) -> None:
    ds = _dataset(args.data)
    cfg = {"epochs": 2, "record_rounds": 2}
    other, before, after, n_rated = _changed(ds, cfg)
    real, silent, ord = DEFENSES[args.defense]
    strength = {"epsilon": args.epsilon[0]} if args.defense == "dp-laplace" else {"noise_multiplier": args.sigma}
    print(f"data {args.data}: client 0 rates {n_rated} training items; one rating {before:g} -> {after:g}, seed 0")
    print(f"{args.defense} {strength}, clip C = {args.clip}, norm L{ord}\n")
    head = "| mode | pre-noise r0 | pre-noise r1 | released r0 | released r1 | sensitivity | releases/round |"
    print(head + " eps/round accounted | r0 distance / noise scale |")
    print("|" + "---|" * 9)
    for label, mode in MODES.items():
        rows = []
        for cls in (silent, real):
            runs = []
            for data in (ds, other):
                d = cls(clip=args.clip, **strength, **mode)
                runs.append(FedMVMF().run(data, cfg, [d], 0).transcript)
            rows.append([_distance(_release(runs[0], r), _release(runs[1], r), ord) for r in (0, 1)])
        spent = d.privacy_spent(1)
        scale = spent.get("noise_scale", spent.get("noise_std"))
        loss = rows[0][0] / scale
        print(
            f"| {label} | {rows[0][0]:.3f} | {rows[0][1]:.3f} | {rows[1][0]:.3f} | {rows[1][1]:.3f} "
            f"| {spent['sensitivity']:g} | {spent['releases_per_round']} | {spent['epsilon_per_round']:.3g} "
            f"| {loss:.3g} |"
        )


def utility(args) -> None:
    ds = _dataset(args.data)
    cfg = {"epochs": args.epochs, "record_rounds": 0}
    print(f"data {args.data}, {args.epochs} epochs, dp-laplace C = {args.clip}, epsilon per release as listed")
    print("| defense | epsilon | ndcg@10 | cold_user_ndcg@10 | s/epoch | eps over the run | peak RSS growth MB |")
    print("|---|---|---|---|---|---|---|")
    variants = [("none", None, float("nan"))]
    variants += [(f"dp-laplace {k}", m, e) for e in args.epsilon for k, m in MODES.items() if k in args.modes]
    for label, mode, epsilon in variants:
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        defenses = [] if mode is None else [DPLaplace(epsilon=epsilon, clip=args.clip, **mode)]
        res = FedMVMF().run(ds, cfg, defenses, 0)
        grow = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
        eps = defenses[0].privacy_spent(args.epochs)["epsilon"] if defenses else float("nan")
        u = res.utility
        print(
            f"| {label} | {epsilon:g} | {u['ndcg@10']:.4f} | {u['cold_user_ndcg@10']:.4f} | {u['epoch_seconds']:.3f} "
            f"| {eps:.4g} | {grow:.0f} |"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("one-rating", "utility"))
    ap.add_argument("--data", default="synthetic", help=f"'synthetic' or a MovieLens folder (e.g. {ml100k_dir()})")
    ap.add_argument("--defense", choices=tuple(DEFENSES), default="dp-laplace")
    ap.add_argument("--epsilon", type=float, nargs="+", default=[1.0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), metavar="MODE")
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--epochs", type=int, default=40)
    args = ap.parse_args(argv)
    (one_rating if args.what == "one-rating" else utility)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

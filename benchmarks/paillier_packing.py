"""Ciphertext packing vs one value per ciphertext: encryption + aggregation + decryption.

Takes one FedMVMF epoch's uploads on ML-100K (SemiALS, sampling rho), keeps those of a
subsample of clients (``--users``; one value per ciphertext at 2048 bits costs ~30 ms per
value here, so a whole epoch -- ~2.4 M values -- is out of reach for the unpacked baseline),
and pushes the same uploads through the ``paillier`` defense twice: ``packing=true`` and
``packing=false``. Prints seconds per phase, ciphertext counts, the speed-up ratio, whether
the decrypted sums are identical, and the packed time projected to the whole epoch
(measured seconds per ciphertext x the epoch's ciphertext count).

    python benchmarks/paillier_packing.py [--data PATH] [--users 10] [--key-length 2048] [--jobs 2] [--rho 1]

With ``--jobs 1`` the ratio of process CPU times is printed too (robust to a busy machine).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from privaudit.data import load_dataset, synthetic
from privaudit.defenses._paillier_packing import make_layout
from privaudit.protocols.base import Channel
from privaudit.registry import get
from privaudit.transcript import Transcript
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

ML100K = ml100k_dir()


def epoch_uploads(ds, rho: float, K: int, seed: int):
    """(senders, grad_V payloads, grad_P payloads) of epoch 0 of FedMVMF with sampling."""
    sampling = get("defense", "sampling")
    res = get("protocol", "fedmvmf")().run(ds, {"epochs": 1, "K": K, "record_rounds": 1}, [sampling(rho=rho)], rng=seed)
    tr = res.transcript
    gv = {m.sender: m.payload for m in tr.select("grad_V", round=0)}
    gp = {m.sender: m.payload for m in tr.select("grad_P", round=0)}
    senders = sorted(gv, key=lambda s: int(s.split(":")[1]))
    return senders, [dict(gv[s]) for s in senders], [dict(gp[s]) for s in senders], res.transcript.config["n_items"]


def run(senders, gv, gp, m, key_length, packing, jobs):
    d = get("defense", "paillier")(key_length=key_length, packing=packing, jobs=jobs)
    tr = Transcript("bench", parties=["server", *senders])
    ch = Channel([d], tr, np.random.default_rng(0))
    # generate the key outside the timed region
    d._ensure_keys(type("B", (), {"senders": senders, "round": 0, "receiver": "server"})(), ch)
    t0, c0 = time.perf_counter(), time.process_time()
    sV = ch.sum(ch.send(0, "grad_V", senders, gv, record=False), rows=m)
    sP = ch.sum(ch.send(0, "grad_P", senders, gp, record=False))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return d, sV, sP, wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ML100K) if ML100K.exists() else "synthetic")
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--key-length", type=int, default=2048)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ds = synthetic() if args.data == "synthetic" else load_dataset(args.data)
    senders, gv, gp, m = epoch_uploads(ds, args.rho, args.K, args.seed)
    n_all = len(senders)
    all_values = sum(p["values"].size for p in gv) + sum(p["values"].size for p in gp)
    all_rows = sum(len(p["items"]) for p in gv)
    pick = np.sort(np.random.default_rng(args.seed).choice(n_all, min(args.users, n_all), replace=False))
    senders = [senders[i] for i in pick]
    gv = [gv[i] for i in pick]
    gp = [gp[i] for i in pick]
    n_values = sum(p["values"].size for p in gv) + sum(p["values"].size for p in gp)
    print(f"data={ds.summary()['name']} clients={n_all} epoch values={all_values} (grad_V rows={all_rows})")
    print(f"subsample: {len(senders)} clients, {n_values} values; key_length={args.key_length} jobs={args.jobs}")
    results = {}
    for packing in (True, False):
        d, sV, sP, wall, cpu = run(senders, gv, gp, m, args.key_length, packing, args.jobs)
        t = d.timings[0]
        c = d.ciphertext_counts[0]
        results[packing] = (sV, sP, wall, t, c, cpu)
        print(
            f"packing={str(packing):5s}: encrypt {t['encrypt']:8.2f}s  aggregate {t['aggregate']:7.3f}s  "
            f"decrypt {t['decrypt']:7.2f}s  total {wall:8.2f}s (cpu {cpu:8.2f}s)  ciphertexts {c['encrypted']} "
            f"(decrypted {c['decrypted']})"
        )
    (pV, pP, pw, pt, pc, pcpu), (uV, uP, uw, ut, uc, ucpu) = results[True], results[False]
    same = np.array_equal(pV["values"], uV["values"]) and np.array_equal(pP["values"], uP["values"]) and np.array_equal(
        pV["counts"], uV["counts"]
    )
    print(f"identical decrypted sums: {same}")
    print(f"speed-up (one value per ciphertext / packed), encrypt+aggregate+decrypt: {uw / pw:.1f}x")
    if args.jobs == 1:  # all work in this process: CPU time is insensitive to other load on the machine
        print(f"speed-up in process CPU time (jobs=1): {ucpu / pcpu:.1f}x")
    print(f"ciphertext ratio: {uc['encrypted'] / pc['encrypted']:.1f}x")
    lay = make_layout(args.key_length, 32, 2.0**20, n_all, True)
    epoch_cts = all_rows * lay.n_ciphertexts(args.K) + n_all * lay.n_ciphertexts(gp[0]["values"].size)
    per_ct = pw / pc["encrypted"]
    print(
        f"projection to the whole epoch ({n_all} clients, {lay.slots} slots/ciphertext): packed ~{epoch_cts} ciphertexts, "
        f"~{epoch_cts * per_ct / 60:.1f} min; unpacked ~{all_values} ciphertexts, ~{all_values * uw / uc['encrypted'] / 3600:.1f} h"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

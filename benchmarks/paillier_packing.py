"""Paillier encryption paths: DJN vs phe per ciphertext, and packing vs one value per ciphertext.

Part 1, per ciphertext (``--ciphertexts`` of them, in this process, process CPU time): phe's
``raw_encrypt`` (a fresh ``r^n mod n^2``, full-length exponent), the ``standard`` path of the
``paillier`` defense (the same ``r^n`` obfuscator, computed offline, then one product online) and
the ``djn`` path (``h_s^r`` with a ``ceil(k/2)``-bit ``r`` from a fixed-base table); every
ciphertext is decrypted by phe and checked. Prints milliseconds per ciphertext, offline and
online, and the ratios phe / DJN.

Part 2, one epoch's uploads:

Takes one FedMVMF epoch's uploads on ML-100K (SemiALS, sampling rho), keeps those of a
subsample of clients (``--users``; one value per ciphertext at 2048 bits costs ~30 ms per
value here, so a whole epoch -- ~2.4 M values -- is out of reach for the unpacked baseline),
and pushes the same uploads through the ``paillier`` defense three times: packed with DJN
obfuscation, packed standard, and ``packing=false`` (standard, one value per ciphertext as in
the paper). Prints seconds per phase (offline = obfuscators, encrypt = online), ciphertext
counts, the speed-up ratios against packed standard and unpacked encryption, whether the
decrypted sums are identical, and the packed time projected to the whole epoch (measured
seconds per ciphertext x the epoch's ciphertext count).

    python benchmarks/paillier_packing.py [--data PATH] [--users 10] [--key-length 2048] [--jobs 2] [--rho 1]
        [--ciphertexts 200]

With ``--jobs 1`` the phase times are process CPU times and their ratio is printed too (robust to a
busy machine); otherwise wall times.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.data import load_dataset, synthetic
from privaudit.defenses._paillier_packing import (
    _fixed_base_table,
    djn_base,
    djn_exponent_bits,
    encrypt_online,
    generate_keypair,
    make_layout,
    obfuscators,
)
from privaudit.defenses.paillier import MIN_KEY_LENGTH
from privaudit.protocols.base import Channel
from privaudit.registry import get
from privaudit.transcript import Transcript

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


def per_ciphertext(key_length: int, count: int) -> None:
    """Part 1: ms per ciphertext of phe, standard (offline + online) and DJN (offline + online)."""
    public, secret = generate_keypair(key_length)
    n, width = public.n, 2 * key_length // 8
    msgs = [secrets.randbelow(n) for _ in range(count)]
    c0 = time.process_time()
    phe_cts = [public.raw_encrypt(m) for m in msgs]
    phe = (time.process_time() - c0) / count
    assert [secret.raw_decrypt(c) for c in phe_cts[:20]] == msgs[:20]
    out = {}
    for name in ("standard", "djn"):
        hs = djn_base(n) if name == "djn" else None
        if hs is not None:
            c0 = time.process_time()
            _fixed_base_table(hs, n * n, djn_exponent_bits(n))
            table = time.process_time() - c0
        c0 = time.process_time()
        obfs = obfuscators(n, count, hs)
        offline = (time.process_time() - c0) / count
        c0 = time.process_time()
        cts = encrypt_online(n, msgs, obfs, width)
        online = (time.process_time() - c0) / count
        ok = all(secret.raw_decrypt(int.from_bytes(c.tobytes(), "big")) == m for c, m in zip(cts, msgs))
        out[name] = (offline, online, ok)
        extra = f" (fixed-base table, once per key: {table:.2f} s)" if hs is not None else ""
        print(
            f"{name:9s}: offline {offline * 1e3:7.3f} ms + online {online * 1e3:6.3f} ms per ciphertext, "
            f"phe decrypts all: {ok}{extra}"
        )
    print(f"phe      : {phe * 1e3:7.3f} ms per ciphertext (raw_encrypt)")
    djn_total = out["djn"][0] + out["djn"][1]
    print(
        f"ratio phe / DJN per ciphertext: {phe / djn_total:.1f}x (offline + online), "
        f"{phe / out['djn'][1]:.0f}x online only; "
        f"standard / DJN: {(out['standard'][0] + out['standard'][1]) / djn_total:.1f}x"
    )


def run(senders, gv, gp, m, key_length, packing, jobs, obfuscation="standard"):
    d = get("defense", "paillier")(
        key_length=key_length,
        packing=packing,
        jobs=jobs,
        obfuscation=obfuscation,
        insecure_test_key=key_length < MIN_KEY_LENGTH,
    )
    if jobs == 1:  # all work in this process: phase times in process CPU time (robust to a busy machine)
        d.clock = time.process_time
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
    ap.add_argument("--ciphertexts", type=int, default=200, help="part 1: ciphertexts per path")
    args = ap.parse_args(argv)
    if args.key_length < MIN_KEY_LENGTH:
        print(f"key_length {args.key_length} < {MIN_KEY_LENGTH}: INSECURE test key (timing only)")
    print(f"part 1: {args.ciphertexts} ciphertexts, key_length={args.key_length}, one process, CPU time")
    per_ciphertext(args.key_length, args.ciphertexts)
    print("\npart 2: one epoch's uploads")
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
    paths = (("packed djn", True, "djn"), ("packed std", True, "standard"), ("unpacked std", False, "standard"))
    for label, packing, obf in paths:
        d, sV, sP, wall, cpu = run(senders, gv, gp, m, args.key_length, packing, args.jobs, obf)
        t = d.timings[0]
        c = d.ciphertext_counts[0]
        results[label] = (sV, sP, wall, t, c, cpu)
        print(
            f"{label:12s}: offline {t['offline']:8.2f}s  encrypt {t['encrypt']:7.2f}s  "
            f"aggregate {t['aggregate']:7.3f}s  "
            f"decrypt {t['decrypt']:7.2f}s  total {wall:8.2f}s (cpu {cpu:8.2f}s)  ciphertexts {c['encrypted']} "
            f"(decrypted {c['decrypted']})"
        )
    (dV, dP, dw, _, dc, _) = results["packed djn"]
    (pV, pP, pw, _, pc, pcpu), (uV, uP, uw, _, uc, ucpu) = results["packed std"], results["unpacked std"]
    same = all(
        np.array_equal(a["values"], b["values"]) for a, b in ((pV, uV), (pP, uP), (dV, pV), (dP, pP))
    ) and np.array_equal(pV["counts"], uV["counts"])
    print(f"identical decrypted sums: {same}")
    print(f"speed-up (one value per ciphertext / packed), encrypt+aggregate+decrypt: {uw / pw:.1f}x")
    enc = {k: v[3]["offline"] + v[3]["encrypt"] for k, v in results.items()}
    print(
        f"encryption (offline + online) packed djn vs packed standard: "
        f"{enc['packed std'] / enc['packed djn']:.1f}x faster, vs unpacked standard: "
        f"{enc['unpacked std'] / enc['packed djn']:.1f}x; whole path vs packed standard: {pw / dw:.1f}x"
    )
    if args.jobs == 1:  # all work in this process: CPU time is insensitive to other load on the machine
        print(f"speed-up in process CPU time (jobs=1): {ucpu / pcpu:.1f}x")
    print(f"ciphertext ratio: {uc['encrypted'] / pc['encrypted']:.1f}x")
    lay = make_layout(args.key_length, 32, 2.0**20, n_all, True)
    epoch_cts = all_rows * lay.n_ciphertexts(args.K) + n_all * lay.n_ciphertexts(gp[0]["values"].size)
    per_ct = pw / pc["encrypted"]
    print(
        f"projection to the whole epoch ({n_all} clients, {lay.slots} slots/ciphertext): "
        f"packed ~{epoch_cts} ciphertexts, "
        f"standard ~{epoch_cts * per_ct / 60:.1f} min, djn ~{epoch_cts * dw / dc['encrypted'] / 60:.1f} min; "
        f"unpacked ~{all_values} ciphertexts, ~{all_values * uw / uc['encrypted'] / 3600:.1f} h"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

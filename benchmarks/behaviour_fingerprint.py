"""Fingerprint of the toolkit's behaviour: numbers that a refactoring must leave unchanged.

For one default-seed run of every protocol on the synthetic data (privmvmf with a 512-bit key
and 8 users; also fedncf with DP-SGD and persistent client optimizers, fedrec with HF filling,
fedproto with DP prototypes) it prints the utility dict and a SHA-256 of the transcript (every
message's round, parties, kind and payload arrays; ciphertexts and keys, whose randomness comes
from the OS by design, and timing are left out); with ``--main-job`` also the metrics of every
point of the README's main job (``privaudit attack --protocol fedmvmf --noise laplace``, one job).

Usage::

    python benchmarks/behaviour_fingerprint.py [--main-job] > before.json
    ... change the code ...
    python benchmarks/behaviour_fingerprint.py [--main-job] > after.json && diff before.json after.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RUNS = {  # label: (protocol, defenses, --set values, users)
    "fedmvmf": ("fedmvmf", [], [], None),
    "privmvmf": ("privmvmf", ["paillier:key_length=512,insecure_test_key=true"], [], 8),
    "fedsplit": ("fedsplit", [], [], None),
    "fedncf": ("fedncf", [], [], None),
    "fedncf+dp-sgd": ("fedncf", ["dp-sgd"], ["client_optimizer=persistent", "user_lr=0.01"], None),
    "fedrec": ("fedrec", [], [], None),
    "fedrec+sampling-hf": ("fedrec", ["sampling:filling=hf"], ["T=12"], None),
    "fedproto": ("fedproto", [], [], None),
    "fedproto+dp-prototypes": ("fedproto", ["dp-prototypes:epsilon=1"], [], None),
}
_VOLATILE = ("seconds", "time", "bytes_per_second")
_KEY_KINDS = ("public_key", "secret_key")  # cryptographic keys: OS randomness
_KEY_PREFIXES = ("paillier_",)  # a key holder's private key material


def transcript_hash(transcript) -> str:
    """SHA-256 over every message's round, sender, receiver, kind and payload arrays."""
    h = hashlib.sha256()
    h.update(json.dumps(transcript.config, sort_keys=True, default=str).encode())
    for m in transcript:
        h.update(f"{m.round}|{m.sender}|{m.receiver}|{m.kind}".encode())
        if m.meta.get("encrypted") or m.kind in _KEY_KINDS:
            continue  # Paillier keys and ciphertexts: fresh OS randomness by design
        for key in sorted(k for k in m.payload if not k.startswith(_KEY_PREFIXES)):
            a = np.ascontiguousarray(np.asarray(m.payload[key]))
            h.update(f"{key}|{a.dtype.str}|{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def _clean(value):
    """``value`` without timing entries (recursively)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in sorted(value.items()) if not any(s in str(k) for s in _VOLATILE)}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def protocol_runs(names) -> dict:
    from privaudit.experiment import run_transcript
    from privaudit.params import parse_spec

    out = {}
    for name in names:
        protocol, defenses, sets, users = RUNS[name]
        specs = [{"name": n, **p} for n, p in (parse_spec(d, "--defense") for d in defenses)]
        config = dict(s.split("=", 1) for s in sets)
        result = run_transcript(protocol=protocol, defenses=specs, protocol_config=config, users=users)
        out[name] = {
            "utility": _clean(result.utility),
            "transcript_sha256": transcript_hash(result.transcript),
            "messages": len(result.transcript),
        }
    return out


def main_job() -> list:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "privaudit",
            "attack",
            "--protocol",
            "fedmvmf",
            "--noise",
            "laplace",
            "--jobs",
            "1",
            "--quiet",
            "--out",
            str(Path(tmp) / "report"),
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        results = json.loads((Path(tmp) / "report" / "results.json").read_text())
    return _clean(results["points"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main-job", action="store_true", help="also run the README's main job (slower)")
    parser.add_argument("--protocols", default=",".join(RUNS), help="comma-separated subset of the run labels")
    args = parser.parse_args()
    out = {"protocols": protocol_runs([p for p in args.protocols.split(",") if p])}
    if args.main_job:
        out["main_job"] = main_job()
    print(json.dumps(out, indent=1, sort_keys=True, default=float))


if __name__ == "__main__":
    main()

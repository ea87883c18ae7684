"""Fingerprint of sharded runs: numbers a change to sharding must leave unchanged.

On a 2-worker LocalCluster, three sharded runs of ``tests/test_sharded.py`` (FedMVMF
SemiALS/ObsOnly and SGD/InclUnc, FedRec pmf-batch; 300 synthetic users in blocks of 40): a
SHA-256 of the transcript ``sharded.load`` reads back (every message's seq, round, parties, kind,
meta and payload arrays), of the model arrays, the utility (timings left out), the manifest and
the shard file names, and for FedMVMF ``sharded.attack_shards`` (mvmf-analytic per shard).
About 30 s on 2 cores.

Usage::

    python benchmarks/sharded_fingerprint.py > before.json
    ... change the code ...
    python benchmarks/sharded_fingerprint.py > after.json && diff before.json after.json
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np

RUNS = {  # label: (protocol, config, seed)
    "fedmvmf-semials-obsonly": ("fedmvmf", {"epochs": 3, "record_rounds": 2, "K": 6}, 11),
    "fedmvmf-sgd-inclunc": (
        "fedmvmf",
        {"epochs": 3, "record_rounds": 2, "K": 6, "update": "sgd", "unrated": "inclunc", "eta": 0.01},
        11,
    ),
    "fedrec-pmf-batch": ("fedrec", {"T": 4, "record_rounds": [0, -1], "d": 5}, 8),
}


def _array(h: hashlib._Hash, value: object) -> None:
    a = value.toarray() if hasattr(value, "toarray") else np.asarray(value)
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())


def transcript_digest(t) -> str:
    h = hashlib.sha256(json.dumps([t.protocol, t.config, t.seed, t.dataset, t.parties], default=str).encode())
    for m in t.messages:
        h.update(json.dumps([m.seq, m.round, m.sender, m.receiver, m.kind, m.meta], default=str).encode())
        for key in sorted(m.payload):
            h.update(key.encode())
            _array(h, m.payload[key])
    return h.hexdigest()[:16]


def model_digest(model: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(model):
        h.update(key.encode())
        value = model[key]
        h.update(repr(value).encode()) if value is None or isinstance(value, float) else _array(h, value)
    return h.hexdigest()[:16]


def main() -> None:
    from privaudit import sharded
    from privaudit.data.synthetic import synthetic

    data = synthetic(n_users=300, n_items=120, min_ratings=8, density=0.08, seed=5)
    out = {}
    with sharded.dask_client("local:2") as client, tempfile.TemporaryDirectory() as tmp:
        for label, (protocol, config, seed) in RUNS.items():
            folder = Path(tmp) / label
            folder.mkdir()
            done = sharded.run_sharded(protocol, data, config, seed, client, folder, block_size=40)
            row = {
                "transcript": transcript_digest(sharded.load(folder)),
                "model": model_digest(done.result.model),
                "utility": {k: v for k, v in done.result.utility.items() if "seconds" not in k},
                "manifest": json.loads((folder / sharded.MANIFEST).read_text()),
                "files": sorted(p.name for p in folder.iterdir()),
            }
            if protocol == "fedmvmf":
                row["attack_shards"] = sharded.attack_shards(folder, client, "mvmf-analytic")
            out[label] = row
    print(json.dumps(out, indent=1, sort_keys=True, default=float))


if __name__ == "__main__":  # the LocalCluster's worker processes import this file
    main()

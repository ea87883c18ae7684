"""An empirical check of a recorded Flower run's DP: a canary client, one run.

``privaudit record --canaries M`` (default: 1000 when the ClientApp has a ``LocalDpMod``) runs one
simulated node more than ``--clients``: the node with the last partition id is a *canary
client*. A client Mod that the recorder puts inside the app's own mods (closest to the app's
``train`` function, so the app's LocalDpMod clips and noises what it returns) replaces that
node's trained arrays by the model it was sent plus a canary vector: ``M`` coordinates of the
first array of the reply (the item-embedding matrix in a FedAvg MF app), public and drawn from
the recorded ``seed``, each moved by ``+a`` or ``-a`` by a secret random bit (the same bits in
every round), a = 0.9 C / sqrt(M) with C the LocalDpMod's clipping norm (1 without one): the
canary update has L2 norm 0.9 C, so clipping leaves it unchanged. Flipping one bit changes the
canary client's data, so a mechanism that is (epsilon, delta)-DP for one client's data replaced
is (epsilon, delta)-DP for each bit.

The guesser reads the server's view only: the canary client's recorded uploads and the model the
server sent it; its score of canary i is the sum over rounds of the uploaded change at the
canary's coordinate. :func:`canary_check` turns the scores and the bits (kept in a
``canary_bits`` message the server never receives) into the one-run lower bound epsilon_lb of
Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023)
(:func:`privaudit.canary.canary_bound`, 95 % confidence), beside its *ceiling* (the bound when
every guess is right: about log M; no run of M canaries can show more) and the epsilon the
LocalDpMod claims and delivers over the canary client's uploads. The canary client has no
ground truth: attacks never score it (:func:`canary_party`).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEFAULT_CANARIES", "canary_check", "canary_mod", "canary_party", "coordinates", "read_canary"]

#: canaries of a recording whose ClientApp has a LocalDpMod (``--canaries`` default)
DEFAULT_CANARIES = 1000
#: the canary vector's L2 norm as a fraction of the clipping norm (clipping leaves it unchanged)
NORM_FRACTION = 0.9
_DIR = "canary"


def coordinates(seed: int, size: int, count: int) -> np.ndarray:
    """The public canary coordinates: ``count`` distinct flat indices in ``[0, size)``."""
    return np.sort(np.random.default_rng([int(seed), 29]).choice(size, size=count, replace=False))


def amplitude(clip: float, count: int) -> float:
    return NORM_FRACTION * float(clip) / math.sqrt(max(count, 1))


def canary_mod(run_dir: str | Path, partition: int, count: int, clip: float, seed: int) -> Callable:
    """The Mod that makes the node of partition id ``partition`` a canary client (module docstring)."""
    run_dir = str(run_dir)

    def mod(message: Any, context: Any, call_next: Callable) -> Any:
        reply = call_next(message, context)
        mtype = str(message.metadata.message_type)
        if int(context.node_config.get("partition-id", -1)) != partition or not mtype.startswith("train"):
            return reply
        if reply.has_error() or len(message.content.array_records) != 1 or len(reply.content.array_records) != 1:
            return reply
        from flwr.app import Array, ArrayRecord

        sent = next(iter(message.content.array_records.values()))
        name, returned = next(iter(reply.content.array_records.items()))
        keys = list(sent.keys())
        if keys != list(returned.keys()):
            return reply
        arrays = {k: np.array(sent[k].numpy(), copy=True) for k in keys}
        first = next((k for k in keys if arrays[k].dtype.kind == "f" and arrays[k].size >= 2 * 2), None)
        if first is None:
            return reply
        base = arrays[first]
        m = min(int(count), base.size // 2)
        bits = _bits(run_dir, int(context.node_id), m)
        flat = base.astype(np.float64).ravel()
        flat[coordinates(seed, base.size, m)] += amplitude(clip, m) * bits
        arrays[first] = flat.reshape(base.shape).astype(base.dtype)
        _note(run_dir, {"node": int(context.node_id), "array": first, "size": int(base.size), "count": m})
        reply.content[name] = ArrayRecord({k: Array(np.asarray(arrays[k])) for k in keys})
        return reply

    return mod


def skip_partition(mod: Callable, partition: int) -> Callable:
    """``mod`` on every node but the canary client (its ground-truth Mod: the canary has none)."""

    def wrapped(message: Any, context: Any, call_next: Callable) -> Any:
        if int(context.node_config.get("partition-id", -1)) == partition:
            return call_next(message, context)
        return mod(message, context, call_next)

    return wrapped


def canary_config(run_dir: str | Path, seed: int, clip: float) -> tuple[dict[str, Any], np.ndarray, int] | None:
    """(the public ``canaries`` config without its party, the bits, the canary's node id) of a run."""
    got = read_canary(run_dir)
    if got is None:
        return None
    info, bits = got
    cfg = {
        "seed": int(seed),
        "count": int(bits.size),
        "size": int(info["size"]),
        "array": str(info["array"]),
        "amplitude": amplitude(clip, int(bits.size)),
        "clipping_norm": float(clip),
        "note": "canary client: the first array of its train replies = the model sent + amplitude x secret "
        "+-1 bits at the public coordinates (privaudit.integrations.flower_canary.coordinates)",
    }
    return cfg, bits, int(info["node"])


def _bits(run_dir: str, node: int, m: int) -> np.ndarray:
    """The canary client's secret +-1 bits, drawn once (``secrets``) and kept in the side channel."""
    folder = Path(run_dir) / _DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bits.npy"
    if not path.is_file():
        rng = np.random.default_rng(secrets.randbits(128))
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".npy")
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.where(rng.random(m) < 0.5, 1, -1).astype(np.int64), allow_pickle=False)
        os.replace(tmp, path)
    return np.load(path, allow_pickle=False)[:m]


def _note(run_dir: str, info: dict[str, Any]) -> None:
    path = Path(run_dir) / _DIR / "canary.json"
    if not path.is_file():
        path.write_text(json.dumps(info))


def read_canary(run_dir: str | Path) -> tuple[dict[str, Any], np.ndarray] | None:
    """(what the canary Mod noted, its bits) from a run's side channel, None when it never ran."""
    folder = Path(run_dir) / _DIR
    try:
        info = json.loads((folder / "canary.json").read_text())
        bits = np.load(folder / "bits.npy", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or bits.ndim != 1 or bits.dtype.kind not in "iu":
        return None
    return info, bits


def canary_party(config: dict[str, Any]) -> str | None:
    """The canary client's party in a recording's public config (None without canaries)."""
    c = config.get("canaries")
    return str(c["party"]) if isinstance(c, dict) and isinstance(c.get("party"), str) else None


def canary_check(transcript: Any, confidence: float = 0.95) -> dict[str, Any] | None:
    """The one-run epsilon lower bound of a recording with a canary client (module docstring), or None.

    Returns ``{"epsilon_lb", "ceiling", "canaries", "guesses", "correct", "rounds", "delta",
    "claimed_epsilon", "delivered_epsilon", "line"}``: ``claimed``/``delivered`` are the
    LocalDpMod's over the canary client's uploads (None without one)."""
    from privaudit.attacks.generic._uploads import client_uploads
    from privaudit.canary import canary_bound
    from privaudit.integrations._flower_dp import check_claims

    cfg = transcript.config
    party = canary_party(cfg)
    msgs = [m for m in transcript.messages if m.kind == "canary_bits" and m.sender == party]
    if party is None or not msgs:
        return None
    c = cfg["canaries"]
    if not all(isinstance(c.get(k), int) and not isinstance(c.get(k), bool) and c[k] >= 0 for k in ("seed", "size")):
        return None  # a hand-edited config: nothing to check against
    bits = np.asarray(msgs[0].payload.get("bits", np.zeros(0))).ravel()
    if bits.dtype.kind not in "iu" or not np.isin(bits, (-1, 1)).all() or not 2 <= bits.size <= c["size"] // 2:
        return None
    bits = bits.astype(np.int64)
    m = bits.size
    ups = client_uploads(transcript.view("server"), include_canary=True, floor=False).get(party, [])
    scores = np.zeros(m)
    rounds = 0
    for up in ups:
        if up.delta is None or up.sent is None:
            continue
        V = _sent_model(transcript, up.round, party)
        if V is None or V.size != int(c.get("size", -1)):
            continue
        full = np.zeros(V.shape)
        full[up.items] = up.delta
        scores += full.ravel()[coordinates(int(c["seed"]), V.size, m)]
        rounds += 1
    local = [
        d
        for d in cfg.get("defenses", [])
        if isinstance(d, dict) and d.get("name") == "flower-local-dp" and check_claims([d])
    ]
    delta = float(local[0]["delta"]) if local else 1e-5
    out = canary_bound(scores, bits, delta=delta, confidence=confidence)
    # the ceiling: the bound of a guesser that knew every bit (its guesses on each side are
    # capped by how many bits of that sign there are)
    out["ceiling"] = canary_bound(bits.astype(float), bits, delta=delta, confidence=confidence)["epsilon_lb"]
    out.update({"rounds": rounds, "delta": delta, "party": party, "claimed_epsilon": None, "delivered_epsilon": None})
    if local and rounds:
        from privaudit.defenses.accounting import gaussian_epsilon

        entry = local[0]
        z_claim = math.sqrt(2.0 * math.log(1.25 / delta)) / float(entry["epsilon"])
        out["claimed_epsilon"] = float(gaussian_epsilon(z_claim, rounds, delta))
        std = float(entry["sensitivity"]) * z_claim
        z = std / (2.0 * float(entry["clipping_norm"]))
        out["delivered_epsilon"] = float(gaussian_epsilon(z, rounds, delta)) if z > 0 else None
    out["line"] = _line(out)
    return out


def _sent_model(transcript: Any, rnd: int, party: str) -> np.ndarray | None:
    for m in transcript.view("server").select("state"):
        if m.round == rnd and m.meta.get("of") == "model" and party in m.meta.get("to", []) and "V" in m.payload:
            return np.asarray(m.payload["V"], dtype=np.float64)
    return None


def _line(out: dict[str, Any]) -> str:
    def f(x: Any) -> str:
        return "-" if x is None else (f"{x:.3g}" if math.isfinite(x) else "unbounded")

    chance = (
        "at the ceiling"
        if out["epsilon_lb"] >= 0.95 * out["ceiling"]
        else ("within chance" if out["epsilon_lb"] <= 0 else "above chance")
    )
    return (
        f"canaries: epsilon_lb {out['epsilon_lb']:.3f} from {out['correct']} of {out['guesses']} guesses right "
        f"({out['canaries']} canaries, {out['rounds']} uploads; {chance}: a one-run bound of {out['canaries']} "
        f"canaries tops out at {out['ceiling']:.3f}, {int(100 * out['confidence'])} % confidence) vs claimed "
        f"{f(out['claimed_epsilon'])} and delivered {f(out['delivered_epsilon'])} over those uploads at delta "
        f"{out['delta']:g}"
    )

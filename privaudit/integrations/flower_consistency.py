"""A Flower client Mod that checks model consistency under SecAgg+ through a shared bulletin.

The countermeasure of Pasquini, Francati and Ateniese ("Eluding Secure Aggregation in Federated
Learning via Model Inconsistency", ACM CCS 2022), privaudit's ``model-consistency`` defense for
Flower: in SecAgg+'s ``collect_masked_vectors`` stage each client posts the SHA-256 digest of
the model it received (the ``fitins.parameters`` record) to a bulletin; in the ``unmask`` stage,
which starts only after every client of the round has uploaded its masked vector, it reads the
round's digests and refuses to send its key shares (it raises, so Flower replies with an error)
when they differ. Without the shares of at least ``threshold`` clients the server cannot remove
the masks and the round's aggregate is never computed.

The bulletin here is a folder (``<folder>/<run id>/<round>/<node id>``) that the simulation's
clients share; a deployment needs a public append-only board the server cannot write to or
filter (the paper's assumption). The clients' check must not be switchable by the server: the
reference app reads the folder from the run config, which in a deployment the server's operator
sets, so there it belongs in each node's own config.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["model_digest", "model_consistency_mod"]

_CONFIGS = "secaggplus_configs"
_FITINS = "fitins.parameters"


def model_digest(content: Any) -> str | None:
    """SHA-256 hex digest of a message's ``fitins.parameters`` arrays (None when it holds none)."""
    if _FITINS not in content.array_records:
        return None
    record = content.array_records[_FITINS]
    h = hashlib.sha256()
    for key in sorted(record):
        arr = record[key].numpy()
        h.update(key.encode() + str(arr.dtype).encode() + str(arr.shape).encode() + arr.tobytes())
    return h.hexdigest()


def model_consistency_mod(folder: str | os.PathLike) -> Callable:
    """A client Mod posting the received model's digest and refusing to unmask on a mismatch.

    Put it before ``secaggplus_mod`` (outermost first): ``ClientApp(mods=[model_consistency_mod(
    folder), secaggplus_mod])``.
    """
    root = Path(folder)

    def mod(msg: Any, context: Any, call_next: Callable) -> Any:
        if _CONFIGS not in msg.content.config_records:
            return call_next(msg, context)
        stage = msg.content.config_records[_CONFIGS].get("stage")
        board = root / str(msg.metadata.run_id) / str(msg.metadata.group_id)
        if stage == "collect_masked_vectors":
            digest = model_digest(msg.content)
            if digest is not None:
                board.mkdir(parents=True, exist_ok=True)
                tmp = board / f".{context.node_id}.tmp"
                tmp.write_text(digest)
                os.replace(tmp, board / str(context.node_id))
        elif stage == "unmask" and board.is_dir():
            posted = {p.name: p.read_text() for p in board.iterdir() if not p.name.startswith(".")}
            if len(set(posted.values())) > 1:
                raise RuntimeError(
                    f"model-consistency: {len(set(posted.values()))} different models in round "
                    f"{msg.metadata.group_id} ({len(posted)} digests posted); refusing to unmask"
                )
        return call_next(msg, context)

    return mod

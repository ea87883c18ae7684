"""A Flower client Mod that checks model consistency under SecAgg+ through a shared bulletin.

The countermeasure of Pasquini, Francati and Ateniese ("Eluding Secure Aggregation in Federated
Learning via Model Inconsistency", ACM CCS 2022), privaudit's ``model-consistency`` defense for
Flower: in SecAgg+'s ``collect_masked_vectors`` stage each client appends the SHA-256 digest of
the model it received (the ``fitins.parameters`` arrays and the ``fitins.config`` values) to its
own log on a bulletin; in the ``unmask`` stage, which starts only after every client of the round
has uploaded its masked vector, it compares its latest digest with the digest at the same
position in every other client's log and refuses to send its key shares (it raises, so Flower
replies with an error) when one differs. Without the shares of at least ``threshold`` clients
the server cannot remove the masks and the round's aggregate is never computed.

Rounds are matched by position in the logs, not by the message's group id: the group id is the
server's to choose, and a server that gave the target another group id than the others would
otherwise split the bulletin. Matching by position assumes every node takes part in every round
(the reference app's ``fraction_fit = 1``); with client sampling the clients need a round
identifier they agree on without the server (not implemented).

The bulletin here is a folder (``<folder>/<run id>/<node id>``) that the simulation's clients
share; a deployment needs a public append-only board the server cannot write to or filter (the
paper's assumption). The clients' check must not be switchable by the server: the reference app
reads the folder from the run config, which in a deployment the server's operator sets, so there
it belongs in each node's own config.
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
_CONFIG = "fitins.config"


def model_digest(content: Any) -> str | None:
    """SHA-256 hex digest of a message's ``fitins.parameters`` arrays and ``fitins.config``
    values (None when it holds no ``fitins.parameters``)."""
    if _FITINS not in content.array_records:
        return None
    record = content.array_records[_FITINS]
    h = hashlib.sha256()
    for key in sorted(record):
        arr = record[key].numpy()
        h.update(key.encode() + str(arr.dtype).encode() + str(arr.shape).encode() + arr.tobytes())
    if _CONFIG in content.config_records:
        config = content.config_records[_CONFIG]
        h.update(repr(sorted((str(k), repr(v)) for k, v in config.items())).encode())
    return h.hexdigest()


def _log(path: Path) -> list[str]:
    return path.read_text().split() if path.is_file() else []


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
        board = root / str(msg.metadata.run_id)
        mine = board / str(context.node_id)
        if stage == "collect_masked_vectors":
            digest = model_digest(msg.content)
            if digest is not None:
                board.mkdir(parents=True, exist_ok=True)
                with open(mine, "a") as f:  # one short append per round: only this node writes it
                    f.write(digest + "\n")
        elif stage == "unmask" and mine.is_file():
            own = _log(mine)
            k = len(own)
            others = {p.name: _log(p) for p in board.iterdir() if p.name != mine.name}
            differ = sorted(name for name, log in others.items() if len(log) >= k and log[k - 1] != own[-1])
            if differ:
                raise RuntimeError(
                    f"model-consistency: {len(differ)} of {len(others)} other clients received another model "
                    f"in this node's round {k}; refusing to unmask"
                )
        return call_next(msg, context)

    return mod

"""Hand-made transcript pieces shared by the file-format and hostile-input tests."""

from __future__ import annotations

import io
from typing import Any

import numpy as np


def npy_bytes(arr: np.ndarray, allow_pickle: bool = False) -> bytes:
    """``arr`` as the bytes of a ``.npy`` file."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=allow_pickle)
    return buf.getvalue()


def manifest_dict(payload: dict | None = None, arrays: dict | None = None, **over: Any) -> dict:
    """A valid one-message ``manifest.json`` (a server ``state`` with payload ``V``), with
    ``payload``, the ``arrays`` table and any top-level field replaced."""
    m = {
        "format": "privaudit-transcript",
        "version": 1,
        "protocol": "fedmvmf",
        "config": {},
        "seed": 0,
        "dataset": {},
        "parties": ["server"],
        "messages": [
            {
                "seq": 0,
                "round": 0,
                "sender": "server",
                "receiver": "server",
                "kind": "state",
                "payload": payload if payload is not None else {"V": "arrays/0.npy"},
                "meta": {},
            }
        ],
    }
    if arrays is not None:
        m["arrays"] = arrays
    m.update(over)
    return m

"""One line instead of a silent crash when a memory-mapped transcript changes under the reader.

A stored column beyond the copy allowance is memory-mapped (:mod:`privaudit.transcript_io.v2`);
if its file is truncated or rewritten while a payload view is read, the kernel sends SIGBUS,
which kills the process without a word (exit -7). :func:`install` (called the first time a
column is mapped) replaces the default action by a handler that writes one line on stderr and
exits with code 2. The handler is a ctypes callback: it takes the interpreter lock of the
faulting thread (held, or released by numpy and taken back) and calls only ``os.write`` and
``os._exit``. Not installed on platforms without SIGBUS or without a C library to call.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

__all__ = ["MESSAGE", "install"]

MESSAGE = (
    b"privaudit: error: a memory-mapped transcript file changed or was truncated while it was read "
    b"(SIGBUS); leave the file unchanged while privaudit reads it\n"
)
_lock = threading.Lock()
_installed: list[Any] = []  # the ctypes callback, kept alive while installed


def _on_sigbus(signum: int) -> None:  # pragma: no cover - runs in a child killed by SIGBUS
    os.write(2, MESSAGE)
    os._exit(2)


def install() -> bool:
    """Install the SIGBUS handler once per process; True if it is installed."""
    if not hasattr(signal, "SIGBUS"):
        return False
    with _lock:
        if _installed:
            return True
        try:
            import ctypes

            libc = ctypes.CDLL(None)
            handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
            handler = handler_type(_on_sigbus)
            libc.signal.restype = ctypes.c_void_p
            libc.signal.argtypes = [ctypes.c_int, handler_type]
            libc.signal(int(signal.SIGBUS), handler)
        except (OSError, AttributeError, TypeError):
            return False
        _installed.append(handler)
        return True

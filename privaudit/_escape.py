"""Terminal-safe text: control characters in strings from files are shown escaped, never obeyed.

A manifest string holding ``\\x1b[2K\\r`` (an ANSI escape and a carriage return) or a newline
could erase or fake a line of ``privaudit inspect``'s output or of an error message. Leaf module.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 and C1 controls, DEL, line/paragraph separators and bidirectional overrides/isolates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")


def _escape(match: re.Match) -> str:
    c = ord(match.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: object) -> str:
    """``str(text)`` with every control character escaped (``\\n`` -> ``\\x0a``): one safe line."""
    return _UNSAFE.sub(_escape, str(text))

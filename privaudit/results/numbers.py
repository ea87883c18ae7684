"""Numbers as every report reads and prints them: coercion to float, JSON-safe values, and the
one number format of tables and sentences."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def num(v: Any) -> float:
    """``v`` as a float; NaN for None and anything that is not a number."""
    if isinstance(v, bool):
        return float(v)
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def floats(d: Mapping[str, Any] | None) -> dict[str, float]:
    """The numeric entries of ``d`` as floats (others dropped)."""
    out: dict[str, float] = {}
    for k, v in (d or {}).items():
        if isinstance(v, (str, bytes)) or v is None:
            continue
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def jsonable(obj: Any) -> Any:
    """``obj`` with NaN/inf -> None, numpy scalars/arrays -> Python, tuples -> lists."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def fmt(x: Any, digits: int = 3) -> str:
    """A number for a table: ``digits`` decimals, 3 significant digits from 10^4 on, ``n/a``
    for NaN/None. The one number format of every report."""
    x = num(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.3g}"


def fmt_pm(mean: Any, ci: Any, digits: int = 3) -> str:
    """``mean ± ci`` (just the mean when the half-width is 0 or unknown)."""
    mean, ci = num(mean), num(ci)
    if math.isnan(mean):
        return "n/a"
    if math.isnan(ci) or ci == 0:
        return fmt(mean, digits)
    return f"{fmt(mean, digits)} ± {fmt(ci, digits)}"


def fmt_value(v: Any) -> str:
    """A swept value or defense strength: ``0``, ``0.5``, ``1e-4``, ``1.51e4``; ``-`` for None."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        if v == 0:
            return "0"
        a = abs(float(v))
        if not math.isfinite(a):
            return str(v)
        if 1e-2 <= a < 1e4:
            return f"{float(v):g}"
        text = f"{float(v):.3g}" if a >= 1e4 else f"{float(v):.0e}"  # 15100 -> 1.51e4, not 2e4
        return text.replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")
    return str(v)


def fmt_interval(low: Any, high: Any) -> str:
    """``[low, high]``."""
    return f"[{fmt(low)}, {fmt(high)}]"


def has_interval(advantage: Any, high: Any) -> bool:
    """Whether ``high`` is a finite bound (a point without per-victim scores has none)."""
    return math.isfinite(num(high))


def fmt_advantage(advantage: Any, high: Any, low: Any = math.nan) -> str:
    """``"0.678 [0.650, 0.702]"`` (lower and upper bound), ``"0.678 (≤ 0.702)"`` without a lower
    bound, or ``"0.678 (no interval)"``."""
    if not has_interval(advantage, high):
        return f"{fmt(advantage)} (no interval)"
    if math.isfinite(num(low)):
        return f"{fmt(advantage)} {fmt_interval(low, high)}"
    return f"{fmt(advantage)} (≤ {fmt(high)})"

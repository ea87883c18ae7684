"""Flower's own DP mods and strategy wrappers found in a stock app, with no privaudit code in it.

A stock app writes ``ClientApp(mods=[LocalDpMod(...)])`` (or ``@app.train(mods=[...])``) and
wraps its strategy (``DifferentialPrivacyServerSideFixedClipping(FedAvg(...), ...)``). Flower
bakes the mods into closures (``flwr.client.mod.utils.make_ffn``: each wrapper closes over the
next callable ``_ffn`` and its ``_mod``); :func:`client_app_mods` follows those closures. The
strategy is the ``self`` of the frame that calls the Grid (``Strategy.start``):
:func:`calling_strategy`. :func:`with_innermost` puts one more mod closest to the app's own
``train`` function, inside the app's mods (the canaries of :mod:`privaudit.integrations.flower_canary`
must pass through the app's LocalDpMod like its real updates).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["calling_client_app", "calling_strategy", "client_app_mods", "dp_mods", "is_dp_mod", "with_innermost"]

#: Flower's client-side DP mods by name (functions) and class
_MOD_FUNCTIONS = ("fixedclipping_mod", "adaptiveclipping_mod")
_MOD_CLASSES = ("LocalDpMod",)
#: frames searched upwards for the calling strategy or ClientApp
_MAX_FRAMES = 40


def is_dp_mod(obj: Any) -> bool:
    """Whether ``obj`` is one of Flower's DP client mods."""
    return type(obj).__name__ in _MOD_CLASSES or getattr(obj, "__name__", "") in _MOD_FUNCTIONS


def _unwrap(fn: Any, limit: int = 64) -> tuple[Any, list[Any]]:
    """(the innermost callable, the mods around it outermost first) of a ``make_ffn`` chain."""
    mods = []
    for _ in range(limit):
        code = getattr(fn, "__code__", None)
        cells = getattr(fn, "__closure__", None)
        if code is None or not cells or set(code.co_freevars) != {"_ffn", "_mod"}:
            break
        named = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
        mods.append(named["_mod"])
        fn = named["_ffn"]
    return fn, mods


def client_app_mods(app: Any) -> list[Any]:
    """Every mod of a Flower ``ClientApp`` (app-level and per-function), each once, outermost first."""
    found: list[Any] = list(getattr(app, "_mods", None) or [])
    funcs = list((getattr(app, "_registered_funcs", None) or {}).values())
    if getattr(app, "_call", None) is not None:
        funcs.append(app._call)
    inner = getattr(app, "_inner", None)  # privaudit's own wrapper (_flower_grid._ModdedClientApp)
    if inner is not None:
        found += client_app_mods(inner)
    for fn in funcs:
        found += _unwrap(fn)[1]
    out: list[Any] = []
    for m in found:
        if not any(m is o for o in out):
            out.append(m)
    return out


def dp_mods(app: Any) -> list[Any]:
    """The Flower DP mods among :func:`client_app_mods`."""
    return [m for m in client_app_mods(app) if is_dp_mod(m)]


def _calling_self(test: Callable[[Any], bool]) -> Any:
    frame = inspect.currentframe()
    try:
        frame = frame.f_back if frame is not None else None
        for _ in range(_MAX_FRAMES):
            if frame is None:
                return None
            obj = frame.f_locals.get("self")
            if obj is not None and test(obj):
                return obj
            frame = frame.f_back
        return None
    finally:
        del frame


def calling_strategy() -> Any:
    """The Flower strategy whose frame called us (the outermost wrapper: ``Strategy.start``), or None."""
    try:
        from flwr.serverapp.strategy import Strategy
    except ImportError:  # pragma: no cover - Flower is there when a Grid calls
        return None
    return _calling_self(lambda obj: isinstance(obj, Strategy))


def calling_client_app() -> Any:
    """The Flower ``ClientApp`` whose ``__call__`` frame is above ours, or None."""
    try:
        from flwr.clientapp import ClientApp
    except ImportError:  # pragma: no cover
        return None
    return _calling_self(lambda obj: isinstance(obj, ClientApp))


def with_innermost(app: Any, mod: Callable) -> Any:
    """A copy of ``app`` whose registered functions (and legacy ``client_fn`` call) run ``mod``
    inside all of the app's mods, right around the app's own function (``app`` is unchanged)."""
    from flwr.client.mod.utils import make_ffn

    new = copy.copy(app)
    new._registered_funcs = {}
    for name, fn in (getattr(app, "_registered_funcs", None) or {}).items():
        raw, mods = _unwrap(fn)
        new._registered_funcs[name] = make_ffn(raw, mods + [mod])
    if getattr(app, "_call", None) is not None:
        raw, mods = _unwrap(app._call)
        new._call = make_ffn(raw, mods + [mod])
    return new

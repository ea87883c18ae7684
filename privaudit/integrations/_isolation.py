"""What a Flower recording may touch: loopback only, no telemetry, scratch inside its own folder;
and the app's privaudit hooks (``public-info``, ``private-data``) checked like any other input.

:func:`child_env` is the environment of the recording child (``privaudit record``):

* ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray take the loopback address as the node's
  address; with ``_node_ip_address="127.0.0.1"`` (:func:`ray_init_args`) its GCS, raylet, agents
  and workers listen on 127.0.0.1 only (Ray otherwise listens on every interface, and its GCS has
  no authentication), and Ray does not look up its address by connecting towards a public DNS;
* ``RAY_USAGE_STATS_ENABLED=0`` (Ray's usage statistics, which look up cloud metadata servers)
  and ``FLWR_TELEMETRY_ENABLED=0`` (Flower's telemetry): nothing is sent anywhere;
* ``FLWR_HOME``, ``RAY_TMPDIR`` and ``TMPDIR`` point into the recording's private temporary
  folder (mode 0700), removed when the recording ends (nothing is left in ``~/.flwr``).

Ray's dashboard is never started (``include_dashboard=False``).
"""

from __future__ import annotations

import inspect
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from privaudit._escape import printable
from privaudit.errors import PrivauditError

__all__ = [
    "LOOPBACK",
    "MAX_PUBLIC_INFO_BYTES",
    "check_hook",
    "check_private_data",
    "check_public_info",
    "checked_hooks",
    "child_env",
    "keep_log",
    "raise_hook_errors",
    "ray_init_args",
    "summarize_log",
]

LOOPBACK = "127.0.0.1"
#: Environment of every recording (documented in docs/flower.md, "What a recording touches").
QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "FLWR_TELEMETRY_ENABLED": "0",
    "RAY_DISABLE_IMPORT_WARNING": "1",
}
#: Ray's dashboard process probes cloud metadata servers over HTTP even with usage statistics
#: off: every HTTP(S) proxy variable of the child points at a closed loopback port, and only
#: loopback addresses bypass it (a library reaching for the internet fails at once, locally).
NO_NETWORK_ENV = {
    **{name: "http://127.0.0.1:9" for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")},
    **{name: "127.0.0.1,localhost,::1" for name in ("no_proxy", "NO_PROXY")},
}
#: Largest JSON text of the ``public-info`` object.
MAX_PUBLIC_INFO_BYTES = 1024**2
#: Most distinct rating values a declared scale may have ((max - min) / step + 1).
MAX_RATING_LEVELS = 1_000_000
#: Largest private data of one node (the side channel's per-file cap).
MAX_PRIVATE_BYTES = 256 * 1024**2
_MAX_PRIVATE_FIELDS = 64


def child_env(scratch: Path, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the recording's isolation settings (folders created inside ``scratch``)."""
    env = dict(base)
    env.update(QUIET_ENV)
    env.update(NO_NETWORK_ENV)
    env.pop("ALL_PROXY", None)
    env.pop("all_proxy", None)
    for name, sub in (("FLWR_HOME", "flwr"), ("RAY_TMPDIR", "r"), ("TMPDIR", "t")):
        folder = Path(scratch) / sub
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        env[name] = str(folder)
    return env


def ray_init_args(temp_dir: Path) -> dict[str, Any]:
    """Ray's ``init`` arguments: loopback only, no dashboard, session folder ``temp_dir``."""
    return {
        "logging_level": "ERROR",
        "log_to_driver": False,
        "_temp_dir": str(temp_dir),
        "_node_ip_address": LOOPBACK,
        "include_dashboard": False,
    }


def check_hook(obj: Any, ref: str, key: str, where: str) -> Callable:
    """A ``[tool.privaudit]`` hook must be a Python function defined in Python code (a builtin
    such as ``os:system``, a class or any other object is refused)."""
    if not inspect.isfunction(obj):
        kind = "a builtin" if inspect.isbuiltin(obj) else f"a {type(obj).__name__}"
        raise PrivauditError(printable(f"{where}: [tool.privaudit] {key} = {ref!r} is {kind}, not a Python function"))
    return obj


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_size(value: Any, where: str, limit: int = 100_000, depth: int = 32) -> None:
    """Refuse a value of more than ``limit`` items or nested deeper than ``depth`` before it is
    serialized (a 2 x 10^7-row matrix is refused after ``limit`` steps, not after a copy)."""
    stack, seen = [(value, 0)], 0
    while stack:
        item, level = stack.pop()
        seen += 1
        if seen > limit or level > depth:
            raise PrivauditError(f"{where} returned more than {limit} values or {depth} levels of nesting")
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            if len(item) > limit:
                raise PrivauditError(f"{where} returned more than {limit} values or {depth} levels of nesting")
            stack.extend((v, level + 1) for v in item)


def check_public_info(value: Any, ref: str) -> dict[str, Any]:
    """The ``public-info`` hook's result, checked before the simulation starts: a JSON object
    (string keys) of at most :data:`MAX_PUBLIC_INFO_BYTES`, ``lr``/``lam``/``global_mean``
    finite numbers and ``local_steps`` an integer in [1, 10**6] when given, ``n_items`` an integer in [1, 2**20] (the recorded transcripts' cap), a sane
    rating scale (finite, min < max, step > 0, at most MAX_RATING_LEVELS values), and
    ``attribute_names`` a list of strings."""
    where = f"public-info {ref!r}"
    if not isinstance(value, dict):
        raise PrivauditError(printable(f"{where} returned a {type(value).__name__}, not an object (a dict)"))
    bad = next((k for k in value if not isinstance(k, str)), None)
    if bad is not None:
        raise PrivauditError(printable(f"{where} returned a key {bad!r}: keys must be strings")[:300])
    _check_size(value, where)
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PrivauditError(printable(f"{where} returned a value that is not plain JSON ({str(exc)[:120]})")) from None
    if len(text) > MAX_PUBLIC_INFO_BYTES:
        raise PrivauditError(f"{where} returned {len(text)} bytes of JSON, more than {MAX_PUBLIC_INFO_BYTES}")
    from privaudit.protocols.recorded import MAX_ATTRIBUTES  # what a recorded transcript may hold
    from privaudit.protocols.recorded import MAX_RECORDED_ITEMS as MAX_ITEMS

    info = json.loads(text)  # plain JSON from here on (keys are strings)
    if "n_items" in info:
        n = info["n_items"]
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_ITEMS:
            raise PrivauditError(printable(f"{where}: n_items must be an integer in [1, {MAX_ITEMS}], got {n!r}"[:300]))
    scale = [k for k in ("rating_min", "rating_max", "rating_step") if k in info]
    for k in scale:
        if not _finite(info[k]):
            raise PrivauditError(printable(f"{where}: {k} must be a finite number, got {info[k]!r}"[:300]))
    if "rating_min" in info and "rating_max" in info and not info["rating_min"] < info["rating_max"]:
        raise PrivauditError(f"{where}: rating_min must be below rating_max")
    if "rating_step" in info:
        step = info["rating_step"]
        if step <= 0:
            raise PrivauditError(f"{where}: rating_step must be positive, got {step!r}")
        if "rating_min" in info and "rating_max" in info:
            levels = (info["rating_max"] - info["rating_min"]) / step + 1
            if levels > MAX_RATING_LEVELS:
                raise PrivauditError(f"{where}: the rating scale has {levels:.3g} values (at most {MAX_RATING_LEVELS})")
    for k in ("lr", "lam", "global_mean"):  # the training recipe the generic attacks read
        if k in info and not _finite(info[k]):
            raise PrivauditError(printable(f"{where}: {k} must be a finite number, got {info[k]!r}"[:300]))
    steps = info.get("local_steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 10**6):
        raise PrivauditError(printable(f"{where}: local_steps must be an integer in [1, 1000000], got {steps!r}"[:300]))
    names = info.get("attribute_names")
    if names is not None and (
        not isinstance(names, list) or len(names) > MAX_ATTRIBUTES or not all(isinstance(x, str) for x in names)
    ):
        raise PrivauditError(f"{where}: attribute_names must be a list of at most {MAX_ATTRIBUTES} strings")
    return info


def check_private_data(data: Any, n_items: int | None = None) -> dict[str, np.ndarray]:
    """The ``private-data`` hook's result for one node: named plain numeric arrays of at most
    :data:`MAX_PRIVATE_BYTES` together; ``items`` (if given) integers in [0, n_items) and as
    many ``ratings`` as ``items``."""
    if not isinstance(data, Mapping):
        raise PrivauditError(f"returned a {type(data).__name__}, not a dict of arrays")
    if len(data) > _MAX_PRIVATE_FIELDS:
        raise PrivauditError(f"returned {len(data)} fields (at most {_MAX_PRIVATE_FIELDS})")
    out: dict[str, np.ndarray] = {}
    total = 0
    for name, value in data.items():
        if not isinstance(name, str):
            raise PrivauditError(printable(f"field {name!r}: names must be strings"[:200]))
        if isinstance(value, np.ndarray):
            arr = value
        elif isinstance(value, (list, tuple, int, float)) and not isinstance(value, bool):
            size = len(value) if isinstance(value, (list, tuple)) else 1
            if size * 8 > MAX_PRIVATE_BYTES:
                raise PrivauditError(f"field {name!r} is larger than {MAX_PRIVATE_BYTES} bytes")
            try:
                arr = np.asarray(value)
            except (ValueError, TypeError) as exc:
                raise PrivauditError(printable(f"field {name!r}: not an array ({exc})"[:200])) from None
        else:
            raise PrivauditError(printable(f"field {name!r} is a {type(value).__name__}, not an array"))
        if arr.dtype.kind not in "biuf" or arr.dtype.hasobject or arr.ndim > 2:
            raise PrivauditError(printable(f"field {name!r}: a {arr.dtype} array of {arr.ndim} dims"))
        total += arr.nbytes
        if total > MAX_PRIVATE_BYTES:
            raise PrivauditError(f"returned more than {MAX_PRIVATE_BYTES} bytes for one node")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise PrivauditError(printable(f"field {name!r} holds NaN or infinite values"))
        out[name] = arr
    items = out.get("items")
    if items is not None:
        if items.dtype.kind not in "iu" or items.ndim != 1:
            raise PrivauditError("field 'items' must be a 1-D integer array")
        if items.size and (items.min() < 0 or (n_items is not None and items.max() >= n_items)):
            raise PrivauditError(f"field 'items' holds ids outside [0, {n_items})")
        ratings = out.get("ratings")
        if ratings is not None and ratings.shape != items.shape:
            raise PrivauditError("fields 'items' and 'ratings' must have the same length")
    return out


def checked_hooks(
    app: Any, resolve: Callable, run_config: Mapping, private: bool, run_dir: Path, clients: int = 2
) -> tuple:
    """``(public, loader)`` of an app's hooks, checked before the simulation starts: ``public``
    calls ``public-info`` once, now, and returns its checked object (None without the hook);
    ``loader`` wraps ``private-data`` so that each node's result is checked and an error is kept
    for :func:`raise_hook_errors` (None without the hook or when ``private`` is False); it is
    called once first, for the first node, so that a wrong hook stops before the simulation."""
    where = f"{app.root}/pyproject.toml"
    public = loader = None
    if app.public_info:
        hook = check_hook(resolve(app, app.public_info), app.public_info, "public-info", where)
        try:
            value = hook(run_config)
        except Exception as exc:  # noqa: BLE001 - the app's own code: any failure is one line
            raise PrivauditError(
                printable(f"public-info {app.public_info!r} failed: {type(exc).__name__}: {exc}")[:300]
            ) from None
        info = check_public_info(value, app.public_info)

        def public(_run_config: Any) -> dict[str, Any]:
            return dict(info)

    if private and app.private_data:
        hook = check_hook(resolve(app, app.private_data), app.private_data, "private-data", where)
        n_items = info.get("n_items") if app.public_info else None
        loader = _CheckedLoader(hook, app.private_data, n_items, str(run_dir))
        _probe(loader, app.private_data, run_config, clients)
    return public, loader


def _probe(loader: Any, ref: str, run_config: Mapping, clients: int) -> None:
    """Call ``private-data`` once for the first simulated node before the simulation starts
    (the context Flower's simulation gives it: ``partition-id`` 0 of ``clients``)."""
    from flwr.app import Context, RecordDict

    node_config = {"partition-id": 0, "num-partitions": int(clients)}
    context = Context(run_id=0, node_id=0, node_config=node_config, state=RecordDict(), run_config=dict(run_config))
    try:
        loader.check(context)
    except PrivauditError:
        raise
    except Exception as exc:  # noqa: BLE001 - the app's own code: any failure is one line
        raise PrivauditError(printable(f"private-data {ref!r} failed: {type(exc).__name__}: {exc}")[:300]) from None


class _CheckedLoader:
    """``private-data`` with its result checked (:func:`check_private_data`); a failure is also
    written to the run folder's ``hook-errors`` (the nodes run in other processes)."""

    def __init__(self, hook: Callable, ref: str, n_items: int | None, run_dir: str) -> None:
        self.hook, self.ref, self.n_items, self.run_dir = hook, ref, n_items, run_dir

    def check(self, context: Any) -> dict[str, np.ndarray]:
        """The hook's checked result (a one-line PrivauditError naming the hook if it is wrong)."""
        try:
            return check_private_data(self.hook(context), self.n_items)
        except PrivauditError as exc:
            raise PrivauditError(printable(f"private-data {self.ref!r}: {exc}")[:300]) from None

    def __call__(self, context: Any) -> dict[str, np.ndarray]:
        try:
            return self.check(context)
        except Exception as exc:
            folder = Path(self.run_dir) / "hook-errors"
            folder.mkdir(exist_ok=True)
            text = str(exc) if isinstance(exc, PrivauditError) else f"{self.ref!r} failed: {type(exc).__name__}: {exc}"
            line = printable(text if isinstance(exc, PrivauditError) else f"private-data {text}")[:300]
            (folder / f"{os.getpid()}.txt").write_text(line)
            raise


def raise_hook_errors(run_dir: Path) -> None:
    """A one-line error if a node's ``private-data`` hook failed during the simulation."""
    folder = Path(run_dir) / "hook-errors"
    if folder.is_dir():
        for f in sorted(folder.glob("*.txt")):
            try:
                line = f.read_text(encoding="utf-8", errors="replace")[:300]
            except OSError:
                continue
            raise PrivauditError(printable(line))


def summarize_log(log: Path, limit: int = 240) -> str:
    """The most telling line of a failed child's log (its last exception line, else its last
    line), printable and at most ``limit`` characters."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [printable(line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception"))]
    best = errors[-1] if errors else (lines[-1] if lines else "")
    return best[:limit]


def keep_log(log: Path, folder: Path | None, limit: int = 16 * 1024**2) -> Path | None:
    """Copy (the last ``limit`` bytes of) a failed child's log to a new file
    ``privaudit-record-N.log`` in ``folder`` (an existing file is never replaced); its path, or
    None when there is no folder to write to."""
    if folder is None or not Path(folder).is_dir():
        return None
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - limit))
            data = fh.read()
    except OSError:
        return None
    for n in range(1000):
        target = Path(folder) / (f"privaudit-record-{n}.log" if n else "privaudit-record.log")
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        except OSError:
            return None
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        return target
    return None

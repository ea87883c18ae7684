"""Record a Flower app's run as a privaudit transcript.

Two pieces, both switched on by :func:`record` (or ``privaudit record --flower APP_DIR``):

* on the server, a delegating ``Grid`` (:class:`~privaudit.integrations._flower_grid.RecordingGrid`)
  hands every message the ServerApp sends (``down``) and receives (``up``) to a
  :class:`FlowerRecorder`, which flattens it (array records as arrays, config and metric
  records as values) and names it through the app's :class:`~privaudit.integrations.schema_map.SchemaMap`;
* on the clients, a Mod (:func:`~privaudit.integrations._flower_grid.private_data_mod`) writes
  each node's private training data once, as ``.npy`` files in a run folder (the simulation
  runs clients in other processes); the files become the nodes' ``private`` messages when the
  run ends. Without the Mod the transcript has no ground truth (nothing to score against).

Parties are ``server`` and ``client:<k>``, k = the rank of the node id among all node ids of
the run (sorted ascending), so the mapping is stable within a run. Rounds come from the message
(its group id, or a mapped entry) minus the map's ``round-base``. Each distinct payload the
server sends in a round is also recorded once as a ``state`` message to the server itself
(meta ``of`` = the kind, ``to`` = the receivers): what the server knows it sent.

Flower (``flwr[simulation]``, 1.41) is imported lazily: ``pip install "privaudit[flower]"``.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import _safejson
from privaudit._escape import printable
from privaudit.errors import MissingDependencyError, PrivauditError
from privaudit.integrations import _isolation, dense
from privaudit.integrations._flower_dp import client_reported
from privaudit.integrations._flower_mods import calling_strategy
from privaudit.integrations._sidechannel import merge_defenses, merge_private, write_private
from privaudit.integrations.schema_map import SchemaMap
from privaudit.transcript import Transcript
from privaudit.transcript_io import TranscriptWriter

__all__ = [
    "PROTOCOL",
    "FlowerApp",
    "FlowerRecorder",
    "load_app",
    "merge_private",
    "record",
    "require_flwr",
    "write_private",
]

#: Environment variable naming the side-channel folder of a ``privaudit record`` simulation (set
#: while it runs), where the app's privaudit client Mod writes the DP mods it applies.
SIMULATION_DIR_ENV = "PRIVAUDIT_SIMULATION_RUN_DIR"
#: The protocol name of every transcript recorded from Flower.
PROTOCOL = "flower"


def require_flwr() -> Any:
    """The ``flwr`` module, or a one-line error naming the extra to install."""
    try:
        import flwr
        import flwr.simulation  # noqa: F401
    except ImportError:
        raise MissingDependencyError("flwr[simulation]", "flower") from None
    return sys.modules["flwr"]


# --------------------------------------------------------------------------- flattening


def flatten(content: Any) -> dict[str, Any]:
    """The entries of a Flower ``RecordDict``: ``"R/k"`` -> numpy array (copied) or value."""
    entries: dict[str, Any] = {}
    for name, rec in content.array_records.items():
        for key in rec:
            entries[f"{name}/{key}"] = np.array(rec[key].numpy(), copy=True)
    for records in (content.config_records, content.metric_records):
        for name, rec in records.items():
            for key, value in rec.items():
                entries[f"{name}/{key}"] = value
    return entries


def _split(entries: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays (numbers, bytes, lists of them) go to the payload; scalars and strings to meta."""
    payload: dict[str, np.ndarray] = {}
    values: dict[str, Any] = {}
    for name, v in entries.items():
        if isinstance(v, np.ndarray):
            payload[name] = v
        elif isinstance(v, (bytes, bytearray)):
            payload[name] = np.frombuffer(bytes(v), dtype=np.uint8).copy()
        elif isinstance(v, list) and v and all(isinstance(x, (bytes, bytearray)) for x in v):
            for i, x in enumerate(v):
                payload[f"{name}/{i}"] = np.frombuffer(bytes(x), dtype=np.uint8).copy()
        elif isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            arr = _number_array(v)
            if arr is None:  # integers beyond 64 bits: kept as text
                values[name] = repr(v)
            else:
                payload[name] = arr
        elif isinstance(v, (bool, int, float, str)) or (
            isinstance(v, list) and all(isinstance(x, (bool, str)) for x in v)
        ):
            values[name] = v
        else:  # anything else is kept as its text (never pickled)
            values[name] = repr(v)
    return payload, values


def _number_array(v: list) -> np.ndarray | None:
    """A list of numbers as float64, or exactly as int64/uint64 when all are integers; None if
    no numpy dtype holds them (integers beyond 64 bits)."""
    if not all(isinstance(x, int) for x in v):
        return np.asarray(v, dtype=np.float64)
    for dtype in (np.int64, np.uint64):
        try:
            return np.asarray(v, dtype=dtype)
        except OverflowError:
            continue
    return None


# --------------------------------------------------------------------------- recorder


@dataclass
class _Event:
    direction: str
    node: int
    round: int
    kind: str
    payload: dict[str, np.ndarray]
    meta: dict[str, Any]


@dataclass
class FlowerRecorder:
    """Collects the messages of one Flower run and turns them into a :class:`Transcript`.

    Parameters
    ----------
    schema : SchemaMap
        How the app's record names become privaudit kinds and payload names.
    run_dir : path
        Folder of the run's side channel (the clients' ``private`` files).
    spill : TranscriptWriter, optional
        A streaming writer each event is appended to as it is recorded: once a round is written,
        its payloads are read-only views of that file, so a long run does not hold every round.
    """

    schema: SchemaMap
    run_dir: Path
    events: list[_Event] = field(default_factory=list)
    nodes: set[int] = field(default_factory=set)
    run_config: dict[str, Any] = field(default_factory=dict)
    public: dict[str, Any] = field(default_factory=dict)
    spill: Any = None
    #: the Flower strategy that drives the Grid (found on the first send) and the ClientApp's DP mods
    strategy: Any = None
    client_dp: list = field(default_factory=list)
    #: (seed, clipping norm) of the run's canary client (flower_canary), None without one
    canary: Any = None
    _round: int = 0

    def start(self, run_config: dict[str, Any], public: dict[str, Any]) -> None:
        """Called by the recording ServerApp with the run config and the app's public facts."""
        self.run_config = {str(k): v for k, v in run_config.items()}
        self.public = dict(public)

    def see_nodes(self, nodes: Iterable[int]) -> None:
        self.nodes.update(int(n) for n in nodes)

    def record(self, messages: Iterable[Any], direction: str) -> None:
        """Record Flower messages travelling ``direction`` ("down": to clients, "up": replies)."""
        if direction == "down" and self.strategy is None:
            self.strategy = calling_strategy()
        for msg in messages:
            md = msg.metadata
            node = int(md.dst_node_id if direction == "down" else md.src_node_id)
            self.nodes.add(node)
            flower_meta = {"message_type": md.message_type, "group_id": md.group_id}
            if msg.has_error():
                meta = {"flower": flower_meta, "error": _short(str(msg.error.reason))}
                self.events.append(_Event(direction, node, self._round, "flower.error", {}, meta))
                continue
            entries = flatten(msg.content)
            rnd = self.schema.round_of(md.group_id, entries)
            self._round = self._round if rnd is None else rnd
            kind, named, extra = self.schema.classify(direction, md.message_type, entries)
            payload, values = _split(named)
            meta: dict[str, Any] = {"flower": flower_meta, **extra}
            if values:
                meta["entries"] = values
            self.events.append(_Event(direction, node, self._round, kind, payload, meta))
            if self.spill is not None and payload and all(a.dtype.kind in "biufc" for a in payload.values()):
                # the same dict: once its round is written, its arrays become views of the file
                self.spill.add(self._round, f"node:{node}", direction, kind, payload)

    def server_state(self, server_round: int, kind: str, arrays: dict, meta: dict | None = None) -> None:
        """A server ``state`` message (``meta.of`` = ``kind``) the ServerApp logs in Flower round
        ``server_round`` (arrays copied as float64)."""
        payload = {str(k): np.array(v, dtype=np.float64) for k, v in arrays.items()}
        rnd = int(server_round) - self.schema.round_base
        self.events.append(_Event("state", 0, rnd, "state", payload, {**(meta or {}), "of": str(kind)}))

    def transcript(self, *, app: str = "", seed: int | None = None, defenses: list[dict] | None = None) -> Transcript:
        """The transcript of everything recorded (private messages merged from ``run_dir``)."""
        private = merge_private(self.run_dir)
        nodes = sorted(self.nodes | set(private))
        party = {n: f"client:{k}" for k, n in enumerate(nodes)}
        config: dict[str, Any] = {
            key: self.run_config[src] for key, src in self.schema.public.items() if src in self.run_config
        }
        config.update(self.public)
        events, schema, dense_summary = dense.convert(self.events, self.schema, config)
        config.update({"dense": dense_summary} if dense_summary else {})
        config.update(
            {
                "recorded_from": "flower",
                "app": app,
                "flower_run_config": _jsonable_config(self.run_config),
                "schema_map": schema.to_dict(),
                "defenses": list(defenses or []),
                "party_mapping": "client:<k>: k = rank of the node id among the run's sorted node ids",
            }
        )
        dataset = {"name": f"flower:{app}" if app else "flower", "users": len(nodes)}
        if "n_items" in config:
            dataset["items"] = config["n_items"]
        canary = None
        if self.canary is not None:
            from privaudit.integrations.flower_canary import canary_config

            canary = canary_config(self.run_dir, *self.canary)
            if canary is not None and canary[2] in party:
                config["canaries"] = {**canary[0], "party": party[canary[2]]}
        t = Transcript(PROTOCOL, config, seed, dataset, ["server"] + [party[n] for n in nodes])
        for n in nodes:
            if n in private:
                t.add(0, party[n], party[n], "private", private[n])
        if "canaries" in config:  # the secret bits: a message the server never receives
            p = config["canaries"]["party"]
            t.add(0, p, p, "canary_bits", {"bits": canary[1]})
        self._add_events(t, party, events)
        return t

    def _add_events(self, t: Transcript, party: dict[int, str], events: list[_Event]) -> None:
        sent: dict[tuple, Any] = {}
        for ev in events:
            if ev.direction in ("state", "up"):  # a ServerApp's own state, or a client's upload
                sender = "server" if ev.direction == "state" else party[ev.node]
                t.add(ev.round, sender, "server", ev.kind, ev.payload, ev.meta)
                continue
            digest = hashlib.sha256()
            for name in sorted(ev.payload):
                digest.update(name.encode() + ev.payload[name].tobytes())
            key = (ev.round, ev.kind, digest.hexdigest())
            if key not in sent:
                sent[key] = t.add(ev.round, "server", "server", "state", ev.payload, {"of": ev.kind, "to": []})
            sent[key].meta["to"].append(party[ev.node])
            t.add(ev.round, "server", party[ev.node], ev.kind, ev.payload, ev.meta)


def _short(text: str, limit: int = 300) -> str:
    """The last non-empty line of an error text, at most ``limit`` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:limit]


def _jsonable_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (bool, int, float, str)) else repr(v) for k, v in cfg.items()}


# --------------------------------------------------------------------------- apps


@dataclass
class FlowerApp:
    """A Flower app folder as privaudit reads it (``pyproject.toml``: ``[tool.flwr.app]`` and
    ``[tool.privaudit]``)."""

    root: Path
    name: str
    serverapp: str
    clientapp: str
    config: dict[str, Any]
    schema: SchemaMap
    private_data: str | None
    public_info: str | None


def _subtable(doc: dict, key: str, where: str) -> dict:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise PrivauditError(f"{where}: [{key}] must be a table")
    return value


def load_app(app_dir: str | Path) -> FlowerApp:
    """Read and validate an app folder's ``pyproject.toml`` (one-line errors, nothing imported)."""
    root = Path(app_dir).resolve()
    where = f"{app_dir}/pyproject.toml"
    if not (root / "pyproject.toml").is_file():
        raise PrivauditError(f"{app_dir}: not a Flower app folder (no pyproject.toml)")
    try:
        if (root / "pyproject.toml").stat().st_size > _safejson.TOML_MAX_BYTES:
            raise _safejson.JSONLimitError(f"more than {_safejson.TOML_MAX_BYTES} bytes")
        doc = _safejson.toml_loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, _safejson.JSONLimitError) as exc:
        raise PrivauditError(f"{where}: invalid TOML ({exc})") from None
    tool = _subtable(doc, "tool", where)
    app = _subtable(_subtable(tool, "flwr", where), "app", where)
    comps = _subtable(app, "components", where)
    for key in ("serverapp", "clientapp"):
        if not isinstance(comps.get(key), str) or ":" not in comps[key]:
            raise PrivauditError(f'{where} lacks [tool.flwr.app.components] {key} = "module:attribute"')
    pa = tool.get("privaudit", {})
    if not isinstance(pa, dict):
        raise PrivauditError(f"{where}: [tool.privaudit] must be a table")
    # no schema table: whole-matrix replies, the item-embedding matrix detected by shape (dense.py)
    schema = SchemaMap.from_dict(pa["schema"], f"{where} [tool.privaudit.schema]") if "schema" in pa else None
    schema = schema or SchemaMap.auto_map()
    hooks = {}
    for key in ("private-data", "public-info"):
        value = pa.get(key)
        if value is not None and (not isinstance(value, str) or ":" not in value):
            raise PrivauditError(f'{where}: [tool.privaudit] {key} must be "module:function"')
        hooks[key] = value
    config = app.get("config", {})
    if not isinstance(config, dict):
        raise PrivauditError(f"{where}: [tool.flwr.app.config] must be a table")
    name = str(_subtable(doc, "project", where).get("name", root.name))
    return FlowerApp(
        root, name, comps["serverapp"], comps["clientapp"], config, schema, hooks["private-data"], hooks["public-info"]
    )


def _attr(app: FlowerApp, ref: str) -> Any:
    module, _, attr = ref.partition(":")
    if str(app.root) not in sys.path:
        sys.path.insert(0, str(app.root))
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise PrivauditError(f"{app.root}: cannot load {ref!r} ({type(exc).__name__}: {exc})") from None
    return obj


def parse_overrides(items: Iterable[str], defaults: dict[str, Any]) -> dict[str, Any]:
    """``KEY=VALUE`` run-config overrides, typed like the app's default for that key."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PrivauditError(f"--run-config expects KEY=VALUE, got {item!r}")
        if key not in defaults:
            known = ", ".join(sorted(defaults))
            raise PrivauditError(f"--run-config: the app has no config key {key!r} (known: {known})")
        kind = type(defaults[key])
        try:
            if kind is bool:
                if text.lower() not in ("true", "false"):
                    raise ValueError(text)
                out[key] = text.lower() == "true"
            else:
                out[key] = kind(text)
        except ValueError:
            raise PrivauditError(f"--run-config {key}: {text!r} is not a {kind.__name__}") from None
    return out


#: Smallest ``cpus_per_client``: Ray starts (machine CPUs / this) worker processes.
MIN_CPUS_PER_CLIENT = 0.25


@dataclass
class Recording:
    """Outcome of :func:`record`: the transcript, the ServerApp's final context, the timing."""

    transcript: Transcript
    context: Any
    seconds: float
    run_dir: Path


def record(
    app_dir: str | Path,
    *,
    clients: int,
    rounds: int | None = None,
    run_config: dict[str, Any] | None = None,
    private: bool = True,
    recorder: bool = True,
    run_dir: str | Path | None = None,
    cpus_per_client: float = 2.0,
    ray_temp_dir: str | Path | None = None,
    canaries: int = 0,
) -> Recording:
    """Run a Flower app under Flower's simulation engine with the recorder switched on.

    Parameters
    ----------
    app_dir : path
        The app folder (``pyproject.toml`` with ``[tool.flwr.app]`` and ``[tool.privaudit]``).
    clients : int
        Number of simulated nodes (``num_supernodes``).
    rounds : int, optional
        Sets the run-config key ``num-server-rounds``.
    run_config : dict, optional
        Further run-config overrides.
    private : bool
        Install the client Mod that writes the ground truth (``private`` messages).
    recorder : bool
        False runs the app unchanged (no Grid wrapper, no Mod): the reference run of the test
        that recording changes nothing.
    run_dir : path, optional
        Side-channel folder (default: a temporary folder removed afterwards).
    cpus_per_client : float
        CPUs Ray reserves per ClientApp run (Flower's default, 2): the number of worker
        processes is the machine's CPUs divided by this.
    ray_temp_dir : path, optional
        Ray's session folder (default: inside a private temporary folder removed afterwards).
    canaries : int
        Canaries of one more simulated node, the canary client
        (:mod:`privaudit.integrations.flower_canary`); 0: none; -1: 1000 when the ClientApp has a
        ``LocalDpMod``, else none.

    Returns
    -------
    Recording
        ``transcript`` is None when ``recorder`` is False.
    """
    if clients < 2:
        raise PrivauditError(f"--clients must be at least 2, got {clients}")
    if rounds is not None and rounds < 1:
        raise PrivauditError(f"--rounds must be at least 1, got {rounds}")
    if not MIN_CPUS_PER_CLIENT <= cpus_per_client <= 1024:  # Ray starts CPUs / C worker processes
        raise PrivauditError(f"--cpus-per-client must be in [{MIN_CPUS_PER_CLIENT}, 1024], got {cpus_per_client}")
    app = load_app(app_dir)
    for key, value in _isolation.QUIET_ENV.items():  # before Ray is imported: loopback, no telemetry
        os.environ.setdefault(key, value)
    require_flwr()
    overrides = dict(run_config or {})
    if rounds is not None:
        if "num-server-rounds" not in app.config:
            raise PrivauditError(
                f"{app_dir}: the app's run config has no 'num-server-rounds' (give --run-config instead)"
            )
        overrides["num-server-rounds"] = int(rounds)
    unknown = sorted(set(overrides) - set(app.config))
    if unknown:
        raise PrivauditError(f"the app has no config key {unknown[0]!r} (known: {', '.join(sorted(app.config))})")
    scratch = None
    if run_dir is None or ray_temp_dir is None:  # a private folder (mode 0700), removed afterwards
        scratch = Path(tempfile.mkdtemp(prefix="pa-", dir=_short_temp_root()))
    path = scratch / "run" if run_dir is None else Path(run_dir)
    ray_temp = scratch / "r" if ray_temp_dir is None else Path(ray_temp_dir)
    path.mkdir(parents=True, exist_ok=True)
    try:
        return _simulate(app, clients, overrides, private, recorder, path, cpus_per_client, ray_temp, canaries)
    finally:
        _shutdown_ray()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _short_temp_root() -> str:
    """The temporary root for Ray's session folder: Ray's socket paths must stay under 107 bytes."""
    root = tempfile.gettempdir()
    return root if len(root) <= 24 or not os.path.isdir("/tmp") else "/tmp"


def _shutdown_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def _simulate(
    app: FlowerApp,
    clients: int,
    overrides: dict,
    private: bool,
    recorder: bool,
    path: Path,
    cpus: float,
    ray_temp: Path,
    canaries: int = 0,
) -> Recording:
    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    from privaudit.integrations import _flower_grid as fg
    from privaudit.integrations._flower_mods import dp_mods, with_innermost

    server_app = _attr(app, app.serverapp)
    client_app = _attr(app, app.clientapp)
    rec = FlowerRecorder(app.schema, path)
    rec.client_dp = dp_mods(client_app)  # stock mods: ClientApp(mods=[LocalDpMod(...)])
    fused = get_fused_config_from_dir(app.root, dict(overrides))
    public, loader = _isolation.checked_hooks(app, _attr, fused, recorder and private, path, clients)
    n_canaries = _canary_count(canaries, rec.client_dp) if recorder else 0
    if n_canaries:  # one more node, the canary client, inside the app's own mods
        from privaudit.integrations import flower_canary as fc

        clips = [float(m.clipping_norm) for m in rec.client_dp if type(m).__name__ == "LocalDpMod"]
        seed = fused.get("seed")
        rec.canary = (int(seed) if isinstance(seed, int) and 0 <= seed < 2**63 else 0, min(clips, default=1.0))
        client_app = with_innermost(client_app, fc.canary_mod(path, clients, n_canaries, rec.canary[1], rec.canary[0]))
    if recorder:
        rec.spill = TranscriptWriter(path / "recorded-rounds.ptx", stream=True)
        server_app = fg.recording_server_app(server_app, rec, public)
        if loader is not None:
            truth = fg.private_data_mod(loader, path)
            truth = fc.skip_partition(truth, clients) if n_canaries else truth
            client_app = fg.with_mods(client_app, [truth])
    run_id = int.from_bytes(os.urandom(8), "big") >> 1
    run = Run.create_empty(run_id=run_id)
    run.primary_task_id = int.from_bytes(os.urandom(8), "big") >> 1
    run.override_config = dict(overrides)
    run.federation_id = NOOP_FEDERATION_ID
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    context = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=fused)
    backend = {
        "client_resources": {"num_cpus": cpus, "num_gpus": 0.0},
        # Ray's session folder (logs, sockets) inside privaudit's private temporary folder
        # loopback only, no dashboard (privaudit.integrations._isolation)
        "init_args": _isolation.ray_init_args(ray_temp),
    }
    t0 = time.perf_counter()
    # the simulation's worker processes import the app's modules: put its folder on their path;
    # the app's privaudit client Mod (integrations.flower_deploy) writes its DP mods to the side channel
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(app.root)] + ([old_path] if old_path else []))
    if recorder:
        os.environ[SIMULATION_DIR_ENV] = str(path)
    try:
        result = _run_simulation(
            num_supernodes=clients + (1 if n_canaries else 0),
            exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
            client_app=client_app,
            server_app=server_app,
            backend_config=backend,
            server_app_context=context,
            app_dir=str(app.root),
            run=run,
            is_app=True,
        )
        _isolation.raise_hook_errors(path)
    except Exception:
        _isolation.raise_hook_errors(path)  # a failed private-data hook, rather than what it broke
        raise
    finally:
        if rec.spill is not None:  # drop the scratch file: the views of its rounds stay valid
            rec.spill.abort()
        os.environ.pop(SIMULATION_DIR_ENV, None)
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    seconds = time.perf_counter() - t0
    transcript = None
    if recorder:
        seed = fused.get("seed")
        seed = int(seed) if isinstance(seed, int) and 0 <= seed < 2**63 else None
        transcript = rec.transcript(app=app.name, seed=seed, defenses=recorded_defenses(rec))
        transcript.config["simulation"] = {"clients": clients, "seconds": round(seconds, 3)}
    return Recording(transcript, result.context, seconds, path)


_STAGE = "secaggplus_configs/stage"


def _canary_count(canaries: int, client_dp: list) -> int:
    """The canaries of a recording: ``canaries``, or for -1 the default when the ClientApp has a LocalDpMod."""
    if canaries >= 0:
        return int(canaries)
    from privaudit.integrations.flower_canary import DEFAULT_CANARIES

    return DEFAULT_CANARIES if any(type(m).__name__ == "LocalDpMod" for m in client_dp) else 0


def recorded_defenses(rec: FlowerRecorder, delta: float | None = None) -> list[dict[str, Any]]:
    """The Flower defenses the recorded messages show were active (public facts of the run),
    the DP wrappers of the strategy that drove the Grid, the ClientApp's own DP mods, then the
    DP mods the clients described through the side channel (simulation)."""
    from privaudit.integrations._flower_stock import stock_defenses

    out = _secaggplus(rec)
    canary = None
    if rec.canary is not None:  # the canary client's replies are not a client's uploads
        from privaudit.integrations.flower_canary import read_canary

        got = read_canary(rec.run_dir)
        canary = int(got[0].get("node", -1)) if got is not None else None
    train = [ev for ev in rec.events if ev.direction == "up" and is_train_event(ev) and ev.node != canary]
    per_node: dict[int, int] = {}
    for ev in train:
        per_node[ev.node] = per_node.get(ev.node, 0) + 1
    out += stock_defenses(rec.strategy, rec.client_dp, train, delta)
    entries, reported = merge_defenses(rec.run_dir)
    if entries:
        described = client_reported(entries, reported, max(per_node.values(), default=0))
        out += [e for e in described if not any(_same_mod(e, o) for o in out)]
    return out


def _same_mod(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two entries of one client mod (a stock mod also described by the app's privaudit Mod)."""
    keys = ("name", "mod", "clipping_norm", "sensitivity", "epsilon", "delta")
    return "mod" in a and all(a.get(k) == b.get(k) for k in keys)


def is_train_event(ev: Any) -> bool:
    return str(ev.meta.get("flower", {}).get("message_type", "")).startswith("train")


def _secaggplus(rec: FlowerRecorder) -> list[dict[str, Any]]:
    """SecAgg+ when the recorded messages show its stages (its public parameters)."""
    out = []
    stages = [ev for ev in rec.events if ev.direction == "down" and _STAGE in ev.meta.get("entries", {})]
    if stages:
        setup = next((ev.meta["entries"] for ev in stages if ev.meta["entries"].get(_STAGE) == "setup"), {})
        params = {k.split("/", 1)[1]: v for k, v in setup.items() if k != _STAGE}
        name = {"name": "flower-secaggplus", "workflow": "SecAggPlusWorkflow", "client_mod": "secaggplus_mod"}
        out.append({**name, **params})
    return out


# ---------------------------------------------------------------------------------------------
# `privaudit record`: the simulation in a child process group that privaudit can always stop

#: Seconds a stopped recording gets to exit on SIGTERM before its whole process group is killed.
STOP_GRACE = 3.0
#: Most simulated clients and rounds ``privaudit record`` accepts.
MAX_CLIENTS = 1000
MAX_ROUNDS = 100_000


class _Stopped(BaseException):
    """SIGTERM/SIGHUP received by ``privaudit record`` (exit code 128 + signal)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _group_members(pid: int) -> list[int]:
    """Every process of process group ``pid`` and every descendant of ``pid`` (Ray's raylet,
    GCS, agents and workers), as a snapshot taken before anything is killed."""
    import psutil

    found: set[int] = set()
    try:
        found.update(p.pid for p in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        pass
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pid:
                found.add(p.pid)
        except OSError:
            continue
    found.add(pid)
    return sorted(found)


def _kill_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _stop_child(proc: Any, grace: float = STOP_GRACE) -> None:
    """SIGTERM to the child's group, SIGKILL to every member left after ``grace`` seconds."""
    import signal
    import subprocess

    members = _group_members(proc.pid)
    _kill_all(members, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _kill_all(set(members) | set(_group_members(proc.pid)), signal.SIGKILL)
    proc.wait()


def record_to_file(
    app_dir: str | Path,
    output: str | Path,
    *,
    clients: int,
    rounds: int | None = None,
    run_config: dict[str, Any] | None = None,
    private: bool = True,
    cpus_per_client: float = 2.0,
    canaries: int = -1,
) -> dict[str, Any]:
    """:func:`record` in a child process that leads its own process group; writes ``output``.

    The child runs the app (and Ray) in a new session, watches this process and kills its
    group if this process dies (even by SIGKILL); Ctrl-C or SIGTERM here stops the child's
    whole group (SIGTERM, then SIGKILL after :data:`STOP_GRACE` s) and re-raises. Ray's
    session folder lives in a private temporary folder removed afterwards. Returns the
    summary the child wrote (``messages``, ``seconds``, ``defenses``, ``errors``, ``first_error``).
    """
    import json
    import signal

    from privaudit.reports.render import write_file_from

    _check_record_args(clients, rounds, cpus_per_client)
    load_app(app_dir)
    require_flwr()
    scratch = Path(tempfile.mkdtemp(prefix="pa-", dir=_short_temp_root()))
    job = {
        "app_dir": str(Path(app_dir).resolve()),
        "clients": int(clients),
        "rounds": rounds,
        "run_config": dict(run_config or {}),
        "private": bool(private),
        "cpus_per_client": float(cpus_per_client),
        "canaries": int(canaries),
        "scratch": str(scratch),
    }
    (scratch / "job.json").write_text(json.dumps(job))

    def stop(signum: int, _frame: Any) -> None:
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        result = _run_child(scratch, Path(output).parent)
        write_file_from(scratch / "out.ptx", Path(output))
        return result
    except _Stopped as stopped:
        raise SystemExit(128 + stopped.signum) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(scratch, ignore_errors=True)


def _check_record_args(clients: int, rounds: int | None, cpus_per_client: float) -> None:
    if not 2 <= clients <= MAX_CLIENTS:
        raise PrivauditError(f"--clients must be in [2, {MAX_CLIENTS}], got {clients}")
    if rounds is not None and not 1 <= rounds <= MAX_ROUNDS:
        raise PrivauditError(f"--rounds must be in [1, {MAX_ROUNDS}], got {rounds}")
    if not MIN_CPUS_PER_CLIENT <= cpus_per_client <= 1024:
        raise PrivauditError(f"--cpus-per-client must be in [{MIN_CPUS_PER_CLIENT}, 1024], got {cpus_per_client}")


def _run_child(scratch: Path, log_dir: Path | None = None) -> dict[str, Any]:
    """Run the recording child on ``scratch/job.json`` and return its ``result.json``; when it
    failed, a one-line error (its log copied into ``log_dir``)."""
    import json
    import subprocess

    package_root = str(Path(__file__).resolve().parents[2])
    # loopback only, no telemetry, FLWR_HOME/RAY_TMPDIR/TMPDIR inside scratch (_isolation)
    env = _isolation.child_env(scratch, os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    code = "from privaudit.integrations.flower import _child_main; _child_main()"
    with open(scratch / "log.txt", "wb") as log:  # Flower's and Ray's output; shown if the run fails
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(scratch / "job.json"), str(os.getpid())],
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            returncode = proc.wait()
        except BaseException:
            _stop_child(proc)
            raise
    result_path = scratch / "result.json"
    if not result_path.is_file():
        line = _isolation.summarize_log(scratch / "log.txt")
        kept = _isolation.keep_log(scratch / "log.txt", log_dir)
        raise PrivauditError(
            f"the recording failed (exit code {returncode}): {line or 'no message'}"
            + (f" (its log: {printable(kept)})" if kept else "")
        )
    result = json.loads(result_path.read_text())
    if "error" in result:
        raise PrivauditError(result["error"])
    return result


def _watch_parent(parent: int, scratch: Path) -> None:
    """Child side: when ``parent`` is gone, kill this whole group (Ray included) and exit."""
    import signal
    import threading

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        _die(scratch, signal.SIGKILL)

    threading.Thread(target=loop, name="privaudit-parent-watch", daemon=True).start()


def _die(scratch: Path, sig: int) -> None:
    import signal

    me = os.getpid()
    members = [p for p in _group_members(me) if p != me]
    _kill_all(members, signal.SIGTERM if sig == signal.SIGTERM else signal.SIGKILL)
    if sig == signal.SIGTERM:
        time.sleep(1.0)
        _kill_all([p for p in _group_members(me) if p != me], signal.SIGKILL)
    shutil.rmtree(scratch, ignore_errors=True)
    os._exit(128 + int(sig))


def _child_main() -> None:
    """Entry point of the recording child (``python -c``; argv: job file, parent pid)."""
    import json
    import signal

    from privaudit.integrations._flower_dp import check_claims, defense_label

    job_file, parent = Path(sys.argv[1]), int(sys.argv[2])
    job = json.loads(job_file.read_text())
    scratch = Path(job["scratch"])
    _watch_parent(parent, scratch)
    signal.signal(signal.SIGTERM, lambda signum, _frame: _die(scratch, signal.SIGTERM))
    result: dict[str, Any]
    try:
        rec = record(
            job["app_dir"],
            clients=job["clients"],
            rounds=job["rounds"],
            run_config=job["run_config"],
            private=job["private"],
            cpus_per_client=job["cpus_per_client"],
            run_dir=scratch / "run",
            ray_temp_dir=scratch / "r",
            canaries=int(job.get("canaries", 0)),
        )
        rec.transcript.save(scratch / "out.ptx")
        errors = rec.transcript.select("flower.error")
        result = {
            "messages": len(rec.transcript),
            "seconds": rec.seconds,
            "defenses": [defense_label(d) for d in rec.transcript.config.get("defenses", [])],
            "dp_claims": check_claims(rec.transcript.config.get("defenses", [])),
            "errors": len(errors),
            "first_error": errors[0].meta.get("error") if errors else None,
        }
    except PrivauditError as exc:
        result = {"error": str(exc)}
    (scratch / "result.json").write_text(json.dumps(result, default=str))

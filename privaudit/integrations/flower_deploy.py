"""Record a Flower app run by Flower's deployment engine (``flwr run`` against a SuperLink).

Under the deployment engine the ServerApp and every ClientApp run in processes Flower starts
(possibly on other machines), so :func:`privaudit.integrations.flower.record` cannot wrap them.
The app itself switches the recorder on, with one line on each side::

    # server_app.py, inside the @app.main() function, around the strategy's start:
    with record_run(grid, context, strategy, public_info=public_info) as grid:
        result = strategy.start(grid=grid, ...)

    # client_app.py: the Mod goes first (outermost), before the app's own mods
    app = ClientApp(mods=[client_mod(private_data), *mods])

Both are no-ops unless the run config key ``privaudit-out`` (declared in the app's
``[tool.flwr.app.config]``) names the transcript file, e.g.
``flwr run . deploy --run-config 'privaudit-out="/abs/run.ptx"'``. Then:

* the client Mod attaches the node's private training data (``private_data(context)``, named
  numpy arrays) to each reply, as the array record ``privaudit.private``, and a description of
  the Flower DP mods it was given (:func:`describe`) as the config record ``privaudit.defenses``;
  this ships ground truth to the server, so it is for audit runs only;
* the server's :class:`~privaudit.integrations._flower_grid.RecordingGrid` removes both records
  from every reply before the recorder and the strategy see it (the strategy receives the
  replies it would receive without privaudit), keeps the private data once per node, and
  records every message as the simulation recorder does (same parties, rounds, ``state``);
* when the ``with`` block ends (also on an error: the rounds done are kept) the transcript is
  written to ``privaudit-out``. Its ``defenses`` list holds the Flower defenses of the run
  (SecAgg+ as seen in the messages, the DP strategy wrappers of ``strategy``, the clients' DP
  mods) with their parameters and the privacy they claim, accounted over the rounds run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from privaudit.errors import PrivauditError
from privaudit.integrations._flower_dp import DEFAULT_DELTA as DEFAULT_DELTA  # re-exported
from privaudit.integrations._flower_dp import client_reported, describe
from privaudit.integrations._flower_mods import calling_client_app, dp_mods, is_dp_mod
from privaudit.integrations._isolation import check_private_data, check_public_info
from privaudit.integrations._sidechannel import write_defenses, write_private
from privaudit.integrations.flower import (
    SIMULATION_DIR_ENV,
    FlowerRecorder,
    is_train_event,
    recorded_defenses,
    require_flwr,
)
from privaudit.integrations.schema_map import SchemaMap

__all__ = [
    "DEFAULT_DELTA",
    "DEFENSES_RECORD",
    "OUT_KEY",
    "PRIVATE_RECORD",
    "client_mod",
    "describe",
    "record_run",
    "recording_path",
]

#: Run-config key naming the transcript file; empty or absent: nothing is recorded.
OUT_KEY = "privaudit-out"
#: Name of the array record carrying a node's private data in its replies.
PRIVATE_RECORD = "privaudit.private"
#: Name of the config record carrying a node's DP mods (key ``json``: a JSON list of dicts).
DEFENSES_RECORD = "privaudit.defenses"


def recording_path(run_config: Any) -> str:
    """The transcript path a run config names under :data:`OUT_KEY` ("" when not recording)."""
    value = run_config.get(OUT_KEY, "") if run_config is not None else ""
    return value.strip() if isinstance(value, str) else ""


# --------------------------------------------------------------------------- defenses


# --------------------------------------------------------------------------- client side


def client_mod(private_data: Callable[[Any], dict], defenses: Iterable[Any] = ()) -> Callable:
    """A Flower client Mod attaching the node's ground truth (and DP mods) to its replies.

    Parameters
    ----------
    private_data : callable
        ``private_data(context)`` -> the node's training data as named numpy arrays
        (``items``, ``ratings``, ``attributes``, ...).
    defenses : iterable
        The node's Flower DP mods to describe (e.g. a ``LocalDpMod``), or callables
        ``context -> mod or None`` for mods built from the run config.

    Put it first in ``ClientApp(mods=[...])`` so that it sees the reply after the DP mods.
    """
    defenses = list(defenses)

    def described(context: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for d in defenses:
            obj = d if _is_flower_dp(d) else d(context)
            out += describe(obj) if obj is not None else []
        # the stock mods of the ClientApp that runs this mod (ClientApp(mods=[LocalDpMod(...)])), unlisted
        for obj in dp_mods(calling_client_app()):
            out += [e for e in describe(obj) if e not in out]
        return out

    def mod(message: Any, context: Any, call_next: Callable) -> Any:
        reply = call_next(message, context)
        if reply.has_error():
            return reply
        if not recording_path(context.run_config):
            simulation = os.environ.get(SIMULATION_DIR_ENV, "")
            if simulation:  # under `privaudit record`: the ground truth has its own Mod there
                write_defenses(simulation, int(context.node_id), described(context))
            return reply
        from flwr.app import Array, ArrayRecord, ConfigRecord

        data = check_private_data(private_data(context))
        reply.content[PRIVATE_RECORD] = ArrayRecord({str(k): Array(np.asarray(v)) for k, v in data.items()})
        reply.content[DEFENSES_RECORD] = ConfigRecord({"json": json.dumps(described(context))})
        return reply

    return mod


def _is_flower_dp(obj: Any) -> bool:
    return is_dp_mod(obj)


# --------------------------------------------------------------------------- server side


class _DeployRecorder:
    """Takes the privaudit records out of every reply, then hands the reply to a FlowerRecorder."""

    def __init__(self, rec: FlowerRecorder):
        self.rec = rec
        self.client_defenses: dict[str, dict[str, Any]] = {}
        self.reported: dict[str, set[int]] = {}
        self.rejected: set[int] = set()  # nodes whose private data failed the checks

    def see_nodes(self, nodes: Iterable[int]) -> None:
        self.rec.see_nodes(nodes)

    def record(self, messages: Iterable[Any], direction: str) -> None:
        messages = list(messages)
        if direction == "up":
            for msg in messages:
                if not msg.has_error():
                    self._take(msg)
        self.rec.record(messages, direction)

    def _take(self, msg: Any) -> None:
        content = msg.content
        node = int(msg.metadata.src_node_id)
        if PRIVATE_RECORD in content:
            rec = content[PRIVATE_RECORD]
            arrays = {str(k): np.array(rec[k].numpy(), copy=True) for k in rec}
            del content[PRIVATE_RECORD]
            try:  # a node's ground truth is input like any other: checked, else left out (and counted)
                checked = check_private_data(arrays, self.rec.public.get("n_items"))
            except PrivauditError:
                self.rejected.add(node)
            else:
                write_private(self.rec.run_dir, node, lambda: checked)
        if DEFENSES_RECORD in content:
            text = content[DEFENSES_RECORD].get("json", "[]")
            del content[DEFENSES_RECORD]
            try:
                entries = json.loads(text) if isinstance(text, str) else []
            except ValueError:
                entries = []
            for e in entries if isinstance(entries, list) else []:
                if isinstance(e, dict) and isinstance(e.get("name"), str):
                    key = json.dumps(e, sort_keys=True)
                    self.client_defenses.setdefault(key, e)
                    self.reported.setdefault(key, set()).add(node)

    def defenses(self, strategy: Any, delta: float | None) -> list[dict[str, Any]]:
        """SecAgg+ (from the messages), the strategy's DP wrappers, the clients' DP mods."""
        train = [ev for ev in self.rec.events if ev.direction == "up" and is_train_event(ev)]
        per_node: dict[int, int] = {}
        for ev in train:
            per_node[ev.node] = per_node.get(ev.node, 0) + 1
        if strategy is not None:  # given to record_run: described instead of the one the Grid saw
            self.rec.strategy = strategy
        out = recorded_defenses(self.rec, delta)
        client_rounds = max(per_node.values(), default=0)
        return out + client_reported(self.client_defenses, self.reported, client_rounds)


@contextlib.contextmanager
def record_run(
    grid: Any,
    context: Any,
    strategy: Any = None,
    *,
    public_info: Callable[[Any], dict] | None = None,
    schema: SchemaMap | None = None,
    delta: float | None = None,
) -> Iterator[Any]:
    """Record the messages the ServerApp exchanges inside the ``with`` block.

    Yields a recording ``Grid`` (``grid`` itself when the run config's ``privaudit-out`` is empty).
    On leaving the block the transcript is written to that path (``.ptx``).

    Parameters
    ----------
    grid, context : the ServerApp's ``Grid`` and ``Context``
    strategy : flwr strategy, optional
        Its DP wrappers (fixed clipping) are recorded with their accounted epsilon.
    public_info : callable, optional
        ``public_info(run_config)`` -> the public facts of the app (``n_items``, ...).
    schema : SchemaMap, optional
        How the app's records become privaudit kinds (default: whole-matrix replies, by shape).
    delta : float, optional
        delta of the accounted epsilon of fixed clipping (default :data:`DEFAULT_DELTA`).
    """
    path = recording_path(context.run_config)
    if not path:
        yield grid
        return
    require_flwr()
    from privaudit.integrations._flower_grid import RecordingGrid

    if isinstance(grid, RecordingGrid):
        raise PrivauditError(f"privaudit record already records this run: leave {OUT_KEY} empty")
    out = Path(path).expanduser()
    if not out.is_absolute():  # the ServerApp runs in a process Flower starts, in a folder of its own
        raise PrivauditError(f"{OUT_KEY}={path!r}: give an absolute path")
    if not out.parent.is_dir():
        raise PrivauditError(f"{OUT_KEY}={path!r}: the folder {out.parent} does not exist")
    run_dir = Path(tempfile.mkdtemp(prefix="privaudit-deploy-"))
    rec = FlowerRecorder(schema or SchemaMap.auto_map(), run_dir)
    public = check_public_info(public_info(context.run_config), "public_info") if public_info else {}
    rec.start(dict(context.run_config), public)
    deploy = _DeployRecorder(rec)
    try:
        yield RecordingGrid(grid, deploy)
    finally:
        try:
            seed = context.run_config.get("seed")
            app = str(getattr(getattr(grid, "run", None), "fab_id", "") or "")
            t = rec.transcript(
                app=app,
                seed=int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None,
                defenses=deploy.defenses(strategy, delta),
            )
            t.config["deployment"] = {"engine": "flower-deployment", "nodes": len(rec.nodes)}
            if deploy.rejected:
                t.config["deployment"]["private_rejected"] = len(deploy.rejected)
            t.save(out)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

"""The delegating Flower ``Grid`` and client ``Mod`` of the recorder (imports flwr at import time)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from privaudit.integrations._sidechannel import write_private


class RecordingGrid(Grid):
    """A ``Grid`` that hands every message the ServerApp sends or receives to a recorder.

    Every call is delegated unchanged to ``inner``; the recorder only reads the messages
    (it copies their arrays), so the run is the same with and without it.
    """

    def __init__(self, inner: Grid, recorder: Any):
        self._inner = inner
        self._recorder = recorder

    def set_run(self, run: Any) -> None:
        self._inner.set_run(run)

    @property
    def run(self) -> Any:
        return self._inner.run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return self._inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        nodes = list(self._inner.get_node_ids())
        self._recorder.see_nodes(nodes)
        return nodes

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self._recorder.record(messages, "down")
        return self._inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(self._inner.pull_messages(message_ids))
        self._recorder.record(replies, "up")
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        self._recorder.record(messages, "down")
        replies = list(self._inner.send_and_receive(messages, timeout=timeout))
        self._recorder.record(replies, "up")
        return replies

    def record_state(self, server_round: int, kind: str, arrays: dict, meta: dict | None = None) -> None:
        """Let the ServerApp log what it computed (e.g. the secure ``aggregate``) as a server state."""
        self._recorder.server_state(server_round, kind, arrays, meta)


def recording_server_app(app: ServerApp, recorder: Any, public_info: Callable | None = None) -> ServerApp:
    """A ServerApp running ``app`` on a :class:`RecordingGrid` (compat and ``main`` apps alike)."""
    wrapped = ServerApp()

    @wrapped.main()
    def main(grid: Grid, context: Context) -> None:
        recorder.start(dict(context.run_config), public_info(context.run_config) if public_info else {})
        app(RecordingGrid(grid, recorder), context)

    return wrapped


class _ModdedClientApp(ClientApp):
    """``inner`` with extra mods around it (applied before the app's own mods)."""

    def __init__(self, inner: ClientApp, mods: list):
        super().__init__()
        self._inner = inner
        call = inner.__call__
        for mod in reversed(mods):
            call = _wrap(call, mod)
        self._outer = call

    def __call__(self, message: Message, context: Context) -> Message:
        return self._outer(message, context)


def _wrap(call: Callable, mod: Callable) -> Callable:
    def new_call(message: Message, context: Context) -> Message:
        return mod(message, context, call)

    return new_call


def private_data_mod(loader: Callable[[Context], dict], run_dir: str | Path) -> Callable:
    """A client Mod writing ``loader(context)`` once per node into ``run_dir`` (ground truth).

    ``loader`` returns the node's private training data as named numpy arrays (``items``,
    ``ratings``, ``attributes``, ...). The files (one ``.npy`` per array, never a pickle) are
    merged into the transcript as the node's ``private`` message when the run ends.
    """
    run_dir = str(run_dir)

    def mod(message: Message, context: Context, call_next: Callable) -> Message:
        write_private(run_dir, int(context.node_id), lambda: loader(context))
        return call_next(message, context)

    return mod


def with_mods(app: ClientApp, mods: list) -> ClientApp:
    """``app`` with ``mods`` applied around it (outermost first)."""
    return _ModdedClientApp(app, list(mods))

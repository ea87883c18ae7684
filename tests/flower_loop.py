"""A loop-back Flower ``Grid`` for tests: the recorder's code path without Ray or a network."""

from __future__ import annotations


class LoopGrid:
    """A Flower ``Grid`` delivering each message to a ClientApp in this process, as SuperNodes
    do: node k (id ``first_id + stride * k``) holds partition k of ``nodes``, and the replies
    come back through the client Mods."""

    def __init__(self, client_app, run_config: dict, nodes: int, *, first_id: int, stride: int, run_id: int):
        from flwr.app import Context, RecordDict

        self.app = client_app
        self.ids = [first_id + stride * k for k in range(nodes)]
        self.contexts = {
            n: Context(
                run_id=run_id,
                node_id=n,
                node_config={"partition-id": k, "num-partitions": nodes},
                state=RecordDict(),
                run_config=run_config,
            )
            for k, n in enumerate(self.ids)
        }
        self.run = None

    def set_run(self, run) -> None:
        self.run = run

    def get_node_ids(self):
        return list(self.ids)

    def send_and_receive(self, messages, *, timeout=None):
        return [self.app(m, self.contexts[m.metadata.dst_node_id]) for m in messages]

"""ServerApp of the FedNCF-GMF reference app: MF-FedAvg (row means over the clients that
trained a row) for the item embeddings, FedAvg (plain mean) for the output weights h."""

from __future__ import annotations

import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedncf_gmf.task import dataset_of, init_model

app = ServerApp()


def wait_for_nodes(grid: Grid, min_nodes: int = 2, timeout: float = 120.0) -> list[int]:
    """The node ids once at least ``min_nodes`` have registered and the set stopped growing.

    The simulation engine registers its nodes while the ServerApp starts, so the first
    ``get_node_ids()`` may come back empty.
    """
    deadline = time.monotonic() + timeout
    nodes: list[int] = []
    while time.monotonic() < deadline:
        now = sorted(grid.get_node_ids())
        if len(now) >= min_nodes and now == nodes:
            return nodes
        nodes = now
        time.sleep(0.5)
    raise RuntimeError(f"fewer than {min_nodes} nodes registered within {timeout:.0f} s")


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    V, h = init_model(int(cfg["seed"]), dataset_of(cfg).n_items, int(cfg["dim"]))
    nodes = wait_for_nodes(grid)
    for rnd in range(1, int(cfg["num-server-rounds"]) + 1):
        content = RecordDict(
            {
                "item-emb": ArrayRecord({"V": Array(V), "h": Array(h)}),
                "config": ConfigRecord({"server-round": rnd, "lr": float(cfg["lr"])}),
            }
        )
        msgs = [Message(content=content, dst_node_id=n, message_type="train", group_id=str(rnd)) for n in nodes]
        replies = [r for r in grid.send_and_receive(msgs) if not r.has_error()]
        if len(replies) != len(msgs):
            raise RuntimeError(f"round {rnd}: {len(msgs) - len(replies)} of {len(msgs)} nodes failed")
        ups = [tuple(r.content["item-rows"][k].numpy() for k in ("ids", "rows", "h")) for r in replies]
        ups.sort(key=lambda u: (u[0].tobytes(), u[1].tobytes()))  # arrival order must not matter
        total, count = np.zeros_like(V), np.zeros(V.shape[0])
        for ids, rows, _ in ups:
            total[ids] += rows
            count[ids] += 1
        seen = count > 0
        V = V.copy()
        V[seen] = total[seen] / count[seen, None]
        h = np.mean([u[2] for u in ups], axis=0)
    context.state.array_records["final-model"] = ArrayRecord({"V": Array(V), "h": Array(h)})

"""ServerApp and ClientApp of the test app: one least-squares gradient step per round."""

from __future__ import annotations

import time

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

server = ServerApp()
client = ClientApp()


def _data(context: Context) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(int(context.node_config["partition-id"]))
    return rng.normal(size=(20, 10)), rng.normal(size=(20, 3))


@server.main()
def main(grid: Grid, context: Context) -> None:
    nodes, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline:  # the simulation registers its nodes while we start
        now = len(list(grid.get_node_ids()))
        if now >= 2 and now == nodes:
            break
        nodes = now
        time.sleep(0.5)
    strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)
    arrays = ArrayRecord([np.zeros((10, 3)), np.zeros(3)])
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=int(context.run_config["num-server-rounds"]))


@client.train()
def train(msg: Message, context: Context) -> Message:
    W, b = msg.content["arrays"].to_numpy_ndarrays()
    X, Y = _data(context)
    err = X @ W + b - Y
    W, b = W - 0.01 * X.T @ err, b - 0.01 * err.sum(axis=0)
    content = RecordDict({"arrays": ArrayRecord([W, b]), "metrics": MetricRecord({"num-examples": len(X)})})
    return Message(content, reply_to=msg)


def private_data(context: Context) -> dict[str, np.ndarray]:
    """Ground truth: the node's data (no items: nothing the generic attacks score)."""
    X, Y = _data(context)
    return {"X": X, "Y": Y}


def public_info(run_config) -> dict:
    return {"n_items": 50}

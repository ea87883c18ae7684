"""ServerApp of the FedAvg-MF reference app: MF-FedAvg over item rows, or the same under SecAgg+.

Plain mode: each round the server sends the item embeddings ``V`` to every node, receives each
client's updated rows of its train items, and replaces every row by the mean of the rows
uploaded for it (rows nobody trained keep their value). Replies are aggregated in an order
defined by their content, so the model does not depend on arrival order or node ids.

SecAgg+ mode (run config ``secaggplus = true``): clients upload the dense row delta and a 0/1
row-count vector through Flower's ``SecAggPlusWorkflow``; the server only learns their sums,
and applies the same row means.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedavg_mf.task import dataset_of, init_items

app = ServerApp()


def _send(grid: Grid, nodes: list[int], content: RecordDict, kind: str, rnd: int) -> list[Message]:
    msgs = [Message(content=content, dst_node_id=n, message_type=kind, group_id=str(rnd)) for n in nodes]
    replies = [r for r in grid.send_and_receive(msgs) if not r.has_error()]
    if len(replies) != len(msgs):
        raise RuntimeError(f"round {rnd}: {len(msgs) - len(replies)} of {len(msgs)} nodes failed")
    return replies


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


def mean_rows(V: np.ndarray, uploads: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Replace each uploaded row of ``V`` by the mean of the rows uploaded for it."""
    total = np.zeros_like(V)
    count = np.zeros(V.shape[0])
    for ids, rows in sorted(uploads, key=lambda p: (p[0].tobytes(), p[1].tobytes())):
        total[ids] += rows
        count[ids] += 1
    out = V.copy()
    seen = count > 0
    out[seen] = total[seen] / count[seen, None]
    return out


def _evaluate(grid: Grid, nodes: list[int], V: np.ndarray, rnd: int) -> float:
    content = RecordDict({"item-emb": ArrayRecord({"V": Array(V)})})
    replies = _send(grid, nodes, content, "evaluate", rnd)
    sse = sum(float(r.content["metrics"]["sse"]) for r in replies)
    count = sum(int(r.content["metrics"]["count"]) for r in replies)
    return float(np.sqrt(sse / max(count, 1)))


def _plain(grid: Grid, context: Context, V: np.ndarray, nodes: list[int]) -> np.ndarray:
    cfg = context.run_config
    for rnd in range(1, int(cfg["num-server-rounds"]) + 1):
        config = ConfigRecord({"server-round": rnd, "lr": float(cfg["lr"]), "local-steps": int(cfg["local-steps"])})
        content = RecordDict({"item-emb": ArrayRecord({"V": Array(V)}), "config": config})
        replies = _send(grid, nodes, content, "train", rnd)
        uploads = [(r.content["item-rows"]["ids"].numpy(), r.content["item-rows"]["rows"].numpy()) for r in replies]
        V = mean_rows(V, uploads)
    return V


def _secaggplus(grid: Grid, context: Context, V: np.ndarray, nodes: list[int]) -> np.ndarray:
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    state = {"V": V}

    class RowMeanFedAvg(FedAvg):
        """FedAvg whose aggregate (mean delta, mean count) becomes per-row means of the rows."""

        def aggregate_fit(self, server_round, results, failures):
            params, metrics = super().aggregate_fit(server_round, results, failures)
            delta, counts = parameters_to_ndarrays(params)
            seen = counts > 0.5 / len(results)
            new = state["V"].copy()
            new[seen] += delta[seen] / counts[seen, None]
            state["V"] = new
            return ndarrays_to_parameters([new]), metrics

    cfg = context.run_config
    strategy = RowMeanFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=len(nodes),
        min_available_clients=len(nodes),
        initial_parameters=ndarrays_to_parameters([V]),
        on_fit_config_fn=lambda rnd: {"server-round": rnd, "lr": float(cfg["lr"])},
    )
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=int(cfg["num-server-rounds"])), strategy=strategy)
    shares = int(cfg["secagg-shares"])  # neighbours per node, itself included: odd, at most the node count
    workflow = DefaultWorkflow(
        fit_workflow=SecAggPlusWorkflow(num_shares=shares, reconstruction_threshold=shares // 2 + 1, max_weight=1.0)
    )
    workflow(grid, legacy)
    return state["V"]


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    dataset = dataset_of(cfg)
    V = init_items(int(cfg["seed"]), dataset.n_items, int(cfg["dim"]))
    nodes = wait_for_nodes(grid)
    V = _secaggplus(grid, context, V, nodes) if cfg["secaggplus"] else _plain(grid, context, V, nodes)
    rmse = _evaluate(grid, nodes, V, int(cfg["num-server-rounds"]) + 1)
    context.state.array_records["final-model"] = ArrayRecord({"V": Array(V)})
    context.state.config_records["final-metrics"] = ConfigRecord({"test-rmse": rmse})

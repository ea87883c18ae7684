"""ServerApp: Flower's stock FedAvg over the whole item matrix."""

from __future__ import annotations

import time

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from localdp_mf.task import init_items

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    seen, nodes = -1, 0
    for _ in range(240):  # the simulation registers its nodes while the ServerApp starts
        nodes = len(list(grid.get_node_ids()))
        if nodes >= 2 and nodes == seen:
            break
        seen = nodes
        time.sleep(0.5)
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord([init_items(cfg)]),
        num_rounds=int(cfg["num-server-rounds"]),
        train_config=ConfigRecord(),
    )

"""ServerApp of the plain FedAvg MF app: Flower's stock FedAvg over the whole item matrix.

Every round FedAvg sends ``ArrayRecord([V])`` to every node and replaces V by the average of
the returned matrices weighted by the clients' ``num-examples``.
"""

from __future__ import annotations

import time

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from plain_mf.task import dataset_of, init_items, public_info
from privaudit.integrations.flower_deploy import record_run

app = ServerApp()


def wait_for_nodes(grid: Grid, min_nodes: int = 2, timeout: float = 120.0) -> int:
    """The number of nodes once at least ``min_nodes`` have registered and stopped growing
    (the simulation registers its nodes while the ServerApp starts)."""
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        now = len(list(grid.get_node_ids()))
        if now >= min_nodes and now == seen:
            return now
        seen = now
        time.sleep(0.5)
    raise RuntimeError(f"fewer than {min_nodes} nodes registered within {timeout:.0f} s")


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    V = init_items(int(cfg["seed"]), dataset_of(cfg).n_items, int(cfg["dim"]))
    nodes = wait_for_nodes(grid)
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=nodes, min_available_nodes=nodes)
    # records the run into the run config's privaudit-out (a no-op when it is empty)
    with record_run(grid, context, strategy, public_info=public_info) as grid:
        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord([V]),
            num_rounds=int(cfg["num-server-rounds"]),
            train_config=ConfigRecord(),
        )
    context.state.array_records["final-model"] = result.arrays

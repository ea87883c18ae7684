"""ServerApp of the SecAgg+ GMF-MF app: FedAvg of the clients' deltas under Flower's SecAgg+.

Run config ``server-plan``:

* ``honest`` (default): every client of a round is sent the global model (V, h); the server
  adds the mean of the deltas, which SecAgg+ reveals only as a sum.
* ``inconsistent``: the server is the attacker (model inconsistency, Pasquini, Francati and
  Ateniese, "Eluding Secure Aggregation in Federated Learning via Model Inconsistency", ACM
  CCS 2022). In rounds ``attack-start`` .. ``attack-start + attack-rounds - 1`` the target
  (rank ``target`` among the sorted node ids) is sent the global model and every other
  client V = 0, h = 0, on which local training leaves the uploaded parameters unchanged
  (``task`` docstring), so the secure sum is the target's delta. The server keeps the global
  model in those rounds (applying the target's delta alone would reveal the attack).

Under privaudit's recorder the server also logs what it obtained from SecAgg+ each round (the
sum of the deltas) as a server ``aggregate`` state message; without the recorder nothing is logged.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from secagg_mal_mf.task import dataset_of, init_h, init_items

app = ServerApp()
PLANS = ("honest", "inconsistent")


def wait_for_nodes(grid: Grid, min_nodes: int = 2, timeout: float = 120.0) -> list[int]:
    """The node ids once at least ``min_nodes`` have registered and the set stopped growing."""
    deadline = time.monotonic() + timeout
    nodes: list[int] = []
    while time.monotonic() < deadline:
        now = sorted(grid.get_node_ids())
        if len(now) >= min_nodes and now == nodes:
            return nodes
        nodes = now
        time.sleep(0.5)
    raise RuntimeError(f"fewer than {min_nodes} nodes registered within {timeout:.0f} s")


def _plan(cfg, n_nodes: int) -> tuple[str, int, set[int]]:
    """(plan, target rank, deviation rounds) from the run config; ValueError on a bad value."""
    plan = str(cfg["server-plan"])
    if plan not in PLANS:
        raise ValueError(f"server-plan must be one of {PLANS}, got {plan!r}")
    target, start, count = int(cfg["target"]), int(cfg["attack-start"]), int(cfg["attack-rounds"])
    if not 0 <= target < n_nodes:
        raise ValueError(f"target must be in 0..{n_nodes - 1}, got {target}")
    if start < 1 or count < 0:
        raise ValueError("attack-start must be >= 1 and attack-rounds >= 0")
    rounds = set(range(start, start + count)) if plan == "inconsistent" else set()
    return plan, target, rounds


@app.main()
def main(grid: Grid, context: Context) -> None:
    from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    cfg = context.run_config
    dataset = dataset_of(cfg)
    nodes = wait_for_nodes(grid)
    plan, target, deviate = _plan(cfg, len(nodes))
    state = {"V": init_items(int(cfg["seed"]), dataset.n_items, int(cfg["dim"])), "h": init_h(int(cfg["dim"]))}
    log_state = getattr(grid, "record_state", None)  # privaudit's recording grid only

    class DeltaFedAvg(FedAvg):
        """FedAvg of deltas; in deviation rounds a crafted model for all but the target."""

        def configure_fit(self, server_round, parameters, client_manager):
            pairs = super().configure_fit(server_round, parameters, client_manager)
            if server_round not in deviate:
                return pairs
            crafted = FitIns(ndarrays_to_parameters([np.zeros_like(state["V"]), np.zeros_like(state["h"])]), {})
            return [(proxy, ins if proxy.node_id == nodes[target] else crafted) for proxy, ins in pairs]

        def aggregate_fit(self, server_round, results, failures):
            params, metrics = super().aggregate_fit(server_round, results, failures)
            dV, dh = parameters_to_ndarrays(params)  # SecAgg+ gives the mean over the n uploads
            n = len(results)
            if log_state is not None:
                log_state(server_round, "aggregate", {"V": dV * n, "h": dh * n}, {"n": n, "plan": plan})
            if server_round not in deviate:
                state["V"], state["h"] = state["V"] + dV, state["h"] + dh
            return ndarrays_to_parameters([state["V"], state["h"]]), metrics

    strategy = DeltaFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=len(nodes),
        min_available_clients=len(nodes),
        initial_parameters=ndarrays_to_parameters([state["V"], state["h"]]),
    )
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=int(cfg["num-server-rounds"])), strategy=strategy)
    shares = int(cfg["secagg-shares"])
    workflow = DefaultWorkflow(
        fit_workflow=SecAggPlusWorkflow(num_shares=shares, reconstruction_threshold=shares // 2 + 1, max_weight=1.0)
    )
    workflow(grid, legacy)

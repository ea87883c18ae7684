"""ClientApp of the FedAvg-MF reference app: one user per node, item rows up, user vector kept."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import (
    Code,
    FitRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat

from fedavg_mf.task import dataset_of, init_user, local_train, user_split


def secaggplus_when_asked(msg: Message, ctx: Context, call_next):
    """Flower's ``secaggplus_mod`` for messages of the SecAgg+ workflow; others pass through."""
    if "secaggplus_configs" in msg.content.config_records:
        return secaggplus_mod(msg, ctx, call_next)
    return call_next(msg, ctx)


app = ClientApp(mods=[secaggplus_when_asked])


def _user_state(context: Context):
    cfg = context.run_config
    user = int(context.node_config["partition-id"])
    dataset = dataset_of(cfg)
    train, test = user_split(dataset, user, int(cfg["seed"]))
    if "user" not in context.state.array_records:
        u = init_user(int(cfg["seed"]), user, int(cfg["dim"]))
        context.state.array_records["user"] = ArrayRecord({"u": Array(u)})
    u = context.state.array_records["user"]["u"].numpy()
    return u, train, test


def _train(context: Context, V: np.ndarray):
    """Local steps on the train items; (updated u, item ids, updated rows, loss)."""
    cfg = context.run_config
    u, (items, ratings), _ = _user_state(context)
    u_new, rows = local_train(u, V[items], ratings, float(cfg["lr"]), float(cfg["lam"]), int(cfg["local-steps"]))
    context.state.array_records["user"] = ArrayRecord({"u": Array(u_new)})
    loss = float(np.mean((ratings - V[items] @ u) ** 2))
    return items, rows, loss


@app.train()
def train(msg: Message, context: Context) -> Message:
    if "fitins.parameters" in msg.content.array_records:  # SecAgg+ (legacy FitIns) round
        fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        V = parameters_to_ndarrays(fitins.parameters)[0]
        items, rows, loss = _train(context, V)
        delta = np.zeros_like(V)
        delta[items] = rows - V[items]
        counts = np.zeros(V.shape[0])
        counts[items] = 1.0
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([delta, counts]), 1, {"loss": loss})
        return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)
    V = msg.content.array_records["item-emb"]["V"].numpy()
    items, rows, loss = _train(context, V)
    content = RecordDict(
        {
            "item-rows": ArrayRecord({"ids": Array(items), "rows": Array(rows)}),
            "metrics": MetricRecord({"num-examples": int(items.size), "loss": loss}),
        }
    )
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    V = msg.content.array_records["item-emb"]["V"].numpy()
    u, _, (items, ratings) = _user_state(context)
    err = ratings - V[items] @ u
    metrics = MetricRecord({"sse": float(err @ err), "count": int(items.size)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)

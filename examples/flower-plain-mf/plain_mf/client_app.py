"""ClientApp of the plain FedAvg MF app: the whole item matrix comes back, the user vector stays."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from plain_mf.task import dataset_of, local_train, ridge_user, user_split

app = ClientApp()


def _split(context: Context):
    cfg = context.run_config
    user = int(context.node_config["partition-id"])
    return user, user_split(dataset_of(cfg), user, int(cfg["seed"]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    V = msg.content["arrays"].to_numpy_ndarrays()[0]
    user, ((items, ratings), _) = _split(context)
    rnd = int(msg.content["config"]["server-round"])
    rng = np.random.default_rng([int(context.run_config["seed"]), 4, user, rnd])
    V_new, _, loss = local_train(V, items, ratings, context.run_config, rng)
    content = RecordDict(
        {
            "arrays": ArrayRecord([V_new]),
            "metrics": MetricRecord({"num-examples": int(items.size), "train-loss": loss}),
        }
    )
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    V = msg.content["arrays"].to_numpy_ndarrays()[0]
    cfg = context.run_config
    _, ((items, ratings), (t_items, t_ratings)) = _split(context)
    mu = float(cfg["global-mean"])
    u = ridge_user(V[items], ratings - mu, float(cfg["ridge"]))
    err = t_ratings - mu - V[t_items] @ u
    rmse = float(np.sqrt(np.mean(err**2))) if err.size else 0.0
    metrics = MetricRecord({"num-examples": max(int(t_items.size), 1), "eval-rmse": rmse})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)

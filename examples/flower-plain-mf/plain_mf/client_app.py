"""ClientApp of the plain FedAvg MF app: the whole item matrix comes back, the user vector stays."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod

from plain_mf.task import dataset_of, local_train, private_data, ridge_user, user_split
from privaudit.integrations.flower_deploy import client_mod


def local_dp_of(context: Context) -> LocalDpMod | None:
    """Flower's LocalDpMod as the run config sets it (``dp = "local"``), else None."""
    cfg = context.run_config
    if str(cfg.get("dp", "none")) != "local":
        return None
    clip = float(cfg["dp-clipping-norm"])
    return LocalDpMod(clip, 2.0 * clip, float(cfg["dp-epsilon"]), float(cfg["dp-delta"]))


def local_dp(msg: Message, context: Context, call_next):
    """Mod applying :func:`local_dp_of` to train messages (the run config is known only once a
    message comes; LocalDpMod refuses the evaluate replies, which carry no arrays)."""
    mod = local_dp_of(context)
    if mod is None or msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    return mod(msg, context, call_next)


# privaudit's Mod first: it attaches the ground truth after LocalDpMod noised the reply
app = ClientApp(mods=[client_mod(private_data, [local_dp_of]), local_dp])


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

"""ClientApp of the FedNCF-GMF reference app: one user per node."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedncf_gmf.task import (
    dataset_of,
    init_user,
    local_train,
    positives,
    sample_negatives,
)

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = context.run_config
    user, seed = int(context.node_config["partition-id"]), int(cfg["seed"])
    dataset = dataset_of(cfg)
    V = msg.content.array_records["item-emb"]["V"].numpy()
    h = msg.content.array_records["item-emb"]["h"].numpy()
    rnd = int(msg.content.config_records["config"]["server-round"])
    if "user" not in context.state.array_records:
        context.state.array_records["user"] = ArrayRecord({"p": Array(init_user(seed, user, V.shape[1]))})
    p = context.state.array_records["user"]["p"].numpy()
    pos = positives(dataset, user)
    neg = sample_negatives(V.shape[0], pos, int(cfg["negatives"]), seed, user, rnd)
    items = np.concatenate([pos, neg])
    order = np.argsort(items)
    items = items[order]
    labels = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])[order]
    p, rows, h_new, loss = local_train(p, V[items], h, labels, float(cfg["lr"]), int(cfg["local-epochs"]))
    context.state.array_records["user"] = ArrayRecord({"p": Array(p)})
    content = RecordDict(
        {
            "item-rows": ArrayRecord({"ids": Array(items), "rows": Array(rows), "h": Array(h_new)}),
            "metrics": MetricRecord({"num-examples": int(items.size), "loss": loss}),
        }
    )
    return Message(content, reply_to=msg)

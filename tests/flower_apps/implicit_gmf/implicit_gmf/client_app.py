"""ClientApp: local GMF training, the whole model returned."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from implicit_gmf.task import local_train, positives

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    model = msg.content["arrays"].to_numpy_ndarrays()
    user = int(context.node_config["partition-id"])
    pos = positives(context.run_config, user)
    rnd = int(msg.content["config"]["server-round"])
    rng = np.random.default_rng([int(context.run_config["seed"]), 7, user, rnd])
    new = local_train(model, pos, context.run_config, rng)
    content = RecordDict({"arrays": ArrayRecord(new), "metrics": MetricRecord({"num-examples": int(pos.size)})})
    return Message(content, reply_to=msg)

"""ClientApp: Flower's LocalDpMod on every train reply, as the app ships it."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod

from localdp_mf.task import local_train, user_data

app = ClientApp(mods=[LocalDpMod(clipping_norm=1.0, sensitivity=1e-4, epsilon=10, delta=1e-5)])


@app.train()
def train(msg: Message, context: Context) -> Message:
    V = msg.content["arrays"].to_numpy_ndarrays()[0]
    items, ratings = user_data(context.run_config, int(context.node_config["partition-id"]))
    V_new = local_train(V, items, ratings, context.run_config)
    content = RecordDict({"arrays": ArrayRecord([V_new]), "metrics": MetricRecord({"num-examples": int(items.size)})})
    return Message(content, reply_to=msg)

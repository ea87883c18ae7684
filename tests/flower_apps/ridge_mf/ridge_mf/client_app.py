"""ClientApp: ridge user vector, local steps on the rated rows, the whole matrix returned."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ridge_mf.task import local_train, train_split

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    V = msg.content["arrays"].to_numpy_ndarrays()[0]
    items, ratings = train_split(context.run_config, int(context.node_config["partition-id"]))
    V_new = local_train(V, items, ratings, context.run_config)
    content = RecordDict({"arrays": ArrayRecord([V_new]), "metrics": MetricRecord({"num-examples": int(items.size)})})
    return Message(content, reply_to=msg)

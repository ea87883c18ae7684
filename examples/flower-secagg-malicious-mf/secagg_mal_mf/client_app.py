"""ClientApp of the SecAgg+ GMF-MF app: the stock honest client under Flower's ``secaggplus_mod``.

Each round it trains on the model (V, h) it was sent and uploads the dense deltas (V' - V,
h' - h) with weight 1 through SecAgg+; the user vector u stays on the node. With the run config
``consistency-bulletin`` set to a folder, the clients also run privaudit's model-consistency
Mod (``privaudit.integrations.flower_consistency``).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat

from secagg_mal_mf.task import dataset_of, init_user, local_train, user_split


def consistency_when_configured(msg: Message, ctx: Context, call_next):
    """privaudit's model-consistency Mod when the run config names a bulletin folder (default: off)."""
    folder = str(ctx.run_config.get("consistency-bulletin", ""))
    if not folder:
        return call_next(msg, ctx)
    from privaudit.integrations.flower_consistency import model_consistency_mod

    return model_consistency_mod(folder)(msg, ctx, call_next)


app = ClientApp(mods=[consistency_when_configured, secaggplus_mod])


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = context.run_config
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    V, h = parameters_to_ndarrays(fitins.parameters)
    user = int(context.node_config["partition-id"])
    (items, ratings), _ = user_split(dataset_of(cfg), user, int(cfg["seed"]))
    if "user" not in context.state.array_records:
        context.state.array_records["user"] = ArrayRecord(
            {"u": Array(init_user(int(cfg["seed"]), user, int(cfg["dim"])))}
        )
    u = context.state.array_records["user"]["u"].numpy()
    u_new, V_new, h_new = local_train(
        u, V, h, items, ratings, float(cfg["lr"]), float(cfg["lam"]), int(cfg["local-steps"])
    )
    context.state.array_records["user"] = ArrayRecord({"u": Array(u_new)})
    loss = float(np.mean((ratings - V[items] @ (h * u)) ** 2))
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([V_new - V, h_new - h]), 1, {"loss": loss})
    return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)

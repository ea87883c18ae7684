"""``defenses`` entries of the Flower DP objects a stock app uses (found by
:mod:`privaudit.integrations._flower_mods`), accounted over the recorded train replies."""

from __future__ import annotations

from typing import Any

__all__ = ["stock_defenses"]


def stock_defenses(
    strategy: Any, client_mods: list[Any], train: list[Any], delta: float | None
) -> list[dict[str, Any]]:
    """Entries of the strategy's DP wrappers and the ClientApp's DP mods.

    Parameters
    ----------
    strategy : the Flower strategy that drove the Grid (or None)
    client_mods : the ClientApp's Flower DP mods (LocalDpMod, fixedclipping_mod, ...)
    train : the recorder's train-reply events (``node``, ``round``)
    delta : delta of the fixed-clipping accounting (None: the wrapper's accountant or 1e-5)
    """
    from privaudit.integrations._flower_dp import describe

    rounds = sorted({ev.round for ev in train})
    per_node: dict[int, int] = {}
    per_round: dict[int, int] = {}
    for ev in train:
        per_node[ev.node] = per_node.get(ev.node, 0) + 1
        per_round[ev.round] = per_round.get(ev.round, 0) + 1
    out = []
    for e in describe(strategy, len(rounds), delta) if strategy is not None else []:
        e["detected"] = "the strategy that drove the Grid"
        if "num_sampled_clients" in e and per_round:
            e["min_replies"] = min(per_round.values())
        out.append(e)
    client_rounds = max(per_node.values(), default=0)
    for mod in client_mods:
        for e in describe(mod, client_rounds):
            e["detected"] = "the ClientApp's mods"
            e["reported_by_clients"] = len(per_node)
            out.append(e)
    return out

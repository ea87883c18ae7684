"""Tables and quick checks of the FedRec paper (federated PMF) for ``benchmarks/reproduce.py fedrec``."""

from __future__ import annotations

from collections.abc import Callable

from reproduce_common import Check, Context, script_table


def fedrec_run(ds, model: str, federated: bool, fold: int):
    from privaudit.protocols.fedrec import FedRec

    return FedRec().run(ds, {"model": model, "federated": federated, "fold": fold, "record_rounds": []}, [], 0).utility


def q_fedrec(ctx: Context) -> list[Check]:
    ds = ctx.dataset()
    fed = fedrec_run(ds, "pmf-batch", True, 0)
    unf = fedrec_run(ds, "pmf-batch", False, 0)
    md = abs(fed["rmse"] - unf["rmse"]) / unf["rmse"] * 100
    return [
        Check("fedrec", "PMF(B) federated fold 0 RMSE (docs 0.94760; paper 0.9424)", fed["rmse"], 0.94760, 0.0005),
        Check("fedrec", "PMF(B) federated fold 0 MAE (docs 0.74667)", fed["mae"], 0.74667, 0.0005),
        Check("fedrec", "PMF(B) fold 0 MD federated vs unfederated, % (docs <= 0.1 %)", md, 0.0, 0.1, "max"),
    ]


#: Tables of ``reproduce.py fedrec`` by name (each returns Markdown).
TABLES: dict[str, Callable[[Context], str]] = {
    "table2": script_table(
        "fedrec_table2.py",
        "--parts",
        "table",
        "--models",
        "pmf-batch,pmf-sgd,svdpp-sgd",
        "--folds",
        "0,1,2,3,4",
        "--jobs",
        "1",
        data_flag=None,
    ),
    "rho": script_table(
        "fedrec_table2.py",
        "--parts",
        "rho",
        "--models",
        "pmf-batch",
        "--folds",
        "0,1,2,3,4",
        "--jobs",
        "1",
        data_flag=None,
    ),
    "render": script_table("fedrec_table2.py", "--render", data_flag=None),
}

#: Quick checks of ``reproduce.py fedrec --quick``.
QUICK = q_fedrec

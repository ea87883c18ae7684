"""Neural collaborative filtering (GMF, MLP, NeuMF) for FedNCF, as batched functional PyTorch
models: the networks (:mod:`~privaudit.models.ncf.network`), the local training of a round's
clients with optional DP-SGD (:mod:`~privaudit.models.ncf.training`) and scoring
(:mod:`~privaudit.models.ncf.scoring`), re-exported here.

No parties, no I/O: :mod:`privaudit.protocols.fedncf` wires these kernels into FedNCF
(FedNCF paper §3.2; He et al. 2017). torch is an optional extra (``privaudit[ncf]``) and is
imported lazily inside the functions, so importing this package never needs it.
"""

from __future__ import annotations

from privaudit.models.ncf.network import (
    ARCHS,
    EMBED_STD,
    Architecture,
    flatten_network,
    forward,
    forward_stacked,
    init_embeddings,
    init_network,
    item_dim,
    loss_grads_stacked,
    network_shapes,
    require_torch,
    single_thread,
    unflatten_network,
)
from privaudit.models.ncf.scoring import sample_negatives, score
from privaudit.models.ncf.training import (
    ADAM_BETAS,
    ADAM_EPS,
    CohortData,
    LocalTrainingSettings,
    make_batches,
    train_centralized,
    train_clients,
    train_clients_loop,
    train_cohort,
)

__all__ = [
    "ARCHS",
    "EMBED_STD",
    "ADAM_BETAS",
    "ADAM_EPS",
    "Architecture",
    "CohortData",
    "LocalTrainingSettings",
    "flatten_network",
    "forward",
    "forward_stacked",
    "init_embeddings",
    "init_network",
    "item_dim",
    "loss_grads_stacked",
    "make_batches",
    "network_shapes",
    "require_torch",
    "sample_negatives",
    "score",
    "single_thread",
    "train_centralized",
    "train_clients",
    "train_clients_loop",
    "train_cohort",
    "unflatten_network",
]

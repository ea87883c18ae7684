"""FedNCF: federated GMF / MLP / NeuMF (the FedNCF paper, §3).

Parties: the coordination server ``server`` and one client ``client:<u>`` per user
(u = 0..n-1). Interactions are implicit: every rating is a positive. Leave-one-out split
(FedNCF paper §4.1): each user's latest interaction is held out; clients train on the rest.

Round r (an *aggregation round*; a *global round* is a pass over all clients):

1. the server picks a cohort (``selection``): ``random`` -- every global round a random
   permutation of the clients cut into cohorts of ``clients_per_round``; ``adversarial`` -- the
   linking attack of §3.5.2: a fixed random group S of ``clients_per_round - 1`` clients and the
   ``target``; rounds 0, 2, ..., 2R-2 use S + target, rounds 1, 3, ..., 2R-1 use S
   (R = ``manipulated_rounds``), later rounds are random. Recorded as a ``cohort`` message
   (server -> server, payload ``clients`` int64 user ids, meta ``k`` = cohort size);
2. every selected client draws ``negatives`` x |positives| negatives (uniform over the items it
   never interacted with; the held-out item is excluded too), and trains the global item rows
   of its local items (positives + negatives), its private user vector and the network for
   ``local_epochs`` epochs of Adam (lr ``lr``, paper 1e-3; batch ``batch_size``, BCE) -- all clients of a
   round batched together (:func:`privaudit.models.ncf.train_clients`);
3. it uploads through :meth:`Channel.send` (so ``secagg`` can mask and ``dp-sgd`` changes the
   training):

   ``item_update`` payload ``items`` (int64, the ids of the rows it updated = the observation
   vector P of §3.4 as a support set) and ``values`` (len(items) x Dtot: w_i (I^i - I_t) on
   those rows); meta ``n_rows`` = m.
   ``net_update`` payload ``delta`` (flat network weights, w'_i (N^i - N_t)) and
   ``n_instances`` (1,) float64, the local training instances n_i.

   Weights per ``aggregation``: ``mf-fedavg`` w = 1, w' = n_i; ``fedavg`` w = w' = n_i;
   ``simpleavg`` w = w' = 1;
4. the server sums with :meth:`Channel.sum` (``counts`` = per-item number of clients that
   updated the row, i.e. sum of the P vectors) and updates (|c| = clients whose uploads
   arrived, n = sum n_i):

   ``mf-fedavg`` (Algorithm 1): I[k] += sum values[k] / counts[k] where counts > 0;
   N += sum delta / n.   ``fedavg`` (eq. 1): I += sum values / n; N += sum delta / n.
   ``simpleavg``: I += sum values / |c|; N += sum delta / |c|.
   The per-item counts and cohort size are recorded as an ``aggregate`` message (server ->
   server: ``counts`` int64 (m,), meta ``k``), which is exactly what the server learns under
   secure aggregation.

Malicious server (``server``, default ``honest``; docs/malicious-server.md): after
``deviation_start`` regular rounds the server runs ``deviation_rounds`` rounds of its plan around
a ``target``: ``sybil`` -- the cohort is the target, ``sybils`` clients the server runs (they
upload zeros through the channel) and honest cover clients; ``inconsistent`` -- an honest
cohort in which every member but the target gets :meth:`FedNCF.crafted_model`; ``saturate`` --
an honest cohort (the target and others re-drawn every round) in which every member gets the
same :meth:`FedNCF.saturated_model` (item rows 0 or kept, ``predict.bias`` -``craft_bias``), so
that only positives' rows move (docs/active-manipulation.md); the server applies the item
aggregate to its own item table and keeps its network. The deviation is recorded on the round's
``state`` message (meta ``deviation``, ``target``, ``sybils``, ``crafted``; the payload stays the
server's own global model). Defenses with the ``download`` capability
(:mod:`privaudit.defenses.feature_bounds`) see each model a member receives (payload ``items``
and ``bias``) and may change it before the member trains.
Defenses with the ``round-check`` capability (:mod:`privaudit.defenses.consistency`) see each
member's received model and whether it is a verified (non-sybil) client before it uploads; an
aborted round uploads nothing (its ``aggregate`` has ``k`` 0 and meta ``aborted``).

Recorded rounds: ``record_rounds`` (first N aggregation rounds; -1 all) get the ``cohort``,
``state`` (server -> server: ``items`` (m x Dtot), ``network`` flat float64, the global model
sent that round), the uploads and the ``aggregate``. Private (``client:u`` -> itself, round 0):
``items`` (int64 sorted training positives), ``test_item`` (1,) int64.

Utility: HR@10 and NDCG@10 with the held-out item ranked against ``eval_negatives`` (100)
sampled non-interacted items (FedNCF paper §4.1), each user scored with its own user vector;
``hr_history`` in the model (one value per evaluation). With ``dp-sgd``: ``epsilon`` (largest
over clients, for the rounds each actually took part in), ``delta``.

Departures: clients upload the *change* of their rows and weights rather than the new weights
(averaging new weights of updated rows is the same as adding the mean change: identical
results, and small values suit secure aggregation's fixed-point encoding). Negatives are drawn
once per round and reused in both local epochs (the paper does not say; the observation
vector P is then the set of rows trained that round). The paper gives no batch size; 64 is
used (``batch_size``). Each client starts every round with a fresh Adam state (default;
``client_optimizer=persistent`` keeps each client's Adam moments and step count across rounds --
the paper does not say which; on ML-100K it made no difference to FedGMF's HR@10, while FedMLP
reaches the paper's HR@10 only with ``persistent``, docs/reproduction.md).
The paper does not give the initial scale of the user and item embeddings (only "Xavier" for the
network weights, §4.2): ``init_std`` (default 0.1) sets it. It decides whether FedGMF learns on
ML-100K: at the NCF reference code's 0.01 (and at Xavier's ~0.035 for these tables) HR@10 stalls
within a few global rounds, below the popularity ranker; at 0.1 it starts near 0.1 as in the
paper's Fig. 5 and reaches the paper's HR@10 after its 400 global rounds (docs/reproduction.md,
"Why FedGMF plateaued"). The authors' later federated recommender code (vperifan/FedPOIRec) draws
embeddings from N(0, (1/D)^2), 0.083 for D = 12, the same order. ``user_lr`` (default: ``lr``) is
a diagnostic key, not in the paper. Leave-one-out: a user's latest rating is held out; ties at the
latest timestamp (415 of ML-100K's 943 users) are broken at random (``loo_ties``; see
:func:`privaudit.data.leave_one_out` for why not by item id).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.data.splits import LOO_TIES
from privaudit.defenses.base import DOWNLOAD, LOCAL_TRAINING, ROUND_CHECK, Defense
from privaudit.errors import PrivauditError
from privaudit.metrics import hit_ratio_at_k, ndcg_at_k_loo
from privaudit.models import ncf
from privaudit.params import Param
from privaudit.protocols._fedncf_client import (
    ClientData,
    adam_slice,
    adam_store,
    init_adam,
    merge_uploads,
    model_bytes,
    training_instances,
    upload_payloads,
)
from privaudit.protocols.base import Protocol, RunResult, RunSetup, utility_specs_of
from privaudit.registry import register_protocol
from privaudit.results import UserUtility
from privaudit.schema import ITEMS, MessageSchema, PayloadField, ProtocolSchema

DERIVED_KEYS = ("n_items", "n_users", "defenses", "seed")
AGGREGATIONS = ("mf-fedavg", "fedavg", "simpleavg")
SERVER_PLANS = ("honest", "sybil", "inconsistent", "saturate")


#: FedNCF's independent random streams, in SeedSequence spawn order (``split`` was added last,
#: so the other five are those of earlier versions).
RNG_STREAMS = ("schedule", "init", "train", "channel", "eval", "split")


def rng_streams(seed: int) -> dict[str, np.random.Generator]:
    """Name -> generator of each stream of a run with ``seed`` (benchmarks reuse ``split`` and
    ``eval`` to hold out the same items and rank them against the same negatives)."""
    children = np.random.SeedSequence(seed).spawn(len(RNG_STREAMS))
    return {name: np.random.default_rng(c) for name, c in zip(RNG_STREAMS, children)}


def implicit_split(dataset: Any, rng: Any = 0, ties: str = "random") -> tuple[sp.csr_matrix, np.ndarray]:
    """Binarised leave-one-out split: (train positives CSR n x m, bool), test item per user (-1: none).

    ``rng``/``ties``: how ties at a user's latest timestamp are broken
    (:func:`privaudit.data.leave_one_out`)."""
    from privaudit.data import leave_one_out

    train, test = leave_one_out(dataset, rng, ties)
    pos = sp.csr_matrix(train.ratings, dtype=np.float64)
    pos.data = np.ones_like(pos.data)
    pos.eliminate_zeros()
    pos = pos.astype(bool).tocsr()
    pos.sort_indices()
    test = sp.csr_matrix(test)
    has = np.diff(test.indptr) > 0
    test_item = np.full(dataset.n_users, -1, dtype=np.int64)
    test_item[has] = test.indices[test.indptr[:-1][has]]
    return pos, test_item


def eval_candidates(
    pos: sp.csr_matrix, test_item: np.ndarray, n_items: int, n_neg: int, rng: np.random.Generator
) -> np.ndarray:
    """(n_eval_users, 1 + n_neg) candidate ids, column 0 the held-out item; rows of users with a test item."""
    users = np.flatnonzero(test_item >= 0)
    excl = _exclusion(pos, test_item, n_items)
    neg = ncf.sample_negatives(np.repeat(users, n_neg), excl, n_items, rng).reshape(len(users), n_neg)
    return users, np.concatenate([test_item[users, None], neg], axis=1)


def _exclusion(pos: sp.csr_matrix, test_item: np.ndarray, n_items: int) -> sp.csr_matrix:
    n = pos.shape[0]
    has = test_item >= 0
    t = sp.csr_matrix((np.ones(int(has.sum()), dtype=bool), (np.flatnonzero(has), test_item[has])), shape=(n, n_items))
    out = (pos + t).astype(bool).tocsr()
    out.sort_indices()
    return out


def ncf_utility(
    arch: str,
    D: int,
    layers: Sequence[int],
    model: Mapping[str, Any],
    users: np.ndarray,
    cand: np.ndarray,
    k: int,
    per_user: dict[str, UserUtility] | None = None,
) -> dict[str, float]:
    """HR@k and NDCG@k of the leave-one-out candidates (target in column 0); ``per_user``
    receives each evaluated user's hit and NDCG gain (in the order of ``users``)."""
    if len(users) == 0:
        return {f"hr@{k}": float("nan"), f"ndcg@{k}": float("nan")}
    scores = np.concatenate(
        [
            ncf.score(
                arch, D, layers, model["net"], model["users"][users[s : s + 4096]], model["items"], cand[s : s + 4096]
            )
            for s in range(0, len(users), 4096)
        ]
    )
    target = np.zeros(len(users), dtype=np.int64)
    hr, hits = hit_ratio_at_k(scores, target, k, by_user=True)
    ndcg, gains = ndcg_at_k_loo(scores, target, k, by_user=True)
    if per_user is not None:
        per_user.update({f"hr@{k}": UserUtility.means(hits), f"ndcg@{k}": UserUtility.means(gains)})
    return {f"hr@{k}": hr, f"ndcg@{k}": ndcg}


#: The messages a transcript of this protocol holds (checked before any attack reads one).
SCHEMA = ProtocolSchema(
    config_keys=("D", "model", "layers", "n_items", "n_users", "aggregation", "selection"),
    dims={"m": "n_items", "n": "n_users"},
    messages=(
        MessageSchema(
            "private",
            "client",
            "self",
            (
                PayloadField("items", "int", ("@r",), ids="m", unique=True),
                PayloadField("test_item", "int", (1,), ids="m"),
            ),
        ),
        MessageSchema("cohort", "server", "self", (PayloadField("clients", "int", ("@k",), ids="n", unique=True),)),
        MessageSchema(
            "state",
            "server",
            "self",
            (PayloadField("items", "float", ("m", "D_total")), PayloadField("network", "float", ("n_weights",))),
        ),
        MessageSchema(
            "item_update",
            "client",
            "server",
            (ITEMS, PayloadField("values", "float", ("@r", "D_total"))),
            upload=True,
            required=True,
        ),
        MessageSchema(
            "net_update",
            "client",
            "server",
            (PayloadField("delta", "float", ("n_weights",)), PayloadField("n_instances", "float", (1,))),
            upload=True,
        ),
        MessageSchema("aggregate", "server", "self", (PayloadField("counts", "int", ("m",)),)),
    ),
)


@register_protocol("fedncf")
class FedNCF(Protocol):
    """Federated GMF / MLP / NeuMF with MF-FedAvg, FedAvg or SimpleAvg (module docstring)."""

    description = "Federated neural collaborative filtering (FedNCF, FedNCF paper): GMF/MLP/NeuMF, MF-FedAvg"
    schema = SCHEMA  # declared message kinds, checked before any attack
    utility_specs = utility_specs_of("hr@10", "ndcg@10")
    default_attack = "ncf-update-leak"
    requires_extras = ("ncf",)  # torch (errors.check_extras)
    main_utility = "hr@10"  # the paper's headline metric (Tables 5, 6)
    derived_keys = DERIVED_KEYS
    parameters = (
        Param("model", "gmf", "gmf, mlp or neumf", choices=ncf.ARCHS),
        Param("D", 12, "latent dimension of the embeddings", ge=1),
        Param("layers", [48, 24, 12, 6], "MLP hidden layer sizes (input 2D)", ge=1),
        Param("negatives", 4, "sampled negatives per positive (the blurring of §3.5.2)", ge=0),
        Param(
            "lr",
            0.01,
            "client Adam learning rate (paper: 0.001 over 400 global rounds; the default 0.01 "
            "reaches HR@10 within 3 % of that on the synthetic data in 5)",
            gt=0,
        ),
        Param(
            "user_lr",
            -1.0,
            "Adam learning rate of the private user vectors (-1: same as lr; diagnostic, not in the paper)",
            gt=0,
            also=(-1.0,),
        ),
        Param("local_epochs", 2, "local epochs per round", ge=1),
        Param(
            "init_std",
            0.1,
            "standard deviation of the N(0, s^2) initial user and item embeddings (0.01 learns faster in the first "
            "rounds but stalls at HR@10 ~0.36 on ML-100K)",
            gt=0,
        ),
        Param("batch_size", 64, "local mini-batch size (the paper gives none)", ge=1),
        Param(
            "client_optimizer",
            "fresh",
            "fresh (new Adam state every round) or persistent (each client keeps its Adam moments and step count "
            "across rounds)",
            choices=("fresh", "persistent"),
        ),
        Param(
            "aggregation",
            "mf-fedavg",
            "mf-fedavg (per-item averaging), fedavg (eq. 1) or simpleavg",
            choices=AGGREGATIONS,
        ),
        Param("clients_per_round", 20, "cohort size |c| of an aggregation round", ge=1),
        Param(
            "global_rounds",
            5,
            "passes over all clients (the paper's 'epochs', 400 at lr 0.001; the default 5 at lr 0.01 "
            "beats popularity on the synthetic data; ML-100K needs hundreds)",
            ge=0,
        ),
        Param("max_rounds", -1, "stop after this many aggregation rounds (-1: no limit)", ge=0, also=(-1,)),
        Param(
            "selection",
            "random",
            "random or adversarial (same cohort with and without the target, §3.5.2)",
            choices=("random", "adversarial"),
        ),
        Param("target", -1, "adversarial: the target user id (-1: a random client)", ge=0, also=(-1,)),
        Param("manipulated_rounds", 4, "adversarial: R pairs of rounds (cohort with / without the target)", ge=0),
        Param(
            "record_rounds",
            50,
            "record cohorts, global model, uploads and aggregates of the first N rounds (-1: all)",
            ge=0,
            also=(-1,),
        ),
        Param("eval_every", 0, "evaluate HR/NDCG every N global rounds (0: only at the end)", ge=0),
        Param("eval_negatives", 100, "sampled negatives ranked against each held-out item", ge=1),
        Param(
            "loo_ties",
            "random",
            "held-out item among ratings tied at a user's latest timestamp: random (seeded) or highest (item index)",
            choices=LOO_TIES,
        ),
        Param("top_k", 10, "K of HR@K and NDCG@K", ge=1),
        Param(
            "server",
            "honest",
            "honest, or a malicious server's plan for the first deviation_rounds rounds: sybil (the target's "
            "cohort filled with sybils uploading zeros), inconsistent (the other members get a crafted model) or "
            "saturate (every member gets a model whose scores are saturated at 0: negatives' rows stay still)",
            choices=SERVER_PLANS,
        ),
        Param("deviation_rounds", 4, "malicious server: rounds it deviates in", ge=1),
        Param(
            "deviation_start",
            0,
            "malicious server: regular aggregation rounds before the deviation rounds (record_rounds must cover them)",
            ge=0,
        ),
        Param(
            "sybils",
            -1,
            "server=sybil: sybil clients per cohort (-1: clients_per_round - 1, or clients_per_round - min_clients "
            "under verified-cohort)",
            ge=0,
            also=(-1,),
        ),
        Param(
            "craft_items",
            "zero",
            "server=saturate: the item rows sent, zero (every row 0) or keep (the global rows)",
            choices=("zero", "keep"),
        ),
        Param("craft_bias", 50.0, "server=saturate: the prediction bias sent is -craft_bias", gt=0),
        Param(
            "craft_via",
            "bias",
            "server=saturate: where the logit is saturated: bias (predict.bias -craft_bias) or mlp-unit (one "
            "last-layer MLP unit with weights 0, bias +craft_bias and output weight -1; predict.bias untouched; "
            "mlp and neumf only)",
            choices=("bias", "mlp-unit"),
        ),
    )

    @classmethod
    def validate_config(cls, config: dict[str, Any]) -> None:
        if config["selection"] == "adversarial" and config["clients_per_round"] < 2:
            cls.config_fail("adversarial selection needs clients_per_round >= 2")
        if config["server"] != "honest":
            if config["selection"] == "adversarial":
                cls.config_fail("a malicious server plan (server) and selection=adversarial exclude each other")
            if config["clients_per_round"] < 2:
                cls.config_fail(f"server={config['server']} needs clients_per_round >= 2")
            if config["sybils"] > config["clients_per_round"] - 1:
                cls.config_fail(f"sybils must be at most clients_per_round - 1 = {config['clients_per_round'] - 1}")
            if config["server"] == "saturate" and config["craft_via"] == "mlp-unit" and config["model"] == "gmf":
                cls.config_fail("craft_via=mlp-unit needs an MLP tower (model mlp or neumf)")

    @staticmethod
    def deviation_budget(config: Mapping[str, Any], n_users: int | None) -> int | None:
        """The most rounds a malicious server can deviate in: the run's aggregation rounds
        (``global_rounds`` passes, at least one, of ceil(n_users / clients_per_round) cohorts;
        ``max_rounds`` caps it). None without the number of users."""
        if not n_users:
            return None
        c = max(1, min(int(config["clients_per_round"]), int(n_users)))
        rounds = max(1, int(config["global_rounds"])) * -(-int(n_users) // c)
        return min(rounds, int(config["max_rounds"])) if int(config["max_rounds"]) > 0 else rounds

    # ------------------------------------------------------------------ schedule
    @staticmethod
    def schedule(
        cfg: Mapping[str, Any], eligible: np.ndarray, rng: np.random.Generator
    ) -> tuple[list[np.ndarray], int]:
        """Cohorts of every aggregation round (list of sorted int64 user ids) and the target (-1 if none)."""
        c = min(cfg["clients_per_round"], len(eligible))
        cohorts: list[np.ndarray] = []
        target = -1
        if cfg["selection"] == "adversarial":
            target = int(cfg["target"]) if cfg["target"] >= 0 else int(rng.choice(eligible))
            if target not in set(eligible.tolist()):
                raise PrivauditError(f"protocol 'fedncf': target {target} is not a client with training data")
            others = eligible[eligible != target]
            group = np.sort(rng.choice(others, size=min(c - 1, len(others)), replace=False)).astype(np.int64)
            for _ in range(cfg["manipulated_rounds"]):
                cohorts.append(np.sort(np.append(group, target)).astype(np.int64))
                cohorts.append(group.copy())
        for _ in range(cfg["global_rounds"]):
            perm = rng.permutation(eligible)
            cohorts.extend(np.sort(perm[s : s + c]).astype(np.int64) for s in range(0, len(perm), c))
        if cfg["max_rounds"] >= 0:
            cohorts = cohorts[: cfg["max_rounds"]]
        return cohorts, target

    @staticmethod
    def deviation_plan(
        cfg: Mapping[str, Any], eligible: np.ndarray, rng: np.random.Generator, verified: int = 0
    ) -> dict[str, Any]:
        """A malicious server's rounds (``server`` sybil or inconsistent; run after
        ``deviation_start`` regular rounds): ``cohorts`` (one sorted
        int64 array per deviation round, the target in each), ``target`` and ``sybils`` (int64 ids
        of the clients the server runs; empty for inconsistent). Sybil: a fixed set of ``sybils``
        clients (-1: clients_per_round - 1) plus honest cover clients re-drawn every round to fill
        the cohort; inconsistent: the target and clients_per_round - 1 others re-drawn every round.
        ``verified``: the public minimum of verified members a round needs (``verified-cohort``
        min_clients): with ``sybils`` -1 the adaptive server runs clients_per_round - ``verified``
        sybils, so that its rounds are not aborted."""
        c = min(cfg["clients_per_round"], len(eligible))
        target = int(cfg["target"]) if cfg["target"] >= 0 else int(rng.choice(eligible))
        if target not in set(eligible.tolist()):
            raise PrivauditError(f"protocol 'fedncf': target {target} is not a client with training data")
        others = eligible[eligible != target]
        n_syb = 0
        if cfg["server"] == "sybil":
            n_syb = min(c - max(1, verified) if cfg["sybils"] < 0 else int(cfg["sybils"]), len(others))
        sybils = np.sort(rng.choice(others, size=n_syb, replace=False)).astype(np.int64)
        honest = others[~np.isin(others, sybils)]
        cohorts = []
        for _ in range(cfg["deviation_rounds"]):
            cover = rng.choice(honest, size=min(c - 1 - n_syb, len(honest)), replace=False)
            cohorts.append(np.sort(np.concatenate([[target], sybils, cover])).astype(np.int64))
        return {"cohorts": cohorts, "target": target, "sybils": sybils}

    @staticmethod
    def crafted_model(
        items: np.ndarray, net: dict[str, np.ndarray], arch: str
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The model an inconsistent server sends every cohort member but the target: item rows 0,
        ``predict.weight`` 0 and every MLP ReLU dead (weights 0, bias -1). The loss gradient of the
        item rows, the user vector and every weight but ``predict.bias`` is then exactly 0 at every
        local step (a fixed point of Adam), so these clients' item updates vanish (the CCS 2022
        model-inconsistency idea)."""
        out = {k: np.array(v, copy=True) for k, v in net.items()}
        for k in out:
            if k.endswith(".weight"):
                out[k][...] = 0.0
            elif k.startswith("mlp.") and k.endswith(".bias"):
                out[k][...] = -1.0
        return np.zeros_like(items), out

    @staticmethod
    def saturated_model(
        items: np.ndarray,
        net: dict[str, np.ndarray],
        craft_items: str,
        bias: float,
        via: str = "bias",
        arch: str = "gmf",
        D: int = 0,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The model a ``saturate`` server sends every cohort member: item rows 0 (``craft_items``
        zero) or the global ones (keep), and ``predict.bias`` = -``bias``. Every score is then
        about -bias, sigmoid(score) ~ 0: a sampled negative's BCE gradient (sigmoid(s) - 0) ds/dq
        is ~e^-bias, far below Adam's epsilon, so its row stays (all but) still, while a
        positive's, (sigmoid(s) - 1) ds/dq ~ -ds/dq, moves its row a full Adam step.

        ``via`` mlp-unit (models mlp and neumf): ``predict.bias`` is left as it is and the last
        MLP layer's unit 0 gets incoming weights 0 and bias +``bias``, its output weight -1, so
        the unit outputs ``bias`` on every input and the score is shifted by -``bias`` through a
        parameter a bound on ``predict.bias`` does not see."""
        out = {k: np.array(v, copy=True) for k, v in net.items()}
        if via == "mlp-unit":
            last = max(int(k.split(".")[1]) for k in out if k.startswith("mlp."))
            out[f"mlp.{last}.weight"][0, :] = 0.0
            out[f"mlp.{last}.bias"][0] = float(bias)
            out["predict.weight"][D if arch == "neumf" else 0] = -1.0
        else:
            out["predict.bias"][...] = -float(bias)
        return (np.zeros_like(items) if craft_items == "zero" else np.array(items, copy=True)), out

    # ------------------------------------------------------------------ run
    def run(
        self,
        dataset: Any,
        config: Mapping[str, Any] | None = None,
        defenses: Sequence[Defense] = (),
        rng: np.random.Generator | int | None = None,
    ) -> RunResult:
        """Train FedNCF on ``dataset`` (ratings binarised) and return transcript, model, utility.

        ``model``: ``items`` (m x Dtot), ``net`` (dict of arrays), ``users`` (n x Dtot, the clients'
        vectors), ``hr_history`` / ``ndcg_history`` (per evaluation), ``rounds``.
        """
        ncf.require_torch()
        with ncf.single_thread():
            return super().run(dataset, config, defenses, rng)

    def __init__(self, user_vectors: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """``user_vectors``: (user ids, (len, Dtot) initial vectors) of clients whose private user
        vector starts at a chosen value (a canary audit's crafted clients, :mod:`privaudit.canary`;
        DP-SGD's guarantee holds for any initial state); None: every client's is drawn as usual."""
        self.user_vectors = user_vectors

    @classmethod
    def release_count(cls, config: Mapping[str, Any]) -> int | None:
        """The most aggregation rounds one client can take part in: one per global round (the
        cohorts of a global round partition the clients), two per manipulated round pair under
        adversarial selection, one per deviation round of a malicious server; at most
        ``max_rounds`` when set. None when the config lacks these keys."""
        try:
            count = int(config["global_rounds"])
            if config.get("selection", "random") == "adversarial":
                count += 2 * int(config["manipulated_rounds"])
            if config.get("server", "honest") != "honest":
                count += int(config["deviation_rounds"])
            limit = int(config.get("max_rounds", -1))
        except (KeyError, TypeError, ValueError):
            return None
        return min(count, limit) if limit >= 0 else count

    def simulate(self, setup: RunSetup) -> RunResult:
        """The run's steps under :meth:`run` (torch present, one thread)."""
        run = self._prepare(setup)
        for r, cohort in enumerate(run.cohorts):
            self._round(run, r, cohort)
        return self._finish(run)

    # ------------------------------------------------------------------ the run's parts
    def _prepare(self, setup: RunSetup) -> _Run:
        """Split, schedule (with the server's plan), transcript, initial model of one run."""
        cfg, dataset, defenses, seed = setup.config, setup.dataset, setup.defenses, setup.seed
        sched_rng, init_rng, train_rng, channel_rng, eval_rng, split_rng = rng_streams(seed).values()
        arch, D, layers = cfg["model"], cfg["D"], list(cfg["layers"])
        Dt = ncf.item_dim(arch, D)
        n, m = dataset.n_users, dataset.n_items
        pos, test_item = implicit_split(dataset, split_rng, cfg["loo_ties"])
        excl = _exclusion(pos, test_item, m)
        n_pos = np.diff(pos.indptr)
        eligible = np.flatnonzero(n_pos > 0).astype(np.int64)
        if len(eligible) == 0:
            raise PrivauditError("protocol 'fedncf': no user has a training interaction after the leave-one-out split")
        eval_users, cand = eval_candidates(pos, test_item, m, cfg["eval_negatives"], eval_rng)
        cohorts, target = self.schedule(cfg, eligible, sched_rng)
        plan, start = None, 0
        if cfg["server"] != "honest":
            verified = max(
                (int(getattr(d, "min_clients", 0)) for d in defenses if ROUND_CHECK in d.capabilities), default=0
            )
            plan = self.deviation_plan(cfg, eligible, sched_rng, verified)
            start = min(cfg["deviation_start"], len(cohorts))
            cohorts = cohorts[:start] + plan["cohorts"] + cohorts[start:]
            cohorts = cohorts[: cfg["max_rounds"]] if cfg["max_rounds"] >= 0 else cohorts
            target = plan["target"]
        dp_defenses = [d for d in defenses if LOCAL_TRAINING in d.capabilities]
        if len(dp_defenses) > 1:
            raise PrivauditError("protocol 'fedncf': at most one local-training defense (dp-sgd)")
        parties = ["server"] + [f"client:{u}" for u in range(n)]
        private = {
            f"client:{u}": {
                "items": pos.indices[pos.indptr[u] : pos.indptr[u + 1]].astype(np.int64),
                "test_item": np.array([test_item[u]], dtype=np.int64),
            }
            for u in range(n)
        }
        transcript, channel = self.start(
            setup, parties, private, channel_rng, n_items=m, n_users=n, target=target, seed=seed
        )
        net = ncf.init_network(arch, D, layers, init_rng)
        items = ncf.init_embeddings(m, Dt, init_rng, cfg["init_std"])
        users = ncf.init_embeddings(n, Dt, init_rng, cfg["init_std"])
        if self.user_vectors is not None:  # a canary audit's crafted clients (privaudit.canary); else None
            users[np.asarray(self.user_vectors[0])] = np.asarray(self.user_vectors[1], dtype=np.float32)
        per_global = max(1, -(-len(eligible) // min(cfg["clients_per_round"], len(eligible))))
        return _Run(
            cfg=cfg,
            data=ClientData(pos, excl, n_pos, m),
            cohorts=cohorts,
            target=target,
            plan=plan,
            start=start,
            guards=[d for d in defenses if ROUND_CHECK in d.capabilities],
            bounds=[d for d in defenses if DOWNLOAD in d.capabilities],
            dp=dp_defenses[0] if dp_defenses else None,
            transcript=transcript,
            channel=channel,
            net=net,
            items=items,
            users=users,
            adam=init_adam(n, m, Dt, net) if cfg["client_optimizer"] == "persistent" else None,
            train_rng=train_rng,
            eval_users=eval_users,
            cand=cand,
            per_global=per_global,
            offset=2 * cfg["manipulated_rounds"] if cfg["selection"] == "adversarial" else 0,
            participation=np.zeros(n, dtype=np.int64),
            craft_bias=self._craft_bias(cfg, defenses),
        )

    @staticmethod
    def _craft_bias(cfg: Mapping[str, Any], defenses: Sequence[Defense]) -> float:
        """The saturation a ``saturate`` server crafts: ``craft_bias``, or just below the public
        ``max_score`` of a ``download`` defense (feature-bounds), which would refuse more (the
        adaptive server stays inside the bound it knows)."""
        bounds = [float(getattr(d, "max_score", -1.0)) for d in defenses if DOWNLOAD in d.capabilities]
        bounds = [b for b in bounds if b > 0]
        return min([float(cfg["craft_bias"])] + [0.9 * b for b in bounds])

    def _round(self, run: _Run, r: int, cohort: np.ndarray) -> None:
        """One aggregation round: the models sent, the members' checks, uploads, aggregate, update."""
        cfg = run.cfg
        record = cfg["record_rounds"] < 0 or r < cfg["record_rounds"]
        net_flat = ncf.flatten_network(run.net, *run.arch)
        deviation = run.plan is not None and run.start <= r < run.start + len(run.plan["cohorts"])
        sybils = run.plan["sybils"] if deviation else np.zeros(0, dtype=np.int64)
        is_sybil = np.isin(cohort, sybils)
        plan = cfg["server"] if deviation else "honest"
        crafted = None
        if plan == "inconsistent":
            crafted = self.crafted_model(run.items, run.net, cfg["model"])
        elif plan == "saturate":
            crafted = self.saturated_model(
                run.items, run.net, cfg["craft_items"], run.craft_bias, cfg["craft_via"], cfg["model"], cfg["D"]
            )
        if record:
            self._record_start(run, r, cohort, plan, is_sybil, net_flat)
        abort = self._check_round(run, r, cohort, plan, crafted, is_sybil, net_flat) if run.guards else None
        t0 = time.perf_counter()
        try:
            uploads = None if abort else self._uploads(run, cohort, plan, crafted, is_sybil, net_flat)
        except _Refused as exc:  # a member refused the model it received (feature-bounds max_score)
            abort = str(exc)
        run.t_train += time.perf_counter() - t0
        if abort:
            if record:
                zero = np.zeros(run.data.m, dtype=np.int64)
                run.transcript.add(r, "server", "server", "aggregate", {"counts": zero}, {"k": 0, "aborted": abort})
            return
        run.participation[cohort] += 1
        senders = [f"client:{u}" for u in cohort]
        m = run.data.m
        b_items = run.channel.send(
            r, "item_update", senders, uploads["item_payloads"], record=record, meta={"n_rows": m}
        )
        b_net = run.channel.send(r, "net_update", senders, uploads["net_payloads"], record=record)
        s_items = run.channel.sum(b_items, rows=m)
        s_net = run.channel.sum(b_net)
        counts = np.asarray(s_items["counts"], dtype=np.int64)
        kk = len(b_items.senders)
        if record:
            run.transcript.add(r, "server", "server", "aggregate", {"counts": counts}, {"k": int(kk)})
        if kk == 0:
            return
        self._apply_aggregate(run, s_items, s_net, counts, kk, net_flat, keep_network=plan == "saturate")
        done = r + 1 - run.offset  # regular rounds done (neither adversarial nor deviation rounds)
        if run.plan is not None:
            done -= min(max(r + 1 - run.start, 0), len(run.plan["cohorts"]))
        if deviation:
            return
        if cfg["eval_every"] > 0 and done > 0 and done % (run.per_global * cfg["eval_every"]) == 0:
            util = ncf_utility(*run.arch, {"net": run.net, "users": run.users, "items": run.items}, *run.eval_set)
            run.hr_hist.append(util[f"hr@{cfg['top_k']}"])
            run.ndcg_hist.append(util[f"ndcg@{cfg['top_k']}"])

    @staticmethod
    def _record_start(run: _Run, r: int, cohort: np.ndarray, plan: str, is_sybil: np.ndarray, net_flat) -> None:
        """The round's ``cohort`` and ``state`` messages (the server's record of a deviation on ``state``)."""
        run.transcript.add(r, "server", "server", "cohort", {"clients": cohort}, {"k": int(len(cohort))})
        state_meta = None
        if plan != "honest":  # the server's own record of its deviation
            state_meta = {"deviation": plan, "target": run.target, "sybils": cohort[is_sybil].tolist()}
            if plan == "inconsistent":
                state_meta["crafted"] = "item rows 0, predict.weight 0, dead ReLUs: sent to all but the target"
            elif plan == "saturate":
                via = (
                    f"MLP unit 0 of the last layer: weights 0, bias +{run.craft_bias:g}, output weight -1"
                    if run.cfg["craft_via"] == "mlp-unit"
                    else f"predict.bias -{run.craft_bias:g}"
                )
                state_meta["crafted"] = (
                    f"item rows {'0' if run.cfg['craft_items'] == 'zero' else 'kept'}, {via}: sent to every member"
                )
        state = {"items": run.items.astype(np.float64), "network": net_flat}
        run.transcript.add(r, "server", "server", "state", state, state_meta)

    @staticmethod
    def _check_round(run, r, cohort, plan, crafted, is_sybil, net_flat) -> str | None:
        """The first abort reason of the ``round-check`` defenses (each member's received model)."""
        sent = model_bytes(run.items, net_flat)
        received = [sent] * len(cohort)
        if crafted is not None:
            other = model_bytes(crafted[0], ncf.flatten_network(crafted[1], *run.arch))
            received = (
                [sent if u == run.target else other for u in cohort]
                if plan == "inconsistent"
                else [other] * len(cohort)
            )
        abort = None
        for d in run.guards:
            abort = abort or d.abort_reason(r, [f"client:{u}" for u in cohort], received, ~is_sybil)
        return abort

    def _uploads(self, run, cohort, plan, crafted, is_sybil, net_flat) -> dict[str, list]:
        """The plaintext uploads of every member, in cohort order (sybils upload zeros)."""
        if plan == "inconsistent":  # the target trains the true model, the others the crafted one
            mine = cohort == run.target
            up_t = self._local_round(run, cohort[mine], *self._received(run, run.items, run.net))
            up_o = self._local_round(run, cohort[~mine], *self._received(run, *crafted))
            return merge_uploads(mine, up_t, up_o)
        if is_sybil.any():  # sybils upload zeros (no rows, zero weights, no instances)
            up_h = self._local_round(run, cohort[~is_sybil], *self._received(run, run.items, run.net))
            zero = {
                "item_payloads": [{"items": np.zeros(0, dtype=np.int64), "values": np.zeros((0, run.items.shape[1]))}],
                "net_payloads": [{"delta": np.zeros_like(net_flat), "n_instances": np.zeros(1)}],
            }
            zeros = {k: v * int(is_sybil.sum()) for k, v in zero.items()}
            return merge_uploads(~is_sybil, up_h, zeros)
        sent = crafted if plan == "saturate" else (run.items, run.net)
        return self._local_round(run, cohort, *self._received(run, *sent))

    @staticmethod
    def _received(run: _Run, items: np.ndarray, net: dict[str, np.ndarray]) -> tuple[np.ndarray, dict]:
        """The model a member trains on: the one sent, through every ``download`` defense
        (:mod:`privaudit.defenses.feature_bounds`) as payload ``items`` (m x Dtot) and ``bias`` (1,)."""
        if not run.bounds:
            return items, net
        got = run.channel.download({"items": items, "bias": np.asarray(net["predict.bias"])})
        net = {**net, "predict.bias": np.asarray(got["bias"], dtype=net["predict.bias"].dtype)}
        return np.asarray(got["items"], dtype=items.dtype), net

    @staticmethod
    def _apply_aggregate(run, s_items, s_net, counts, kk, net_flat, keep_network=False) -> None:
        """The server's update of the global item table and network by ``aggregation`` (module
        docstring); ``keep_network``: the network's aggregate is dropped (a saturation round's)."""
        vals = np.asarray(s_items["values"], dtype=np.float64)
        n_total = float(np.asarray(s_net["n_instances"]).ravel()[0])
        agg = run.cfg["aggregation"]
        if agg == "mf-fedavg":
            upd = counts > 0
            run.items[upd] += (vals[upd] / counts[upd, None]).astype(np.float32)
            net_flat = net_flat + np.asarray(s_net["delta"]) / max(n_total, 1.0)
        elif agg == "fedavg":
            run.items += (vals / max(n_total, 1.0)).astype(np.float32)
            net_flat = net_flat + np.asarray(s_net["delta"]) / max(n_total, 1.0)
        else:
            run.items += (vals / kk).astype(np.float32)
            net_flat = net_flat + np.asarray(s_net["delta"]) / kk
        if not keep_network:
            run.net = ncf.unflatten_network(net_flat, *run.arch)

    def _finish(self, run: _Run) -> RunResult:
        """Model, final utility (and DP-SGD's epsilon) of the run."""
        cfg = run.cfg
        model = {
            "items": run.items,
            "net": run.net,
            "users": run.users,
            "hr_history": run.hr_hist,
            "ndcg_history": run.ndcg_hist,
            "rounds": len(run.cohorts),
        }
        per_user: dict[str, UserUtility] = {}
        utility = ncf_utility(*run.arch, model, *run.eval_set, per_user=per_user)
        utility["rounds"] = float(len(run.cohorts))
        utility["train_seconds_per_round"] = run.t_train / max(len(run.cohorts), 1)
        if run.dp is not None:
            d = run.data
            run.dp.account(d.n_pos, run.participation, cfg["batch_size"], cfg["local_epochs"], cfg["negatives"])
            spent = run.dp.spent_by_clients()
            utility["epsilon"] = spent["epsilon"]
            utility["delta"] = spent["delta"]
        return RunResult(run.transcript, model, utility, per_user)

    # ------------------------------------------------------------------ one round of local work
    @staticmethod
    def _check_scores(run: _Run, cohort: np.ndarray, local: list, items: np.ndarray, net: dict) -> None:
        """Each member's scores of the rows it is about to train (its positives and sampled
        negatives) under the model it received, checked by every ``download`` defense with a
        ``refuse_scores`` (feature-bounds ``max_score``); a refusal aborts the round (:class:`_Refused`).
        Reads no randomness: a run whose scores stay within the bound is unchanged."""
        checks = [c for c in (getattr(d, "refuse_scores", None) for d in run.bounds) if c is not None]
        if not checks or len(cohort) == 0:
            return
        L = max(len(x) for x in local)
        cand = np.stack([np.pad(np.asarray(x, dtype=np.int64), (0, L - len(x)), mode="edge") for x in local])
        scores = ncf.score(*run.arch, net, run.users[cohort], items, cand)
        for check in checks:
            why = check(scores)
            if why:
                raise _Refused(why)

    def _local_round(self, run: _Run, cohort: np.ndarray, items: np.ndarray, net: dict[str, np.ndarray]) -> dict:
        """Negative sampling, batched local training and the plaintext uploads of one cohort
        trained on ``items`` and ``net``.

        Updates ``run.users`` (the clients' private vectors) and ``run.adam`` (persistent
        per-client Adam state, or None) in place.
        """
        cfg, rng, dp = run.cfg, run.train_rng, run.dp
        local, inst_items, n_inst, npos = training_instances(cfg, cohort, run.data, dp is not None, rng)
        C, Dt = len(cohort), items.shape[1]
        L, N = max(len(x) for x in local), int(n_inst.max())
        item_rows = np.zeros((C, L, Dt), dtype=np.float32)
        inst_item = np.zeros((C, N), dtype=np.int64)
        inst_label = np.zeros((C, N), dtype=np.float32)
        for c in range(C):  # O(C) bookkeeping per round, not per step
            item_rows[c, : len(local[c])] = items[local[c]]
            inst_item[c, : n_inst[c]] = np.searchsorted(local[c], inst_items[c])
            inst_label[c, : npos[c]] = 1.0
        self._check_scores(run, cohort, local, items, net)
        state = adam_slice(run.adam, cohort, local, L, Dt) if run.adam is not None else None
        index, valid = ncf.make_batches(n_inst, cfg["local_epochs"], cfg["batch_size"], rng)
        local_dp = dp.local_training() if dp is not None else None
        settings = ncf.LocalTrainingSettings(
            lr=cfg["lr"],
            user_lr=float(cfg["user_lr"]) if cfg["user_lr"] > 0 else None,
            dp=(local_dp.noise_multiplier, local_dp.clip) if local_dp is not None else None,
            noise_seed=int(rng.integers(2**63)),
        )
        lens = np.array([len(x) for x in local])
        data = ncf.CohortData(item_rows, run.users[cohort], inst_item, inst_label, n_inst, index, valid, lens, state)
        arch, D, layers = run.arch
        out = ncf.train_cohort(ncf.Architecture(arch, D, tuple(layers)), net, data, settings)
        run.users[cohort] = out["users"]
        if run.adam is not None:
            adam_store(run.adam, out["adam_state"], cohort, local)
        return upload_payloads(cfg, run.arch, local, n_inst, item_rows, out, ncf.flatten_network(net, *run.arch))


class _Refused(Exception):
    """A member refused the model it received (a ``download`` defense's ``refuse_scores``): the round aborts."""


@dataclasses.dataclass
class _Run:
    """The state of one FedNCF run that its rounds update (:meth:`FedNCF.simulate`)."""

    cfg: Mapping[str, Any]
    data: ClientData
    cohorts: list[np.ndarray]
    target: int
    plan: dict[str, Any] | None  # FedNCF.deviation_plan, or None for an honest server
    start: int  # the first deviation round
    guards: list[Defense]  # round-check defenses
    bounds: list[Defense]  # download defenses
    dp: Any
    transcript: Any
    channel: Any
    net: dict[str, np.ndarray]
    items: np.ndarray
    users: np.ndarray
    adam: dict[str, Any] | None  # persistent per-client Adam state
    train_rng: np.random.Generator
    eval_users: np.ndarray
    cand: np.ndarray
    per_global: int  # aggregation rounds per global round
    offset: int  # adversarial-selection rounds before the regular ones
    participation: np.ndarray  # rounds each client took part in
    craft_bias: float = 0.0  # the saturation a saturate server sends (below a public max_score)
    hr_hist: list[float] = dataclasses.field(default_factory=list)
    ndcg_hist: list[float] = dataclasses.field(default_factory=list)
    t_train: float = 0.0

    @property
    def arch(self) -> tuple[str, int, list[int]]:
        return self.cfg["model"], self.cfg["D"], list(self.cfg["layers"])

    @property
    def eval_set(self) -> tuple[np.ndarray, np.ndarray, int]:
        return self.eval_users, self.cand, self.cfg["top_k"]

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
cohort in which every member but the target gets :meth:`FedNCF.crafted_model`. The deviation
is recorded on the round's ``state`` message (meta ``deviation``, ``target``, ``sybils``).
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

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit import schema as transcript_schema
from privaudit.data.splits import LOO_TIES
from privaudit.defenses.base import LOCAL_TRAINING, ROUND_CHECK, Defense
from privaudit.errors import PrivauditError
from privaudit.metrics import hit_ratio_at_k, ndcg_at_k_loo
from privaudit.models import ncf
from privaudit.params import Param
from privaudit.protocols.base import Protocol, RunResult, RunSetup
from privaudit.registry import register_protocol

DERIVED_KEYS = ("n_items", "n_users", "defenses", "seed")
AGGREGATIONS = ("mf-fedavg", "fedavg", "simpleavg")
SERVER_PLANS = ("honest", "sybil", "inconsistent")


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
    arch: str, D: int, layers: Sequence[int], model: Mapping[str, Any], users: np.ndarray, cand: np.ndarray, k: int
) -> dict[str, float]:
    """HR@k and NDCG@k of the leave-one-out candidates (target in column 0)."""
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
    return {f"hr@{k}": hit_ratio_at_k(scores, target, k), f"ndcg@{k}": ndcg_at_k_loo(scores, target, k)}


@register_protocol("fedncf")
class FedNCF(Protocol):
    """Federated GMF / MLP / NeuMF with MF-FedAvg, FedAvg or SimpleAvg (module docstring)."""

    description = "Federated neural collaborative filtering (FedNCF, FedNCF paper): GMF/MLP/NeuMF, MF-FedAvg"
    schema = transcript_schema.FEDNCF  # declared message kinds, checked before any attack
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
            "cohort filled with sybils uploading zeros) or inconsistent (the other members get a crafted model)",
            choices=SERVER_PLANS,
        ),
        Param("deviation_rounds", 4, "malicious server: rounds it deviates in", ge=1),
        Param(
            "deviation_start",
            0,
            "malicious server: regular aggregation rounds before the deviation rounds (record_rounds must cover them)",
            ge=0,
        ),
        Param("sybils", -1, "server=sybil: sybil clients per cohort (-1: clients_per_round - 1)", ge=0, also=(-1,)),
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
    def deviation_plan(cfg: Mapping[str, Any], eligible: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
        """A malicious server's rounds (``server`` sybil or inconsistent; run after
        ``deviation_start`` regular rounds): ``cohorts`` (one sorted
        int64 array per deviation round, the target in each), ``target`` and ``sybils`` (int64 ids
        of the clients the server runs; empty for inconsistent). Sybil: a fixed set of ``sybils``
        clients (-1: clients_per_round - 1) plus honest cover clients re-drawn every round to fill
        the cohort; inconsistent: the target and clients_per_round - 1 others re-drawn every round."""
        c = min(cfg["clients_per_round"], len(eligible))
        target = int(cfg["target"]) if cfg["target"] >= 0 else int(rng.choice(eligible))
        if target not in set(eligible.tolist()):
            raise PrivauditError(f"protocol 'fedncf': target {target} is not a client with training data")
        others = eligible[eligible != target]
        n_syb = 0
        if cfg["server"] == "sybil":
            n_syb = min(c - 1 if cfg["sybils"] < 0 else int(cfg["sybils"]), len(others))
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

    #: (user ids, (len, Dtot) initial vectors) of canary clients, set only by privaudit.canary
    user_vectors: tuple[np.ndarray, np.ndarray] | None = None

    def simulate(self, setup: RunSetup) -> RunResult:
        """The run's steps under :meth:`run` (torch present, one thread)."""
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
        plan = None
        if cfg["server"] != "honest":
            plan = self.deviation_plan(cfg, eligible, sched_rng)
            start = min(cfg["deviation_start"], len(cohorts))
            cohorts = cohorts[:start] + plan["cohorts"] + cohorts[start:]
            cohorts = cohorts[: cfg["max_rounds"]] if cfg["max_rounds"] >= 0 else cohorts
            target = plan["target"]
        guards = [d for d in defenses if ROUND_CHECK in d.capabilities]
        dp_defenses = [d for d in defenses if LOCAL_TRAINING in d.capabilities]
        if len(dp_defenses) > 1:
            raise PrivauditError("protocol 'fedncf': at most one local-training defense (dp-sgd)")
        dp = dp_defenses[0] if dp_defenses else None

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
        adam = None
        if cfg["client_optimizer"] == "persistent":  # per-client Adam moments (n x m x Dtot for the rows)
            adam = {"step": np.zeros(n, dtype=np.int64)}
            for mk in ("m", "v"):
                adam[f"{mk}_user"] = np.zeros((n, Dt), dtype=np.float32)
                adam[f"{mk}_item"] = np.zeros((n, m, Dt), dtype=np.float32)
                adam[f"{mk}_net"] = {k: np.zeros((n,) + v.shape, dtype=np.float32) for k, v in net.items()}
        per_global = max(1, -(-len(eligible) // min(cfg["clients_per_round"], len(eligible))))
        offset = 2 * cfg["manipulated_rounds"] if cfg["selection"] == "adversarial" else 0
        participation = np.zeros(n, dtype=np.int64)
        hr_hist: list[float] = []
        ndcg_hist: list[float] = []
        k = cfg["top_k"]
        t_train = 0.0
        for r, cohort in enumerate(cohorts):
            record = cfg["record_rounds"] < 0 or r < cfg["record_rounds"]
            net_flat = ncf.flatten_network(net, arch, D, layers)
            deviation = plan is not None and start <= r < start + len(plan["cohorts"])
            sybils = plan["sybils"] if deviation else np.zeros(0, dtype=np.int64)
            is_sybil = np.isin(cohort, sybils)
            crafted = self.crafted_model(items, net, arch) if deviation and cfg["server"] == "inconsistent" else None
            if record:
                transcript.add(r, "server", "server", "cohort", {"clients": cohort}, {"k": int(len(cohort))})
                state_meta = None
                if deviation:  # the server's own record of its deviation
                    state_meta = {"deviation": cfg["server"], "target": target, "sybils": cohort[is_sybil].tolist()}
                    if crafted is not None:
                        state_meta["crafted"] = "item rows 0, predict.weight 0, dead ReLUs: sent to all but the target"
                state = {"items": items.astype(np.float64), "network": net_flat}
                transcript.add(r, "server", "server", "state", state, state_meta)
            abort = None
            if guards:  # countermeasures: every member checks the round before uploading
                sent = _model_bytes(items, net_flat)
                received = [sent] * len(cohort)
                if crafted is not None:
                    other = _model_bytes(crafted[0], ncf.flatten_network(crafted[1], arch, D, layers))
                    received = [sent if u == target else other for u in cohort]
                for d in guards:
                    abort = abort or d.abort_reason(r, [f"client:{u}" for u in cohort], received, ~is_sybil)
            if abort:
                if record:
                    zero = np.zeros(m, dtype=np.int64)
                    transcript.add(r, "server", "server", "aggregate", {"counts": zero}, {"k": 0, "aborted": abort})
                continue
            t0 = time.perf_counter()
            args = (pos, excl, n_pos)
            if crafted is not None:  # the target trains the true model, the others the crafted one
                mine = cohort == target
                up_t = self._local_round(cfg, cohort[mine], *args, items, users, net, dp, train_rng, m, adam)
                c_items, c_net = crafted
                up_o = self._local_round(cfg, cohort[~mine], *args, c_items, users, c_net, dp, train_rng, m, adam)
                uploads = _merge_uploads(mine, up_t, up_o)
            elif is_sybil.any():  # sybils upload zeros (no rows, zero weights, no instances)
                up_h = self._local_round(cfg, cohort[~is_sybil], *args, items, users, net, dp, train_rng, m, adam)
                zero = {
                    "item_payloads": [{"items": np.zeros(0, dtype=np.int64), "values": np.zeros((0, Dt))}],
                    "net_payloads": [{"delta": np.zeros_like(net_flat), "n_instances": np.zeros(1)}],
                }
                zeros = {k: v * int(is_sybil.sum()) for k, v in zero.items()}
                uploads = _merge_uploads(~is_sybil, up_h, zeros)
            else:
                uploads = self._local_round(cfg, cohort, *args, items, users, net, dp, train_rng, m, adam)
            t_train += time.perf_counter() - t0
            participation[cohort] += 1
            senders = [f"client:{u}" for u in cohort]
            b_items = channel.send(
                r, "item_update", senders, uploads["item_payloads"], record=record, meta={"n_rows": m}
            )
            b_net = channel.send(r, "net_update", senders, uploads["net_payloads"], record=record)
            s_items = channel.sum(b_items, rows=m)
            s_net = channel.sum(b_net)
            counts = np.asarray(s_items["counts"], dtype=np.int64)
            kk = len(b_items.senders)
            n_total = float(np.asarray(s_net["n_instances"]).ravel()[0])
            if record:
                transcript.add(r, "server", "server", "aggregate", {"counts": counts}, {"k": int(kk)})
            if kk == 0:
                continue
            vals = np.asarray(s_items["values"], dtype=np.float64)
            agg = cfg["aggregation"]
            if agg == "mf-fedavg":
                upd = counts > 0
                items[upd] += (vals[upd] / counts[upd, None]).astype(np.float32)
                net_flat = net_flat + np.asarray(s_net["delta"]) / max(n_total, 1.0)
            elif agg == "fedavg":
                items += (vals / max(n_total, 1.0)).astype(np.float32)
                net_flat = net_flat + np.asarray(s_net["delta"]) / max(n_total, 1.0)
            else:
                items += (vals / kk).astype(np.float32)
                net_flat = net_flat + np.asarray(s_net["delta"]) / kk
            net = ncf.unflatten_network(net_flat, arch, D, layers)
            done = r + 1 - offset  # regular rounds done (neither adversarial nor deviation rounds)
            if plan is not None:
                done -= min(max(r + 1 - start, 0), len(plan["cohorts"]))
            if deviation:
                continue
            if cfg["eval_every"] > 0 and done > 0 and done % (per_global * cfg["eval_every"]) == 0:
                util = ncf_utility(arch, D, layers, {"net": net, "users": users, "items": items}, eval_users, cand, k)
                hr_hist.append(util[f"hr@{k}"])
                ndcg_hist.append(util[f"ndcg@{k}"])
        model = {
            "items": items,
            "net": net,
            "users": users,
            "hr_history": hr_hist,
            "ndcg_history": ndcg_hist,
            "rounds": len(cohorts),
        }
        utility = ncf_utility(arch, D, layers, model, eval_users, cand, k)
        utility["rounds"] = float(len(cohorts))
        utility["train_seconds_per_round"] = t_train / max(len(cohorts), 1)
        if dp is not None:
            dp.account(n_pos, participation, cfg["batch_size"], cfg["local_epochs"], cfg["negatives"])
            spent = dp.spent_by_clients()
            utility["epsilon"] = spent["epsilon"]
            utility["delta"] = spent["delta"]
        return RunResult(transcript, model, utility)

    # ------------------------------------------------------------------ one round of local work
    def _local_round(
        self,
        cfg: Mapping[str, Any],
        cohort: np.ndarray,
        pos: sp.csr_matrix,
        excl: sp.csr_matrix,
        n_pos: np.ndarray,
        items: np.ndarray,
        users: np.ndarray,
        net: dict[str, np.ndarray],
        dp: Any,
        rng: np.random.Generator,
        m: int,
        adam: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Negative sampling, batched local training and the plaintext uploads of one cohort.

        Updates ``users`` (the clients' private vectors) and ``adam`` (persistent per-client Adam
        state, or None) in place.
        """
        arch, D, layers = cfg["model"], cfg["D"], list(cfg["layers"])
        C = len(cohort)
        npos = n_pos[cohort]
        nneg = cfg["negatives"] * npos
        n_inst = npos + nneg
        neg_all = (
            ncf.sample_negatives(np.repeat(cohort, nneg), excl, m, rng) if nneg.sum() else np.zeros(0, dtype=np.int64)
        )
        neg_split = np.split(neg_all, np.cumsum(nneg)[:-1])
        pos_lists = [pos.indices[pos.indptr[u] : pos.indptr[u + 1]].astype(np.int64) for u in cohort]
        inst_items = [np.concatenate([p, q]) for p, q in zip(pos_lists, neg_split)]
        if dp is not None:  # DP noise touches every row: the whole item table is local
            local = [np.arange(m, dtype=np.int64) for _ in range(C)]
        else:
            local = [np.unique(x) for x in inst_items]
        L = max(len(x) for x in local)
        N = int(n_inst.max())
        Dt = items.shape[1]
        item_rows = np.zeros((C, L, Dt), dtype=np.float32)
        inst_item = np.zeros((C, N), dtype=np.int64)
        inst_label = np.zeros((C, N), dtype=np.float32)
        for c in range(C):  # O(C) bookkeeping per round, not per step
            item_rows[c, : len(local[c])] = items[local[c]]
            inst_item[c, : n_inst[c]] = np.searchsorted(local[c], inst_items[c])
            inst_label[c, : npos[c]] = 1.0
        state = None
        if adam is not None:
            state = {"step": adam["step"][cohort]}
            for mk in ("m", "v"):
                state[f"{mk}_user"] = adam[f"{mk}_user"][cohort]
                state[f"{mk}_net"] = {k: v[cohort] for k, v in adam[f"{mk}_net"].items()}
                it = np.zeros((C, L, Dt), dtype=np.float32)
                for c in range(C):
                    it[c, : len(local[c])] = adam[f"{mk}_item"][cohort[c], local[c]]
                state[f"{mk}_item"] = it
        index, valid = ncf.make_batches(n_inst, cfg["local_epochs"], cfg["batch_size"], rng)
        local_dp = dp.local_training() if dp is not None else None
        settings = ncf.LocalTrainingSettings(
            lr=cfg["lr"],
            user_lr=float(cfg["user_lr"]) if cfg["user_lr"] > 0 else None,
            dp=(local_dp.noise_multiplier, local_dp.clip) if local_dp is not None else None,
            noise_seed=int(rng.integers(2**63)),
        )
        data = ncf.CohortData(
            item_rows,
            users[cohort],
            inst_item,
            inst_label,
            n_inst,
            index,
            valid,
            np.array([len(x) for x in local]),
            state,
        )
        out = ncf.train_cohort(ncf.Architecture(arch, D, tuple(layers)), net, data, settings)
        users[cohort] = out["users"]
        if adam is not None:
            new = out["adam_state"]
            adam["step"][cohort] = new["step"]
            for mk in ("m", "v"):
                adam[f"{mk}_user"][cohort] = new[f"{mk}_user"]
                for k in adam[f"{mk}_net"]:
                    adam[f"{mk}_net"][k][cohort] = new[f"{mk}_net"][k]
                for c in range(C):
                    adam[f"{mk}_item"][cohort[c], local[c]] = new[f"{mk}_item"][c, : len(local[c])]
        agg = cfg["aggregation"]
        net_flat = ncf.flatten_network(net, arch, D, layers)
        item_payloads, net_payloads = [], []
        for c in range(C):
            w_item = float(n_inst[c]) if agg == "fedavg" else 1.0
            w_net = 1.0 if agg == "simpleavg" else float(n_inst[c])
            Lc = len(local[c])
            delta = out["items"][c, :Lc].astype(np.float64) - item_rows[c, :Lc].astype(np.float64)
            item_payloads.append({"items": local[c], "values": w_item * delta})
            new_flat = np.concatenate(
                [out["net"][k][c].astype(np.float64).ravel() for k in ncf.network_shapes(arch, D, layers)]
            )
            net_payloads.append({"delta": w_net * (new_flat - net_flat), "n_instances": np.array([float(n_inst[c])])})
        return {"item_payloads": item_payloads, "net_payloads": net_payloads}


def _model_bytes(items: np.ndarray, net_flat: np.ndarray) -> bytes:
    """A model as sent: float32 item rows (m x Dtot), then float64 network weights."""
    return np.ascontiguousarray(items, dtype=np.float32).tobytes() + np.ascontiguousarray(net_flat).tobytes()


def _merge_uploads(first: np.ndarray, a: dict[str, list], b: dict[str, list]) -> dict[str, list]:
    """Interleave two clients' upload lists into cohort order (``first``: bool per member, True
    where the member's uploads are the next ones of ``a``)."""
    out: dict[str, list] = {}
    for key in a:
        ia, ib = iter(a[key]), iter(b[key])
        out[key] = [next(ia) if f else next(ib) for f in first]
    return out

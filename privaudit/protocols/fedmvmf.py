"""FedMVMF: federated multi-view matrix factorization (privmvmf.txt §3; DESIGN.md "FedMVMF").

Parties: clients ``client:<u>`` (one per training user, u = 0..n-1), the FL server ``server``
(holds V and P) and the item server ``item-server`` (holds the item features Y and Q).

Each epoch t (0-based):

1. the server sends V, P (recorded as a ``state`` message server -> server, round t);
2. every client updates its u_u — SemiALS: closed form (eq. 8); SGD: one step
   ``u <- u - eta grad_u`` (eqs. 9-10) — then uploads, computed with the same V, P and the
   fresh u_u (eqs. 5, 7)::

       grad_V  items: the client's explicit local entries (ObsOnly) or all m items (InclUnc)
               values[i] = -2 c_ui (r_ui - u_u.v_i) u_u           (len(items) x K)
       grad_P  values    = -2 alpha (x_u - P u_u) u_u^T           (p x K)

   through :meth:`Channel.send` (so noise, encryption, masking apply) and the server sums
   them with :meth:`Channel.sum`;
3. the item server updates Q (SemiALS: closed form, eq. 11; SGD: one Adam step on eq. 13)
   with the V of that round and sends ``grad_V_item`` = -2 alpha (Y - V Q^T) Q (m x K) to the
   server (not a client upload, so client-side defenses do not touch it);
4. the server takes one Adam step on V (summed client gradients + item server part
   + 2 lam V) and on P (summed client gradients + 2 lam P).

Data split (privmvmf.txt §6.3): ``cold_user_fraction`` of the users and ``cold_item_fraction``
of the items are held out as cold-start users/items; each remaining user's ratings of the
remaining items are split ``1 - test_fraction`` / ``test_fraction`` into training and test
ratings. The clients train on their training ratings, passed through
:meth:`Channel.client_data` first (a sampling defense adds virtual items there; their weight
is used as c_ui and their rating — 0 — as r_ui, and they are uploaded like rated items).
Item ids in the transcript index the training items (``n_items`` = their number); the model
dict maps them back (``train_items``, ``train_users``, ``cold_users``, ``cold_items``: indices
into the dataset).

Utility (privmvmf.txt appendix .2): NDCG@10, precision@10, recall@10, F1@10 with relevance =
rating >= ``relevance_threshold``; existing users: the test ratings, ranking the training items
minus the user's own training items; cold-start users (u from eq. 15): their ratings of the
training items; cold-start items (v from eq. 17): the training users' ratings of the cold
items, ranking the cold items. Keys ``ndcg@10``..``f1@10``, ``cold_user_ndcg@10``..,
``cold_item_ndcg@10``.., plus ``train_loss`` (J of eq. 3 at the end) and ``epoch_seconds``.

Recording: the ``state`` messages, client uploads and ``grad_V_item`` of the first
``record_rounds`` epochs (-1: all) are recorded; the attacks need two. Private messages
(``client:u`` -> itself, round 0): ``items`` (int64 sorted), ``ratings`` (float64),
``attributes`` (float64 0/1, length p) — the client's real training ratings (virtual items of a
sampling defense are not ratings).

Departures from the paper (whose equations were lost in extraction): the math follows
DESIGN.md exactly; the item server's SGD step on Q uses Adam with the server's learning rate
(the paper says only "gradient descent ... with Adam"); the initial factors are
N(0, init_scale^2). Randomness: one seed; the split, the initialisation and the channel (noise
of the defenses) draw from three independent child streams, so a noise sweep with one seed
keeps the split and the initial model fixed.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from privaudit.data.splits import cold_start_items, cold_start_users, holdout_split
from privaudit.defenses.base import ClientData, Defense
from privaudit.metrics import ranking_metrics_at_k
from privaudit.models import mvmf
from privaudit.protocols.base import Channel, Protocol, RunResult, resolve_seed
from privaudit.registry import register_protocol

#: Config keys the protocol fills in itself (ignored if passed in).
DERIVED_KEYS = ("n_items", "n_users", "attribute_names", "rating_min", "rating_max", "rating_step", "defenses", "seed")


def split_fedmvmf(
    dataset: Any,
    test_fraction: float,
    cold_user_fraction: float,
    cold_item_fraction: float,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Cold users, cold items, and a per-user train/test split of the rest (privmvmf.txt §6.3).

    Uses :mod:`privaudit.data.splits`. Returns a dict of index arrays into the dataset
    (``train_users``, ``cold_users``, ``train_items``, ``cold_items``; sorted int64) and CSR
    matrices: ``train`` and ``test`` (train users x train items; ``round(test_fraction * n_u)``
    of each user's ratings in test, at least one kept for training), ``cold_user_ratings``
    (cold users x train items), ``cold_item_ratings`` (train users x cold items).
    """
    train_users, cold_users = cold_start_users(dataset, cold_user_fraction, rng)
    train_items, cold_items = cold_start_items(dataset, cold_item_fraction, rng)
    warm_rows = dataset.subset_users(train_users)
    warm = warm_rows.subset_items(train_items)
    train, test = holdout_split(warm, test_fraction, rng)
    return {
        "train_users": train_users,
        "cold_users": cold_users,
        "train_items": train_items,
        "cold_items": cold_items,
        "train": train.ratings,
        "test": test.ratings,
        "cold_user_ratings": dataset.subset_users(cold_users).subset_items(train_items).ratings,
        "cold_item_ratings": warm_rows.subset_items(cold_items).ratings,
    }


def ranking_utility(
    scores: np.ndarray, truth: sp.csr_matrix, threshold: float, k: int, exclude: sp.csr_matrix | None = None, prefix: str = ""
) -> dict[str, float]:
    """``{prefix}ndcg@k``, precision, recall, f1 with relevance = truth >= threshold."""
    nan = float("nan")
    keys = ("ndcg", "precision", "recall", "f1")
    if scores.size == 0 or truth.nnz == 0:
        return {f"{prefix}{key}@{k}": nan for key in keys}
    rel = sp.csr_matrix(truth >= threshold)
    res = ranking_metrics_at_k(scores, rel, k=k, exclude=exclude)
    return {f"{prefix}{key}@{k}": float(res[key]) for key in keys}


@register_protocol("fedmvmf")
class FedMVMF(Protocol):
    """Federated MVMF with clients, an FL server and an item server (module docstring)."""

    description = "Federated multi-view matrix factorization (FedMVMF, privmvmf.txt §3): SemiALS/SGD x ObsOnly/InclUnc"
    default_attack = "mvmf-analytic"
    derived_keys = DERIVED_KEYS
    #: what ``privaudit attack --protocol fedmvmf`` sweeps when no defense, noise or sweep is named
    #: (attack accuracy 1.0 -> ~0.34, NDCG@10 within ~10 % of scale 0 on the synthetic data)
    default_defense_specs: tuple[str, ...] = ()
    default_sweep_spec: str | None = "laplace.scale=0,0.3,1,3"
    default_config: dict[str, Any] = {
        "K": 20,
        "alpha": 2.0,
        "lam": 10.0,
        "w": 0.2,
        "eta": 3e-4,
        "update": "semials",
        "unrated": "obsonly",
        "epochs": 40,
        "lr": 0.2,
        "init_scale": 0.1,
        "record_rounds": 2,
        "test_fraction": 0.2,
        "cold_user_fraction": 0.1,
        "cold_item_fraction": 0.1,
        "relevance_threshold": 4.0,
        "top_k": 10,
    }
    config_help = {
        "K": "latent dimension",
        "alpha": "weight of the side-information views (user attributes, item features)",
        "lam": "L2 regularization of U, V, P, Q (> 0)",
        "w": "InclUnc: confidence c_ui of unrated items (rating 0)",
        "eta": "SGD: client step size on u_u",
        "update": "client update of u_u: semials (closed form) or sgd (one step per epoch)",
        "unrated": "obsonly (upload rated items only) or inclunc (all items, unrated with weight w)",
        "epochs": "training epochs (server Adam steps)",
        "lr": "server Adam learning rate for V and P (and the item server's Q under sgd)",
        "init_scale": "standard deviation of the initial factors",
        "record_rounds": "record the uploads and server state of the first N epochs (-1: all)",
        "test_fraction": "per-user fraction of ratings held out for the existing-user test",
        "cold_user_fraction": "fraction of users held out as cold-start users",
        "cold_item_fraction": "fraction of items held out as cold-start items",
        "relevance_threshold": "a test rating >= this is relevant (utility)",
        "top_k": "length of the recommendation lists (utility)",
    }

    @classmethod
    def validate_config(cls, config: dict[str, Any]) -> None:
        fail = cls.config_fail

        if config["update"] not in ("semials", "sgd"):
            fail(f"update must be 'semials' or 'sgd', got {config['update']!r}")
        if config["unrated"] not in ("obsonly", "inclunc"):
            fail(f"unrated must be 'obsonly' or 'inclunc', got {config['unrated']!r}")
        if not isinstance(config["K"], int) or config["K"] < 1:
            fail(f"K must be a positive integer, got {config['K']!r}")
        if not isinstance(config["epochs"], int) or config["epochs"] < 1:
            fail(f"epochs must be a positive integer, got {config['epochs']!r}")
        if not isinstance(config["record_rounds"], int) or config["record_rounds"] < -1:
            fail(f"record_rounds must be -1 (all) or a non-negative integer, got {config['record_rounds']!r}")
        if not isinstance(config["top_k"], int) or config["top_k"] < 1:
            fail(f"top_k must be a positive integer, got {config['top_k']!r}")
        for key in ("alpha", "w", "init_scale"):
            if not np.isfinite(config[key]) or config[key] < 0:
                fail(f"{key} must be a non-negative number, got {config[key]!r}")
        for key in ("lam", "eta", "lr"):
            if not np.isfinite(config[key]) or config[key] <= 0:
                fail(f"{key} must be a positive number, got {config[key]!r}")
        for key in ("test_fraction", "cold_user_fraction", "cold_item_fraction"):
            if not 0.0 <= config[key] < 1.0:
                fail(f"{key} must be in [0, 1), got {config[key]!r}")

    # ------------------------------------------------------------------ run
    def run(
        self,
        dataset: Any,
        config: Mapping[str, Any] | None = None,
        defenses: Sequence[Defense] = (),
        rng: np.random.Generator | int | None = None,
    ) -> RunResult:
        """Train FedMVMF on ``dataset`` (a RatingsDataset) and return transcript, model, utility.

        ``model``: dict with ``U`` (n x K, training users), ``V`` (m_train x K), ``P`` (p x K),
        ``Q`` (q x K), ``U_init`` (the clients' initial u, used by SGD), ``U_cold`` / ``V_cold``
        (cold-start factors), the index arrays of the split, ``train``/``test`` (CSR, train users x
        train items) and ``loss`` (J after each epoch, eq. 3).
        """
        cfg = self.resolve_config(config)
        self.check_defenses(self.name, defenses)
        seed = resolve_seed(rng)
        split_rng, init_rng, channel_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))

        K, alpha, lam, w, eta = cfg["K"], float(cfg["alpha"]), float(cfg["lam"]), float(cfg["w"]), float(cfg["eta"])
        update, unrated = cfg["update"], cfg["unrated"]
        split = split_fedmvmf(
            dataset, cfg["test_fraction"], cfg["cold_user_fraction"], cfg["cold_item_fraction"], split_rng
        )
        R_train = split["train"]
        n, m = R_train.shape
        X = np.asarray(dataset.user_attributes, dtype=np.float64)
        Y = np.asarray(dataset.item_features, dtype=np.float64)
        X_train, X_cold = X[split["train_users"]], X[split["cold_users"]]
        Y_train, Y_cold = Y[split["train_items"]], Y[split["cold_items"]]
        p, q = X.shape[1], Y.shape[1]

        senders = [f"client:{u}" for u in range(n)]
        transcript = self.open_transcript(
            cfg,
            dataset,
            defenses,
            seed,
            ["server", "item-server", *senders],
            n_items=int(m),
            n_users=int(n),
            attribute_names=list(dataset.attribute_names),
            rating_min=float(dataset.rating_min),
            rating_max=float(dataset.rating_max),
            rating_step=float(dataset.rating_step),
        )
        channel = Channel(defenses, transcript, channel_rng)

        # ground truth: each client's real training ratings and attributes
        items_all = R_train.indices.astype(np.int64)
        for u, party in enumerate(senders):
            lo, hi = R_train.indptr[u], R_train.indptr[u + 1]
            transcript.add(
                0,
                party,
                party,
                "private",
                {"items": items_all[lo:hi], "ratings": R_train.data[lo:hi].copy(), "attributes": X_train[u].copy()},
                {"dataset_user": int(split["train_users"][u])},
            )

        data = channel.client_data(ClientData.from_ratings(R_train))
        ratings = sp.csr_matrix(data.ratings, dtype=np.float64)
        ratings.sort_indices()
        weights = sp.csr_matrix((np.asarray(sp.csr_matrix(data.weights).data, dtype=np.float64), ratings.indices, ratings.indptr), shape=ratings.shape)
        if sp.csr_matrix(data.weights).nnz != ratings.nnz:
            raise RuntimeError("ClientData.weights must have the sparsity of ClientData.ratings")

        V = init_rng.normal(0.0, cfg["init_scale"], (m, K))
        P = init_rng.normal(0.0, cfg["init_scale"], (p, K))
        Q = init_rng.normal(0.0, cfg["init_scale"], (q, K))
        U = init_rng.normal(0.0, cfg["init_scale"], (n, K))
        U_init = U.copy()
        server_adam = mvmf.Adam(lr=cfg["lr"])
        item_adam = mvmf.Adam(lr=cfg["lr"])

        entry_rows = np.repeat(np.arange(n), np.diff(ratings.indptr))
        entry_items = ratings.indices.astype(np.int64)
        all_items = np.arange(m, dtype=np.int64)
        indptr = ratings.indptr
        record_rounds = cfg["record_rounds"]
        losses: list[float] = []
        seconds = 0.0

        for t in range(cfg["epochs"]):
            record = record_rounds < 0 or t < record_rounds
            tic = time.perf_counter()
            if record:
                transcript.add(t, "server", "server", "state", {"V": V, "P": P})
            sent = channel.download({"V": V, "P": P})
            V_sent, P_sent = sent["V"], sent["P"]
            # clients
            A, b = mvmf.normal_equations(V_sent, P_sent, X_train, ratings, weights, alpha, lam, w, unrated)
            U = mvmf.solve_users(A, b) if update == "semials" else mvmf.sgd_users(U, A, b, eta)
            if not channel.defenses and not record:
                # nothing observes this round: the server's plain sum, computed without
                # materializing per-client payloads (equal to plain_sum up to rounding)
                sum_V, sum_P = mvmf.summed_uploads(U, V_sent, P_sent, X_train, ratings, weights, alpha, w, unrated)
            else:
                if unrated == "obsonly":
                    coef = mvmf.entry_coefficients(U, V_sent, ratings, weights)
                    rows = mvmf.grad_V_rows(coef, U, entry_rows)
                    payloads = [
                        {"items": entry_items[indptr[u] : indptr[u + 1]], "values": rows[indptr[u] : indptr[u + 1]]}
                        for u in range(n)
                    ]
                else:
                    coef = mvmf.dense_coefficients(U, V_sent, ratings, weights, w)
                    rows = mvmf.grad_V_rows(coef, U)
                    payloads = [{"items": all_items, "values": rows[u]} for u in range(n)]
                batch = channel.send(t, "grad_V", senders, payloads, record=record)
                sum_V = _summed(channel.sum(batch, rows=m), (m, K))
                del payloads, rows, batch
                gP = mvmf.grad_P(U, P_sent, X_train, alpha)
                batch = channel.send(t, "grad_P", senders, [{"values": gP[u]} for u in range(n)], record=record)
                sum_P = _summed(channel.sum(batch), (p, K))
                del gP, batch
            # item server
            if update == "semials":
                Q = mvmf.solve_Q(V, Y_train, alpha, lam)
            else:
                Q = item_adam.step({"Q": Q}, {"Q": mvmf.grad_Q(Q, V, Y_train, alpha, lam)})["Q"]
            g_item = mvmf.item_grad_V(V, Q, Y_train, alpha)
            if record:
                transcript.add(t, "item-server", "server", "grad_V_item", {"values": g_item})
            losses.append(mvmf.loss(U, V_sent, P_sent, Q, ratings, weights, X_train, Y_train, alpha, lam, w, unrated))
            # FL server
            new = server_adam.step({"V": V, "P": P}, {"V": sum_V + g_item + 2.0 * lam * V, "P": sum_P + 2.0 * lam * P})
            V, P = new["V"], new["P"]
            seconds += time.perf_counter() - tic

        # evaluation
        k, thr = cfg["top_k"], float(cfg["relevance_threshold"])
        U_cold = mvmf.cold_start_users(P, X_cold, alpha, lam)
        V_cold = mvmf.cold_start_items(Q, Y_cold, alpha, lam)
        utility: dict[str, float] = {}
        utility.update(ranking_utility(U @ V.T, split["test"], thr, k, exclude=R_train.astype(bool)))
        utility.update(ranking_utility(U_cold @ V.T, split["cold_user_ratings"], thr, k, prefix="cold_user_"))
        utility.update(ranking_utility(U @ V_cold.T, split["cold_item_ratings"], thr, k, prefix="cold_item_"))
        utility["train_loss"] = float(losses[-1])
        utility["epoch_seconds"] = seconds / cfg["epochs"]

        model = {
            "U": U,
            "V": V,
            "P": P,
            "Q": Q,
            "U_init": U_init,
            "U_cold": U_cold,
            "V_cold": V_cold,
            "loss": np.asarray(losses),
            "train_users": split["train_users"],
            "cold_users": split["cold_users"],
            "train_items": split["train_items"],
            "cold_items": split["cold_items"],
            "train": R_train,
            "test": split["test"],
        }
        return RunResult(transcript, model, utility)


def _summed(total: Mapping[str, np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """The ``values`` entry of an aggregate as a float array of ``shape`` (zeros if empty)."""
    values = total.get("values") if total else None
    if values is None:
        return np.zeros(shape)
    return np.asarray(values, dtype=np.float64).reshape(shape)

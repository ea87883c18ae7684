"""FedProto: federated recommendation from (differentially private) prototypes
(DP-prototypes paper Algorithm 1, §3).

Parties: ``server`` and one ``client:<h>`` per silo. Silos (``silos="zip"``, default): the
first ZIP digit (:func:`privaudit.data.zip_silos`: 10 regions plus one silo of unknown ZIPs;
the synthetic dataset carries a ``user_region`` too); ``silos="uniform"`` deals users at random
into ``n_silos`` equal silos (the paper's synthetic setting); a dataset without ZIP codes (a
ratings CSV, ML latest-small) gets the uniform silos under ``silos="zip"`` too.

Split (§4.3): ``test_users`` (20 %) of the users are drawn at random and ``test_per_user`` (5) of
each drawn user's ratings are held out (a user keeps at least one training rating). X_h is
silo h's training matrix, dense n_h x m with 0 = unrated (eq. 1 treats the matrix as complete).

Round 0 (Algorithm 1 lines 1-4): each silo sends k prototypes (kind ``prototypes``,
payload ``prototypes``: k x m) through :meth:`Channel.send`:

- ``exact``: k-means centres (scikit-learn ``KMeans``, ``n_init=1``, k-means++), min(k, n_h);
- ``random``: min(k, n_h) of the silo's rows drawn without replacement (real rows: no privacy);
- ``dp``: the silo hands its rows to the channel and the ``dp-prototypes`` defense replaces
  them by k epsilon-DP prototypes (Algorithm 2) before they leave the silo — the server view and
  the transcript hold only the prototypes. ``prototypes="auto"`` (default) means ``dp`` when the
  ``dp-prototypes`` defense is active and ``exact`` otherwise; ``dp`` without the defense
  activates it with its defaults (and records it in ``config["defenses"]``); ``exact``/``random``
  together with the defense is an error. The defense's ``k``/``s`` default to the protocol's.

Server (lines 5-7): stacks P = [P_1; ...; P_H] (negative entries, impossible after the
defense's clipping, projected to 0) and solves eq. 1 with V >= 0:
min ||P - W V^T||^2 + lam (||W||^2 + ||V||^2) by scikit-learn ``NMF`` (coordinate descent,
``alpha_W = lam / m``, ``alpha_H = lam / rows(P)``, ``l1_ratio = 0``: sklearn scales the
penalties by the other dimension, so this is exactly the paper's objective halved); records a
``state`` (P, V) and sends each silo V (kind ``model``, payload ``V``: m x ell).

Silos (lines 8-10): U_h = argmin_{U >= 0} ||X_h - U V^T||^2 + lam ||U||^2 (scikit-learn
``non_negative_factorization`` with H = V^T fixed; rows are independent, so one call fits every
silo), X̂_h = U_h V^T.

Transcript: public config, per silo a ``private`` message (round 0) with its training rows
(``user_ids`` dataset indices, ``users`` row inside the silo, ``items``, ``ratings``,
``n_users``), the prototypes as the server sees them, the server's state and V as the silos see
it.

Utility on the held-out entries T: ``rmse``, ``mean_rank`` (eq. 4, items the user rated in
training excluded from the ranking), ``map@10`` (eqs. 5-6, every held-out item relevant).

Departures: the dense eq. 1 (unrated = 0), not the observed-only eq. 2 — the paper's metrics
rank all items, and its synthetic and eICU matrices are count matrices (so predictions shrink
towards 0 and ``rmse`` on 1..5 ratings is ~3, against ~1.05 for predicting the training mean on
the synthetic data: the model ranks, and reports show ``map@10``); Lambda (the entry
bound) is the rating maximum and s (non-zeros per row and per prototype) is a public config
value (rows with more ratings are subsampled for the mechanism only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from privaudit.data import zip_silos
from privaudit.defenses.base import Defense
from privaudit.errors import PrivauditError
from privaudit.metrics import error_sums_by_user, map_at_k, mean_rank, rmse
from privaudit.params import Param
from privaudit.protocols.base import Protocol, RunResult, RunSetup, utility_specs_of
from privaudit.registry import register_protocol
from privaudit.results import UserUtility
from privaudit.schema import GROUP_PRIVATE, MessageSchema, PayloadField, ProtocolSchema

__all__ = [
    "FedProto",
    "split_test_users",
    "exact_prototypes",
    "random_prototypes",
    "server_factorize",
    "fit_users",
    "recommendation_metrics",
    "nmf_scores",
    "local_scores",
]

DERIVED_KEYS = ("n_items", "n_silos_found", "Lambda_used", "s_used", "rating_min", "rating_max", "defenses")


def split_test_users(
    ratings: sp.csr_matrix, test_users: float, per_user: int, rng: np.random.Generator
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """§4.3: a fraction ``test_users`` of the users, ``per_user`` held-out ratings each
    (at most n_u - 1). Returns (train, test) CSR matrices of the same shape."""
    R = sp.csr_matrix(ratings, dtype=np.float64)
    n = R.shape[0]
    chosen = np.zeros(n, dtype=bool)
    chosen[rng.choice(n, size=int(round(test_users * n)), replace=False)] = True
    counts = np.diff(R.indptr)
    rows = np.repeat(np.arange(n), counts)
    order = np.lexsort((rng.random(rows.size), rows))
    rank = np.empty(rows.size, dtype=np.int64)
    rank[order] = np.arange(rows.size) - R.indptr[rows[order]]
    take = np.minimum(per_user, np.maximum(counts - 1, 0))
    test = chosen[rows] & (rank < take[rows])
    coo = R.tocoo()
    tr = sp.csr_matrix((coo.data[~test], (coo.row[~test], coo.col[~test])), shape=R.shape)
    te = sp.csr_matrix((coo.data[test], (coo.row[test], coo.col[test])), shape=R.shape)
    return tr, te


def exact_prototypes(X: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means centres of the rows of X (min(k, n) x m), scikit-learn KMeans."""
    from sklearn.cluster import KMeans

    kk = int(min(k, X.shape[0]))
    km = KMeans(n_clusters=kk, n_init=1, random_state=seed).fit(X)
    return km.cluster_centers_


def random_prototypes(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """min(k, n) rows of X drawn without replacement (the paper's "MF + k-random")."""
    idx = rng.choice(X.shape[0], size=int(min(k, X.shape[0])), replace=False)
    return np.array(X[np.sort(idx)], dtype=np.float64)


def server_factorize(P: np.ndarray, n_components: int, lam: float, max_iter: int, seed: int) -> np.ndarray:
    """V (m x ell) >= 0 of min ||P - W V^T||^2 + lam (||W||^2 + ||V||^2) (eq. 1)."""
    import warnings

    from sklearn.decomposition import NMF
    from sklearn.exceptions import ConvergenceWarning

    P = np.maximum(np.asarray(P, dtype=np.float64), 0.0)
    rows, m = P.shape
    if not P.any():
        return np.zeros((m, int(n_components)))
    model = NMF(
        n_components=int(n_components),
        init="nndsvda" if int(n_components) <= min(rows, m) else "random",  # nndsvda needs ell <= rows
        solver="cd",
        alpha_W=lam / m,
        alpha_H=lam / rows,
        l1_ratio=0.0,
        max_iter=int(max_iter),
        random_state=int(seed),
    )
    with warnings.catch_warnings(), threadpool_limits(1):  # tiny matrices: BLAS threads only add overhead
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(P)
    return np.ascontiguousarray(model.components_.T)


def fit_users(X: Any, V: np.ndarray, lam: float, max_iter: int) -> np.ndarray:
    """U >= 0 (n x ell) of min ||X - U V^T||^2 + lam ||U||^2 with V fixed (each row alone)."""
    import warnings

    from sklearn.decomposition import non_negative_factorization
    from sklearn.exceptions import ConvergenceWarning

    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    if not V.any():
        return np.zeros((X.shape[0], V.shape[1]))
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        U, _, _ = non_negative_factorization(
            X,
            H=np.ascontiguousarray(V.T),
            n_components=V.shape[1],
            update_H=False,
            solver="cd",
            alpha_W=lam / X.shape[1],
            l1_ratio=0.0,
            max_iter=int(max_iter),
        )
    return U


def nmf_scores(X: Any, n_components: int, lam: float, max_iter: int, seed: int) -> np.ndarray:
    """U V^T of the regularised NMF of X itself (eq. 1): the paper's "Full" (all silos' rows)
    or, per silo, "Local" baseline; (n x m)."""
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    V = server_factorize(X, n_components, lam, max_iter, seed)
    return fit_users(X, V, lam, max_iter) @ V.T


def local_scores(
    X: Any, silos: Sequence[np.ndarray], n_components: int, lam: float, max_iter: int, seed: int
) -> np.ndarray:
    """ "Local": every silo factorises its own rows alone (rank min(ell, n_h)); (n x m)."""
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    out = np.zeros_like(X)
    for h, users in enumerate(silos):
        out[users] = nmf_scores(X[users], min(int(n_components), len(users)), lam, max_iter, seed + h)
    return out


def recommendation_metrics(
    scores: np.ndarray,
    train: sp.csr_matrix,
    test: sp.csr_matrix,
    k: int = 10,
    per_user: dict[str, UserUtility] | None = None,
) -> dict[str, float]:
    """``rmse`` on the test entries, ``mean_rank`` (eq. 4) and ``map@k`` over the test users,
    training items excluded from the rankings. ``per_user`` receives each test user's
    contributions (in user order): squared-error sums and counts, rank sums and weights, AP@k."""
    te = test.tocoo()
    users = np.unique(te.row)
    if users.size == 0:
        return {"rmse": float("nan"), "mean_rank": float("nan"), f"map@{k}": float("nan")}
    S = np.asarray(scores)[users]
    T = test[users]
    excl = (train[users] != 0).toarray()
    pred = np.asarray(scores)[te.row, te.col]
    rank, (rank_num, rank_den) = mean_rank(S, T, exclude=excl, by_user=True)
    ap_mean, ap = map_at_k(S, T, k=k, exclude=excl, by_user=True)
    if per_user is not None:
        sq, _, count = error_sums_by_user(te.data, pred, np.searchsorted(users, te.row), users.size)
        per_user.update(
            {
                "rmse": UserUtility.sums(sq, count, root=True),
                "mean_rank": UserUtility.sums(rank_num, rank_den),
                f"map@{k}": UserUtility.means(ap),
            }
        )
    return {"rmse": rmse(te.data, pred), "mean_rank": rank, f"map@{k}": ap_mean}


#: The messages a transcript of this protocol holds (checked before any attack reads one).
SCHEMA = ProtocolSchema(
    config_keys=("k", "latent_dim", "n_items", "rating_min", "rating_max", "prototypes"),
    dims={"m": "n_items", "K": "latent_dim", "users": lambda c, d: d["users"]},
    messages=(
        MessageSchema("private", "client", "self", GROUP_PRIVATE),
        MessageSchema(
            "prototypes",
            "client",
            "server",
            (PayloadField("prototypes", "float", ("@k", "m")),),
            upload=True,
            required=True,
        ),
        MessageSchema(
            "state", "server", "self", (PayloadField("P", "float", (None, "m")), PayloadField("V", "float", ("m", "K")))
        ),
        MessageSchema("model", "server", "client", (PayloadField("V", "float", ("m", "K")),)),
    ),
)


@register_protocol("fedproto")
class FedProto(Protocol):
    description = "Cross-silo federated NMF from k (DP) prototypes per silo, two rounds"
    schema = SCHEMA  # declared message kinds, checked before any attack
    utility_specs = utility_specs_of("map@10", "rmse", "mean_rank")
    default_attack = "proto-membership"
    derived_keys = DERIVED_KEYS
    # the dense eq. 1 (unrated = 0) ranks items but predicts ratings shrunk towards 0 (RMSE ~3 on
    # 1..5 ratings, docs/first-run.md), so reports show the paper's ranking metric
    main_utility = "map@10"
    #: ``privaudit attack --protocol fedproto`` without a defense: prototypes per silo
    default_defense_specs: tuple[str, ...] = ()
    default_sweep_spec: str | None = "protocol.k=2,5,10,30"
    attacker = "server"
    parameters = (
        Param(
            "prototypes",
            "auto",
            "'auto' (dp with the dp-prototypes defense, else exact), 'exact' k-means, 'random' rows, 'dp'",
            choices=("auto", "exact", "random", "dp"),
        ),
        Param("k", 10, "prototypes per silo (the dp-prototypes defense's k overrides when set)", ge=1),
        Param("latent_dim", 20, "ell, columns of V (paper §4.4: 10..50)", ge=1),
        Param("lam", 0.1, "regularisation lambda of eq. 1 (paper: 0.1)", ge=0),
        Param("s", 50, "public bound on non-zeros per row / prototype for the DP mechanism", ge=1),
        Param("Lambda", 0.0, "public bound on every entry (0: the dataset's rating maximum)", ge=0),
        Param(
            "silos",
            "zip",
            "'zip' (first ZIP digit; uniform when the data has no ZIP codes) or 'uniform' (n_silos random equal silos)",
            choices=("zip", "uniform"),
        ),
        Param("n_silos", 10, "silos of silos='uniform'", ge=1),
        Param("test_users", 0.2, "fraction of users with held-out ratings (§4.3: 0.2)", ge=0, lt=1),
        Param("test_per_user", 5, "held-out ratings per test user (§4.3: 5)", ge=1),
        Param("max_iter", 300, "iterations of the server NMF and of the silos' U fits", ge=1),
        Param("map_k", 10, "k of MAP@k", ge=1),
    )

    @staticmethod
    def resolve_kind(kind: str, defenses: Sequence[Defense]) -> tuple[str, list[Defense]]:
        """The prototype kind and the defense list (with dp-prototypes added for ``dp``)."""
        has = any(d.name == "dp-prototypes" for d in defenses)
        if kind == "auto":
            kind = "dp" if has else "exact"
        if kind in ("exact", "random") and has:
            raise PrivauditError(
                f"protocol 'fedproto': prototypes={kind} sends exact data, but the dp-prototypes defense is active; "
                "use prototypes=dp (or auto)"
            )
        defenses = list(defenses)
        if kind == "dp" and not has:
            from privaudit.defenses.dp_prototypes import DPPrototypes

            defenses.insert(0, DPPrototypes())
        return kind, defenses

    def silos(self, dataset: Any, cfg: Mapping[str, Any], rng: np.random.Generator) -> list[np.ndarray]:
        if cfg["silos"] == "zip" and (np.asarray(dataset.user_region) >= 0).any():
            return [np.asarray(s, dtype=np.int64) for s in zip_silos(dataset) if len(s)]
        # silos="uniform", or a dataset without ZIP codes (a ratings CSV): n_silos random silos
        perm = rng.permutation(dataset.n_users)
        return [np.sort(part) for part in np.array_split(perm, cfg["n_silos"]) if part.size]

    def prepare_defenses(self, config: Mapping[str, Any], defenses: list[Defense]) -> list[Defense]:
        """The defenses with ``dp-prototypes`` added for ``prototypes=dp`` (:meth:`resolve_kind`)."""
        return self.resolve_kind(config["prototypes"], defenses)[1]

    @classmethod
    def release_count(cls, config: Mapping[str, Any]) -> int | None:
        """Every silo sends its prototypes once (round 0)."""
        return 1

    def simulate(self, setup: RunSetup) -> RunResult:
        """Run Algorithm 1; ``model``: dict with ``V`` (m x ell), ``U`` (n x ell), ``silos``
        (list of user-index arrays), ``prototypes`` (the server's stacked P), ``kind``."""
        cfg, dataset, defenses = setup.config, setup.dataset, setup.defenses
        kind, _ = self.resolve_kind(cfg["prototypes"], defenses)
        split_rng, silo_rng, proto_rng, channel_rng, server_rng = setup.streams(5)
        n, m = dataset.ratings.shape
        Lambda = float(cfg["Lambda"] or dataset.rating_max)
        train, test = split_test_users(dataset.ratings, cfg["test_users"], cfg["test_per_user"], split_rng)
        silos = self.silos(dataset, cfg, silo_rng)
        H = len(silos)
        senders = [f"client:{h}" for h in range(H)]
        private = []
        for h, users in enumerate(silos):
            sub = train[users].tocoo()
            payload = {
                "user_ids": users.copy(),
                "users": sub.row.astype(np.int64),
                "items": sub.col.astype(np.int64),
                "ratings": sub.data.astype(np.float64),
                "n_users": np.asarray(users.size, dtype=np.int64),
            }
            private.append((senders[h], payload, {"n_users": int(users.size), "n_ratings": int(sub.nnz)}))
        transcript, channel = self.start(
            setup,
            ["server", *senders],
            private,
            channel_rng,
            prototypes=kind,
            n_items=int(m),
            n_silos_found=int(H),
            Lambda_used=Lambda,
            s_used=int(cfg["s"]),
            rating_min=float(dataset.rating_min),
            rating_max=float(dataset.rating_max),
        )

        Xd = train.toarray()

        # round 0: prototypes (Algorithm 1 lines 1-4)
        seeds = proto_rng.integers(2**31, size=H)
        if kind == "dp":
            payloads = [{"rows": Xd[users]} for users in silos]
        elif kind == "exact":
            payloads = [
                {"prototypes": exact_prototypes(Xd[users], cfg["k"], int(seeds[h]))} for h, users in enumerate(silos)
            ]
        else:
            payloads = [{"prototypes": random_prototypes(Xd[users], cfg["k"], proto_rng)} for users in silos]
        batch = channel.send(
            0, "prototypes", senders, payloads, meta={"k": cfg["k"], "s": cfg["s"], "Lambda": Lambda, "kind": kind}
        )
        if any("prototypes" not in p for p in batch.payloads):
            raise PrivauditError("protocol 'fedproto': a prototype upload left the silo without prototypes")
        P = np.vstack([np.asarray(p["prototypes"], dtype=np.float64) for p in batch.payloads])

        # server (lines 5-7)
        V = server_factorize(P, cfg["latent_dim"], cfg["lam"], cfg["max_iter"], int(server_rng.integers(2**31)))
        transcript.add(1, "server", "server", "state", {"P": P, "V": V})
        received = V
        for party in senders:
            dl = channel.download({"V": V})
            transcript.add(1, "server", party, "model", dl)
            received = np.asarray(dl["V"])

        # silos (lines 8-10): one call, rows are independent given V
        U = fit_users(Xd, received, cfg["lam"], cfg["max_iter"])
        scores = U @ received.T
        per_user: dict[str, UserUtility] = {}
        utility = recommendation_metrics(scores, train, test, cfg["map_k"], per_user)
        utility.update(n_silos=float(H), prototypes_per_silo=float(P.shape[0]) / max(H, 1))
        if batch.meta.get("dp"):  # the DP mechanism that made the prototypes states its budget
            utility["epsilon"] = float(batch.meta["epsilon"])
        model = {"V": V, "U": U, "silos": silos, "prototypes": P, "kind": kind, "train": train, "test": test}
        return RunResult(transcript, model, utility, per_user)

"""FedMVMF: federated multi-view matrix factorization (the PrivMVMF paper, §3).

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

Data split (PrivMVMF paper §6.3): ``cold_user_fraction`` of the users and ``cold_item_fraction``
of the items are held out as cold-start users/items; each remaining user's ratings of the
remaining items are split ``1 - test_fraction`` / ``test_fraction`` into training and test
ratings. The clients train on their training ratings, passed through
:meth:`Channel.client_data` first (a sampling defense adds virtual items there; their weight
is used as c_ui and their rating — 0 — as r_ui, and they are uploaded like rated items).
Item ids in the transcript index the training items (``n_items`` = their number); the model
dict maps them back (``train_items``, ``train_users``, ``cold_users``, ``cold_items``: indices
into the dataset).

Utility (PrivMVMF paper appendix .2): NDCG@10, precision@10, recall@10, F1@10 with relevance =
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
the restated equations in docs/reproduction.md exactly; the item server's SGD step on Q uses Adam with the server's learning rate
(the paper says only "gradient descent ... with Adam"); the initial factors are
N(0, init_scale^2). Randomness: one seed; the split, the initialisation and the channel (noise
of the defenses) draw from three independent child streams, so a noise sweep with one seed
keeps the split and the initial model fixed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from privaudit.data.splits import cold_start_items, cold_start_users, holdout_split
from privaudit.defenses.base import ClientData
from privaudit.defenses.noise import DEFAULT_SCALES
from privaudit.metrics import ranking_metrics_at_k_factored
from privaudit.models import mvmf
from privaudit.params import Param
from privaudit.protocols.base import (
    BlockClients,
    BlockPart,
    BlockRound,
    BlockRun,
    Channel,
    Protocol,
    RunResult,
    RunSetup,
    utility_specs_of,
)
from privaudit.protocols.blocks import (
    CLIENT_BLOCK,
    Accumulator,
    MVMFBlock,
    MVMFSettings,
    MVMFUploads,
    block_ranges,
    mvmf_block_round,
    server_loss,
)
from privaudit.registry import register_protocol
from privaudit.results import UserUtility
from privaudit.schema import GRAD_ROWS, ITEMS, RATINGS, MessageSchema, PayloadField, ProtocolSchema, n_attributes

#: Config keys the protocol fills in itself (ignored if passed in).
DERIVED_KEYS = ("n_items", "n_users", "attribute_names", "rating_min", "rating_max", "rating_step", "defenses", "seed")


def split_fedmvmf(
    dataset: Any,
    test_fraction: float,
    cold_user_fraction: float,
    cold_item_fraction: float,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Cold users, cold items, and a per-user train/test split of the rest (PrivMVMF paper §6.3).

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
    user_factors: np.ndarray,
    item_factors: np.ndarray,
    truth: sp.csr_matrix,
    threshold: float,
    k: int,
    exclude: sp.csr_matrix | None = None,
    prefix: str = "",
    per_user: dict[str, UserUtility] | None = None,
) -> dict[str, float]:
    """``{prefix}ndcg@k``, precision, recall, f1 of the scores ``user_factors @ item_factors.T``
    (ranked one block of users at a time, never the full matrix) with relevance = truth >= threshold.
    ``per_user``: receives the per-user contributions of ndcg, precision and recall (rows of
    ``user_factors``; F1 does not decompose)."""
    nan = float("nan")
    keys = ("ndcg", "precision", "recall", "f1")
    if len(user_factors) == 0 or len(item_factors) == 0 or truth.nnz == 0:
        return {f"{prefix}{key}@{k}": nan for key in keys}
    rel = sp.csr_matrix(truth >= threshold)
    res, users = ranking_metrics_at_k_factored(user_factors, item_factors, rel, k=k, exclude=exclude, by_user=True)
    if per_user is not None:
        per_user.update({f"{prefix}{key}@{k}": UserUtility.means(v) for key, v in users.items()})
    return {f"{prefix}{key}@{k}": float(res[key]) for key in keys}


#: The messages a transcript of this protocol holds (checked before any attack reads one).
SCHEMA = ProtocolSchema(
    config_keys=("K", "n_items", "attribute_names", "alpha", "lam", "update", "unrated", "rating_min", "rating_max"),
    dims={"m": "n_items", "K": "K", "p": n_attributes},
    messages=(
        MessageSchema(
            "private",
            "client",
            "self",
            (ITEMS, RATINGS, PayloadField("attributes", "float", ("p",), value_range=(0.0, 1.0))),
        ),
        MessageSchema(
            "state",
            "server",
            "self",
            (PayloadField("V", "float", ("m", "K")), PayloadField("P", "float", ("p", "K"))),
            required=True,
        ),
        MessageSchema("grad_V", "client", "server", GRAD_ROWS, upload=True, required=True),
        MessageSchema("grad_P", "client", "server", (PayloadField("values", "float", ("p", "K")),), upload=True),
        MessageSchema("grad_V_item", "item-server", "server", (PayloadField("values", "float", ("m", "K")),)),
    ),
)


@dataclass
class MVMFClientBlock:
    """A block of FedMVMF clients as a sharded run's worker holds it: the block and the dataset
    user of each client (the ``dataset_user`` meta of its private message)."""

    block: MVMFBlock
    users: np.ndarray


class MVMFBlocks(BlockRound):
    """FedMVMF's clients in blocks (``FedMVMF.block_round``): one epoch of a block is
    :func:`mvmf_block_round` with the V, P the server sent; its partials ``(sum_V, sum_P, loss
    part)``; its uploads ``grad_V`` then ``grad_P``. Every setting, without defenses."""

    upload_kinds = ("grad_V", "grad_P")

    def __init__(self, st: MVMFSettings) -> None:
        self.st = st

    @classmethod
    def open(cls, protocol: Protocol, setup: RunSetup) -> BlockRun:
        """:meth:`FedMVMF.open_run` without private messages; a block's u_u are drawn from the seed
        and the block index (:meth:`MVMFBlock.initial`), as :meth:`MVMFRun.client_blocks` does."""
        run = protocol.open_run(setup, private=False)
        X, users, scale = run.views.X_train, run.split["train_users"], float(run.cfg["init_scale"])

        def block(index: int, lo: int, hi: int) -> MVMFClientBlock:
            R, W = run.ratings[lo:hi], run.weights[lo:hi]
            return MVMFClientBlock(
                MVMFBlock.initial(index, lo, R, W, X[lo:hi], run.st.K, setup.seed, scale), users[lo:hi]
            )

        def train(clients: BlockClients) -> RunResult:
            run.ratings = run.weights = None  # the blocks hold the clients' data now
            return protocol.train(run, _ClientsInBlocks(clients))

        return BlockRun(cls(run.st), run.ratings.shape[0], run.transcript, block, train)

    def private(self, client_block: MVMFClientBlock) -> list[tuple[dict[str, np.ndarray], dict[str, Any]]]:
        """Each client's real training items, ratings and attributes (as :func:`_private_messages`)."""
        b = client_block.block
        R, X = b.ratings, np.ascontiguousarray(b.X)
        ip, items, ratings = R.indptr, R.indices.astype(np.int64), R.data.copy()
        return [
            (
                {"items": items[ip[u] : ip[u + 1]], "ratings": ratings[ip[u] : ip[u + 1]], "attributes": X[u]},
                {"dataset_user": int(client_block.users[u])},
            )
            for u in range(R.shape[0])
        ]

    def round(
        self, client_block: MVMFClientBlock, t: int, record: bool, V: np.ndarray, P: np.ndarray, with_loss: bool
    ) -> BlockPart:
        b = client_block.block
        part = mvmf_block_round(b, V, P, self.st, record, with_loss)
        uploads = None
        if record:
            senders = [f"client:{u}" for u in range(b.lo, b.lo + b.ratings.shape[0])]
            uploads = [(x.kind, x.payloads()) for x in part.uploads.batches(t, senders)]
        return BlockPart((part.sum_V, part.sum_P, part.loss), uploads)

    def users(self, client_block: MVMFClientBlock) -> tuple[np.ndarray, np.ndarray]:
        """The block's current and initial u (clients x K each)."""
        return client_block.block.U, client_block.block.U_init


@register_protocol("fedmvmf")
class FedMVMF(Protocol):
    """Federated MVMF with clients, an FL server and an item server (module docstring)."""

    description = (
        "Federated multi-view matrix factorization (FedMVMF, PrivMVMF paper §3): SemiALS/SGD x ObsOnly/InclUnc"
    )
    schema = SCHEMA  # declared message kinds, checked before any attack
    utility_specs = utility_specs_of("ndcg@10", "precision@10", "recall@10", "f1@10")
    streams_transcript = True  # `run -o` writes each recorded round as it ends
    default_attack = "mvmf-analytic"
    derived_keys = DERIVED_KEYS
    block_round = MVMFBlocks  # every setting runs in client blocks (privaudit.sharded)
    #: what ``privaudit attack --protocol fedmvmf`` sweeps when no defense, noise or sweep is named:
    #: the grid of ``--noise laplace`` (on the synthetic data the attack falls to its prior-only
    #: baseline within the grid, at a moderate NDCG@10 cost)
    default_defense_specs: tuple[str, ...] = ()
    default_sweep_spec: str | None = "laplace.scale=" + ",".join(f"{s:g}" for s in DEFAULT_SCALES)
    parameters = (
        Param("K", 20, "latent dimension", ge=1),
        Param("alpha", 2.0, "weight of the side-information views (user attributes, item features)", ge=0),
        Param("lam", 10.0, "L2 regularization of U, V, P, Q (> 0)", gt=0),
        Param("w", 0.2, "InclUnc: confidence c_ui of unrated items (rating 0)", ge=0),
        Param("eta", 3e-4, "SGD: client step size on u_u", gt=0),
        Param(
            "update",
            "semials",
            "client update of u_u: semials (closed form) or sgd (one step per epoch)",
            choices=("semials", "sgd"),
        ),
        Param(
            "unrated",
            "obsonly",
            "obsonly (upload rated items only) or inclunc (all items, unrated with weight w)",
            choices=("obsonly", "inclunc"),
        ),
        Param("epochs", 40, "training epochs (server Adam steps)", ge=1),
        Param("lr", 0.2, "server Adam learning rate for V and P (and the item server's Q under sgd)", gt=0),
        Param("init_scale", 0.1, "standard deviation of the initial factors", ge=0),
        Param(
            "record_rounds", 2, "record the uploads and server state of the first N epochs (-1: all)", ge=0, also=(-1,)
        ),
        Param("test_fraction", 0.2, "per-user fraction of ratings held out for the existing-user test", ge=0, lt=1),
        Param("cold_user_fraction", 0.1, "fraction of users held out as cold-start users", ge=0, lt=1),
        Param("cold_item_fraction", 0.1, "fraction of items held out as cold-start items", ge=0, lt=1),
        Param("relevance_threshold", 4.0, "a test rating >= this is relevant (utility)"),
        Param("top_k", 10, "length of the recommendation lists (utility)", ge=1),
        Param("track_loss", False, "compute the training loss J after every epoch (model['loss']), not the last only"),
    )

    # ------------------------------------------------------------------ run
    @classmethod
    def release_count(cls, config: Mapping[str, Any]) -> int | None:
        """Every client uploads its ``grad_V``/``grad_P`` rows in every epoch: ``epochs``
        releases (``record_rounds`` records only the first of them)."""
        return _int_or_none(config.get("epochs"))

    def simulate(self, setup: RunSetup) -> RunResult:
        """Train FedMVMF on ``setup.dataset`` (a RatingsDataset) and return transcript, model, utility.

        ``model``: dict with ``U`` (n x K, training users), ``V`` (m_train x K), ``P`` (p x K),
        ``Q`` (q x K), ``U_init`` (the clients' initial u, used by SGD), ``U_cold`` / ``V_cold``
        (cold-start factors), the index arrays of the split, ``train``/``test`` (CSR, train users x
        train items) and ``loss`` (J of eq. 3 after each epoch with ``track_loss``, else after the last).
        """
        # one BLAS thread: the products are thin (K columns) and the solves K x K, so a second
        # thread only adds its synchronisation (the numbers do not depend on the thread count)
        with threadpool_limits(limits=1, user_api="blas"):
            run = self.open_run(setup, private=True)
            return self.train(run, LocalClients(run, run.client_blocks(setup.seed)))

    def open_run(self, setup: RunSetup, private: bool) -> MVMFRun:
        """The split, the transcript (with the clients' ``private`` messages if ``private``), the
        channel, the clients' data after the ``client-data`` defenses and the servers' state."""
        cfg, dataset = setup.config, setup.dataset
        split_rng, init_rng, channel_rng = setup.streams(3)
        split = split_fedmvmf(
            dataset, cfg["test_fraction"], cfg["cold_user_fraction"], cfg["cold_item_fraction"], split_rng
        )
        views = _Views.of(dataset, split)
        n, m = views.R_train.shape
        senders = [f"client:{u}" for u in range(n)]
        messages = _private_messages(senders, views.R_train, views.X_train, split["train_users"]) if private else []
        transcript, channel = self.start(
            setup,
            ["server", "item-server", *senders],
            messages,
            channel_rng,
            n_items=int(m),
            n_users=int(n),
            attribute_names=list(dataset.attribute_names),
            rating_min=float(dataset.rating_min),
            rating_max=float(dataset.rating_max),
            rating_step=float(dataset.rating_step),
        )
        ratings, weights = _client_data(channel, views.R_train)
        st = MVMFSettings.from_config(cfg)
        state = _State.initial(init_rng, m, views.X_train.shape[1], views.Y_train.shape[1], st.K, cfg)
        return MVMFRun(cfg, st, split, views, senders, transcript, channel, state, ratings, weights)

    def epoch(self, run: MVMFRun, clients: Any, t: int, with_loss: bool = True) -> float:
        """One epoch (:func:`_epoch`): the step a subclass may wrap (PrivMVMF tags the ``state``
        message of a malicious server's deviation round)."""
        return _epoch(run, clients, t, with_loss)

    def train(self, run: MVMFRun, clients: Any) -> RunResult:
        """The epochs with ``clients`` (:class:`LocalClients` or a sharded run's workers), then the
        utility; ``clients.users()`` gives the final and initial u (n x K each)."""
        cfg = run.cfg
        losses: list[float] = []
        seconds = 0.0
        for t in range(cfg["epochs"]):
            tic = time.perf_counter()
            want = cfg["track_loss"] or t == cfg["epochs"] - 1  # J costs a pass over the ratings
            loss = self.epoch(run, clients, t, want)
            losses += [loss] if want else []
            seconds += time.perf_counter() - tic
        U, U_init = clients.users()
        per_user: dict[str, UserUtility] = {}
        utility = _evaluate(U, run.state, run.st, cfg, run.views, run.split, per_user)
        utility["train_loss"] = float(losses[-1])
        utility["epoch_seconds"] = seconds / cfg["epochs"]
        split, state = run.split, run.state
        model = {
            "U": U,
            "V": state.V,
            "P": state.P,
            "Q": state.Q,
            "U_init": U_init,
            "U_cold": utility.pop("_U_cold"),
            "V_cold": utility.pop("_V_cold"),
            "loss": np.asarray(losses),
            "train_users": split["train_users"],
            "cold_users": split["cold_users"],
            "train_items": split["train_items"],
            "cold_items": split["cold_items"],
            "train": run.views.R_train,
            "test": split["test"],
        }
        return RunResult(run.transcript, model, utility, per_user)


class _ClientsInBlocks:
    """:class:`BlockClients` as :meth:`FedMVMF.train` drives its clients (``round``, ``users``)."""

    def __init__(self, clients: BlockClients) -> None:
        self.clients = clients

    def round(
        self, t: int, V: np.ndarray, P: np.ndarray, record: bool, with_loss: bool = True
    ) -> tuple[np.ndarray, np.ndarray, float]:
        sum_V, sum_P, loss = self.clients.round(t, record, V, P, with_loss)
        return sum_V, sum_P, loss

    def users(self) -> tuple[np.ndarray, np.ndarray]:
        got = self.clients.each("users")
        return np.concatenate([u for u, _ in got]), np.concatenate([u0 for _, u0 in got])


def _epoch(run: MVMFRun, clients: Any, t: int, with_loss: bool = True) -> float:
    """One epoch: the server's broadcast, the clients' updates and upload sums, the item
    server's step, then the FL server's Adam step on V and P. Returns the loss J (eq. 3), NaN
    without ``with_loss``."""
    state, st, transcript = run.state, run.st, run.transcript
    record_rounds = run.cfg["record_rounds"]
    record = record_rounds < 0 or t < record_rounds
    if record:
        transcript.add(t, "server", "server", "state", {"V": state.V, "P": state.P})
    sent = run.channel.download({"V": state.V, "P": state.P})
    V_sent, P_sent = sent["V"], sent["P"]
    sum_V, sum_P, loss = clients.round(t, V_sent, P_sent, record, with_loss)
    g_item = _item_server_step(state, st, run.views.Y_train)
    if record:
        transcript.add(t, "item-server", "server", "grad_V_item", {"values": g_item})
    if with_loss:
        loss += server_loss(V_sent, P_sent, state.Q, run.views.Y_train, st)
    lam, V, P = st.lam, state.V, state.P
    new = state.server_adam.step({"V": V, "P": P}, {"V": sum_V + g_item + 2.0 * lam * V, "P": sum_P + 2.0 * lam * P})
    state.V, state.P = new["V"], new["P"]
    return loss


@dataclass(frozen=True)
class _Views:
    """The training ratings and the side information of train and cold-start users/items."""

    R_train: sp.csr_matrix
    X_train: np.ndarray
    X_cold: np.ndarray
    Y_train: np.ndarray
    Y_cold: np.ndarray

    @classmethod
    def of(cls, dataset: Any, split: Mapping[str, Any]) -> _Views:
        X = np.asarray(dataset.user_attributes, dtype=np.float64)
        Y = np.asarray(dataset.item_features, dtype=np.float64)
        return cls(
            split["train"],
            X[split["train_users"]],
            X[split["cold_users"]],
            Y[split["train_items"]],
            Y[split["cold_items"]],
        )


@dataclass
class _State:
    """The servers' model during training: V, P (FL server), Q (item server), their optimizers.
    The clients' u_u live in their blocks (:class:`~privaudit.protocols.blocks.MVMFBlock`)."""

    V: np.ndarray
    P: np.ndarray
    Q: np.ndarray
    server_adam: Any
    item_adam: Any

    @classmethod
    def initial(cls, rng: np.random.Generator, m: int, p: int, q: int, K: int, cfg: Mapping[str, Any]) -> _State:
        V = rng.normal(0.0, cfg["init_scale"], (m, K))
        P = rng.normal(0.0, cfg["init_scale"], (p, K))
        Q = rng.normal(0.0, cfg["init_scale"], (q, K))
        return cls(V, P, Q, mvmf.Adam(lr=cfg["lr"]), mvmf.Adam(lr=cfg["lr"]))


@dataclass
class MVMFRun:
    """One FedMVMF run as the servers hold it: config, split, views, transcript, channel, the
    servers' state, and the clients' training data after the ``client-data`` defenses."""

    cfg: Mapping[str, Any]
    st: MVMFSettings
    split: dict[str, Any]
    views: _Views
    senders: list[str]
    transcript: Any
    channel: Channel
    state: _State
    ratings: sp.csr_matrix
    weights: sp.csr_matrix

    def client_blocks(self, seed: int, size: int | None = None) -> list[MVMFBlock]:
        """The clients in blocks of ``size`` (default :data:`CLIENT_BLOCK`), u_u initialised."""
        R, W, X = self.ratings, self.weights, self.views.X_train
        size = CLIENT_BLOCK if size is None else size
        scale = float(self.cfg["init_scale"])
        return [
            MVMFBlock.initial(b, lo, R[lo:hi], W[lo:hi], X[lo:hi], self.st.K, seed, scale)
            for b, (lo, hi) in enumerate(block_ranges(R.shape[0], size))
        ]


class LocalClients:
    """Every client block in this process: one epoch is :func:`mvmf_block_round` per block; the
    uploads go through the channel when recorded or defended."""

    def __init__(self, run: MVMFRun, blocks: list[MVMFBlock]) -> None:
        self.run, self.blocks = run, blocks

    def round(
        self, t: int, V: np.ndarray, P: np.ndarray, record: bool, with_loss: bool = True
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """(sum_V m x K, sum_P p x K, the clients' loss part) as the server receives them."""
        channel, st = self.run.channel, self.run.st
        uploads = record or bool(channel.defenses)
        total, packed = Accumulator(), []
        for block in self.blocks:
            # with defenses the server sums what the channel returns: the plaintext sums are not needed
            part = mvmf_block_round(block, V, P, st, uploads, with_loss, sums=not channel.defenses)
            total.add(part.sum_V, part.sum_P, part.loss)
            if uploads:
                packed.append(part.uploads)
        sum_V, sum_P, loss = total.values
        if uploads:
            # one round's messages together, so that a DP defense clips each client's grad_V and grad_P jointly
            batches = MVMFUploads.concatenate(packed).batches(t, self.run.senders)
            del packed
            if not record:  # only the server's sums are needed: the defenses' noise drawn on them
                sums = channel.sum_round_packed(t, batches, [V.shape[0], None])
                if sums is not None:
                    return _summed(sums[0], V.shape), _summed(sums[1], P.shape), loss
            sent_V, sent_P = channel.send_round_packed(t, batches, record=record)
            del batches
            if channel.defenses:
                sum_V = _summed(channel.sum(sent_V, rows=V.shape[0]), V.shape)
                sum_P = _summed(channel.sum(sent_P), P.shape)
        return sum_V, sum_P, loss

    def users(self) -> tuple[np.ndarray, np.ndarray]:
        """The clients' final and initial u (n x K each)."""
        return np.concatenate([b.U for b in self.blocks]), np.concatenate([b.U_init for b in self.blocks])


def _private_messages(
    senders: list[str], R_train: sp.csr_matrix, X_train: np.ndarray, train_users: np.ndarray
) -> list[tuple[str, dict[str, np.ndarray], dict[str, Any]]]:
    """Ground truth: each client's real training ratings and attributes."""
    items_all = R_train.indices.astype(np.int64)
    out = []
    for u, party in enumerate(senders):
        lo, hi = R_train.indptr[u], R_train.indptr[u + 1]
        payload = {"items": items_all[lo:hi], "ratings": R_train.data[lo:hi].copy(), "attributes": X_train[u].copy()}
        out.append((party, payload, {"dataset_user": int(train_users[u])}))
    return out


def _client_data(channel: Channel, R_train: sp.csr_matrix) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """The clients' training ratings and confidences after the ``client-data`` defenses."""
    data = channel.client_data(ClientData.from_ratings(R_train))
    ratings = sp.csr_matrix(data.ratings, dtype=np.float64)
    ratings.sort_indices()
    weights = sp.csr_matrix(
        (np.asarray(sp.csr_matrix(data.weights).data, dtype=np.float64), ratings.indices, ratings.indptr),
        shape=ratings.shape,
    )
    if sp.csr_matrix(data.weights).nnz != ratings.nnz:
        raise RuntimeError("ClientData.weights must have the sparsity of ClientData.ratings")
    return ratings, weights


def _item_server_step(state: _State, st: MVMFSettings, Y_train: np.ndarray) -> np.ndarray:
    """The item server updates Q (closed form or Adam) and returns its grad_V term (m x K)."""
    if st.update == "semials":
        state.Q = mvmf.solve_Q(state.V, Y_train, st.alpha, st.lam)
    else:
        state.Q = state.item_adam.step({"Q": state.Q}, {"Q": mvmf.grad_Q(state.Q, state.V, Y_train, st.alpha, st.lam)})[
            "Q"
        ]
    return mvmf.item_grad_V(state.V, state.Q, Y_train, st.alpha)


def _evaluate(
    U: np.ndarray,
    state: _State,
    st: MVMFSettings,
    cfg: Mapping[str, Any],
    views: _Views,
    split: Mapping[str, Any],
    per_user: dict[str, UserUtility] | None = None,
) -> dict[str, Any]:
    """Ranking utility of existing users, cold-start users and cold-start items (the cold-start
    factors are returned under ``_U_cold`` / ``_V_cold``); ``per_user`` receives the existing
    users' per-user contributions."""
    k, thr = cfg["top_k"], float(cfg["relevance_threshold"])
    U_cold = mvmf.cold_start_users(state.P, views.X_cold, st.alpha, st.lam)
    V_cold = mvmf.cold_start_items(state.Q, views.Y_cold, st.alpha, st.lam)
    V = state.V
    utility: dict[str, Any] = {}
    utility.update(ranking_utility(U, V, split["test"], thr, k, exclude=views.R_train.astype(bool), per_user=per_user))
    utility.update(ranking_utility(U_cold, V, split["cold_user_ratings"], thr, k, prefix="cold_user_"))
    utility.update(ranking_utility(U, V_cold, split["cold_item_ratings"], thr, k, prefix="cold_item_"))
    utility["_U_cold"], utility["_V_cold"] = U_cold, V_cold
    return utility


def _summed(total: Mapping[str, np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """The ``values`` entry of an aggregate as a float array of ``shape`` (zeros if empty)."""
    values = total.get("values") if total else None
    if values is None:
        return np.zeros(shape)
    return np.asarray(values, dtype=np.float64).reshape(shape)


def _int_or_none(value: Any) -> int | None:
    """``value`` when it is an int (not a bool), else None."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

"""FedRec: federated PMF (batch and stochastic) and SVD++ (stochastic) — FedRec paper §3.

Parties: clients ``client:<u>`` (one per user of the dataset, u = 0..n-1) and ``server``
(holds V, and W for SVD++). Data: one fold of a ``n_folds``-fold split of the ratings
(FedRec paper §4.1: five equal parts, four for training); the test fold gives the utility
(RMSE and MAE on real test ratings, predictions clipped to the rating range).

Local data: every iteration (Algorithm 2/5 line 1) the clients' real training ratings pass
through :meth:`Channel.client_data`; a ``sampling`` defense (``filling=ua`` or ``hf``) adds
round(rho |I_u|) random unrated items I'_u with the user average as virtual rating (eq. 5).
With ``filling=hf`` (Algorithm 3) the protocol then runs ``t_local`` local eq.-7 steps on U_u
(which persist) and, from iteration ``t_predict`` on, replaces the virtual ratings by the
local predictions (eq. 6). ``resample=false`` draws I'_u once (an extension).

Models (config ``model``):

* ``pmf-batch`` — Algorithms 1-2: every client steps U_u with eq. 7, uploads eq. 8 for
  I_u ∪ I'_u (kind ``grad_V``: ``items`` int64, ``values`` len x d); the server averages
  per item (eq. 9) and steps V. Unfederated: the same math computed centrally with sparse
  products (no messages, no channel) — equal up to floating-point summation order.
* ``pmf-sgd`` / ``svdpp-sgd`` — Algorithms 4-5: every iteration each client walks its entries
  in random order, updating U_u per entry and computing eq. 8 (SVD++: with
  ``U_u + |N_u\\{i}|^-1/2 sum W_j``, N_u = I_u ∪ I'_u, plus kind ``grad_W`` for every
  j in N_u); the server applies the uploads with step lr. Unfederated: standard SGD updating
  U_u and V_i from the same residual at every step (SVD++: W at the end of each user's walk).

Learning rate: ``lr`` (default 0.8 batch, 0.01 stochastic, §4.2) times 0.9 after every
iteration. d = 20, T = 100 as the paper.

Departures (stated because they change numbers):

* stochastic style — the server visits every user once per iteration in a random order
  (the paper samples n users with replacement; its complexity analysis assumes once each),
  and runs ``chunk_users`` consecutive clients in lock-step against one V snapshot, applying
  their uploads together: Algorithm 4 exactly for ``chunk_users=1``, a staleness of one
  chunk (at most ``chunk_users`` - 1 clients) otherwise. The unfederated baseline uses the
  same user order and lock-step, with V updated after every step;
* SVD++ — N_u is I_u ∪ I'_u during training (otherwise the W uploads would expose I_u);
  the test prediction uses the real I_u; W gradients are applied once per walk (the sum over
  the walk's entries, self excluded) rather than after every entry; HF's local steps on
  U_u use eq. 7 with the SVD++ prediction (the implicit term without self-exclusion);
* HF's local steps use the current (decayed) learning rate; the paper leaves it open.
  T_predict and T_local: the paper tunes both on {5, 10, 15} by MAE on fold 1 (§4.2) without
  reporting the choice; when the ``sampling`` defense leaves them unset (``None``) FedRec
  uses ``T_predict = 10``, ``T_local = 5`` (:data:`HF_DEFAULTS`, not tuned here);
* stability guard (not in the paper): every batch-style step of a factor row (a client's
  U_u step, eq. 7 and Algorithm 3's local steps; the server's V_i step, eq. 9) is clipped to
  Euclidean norm ``max_step`` (default 1.0). The paper's lr 0.8 is unstable once
  lr |U_u|^2 > 2 for an item with few raters, which happens on small data (60 synthetic
  users diverged to NaN) before the 0.9 decay brings lr down. On ML-100K it binds on a few early
  row steps and barely moves the test RMSE (``utility["clipped_steps"]`` counts them; ``max_step=0``
  runs the paper's algorithm unguarded; figures in docs/reproduction.md). Non-finite factors after
  any iteration (e.g. a user-set lr too large for the stochastic models) raise a one-line
  :class:`PrivauditError` naming the iteration instead of returning NaN.

Recording: ``record_rounds`` lists the iterations recorded (negative = counted from the end;
default the first and the last). In a recorded iteration the server's ``state`` (``V``, and
``W`` for SVD++) is recorded before every download it makes (once per iteration in batch
style, once per chunk in stochastic style, meta ``chunk``), followed by the uploads of the
clients that used it (in walk order for the stochastic style). Private messages
(``client:u`` -> itself, round 0): ``items`` (int64 sorted) and ``ratings`` (float64) of the
client's real training ratings.

Randomness: one seed; the fold split, the initialisation, the walk orders and the channel
(sampling, noise) draw from four independent child streams.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.data.splits import kfold_ratings
from privaudit.defenses.base import CLIENT_DATA, ClientData, Defense
from privaudit.errors import PrivauditError
from privaudit.metrics import error_sums_by_user
from privaudit.models import pmf
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
    block_ranges,
    entries_block,
    error_sums,
    fold,
    pmf_block_round,
)
from privaudit.registry import register_protocol
from privaudit.results import UserUtility
from privaudit.schema import GRAD_ROWS, ITEMS, RATINGS, MessageSchema, PayloadField, ProtocolSchema

MODELS = ("pmf-batch", "pmf-sgd", "svdpp-sgd")
DERIVED_KEYS = (
    "n_items",
    "n_users",
    "rating_min",
    "rating_max",
    "rating_step",
    "defenses",
    "seed",
    "lr_used",
    "lam_used",
    "chunk_used",
)

#: lambda fixed at 0.01, the middle of the paper's grid {0.1, 0.01, 0.001} (not grid-searched here)
DEFAULT_LAM = {"pmf-batch": 0.01, "pmf-sgd": 0.01, "svdpp-sgd": 0.01}
DEFAULT_LR = {"pmf-batch": 0.8, "pmf-sgd": 0.01, "svdpp-sgd": 0.01}
#: batch GD at lr 0.8 is at the edge of stability once |V_i|^2 ~ 2 / 0.8: starting from 0.001
#: the factors grow only after the learning rate has decayed (0.01 diverges on some ML-100K folds)
DEFAULT_INIT = {"pmf-batch": 0.001, "pmf-sgd": 0.01, "svdpp-sgd": 0.01}
#: stochastic lock-step chunk sizes: SVD++'s shared W couples users strongly (|N_u ∩ N_v| / sqrt(|N_u||N_v|)),
#: and stale W over larger chunks diverges on ML-100K (docs/reproduction.md)
DEFAULT_CHUNK = {"pmf-batch": 1, "pmf-sgd": 64, "svdpp-sgd": 4}
#: HF's T_predict and T_local when the sampling defense leaves them unset (FedRec paper §4.2 tunes both on {5, 10, 15})
HF_DEFAULTS = {"t_predict": 10, "t_local": 5}


def hf_settings(defenses: Sequence[Defense]) -> tuple[str | None, int, int]:
    """(filling, t_predict, t_local) of the active sampling defense, if any (unset
    t_predict / t_local -> :data:`HF_DEFAULTS`).

    The filling rule is part of the client's algorithm (Algorithm 3): the protocol asks the
    ``client-data`` defenses for it (:meth:`Defense.virtual_ratings`, public by Kerckhoffs).
    """
    for d in defenses:
        rule = d.virtual_ratings() if CLIENT_DATA in d.capabilities else None
        if rule is not None:
            tp = HF_DEFAULTS["t_predict"] if rule.t_predict is None else int(rule.t_predict)
            tl = HF_DEFAULTS["t_local"] if rule.t_local is None else int(rule.t_local)
            return str(rule.filling), tp, tl
    return None, 0, 0


#: The messages a transcript of this protocol holds (checked before any attack reads one).
SCHEMA = ProtocolSchema(
    config_keys=("d", "model", "n_items", "n_users", "rating_min", "rating_max", "federated"),
    dims={"m": "n_items", "K": "d"},
    messages=(
        MessageSchema("private", "client", "self", (ITEMS, RATINGS)),
        MessageSchema(
            "state",
            "server",
            "self",
            (PayloadField("V", "float", ("m", "K")), PayloadField("W", "float", ("m", "K"), optional=True)),
        ),
        MessageSchema("grad_V", "client", "server", GRAD_ROWS, upload=True, required=True),
        MessageSchema("grad_W", "client", "server", GRAD_ROWS, upload=True),
    ),
)


@dataclass
class PMFBlock:
    """A block of FedRec clients (pmf-batch) as a sharded run's worker holds it: its training
    entries (rows from 0), its U rows and its test entries (rows from 0, columns, ratings)."""

    lo: int
    entries: pmf.Entries
    U: np.ndarray
    test_rows: np.ndarray
    test_cols: np.ndarray
    test_vals: np.ndarray


@dataclass(frozen=True)
class PMFBlockSettings:
    """What a block's iteration and test errors need of the run's settings."""

    lam: float
    max_step: float
    rating_min: float
    rating_max: float
    clip: bool


class PMFBlocks(BlockRound):
    """FedRec's federated pmf-batch model in client blocks (``FedRec.block_round``): one batch
    iteration of a block is :func:`pmf_block_round` with the V the server sent and the current
    learning rate; its partials ``(sum of eq.-8 uploads by item, uploads per item, clipped U
    steps)``; its uploads ``grad_V``. The stochastic models walk clients in turn: refused."""

    upload_kinds = ("grad_V",)

    def __init__(self, st: PMFBlockSettings) -> None:
        self.st = st

    @classmethod
    def check(cls, config: Mapping[str, Any]) -> None:
        if config["model"] != "pmf-batch" or not config["federated"]:
            raise PrivauditError(
                "protocol 'fedrec': a sharded run runs the federated pmf-batch model only "
                "(the stochastic ones walk clients in turn)"
            )

    @classmethod
    def open(cls, protocol: Protocol, setup: RunSetup) -> BlockRun:
        """The fold, the initial factors (U drawn for all clients at once, as
        :meth:`FedRec.simulate`) and the server's loop of :meth:`FedRec.simulate` with the blocks'
        iterations and test errors (:meth:`round`, :meth:`tests`)."""
        cfg = setup.config
        cls.check(cfg)
        split_rng, init_rng, _, _ = setup.streams(4)
        st = FedRecSettings.of(cfg, [])
        fold = _Fold.of(setup.dataset, cfg, split_rng)
        transcript = protocol.open_transcript(
            cfg, setup.dataset, [], setup.seed, ["server"], **fold.public(), **st.public()
        )
        f = _Factors.initial(init_rng, fold.R_train.shape, st)
        entries = [pmf.Entries.from_csr(fold.R_train)]

        def block(index: int, lo: int, hi: int) -> PMFBlock:
            return PMFBlock(lo, entries_block(entries[0], lo, hi), f.U[lo:hi].copy(), *fold.block_tests(lo, hi))

        def train(clients: BlockClients) -> RunResult:
            entries.clear()  # the blocks hold the clients' entries now
            return _train_blocks(clients, transcript, st, fold, f)

        rounds = cls(PMFBlockSettings(st.lam, st.max_step, fold.rmin, fold.rmax, st.clip))
        return BlockRun(rounds, fold.R_train.shape[0], transcript, block, train)

    def private(self, block: PMFBlock) -> list[tuple[dict[str, np.ndarray], None]]:
        """Each client's real training items and ratings."""
        E = block.entries
        ip, items, ratings = E.indptr, E.cols.astype(np.int64), E.vals.copy()
        return [
            ({"items": items[ip[u] : ip[u + 1]], "ratings": ratings[ip[u] : ip[u + 1]]}, None)
            for u in range(E.shape[0])
        ]

    def round(self, block: PMFBlock, t: int, record: bool, V: np.ndarray, lr: float) -> BlockPart:
        part = pmf_block_round(block.U, block.entries, V, self.st.lam, lr, self.st.max_step, record)
        block.U = part.U
        return BlockPart(
            (part.total, part.counts, float(part.clipped)), [("grad_V", part.payloads)] if record else None
        )

    def tests(self, block: PMFBlock, V: np.ndarray) -> tuple[float, float, bool]:
        """The block's test error sums (:func:`error_sums`) and whether its U is finite."""
        st = self.st
        pred = pmf.predict(block.U, V, block.test_rows, block.test_cols)
        sq, ab = error_sums(pred, block.test_vals, st.rating_min, st.rating_max, st.clip)
        return sq, ab, bool(np.isfinite(block.U).all())

    def users(self, block: PMFBlock) -> np.ndarray:
        return block.U


def _train_blocks(clients: BlockClients, transcript: Any, st: FedRecSettings, fold: _Fold, f: _Factors) -> RunResult:
    """:meth:`FedRec.simulate`'s loop for the federated pmf-batch model without defenses, the
    clients' iterations and test errors computed block by block (:class:`PMFBlocks`)."""
    rmse, mae, seconds, clipped = [], [], 0.0, 0
    for t in range(st.T):
        tic = time.perf_counter()
        record = t in st.recorded
        if record:
            transcript.add(t, "server", "server", "state", {"V": f.V.copy()})
        total = clients.round(t, record, f.V, st.lr)
        grad, counts, k = total if total else (np.zeros_like(f.V), np.zeros(len(f.V)), 0.0)
        stepV, k2 = pmf.clip_rows(st.lr * pmf.item_average(grad, counts), st.max_step)
        f.V = f.V - stepV
        clipped += int(k) + k2
        st.lr *= st.decay
        seconds += time.perf_counter() - tic
        parts = clients.each("tests", f.V)
        f.U = f.U if all(p[2] for p in parts) else np.full_like(f.U, np.nan)
        f.check(t, st)
        r_, m_ = rmse_mae([(p[0], p[1]) for p in parts], len(fold.test_vals))
        rmse.append(r_)
        mae.append(m_)
    f.U = np.concatenate(clients.each("users"))
    utility = {"rmse": rmse[-1], "mae": mae[-1], "iteration_seconds": seconds / st.T, "clipped_steps": clipped}
    model = {
        "U": f.U,
        "V": f.V,
        "W": None,
        "train": fold.R_train,
        "test": fold.test,
        "test_rmse": np.asarray(rmse),
        "test_mae": np.asarray(mae),
        "lam": st.lam,
    }
    transcript.parties = ["server", *fold.senders]
    return RunResult(transcript, model, utility)


@register_protocol("fedrec")
class FedRec(Protocol):
    """Federated PMF(B), PMF(S), SVD++(S) with user-average / hybrid filling (module docstring)."""

    description = "FedRec (FedRec paper): federated PMF batch/stochastic and SVD++ with UA/HF virtual ratings"
    schema = SCHEMA  # declared message kinds, checked before any attack
    utility_specs = utility_specs_of("rmse", "mae")
    default_attack = "fedrec-rated-items"
    derived_keys = DERIVED_KEYS
    block_round = PMFBlocks  # the federated pmf-batch model runs in client blocks (privaudit.sharded)
    #: ``privaudit attack --protocol fedrec`` without a defense: user-average filling over rho
    default_defense_specs: tuple[str, ...] = ("sampling:filling=ua",)
    default_sweep_spec: str | None = "sampling.rho=0,1,2,3"
    parameters = (
        Param(
            "model", "pmf-batch", "pmf-batch (Algorithms 1-2), pmf-sgd or svdpp-sgd (Algorithms 4-5)", choices=MODELS
        ),
        Param("federated", True, "false: the unfederated (centralized) model with the same math"),
        Param("d", 20, "number of latent dimensions", ge=1),
        Param("T", 100, "iterations", ge=1),
        Param("lr", None, "initial learning rate gamma (default 0.8 batch, 0.01 stochastic)", type=float, gt=0),
        Param("lam", None, "regularization lambda (default 0.01 for every model, not tuned)", type=float, ge=0),
        Param("decay", 0.9, "learning-rate factor after every iteration", gt=0, le=1),
        Param(
            "init_scale",
            None,
            "initial factors uniform on (-init_scale/2, init_scale/2) (default 0.001 batch, 0.01 stochastic)",
            type=float,
            gt=0,
        ),
        Param("n_folds", 5, "folds of the ratings split (the test fold is the held-out part)", ge=2),
        Param("fold", 0, "which fold is the test set (0-based, below n_folds)", ge=0),
        Param(
            "chunk_users",
            None,
            "stochastic: clients run in lock-step against one V snapshot (1 = Algorithm 4 exactly; "
            "default 64 PMF, 4 SVD++)",
            type=int,
            ge=1,
        ),
        Param("resample", True, "draw the virtual items I'_u anew every iteration (Algorithm 2 line 1)"),
        Param(
            "record_rounds", [0, -1], "iterations whose server state and uploads are recorded (negative: from the end)"
        ),
        Param("clip", True, "clip test predictions to the rating range"),
        Param(
            "max_step",
            1.0,
            "batch style: clip every factor row's step to this norm (divergence guard on small data; 0 = off)",
            ge=0,
            nullable=True,
        ),
    )

    @classmethod
    def validate_config(cls, config: dict[str, Any]) -> None:
        if not config["fold"] < config["n_folds"]:
            cls.config_fail(f"fold must be in 0..{config['n_folds'] - 1}, got {config['fold']!r}")

    @staticmethod
    def recorded_rounds(config: Mapping[str, Any]) -> set[int]:
        T = int(config["T"])
        return {int(r) % T if r < 0 else int(r) for r in config["record_rounds"] if -T <= r < T}

    # ------------------------------------------------------------------ run
    @classmethod
    def release_count(cls, config: Mapping[str, Any]) -> int | None:
        """Every client uploads in every iteration: ``T`` releases (``record_rounds`` records
        only some of them)."""
        T = config.get("T")
        return int(T) if isinstance(T, int) and not isinstance(T, bool) else None

    def simulate(self, setup: RunSetup) -> RunResult:
        """Train one model on one fold; returns transcript, model and utility.

        ``model``: dict with ``U`` (n x d), ``V`` (m x d), ``W`` (SVD++), ``train``/``test``
        (CSR n x m), ``test_rmse``/``test_mae`` per iteration (arrays of length T).
        ``utility``: ``rmse``, ``mae`` (test fold, real ratings), ``iteration_seconds``.
        """
        split_rng, init_rng, order_rng, channel_rng = setup.streams(4)
        st = FedRecSettings.of(setup.config, setup.defenses)
        fold = _Fold.of(setup.dataset, setup.config, split_rng)
        transcript, channel = self.start(
            setup, ["server", *fold.senders], fold.private(), channel_rng, **fold.public(), **st.public()
        )
        f = _Factors.initial(init_rng, fold.R_train.shape, st)
        run = _Iteration(st, fold, channel, order_rng)
        rmse, mae, seconds, clipped, E = [], [], 0.0, 0, None
        for t in range(st.T):
            tic = time.perf_counter()
            if E is None or st.resample:
                data = channel.client_data(ClientData.from_ratings(fold.R_train))
                E = pmf.Entries.from_csr(data.ratings, data.virtual)
            clipped += run.step(t, f, E)
            st.lr *= st.decay
            seconds += time.perf_counter() - tic
            f.check(t, st)
            r_, m_ = fold.test_errors(f, st.clip)
            rmse.append(r_)
            mae.append(m_)
        utility = {"rmse": rmse[-1], "mae": mae[-1], "iteration_seconds": seconds / st.T, "clipped_steps": clipped}
        sq, ab, count = fold.user_errors(f, st.clip)
        per_user = {"rmse": UserUtility.sums(sq, count, root=True), "mae": UserUtility.sums(ab, count)}
        model = {
            "U": f.U,
            "V": f.V,
            "W": f.W,
            "train": fold.R_train,
            "test": fold.test,
            "test_rmse": np.asarray(rmse),
            "test_mae": np.asarray(mae),
            "lam": st.lam,
        }
        return RunResult(transcript, model, utility, per_user)


@dataclass
class FedRecSettings:
    """The resolved hyperparameters of a FedRec run (``lr`` decays in place every iteration)."""

    model: str
    federated: bool
    d: int
    T: int
    lam: float
    lr: float
    decay: float
    init_scale: float
    chunk: int
    max_step: float
    resample: bool
    clip: bool
    recorded: frozenset[int]
    filling: str | None
    t_predict: int
    t_local: int

    @property
    def batch(self) -> bool:
        return self.model == "pmf-batch"

    @property
    def svd(self) -> bool:
        return self.model == "svdpp-sgd"

    @classmethod
    def of(cls, cfg: Mapping[str, Any], defenses: Sequence[Defense]) -> FedRecSettings:
        model = cfg["model"]

        def given(key: str, defaults: Mapping[str, Any]) -> Any:
            return defaults[model] if cfg[key] is None else cfg[key]

        filling, t_predict, t_local = hf_settings(defenses)
        return cls(
            model,
            bool(cfg["federated"]),
            int(cfg["d"]),
            int(cfg["T"]),
            float(given("lam", DEFAULT_LAM)),
            float(given("lr", DEFAULT_LR)),
            float(cfg["decay"]),
            float(given("init_scale", DEFAULT_INIT)),
            int(given("chunk_users", DEFAULT_CHUNK)),
            float(cfg["max_step"] or 0.0),
            bool(cfg["resample"]),
            bool(cfg["clip"]),
            frozenset(FedRec.recorded_rounds(cfg)),
            filling,
            t_predict,
            t_local,
        )

    def public(self) -> dict[str, Any]:
        """The derived values a transcript records (``lr_used``, ``lam_used``, ``chunk_used``)."""
        return {"lr_used": self.lr, "lam_used": self.lam, "chunk_used": self.chunk}


@dataclass
class _Fold:
    """The training ratings (CSR n x m) and the test entries of one fold, with the rating range."""

    R_train: sp.csr_matrix
    test: sp.csr_matrix
    test_rows: np.ndarray
    test_cols: np.ndarray
    test_vals: np.ndarray
    rmin: float
    rmax: float
    rating_step: float

    @classmethod
    def of(cls, dataset: Any, cfg: Mapping[str, Any], rng: np.random.Generator) -> _Fold:
        folds = list(kfold_ratings(dataset, int(cfg["n_folds"]), rng))
        train_ds, test_ds = folds[int(cfg["fold"])]
        R_train = sp.csr_matrix(train_ds.ratings, dtype=np.float64)
        R_train.sort_indices()
        coo = sp.csr_matrix(test_ds.ratings, dtype=np.float64).tocoo()
        rows, cols = coo.row.astype(np.int64), coo.col.astype(np.int64)
        scale = (float(dataset.rating_min), float(dataset.rating_max), float(dataset.rating_step))
        return cls(R_train, sp.csr_matrix(test_ds.ratings), rows, cols, coo.data, *scale)

    @property
    def senders(self) -> list[str]:
        return [f"client:{u}" for u in range(self.R_train.shape[0])]

    def private(self) -> dict[str, dict[str, np.ndarray]]:
        """Ground truth: each client's real training items (int64 sorted) and ratings."""
        R, out = self.R_train, {}
        for u, party in enumerate(self.senders):
            lo, hi = R.indptr[u], R.indptr[u + 1]
            out[party] = {"items": R.indices[lo:hi].astype(np.int64), "ratings": R.data[lo:hi].copy()}
        return out

    def public(self) -> dict[str, Any]:
        n, m = self.R_train.shape
        return {
            "n_items": int(m),
            "n_users": int(n),
            "rating_min": self.rmin,
            "rating_max": self.rmax,
            "rating_step": self.rating_step,
        }

    def test_errors(self, f: _Factors, clip: bool) -> tuple[float, float]:
        """(RMSE, MAE) of the test entries; the error sums are added per client block in block
        order (:func:`~privaudit.protocols.blocks.error_sums`), as a sharded run's workers do."""
        implicit = self.R_train if f.W is not None else None
        pred = pmf.predict(f.U, f.V, self.test_rows, self.test_cols, f.W, implicit, exclude_self=False)
        cuts = np.searchsorted(self.test_rows, [lo for lo, _ in block_ranges(self.R_train.shape[0], CLIENT_BLOCK)])
        parts = [
            error_sums(p, r, self.rmin, self.rmax, clip)
            for p, r in zip(np.split(pred, cuts[1:]), np.split(self.test_vals, cuts[1:]))
        ]
        return rmse_mae(parts, len(pred))

    def user_errors(self, f: _Factors, clip: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per client: the test entries' squared-error sum, absolute-error sum and count (the
        contributions whose ratios of sums are :meth:`test_errors`' RMSE and MAE)."""
        implicit = self.R_train if f.W is not None else None
        pred = pmf.predict(f.U, f.V, self.test_rows, self.test_cols, f.W, implicit, exclude_self=False)
        if clip:
            pred = np.clip(pred, self.rmin, self.rmax)
        return error_sums_by_user(self.test_vals, pred, self.test_rows, self.R_train.shape[0])

    def block_tests(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows (from 0), columns and ratings of the test entries of clients ``lo..hi-1``."""
        a, b = np.searchsorted(self.test_rows, [lo, hi])
        return self.test_rows[a:b] - lo, self.test_cols[a:b], self.test_vals[a:b]


def rmse_mae(parts: Sequence[tuple[float, float]], n: int) -> tuple[float, float]:
    """RMSE and MAE from the blocks' error sums (folded in block order) over ``n`` test entries."""
    sq, ab = fold(parts) if parts else (0.0, 0.0)
    return float(np.sqrt(sq / max(n, 1))), float(ab / max(n, 1))


@dataclass
class _Factors:
    """U (n x d, the clients'), V (m x d) and W (m x d, SVD++) of a FedRec run."""

    U: np.ndarray
    V: np.ndarray
    W: np.ndarray | None

    @classmethod
    def initial(cls, rng: np.random.Generator, shape: tuple[int, int], st: FedRecSettings) -> _Factors:
        """U, V then W from ``rng``, uniform on (-init_scale/2, init_scale/2). U is one draw for
        all clients (the documented reproductions' order); a sharded run draws it the same way
        and hands each worker its blocks' rows."""
        n, m = shape
        U = pmf.init_factors(rng, (n, st.d), st.init_scale)
        V = pmf.init_factors(rng, (m, st.d), st.init_scale)
        W = pmf.init_factors(rng, (m, st.d), st.init_scale) if st.svd else None
        return cls(U, V, W)

    def check(self, t: int, st: FedRecSettings) -> None:
        """A one-line error when training diverged (non-finite factors) at iteration ``t``."""
        if not (
            np.isfinite(self.U).all() and np.isfinite(self.V).all() and (self.W is None or np.isfinite(self.W).all())
        ):
            raise PrivauditError(
                f"protocol 'fedrec': {st.model} training diverged at iteration {t} (non-finite factors); "
                f"lower lr (used {st.lr / st.decay:.3g} at that iteration) or set max_step"
            )


@dataclass
class _Iteration:
    """One iteration of the chosen model (HF's local steps first), updating the factors in place."""

    st: FedRecSettings
    fold: _Fold
    channel: Channel
    order_rng: np.random.Generator

    def step(self, t: int, f: _Factors, E: pmf.Entries) -> int:
        """Returns the number of clipped row steps."""
        st = self.st
        if st.filling == "hf" and bool(E.virtual.any()):
            _hybrid_filling(t, f, E, st)
        if not st.batch:
            _sgd_iteration(t, f, E, st, self.channel, self.order_rng)
            return 0
        if not st.federated:
            f.U, f.V, k = pmf.batch_centralized_step(f.U, f.V, E, st.lam, st.lr, st.max_step)
            return k
        return _batch_iteration(t, f, E, st, self.channel)


def _hybrid_filling(t: int, f: _Factors, E: pmf.Entries, st: FedRecSettings) -> None:
    """Algorithm 3: ``t_local`` local steps on U, then (from ``t_predict`` on) the virtual ratings
    replaced by the local predictions (eq. 6)."""
    offset = None
    if st.svd:
        S, cnt = pmf.implicit_sum(f.W, E.matrix(np.ones(len(E.rows))))
        offset = S / np.sqrt(np.maximum(cnt, 1))[:, None]
    f.U = _local_steps(f.U, f.V, E, st.lam, st.lr, st.t_local, offset, st.max_step if st.batch else 0.0)
    if t >= st.t_predict:
        vi = np.flatnonzero(E.virtual)
        imp = E.matrix(np.ones(len(E.rows))) if st.svd else None
        E.vals[vi] = pmf.predict(f.U, f.V, E.rows[vi], E.cols[vi], f.W, imp, exclude_self=True)


def _batch_iteration(t: int, f: _Factors, E: pmf.Entries, st: FedRecSettings, channel: Channel) -> int:
    """One federated iteration of Algorithms 1-2: every block of clients steps U_u (eq. 7) and
    computes its uploads (eq. 8, :func:`~privaudit.protocols.blocks.pmf_block_round`); the server
    averages per item (eq. 9) and steps V. Returns the clipped row steps."""
    m = f.V.shape[0]
    if t in st.recorded:
        channel.transcript.add(t, "server", "server", "state", {"V": f.V.copy()})
    Vs = channel.download({"V": f.V})["V"]
    uploads = t in st.recorded or bool(channel.defenses)
    total, payloads, U = Accumulator(), [], np.empty_like(f.U)
    for lo, hi in block_ranges(E.shape[0], CLIENT_BLOCK):
        part = pmf_block_round(f.U[lo:hi], entries_block(E, lo, hi), Vs, st.lam, st.lr, st.max_step, uploads)
        U[lo:hi] = part.U
        total.add(part.total, part.counts, part.clipped)
        payloads += part.payloads or []
    f.U = U
    grad, counts, clipped = total.values if total.values else (np.zeros_like(f.V), np.zeros(m), 0.0)
    if uploads:
        sent = channel.send(t, "grad_V", [f"client:{u}" for u in range(E.shape[0])], payloads, record=t in st.recorded)
        if channel.defenses:
            agg = channel.sum(sent, rows=m)
            grad = np.asarray(agg.get("values", np.zeros_like(f.V)), dtype=np.float64).reshape(f.V.shape)
            counts = np.asarray(agg.get("counts", np.bincount(E.cols, minlength=m)))
    stepV, k2 = pmf.clip_rows(st.lr * pmf.item_average(grad, counts), st.max_step)
    f.V = f.V - stepV  # eq. 9, Algorithm 1 line 8
    return int(clipped) + k2


def _sgd_iteration(t: int, f: _Factors, E: pmf.Entries, st: FedRecSettings, channel: Channel, order_rng) -> None:
    """One iteration of Algorithm 4 (in place on U, V, W)."""
    U, V, W, lr = f.U, f.V, f.W, st.lr
    m, d = V.shape
    order, _ = pmf.entry_order(E, order_rng)
    for c, chunk in enumerate(pmf.user_chunks(E.counts, st.chunk, order_rng)):
        users, lengths, P = pmf.padded_chunk(E, order, chunk)
        Uc = U[users]
        valid = P >= 0
        if not st.federated:
            out = pmf.sgd_chunk(Uc, V, E, P, lengths, st.lam, lr, W, federated=False)
            U[users] = Uc
            if W is not None:
                pmf.scatter_rows(W, E.cols[P[valid]], out["grad_W"][valid], lr)
            continue
        record = t in st.recorded
        if record:
            state = {"V": V.copy()} if W is None else {"V": V.copy(), "W": W.copy()}
            channel.transcript.add(t, "server", "server", "state", state, {"chunk": c})
        down = channel.download({"V": V} if W is None else {"V": V, "W": W})
        out = pmf.sgd_chunk(Uc, down["V"], E, P, lengths, st.lam, lr, down.get("W"), federated=True)
        U[users] = Uc
        walk_items = E.cols[np.where(valid, P, 0)]
        for kind, target in (("grad_V", V), ("grad_W", W)):
            if kind not in out:
                continue
            G = out[kind]
            if not channel.defenses and not record:
                pmf.scatter_rows(target, walk_items[valid], G[valid], lr)
                continue
            payloads = [{"items": walk_items[b, : lengths[b]], "values": G[b, : lengths[b]]} for b in range(len(users))]
            sent = channel.send(t, kind, [f"client:{u}" for u in users], payloads, record=record, meta={"chunk": c})
            agg = channel.sum(sent, rows=m)
            target -= lr * np.asarray(agg.get("values", np.zeros((m, d))), dtype=np.float64).reshape(m, d)


def _local_steps(U, V, E, lam, lr, steps, offset=None, max_step=0.0):
    """Algorithm 3 lines 2-5: ``steps`` eq.-7 steps on U (offset: SVD++ implicit term)."""
    if offset is None:
        return pmf.batch_local_steps(U, V, E, lam, lr, steps, max_step)
    U = U.copy()
    has = E.counts > 0
    for _ in range(int(steps)):
        g = pmf.batch_user_gradient(U + offset, V, E, lam) - lam * offset
        U[has] -= lr * g[has]
    return U

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
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.data.splits import kfold_ratings
from privaudit.defenses.base import CLIENT_DATA, ClientData, Defense
from privaudit.errors import PrivauditError
from privaudit.models import pmf
from privaudit.params import Param
from privaudit.protocols.base import Protocol, RunResult, RunSetup, utility_specs_of
from privaudit.registry import register_protocol
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


@register_protocol("fedrec")
class FedRec(Protocol):
    """Federated PMF(B), PMF(S), SVD++(S) with user-average / hybrid filling (module docstring)."""

    description = "FedRec (FedRec paper): federated PMF batch/stochastic and SVD++ with UA/HF virtual ratings"
    schema = SCHEMA  # declared message kinds, checked before any attack
    utility_specs = utility_specs_of("rmse", "mae")
    default_attack = "fedrec-rated-items"
    derived_keys = DERIVED_KEYS
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
    def simulate(self, setup: RunSetup) -> RunResult:
        """Train one model on one fold; returns transcript, model and utility.

        ``model``: dict with ``U`` (n x d), ``V`` (m x d), ``W`` (SVD++), ``train``/``test``
        (CSR n x m), ``test_rmse``/``test_mae`` per iteration (arrays of length T).
        ``utility``: ``rmse``, ``mae`` (test fold, real ratings), ``iteration_seconds``.
        """
        cfg, dataset, defenses = setup.config, setup.dataset, setup.defenses
        split_rng, init_rng, order_rng, channel_rng = setup.streams(4)
        model_name = cfg["model"]
        batch = model_name == "pmf-batch"
        svd = model_name == "svdpp-sgd"
        federated = bool(cfg["federated"])
        d, T = int(cfg["d"]), int(cfg["T"])
        lam = float(DEFAULT_LAM[model_name] if cfg["lam"] is None else cfg["lam"])
        lr = float(DEFAULT_LR[model_name] if cfg["lr"] is None else cfg["lr"])
        filling, t_predict, t_local = hf_settings(defenses)
        chunk = int(DEFAULT_CHUNK[model_name] if cfg["chunk_users"] is None else cfg["chunk_users"])
        max_step = float(cfg["max_step"] or 0.0)
        clipped = 0

        folds = list(kfold_ratings(dataset, int(cfg["n_folds"]), split_rng))
        train_ds, test_ds = folds[int(cfg["fold"])]
        R_train = sp.csr_matrix(train_ds.ratings, dtype=np.float64)
        R_train.sort_indices()
        R_test = sp.csr_matrix(test_ds.ratings, dtype=np.float64).tocoo()
        n, m = R_train.shape
        rmin, rmax = float(dataset.rating_min), float(dataset.rating_max)

        senders = [f"client:{u}" for u in range(n)]
        private = {
            party: {
                "items": R_train.indices[R_train.indptr[u] : R_train.indptr[u + 1]].astype(np.int64),
                "ratings": R_train.data[R_train.indptr[u] : R_train.indptr[u + 1]].copy(),
            }
            for u, party in enumerate(senders)
        }
        transcript, channel = self.start(
            setup,
            ["server", *senders],
            private,
            channel_rng,
            n_items=int(m),
            n_users=int(n),
            rating_min=rmin,
            rating_max=rmax,
            rating_step=float(dataset.rating_step),
            lr_used=lr,
            lam_used=lam,
            chunk_used=chunk,
        )

        scale = float(DEFAULT_INIT[model_name] if cfg["init_scale"] is None else cfg["init_scale"])
        U = pmf.init_factors(init_rng, (n, d), scale)
        V = pmf.init_factors(init_rng, (m, d), scale)
        W = pmf.init_factors(init_rng, (m, d), scale) if svd else None
        recorded = self.recorded_rounds(cfg)
        test_rows, test_cols, test_vals = R_test.row.astype(np.int64), R_test.col.astype(np.int64), R_test.data
        real_implicit = R_train if svd else None
        hist_rmse, hist_mae = [], []
        seconds = 0.0
        E = None

        for t in range(T):
            tic = time.perf_counter()
            record = t in recorded
            if E is None or cfg["resample"]:
                data = channel.client_data(ClientData.from_ratings(R_train))
                E = pmf.Entries.from_csr(data.ratings, data.virtual)
            has_virtual = bool(E.virtual.any())
            if filling == "hf" and has_virtual:
                offset = None
                if svd:
                    S, cnt = pmf.implicit_sum(W, E.matrix(np.ones(len(E.rows))))
                    offset = S / np.sqrt(np.maximum(cnt, 1))[:, None]
                U = _local_steps(U, V, E, lam, lr, t_local, offset, max_step if batch else 0.0)
                if t >= t_predict:
                    vi = np.flatnonzero(E.virtual)
                    imp = E.matrix(np.ones(len(E.rows))) if svd else None
                    E.vals[vi] = pmf.predict(U, V, E.rows[vi], E.cols[vi], W, imp, exclude_self=True)
            if batch:
                U, V, k = self._batch_iteration(U, V, E, lam, lr, federated, channel, senders, t, record, max_step)
                clipped += k
            else:
                self._sgd_iteration(U, V, W, E, lam, lr, federated, channel, senders, t, record, order_rng, chunk)
            lr *= float(cfg["decay"])
            seconds += time.perf_counter() - tic
            if not (np.isfinite(U).all() and np.isfinite(V).all() and (W is None or np.isfinite(W).all())):
                raise PrivauditError(
                    f"protocol 'fedrec': {model_name} training diverged at iteration {t} (non-finite factors); "
                    f"lower lr (used {lr / float(cfg['decay']):.3g} at that iteration) or set max_step"
                )
            pred = self._predict(U, V, W, real_implicit, test_rows, test_cols, rmin, rmax, cfg["clip"])
            r_, m_ = pmf.rmse_mae(pred, test_vals)
            hist_rmse.append(r_)
            hist_mae.append(m_)

        utility = {
            "rmse": hist_rmse[-1],
            "mae": hist_mae[-1],
            "iteration_seconds": seconds / T,
            "clipped_steps": clipped,
        }
        model = {
            "U": U,
            "V": V,
            "W": W,
            "train": R_train,
            "test": sp.csr_matrix(test_ds.ratings),
            "test_rmse": np.asarray(hist_rmse),
            "test_mae": np.asarray(hist_mae),
            "lam": lam,
        }
        return RunResult(transcript, model, utility)

    # ------------------------------------------------------------------ pieces
    @staticmethod
    def _predict(U, V, W, implicit, rows, cols, rmin, rmax, clip) -> np.ndarray:
        pred = pmf.predict(U, V, rows, cols, W, implicit, exclude_self=False)
        return np.clip(pred, rmin, rmax) if clip else pred

    @staticmethod
    def _batch_iteration(U, V, E, lam, lr, federated, channel, senders, t, record, max_step=0.0):
        """One iteration of Algorithms 1-2; returns (U, V, number of clipped row steps)."""
        if not federated:
            return pmf.batch_centralized_step(U, V, E, lam, lr, max_step)
        m, d = V.shape
        if record:
            channel.transcript.add(t, "server", "server", "state", {"V": V.copy()})
        Vs = channel.download({"V": V})["V"]
        has = E.counts > 0
        U = U.copy()
        stepU, k1 = pmf.clip_rows(lr * pmf.batch_user_gradient(U, Vs, E, lam)[has], max_step)
        U[has] -= stepU  # Algorithm 2 lines 3-4 (eq. 7)
        G = pmf.grad_V_entries(U, Vs, E, lam)  # eq. 8, with the updated U_u
        if not channel.defenses and not record:
            total = np.zeros((m, d))
            pmf.scatter_rows(total, E.cols, G, -1.0)
            counts = np.bincount(E.cols, minlength=m)
        else:
            ip = E.indptr
            payloads = [
                {"items": E.cols[ip[u] : ip[u + 1]], "values": G[ip[u] : ip[u + 1]]} for u in range(len(senders))
            ]
            sent = channel.send(t, "grad_V", senders, payloads, record=record)
            agg = channel.sum(sent, rows=m)
            total = np.asarray(agg.get("values", np.zeros((m, d))), dtype=np.float64).reshape(m, d)
            counts = np.asarray(agg.get("counts", np.bincount(E.cols, minlength=m)))
        stepV, k2 = pmf.clip_rows(lr * pmf.item_average(total, counts), max_step)
        return U, V - stepV, k1 + k2  # eq. 9, Algorithm 1 line 8

    @staticmethod
    def _sgd_iteration(U, V, W, E, lam, lr, federated, channel, senders, t, record, order_rng, chunk_users):
        """One iteration of Algorithm 4 (in place on U, V, W)."""
        m, d = V.shape
        order, _ = pmf.entry_order(E, order_rng)
        for c, chunk in enumerate(pmf.user_chunks(E.counts, chunk_users, order_rng)):
            users, lengths, P = pmf.padded_chunk(E, order, chunk)
            Uc = U[users]
            if not federated:
                out = pmf.sgd_chunk(Uc, V, E, P, lengths, lam, lr, W, federated=False)
                U[users] = Uc
                if W is not None:
                    valid = P >= 0
                    pmf.scatter_rows(W, E.cols[P[valid]], out["grad_W"][valid], lr)
                continue
            if record:
                state = {"V": V.copy()}
                if W is not None:
                    state["W"] = W.copy()
                channel.transcript.add(t, "server", "server", "state", state, {"chunk": c})
            down = channel.download({"V": V} if W is None else {"V": V, "W": W})
            out = pmf.sgd_chunk(Uc, down["V"], E, P, lengths, lam, lr, down.get("W"), federated=True)
            U[users] = Uc
            valid = P >= 0
            walk_items = E.cols[np.where(valid, P, 0)]
            for kind, key, target in (("grad_V", "grad_V", V), ("grad_W", "grad_W", W)):
                if key not in out:
                    continue
                G = out[key]
                if not channel.defenses and not record:
                    pmf.scatter_rows(target, walk_items[valid], G[valid], lr)
                    continue
                payloads = [
                    {"items": walk_items[b, : lengths[b]], "values": G[b, : lengths[b]]} for b in range(len(users))
                ]
                sent = channel.send(t, kind, [senders[u] for u in users], payloads, record=record, meta={"chunk": c})
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

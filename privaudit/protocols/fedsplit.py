"""FedSPLIT: one-shot federated NMF with knowledge distillation (FedSPLIT paper §3.3, Algorithm 1).

Parties: the server ``server`` (the paper's processor) and one client ``client:<g>`` per group
of users (g = 0..N-1). Users are assigned at random to groups whose sizes are uniform in
``[group_min, group_max]`` (:func:`privaudit.data.random_groups`; 3..30 as the paper §4.1).
Each user's ratings are split ``1 - test_fraction`` / ``test_fraction`` into the group's
training ratings X^g and its held-out ratings (:func:`privaudit.data.holdout_split`, per user;
the paper holds out 20 % of the whole dataset).

Round 0 — global mean exchange (§3.3.1): every group uploads ``mean`` = {``sum``: sum of its
ratings, ``count``: their number (int64)} through :meth:`Channel.send`; the server forms
mu^g = sum / count and mu^Global = mean_g mu^g (eq. 14; ``global_mean="ratings"`` uses
sum(sums) / sum(counts) instead) and sends ``global_mean`` = {``mu``} to each group.

Local CF (Algorithm 1 lines 2-5): each group fits :class:`~privaudit.models.cnmf.CNMF` on X^g
with mu = mu^Global and k^g = min(k, n^g - 1) (the paper's upper bound is min(n^g, 21) - 1);
all groups are fitted at once in one vectorised pass (:func:`~privaudit.models.cnmf.block_columns`).

Round 1 — one-shot exchange: each group uploads ``H`` = {``H_T``: (H^g)^T (m x k^g), ``b_H``:
b_H^g (m,)} through :meth:`Channel.send` (a ``laplace``/``gaussian`` defense perturbs exactly
these floats). The server stacks X = [(H^1)^T, ..., (H^N)^T] (m x sum k^g, eq. 15; negative
entries — possible only under noise — are projected to 0), factorises it with scikit-learn's
``NMF(n_components=K, init="nndsvd", solver="mu")`` into W^Global (m x K) and H^Global
(K x sum k^g), averages b_H^Global = mean_g b_H^g (eq. 16), records that as a ``state``
message to itself, and sends each group ``M`` = {``M``: M^g = H^Global[:, block g] (K x k^g,
eq. 17), ``W_global``, ``b_H_global``}. The group distils W*^g = W^g (M^g)^T (eq. 18) and
predicts X̂^g_ij = W*^g_i: W^Global_j:^T + b_W^g_i + b_H^Global_j + mu^Global (eq. 19),
clipped to the rating range.

Transcript: the public config (every hyperparameter, ``n_items``, rating range, defenses);
per group a ``private`` message (round 0) with its training ratings — ``users`` (row of the
rating inside the group, int64), ``items`` (int64), ``ratings`` (float64), ``user_ids``
(dataset user indices of the n^g members) and ``n_users`` (n^g, int64 scalar); every upload
and download; the server's ``state``. Every message between two parties carries
``meta["bytes"]`` (payload bytes as sent), the communication summary of §3.3.5; the totals
are in the utility (``bytes_up``, ``bytes_down``, ``messages_up``, ``messages_down``).

Utility: per group, the RMSE on its held-out ratings of its local CNMF (eq. 7, "before") and of
FedSPLIT (eq. 19, "after"); ``rmse_local``/``rmse_fedsplit`` are their means over groups
(``rmse`` repeats ``rmse_fedsplit``, the utility reports plot)
(with ``_ci95`` half-widths), ``rmse_drop`` their difference, ``improved_fraction`` the
fraction of groups whose RMSE fell; ``rmse_central`` is the non-private CNMF fitted on all
training ratings (``centralized=false`` skips it), ``rmse_*_pooled`` the RMSEs over all held-out
ratings. The model dict holds the factors and the per-group RMSE arrays.

Departures: no Optuna tuning — all groups share the hyperparameters of the config (within the
paper's tuning ranges; see docs/reproduction.md), and the server's K is fixed rather than
cross-validated over 2..30; the split is per user (every user keeps a training rating).
Randomness: one seed, spawned into independent streams for the split, the grouping, the
factor initialisation, the channel and the server's NNDSVD (so a noise sweep keeps groups,
split and initial factors fixed).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from privaudit.data import holdout_split, random_groups
from privaudit.metrics import mean_ci95
from privaudit.models.cnmf import CNMF, block_columns, observed
from privaudit.params import Param
from privaudit.protocols.base import Channel, Protocol, RunResult, RunSetup, utility_specs_of
from privaudit.registry import register_protocol
from privaudit.results import UserUtility
from privaudit.schema import GROUP_PRIVATE, MessageSchema, PayloadField, ProtocolSchema

__all__ = ["FedSPLIT", "cnmf_from_config"]

#: Config keys the protocol fills in itself.
DERIVED_KEYS = ("n_items", "n_groups", "rating_min", "rating_max", "rating_step", "defenses")


def cnmf_from_config(config: Mapping[str, Any], n_components: int | None = None) -> CNMF:
    """The :class:`CNMF` of a FedSPLIT config (public: the adversary builds the same one)."""
    return CNMF(
        n_components=int(n_components if n_components is not None else config["k"]),
        alpha=float(config["alpha"]),
        beta=float(config["beta"]),
        gamma=float(config["gamma"]),
        delta=float(config["delta"]),
        eta_W=float(config["eta_W"]),
        eta_H=float(config["eta_H"]),
        n_iter=int(config["n_iter"]),
        init_high=float(config["init_high"]),
        rating_range=(float(config.get("rating_min", 1.0)), float(config.get("rating_max", 5.0))),
    )


def group_ranks(n_users: np.ndarray, k: int) -> np.ndarray:
    """k^g = min(k, n^g - 1), at least 1 (FedSPLIT paper §4.1 bounds k^g by min(n^g, 21) - 1)."""
    return np.maximum(1, np.minimum(int(k), np.asarray(n_users, dtype=np.int64) - 1))


def _group_rmse(group: np.ndarray, err2: np.ndarray, n_groups: int) -> np.ndarray:
    counts = np.bincount(group, minlength=n_groups)
    sums = np.bincount(group, err2, minlength=n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt(sums / counts)


#: The messages a transcript of this protocol holds (checked before any attack reads one).
SCHEMA = ProtocolSchema(
    config_keys=("K", "k", "n_items", "rating_min", "rating_max", "global_mean"),
    dims={"m": "n_items", "users": lambda c, d: d["users"]},
    messages=(
        MessageSchema("private", "client", "self", GROUP_PRIVATE),
        MessageSchema(
            "mean",
            "client",
            "server",
            (PayloadField("sum", "float", ()), PayloadField("count", "number", ())),
            upload=True,
        ),
        MessageSchema("global_mean", "server", "client", (PayloadField("mu", "float", ()),)),
        MessageSchema(
            "H",
            "client",
            "server",
            (PayloadField("H_T", "float", ("m", "@k")), PayloadField("b_H", "float", ("m",))),
            upload=True,
            required=True,
        ),
        MessageSchema(
            "state",
            "server",
            "self",
            (
                PayloadField("X", "float", ("m", "@c")),
                PayloadField("W_global", "float", ("m", "K_joint")),
                PayloadField("H_global", "float", ("K_joint", "@c")),
                PayloadField("b_H_global", "float", ("m",)),
                PayloadField("mu_global", "float", ()),
                PayloadField("offsets", "int", (None,)),
            ),
        ),
        MessageSchema(
            "M",
            "server",
            "client",
            (
                PayloadField("M", "float", ("K_joint", "@k")),
                PayloadField("W_global", "float", ("m", "K_joint")),
                PayloadField("b_H_global", "float", ("m",)),
            ),
        ),
    ),
)


@register_protocol("fedsplit")
class FedSPLIT(Protocol):
    description = "One-shot federated NMF: local CNMF per group, joint NMF of the item factors, distillation"
    schema = SCHEMA  # declared message kinds, checked before any attack
    utility_specs = utility_specs_of("rmse")
    default_attack = "fedsplit-inference"
    derived_keys = DERIVED_KEYS
    attacker = "server"
    parameters = (
        Param("group_min", 3, "smallest group size (users), FedSPLIT §4.1: 3", ge=1),
        Param("group_max", 30, "largest group size (users), FedSPLIT §4.1: 30", ge=1),
        Param("test_fraction", 0.2, "fraction of each user's ratings held out for the per-group RMSE", gt=0, lt=1),
        Param("k", 5, "local latent dimension; group g uses k^g = min(k, n^g - 1)", ge=1),
        Param("K", 20, "components of the server's joint NMF (eq. 15-17)", ge=1),
        Param("alpha", 0.08, "CNMF regularisation of W (eq. 9, scaled by rating counts as Surprise)", ge=0),
        Param("beta", 0.08, "CNMF regularisation of H (eq. 9)", ge=0),
        Param("gamma", 0.02, "CNMF regularisation of the user biases b_W (eq. 10)", ge=0),
        Param("delta", 0.02, "CNMF regularisation of the item biases b_H (eq. 11)", ge=0),
        Param("eta_W", 0.005, "learning rate of the user-bias step (eq. 10); eta_W * (1 + gamma) < 1", gt=0),
        Param("eta_H", 0.005, "learning rate of the item-bias step (eq. 11); eta_H * (1 + delta) < 1", gt=0),
        Param("n_iter", 100, "CNMF iterations (local, centralized, and the adversary's fit)", ge=1),
        Param("init_high", 0.1, "W and H start uniform in [0, init_high]", gt=0),
        Param("server_max_iter", 1000, "maximum iterations of the server's NMF", ge=1),
        Param(
            "global_mean",
            "groups",
            "'groups': mu^Global = mean of the group means (eq. 14); 'ratings': mean of all ratings",
            choices=("groups", "ratings"),
        ),
        Param("centralized", True, "also fit the non-private CNMF on all training ratings (utility rmse_central)"),
        Param("k_central", 15, "latent dimension of the non-private CNMF", ge=1),
    )

    @classmethod
    def validate_config(cls, config: dict[str, Any]) -> None:
        fail = cls.config_fail

        if config["group_min"] > config["group_max"]:
            fail(f"group_min ({config['group_min']}) exceeds group_max ({config['group_max']})")
        for key, reg in (("eta_W", "gamma"), ("eta_H", "delta")):
            if not config[key] * (1 + config[reg]) < 1:
                fail(f"{key} must be positive with {key} * (1 + {reg}) < 1, got {config[key]!r}")

    @classmethod
    def release_count(cls, config: Mapping[str, Any]) -> int | None:
        """Every group sends twice: its rating sum and count (round 0) and its ``H`` factor
        (round 1)."""
        return 2

    def simulate(self, setup: RunSetup) -> RunResult:
        """Run FedSPLIT on ``setup.dataset`` (a RatingsDataset); see the module docstring.

        ``model``: dict with ``groups`` (list of dataset user-index arrays), ``k_g`` (N,),
        ``W`` (n x k, every user's local W row, zero beyond k^g), ``b_W`` (n,), ``H`` (N, k, m)
        local item factors, ``b_H`` (N, m), ``W_global`` (m x K), ``H_global`` (K x sum k^g),
        ``b_H_global`` (m,), ``mu_global``, ``W_star`` (n x K, eq. 18), and the per-group
        ``rmse_local``, ``rmse_fedsplit`` (N,), ``n_users`` (N,), ``n_ratings`` (N,).
        """
        cfg, dataset = setup.config, setup.dataset
        split_rng, group_rng, init_rng, channel_rng, server_rng = setup.streams(5)
        m = dataset.ratings.shape[1]
        train, test = holdout_split(dataset, cfg["test_fraction"], split_rng)
        groups = Groups.draw(dataset, cfg, group_rng)
        N = groups.N
        Xtr, rows, cols, vals = observed(train.ratings)
        _, te_rows, te_cols, te_vals = observed(test.ratings)

        senders = [f"client:{g}" for g in range(N)]
        transcript, channel = self.start(
            setup,
            ["server", *senders],
            _private_messages(groups, senders, rows, cols, vals),
            channel_rng,
            n_items=int(m),
            n_groups=int(N),
            rating_min=float(dataset.rating_min),
            rating_max=float(dataset.rating_max),
            rating_step=float(dataset.rating_step),
        )
        mu_global, mu_clients = _mean_round(channel, transcript, senders, groups, rows, vals, cfg["global_mean"])
        local = _local_fit(transcript.config, cfg["k"], groups, Xtr, mu_clients, init_rng, m, te_rows, te_cols)
        server = _server_round(channel, transcript, senders, groups.k_g, local, mu_global, cfg, server_rng)
        W_star, fed_pred = _distill(channel, transcript, senders, groups, local, server, te_rows, te_cols, mu_clients)
        fed_pred = np.clip(fed_pred, dataset.rating_min, dataset.rating_max)

        g_te = groups.gid[te_rows]
        rmse_local = _group_rmse(g_te, (local.pred - te_vals) ** 2, N)
        rmse_fed = _group_rmse(g_te, (fed_pred - te_vals) ** 2, N)
        utility = _utility(rmse_local, rmse_fed, local.pred, fed_pred, te_vals, N)
        # rmse (= rmse_fedsplit) is a mean over the groups: its contributions are per group
        valid = np.isfinite(rmse_local) & np.isfinite(rmse_fed)
        per_group = UserUtility.means(np.where(valid, rmse_fed, np.nan), over="groups")
        per_user = {"rmse": per_group, "rmse_fedsplit": per_group}
        utility.update(_communication(transcript))
        utility["cnmf_seconds"] = local.seconds
        utility["server_seconds"] = server.seconds
        if cfg["centralized"]:
            central = cnmf_from_config(transcript.config, cfg["k_central"]).fit(Xtr, rng=init_rng)
            utility["rmse_central"] = central.rmse(test.ratings)
        model_out = {
            "groups": groups.members,
            "k_g": groups.k_g,
            "W": local.model.W_,
            "b_W": local.model.b_W_,
            "H": local.H,
            "b_H": local.b_H,
            "W_global": server.W_global,
            "H_global": server.H_global,
            "b_H_global": server.b_H_global,
            "mu_global": mu_global,
            "W_star": W_star,
            "rmse_local": rmse_local,
            "rmse_fedsplit": rmse_fed,
            "n_users": groups.n_users,
            "n_ratings": np.bincount(groups.gid[rows], minlength=N).astype(np.int64),
        }
        return RunResult(transcript, model_out, utility, per_user)


@dataclass(frozen=True)
class Groups:
    """The random groups (the federation's clients) and each user's place in them.

    Attributes
    ----------
    members : list of (n^g,) int64 arrays
        Dataset user indices of every group.
    gid, local_row : (n,) int64
        Group of every user and its row inside the group.
    n_users : (N,) int64
    k_g : (N,) int64
        Local latent dimension of every group (:func:`group_ranks`).
    """

    members: list[np.ndarray]
    gid: np.ndarray
    local_row: np.ndarray
    n_users: np.ndarray
    k_g: np.ndarray

    @property
    def N(self) -> int:
        return len(self.members)

    @classmethod
    def draw(cls, dataset: Any, cfg: Mapping[str, Any], rng: np.random.Generator) -> Groups:
        n = dataset.ratings.shape[0]
        members = [
            np.asarray(g, dtype=np.int64) for g in random_groups(dataset, cfg["group_min"], cfg["group_max"], rng)
        ]
        gid = np.empty(n, dtype=np.int64)
        local_row = np.empty(n, dtype=np.int64)
        for g, users in enumerate(members):
            gid[users] = g
            local_row[users] = np.arange(users.size)
        n_users = np.array([g.size for g in members], dtype=np.int64)
        return cls(members, gid, local_row, n_users, group_ranks(n_users, cfg["k"]))


@dataclass(frozen=True)
class LocalFit:
    """The groups' local CNMF (Algorithm 1, lines 2-5): the fitted model (all groups in one
    block model), H^g as (N, k, m) with H^g = H[g, :k^g], b_H^g (N, m), the local predictions
    of the test ratings, and the fit's seconds."""

    model: CNMF
    H: np.ndarray
    b_H: np.ndarray
    pred: np.ndarray
    seconds: float


@dataclass(frozen=True)
class ServerFit:
    """The server's joint NMF of the uploaded item factors (eqs. 15-17)."""

    W_global: np.ndarray
    H_global: np.ndarray
    b_H_global: np.ndarray
    offsets: np.ndarray
    seconds: float


def _private_messages(
    groups: Groups, senders: list[str], rows: np.ndarray, cols: np.ndarray, vals: np.ndarray
) -> list[tuple[str, dict[str, np.ndarray], dict[str, int]]]:
    """Ground truth: each group's training ratings X^g (rows local to the group)."""
    gid, local_row = groups.gid, groups.local_row
    order = np.lexsort((cols, local_row[rows], gid[rows]))
    g_of = gid[rows][order]
    bounds = np.searchsorted(g_of, np.arange(groups.N + 1))
    out = []
    for g, party in enumerate(senders):
        sel = order[bounds[g] : bounds[g + 1]]
        payload = {
            "users": local_row[rows[sel]],
            "items": cols[sel].copy(),
            "ratings": vals[sel].copy(),
            "user_ids": groups.members[g].copy(),
            "n_users": np.asarray(groups.n_users[g], dtype=np.int64),
        }
        out.append((party, payload, {"n_users": int(groups.n_users[g]), "n_ratings": int(sel.size)}))
    return out


def _mean_round(
    channel: Channel,
    transcript: Any,
    senders: list[str],
    groups: Groups,
    rows: np.ndarray,
    vals: np.ndarray,
    global_mean: str,
) -> tuple[float, float]:
    """Round 0, the global mean exchange (eq. 6, eq. 14): the server's mu^Global and what the groups received."""
    N, gid = groups.N, groups.gid
    g_sum = np.bincount(gid[rows], vals, minlength=N)
    g_cnt = np.bincount(gid[rows], minlength=N).astype(np.int64)
    batch = channel.send(
        0,
        "mean",
        senders,
        [{"sum": np.asarray(g_sum[g]), "count": np.asarray(g_cnt[g])} for g in range(N)],
    )
    sums = np.array([float(p["sum"]) for p in batch.payloads])
    counts = np.array([float(p["count"]) for p in batch.payloads])
    if global_mean == "groups":
        mu_global = float(np.mean(sums / np.maximum(counts, 1)))
    else:
        mu_global = float(np.sum(sums) / max(np.sum(counts), 1))
    for party in senders:
        received = channel.download({"mu": np.asarray(mu_global)})
        transcript.add(0, "server", party, "global_mean", received)
    mu_clients = float(received["mu"]) if N else mu_global  # what the groups received (same for all)
    return mu_global, mu_clients


def _local_fit(
    public: Mapping[str, Any],
    k: int,
    groups: Groups,
    Xtr: Any,
    mu: float,
    rng: np.random.Generator,
    m: int,
    te_rows: np.ndarray,
    te_cols: np.ndarray,
) -> LocalFit:
    """The local CNMF of every group at once (block columns, per-group ranks k^g)."""
    t0 = time.perf_counter()
    N, gid, k_g = groups.N, groups.gid, groups.k_g
    model = cnmf_from_config(public, k)
    Xb = block_columns(Xtr, gid, N)
    model.fit(Xb, mu=mu, rng=rng, row_rank=k_g[gid], col_rank=np.repeat(k_g, m))
    seconds = time.perf_counter() - t0
    H_loc = model.H_.reshape(k, N, m).transpose(1, 0, 2)  # (N, k, m): H^g = H_loc[g, :k^g]
    bH_loc = model.b_H_.reshape(N, m)
    pred = model.predict(te_rows, gid[te_rows] * m + te_cols)
    return LocalFit(model, H_loc, bH_loc, pred, seconds)


def _server_round(
    channel: Channel,
    transcript: Any,
    senders: list[str],
    k_g: np.ndarray,
    local: LocalFit,
    mu_global: float,
    cfg: Mapping[str, Any],
    rng: np.random.Generator,
) -> ServerFit:
    """Round 1: the groups upload (H^g)^T and b_H^g; the server stacks and factorizes them."""
    uploads = [
        {"H_T": np.ascontiguousarray(local.H[g, : k_g[g]].T), "b_H": local.b_H[g].copy()} for g in range(len(senders))
    ]
    batch = channel.send(1, "H", senders, uploads, noisy_keys=("H_T", "b_H"))
    t0 = time.perf_counter()
    seen = [np.asarray(p["H_T"], dtype=np.float64) for p in batch.payloads]
    X_server = np.maximum(np.hstack(seen), 0.0)  # eq. 15
    b_H_global = np.mean([np.asarray(p["b_H"], dtype=np.float64) for p in batch.payloads], axis=0)  # eq. 16
    offsets = np.concatenate(([0], np.cumsum([s.shape[1] for s in seen]))).astype(np.int64)
    W_global, H_global = _joint_nmf(X_server, cfg["K"], cfg["server_max_iter"], int(rng.integers(2**31)))
    seconds = time.perf_counter() - t0
    transcript.add(
        1,
        "server",
        "server",
        "state",
        {
            "X": X_server,
            "W_global": W_global,
            "H_global": H_global,
            "b_H_global": b_H_global,
            "mu_global": np.asarray(mu_global),
            "offsets": offsets,
        },
    )
    return ServerFit(W_global, H_global, b_H_global, offsets, seconds)


def _distill(
    channel: Channel,
    transcript: Any,
    senders: list[str],
    groups: Groups,
    local: LocalFit,
    server: ServerFit,
    te_rows: np.ndarray,
    te_cols: np.ndarray,
    mu: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The server sends every group M^g (eq. 17); each distills W* = W^g M^g^T (eq. 18).
    Returns W* (n x K) and the federated predictions of the test ratings (eq. 19, unclipped)."""
    model = local.model
    W_global, H_global, b_H_global, offsets = server.W_global, server.H_global, server.b_H_global, server.offsets
    W_star = np.zeros((len(groups.gid), W_global.shape[1]))
    for g, party in enumerate(senders):
        M_g = np.ascontiguousarray(H_global[:, offsets[g] : offsets[g + 1]])  # eq. 17
        received = channel.download({"M": M_g, "W_global": W_global, "b_H_global": b_H_global})
        transcript.add(1, "server", party, "M", received)
        users = groups.members[g]
        W_star[users] = model.W_[users, : groups.k_g[g]] @ np.asarray(received["M"]).T  # eq. 18
    W_dl = np.asarray(received["W_global"]) if groups.N else W_global
    bH_dl = np.asarray(received["b_H_global"]) if groups.N else b_H_global
    fed_pred = (
        np.einsum("nk,nk->n", W_star[te_rows], W_dl[te_cols]) + model.b_W_[te_rows] + bH_dl[te_cols] + mu
    )  # eq. 19
    return W_star, fed_pred


def _communication(transcript: Any) -> dict[str, float]:
    """Bytes and messages up and down (§3.3.5); also sets every sent message's ``meta["bytes"]``."""
    up = down = n_up = n_down = 0
    for msg in transcript.messages:
        if msg.sender == msg.receiver:
            continue
        msg.meta["bytes"] = msg.nbytes
        if msg.receiver == "server":
            up += msg.nbytes
            n_up += 1
        else:
            down += msg.nbytes
            n_down += 1
    return {
        "bytes_up": float(up),
        "bytes_down": float(down),
        "messages_up": float(n_up),
        "messages_down": float(n_down),
    }


def _utility(
    rmse_local: np.ndarray,
    rmse_fed: np.ndarray,
    local_pred: np.ndarray,
    fed_pred: np.ndarray,
    te_vals: np.ndarray,
    N: int,
) -> dict[str, float]:
    """Per-group RMSE of the local and the federated model: means, 95 % intervals, pooled values."""
    valid = np.isfinite(rmse_local) & np.isfinite(rmse_fed)
    loc_mean, loc_ci = mean_ci95(rmse_local[valid])
    fed_mean, fed_ci = mean_ci95(rmse_fed[valid])
    return {
        "rmse": fed_mean,
        "rmse_local": loc_mean,
        "rmse_local_ci95": loc_ci,
        "rmse_fedsplit": fed_mean,
        "rmse_fedsplit_ci95": fed_ci,
        "rmse_drop": loc_mean - fed_mean,
        "improved_fraction": float(np.mean(rmse_fed[valid] < rmse_local[valid])),
        "rmse_local_pooled": float(np.sqrt(np.mean((local_pred - te_vals) ** 2))),
        "rmse_fedsplit_pooled": float(np.sqrt(np.mean((fed_pred - te_vals) ** 2))),
        "n_groups": float(N),
    }


def _joint_nmf(X: np.ndarray, K: int, max_iter: int, random_state: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Server-side NMF of the stacked item factors (eqs. 15, 17): X (m x s) ~ W^Global H^Global.

    scikit-learn ``NMF(init="nndsvd", solver="mu")`` as the paper (NNDSVD, multiplicative
    updates, Frobenius loss); K is capped at min(m, s). scikit-learn's warning that "mu" cannot
    update the zeros NNDSVD puts in the initialisation is silenced: that is the paper's choice.
    ``random_state`` seeds the randomized SVD inside NNDSVD (the run is deterministic per seed).
    """
    from sklearn.decomposition import NMF

    m, s = X.shape
    K = int(min(K, m, s))
    if not np.any(X > 0):
        return np.zeros((m, K)), np.zeros((K, s))
    from threadpoolctl import threadpool_limits

    nmf = NMF(n_components=K, init="nndsvd", solver="mu", max_iter=int(max_iter), random_state=random_state)
    # small dense products: one BLAS thread (multi-threaded BLAS only contends on a busy machine)
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
        warnings.simplefilter("ignore", UserWarning)
        try:
            from sklearn.exceptions import ConvergenceWarning

            warnings.simplefilter("ignore", ConvergenceWarning)
        except ImportError:  # pragma: no cover
            pass
        W = nmf.fit_transform(X)
    return W, nmf.components_

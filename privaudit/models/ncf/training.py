"""Local NCF training of a round's clients: batched over clients, with optional DP-SGD.

:func:`train_clients` trains C clients of one round *together*: every client gets its own copy
of the network (stacked, leading dimension C), its user vector and the rows of the item table
it trains on (its local items, padded to the largest local set). The per-client forward pass is
vectorised over clients (:func:`~privaudit.models.ncf.network.forward_stacked`) and the gradients
of the sum of the clients' losses are each client's own gradients (the clients share no
parameter). Adam runs per client (torch's fused Adam kernel on the stacked tensors of the
clients still active), so a client whose local data is exhausted stops exactly where a
sequential per-client loop would stop. :func:`train_clients_loop` is that sequential reference
(``torch.optim.Adam``, one client at a time); the two agree to float32 rounding
(tests/test_fedncf.py; benchmarks/fedncf_batched.py times them).

DP-SGD (Abadi et al. 2016) in :func:`train_clients`: per-sample gradients by
``torch.func.vmap(grad(...))`` over samples and clients, per-sample clipping to ``clip`` in the
joint L2 norm of all of a client's parameters touched by the sample, the sum plus
N(0, sigma^2 clip^2) on *every* parameter (all item rows too), divided by the batch size.
This is the computation of Opacus's ``GradSampleModule`` + ``DPOptimizer``, written with
``torch.func`` because Opacus wraps one ``nn.Module`` per optimizer and cannot batch clients;
the privacy accounting uses Opacus's ``RDPAccountant`` (:mod:`privaudit.defenses.dp_sgd`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privaudit.models.ncf.network import (
    EMBED_STD,
    Architecture,
    bce,
    forward,
    init_embeddings,
    init_network,
    item_dim,
    loss_grads_stacked,
    network_shapes,
    require_torch,
)
from privaudit.models.ncf.scoring import sample_negatives

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def make_batches(
    n_instances: Sequence[int], epochs: int, batch_size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled mini-batch schedules of C clients, padded to a common number of steps.

    Client c has ``n_instances[c]`` local instances; every epoch it visits them in a fresh random
    order in ``ceil(n_c / B)`` batches (the last one partial). Returns ``index`` (C, S, B) int64
    (instance index, 0 where padded) and ``valid`` (C, S, B) bool, S = the largest step count.
    """
    n_instances = np.asarray(n_instances, dtype=np.int64)
    steps = epochs * np.maximum(-(-n_instances // batch_size), 0)
    S = int(steps.max()) if len(steps) else 0
    C = len(n_instances)
    index = np.zeros((C, S, batch_size), dtype=np.int64)
    valid = np.zeros((C, S, batch_size), dtype=bool)
    for c, n in enumerate(n_instances):  # O(C) permutations, not per step
        if n == 0:
            continue
        order = np.concatenate([rng.permutation(n) for _ in range(epochs)])
        per_epoch = -(-n // batch_size)
        padded = np.zeros((epochs, per_epoch * batch_size), dtype=np.int64)
        mask = np.zeros_like(padded, dtype=bool)
        padded[:, :n] = order.reshape(epochs, n)
        mask[:, :n] = True
        index[c, : epochs * per_epoch] = padded.reshape(epochs * per_epoch, batch_size)
        valid[c, : epochs * per_epoch] = mask.reshape(epochs * per_epoch, batch_size)
    return index, valid


def _adam_step(params: list, grads: list, ms: list, vs: list, step: Any, lr: float) -> None:
    """In-place Adam step on several tensors with the kernel of ``torch.optim.Adam(fused=True)``.

    ``step``: the step count after this step (1 on the first), an int or a float32 scalar tensor."""
    torch = require_torch()
    b1, b2 = ADAM_BETAS
    st = step if isinstance(step, torch.Tensor) else torch.tensor(float(step))
    torch._fused_adam_(
        params,
        [g if g.is_contiguous() else g.contiguous() for g in grads],
        ms,
        vs,
        [],
        [st] * len(params),
        lr=lr,
        beta1=b1,
        beta2=b2,
        weight_decay=0.0,
        eps=ADAM_EPS,
        amsgrad=False,
        maximize=False,
    )


@dataclass(frozen=True)
class LocalTrainingSettings:
    """How clients train locally.

    Attributes
    ----------
    lr : float
        Adam learning rate.
    user_lr : float, optional
        Adam learning rate of the (private) user vectors; default ``lr``.
    dp : (noise_multiplier, clip), optional
        DP-SGD: per-sample clipping to ``clip`` and Gaussian noise ``noise_multiplier * clip``
        (module docstring). Every item row then receives noise, so pass all items as local rows.
    noise_seed : int
        Seed of the torch generator of the DP noise.
    """

    lr: float = 1e-3
    user_lr: float | None = None
    dp: tuple[float, float] | None = None
    noise_seed: int = 0


@dataclass(frozen=True)
class CohortData:
    """The local data of C clients trained together.

    Attributes
    ----------
    item_rows : (C, L, Dtot) float32
        Each client's copy of the global rows of its local items (padded rows are never used).
    users : (C, Dtot) float32
        The clients' user vectors (client-local).
    inst_item : (C, N) int64
        Local row (0..L-1) of every training instance (padded beyond ``n_instances``).
    inst_label : (C, N) float32
        1 for a positive, 0 for a sampled negative.
    n_instances : (C,) int64
    index, valid : (C, S, B)
        Mini-batch schedule from :func:`make_batches`.
    n_rows : (C,) int, optional
        Number of real (unpadded) local rows of each client (default L).
    adam_state : dict, optional
        Persistent per-client Adam state to resume from (default: fresh state, step 0):
        ``m_user``/``v_user`` (C, Dtot), ``m_item``/``v_item`` (C, L, Dtot), ``m_net``/``v_net``
        (dict name -> (C, ...)), ``step`` (C,) int64 steps already taken.
    """

    item_rows: np.ndarray
    users: np.ndarray
    inst_item: np.ndarray
    inst_label: np.ndarray
    n_instances: np.ndarray
    index: np.ndarray
    valid: np.ndarray
    n_rows: np.ndarray | None = None
    adam_state: dict[str, Any] | None = None


def train_clients(
    arch: str,
    D: int,
    layers: Sequence[int],
    net: dict[str, np.ndarray],
    item_rows: np.ndarray,
    users: np.ndarray,
    inst_item: np.ndarray,
    inst_label: np.ndarray,
    n_instances: np.ndarray,
    index: np.ndarray,
    valid: np.ndarray,
    lr: float = 1e-3,
    dp: tuple[float, float] | None = None,
    noise_seed: int = 0,
    n_rows: np.ndarray | None = None,
    adam_state: dict[str, Any] | None = None,
    user_lr: float | None = None,
) -> dict[str, np.ndarray]:
    """:func:`train_cohort` with its arguments spelled out (see :class:`CohortData` and
    :class:`LocalTrainingSettings` for their meaning)."""
    return train_cohort(
        Architecture(arch, int(D), tuple(layers)),
        net,
        CohortData(item_rows, users, inst_item, inst_label, n_instances, index, valid, n_rows, adam_state),
        LocalTrainingSettings(lr, user_lr, dp, noise_seed),
    )


def train_cohort(
    model: Architecture, net: dict[str, np.ndarray], data: CohortData, settings: LocalTrainingSettings
) -> dict[str, np.ndarray]:
    """Local training of C clients at once (FedNCF paper Algorithm 2, the plain update part).

    Internally the rows of all clients are stored unpadded in one (sum n_rows, Dtot) tensor,
    clients ordered by their step counts, so the rows of the clients still active form a
    contiguous prefix and Adam touches no padding. With ``data.adam_state`` the updated state
    is returned under ``adam_state`` (same layout); that path uses an unfused Adam with
    per-client step counts (same formula as ``torch.optim.Adam``).

    Parameters
    ----------
    model : Architecture
    net : dict name -> array
        Global network weights (no client dimension).
    data : CohortData
    settings : LocalTrainingSettings

    Returns
    -------
    dict with ``net`` (dict name -> (C, ...) float32), ``items`` (C, L, Dtot), ``users`` (C, Dtot),
    ``steps`` (C,) Adam steps taken.
    """
    torch = require_torch()
    cohort = _Cohort.sorted_by_steps(data)
    params = _Parameters.stacked(torch, model.names, net, cohort)
    moments = _Moments.start(torch, params, cohort, model.names, data.adam_state)
    steps = _StepTensors.gather(torch, cohort)
    grads_of = _plain_grads if settings.dp is None else _dp_grads_factory(torch, model, settings)
    active = (cohort.n_steps[None, :] > np.arange(steps.S)[:, None]).sum(1)  # (S,) active clients per step: a prefix
    a_prev = -1
    for s in range(steps.S):
        a = int(active[s])
        if a == 0:
            break
        if a != a_prev:  # views of the active prefix change only when a client finishes
            n_act = int(cohort.off[a])
            cur = [params.all[0][:a], params.all[1][:n_act]] + [p[:a] for p in params.all[2:]]
            ms = [moments.m[0][:a], moments.m[1][:n_act]] + [m[:a] for m in moments.m[2:]]
            vs = [moments.v[0][:a], moments.v[1][:n_act]] + [v[:a] for v in moments.v[2:]]
            a_prev = a
        full = a == cohort.C
        flat_idx = steps.rows[s] if full else steps.rows[s][: a * steps.B]  # (a B,) rows of the flat item table
        y = steps.y[s] if full else steps.y[s][:a]
        wt = steps.w[s] if full else steps.w[s][:a]
        grads = grads_of(torch, model, cur, flat_idx, y, wt, cohort.valid[:a, s], a, steps.B, cohort.Dt)
        _adam_update(cur, grads, ms, vs, s, steps, moments, n_act, a, settings)
    return _collect(params, moments, cohort, model.names, data.adam_state)


@dataclass(frozen=True)
class _Cohort:
    """The clients sorted by their number of steps: client c is active at steps 0..steps_c-1, so
    the active clients of step s are a prefix and all share the Adam step count s+1."""

    order: np.ndarray
    inverse: np.ndarray
    item_rows: np.ndarray
    users: np.ndarray
    inst_item: np.ndarray  # rows of the flat table
    inst_label: np.ndarray
    index: np.ndarray
    valid: np.ndarray
    n_steps: np.ndarray
    rows_per: np.ndarray
    off: np.ndarray
    flat_rows: np.ndarray

    @property
    def C(self) -> int:
        return self.item_rows.shape[0]

    @property
    def Dt(self) -> int:
        return self.item_rows.shape[2]

    @classmethod
    def sorted_by_steps(cls, data: CohortData) -> _Cohort:
        C, L, Dt = data.item_rows.shape
        n_steps = data.valid.any(axis=2).sum(axis=1)
        order = np.argsort(-n_steps, kind="stable")
        inverse = np.argsort(order)
        item_rows, users = data.item_rows[order], data.users[order]
        inst_item, inst_label = data.inst_item[order], data.inst_label[order]
        index, valid, n_steps = data.index[order], data.valid[order], n_steps[order]
        rows_per = (
            np.full(C, L, dtype=np.int64) if data.n_rows is None else np.asarray(data.n_rows, dtype=np.int64)[order]
        )
        off = np.concatenate([[0], np.cumsum(rows_per)])
        flat_rows = (
            np.concatenate([item_rows[c, : rows_per[c]] for c in range(C)]) if C else np.zeros((0, Dt), np.float32)
        )
        inst_item = inst_item + off[:-1, None]
        return cls(
            order, inverse, item_rows, users, inst_item, inst_label, index, valid, n_steps, rows_per, off, flat_rows
        )

    def flat(self, per_client: np.ndarray) -> np.ndarray:
        """(C, L, ...) rows of every client -> the (sum n_rows, ...) flat table (clients in order)."""
        C, Dt = self.C, self.Dt
        return (
            np.concatenate([per_client[c, : self.rows_per[c]] for c in range(C)])
            if C
            else np.zeros((0, Dt), np.float32)
        )


@dataclass(frozen=True)
class _Parameters:
    """The trained tensors: per-client network copies, the flat item table, the user vectors."""

    net: dict[str, Any]
    item: Any
    user: Any
    all: list

    @classmethod
    def stacked(cls, torch: Any, names: list[str], net: dict[str, np.ndarray], cohort: _Cohort) -> _Parameters:
        C = cohort.C
        P_net = {k: torch.tensor(np.broadcast_to(net[k], (C,) + net[k].shape).copy()) for k in names}
        P_item = torch.tensor(cohort.flat_rows, dtype=torch.float32)
        P_user = torch.tensor(cohort.users, dtype=torch.float32)
        return cls(P_net, P_item, P_user, [P_user, P_item] + [P_net[k] for k in names])


@dataclass(frozen=True)
class _Moments:
    """Adam's first and second moments (same layout as the parameters) and, when resumed from a
    persistent state, the per-client step counts already taken and each flat row's client."""

    m: list
    v: list
    step0: Any = None
    row_client: Any = None

    @classmethod
    def start(
        cls, torch: Any, params: _Parameters, cohort: _Cohort, names: list[str], adam_state: dict[str, Any] | None
    ) -> _Moments:
        m_state = [torch.zeros_like(p) for p in params.all]
        v_state = [torch.zeros_like(p) for p in params.all]
        if adam_state is None:
            return cls(m_state, v_state)
        order = cohort.order
        for st, mk in ((m_state, "m"), (v_state, "v")):
            st[0].copy_(torch.as_tensor(adam_state[f"{mk}_user"][order]))
            st[1].copy_(torch.as_tensor(cohort.flat(adam_state[f"{mk}_item"][order])))
            for j, k in enumerate(names):
                st[2 + j].copy_(torch.as_tensor(adam_state[f"{mk}_net"][k][order]))
        step0 = torch.as_tensor(np.asarray(adam_state["step"], dtype=np.float64)[order])
        row_client = torch.as_tensor(np.repeat(np.arange(cohort.C), cohort.rows_per))
        return cls(m_state, v_state, step0, row_client)


@dataclass(frozen=True)
class _StepTensors:
    """Per-step tensors gathered once, (S, C, B) so that step s of the active prefix is
    contiguous: flat-table row, label and loss weight (1 / batch count; 0 on padding) of every
    batch slot, and the Adam step counts."""

    rows: tuple
    y: tuple
    w: tuple
    t: tuple
    S: int
    B: int

    @classmethod
    def gather(cls, torch: Any, cohort: _Cohort) -> _StepTensors:
        C, index, valid = cohort.C, cohort.index, cohort.valid
        S, B = index.shape[1], index.shape[2]
        flat = index.reshape(C, S * B)
        rows = np.take_along_axis(cohort.inst_item, flat, 1).reshape(C, S, B).transpose(1, 0, 2).reshape(S, C * B)
        labels = np.take_along_axis(cohort.inst_label, flat, 1).reshape(C, S, B).transpose(1, 0, 2)
        weights = (valid / np.maximum(valid.sum(2, keepdims=True), 1)).transpose(1, 0, 2)
        return cls(
            torch.as_tensor(np.ascontiguousarray(rows)).unbind(0),
            torch.as_tensor(np.ascontiguousarray(labels), dtype=torch.float32).unbind(0),
            torch.as_tensor(np.ascontiguousarray(weights), dtype=torch.float32).unbind(0),
            torch.arange(1, S + 1, dtype=torch.float32).unbind(0),
            S,
            B,
        )


def _plain_grads(
    torch: Any,
    model: Architecture,
    cur: list,
    flat_idx: Any,
    y: Any,
    wt: Any,
    valid: np.ndarray,
    a: int,
    B: int,
    Dt: int,
) -> list:
    """The active clients' gradients of one step; the rows' gradients scattered into the flat table."""
    names = model.names
    irows = torch.index_select(cur[1], 0, flat_idx).view(a, B, Dt)  # cheaper than advanced indexing
    g_u, g_rows, g_net = loss_grads_stacked(
        model.arch, model.D, model.n_layers, dict(zip(names, cur[2:])), names, cur[0], irows, y, wt
    )
    g_item = torch.zeros_like(cur[1]).index_put_((flat_idx,), g_rows.reshape(-1, Dt), accumulate=True)
    return [g_u, g_item] + g_net


def _dp_grads_factory(torch: Any, model: Architecture, settings: LocalTrainingSettings) -> Any:
    """DP-SGD gradients of one step: per-sample gradients (vmap over samples, then clients),
    clipped in their joint L2 norm, summed, plus Gaussian noise on every parameter, divided by B."""
    from torch.func import grad, vmap

    arch, D, n_layers, names = model.arch, model.D, model.n_layers, model.names
    sigma, clip = float(settings.dp[0]), float(settings.dp[1])
    gen = torch.Generator().manual_seed(int(settings.noise_seed))

    def sample_loss(netc, u, irow, y):
        return bce(forward(arch, D, n_layers, netc, u, irow), y)

    # per-sample grads: vmap over samples (net, user shared), then over clients
    ps_grad = vmap(vmap(grad(sample_loss, argnums=(0, 1, 2)), in_dims=(None, None, 0, 0)), in_dims=(0, 0, 0, 0))

    def dp_grads(
        torch: Any,
        model: Architecture,
        cur: list,
        flat_idx: Any,
        y: Any,
        wt: Any,
        valid: np.ndarray,
        a: int,
        B: int,
        Dt: int,
    ) -> list:
        w = torch.as_tensor(valid, dtype=torch.float32)  # (a, B) 1 on real batch slots
        irows = cur[1][flat_idx.view(a, B)]
        g_net, g_u, g_i = ps_grad(dict(zip(names, cur[2:])), cur[0], irows, y)
        sq = g_u.pow(2).sum(-1) + g_i.pow(2).sum(-1)
        for k in names:
            sq = sq + g_net[k].pow(2).flatten(2).sum(-1)
        factor = (clip / (sq.sqrt() + 1e-6)).clamp(max=1.0) * w  # (a, B)
        denom = float(B)  # Opacus divides by the expected batch size
        gu = (g_u * factor[..., None]).sum(1)
        gi = torch.zeros_like(cur[1]).index_add_(0, flat_idx, (g_i * factor[..., None]).reshape(-1, Dt))
        gn = [(g_net[k] * factor.view(a, B, *([1] * (g_net[k].dim() - 2)))).sum(1) for k in names]
        grads = []
        for g in [gu, gi] + gn:
            noise = torch.normal(0.0, sigma * clip, size=g.shape, generator=gen)
            grads.append((g + noise) / denom)
        return grads

    return dp_grads


def _adam_update(
    cur: list,
    grads: list,
    ms: list,
    vs: list,
    s: int,
    steps: _StepTensors,
    moments: _Moments,
    n_act: int,
    a: int,
    settings: LocalTrainingSettings,
) -> None:
    """One Adam step of the active clients: fused with one step count (fresh state), or per
    client with their own step counts (resumed persistent state)."""
    lr, user_lr = settings.lr, settings.user_lr
    if moments.step0 is None and user_lr is not None and user_lr != lr:
        _adam_step(cur[:1], list(grads[:1]), ms[:1], vs[:1], steps.t[s], user_lr)
        _adam_step(cur[1:], list(grads[1:]), ms[1:], vs[1:], steps.t[s], lr)
        return
    if moments.step0 is None:
        _adam_step(cur, grads, ms, vs, steps.t[s], lr)
        return
    t = moments.step0[:a] + (s + 1)
    b1, b2 = ADAM_BETAS
    bc1, bc2 = 1.0 - b1**t, 1.0 - b2**t  # (a,) float64 per-client bias corrections
    for j, (p, g, m_, v_) in enumerate(zip(cur, grads, ms, vs)):
        sel = moments.row_client[:n_act] if j == 1 else slice(None)
        shape = (-1,) + (1,) * (p.dim() - 1)
        c1 = bc1[sel].float().view(shape)
        c2 = bc2[sel].float().view(shape)
        m_.mul_(b1).add_(g, alpha=1.0 - b1)
        v_.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        lr_j = user_lr if (j == 0 and user_lr is not None) else lr
        p.sub_(lr_j * (m_ / c1) / ((v_ / c2).sqrt() + ADAM_EPS))


def _collect(
    params: _Parameters, moments: _Moments, cohort: _Cohort, names: list[str], adam_state: dict[str, Any] | None
) -> dict[str, Any]:
    """The trained tensors back in the callers' client order and padded (C, L, Dtot) layout."""
    C, inverse, rows_per, off = cohort.C, cohort.inverse, cohort.rows_per, cohort.off
    L, Dt = cohort.item_rows.shape[1], cohort.Dt

    def unflat(fl: np.ndarray, base: np.ndarray) -> np.ndarray:
        for c in range(C):
            base[c, : rows_per[c]] = fl[off[c] : off[c + 1]]
        return base

    out = {
        "net": {k: params.net[k].numpy()[inverse] for k in names},
        "items": unflat(params.item.numpy(), cohort.item_rows.copy())[inverse],
        "users": params.user.numpy()[inverse],
        "steps": cohort.n_steps[inverse],
    }
    if adam_state is not None:
        new_state: dict[str, Any] = {"step": (np.asarray(adam_state["step"])[cohort.order] + cohort.n_steps)[inverse]}
        for st, mk in ((moments.m, "m"), (moments.v, "v")):
            new_state[f"{mk}_user"] = st[0].numpy()[inverse]
            new_state[f"{mk}_item"] = unflat(st[1].numpy(), np.zeros((C, L, Dt), dtype=np.float32))[inverse]
            new_state[f"{mk}_net"] = {k: st[2 + j].numpy()[inverse] for j, k in enumerate(names)}
        out["adam_state"] = new_state
    return out


def train_clients_loop(
    arch: str,
    D: int,
    layers: Sequence[int],
    net: dict[str, np.ndarray],
    item_rows: np.ndarray,
    users: np.ndarray,
    inst_item: np.ndarray,
    inst_label: np.ndarray,
    n_instances: np.ndarray,
    index: np.ndarray,
    valid: np.ndarray,
    lr: float = 1e-3,
) -> dict[str, np.ndarray]:
    """The sequential reference of :func:`train_clients`: one client at a time, one
    ``torch.optim.Adam(fused=True)`` per client, one Python iteration per mini-batch (no DP)."""
    torch = require_torch()
    C = item_rows.shape[0]
    n_layers = len(layers) if arch in ("mlp", "neumf") else 0
    names = list(network_shapes(arch, D, layers))
    out_net = {k: np.zeros((C,) + net[k].shape, dtype=np.float32) for k in names}
    out_items = np.array(item_rows, dtype=np.float32, copy=True)
    out_users = np.array(users, dtype=np.float32, copy=True)
    steps = np.zeros(C, dtype=np.int64)
    for c in range(C):
        p_net = {k: torch.tensor(net[k], requires_grad=True) for k in names}
        p_item = torch.tensor(item_rows[c], requires_grad=True)
        p_user = torch.tensor(users[c], requires_grad=True)
        opt = torch.optim.Adam(
            [p_user, p_item] + [p_net[k] for k in names], lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, fused=True
        )
        items_c = torch.as_tensor(inst_item[c])
        labels_c = torch.as_tensor(inst_label[c], dtype=torch.float32)
        for s in range(index.shape[1]):
            sel = index[c, s][valid[c, s]]
            if sel.size == 0:
                continue
            sel_t = torch.as_tensor(sel)
            opt.zero_grad()
            logits = forward(arch, D, n_layers, p_net, p_user, p_item[items_c[sel_t]])
            loss = bce(logits, labels_c[sel_t]).mean()
            loss.backward()
            opt.step()
            steps[c] += 1
        for k in names:
            out_net[k][c] = p_net[k].detach().numpy()
        out_items[c] = p_item.detach().numpy()
        out_users[c] = p_user.detach().numpy()
    return {"net": out_net, "items": out_items, "users": out_users, "steps": steps}


def train_centralized(
    arch: str,
    D: int,
    layers: Sequence[int],
    positives: Any,
    n_users: int,
    n_items: int,
    epochs: int,
    batch_size: int,
    negatives: int,
    lr: float,
    rng: np.random.Generator,
    exclude: Any = None,
    callback: Any = None,
    init_std: float = EMBED_STD,
) -> dict[str, Any]:
    """Centralised NCF (He et al. 2017; FedNCF paper Table 6 "NCF"): one model, all users.

    ``positives``: CSR (n_users x n_items) of training interactions; ``exclude``: CSR of
    items never drawn as negatives (training + held-out). Negatives are re-drawn every epoch
    (``negatives`` per positive). ``callback(epoch, model)`` after every epoch. ``init_std``: std of
    the N(0, s^2) initial embeddings.
    Returns ``{"net", "items", "users"}`` (numpy).
    """
    torch = require_torch()
    import scipy.sparse as sp

    pos = sp.csr_matrix(positives)
    excl = sp.csr_matrix(exclude if exclude is not None else pos).astype(bool).tocsr()
    Dt = item_dim(arch, D)
    n_layers = len(layers) if arch in ("mlp", "neumf") else 0
    net_np = init_network(arch, D, layers, rng)
    names = list(net_np)
    p_net = {k: torch.tensor(v, requires_grad=True) for k, v in net_np.items()}
    U = torch.tensor(init_embeddings(n_users, Dt, rng, init_std), requires_grad=True)
    Itab = torch.tensor(init_embeddings(n_items, Dt, rng, init_std), requires_grad=True)
    opt = torch.optim.Adam([U, Itab] + [p_net[k] for k in names], lr=lr)
    pu = np.repeat(np.arange(n_users), np.diff(pos.indptr))
    pi = pos.indices.astype(np.int64)
    for epoch in range(epochs):
        nu = np.repeat(pu, negatives)
        ni = sample_negatives(nu, excl, n_items, rng)
        users = np.concatenate([pu, nu])
        items = np.concatenate([pi, ni])
        labels = np.concatenate([np.ones(len(pu)), np.zeros(len(nu))]).astype(np.float32)
        order = rng.permutation(len(users))
        users_t, items_t, labels_t = (torch.as_tensor(a[order]) for a in (users, items, labels))
        for start in range(0, len(order), batch_size):
            sl = slice(start, start + batch_size)
            opt.zero_grad()
            logits = forward(arch, D, n_layers, p_net, U[users_t[sl]], Itab[items_t[sl]])
            loss = bce(logits, labels_t[sl]).mean()
            loss.backward()
            opt.step()
        if callback is not None:
            callback(epoch, _detach(p_net, U, Itab))
    return _detach(p_net, U, Itab)


def _detach(p_net: dict, U: Any, Itab: Any) -> dict[str, Any]:
    return {
        "net": {k: v.detach().numpy().copy() for k, v in p_net.items()},
        "users": U.detach().numpy().copy(),
        "items": Itab.detach().numpy().copy(),
    }

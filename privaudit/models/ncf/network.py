"""NCF networks (GMF, MLP, NeuMF; He et al. 2017) as batched functional PyTorch models.

Architecture (FedNCF paper §4.2): latent dimension ``D`` (12), MLP tower
``2D -> h1 -> ... -> hn`` with ReLU (h = 48-24-12-6, so 24x48 input weights as in the
paper's parameter count of §3.4), prediction layer ``F -> 1`` with a sigmoid, F = D (GMF),
hn (MLP) or D + hn (NeuMF). Network weights are Xavier-uniform, biases zero, embeddings
N(0, 0.01^2) (as in the NCF reference code). Loss: binary cross-entropy (mean over the
batch), computed from the logits (``BCEWithLogits``, the numerically stable form of
sigmoid + BCE).

Item and user embeddings are stored as one matrix each with ``item_dim(arch, D)`` columns:
GMF and MLP use D columns, NeuMF 2D (the GMF half first, then the MLP half), so an item's
"row" is everything a client updates for that item. :func:`forward_stacked` runs C clients'
copies of the network at once (leading dimension C); :func:`loss_grads_stacked` is its
backward pass written out by hand (checked against autograd).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privaudit.errors import MissingDependencyError

ARCHS = ("gmf", "mlp", "neumf")
EMBED_STD = 0.01


def require_torch():
    """Import torch or raise :class:`MissingDependencyError` (exit 2 with the extra's name)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("torch", "ncf") from None
    return torch


class single_thread:
    """Context manager running torch on one intra-op thread (restored on exit).

    The per-step tensors of a cohort are small (C x B x Dtot); on a shared 2-core machine torch's
    intra-op threads only contend, so training uses one thread.
    """

    def __enter__(self):
        torch = require_torch()
        self._n = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        require_torch().set_num_threads(self._n)
        return False


def item_dim(arch: str, D: int) -> int:
    """Columns of an item (or user) embedding row: D for GMF/MLP, 2D for NeuMF."""
    return 2 * D if arch == "neumf" else D


def network_shapes(arch: str, D: int, layers: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the network weights (``mlp.<l>.weight`` (out, in), ``predict.weight`` (F,))."""
    shapes: dict[str, tuple[int, ...]] = {}
    if arch in ("mlp", "neumf"):
        width = 2 * D
        for l, h in enumerate(layers):
            shapes[f"mlp.{l}.weight"] = (int(h), width)
            shapes[f"mlp.{l}.bias"] = (int(h),)
            width = int(h)
    F = {"gmf": D, "mlp": int(layers[-1]), "neumf": D + int(layers[-1])}[arch]
    shapes["predict.weight"] = (F,)
    shapes["predict.bias"] = (1,)
    return shapes


def init_network(arch: str, D: int, layers: Sequence[int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Xavier-uniform weights, zero biases (float32 numpy arrays; FedNCF paper §4.2)."""
    out: dict[str, np.ndarray] = {}
    for name, shape in network_shapes(arch, D, layers).items():
        if name.endswith("bias"):
            out[name] = np.zeros(shape, dtype=np.float32)
        else:
            fan_out, fan_in = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
            bound = np.sqrt(6.0 / (fan_in + fan_out))
            out[name] = rng.uniform(-bound, bound, size=shape).astype(np.float32)
    return out


def init_embeddings(n: int, dim: int, rng: np.random.Generator, std: float = EMBED_STD) -> np.ndarray:
    """(n, dim) float32 embeddings drawn from N(0, std^2) (default EMBED_STD, as the NCF reference code;
    1.0 is ``torch.nn.Embedding``'s default initialisation)."""
    return (std * rng.standard_normal((n, dim))).astype(np.float32)


def flatten_network(net: dict[str, np.ndarray], arch: str, D: int, layers: Sequence[int]) -> np.ndarray:
    """Concatenate the network weights in :func:`network_shapes` order into one vector."""
    return np.concatenate([np.asarray(net[k], dtype=np.float64).ravel() for k in network_shapes(arch, D, layers)])


def unflatten_network(flat: np.ndarray, arch: str, D: int, layers: Sequence[int]) -> dict[str, np.ndarray]:
    """Inverse of :func:`flatten_network` (float32)."""
    out, pos = {}, 0
    for k, shape in network_shapes(arch, D, layers).items():
        size = int(np.prod(shape))
        out[k] = np.asarray(flat[pos : pos + size], dtype=np.float32).reshape(shape)
        pos += size
    return out


def forward(arch: str, D: int, n_layers: int, net: dict[str, Any], u: Any, i: Any) -> Any:
    """Logits of one client: ``u`` (..., Dtot) user rows, ``i`` (..., Dtot) item rows -> (...).

    ``net`` holds one client's weights (no leading client dimension); vectorise over clients
    with ``torch.func.vmap``.
    """
    torch = require_torch()
    F = torch.nn.functional
    parts = []
    if arch in ("gmf", "neumf"):
        parts.append(u[..., :D] * i[..., :D])
    if arch in ("mlp", "neumf"):
        off = D if arch == "neumf" else 0
        h = _cat_last(torch, u[..., off : off + D], i[..., off : off + D])
        for l in range(n_layers):
            h = F.relu(F.linear(h, net[f"mlp.{l}.weight"], net[f"mlp.{l}.bias"]))
        parts.append(h)
    z = parts[0] if len(parts) == 1 else _cat_last(torch, *parts)
    return z @ net["predict.weight"] + net["predict.bias"][0]


def forward_stacked(arch: str, D: int, n_layers: int, net: dict[str, Any], u: Any, i: Any) -> Any:
    """Logits (C, B) of C clients at once: ``net`` stacked (C, ...), ``u`` (C, Dtot), ``i`` (C, B, Dtot).

    The same function as ``vmap(forward)`` written with batched matrix products (``baddbmm``),
    which avoids vmap's per-call Python overhead in the training loop.
    """
    return _forward_stacked_parts(arch, D, n_layers, net, u, i)[0]


def _forward_stacked_parts(
    arch: str, D: int, n_layers: int, net: dict[str, Any], u: Any, i: Any
) -> tuple[Any, Any, list]:
    """:func:`forward_stacked` with what its backward pass needs: (logits (C, B), the input z
    (C, B, F) of the prediction layer, the MLP tower's activations [input, layer 1, ..., layer n])."""
    torch = require_torch()
    parts, acts = [], []
    if arch == "gmf":
        parts.append(u[:, None, :] * i)
    elif arch == "neumf":
        parts.append(u[:, None, :D] * i[..., :D])
    if arch in ("mlp", "neumf"):
        off = D if arch == "neumf" else 0
        h = torch.cat([u[:, None, off : off + D].expand(-1, i.shape[1], -1), i[..., off : off + D]], dim=-1)
        acts.append(h)
        for l in range(n_layers):
            h = torch.relu(torch.baddbmm(net[f"mlp.{l}.bias"][:, None, :], h, net[f"mlp.{l}.weight"].transpose(1, 2)))
            acts.append(h)
        parts.append(h)
    z = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    logit = torch.baddbmm(net["predict.bias"][:, :, None], z, net["predict.weight"][:, :, None])[..., 0]
    return logit, z, acts


def loss_grads_stacked(
    arch: str, D: int, n_layers: int, net: dict[str, Any], names: Sequence[str], u: Any, irows: Any, y: Any, wt: Any
) -> tuple[Any, Any, list]:
    """Hand-written backward pass of :func:`forward_stacked` + weighted BCE, without autograd.

    Loss: sum over clients c and batch slots b of ``wt[c, b] * BCE(logit[c, b], y[c, b])``.
    ``u`` (C, Dtot), ``irows`` (C, B, Dtot), ``y``/``wt`` (C, B), ``net`` stacked (C, ...).
    Returns (dL/du (C, Dtot), dL/dirows (C, B, Dtot), [dL/dnet[k] for k in names]).

    The same numbers as ``torch.autograd.grad`` of that loss (tests/test_fedncf.py checks all
    three models to float32 rounding) at about half the cost per step for GMF: a training step
    of a cohort is a few dozen tiny tensor operations, so autograd's graph bookkeeping is a
    large part of it. With BCE on logits, dL/dlogit = wt (sigmoid(logit) - y).
    """
    torch = require_torch()
    logit, z, acts = _forward_stacked_parts(arch, D, n_layers, net, u, irows)
    pw = net["predict.weight"]
    dl = (torch.sigmoid(logit) - y) * wt  # (C, B) dL/dlogit
    g = {"predict.bias": dl.sum(1, keepdim=True), "predict.weight": torch.bmm(dl[:, None, :], z)[:, 0]}
    dz = dl[..., None] * pw[:, None, :]  # (C, B, F)
    if arch == "gmf":  # the whole row is the GMF half
        g_u = (dz * irows).sum(1)
        g_i = dz * u[:, None, :]
        return g_u, g_i, [g[k] for k in names]
    g_u = torch.empty_like(u)
    g_i = torch.empty_like(irows)
    if arch == "neumf":
        g_u[:, :D] = (dz[..., :D] * irows[..., :D]).sum(1)
        g_i[..., :D] = dz[..., :D] * u[:, None, :D]
    off = D if arch == "neumf" else 0
    dh = dz[..., D:] if arch == "neumf" else dz
    for l in reversed(range(n_layers)):
        dpre = dh * (acts[l + 1] > 0)
        g[f"mlp.{l}.weight"] = torch.bmm(dpre.transpose(1, 2), acts[l])
        g[f"mlp.{l}.bias"] = dpre.sum(1)
        dh = torch.bmm(dpre, net[f"mlp.{l}.weight"])
    g_u[:, off : off + D] = dh[..., :D].sum(1)
    g_i[..., off : off + D] = dh[..., D:]
    return g_u, g_i, [g[k] for k in names]


def _cat_last(torch: Any, *xs: Any) -> Any:
    """Concatenate on the last axis after broadcasting the leading axes."""
    lead = torch.broadcast_shapes(*(x.shape[:-1] for x in xs))
    return torch.cat([x.expand(*lead, x.shape[-1]) for x in xs], dim=-1)


def bce(logit: Any, y: Any) -> Any:
    torch = require_torch()
    return torch.nn.functional.binary_cross_entropy_with_logits(logit, y, reduction="none")


@dataclass(frozen=True)
class Architecture:
    """An NCF model's shape: ``arch`` (gmf, mlp, neumf), latent dimension ``D``, MLP ``layers``."""

    arch: str
    D: int
    layers: tuple[int, ...]

    @property
    def n_layers(self) -> int:
        return len(self.layers) if self.arch in ("mlp", "neumf") else 0

    @property
    def names(self) -> list[str]:
        return list(network_shapes(self.arch, self.D, self.layers))

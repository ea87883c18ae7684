"""The :class:`Defense` base class: hooks that change what clients send.

A defense has parameters (``params``), one of which may be its *strength* (``strength``, e.g. a
noise scale, an epsilon, a sampling ratio) with a default grid to sweep. Protocols never call a
defense directly: client uploads go through a :class:`~privaudit.protocols.base.Channel` that
calls, for every active defense in order,

- :meth:`Defense.on_client_data` before training (e.g. sampling adds virtual items),
- :meth:`Defense.on_upload` on every batch of uploads (noise, encryption, masking),
- :meth:`Defense.on_round` on all the messages a client sends in one round when a protocol
  hands them over together (:meth:`~privaudit.protocols.base.Channel.send_round`; default: each
  batch through :meth:`Defense.on_upload`), so that a DP defense clips them jointly,
- :meth:`Defense.aggregate` when the receiver sums a batch (homomorphic or masked sums),
- :meth:`Defense.on_download` on what the server sends back.

Optional, for speed: a defense whose :meth:`Defense.packs` accepts a round's
:class:`PackedBatch` es (one array per entry, as FedMVMF sends them) gets them through
:meth:`Defense.on_upload_packed` / :meth:`Defense.on_round_packed` with the same numbers, and in
a round that is only summed through :meth:`Defense.on_round_summed` plus
:meth:`Defense.summed_noise` (its i.i.d. noise drawn on the sums, same law).

What the receiver sees after the defenses is exactly what the transcript records for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from privaudit.params import Configurable
from privaudit.registry import RegisteredName
from privaudit.schema import ANY as ANY  # the wildcard of Defense.acts_on
from privaudit.schema import DefenseSchema, ProtocolSchema, holds_payload
from privaudit.transcript import Transcript


class ChannelContext(Protocol):
    """What a defense hook may use of the uplink that calls it.

    :class:`~privaudit.protocols.base.Channel` satisfies it; defenses never import it (so
    ``defenses`` does not depend on ``protocols``).

    Attributes
    ----------
    rng : numpy.random.Generator
        Simulation randomness (noise draws); never cryptographic material.
    transcript : Transcript
        The run's transcript (public config; defenses may record their own messages).
    """

    rng: np.random.Generator
    transcript: Transcript


@dataclass
class ClientData:
    """All clients' local training data, batched (row u belongs to client u).

    Passed through :meth:`Defense.on_client_data` before training, so that a defense such as
    sampling can add virtual (unrated) items that the clients will then train on and upload.

    Attributes
    ----------
    ratings : scipy.sparse.csr_matrix (n_users x n_items), float64
        Values used in the local loss. Virtual entries carry their filled value (0 for
        PrivMVMF's weighted sampling, the user average for FedRec's UA filling). Explicit
        entries (including explicit zeros) define the set of items each client uploads.
    weights : scipy.sparse.csr_matrix (n_users x n_items), float64
        Confidence c_ui of every entry (1 for real ratings), same sparsity as ``ratings``.
    virtual : scipy.sparse.csr_matrix (n_users x n_items), bool
        True on virtual entries, same sparsity as ``ratings``.
    """

    ratings: Any
    weights: Any
    virtual: Any

    @classmethod
    def from_ratings(cls, ratings: Any) -> ClientData:
        """Real ratings only: weights 1, nothing virtual."""
        import scipy.sparse as sp

        r = sp.csr_matrix(ratings, dtype=np.float64)
        r.sort_indices()
        w = r.copy()
        w.data = np.ones_like(w.data)
        v = r.copy().astype(bool)
        v.data = np.zeros(len(v.data), dtype=bool)
        return cls(r, w, v)


@dataclass
class UploadBatch:
    """The uploads of one kind from many clients in one round.

    Attributes
    ----------
    round : int
    kind : str
        Message kind (``grad_V``, ``grad_P``, ``H``, ...).
    senders : list[str]
        Client party ids, one per payload.
    payloads : list[dict[str, numpy.ndarray]]
        One payload per sender. By convention a payload with ``items`` (int64, r) and
        ``values`` (r x K) holds rows of an item matrix; other payloads hold dense arrays.
    receiver : str
    noisy_keys : tuple[str, ...] | None
        Payload entries a noise defense perturbs; ``None`` means every floating-point entry.
    meta : dict
        Per-batch metadata recorded with every message (e.g. ``{"encrypted": True}``).
    recorded : bool
        Whether the channel records this batch in the transcript (so that a defense records
        its own messages, e.g. decryptors' sums, for the same rounds only).
    """

    round: int
    kind: str
    senders: list[str]
    payloads: list[dict[str, np.ndarray]]
    receiver: str = "server"
    noisy_keys: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    recorded: bool = True

    def float_keys(self, payload: dict[str, np.ndarray]) -> list[str]:
        """Names of the entries of ``payload`` that count as uploaded floats."""
        if self.noisy_keys is not None:
            return [k for k in self.noisy_keys if k in payload]
        return [k for k, v in payload.items() if (v.dtype.kind == "f" if type(v) is np.ndarray else _is_float(v))]


@dataclass
class PackedBatch:
    """An :class:`UploadBatch` held as one array per payload entry instead of one dict per sender.

    Payload j's entry ``key`` is rows ``bounds[j]:bounds[j + 1]`` of ``arrays[key]`` when
    ``bounds`` is given (ragged uploads such as ``items``/``values`` item rows), else
    ``arrays[key][j]`` (one equally shaped array per sender). Same messages, same order and the
    same floats as the unpacked batch (:meth:`payloads`); protocols build it to spare a Python
    object per client, and only defenses that implement the packed hooks ever see one.

    Attributes
    ----------
    round, kind, senders, receiver, noisy_keys, meta, recorded
        As in :class:`UploadBatch`.
    arrays : dict[str, numpy.ndarray]
        Every sender's entry ``key``, concatenated (ragged) or stacked along axis 0.
    bounds : numpy.ndarray (len(senders) + 1,), int64, or None
        Row offsets of the senders' entries in every array (ragged); None when stacked.
    """

    round: int
    kind: str
    senders: list[str]
    arrays: dict[str, np.ndarray]
    bounds: np.ndarray | None = None
    receiver: str = "server"
    noisy_keys: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    recorded: bool = True

    def float_keys(self) -> list[str]:
        """Names of the entries that count as uploaded floats (as :meth:`UploadBatch.float_keys`)."""
        if self.noisy_keys is not None:
            return [k for k in self.noisy_keys if k in self.arrays]
        return [k for k, v in self.arrays.items() if v.dtype.kind == "f"]

    def entry_sizes(self, key: str) -> np.ndarray:
        """Floats of every sender's entry ``key``, (len(senders),) int64."""
        a = self.arrays[key]
        if self.bounds is None:
            return np.full(len(self.senders), a[0].size if len(a) else 0, dtype=np.int64)
        return np.diff(self.bounds) * (a[0].size if len(a) else 0)

    def payloads(self) -> list[dict[str, np.ndarray]]:
        """One dict per sender, its entries views of :attr:`arrays`."""
        keys = list(self.arrays)
        if self.bounds is None:
            return [{k: self.arrays[k][j] for k in keys} for j in range(len(self.senders))]
        b = self.bounds.tolist()
        return [{k: self.arrays[k][b[j] : b[j + 1]] for k in keys} for j in range(len(self.senders))]

    def unpacked(self) -> UploadBatch:
        """The same batch as an :class:`UploadBatch`."""
        return UploadBatch(
            self.round,
            self.kind,
            list(self.senders),
            self.payloads(),
            self.receiver,
            self.noisy_keys,
            dict(self.meta),
            self.recorded,
        )


#: dtype -> whether it is a floating-point dtype (``np.issubdtype`` once per dtype, not per entry)
_FLOAT_DTYPES: dict[np.dtype, bool] = {}


def _is_float(value: Any) -> bool:
    """Whether ``value`` (anything ``np.asarray`` takes) has a floating-point dtype (kind ``f``)."""
    dtype = value.dtype if isinstance(value, np.ndarray) else np.asarray(value).dtype
    known = _FLOAT_DTYPES.get(dtype)
    if known is None:
        known = _FLOAT_DTYPES[dtype] = bool(np.issubdtype(dtype, np.floating))
    return known


#: Capabilities a defense declares (:attr:`Defense.capabilities`): which seams of a protocol it uses.
CLIENT_DATA = "client-data"  #: :meth:`Defense.on_client_data` changes the clients' training data
UPLOAD = "upload"  #: :meth:`Defense.on_upload` changes what clients send
LOCAL_TRAINING = "local-training"  #: :meth:`Defense.local_training` changes the clients' optimizer (DP-SGD)
AGGREGATION = "aggregation"  #: :meth:`Defense.aggregate` computes the receiver's sum itself
DOWNLOAD = "download"  #: :meth:`Defense.on_download` changes what the server sends
ROUND_CHECK = "round-check"  #: :meth:`Defense.abort_reason`: clients check a round before uploading
CAPABILITIES = (CLIENT_DATA, UPLOAD, LOCAL_TRAINING, AGGREGATION, DOWNLOAD, ROUND_CHECK)
_HOOKS = {
    "on_client_data": CLIENT_DATA,
    "on_upload": UPLOAD,
    "aggregate": AGGREGATION,
    "on_download": DOWNLOAD,
    "abort_reason": ROUND_CHECK,
}


@dataclass(frozen=True)
class LocalTraining:
    """How a ``local-training`` defense changes the clients' optimizer: DP-SGD's per-sample
    clipping to ``clip`` (L2) and Gaussian noise of standard deviation ``noise_multiplier * clip``."""

    noise_multiplier: float
    clip: float


@dataclass(frozen=True)
class VirtualRatings:
    """How clients treat the virtual entries a ``client-data`` defense adds (part of the clients'
    public algorithm): ``filling`` (``weight``, ``ua``, ``hf``) and, for ``hf``, the round after
    which virtual ratings become predictions and the local rounds between refreshes (None: the
    protocol's defaults)."""

    filling: str
    t_predict: int | None = None
    t_local: int | None = None


class Defense(Configurable):
    """Base class of defenses. Subclasses set ``name``, ``description``, ``parameters`` and hooks.

    Class attributes
    ----------------
    strength : str | None
        The parameter an experiment sweeps by default.
    default_grid : tuple
        Default values of the strength for sweeps.
    applies_to : tuple[str, ...] | None
        Protocol names this defense supports (``None``: every protocol whose schema holds a
        payload of ``acts_on``).
    acts_on : tuple[tuple[str, str], ...]
        The payloads the defense changes, as ``(message kind, payload field)``; ``ANY`` (``"*"``)
        for every upload kind or every field. An audit sweeps the defense only on protocols
        whose schema holds one of them (:meth:`acts_on_schema`); a defense declaring none joins
        no audit.
    capabilities : frozenset[str]
        The seams the defense uses (:data:`CAPABILITIES`). Protocols ask for a capability, never
        for a defense's name; when a class declares none, the hooks it overrides give them.
    privacy_claim : str | None
        The DP guarantee in words (neighbour relation, sensitivity, coverage), for ``describe``.
    schema_contribution : DefenseSchema
        What the defense adds to a transcript (:class:`~privaudit.schema.DefenseSchema`): message
        kinds it records with their payloads, upload fields it sends in another dtype (``int8``),
        masked/encrypted upload forms. The schema check composes it with the protocol's schema
        whenever the transcript's config lists the defense, in memory and on files alike; a
        defense that changes only values declares nothing.
    """

    kind_label = "defense"
    #: the registered name (looked up in the registry; registering never sets it)
    name = RegisteredName()
    strength: str | None = None
    default_grid: tuple = ()
    applies_to: tuple[str, ...] | None = None
    acts_on: tuple[tuple[str, str], ...] = ()
    capabilities: frozenset[str] = frozenset()
    #: what ``privaudit describe`` states of a DP defense's guarantee: neighbour relation,
    #: sensitivity, what is and is not covered (None: the defense claims no DP guarantee)
    privacy_claim: str | None = None
    schema_contribution: DefenseSchema = DefenseSchema()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "capabilities" in cls.__dict__:
            cls.capabilities = frozenset(cls.__dict__["capabilities"])
        else:
            cls.capabilities = frozenset(
                cap for hook, cap in _HOOKS.items() if getattr(cls, hook) is not getattr(Defense, hook)
            ) | (cls.capabilities & {LOCAL_TRAINING})
        unknown = set(cls.capabilities) - set(CAPABILITIES)
        if unknown:
            known = ", ".join(CAPABILITIES)
            raise TypeError(f"{cls.__name__}: unknown capabilities {sorted(unknown)} (known: {known})")

    @classmethod
    def acts_on_schema(cls, schema: ProtocolSchema) -> bool:
        """Whether a protocol with message schema ``schema`` has a payload this defense changes."""
        return any(holds_payload(schema, kind, name) for kind, name in cls.acts_on)

    def local_training(self) -> LocalTraining | None:
        """``local-training`` defenses: the clients' changed optimizer (default: none)."""
        return None

    def virtual_ratings(self) -> VirtualRatings | None:
        """``client-data`` defenses that add virtual entries: how clients fill them (default: none)."""
        return None

    def with_protocol_defaults(self, values: Mapping[str, Any]) -> Defense:
        """This defense with the protocol's values for parameters it leaves unset (default: itself)."""
        return self

    def on_client_data(self, data: Any, rng: np.random.Generator) -> Any:
        """Change a client's local data before training (default: unchanged)."""
        return data

    def on_upload(self, batch: UploadBatch, channel: ChannelContext) -> UploadBatch:
        """Transform a batch of uploads before it leaves the clients (default: unchanged)."""
        return batch

    def on_round(self, batches: list[UploadBatch], channel: ChannelContext) -> list[UploadBatch]:
        """Transform all the batches of one round together (same senders, in the protocol's
        order); default: each through :meth:`on_upload`."""
        return [self.on_upload(b, channel) for b in batches]

    def packs(self, batches: list[PackedBatch]) -> bool:
        """Whether this defense takes ``batches`` packed (:meth:`on_upload_packed` /
        :meth:`on_round_packed` give the same numbers as the unpacked hooks). Default: only a
        defense that changes no upload and computes no sum."""
        return all(getattr(type(self), h) is getattr(Defense, h) for h in ("on_upload", "on_round", "aggregate"))

    def on_upload_packed(self, batch: PackedBatch, channel: ChannelContext) -> PackedBatch:
        """:meth:`on_upload` of a packed batch (called only when :meth:`packs`; default: unchanged)."""
        return batch

    def on_round_packed(self, batches: list[PackedBatch], channel: ChannelContext) -> list[PackedBatch]:
        """:meth:`on_round` of packed batches (called only when :meth:`packs`; default: each
        through :meth:`on_upload_packed`)."""
        return [self.on_upload_packed(b, channel) for b in batches]

    def on_round_summed(self, batches: list[PackedBatch], channel: ChannelContext) -> list[PackedBatch]:
        """An unrecorded round that the receiver only sums (called only when :meth:`packs`):
        :meth:`on_round_packed` without the i.i.d. noise, which :meth:`summed_noise` then adds
        to the sums. Default: :meth:`on_round_packed` (a defense that adds no noise)."""
        return self.on_round_packed(batches, channel)

    def summed_noise(self, rng: np.random.Generator, counts: np.ndarray) -> np.ndarray | None:
        """The sum of this defense's i.i.d. noise over ``counts`` senders, elementwise (float64,
        the shape of ``counts``): equal in law to summing each sender's own draw. None: no noise."""
        return None

    def aggregate(self, batch: UploadBatch, channel: ChannelContext, rows: int | None) -> dict[str, np.ndarray] | None:
        """Sum ``batch`` at the receiver, or ``None`` to leave it to the next defense / plain sum."""
        return None

    def on_download(self, payload: dict[str, np.ndarray], channel: ChannelContext) -> dict[str, np.ndarray]:
        """Transform what the server sends to clients (default: unchanged)."""
        return payload

    def abort_reason(self, round: int, members: list[str], models: list[bytes], verified: Any) -> str | None:
        """``round-check`` defenses: why the cohort ``members`` abort the round before uploading
        (None: they go on), given the model each received (serialised) and whether each is a
        verified (enrolled, non-sybil) client (bool array). Default: never."""
        return None

    def privacy_spent(self, rounds: int) -> dict[str, Any] | None:
        """Privacy loss of a client that took part in ``rounds`` rounds, if known.

        Keys: ``epsilon``, ``delta``, ``unit`` (what is protected, in words), ``accountant``; a DP
        defense also states ``neighbour`` (``"rating"``: one rating value replaced, the rated-item
        set fixed; ``"user"``: one user's whole data replaced, item set included),
        ``item_set_covered`` (bool: whether which items a user rated is protected), ``releases``
        (separately noised releases over the run), ``sensitivity`` and ``norm`` (``"l1"``/``"l2"``)
        of one release under that neighbour relation.
        """
        return None

    def hides_plaintext(self) -> bool:
        """True when the receiver sees no per-client plaintext (encryption, secure aggregation)."""
        return False

"""The :class:`Defense` base class: what a defense changes of what clients send.

A defense has parameters (``params``), one of which may be its *strength* (``strength``, e.g. a
noise scale, an epsilon, a sampling ratio) with a default grid to sweep. Protocols never call a
defense directly: client uploads go through a :class:`~privaudit.protocols.base.Channel`, which
calls, for every active defense in order,

- :meth:`Defense.on_client_data` before training (e.g. sampling adds virtual items),
- :meth:`Defense.process_uploads`, the one upload hook: middleware over a round's uploads
  (:class:`RoundUploads`) with the signature ``(uploads, ctx, call_next)`` (as Flower's mods):
  the defense changes the uploads (noise, clipping, encryption, masking), may record its own
  messages, and hands them on with ``call_next``, which runs the later defenses and returns the
  uploads as the receiver gets them; ``ctx`` is the uplink (:class:`ChannelContext`: the
  simulation ``rng``, the ``transcript``, the ``model`` the clients last downloaded),
- :meth:`Defense.on_download` on what the server sends back.

The fast paths are derived, not written per defense: the uploads may come packed
(:class:`PackedBatch`, one array per entry) to a defense that declares :attr:`Defense.takes_packed`
(the others get them unpacked, one dict per sender, the same numbers); in a round the
receiver only sums (:attr:`RoundUploads.summed`, offered only when every defense takes the round
packed) a defense puts its i.i.d. noise on the sums (:meth:`RoundUploads.noise_on_sums`); a
defense that hides plaintext attaches the receiver's sum to the batches it sends
(:attr:`UploadBatch.receiver_sum`).

What the receiver sees after the defenses is exactly what the transcript records for it.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
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
    model : dict[str, numpy.ndarray] | None
        What the server last sent the clients through the channel (the round's downloaded
        model, after the defenses' :meth:`Defense.on_download`); None before any download or
        when the protocol sends its model otherwise.
    """

    rng: np.random.Generator
    transcript: Transcript
    model: Mapping[str, np.ndarray] | None


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
    receiver_sum : callable or None
        ``receiver_sum(batch, ctx, rows) -> dict``: how the receiver sums this batch when it
        cannot add plaintext (set by the encrypting or masking defense that made it: homomorphic
        sums and decryption, unmasking); None: the plain sum.
    """

    round: int
    kind: str
    senders: list[str]
    payloads: list[dict[str, np.ndarray]]
    receiver: str = "server"
    noisy_keys: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    recorded: bool = True
    receiver_sum: Callable[[UploadBatch, Any, int | None], dict[str, np.ndarray]] | None = field(
        default=None, repr=False, compare=False
    )

    def float_keys(self, payload: dict[str, np.ndarray]) -> list[str]:
        """Names of the entries of ``payload`` that count as uploaded floats."""
        if self.noisy_keys is not None:
            return [k for k in self.noisy_keys if k in payload]
        return [k for k, v in payload.items() if (v.dtype.kind == "f" if type(v) is np.ndarray else _is_float(v))]

    def with_floats(self, change: Callable[[np.ndarray], np.ndarray]) -> UploadBatch:
        """This batch with every uploaded float (:meth:`float_keys`, in (payload, key) order) through
        ``change``, which gets them as one fresh float64 array (it may change it in place) and
        returns as many; unchanged when there are none. :meth:`PackedBatch.with_floats` gives the
        same numbers on the packed form."""
        slots = [(j, key) for j, p in enumerate(self.payloads) for key in self.float_keys(p)]
        arrays = [np.asarray(self.payloads[j][key]) for j, key in slots]
        sizes = [a.size for a in arrays]
        if sum(sizes) == 0:
            return self
        flat = change(np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float64, copy=False))
        payloads = [dict(p) for p in self.payloads]
        end = 0
        for (j, key), arr, size in zip(slots, arrays, sizes):
            end += size
            payloads[j][key] = flat[end - size : end].reshape(arr.shape)
        return dataclasses.replace(self, payloads=payloads)


@dataclass
class PackedBatch:
    """An :class:`UploadBatch` held as one array per payload entry instead of one dict per sender.

    Payload j's entry ``key`` is rows ``bounds[j]:bounds[j + 1]`` of ``arrays[key]`` when
    ``bounds`` is given (ragged uploads such as ``items``/``values`` item rows), else
    ``arrays[key][j]`` (one equally shaped array per sender). Same messages, same order and the
    same floats as the unpacked batch (:meth:`payloads`); protocols build it to spare a Python
    object per client, and only defenses that declare :attr:`Defense.takes_packed` ever see one.

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

    def with_floats(self, change: Callable[[np.ndarray], np.ndarray]) -> UploadBatch | PackedBatch:
        """:meth:`UploadBatch.with_floats`, the same numbers: on the packed array when the batch has
        one float entry (its order is the (payload, key) order), else on the unpacked batch."""
        keys = self.float_keys()
        if len(keys) > 1:
            return self.unpacked().with_floats(change)
        if not self.senders or not keys or self.arrays[keys[0]].size == 0:
            return self
        values = self.arrays[keys[0]].astype(np.float64)  # a copy: the clients' plaintext stays as it was
        flat = change(values.reshape(-1))
        return dataclasses.replace(self, arrays={**self.arrays, keys[0]: flat.reshape(values.shape)})

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


@dataclass
class RoundUploads:
    """What clients send in one round, on its way through the defenses (:meth:`Defense.process_uploads`).

    Attributes
    ----------
    round : int
    batches : list[UploadBatch | PackedBatch]
        One batch per message kind, same senders in the protocol's order; packed
        (:class:`PackedBatch`) only for a defense that declares :attr:`Defense.takes_packed`.
        A defense that is not :attr:`Defense.joint_round` gets one batch at a time.
    summed : bool
        The round is not recorded and the receiver only sums it: a defense may put its i.i.d.
        noise on the sums (:meth:`noise_on_sums`) instead of drawing it per uploaded float.
    sum_noise : list of callables
        The laws :meth:`noise_on_sums` registered, in the defenses' order.
    """

    round: int
    batches: list[Any]
    summed: bool = False
    sum_noise: list[Callable[[np.random.Generator, np.ndarray], np.ndarray]] = field(default_factory=list)

    @property
    def packed(self) -> bool:
        """Whether every batch is a :class:`PackedBatch`."""
        return bool(self.batches) and all(isinstance(b, PackedBatch) for b in self.batches)

    def unpacked(self) -> RoundUploads:
        """The same uploads with every batch an :class:`UploadBatch` (one dict per sender)."""
        return self.replace([b.unpacked() if isinstance(b, PackedBatch) else b for b in self.batches])

    def replace(self, batches: list[Any]) -> RoundUploads:
        """These uploads with ``batches`` instead (same round, same sums' noise)."""
        return dataclasses.replace(self, batches=list(batches))

    def map(self, change: Callable[[Any], Any]) -> RoundUploads:
        """These uploads with every batch through ``change`` (batch -> batch), in order."""
        return self.replace([change(b) for b in self.batches])

    def noise_on_sums(self, law: Callable[[np.random.Generator, np.ndarray], np.ndarray]) -> None:
        """In a :attr:`summed` round: add, to every float element of the receiver's sums,
        ``law(rng, counts)``, the sum of a defense's i.i.d. noise over ``counts`` senders
        (float64, the shape of ``counts``; equal in law to summing each sender's own draw)."""
        if not self.summed:
            raise ValueError("noise goes on the sums only in a round the receiver only sums")
        self.sum_noise.append(law)


def _is_float(value: Any) -> bool:
    """Whether ``value`` (anything ``np.asarray`` takes) has a floating-point dtype (kind ``f``)."""
    dtype = value.dtype if isinstance(value, np.ndarray) else np.asarray(value).dtype
    return dtype.kind == "f"


#: Capabilities a defense declares (:attr:`Defense.capabilities`): which seams of a protocol it uses.
CLIENT_DATA = "client-data"  #: :meth:`Defense.on_client_data` changes the clients' training data
UPLOAD = "upload"  #: :meth:`Defense.process_uploads` changes what clients send
LOCAL_TRAINING = "local-training"  #: :meth:`Defense.local_training` changes the clients' optimizer (DP-SGD)
AGGREGATION = "aggregation"  #: the receiver's sum is the defense's own (:attr:`UploadBatch.receiver_sum`)
DOWNLOAD = "download"  #: :meth:`Defense.on_download` changes what the server sends
ROUND_CHECK = "round-check"  #: :meth:`Defense.abort_reason`: clients check a round before uploading
CAPABILITIES = (CLIENT_DATA, UPLOAD, LOCAL_TRAINING, AGGREGATION, DOWNLOAD, ROUND_CHECK)
_HOOKS = {
    "on_client_data": CLIENT_DATA,
    "process_uploads": UPLOAD,
    "on_download": DOWNLOAD,
    "abort_reason": ROUND_CHECK,
}
#: the upload hooks :meth:`Defense.process_uploads` replaced (a subclass defining one is refused,
#: except ``on_upload``, adapted with a DeprecationWarning)
_REMOVED_HOOKS = (
    "on_round",
    "packs",
    "on_upload_packed",
    "on_round_packed",
    "on_round_summed",
    "summed_noise",
    "aggregate",
)


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
    #: :meth:`process_uploads` takes :class:`PackedBatch` es (one array per entry; the same numbers
    #: as unpacked); the channel unpacks a round before a defense that does not. A round the
    #: receiver only sums takes the fast path (noise on the sums) only when every upload defense
    #: takes it packed and each batch has at most one float entry.
    takes_packed: bool = False
    #: :meth:`process_uploads` sees all of a round's message kinds at once (a DP defense's joint
    #: clip); otherwise the channel runs the defenses on one batch, then on the next.
    joint_round: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        removed = [h for h in _REMOVED_HOOKS if h in cls.__dict__]
        if removed:
            raise TypeError(
                f"{cls.__name__}: {', '.join(removed)} is no longer a defense hook; override "
                "process_uploads(uploads, ctx, call_next) (docs/extending.md)"
            )
        if "on_upload" in cls.__dict__ and "process_uploads" not in cls.__dict__:
            warnings.warn(
                f"{cls.__name__}.on_upload: override process_uploads(uploads, ctx, call_next) instead",
                DeprecationWarning,
                stacklevel=2,
            )
            cls.process_uploads = _adapted(cls.__dict__["on_upload"])
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

    def process_uploads(
        self, uploads: RoundUploads, ctx: ChannelContext, call_next: Callable[[RoundUploads], RoundUploads]
    ) -> RoundUploads:
        """The upload hook: change a round's uploads and hand them on (default: unchanged).

        Middleware as Flower's mods: ``call_next(uploads)`` runs the later defenses and returns
        the uploads as the receiver gets them (what the channel then records and sums); a
        defense returns that, or what it makes of it. ``ctx`` is the uplink
        (:class:`ChannelContext`: ``rng``, ``transcript``, the downloaded ``model``).

        A defense that changes values draws its randomness from ``ctx.rng`` in the order of the
        batches, payloads and float keys; in a :attr:`RoundUploads.summed` round it may register
        its i.i.d. noise on the sums instead (:meth:`RoundUploads.noise_on_sums`). A defense that
        hides plaintext sets :attr:`UploadBatch.receiver_sum` on the batches it returns.
        """
        return call_next(uploads)

    def on_upload(self, batch: UploadBatch | PackedBatch, ctx: ChannelContext) -> Any:
        """This defense alone on one batch (:meth:`process_uploads` with nothing after it), for
        tests and scripts. Deprecated as a hook: a subclass overriding it is adapted (one batch at
        a time, unpacked) with a DeprecationWarning; override :meth:`process_uploads`."""
        return self.on_round([batch], ctx)[0]

    def on_round(self, batches: list[Any], ctx: ChannelContext) -> list[Any]:
        """This defense alone on one round's ``batches`` (as :meth:`on_upload`); not a hook."""
        uploads = RoundUploads(batches[0].round if batches else 0, list(batches))
        if not self.takes_packed and any(isinstance(b, PackedBatch) for b in batches):
            uploads = uploads.unpacked()
        if self.joint_round or len(batches) <= 1:
            return self.process_uploads(uploads, ctx, _received).batches
        return [
            self.process_uploads(RoundUploads(uploads.round, [b]), ctx, _received).batches[0] for b in uploads.batches
        ]

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


def _received(uploads: RoundUploads) -> RoundUploads:
    """The end of a defense chain: the uploads as the receiver gets them."""
    return uploads


def _adapted(on_upload: Callable[..., UploadBatch]) -> Callable[..., RoundUploads]:
    """:meth:`Defense.process_uploads` of an old-style defense's ``on_upload(batch, channel)``."""

    def process_uploads(self: Defense, uploads: RoundUploads, ctx: Any, call_next: Callable) -> RoundUploads:
        return call_next(uploads.unpacked().map(lambda b: on_upload(self, b, ctx)))

    return process_uploads

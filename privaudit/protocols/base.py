"""The :class:`Protocol` base class and the uplink :class:`Channel`.

A protocol simulates one federated recommender on a :class:`~privaudit.data.RatingsDataset`
and returns a :class:`RunResult`: the transcript, the trained model, and utility metrics.
Every client-to-server upload passes through a :class:`Channel` built from the active
defenses, so a protocol never knows which defenses are on: it hands the channel the plaintext
uploads of a batch of clients and gets back what the receiver sees (and, with
:meth:`Channel.sum`, the receiver's aggregate).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from privaudit.defenses.base import Defense, PackedBatch, RoundUploads, UploadBatch
from privaudit.errors import PrivauditError
from privaudit.params import Param, declare_on, public_values, resolve_declared
from privaudit.protocols.blocks import CLIENT_BLOCK, Accumulator, block_ranges
from privaudit.registry import RegisteredName
from privaudit.results import MetricSpec, UserUtility
from privaudit.schema import ProtocolSchema
from privaudit.transcript import Transcript
from privaudit.transcript_io import claim_stream


@dataclass
class RunResult:
    """Outcome of :meth:`Protocol.run`.

    Attributes
    ----------
    transcript : Transcript
    model : Any
        Protocol-specific trained model (factor matrices, network weights).
    utility : dict[str, float]
        Utility metrics (e.g. ``ndcg@10``, ``rmse``), flat and JSON-able.
    user_utility : dict[str, UserUtility]
        Per-user (or per-group) contributions of the utility metrics that decompose (whose mean
        or ratio of sums is the value in ``utility``): what gives a defense's utility cost a paired
        bootstrap over users (:mod:`privaudit.results.utility`). Empty: no interval from one seed.
    """

    transcript: Transcript
    model: Any
    utility: dict[str, float] = field(default_factory=dict)
    user_utility: dict[str, UserUtility] = field(default_factory=dict)


class Channel:
    """The uplink: applies the defenses to uploads and records what each party sees.

    Every round's uploads go through the defenses' :meth:`~Defense.process_uploads`, composed
    once as middleware (the first defense's ``call_next`` runs the second, and so on; the last
    hands back what the receiver gets), then into the transcript; :meth:`sum` is the receiver's
    aggregate. The channel is the defenses' context (:class:`~privaudit.defenses.base.ChannelContext`).

    Parameters
    ----------
    defenses : sequence of Defense
        Applied in order on upload.
    transcript : Transcript
        Receives a message per sender for every recorded batch.
    rng : numpy.random.Generator
        Simulation randomness (noise draws). Cryptographic material never comes from it.
    """

    def __init__(self, defenses: Sequence[Defense], transcript: Transcript, rng: np.random.Generator):
        self.defenses = list(defenses)
        self.transcript = transcript
        self.rng = rng
        #: what the server last sent the clients through :meth:`download` (None: nothing yet)
        self.model: dict[str, np.ndarray] | None = None
        # the defenses that change uploads (the others pass every round on unchanged)
        self._uploaders = [d for d in self.defenses if type(d).process_uploads is not Defense.process_uploads]

    def client_data(self, data: Any) -> Any:
        """Pass client-local data through every defense's ``on_client_data``."""
        for defense in self.defenses:
            data = defense.on_client_data(data, self.rng)
        return data

    def send(
        self,
        round: int,
        kind: str,
        senders: Sequence[str],
        payloads: Sequence[Mapping[str, np.ndarray]],
        *,
        receiver: str = "server",
        record: bool = True,
        noisy_keys: tuple[str, ...] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> UploadBatch:
        """Upload one batch; returns it as the receiver sees it (after every defense).

        With ``record`` the transcript gets one message per sender, from sender to receiver.
        """
        if len(senders) != len(payloads):
            raise ValueError("one payload per sender is required")
        batch = UploadBatch(
            round,
            kind,
            list(senders),
            [dict(p) for p in payloads],
            receiver,
            noisy_keys,
            dict(meta or {}),
            bool(record),
        )
        (batch,) = self._through_defenses(RoundUploads(round, [batch])).batches
        if record:
            for sender, payload in zip(batch.senders, batch.payloads):
                self.transcript.add(round, sender, receiver, kind, payload, batch.meta)
        return batch

    def send_round(
        self,
        round: int,
        senders: Sequence[str],
        uploads: Sequence[tuple[str, Sequence[Mapping[str, np.ndarray]]]],
        record: bool = True,
    ) -> list[UploadBatch]:
        """Upload every message ``(kind, payloads)`` the ``senders`` send in one round, as the
        receiver sees them: like one :meth:`send` per kind, except that a defense that declares
        :attr:`~Defense.joint_round` (a DP defense's joint clip) sees the round's batches together."""
        batches = [
            UploadBatch(round, kind, list(senders), [dict(p) for p in payloads], recorded=bool(record))
            for kind, payloads in uploads
        ]
        if any(len(b.payloads) != len(b.senders) for b in batches):
            raise ValueError("one payload per sender is required")
        batches = self._through_defenses(RoundUploads(round, batches)).batches
        if record:
            self._record(round, batches)
        return batches

    def _through_defenses(self, uploads: RoundUploads) -> RoundUploads:
        """A round's uploads through the defenses' composed middleware: all batches at once when
        one defense is :attr:`~Defense.joint_round` (a DP clip), else one batch after the other,
        each through every defense (the order of the random draws and of the defenses' own
        messages). A defense that does not take packed batches gets them unpacked."""
        return uploads.replace([b for part in self._parts(uploads) for b in part.batches])

    def _parts(self, uploads: RoundUploads) -> list[RoundUploads]:
        """:meth:`_through_defenses` as the parts the chain ran on (one per batch unless joint)."""
        if any(d.joint_round for d in self._uploaders) or len(uploads.batches) <= 1:
            return [self._chain(0, uploads)]
        return [self._chain(0, RoundUploads(uploads.round, [b], uploads.summed)) for b in uploads.batches]

    def _chain(self, i: int, uploads: RoundUploads) -> RoundUploads:
        """Defenses ``i``, ``i + 1``, ... on ``uploads``: defense i's ``call_next`` runs the rest."""
        if i == len(self._uploaders):
            return uploads
        defense = self._uploaders[i]
        if not defense.takes_packed and any(isinstance(b, PackedBatch) for b in uploads.batches):
            uploads = uploads.unpacked()
        return defense.process_uploads(uploads, self, lambda nxt: self._chain(i + 1, nxt))

    def _record(self, round: int, batches: list[Any]) -> None:
        """One message per sender of every batch, as the receiver sees it."""
        for batch in batches:
            payloads = batch.payloads() if isinstance(batch, PackedBatch) else batch.payloads
            for sender, payload in zip(batch.senders, payloads):
                self.transcript.add(round, sender, batch.receiver, batch.kind, payload, batch.meta)

    def send_round_packed(self, round: int, batches: list[PackedBatch], *, record: bool = True) -> list[Any]:
        """:meth:`send_round` of packed batches (one per message kind, same senders in the same
        order); each defense gets them packed or unpacked as it declares
        (:attr:`~Defense.takes_packed`). Returns what the receiver sees (:class:`PackedBatch` or
        :class:`UploadBatch`; :meth:`sum` takes either); same numbers and transcript either way."""
        for b in batches:
            b.recorded = bool(record)
        batches = self._through_defenses(RoundUploads(round, list(batches))).batches
        if record:
            self._record(round, batches)
        return batches

    def sum_round_packed(
        self, round: int, batches: list[PackedBatch], rows: Sequence[int | None], index_key: str = "items"
    ) -> list[dict[str, np.ndarray]] | None:
        """The receiver's sums (as :meth:`sum`) of an unrecorded round, one per batch (``rows``:
        each batch's row count), when every defense that changes uploads takes them packed and
        each batch has at most one float entry; None otherwise (then send and sum). The round
        goes through the defenses as :attr:`RoundUploads.summed`: their i.i.d. noise is drawn on
        the sums, as the sum over each element's senders
        (:meth:`~privaudit.defenses.base.RoundUploads.noise_on_sums`), the same law as
        per-sender noise summed, without a draw per uploaded float. Nothing is recorded."""
        if not all(d.takes_packed for d in self._uploaders) or any(len(b.float_keys()) > 1 for b in batches):
            return None
        for b in batches:
            b.recorded = False
        out = []
        parts = self._parts(RoundUploads(round, list(batches), summed=True))
        laws = [(b, part.sum_noise) for part in parts for b in part.batches]
        for (batch, noises), n_rows in zip(laws, rows):
            total = packed_sum(batch, n_rows, index_key)
            for key in batch.float_keys():
                if key not in total:
                    continue
                if index_key in batch.arrays and batch.bounds is not None:
                    per_row = total["counts"].astype(np.float64)  # senders that sent each row
                else:
                    per_row = np.full(total[key].shape[:1], float(len(batch.senders)))
                counts = np.broadcast_to(per_row.reshape((-1,) + (1,) * (total[key].ndim - 1)), total[key].shape)
                for law in noises:
                    total[key] = total[key] + law(self.rng, counts)
            out.append(total)
        return out

    def sum(
        self, batch: UploadBatch | PackedBatch, rows: int | None = None, index_key: str = "items"
    ) -> dict[str, np.ndarray]:
        """The receiver's aggregate of ``batch`` as plaintext.

        For payloads with ``index_key`` (item-row uploads), entries are summed into ``rows``
        rows by index (an ``counts`` entry gives how many senders touched each row); other
        entries are summed elementwise. Defenses that hide plaintext (encryption, secure
        aggregation) attach the receiver's sum to the batches they make
        (:attr:`UploadBatch.receiver_sum`).
        """
        if isinstance(batch, PackedBatch):  # only defenses that compute no sum pack
            return packed_sum(batch, rows, index_key)
        if batch.receiver_sum is not None:
            return batch.receiver_sum(batch, self, rows)
        return plain_sum(batch.payloads, rows, index_key)

    def download(self, payload: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Pass a server-to-client payload through every defense's ``on_download``; the result
        is the clients' :attr:`model` from then on."""
        out = dict(payload)
        for defense in self.defenses:
            out = defense.on_download(out, self)
        self.model = out
        return out


def plain_sum(
    payloads: Sequence[Mapping[str, np.ndarray]], rows: int | None, index_key: str = "items"
) -> dict[str, np.ndarray]:
    """Sum a list of payloads (row-indexed entries scattered into ``rows`` rows)."""
    if not payloads:
        return {}
    out: dict[str, np.ndarray] = {}
    if index_key in payloads[0]:
        if rows is None:
            raise ValueError("rows is required to sum row-indexed uploads")
        indices = [np.asarray(p[index_key], dtype=np.int64) for p in payloads]
        index = np.concatenate(indices)
        out["counts"] = np.bincount(index, minlength=rows).astype(np.int64)
        # payloads whose row ids are strictly increasing (the convention): add them one by one,
        # which sums every row in payload order like the scatter below (identical result) and
        # avoids concatenating all values (much faster for large uploads)
        unique_rows = _increasing_within(index, [len(i) for i in indices])
        for key in payloads[0]:
            if key == index_key:
                continue
            first = np.asarray(payloads[0][key])
            if unique_rows and first.dtype.kind in "biuf" and len(payloads) <= max(64, len(index) // 16):
                total = np.zeros((rows,) + first.shape[1:], dtype=np.result_type(first.dtype, np.float64))
                full = np.arange(rows)
                for idx, p in zip(indices, payloads):
                    v = np.asarray(p[key])
                    if len(idx) == rows and np.array_equal(idx, full):
                        total += v
                    else:
                        total[idx] += v
                out[key] = total
                continue
            values = np.concatenate([np.asarray(p[key]) for p in payloads], axis=0)
            total = np.zeros((rows,) + values.shape[1:], dtype=np.result_type(values.dtype, np.float64))
            if values.ndim <= 2 and np.issubdtype(total.dtype, np.floating) and values.dtype.kind in "biuf":
                # bincount accumulates in input order like np.add.at (same result), much faster
                flat = values.reshape(len(index), -1)
                cols = [np.bincount(index, weights=flat[:, j], minlength=rows) for j in range(flat.shape[1])]
                total[...] = np.stack(cols, axis=1).reshape(total.shape) if cols else total
            else:
                np.add.at(total, index, values)
            out[key] = total
        return out
    for key in payloads[0]:
        out[key] = np.sum([np.asarray(p[key]) for p in payloads], axis=0)
    return out


def packed_sum(batch: PackedBatch, rows: int | None, index_key: str = "items") -> dict[str, np.ndarray]:
    """:func:`plain_sum` of a packed batch, bit for bit: every row's entries added in sender order."""
    if not batch.senders:
        return {}
    arrays = batch.arrays
    if batch.bounds is None and index_key not in arrays:
        # np.sum of the stacked entries over axis 0, as plain_sum's np.sum of the list
        return {k: np.sum(np.ascontiguousarray(v), axis=0) for k, v in arrays.items()}
    if batch.bounds is None or index_key not in arrays:
        return plain_sum(batch.payloads(), rows, index_key)
    if rows is None:
        raise ValueError("rows is required to sum row-indexed uploads")
    index = np.asarray(arrays[index_key], dtype=np.int64)
    out: dict[str, np.ndarray] = {"counts": np.bincount(index, minlength=rows).astype(np.int64)}
    # selector S (rows x entries), one 1.0 per entry in its row: S @ values adds every row's
    # entries in entry (= sender) order to 0.0, exactly plain_sum's rounding, in one C loop
    select = None
    for key, values in arrays.items():
        if key == index_key:
            continue
        if values.ndim > 2 or values.dtype.kind not in "biuf":
            return plain_sum(batch.payloads(), rows, index_key)
        if select is None:
            select = sp.csc_matrix((np.ones(len(index)), index, np.arange(len(index) + 1)), shape=(rows, len(index)))
        total = np.asarray(select @ values.reshape(len(index), -1), dtype=np.float64)
        total = total.reshape((rows,) + values.shape[1:])
        out[key] = total
    return out


def _increasing_within(index: np.ndarray, lengths: list[int]) -> bool:
    """Whether every one of the consecutive runs of ``index`` of ``lengths`` is strictly increasing."""
    if len(index) < 2:
        return True
    up = index[1:] > index[:-1]
    starts = np.cumsum(lengths)[:-1]  # a run's first entry need not exceed the previous run's last
    starts = starts[(starts > 0) & (starts < len(index))]
    up[starts - 1] = True
    return bool(np.all(up))


def resolve_seed(rng: np.random.Generator | int | None) -> int:
    """The integer seed of a run: given, drawn from a Generator, or fresh (OS entropy)."""
    if rng is None:
        return int(np.random.SeedSequence().entropy % (2**32))
    if isinstance(rng, (int, np.integer)):
        return int(rng)
    if isinstance(rng, np.random.Generator):
        return int(rng.integers(2**32))
    raise TypeError(f"rng must be a numpy Generator, an int seed or None, not {type(rng).__name__}")


def public_defenses(defenses: Sequence[Defense]) -> list[dict[str, Any]]:
    """The active defenses as recorded in a transcript's public config: ``{"name", **params}``."""
    return [
        {"name": d.name, **(d.public_config() if hasattr(d, "public_config") else dict(d.config))} for d in defenses
    ]


@dataclass(frozen=True)
class RunSetup:
    """What the shared opening of :meth:`Protocol.run` hands to :meth:`Protocol.simulate`.

    Attributes
    ----------
    config : dict
        Resolved and validated parameter values.
    dataset : RatingsDataset
    defenses : list of Defense
        The defenses of the run, prepared and checked.
    seed : int
        The run's seed; protocols spawn their generator streams from it.
    """

    config: dict[str, Any]
    dataset: Any
    defenses: list[Defense]
    seed: int

    def streams(self, n: int) -> list[np.random.Generator]:
        """``n`` independent generators spawned from the seed (always in the same order)."""
        return [np.random.default_rng(s) for s in np.random.SeedSequence(self.seed).spawn(n)]


#: Utility metrics the built-in protocols report, with their meaning and direction; a protocol
#: declares its own as ``utility_specs = utility_specs_of("rmse", "mae")`` (or writes MetricSpecs).
UTILITY_METRICS: dict[str, MetricSpec] = {
    "ndcg@10": MetricSpec(
        True, True, "fraction", "normalized discounted cumulative gain of the top 10 recommendations"
    ),
    "hr@10": MetricSpec(
        True, True, "fraction", "hit ratio at 10: share of users whose held-out item is in their top 10"
    ),
    "precision@10": MetricSpec(
        True, True, "fraction", "share of the top 10 recommendations that are held-out relevant items"
    ),
    "recall@10": MetricSpec(True, True, "fraction", "share of held-out relevant items found in the top 10"),
    "f1@10": MetricSpec(True, True, "fraction", "F1 score of the top 10 recommendations"),
    "map@10": MetricSpec(True, True, "fraction", "mean average precision of the top 10"),
    "rmse": MetricSpec(False, True, "rating", "root mean squared error of predicted ratings (lower is better)"),
    "mae": MetricSpec(False, True, "rating", "mean absolute error of predicted ratings (lower is better)"),
    "mean_rank": MetricSpec(False, True, "rank", "mean percentile rank of held-out items (lower is better)"),
}


def utility_specs_of(*names: str) -> dict[str, MetricSpec]:
    """The :data:`UTILITY_METRICS` entries named (a protocol's ``utility_specs`` declaration)."""
    unknown = [n for n in names if n not in UTILITY_METRICS]
    if unknown:
        raise KeyError(f"no shared utility spec {unknown[0]!r}: declare a MetricSpec for it")
    return {n: UTILITY_METRICS[n] for n in names}


class Protocol:
    """Base class of protocols.

    A subclass declares, as class attributes (each documented below, defaults here):
    ``name``, ``description``, ``parameters`` (every hyperparameter as a
    :class:`~privaudit.params.Param`), ``schema`` (the messages its transcripts hold),
    ``utility_specs`` (what each utility metric means, lower-is-better ones included),
    ``default_attack``, ``main_utility``, the defaults of ``privaudit attack --protocol``
    (``default_sweep_spec``, ``default_defense_specs``, ``default_users``) and, for slow
    protocols, :meth:`estimate_seconds`; it implements :meth:`simulate`. ``declared``,
    ``default_config`` (name -> default) and ``config_help`` (name -> help) are derived from
    ``parameters``.
    """

    #: the registered name (looked up in the registry; registering never sets it)
    name = RegisteredName()
    description: str = ""
    parameters: tuple[Param, ...] = ()
    declared: dict[str, Param] = {}
    default_config: dict[str, Any] = {}
    config_help: dict[str, str] = {}
    #: The messages a transcript of this protocol may hold (:class:`~privaudit.schema.ProtocolSchema`),
    #: checked before any attack reads a transcript; declared beside the protocol. A protocol whose
    #: schema depends on the transcript overrides :meth:`schema_for` instead (recorded runs).
    schema: ProtocolSchema | None = None
    #: Utility metric name -> :class:`~privaudit.results.MetricSpec` (direction: ``rmse`` is
    #: lower-is-better), for every utility metric the protocol's runs report that a report may show
    #: (the main one, utility costs of defenses). See :func:`utility_specs_of`.
    utility_specs: dict[str, MetricSpec] = {}
    #: The strongest registered attack against it (``privaudit attack`` without ``--attack``).
    default_attack: str | None = None
    #: The utility metric reports show (tables, figures' right axis); None: the first of
    #: ndcg@10, ndcg, rmse, hr@10, f1, auc that the run reports.
    main_utility: str | None = None
    attacker: str = "server"
    #: ``privaudit attack --protocol P`` without --defense, --noise or --sweep: this sweep
    #: (``TARGET.PARAM=V1,V2,...``, e.g. ``laplace.scale=0,1,2``) with ``default_defense_specs``
    #: (``NAME[:k=v,...]``) active, unless the attack sweeps a parameter of its own. None: no sweep.
    default_sweep_spec: str | None = None
    #: Defenses active with ``default_sweep_spec`` (``NAME[:k=v,...]`` strings).
    default_defense_specs: tuple[str, ...] = ()
    #: Users a default ``privaudit attack --protocol P`` subsamples (None: the whole dataset);
    #: set by protocols whose run is slow per user (encryption).
    default_users: int | None = None
    #: Config keys a run fills in itself (dataset sizes, the defense list, the seed). They are
    #: recorded in the transcript's public config and ignored when passed back in, so the
    #: config of a transcript can be handed to another run.
    derived_keys: tuple[str, ...] = ()
    #: Whether a run may write its transcript while it runs (:func:`privaudit.transcript_io.streaming`):
    #: true for protocols that never read their own transcript's payloads back during the run.
    streams_transcript: bool = False
    #: The protocol's clients run in blocks of consecutive clients: its :class:`BlockRound` class
    #: (what a sharded run, ``privaudit run --scheduler``, spreads over Dask workers). None: they
    #: do not, and a sharded run refuses the protocol.
    block_round: ClassVar[type[BlockRound] | None] = None

    @classmethod
    def estimate_seconds(cls, n_users: int, sets: Mapping[str, Any], defenses: Sequence[str] = ()) -> float | None:
        """Rough seconds of one run with ``n_users`` users, ``--set`` values ``sets`` and
        ``--defense`` specs ``defenses`` (the CLI prints an estimate above two minutes);
        None (the default): cheap enough not to estimate."""
        return None

    @classmethod
    def check_stack(cls, defenses: Sequence[Any]) -> None:
        """Refuse, before any compute, a stack of ``defenses`` (instances, in order) this protocol
        cannot run: a :class:`~privaudit.errors.PrivauditError` naming why. Default: accept."""

    @classmethod
    def release_count(cls, config: Mapping[str, Any]) -> int | None:
        """Rounds in which every client sends its uploads in a run with (public) ``config``,
        recorded or not: the releases a DP defense's accountant composes (``privacy_spent``) and
        the rounds ``target_epsilon`` calibrates over. None (the default): not fixed by the
        config; the accounting then counts the rounds recorded in the transcript and its
        ``privacy`` entry says ``"rounds_source": "recorded"``."""
        return None

    @classmethod
    def schema_for(cls, transcript: Any) -> ProtocolSchema | None:
        """The schema ``transcript`` is checked against (default: :attr:`schema`)."""
        return cls.schema

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declare_on(cls, "default_config", "config_help")

    @classmethod
    def resolve_config(cls, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Defaults updated with ``overrides``, coerced and checked against the declaration,
        then :meth:`validate_config`.

        Keys in :attr:`derived_keys` (and ``seed``, ``defenses``) are dropped from ``overrides``.
        """
        ignored = set(cls.derived_keys) | {"seed", "defenses"}
        overrides = {k: v for k, v in (overrides or {}).items() if k not in ignored}
        config = resolve_declared(cls.declared, overrides, f"protocol {cls.name!r}")
        cls.validate_config(config)
        return config

    @classmethod
    def validate_config(cls, config: dict[str, Any]) -> None:
        """Checks across several values (single values are checked by their declaration);
        raise :class:`PrivauditError` (see :meth:`config_fail`)."""

    def open_transcript(
        self,
        config: Mapping[str, Any],
        dataset: Any,
        defenses: Sequence[Defense],
        seed: int | None,
        parties: Sequence[str],
        /,
        **public: Any,
    ) -> Transcript:
        """A new transcript of this protocol whose public config is ``config`` (its parameters
        declared public), then the derived values ``public`` (dataset sizes, rating scale, ...),
        then the active defenses (:func:`public_defenses`); the dataset is recorded by its
        ``summary()``."""
        recorded = {**public_values(self.declared, config), **public, "defenses": public_defenses(defenses)}
        transcript = Transcript(
            protocol=self.name, config=recorded, seed=seed, dataset=dataset.summary(), parties=list(parties)
        )
        if self.streams_transcript:  # inside transcript_io.streaming(): written round by round
            claim_stream(transcript)
        return transcript

    @classmethod
    def config_fail(cls, msg: str) -> None:
        """Raise the one-line :class:`PrivauditError` of an invalid config value."""
        raise PrivauditError(f"protocol {cls.name!r}: {msg}")

    def run(
        self,
        dataset: Any,
        config: Mapping[str, Any] | None = None,
        defenses: Sequence[Defense] = (),
        rng: np.random.Generator | int | None = None,
    ) -> RunResult:
        """Simulate the protocol on ``dataset``; the transcript, the trained model and utility.

        The shared opening, then the protocol's own steps: ``config`` resolved against the
        declaration, the defenses prepared (:meth:`prepare_defenses`) and checked, the seed
        fixed (:func:`resolve_seed`), then :meth:`simulate`, which opens the transcript with
        the clients' private messages and the channel through :meth:`start`.

        Parameters
        ----------
        dataset : RatingsDataset
        config : mapping, optional
            Parameter values (strings are coerced); derived keys are ignored.
        defenses : sequence of Defense
        rng : numpy Generator, int seed or None (fresh entropy)
        """
        cfg = self.resolve_config(config)
        active = self.prepare_defenses(cfg, list(defenses))
        self.check_defenses(self.name, active)
        return self.simulate(RunSetup(cfg, dataset, active, resolve_seed(rng)))

    def prepare_defenses(self, config: Mapping[str, Any], defenses: list[Defense]) -> list[Defense]:
        """The defenses a run uses (default: as given; a protocol may add its own)."""
        return defenses

    def simulate(self, setup: RunSetup) -> RunResult:
        """The protocol's own steps (split, training, evaluation) for a prepared run."""
        raise NotImplementedError

    def simulate_blocks(self, setup: RunSetup, block_size: int = CLIENT_BLOCK) -> RunResult:
        """The run of a protocol that declares :attr:`block_round`, every block in this process
        (:class:`LocalBlocks`): the transcript a sharded run's folder loads back to, message for
        message. Without defenses (a sharded run has none)."""
        rounds = self.block_round
        if rounds is None:
            raise PrivauditError(f"protocol {self.name!r} declares no block_round: its clients do not run in blocks")
        if setup.defenses:
            raise PrivauditError(f"protocol {self.name!r}: a run in client blocks takes no defenses")
        rounds.check(setup.config)
        run = rounds.open(self, setup)
        return run.train(LocalBlocks(run, block_size))

    def start(
        self,
        setup: RunSetup,
        parties: Sequence[str],
        private: Mapping[str, Mapping[str, np.ndarray]] | Sequence[tuple[str, Mapping[str, np.ndarray], Mapping]],
        channel_rng: np.random.Generator,
        /,
        **public: Any,
    ) -> tuple[Transcript, Channel]:
        """Open the run's transcript (:meth:`open_transcript` with the derived values ``public``),
        record every client's ``private`` message (round 0, sender = receiver; a mapping
        party -> payload, or ``(party, payload, meta)`` triples) and build the uplink."""
        transcript = self.open_transcript(setup.config, setup.dataset, setup.defenses, setup.seed, parties, **public)
        items = private.items() if isinstance(private, Mapping) else private
        for entry in items:
            party, payload, *meta = entry
            transcript.add(0, party, party, "private", payload, *meta)
        return transcript, Channel(setup.defenses, transcript, channel_rng)

    @staticmethod
    def check_defenses(protocol: str, defenses: Sequence[Defense]) -> None:
        for d in defenses:
            if d.applies_to is not None and protocol not in d.applies_to:
                raise PrivauditError(
                    f"defense {d.name!r} does not apply to protocol {protocol!r} (it supports: {', '.join(d.applies_to)})"
                )


# ------------------------------------------------------------------------- client blocks


@dataclass
class BlockPart:
    """What one block of clients returns from one round (:meth:`BlockRound.round`).

    Attributes
    ----------
    partials : tuple
        Arrays or floats the server adds over the blocks, in block order (:class:`Accumulator`):
        the block's upload sums, loss part, counts...
    uploads : list of (kind, payloads), optional
        In a recorded round: per kind of :attr:`BlockRound.upload_kinds`, in that order, one
        payload per client of the block (in client order). None when the round is not recorded.
    """

    partials: tuple
    uploads: list[tuple[str, list[Mapping[str, np.ndarray]]]] | None = None


class BlockClients:
    """The clients of a run in blocks, as the server's loop (:attr:`BlockRun.train`) drives them:
    all blocks in this process (:class:`LocalBlocks`) or on Dask workers (a sharded run). A
    block's state stays where it is; only the server's state and the blocks' partials move."""

    n_blocks: int

    def round(self, t: int, record: bool, *state: Any) -> list:
        """One round of every block (:meth:`BlockRound.round` with the server's ``state``): the
        sums of the blocks' partials, added in block order (an empty list when there are no
        clients). In a recorded round the uploads are recorded (or written to the blocks' shards)."""
        raise NotImplementedError

    def each(self, method: str, *args: Any) -> list:
        """``rounds.<method>(block, *args)`` of every block, in block order (test errors, the
        clients' final factors...)."""
        raise NotImplementedError


@dataclass
class BlockRun:
    """A run opened for client blocks (:meth:`BlockRound.open`), in the server's process.

    Attributes
    ----------
    rounds : BlockRound
        The per-block computation with the run's settings, sent to every worker (picklable).
    n_clients : int
        Clients ``client:0`` .. ``client:<n_clients - 1>``, cut into blocks of consecutive clients.
    transcript : Transcript
        The run's header; nothing recorded yet (the clients' private messages come from
        :meth:`BlockRound.private`, the servers' from ``train``).
    block : callable
        ``block(index, lo, hi)``: the state of the block of clients ``lo..hi-1`` (picklable; it
        lives on one worker from then on).
    train : callable
        ``train(clients)``: the servers' loop over :class:`BlockClients`, called once every block
        has been handed out (it may let go of the clients' data), returning the :class:`RunResult`.
    """

    rounds: BlockRound
    n_clients: int
    transcript: Transcript
    block: Callable[[int, int, int], Any]
    train: Callable[[BlockClients], RunResult]


class BlockRound:
    """A protocol's client round, one block of consecutive clients at a time: declared as
    ``Protocol.block_round``, it lets :mod:`privaudit.sharded` spread any such protocol's clients
    over Dask workers (``privaudit run --scheduler``) without knowing the protocol.

    In the server's process the class opens a run (:meth:`check`, :meth:`open`); the
    :class:`BlockRun` it returns holds an instance (the run's settings) that is pickled to every
    worker, where :meth:`private` and :meth:`round` (and any other method ``train`` asks for
    through :meth:`BlockClients.each`) run on each block held there. The server adds the blocks'
    partials in block order, so a sharded run equals the run with every block in one process
    (:meth:`Protocol.simulate_blocks`) bit for bit, whatever the number of workers; per-client
    random draws must come from the seed and the block index
    (:func:`privaudit.protocols.blocks.block_rng`) or from the server's process.

    The transcript of a run in blocks holds, in order: every client's ``private`` message (round
    0), then per round the server's messages (sender ``server``), the blocks' uploads (one kind of
    :attr:`upload_kinds` after the other, clients in order) and the other parties' messages.
    """

    #: The kinds a block uploads (client -> server) in a recorded round, in transcript order.
    upload_kinds: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check(cls, config: Mapping[str, Any]) -> None:
        """Refuse a resolved ``config`` whose run does not go in blocks (a one-line
        :class:`PrivauditError`), before any compute. Default: every config does."""

    @classmethod
    def open(cls, protocol: Protocol, setup: RunSetup) -> BlockRun:
        """The run on ``setup`` (no defenses): split, servers' state, transcript header, blocks."""
        raise NotImplementedError

    def private(self, block: Any) -> list[tuple[Mapping[str, np.ndarray], Mapping[str, Any] | None]]:
        """``(payload, meta)`` of the ``private`` message of each client of ``block``, in client
        order (the ground truth attacks are scored against). Default: none."""
        return []

    def round(self, block: Any, t: int, record: bool, *state: Any) -> BlockPart:
        """Round ``t`` of ``block``'s clients with the server's ``state`` (updating the block's
        own state in place): its partials and, when ``record``, its uploads."""
        raise NotImplementedError


class LocalBlocks(BlockClients):
    """Every block of a :class:`BlockRun` in this process, uploads recorded into its transcript
    in the order a sharded run's folder loads back to; ``block_size`` clients per block."""

    def __init__(self, run: BlockRun, block_size: int = CLIENT_BLOCK) -> None:
        self.rounds, self.transcript = run.rounds, run.transcript
        self.ranges = block_ranges(run.n_clients, block_size)
        self.n_blocks = len(self.ranges)
        self.blocks = [run.block(b, lo, hi) for b, (lo, hi) in enumerate(self.ranges)]
        for (lo, _), block in zip(self.ranges, self.blocks):
            for u, (payload, meta) in enumerate(self.rounds.private(block)):
                self.transcript.add(0, f"client:{lo + u}", f"client:{lo + u}", "private", payload, meta)

    def round(self, t: int, record: bool, *state: Any) -> list:
        total, uploads = Accumulator(), []
        for block in self.blocks:
            part = self.rounds.round(block, t, record, *state)
            total.add(*part.partials)
            uploads.append(part.uploads or [])
            for kind, _ in uploads[-1]:
                if kind not in self.rounds.upload_kinds:
                    raise ValueError(f"a block uploaded {kind!r}, not one of its round's upload_kinds")
        for kind in self.rounds.upload_kinds if record else ():
            for (lo, _), own in zip(self.ranges, uploads):
                for payloads in (p for k, p in own if k == kind):
                    for u, payload in enumerate(payloads):
                        self.transcript.add(t, f"client:{lo + u}", "server", kind, payload)
        return total.values

    def each(self, method: str, *args: Any) -> list:
        return [getattr(self.rounds, method)(block, *args) for block in self.blocks]

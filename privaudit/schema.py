"""Declared message schemas: what a transcript of a protocol may hold, checked before any attack.

A protocol class declares ``schema = ProtocolSchema(...)`` in its own module: the config keys every party knows,
named dimensions taken from that config (``m`` = ``n_items``, ``K``, ...), and one
:class:`MessageSchema` per message kind (who sends it to whom, and its payload arrays as
:class:`PayloadField`: dtype class, shape in named dimensions, id ranges, uniqueness, finiteness,
value ranges). :func:`validate` checks a transcript against the schema of the protocol it names
and raises a one-line :class:`~privaudit.errors.TranscriptError` at the first violation, so an
attack never reads an array the schema did not admit.

Shape entries are an ``int`` (that exact length), a dimension name (resolved from the config,
or, when the schema does not define it, bound by its first use and then equal in every message:
``D``, the embedding width, is such a name), a name starting with ``@`` (bound per message:
``("@r",)`` for ``items`` and ``("@r", "K")`` for ``values`` means one row per item), or
``None`` (any length).

A defense declares what it adds to the transcripts of the protocols it runs on as a
:class:`DefenseSchema` (``Defense.schema_contribution``): extra message kinds with their payload
schemas, payload dtypes it may turn an upload field into (``int8`` quantized rows), and the
upload forms it produces (meta ``masked``: unsigned ring elements instead of floats, as
``secagg``; meta ``encrypted``: ``uint8`` ciphertexts with the ids kept, as ``paillier``).
:func:`validate` composes the protocol's schema with the declarations of the defenses the
transcript's config lists, and an error names the component whose declaration the message
breaks (``protocol 'fedmvmf'`` or ``defense 'paillier'``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privaudit._escape import printable
from privaudit.errors import PrivauditError, TranscriptError

__all__ = [
    "ANY",
    "MASKED",
    "ENCRYPTED",
    "UPLOAD_FORMS",
    "DefenseSchema",
    "GRAD_ROWS",
    "GROUP_PRIVATE",
    "ITEMS",
    "RATINGS",
    "MessageSchema",
    "PayloadField",
    "ProtocolSchema",
    "holds_payload",
    "n_attributes",
    "schema_of",
    "validate",
]

_MAX_DIM = 2**31 - 1
_DTYPES = {
    "int": "iu",  # integer ids and counts (signed or unsigned)
    "float": "f",
    "number": "biuf",
    "uint": "u",
    "uint8": "u",
    "bool": "b",
    "int8": "i",
}
#: dtype classes that fix the item size too (bytes)
_ITEMSIZE = {"uint8": 1, "int8": 1}


@dataclass(frozen=True)
class PayloadField:
    """One named array of a message.

    Parameters
    ----------
    name : str
        Payload key.
    dtype : {"int", "float", "number", "uint", "uint8", "int8", "bool"}
        Allowed dtype class (``uint8``: exactly unsigned 8-bit, e.g. Paillier ciphertext bytes;
        ``int8``: exactly signed 8-bit, e.g. quantized rows).
    shape : tuple
        One entry per axis: int, dimension name, ``@name`` (per message) or None (any).
    ids : str or None
        Values are ids in ``[0, dims[ids])`` (an integer dtype is required).
    unique : bool
        With ``ids``: no id repeats within the array.
    finite : bool
        Float values must be finite (no NaN/Inf).
    value_range : (str or float, str or float) or None
        Inclusive bounds; a string is a config key (``("rating_min", "rating_max")``).
    optional : bool
        The message may leave this array out.
    """

    name: str
    dtype: str
    shape: tuple = ()
    ids: str | None = None
    unique: bool = False
    finite: bool = True
    value_range: tuple | None = None
    optional: bool = False


@dataclass(frozen=True)
class MessageSchema:
    """A message kind: sender and receiver roles and payload fields.

    Roles are a party id's prefix before ``:`` (``client``, ``server``, ``item-server``,
    ``decryptor``); receiver ``"self"`` means the sender itself (``private``/``state``).
    ``upload=True`` marks messages that pass through the defenses' channel (they may be
    masked or encrypted when such a defense is configured). ``required=True``: a transcript of
    this protocol holds at least one message of the kind.
    """

    kind: str
    sender: str
    receiver: str
    fields: tuple[PayloadField, ...] = ()
    upload: bool = False
    required: bool = False
    #: admit payload arrays beyond ``fields`` (recorded apps name their own arrays); each extra
    #: array must still be a numeric array with finite floats
    open_payload: bool = False


@dataclass(frozen=True)
class ProtocolSchema:
    """Everything a protocol's transcript may hold.

    Parameters
    ----------
    config_keys : tuple of str
        Keys the public config must hold.
    dims : mapping
        Dimension name -> config key, or a callable ``(config, dataset) -> int``.
    messages : tuple of MessageSchema
        Every admitted kind (a kind may appear in several entries, e.g. per role pair).
    """

    config_keys: tuple[str, ...] = ()
    dims: Mapping[str, str | Callable[[Mapping, Mapping], Any]] = field(default_factory=dict)
    messages: tuple[MessageSchema, ...] = ()


#: Upload form of a defense whose uploads hold unsigned ring elements (meta ``masked``).
MASKED = "masked"
#: Upload form of a defense whose uploads hold ``uint8`` ciphertexts, ids kept (meta ``encrypted``).
ENCRYPTED = "encrypted"
UPLOAD_FORMS = (MASKED, ENCRYPTED)


@dataclass(frozen=True)
class DefenseSchema:
    """What a defense adds to the transcripts of the protocols it runs on.

    Parameters
    ----------
    messages : tuple of MessageSchema
        Message kinds the defense itself records (key distribution, sums sent to decryptors),
        or further role pairs / payloads of a protocol kind.
    payload_dtypes : mapping
        ``(message kind, payload field) -> dtype class`` (:class:`PayloadField` dtypes): the
        defense may send that upload field in this dtype instead of the protocol's (e.g.
        ``{("*", "values"): "int8"}`` for quantized rows); ``"*"`` (:data:`ANY`) for every
        upload kind. Shape, ids and ranges stay those of the protocol's field.
    upload_forms : tuple of str
        :data:`MASKED` and/or :data:`ENCRYPTED`: uploads whose meta carries that flag are
        checked in that form (ring elements; ciphertext bytes with ids in the clear).
    """

    messages: tuple[MessageSchema, ...] = ()
    payload_dtypes: Mapping[tuple[str, str], str] = field(default_factory=dict)
    upload_forms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [f for f in self.upload_forms if f not in UPLOAD_FORMS]
        if unknown:
            raise TypeError(f"unknown upload form {unknown[0]!r} (known: {', '.join(UPLOAD_FORMS)})")
        for (kind, name), dtype in dict(self.payload_dtypes).items():
            if dtype not in _DTYPES:
                raise TypeError(f"payload dtype {dtype!r} of {kind}.{name} is not one of {', '.join(_DTYPES)}")
        for m in self.messages:
            for f in m.fields:
                if f.dtype not in _DTYPES:
                    raise TypeError(f"{m.kind}.{f.name}: dtype {f.dtype!r} is not one of {', '.join(_DTYPES)}")


#: Wildcard of a payload declaration (``Defense.acts_on``): every upload kind, or every field.
ANY = "*"


def holds_payload(schema: ProtocolSchema, kind: str, name: str) -> bool:
    """Whether ``schema`` admits payload field ``name`` in a ``kind`` message (:data:`ANY`:
    in any upload message / any field; an upload is a message that passes the defenses' channel)."""
    for m in schema.messages:
        if (m.kind == kind) if kind != ANY else m.upload:
            if name == ANY or any(f.name == name for f in m.fields):
                return True
    return False


def _role(party: str) -> str:
    return party.split(":", 1)[0]


def _fail(text: str) -> TranscriptError:
    return TranscriptError(printable(text))


def schema_of(protocol: str, transcript: Any = None) -> ProtocolSchema:
    """The schema declared by the registered protocol ``protocol`` (one line if none).

    Each protocol declares ``schema`` beside itself (:class:`~privaudit.protocols.base.Protocol`);
    one whose schema depends on the transcript (recorded runs, whose schema map travels in the
    public config) overrides the classmethod ``schema_for(transcript)`` instead.
    """
    from privaudit import registry

    cls = registry.get("protocol", protocol)
    schema = cls.schema_for(transcript) if transcript is not None else cls.schema
    if not isinstance(schema, ProtocolSchema):
        raise _fail(
            f"protocol {protocol!r} declares no transcript schema, so its transcripts cannot be checked (refused)"
        )
    return schema


def _defense_names(config: Mapping) -> set[str]:
    names = set()
    for d in config.get("defenses", []) or []:
        if isinstance(d, str):
            names.add(d.split(":", 1)[0])
        elif isinstance(d, Mapping) and isinstance(d.get("name"), str):
            names.add(d["name"])
    return names


def defense_schemas(config: Mapping) -> dict[str, DefenseSchema]:
    """The :class:`DefenseSchema` declared by every registered defense that ``config`` (a
    transcript's public config) lists, by name; a name no registered defense has contributes
    nothing (the transcript's messages then have to fit the protocol's schema alone)."""
    from privaudit import registry

    out: dict[str, DefenseSchema] = {}
    for name in sorted(_defense_names(config)):
        try:
            cls = registry.get("defense", name)
        except PrivauditError:
            continue
        declared = getattr(cls, "schema_contribution", None)
        if isinstance(declared, DefenseSchema):
            out[name] = declared
    return out


def _resolve_dims(schema: ProtocolSchema, config: Mapping, dataset: Mapping, protocol: str) -> dict[str, int]:
    for key in schema.config_keys:
        if key not in config:
            raise _fail(
                f"transcript config lacks {key!r}, which every {protocol} transcript holds (wrong protocol label?)"
            )
    dims = {}
    for name, source in schema.dims.items():
        try:
            value = source(config, dataset) if callable(source) else config[source]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise _fail(f"transcript config cannot give dimension {name!r} of the {protocol} schema") from None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= _MAX_DIM:
            raise _fail(f"transcript config gives dimension {name!r} = {value!r} (a non-negative integer is required)")
        dims[name] = int(value)
    return dims


def _bound(value: Any, config: Mapping, what: str) -> float:
    if isinstance(value, str):
        v = config.get(value)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _fail(f"transcript config lacks a number {value!r} needed to check {what}")
        return float(v)
    return float(value)


class _Checker:
    def __init__(self, schema: ProtocolSchema, transcript: Any, defenses: Mapping[str, DefenseSchema] | None = None):
        self.protocol = transcript.protocol
        self.config = transcript.config
        self.dims = _resolve_dims(schema, transcript.config, transcript.dataset, transcript.protocol)
        self.free: dict[str, tuple[int, str]] = {}  # transcript-wide dimensions bound by first use
        self.listed = sorted(_defense_names(transcript.config))
        declared = defense_schemas(transcript.config) if defenses is None else dict(defenses)
        self.forms: dict[str, list[str]] = {form: [] for form in UPLOAD_FORMS}
        #: (kind or ANY, field) -> [(dtype class, defense name)] a defense may send instead
        self.alt_dtypes: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.by_kind: dict[str, list[tuple[MessageSchema, str]]] = {}
        for e in schema.messages:
            self.by_kind.setdefault(e.kind, []).append((e, f"protocol {self.protocol!r}"))
        for name, d in sorted(declared.items()):
            for e in d.messages:
                self.by_kind.setdefault(e.kind, []).append((e, f"defense {name!r}"))
            for form in d.upload_forms:
                self.forms[form].append(name)
            for key, dtype in dict(d.payload_dtypes).items():
                self.alt_dtypes.setdefault(tuple(key), []).append((dtype, name))
        self.required = {e.kind for e in schema.messages if e.required}
        self.parties = set(transcript.parties)

    def _alternates(self, e: MessageSchema, name: str) -> list[tuple[str, str]]:
        if not e.upload:
            return []
        return self.alt_dtypes.get((e.kind, name), []) + self.alt_dtypes.get((ANY, name), [])

    # -------------------------------------------------------------------------------------
    def _dim(self, entry: Any, local: dict[str, int], length: int, where: str, axis: int) -> None:
        if entry is None:
            return
        if isinstance(entry, int):
            expected = entry
        elif entry.startswith("@"):
            expected = local.setdefault(entry, length)
        elif entry in self.dims:
            expected = self.dims[entry]
        else:
            expected, first = self.free.setdefault(entry, (length, where))
            if expected != length:
                raise _fail(f"{where}: axis {axis} has length {length}, but {entry} = {expected} elsewhere ({first})")
            return
        if expected != length:
            raise _fail(f"{where}: axis {axis} has length {length}, expected {entry} = {expected}")

    def _field(self, f: PayloadField, arr: Any, local: dict[str, int], where: str, alternates: Sequence = ()) -> None:
        if not isinstance(arr, np.ndarray):
            raise _fail(f"{where}: not an array")
        if not _dtype_is(arr, f.dtype) and not any(_dtype_is(arr, dtype) for dtype, _ in alternates):
            also = "".join(f" or {dtype} (defense {name!r})" for dtype, name in alternates)
            raise _fail(f"{where}: dtype {arr.dtype} is not {f.dtype}{also}")
        if arr.ndim != len(f.shape):
            raise _fail(f"{where}: {arr.ndim} axes {list(arr.shape)}, expected {len(f.shape)} {list(f.shape)}")
        for axis, (entry, length) in enumerate(zip(f.shape, arr.shape)):
            self._dim(entry, local, int(length), where, axis)
        if arr.dtype.kind == "f" and f.finite and arr.size and not np.isfinite(arr).all():
            raise _fail(f"{where}: holds NaN or infinite values")
        if f.ids is not None and arr.size:
            bound = self.dims[f.ids] if f.ids in self.dims else local.get(f.ids)
            if bound is None:
                raise _fail(f"{where}: the schema's id bound {f.ids!r} is unknown")
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= bound:
                bad = lo if lo < 0 else hi
                raise _fail(f"{where}: id {bad} is outside [0, {bound}) ({f.ids})")
            if f.unique and np.unique(arr).size != arr.size:
                raise _fail(f"{where}: an id repeats within the message")
        if f.value_range is not None and arr.size:
            lo = _bound(f.value_range[0], self.config, where)
            hi = _bound(f.value_range[1], self.config, where)
            if float(arr.min()) < lo or float(arr.max()) > hi:
                raise _fail(f"{where}: values outside [{lo:g}, {hi:g}]")

    def _match(self, e: MessageSchema, m: Any, where: str, origin: str) -> None:
        fields = {f.name: f for f in e.fields}
        extra = sorted(set(m.payload) - set(fields))
        if extra and e.open_payload:
            for name in extra:
                self._field(
                    PayloadField(name, "number", (None,) * np.ndim(m.payload[name])),
                    m.payload[name],
                    {},
                    f"{where} payload {name!r}",
                )
        elif extra:
            raise _fail(f"{where}: payload {extra[0]!r} is not part of a {m.kind!r} message as {origin} declares it")
        missing = [f.name for f in e.fields if not f.optional and f.name not in m.payload]
        if missing:
            raise _fail(f"{where}: payload {missing[0]!r} is missing")
        local: dict[str, int] = {}
        for f in e.fields:  # declaration order: a per-message id bound is bound before it is used
            if f.name in m.payload:
                self._field(f, m.payload[f.name], local, f"{where} payload {f.name!r}", self._alternates(e, f.name))

    def _match_masked(self, e: MessageSchema, m: Any, where: str) -> None:
        """secagg uploads: ring elements (unsigned) in the plain layout or the dense (values, P) one."""
        names = {f.name for f in e.fields}
        extra = sorted(set(m.payload) - names - {"P"})
        if extra:
            raise _fail(f"{where}: masked payload {extra[0]!r} is not part of a {self.protocol} {m.kind!r} upload")
        for name, arr in m.payload.items():
            if not isinstance(arr, np.ndarray) or arr.dtype.kind != "u" or arr.ndim > 3:
                raise _fail(f"{where} payload {name!r}: a masked upload must hold unsigned ring elements")
        if "P" in m.payload:
            values = m.payload.get("values")
            ids = next((f for f in e.fields if f.ids is not None), None)
            rows = self.dims.get(ids.ids) if ids is not None else None
            if (
                values is None
                or m.payload["P"].shape != (values.shape[0],)
                or (rows is not None and values.shape[0] != rows)
            ):
                raise _fail(f"{where}: masked dense upload has inconsistent rows")

    def _match_encrypted(self, e: MessageSchema, m: Any, where: str) -> None:
        """paillier uploads: ``ciphertexts`` bytes; id fields kept in the clear and checked."""
        fields = {f.name: f for f in e.fields}
        local: dict[str, int] = {}
        for name, arr in m.payload.items():
            if name == "ciphertexts":
                if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or not 1 <= arr.ndim <= 3:
                    raise _fail(f"{where} payload 'ciphertexts': must be a uint8 array of 1 to 3 axes")
                continue
            f = fields.get(name)
            if f is None or f.ids is None:
                raise _fail(f"{where}: encrypted upload carries plaintext payload {name!r}")
            self._field(f, arr, local, f"{where} payload {name!r}")
        if "ciphertexts" not in m.payload:
            raise _fail(f"{where}: encrypted upload without ciphertexts")

    def message(self, i: int, m: Any) -> None:
        where = f"message {i} (seq {m.seq}, {m.kind!r} from {m.sender!r})"
        if m.round < 0:
            raise _fail(f"{where}: negative round {m.round}")
        if self.parties and (m.sender not in self.parties or m.receiver not in self.parties):
            raise _fail(f"{where}: sender or receiver {m.receiver!r} is not a party of the transcript")
        candidates = self.by_kind.get(m.kind)
        if not candidates:
            raise _fail(f"{where}: kind {m.kind!r} is {self._unknown_kind()}")
        roles = [
            (e, origin)
            for e, origin in candidates
            if _role(m.sender) == e.sender
            and (m.receiver == m.sender if e.receiver == "self" else _role(m.receiver) == e.receiver)
        ]
        if not roles:
            origins = " / ".join(dict.fromkeys(origin for _, origin in candidates))
            raise _fail(f"{where}: a {m.kind!r} message of {origins} does not go from {m.sender!r} to {m.receiver!r}")
        meta = m.meta if isinstance(m.meta, Mapping) else {}
        form = next((f for f in UPLOAD_FORMS if meta.get(f)), None)
        error = None
        for e, origin in roles:
            try:
                if e.upload and form is not None:
                    if not self.forms[form]:
                        raise _fail(f"{where}: {form} upload, but no defense the config lists declares {form} uploads")
                    (self._match_masked if form == MASKED else self._match_encrypted)(e, m, where)
                else:
                    self._match(e, m, where, origin)
                return
            except TranscriptError as exc:
                error = error or exc
        raise error

    def _unknown_kind(self) -> str:
        """Why a kind is unknown, naming the components asked."""
        if not self.listed:
            return f"not a {self.protocol} message kind (wrong protocol label?)"
        from privaudit import registry

        unregistered = [n for n in self.listed if n not in registry.available("defense")]
        text = f"not a {self.protocol} message kind, nor one a listed defense declares ({', '.join(self.listed)})"
        if unregistered:
            text += f"; not registered here: {', '.join(unregistered)}"
        return text


def _dtype_is(arr: np.ndarray, dtype: str) -> bool:
    size = _ITEMSIZE.get(dtype)
    return arr.dtype.kind in _DTYPES[dtype] and (size is None or arr.dtype.itemsize == size)


def validate(
    transcript: Any, schema: ProtocolSchema | None = None, defenses: Mapping[str, DefenseSchema] | None = None
) -> None:
    """Check ``transcript`` against ``schema`` (default: its protocol's declared schema).

    ``defenses`` (name -> :class:`DefenseSchema`) defaults to the declarations of the registered
    defenses the transcript's config lists (:func:`defense_schemas`).

    Raises
    ------
    TranscriptError
        One line naming the message, the payload and the violation: unknown protocol, missing
        config key, unknown kind, wrong sender/receiver, unexpected or missing payload, wrong
        dtype, shape or dimension (K, rows vs items), id outside its range or repeated, NaN/Inf,
        value outside its range, or a required kind absent.
    """
    if schema is None:
        schema = schema_of(transcript.protocol, transcript)
    checker = _Checker(schema, transcript, defenses)
    seen = set()
    for i, m in enumerate(transcript.messages):
        checker.message(i, m)
        seen.add(m.kind)
    missing = sorted(checker.required - seen)
    if missing:
        raise _fail(
            f"transcript holds no {missing[0]!r} message, which every {transcript.protocol} transcript has "
            "(wrong protocol label?)"
        )


def messages(*entries: MessageSchema) -> tuple[MessageSchema, ...]:
    """Convenience for schema declarations: a tuple of message schemas."""
    return tuple(entries)


def n_attributes(config: Mapping, dataset: Mapping) -> int:
    """Dimension ``p`` of the MVMF schemas: the number of public ``attribute_names``."""
    names = config["attribute_names"]
    if not isinstance(names, Sequence) or isinstance(names, str):
        raise TypeError("attribute_names")
    return len(names)


# ------------------------------------------------------------------------------------------
# Fields the built-in protocols' schemas share (each protocol declares its schema beside it).

#: Item ids of one message: unique rows of the item matrix (``@r`` of them).
ITEMS = PayloadField("items", "int", ("@r",), ids="m", unique=True)
#: One rating per item id, on the public rating scale.
RATINGS = PayloadField("ratings", "float", ("@r",), value_range=("rating_min", "rating_max"))
#: An upload of item-matrix rows: ids and one K-wide row each.
GRAD_ROWS = (ITEMS, PayloadField("values", "float", ("@r", "K")))
#: A group's private ratings (FedSPLIT, FedProto: a client is a group of users).
GROUP_PRIVATE = (
    PayloadField("user_ids", "int", ("@n",), ids="users", unique=True),
    PayloadField("users", "int", ("@r",), ids="@n"),
    PayloadField("items", "int", ("@r",), ids="m"),
    RATINGS,
    PayloadField("n_users", "int", ()),
)

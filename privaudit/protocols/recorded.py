"""``flower``: the protocol name of transcripts recorded from a real Flower run (not simulated).

A recorded transcript names its messages through the app's schema map
(:mod:`privaudit.integrations.schema_map`); the attacks that read it are the generic ones,
which choose themselves by the message kinds it holds. Record a run with
``privaudit record --flower APP_DIR``; attack it with ``privaudit attack --transcript FILE``.
"""

from __future__ import annotations

import math
from typing import Any

from privaudit.errors import PrivauditError
from privaudit.protocols.base import Protocol
from privaudit.registry import register_protocol
from privaudit.schema import ProtocolSchema

#: Largest ``n_items`` a recorded transcript may declare (attacks allocate per-item arrays per client).
MAX_RECORDED_ITEMS = 2**20
#: Most points of a rating grid (``(rating_max - rating_min) / rating_step + 1``).
MAX_RATING_LEVELS = 1000
#: Most public attribute names (one-hot columns) a recording may declare.
MAX_ATTRIBUTES = 10_000
#: Meta keys the attacks read, and their types.
_META_TYPES = {"to": list, "of": str, "values": str, "masked": bool, "encrypted": bool}


def _fail(text: str) -> PrivauditError:
    from privaudit._escape import printable
    from privaudit.errors import TranscriptError

    return TranscriptError(printable(f"recorded transcript: {text}"))


def _number(config: dict[str, Any], key: str) -> float | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(f"config {key} = {value!r} is not a finite number")
    return float(value)


def check_recorded_config(config: Any) -> None:
    """One-line refusal of a recorded transcript's public config that the attacks cannot trust.

    Requires a ``schema_map`` and an integer ``n_items`` in ``[1, MAX_RECORDED_ITEMS]``; the
    rating grid (``rating_min`` < ``rating_max``, ``rating_step`` > 0) finite with at most
    ``MAX_RATING_LEVELS`` points; ``attribute_names`` (if given) a list of strings; ``defenses``
    a list of objects with a string ``name``.
    """
    if not isinstance(config, dict):
        raise _fail("its public config is not an object")
    if not isinstance(config.get("schema_map"), dict):
        raise _fail("its public config holds no schema_map (record it with privaudit record)")
    m = config.get("n_items")
    if isinstance(m, bool) or not isinstance(m, int):
        raise _fail(f"config n_items = {m!r}: an integer number of items is required (ids are checked against it)")
    if not 1 <= m <= MAX_RECORDED_ITEMS:
        raise _fail(f"config n_items = {m} is outside [1, {MAX_RECORDED_ITEMS}]")
    lo, hi, step = (_number(config, k) for k in ("rating_min", "rating_max", "rating_step"))
    if (lo is None) != (hi is None):
        raise _fail("config gives only one of rating_min and rating_max")
    if step is not None and step <= 0:
        raise _fail(f"config rating_step = {step:g} must be positive")
    if lo is not None and hi is not None:
        if not lo < hi:
            raise _fail(f"config rating_min = {lo:g} is not below rating_max = {hi:g}")
        levels = (hi - lo) / (step or 1.0) + 1
        if levels > MAX_RATING_LEVELS:
            raise _fail(f"config rating grid has {levels:.3g} levels, more than {MAX_RATING_LEVELS}")
    names = config.get("attribute_names", [])
    if not isinstance(names, list) or len(names) > MAX_ATTRIBUTES or not all(isinstance(x, str) for x in names):
        raise _fail(f"config attribute_names must be a list of at most {MAX_ATTRIBUTES} strings")
    defenses = config.get("defenses", [])
    if not isinstance(defenses, list) or not all(
        isinstance(d, dict) and isinstance(d.get("name"), str) for d in defenses
    ):
        raise _fail('config defenses must be a list of objects with a string "name"')


def check_recorded_meta(transcript: Any) -> None:
    """Type-check the meta keys the attacks read (``to`` a list of party ids, ``of``/``values``
    strings, ``masked``/``encrypted`` booleans)."""
    parties = set(transcript.parties)
    for i, m in enumerate(transcript.messages):
        if not isinstance(m.meta, dict):
            raise _fail(f"message {i}: meta is not an object")
        for key, kind in _META_TYPES.items():
            if key in m.meta and not isinstance(m.meta[key], kind):
                raise _fail(f"message {i} ({m.kind!r}): meta {key!r} must be a {kind.__name__}")
        to = m.meta.get("to", [])
        if not all(isinstance(p, str) and p in parties for p in to):
            raise _fail(f"message {i} ({m.kind!r}): meta 'to' names a party the transcript does not list")


@register_protocol("flower")
class RecordedFlower(Protocol):
    """A run recorded from a Flower app; privaudit does not simulate it."""

    description = "a run recorded from a Flower app (privaudit record --flower APP_DIR); attacked from its transcript"
    default_attack = "generic-trained-items"
    #: transcripts come from a recorder, never from :meth:`run` (so the protocol has no parameters)
    recorded = True
    #: a recording holds no utility metric (the app's own evaluation is not part of the transcript)
    utility_specs: dict = {}

    @classmethod
    def schema_for(cls, transcript: Any) -> ProtocolSchema:
        """The schema of a recorded transcript, built from the schema map in its public config.

        The public config is checked first (:func:`check_recorded_config`), then every kind
        the map names (sent down by the server or up by clients), the server's ``state`` and
        the clients' ``private`` messages: ``items`` are unique ids in ``[0, n_items)`` with one
        row of ``values`` each; ``V`` is ``n_items x K`` and item-update rows are ``K`` wide
        (``K`` bound by its first use); float arrays are finite; other arrays are admitted as
        numbers (apps name their own records). Message meta is type-checked.
        """
        from privaudit.integrations.schema_map import SchemaMap
        from privaudit.schema import MessageSchema, PayloadField

        config = transcript.config or {}
        check_recorded_config(config)
        check_recorded_meta(transcript)
        smap = SchemaMap.from_dict(config["schema_map"], "recorded transcript schema_map")
        items = PayloadField("items", "int", ("@r",), ids="m", unique=True, optional=True)
        model = PayloadField("V", "float", ("m", "K"), optional=True)
        rows = {
            "item_update": PayloadField("values", "float", ("@r", "K"), optional=True),
        }
        other_values = PayloadField("values", "float", ("@r", None), optional=True)
        entries = []
        for rule in smap.kinds:
            up = rule.direction == "up"
            fields = (items, rows.get(rule.kind, other_values), model)
            entries.append(
                MessageSchema(
                    rule.kind, "client" if up else "server", "server" if up else "client", fields, open_payload=True
                )
            )
        # messages the map does not name keep the app's message type as ``flower.<type>``
        for kind in sorted({m.kind for m in transcript.messages if m.kind.startswith("flower.")}):
            entries.append(MessageSchema(kind, "server", "client", (), open_payload=True))
            entries.append(MessageSchema(kind, "client", "server", (), open_payload=True))
        entries.append(MessageSchema("state", "server", "self", (items, other_values, model), open_payload=True))
        rated = ("rating_min", "rating_max") if "rating_min" in config and "rating_max" in config else None
        truth_items = PayloadField("items", "int", ("@n",), ids="m", unique=True, optional=True)
        ratings = PayloadField("ratings", "float", ("@n",), value_range=rated, optional=True)
        entries.append(MessageSchema("private", "client", "self", (truth_items, ratings), open_payload=True))
        # the secret bits of a canary client (privaudit record --canaries): never in the server's view
        bits = PayloadField("bits", "int", (None,), optional=True)
        entries.append(MessageSchema("canary_bits", "client", "self", (bits,), open_payload=True))
        return ProtocolSchema(dims={"m": "n_items"}, messages=tuple(entries))

    @classmethod
    def validate_config(cls, config: dict[str, Any]) -> None:
        raise PrivauditError(
            "protocol 'flower' is recorded, not simulated: record a run with "
            "privaudit record --flower APP_DIR -o run.ptx, then attack it with --transcript run.ptx"
        )

"""``flower``: the protocol name of transcripts recorded from a real Flower run (not simulated).

A recorded transcript names its messages through the app's schema map
(:mod:`privaudit.integrations.schema_map`); the attacks that read it are the generic ones,
which choose themselves by the message kinds it holds. Record a run with
``privaudit record --flower APP_DIR``; attack it with ``privaudit attack --transcript FILE``.
"""

from __future__ import annotations

from typing import Any

from privaudit.errors import PrivauditError
from privaudit.protocols.base import Protocol
from privaudit.registry import register_protocol


@register_protocol("flower")
class RecordedFlower(Protocol):
    """A run recorded from a Flower app; privaudit does not simulate it."""

    description = "a run recorded from a Flower app (privaudit record --flower APP_DIR); attacked from its transcript"
    default_attack = "generic-trained-items"
    #: transcripts come from a recorder, never from :meth:`run` (so the protocol has no parameters)
    recorded = True

    @classmethod
    def schema_for(cls, transcript: Any) -> Any:
        """The schema of a recorded transcript, built from the schema map in its public config.

        Every kind the map names (sent down by the server or up by clients), the server's
        ``state`` and the clients' ``private`` messages; ``items`` are unique ids below
        ``n_items`` when the config gives it, float arrays finite, other arrays admitted as
        numbers (apps name their own records).
        """
        from privaudit.integrations.schema_map import SchemaMap
        from privaudit.schema import MessageSchema, PayloadField, ProtocolSchema

        config = transcript.config or {}
        raw = config.get("schema_map")
        if not isinstance(raw, dict):
            raise PrivauditError(
                "recorded transcript: its public config holds no schema_map (record it with privaudit record)"
            )
        smap = SchemaMap.from_dict(raw, "recorded transcript schema_map")
        has_m = isinstance(config.get("n_items"), int) and not isinstance(config.get("n_items"), bool)
        items = PayloadField("items", "int", (None,), ids="m" if has_m else None, unique=True, optional=True)
        values = PayloadField("values", "float", (None, None), optional=True)
        entries = []
        for rule in smap.kinds:
            up = rule.direction == "up"
            entries.append(
                MessageSchema(
                    rule.kind,
                    "client" if up else "server",
                    "server" if up else "client",
                    (items, values),
                    upload=up,
                    open_payload=True,
                )
            )
        # messages the map does not name keep the app's message type as ``flower.<type>``
        for kind in sorted({m.kind for m in transcript.messages if m.kind.startswith("flower.")}):
            entries.append(MessageSchema(kind, "server", "client", (), open_payload=True))
            entries.append(MessageSchema(kind, "client", "server", (), open_payload=True))
        entries.append(MessageSchema("state", "server", "self", (), open_payload=True))
        entries.append(
            MessageSchema(
                "private",
                "client",
                "self",
                (items, PayloadField("ratings", "float", (None,), optional=True)),
                open_payload=True,
            )
        )
        return ProtocolSchema(dims={"m": "n_items"} if has_m else {}, messages=tuple(entries))

    @classmethod
    def validate_config(cls, config: dict[str, Any]) -> None:
        raise PrivauditError(
            "protocol 'flower' is recorded, not simulated: record a run with "
            "privaudit record --flower APP_DIR -o run.ptx, then attack it with --transcript run.ptx"
        )

"""Schema maps: from a federated app's record names to privaudit's message kinds and payload names.

A recorder flattens every message of a real run into named entries: an array ``R/k`` for key
``k`` of an array record ``R``, and a config or metric value ``R/k`` (numbers, strings, bytes).
A :class:`SchemaMap` says which entries make a message of which privaudit kind and under which
payload names, so that attacks read a recorded transcript through the same contract as a
simulated one (``item_update`` with ``items`` and ``values``, ``model`` with ``V``, ...).

The declaration is a plain mapping (a Python dict, or the ``[tool.privaudit.schema]`` table of
a Flower app's ``pyproject.toml``)::

    round = "group_id"          # where the round is: the message's group id, or an entry "R/k"
    round-base = 1              # the app's first round number (privaudit rounds start at 0)
    [public]                    # privaudit config key -> the app's run-config key
    lr = "lr"
    [[kinds]]                   # first matching rule wins
    kind = "item_update"        # privaudit message kind
    direction = "up"            # "up": client -> server (a reply); "down": server -> client
    message-type = "train"      # optional: only messages of this Flower message type
    when = ["item-rows/ids"]    # entries (or whole records "R") that must all be present
    payload = { items = "item-rows/ids", values = "item-rows/rows" }
    meta = { values = "rows" }  # optional: copied into every matching message's meta

Entries a rule does not rename keep their ``R/k`` names; a message no rule matches gets kind
``flower.<message type>`` (``.reply`` appended for replies), so nothing a run sent is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from privaudit.errors import PrivauditError

__all__ = ["REQUIRED_PAYLOAD", "KindRule", "SchemaMap", "SchemaMapError"]

#: Payload names the generic attacks read, per privaudit kind (what a map must provide).
REQUIRED_PAYLOAD: dict[str, tuple[str, ...]] = {
    "item_update": ("items", "values"),
    "model": ("V",),
}

_DIRECTIONS = ("up", "down")
_RULE_KEYS = {"kind", "direction", "message-type", "when", "payload", "meta"}
_MAP_KEYS = {"round", "round-base", "public", "kinds"}


class SchemaMapError(PrivauditError):
    """A schema map is incomplete or malformed (one line naming what it lacks)."""


@dataclass(frozen=True)
class KindRule:
    """One rule of a schema map: which messages become ``kind`` and how their entries are named."""

    kind: str
    direction: str
    when: tuple[str, ...]
    payload: dict[str, str] = field(default_factory=dict)
    message_type: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def matches(self, direction: str, message_type: str, entries: Mapping[str, Any]) -> bool:
        """Whether a message with these flattened ``entries`` falls under this rule."""
        if direction != self.direction:
            return False
        if self.message_type is not None and message_type.split(".")[0] != self.message_type:
            return False
        records = {name.split("/", 1)[0] for name in entries}
        return all(w in entries or w in records for w in self.when)


@dataclass(frozen=True)
class SchemaMap:
    """A validated schema map (see the module docstring for the declaration)."""

    kinds: tuple[KindRule, ...]
    round: str = "group_id"
    round_base: int = 1
    public: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], where: str = "schema map") -> SchemaMap:
        """Validate ``spec``; a :class:`SchemaMapError` naming the first thing it lacks."""
        if not isinstance(spec, Mapping):
            raise SchemaMapError(f"{where} must be a table (mapping), got {type(spec).__name__}")
        unknown = sorted(set(spec) - _MAP_KEYS)
        if unknown:
            raise SchemaMapError(f"{where} has unknown key {unknown[0]!r} (known: {', '.join(sorted(_MAP_KEYS))})")
        raw_kinds = spec.get("kinds")
        if not isinstance(raw_kinds, list) or not raw_kinds:
            raise SchemaMapError(f"{where} lacks 'kinds' (a list of rules mapping record names to message kinds)")
        rules = tuple(_rule(raw, f"{where} kinds[{i}]") for i, raw in enumerate(raw_kinds))
        round_src = spec.get("round", "group_id")
        if not isinstance(round_src, str) or not round_src:
            raise SchemaMapError(f'{where}: \'round\' must be "group_id" or an entry name "record/key"')
        base = spec.get("round-base", 1)
        if not isinstance(base, int) or isinstance(base, bool):
            raise SchemaMapError(f"{where}: 'round-base' must be an integer")
        public = spec.get("public", {})
        if not _str_map(public):
            raise SchemaMapError(f"{where}: 'public' must map privaudit config keys to run-config keys (strings)")
        return cls(rules, round_src, base, dict(public))

    def to_dict(self) -> dict[str, Any]:
        """The declaration back as a JSON-able dict (recorded in the transcript's config)."""
        kinds = []
        for r in self.kinds:
            d: dict[str, Any] = {"kind": r.kind, "direction": r.direction, "when": list(r.when)}
            if r.payload:
                d["payload"] = dict(r.payload)
            if r.message_type is not None:
                d["message-type"] = r.message_type
            if r.meta:
                d["meta"] = dict(r.meta)
            kinds.append(d)
        return {"round": self.round, "round-base": self.round_base, "public": dict(self.public), "kinds": kinds}

    def require(self, kind: str, names: tuple[str, ...] | None = None) -> None:
        """Raise unless some rule maps messages to ``kind`` with every payload name in ``names``."""
        names = REQUIRED_PAYLOAD.get(kind, ()) if names is None else names
        rules = [r for r in self.kinds if r.kind == kind]
        if not rules:
            raise SchemaMapError(f"schema map lacks a rule for kind {kind!r}")
        for name in names:
            if not any(name in r.payload for r in rules):
                raise SchemaMapError(f"schema map kind {kind!r} lacks payload {name!r}")

    def classify(
        self, direction: str, message_type: str, entries: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any], dict]:
        """(kind, renamed entries, extra meta) of one flattened message."""
        for rule in self.kinds:
            if rule.matches(direction, message_type, entries):
                missing = [src for src in rule.payload.values() if src not in entries]
                if missing:
                    raise SchemaMapError(
                        f"schema map kind {rule.kind!r}: a matching message lacks entry {missing[0]!r}"
                    )
                inverse = {src: dst for dst, src in rule.payload.items()}
                renamed = {inverse.get(name, name): value for name, value in entries.items()}
                return rule.kind, renamed, dict(rule.meta)
        suffix = ".reply" if direction == "up" else ""
        return f"flower.{message_type}{suffix}", dict(entries), {}

    def round_of(self, group_id: str, entries: Mapping[str, Any]) -> int | None:
        """The privaudit round (0-based) of a message, or None when it carries none."""
        raw: Any = group_id if self.round == "group_id" else entries.get(self.round)
        try:
            return int(raw) - self.round_base
        except (TypeError, ValueError):
            return None


def _str_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _rule(raw: Any, where: str) -> KindRule:
    if not isinstance(raw, Mapping):
        raise SchemaMapError(f"{where} must be a table")
    unknown = sorted(set(raw) - _RULE_KEYS)
    if unknown:
        raise SchemaMapError(f"{where} has unknown key {unknown[0]!r} (known: {', '.join(sorted(_RULE_KEYS))})")
    for key in ("kind", "direction", "when"):
        if key not in raw:
            raise SchemaMapError(f"{where} lacks {key!r}")
    kind, direction, when = raw["kind"], raw["direction"], raw["when"]
    if not isinstance(kind, str) or not kind:
        raise SchemaMapError(f"{where}: 'kind' must be a non-empty string")
    if direction not in _DIRECTIONS:
        raise SchemaMapError(f'{where}: \'direction\' must be "up" or "down", got {direction!r}')
    if isinstance(when, str):
        when = [when]
    if not isinstance(when, list) or not when or not all(isinstance(w, str) and w for w in when):
        raise SchemaMapError(f'{where}: \'when\' must list the entries ("record/key" or "record") a message holds')
    payload = raw.get("payload", {})
    if not _str_map(payload):
        raise SchemaMapError(f"{where}: 'payload' must map privaudit payload names to entries \"record/key\"")
    meta = raw.get("meta", {})
    if not isinstance(meta, Mapping):
        raise SchemaMapError(f"{where}: 'meta' must be a table")
    for name in REQUIRED_PAYLOAD.get(kind, ()):
        if name not in payload:
            raise SchemaMapError(f"{where} (kind {kind!r}) lacks payload {name!r}")
    mtype = raw.get("message-type")
    if mtype is not None and not isinstance(mtype, str):
        raise SchemaMapError(f"{where}: 'message-type' must be a string")
    return KindRule(kind, direction, tuple(when), dict(payload), mtype, dict(meta))

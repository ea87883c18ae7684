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

**Dense form**, for apps whose clients reply with their whole parameter list (Flower's stock
``FedAvg``: ``ArrayRecord([V, ...])``, keys ``"0"``, ``"1"``, ...) and send no item ids::

    item-embeddings = "arrays/0"   # or a list (NCF: GMF and MLP item tables), or "auto"
    user-params = []               # optional: entries of user-side parameters (kept as is)
    head-params = []               # optional: entries of shared head parameters (kept as is)
    updates = "auto"               # the replies hold updated rows ("rows"), deltas, or "auto"
    message-type = "train"         # the Flower message type of the training round trip

Down messages of ``message-type`` holding the matrix become ``model`` (payload ``V``); replies
become ``item_update`` whose ``items`` are the rows that changed against the model the client
was sent (:mod:`privaudit.integrations.dense` converts them when the recording ends). A
``kinds`` map does the same when its ``item_update`` rule names ``values`` without ``items``,
or when it has a ``model`` rule and no ``item_update`` rule (replies returning the model's
``V`` entry). A map may
have both ``kinds`` and the dense keys (its ``kinds`` rules come first). An app with no
``[tool.privaudit.schema]`` table at all gets :meth:`SchemaMap.auto`: the matrix is detected by
shape (2-D float array with ``n_items`` rows sent down and returned).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from privaudit.errors import PrivauditError

__all__ = ["REQUIRED_PAYLOAD", "SERVER_ROUND", "KindRule", "SchemaMap", "SchemaMapError"]

#: Payload names the generic attacks read, per privaudit kind (what a map must provide). An
#: ``item_update`` rule without ``items`` maps whole-matrix replies: their ``values`` (n_items
#: x K) are turned into the changed rows by :mod:`privaudit.integrations.dense`.
REQUIRED_PAYLOAD: dict[str, tuple[str, ...]] = {
    "item_update": ("values",),
    "model": ("V",),
}

_DIRECTIONS = ("up", "down")
_RULE_KEYS = {"kind", "direction", "message-type", "when", "payload", "meta"}
_MAP_KEYS = {"round", "round-base", "public", "kinds"}
_DENSE_KEYS = {"item-embeddings", "user-params", "head-params", "updates", "message-type"}
_UPDATES = ("auto", "rows", "deltas")
#: The round entry Flower's stock strategies put in every message they send (their group id is "").
SERVER_ROUND = "config/server-round"


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
    #: made from the dense keys (not written back by :meth:`SchemaMap.to_dict`)
    synthesized: bool = False

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
    #: dense form: entries of the item-embedding matrices (``("auto",)``: detect by shape)
    item_embeddings: tuple[str, ...] = ()
    user_params: tuple[str, ...] = ()
    head_params: tuple[str, ...] = ()
    updates: str = "auto"
    dense_message_type: str = "train"

    @property
    def dense(self) -> bool:
        """Whether whole-matrix replies are converted (:mod:`privaudit.integrations.dense`)."""
        return bool(self.item_embeddings)

    @property
    def whole_matrix(self) -> bool:
        """Whether replies may hold whole matrices to convert: the dense form, an
        ``item_update`` rule without ``items``, or a ``model`` rule and no ``item_update`` rule
        (replies returning the model's ``V`` entry)."""
        ups = [r for r in self.kinds if r.kind == "item_update" and not r.synthesized]
        models = [r for r in self.kinds if r.kind == "model" and "V" in r.payload and not r.synthesized]
        return self.dense or any("items" not in r.payload for r in ups) or (not ups and bool(models))

    @property
    def auto(self) -> bool:
        """Whether the item-embedding matrix is still to be detected by shape."""
        return self.item_embeddings == ("auto",)

    @classmethod
    def auto_map(cls) -> SchemaMap:
        """The map of an app without ``[tool.privaudit.schema]``: dense form, matrix detected."""
        return cls((), item_embeddings=("auto",))

    def with_embeddings(self, names: tuple[str, ...]) -> SchemaMap:
        """This map with the item-embedding entries resolved (empty: none found)."""
        spec = self.to_dict()
        if not names:
            return replace(self, item_embeddings=("auto",)) if self.dense else self
        spec["item-embeddings"] = list(names)
        return SchemaMap.from_dict(spec)

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], where: str = "schema map") -> SchemaMap:
        """Validate ``spec``; a :class:`SchemaMapError` naming the first thing it lacks."""
        if not isinstance(spec, Mapping):
            raise SchemaMapError(f"{where} must be a table (mapping), got {type(spec).__name__}")
        unknown = sorted(set(spec) - _MAP_KEYS - _DENSE_KEYS)
        if unknown:
            known = ", ".join(sorted(_MAP_KEYS | _DENSE_KEYS))
            raise SchemaMapError(f"{where} has unknown key {unknown[0]!r} (known: {known})")
        dense = _dense(spec, where)
        raw_kinds = spec.get("kinds", [] if dense["item_embeddings"] else None)
        if not isinstance(raw_kinds, list) or (not raw_kinds and not dense["item_embeddings"]):
            raise SchemaMapError(
                f"{where} lacks 'kinds' (a list of rules mapping record names to message kinds) "
                "or 'item-embeddings' (the dense form)"
            )
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
        names = dense["item_embeddings"]
        if names and names != ("auto",):  # what the recorded protocol's schema admits
            mtype = dense["dense_message_type"]
            rules += (
                KindRule("model", "down", names, {}, mtype, {}, synthesized=True),
                KindRule("item_update", "up", names, {}, mtype, {}, synthesized=True),
            )
        elif not any(r.kind == "item_update" for r in rules):  # replies return the model's V entry
            for r in rules:
                if r.kind == "model" and r.direction == "down" and "V" in r.payload:
                    rule = KindRule("item_update", "up", (r.payload["V"],), {}, r.message_type, {}, synthesized=True)
                    rules += (rule,)
        return cls(rules, round_src, base, dict(public), **dense)

    def to_dict(self) -> dict[str, Any]:
        """The declaration back as a JSON-able dict (recorded in the transcript's config)."""
        kinds = []
        for r in self.kinds:
            if r.synthesized:
                continue
            d: dict[str, Any] = {"kind": r.kind, "direction": r.direction, "when": list(r.when)}
            if r.payload:
                d["payload"] = dict(r.payload)
            if r.message_type is not None:
                d["message-type"] = r.message_type
            if r.meta:
                d["meta"] = dict(r.meta)
            kinds.append(d)
        out = {"round": self.round, "round-base": self.round_base, "public": dict(self.public), "kinds": kinds}
        if self.dense:
            out["item-embeddings"] = self.item_embeddings[0] if self.auto else list(self.item_embeddings)
            out.update({"user-params": list(self.user_params), "head-params": list(self.head_params)})
            out.update({"updates": self.updates, "message-type": self.dense_message_type})
        return out

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
            if not rule.synthesized and rule.matches(direction, message_type, entries):
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
        if self.round == "group_id" and not str(group_id).strip().isdigit():
            raw = entries.get(SERVER_ROUND)  # Flower's stock strategies: empty group id, round in config
        try:
            return int(raw) - self.round_base
        except (TypeError, ValueError):
            return None


def _str_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _dense(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The dense-form fields of ``spec`` (all defaults when it has no ``item-embeddings``)."""
    names = spec.get("item-embeddings")
    if names is None:
        extra = sorted(set(spec) & (_DENSE_KEYS - {"item-embeddings"}))
        if extra:
            raise SchemaMapError(f"{where}: {extra[0]!r} needs 'item-embeddings' (the dense form)")
        return {"item_embeddings": ()}
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise SchemaMapError(f'{where}: \'item-embeddings\' must name entries ("arrays/0") or be "auto"')
    if "auto" in names and len(names) > 1:
        raise SchemaMapError(f"{where}: 'item-embeddings' is either \"auto\" or entry names")
    out: dict[str, Any] = {"item_embeddings": tuple(names)}
    for key in ("user-params", "head-params"):
        value = spec.get(key, [])
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise SchemaMapError(f'{where}: {key!r} must list entries ("arrays/1")')
        out[key.replace("-", "_")] = tuple(value)
    updates = spec.get("updates", "auto")
    if updates not in _UPDATES:
        raise SchemaMapError(f"{where}: 'updates' must be one of {', '.join(_UPDATES)}, got {updates!r}")
    mtype = spec.get("message-type", "train")
    if not isinstance(mtype, str) or not mtype:
        raise SchemaMapError(f"{where}: 'message-type' must be a non-empty string")
    out.update({"updates": updates, "dense_message_type": mtype})
    return out


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

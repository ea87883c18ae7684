"""Typed parameters for protocols, attacks and defenses.

Every configurable object declares its parameters as a dict ``name -> default``. Values from
the command line (``--set K=10``, ``--defense laplace:scale=0.1``) arrive as strings and are
coerced to the type of the default; unknown names and unparsable values raise
:class:`~privaudit.errors.PrivauditError` naming the parameter and the accepted ones.
"""

from __future__ import annotations

from typing import Any, Mapping

from privaudit.errors import PrivauditError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def coerce(value: Any, default: Any, name: str, owner: str) -> Any:
    """Convert ``value`` to the type of ``default`` (strings are parsed)."""
    if not isinstance(value, str):
        if isinstance(default, bool) and not isinstance(value, bool):
            raise PrivauditError(f"{owner}: {name} must be true or false, got {value!r}")
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value
    text = value.strip()
    if default is None:
        if text.lower() in ("none", "null", ""):
            return None
        for parse in (int, float):
            try:
                return parse(text)
            except ValueError:
                pass
        return text
    if isinstance(default, bool):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise PrivauditError(f"{owner}: {name} must be true or false, got {value!r}")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise PrivauditError(f"{owner}: {name} must be an integer, got {value!r}") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise PrivauditError(f"{owner}: {name} must be a number, got {value!r}") from None
    if isinstance(default, (list, tuple)):
        items = [t for t in text.split(",") if t.strip()]
        proto = default[0] if default else None
        return type(default)(coerce(t, proto, name, owner) for t in items)
    return text


def resolve(defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None, owner: str) -> dict[str, Any]:
    """``defaults`` updated with coerced ``overrides``; unknown names are an error."""
    params = dict(defaults)
    for key, value in (overrides or {}).items():
        if key not in defaults:
            known = ", ".join(defaults) or "none"
            raise PrivauditError(f"{owner}: unknown parameter {key!r} (known: {known})")
        params[key] = coerce(value, defaults[key], key, owner)
    return params


def parse_spec(spec: str, what: str) -> tuple[str, dict[str, str]]:
    """Parse ``"name:k=v,k2=v2"`` into ``("name", {"k": "v", "k2": "v2"})``."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise PrivauditError(f"{what}: empty name in {spec!r}")
    params: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise PrivauditError(f"{what}: expected key=value in {spec!r}, got {item!r}")
            params[key.strip()] = value.strip()
    return name, params


class Configurable:
    """Base for objects with declared parameters (``params``: name -> default)."""

    name: str = ""
    description: str = ""
    params: dict[str, Any] = {}
    param_help: dict[str, str] = {}

    def __init__(self, **overrides: Any):
        self.config = resolve(self.params, overrides, f"{self.kind_label} {self.name!r}")
        self.validate()

    kind_label = "object"

    def validate(self) -> None:
        """Check parameter ranges; raise PrivauditError on a bad value."""

    def __getattr__(self, item: str) -> Any:
        config = self.__dict__.get("config")
        if config is not None and item in config:
            return config[item]
        raise AttributeError(f"{type(self).__name__!s} has no attribute {item!r}")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"

"""Declared parameters of protocols, attacks and defenses.

Every configurable class lists its parameters once, as :class:`Param` declarations::

    parameters = (
        Param("K", 20, "latent dimension", ge=1),
        Param("update", "semials", "client update of u_u", choices=("semials", "sgd")),
        Param("lr", None, "learning rate (default: per model)", type=float, gt=0),
    )

The declaration drives everything else: string values from the command line (``--set K=10``,
``--sweep attack.rounds=1,2``, ``--defense laplace:scale=0.1``) are coerced to the declared
type; types, bounds and choices are checked generically with a one-line
:class:`~privaudit.errors.PrivauditError` naming the parameter, the value and what is accepted;
the defaults give ``params`` / ``default_config``; the help lines give ``privaudit describe``.
Only checks that involve several parameters are written by hand (``validate``,
``validate_config``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from privaudit.errors import PrivauditError, did_you_mean

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_NONE = {"none", "null", ""}


def _free_form(text: str) -> Any:
    """A value of an untyped parameter: ``none`` gives None, then an int, a float, else the text."""
    if text.lower() in _NONE:
        return None
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


#: Upper bounds of integer parameters declared without one (``cap``), so that no value read from a
#: command line or a plan file can ask for an unbounded allocation or loop: widths (latent
#: dimensions, layer sizes), iteration counts (rounds, epochs, solver iterations), anything else.
WIDTH_CAP = 4096
ITERATION_CAP = 100_000
INT_CAP = 1_000_000
_WIDTHS = {"K", "D", "d", "latent_dim", "layers", "k_central"}
_ITERATIONS = {
    "T",
    "epochs",
    "local_epochs",
    "rounds",
    "global_rounds",
    "max_rounds",
    "record_rounds",
    "table_rounds",
    "manipulated_rounds",
    "max_iter",
    "maxiter",
    "n_iter",
    "matched_iters",
    "swap_iters",
    "server_max_iter",
    "refits",
    "retries",
    "solves",
    "trials",
    "t_local",
    "t_predict",
    "n_calibration",
}


def default_cap(name: str) -> int:
    """The upper bound of an integer parameter ``name`` declared without ``le``/``lt``/``cap``."""
    if name in _WIDTHS:
        return WIDTH_CAP
    if name in _ITERATIONS:
        return ITERATION_CAP
    return INT_CAP


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Param:
    """One declared parameter.

    Parameters
    ----------
    name : str
    default : Any
        The value used when none is given (``None`` makes the parameter optional: ``none``
        on the command line).
    help : str
        One line shown by ``privaudit describe``.
    type : type, optional
        ``bool``, ``int``, ``float``, ``str`` or ``list``; inferred from ``default`` when omitted
        (required when ``default`` is None, except for free-form values).
    item : type, optional
        Type of a list's items (inferred from the default's first item, else ``int``).
    ge, gt, le, lt : float, optional
        Bounds of a number (of every item of a list).
    choices : tuple, optional
        The accepted values.
    also : tuple
        Values accepted besides the bounds (e.g. ``-1`` meaning "all").
    cap : float, optional
        Upper bound of an integer (of every item of an integer list) beyond ``le``/``lt``; by
        default :func:`default_cap` of the name for integers declared without ``le``/``lt``.
    nullable : bool, optional
        Whether ``None`` is accepted (default: when the default is None).
    public : bool
        Whether the value is part of the public config every party knows (recorded in the
        transcript); False for a party's own secret settings.
    """

    name: str
    default: Any
    help: str = ""
    type: Any = None
    item: Any = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple | None = None
    also: tuple = ()
    cap: float | None = None
    nullable: bool | None = None
    public: bool = True
    _kind: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = self.type
        if kind is None and self.default is not None:
            kind = next(t for t in (bool, int, float, str, list, tuple, object) if isinstance(self.default, t))
            kind = list if kind is tuple else kind
        object.__setattr__(self, "_kind", kind)
        if self.nullable is None:
            object.__setattr__(self, "nullable", self.default is None)
        if kind is list and self.item is None:
            items = list(self.default or [])
            object.__setattr__(self, "item", type(items[0]) if items else int)
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
        integer = kind is int or (kind is list and self.item is int)
        if integer and self.cap is None and self.le is None and self.lt is None and self.choices is None:
            object.__setattr__(self, "cap", default_cap(self.name))

    # ------------------------------------------------------------------ text
    @property
    def type_name(self) -> str:
        """``int``, ``float``, ``bool``, ``str``, ``list[int]``, ``any``."""
        if self._kind is list:
            return f"list[{self.item.__name__}]"
        return getattr(self._kind, "__name__", "any") if self._kind not in (None, object) else "any"

    def accepted(self) -> str:
        """What the parameter accepts, in words (``an integer >= 1``, ``one of a, b``)."""
        if self.choices is not None:
            text = "one of " + ", ".join(_fmt(c) for c in self.choices)
        else:
            kind = self.item if self._kind is list else self._kind
            text = _TYPE_WORDS.get(kind, "any value")
            if self._kind is list:
                items = {int: "integers", float: "numbers"}.get(kind, "values")
                text = f"a comma-separated list of {items}"
            lower = f"{'>' if self.gt is not None else '>='} {_fmt(self.gt if self.gt is not None else self.ge)}"
            upper = f"{'<' if self.lt is not None else '<='} {_fmt(self.lt if self.lt is not None else self.le)}"
            has_low = self.gt is not None or self.ge is not None
            has_high = self.lt is not None or self.le is not None
            if has_low and has_high:
                left = "(" if self.gt is not None else "["
                right = ")" if self.lt is not None else "]"
                lo = self.gt if self.gt is not None else self.ge
                hi = self.lt if self.lt is not None else self.le
                text += f" in {left}{_fmt(lo)}, {_fmt(hi)}{right}"
            elif has_low:
                text += f" {lower}"
            elif has_high:
                text += f" {upper}"
        if self.also:
            text = " or ".join(_fmt(a) for a in self.also) + " or " + text
        if self.nullable:
            text += " or none"
        return text

    # ------------------------------------------------------------------ values
    def _fail(self, value: Any, owner: str) -> None:
        raise PrivauditError(f"{owner}: {self.name} must be {self.accepted()}, got {value!r}")

    def _parse_text(self, text: str, kind: Any, owner: str, shown: Any) -> Any:
        if kind is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
        elif kind is int:
            try:
                return int(text)
            except ValueError:
                pass
        elif kind is float:
            try:
                return float(text)
            except ValueError:
                pass
        elif kind is str:
            return text
        else:
            return _free_form(text)
        self._fail(shown, owner)

    def _typed(self, value: Any, kind: Any, owner: str, shown: Any) -> Any:
        if isinstance(value, str) and kind is not str:
            return self._parse_text(value.strip(), kind, owner, shown)
        if kind is bool:
            if isinstance(value, bool) or type(value).__name__ == "bool_":
                return bool(value)
        elif kind is int:
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                return int(value)
        elif kind is float:
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)):
                return float(value)
        elif kind is str:
            if isinstance(value, str):
                return value
        else:
            return value
        self._fail(shown, owner)

    def _in_range(self, v: Any) -> bool:
        if v in self.also:
            return True
        if self.choices is not None:
            return v in self.choices
        if not isinstance(v, numbers.Real) or isinstance(v, bool):
            return True
        return not (
            (self.ge is not None and not v >= self.ge)
            or (self.gt is not None and not v > self.gt)
            or (self.le is not None and not v <= self.le)
            or (self.lt is not None and not v < self.lt)
        )

    def _check_cap(self, values: Iterable[Any], shown: Any, owner: str) -> None:
        if self.cap is None:
            return
        for v in values:
            if isinstance(v, numbers.Real) and not isinstance(v, bool) and v > self.cap and v not in self.also:
                raise PrivauditError(f"{owner}: {self.name} must be at most {_fmt(self.cap)}, got {shown!r}")

    def parse(self, value: Any, owner: str = "") -> Any:
        """A string ``value`` converted to the declared scalar type only (bounds unchecked; lists
        and non-strings unchanged), so that :meth:`coerce` then names the parsed value."""
        if not isinstance(value, str) or self._kind in (list, str):
            return value
        if value.strip().lower() in _NONE:
            return None
        return self._typed(value, self._kind, owner, value)

    def coerce(self, value: Any, owner: str = "") -> Any:
        """``value`` converted to the declared type and checked against the bounds/choices.

        Strings are parsed (``"none"`` gives None for optional parameters, lists are
        comma-separated; a single value is a one-item list). Raises :class:`PrivauditError` (one line) otherwise.
        """
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE and self._kind is not str):
            if self.nullable:
                return None
            self._fail(value, owner)
        if self._kind is list:
            if isinstance(value, str):
                parts: Iterable[Any] = [t for t in value.split(",") if t.strip()]
            elif isinstance(value, (list, tuple)):
                parts = value
            else:  # one value: a one-item list
                parts = [value]
            out = [self._typed(v, self.item, owner, value) for v in parts]
            if not all(self._in_range(v) for v in out):
                self._fail(value, owner)
            self._check_cap(out, value, owner)
            return type(self.default)(out) if isinstance(self.default, (list, tuple)) else out
        v = self._typed(value, self._kind, owner, value)
        if not self._in_range(v):
            self._fail(value, owner)
        self._check_cap((v,), value, owner)
        return v


def declare(parameters: Iterable[Param]) -> dict[str, Param]:
    """Name -> :class:`Param`, checking names are unique and every default is accepted."""
    out: dict[str, Param] = {}
    for p in parameters:
        if p.name in out:
            raise ValueError(f"parameter {p.name!r} is declared twice")
        if p.default is not None or not p.nullable:
            p.coerce(p.default, f"declaration of {p.name!r}")
        out[p.name] = p
    return out


def resolve_declared(declared: Mapping[str, Param], overrides: Mapping[str, Any] | None, owner: str) -> dict[str, Any]:
    """Every declared parameter's value: defaults updated with ``overrides``, all coerced and checked."""
    overrides = dict(overrides or {})
    unknown = [k for k in overrides if k not in declared]
    if unknown:
        known = ", ".join(declared) or "none"
        hint = did_you_mean(unknown[0], declared)
        raise PrivauditError(f"{owner}: unknown parameter {unknown[0]!r}{hint} (known: {known})")
    out = {}
    for name, p in declared.items():
        if name in overrides:
            out[name] = p.coerce(overrides[name], owner)
        else:
            out[name] = p.default if not isinstance(p.default, list) else list(p.default)
    return out


def public_values(declared: Mapping[str, Param], values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` declared public (undeclared keys are kept)."""
    return {k: v for k, v in values.items() if k not in declared or declared[k].public}


def describe_parameters(declared: Mapping[str, Param]) -> list[dict[str, Any]]:
    """One JSON-able row per parameter: name, type, default, accepted, public, help."""
    return [
        {
            "name": p.name,
            "type": p.type_name,
            "default": p.default,
            "accepted": p.accepted(),
            "public": p.public,
            "help": p.help,
        }
        for p in declared.values()
    ]


def declared_of(cls: Any) -> dict[str, Param]:
    """The declared parameters of a protocol, attack or defense class (name -> :class:`Param`)."""
    return dict(getattr(cls, "declared", None) or {})


def declare_on(cls: Any, defaults_attr: str, help_attr: str) -> None:
    """Set ``cls.declared`` from ``cls.parameters`` and derive the name -> default / help dicts.

    Called from ``__init_subclass__``: ``defaults_attr`` (``params`` / ``default_config``) and
    ``help_attr`` (``param_help`` / ``config_help``) become read-only views of the declaration.
    A class that sets ``defaults_attr`` itself (the retired dict form) is refused with a
    :class:`TypeError` saying how to declare instead.
    """
    own = cls.__dict__
    if "parameters" in own:
        cls.declared = declare(own["parameters"])
    elif defaults_attr in own or help_attr in own:
        raise TypeError(
            f"{cls.__name__}: declare parameters as `parameters = (Param(name, default, help, ...), ...)` "
            f"(privaudit.params.Param), not as a `{defaults_attr}` dict"
        )
    elif "declared" not in own:
        cls.declared = dict(getattr(cls, "declared", {}) or {})
    setattr(cls, defaults_attr, {k: p.default for k, p in cls.declared.items()})
    setattr(cls, help_attr, {k: p.help for k, p in cls.declared.items()})


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
    """Base of attacks and defenses: parameters declared in ``parameters`` (a tuple of :class:`Param`).

    Subclasses get ``declared`` (name -> Param), ``params`` (name -> default) and
    ``param_help`` (name -> help) derived from it. ``__init__`` resolves the given values
    (coerced and checked against the declaration) into ``self.config`` and then calls
    :meth:`validate` for checks that involve several parameters. Values are readable as
    attributes (``self.scale``).
    """

    name: str = ""
    description: str = ""
    parameters: tuple[Param, ...] = ()
    declared: dict[str, Param] = {}
    params: dict[str, Any] = {}
    param_help: dict[str, str] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declare_on(cls, "params", "param_help")

    def __init__(self, **overrides: Any):
        self.config = resolve_declared(self.declared, overrides, f"{self.kind_label} {self.name!r}")
        self.validate()

    kind_label = "object"

    def validate(self) -> None:
        """Checks across several parameters; raise PrivauditError on a bad combination."""

    def public_config(self) -> dict[str, Any]:
        """The parameters every party knows (those declared ``public``)."""
        return public_values(self.declared, self.config)

    def __getattr__(self, item: str) -> Any:
        config = self.__dict__.get("config")
        if config is not None and item in config:
            return config[item]
        raise AttributeError(f"{type(self).__name__!s} has no attribute {item!r}")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"

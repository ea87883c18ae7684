"""The parameter declaration: coercion, generic checks, error lines, derived dicts, describe."""

from __future__ import annotations

import json

import pytest

from privaudit import registry
from privaudit.cli import main
from privaudit.errors import PrivauditError
from privaudit.params import Param, declare, resolve_declared
from tests.dummies import DummyNoise, DummyProtocol, dummy_registry  # noqa: F401 - fixture


def test_types_are_inferred_and_strings_coerced():
    assert Param("K", 20).coerce("5") == 5
    assert Param("lam", 0.1).coerce("1e-3") == 1e-3
    assert Param("lam", 0.1).coerce(2) == 2.0 and isinstance(Param("lam", 0.1).coerce(2), float)
    assert Param("on", False).coerce("yes") is True and Param("on", True).coerce("off") is False
    assert Param("layers", [48, 24]).coerce("8,4") == [8, 4]
    assert Param("rounds", [0, -1]).coerce(3) == [3]  # one value: a one-item list
    assert Param("users", None, type=int, ge=1).coerce("none") is None
    assert Param("users", None, type=int, ge=1).coerce("7") == 7
    assert Param("mode", "a", choices=("a", "b")).coerce("b") == "b"
    assert Param("ring", 64, choices=(32, 64)).coerce("32") == 32


@pytest.mark.parametrize(
    "param, value, line",
    [
        (Param("K", 20, ge=1), "0", "K must be an integer >= 1, got '0'"),
        (Param("K", 20, ge=1), 2.5, "K must be an integer >= 1, got 2.5"),
        (Param("K", 20, ge=1), True, "K must be an integer >= 1, got True"),
        (Param("f", 0.2, ge=0, lt=1), 1.0, "f must be a number in [0, 1), got 1.0"),
        (Param("f", 0.2, gt=0, le=1), "nan", "f must be a number in (0, 1], got 'nan'"),
        (Param("lam", 1.0, gt=0), float("inf"), "lam must be a number > 0, got inf"),
        (Param("r", 2, ge=0, also=(-1,)), -2, "r must be -1 or an integer >= 0, got -2"),
        (Param("mode", "a", choices=("a", "b")), "c", "mode must be one of a, b, got 'c'"),
        (Param("on", True), "maybe", "on must be true or false, got 'maybe'"),
        (Param("K", 20), None, "K must be an integer, got None"),
        (Param("layers", [4], ge=1), "4,0", "layers must be a comma-separated list of integers >= 1, got '4,0'"),
    ],
)
def test_errors_are_one_line_naming_value_and_range(param, value, line):
    with pytest.raises(PrivauditError) as exc:
        param.coerce(value, "protocol 'x'")
    assert str(exc.value) == f"protocol 'x': {line}"


def test_declaration_checks_names_and_defaults():
    with pytest.raises(ValueError, match="declared twice"):
        declare([Param("a", 1), Param("a", 2)])
    with pytest.raises(PrivauditError, match="a must be an integer >= 5, got 1"):
        declare([Param("a", 1, ge=5)])
    with pytest.raises(PrivauditError, match=r"x: unknown parameter 'b' \(known: a\)"):
        resolve_declared(declare([Param("a", 1)]), {"b": 2}, "x")


def test_classes_derive_their_dicts_from_the_declaration():
    assert DummyProtocol.default_config == {"p": 4, "rounds": 2, "signal": 1.0, "delay": 0.0, "bias": 0.5}
    assert DummyProtocol.config_help["p"] == "secret bits per client"
    assert DummyNoise.params == {"scale": 0.0} and DummyNoise(scale="0.5").scale == 0.5
    with pytest.raises(PrivauditError, match=r"defense '[a-z-]*': scale must be a number >= 0, got -1$"):
        DummyNoise(scale=-1)
    assert DummyProtocol.resolve_config({"p": "3"})["p"] == 3


def test_the_retired_dict_declaration_is_refused_with_how_to_declare():
    """``params = {name: default}`` (no bounds, no help) is refused when the class is defined."""
    from privaudit.defenses.base import Defense

    with pytest.raises(TypeError, match=r"Legacy: declare parameters as `parameters = \(Param"):

        class Legacy(Defense):
            name = "legacy"
            params = {"scale": 0.5}

    import privaudit.params as pm

    assert not any(hasattr(pm, name) for name in ("coerce", "resolve", "from_defaults"))


@pytest.mark.usefixtures("dummy_registry")
def test_sweep_values_are_checked_by_the_owning_declaration():
    """Each swept value goes through the declared Param: type, bounds and choices, one line each."""
    from privaudit import plan as pl

    def sweep(target, param, values, **kwargs):
        return pl.resolve(protocol="dummy-proto", sweep=pl.Sweep(target, param, tuple(values)), **kwargs)

    assert [v for _, v, *_ in sweep("dummy-noise", "scale", ("0", "2.5")).grid()] == [0.0, 2.5]
    with pytest.raises(PrivauditError, match=r"^defense 'dummy-noise': scale must be a number >= 0, got -1.0$"):
        sweep("dummy-noise", "scale", ("0", "-1"))
    with pytest.raises(PrivauditError, match=r"^protocol 'dummy-proto': p must be an integer >= 1, got 0$"):
        sweep("protocol", "p", ("2", "0"))
    with pytest.raises(PrivauditError, match=r"^attack 'dummy-aux-attack': aux_fraction must be a number in \[0, 1\]"):
        sweep("attack", "aux_fraction", ("0.5", "1.5"), attack="dummy-aux-attack")
    with pytest.raises(PrivauditError, match=r"^attack 'generic-trained-items': rounds must be -1 or an integer >= 1"):
        registry.get("attack", "generic-trained-items").declared["rounds"].coerce("0", "attack 'generic-trained-items'")
    with pytest.raises(
        PrivauditError, match=r"generic-attribute-inference'?: aux_fraction must be a number in \(0, 1\)"
    ):
        registry.get("attack", "generic-attribute-inference")(aux_fraction=1)


def test_private_parameters_stay_out_of_the_public_config():
    from privaudit.defenses.base import Defense
    from privaudit.protocols.base import public_defenses

    class Keyed(Defense):
        name = "keyed"
        parameters = (Param("scale", 1.0, "public"), Param("seed", 7, "a party's own secret", public=False))

    d = Keyed()
    assert d.config == {"scale": 1.0, "seed": 7}
    assert public_defenses([d]) == [{"name": "keyed", "scale": 1.0}]


def test_every_builtin_declares_help_and_valid_defaults():
    for kind in registry.KINDS:
        for name, cls in registry.available(kind).items():
            declared = cls.declared
            if getattr(cls, "recorded", False):  # recorded runs (flower) are never simulated: no parameters
                continue
            assert declared, f"{kind} {name} declares no parameters" if kind == "protocol" else True
            for p in declared.values():
                assert p.help, f"{kind} {name}: parameter {p.name} has no help"
                assert p.coerce(p.default, name) == p.default


@pytest.mark.parametrize("kind", registry.KINDS)
def test_describe_every_registered_name(kind, capsys):
    for name, cls in registry.available(kind).items():
        assert main(["describe", name]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"{kind} {name}: ") or f"\n{kind} {name}: " in out
        for p in cls.declared.values():
            assert f"  {p.name} : {p.type_name} = {p.default!r}  ({p.accepted()})" in out
            assert p.help in out
        assert main(["describe", name, "--json"]) == 0
        rows = [e for e in json.loads(capsys.readouterr().out) if e["kind"] == kind]
        assert [r["name"] for r in rows[0]["parameters"]] == list(cls.declared)


def test_describe_unknown_name_is_one_line_with_close_matches(capsys):
    assert main(["describe", "fedmvfm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no protocol, attack or defense named 'fedmvfm'" in err and "fedmvmf" in err
    assert main(["describe", "zzzzzz"]) == 2
    assert "see privaudit list" in capsys.readouterr().err


def test_attack_help_points_to_describe(capsys):
    with pytest.raises(SystemExit):
        main(["attack", "--help"])
    assert "privaudit describe NAME" in capsys.readouterr().out

"""Command-line front end: parsing and printing only; the work happens in the library.

Subcommands register themselves in :data:`COMMANDS` through :func:`command`; each gets an
``add_arguments(parser)`` and a ``handler(args) -> int``. A user mistake raises
:class:`~privaudit.errors.PrivauditError` (or an argparse error) and ends as one line on
stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from privaudit import __version__
from privaudit.errors import PrivauditError

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one line (exit code 2)."""

    def error(self, message: str):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command(name: str, help: str):
    """Register ``handler`` as subcommand ``name``; ``add_arguments`` is attached later."""

    def decorator(add_arguments: Callable[[argparse.ArgumentParser], None]):
        def bind(handler: Callable[[argparse.Namespace], int]):
            COMMANDS[name] = (help, add_arguments, handler)
            return handler

        return bind

    return decorator


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


# ---------------------------------------------------------------------------------------- list


def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


@command("list", "list the registered protocols, attacks and defenses (plugins included)")(_list_args)
def cmd_list(args: argparse.Namespace) -> int:
    from privaudit import registry

    rows = []
    for kind in registry.KINDS:
        for name, cls in registry.available(kind).items():
            rows.append({"kind": kind, "name": name, "description": registry.describe(cls)})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max((len(r["name"]) for r in rows), default=4)
        for r in rows:
            print(f"{r['kind']:<9} {r['name']:<{width}}  {r['description']}")
    for err in registry.plugin_errors():
        print(f"warning: plugin failed to load: {err}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------- inspect


def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="transcript file (.ptx)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--max-bytes", type=int, default=None, help="refuse archives larger than this uncompressed (default 4 GiB)")


@command("inspect", "summarize a transcript: parties, rounds, message kinds, bytes, private data")(_inspect_args)
def cmd_inspect(args: argparse.Namespace) -> int:
    from privaudit import transcript as tr

    kwargs = {} if args.max_bytes is None else {"max_bytes": args.max_bytes}
    t = tr.load(args.file, **kwargs)
    s = tr.summarize(t)
    if args.json:
        print(json.dumps(s, indent=2, default=str))
        return 0
    ds = s["dataset"]
    print(f"transcript  {args.file}")
    print(f"protocol    {s['protocol']}   seed {s['seed']}")
    if ds:
        print("dataset     " + ", ".join(f"{k}={v}" for k, v in ds.items()))
    others = ", ".join(s["other_parties"])
    print(f"parties     {s['parties']} ({s['clients']} clients{'; ' + others if others else ''})")
    if s["rounds"]:
        print(f"rounds      {s['rounds'][0]}..{s['rounds'][1]}")
    print(f"messages    {s['messages']}")
    print(f"private     {'included' if s['private_included'] else 'not included'}")
    print("kinds:")
    for kind, e in sorted(s["kinds"].items()):
        print(f"  {kind:<20} {e['messages']:>8} messages  {_human_bytes(e['bytes']):>10}")
    return 0


# ---------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="privaudit",
        description="Privacy attacks and audits for federated recommender systems.",
    )
    parser.add_argument("--version", action="version", version=f"privaudit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (help_text, add_arguments, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    _, _, handler = COMMANDS[args.command]
    try:
        return int(handler(args) or 0)
    except PrivauditError as exc:
        print(f"privaudit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("privaudit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

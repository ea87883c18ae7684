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


# ------------------------------------------------------------------------ run / attack / report


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--defense", action="append", default=[], metavar="NAME[:k=v,...]", help="activate a defense (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a protocol config value (repeatable)")
    p.add_argument("--data", default="synthetic", metavar="synthetic|PATH", help="dataset: synthetic (default) or a MovieLens folder / ratings CSV")
    p.add_argument("--users", type=int, default=None, metavar="N", help="subsample N users (seeded)")


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", required=True, help="protocol name (see privaudit list)")
    _data_args(p)
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.ptx", help="transcript file to write")
    p.add_argument("--no-private", action="store_true", help="leave out the clients' private messages (shareable)")


@command("run", "run a protocol once and write its transcript (.ptx)")(_run_args)
def cmd_run(args: argparse.Namespace) -> int:
    from privaudit.experiment import run_transcript

    result = run_transcript(args.protocol, args.defense, args.set, args.data, args.users, args.seed)
    path = result.transcript.save(args.output, include_private=not args.no_private)
    print(f"transcript written to {path} ({len(result.transcript)} messages)")
    for k, v in result.utility.items():
        print(f"  {k:<20} {v:.4f}" if isinstance(v, float) else f"  {k:<20} {v}")
    return 0


def _attack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", help="protocol to simulate (see privaudit list)")
    p.add_argument("--transcript", metavar="FILE", help="attack a recorded transcript instead of simulating")
    p.add_argument("--attack", metavar="A[:k=v,...]", help="attack (default: the protocol's default attack)")
    p.add_argument("--noise", metavar="KIND", help="sweep a noise defense's scale (laplace, gaussian)")
    p.add_argument("--scales", metavar="LIST", help="noise scales (default: the defense's grid, 0,0.1,0.5,1,2,4 for laplace)")
    _data_args(p)
    p.add_argument("--sweep", metavar="TARGET.PARAM=V1,V2,...", help="sweep a defense, attack or protocol parameter")
    p.add_argument("--seeds", type=int, default=None, metavar="N", help="run seeds SEED..SEED+N-1 (default 3)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel points (default: all cores; 1 = sequential)")
    p.add_argument("--scheduler", metavar="ADDRESS|local:N", help="run the points on a Dask cluster (scheduler address, or local:N workers)")
    p.add_argument("--out", metavar="DIR", help="report folder (default privaudit-report/<protocol>-<sweep>/)")
    p.add_argument("--quiet", action="store_true", help="do not print the table")
    p.add_argument("--config", metavar="FILE.toml", help="run the plan of a plan.toml (every report folder records one)")


_SIMULATION_ONLY = ("noise", "scales", "defense", "sweep", "set", "users", "seeds", "scheduler")
_PLAN_FIELDS = ("protocol", "transcript", "attack", "noise", "scales", "defense", "sweep", "set", "users", "seeds")


@command("attack", "attack a simulated protocol (sweeping a defense) or a transcript; write a report")(_attack_args)
def cmd_attack(args: argparse.Namespace) -> int:
    from privaudit import experiment, reports
    from privaudit.plan import load_plan, plan_to_toml

    plan = None
    if args.config:
        given = [f"--{k}" for k in _PLAN_FIELDS if getattr(args, k) not in (None, [], False)]
        given += ["--data"] if args.data != "synthetic" else []
        given += ["--seed"] if args.seed != 0 else []
        if given:
            raise PrivauditError(f"--config cannot be combined with {', '.join(given)} (edit the plan instead)")
        plan = load_plan(args.config, jobs=args.jobs, scheduler=args.scheduler)
        results = experiment.run_plan(plan)
    elif args.transcript:
        given = [f"--{k}" for k in _SIMULATION_ONLY if getattr(args, k) not in (None, [], False)]
        if args.protocol or args.data != "synthetic":
            given += ["--protocol"] if args.protocol else []
            given += ["--data"] if args.data != "synthetic" else []
        if given:
            raise PrivauditError(f"--transcript cannot be combined with {', '.join(given)}")
        results = experiment.attack_transcript(args.transcript, args.attack)
    else:
        if not args.protocol:
            raise PrivauditError("give --protocol P (or --transcript FILE)")
        exp = experiment.build_experiment(
            args.protocol, args.attack, args.noise, args.scales, args.defense, args.sweep, args.set,
            args.data, args.users,
            experiment.DEFAULT_SEEDS if args.seeds is None else args.seeds,
            args.seed,
            experiment.default_jobs() if args.jobs is None else args.jobs,
            scheduler=args.scheduler,
        )
        plan = exp.plan()  # names resolved and everything validated before any compute
        results = experiment.run_plan(plan)
    out = reports.write_report(results, args.out, plan_toml=plan_to_toml(plan) if plan is not None else None)
    if not args.quiet:
        print(reports.format_table(results))
    print(f"report written to {out}/")
    return 0


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="report folder holding results.json")


@command("report", "re-render a report folder (CSV, figures, Markdown, HTML) from its results.json")(_report_args)
def cmd_report(args: argparse.Namespace) -> int:
    from privaudit import reports

    out = reports.rerender(args.dir)
    print(reports.format_table(reports.read_results(out)))
    print(f"report re-rendered in {out}/")
    return 0


# --------------------------------------------------------------------------------------- audit


def _audit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", help="protocol to audit (see the list below)")
    p.add_argument("--data", default="synthetic", metavar="synthetic|PATH", help="dataset: synthetic (default) or a MovieLens folder / ratings CSV")
    p.add_argument("--users", type=int, default=None, metavar="N", help="subsample N users (seeded)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a protocol config value (repeatable)")
    p.add_argument("--seeds", type=int, default=None, metavar="N", help="seeds per point (default 2)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel runs (default: all cores)")
    p.add_argument("--scheduler", metavar="ADDRESS|local:N", help="run on a Dask cluster (scheduler address, or local:N workers)")
    p.add_argument("--attack", action="append", default=None, metavar="NAME", help="only these attacks (repeatable)")
    p.add_argument("--defense", action="append", default=None, metavar="NAME", help="only these defenses (repeatable)")
    p.add_argument("--out", metavar="DIR", help="report folder (default privaudit-report/<protocol>-audit/)")
    p.add_argument("--config", metavar="FILE.toml", help="rerun the plan.toml an audit folder records")
    format_help = p.format_help

    def with_protocols() -> str:  # listed only when help is printed (the registry loads lazily)
        from privaudit import registry

        p.epilog = "protocols: " + ", ".join(registry.available("protocol"))
        return format_help()

    p.format_help = with_protocols


@command("audit", "every applicable attack against every applicable defense's grid: audit.json + audit.html")(_audit_args)
def cmd_audit(args: argparse.Namespace) -> int:
    from privaudit import audit as au
    from privaudit.plan import audit_to_toml, load_audit_fields, parse_assignments
    from privaudit.runner import default_jobs

    if args.config:
        given = [f"--{k}" for k in ("protocol", "users", "seeds", "attack", "defense") if getattr(args, k) not in (None, [])]
        given += ["--data"] if args.data != "synthetic" else []
        given += ["--seed"] if args.seed != 0 else []
        given += ["--set"] if args.set else []
        if given:
            raise PrivauditError(f"--config cannot be combined with {', '.join(given)} (edit the plan instead)")
        fields = load_audit_fields(args.config)
        if args.jobs is not None:
            fields["jobs"] = args.jobs
        if args.scheduler is not None:
            fields["scheduler"] = args.scheduler
        spec = au.Audit(**fields)
    else:
        if not args.protocol:
            raise PrivauditError("give --protocol P (or --config DIR/plan.toml)")
        spec = au.Audit(
            protocol=args.protocol, data=args.data, users=args.users, sets=parse_assignments(args.set),
            seeds=au.DEFAULT_AUDIT_SEEDS if args.seeds is None else args.seeds, seed=args.seed,
            jobs=default_jobs() if args.jobs is None else args.jobs, scheduler=args.scheduler,
            attacks=args.attack, defenses=args.defense,
        )
    result = au.run_audit(spec)
    out = au.write_audit(result, args.out, plan_toml=audit_to_toml(spec))
    print(au.format_matrix(result))
    for a in result["attacks"]:
        if not a.get("applies"):
            print(f"note: {a['name']} does not apply to the undefended {result['protocol']} view: {a.get('reason')}")
    errors = sorted({r["error"] for r in result["runs"] if "error" in r})
    for e in errors:
        print(f"warning: a run failed: {e}", file=sys.stderr)
    print(f"audit written to {out}/ ({result['timing']['total_seconds']:.1f} s)")
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

"""The ``report``, ``audit`` and ``record`` subcommands (registered in the command table of
:mod:`privaudit._cli_common`; :mod:`privaudit.cli` builds the parser)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from privaudit._cli_common import (
    byte_size,
    check_cli_extras,
    check_writable,
    command,
    dataset_args,
    dataset_from_args,
    default_report_dir,
    fail_on_arg,
    force_arg,
    gate_exit_code,
    margin_arg,
    margin_value,
    max_bytes_arg,
    say,
)
from privaudit.errors import PrivauditError
from privaudit.gate import FAIL_ON

FAIL_ON_HELP = (
    "exit code 1 when a defended cell (every cell when none is defended; every row of a transcript) meets a "
    "condition: leaks, inconclusive; dp-violation: any cell, canary run or DP claim (comma-separated or "
    "repeated; docs/ci.md)"
)


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="report folder holding results.json")
    p.add_argument(
        "--force", action="store_true", help="replace the rendered files (report.md, report.html, CSV, figures)"
    )


#: What ``privaudit report`` renders; any of them present means a re-render replaces it.
RENDERED = ("report.md", "report.html", "results.csv")


@command("report", "re-render a report folder (CSV, figures, Markdown, HTML) from its results.json")(_report_args)
def cmd_report(args: argparse.Namespace) -> int:
    from privaudit import reports

    folder = Path(os.path.expanduser(args.dir))
    folder = folder if folder.is_dir() else folder.parent
    present = [name for name in RENDERED if os.path.lexists(folder / name)]
    if present and not args.force:
        raise PrivauditError(f"{folder}/ already holds {', '.join(present)}: re-render with --force to replace them")
    out = reports.rerender(args.dir)
    say(reports.format_console(reports.read_results(out), report=str(out)))
    say(f"report re-rendered in {out}/")
    return 0


# --------------------------------------------------------------------------------------- audit


def _audit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", help="protocol to audit (see the list below)")
    p.add_argument(
        "--transcript", metavar="FILE", help="audit one recorded transcript: every attack that reads it, no simulation"
    )
    dataset_args(p)
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="set a protocol config value (repeatable)"
    )
    p.add_argument("--seeds", type=int, default=None, metavar="N", help="seeds per point (default 2)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel runs (default: all cores)")
    p.add_argument(
        "--scheduler", metavar="ADDRESS|local:N", help="run on a Dask cluster (scheduler address, or local:N workers)"
    )
    p.add_argument("--attack", action="append", default=None, metavar="NAME", help="only these attacks (repeatable)")
    p.add_argument("--defense", action="append", default=None, metavar="NAME", help="only these defenses (repeatable)")
    p.add_argument(
        "--threat",
        choices=("honest-but-curious", "malicious", "both"),
        default=None,
        help="the server's threat model(s): malicious attacks run with their plan set (default both)",
    )
    p.add_argument(
        "-o", "--out", metavar="DIR", help="report folder (default privaudit-report/<protocol>-audit-<dataset>/)"
    )
    force_arg(p)
    max_bytes_arg(p)
    p.add_argument("--config", metavar="FILE.toml", help="rerun the plan.toml an audit folder records")
    margin_arg(p)
    fail_on_arg(p, FAIL_ON, FAIL_ON_HELP)
    format_help = p.format_help

    def with_protocols() -> str:  # listed only when help is printed (the registry loads lazily)
        from privaudit import registry

        p.epilog = "protocols: " + ", ".join(registry.available("protocol"))
        return format_help()

    p.format_help = with_protocols


@command(
    "audit",
    "every applicable attack against every applicable defense's grid (audit.json + audit.html); "
    "with --transcript FILE every attack that reads it (audit.json + audit.txt)",
)(_audit_args)
def cmd_audit(args: argparse.Namespace) -> int:
    from privaudit import audit as au
    from privaudit.plan import audit_to_toml, check_bounds, load_audit_fields, parse_assignments
    from privaudit.runner import default_jobs

    if args.transcript:
        return _audit_transcript(args)
    if args.max_bytes is not None:
        raise PrivauditError("--max-bytes applies to --transcript only")
    if args.config:
        given = [
            f"--{k}"
            for k in ("protocol", "users", "seeds", "attack", "defense", "threat")
            if getattr(args, k) not in (None, [])
        ]
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
        check_bounds(jobs=fields.get("jobs"))
        args.out = args.out or str(au.default_out_dir(fields["protocol"]))
        check_writable(args.out, args.force, "--out DIR", folder=True)
        spec = au.Audit(**fields)
    else:
        if not args.protocol:
            raise PrivauditError("give --protocol P (or --transcript FILE, or --config DIR/plan.toml)")
        args.out = args.out or default_report_dir(args)
        check_writable(args.out, args.force, "--out DIR", folder=True)
        check_cli_extras(args.protocol, None, args.defense or (), attacks=args.attack or (), scheduler=args.scheduler)
        check_bounds(args.seeds, args.jobs, args.users)
        spec = au.Audit(
            protocol=args.protocol,
            data=dataset_from_args(args),
            users=args.users,
            sets=parse_assignments(args.set),
            seeds=au.DEFAULT_AUDIT_SEEDS if args.seeds is None else args.seeds,
            seed=args.seed,
            jobs=default_jobs() if args.jobs is None else args.jobs,
            scheduler=args.scheduler,
            attacks=args.attack,
            defenses=args.defense,
            threat=args.threat or "both",
        )
    margin = None if args.margin is None else margin_value(args.margin)  # checked before any compute
    au.check(spec)
    _say_audit_estimate(spec)
    result = au.run_audit(spec)
    if margin is not None:
        result["margin"] = margin
        au.decide(result)
    out = au.write_audit(result, args.out, plan_toml=audit_to_toml(spec))
    say(au.format_matrix(result))
    from privaudit.reports.render import audit_sentence_lines

    for line in audit_sentence_lines(result):  # a defense the matrix reads protected, named
        say(line)
    for a in result["attacks"]:
        if not a.get("applies"):
            say(f"note: {a['name']} does not apply to the undefended {result['protocol']} view: {a.get('reason')}")
    errors = sorted({r["error"] for r in result["runs"] if "error" in r})
    for e in errors:
        say(f"warning: a run failed: {e}", file=sys.stderr)
    say(f"audit written to {out}/ ({result['timing']['total_seconds']:.1f} s)")
    return gate_exit_code(result, "audit", args.fail_on)


def _say_audit_estimate(spec) -> None:
    """One line (wrapped at 100 columns) with the calibrated time of an audit expected to take
    over a minute and how to shorten it (:mod:`privaudit.estimate`); a data error stops here."""
    from privaudit import estimate
    from privaudit.reports.render import wrap_lines
    from privaudit.runner import load_data, subsample_users

    dataset = subsample_users(load_data(spec.data), spec.users, spec.seed)
    est = estimate.audit_estimate(spec, dataset)
    if est is not None and est.seconds > estimate.ANNOUNCE_ABOVE:
        print("\n".join(wrap_lines(est.line(f"a {spec.protocol} audit"))), flush=True)


def _audit_transcript(args: argparse.Namespace) -> int:
    """``privaudit audit --transcript FILE``: every attack that reads the transcript, one row each."""
    from privaudit.integrations import recorded

    given = ("protocol", "users", "seeds", "scheduler", "defense")
    simulation = [f"--{k}" for k in given if getattr(args, k) not in (None, [])]
    simulation += ["--set"] if args.set else []
    simulation += ["--data"] if args.data != "synthetic" else []
    if simulation:
        raise PrivauditError(f"--transcript cannot be combined with {', '.join(simulation)}")
    from privaudit.results import PROTECTION_MARGIN

    margin = PROTECTION_MARGIN if args.margin is None else margin_value(args.margin)
    args.out = args.out or str(Path("privaudit-report") / f"{Path(args.transcript).stem or 'transcript'}-audit")
    check_writable(args.out, args.force, "--out DIR", folder=True)
    result = recorded.audit_transcript(args.transcript, args.attack, max_bytes=args.max_bytes, margin=margin)
    if args.threat not in (None, "both"):  # a recording's threat is its server app's: keep that axis's rows
        from privaudit import registry

        threat = {r["attack"]: getattr(registry.get("attack", r["attack"]), "threat", "") for r in result["rows"]}
        result["rows"] = [r for r in result["rows"] if threat[r["attack"]] == args.threat]
    out = recorded.write_audit(result, args.out)
    say(recorded.format_audit(result))
    for d in result["defenses"]:
        say(f"defense: {', '.join(f'{k}={v}' for k, v in d.items())}")
    for c in result.get("dp_claims", []):  # one line each: the claim checked against the mechanism
        say(f"dp claim: {c['reason']}")
    if result.get("canaries"):
        say(result["canaries"]["line"])
    if not result["private_included"]:
        print("note: the transcript holds no private messages: nothing to score against")
    say(f"audit written to {out}/")
    return gate_exit_code(result, "audit", args.fail_on)


# --------------------------------------------------------------------------------------- record


def _record_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--flower",
        required=True,
        metavar="APP_DIR",
        help="Flower app folder (pyproject.toml with [tool.flwr.app] and [tool.privaudit])",
    )
    p.add_argument("--clients", type=int, default=5, metavar="N", help="simulated nodes (default 5)")
    p.add_argument("--rounds", type=int, default=None, metavar="R", help="server rounds (the app's num-server-rounds)")
    p.add_argument(
        "--run-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an app run-config value (repeatable)",
    )
    p.add_argument(
        "--cpus-per-client",
        type=float,
        default=2.0,
        metavar="C",
        help="CPUs Ray reserves per client run (default 2, Flower's; worker processes = CPUs / C)",
    )
    p.add_argument(
        "--canaries",
        type=int,
        default=-1,
        metavar="M",
        help="canaries of one more node, a canary client that tests the run's DP (0: none; default: 1000 "
        "when the ClientApp has a LocalDpMod, else none)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE.ptx", help="transcript file to write")
    p.add_argument(
        "--no-private",
        action="store_true",
        help="no ground-truth Mod on the clients (the transcript then has no private messages)",
    )
    force_arg(p)
    p.epilog = _RECORD_WARNING


_RECORD_WARNING = (
    "WARNING: recording executes the app's own Python code (its ServerApp, ClientApp and the "
    "[tool.privaudit] hooks) with your privileges, in Flower's simulation engine: record only apps you trust. "
    "Ctrl-C stops the run and every Ray process it started."
)


@command(
    "record",
    "run a Flower app (its own code: trusted apps only) in Flower's simulation engine with privaudit's recorder; "
    "write its transcript",
)(_record_args)
def cmd_record(args: argparse.Namespace) -> int:
    from privaudit._escape import printable
    from privaudit.integrations import flower

    check_writable(args.output, args.force, "-o FILE", folder=False)
    if not -1 <= args.canaries <= 100_000:
        raise PrivauditError(f"--canaries must be in [0, 100000] (or -1: the default), got {args.canaries}")
    app = flower.load_app(args.flower)
    overrides = flower.parse_overrides(args.run_config, app.config)
    print(f"recording {args.clients} simulated clients of {printable(app.name)} (Ctrl-C stops it) ...", flush=True)
    summary = flower.record_to_file(
        args.flower,
        args.output,
        clients=args.clients,
        rounds=args.rounds,
        run_config=overrides,
        private=not args.no_private,
        cpus_per_client=args.cpus_per_client,
        canaries=args.canaries,
    )
    defenses = ", ".join(str(d) for d in summary["defenses"]) or "none"
    print(
        printable(
            f"transcript written to {args.output} ({summary['messages']} messages, {args.clients} clients, "
            f"{summary['seconds']:.1f} s of simulation; Flower defenses: {defenses})"
        )
    )
    for c in summary.get("dp_claims", []):
        print(printable(f"dp claim: {c['reason']}"))
    if summary["errors"]:
        first = printable(summary["first_error"])
        print(f"warning: {summary['errors']} client replies were errors (first: {first})", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------- compare


def _compare_args(p: argparse.ArgumentParser) -> None:
    from privaudit.compare import COMPARE_FAIL_ON

    p.add_argument("old", metavar="OLD", help="an audit.json or results.json (e.g. from the last release)")
    p.add_argument("new", metavar="NEW", help="a file of the same kind (e.g. from this commit)")
    fail_on_arg(
        p,
        COMPARE_FAIL_ON,
        "exit code 1 when: changed (a verdict label differs), new-leaks (a defended cell leaks in NEW, not in OLD), "
        "new-dp-violations (a DP violation only NEW has), or leaks, dp-violation, inconclusive in NEW "
        "(comma-separated or repeated; docs/ci.md)",
    )
    p.add_argument(
        "--max-bytes",
        type=byte_size,
        default=None,
        metavar="N[K|M|G]",
        help="largest file read (default 256M)",
    )


@command(
    "compare",
    "compare two audit.json (or results.json) files: changed verdicts, largest metric moves, new DP violations",
)(_compare_args)
def cmd_compare(args: argparse.Namespace) -> int:
    from privaudit.compare import compare_files
    from privaudit.gate import named

    comparison = compare_files(args.old, args.new, max_bytes=args.max_bytes)
    for line in comparison.lines():
        say(line)
    conditions = named(args.fail_on)
    if not conditions:
        return 0
    failures = comparison.failures(conditions)
    for line in failures:
        say(f"privaudit: fail: {line}", file=sys.stderr)
    if not failures:
        say(f"fail-on {','.join(conditions)}: not met")
    return 1 if failures else 0

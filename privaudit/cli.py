"""Command-line front end: parsing and printing only; the work happens in the library.

The ``list``, ``describe``, ``inspect``, ``run`` and ``attack`` subcommands live here, ``report``,
``audit`` and ``record`` in :mod:`privaudit.cli_audit`, what they share in
:mod:`privaudit._cli_common`. Subcommands register themselves in ``COMMANDS`` through
``command``; each gets an
``add_arguments(parser)`` and a ``handler(args) -> int``. A user mistake raises
:class:`~privaudit.errors.PrivauditError` (or an argparse error) and ends as one line on
stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from privaudit import (
    __version__,
    cli_audit,  # noqa: F401 - registers report, audit and record
)
from privaudit._cli_common import (
    COMMANDS,
    ArgParser,
    check_cli_extras,
    check_writable,
    command,
    data_args,
    dataset_from_args,
    default_report_dir,
    fail_on_arg,
    force_arg,
    gate_exit_code,
    human_bytes,
    margin_arg,
    margin_value,
    max_bytes_arg,
    say,
    warn_short_key_specs,
    warn_short_keys,
)
from privaudit.errors import PrivauditError, missing_dependency
from privaudit.gate import FAIL_ON

# ---------------------------------------------------------------------------------------- list


def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


@command("list", "list the registered protocols, attacks and defenses (plugins included)")(_list_args)
def cmd_list(args: argparse.Namespace) -> int:
    from privaudit import registry
    from privaudit.errors import extra_installed

    rows = []
    for kind in registry.KINDS:
        for name, cls in registry.available(kind).items():
            extras = list(getattr(cls, "requires_extras", ()) or ())
            missing = [e for e in extras if not extra_installed(e)]
            rows.append(
                {
                    "kind": kind,
                    "name": name,
                    "description": registry.describe(cls),
                    "extras": extras,
                    "missing": missing,
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max((len(r["name"]) for r in rows), default=4)
        for r in rows:
            needs = "".join(f" [needs privaudit[{e}]: not installed]" for e in r["missing"])  # installed: no tag
            say(f"{r['kind']:<9} {r['name']:<{width}}  {r['description']}{needs}")
    for err in registry.plugin_errors():
        print(f"warning: plugin failed to load: {err}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------ describe


def _describe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="a protocol, attack or defense (see privaudit list)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _format_description(entry: dict) -> list[str]:
    lines = [f"{entry['kind']} {entry['name']}: {entry['description']}"]
    lines += [f"  {key}: {value}" for key, value in entry["facts"].items()]
    if not entry["parameters"]:
        return lines + ["  parameters: none"]
    name = entry["name"]
    how = {
        "protocol": "--set KEY=VALUE; sweep with --sweep protocol.KEY=V1,V2",
        "attack": f"--attack {name}:KEY=VALUE; sweep with --sweep attack.KEY=V1,V2",
        "defense": f"--defense {name}:KEY=VALUE; sweep with --sweep {name}.KEY=V1,V2",
    }[entry["kind"]]
    lines.append(f"parameters (set with {how}):")
    for row in entry["parameters"]:
        private = "" if row["public"] else "  [not public]"
        lines.append(f"  {row['name']} : {row['type']} = {row['default']!r}  ({row['accepted']}){private}")
        if row["help"]:
            lines.append(f"      {row['help']}")
    return lines


@command("describe", "show a protocol's, attack's or defense's parameters: defaults, types, accepted values, help")(
    _describe_args
)
def cmd_describe(args: argparse.Namespace) -> int:
    from privaudit import registry

    found = registry.find(args.name)
    if not found:
        close = registry.close_matches(args.name)
        hint = f"; did you mean {', '.join(close)}?" if close else " (see privaudit list)"
        raise PrivauditError(f"no protocol, attack or defense named {args.name!r}{hint}")
    entries = [registry.summary(kind, cls) for kind, cls in found]
    if args.json:
        print(json.dumps(entries, indent=2, default=str))
    else:
        say("\n\n".join("\n".join(_format_description(e)) for e in entries))
    return 0


# ------------------------------------------------------------------------------------- inspect


def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="transcript file (.ptx)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    max_bytes_arg(p)


@command("inspect", "summarize a transcript: parties, rounds, message kinds, bytes, private data")(_inspect_args)
def cmd_inspect(args: argparse.Namespace) -> int:
    from privaudit import transcript as tr
    from privaudit._escape import printable as esc

    kwargs = {} if args.max_bytes is None else {"max_bytes": args.max_bytes}
    t = tr.load_validated(args.file, **kwargs)  # the same schema check as attack and audit
    s = tr.summarize(t)
    if args.json:  # json.dumps escapes control characters itself
        print(json.dumps(s, indent=2, default=str))
        return 0
    ds = s["dataset"]  # every string from the file is printed escaped: no ANSI escape or newline acts
    print(f"transcript  {esc(args.file)}")
    print(f"protocol    {esc(s['protocol'])}   seed {s['seed']}")
    if ds:
        print("dataset     " + esc(", ".join(f"{k}={v}" for k, v in ds.items())))
    others = esc(", ".join(s["other_parties"]))
    print(f"parties     {s['parties']} ({s['clients']} clients{'; ' + others if others else ''})")
    if s["rounds"]:
        print(f"rounds      {s['rounds'][0]}..{s['rounds'][1]}")
    print(f"messages    {s['messages']}")
    print(f"private     {'included' if s['private_included'] else 'not included'}")
    from privaudit.transcript_io import mapped_bytes

    n_mapped, mapped = mapped_bytes(t)
    if n_mapped:  # the first 64 MiB of stored columns are read with their CRCs checked; the rest are mapped
        print(
            f"mapped      {n_mapped} stored columns ({human_bytes(mapped)}): CRCs not checked; do not change the file"
        )
    defenses = (s["config"] or {}).get("defenses") or []
    if not defenses:
        print("defenses    none recorded")
    for i, d in enumerate(defenses):  # the public config's {"name", **params} entries
        name, params = (
            (d.get("name", "?"), {k: v for k, v in d.items() if k != "name"}) if isinstance(d, dict) else (d, {})
        )
        text = f"{name}: " + ", ".join(f"{k}={v}" for k, v in params.items() if v is not None) if params else str(name)
        print(f"{'defenses' if i == 0 else '':<12}{esc(text)}")
    print("kinds:")
    for kind, e in sorted(s["kinds"].items()):
        print(f"  {esc(kind):<20} {e['messages']:>8} messages  {human_bytes(e['bytes']):>10}")
    return 0


def _protocol_defaults(args: argparse.Namespace) -> str | None:
    """Fill in what ``attack --protocol P`` runs when no defense, noise or sweep is named: the
    protocol's ``default_defense_specs`` / ``default_sweep_spec`` (unless the attack sweeps a
    parameter of its own) and ``default_users``; returns the line that says so (printed once
    the plan is valid), or None."""
    from privaudit import registry
    from privaudit.params import parse_spec

    protocol_cls = registry.get("protocol", args.protocol)
    notes = []
    users = protocol_cls.default_users
    if args.users is None and users is not None:
        args.users = int(users)
        notes.append(f"{users} users (--users N for more)")
    if args.defense or args.noise or args.sweep:
        pass
    else:
        attack = parse_spec(args.attack, "--attack")[0] if args.attack else protocol_cls.default_attack
        spec = protocol_cls.default_sweep_spec
        own = registry.get("attack", attack).default_sweep if attack else None
        if spec and not own:
            args.defense = list(protocol_cls.default_defense_specs)
            args.sweep = spec
            notes.append(" ".join([f"--defense {d}" for d in args.defense] + [f"--sweep {spec}"]))
        elif own:  # the attack sweeps a parameter of its own (printed so every default names its sweep)
            values = [str(v) for v in own[1]]
            shown = ",".join(values) if len(values) <= 6 else f"{values[0]}..{values[-1]} ({len(values)} values)"
            notes.append(f"{attack}'s own sweep attack.{own[0]}={shown}")
    if notes:
        return f"{args.protocol} defaults: {'; '.join(notes)} (--defense, --noise or --sweep choose another)"
    return None


def _print_estimate(args: argparse.Namespace, seeds: int) -> None:
    """Print the estimated time of a run above two minutes (``Protocol.estimate_seconds``)."""
    from privaudit import registry
    from privaudit.protocols.base import Protocol

    protocol_cls = registry.get("protocol", args.protocol)
    if protocol_cls.estimate_seconds.__func__ is Protocol.estimate_seconds.__func__:
        return  # declares no estimate: cheap (loading the data to estimate would cost more)
    from privaudit.plan import parse_assignments

    points = len(str(args.sweep).partition("=")[2].split(",")) if getattr(args, "sweep", None) else 1
    if getattr(args, "noise", None):
        grid = registry.get("defense", args.noise).default_grid or (0,)
        points = len(args.scales.split(",")) if args.scales else len(grid)
    from privaudit.experiment import load_data

    n_users = load_data(dataset_from_args(args)).n_users  # loading is cheap next to a run worth estimating
    users = n_users if args.users is None else args.users
    if users > n_users:
        return  # refused with one line when the experiment loads the data
    per_run = protocol_cls.estimate_seconds(users, parse_assignments(args.set), list(args.defense or ()))
    if per_run is None:
        return
    seconds = per_run * points * seeds
    jobs = getattr(args, "jobs", None) or 0
    from privaudit.experiment import default_jobs

    seconds /= max(1, min(points * seeds, jobs if jobs > 0 else default_jobs()))
    if seconds > 120:
        runs = points * seeds
        plural = "s" if runs > 1 else ""
        what = f"{runs} run{plural} of {args.protocol} with {users} users"
        print(f"estimated time: ~{seconds / 60:.0f} min ({what})", flush=True)


def _reference_line(results) -> str | None:
    """``utility <metric>: v1, v2, ... (no defense: v0)`` for sweeps with an undefended point."""
    import math

    metric = results.get("utility_metric")
    if not metric or not results.get("sweep"):
        return None
    means = {}
    for row in results.get("summary", []):
        if row["metric"] == f"utility.{metric}":
            means[json.dumps(row["value"])] = row["mean"]
    if not means:
        return None
    target, _, param = str(results["sweep"]).partition(".")
    values = results.get("sweep_values") or []
    ref, label = None, "no defense"
    if target == "attack":  # one protocol run per seed: the same utility at every point
        ref = None if results.get("defenses") else next(iter(means.values()))
    elif target == "protocol":  # the point at the protocol's default value
        from privaudit import registry

        default = registry.get("protocol", results["protocol"]).default_config.get(param)
        ref, label = means.get(json.dumps(default)), f"{param}={default}, the default"
    else:  # a defense's strength: its value 0 is off
        ref = next((means.get(json.dumps(v)) for v in values if isinstance(v, (int, float)) and v == 0), None)
        label = f"{results['sweep']}=0"
    if ref is None or (isinstance(ref, float) and math.isnan(ref)):
        return None
    shown = ", ".join(f"{means[json.dumps(v)]:.3g}" for v in values if json.dumps(v) in means)
    return f"utility {metric} at each point: {shown} (reference, {label}: {ref:.3g})"


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", required=True, help="protocol name (see privaudit list)")
    data_args(p)
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.ptx", help="transcript file to write")
    p.add_argument("--no-private", action="store_true", help="leave out the clients' private messages (shareable)")
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS|local:N",
        help="run the clients on a Dask cluster; -o is then a folder of shards (fedmvmf, fedrec pmf-batch; no defenses)",
    )
    force_arg(p)


@command("run", "run a protocol once and write its transcript (.ptx)")(_run_args)
def cmd_run(args: argparse.Namespace) -> int:
    from privaudit.experiment import run_transcript
    from privaudit.plan import parse_assignments
    from privaudit.transcript_io import streaming

    if args.scheduler is not None:  # one protocol run over a Dask cluster: privaudit.sharded
        from privaudit.sharded import cmd_run

        return cmd_run(args, dataset_from_args)
    check_writable(args.output, args.force, "-o FILE", folder=False)
    check_cli_extras(args.protocol, None, args.defense)
    warn_short_key_specs(args.defense)
    args.sweep = args.noise = None
    _print_estimate(args, 1)
    data = dataset_from_args(args)
    with streaming(args.output, include_private=not args.no_private) as stream:  # rounds written as they end
        result = run_transcript(
            protocol=args.protocol,
            defenses=_defense_specs(args.defense),
            protocol_config=parse_assignments(args.set),
            data=data,
            users=args.users,
            seed=args.seed,
        )
        path = stream.finish(result.transcript)
    print(f"transcript written to {path} ({len(result.transcript)} messages)")
    for k, v in result.utility.items():
        print(f"  {k:<20} {v:.4f}" if isinstance(v, float) else f"  {k:<20} {v}")
    return 0


def _attack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", help="protocol to simulate (see privaudit list)")
    p.add_argument("--transcript", metavar="FILE", help="attack a recorded transcript instead of simulating")
    p.add_argument("--attack", metavar="A[:k=v,...]", help="attack (default: the protocol's default attack)")
    p.add_argument("--noise", metavar="KIND", help="sweep a noise defense's scale (laplace, gaussian)")
    p.add_argument(
        "--scales", metavar="LIST", help="noise scales (default: the defense's grid, 0,0.1,0.5,1,2,4 for laplace)"
    )
    data_args(p)
    p.add_argument("--sweep", metavar="TARGET.PARAM=V1,V2,...", help="sweep a defense, attack or protocol parameter")
    p.add_argument("--seeds", type=int, default=None, metavar="N", help="run seeds SEED..SEED+N-1 (default 3)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    p.add_argument(
        "--jobs", type=int, default=None, metavar="N", help="parallel points (default: all cores; 1 = sequential)"
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS|local:N",
        help="run the points on a Dask cluster (scheduler address, or local:N workers)",
    )
    p.add_argument(
        "-o", "--out", metavar="DIR", help="report folder (default privaudit-report/<protocol>-<sweep>-<dataset>/)"
    )
    force_arg(p)
    p.add_argument("--quiet", action="store_true", help="do not print the table")
    margin_arg(p)
    max_bytes_arg(p)
    p.add_argument(
        "--config", metavar="FILE.toml", help="run the plan of a plan.toml (every report folder records one)"
    )
    fail_on_arg(p, FAIL_ON, FAIL_ON_HELP)
    p.epilog = "Parameters of a protocol, attack or defense (defaults, accepted values): privaudit describe NAME"


FAIL_ON_HELP = (
    "exit code 1 when a defended point (every point when none is defended) meets a condition: leaks, "
    "inconclusive; dp-violation: any point or DP claim (comma-separated or repeated; docs/ci.md)"
)
_SIMULATION_ONLY = ("noise", "scales", "defense", "sweep", "set", "users", "seeds", "scheduler", "rating_scale")
_PLAN_FIELDS = ("protocol", "transcript", "attack", "noise", "scales", "defense", "sweep", "set", "users", "seeds")


@command("attack", "attack a simulated protocol (sweeping a defense) or a transcript; write a report")(_attack_args)
def cmd_attack(args: argparse.Namespace) -> int:
    from privaudit import reports
    from privaudit import results as rs
    from privaudit.plan import plan_to_toml

    margin = None if args.margin is None else margin_value(args.margin)  # checked before any compute
    defaults_note = None
    if args.protocol and not args.transcript and not args.config:
        defaults_note = _protocol_defaults(args)
    if args.protocol or args.transcript:
        args.out = args.out or default_report_dir(args)
        check_writable(args.out, args.force, "--out DIR", folder=True)
    plan = None
    if args.config:
        plan, results = _attack_config(args)
    elif args.transcript:
        results = _attack_recorded(args)
        if results is None:
            return _unscored_gate(args)
    else:
        plan, results = _attack_simulated(args, defaults_note)
    if margin is not None:
        results["margin"] = margin
        results["verdicts"] = rs.experiment_verdicts(results)
    out = reports.write_report(results, args.out, plan_toml=plan_to_toml(plan) if plan is not None else None)
    if not args.quiet:  # every line within reports.CONSOLE_WIDTH columns; the full table is in report.md
        from privaudit.reports.render import wrap_lines

        say(reports.format_console(results, report=str(out)))
        line = _reference_line(results)
        if line:
            say("\n".join(wrap_lines(line)))
    say(f"report written to {out}/")
    return gate_exit_code(results, "results", args.fail_on)


def _unscored_gate(args: argparse.Namespace) -> int:
    """``--fail-on`` on a transcript without private messages: nothing was judged; that is a
    failure only of ``inconclusive``."""
    from privaudit.gate import named

    conditions = named(args.fail_on)
    if "inconclusive" in conditions:
        say(f"privaudit: fail: {args.transcript}: inconclusive: unscored (no private messages)", file=sys.stderr)
        return 1
    if conditions:
        say(f"fail-on {','.join(conditions)}: nothing judged ({args.transcript} holds no private messages)")
    return 0


def _attack_spec(text: str | None) -> dict | None:
    """``--attack NAME[:k=v,...]`` as the API's ``{"name": NAME, **params}`` (None: the default)."""
    from privaudit.params import parse_spec

    if not text:
        return None
    name, params = parse_spec(text, "--attack")
    return {"name": name, **params}


def _defense_specs(texts) -> list[dict]:
    """``--defense NAME[:k=v,...]`` options as ``{"name": NAME, **params}`` mappings."""
    from privaudit.params import parse_spec

    return [{"name": n, **p} for n, p in (parse_spec(d, "--defense") for d in texts or ())]


def _sweep_spec(args: argparse.Namespace) -> dict:
    """``--sweep T.P=V1,...`` or ``--noise KIND [--scales L]`` as ``build_experiment`` keywords."""
    from privaudit.plan import parse_sweep, parse_values

    if args.scales is not None and not args.noise:
        raise PrivauditError("--scales needs --noise KIND (e.g. --noise laplace --scales 0,0.1,1)")
    if args.noise and args.sweep:
        raise PrivauditError("use either --noise or --sweep, not both")
    if args.noise:
        scales = parse_values(args.scales, "--scales") if args.scales is not None else None
        return {"noise": args.noise, "scales": scales}
    return {"sweep": parse_sweep(args.sweep) if args.sweep else None}


def _attack_config(args: argparse.Namespace):
    """``attack --config plan.toml``: the recorded plan, rerun (the plan and its results)."""
    from privaudit import experiment
    from privaudit.plan import load_plan

    given = [f"--{k}" for k in _PLAN_FIELDS if getattr(args, k) not in (None, [], False)]
    given += ["--data"] if args.data != "synthetic" else []
    given += ["--seed"] if args.seed != 0 else []
    if given:
        raise PrivauditError(f"--config cannot be combined with {', '.join(given)} (edit the plan instead)")
    plan = load_plan(args.config, jobs=args.jobs, scheduler=args.scheduler)
    if not args.out:
        from privaudit.reports.render import default_out_dir

        sweep = plan.sweep.label if plan.sweep is not None else None
        args.out = str(default_out_dir({"protocol": plan.protocol_cls.name, "sweep": sweep}))
    check_writable(args.out, args.force, "--out DIR", folder=True)
    warn_short_keys(plan.defenses)
    return plan, experiment.run_plan(plan)


def _attack_recorded(args: argparse.Namespace):
    """``attack --transcript FILE``: the results, or None when the file holds no ground truth
    (the reconstruction is written instead)."""
    from privaudit import experiment
    from privaudit import transcript as tr

    given = [f"--{k}" for k in _SIMULATION_ONLY if getattr(args, k) not in (None, [], False)]
    given += ["--protocol"] if args.protocol else []
    given += ["--data"] if args.data != "synthetic" else []
    if given:
        raise PrivauditError(f"--transcript cannot be combined with {', '.join(given)}")
    load = tr.load_validated
    if Path(args.transcript).is_dir():  # a sharded run's folder (privaudit run --scheduler)
        from privaudit.sharded import load_validated as load
    recorded = load(args.transcript, **({} if args.max_bytes is None else {"max_bytes": args.max_bytes}))
    if not recorded.has_private:  # no ground truth: run the attack, write what it recovered
        from privaudit.integrations.recorded import reconstruct

        out, name = reconstruct(
            recorded, args.attack, args.out or str(Path("privaudit-report") / f"{Path(args.transcript).stem}-unscored")
        )
        print(
            f"note: {args.transcript} holds no private messages: nothing to score {name} against; "
            f"reconstruction written to {out}/reconstruction.json"
        )
        return None
    return experiment.attack_transcript(recorded, _attack_spec(args.attack))


def _attack_simulated(args: argparse.Namespace, defaults_note: str | None):
    """``attack --protocol P``: the plan (every name and value checked first) and its results."""
    from privaudit import experiment
    from privaudit.plan import parse_assignments

    if not args.protocol:
        raise PrivauditError("give --protocol P (or --transcript FILE)")
    if args.max_bytes is not None:
        raise PrivauditError("--max-bytes applies to --transcript only")
    check_cli_extras(
        args.protocol, args.attack, args.defense + ([args.noise] if args.noise else []), scheduler=args.scheduler
    )
    seeds = experiment.DEFAULT_SEEDS if args.seeds is None else args.seeds
    exp = experiment.build_experiment(
        protocol=args.protocol,
        attack=_attack_spec(args.attack),
        defenses=_defense_specs(args.defense),
        **_sweep_spec(args),
        protocol_config=parse_assignments(args.set),
        data=dataset_from_args(args),
        users=args.users,
        seeds=seeds,
        seed=args.seed,
        jobs=experiment.default_jobs() if args.jobs is None else args.jobs,
        scheduler=args.scheduler,
    )
    plan = exp.plan()  # names resolved and everything validated before any compute
    warn_short_keys(plan.defenses)
    from privaudit.reports.render import wrap_lines
    from privaudit.runner import subsample_users

    dataset = experiment.load_data(plan.data)  # a data error (or too many --users) stops here,
    sampled = subsample_users(dataset, plan.users, plan.seed)  # before any banner
    if defaults_note:
        say("\n".join(wrap_lines(defaults_note)))
    _say_estimate(plan, sampled, plan.protocol_cls.name)
    return plan, experiment.run_plan(plan, dataset=dataset)


def _say_estimate(plan, dataset, what: str) -> None:
    """One line (wrapped at 100 columns) with the calibrated time of a sweep expected to take
    over a minute and how to shorten it (:mod:`privaudit.estimate`); ``dataset``: the plan's
    data, loaded and subsampled to its users."""
    from privaudit import estimate
    from privaudit.reports.render import wrap_lines

    est = estimate.experiment_estimate(plan, dataset)
    if est is not None and est.seconds > estimate.ANNOUNCE_ABOVE:
        print("\n".join(wrap_lines(est.line(what))), flush=True)


# ---------------------------------------------------------------------------------------- main


#: The order ``privaudit --help`` lists the subcommands in.
ORDER = ("list", "describe", "inspect", "run", "attack", "report", "audit", "record", "compare")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgParser(
        prog="privaudit",
        description="Privacy attacks and audits for federated recommender systems.",
    )
    parser.add_argument("--version", action="version", version=f"privaudit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgParser)
    order = [n for n in ORDER if n in COMMANDS] + [n for n in COMMANDS if n not in ORDER]
    for name in order:
        help_text, add_arguments, _ = COMMANDS[name]
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
    from privaudit.runner import quiet_nan_warnings

    try:
        with quiet_nan_warnings():  # a NaN metric prints as n/a; numpy's warning about it is noise
            return int(handler(args) or 0)
    except PrivauditError as exc:
        from privaudit._escape import printable

        print(f"privaudit: error: {printable(exc)}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional extra missing where no check caught it (e.g. a worker)
        mapped = missing_dependency(exc)
        if mapped is None:
            raise
        print(f"privaudit: error: {mapped}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("privaudit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

"""Command-line front end: parsing and printing only; the work happens in the library.

Subcommands register themselves in :data:`COMMANDS` through :func:`command`; each gets an
``add_arguments(parser)`` and a ``handler(args) -> int``. A user mistake raises
:class:`~privaudit.errors.PrivauditError` (or an argparse error) and ends as one line on
stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from privaudit import __version__
from privaudit.errors import PrivauditError, missing_dependency

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


def _byte_size(text: str) -> int:
    """``--max-bytes`` value: an integer number of bytes, optionally with K, M, G or T (binary)."""
    units = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in units else ""
    number = t[: len(t) - len(unit)]
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive byte count like 512M or 2G, got {text!r}")
    return int(number) * units[unit]


def _max_bytes_arg(p: argparse.ArgumentParser) -> None:
    """The one ``--max-bytes`` option of every command that loads a transcript."""
    p.add_argument(
        "--max-bytes",
        type=_byte_size,
        default=None,
        metavar="N[K|M|G]",
        help="byte budget for loading a transcript: members' total uncompressed size; member count and manifest "
        "limits scale with it (default 512M)",
    )


def _say(text: object, file=None) -> None:
    """Print ``text`` line by line with every control character escaped (:mod:`privaudit._escape`):
    names from files (metrics, defenses, attacks, reasons) never act on the terminal."""
    from privaudit._escape import printable

    print("\n".join(printable(line) for line in str(text).split("\n")), file=file)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _next_free(path: Path, folder: bool = False) -> Path:
    """The first of ``path-2``, ``path-3``, ... (a file's: before its suffix) that does not exist."""
    for n in range(2, 10_000):
        keep = path.suffix and not folder
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}") if keep else Path(f"{path}-{n}")
        if not candidate.exists():
            return candidate
    return path  # pragma: no cover - ten thousand reruns


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
            needs = "".join(
                f" [needs privaudit[{e}]{': not installed' if e in r['missing'] else ''}]" for e in r["extras"]
            )
            _say(f"{r['kind']:<9} {r['name']:<{width}}  {r['description']}{needs}")
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
        _say("\n\n".join("\n".join(_format_description(e)) for e in entries))
    return 0


# ------------------------------------------------------------------------------------- inspect


def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="transcript file (.ptx)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _max_bytes_arg(p)


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
        print(f"  {esc(kind):<20} {e['messages']:>8} messages  {_human_bytes(e['bytes']):>10}")
    return 0


# ------------------------------------------------------------------------ run / attack / report


_DATA_HELP = (
    "dataset: synthetic (default, 200 users x 300 items), a sized synthetic dataset "
    "synthetic:PRESET or synthetic:users=N,items=M,density=D[,k=K,min_ratings=R,seed=S] "
    "(presets ml-100k-size, ml-1m-size: 6,040 x 3,706, 1.0 M ratings, ml-10m-size: 69,878 x 10,677, "
    "~10 M ratings), or a MovieLens folder / ratings CSV (user,item,rating[,timestamp])"
)


def _data_value(value: str) -> str:
    """``--data``: a synthetic spec is checked while parsing (one line, exit 2, before any compute)."""
    if value.strip().lower().startswith("synthetic:"):
        from privaudit.data.synthetic import parse_spec

        try:
            parse_spec(value)
        except PrivauditError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--defense", action="append", default=[], metavar="NAME[:k=v,...]", help="activate a defense (repeatable)"
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="set a protocol config value (repeatable)"
    )
    _dataset_args(p)


def _dataset_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="synthetic", type=_data_value, metavar="synthetic[:SPEC]|PATH", help=_DATA_HELP)
    p.add_argument(
        "--rating-scale",
        metavar="MIN,MAX[,STEP]",
        help="rating scale of --data PATH (a CSV's default: 1,5,1); ratings off it are refused",
    )
    p.add_argument(
        "--users", type=int, default=None, metavar="N", help="subsample N users (seeded; at most the dataset's users)"
    )


def _force_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="replace an existing output (transcript file or report folder)")


# ------------------------------------------------------------------ checks made before any work


def _dataset(args: argparse.Namespace):
    """``--data`` as given, or the dataset loaded with its declared ``--rating-scale``."""
    scale = getattr(args, "rating_scale", None)
    synthetic = str(args.data).strip().lower().startswith("synthetic")
    if not synthetic and not Path(args.data).expanduser().exists():
        raise PrivauditError(f"{args.data}: no such file or folder")
    if scale is None:
        return args.data
    if synthetic:
        raise PrivauditError(
            "--rating-scale applies to --data PATH (a MovieLens folder or a ratings CSV), not synthetic data"
        )
    from privaudit.data import load_dataset

    return load_dataset(args.data, rating_scale=scale)


class _Scheduler:
    name = "--scheduler"
    requires_extras = ("dask",)


def _check_extras(protocol: str | None, attack: str | None = None, defenses=(), attacks=(), scheduler=None) -> None:
    """Refuse a plan whose protocol, attack, defenses or ``--scheduler`` need an extra that is
    not installed."""
    from privaudit import registry
    from privaudit.errors import check_extras
    from privaudit.params import parse_spec

    classes = [_Scheduler] if scheduler else []
    if protocol:
        protocol_cls = registry.get("protocol", protocol)
        classes.append(protocol_cls)
        name = parse_spec(attack, "--attack")[0] if attack else getattr(protocol_cls, "default_attack", None)
        if name and not attacks:
            classes.append(registry.get("attack", name))
    classes += [registry.get("attack", a) for a in attacks or ()]
    classes += [registry.get("defense", parse_spec(d, "--defense")[0]) for d in defenses or ()]
    check_extras(classes)


def _protocol_defaults(args: argparse.Namespace) -> str | None:
    """Fill in what ``attack --protocol P`` runs when no defense, noise or sweep is named: the
    protocol's ``default_defense_specs`` / ``default_sweep_spec`` (unless the attack sweeps a
    parameter of its own) and ``default_users``; returns the line that says so (printed once
    the plan is valid), or None."""
    from privaudit import registry
    from privaudit.params import parse_spec

    protocol_cls = registry.get("protocol", args.protocol)
    notes = []
    users = getattr(protocol_cls, "default_users", None)
    if args.users is None and users is not None:
        args.users = int(users)
        notes.append(f"{users} users (--users N for more)")
    if args.defense or args.noise or args.sweep:
        pass
    else:
        attack = parse_spec(args.attack, "--attack")[0] if args.attack else protocol_cls.default_attack
        spec = getattr(protocol_cls, "default_sweep_spec", None)
        own = getattr(registry.get("attack", attack), "default_sweep", None) if attack else None
        if spec and not own:
            args.defense = list(getattr(protocol_cls, "default_defense_specs", ()) or ())
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
    """Print the estimated time of a run above two minutes (protocols with ``estimate_seconds``)."""
    from privaudit import registry

    estimate = getattr(registry.get("protocol", args.protocol), "estimate_seconds", None)
    if estimate is None:
        return
    from privaudit.experiment import parse_assignments

    points = len(str(args.sweep).partition("=")[2].split(",")) if getattr(args, "sweep", None) else 1
    if getattr(args, "noise", None):
        grid = getattr(registry.get("defense", args.noise), "default_grid", ()) or (0,)
        points = len(args.scales.split(",")) if args.scales else len(grid)
    from privaudit.experiment import load_data

    n_users = load_data(_dataset(args)).n_users  # loading is cheap next to a run worth estimating
    users = n_users if args.users is None else args.users
    if users > n_users:
        return  # refused with one line when the experiment loads the data
    seconds = estimate(users, parse_assignments(args.set), list(args.defense or ())) * points * seeds
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


def _data_tag(data: object, users: int | None) -> str:
    """Dataset part of a default output name: ``synthetic``, the file or folder name, ``-uN``."""
    import re
    from pathlib import Path

    text = str(data).strip()
    if not text.lower().startswith("synthetic"):
        path = Path(text.rstrip("/\\"))
        text = path.stem if path.suffix.lower() in (".csv", ".tsv", ".txt", ".dat") else path.name
    tag = re.sub(r"[^A-Za-z0-9._=-]+", "-", text).strip("-.") or "data"
    return tag + (f"-u{users}" if users is not None else "")


def _default_report_dir(args: argparse.Namespace) -> str:
    """``privaudit-report/<protocol>-<sweep>-<dataset>/`` (``<transcript file>-transcript``)."""
    from pathlib import Path

    if getattr(args, "transcript", None):
        return str(Path("privaudit-report") / f"{Path(args.transcript).stem}-transcript")
    if getattr(args, "noise", None):
        label = f"{args.noise}.scale"
    elif getattr(args, "sweep", None):
        label = str(args.sweep).partition("=")[0].strip() or "sweep"
    else:
        label = "audit" if args.command == "audit" else "default"
    return str(Path("privaudit-report") / f"{args.protocol}-{label}-{_data_tag(args.data, args.users)}")


def _check_writable(path, force: bool, what: str, folder: bool) -> None:
    """One-line refusal of an output that cannot be written, or exists without ``--force``.

    A report folder (``folder``) may be new (its missing parents are created); a file needs
    an existing folder.
    """
    import os
    from pathlib import Path

    path = Path(path)
    if path.is_symlink():
        raise PrivauditError(f"{path}: is a symbolic link; privaudit does not write through links (remove it)")
    if folder:
        if path.exists() and not path.is_dir():
            raise PrivauditError(f"{path}: exists and is not a folder (give another {what})")
        if path.is_dir() and any(path.iterdir()) and not force:
            raise PrivauditError(
                f"{path}/ already exists; pass --force to replace it or choose another {what} "
                f"(e.g. {what.split()[0]} {_next_free(path, folder=True)})"
            )
        parent = path
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise PrivauditError(f"{path}: cannot create the report folder ({parent} is not a writable folder)")
        return
    parent = path.parent
    if not parent.is_dir():
        raise PrivauditError(f"{path}: the folder {parent} does not exist")
    if path.is_dir():
        raise PrivauditError(f"{path}: is a folder (give a file name for {what})")
    if path.exists() and not path.is_file():
        raise PrivauditError(f"{path}: exists and is not a regular file; privaudit replaces only regular files")
    if path.exists() and not force:
        raise PrivauditError(f"{path} already exists; pass --force to replace it or write -o {_next_free(path)}")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise PrivauditError(f"{path}: not writable")


def _warn_short_keys(defenses) -> None:
    """``warning: ...`` on stderr for every defense with a short key (``(class, params)`` pairs)."""
    for cls, params in defenses:
        line = getattr(cls(**params), "short_key_warning", None)  # defenses are cheap to build (keys are lazy)
        if line:
            print(f"warning: {line}", file=sys.stderr)


def _warn_short_key_specs(specs) -> None:
    from privaudit import registry
    from privaudit.params import parse_spec

    _warn_short_keys([(registry.get("defense", n), p) for n, p in (parse_spec(s, "--defense") for s in specs or ())])


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", required=True, help="protocol name (see privaudit list)")
    _data_args(p)
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.ptx", help="transcript file to write")
    p.add_argument("--no-private", action="store_true", help="leave out the clients' private messages (shareable)")
    _force_arg(p)


@command("run", "run a protocol once and write its transcript (.ptx)")(_run_args)
def cmd_run(args: argparse.Namespace) -> int:
    from privaudit.experiment import run_transcript
    from privaudit.transcript_io import streaming

    _check_writable(args.output, args.force, "-o FILE", folder=False)
    _check_extras(args.protocol, None, args.defense)
    _warn_short_key_specs(args.defense)
    args.sweep = args.noise = None
    _print_estimate(args, 1)
    data = _dataset(args)
    with streaming(args.output, include_private=not args.no_private) as stream:  # rounds written as they end
        result = run_transcript(args.protocol, args.defense, args.set, data, args.users, args.seed)
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
    _data_args(p)
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
    _force_arg(p)
    p.add_argument("--quiet", action="store_true", help="do not print the table")
    _margin_arg(p)
    _max_bytes_arg(p)
    p.add_argument(
        "--config", metavar="FILE.toml", help="run the plan of a plan.toml (every report folder records one)"
    )
    p.epilog = "Parameters of a protocol, attack or defense (defaults, accepted values): privaudit describe NAME"


_SIMULATION_ONLY = ("noise", "scales", "defense", "sweep", "set", "users", "seeds", "scheduler", "rating_scale")
_PLAN_FIELDS = ("protocol", "transcript", "attack", "noise", "scales", "defense", "sweep", "set", "users", "seeds")


def _margin_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        metavar="M",
        help="verdict margin: share of the gap between the baseline and a perfect attack (default 0.05)",
    )


def _margin(value: float) -> float:
    if not (0.0 < value < 1.0):
        raise PrivauditError(f"--margin must lie strictly between 0 and 1, got {value:g}")
    return float(value)


@command("attack", "attack a simulated protocol (sweeping a defense) or a transcript; write a report")(_attack_args)
def cmd_attack(args: argparse.Namespace) -> int:
    from privaudit import experiment, reports
    from privaudit import results as rs
    from privaudit.plan import load_plan, plan_to_toml

    margin = None if args.margin is None else _margin(args.margin)  # checked before any compute
    defaults_note = None
    if args.protocol and not args.transcript and not args.config:
        defaults_note = _protocol_defaults(args)
    if args.protocol or args.transcript:
        args.out = args.out or _default_report_dir(args)
        _check_writable(args.out, args.force, "--out DIR", folder=True)
    plan = None
    if args.config:
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
        _check_writable(args.out, args.force, "--out DIR", folder=True)
        _warn_short_keys(plan.defenses)
        results = experiment.run_plan(plan)
    elif args.transcript:
        given = [f"--{k}" for k in _SIMULATION_ONLY if getattr(args, k) not in (None, [], False)]
        if args.protocol or args.data != "synthetic":
            given += ["--protocol"] if args.protocol else []
            given += ["--data"] if args.data != "synthetic" else []
        if given:
            raise PrivauditError(f"--transcript cannot be combined with {', '.join(given)}")
        from privaudit import transcript as tr

        recorded = tr.load_validated(
            args.transcript, **({} if args.max_bytes is None else {"max_bytes": args.max_bytes})
        )
        if not recorded.has_private:  # no ground truth: run the attack, write what it recovered
            from privaudit.integrations.recorded import reconstruct

            out, name = reconstruct(recorded, args.attack, args.out or "privaudit-report/transcript-unscored")
            print(
                f"note: {args.transcript} holds no private messages: nothing to score {name} against; "
                f"reconstruction written to {out}/reconstruction.json"
            )
            return 0
        results = experiment.attack_transcript(recorded, args.attack)
    else:
        if not args.protocol:
            raise PrivauditError("give --protocol P (or --transcript FILE)")
        if args.max_bytes is not None:
            raise PrivauditError("--max-bytes applies to --transcript only")
        _check_extras(
            args.protocol, args.attack, args.defense + ([args.noise] if args.noise else []), scheduler=args.scheduler
        )
        exp = experiment.build_experiment(
            args.protocol,
            args.attack,
            args.noise,
            args.scales,
            args.defense,
            args.sweep,
            args.set,
            _dataset(args),
            args.users,
            experiment.DEFAULT_SEEDS if args.seeds is None else args.seeds,
            args.seed,
            experiment.default_jobs() if args.jobs is None else args.jobs,
            scheduler=args.scheduler,
        )
        plan = exp.plan()  # names resolved and everything validated before any compute
        _warn_short_keys(plan.defenses)
        if defaults_note:
            print(defaults_note)
        _print_estimate(args, experiment.DEFAULT_SEEDS if args.seeds is None else args.seeds)
        results = experiment.run_plan(plan)
    if margin is not None:
        results["margin"] = margin
        results["verdicts"] = rs.experiment_verdicts(results)
    out = reports.write_report(results, args.out, plan_toml=plan_to_toml(plan) if plan is not None else None)
    if not args.quiet:
        _say(reports.format_table(results))
        line = _reference_line(results)
        if line:
            _say(line)
    _say(f"report written to {out}/")
    return 0


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
    _say(reports.format_table(reports.read_results(out)))
    _say(f"report re-rendered in {out}/")
    return 0


# --------------------------------------------------------------------------------------- audit


def _audit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", help="protocol to audit (see the list below)")
    p.add_argument(
        "--transcript", metavar="FILE", help="audit one recorded transcript: every attack that reads it, no simulation"
    )
    _dataset_args(p)
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
        "-o", "--out", metavar="DIR", help="report folder (default privaudit-report/<protocol>-audit-<dataset>/)"
    )
    _force_arg(p)
    _max_bytes_arg(p)
    p.add_argument("--config", metavar="FILE.toml", help="rerun the plan.toml an audit folder records")
    _margin_arg(p)
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
            f"--{k}" for k in ("protocol", "users", "seeds", "attack", "defense") if getattr(args, k) not in (None, [])
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
        _check_writable(args.out, args.force, "--out DIR", folder=True)
        spec = au.Audit(**fields)
    else:
        if not args.protocol:
            raise PrivauditError("give --protocol P (or --transcript FILE, or --config DIR/plan.toml)")
        args.out = args.out or _default_report_dir(args)
        _check_writable(args.out, args.force, "--out DIR", folder=True)
        _check_extras(args.protocol, None, args.defense or (), args.attack or (), scheduler=args.scheduler)
        check_bounds(args.seeds, args.jobs, args.users)
        spec = au.Audit(
            protocol=args.protocol,
            data=_dataset(args),
            users=args.users,
            sets=parse_assignments(args.set),
            seeds=au.DEFAULT_AUDIT_SEEDS if args.seeds is None else args.seeds,
            seed=args.seed,
            jobs=default_jobs() if args.jobs is None else args.jobs,
            scheduler=args.scheduler,
            attacks=args.attack,
            defenses=args.defense,
        )
    margin = None if args.margin is None else _margin(args.margin)  # checked before any compute
    result = au.run_audit(spec)
    if margin is not None:
        from privaudit import results as rs

        result["margin"] = margin
        result["matrix"], result["verdicts"] = rs.audit_matrix(result), rs.audit_verdicts(result)
    out = au.write_audit(result, args.out, plan_toml=audit_to_toml(spec))
    _say(au.format_matrix(result))
    for a in result["attacks"]:
        if not a.get("applies"):
            _say(f"note: {a['name']} does not apply to the undefended {result['protocol']} view: {a.get('reason')}")
    errors = sorted({r["error"] for r in result["runs"] if "error" in r})
    for e in errors:
        _say(f"warning: a run failed: {e}", file=sys.stderr)
    _say(f"audit written to {out}/ ({result['timing']['total_seconds']:.1f} s)")
    return 0


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

    margin = PROTECTION_MARGIN if args.margin is None else _margin(args.margin)
    args.out = args.out or "privaudit-report/transcript-audit"
    _check_writable(args.out, args.force, "--out DIR", folder=True)
    result = recorded.audit_transcript(args.transcript, args.attack, max_bytes=args.max_bytes, margin=margin)
    out = recorded.write_audit(result, args.out)
    _say(recorded.format_audit(result))
    for d in result["defenses"]:
        _say(f"defense: {', '.join(f'{k}={v}' for k, v in d.items())}")
    if not result["private_included"]:
        print("note: the transcript holds no private messages: nothing to score against")
    _say(f"audit written to {out}/")
    return 0


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
    p.add_argument("-o", "--output", required=True, metavar="FILE.ptx", help="transcript file to write")
    p.add_argument(
        "--no-private",
        action="store_true",
        help="no ground-truth Mod on the clients (the transcript then has no private messages)",
    )
    _force_arg(p)
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

    _check_writable(args.output, args.force, "-o FILE", folder=False)
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
    )
    defenses = ", ".join(str(d) for d in summary["defenses"]) or "none"
    print(
        printable(
            f"transcript written to {args.output} ({summary['messages']} messages, {args.clients} clients, "
            f"{summary['seconds']:.1f} s of simulation; Flower defenses: {defenses})"
        )
    )
    if summary["errors"]:
        first = printable(summary["first_error"])
        print(f"warning: {summary['errors']} client replies were errors (first: {first})", file=sys.stderr)
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

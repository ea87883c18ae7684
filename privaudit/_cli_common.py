"""What every ``privaudit`` subcommand shares: the command registry, one-line argparse errors,
escaped printing, the data/force/margin/max-bytes options and the checks made before any work
(output writable, extras installed, dataset present)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from privaudit.errors import PrivauditError

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


class ArgParser(argparse.ArgumentParser):
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


def byte_size(text: str) -> int:
    """``--max-bytes`` value: an integer number of bytes, optionally with K, M, G or T (binary)."""
    units = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in units else ""
    number = t[: len(t) - len(unit)]
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive byte count like 512M or 2G, got {text!r}")
    return int(number) * units[unit]


def max_bytes_arg(p: argparse.ArgumentParser) -> None:
    """The one ``--max-bytes`` option of every command that loads a transcript."""
    p.add_argument(
        "--max-bytes",
        type=byte_size,
        default=None,
        metavar="N[K|M|G]",
        help="byte budget for loading a transcript: members' total uncompressed size; member count and manifest "
        "limits scale with it (default 512M)",
    )


def say(text: object, file=None) -> None:
    """Print ``text`` line by line with every control character escaped (:mod:`privaudit._escape`):
    names from files (metrics, defenses, attacks, reasons) never act on the terminal."""
    from privaudit._escape import printable

    print("\n".join(printable(line) for line in str(text).split("\n")), file=file)


def human_bytes(n: int) -> str:
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


def data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--defense", action="append", default=[], metavar="NAME[:k=v,...]", help="activate a defense (repeatable)"
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="set a protocol config value (repeatable)"
    )
    dataset_args(p)


def dataset_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="synthetic", type=_data_value, metavar="synthetic[:SPEC]|PATH", help=_DATA_HELP)
    p.add_argument(
        "--rating-scale",
        metavar="MIN,MAX[,STEP]",
        help="rating scale of --data PATH (a CSV's default: 1,5,1); ratings off it are refused",
    )
    p.add_argument(
        "--users", type=int, default=None, metavar="N", help="subsample N users (seeded; at most the dataset's users)"
    )


def force_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="replace an existing output (transcript file or report folder)")


# ------------------------------------------------------------------ checks made before any work


def dataset_from_args(args: argparse.Namespace):
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


def check_cli_extras(
    protocol: str | None, attack: str | None = None, defenses=(), *, attacks=(), scheduler=None
) -> None:
    """Refuse a plan whose protocol, attack, defenses or ``--scheduler`` need an extra that is
    not installed."""
    from privaudit import registry
    from privaudit.errors import check_extras
    from privaudit.params import parse_spec

    if scheduler:  # local:N within the worker cap, before any work
        from privaudit._local_cluster import local_workers

        local_workers(scheduler)
    classes = [_Scheduler] if scheduler else []
    if protocol:
        protocol_cls = registry.get("protocol", protocol)
        classes.append(protocol_cls)
        name = parse_spec(attack, "--attack")[0] if attack else protocol_cls.default_attack
        if name and not attacks:
            classes.append(registry.get("attack", name))
    classes += [registry.get("attack", a) for a in attacks or ()]
    # an audit's --defense may be a stack "a+b" (privaudit.audit.parse_cell)
    members = [m for d in defenses or () for m in str(d).split("+") if m.strip()]
    classes += [registry.get("defense", parse_spec(m, "--defense")[0]) for m in members]
    check_extras(classes)


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


def default_report_dir(args: argparse.Namespace) -> str:
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


def check_writable(path, force: bool, what: str, folder: bool) -> None:
    """One-line refusal of an output that cannot be written, or exists without ``--force``.

    A report folder (``folder``) may be new (its missing parents are created); a file needs
    an existing folder.
    """
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


def warn_short_keys(defenses) -> None:
    """``warning: ...`` on stderr for every defense with a short key (``(class, params)`` pairs)."""
    for cls, params in defenses:
        line = getattr(cls(**params), "short_key_warning", None)  # defenses are cheap to build (keys are lazy)
        if line:
            print(f"warning: {line}", file=sys.stderr)


def warn_short_key_specs(specs) -> None:
    from privaudit import registry
    from privaudit.params import parse_spec

    warn_short_keys([(registry.get("defense", n), p) for n, p in (parse_spec(s, "--defense") for s in specs or ())])


def margin_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        metavar="M",
        help="verdict margin: share of the gap between the baseline and a perfect attack (default 0.05)",
    )


def margin_value(value: float) -> float:
    if not (0.0 < value < 1.0):
        raise PrivauditError(f"--margin must lie strictly between 0 and 1, got {value:g}")
    return float(value)


def fail_on_arg(p: argparse.ArgumentParser, allowed: tuple[str, ...], help_text: str) -> None:
    """``--fail-on A[,B...]`` (repeatable): exit code 1 when the run meets a named condition."""
    from privaudit.gate import fail_on_type

    p.add_argument(
        "--fail-on",
        action="append",
        type=fail_on_type(allowed),
        default=None,
        metavar="|".join(allowed),
        help=help_text,
    )


def gate_exit_code(doc, kind: str, fail_on) -> int:
    """Apply ``--fail-on`` to a written audit or results dict: one stderr line per failing cell
    and exit code 1, else a stdout line saying what was gated and 0 (``docs/ci.md``)."""
    from privaudit.gate import gate_lines, named

    conditions = named(fail_on)
    if not conditions:
        return 0
    lines, summary = gate_lines(doc, kind, conditions)
    for line in lines:
        say(f"privaudit: fail: {line}", file=sys.stderr)
    if not lines:
        say(summary)
    return 1 if lines else 0

"""Regenerate the tables of docs/reproduction.md from the code, paper by paper.

    python benchmarks/reproduce.py PAPER [--table NAME[,NAME...]] [--quick] [--out DIR] [--data DIR]

PAPER is one of ``privmvmf``, ``fedsplit``, ``fedncf``, ``fedproto``, ``fedrec`` or ``all``.
Without ``--quick`` every table of the paper (or the ones named by ``--table``; ``--list``
prints the names) is recomputed and written as Markdown to ``OUT/PAPER/NAME.md`` (figures beside
it); tables that an existing benchmark script produces are run through that script with the
arguments given in docs/reproduction.md (its output is the Markdown file). Each table's cost is
in its heading in docs/reproduction.md. One module per paper (``benchmarks/reproduce_<paper>.py``)
holds its tables and quick checks.

``--quick`` runs a subsampled check of every paper instead:
each check recomputes a figure the docs state and compares it with the stated value and
tolerance, writes ``OUT/quick.md`` and exits 1 after printing the failing rows if any check
fails.

MovieLens 100K (the folder holding ``u.data``) is found at ``--data``, else at
``$PRIVAUDIT_ML100K``, else at ``../shared/data/ml-100k`` next to the checkout (the other
benchmarks' default). A missing dataset is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import reproduce_fedncf
import reproduce_fedproto
import reproduce_fedrec
import reproduce_fedsplit
import reproduce_privmvmf
from reproduce_common import DEFAULT_DATA, Check, Context

PAPERS = ("privmvmf", "fedsplit", "fedncf", "fedproto", "fedrec")
_MODULES = {
    "privmvmf": reproduce_privmvmf,
    "fedsplit": reproduce_fedsplit,
    "fedncf": reproduce_fedncf,
    "fedproto": reproduce_fedproto,
    "fedrec": reproduce_fedrec,
}
TABLES = {p: _MODULES[p].TABLES for p in PAPERS}
QUICK = {p: _MODULES[p].QUICK for p in PAPERS}


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings to a dict; values parsed as int, float, bool, a tuple of numbers (comma) or str."""

    def value(v: str) -> Any:
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
        if "," in v and all(_is_number(x) for x in v.split(",")):
            return tuple(float(x) for x in v.split(","))
        return v

    out = {}
    for item in items:
        key, sep, v = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        out[key] = value(v)
    return out


def _is_number(x: str) -> bool:
    try:
        float(x)
    except ValueError:
        return False
    return True


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paper", choices=[*PAPERS, "all"])
    ap.add_argument("--table", default="", help="comma-separated table names of the paper (default: all of them)")
    ap.add_argument(
        "--quick", action="store_true", help="subsampled checks against the docs' tolerances (exit 1 on failure)"
    )
    ap.add_argument("--list", action="store_true", help="print the table names and exit")
    ap.add_argument("--out", default="reproduce-out", help="output folder (created)")
    ap.add_argument(
        "--data", default=os.environ.get("PRIVAUDIT_ML100K", str(DEFAULT_DATA)), help="MovieLens 100K folder"
    )
    ap.add_argument("--jobs", type=int, default=1, help="parallel workers where a table supports them")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="budget parameter of the named table (e.g. groupings=5, global_rounds=50); repeatable",
    )
    return ap


def _mistake(args: argparse.Namespace, papers: list[str], names: list[str]) -> str | None:
    """The user mistake in the table, --quick, --data and --jobs arguments (one line), or None."""
    if names and len(papers) > 1:
        return "--table needs a single PAPER"
    unknown = [t for t in names if t not in TABLES[papers[0]]]
    if unknown:
        return f"unknown table {unknown[0]!r} of {papers[0]} (known: {', '.join(TABLES[papers[0]])})"
    if args.quick and names:
        return "--quick runs every paper's checks; it takes no --table"
    if not (Path(args.data) / "u.data").is_file():
        return f"MovieLens 100K not found at {Path(args.data)} (give --data or set PRIVAUDIT_ML100K)"
    return None


def _overrides(args: argparse.Namespace, papers: list[str], names: list[str]) -> dict[str, Any]:
    """The --set budget parameters of the one named table (ValueError: a one-line mistake)."""
    overrides = parse_sets(args.set)
    if overrides and (len(names) != 1 or args.quick):
        raise ValueError("--set needs exactly one --table")
    if overrides:
        accepted = set(inspect.signature(TABLES[papers[0]][names[0]]).parameters) - {"ctx"}
        bad = sorted(set(overrides) - accepted)
        if bad:
            takes = ", ".join(sorted(accepted)) or "none"
            raise ValueError(f"table {names[0]!r} takes no parameter {bad[0]!r} (it takes: {takes})")
    if args.jobs < 1:
        raise ValueError("--jobs must be >= 1")
    return overrides


def _run_quick(ctx: Context, papers: list[str]) -> int:
    """Every paper's quick checks: ``OUT/quick.md``; exit 1 with the failing rows if any fails."""
    checks: list[Check] = []
    for p in papers:
        t0 = time.perf_counter()
        checks += QUICK[p](ctx)
        print(f"{p}: quick checks done in {time.perf_counter() - t0:.0f} s", flush=True)
    head = "| paper | check | ours | docs (tolerance) | |\n|---|---|---|---|---|\n"
    table = head + "\n".join(c.row() for c in checks)
    (ctx.out / "quick.md").write_text(table + "\n")
    print(table)
    failed = [c for c in checks if not c.ok]
    if failed:
        print("\nFAILED:\n" + "\n".join(c.row() for c in failed), file=sys.stderr)
        return 1
    return 0


def _run_tables(ctx: Context, papers: list[str], names: list[str], overrides: dict, sets: list[str]) -> None:
    """The named tables (all by default) of ``papers``, each written to ``OUT/PAPER/NAME.md``."""
    for p in papers:
        (ctx.out / p).mkdir(exist_ok=True)
        for name, fn in TABLES[p].items():
            if names and name not in names:
                continue
            t0 = time.perf_counter()
            text = fn(ctx, **overrides)
            cmd = f"python benchmarks/reproduce.py {p} --table {name}" + "".join(f" --set {kv}" for kv in sets)
            (ctx.out / p / f"{name}.md").write_text(f"Command: `{cmd}`\n\n{text}\n")
            print(f"## {p} / {name} ({time.perf_counter() - t0:.0f} s)\n\n{text}\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    papers = list(PAPERS) if args.paper == "all" else [args.paper]
    if args.list:
        for p in papers:
            print(f"{p}: {', '.join(TABLES[p])}")
        return 0
    names = [t for t in args.table.split(",") if t]
    mistake = _mistake(args, papers, names)
    try:
        overrides = {} if mistake else _overrides(args, papers, names)
    except ValueError as exc:
        mistake = str(exc)
    if mistake:
        print(f"reproduce.py: {mistake}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(data=Path(args.data).resolve(), out=out.resolve(), jobs=args.jobs)
    warnings.simplefilter("ignore")
    if args.quick:
        return _run_quick(ctx, papers)
    _run_tables(ctx, papers, names, overrides, args.set)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

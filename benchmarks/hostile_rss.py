"""Peak RSS of privaudit on the hostile inputs of the transcript loader, recorded transcripts,
plan files and report inputs.

The first two files (small on disk, valid CRCs) are a transcript with a 3.5 GiB all-zero
float64 member and one whose manifest.json inflates to 250 MiB of ``[{},{},...]``, given to
``inspect``. The other cases are those of the second round (issue 30): recorded transcripts
that asked for TiB-sized arrays (``audit --transcript``), plan files with unbounded sizes
(``attack --config``), report inputs that took minutes or ran out of memory (``report``), and
``inspect /dev/zero``. Each runs as ``python -m privaudit ...`` in a child process; the script
prints its exit code, first stderr line and peak RSS (``os.wait4``, from a small launcher
process). ``--checkout DIR`` runs another checkout's code (e.g. an older commit, to measure
"before"); ``--max-bytes`` is passed to inspect; ``--scale`` shrinks the two bombs.

    python benchmarks/hostile_rss.py
    python benchmarks/hostile_rss.py --max-bytes 4G
    python benchmarks/hostile_rss.py --case round2
    python benchmarks/hostile_rss.py --checkout ../main-before --scale 0.25
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_hostile import (  # noqa: E402 (after the sys.path line)
    RECORDED_CASES,
    _plan_text,
    _with,
    manifest_bomb,
    measured_run,
    recorded_transcript,
    zero_bomb,
)


def _round_two(folder: Path) -> dict[str, tuple[list[str], Path]]:
    """name -> (privaudit arguments, working folder) of the second-round cases, files written."""
    cases: dict[str, tuple[list[str], Path]] = {}

    def place(name: str) -> Path:
        d = folder / "".join(c if c.isalnum() else "_" for c in name)
        d.mkdir()
        return d

    for name in ("recorded: no n_items, id 2^40", "recorded: n_items 2^31-1", "recorded: rating_max 2e9"):
        d = place(name)
        RECORDED_CASES[name][0](recorded_transcript()).save(d / "bad.ptx")
        cases[name] = (["audit", "--transcript", "bad.ptx"], d)
    plan = _plan_text()
    for name, edit in (
        ("plan: seeds 10^9", ("run", "seeds = 1000000000")),
        ("plan: jobs 10^6", ("run", "jobs = 1000000")),
        ("plan: K 10^6", ("protocol", "K = 1000000")),
        ("plan: epochs 10^9", ("protocol", "epochs = 1000000000")),
        ("plan: TOML nested 1000", ("protocol", "x = " + "[" * 1000 + "]" * 1000)),
    ):
        d = place(name)
        (d / "plan.toml").write_text(_with(plan, *edit))
        cases[name] = (["attack", "--config", "plan.toml"], d)
    head = '{"protocol":"x","attack":"y","sweep":null,'
    for name, text in (
        (
            "report: 20,000 metric names",
            head + '"points":[{"attack_metrics":{' + ",".join(f'"m{i}":1' for i in range(20_000)) + "}}]}",
        ),
        ("report: 2*10^7 points (60 MB)", head + '"points":[' + ",".join(["{}"] * 20_000_000) + "]}"),
        ("report: 401-digit integer", head + '"points":[{"value":' + "9" * 401 + "}]}"),
    ):
        d = place(name)
        (d / "results.json").write_text(text)
        cases[name] = (["report", "."], d)
    cases["inspect /dev/zero"] = (["inspect", "/dev/zero"], place("inspect dev zero"))
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", type=Path, default=ROOT, help="repository whose privaudit is run (default: this one)")
    ap.add_argument("--max-bytes", default=None, help="passed to inspect")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink both bombs by this factor")
    ap.add_argument("--case", choices=("zero", "manifest", "round2"), default=None, help="run one group only")
    args = ap.parse_args()
    extra = [] if args.max_bytes is None else ["--max-bytes", args.max_bytes]
    with tempfile.TemporaryDirectory() as tmp:
        cases: dict[str, tuple[list[str], Path]] = {}
        for key, name, build in (
            (
                "zero",
                f"zero member {3584 * args.scale / 1024:.2f} GiB",
                lambda: zero_bomb(int(3584 * args.scale), valid_crc=True),
            ),
            (
                "manifest",
                f"manifest {250 * args.scale:.0f} MiB of [{{}},...]",
                lambda: manifest_bomb(mib=int(250 * args.scale)),
            ),
        ):
            if args.case in (None, key):
                d = Path(tmp) / key
                d.mkdir()
                (d / "case.ptx").write_bytes(build())
                cases[name] = (["inspect", "case.ptx", *extra], d)
        if args.case in (None, "round2"):
            cases.update(_round_two(Path(tmp)))
        print(f"{'case':<34} {'exit':>5} {'peak RSS':>10}  first stderr line")
        for name, (argv, cwd) in cases.items():
            res = measured_run(argv, cwd, pythonpath=args.checkout.resolve())
            lines = res["err"].splitlines()
            line = next((x for x in lines if x.startswith("privaudit:")), lines[-1] if lines else "")
            print(f"{name:<34} {res['rc']:>5} {res['rss'] / 2**20:>7.0f} MiB  {line[:100]}")


if __name__ == "__main__":
    main()

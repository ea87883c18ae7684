"""Peak RSS of `privaudit inspect` on the two memory-exhaustion files of the transcript loader.

Builds (small on disk, valid CRCs) a transcript with a 3.5 GiB all-zero float64 member and one
whose manifest.json inflates to 250 MiB of ``[{},{},...]``, then runs ``python -m privaudit
inspect FILE`` on each in a child process and prints its exit code, first stderr line and peak
RSS (``os.wait4``, from a small launcher process). ``--checkout DIR`` runs another checkout's
code (e.g. an older commit, to measure "before"); ``--max-bytes`` is passed through;
``--scale`` shrinks both files.

    python benchmarks/hostile_rss.py
    python benchmarks/hostile_rss.py --max-bytes 4G
    python benchmarks/hostile_rss.py --checkout ../main-before --scale 0.25
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_hostile import manifest_bomb, measured_run, zero_bomb  # noqa: E402 (after the sys.path line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", type=Path, default=ROOT, help="repository whose privaudit is run (default: this one)")
    ap.add_argument("--max-bytes", default=None, help="passed to inspect")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink both files by this factor")
    ap.add_argument("--case", choices=("zero", "manifest"), default=None, help="run one file only")
    args = ap.parse_args()
    extra = [] if args.max_bytes is None else ["--max-bytes", args.max_bytes]
    with tempfile.TemporaryDirectory() as tmp:
        cases = {}
        if args.case in (None, "zero"):
            cases[f"zero member {3584 * args.scale / 1024:.2f} GiB"] = zero_bomb(int(3584 * args.scale), valid_crc=True)
        if args.case in (None, "manifest"):
            cases[f"manifest {250 * args.scale:.0f} MiB of [{{}},...]"] = manifest_bomb(mib=int(250 * args.scale))
        print(f"{'file':<32} {'on disk':>10} {'exit':>5} {'peak RSS':>10}  first stderr line")
        for name, data in cases.items():
            path = Path(tmp) / "case.ptx"
            path.write_bytes(data)
            # cwd elsewhere: `python -m` puts the cwd first on sys.path
            res = measured_run(["inspect", str(path), *extra], tmp, pythonpath=args.checkout.resolve())
            lines = res["err"].splitlines()
            line = next((x for x in lines if x.startswith("privaudit:")), lines[-1] if lines else "")
            rc, rss_mib = res["rc"], res["rss"] / 2**20
            print(f"{name:<32} {len(data) / 2**20:>8.1f}MB {rc:>5} {rss_mib:>7.0f} MiB  {line[:110]}")


if __name__ == "__main__":
    main()

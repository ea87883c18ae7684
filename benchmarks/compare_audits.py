"""What changed between two ``audit.json`` files of the same audit (e.g. two versions of the code):
a thin wrapper over ``privaudit compare OLD NEW --fail-on changed`` (:mod:`privaudit.compare`)
that also reads files written before versioned schemas (no ``schema_version``: trees older than
the CI gate, as in docs/scale.md), validating them as the current schema version::

    python benchmarks/compare_audits.py before/audit.json after/audit.json

Prints the writers, whether the two are identical apart from timings, the cells whose verdict
changed, whether the summary verdicts agree, the largest moves of a seed-mean primary metric and
the canary bounds side by side. Exit status 1 when a verdict label differs, 2 for a file that
cannot be read or does not validate.
"""

from __future__ import annotations

import sys

from privaudit._escape import printable
from privaudit.compare import compare_files
from privaudit.errors import PrivauditError


def main(a_path: str, b_path: str) -> int:
    try:
        comparison = compare_files(a_path, b_path, legacy=True)
    except PrivauditError as exc:
        print(f"compare_audits: error: {printable(exc)}", file=sys.stderr)
        return 2
    for line in comparison.lines():
        print(printable(line))
    failures = comparison.failures(("changed",))
    return 1 if failures or not comparison.same_verdicts else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))

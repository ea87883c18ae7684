"""Headlines that explain themselves (privaudit.reports.headlines): which point a sweep over an
attack parameter quotes and why, the headline's metric at that point, why a defense the
protocol defeats does not help, and every defense the audit matrix reads protected named."""

from __future__ import annotations

from privaudit.reports import format_console, headlines


def _test(metric, advantage, low, high, p, status):
    return {"metric": metric, "advantage": advantage, "low": low, "high": high, "p": p, "status": status}


def _row(value, verdict, leak, tests, high=0.3):
    return {"value": value, "verdict": verdict, "leak_metrics": leak, "tests": tests, "advantage_high": high}


def _results(protocol="fedproto", sweep="protocol.k", rows=(), defenses=()):
    return {
        "protocol": protocol,
        "attack": "proto-membership",
        "sweep": sweep,
        "defenses": [{"name": d} for d in defenses],
        "points": [],
        "verdicts": [
            {
                "attack": "proto-membership",
                "metric": "auc",
                "sentence": "proto-membership (auc): protocol.k is not a defense strength; the attack leaks on tpr.",
                "rows": list(rows),
            }
        ],
    }


ROWS = [
    _row(
        2,
        "leaks",
        ["tpr"],
        {"tpr": _test("tpr", 0.2, 0.1, 0.3, 0.01, "leaks"), "auc": _test("auc", 0.1, 0.0, 0.2, 0.2, "n/s")},
    ),
    _row(
        30,
        "leaks",
        ["tpr"],
        {"tpr": _test("tpr", 0.9, 0.8, 0.95, 1e-6, "leaks"), "auc": _test("auc", 0.49, 0.45, 0.52, 1e-5, "leaks")},
    ),
    _row(10, "inconclusive", [], {"auc": _test("auc", 0.0, -0.1, 0.1, 0.9, "inconclusive")}),
]


def test_the_quoted_point_and_the_headline_metric_are_explained():
    results = _results(rows=ROWS)
    got = headlines.clauses(results["verdicts"][0], results)
    assert got == [
        "The point quoted is the leaking point with the smallest p-value (p < 0.001; 2 of 3 points leak); "
        "every point is in the report.",
        "The headline's metric auc at that point: advantage 0.490 [0.450, 0.520], leaks.",
    ]
    text = format_console(results)
    assert "smallest p-value" in text and max(len(line) for line in text.splitlines()) <= 100
    # nothing leaks: the largest upper bound is quoted, and said so
    calm = _results(rows=[_row(2, "inconclusive", [], {}, high=0.1), _row(5, "inconclusive", [], {}, high=0.4)])
    assert headlines.clauses(calm["verdicts"][0], calm) == [
        "The point quoted is the one with the largest upper bound of the advantage (2 points); every point "
        "is in the report."
    ]


def test_why_paillier_does_not_help_under_privmvmf():
    rows = [_row(1, "leaks", ["auc"], {"auc": _test("auc", 0.2, 0.1, 0.3, 0.001, "leaks")})]
    results = _results(protocol="privmvmf", sweep="sampling.rho", rows=rows, defenses=["sampling"])
    got = headlines.clauses(results["verdicts"][0], results)
    assert len(got) == 1 and got[0].startswith("Why paillier does not stop it here: the server decrypts the exact sum")
    # not when nothing leaks, and not for another protocol
    quiet = _results(protocol="privmvmf", sweep="sampling.rho", rows=[_row(1, "protected", [], {})])
    assert headlines.clauses(quiet["verdicts"][0], quiet) == []
    other = _results(protocol="fedmvmf", sweep="sampling.rho", rows=rows, defenses=["paillier"])
    assert headlines.clauses(other["verdicts"][0], other) == []


def test_audit_names_every_defense_its_matrix_reads_protected():
    audit = {
        "verdicts": [{"attack": "mvmf-analytic", "sentence": "mvmf-analytic (rating_accuracy): leaks undefended."}],
        "matrix": [
            {"attack": "mvmf-analytic", "defense": None, "verdict": "leaks"},
            {
                "attack": "mvmf-analytic",
                "defense": "dp-laplace",
                "verdict": "protected",
                "strength": "epsilon",
                "value": 0.3,
                "epsilon": 0.6,
            },
            {"attack": "mvmf-analytic", "defense": "laplace", "verdict": "leaks", "strength": "scale", "value": 4},
        ],
    }
    assert headlines.audit_clauses(audit) == [
        "mvmf-analytic vs dp-laplace: protected at dp-laplace.epsilon = 0.3; ε = 0.600."
    ]
    audit["verdicts"][0]["sentence"] += " dp-laplace protects at 0.3."  # named already: no clause
    assert headlines.audit_clauses(audit) == []


def test_fit_table_wraps_dotted_headers_and_cuts_text_before_numbers():
    from privaudit.reports.render import fit_table

    header = ["attack.aux_fraction", "relative_error", "prior", "advantage [bounds]", "verdict", "utility: rmse"]
    rows = [
        ["0.05", "0.059 ± 0.005", "0.094", "-0.011 [-0.015, -0.006]", "leaks (relative_error_unknown)", "1.045 ± 0.036"]
    ] * 3
    lines = fit_table(header, rows, width=100).splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0].startswith("attack.") and lines[1].startswith("aux_fraction")  # wrapped after the dot
    assert "-0.011 [-0.015, -0.006]" in lines[-1] and "1.045 ± 0.036" in lines[-1]  # numbers whole
    narrow = fit_table(header, rows, width=80).splitlines()
    assert max(len(line) for line in narrow) <= 80 and "…" in narrow[-1]

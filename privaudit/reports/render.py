"""Report rendering: printed table, ``results.json``, ``results.csv``, ``report.md``, ``report.html``.

Every output is produced from the results dict alone (the ``results.json`` schema,
``docs/results-schema.md``), so :func:`rerender` rebuilds a report folder from its
``results.json``. ``report.html`` is self-contained: figures are inline SVG, the style is
inline, and nothing refers to an external URL. Every table cell is text escaped when the page
is built (structured cells are built from data by :func:`html_cell`, never passed through as
HTML); ``report.md`` escapes Markdown and HTML. All files of a folder are first written under
temporary names and then renamed into place, ``results.json`` last.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privaudit import results as rs
from privaudit.errors import PrivauditError
from privaudit.report_schema import stamped
from privaudit.reports import figures
from privaudit.reports.files import (  # noqa: F401  (write_file_from, check_folder: re-exported for the recorders)
    MAX_METRICS,
    MAX_POINTS,
    Staged,
    check_folder,
    dumps_json,
    load_json,
    write_file_from,
    write_json,
    write_text_file,
)
from privaudit.reports.markup import (
    html_config,
    html_figure,
    html_glossary,
    html_page,
    html_table,
    html_verdicts,
    md_escape,
    md_table,
    plain_table,
)
from privaudit.results import fmt, fmt_pm, fmt_value, jsonable, num

RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PLAN_TOML = "plan.toml"


# ------------------------------------------------------------------------------ files


def read_results(path: Path) -> dict[str, Any]:
    """Load a ``results.json`` (a folder holding one, or the file); checks the schema keys."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_JSON
    if not path.is_file():
        raise PrivauditError(f"{path}: no such results file (run `privaudit attack ... --out DIR` first)")
    data = load_json(path, "results.json")
    if not isinstance(data, dict):
        raise PrivauditError(f"{path}: not a results.json (expected a JSON object)")
    missing = [k for k in ("protocol", "attack", "sweep", "points") if k not in data]
    if missing:
        raise PrivauditError(f"{path}: not a results.json (missing {', '.join(missing)})")
    if not isinstance(data["points"], list) or not all(isinstance(p, dict) for p in data["points"]):
        raise PrivauditError(f"{path}: 'points' must be a list of objects")
    if len(data["points"]) > MAX_POINTS:
        raise PrivauditError(f"{path}: {len(data['points'])} points, more than the limit of {MAX_POINTS}")
    for key in (
        "attack_metrics",
        "baseline",
        "baseline_random",
        "baseline_prior",
        "utility",
        "privacy",
        "roc",
        "empirical_epsilon",
        "advantage",
    ):
        if any(not isinstance(p.get(key, {}), dict) for p in data["points"]):
            raise PrivauditError(f"{path}: every point's {key!r} must be an object")
        most = max((len(p.get(key, {})) for p in data["points"]), default=0)
        if most > MAX_METRICS:
            raise PrivauditError(
                f"{path}: a point's {key!r} holds {most} entries, more than the limit of {MAX_METRICS}"
            )
    for key in ("verdicts", "summary", "reference", "defenses"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(x, dict) for x in data[key])):
            raise PrivauditError(f"{path}: {key!r} must be a list of objects")
    for key in ("metric_specs", "defense_strengths", "dataset", "protocol_config", "attack_params"):
        if key in data and not isinstance(data[key], dict):
            raise PrivauditError(f"{path}: {key!r} must be an object")
        if key in data and len(data[key]) > MAX_METRICS:
            raise PrivauditError(
                f"{path}: {key!r} holds {len(data[key])} entries, more than the limit of {MAX_METRICS}"
            )
    for key in ("verdicts", "summary", "defenses"):
        if len(data.get(key) or []) > MAX_POINTS:
            raise PrivauditError(f"{path}: {key!r} holds more than {MAX_POINTS} entries")
    return data


# ------------------------------------------------------------------------------ escaping


# ------------------------------------------------------------------------------ tables


def _summary_index(results: Mapping[str, Any]) -> tuple[list[Any], dict[tuple[str, str], tuple[float, float]]]:
    """(values in order, {(repr(value), metric): (mean, ci95)}) recomputed from the points."""
    summary = rs.summarize_points(results.get("points") or [])
    values: list[Any] = []
    index = {}
    for row in summary:
        v = row.get("value")
        if v not in values:
            values.append(v)
        index[(repr(v), row.get("metric"))] = (num(row.get("mean")), num(row.get("ci95")))
    if not values:
        for p in results.get("points") or []:
            if p.get("value") not in values:
                values.append(p.get("value"))
    return values, index


def _verdict_rows(results: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    verdicts = results.get("verdicts") or []
    rows = (verdicts[0].get("rows") if verdicts else None) or []
    return {repr(r.get("value")): r for r in rows if isinstance(r, Mapping)}


def table_rows(results: Mapping[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Header and rows of the summary table: value, each plotted metric (mean ± ci95) with its
    prior-only and random-guess baselines, the primary metric's advantage and verdict, the main
    utility, the one epsilon (total over the run) and its empirical lower bound, seeds."""
    values, index = _summary_index(results)
    metrics = figures.figure_metrics(results)
    utility = figures.utility_metric(results)
    has = lambda prefix, m: any((repr(v), prefix + m) in index for v in values)  # noqa: E731
    header = [_sweep_label(results)]
    for m in metrics:
        header.append(m)
        if has("prior.", m):
            header.append(f"{m}: prior")
        if has("baseline.", m):
            header.append(f"{m}: random")
    vrows = _verdict_rows(results)
    primary = (results.get("verdicts") or [{}])[0].get("metric") if results.get("verdicts") else None
    if vrows and primary:
        header += [f"advantage ({primary})", "verdict"]
    if utility:
        header.append(f"utility: {utility}")
    eps = any(
        "epsilon" in (v or {})
        for p in results.get("points") or []
        for v in (p.get("privacy") or {}).values()
        if isinstance(v, Mapping)
    )
    if eps:
        header += [
            rs.privacy_label([p.get("privacy") for p in results.get("points") or []]),
            "empirical ε (95 % lower bound)",
        ]
    header.append("seeds")
    counts: dict[str, int] = {}
    for p in results.get("points") or []:
        counts[repr(p.get("value"))] = counts.get(repr(p.get("value")), 0) + 1
    rows = []
    for v in values:
        key = repr(v)
        row: list[Any] = [fmt_value(v)]
        for m in metrics:
            row.append(fmt_pm(*index.get((key, m), (math.nan, math.nan))))
            if has("prior.", m):
                row.append(fmt(index.get((key, "prior." + m), (math.nan, math.nan))[0]))
            if has("baseline.", m):
                row.append(fmt(index.get((key, "baseline." + m), (math.nan, math.nan))[0]))
        if vrows and primary:
            vr = vrows.get(key, {})
            row.append(
                rs.fmt_advantage(vr.get("advantage"), vr.get("advantage_high"), vr.get("advantage_low"))
                if vr
                else "n/a"
            )
            verdict = rs.verdict_label(vr) if vr else "n/a"
            canary = rs.canary_text(vr.get("canary")) if vr else None
            verdict += f"; {canary}" if canary else ""
            row.append(verdict + (" (DP violation)" if vr.get("dp_violation") and "violation" not in verdict else ""))
        if utility:
            row.append(fmt_pm(*index.get((key, "utility." + utility), (math.nan, math.nan)), digits=4))
        if eps:
            vr = vrows.get(key, {})
            group = [p for p in results.get("points") or [] if repr(p.get("value")) == key]
            emp = rs.empirical_summary(group)
            row.append(fmt(emp["claimed"], 4) if math.isfinite(num(emp["claimed"])) else "-")
            lb = emp["epsilon_lb"]
            row.append("-" if math.isnan(num(lb)) else fmt(lb, 3) + (" VIOLATION" if emp["violation"] else ""))
        row.append(str(counts.get(key, 0)))
        rows.append(row)
    return header, rows


def _sweep_label(results: Mapping[str, Any]) -> str:
    sweep = results.get("sweep")
    if not sweep:
        return "value"
    target, _, param = str(sweep).partition(".")
    if target in ("attack", "protocol"):
        return str(sweep)
    return rs.strength_label(target, param, [p.get("privacy") for p in results.get("points") or []])


def roc_rows(results: Mapping[str, Any]) -> tuple[list[str], list[list[Any]]] | None:
    """AUC and TPR at 1 % and 0.1 % FPR per swept value and decision (seed means), or None."""
    points = results.get("points") or []
    names = rs.ordered_keys(points, "roc")
    if not names:
        return None
    header = [
        str(results.get("sweep") or "value"),
        "decision (positive)",
        "AUC",
        "TPR at 1 % FPR",
        "TPR at 0.1 % FPR",
        "positives / negatives",
    ]
    rows = []
    order: list[Any] = []
    for p in points:
        if p.get("value") not in order:
            order.append(p.get("value"))
    for v in order:
        group = [p for p in points if p.get("value") == v]
        for name in names:
            rocs = [(p.get("roc") or {}).get(name) for p in group]
            rocs = [r for r in rocs if isinstance(r, Mapping)]
            if not rocs:
                continue
            cells = [
                fmt_value(v),
                f"{name} ({rocs[0].get('positive', 'positive')})",
                fmt_pm(*rs.mean_ci95([r.get("auc") for r in rocs])),
            ]
            for f in ("0.01", "0.001"):
                vals = [num(r.get(f"tpr@{f}")) for r in rocs]
                ci = rocs[0].get(f"tpr@{f}_ci95") if len(rocs) == 1 else None
                if all(math.isnan(x) for x in vals):
                    cells.append(f"n/a: < {int(round(1 / float(f)))} negatives")
                elif isinstance(ci, list) and len(ci) == 2 and all(math.isfinite(num(c)) for c in ci):
                    cells.append(f"{rs.fmt(vals[0])} {rs.fmt_interval(num(ci[0]), num(ci[1]))}")  # one seed
                else:
                    cells.append(fmt_pm(*rs.mean_ci95(vals)))
            counts = [sorted({int(num(r.get(k))) for r in rocs}) for k in ("n_pos", "n_neg")]  # over seeds
            cells.append(" / ".join(str(c[0]) if len(c) == 1 else f"{c[0]}-{c[-1]}" for c in counts))
            rows.append(cells)
    return header, rows


def format_table(results: Mapping[str, Any]) -> str:
    """The verdict sentences and the summary table as aligned plain text (what the CLI prints)."""
    header, rows, same = _compact_columns(*table_rows(results))
    lines = []
    for v in results.get("verdicts") or []:  # the plain line first, the statistical detail beneath
        lines.append(f"verdict: {_plain(v.get('plain') or v.get('sentence', ''))}")
        lines += [f"  detail: {_plain(v['detail'])}"] if v.get("plain") and v.get("detail") else []
    lines.append(plain_table(header, rows, left=0))
    lines += [f"note: {dup} has the same values as {orig} at every point (column left out)" for dup, orig in same]
    roc = roc_rows(results)
    if roc:
        lines += ["", plain_table(*roc, left=2)]
    reasons = sorted({str(p.get("reason")) for p in results.get("points") or [] if p.get("reason")})
    for reason in reasons:
        lines.append(f"note: the attack did not apply ({_plain(reason)}); its metrics equal the baseline")
    return "\n".join(lines)


#: Columns of the terminal: every line the CLI prints before the report path fits this width.
CONSOLE_WIDTH = 100


def wrap_lines(text: Any, width: int = CONSOLE_WIDTH, first: str = "", indent: str = "  ") -> list[str]:
    """``text`` (one or more ``\n``-separated layers) wrapped at ``width`` columns: the first
    layer after ``first``, continuation lines and later layers (a verdict's statistics beneath
    its plain first line) indented by ``indent``. Long tokens are broken, so every line fits
    whatever the text."""
    import textwrap

    layers = [_plain(layer) for layer in str(text).split("\n")] or [""]
    out: list[str] = []
    for k, layer in enumerate(layers):
        if not layer.strip() and k:
            continue
        head = first if k == 0 else indent
        out += textwrap.wrap(
            layer.strip(),
            width=width,
            initial_indent=head,
            subsequent_indent=indent,
            break_on_hyphens=False,
        ) or [head.rstrip()]
    return out


def _explained(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The verdicts with :mod:`privaudit.reports.headlines`' clauses beneath each sentence (a
    second layer: which point is quoted and why, the headline's metric there, why a defense the
    protocol defeats does not help)."""
    from privaudit.reports import headlines

    return [
        {**v, "sentence": headlines.explained_sentence(v, results)}
        for v in results.get("verdicts") or []
        if isinstance(v, Mapping)
    ]


def verdict_lines(verdict: Mapping[str, Any], width: int = CONSOLE_WIDTH) -> list[str]:
    """A verdict for the terminal, all within ``width`` columns: ``verdict: `` and its plain
    first line (the ``plain`` entry of :func:`privaudit.results.verdict_lines`), the statistical
    ``detail`` beneath, then the sentence's further layers (the headline clauses after ``\n``).
    A verdict without a ``plain`` entry (results written before it) shows its sentence first."""
    sentence = str(verdict.get("sentence", ""))
    plain, detail = verdict.get("plain"), verdict.get("detail")
    has_detail = isinstance(detail, str) and bool(detail.strip())
    if not (isinstance(plain, str) and plain.strip()):
        text = sentence + ("\n" + detail if has_detail and detail.strip() not in sentence else "")
        return wrap_lines(text, width, first="verdict: ")
    out = wrap_lines(plain, width, first="verdict: ")
    if has_detail:
        out += wrap_lines(detail, width, first="  detail: ", indent="    ")
    clauses = sentence.partition("\n")[2]
    if clauses.strip():
        out += wrap_lines(clauses, width, first="  ", indent="    ")
    return out


def audit_sentence_lines(audit: Mapping[str, Any]) -> list[str]:
    """:func:`privaudit.reports.headlines.audit_clauses` as the lines the CLI prints after the
    audit matrix (``note: ...``, wrapped at 100 columns)."""
    from privaudit.reports import headlines

    return [line for c in headlines.audit_clauses(audit) for line in wrap_lines(c, first="note: ")]


def _short_verdict(row: Mapping[str, Any]) -> str:
    """A row's verdict in a few words: the label with its one leaking metric named, or the
    number of them, DP flags from the canary audit; the full label is in the report."""
    label = rs.verdict_label(row)
    if label.startswith("inconclusive ("):  # the reason is in the report
        label = "inconclusive"
    leak = list(row.get("leak_metrics") or [])
    if str(row.get("verdict")) == "leaks" and len(leak) > 1:
        label = f"leaks ({len(leak)} metrics)"
    canary = rs.canary_text(row.get("canary")) or ""
    if row.get("dp_violation") or canary.startswith("DP claim violated"):
        label += " DP-VIOLATED"
    elif canary.startswith("DP claim consistent"):
        label += " DP-ok"
    return label


def console_rows(results: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The terminal's decision table: the swept value, the attack's primary metric (seed mean ±
    ci95), its prior-only baseline, the advantage with its bounds, the verdict and the main
    utility. Every other column (further metrics, random guess, epsilon, seeds) is in the report."""
    values, index = _summary_index(results)
    verdicts = results.get("verdicts") or []
    metrics = figures.figure_metrics(results)
    primary = str(verdicts[0].get("metric")) if verdicts and verdicts[0].get("metric") else None
    primary = primary or (metrics[0] if metrics else None)
    utility = figures.utility_metric(results)
    vrows = _verdict_rows(results)
    has = lambda name: any((repr(v), name) in index for v in values)  # noqa: E731
    header = [_sweep_label(results)]
    if primary:
        header.append(primary)
    base = next((b for b in ("prior", "baseline") if primary and has(f"{b}.{primary}")), None)
    if base:
        header.append("prior" if base == "prior" else "random guess")
    if vrows:
        header += ["advantage [bounds]", "verdict"]
    if utility and has(f"utility.{utility}"):
        header.append(f"utility: {utility}")
    rows = []
    for v in values:
        key = repr(v)
        row = [fmt_value(v)]
        if primary:
            row.append(fmt_pm(*index.get((key, primary), (math.nan, math.nan))))
        if base:
            row.append(fmt(index.get((key, f"{base}.{primary}"), (math.nan, math.nan))[0]))
        if vrows:
            vr = vrows.get(key)
            row.append(
                rs.fmt_advantage(vr.get("advantage"), vr.get("advantage_high"), vr.get("advantage_low"))
                if vr
                else "n/a"
            )
            row.append(_short_verdict(vr) if vr else "n/a")
        if utility and has(f"utility.{utility}"):
            row.append(fmt_pm(*index.get((key, "utility." + utility), (math.nan, math.nan)), digits=3))
        rows.append(row)
    return header, rows


def _header_tokens(text: str) -> list[str]:
    """A header's pieces it may wrap between: words, and a dotted name after each dot
    (``attack.`` / ``aux_fraction``)."""
    return [t for word in text.split() for t in re.findall(r"[^.]+\.?|\.", word)]


def _wrap_header(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for token in _header_tokens(text):
        glue = "" if lines and lines[-1].endswith(".") else " "
        if lines and len(lines[-1]) + len(glue) + len(token) <= width:
            lines[-1] += glue + token
        else:
            lines.append(token)
    return lines or [""]


def _numeric(cells: Sequence[str]) -> bool:
    return all(not re.search(r"[A-Za-z]", c) for c in cells)


def fit_table(header: Sequence[Any], rows: Sequence[Sequence[Any]], width: int = CONSOLE_WIDTH, left: int = 1) -> str:
    """An aligned plain-text table no line of which is wider than ``width``: header names wrap
    over several lines (bottom-aligned; between words and after the dots of a dotted name) down
    to their column's widest cell, then the widest text columns, and only then numeric ones, are
    cut with "…" until the table fits (the report holds every cell in full)."""
    head = [_plain(h) for h in header]
    body = [[_plain(c) for c in r] for r in rows]
    n = len(head)
    cells = [max([len(r[j]) for r in body] + [1]) for j in range(n)]
    widths = [max(cells[j], len(head[j])) for j in range(n)]
    numeric = [_numeric([r[j] for r in body]) for j in range(n)]

    def total() -> int:
        return sum(widths) + 2 * (n - 1)

    # 1. header names over several lines, down to the column's cells (at least 6 columns wide)
    for j in sorted(range(n), key=lambda j: len(head[j]) - cells[j], reverse=True):
        if total() <= width:
            break
        widths[j] = max(cells[j], 6, max((len(t) for t in _header_tokens(head[j])), default=1))
    # 2. the widest text columns cut, then (if still needed) the widest numeric ones
    for numbers in (False, True):
        while total() > width:
            pool = [j for j in range(n) if numeric[j] == numbers and widths[j] > 6]
            if not pool:
                break
            j = max(pool, key=lambda j: widths[j])
            widths[j] = max(6, widths[j] - (total() - width))

    def cut(text: str, w: int) -> str:
        return text if len(text) <= w else text[: w - 1] + "…"

    wrapped = [_wrap_header(h, widths[j]) for j, h in enumerate(head)]
    depth = max(len(w) for w in wrapped)
    wrapped = [[""] * (depth - len(w)) + w for w in wrapped]
    just = lambda j, c: c.ljust(widths[j]) if j < left else c.rjust(widths[j])  # noqa: E731
    lines = ["  ".join(just(j, cut(wrapped[j][d], widths[j])) for j in range(n)).rstrip() for d in range(depth)]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(just(j, cut(r[j], widths[j])) for j in range(n)).rstrip() for r in body]
    return "\n".join(lines)


def format_console(results: Mapping[str, Any], width: int = CONSOLE_WIDTH, report: str | None = None) -> str:
    """What the CLI prints of an experiment, every line within ``width`` columns: the verdict
    sentences (wrapped, their detail layers indented beneath), the decision table
    (:func:`console_rows`), the ROC summary and notes; the full table is :func:`format_table`
    and ``report.md`` (``report``: the folder named in the pointer line)."""
    lines: list[str] = []
    for v in _explained(results):
        lines += verdict_lines(v, width)
    lines.append(fit_table(*console_rows(results), width=width, left=1))
    roc = roc_rows(results)
    if roc:
        lines += ["", fit_table(*roc, width=width, left=2)]
    reasons = sorted({str(p.get("reason")) for p in results.get("points") or [] if p.get("reason")})
    for reason in reasons:
        lines += wrap_lines(f"the attack did not apply ({reason}); its metrics equal the baseline", width, "note: ")
    header = console_rows(results)[0]
    shown = {h.partition(": ")[2] for h in header} | set(header)
    others = [m for m in figures.figure_metrics(results) if m not in shown]
    where = f"{report.rstrip('/')}/report.md" if report else "report.md"
    more = f"the other metrics ({', '.join(others)}), " if others else ""
    lines += wrap_lines(f"{more}the random guess, ε and seeds per point: the full table in {where}", width, "note: ")
    return "\n".join(lines)


def _compact_columns(
    header: list[str], rows: list[list[Any]]
) -> tuple[list[str], list[list[Any]], list[tuple[str, str]]]:
    """The console's narrower table: each metric's ``m: prior`` / ``m: random`` columns folded
    into its own cell (``1.000 (0.322 / 0.200)``), and a metric column whose values and prior
    baselines repeat an earlier metric's at every point left out (returned as (left out, kept)
    pairs)."""
    names: list[str] = []
    out_h: list[str] = []
    cols: list[list[Any]] = []
    keys: list[list[Any]] = []  # a metric column's values and prior-only baselines, compared for repeats
    folded: list[bool] = []
    i = 0
    while i < len(header):
        name, j = header[i], i + 1
        while j < len(header) and header[j].startswith(f"{name}: "):
            j += 1
        extras = [h[len(name) + 2 :] for h in header[i + 1 : j]]
        names.append(name)
        with_prior = "prior" in extras
        keys.append([(r[i], r[i + 1 + extras.index("prior")] if with_prior else None) for r in rows])
        if extras:
            out_h.append(f"{name} ({' / '.join(extras)})")
            cols.append([f"{r[i]} ({' / '.join(str(x) for x in r[i + 1 : j])})" for r in rows])
        else:
            out_h.append(name)
            cols.append([r[i] for r in rows])
        folded.append(bool(extras))
        i = j
    same: list[tuple[str, str]] = []
    keep = list(range(len(out_h)))
    for a in range(len(out_h)):
        for b in range(a):
            if folded[a] and folded[b] and b in keep and keys[a] == keys[b]:
                same.append((names[a], names[b]))
                keep.remove(a)
                break
    return [out_h[k] for k in keep], [[cols[k][r] for k in keep] for r in range(len(rows))], same


def _plain(text: Any) -> str:
    return "".join(c if c.isprintable() else " " for c in str(text))


# ------------------------------------------------------------------------------ glossary


#: Glossary entry of a metric its attack does not declare.
UNDECLARED_TERM = (
    "not declared by the attack: assumed higher = stronger attack; plotted when every value lies in [0, 1]."
)

#: Terms every report defines; ``{margin}`` and ``{no_power}`` are filled from the results.
FIXED_TERMS = (
    (
        "prior",
        "the prior-only baseline: the best guess of an attacker with the same prior knowledge but without "
        "the victims' messages, scored like the attack.",
    ),
    ("random", "the uniform random guess over each value's domain."),
    (
        "advantage",
        "attack metric minus the stronger of the prior and random baselines (in the metric's direction), "
        "with its bounds: a cluster bootstrap over victims pooled over seeds, Holm-corrected over the "
        "grid's points and metrics (family-wise 5 %).",
    ),
    (
        "verdict",
        "leaks: the lower bound is above 0 on some privacy metric (named when not the primary one); "
        "protected: every metric's upper bound is below the margin "
        "({margin} of the gap between the baseline and a perfect attack) and "
        "the attack leaks at a weaker strength or without defense; no evidence of leakage: under the "
        "margin without such a control ({no_power}); attack below prior: upper bound below 0 (never "
        "protection); inconclusive: neither, or no per-victim scores.",
    ),
)

#: Terms of runs whose points record a DP defense's privacy loss.
EPSILON_TERMS = (
    (
        "ε total over the run",
        "the privacy loss the DP defense claims over all rounds, from its "
        "accountant, for the unit named in the column header.",
    ),
    (
        "empirical ε",
        "95 % lower bound on ε from the attack's per-record true and false positives "
        "(Clopper-Pearson); above the claimed ε it is a DP violation.",
    ),
)

#: Term of runs whose points hold per-record decisions.
ROC_TERM = (
    "AUC, TPR at FPR",
    "area under the ROC curve of the attack's per-record decisions and its true "
    "positive rate at 1 % and 0.1 % false positives (n/a: too few negatives).",
)

#: What the swept value is: a noise scale, or by sweep target (else: a defense's parameter).
NOISE_UNIT = "scale b of the added noise, in the uploaded values' units (0 = no noise)"
SWEEP_UNITS = {
    "attack": "the attack parameter varied",
    "protocol": "the protocol setting varied",
}


def _metric_term(name: str, d: Any) -> tuple[str, str]:
    """Glossary entry of attack metric ``name`` from its recorded spec ``d``."""
    if not (d or {}).get("declared", False):
        return name, UNDECLARED_TERM
    spec = rs.spec_from_dict(d)
    text = (spec.description or "(no description declared)").rstrip(".") + "."
    if not spec.plotted and spec.unit in ("count", "seconds"):
        direction = "describes the run, not the attack's success"
    else:
        direction = "higher = stronger attack" if spec.higher_is_better else "lower = stronger attack"
    return name, f"{text} Unit: {spec.unit or 'none'}; {direction}."


def _strength_terms(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Entries of the swept value and of every other defense strength of the run."""
    items = []
    sweep = results.get("sweep")
    strengths = results.get("defense_strengths") or {}
    if sweep:
        target, _, param = str(sweep).partition(".")
        info = (strengths.get(target) if isinstance(strengths, Mapping) else None) or {}
        helptext = str(info.get("help") or "") if isinstance(info, Mapping) else ""
        unit = (
            NOISE_UNIT
            if results.get("noise")
            else SWEEP_UNITS.get(target, f"the {param} parameter of defense {target}")
        )
        items.append((str(sweep), unit + (f"; {helptext}" if helptext else "") + "."))
    for name, info in strengths.items() if isinstance(strengths, Mapping) else ():
        if not isinstance(info, Mapping) or not info.get("strength") or f"{name}.{info['strength']}" == sweep:
            continue
        text = str(info.get("help") or info.get("description") or "")
        items.append((f"{name}.{info['strength']}", f"strength of defense {name}: {text}".rstrip(": ") + "."))
    return items


def glossary(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(term, definition) of every metric shown, the baselines, the advantage, the verdicts,
    the swept strength's unit and the epsilons."""
    specs = results.get("metric_specs") or {}
    points = results.get("points") or []
    items = [_metric_term(m, specs.get(m)) for m in rs.ordered_keys(points, "attack_metrics")]
    utility = figures.utility_metric(results)
    if utility:
        spec = rs.utility_spec(utility, results.get("utility_specs"))
        better = "higher" if spec.higher_is_better else "lower"
        items.append((f"utility: {utility}", f"{spec.description} (the protocol's model quality; {better} is better)."))
    fill = {"margin": fmt_value(rs.verdict_margin(results)), "no_power": rs.NO_POWER}
    items += [(term, text.format(**fill)) for term, text in FIXED_TERMS]
    items += _strength_terms(results)
    if any(p.get("privacy") for p in points):
        items += EPSILON_TERMS
    if any(p.get("roc") for p in points):
        items.append(ROC_TERM)
    return items


# ------------------------------------------------------------------------------ CSV


def _flatten(point: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"value": point.get("value"), "seed": point.get("seed"), "seconds": point.get("seconds")}
    fields = (
        ("attack_metrics", "attack."),
        ("baseline_prior", "prior."),
        ("advantage", "advantage."),
        ("utility", "utility."),
    )
    for field_name, prefix in fields:
        for k, v in (point.get(field_name) or {}).items():
            row[prefix + k] = v
    for k, v in rs.point_random_baseline(point).items():
        row["random." + k] = v
    for name, spent in (point.get("privacy") or {}).items():
        for k, v in (spent or {}).items():
            row[f"privacy.{name}.{k}"] = v
    for name, roc in (point.get("roc") or {}).items():
        for k in ("auc", "tpr@0.01", "tpr@0.001"):
            row[f"roc.{name}.{k}"] = (roc or {}).get(k)
    for name, e in (point.get("empirical_epsilon") or {}).items():
        row[f"empirical_epsilon.{name}"] = (e or {}).get("epsilon_lb")
        row[f"dp_violation.{name}"] = (e or {}).get("violation")
    if point.get("reason"):
        row["reason"] = point["reason"]
    return row


#: First characters a spreadsheet may read as the start of a formula (OWASP's CSV injection list).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(results: Mapping[str, Any]) -> str:
    """One row per point: value, seed, seconds, ``attack.*``, ``prior.*``, ``random.*``,
    ``advantage.*``, ``utility.*``, privacy, ROC and empirical epsilon columns."""
    rows = [_flatten(p) for p in results.get("points") or []]
    columns: list[str] = []
    for r in rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        out = {}
        for k in columns:
            v = r.get(k)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                out[k] = ""
            elif isinstance(v, str):
                # no formula injection in spreadsheets; a CR (which the writer does not quote) shown as \r
                out[k] = ("'" + v if v[:1] in _FORMULA_START else v).replace("\r", "\\r")
            else:
                out[k] = v
        writer.writerow(out)
    return buf.getvalue()


def write_csv(results: Mapping[str, Any], path: Path) -> Path:
    """Write :func:`csv_text` to ``path``."""
    return write_text_file(path, csv_text(results))


# ------------------------------------------------------------------------------ Markdown


def _params(params: Mapping[str, Any] | None) -> str:
    if not params:
        return ""
    return "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"


def _config_items(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    target, _, param = str(results.get("sweep") or "").partition(".")
    swept = (target, param)
    defenses = results.get("defenses") or []
    items = [
        ("protocol", str(results.get("protocol"))),
        ("attack", str(results.get("attack")) + _params(results.get("attack_params"))),
        (
            "defenses",
            ", ".join(
                str(d.get("name", "?"))
                + _params({k: ("swept" if swept == (d.get("name"), k) else v) for k, v in d.items() if k != "name"})
                for d in defenses
                if isinstance(d, Mapping)
            )
            or "none",
        ),
        ("sweep", str(results.get("sweep") or "none (single point)")),
        (
            "seeds",
            ", ".join(
                str(s)
                for s in results.get("seeds") or sorted({p.get("seed") for p in results.get("points") or []}, key=str)
            ),
        ),
        ("dataset", ", ".join(f"{k}={v}" for k, v in (results.get("dataset") or {}).items())),
        ("privaudit", str(results.get("privaudit_version"))),
    ]
    return items


#: ``privaudit.defenses.paillier.MIN_KEY_LENGTH`` (the reports import no defense; a test keeps them equal).
MIN_KEY_BITS = 2048


def key_warnings(results: Mapping[str, Any]) -> list[str]:
    """One sentence per defense of the run whose key is below the secure minimum (Paillier)."""
    out = []
    for d in results.get("defenses") or []:
        bits = d.get("key_length") if isinstance(d, Mapping) else None
        if isinstance(bits, int) and not isinstance(bits, bool) and bits < MIN_KEY_BITS:
            out.append(
                f"{d.get('name')} ran with a {bits}-bit key, below {MIN_KEY_BITS} bits: breakable, "
                "for tests only (insecure_test_key); its secrecy claims do not hold."
            )
    return out


def render_markdown(results: Mapping[str, Any], figure_stem: str, extra_figures: Sequence[tuple[str, str]] = ()) -> str:
    """``report.md``: verdicts, configuration, tables, figures, glossary (all text escaped)."""
    header, rows = table_rows(results)
    lines = [f"# privaudit report: {md_escape(results.get('attack'))} against {md_escape(results.get('protocol'))}", ""]
    lines += [f"> **Warning.** {md_escape(w)}\n" for w in key_warnings(results)]
    for v in _explained(results):
        lines += [f"**Verdict.** {md_escape(v.get('sentence', ''))}", ""]
    lines += [f"- **{md_escape(k)}**: {md_escape(v)}" for k, v in _config_items(results)]
    lines += ["", "## Attack accuracy and utility", ""]
    lines.append(
        "Seed mean ± 95 % confidence half-width (Student t over seeds); prior: prior-only baseline; "
        "random: uniform random guess."
    )
    lines += ["", md_table(header, rows), ""]
    roc = roc_rows(results)
    if roc:
        lines += ["## Per-record decisions (ROC)", "", md_table(*roc), ""]
    lines += [f"![attack accuracy]({figure_stem}.svg)", "", f"(also as [{figure_stem}.png]({figure_stem}.png))", ""]
    for stem, caption in extra_figures:
        lines += [f"{md_escape(caption)}", "", f"![{md_escape(caption)}]({stem}.svg)", ""]
    reasons = sorted({str(p.get("reason")) for p in results.get("points") or [] if p.get("reason")})
    for reason in reasons:
        lines += [f"> The attack did not apply: {md_escape(reason)}. Its metrics equal the baseline.", ""]
    lines += ["## Glossary", ""]
    lines += [f"- **{md_escape(term)}**: {md_escape(text)}" for term, text in glossary(results)]
    config = jsonable(results.get("protocol_config") or {})
    lines += [
        "",
        "## Protocol configuration",
        "",
        md_table(["key", "value"], [[k, json.dumps(v)] for k, v in config.items()]),
        "",
    ]
    lines += [
        "Per-point numbers: `results.csv`; everything: `results.json` (`privaudit report DIR` re-renders this "
        "folder from it; `privaudit attack --config DIR/plan.toml` reruns it).",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ HTML


def render_html(
    results: Mapping[str, Any],
    svg_markup: str,
    figure_stem: str,
    privacy_svg: str | None = None,
    extra: Sequence[tuple[str, str, str]] = (),
) -> str:
    """``report.html`` from the results and the inline SVGs (``extra``: (svg, caption, id))."""
    header, rows = table_rows(results)
    title = f"privaudit report: {results.get('attack')} against {results.get('protocol')}"
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        *(f'<p class="note"><strong>Warning.</strong> {html.escape(w)}</p>' for w in key_warnings(results)),
        html_verdicts(_explained(results)),
        html_config(_config_items(results)),
    ]
    parts.append("<h2>Attack accuracy and utility</h2>")
    parts.append(
        "<p>Seed mean ± 95 % confidence half-width (Student t over seeds); prior: prior-only baseline; "
        "random: uniform random guess. Terms are defined in the glossary below.</p>"
    )
    parts.append(html_table(header, rows))
    reasons = sorted({str(p.get("reason")) for p in results.get("points") or [] if p.get("reason")})
    for reason in reasons:
        parts.append(
            f'<p class="note">The attack did not apply: {html.escape(reason)}. Its metrics equal the baseline.</p>'
        )
    parts.append(
        html_figure(
            svg_markup,
            "Attack metrics (lines with markers, 95 % bands over seeds) with the prior-only "
            "(dash-dot) and random-guess (dashed) baselines; utility on the right axis.",
            figure_stem,
        )
    )
    if privacy_svg:
        parts.append(
            html_figure(
                privacy_svg,
                "The same attack metrics and utility against the claimed total ε "
                "(mean over seeds; left = more private).",
                figures.privacy_figure_stem(results),
            )
        )
    roc = roc_rows(results)
    if roc:
        parts.append("<h2>Per-record decisions (ROC)</h2>")
        parts.append(html_table(*roc, left=2))
    for svg, caption, fig_id in extra:
        parts.append(html_figure(svg, caption, fig_id))
    parts.append("<h2>Glossary</h2>")
    parts.append(html_glossary(glossary(results)))
    parts.append("<h2>Per point</h2>")
    pts = results.get("points") or []
    keys = rs.ordered_keys(pts, "attack_metrics")
    main = figures.utility_metric(results)
    ukeys = [main] if main else []
    prow = []
    for p in pts:
        prow.append(
            [fmt_value(p.get("value")), str(p.get("seed"))]
            + [fmt((p.get("attack_metrics") or {}).get(k), 4) for k in keys]
            + [fmt((p.get("utility") or {}).get(k), 4) for k in ukeys]
            + [fmt(p.get("seconds"), 2)]
        )
    parts.append(html_table(["value", "seed"] + keys + [f"utility: {k}" for k in ukeys] + ["seconds"], prow, left=0))
    parts.append("<h2>Protocol configuration</h2>")
    parts.append("<pre>" + html.escape(json.dumps(jsonable(results.get("protocol_config") or {}), indent=2)) + "</pre>")
    parts.append(
        f"<p>Generated by privaudit {html.escape(str(results.get('privaudit_version')))}; "
        "<code>privaudit report DIR</code> re-renders this page from <code>results.json</code>.</p>"
    )
    return html_page(title, "\n".join(parts))


# ------------------------------------------------------------------------------ folder


def default_out_dir(results: Mapping[str, Any]) -> Path:
    """``privaudit-report/<protocol>-<sweep>/`` (``transcript`` or ``single`` without a sweep)."""
    sweep = results.get("sweep") or ("transcript" if results.get("transcript") else "single")
    name = re.sub(r"[^A-Za-z0-9_.@=-]+", "_", f"{results.get('protocol')}-{sweep}")
    return Path("privaudit-report") / name


def render_dir(results: Mapping[str, Any], out_dir: Path, staged: Staged | None = None) -> list[Path]:
    """Write CSV, figures (PNG + SVG), Markdown and HTML of ``results`` into ``out_dir``
    (staged under temporary names when ``staged`` is given, else renamed into place here)."""
    out_dir = Path(out_dir)
    own = staged is None
    staged = staged or Staged(out_dir)
    try:
        staged.text(RESULTS_CSV, csv_text(results))
        stem = figures.figure_stem(results)
        svg = figures.save_figure_staged(figures.make_figure(results), stem, staged)
        privacy_svg = None
        fig = figures.make_privacy_figure(results)
        if fig is not None:
            privacy_svg = figures.save_figure_staged(fig, figures.privacy_figure_stem(results), staged)
        extra, md_extra = [], []
        roc_fig = figures.make_roc_figure(results)
        if roc_fig is not None:
            roc_stem = "roc_" + re.sub(r"[^A-Za-z0-9_-]+", "_", str(results.get("attack")))
            caption = (
                f"ROC of {results.get('attack')}'s per-record decisions on log-log axes, one curve per "
                "swept value (first seed); the diagonal is chance."
            )
            extra.append((figures.save_figure_staged(roc_fig, roc_stem, staged), caption, roc_stem))
            md_extra.append((roc_stem, caption))
        staged.text(REPORT_MD, render_markdown(results, stem, md_extra))
        staged.text(REPORT_HTML, render_html(results, svg, stem, privacy_svg, extra))
        if own:
            return staged.commit()
        return [final for _, final in staged.items]
    except BaseException:
        if own:
            staged.discard()
        raise


def write_report(results: Mapping[str, Any], out_dir: Path | str | None = None, plan_toml: str | None = None) -> Path:
    """Write the whole report folder (figures, CSV, Markdown, HTML, ``plan.toml`` when given,
    ``results.json`` last), every file staged under a temporary name and renamed into place
    only once everything rendered; the folder."""
    out = Path(out_dir) if out_dir is not None else default_out_dir(results)
    check_folder(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrivauditError(f"{out}: cannot create the report folder ({exc.strerror or exc})") from None
    text = dumps_json(stamped(results, "results"))  # schema_version and privaudit_version first
    # render from the JSON round trip so that a later `privaudit report` is identical
    data = json.loads(text)
    staged = Staged(out)
    try:
        render_dir(data, out, staged)
        if plan_toml is not None:
            staged.text(PLAN_TOML, plan_toml)
        staged.text(RESULTS_JSON, text)
        staged.commit()
    except BaseException:
        staged.discard()
        raise
    return out


def rerender(out_dir: Path | str) -> Path:
    """Re-render a report folder from its ``results.json`` alone."""
    out = Path(out_dir)
    results = read_results(out)
    if "verdicts" not in results:  # a results.json written before the verdicts
        rs.add_advantages(results)
        results["verdicts"] = rs.experiment_verdicts(results)
    folder = out if out.is_dir() else out.parent
    try:
        render_dir(results, folder)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        # a hand-edited or hostile file with the right keys but wrong types: nothing is replaced
        raise PrivauditError(
            f"{folder / RESULTS_JSON}: not a valid results.json ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    return folder

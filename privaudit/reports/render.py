"""Report rendering: printed table, ``results.json``, ``results.csv``, ``report.md``, ``report.html``.

Every output is produced from the results dict alone (the ``results.json`` schema of
DESIGN.md), so :func:`rerender` rebuilds a report folder from its ``results.json``.
``report.html`` is self-contained: the figure is embedded as inline SVG, the style is inline,
and nothing refers to an external URL.
"""

from __future__ import annotations

import csv
import html
import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from privaudit import _safejson
from privaudit.errors import PrivauditError
from privaudit.reports import figures

RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"


# ------------------------------------------------------------------------------ JSON


def jsonable(obj: Any) -> Any:
    """``obj`` with NaN/inf -> None, numpy scalars/arrays -> Python, tuples -> lists."""
    import numpy as np

    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def write_json(data: Mapping[str, Any], path: Path) -> Path:
    """Write ``data`` as strict JSON (NaN -> null), keys in insertion order."""
    path = Path(path)
    path.write_text(json.dumps(jsonable(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def read_results(path: Path) -> dict[str, Any]:
    """Load a ``results.json`` (a folder holding one, or the file); checks the schema keys."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_JSON
    if not path.is_file():
        raise PrivauditError(f"{path}: no such results file (run `privaudit attack ... --out DIR` first)")
    try:  # bounded: size and nesting depth checked before parsing (no RecursionError on hostile files)
        data = _safejson.load_file(path, max_bytes=_safejson.RESULTS_MAX_BYTES)
    except _safejson.JSONLimitError as exc:
        raise PrivauditError(f"{path}: not a valid results.json ({exc})") from None
    if not isinstance(data, dict):
        raise PrivauditError(f"{path}: not a results.json (expected a JSON object)")
    missing = [k for k in ("protocol", "attack", "sweep", "points") if k not in data]
    if missing:
        raise PrivauditError(f"{path}: not a results.json (missing {', '.join(missing)})")
    if not isinstance(data["points"], list) or not all(isinstance(p, dict) for p in data["points"]):
        raise PrivauditError(f"{path}: 'points' must be a list of objects")
    return data


# ------------------------------------------------------------------------------ numbers


def _num(v: Any) -> float:
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def _fmt(x: Any, digits: int = 3) -> str:
    x = _num(x)
    if math.isnan(x):
        return "n/a"
    return f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.3g}"


def _pm(mean: Any, ci: Any, digits: int = 3) -> str:
    mean, ci = _num(mean), _num(ci)
    if math.isnan(mean):
        return "n/a"
    if math.isnan(ci) or ci == 0:
        return _fmt(mean, digits)
    return f"{_fmt(mean, digits)} ± {_fmt(ci, digits)}"


def _summary_index(results: Mapping[str, Any]) -> tuple[list[Any], dict[tuple[str, str], tuple[float, float]]]:
    """(values in order, {(repr(value), metric): (mean, ci95)}) from ``summary`` (or the points)."""
    summary = results.get("summary")
    if not summary:
        from privaudit.experiment import summarize_points

        summary = summarize_points(results.get("points") or [])
    values: list[Any] = []
    index = {}
    for row in summary:
        v = row.get("value")
        if v not in values:
            values.append(v)
        index[(repr(v), row.get("metric"))] = (_num(row.get("mean")), _num(row.get("ci95")))
    if not values:
        for p in results.get("points") or []:
            if p.get("value") not in values:
                values.append(p.get("value"))
    return values, index


def table_rows(results: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the summary table: value, each accuracy metric (mean ± ci95),
    its random-guess baseline, the main utility."""
    values, index = _summary_index(results)
    metrics = figures.figure_metrics(results)
    utility = figures.utility_metric(results)
    header = [str(results.get("sweep") or "value")]
    for m in metrics:
        header.append(m)
        if any((repr(v), "baseline." + m) in index for v in values):
            header.append(f"baseline {m}")
    if utility:
        header.append(f"utility {utility}")
    eps = figures.epsilon_series(results)
    if eps is not None:
        header.append(f"epsilon ({eps[0]})")
        eps_of = {repr(v): e for v, e in zip(eps[1], eps[2])}
    header.append("seeds")
    counts: dict[str, int] = {}
    for p in results.get("points") or []:
        counts[repr(p.get("value"))] = counts.get(repr(p.get("value")), 0) + 1
    rows = []
    for v in values:
        key = repr(v)
        row = [figures._fmt_value(v) if v is not None else "-"]
        for m in metrics:
            row.append(_pm(*index.get((key, m), (math.nan, math.nan))))
            if any((repr(w), "baseline." + m) in index for w in values):
                row.append(_fmt(index.get((key, "baseline." + m), (math.nan, math.nan))[0]))
        if utility:
            row.append(_pm(*index.get((key, "utility." + utility), (math.nan, math.nan)), digits=4))
        if eps is not None:
            row.append(f"{eps_of.get(key, math.nan):.4g}")
        row.append(str(counts.get(key, 0)))
        rows.append(row)
    return header, rows


def format_table(results: Mapping[str, Any]) -> str:
    """The summary table as aligned plain text (what the CLI prints)."""
    header, rows = table_rows(results)
    widths = [max(len(header[j]), *(len(r[j]) for r in rows)) if rows else len(header[j]) for j in range(len(header))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    reasons = sorted({p.get("reason") for p in results.get("points") or [] if p.get("reason")})
    for reason in reasons:
        lines.append(f"note: the attack did not apply ({reason}); its metrics equal the baseline")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ CSV


def _flatten(point: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"value": point.get("value"), "seed": point.get("seed"), "seconds": point.get("seconds")}
    for field, prefix in (("attack_metrics", "attack."), ("baseline", "baseline."), ("utility", "utility.")):
        for k, v in (point.get(field) or {}).items():
            row[prefix + k] = v
    for name, spent in (point.get("privacy") or {}).items():
        for k, v in (spent or {}).items():
            row[f"privacy.{name}.{k}"] = v
    if point.get("reason"):
        row["reason"] = point["reason"]
    return row


def write_csv(results: Mapping[str, Any], path: Path) -> Path:
    """One row per point: value, seed, seconds, ``attack.*``, ``baseline.*``, ``utility.*``."""
    rows = [_flatten(p) for p in results.get("points") or []]
    columns: list[str] = []
    for r in rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None or (isinstance(r.get(k), float) and math.isnan(r[k])) else r[k]) for k in columns})
    return Path(path)


# ------------------------------------------------------------------------------ Markdown


def _config_items(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    target, _, param = str(results.get("sweep") or "").partition(".")
    swept = (target, param)
    items = [
        ("protocol", str(results.get("protocol"))),
        ("attack", str(results.get("attack")) + _params(results.get("attack_params"))),
        ("defenses", ", ".join(d.get("name", "?") + _params({k: ("swept" if swept == (d.get("name"), k) else v) for k, v in d.items() if k != "name"}) for d in results.get("defenses") or []) or "none"),
        ("sweep", str(results.get("sweep") or "none (single point)")),
        ("seeds", ", ".join(str(s) for s in results.get("seeds") or sorted({p.get("seed") for p in results.get("points") or []}, key=str))),
        ("dataset", ", ".join(f"{k}={v}" for k, v in (results.get("dataset") or {}).items())),
        ("privaudit", str(results.get("privaudit_version"))),
    ]
    return items


def _params(params: Mapping[str, Any] | None) -> str:
    if not params:
        return ""
    return "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def render_markdown(results: Mapping[str, Any], figure_stem: str) -> str:
    header, rows = table_rows(results)
    lines = [f"# privaudit report: {results.get('attack')} against {results.get('protocol')}", ""]
    lines += [f"- **{k}**: {v}" for k, v in _config_items(results)]
    lines += ["", "## Attack accuracy and utility", ""]
    lines.append("Seed mean ± 95 % confidence half-width (Student t over seeds); baseline: uniform random guess.")
    lines += ["", _md_table(header, rows), ""]
    lines += [f"![attack accuracy]({figure_stem}.svg)", "", f"(also as [{figure_stem}.png]({figure_stem}.png))", ""]
    if figures.epsilon_series(results) is not None:
        eps_stem = figures.privacy_figure_stem(results)
        lines += ["Against the privacy cost (mean epsilon over seeds):", ""]
        lines += [f"![attack accuracy and utility vs epsilon]({eps_stem}.svg)", "", f"(also as [{eps_stem}.png]({eps_stem}.png))", ""]
    reasons = sorted({p.get("reason") for p in results.get("points") or [] if p.get("reason")})
    for reason in reasons:
        lines += [f"> The attack did not apply: {reason}. Its metrics equal the baseline.", ""]
    lines += ["## Protocol configuration", "", "```json", json.dumps(jsonable(results.get("protocol_config") or {}), indent=2), "```", ""]
    lines += ["Per-point numbers: `results.csv`; everything: `results.json` (`privaudit report DIR` re-renders this folder from it).", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ HTML

HTML_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em;display:block;overflow-x:auto;max-width:100%}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}
figure.pa-figure{margin:1em 0;display:block;max-width:820px}figure.pa-figure svg{width:100%;height:auto;display:block}
figcaption{font-size:.85em;color:#555}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.85em}
dl.cfg{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dl.cfg dt{font-weight:600}dl.cfg dd{margin:0}
.note{background:#fff6e0;border-left:4px solid #e0a000;padding:.4em .8em}
"""

#: Writes each figure's rendered size into data attributes (checked by the browser test).
HTML_SIZE_SCRIPT = """
(function(){function mark(){var figs=document.querySelectorAll('figure.pa-figure');
for(var i=0;i<figs.length;i++){var r=figs[i].getBoundingClientRect();var s=figs[i].querySelector('svg');
var rs=s?s.getBoundingClientRect():{width:0,height:0};figs[i].setAttribute('data-width',Math.round(r.width));
figs[i].setAttribute('data-height',Math.round(r.height));figs[i].setAttribute('data-svg-width',Math.round(rs.width));
figs[i].setAttribute('data-svg-height',Math.round(rs.height));}
document.body.setAttribute('data-figures',figs.length);document.body.setAttribute('data-rendered','1');}
if(document.readyState==='loading'){document.addEventListener('DOMContentLoaded',mark);}else{mark();}})();
"""


def html_page(title: str, body: str) -> str:
    """A self-contained HTML page (inline style and script, no external references)."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{HTML_STYLE}</style>\n</head>\n<body>\n"
        f"{body}\n<script>{HTML_SIZE_SCRIPT}</script>\n</body>\n</html>\n"
    )


def html_table(header: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1) -> str:
    def cell(tag: str, j: int, text: str) -> str:
        cls = ' class="l"' if j < left else ""
        return f"<{tag}{cls}>{text}</{tag}>"

    out = ["<table>", "<tr>" + "".join(cell("th", j, html.escape(str(h))) for j, h in enumerate(header)) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(cell("td", j, c if str(c).startswith("<") else html.escape(str(c))) for j, c in enumerate(r)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def html_figure(svg_markup: str, caption: str, fig_id: str) -> str:
    return (
        f'<figure class="pa-figure" id="{html.escape(fig_id)}">\n{svg_markup}\n'
        f"<figcaption>{html.escape(caption)}</figcaption>\n</figure>"
    )


def html_config(items: Sequence[tuple[str, str]]) -> str:
    return '<dl class="cfg">' + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items) + "</dl>"


def render_html(results: Mapping[str, Any], svg_markup: str, figure_stem: str, privacy_svg: str | None = None) -> str:
    header, rows = table_rows(results)
    title = f"privaudit report: {results.get('attack')} against {results.get('protocol')}"
    parts = [f"<h1>{html.escape(title)}</h1>", html_config(_config_items(results))]
    parts.append("<h2>Attack accuracy and utility</h2>")
    parts.append("<p>Seed mean ± 95 % confidence half-width (Student t over seeds); baseline: uniform random guess.</p>")
    parts.append(html_table(header, rows))
    reasons = sorted({p.get("reason") for p in results.get("points") or [] if p.get("reason")})
    for reason in reasons:
        parts.append(f'<p class="note">The attack did not apply: {html.escape(reason)}. Its metrics equal the baseline.</p>')
    parts.append(
        html_figure(
            svg_markup,
            "Attack accuracy (lines, 95 % bands over seeds) with the random-guess (dashed) and majority (dash-dot) "
            "baselines; utility on the right axis.",
            figure_stem,
        )
    )
    if privacy_svg:
        parts.append(
            html_figure(
                privacy_svg,
                "The same attack accuracy and utility against the privacy cost epsilon (mean over seeds; "
                "left = more private).",
                figures.privacy_figure_stem(results),
            )
        )
    parts.append("<h2>Per point</h2>")
    pts = results.get("points") or []
    keys = []
    for p in pts:
        for k in p.get("attack_metrics") or {}:
            if k not in keys:
                keys.append(k)
    main = figures.utility_metric(results)
    ukeys = [main] if main else []
    prow = []
    for p in pts:
        prow.append(
            [figures._fmt_value(p.get("value")) if p.get("value") is not None else "-", str(p.get("seed"))]
            + [_fmt((p.get("attack_metrics") or {}).get(k), 4) for k in keys]
            + [_fmt((p.get("utility") or {}).get(k), 4) for k in ukeys]
            + [_fmt(p.get("seconds"), 2)]
        )
    parts.append(html_table(["value", "seed"] + keys + [f"utility {k}" for k in ukeys] + ["seconds"], prow, left=0))
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
    return Path("privaudit-report") / f"{results.get('protocol')}-{sweep}"


def render_dir(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write CSV, figures (PNG + SVG), Markdown and HTML of ``results`` into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [write_csv(results, out_dir / RESULTS_CSV)]
    fig_paths = figures.write_figures(results, out_dir)
    written += fig_paths
    stem = figures.figure_stem(results)
    svg = figures.inline_svg(out_dir / f"{stem}.svg")
    eps_svg = out_dir / f"{figures.privacy_figure_stem(results)}.svg"
    privacy_svg = figures.inline_svg(eps_svg) if eps_svg in fig_paths else None
    (out_dir / REPORT_MD).write_text(render_markdown(results, stem), encoding="utf-8")
    (out_dir / REPORT_HTML).write_text(render_html(results, svg, stem, privacy_svg), encoding="utf-8")
    written += [out_dir / REPORT_MD, out_dir / REPORT_HTML]
    return written


def write_report(results: Mapping[str, Any], out_dir: Path | str | None = None) -> Path:
    """Write the whole report folder (``results.json`` first); the folder."""
    out = Path(out_dir) if out_dir is not None else default_out_dir(results)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrivauditError(f"{out}: cannot create the report folder ({exc.strerror or exc})") from None
    write_json(results, out / RESULTS_JSON)
    # render from the JSON round trip so that a later `privaudit report` is identical
    render_dir(read_results(out / RESULTS_JSON), out)
    return out


def rerender(out_dir: Path | str) -> Path:
    """Re-render a report folder from its ``results.json`` alone."""
    out = Path(out_dir)
    results = read_results(out)
    folder = out if out.is_dir() else out.parent
    render_dir(results, folder)
    return folder

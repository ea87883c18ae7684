"""Markup primitives of the reports: escaped Markdown, HTML and plain-text tables, structured
table cells, and the self-contained HTML page (inline style and script, no external URL)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def md_escape(text: Any) -> str:
    """Text safe inside a Markdown paragraph or table cell: HTML escaped (``<`` ``>`` ``&``),
    emphasis, code, link brackets and pipes backslash-escaped, newlines and control characters
    turned into spaces."""
    s = "".join(" " if (ord(c) < 32 or 127 <= ord(c) < 160) else c for c in str(text))
    s = html.escape(s, quote=False)
    return re.sub(r"([\\`*_\[\]|~])", r"\\\1", s)


def md_code_block(text: str, lang: str = "") -> str:
    """A fenced code block whose fence is longer than any backtick run in ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


@dataclass
class Cell:
    """A structured table cell: lines of text (each escaped when rendered), an optional
    background colour (``#rrggbb`` only) and a CSS class from a fixed set."""

    lines: list[tuple[str, str]] = field(default_factory=list)  # (text, style: "b", "small", "")
    background: str | None = None
    kind: str = ""

    def add(self, text: Any, style: str = "") -> Cell:
        self.lines.append((str(text), style))
        return self

    def plain(self) -> str:
        return " / ".join(t for t, _ in self.lines)


_SAFE_COLOUR = re.compile(r"^#[0-9a-fA-F]{6}$")


_CELL_KINDS = {"", "cell", "verdict-leaks", "verdict-protected", "verdict-not-adapted", "verdict-na", "violation"}


def html_cell(value: Any) -> str:
    """The escaped inner HTML of a table cell built from data (a string or a :class:`Cell`)."""
    if not isinstance(value, Cell):
        return html.escape(str(value))
    parts = []
    for text, style in value.lines:
        t = html.escape(text)
        parts.append(f"<b>{t}</b>" if style == "b" else (f"<small>{t}</small>" if style == "small" else t))
    inner = "<br>".join(parts)
    style = (
        f' style="background:{value.background}"' if value.background and _SAFE_COLOUR.match(value.background) else ""
    )
    kind = value.kind if value.kind in _CELL_KINDS else ""
    cls = f' class="{kind}"' if kind else ""
    return f"<div{cls}{style}>{inner}</div>" if (style or cls) else inner


def html_table(header: Sequence[Any], rows: Iterable[Sequence[Any]], left: int = 1, cls: str = "") -> str:
    """An HTML table; every header and cell escaped (:func:`html_cell`)."""

    def cell(tag: str, j: int, value: Any) -> str:
        c = ' class="l"' if j < left else ""
        return f"<{tag}{c}>{html_cell(value)}</{tag}>"

    klass = f' class="{html.escape(cls)}"' if cls else ""
    out = [f"<table{klass}>", "<tr>" + "".join(cell("th", j, h) for j, h in enumerate(header)) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(cell("td", j, c) for j, c in enumerate(r)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def md_table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table; every cell escaped (:func:`md_escape`)."""

    def text(v: Any) -> str:
        return md_escape(v.plain() if isinstance(v, Cell) else v)

    out = ["| " + " | ".join(text(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(text(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def plain_table(header: Sequence[Any], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """An aligned plain-text table (control characters removed)."""

    def text(v: Any) -> str:
        s = v.plain() if isinstance(v, Cell) else str(v)
        return "".join(c if c.isprintable() else " " for c in s)

    h = [text(x) for x in header]
    body = [[text(c) for c in r] for r in rows]
    widths = [max([len(h[j])] + [len(r[j]) for r in body]) for j in range(len(h))]
    just = lambda j, c, w: c.ljust(w) if j < left else c.rjust(w)  # noqa: E731
    lines = ["  ".join(just(j, c, w) for j, (c, w) in enumerate(zip(h, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(just(j, c, w) for j, (c, w) in enumerate(zip(r, widths))) for r in body]
    return "\n".join(lines)


HTML_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em;max-width:100%;table-layout:auto}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right;overflow-wrap:anywhere;word-break:break-word}
th{background:#f3f3f3}
td.l,th.l{text-align:left}
figure.pa-figure{margin:1em 0;display:block;max-width:820px}figure.pa-figure svg{width:100%;height:auto;display:block}
figcaption{font-size:.85em;color:#555}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.85em;white-space:pre-wrap;overflow-wrap:anywhere}
dl.cfg{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dl.cfg dt{font-weight:600}
dl.cfg dd{margin:0;overflow-wrap:anywhere}
.note{background:#fff6e0;border-left:4px solid #e0a000;padding:.4em .8em}
.verdict{background:#eef4ff;border-left:4px solid #3060c0;padding:.5em .9em;margin:.5em 0}
.verdict-not-adapted{background:repeating-linear-gradient(45deg,#fff3c4,#fff3c4 6px,#f4e3a0 6px,#f4e3a0 12px)}
.verdict-na{background:#eeeeee}.violation{outline:2px solid #b00000}
dl.glossary dt{font-weight:600;margin-top:.3em}dl.glossary dd{margin-left:1.2em}
"""


#: Writes each figure's rendered size and each table's width into data attributes (checked by
#: the browser test).
HTML_SIZE_SCRIPT = """
(function(){function mark(){var figs=document.querySelectorAll('figure.pa-figure');
for(var i=0;i<figs.length;i++){var r=figs[i].getBoundingClientRect();var s=figs[i].querySelector('svg');
var rs=s?s.getBoundingClientRect():{width:0,height:0};figs[i].setAttribute('data-width',Math.round(r.width));
figs[i].setAttribute('data-height',Math.round(r.height));figs[i].setAttribute('data-svg-width',Math.round(rs.width));
figs[i].setAttribute('data-svg-height',Math.round(rs.height));}
var tables=document.querySelectorAll('table');var wide=0;var page=document.body.clientWidth;
for(var j=0;j<tables.length;j++){var w=Math.ceil(tables[j].getBoundingClientRect().width);
tables[j].setAttribute('data-width',w);if(w>page||tables[j].scrollWidth>tables[j].clientWidth+1){wide++;}}
document.body.setAttribute('data-tables',tables.length);document.body.setAttribute('data-wide-tables',wide);
document.body.setAttribute('data-page-width',page);
document.body.setAttribute('data-figures',figs.length);document.body.setAttribute('data-rendered','1');}
if(document.readyState==='loading'){document.addEventListener('DOMContentLoaded',mark);}else{mark();}})();
"""


def html_page(title: str, body: str) -> str:
    """A self-contained HTML page (inline style and script, no external references)."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{HTML_STYLE}</style>\n</head>\n<body>\n"
        f"{body}\n<script>{HTML_SIZE_SCRIPT}</script>\n</body>\n</html>\n"
    )


def html_figure(svg_markup: str, caption: str, fig_id: str) -> str:
    """A figure around an SVG matplotlib drew (its text is drawn as paths; see figures.inline_svg)."""
    return (
        f'<figure class="pa-figure" id="{html.escape(fig_id)}">\n{svg_markup}\n'
        f"<figcaption>{html.escape(caption)}</figcaption>\n</figure>"
    )


def html_config(items: Sequence[tuple[str, str]]) -> str:
    return (
        '<dl class="cfg">' + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items) + "</dl>"
    )


def html_glossary(items: Sequence[tuple[str, str]]) -> str:
    return (
        '<dl class="glossary">'
        + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items)
        + "</dl>"
    )


def html_verdicts(verdicts: Sequence[Mapping[str, Any]]) -> str:
    return "".join(
        f'<p class="verdict"><b>Verdict.</b> {html.escape(str(v.get("sentence", "")))}</p>' for v in verdicts
    )

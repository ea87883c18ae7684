"""Audit rendering: ``audit.json`` and a self-contained ``audit.html`` (and the printed matrix),
built from the audit dict alone (:func:`privaudit.audit.run_audit`)."""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import results as rs
from privaudit._escape import printable
from privaudit.errors import PrivauditError
from privaudit.report_schema import stamped
from privaudit.reports import figures
from privaudit.reports.files import Staged, dumps_json
from privaudit.reports.markup import (
    Cell,
    html_config,
    html_figure,
    html_glossary,
    html_page,
    html_table,
    html_verdicts,
    plain_table,
)
from privaudit.results import fmt, fmt_value, num

AUDIT_JSON = "audit.json"
AUDIT_HTML = "audit.html"

__all__ = ["pair_figure", "roc_figure", "render_html", "format_matrix", "verdict_lines", "write_audit_report"]

#: Cell colours: amber to red for a leak (by advantage), green for protection, hatched pale
#: yellow for an attack below its prior (never green), grey when the attack does not apply.
_VERDICT_KIND = {
    "leaks": "cell",
    "protected": "cell",
    "inconclusive": "cell",
    "no evidence of leakage": "cell",
    "attack below prior": "verdict-not-adapted",
    "not applicable": "verdict-na",
}


def _colour(adv: float, verdict: str = "leaks") -> str:
    """Green for "protected"; amber (small advantage) to red (advantage >= 0.5) for "leaks"."""
    if adv is None or math.isnan(adv):
        return "#eeeeee"
    if verdict == "protected":
        return "#6cc47c"
    t = max(0.0, min(1.0, adv / 0.5))
    r = int(round(236 + t * (220 - 236)))
    g = int(round(176 - t * (176 - 60)))
    b = int(round(64 - t * (64 - 60)))
    return f"#{r:02x}{g:02x}{b:02x}"


def _svg_of(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(figures.RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    text = buf.getvalue()
    text = text[text.find("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    return re.sub(r"<!--.*?-->", "", text, flags=re.S).strip()  # labels repeated in comments


def pair_figure(audit: Mapping[str, Any], attack: str, defense: str):
    """Advantage-vs-strength figure of one (attack, defense) pair, utility on a second axis."""
    import matplotlib
    import matplotlib.ticker
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = [s for s in rs.audit_series(audit, attack, defense) if "mean" in s]
    none = rs.audit_series(audit, attack, None)
    d = next(x for x in audit["defenses"] if x["name"] == defense)
    values = [s["value"] for s in series]
    with matplotlib.rc_context(figures.RC):
        fig = Figure(figsize=(6.4, 3.8))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        x, scale, thresh = figures.x_axis(values)
        mean = np.array([num(s["mean"]) for s in series])
        ci = np.nan_to_num(np.array([num(s["ci95"]) for s in series]))
        metric = series[0]["metric"] if series else "metric"
        (h,) = ax.plot(x, mean, "-o", color="#1f77b4", ms=5, lw=1.6, zorder=4, label=f"{attack}: {metric}")
        handles = [h]
        ax.fill_between(x, mean - ci, mean + ci, color="#1f77b4", alpha=0.18, lw=0)
        for key, label, style, marker in (
            ("baseline_prior", "prior", "-.", "^"),
            ("baseline_random", "random", "--", "v"),
        ):
            base = np.array([num(s.get(key)) for s in series])
            if np.isfinite(base).any():
                (hb,) = ax.plot(x, base, ls=style, marker=marker, ms=3, color="#555555", lw=1.0, label=label)
                handles.append(hb)
        if none and not math.isnan(num(none[0].get("mean"))):
            hn = ax.axhline(num(none[0]["mean"]), color="#d62728", lw=0.9, ls=":", label="no defense")
            handles.append(hn)
        utility = series[0].get("utility_metric") if series else None
        if utility:
            ax2 = ax.twinx()
            u = np.array([num(s.get("utility")) for s in series])
            uc = np.nan_to_num(np.array([num(s.get("utility_ci95")) for s in series]))
            (hu,) = ax2.plot(x, u, ":s", color="black", ms=3, lw=1.2, label=f"utility: {utility} (right)")
            ax2.fill_between(x, u - uc, u + uc, color="black", alpha=0.08, lw=0)
            ax2.set_ylabel(f"utility: {utility}")
            handles.append(hu)
        if scale == "symlog":
            ax.set_xscale("symlog", linthresh=thresh, linscale=0.6)
        elif scale == "log":
            ax.set_xscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([fmt_value(v) for v in values])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel(_strength(audit, d))
        ax.set_ylabel(metric)
        finite = mean[np.isfinite(mean)]
        if finite.size == 0 or (finite.min() >= 0 and finite.max() <= 1):
            ax.set_ylim(-0.02, 1.05)
        ax.grid(True, alpha=0.3, lw=0.5)
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=7, frameon=False)
        ax.set_title(f"{attack} vs {defense} ({audit['protocol']})")
        fig.tight_layout()
    return fig


def roc_figure(audit: Mapping[str, Any], attack: str):
    """Log-log ROC of one attack's decisions, undefended and at each defense's strongest value."""
    points = []
    for dname in [None] + [d["name"] for d in audit.get("defenses") or []]:
        series = rs.audit_series(audit, attack, dname)
        if not series:
            continue
        row = series[0] if dname is None else series[-1]
        if row.get("roc"):
            points.append(
                {"value": "no defense" if dname is None else f"{dname}@{fmt_value(row['value'])}", "roc": row["roc"]}
            )
    if not points:
        return None
    return figures.make_roc_figure(
        {"attack": attack, "protocol": audit.get("protocol"), "sweep": "defense", "points": points}
    )


def _strength(audit: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    if not d.get("strength"):  # a defense without a grid (one cell, its defaults)
        return str(d["name"])
    return rs.strength_label(
        d["name"], d["strength"], [r.get("privacy") for r in audit.get("runs") or [] if r.get("defense") == d["name"]]
    )


def _cell(audit: Mapping[str, Any], cell: Mapping[str, Any] | None, defended: bool) -> Any:
    if cell is None:
        return "-"
    verdict = cell.get("verdict", "not applicable")
    adv = num(cell.get("advantage"))
    c = Cell(kind=_VERDICT_KIND.get(verdict, "cell"))
    c.add(rs.fmt_advantage(adv, cell.get("advantage_high"), cell.get("advantage_low")), "b")
    label = cell.get("verdict_label") or verdict
    c.add(f"{label}" + (f", vs {cell.get('against')}" if cell.get("against") else ""), "small")
    if verdict in ("leaks", "protected"):
        c.background = _colour(adv, verdict)
    if defended:
        c.add(f"utility cost {_cost(cell)}", "small")
        if cell.get("dp_statement"):
            c.add(str(cell["dp_statement"]), "b" if cell.get("dp_violation") else "small")
        else:
            canary = rs.canary_text(cell.get("canary"))
            if canary:
                c.add(canary, "b" if canary.startswith("DP claim violated") else "small")
        if cell.get("epsilon") is not None and math.isfinite(num(cell.get("epsilon"))):
            c.add(f"ε total {fmt(cell.get('epsilon'), 2)}", "small")
        if cell.get("epsilon_lb") is not None and math.isfinite(num(cell.get("epsilon_lb"))):
            c.add(f"empirical ε ≥ {fmt(cell.get('epsilon_lb'), 2)}", "small")
        if cell.get("dp_violation"):
            c.add("DP VIOLATION", "b")
            c.kind = "violation"
    if cell.get("errors"):
        c.add("error: " + "; ".join(cell["errors"])[:200], "small")
    return c


def _cost(cell: Mapping[str, Any]) -> str:
    """A cell's utility cost with its 95 % interval (paired bootstrap over users, or Student t over
    paired seeds) and its label ("within noise" only when the whole interval is within the margin)."""
    cost = fmt(cell.get("utility_cost"), 4)
    low, high = num(cell.get("utility_cost_low")), num(cell.get("utility_cost_high"))
    if not (math.isfinite(low) and math.isfinite(high)):
        return cost
    label = cell.get("utility_cost_label") or ("within noise" if cell.get("utility_cost_within_noise") else "")
    return f"{cost} [{fmt(low, 4)}, {fmt(high, 4)}]" + (f", {label}" if label else "")


def _glossary(audit: Mapping[str, Any]) -> list[tuple[str, str]]:
    items = []
    for a in audit.get("attacks") or []:
        spec = (a.get("metric_specs") or {}).get(a["primary_metric"]) or {}
        d = spec.get("description") or "(no description declared)"
        direction = "higher" if spec.get("higher_is_better", True) else "lower"
        items.append(
            (
                f"{a['name']}: {a['primary_metric']}",
                f"{d} Unit: {spec.get('unit') or 'none'}; {direction} = "
                f"stronger attack.{'' if spec.get('declared') else ' Not declared by the attack.'}",
            )
        )
    for d in audit.get("defenses") or []:
        if not d.get("strength"):
            items.append((str(d["name"]), "no strength (one cell, its defaults): " + str(d.get("description") or "")))
            continue
        items.append(
            (
                f"{d['name']}.{d['strength']}",
                f"strength of {d['name']} (grid {', '.join(fmt_value(v) for v in d['grid'])}, "
                "weakest first): " + str(d.get("description") or ""),
            )
        )
    utility = rs.audit_utility(audit)
    if utility:
        items.append((f"utility: {utility}", rs.utility_spec(utility, audit.get("utility_specs")).description + "."))
    items += [
        (
            "advantage",
            "attack metric minus the stronger of its prior-only and random-guess baselines (seed mean), "
            "with its bounds: a cluster bootstrap over victims, Holm-corrected over the attack's grid "
            "points and metrics (family-wise 5 %).",
        ),
        (
            "verdict",
            "leaks: the lower bound is above 0 on some privacy metric (named when not the primary one); "
            f"protected: every metric's upper bound is below the margin ({fmt_value(rs.verdict_margin(audit))} of the gap "
            "between the baseline and a perfect attack) and the attack leaks without defense or at a weaker "
            f"strength; no evidence of leakage: under the margin without such a control ({rs.NO_POWER}); "
            "attack below prior: upper bound below 0 (not protection, shown hatched); inconclusive: neither "
            "(also without per-victim scores); not applicable.",
        ),
        (
            "threat model",
            "honest-but-curious server: it follows the protocol and reads what it receives; malicious server: it "
            "deviates as the attack declares (its plan: sybils, inconsistent models, isolated decryptions), on runs "
            "of their own with the same seeds. The threat-model sentences name, per column, the verdict under each.",
        ),
        (
            "ε total",
            "the claimed privacy loss over the whole run (the DP defense's accountant), for the unit in the "
            "table header.",
        ),
        (
            "empirical ε",
            "95 % lower bound on ε from the attack's per-record decisions (Clopper-Pearson); above the "
            "claimed ε: DP violation.",
        ),
    ]
    return items


def render_html(audit: Mapping[str, Any]) -> str:
    """The self-contained ``audit.html`` (inline SVG figures, inline style, escaped cells)."""
    title = f"privaudit audit: {audit['protocol']}"
    threat = audit.get("threat_verdicts") or []
    parts = [
        f"<h1>{_esc(title)}</h1>",
        html_verdicts(threat),
        html_verdicts(audit.get("verdicts") or []),
        html_config(_config_rows(audit)),
        "<h2>What leaks: attack advantage by defense</h2>",
        _matrix_intro(audit),
        _matrix_table(audit),
    ]
    dp = _dp_rows(audit)
    if dp:
        parts.append("<h2>DP claims and canaries</h2>")
        parts.append(_DP_INTRO)
        parts.append(html_table(_DP_HEADER, dp))
    if threat:
        parts.append("<h2>Threat models</h2>")
        parts.append(html_table(["column", "honest-but-curious server", "malicious server"], _threat_rows(threat)))
    parts.append("<h2>Attack metric versus defense strength</h2>")
    figs = _pair_sections(audit) + _roc_sections(audit)
    parts += [html_figure(svg, caption, f"fig-{k}") + table for k, (svg, caption, table) in enumerate(figs)]
    parts.append("<h2>Glossary</h2>")
    parts.append(html_glossary(_glossary(audit)))
    parts.append("<h2>Configuration</h2>")
    parts.append("<pre>" + _esc(json.dumps(rs.jsonable(audit.get("protocol_config", {})), indent=2)) + "</pre>")
    parts.append("<h2>Dataset</h2>")
    parts.append(html_table(["key", "value"], [[str(k), str(v)] for k, v in (audit.get("dataset") or {}).items()]))
    parts.append("<h2>Timing</h2>")
    parts.append(_timing_table(audit))
    timing = audit.get("timing") or {}
    parts.append(
        f"<p>Generated by privaudit {_esc(str(audit.get('privaudit_version')))}; total "
        f"{fmt(timing.get('total_seconds'), 1)} s.</p>"
    )
    page = html_page(title, "\n".join(parts))
    return page.replace(
        "</style>", ".matrix td{vertical-align:top;padding:0}.matrix td>div,.matrix td{padding:.35em .5em}</style>", 1
    )


_DP_INTRO = (
    "<p>Every DP cell runs once more on a canary-augmented dataset (randomized canaries, one run: "
    "Steinke, Nasr and Jagielski, NeurIPS 2023). ε_lb is a 95 % lower bound on the mechanism's ε; above the "
    "accounted ε the DP claim is violated. A cell reads \u201cprotected\u201d only when its canaries are not all "
    "distinguished, ε_lb is at most the weak-privacy level and the attack is shown to have power there: it read "
    "every round the claim covers, or a planted-signal control (the same noise, planted canary users) shows "
    "it finds a planted leak above the margin; without that it reads “inconclusive (attack without power "
    "at this noise)”. Otherwise the reasons are listed. \u201ctested\u201d: the whole run against the accounted ε, or (when that "
    "is above what the canaries can show) the first round against the per-round ε.</p>"
)
_DP_HEADER = [
    "defense",
    "value",
    "tested",
    "claimed ε",
    "ε_lb (95 %)",
    "ceiling",
    "canaries",
    "guesses (correct)",
    "rounds read / claimed",
    "not counted as protection because",
]


def _dp_rows(audit: Mapping[str, Any]) -> list[list[str]]:
    """One row per DP cell with a canary audit (the cell's first seed)."""
    rows = []
    for r in audit.get("runs") or []:
        c = r.get("canary_audit")
        if not isinstance(c, Mapping):
            continue
        if "error" in c:
            rows.append(
                [str(r.get("defense")), fmt_value(r.get("value")), "-", "-", "-", "-", "-", "-", "-", c["error"]]
            )
            continue
        gate = r.get("dp_gate") or {}
        lb = fmt(c.get("epsilon_lb"), 2) + (" VIOLATED" if num(c.get("epsilon_lb")) > num(c.get("epsilon")) else "")
        read = f"{gate.get('rounds_read', '-')} / {gate.get('claim_rounds', '-')}"
        rows.append(
            [
                str(r.get("defense")),
                fmt_value(r.get("value")),
                str(c.get("tested", "run")),
                fmt(c.get("epsilon"), 2),
                lb,
                fmt(c.get("ceiling"), 2),
                str(c.get("canaries")),
                f"{c.get('guesses')} ({c.get('correct')})",
                read,
                "; ".join(gate.get("reasons") or []) or "-",
            ]
        )
    return rows


def _threat_of(a: Mapping[str, Any]) -> str:
    """How the report names an attack's threat model (with the malicious server's plan)."""
    if a.get("threat") != "malicious":
        return "honest-but-curious server"
    plan = ", ".join(f"{k}={v}" for k, v in (a.get("plan") or {}).items())
    return f"malicious server ({plan}; {a.get('deviation', 'deviation')})"


def _config_rows(audit: Mapping[str, Any]) -> list[tuple[str, str]]:
    ds = audit.get("dataset") or {}
    timing = audit.get("timing") or {}

    def params(a: Mapping[str, Any]) -> str:
        p = a.get("audit_params") or {}
        return " (" + ", ".join(f"{k}={v}" for k, v in p.items()) + ")" if p else ""

    grids = [
        f"{d['name']} ({d['strength']} in {', '.join(fmt_value(v) for v in d['grid'])})"
        if d.get("strength")
        else f"{d['name']} (no strength: one cell)"
        for d in audit["defenses"]
    ]
    skipped = [f"{s['name']} ({s['reason']})" for s in audit.get("skipped_defenses", [])]
    return [
        ("protocol", str(audit["protocol"])),
        ("dataset", ", ".join(f"{k}={v}" for k, v in ds.items())),
        ("seeds", ", ".join(str(s) for s in audit.get("seeds", []))),
        ("threat models", str(audit.get("threat", "honest-but-curious"))),
        ("attacks", ", ".join(a["name"] + params(a) for a in audit["attacks"])),
        ("defenses", ", ".join(grids) or "none"),
        ("not swept", ", ".join(skipped) or "none"),
        (
            "runs",
            f"{timing.get('runs', len(audit['runs']))} protocol runs, {fmt(timing.get('total_seconds'), 1)} s "
            f"({timing.get('backend', '')})",
        ),
        ("privaudit", str(audit.get("privaudit_version"))),
    ]


def _matrix_intro(audit: Mapping[str, Any]) -> str:
    utility = rs.audit_utility(audit)
    return (
        "<p>Each cell: advantage of the attack's primary metric over the stronger of its prior-only and random-guess "
        "baselines (seed mean; ≤ the upper 95 % bound) with no defense and at each defense's strongest grid value, "
        f"its verdict, the utility cost there ({_esc(str(utility))} lost), the claimed ε total over the run and the "
        "empirical ε lower bound. Green: protected; amber to red: leaks (red: advantage ≥ 0.5); hatched: attack not "
        "adapted (it scores below its baseline, which is not protection). A malicious server's attacks are evaluated "
        "on runs with their plan set (at least 5 seeds: one target per run).</p>"
    )


def _matrix_table(audit: Mapping[str, Any]) -> str:
    header = ["attack (metric)", "no defense"] + [_column(audit, d) for d in audit["defenses"]]
    rows = []
    for a in audit["attacks"]:
        first = Cell().add(a["name"]).add(a["primary_metric"], "small").add(_threat_of(a), "small")
        if not a.get("applies"):
            first.add(f"does not apply: {a.get('reason', '')}", "small")
        row: list[Any] = [first]
        for dname in [None] + [d["name"] for d in audit["defenses"]]:
            cell = next((c for c in audit["matrix"] if c["attack"] == a["name"] and c["defense"] == dname), None)
            row.append(_cell(audit, cell, dname is not None))
        rows.append(row)
    return html_table(header, rows, cls="matrix")


def _column(audit: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    """A matrix column's header: the defense's strength at its strongest value (or its name)."""
    if not d.get("strength"):
        return str(d["name"])
    return f"{_strength(audit, d)} = {fmt_value(d['grid'][-1])}"


def _threat_rows(threat: list[Mapping[str, Any]]) -> list[list[str]]:
    return [
        [str(v.get("column", "")), str(v.get("honest-but-curious", "-")), str(v.get("malicious", "-"))] for v in threat
    ]


def _pair_sections(audit: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(svg, caption, table) of every (attack, defense) pair with results."""
    # the DP gate's reading of each series row ("protected" only where the mechanism protects)
    gated = {(g["attack"], g["defense"], repr(g["value"])): g for g in audit.get("gated_rows") or []}

    utility = rs.audit_utility(audit)
    out = []
    for a in audit["attacks"]:
        for d in audit["defenses"]:
            series = [
                {**s, **gated.get((a["name"], d["name"], repr(s.get("value"))), {})}
                for s in rs.audit_series(audit, a["name"], d["name"])
                if "mean" in s
            ]
            if not series:
                continue
            caption = (
                f"{a['name']} against {d['name']}: {a['primary_metric']} (95 % band over seeds), prior (dash-dot) "
                "and random (dashed) baselines, undefended dotted red; utility on the right axis."
            )
            eps_head = rs.privacy_label([r.get("privacy") for r in audit["runs"] if r.get("defense") == d["name"]])
            header = [_strength(audit, d), a["primary_metric"], "prior", "random", "advantage", "verdict"]
            header += [f"utility: {utility}", eps_head, "empirical ε (95 % lower bound)"]
            table = html_table(header, [_series_row(s) for s in series])
            out.append((_svg_of(pair_figure(audit, a["name"], d["name"])), caption, table))
    return out


def _series_row(s: Mapping[str, Any]) -> list[str]:
    lb = num(s.get("epsilon_lb"))
    return [
        fmt_value(s["value"]),
        fmt(s["mean"]),
        fmt(s.get("baseline_prior")),
        fmt(s.get("baseline_random")),
        rs.fmt_advantage(s["advantage"], s.get("advantage_high"), s.get("advantage_low")),
        rs.verdict_label(s) + (f"; {rs.canary_text(s.get('canary'))}" if s.get("canary") else ""),
        fmt(s.get("utility"), 4),
        fmt(s.get("epsilon"), 2) if math.isfinite(num(s.get("epsilon"))) else "-",
        (fmt(lb, 2) + (" VIOLATION" if s.get("dp_violation") else "")) if math.isfinite(lb) else "-",
    ]


def _roc_sections(audit: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for a in audit["attacks"]:
        fig = roc_figure(audit, a["name"])
        if fig is not None:
            caption = (
                f"ROC of {a['name']}'s per-record decisions (log-log; first seed), "
                "undefended and at each defense's strongest value."
            )
            out.append((_svg_of(fig), caption, ""))
    return out


def _timing_table(audit: Mapping[str, Any]) -> str:
    rows = []
    for r in audit["runs"]:
        attacks = (r.get("attacks") or {}).values()
        secs = num(r.get("protocol_seconds")) + sum(
            num(s.get("seconds")) for s in attacks if isinstance(s, Mapping) and "seconds" in s
        )
        plan = ", ".join(f"{k}={v}" for k, v in (r.get("plan") or {}).items())
        rows.append(
            [
                str(r.get("defense") or "none"),
                fmt_value(r.get("value")),
                str(r.get("seed")),
                str(r.get("threat", "honest-but-curious")) + (f" ({plan})" if plan else ""),
                fmt(r.get("protocol_seconds"), 2),
                fmt(secs, 2),
            ]
        )
    return html_table(["defense", "value", "seed", "server", "protocol s", "protocol + attacks s"], rows)


def _esc(text: str) -> str:
    import html

    return html.escape(text)


#: the longest line an audit row prints in the terminal
ROW_CHARS = 100


def format_matrix(audit: Mapping[str, Any]) -> str:
    """The verdict sentences and the matrix as plain text (what the CLI prints)."""
    cols = ["no defense"] + [
        f"{d['name']}.{d['strength']}={fmt_value(d['grid'][-1])}" if d.get("strength") else str(d["name"])
        for d in audit["defenses"]
    ]
    header = ["attack (advantage, verdict)"] + cols
    rows = []
    for a in audit["attacks"]:
        mark = " [malicious]" if a.get("threat") == "malicious" else ""
        row = [a["name"] + mark + ("" if a.get("applies") else " (n/a)")]
        for dname in [None] + [d["name"] for d in audit["defenses"]]:
            cell = next((c for c in audit["matrix"] if c["attack"] == a["name"] and c["defense"] == dname), None)
            if cell is None:
                row.append("-")
            else:
                short = {
                    "leaks": "leaks",
                    "protected": "prot.",
                    "inconclusive": "inconcl.",
                    "no evidence of leakage": "no-power",
                    "attack below prior": "BELOW-PRIOR",
                    "not applicable": "n/a",
                }.get(cell.get("verdict"), "?")
                leak = cell.get("leak_metrics") or []
                if leak and cell.get("metric") not in leak:
                    short += f":{leak[0]}"
                canary = rs.canary_text(cell.get("canary")) or ""
                ok = canary.startswith("DP claim consistent") and not cell.get("dp_violation")
                row.append(
                    f"{fmt(cell.get('advantage'))} {short}"
                    + (" DP-VIOLATED" if cell.get("dp_violation") or canary.startswith("DP claim violated") else "")
                    + (" DP-ok" if ok else "")
                )
        rows.append(row)
    utility = rs.audit_utility(audit)
    urow = [f"utility cost ({utility})"]
    a0 = audit["attacks"][0]["name"] if audit["attacks"] else None
    for dname in [None] + [d["name"] for d in audit["defenses"]]:
        cell = next((c for c in audit["matrix"] if c["attack"] == a0 and c["defense"] == dname), None)
        noise = " (noise)" if cell is not None and cell.get("utility_cost_within_noise") else ""
        urow.append("-" if cell is None else fmt(cell.get("utility_cost"), 4) + noise)
    rows.append(urow)
    lines = [_short(f"threat: {printable(v.get('sentence', ''))}") for v in audit.get("threat_verdicts") or []]
    lines += [verdict_lines(audit, v)[0] for v in audit.get("verdicts") or []]
    lines += _column_groups(header, rows)
    lines.append("(statistical detail and canary audits: audit.html / audit.json)")
    return "\n".join(lines)


def _column_groups(header: list[str], rows: list[list[str]], width: int = ROW_CHARS) -> list[str]:
    """The matrix as one table, or, when wider than ``width``, as several tables of consecutive
    defense columns, each repeating the attack column (no cell is cut)."""

    def table(cols: list[int]) -> str:
        return plain_table([header[j] for j in cols], [[r[j] for j in cols] for r in rows], left=1)

    groups: list[list[int]] = []
    for j in range(1, len(header)):
        if groups and max(len(x) for x in table([0, *groups[-1], j]).splitlines()) <= width:
            groups[-1].append(j)
        else:
            groups.append([j])
    out: list[str] = []
    for k, cols in enumerate(groups or [[]]):
        out += ([""] if k else []) + table([0, *cols]).splitlines()
    return out


def _short(text: str, limit: int = ROW_CHARS) -> str:
    """``text`` on one line of at most ``limit`` characters (cut at a word, "…" when cut)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0].rstrip(",;:(")
    if len(cut) < limit // 2:  # one very long word: cut inside it
        cut = text[: limit - 1]
    return cut + "…"


def verdict_lines(audit: Mapping[str, Any], v: Mapping[str, Any]) -> tuple[str, str]:
    """(plain first line of at most :data:`ROW_CHARS` characters, the statistical detail) of one
    attack verdict of an audit: the terminal prints the first, the report both. The first line
    is the audit's own (:func:`_plain_verdict`: it names the attack and a violated DP claim
    first); the detail is the statistical layer of :func:`privaudit.results.verdict_lines`
    when the verdict carries one, else its sentence."""
    detail = v.get("detail") if isinstance(v.get("detail"), str) and v.get("detail") else v.get("sentence", "")
    return _short(printable("verdict: " + _plain_verdict(audit, v))), printable(str(detail))


def _plain_verdict(audit: Mapping[str, Any], v: Mapping[str, Any]) -> str:
    """An attack verdict in plain words from its fields (no interval, test or family names); a
    violated DP claim first, so that the cut to :data:`ROW_CHARS` never hides it."""
    name = f"{v.get('attack', '?')} ({v.get('metric', '?')})"
    cells = [c for c in audit.get("matrix") or [] if c.get("attack") == v.get("attack")]
    base = next((c for c in cells if c.get("defense") is None), {})
    violated = [str(c["defense"]) for c in cells if c.get("dp_violation")]
    lead = f"{name}: DP claim violated: {', '.join(violated)}; " if violated else f"{name}: "
    if base.get("verdict") == "not applicable":
        return lead + "does not apply here"
    if v.get("defense") is None and base.get("verdict") in ("attack below prior", "no evidence of leakage"):
        return lead + "finds nothing even without a defense, so it tests no defense"
    undefended = {
        "leaks": "leaks",
        "inconclusive": "inconclusive undefended",
    }.get(str(base.get("verdict")), f"undefended: {base.get('verdict', 'no result')}")
    if v.get("defense") is not None and v.get("strength") is not None:
        d = next((x for x in audit.get("defenses") or [] if x["name"] == v["defense"]), {})
        strength = f" at {d.get('strength')} {fmt_value(v['strength'])} or stronger" if d.get("strength") else ""
        cost = v.get("utility_cost")
        costs = (
            f", {v.get('utility_metric')} cost {fmt(cost, 3)}" if cost is not None and v.get("utility_metric") else ""
        )
        return lead + f"stopped by {v['defense']}{strength}{costs}"
    return lead + f"{undefended}; no tested defense is shown to stop it"


def write_audit_report(audit: Mapping[str, Any], out: Path, plan_toml: str | None = None) -> Path:
    """Write ``audit.json``, ``audit.html`` and (when given) ``plan.toml`` into ``out``, all
    staged under temporary names and renamed into place once everything rendered; the folder."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrivauditError(f"{out}: cannot create the report folder ({exc.strerror or exc})") from None
    text = dumps_json(stamped(audit, "audit"))  # schema_version and privaudit_version first
    staged = Staged(out)
    try:
        staged.text(AUDIT_HTML, render_html(json.loads(text)))
        if plan_toml is not None:
            staged.text("plan.toml", plan_toml)
        staged.text(AUDIT_JSON, text)
        staged.commit()
    except BaseException:
        staged.discard()
        raise
    return out

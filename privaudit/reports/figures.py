"""Accuracy-vs-strength figures (matplotlib, Agg canvas, no pyplot state, no network).

Everything is drawn from a results dict (the ``results.json`` schema) alone, so
``privaudit report DIR`` redraws identical figures. SVGs are deterministic: a fixed
``svg.hashsalt``, no date metadata, glyphs as paths.

Figure content (docs/results-schema.md):

- one panel per metric family (:func:`metric_panels`: the direction, higher or lower = stronger
  attack, and unit its spec declares), side by side, so a lower-is-better error never shares
  an axis with an accuracy; a metric repeating an earlier one's values is drawn once with both
  names;
- in a panel, one line per plotted attack metric (``results["figure_metrics"]``, from the
  attack's declared ``metric_specs``), the seed mean with a 95 % band (Student t over seeds),
  each with its own marker and line style; that metric's baselines in the same colour,
  dash-dotted (``prior``: the prior-only guess) and dashed (``random``: the uniform random
  guess), keyed once in the legend;
- the main utility metric on the last panel's second y axis (black, dotted, with error bars);
- x: the swept value; log-scale when positive values span more than a factor 20, as symlog
  with a linear piece below the smallest positive value when 0 is among them (so 0 shows).
  Non-numeric values are placed at equal spacing with their labels. A single point
  (no sweep) is drawn as bars with the baselines as dashed ticks;
- legends sit below the axes, outside the data; labels taken from a results file are drawn
  literally (no mathtext: ``text.parse_math`` is off), so log axes get plain tick labels
  ("0.001", "0.01", "1": :class:`PlainLogFormatter`, set by :func:`plain_tick_labels`) instead
  of matplotlib's mathtext ``$\\mathdefault{10^{-3}}$``;
- per attack with per-record decisions, a log-log ROC figure (:func:`make_roc_figure`).
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import results as rs
from privaudit.results import fmt_value, num

SVG_HASHSALT = "privaudit"
RC = {
    "svg.hashsalt": SVG_HASHSALT,
    "svg.fonttype": "path",
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "figure.dpi": 100.0,
    "savefig.dpi": 120.0,
    "text.parse_math": False,
}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_STYLES = ("-", "--", ":", "-.")
_PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)


@functools.cache
def _log_formatter_class():  # matplotlib is imported on first use only
    import matplotlib.ticker

    class PlainLogFormatter(matplotlib.ticker.LogFormatter):
        """matplotlib's log-axis formatter (same choice of labelled ticks) writing plain numbers:
        "0.001", "10", "1e-05"; never mathtext, which ``text.parse_math = False`` would show raw."""

        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}" if 1e-4 <= abs(x) < 1e5 else f"{x:.0e}"

    return PlainLogFormatter


def plain_tick_labels(fig) -> None:
    """Replace every log/symlog tick formatter of ``fig``'s axes (mathtext labels) by a
    :class:`PlainLogFormatter` with the same labelling rules. Called by the figure makers and
    again before saving; explicit tick labels (``set_xticklabels``) are left alone."""
    import matplotlib.ticker

    plain = _log_formatter_class()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            transform = axis.get_transform()
            base, linthresh = float(getattr(transform, "base", 10.0)), getattr(transform, "linthresh", None)
            for get, put in (
                (axis.get_major_formatter, axis.set_major_formatter),
                (axis.get_minor_formatter, axis.set_minor_formatter),
            ):
                old = get()
                if isinstance(old, matplotlib.ticker.LogFormatter) and not isinstance(old, plain):
                    put(
                        plain(
                            base=base,
                            labelOnlyBase=old.labelOnlyBase,
                            minor_thresholds=old.minor_thresholds,
                            linthresh=linthresh,
                        )
                    )


def figure_stem(results: Mapping[str, Any]) -> str:
    """File stem: ``accuracy_vs_noise`` for noise sweeps, ``accuracy_vs_<param>`` otherwise,
    ``accuracy`` for a single point."""
    sweep = results.get("sweep")
    if not sweep:
        return "accuracy"
    if results.get("noise"):
        return "accuracy_vs_noise"
    param = str(sweep).split(".", 1)[-1]
    return "accuracy_vs_" + re.sub(r"[^A-Za-z0-9_-]+", "_", param)


def _by_value(results: Mapping[str, Any], get) -> tuple[list[Any], dict[str, list[float]]]:
    """(sweep values in order of first appearance, {repr(value): [get(point) as float per seed]})."""
    order: list[Any] = []
    groups: dict[str, list[float]] = {}
    for p in results.get("points") or []:
        key = repr(p.get("value"))
        if key not in groups:
            groups[key] = []
            order.append(p.get("value"))
        groups[key].append(num(get(p)))
    return order, groups


def _series(results: Mapping[str, Any], field: str, metric: str) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """(values in sweep order, seed means, ci95 half-widths) of ``field``'s ``metric``."""
    from privaudit.metrics import mean_ci95

    order, groups = _by_value(results, lambda p: (p.get(field) or {}).get(metric))
    means, cis = [], []
    for v in order:
        vals = groups[repr(v)]
        if all(math.isnan(x) for x in vals):
            means.append(math.nan)
            cis.append(math.nan)
        else:
            m, c = mean_ci95(vals)
            means.append(m)
            cis.append(c)
    return order, np.asarray(means, dtype=float), np.asarray(cis, dtype=float)


def _has(results: Mapping[str, Any], field: str, metric: str) -> bool:
    return any(metric in (p.get(field) or {}) for p in results.get("points") or [])


def figure_metrics(results: Mapping[str, Any]) -> list[str]:
    """The accuracy metrics a report plots and tabulates: ``results["figure_metrics"]``, else
    every accuracy metric of the results."""
    metrics = results.get("figure_metrics")
    if metrics is None:
        metrics = rs.accuracy_metrics(results)
    return [str(m) for m in metrics]


def utility_metric(results: Mapping[str, Any]) -> str | None:
    """The utility metric a report shows: ``results["utility_metric"]``, else the main one."""
    if "utility_metric" in results:
        u = results.get("utility_metric")
        return None if u is None else str(u)
    return rs.main_utility(results)


def x_axis(values: Sequence[Any]) -> tuple[np.ndarray, str, float | None]:
    """x positions, scale ("linear", "log", "symlog", "category"), symlog threshold."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    if not numeric:
        return np.arange(len(values), dtype=float), "category", None
    x = np.asarray(values, dtype=float)
    pos = x[x > 0]
    if (x >= 0).all() and pos.size >= 2 and pos.max() / pos.min() > 20:
        if (x == 0).any():
            return x, "symlog", float(pos.min())
        return x, "log", None
    return x, "linear", None


def _title(results: Mapping[str, Any]) -> str:
    ds = results.get("dataset") or {}
    name = ds.get("name", "")
    users = ds.get("users")
    data = f"{name}, {users} users" if users is not None else str(name)
    return f"{results.get('attack')} vs {results.get('protocol')} ({data})"


def _same_series(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all((np.abs(a - b) <= 1e-9) | (np.isnan(a) & np.isnan(b))))


def metric_panels(results: Mapping[str, Any], metrics: Sequence[str]) -> tuple[list[list[str]], dict[str, str]]:
    """(panels, repeats): the plotted metrics grouped one family per panel, a family being the
    direction (higher or lower = stronger attack) and unit of the metric's spec, the primary
    metric's panel first; ``repeats`` maps a metric left out to the earlier metric whose seed
    means and baselines it repeats at every value (drawn once, labelled with both names)."""
    panels: dict[tuple[bool, str], list[str]] = {}
    repeats: dict[str, str] = {}
    drawn: list[tuple[str, list[np.ndarray]]] = []
    for metric in metrics:
        series = [_series(results, f, metric)[1] for f in ("attack_metrics", "baseline_prior", "baseline_random")]
        same = next((m for m, other in drawn if all(_same_series(x, y) for x, y in zip(series, other))), None)
        if same is not None:
            repeats[metric] = same
            continue
        drawn.append((metric, series))
        spec = rs.metric_spec(results, metric)
        panels.setdefault((bool(spec.higher_is_better), str(spec.unit)), []).append(metric)
    return list(panels.values()), repeats


def _label(metric: str, repeats: Mapping[str, str]) -> str:
    same = [m for m, orig in repeats.items() if orig == metric]
    return metric + (f" (= {', '.join(same)})" if same else "")


def _panel_ylabel(results: Mapping[str, Any], metrics: Sequence[str]) -> str:
    spec = rs.metric_spec(results, metrics[0]) if metrics else rs.FALLBACK_SPEC
    unit = "" if spec.unit in ("", "fraction") else f", {spec.unit}"
    return f"attack metric ({'higher' if spec.higher_is_better else 'lower'} = stronger attack{unit})"


def _unit_range(ax, results: Mapping[str, Any], metrics: Sequence[str], values: np.ndarray) -> None:
    """A fraction panel whose values all lie in [0, 1] gets the fixed 0..1 axis; others autoscale."""
    finite = values[np.isfinite(values)]
    fraction = all(rs.metric_spec(results, m).unit == "fraction" for m in metrics)
    if fraction and (finite.size == 0 or (finite.min() >= -1e-9 and finite.max() <= 1.0 + 1e-9)):
        ax.set_ylim(-0.02, 1.05)


def make_figure(results: Mapping[str, Any]):
    """The accuracy-vs-strength :class:`matplotlib.figure.Figure` of ``results``: one panel per
    metric family (:func:`metric_panels`), side by side; the utility on the last panel's right axis."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context(RC):
        metrics = figure_metrics(results)
        panels, repeats = metric_panels(results, metrics)
        panels = panels or [[]]
        fig = Figure(figsize=(max(7.2, 4.2 * len(panels)), 4.4))
        FigureCanvasAgg(fig)
        utility = utility_metric(results)
        colors = {m: _PALETTE[k % len(_PALETTE)] for k, m in enumerate(metrics)}
        for k, group in enumerate(panels):
            ax = fig.add_subplot(1, len(panels), k + 1)
            last = k == len(panels) - 1
            draw = _draw_sweep if results.get("sweep") else _draw_single
            draw(ax, results, group, utility if last else None, colors, repeats)
        if len(panels) == 1:
            fig.axes[0].set_title(_title(results))
        else:
            fig.suptitle(_title(results), fontsize=RC["axes.titlesize"])
        with warnings.catch_warnings():  # very long labels (from a results file): saved with a tight bbox anyway
            warnings.simplefilter("ignore", UserWarning)
            plain_tick_labels(fig)
            fig.tight_layout()
    return fig


def _baseline_series(results, metric: str) -> list[tuple[str, str, str]]:
    """(field, label, line style) of the baselines recorded for ``metric``."""
    out = []
    if _has(results, "baseline_prior", metric):
        out.append(("baseline_prior", "prior", "-."))
    if _has(results, "baseline_random", metric):
        out.append(("baseline_random", "random", "--"))
    elif _has(results, "baseline", metric):  # a results.json written before the prior baselines
        out.append(("baseline", "random", "--"))
    return out


def _legend_below(ax, handles, ncol: int = 2) -> None:
    """The legend under the axes (outside the data)."""
    if handles:
        ax.legend(
            handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, fontsize=7, frameon=False
        )


def _style_keys(styles: set[str]) -> list:
    """Legend entries for the baseline line styles (one each, grey: every metric's colour applies)."""
    from matplotlib.lines import Line2D

    names = {"-.": "its prior-only guess", "--": "its random guess"}
    return [Line2D([], [], ls=st, color="grey", lw=1.0, label=names[st]) for st in ("-.", "--") if st in styles]


def _draw_sweep(ax, results, metrics: list[str], utility: str | None, colors=None, repeats=None) -> None:
    import matplotlib.ticker

    colors = colors or {}
    repeats = repeats or {}
    values = None
    handles, styles = [], set()
    n = max(len(metrics), 1)
    for k, metric in enumerate(metrics):
        color = colors.get(metric, _PALETTE[k % len(_PALETTE)])
        values, mean, ci = _series(results, "attack_metrics", metric)
        x, scale, thresh = x_axis(values)
        (h,) = ax.plot(
            x,
            mean,
            marker=_MARKERS[k % len(_MARKERS)],
            ls=_STYLES[k % len(_STYLES)],
            color=color,
            ms=7 - 4 * k / n,
            lw=1.6,
            alpha=0.9,
            zorder=3 + k,
            label=_label(metric, repeats),
        )
        handles.append(h)
        band = np.nan_to_num(ci)
        ax.fill_between(x, mean - band, mean + band, color=color, alpha=0.15, lw=0)
        for field, what, style in _baseline_series(results, metric):
            _, bmean, _ = _series(results, field, metric)
            ax.plot(x, bmean, style, color=color, lw=1.0, alpha=0.8, label=f"{metric}: {what}")
            styles.add(style)
    handles += _style_keys(styles)
    if values is None:  # no accuracy metric: still lay out the x axis from the points
        values = []
        for p in results.get("points") or []:
            if p.get("value") not in values:
                values.append(p.get("value"))
    x, scale, thresh = x_axis(values)
    ax.set_xlabel(str(results.get("sweep")) + (" (noise scale)" if results.get("noise") else ""))
    ys = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()] or [np.zeros(1)])
    _unit_range(ax, results, metrics, ys)
    ax.set_ylabel(_panel_ylabel(results, metrics))
    ax.grid(True, alpha=0.3, lw=0.5)
    if utility and _has(results, "utility", utility):
        ax2 = ax.twinx()
        _, umean, uci = _series(results, "utility", utility)
        # error bars, not a band: a wide utility interval must not cover the attack's lines
        bars = ax2.errorbar(x, umean, yerr=np.nan_to_num(uci), fmt=":s", color="black", ms=3.5, lw=1.3, capsize=2)
        bars.lines[0].set_label(f"utility: {utility} (right axis)")
        ax2.set_ylabel(f"utility: {utility}")
        handles.append(bars.lines[0])
    # the twin shares the x axis: scale and ticks are set once, after it exists
    if scale == "symlog":
        ax.set_xscale("symlog", linthresh=thresh, linscale=0.6)
    elif scale == "log":
        ax.set_xscale("log")
    ax.set_xticks(x)
    step = -(-len(values) // 8)  # at most ~8 labels: the rest of the ticks stay unlabelled
    ax.set_xticklabels([fmt_value(v) if i % step == 0 else "" for i, v in enumerate(values)], rotation=0)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    _legend_below(ax, handles)


def _draw_single(ax, results, metrics: list[str], utility: str | None, colors=None, repeats=None) -> None:
    colors = colors or {}
    repeats = repeats or {}
    means, cis = [], []
    for metric in metrics:
        _, mean, ci = _series(results, "attack_metrics", metric)
        means.append(mean[0] if mean.size else math.nan)
        cis.append(ci[0] if ci.size else math.nan)
    x = np.arange(len(metrics), dtype=float)
    bar_colors = [colors.get(m, _PALETTE[k % len(_PALETTE)]) for k, m in enumerate(metrics)]
    ax.bar(x, np.nan_to_num(means), width=0.6, color=bar_colors, alpha=0.8, yerr=np.nan_to_num(cis), capsize=3)
    ticks = list(means)
    for k, metric in enumerate(metrics):
        for field, _what, style in _baseline_series(results, metric):
            _, bmean, _ = _series(results, field, metric)
            ax.plot([x[k] - 0.35, x[k] + 0.35], [bmean[0], bmean[0]], style, color="black", lw=1.2)
            ticks.append(bmean[0])
    ax.set_xticks(x)
    ax.set_xlim(-0.9, max(len(metrics) - 0.1, 0.9))
    ax.set_xticklabels([_label(m, repeats) for m in metrics], rotation=15, ha="right")
    _unit_range(ax, results, metrics, np.asarray(ticks, dtype=float))
    ax.set_ylabel(_panel_ylabel(results, metrics) + "\n(dash-dot: prior, dashed: random)")
    ax.grid(True, axis="y", alpha=0.3, lw=0.5)
    if utility and _has(results, "utility", utility):
        _, umean, _ = _series(results, "utility", utility)
        ax.text(
            0.99, 0.98, f"utility {utility} = {umean[0]:.4g}", transform=ax.transAxes, ha="right", va="top", fontsize=8
        )


def save_figure(fig, stem: Path) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg`` deterministically; the paths."""
    import matplotlib

    stem = Path(stem)
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    plain_tick_labels(fig)
    with matplotlib.rc_context(RC):
        fig.savefig(png, format="png", metadata={"Software": None}, bbox_inches="tight")
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    return [png, svg]


def save_figure_staged(fig, stem: str, staged) -> str:
    """Save ``stem.png``/``stem.svg`` through a :class:`~privaudit.reports.render.Staged`
    folder (temporary names); the inline ``<svg>`` markup."""
    import matplotlib

    png, svg = staged.path(stem + ".png"), staged.path(stem + ".svg")
    plain_tick_labels(fig)
    with matplotlib.rc_context(RC):
        fig.savefig(png, format="png", metadata={"Software": None}, bbox_inches="tight")
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    return inline_svg(svg)


def epsilon_series(results: Mapping[str, Any]) -> tuple[str, list[Any], np.ndarray] | None:
    """(defense, sweep values, mean epsilon per value) when the points record a privacy cost.

    A point's ``privacy`` maps a defense to ``{"epsilon", "delta", ...}`` (DP defenses and
    accountants); the mean is over seeds. None without a sweep or without finite epsilons at
    two or more values."""
    if not results.get("sweep"):
        return None
    names = [n for p in results.get("points") or [] for n in (p.get("privacy") or {})]
    if not names:
        return None
    name = names[0]
    order, groups = _by_value(
        results,
        lambda p: (
            ((p.get("privacy") or {}).get(name) or {}).get("epsilon")
            if isinstance((p.get("privacy") or {}).get(name), Mapping)
            else None
        ),
    )
    eps = np.asarray(
        [np.nanmean(groups[repr(v)]) if not all(math.isnan(x) for x in groups[repr(v)]) else math.nan for v in order]
    )
    if np.sum(np.isfinite(eps) & (eps > 0)) < 2:
        return None
    return name, order, eps


def privacy_figure_stem(results: Mapping[str, Any]) -> str:
    return figure_stem(results) + "_epsilon"


def make_privacy_figure(results: Mapping[str, Any]):
    """Attack accuracy and utility against the privacy cost epsilon (None without one).

    The accuracy figure redrawn with each sweep value replaced by its mean epsilon (log axis
    when it spans two decades), so the privacy-utility trade-off reads left (private) to right."""
    series = epsilon_series(results)
    if series is None:
        return None
    name, values, eps = series
    by_value = {repr(v): e for v, e in zip(values, eps)}
    keep = [
        p
        for p in results.get("points") or []
        if np.isfinite(by_value[repr(p.get("value"))]) and by_value[repr(p.get("value"))] > 0
    ]
    points = sorted(
        ({**p, "value": float(f"{by_value[repr(p.get('value'))]:.3g}")} for p in keep), key=lambda p: p["value"]
    )
    label = f"{name}: " + rs.privacy_label([p.get("privacy") for p in keep])
    return make_figure({**results, "points": points, "sweep": label, "noise": False, "summary": None})


def write_figures(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Draw the accuracy figure of ``results`` into ``out_dir`` and, when the points record a
    privacy cost, the accuracy-vs-epsilon figure; the written paths."""
    paths = save_figure(make_figure(results), Path(out_dir) / figure_stem(results))
    fig = make_privacy_figure(results)
    if fig is not None:
        paths += save_figure(fig, Path(out_dir) / privacy_figure_stem(results))
    return paths


def inline_svg(path: Path) -> str:
    """An SVG file's ``<svg>`` element for embedding in HTML (XML prolog, doctype and
    metadata stripped; nothing refers to external resources)."""
    text = Path(path).read_text(encoding="utf-8")
    start = text.find("<svg")
    text = text[start:] if start >= 0 else text
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # matplotlib repeats every label in an XML comment; labels may come from a shared results.json
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return text.strip()


def make_roc_figure(results: Mapping[str, Any]):
    """Log-log ROC curves of the attack's per-record decisions, one per swept value (the
    first seed's curve) and decision; None when the points record no ROC."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curves = []
    seen = set()
    for p in results.get("points") or []:
        for name, roc in (p.get("roc") or {}).items():
            key = (repr(p.get("value")), name)
            if key in seen or not isinstance(roc, Mapping):
                continue
            fpr = np.asarray(roc.get("fpr") or [], dtype=float)
            tpr = np.asarray(roc.get("tpr") or [], dtype=float)
            if fpr.size < 2 or fpr.shape != tpr.shape:
                continue
            seen.add(key)
            label = (
                name if not results.get("sweep") else f"{name}, {results.get('sweep')} = {fmt_value(p.get('value'))}"
            )
            curves.append((label + f" (AUC {rs.fmt(roc.get('auc'))})", fpr, tpr, num(roc.get("fpr_floor"))))
    if not curves:
        return None
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(6.4, 5.0))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        floor = min((c[3] for c in curves if math.isfinite(c[3]) and c[3] > 0), default=1e-3)
        lo = min(floor, 1e-3)
        handles = []
        for k, (label, fpr, tpr, _) in enumerate(curves):
            keep = (fpr > 0) & (tpr > 0)
            (h,) = ax.plot(
                np.clip(fpr[keep], lo, 1),
                np.clip(tpr[keep], lo, 1),
                ls=_STYLES[k % len(_STYLES)],
                marker=_MARKERS[k % len(_MARKERS)],
                markevery=0.2,
                ms=4,
                lw=1.3,
                color=_PALETTE[k % len(_PALETTE)],
                label=label,
            )
            handles.append(h)
        (hc,) = ax.plot([lo, 1], [lo, 1], color="grey", lw=0.8, ls=":", label="chance")
        handles.append(hc)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, 1.02)
        ax.set_ylim(lo, 1.02)
        for f in (0.01, 0.001):
            if f >= lo:
                ax.axvline(f, color="#bbbbbb", lw=0.6)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.grid(True, which="major", alpha=0.3, lw=0.5)
        ax.set_title(f"ROC: {results.get('attack')} ({results.get('protocol')})")
        _legend_below(ax, handles, ncol=1)  # saved with bbox_inches="tight": the legend is kept
        plain_tick_labels(fig)
    return fig

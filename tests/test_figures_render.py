"""Every figure kind the package draws, rendered with the installed matplotlib: the text a reader
sees (titles, axis labels, tick labels, legends) is plain (no ``$``, no ``mathdefault``: the
figures draw with ``text.parse_math`` off, so mathtext would show raw), and no two tick labels of
an axis overlap (their bounding boxes from the renderer)."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("matplotlib")

from matplotlib.text import Text  # noqa: E402

from privaudit import audit as au  # noqa: E402
from privaudit import experiment as ex  # noqa: E402
from privaudit.plan import parse_sweep  # noqa: E402
from privaudit.reports import audit as report_audit  # noqa: E402
from privaudit.reports import figures  # noqa: E402
from tests.dummies import tiny_dataset  # noqa: E402


@pytest.fixture(scope="module")
def drawn():
    """(kind, Figure) for each figure kind: accuracy vs strength (noise sweep, categorical sweep,
    single point), utility/accuracy vs epsilon, ROC, and the audit's pair and ROC figures."""
    from privaudit import registry
    from tests.dummies import DUMMIES

    registry.available("protocol")
    for (kind, name), cls in DUMMIES.items():
        registry._register(kind, name)(cls)
    try:
        ds = tiny_dataset(24)
        sweep = ex.build_experiment(
            protocol="dummy-proto", noise="dummy-noise", scales=(0, 0.01, 0.1, 1, 10), seeds=2
        ).run(ds)
        single = ex.build_experiment(protocol="dummy-proto", seeds=2).run(ds)
        category = ex.build_experiment(protocol="dummy-proto", sweep=parse_sweep("protocol.rounds=1,2,3"), seeds=1).run(
            ds
        )
        audit = au.run_audit(
            au.Audit("dummy-proto", seeds=2, defenses=["dummy-noise", "dp-laplace"], jobs=1), dataset=ds
        )
    finally:
        for kind, name in DUMMIES:
            registry.unregister(kind, name)
    out = [
        ("accuracy-vs-strength", figures.make_figure(sweep)),
        ("accuracy-single-point", figures.make_figure(single)),
        ("accuracy-vs-rounds", figures.make_figure(category)),
        ("utility-vs-epsilon", figures.make_privacy_figure(sweep)),
        ("roc", figures.make_roc_figure(sweep)),
        ("audit-roc", report_audit.roc_figure(audit, audit["attacks"][0]["name"])),
    ]
    for d in audit["defenses"]:
        out.append((f"audit-{d['name']}", report_audit.pair_figure(audit, audit["attacks"][0]["name"], d["name"])))
    assert all(fig is not None for _, fig in out), [k for k, f in out if f is None]
    return out


def _texts(fig):
    fig.canvas.draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_every_figure_kind_draws_plain_text(drawn):
    seen = 0
    for kind, fig in drawn:
        for t in _texts(fig):
            text = t.get_text()
            assert "$" not in text and "mathdefault" not in text, (kind, text)
            seen += 1
    assert seen > 40  # titles, labels, ticks and legends were looked at


def _tick_boxes(fig, ax, axis):
    """Window extents of the tick labels the renderer draws inside the axes' span."""
    renderer = fig.canvas.get_renderer()
    span = ax.get_window_extent(renderer)
    lo, hi = (span.x0, span.x1) if axis is ax.xaxis else (span.y0, span.y1)
    boxes = []
    for t in axis.get_ticklabels(which="both"):
        if not (t.get_visible() and t.get_text().strip()):
            continue
        box = t.get_window_extent(renderer)
        mid = (box.x0 + box.x1) / 2 if axis is ax.xaxis else (box.y0 + box.y1) / 2
        if lo - 1 <= mid <= hi + 1:
            boxes.append((t.get_text(), box))
    return boxes


def _overlapping(boxes):
    """Pairs of tick labels whose boxes overlap by more than half a pixel both ways."""
    out = []
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        if min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5 and min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5:
            out.append((ta, tb))
    return out


def test_no_two_tick_labels_overlap(drawn):
    checked = 0
    for kind, fig in drawn:
        fig.canvas.draw()
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                boxes = _tick_boxes(fig, ax, axis)
                assert not _overlapping(boxes), (kind, _overlapping(boxes))
                checked += len(boxes) >= 2
    assert checked >= 2 * len(drawn)


def test_the_overlap_check_sees_crowded_labels():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xticks(range(12), [f"label {k:02d}" for k in range(12)])
    fig.canvas.draw()
    assert len(_overlapping(_tick_boxes(fig, ax, ax.xaxis))) >= 10


def test_log_axes_have_decade_labels(drawn):
    """The ROC's log axes are labelled 0.001 ... 1 (plain numbers), both of them."""
    fig = dict(drawn)["roc"]
    fig.canvas.draw()
    ax = fig.axes[0]
    for axis in (ax.xaxis, ax.yaxis):
        labels = [text for text, _ in _tick_boxes(fig, ax, axis)]
        assert {"0.01", "0.1", "1"} <= set(labels), labels

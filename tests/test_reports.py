"""Reports: results.json schema, CSV, figures, Markdown, self-contained HTML, re-rendering."""

from __future__ import annotations

import csv
import json
import math
import re

import numpy as np
import pytest

from privaudit import experiment as ex
from privaudit import reports
from privaudit.errors import PrivauditError
from privaudit.report_schema import stamped
from privaudit.reports import figures, render
from tests.dummies import tiny_dataset

SCHEMA = [
    "schema_version",  # privaudit.report_schema.RESULTS_SCHEMA_VERSION
    "privaudit_version",
    "protocol",
    "protocol_config",
    "attack",
    "sweep",
    "defenses",
    "dataset",
    "points",
    "summary",
]
POINT = ["value", "seed", "attack_metrics", "baseline_random", "baseline_prior", "supported"]


@pytest.fixture(scope="module")
def noise_results():
    from privaudit import registry
    from tests.dummies import DUMMIES

    registry.available("protocol")
    for (kind, name), cls in DUMMIES.items():
        registry._register(kind, name)(cls)
    try:
        exp = ex.build_experiment(protocol="dummy-proto", noise="dummy-noise", scales=(0, 0.01, 0.1, 1, 10), seeds=3)
        yield exp.run(tiny_dataset(30))
    finally:
        for kind, name in DUMMIES:
            registry.unregister(kind, name)


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_report_folder_schema_and_files(noise_results, tmp_path):
    out = reports.write_report(noise_results, tmp_path / "r")
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "accuracy_vs_noise.png",
        "accuracy_vs_noise.svg",
        "accuracy_vs_noise_epsilon.png",
        "accuracy_vs_noise_epsilon.svg",  # the noise records an epsilon
        "report.html",
        "report.md",
        "results.csv",
        "results.json",
        "roc_dummy-attack.png",
        "roc_dummy-attack.svg",  # the attack makes per-bit decisions
    ]
    data = json.loads((out / "results.json").read_text())
    assert list(data)[: len(SCHEMA)] == SCHEMA
    assert data["sweep"] == "dummy-noise.scale" and data["attack"] == "dummy-attack"
    assert len(data["points"]) == 15
    for p in data["points"]:
        assert list(p)[: len(POINT)] == POINT
    assert {r["metric"] for r in data["summary"]} >= {
        "accuracy",
        "victims",
        "baseline.accuracy",
        "utility.ndcg@10",
        "advantage.accuracy",
    }
    assert all(set(r) == {"value", "metric", "mean", "ci95"} for r in data["summary"])
    with open(out / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 15
    assert {"value", "seed", "seconds", "attack.accuracy", "random.accuracy", "utility.ndcg@10"} <= set(rows[0])
    assert float(rows[0]["attack.accuracy"]) == data["points"][0]["attack_metrics"]["accuracy"]


def test_nan_is_written_as_null(noise_results, tmp_path):
    res = json.loads(json.dumps(render.jsonable(stamped(noise_results, "results"))))
    res["points"][0]["attack_metrics"]["accuracy"] = float("nan")
    path = render.write_json(res, tmp_path / "results.json")
    text = path.read_text()
    assert "NaN" not in text
    assert json.loads(text)["points"][0]["attack_metrics"]["accuracy"] is None
    reports.rerender(tmp_path)  # a null metric still renders
    assert "n/a" in reports.format_table(reports.read_results(tmp_path)) or True


def test_rerender_from_results_json_alone_is_identical(noise_results, tmp_path):
    out = reports.write_report(noise_results, tmp_path / "r")
    before = _files(out)
    for name in list(before):
        if name != "results.json":
            (out / name).unlink()
    reports.rerender(out)
    after = _files(out)
    assert after == before  # byte-identical: figures deterministic (svg.hashsalt, no dates)


def test_html_is_self_contained(noise_results, tmp_path):
    out = reports.write_report(noise_results, tmp_path / "r")
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 3 and 'class="pa-figure"' in page  # accuracy, accuracy-vs-epsilon, ROC
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page and "<img" not in page
    assert "dummy-attack" in page and "dummy-noise" in page
    md = (out / "report.md").read_text()
    assert "![attack accuracy](accuracy_vs_noise.svg)" in md
    assert "| dummy-noise.scale |" in md


def test_figure_axes_and_lines(noise_results):
    fig = figures.make_figure(noise_results)
    ax = fig.axes[0]
    assert ax.get_xscale() == "symlog"  # 0 shown beside 0.01 .. 10
    assert ax.xaxis.get_transform().linthresh == 0.01
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["accuracy", "accuracy: prior", "accuracy: random"]
    assert ax.get_lines()[1].get_linestyle() == "-." and ax.get_lines()[2].get_linestyle() == "--"
    assert ax.get_legend().get_bbox_to_anchor().y0 < ax.bbox.y0  # the legend sits below the axes
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "utility: ndcg@10"
    assert len(ax.collections) == 1  # the 95 % band
    mean0 = ax.get_lines()[0].get_ydata()
    assert mean0[0] == 1.0 and mean0[-1] < 0.75


def test_png_not_blank(noise_results, tmp_path):
    from PIL import Image

    out = reports.write_report(noise_results, tmp_path / "r")
    img = np.asarray(Image.open(out / "accuracy_vs_noise.png").convert("L"), dtype=float)
    assert img.shape[0] > 300 and img.shape[1] > 500
    assert img.std() > 10 and (img < 100).mean() > 0.005


def test_figure_names():
    base = {"protocol": "p", "attack": "a", "points": []}
    assert figures.figure_stem({**base, "sweep": "laplace.scale", "noise": True}) == "accuracy_vs_noise"
    assert figures.figure_stem({**base, "sweep": "attack.aux_fraction"}) == "accuracy_vs_aux_fraction"
    assert figures.figure_stem({**base, "sweep": "sampling.rho"}) == "accuracy_vs_rho"
    assert figures.figure_stem({**base, "sweep": None}) == "accuracy"


def test_x_axis_choice():
    assert figures.x_axis([0.0, 1e-4, 1.0])[1:] == ("symlog", 1e-4)
    assert figures.x_axis([1e-3, 1.0])[1] == "log"
    assert figures.x_axis([0.05, 0.5, 1.0])[1] == "linear"
    assert figures.x_axis(["semials", "sgd"])[1] == "category"


def test_table(noise_results):
    text = reports.format_table(noise_results)
    lines = text.split("\n\n")[0].splitlines()  # the summary table (the ROC table follows)
    # the plain verdict line opens the output, the statistical detail beneath it
    assert lines[0].startswith("verdict: ") and len(lines[0]) <= len("verdict: ") + 160
    assert lines[1].startswith("  detail: ") and "Holm over" in lines[1]
    lines = lines[1:]
    head = lines[1]
    for column in (
        "dummy-noise.scale",
        "accuracy (prior / random)",  # the console folds each metric's baselines into its cell
        "advantage (accuracy)",
        "verdict",
        "utility: ndcg@10",
        "ε total over the run",
        "empirical ε (95 % lower bound)",
        "seeds",
    ):
        assert column in head
    assert head.count("ε total") == 1  # one epsilon column
    assert lines[3].split()[:5] == ["0", "1.000", "(0.500", "/", "0.500)"]  # value (prior / random)
    assert "±" in lines[-1]
    # epsilon column: the seed mean of each point's total privacy cost (dummy: rounds / scale; none at scale 0)
    rounds = {
        p["value"]: p["privacy"]["dummy-noise"]["epsilon"] * p["value"]
        for p in noise_results["points"]
        if p.get("privacy")
    }
    r = next(iter(rounds.values()))
    assert lines[3].split()[-3] == "-" and float(lines[-1].split()[-3]) == pytest.approx(r / 10, rel=1e-3)


def test_privacy_figure_plots_accuracy_and_utility_against_epsilon(noise_results):
    name, values, eps = figures.epsilon_series(noise_results)
    assert name == "dummy-noise" and values == [0, 0.01, 0.1, 1, 10]
    assert np.isnan(eps[0]) and np.all(np.diff(eps[1:]) < 0)  # more noise, smaller epsilon
    fig = figures.make_privacy_figure(noise_results)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "dummy-noise: ε total over the run"  # one epsilon: the total over the run
    assert ax.get_xscale() == "log"  # epsilon spans three decades
    line = ax.get_lines()[0]
    np.testing.assert_allclose(sorted(line.get_xdata()), sorted(float(f"{e:.3g}") for e in eps[1:]))
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "utility: ndcg@10"
    assert figures.epsilon_series({**noise_results, "sweep": None}) is None


def test_protocol_declares_its_main_utility():
    points = [{"value": 1, "utility": {"ndcg@10": 0.3, "hr@10": 0.5}}]
    assert ex.main_utility({"points": points}) == "ndcg@10"
    assert ex.main_utility({"utility_metric": "hr@10", "points": points}) == "hr@10"  # declared, recorded by the plan
    assert ex.main_utility({"utility_metric": "no-such-metric", "points": points}) == "ndcg@10"


@pytest.mark.usefixtures("dummy_registry")
def test_single_point_and_categorical_reports(tmp_path):
    ds = tiny_dataset(20)
    single = ex.build_experiment(protocol="dummy-proto", seeds=2).run(ds)
    out = reports.write_report(single, tmp_path / "single")
    assert (out / "accuracy.svg").exists() and (out / "accuracy.png").exists()
    cat = ex.build_experiment(protocol="dummy-proto", sweep=ex.Sweep("protocol", "p", (2, 3)), seeds=1).run(ds)
    out = reports.write_report(cat, tmp_path / "cat")
    assert (out / "accuracy_vs_p.svg").exists()
    enc = ex.build_experiment(protocol="dummy-proto", defenses=["dummy-encrypt"], seeds=1).run(ds)
    out = reports.write_report(enc, tmp_path / "enc")
    assert "did not apply" in (out / "report.html").read_text()


def test_default_out_dir():
    assert (
        str(render.default_out_dir({"protocol": "fedmvmf", "sweep": "laplace.scale"}))
        == "privaudit-report/fedmvmf-laplace.scale"
    )
    assert (
        str(render.default_out_dir({"protocol": "fedmvmf", "sweep": None, "transcript": True}))
        == "privaudit-report/fedmvmf-transcript"
    )


def test_read_results_errors(tmp_path):
    with pytest.raises(PrivauditError, match="no such results file"):
        reports.read_results(tmp_path)
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(PrivauditError, match="not a valid results.json"):
        reports.read_results(tmp_path)
    (tmp_path / "results.json").write_text('{"protocol": "x"}')
    with pytest.raises(PrivauditError, match="missing attack, sweep, points"):
        reports.read_results(tmp_path)


def test_ci95_band_matches_student_t(noise_results):
    values, mean, ci = figures._series(noise_results, "attack_metrics", "accuracy")
    acc = [p["attack_metrics"]["accuracy"] for p in noise_results["points"] if p["value"] == 1.0]
    k = values.index(1.0)
    assert mean[k] == pytest.approx(np.mean(acc))
    assert ci[k] == pytest.approx(4.302652729911275 * np.std(acc, ddof=1) / math.sqrt(3))


def test_failed_render_leaves_the_old_folder_untouched(noise_results, tmp_path, monkeypatch):
    out = reports.write_report(noise_results, tmp_path / "r")
    before = _files(out)
    changed = json.loads(json.dumps(render.jsonable(noise_results)))
    changed["points"][0]["attack_metrics"]["accuracy"] = 0.123

    def broken(*args, **kwargs):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(render, "render_html", broken)
    with pytest.raises(RuntimeError, match="rendering failed"):
        reports.write_report(changed, out)
    assert _files(out) == before  # results.json is not replaced first; no temporary file is left


def test_markdown_escapes_markup(noise_results, tmp_path):
    res = json.loads(json.dumps(render.jsonable(noise_results)))
    res["attack"] = "a|b <i>x</i> [link](http://e.com) *em*"
    md = render.render_markdown(res, "fig")
    assert "a\\|b &lt;i&gt;x&lt;/i&gt; \\[link\\](http://e.com) \\*em\\*" in md
    assert "<i>" not in md


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.update(metric_specs=[1, 2]), "'metric_specs' must be an object"),
        (lambda d: d["points"][0].update(roc={"bit": {"fpr": ["x", "y"], "tpr": [1, 2]}}), "could not convert"),
        (lambda d: d.update(figure_metrics=7), "not a valid results.json"),
        (lambda d: d.update(verdicts=[{"rows": [{"value": [1], "advantage": "high"}]}]), None),  # shown as n/a
        (lambda d: d["points"][0].update(privacy={"dummy-noise": {"epsilon": "lots"}}), None),  # shown as n/a
    ],
)
def test_report_of_a_malformed_results_json_is_one_line(noise_results, tmp_path, capsys, mutate, expected):
    from privaudit.cli import main

    out = reports.write_report(noise_results, tmp_path / "r")
    data = json.loads((out / "results.json").read_text())
    mutate(data)
    (out / "results.json").write_text(json.dumps(data))
    before = {k: v for k, v in _files(out).items() if k != "results.json"}
    code = main(["report", str(out), "--force"])
    err = capsys.readouterr().err.strip().splitlines()
    if expected is None:  # wrong types where a number is expected read as missing numbers
        assert code == 0 and err == [] and "n/a" in (out / "report.md").read_text()
    else:
        assert code == 2 and len(err) == 1 and expected in err[0]
        assert {k: v for k, v in _files(out).items() if k != "results.json"} == before  # nothing replaced


def test_console_table_folds_baselines_and_leaves_out_repeated_metrics():
    from privaudit.reports.render import _compact_columns

    header = ["value", "a", "a: prior", "a: random", "b", "b: prior", "c", "c: prior", "verdict"]
    rows = [["0", "1.000", "0.3", "0.2", "1.000", "0.3", "0.9", "0.3", "leaks"]]
    out_h, out_rows, same = _compact_columns(header, rows)
    assert out_h == ["value", "a (prior / random)", "c (prior)", "verdict"]
    assert out_rows == [["0", "1.000 (0.3 / 0.2)", "0.9 (0.3)", "leaks"]]
    assert same == [("b", "a")]  # b repeats a's values and prior: left out, named in a note


def test_glossary_states_each_metric_direction_and_run_descriptors():
    from privaudit import results as rs
    from privaudit.reports.render import glossary

    results = {
        "points": [{"value": 0, "attack_metrics": {"accuracy": 0.9, "error": 0.2, "victims": 10, "odd": 3}}],
        "metric_specs": {
            "accuracy": rs.spec_to_dict(rs.MetricSpec(True, True, "fraction", "share of ratings recovered")),
            "error": rs.spec_to_dict(rs.MetricSpec(False, True, "rating", "mean error")),
            "victims": rs.spec_to_dict(rs.MetricSpec(True, False, "count", "clients attacked")),
        },
    }
    terms = dict(glossary(results))
    assert terms["accuracy"] == "share of ratings recovered. Unit: fraction; higher = stronger attack."
    assert terms["error"] == "mean error. Unit: rating; lower = stronger attack."
    assert terms["victims"] == "clients attacked. Unit: count; describes the run, not the attack's success."
    assert terms["odd"].startswith("not declared by the attack")


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_report_files_take_their_mode_from_the_umask(noise_results, tmp_path, umask):
    """Not mkstemp's 0600: a report shared on a machine is readable as the user's other files."""
    import os
    import stat

    old = os.umask(umask)
    try:
        out = reports.write_report(noise_results, tmp_path / "rep")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert set(modes.values()) == {0o666 & ~umask}, modes
    assert {"results.json", "report.html", "accuracy_vs_noise.svg"} <= set(modes)

"""What a new user trips on: one clear line for a wrong --data file or an existing output (naming
the next free name), a defaults line for every protocol, no numpy warnings, progress estimates."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from privaudit import experiment, runner
from privaudit.cli import main
from tests.test_first_run import one_line_error


def test_movielens_side_files_are_not_ratings(tmp_path, capsys, no_compute):
    item = tmp_path / "u.item"  # MovieLens 100K's item list: latin-1, '|'-separated
    item.write_bytes("1|Toy Story (1995)|01-Jan-1995||http://x|0|0\n2|Se\xf1or (1995)|\n".encode("latin-1"))
    out = str(tmp_path / "t.ptx")
    one_line_error(
        capsys,
        ["run", "--protocol", "fedmvmf", "--data", str(item), "-o", out],
        rf"u\.item: not a ratings file \(MovieLens 100K's item list\); give the folder: --data {re.escape(str(tmp_path))}$",
    )
    other = tmp_path / "ratings.txt"  # any file that is not utf-8 text
    other.write_bytes(b"1,2,3\n\xff\xfe,1,1\n")
    one_line_error(
        capsys,
        ["run", "--protocol", "fedmvmf", "--data", str(other), "-o", out],
        r"ratings\.txt line 2: not a ratings file \(not utf-8 text; expected lines user,item,rating",
    )


def test_existing_outputs_name_the_next_free_name(tmp_path, capsys, no_compute):
    for name in ("t.ptx", "t-2.ptx"):
        (tmp_path / name).write_bytes(b"old")
    one_line_error(
        capsys,
        ["run", "--protocol", "fedsplit", "-o", str(tmp_path / "t.ptx")],
        rf"t\.ptx already exists; pass --force to replace it or write -o {re.escape(str(tmp_path / 't-3.ptx'))}$",
    )
    report = tmp_path / "fedsplit-laplace.scale-synthetic"  # a dot in a folder name is not a suffix
    report.mkdir()
    (report / "results.json").write_text("{}")
    one_line_error(
        capsys,
        ["attack", "--protocol", "fedsplit", "--out", str(report)],
        rf"already exists; .* \(e\.g\. --out {re.escape(str(report))}-2\)$",
    )


@pytest.mark.parametrize(
    ("protocol", "line"),
    [
        ("fedsplit", "fedsplit defaults: fedsplit-inference's own sweep attack.aux_fraction=0.05..1.0 (20 values)"),
        ("fedncf", "fedncf defaults: ncf-update-leak's own sweep attack.rounds=1,2,3,4"),
        ("fedmvmf", "fedmvmf defaults: --sweep laplace.scale=0,0.1,0.5,1,2,4"),
    ],
)
def test_every_default_names_its_sweep(protocol, line, tmp_path, capsys, monkeypatch):
    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "run_plan", stop)
    assert main(["attack", "--protocol", protocol, "--out", str(tmp_path / "r")]) == 130
    assert capsys.readouterr().out.startswith(line)


def _noisy(x: int) -> float:
    return float(np.mean(np.array([]))) if x else 0.0  # numpy warns "Mean of empty slice"


def test_parallel_map_hides_empty_mean_warnings_only():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = runner.parallel_map(_noisy, [0, 1], jobs=1, progress=False)
        np.log(np.array([-1.0]))  # other numpy warnings still show
    assert out[0] == 0.0 and np.isnan(out[1])
    assert [str(w.message) for w in caught] == ["invalid value encountered in log"]


def test_parallel_map_prints_an_estimate_for_a_long_map(capsys, monkeypatch):
    monkeypatch.setattr(runner, "ESTIMATE_ABOVE_SECONDS", 0.0)
    monkeypatch.setattr(runner, "PROGRESS_LINE_SECONDS", 0.0)
    assert runner.parallel_map(abs, [-1, -2, -3, -4], jobs=1, progress=False, desc="audit x") == [1, 2, 3, 4]
    lines = capsys.readouterr().err.splitlines()
    # the rate is taken from the second result on (the first carries one-time costs)
    assert re.fullmatch(r"audit x: 2/4 runs in \d+ s; about \d+ s left \(1 at a time\)", lines[0]), lines
    assert re.fullmatch(r"audit x: 3/4 runs in \d+ s", lines[1]) and len(lines) == 2, lines
    monkeypatch.setattr(runner, "ESTIMATE_ABOVE_SECONDS", 60.0)  # a short map stays silent
    runner.parallel_map(abs, [-1, -2, -3], jobs=1, progress=False, desc="audit x")
    assert capsys.readouterr().err == ""


def test_roc_table_counts_agree_with_its_n_a_cells():
    from privaudit.reports.render import roc_rows

    def roc(n_neg: int, auc: float) -> dict:
        return {"positive": "rated", "auc": auc, "tpr@0.01": 0.5, "tpr@0.001": None, "n_pos": 161, "n_neg": n_neg}

    points = [{"value": None, "roc": {"rated": roc(n, a)}} for n, a in ((148, 0.8), (161, 0.9))]
    header, rows = roc_rows({"points": points})
    assert header[-1] == "positives / negatives"
    assert rows[0][-2:] == ["n/a: < 1000 negatives", "161 / 148-161"]  # both seeds' counts, no other number


def _figure_results(sweep: str | None) -> dict:
    values = [0.0, 1.0, 4.0] if sweep else [None]
    points = [
        {
            "value": v,
            "seed": s,
            "attack_metrics": {"acc": 0.9 - 0.1 * k, "rated_acc": 0.9 - 0.1 * k, "err": 0.1 + k, "victims": 50.0},
            "baseline_prior": {"acc": 0.5, "rated_acc": 0.5, "err": 3.0},
            "baseline_random": {"acc": 0.2, "rated_acc": 0.2, "err": 4.0},
            "utility": {"rmse": 1.0 + 0.1 * k + 0.3 * s},
        }
        for k, v in enumerate(values)
        for s in (0, 1)
    ]
    spec = {"plotted": True, "description": "", "declared": True}
    return {
        "attack": "a",
        "protocol": "p",
        "sweep": sweep,
        "noise": False,
        "points": points,
        "primary_metric": "acc",
        "figure_metrics": ["acc", "rated_acc", "err"],
        "utility_metric": "rmse",
        "metric_specs": {
            "acc": {**spec, "higher_is_better": True, "unit": "fraction"},
            "rated_acc": {**spec, "higher_is_better": True, "unit": "fraction"},
            "err": {**spec, "higher_is_better": False, "unit": "rating"},
        },
    }


@pytest.mark.parametrize("sweep", ["laplace.scale", None])
def test_figures_one_metric_family_per_panel(sweep):
    from privaudit.reports import figures

    results = _figure_results(sweep)
    assert figures.metric_panels(results, results["figure_metrics"]) == ([["acc"], ["err"]], {"rated_acc": "acc"})
    fig = figures.make_figure(results)
    accuracy, error = fig.axes[0], fig.axes[1]
    assert "higher = stronger attack" in accuracy.get_ylabel() and "lower = stronger attack" in error.get_ylabel()
    assert accuracy.get_ylim() == (-0.02, 1.05) and error.get_ylim()[1] > 4.0  # the error is not on a 0-1 axis
    if sweep:
        legend = [t.get_text() for t in accuracy.get_legend().get_texts()]
        assert legend == ["acc (= rated_acc)", "its prior-only guess", "its random guess"]
        utility = fig.axes[2]
        assert utility.get_ylabel() == "utility: rmse"
        assert all(type(c).__name__ == "LineCollection" for c in utility.collections)  # error bars, no band
    else:
        assert [t.get_text() for t in accuracy.get_xticklabels()] == ["acc (= rated_acc)"]

"""Audits: every attack that applies to a protocol against every applicable defense.

:func:`run_audit` answers "what leaks, how much, and what does each defense cost" for one
protocol:

- **attacks**: every registered attack whose ``protocols`` names the protocol (or that names
  none); whether it *applies* is decided by the attack itself from what it declares it needs
  (:meth:`Attack.applicable` on the undefended server view: its ``requires`` message kinds in
  plaintext), never by a hand-written table;
- **defenses**: every registered defense whose ``applies_to`` is None or names the protocol
  and that has a ``strength`` with a ``default_grid``; each is run at every grid value;
- for every (defense, grid value, seed) — plus the undefended run per seed — the protocol runs
  once and *every* attack is evaluated on that transcript (``attack.evaluate``: metrics,
  baselines), with the protocol's utility, the defense's ``privacy_spent`` and timings.

Seeds and randomness follow :mod:`privaudit.experiment`: the protocol runs with the integer
seed (common random numbers across defenses and strengths), each attack draws from
``SeedSequence([seed, defense index, value index, attack index])``. The runs are spread with
joblib (``jobs``), or on a Dask cluster (``scheduler``: an address or ``local:N``) through
joblib's Dask backend; the numbers do not depend on either.

The matrix (attack x defense) reports the *advantage* of the attack's ``primary_metric``
over its random-guess baseline (metric minus baseline; baseline minus metric for error
metrics, whose lower values mean a stronger attack) with no defense and at each defense's
strongest grid value (the last one: grids run from weakest to strongest), the utility cost
there (the drop of the main utility metric; its rise for error-like utilities such as RMSE)
and the epsilon the defense reports. ``audit.json`` holds everything; ``audit.html`` renders
it self-contained with one accuracy-vs-strength SVG per (attack, defense) pair.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from privaudit import __version__, registry
from privaudit import experiment as ex
from privaudit.errors import PrivauditError

AUDIT_JSON = "audit.json"
AUDIT_HTML = "audit.html"
DEFAULT_AUDIT_SEEDS = 2

_LOWER_IS_BETTER = ("error", "rmse", "mae", "loss", "rank")


def lower_is_better(metric: str | None) -> bool:
    """True for error-like metric names (relative_error, rmse, mae, loss, mean_rank)."""
    return bool(metric) and any(t in metric.lower() for t in _LOWER_IS_BETTER)


# ------------------------------------------------------------------------------ selection


def applicable_attacks(protocol: str) -> list[type]:
    """Registered attacks that read ``protocol``'s transcripts (declared ``protocols``)."""
    out = []
    for cls in registry.available("attack").values():
        targets = tuple(getattr(cls, "protocols", ()) or ())
        if not targets or protocol in targets:
            out.append(cls)
    return out


def applicable_defenses(protocol: str, include_hiding: bool = False) -> tuple[list[type], list[tuple[str, str]]]:
    """(defenses to sweep, [(name, why skipped)]) for ``protocol``.

    Defenses that hide per-client plaintext (``hides_plaintext()``: encryption, secure
    aggregation) are skipped unless ``include_hiding``: plaintext attacks score their baseline
    against them by construction, and their cryptography makes every run slow (secure
    aggregation on 200 FedMVMF clients: minutes per epoch)."""
    swept, skipped = [], []
    for name, cls in registry.available("defense").items():
        applies = getattr(cls, "applies_to", None)
        if applies is not None and protocol not in applies:
            skipped.append((name, f"applies only to {', '.join(applies)}"))
        elif not getattr(cls, "strength", None) or not tuple(getattr(cls, "default_grid", ()) or ()):
            skipped.append((name, "no strength grid to sweep"))
        elif not include_hiding and _hides_plaintext(cls):
            skipped.append((name, "hides per-client plaintext (cryptographic, slow): add it with --defense " + name))
        else:
            swept.append(cls)
    return swept, skipped


def _hides_plaintext(cls: type) -> bool:
    try:
        return bool(cls().hides_plaintext())
    except Exception:  # a defense that cannot be built with its defaults is not skipped here
        return False


# ------------------------------------------------------------------------------ scheduler


@contextlib.contextmanager
def scheduler_context(scheduler: str | None) -> Iterator[str | None]:
    """Run joblib work on Dask while inside: ``scheduler`` is a Dask scheduler address or
    ``local:N`` (a local cluster of N single-threaded worker processes); None: local joblib.
    Yields a description of the backend."""
    if not scheduler:
        yield None
        return
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:  # pragma: no cover - dask is a declared extra
        from privaudit.errors import MissingDependencyError

        raise MissingDependencyError("dask[distributed]", "dask") from None
    import joblib

    cluster = None
    text = str(scheduler).strip()
    if text.startswith("local:") or text == "local":
        n = text.partition(":")[2] or "2"
        try:
            workers = int(n)
        except ValueError:
            raise PrivauditError(f"--scheduler: expected local:N with N workers, got {scheduler!r}") from None
        if workers < 1:
            raise PrivauditError(f"--scheduler: local:N needs N >= 1, got {workers}")
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        what = f"dask local cluster ({workers} workers)"
    else:
        try:
            client = Client(text, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise PrivauditError(f"--scheduler: cannot connect to Dask scheduler {text!r} ({exc})") from None
        what = f"dask scheduler {text}"
    try:
        with joblib.parallel_config(backend="dask"):
            yield what
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


# ------------------------------------------------------------------------------ runs


@dataclass
class _Run:
    """One protocol run (a defense at one value, or none) and every attack on it."""

    protocol_cls: type
    config: dict[str, Any]
    defense_index: int  # 0 = no defense, k = k-th swept defense
    defense_cls: type | None
    defense_params: dict[str, Any]
    value_index: int
    value: Any
    seed: int
    attacks: list[tuple[str, type]] = field(default_factory=list)  # (registered name, class)
    defense_name: str | None = None
    protocol_name: str = ""


def _execute(run: _Run, dataset: Any) -> dict[str, Any]:
    specs = [(run.defense_cls, dict(run.defense_params))] if run.defense_cls is not None else []
    task = ex._Task(run.protocol_cls, run.config, specs, object, run.seed)
    out: dict[str, Any] = {
        "defense": run.defense_name,
        "value": run.value,
        "seed": run.seed,
    }
    task.names = [run.protocol_name, "", run.defense_name or ""]  # resolved in the main process
    for attack_name, attack_cls in run.attacks:
        if not getattr(attack_cls, "name", ""):
            attack_cls.name = attack_name  # a class re-imported in a worker process
    try:
        result, defenses, protocol_seconds = ex._run_protocol(task, dataset)
    except Exception as exc:  # one failing pair must not end the audit; it is reported
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=3) if not isinstance(exc, PrivauditError) else ""
        return out
    out["utility"] = ex._floats(result.utility)
    out["protocol_seconds"] = protocol_seconds
    privacy = ex._defense_privacy(defenses, result.transcript)
    if privacy and run.defense_name:
        # keyed by the registered name (a class's own ``name`` may be unset in a worker process)
        out["privacy"] = {run.defense_name: next(iter(privacy.values()))}
    attacks = {}
    for a_index, (attack_name, attack_cls) in enumerate(run.attacks):
        ss = np.random.SeedSequence([run.seed, run.defense_index, run.value_index, a_index])
        try:
            params = dict(getattr(attack_cls, "audit_params", {}) or {})
            scored, seconds = ex._evaluate(attack_cls, params, result.transcript, np.random.default_rng(ss))
        except Exception as exc:
            attacks[attack_name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        scored["seconds"] = seconds
        attacks[attack_name] = scored
    out["attacks"] = attacks
    return out


@dataclass
class Audit:
    """An audit of one protocol (see the module docstring).

    Parameters
    ----------
    protocol : str
    data : str | Path | RatingsDataset
        ``"synthetic"`` (default), a path, or a dataset.
    users : int | None
        Subsample this many users (seeded by ``seed``).
    sets : dict
        Protocol config overrides.
    seeds, seed : int
        Seeds ``seed .. seed + seeds - 1``.
    jobs : int
        joblib processes (-1: all cores); ignored with ``scheduler``.
    scheduler : str | None
        Dask scheduler address or ``local:N``.
    attacks, defenses : sequence of str | None
        Restrict to these names (default: every applicable one).
    progress : bool | None
    """

    protocol: str
    data: Any = "synthetic"
    users: int | None = None
    sets: dict[str, Any] = field(default_factory=dict)
    seeds: int = DEFAULT_AUDIT_SEEDS
    seed: int = 0
    jobs: int = 1
    scheduler: str | None = None
    attacks: Sequence[str] | None = None
    defenses: Sequence[str] | None = None
    progress: bool | None = None


def _plan(audit: Audit) -> tuple[list[_Run], dict[str, Any]]:
    protocol_cls = registry.get("protocol", audit.protocol)
    config = protocol_cls.resolve_config(audit.sets)
    if int(audit.seeds) < 1:
        raise PrivauditError(f"--seeds must be at least 1, got {audit.seeds}")
    if int(audit.seed) < 0:
        raise PrivauditError(f"--seed must be non-negative, got {audit.seed}")
    if int(audit.jobs) == 0 or int(audit.jobs) < -1:
        raise PrivauditError(f"--jobs must be a positive number of processes or -1 (all cores), got {audit.jobs}")
    attacks = applicable_attacks(protocol_cls.name)
    if audit.attacks:
        for name in audit.attacks:
            registry.get("attack", name)
        attacks = [a for a in attacks if a.name in set(audit.attacks)]
        missing = sorted(set(audit.attacks) - {a.name for a in attacks})
        if missing:
            raise PrivauditError(f"attack(s) {', '.join(missing)} do not read {protocol_cls.name!r} transcripts")
    if not attacks:
        raise PrivauditError(f"no registered attack reads {protocol_cls.name!r} transcripts")
    defenses, skipped = applicable_defenses(protocol_cls.name, include_hiding=audit.defenses is not None)
    if audit.defenses is not None:
        for name in audit.defenses:
            registry.get("defense", name)
        wanted = set(audit.defenses)
        missing = sorted(wanted - {d.name for d in defenses})
        if missing:
            raise PrivauditError(f"defense(s) {', '.join(missing)} cannot be swept on {protocol_cls.name!r}")
        skipped += [(d.name, "not selected") for d in defenses if d.name not in wanted]
        defenses = [d for d in defenses if d.name in wanted]
    seeds = list(range(int(audit.seed), int(audit.seed) + int(audit.seeds)))
    runs: list[_Run] = []
    named = [(a.name, a) for a in attacks]
    for seed in seeds:
        runs.append(_Run(protocol_cls, config, 0, None, {}, 0, None, seed, named, None, protocol_cls.name))
    for d_index, cls in enumerate(defenses, start=1):
        for v_index, value in enumerate(cls.default_grid):
            cls(**{cls.strength: value})  # validates
            for seed in seeds:
                runs.append(_Run(protocol_cls, config, d_index, cls, {cls.strength: value}, v_index, value, seed, named, cls.name, protocol_cls.name))
    header = {
        "privaudit_version": __version__,
        "protocol": protocol_cls.name,
        "protocol_config": config,
        "seeds": seeds,
        "attacks": [
            {
                "name": a.name,
                "description": registry.describe(a),
                "party": getattr(a, "party", "server"),
                "requires": list(getattr(a, "requires", ()) or ()),
                "primary_metric": getattr(a, "primary_metric", "accuracy"),
                "audit_params": dict(getattr(a, "audit_params", {}) or {}),
                "lower_is_better": lower_is_better(getattr(a, "primary_metric", "accuracy")),
            }
            for a in attacks
        ],
        "defenses": [
            {"name": d.name, "description": registry.describe(d), "strength": d.strength, "grid": list(d.default_grid),
             "params": dict(d.params)}
            for d in defenses
        ],
        "skipped_defenses": [{"name": n, "reason": r} for n, r in skipped],
    }
    return runs, header


def run_audit(audit: Audit, dataset: Any = None) -> dict[str, Any]:
    """Run ``audit`` -> the ``audit.json`` dict."""
    runs, header = _plan(audit)
    t0 = time.perf_counter()
    source = audit.data if isinstance(audit.data, str) else str(audit.data)
    if dataset is None:
        dataset = ex.load_data(audit.data)
    else:
        source = getattr(dataset, "name", "dataset")
    dataset = ex.subsample_users(dataset, audit.users, audit.seed)
    load_seconds = time.perf_counter() - t0
    from tqdm.auto import tqdm

    show = ex._show_progress(audit.progress)
    bar = tqdm(total=len(runs), desc=f"audit {header['protocol']}", unit="run", disable=not show, leave=False)
    results: list[dict] = []
    t1 = time.perf_counter()
    try:
        with scheduler_context(audit.scheduler) as backend:
            parallel = audit.scheduler is not None or (int(audit.jobs) != 1 and len(runs) > 1)
            if parallel:
                from joblib import Parallel, delayed

                n_jobs = -1 if audit.scheduler is not None else int(audit.jobs)
                for r in Parallel(n_jobs=n_jobs, return_as="generator")(delayed(_execute)(run, dataset) for run in runs):
                    results.append(r)
                    bar.update(1)
            else:
                for run in runs:
                    results.append(_execute(run, dataset))
                    bar.update(1)
    finally:
        bar.close()
    run_seconds = time.perf_counter() - t1
    out = dict(header)
    out["dataset"] = dict(dataset.summary(), source=source)
    if audit.users is not None:
        out["dataset"]["subsampled_users"] = int(audit.users)
    out["runs"] = results
    _mark_applicability(out)
    out["matrix"] = build_matrix(out)
    out["timing"] = {
        "total_seconds": time.perf_counter() - t0,
        "load_seconds": load_seconds,
        "run_seconds": run_seconds,
        "runs": len(runs),
        "backend": backend or (f"joblib ({audit.jobs} jobs)" if int(audit.jobs) != 1 else "sequential"),
    }
    return out


def _mark_applicability(out: dict[str, Any]) -> None:
    """An attack applies when it ran on the undefended view (its declared needs were met)."""
    for a in out["attacks"]:
        undefended = [r["attacks"].get(a["name"], {}) for r in out["runs"] if r.get("defense") is None and "attacks" in r]
        supported = [s.get("supported", False) for s in undefended if "error" not in s]
        a["applies"] = bool(supported) and all(supported)
        a["reason"] = "; ".join(sorted({s.get("reason", "") for s in undefended if s.get("reason")}))
        errors = sorted({s["error"] for s in undefended if "error" in s})
        if errors:  # the attack crashed (a bug or a degenerate run), reported as such
            a["errors"] = errors
            a["reason"] = "; ".join(filter(None, [a["reason"], "failed: " + "; ".join(errors)]))


# ------------------------------------------------------------------------------ matrix


def _num(v: Any) -> float:
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def _mean(values: Sequence[float]) -> tuple[float, float]:
    from privaudit.metrics import mean_ci95

    vals = [v for v in values if not math.isnan(v)]
    return mean_ci95(vals) if vals else (math.nan, math.nan)


def _main_utility(runs: Sequence[Mapping]) -> str | None:
    return ex.main_utility({"points": [r for r in runs if "utility" in r]})


def advantage(metric_value: float, baseline_value: float, lower_better: bool) -> float:
    """Attack advantage over the random-guess baseline (positive = the attack learns something)."""
    return baseline_value - metric_value if lower_better else metric_value - baseline_value


def pair_series(audit: Mapping[str, Any], attack: str, defense: str | None) -> list[dict[str, Any]]:
    """Per grid value (one entry for no defense): seed-mean advantage, metric, baseline,
    utility and epsilon, each with its 95 % CI half-width where it varies over seeds."""
    info = next(a for a in audit["attacks"] if a["name"] == attack)
    metric, lower = info["primary_metric"], info["lower_is_better"]
    runs = [r for r in audit["runs"] if r.get("defense") == defense]
    utility = audit.get("utility_metric") or _main_utility(audit["runs"])
    values: list[Any] = []
    for r in runs:
        if r.get("value") not in values:
            values.append(r.get("value"))
    out = []
    for v in values:
        group = [r for r in runs if r.get("value") == v]
        ok = [r for r in group if "attacks" in r and "error" not in r["attacks"].get(attack, {"error": 1})]
        m = [_num(r["attacks"][attack]["attack_metrics"].get(metric)) for r in ok]
        b = [_num(r["attacks"][attack]["baseline"].get(metric)) for r in ok]
        adv = [advantage(x, y, lower) for x, y in zip(m, b)]
        u = [_num((r.get("utility") or {}).get(utility)) for r in group if "utility" in r]
        eps = [_num(((r.get("privacy") or {}).get(defense) or {}).get("epsilon")) for r in group if r.get("privacy")]
        am, ac = _mean(adv)
        entry = {
            "value": v,
            "metric": metric,
            "mean": _mean(m)[0],
            "ci95": _mean(m)[1],
            "baseline": _mean(b)[0],
            "advantage": am,
            "advantage_ci95": ac,
            "utility_metric": utility,
            "utility": _mean(u)[0],
            "utility_ci95": _mean(u)[1],
            "epsilon": _mean(eps)[0] if eps else None,
            "errors": sorted({r["error"] for r in group if "error" in r} | {r["attacks"][attack]["error"] for r in group if "error" in r.get("attacks", {}).get(attack, {})}),
            "reasons": sorted({r["attacks"][attack].get("reason") for r in ok if r["attacks"][attack].get("reason")}),
        }
        out.append(entry)
    return out


def build_matrix(audit: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One cell per (attack, defense) with the advantage undefended and at the strongest grid
    value, the utility cost there and the epsilon there."""
    utility = _main_utility(audit["runs"])
    lower_u = lower_is_better(utility)
    cells = []
    for a in audit["attacks"]:
        none = pair_series(audit, a["name"], None)
        base = none[0] if none else {}
        cells.append(
            {"attack": a["name"], "defense": None, "value": None, "advantage": base.get("advantage"),
             "advantage_ci95": base.get("advantage_ci95"), "metric": a["primary_metric"], "utility": base.get("utility"),
             "utility_cost": 0.0, "epsilon": None, "errors": base.get("errors", []), "reasons": base.get("reasons", [])}
        )
        for d in audit["defenses"]:
            series = pair_series(audit, a["name"], d["name"])
            if not series:
                continue
            strongest = series[-1]
            u0, u1 = _num(base.get("utility")), _num(strongest["utility"])
            cost = (u1 - u0) if lower_u else (u0 - u1)
            best = min((s for s in series if not math.isnan(_num(s["advantage"]))), key=lambda s: s["advantage"], default=None)
            cells.append(
                {"attack": a["name"], "defense": d["name"], "value": strongest["value"], "strength": d["strength"],
                 "advantage": strongest["advantage"], "advantage_ci95": strongest["advantage_ci95"],
                 "metric": a["primary_metric"], "utility": strongest["utility"], "utility_cost": cost,
                 "epsilon": strongest["epsilon"], "min_advantage": best["advantage"] if best else None,
                 "min_advantage_value": best["value"] if best else None,
                 "errors": sorted({e for s in series for e in s["errors"]}),
                 "reasons": sorted({e for s in series for e in s["reasons"]})}
            )
    return cells


# ------------------------------------------------------------------------------ rendering


def pair_figure(audit: Mapping[str, Any], attack: str, defense: str):
    """Advantage-vs-strength figure of one (attack, defense) pair, utility on a second axis."""
    import matplotlib
    import matplotlib.ticker
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from privaudit.reports import figures

    series = pair_series(audit, attack, defense)
    none = pair_series(audit, attack, None)
    d = next(x for x in audit["defenses"] if x["name"] == defense)
    values = [s["value"] for s in series]
    with matplotlib.rc_context(figures._RC):
        fig = Figure(figsize=(6.4, 3.4))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        x, scale, thresh = figures._x_axis(values)
        mean = np.array([_num(s["mean"]) for s in series])
        ci = np.nan_to_num(np.array([_num(s["ci95"]) for s in series]))
        base = np.array([_num(s["baseline"]) for s in series])
        metric = series[0]["metric"] if series else "metric"
        ax.plot(x, mean, "-o", color="#1f77b4", ms=4, lw=1.6, label=f"{attack}: {metric}")
        ax.fill_between(x, mean - ci, mean + ci, color="#1f77b4", alpha=0.18, lw=0)
        ax.plot(x, base, "--", color="#1f77b4", lw=1.0, label="random-guess baseline")
        if none and not math.isnan(_num(none[0]["mean"])):
            ax.axhline(_num(none[0]["mean"]), color="#d62728", lw=0.9, ls=":", label="no defense")
        handles, labels = ax.get_legend_handles_labels()
        utility = series[0]["utility_metric"] if series else None
        if utility:
            ax2 = ax.twinx()
            u = np.array([_num(s["utility"]) for s in series])
            uc = np.nan_to_num(np.array([_num(s["utility_ci95"]) for s in series]))
            (hu,) = ax2.plot(x, u, ":s", color="black", ms=3, lw=1.2, label=f"utility {utility} (right)")
            ax2.fill_between(x, u - uc, u + uc, color="black", alpha=0.08, lw=0)
            ax2.set_ylabel(f"utility: {utility}")
            handles.append(hu)
            labels.append(hu.get_label())
        if scale == "symlog":
            ax.set_xscale("symlog", linthresh=thresh, linscale=0.6)
        elif scale == "log":
            ax.set_xscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([figures._fmt_value(v) for v in values])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel(f"{defense}.{d['strength']}")
        ax.set_ylabel(metric)
        finite = np.concatenate([mean[np.isfinite(mean)], base[np.isfinite(base)]])
        if finite.size == 0 or (finite.min() >= 0 and finite.max() <= 1):
            ax.set_ylim(-0.02, 1.05)
        ax.grid(True, alpha=0.3, lw=0.5)
        ax.legend(handles, labels, fontsize=7, loc="best", framealpha=0.85)
        ax.set_title(f"{attack} vs {defense} ({audit['protocol']})")
        fig.tight_layout()
    return fig


def _svg_of(fig) -> str:
    import io

    import matplotlib

    from privaudit.reports import figures

    buf = io.StringIO()
    with matplotlib.rc_context(figures._RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    import re

    text = text[text.find("<svg"):]
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S).strip()


def _colour(adv: float) -> str:
    """Green (no advantage) to red (advantage >= 0.5)."""
    if adv is None or math.isnan(adv):
        return "#eeeeee"
    t = max(0.0, min(1.0, adv / 0.5))
    r = int(round(60 + t * (220 - 60)))
    g = int(round(180 - t * (180 - 60)))
    b = int(round(90 - t * (90 - 60)))
    return f"#{r:02x}{g:02x}{b:02x}"


def _f(v: Any, digits: int = 3) -> str:
    x = _num(v)
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def render_html(audit: Mapping[str, Any]) -> str:
    """The self-contained ``audit.html`` (inline SVG figures, inline style)."""
    from privaudit.reports import figures
    from privaudit.reports.render import html_config, html_figure, html_page, html_table

    esc = html.escape
    title = f"privaudit audit: {audit['protocol']}"
    utility = _main_utility(audit["runs"])
    parts = [f"<h1>{esc(title)}</h1>"]
    ds = audit.get("dataset") or {}
    timing = audit.get("timing") or {}
    parts.append(
        html_config(
            [
                ("protocol", str(audit["protocol"])),
                ("dataset", ", ".join(f"{k}={v}" for k, v in ds.items())),
                ("seeds", ", ".join(str(s) for s in audit.get("seeds", []))),
                ("attacks", ", ".join(
                    a["name"] + (" (" + ", ".join(f"{k}={v}" for k, v in a["audit_params"].items()) + ")" if a.get("audit_params") else "")
                    for a in audit["attacks"])),
                ("defenses", ", ".join(f"{d['name']} ({d['strength']} in {', '.join(figures._fmt_value(v) for v in d['grid'])})" for d in audit["defenses"]) or "none"),
                ("not swept", ", ".join(f"{s['name']} ({s['reason']})" for s in audit.get("skipped_defenses", [])) or "none"),
                ("runs", f"{timing.get('runs', len(audit['runs']))} protocol runs, {_f(timing.get('total_seconds'), 1)} s ({timing.get('backend', '')})"),
                ("privaudit", str(audit.get("privaudit_version"))),
            ]
        )
    )
    parts.append("<h2>What leaks: attack advantage by defense</h2>")
    parts.append(
        "<p>Each cell: advantage of the attack's primary metric over the random-guess baseline "
        "(metric − baseline; baseline − metric for errors), seed mean, with no defense and at each defense's "
        f"strongest grid value; below it the utility cost ({esc(str(utility))} lost) and the epsilon where the defense "
        "accounts one. Green: no advantage; red: advantage ≥ 0.5.</p>"
    )
    header = ["attack (metric)", "no defense"] + [f"{d['name']} ({d['strength']}={figures._fmt_value(d['grid'][-1])})" for d in audit["defenses"]]
    rows = []
    for a in audit["attacks"]:
        row = [f"<span>{esc(a['name'])}</span><br><small>{esc(a['primary_metric'])}</small>" + ("" if a.get("applies") else f"<br><small>does not apply: {esc(a.get('reason', ''))}</small>")]
        for dname in [None] + [d["name"] for d in audit["defenses"]]:
            cell = next((c for c in audit["matrix"] if c["attack"] == a["name"] and c["defense"] == dname), None)
            if cell is None:
                row.append("<span>-</span>")
                continue
            adv = _num(cell.get("advantage"))
            lines = [f"<b>{_f(adv)}</b>" + (f" ± {_f(cell.get('advantage_ci95'))}" if _num(cell.get("advantage_ci95")) > 0 else "")]
            if dname is not None:
                lines.append(f"<small>utility cost {_f(cell.get('utility_cost'), 4)}</small>")
                if cell.get("epsilon") is not None and not math.isnan(_num(cell.get("epsilon"))):
                    lines.append(f"<small>ε = {_f(cell.get('epsilon'), 2)}</small>")
            if cell.get("errors"):
                lines.append(f"<small>error: {esc('; '.join(cell['errors']))[:200]}</small>")
            row.append(f'<div class="cell" style="background:{_colour(adv)}">' + "<br>".join(lines) + "</div>")
        rows.append(row)
    parts.append(html_table(header, rows).replace("<table>", '<table class="matrix">'))
    parts.append("<h2>Accuracy versus defense strength</h2>")
    k = 0
    for a in audit["attacks"]:
        for d in audit["defenses"]:
            if not pair_series(audit, a["name"], d["name"]):
                continue
            fig = pair_figure(audit, a["name"], d["name"])
            parts.append(html_figure(_svg_of(fig), f"{a['name']} against {d['name']}: {a['primary_metric']} (95 % band over seeds), baseline dashed, undefended dotted red; utility on the right axis.", f"fig-{k}"))
            k += 1
            series = pair_series(audit, a["name"], d["name"])
            prow = [[figures._fmt_value(s["value"]), _f(s["mean"]), _f(s["baseline"]), _f(s["advantage"]), _f(s["utility"], 4),
                     _f(s["epsilon"], 2) if s["epsilon"] is not None else "-"] for s in series]
            parts.append(html_table([d["strength"], a["primary_metric"], "baseline", "advantage", f"utility {utility}", "epsilon"], prow))
    parts.append("<h2>Configuration</h2>")
    parts.append("<pre>" + esc(json.dumps(_jsonable(audit.get("protocol_config", {})), indent=2)) + "</pre>")
    parts.append("<h2>Dataset</h2>")
    parts.append(html_table(["key", "value"], [[esc(str(k)), esc(str(v))] for k, v in ds.items()]))
    parts.append("<h2>Timing</h2>")
    trow = []
    for r in audit["runs"]:
        secs = _num(r.get("protocol_seconds")) + sum(_num(s.get("seconds")) for s in (r.get("attacks") or {}).values() if "seconds" in s)
        trow.append([str(r.get("defense") or "none"), figures._fmt_value(r.get("value")) if r.get("value") is not None else "-", str(r.get("seed")), _f(r.get("protocol_seconds"), 2), _f(secs, 2)])
    parts.append(html_table(["defense", "value", "seed", "protocol s", "protocol + attacks s"], trow))
    parts.append(f"<p>Generated by privaudit {esc(str(audit.get('privaudit_version')))}; total {_f(timing.get('total_seconds'), 1)} s.</p>")
    page = html_page(title, "\n".join(parts))
    return page.replace("</style>", ".matrix td{vertical-align:top;padding:0}.matrix .cell{padding:.35em .6em;min-width:7em}</style>", 1)


def _jsonable(obj: Any) -> Any:
    from privaudit.reports.render import jsonable

    return jsonable(obj)


def default_out_dir(protocol: str) -> Path:
    return Path("privaudit-report") / f"{protocol}-audit"


def write_audit(audit: Mapping[str, Any], out_dir: Path | str | None = None) -> Path:
    """Write ``audit.json`` and ``audit.html`` into ``out_dir``; the folder."""
    from privaudit.reports.render import write_json

    out = Path(out_dir) if out_dir is not None else default_out_dir(audit["protocol"])
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrivauditError(f"{out}: cannot create the report folder ({exc.strerror or exc})") from None
    write_json(audit, out / AUDIT_JSON)
    data = json.loads((out / AUDIT_JSON).read_text(encoding="utf-8"))
    (out / AUDIT_HTML).write_text(render_html(data), encoding="utf-8")
    return out


def format_matrix(audit: Mapping[str, Any]) -> str:
    """The matrix as plain text (what the CLI prints)."""
    from privaudit.reports import figures

    cols = ["no defense"] + [f"{d['name']}@{figures._fmt_value(d['grid'][-1])}" for d in audit["defenses"]]
    header = ["attack (advantage)"] + cols
    rows = []
    for a in audit["attacks"]:
        row = [a["name"] + ("" if a.get("applies") else " (n/a)")]
        for dname in [None] + [d["name"] for d in audit["defenses"]]:
            cell = next((c for c in audit["matrix"] if c["attack"] == a["name"] and c["defense"] == dname), None)
            row.append("-" if cell is None else _f(cell.get("advantage")))
        rows.append(row)
    utility = _main_utility(audit["runs"])
    urow = [f"utility cost ({utility})"]
    a0 = audit["attacks"][0]["name"] if audit["attacks"] else None
    for dname in [None] + [d["name"] for d in audit["defenses"]]:
        cell = next((c for c in audit["matrix"] if c["attack"] == a0 and c["defense"] == dname), None)
        urow.append("-" if cell is None else _f(cell.get("utility_cost"), 4))
    rows.append(urow)
    widths = [max(len(r[j]) for r in [header] + rows) for j in range(len(header))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)

"""How often the recorded-Flower audit says "leaks" or "attack below prior" on null recordings.

Two test apps of ``tests/flower_apps`` as their authors ship them, each node one user of a
seeded synthetic matrix (the run config's ``seed`` draws the data, the model's start and the
split), with only a stock ``LocalDpMod`` changed or added (``--app``, :data:`APP_SPECS`):

* ``localdp_mf``: explicit ratings, Flower's stock FedAvg over the whole item matrix, its
  shipped ``LocalDpMod`` line changed; 2 rounds;
* ``implicit_gmf``: implicit feedback (GMF, 4 sampled negatives per positive, item biases), the
  same ``LocalDpMod`` added to its ClientApp; 1 round (under the null's noise the aggregated GMF
  model of a second round overflows).

The mod is ``LocalDpMod(clipping_norm=1.0, sensitivity=2.0, epsilon=E, delta=1e-5)``:

* null: E = 1e-4: Gaussian noise of standard deviation 9.7e4 on every uploaded float, beside a
  client update clipped to L2 norm 1: the uploads carry nothing usable about the client's data
  (signal-to-noise about 1e-5 per float);
* weak leak: E = 200 (localdp_mf; noise standard deviation 0.048 per float) or 1500
  (implicit_gmf; 0.0065), where the rows of the trained items still stand out of the noise now
  and then.

Each recording is one fresh run-config seed (new data, new start, new noise) of ``--clients``
nodes. Each recording is audited once per attack (the rows of ``privaudit audit --transcript``,
:func:`privaudit.integrations.recorded.transcript_point`); an experiment of S seeds pools S
recordings' points (:func:`privaudit.integrations.recorded.pooled_verdict`: within- and
between-run variance, as a sweep's seeds). The experiments of one seed count use disjoint
recordings (independent); the 1-, 2- and 3-seed rows reuse the same recordings (recording
``i`` is experiment ``i`` at 1 seed and part of experiment ``i // 2`` at 2 seeds, ``i // 3`` at
3), so the rows are not independent of each other.

The engine. ``privaudit record --flower`` runs the app under Flower's simulation engine (Ray):
10-15 s a recording on a 2-core machine, 600+ recordings too slow. The recordings here run the
same ServerApp and ClientApp (the app's own mods included) in this process on a loop-back Grid
that calls the ClientApp for each message as a SuperNode does, through the same recorder (the
``RecordingGrid``, the private-data Mod, the defenses found). ``--check-engine N`` records N
seeds both ways and compares the transcripts: the same parties, kinds, rounds, payload keys and
shapes, the same private data, the same recorded defenses, and uploads equal up to the DP noise
(Flower's ``LocalDpMod`` draws from NumPy's global generator, unseeded under Ray; the check
uses a small noise). The in-process engine seeds NumPy's and Python's global generators
with the recording's seed, so the table is reproducible.

Not counted: ``generic-mf-ratings-estimated`` (no per-victim scores: it always reads
"inconclusive (no per-victim scores)", and it costs about 9 s per recording) unless
``--attacks`` names it; ``flower-model-inconsistency`` and ``generic-attribute-inference`` do
not apply to these apps (no secure aggregation, no attributes); ``generic-mf-ratings`` scores no
victim whenever the uploads do not decode onto the rating grid ("too few victims to judge (0)"
on the null) and does not apply to implicit feedback; ``generic-interaction-inference`` does not
apply to localdp_mf's null (no negative ratio: none in the run config, no row moved twice).

Run: ``python benchmarks/flower_calibration.py --app localdp_mf --recordings 600 --power-recordings
90`` (about 15 minutes on one core; ``--cache DIR`` keeps the audited recordings, ``--jobs`` runs them in
parallel processes). ``--no-null-arm`` gives the verdicts without the attack's null-view arm
(the recorded path's verdict before it had one), from the same recordings.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from privaudit import registry  # noqa: E402
from privaudit.errors import PrivauditError  # noqa: E402
from privaudit.metrics import clopper_pearson  # noqa: E402
from tests.flower_loop import LoopGrid as _LoopGrid  # noqa: E402  (the tests' loop-back Grid)

ROOT = Path(__file__).resolve().parents[1]
APPS = ROOT / "tests" / "flower_apps"


@dataclass(frozen=True)
class App:
    """A test app of ``tests/flower_apps``, the edits of its ClientApp source that make its null
    and weak-leak copies (``{mod}``: the LocalDpMod), its run-config overrides and the weak
    leak's epsilon."""

    edits: tuple[tuple[str, str], ...]
    weak_epsilon: float
    overrides: tuple[tuple[str, Any], ...] = ()


#: localdp_mf: explicit ratings, its stock LocalDpMod line changed. implicit_gmf: implicit feedback
#: with 4 sampled negatives per positive, the same mod added to its ClientApp; one round (under the
#: null's noise the aggregated GMF model of a second round overflows).
APP_SPECS = {
    "localdp_mf": App((("LocalDpMod(clipping_norm=1.0, sensitivity=1e-4, epsilon=10, delta=1e-5)", "{mod}"),), 200.0),
    "implicit_gmf": App(
        (
            (
                "from flwr.clientapp import ClientApp\n",
                "from flwr.clientapp import ClientApp\nfrom flwr.clientapp.mod import LocalDpMod\n",
            ),
            ("app = ClientApp()", "app = ClientApp(mods=[{mod}])"),
        ),
        1500.0,
        (("num-server-rounds", 1),),
    ),
}
#: epsilon of the null copies (noise standard deviation 2 * 4.84 / epsilon = 9.7e4 per float).
NULL_EPSILON = 1e-4
#: epsilon of the --check-engine copy (noise standard deviation 9.7e-5: uploads comparable).
CHECK_EPSILON = 1e5
#: Attacks not counted by default (see the module docstring).
SKIPPED = ("generic-mf-ratings-estimated",)


def app_copy(folder: Path, epsilon: float, app: str = "localdp_mf") -> Path:
    """A copy of test app ``app`` under ``folder`` with ``LocalDpMod(..., epsilon=epsilon)``."""
    dst = folder / f"{app}_eps{epsilon:g}"
    if not dst.exists():
        shutil.copytree(APPS / app, dst, ignore=shutil.ignore_patterns("__pycache__"))
        path = dst / app / "client_app.py"
        text = path.read_text()
        mod = f"LocalDpMod(clipping_norm=1.0, sensitivity=2.0, epsilon={epsilon!r}, delta=1e-5)"
        for old, new in APP_SPECS[app].edits:
            if old not in text:
                raise PrivauditError(f"{path}: no {old.strip()!r} to replace (the app changed; update APP_SPECS)")
            text = text.replace(old, new.format(mod=mod))
        path.write_text(text)
    return dst


def _fresh_import(app: Any) -> None:
    """Forget the app package's modules: each app copy defines the same package name."""
    package = app.clientapp.split(".")[0]
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if "_eps" not in Path(p).name]
    sys.path.insert(0, str(app.root))


def record_in_process(app_dir: Path, clients: int, seed: int, **overrides: Any) -> Any:
    """The transcript ``privaudit record --flower`` builds, the simulation replaced by a loop-back
    Grid in this process (NumPy's and Python's global generators seeded with ``seed``: the
    LocalDpMod noise, FedAvg's node order)."""
    from flwr.app import Context, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from privaudit.integrations import _flower_grid as fg
    from privaudit.integrations import flower
    from privaudit.integrations._flower_mods import dp_mods

    app = flower.load_app(app_dir)
    _fresh_import(app)
    cfg = {**app.config, **overrides, "seed": int(seed)}
    server_app, client_app = flower._attr(app, app.serverapp), flower._attr(app, app.clientapp)
    with tempfile.TemporaryDirectory(prefix="pa-fc-") as run_dir:
        rec = flower.FlowerRecorder(app.schema, Path(run_dir))
        rec.client_dp = dp_mods(client_app)
        truth = fg.private_data_mod(flower._attr(app, app.private_data), run_dir)
        client_app = fg.with_mods(client_app, [truth])
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
        grid = _LoopGrid(client_app, cfg, clients, first_id=5000, stride=11, run_id=7)
        rec.start(cfg, flower._attr(app, app.public_info)(cfg))
        context = Context(run_id=7, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=cfg)
        np.random.seed(seed % 2**32)  # Flower's LocalDpMod draws from NumPy's global generator,
        random.seed(seed)  # and FedAvg samples the nodes (their order: which draw is whose) with Python's
        server_app(fg.RecordingGrid(grid, rec), context)
        return rec.transcript(app=app.name, seed=int(seed), defenses=flower.recorded_defenses(rec))


def record_with_ray(app_dir: Path, clients: int, seed: int, **overrides: Any) -> Any:
    """The transcript of ``privaudit record --flower`` (Flower's simulation engine, Ray)."""
    from privaudit.integrations.flower import record

    return record(app_dir, clients=clients, run_config={**overrides, "seed": int(seed)}, cpus_per_client=1).transcript


def _by_truth(t: Any) -> dict[bytes, str]:
    """party -> a key of its private data (the Ray engine ranks nodes by random ids)."""
    out = {}
    for m in t.messages:
        if m.kind == "private":
            out[b"".join(np.ascontiguousarray(m.payload[k]).tobytes() for k in sorted(m.payload))] = m.sender
    return out


def compare(a: Any, b: Any) -> dict[str, Any]:
    """How two transcripts of one app and seed differ: the largest absolute difference of the
    clients' uploads (matched by their private data) and whether everything else agrees."""
    ka, kb = _by_truth(a), _by_truth(b)
    same = set(ka) == set(kb) and len(a.parties) == len(b.parties)
    rename = {ka[k]: kb[k] for k in ka if k in kb}
    rename["server"] = "server"

    def key(m: Any, names: dict[str, str]) -> tuple:
        return (m.round, names.get(m.sender, m.sender), names.get(m.receiver, m.receiver), m.kind)

    ma = {key(m, rename): m for m in a.messages}
    mb = {key(m, {}): m for m in b.messages}
    same = same and set(ma) == set(mb)
    worst = 0.0
    for k in set(ma) & set(mb):
        pa, pb = ma[k].payload, mb[k].payload
        if set(pa) != set(pb) or any(np.shape(pa[x]) != np.shape(pb[x]) for x in pa):
            same = False
            continue
        for x in pa:
            va, vb = np.asarray(pa[x]), np.asarray(pb[x])
            if va.dtype.kind in "iub" or ma[k].kind == "private":
                same = same and bool(np.array_equal(va, vb))
            elif va.size:
                worst = max(worst, float(np.max(np.abs(va.astype(float) - vb.astype(float)))))
    da = [{k: v for k, v in d.items() if k != "reported_by_clients"} for d in a.config.get("defenses", [])]
    db = [{k: v for k, v in d.items() if k != "reported_by_clients"} for d in b.config.get("defenses", [])]
    return {"same_structure": bool(same and da == db), "max_abs_diff": worst, "messages": len(ma)}


# --------------------------------------------------------------------------- auditing and pooling


def attack_classes(names: list[str] | None) -> list[type]:
    """The attacks an audit of a Flower transcript runs (``names``, or all but :data:`SKIPPED`)."""
    out = [
        cls for name, cls in registry.available("attack").items() if "flower" in (getattr(cls, "protocols", ()) or ())
    ]
    if names:
        return [registry.get("attack", n) for n in names]
    return [cls for cls in out if cls.name not in SKIPPED]


def audit_points(t: Any, classes: list[type]) -> dict[str, Any]:
    """attack -> its point on transcript ``t`` (JSON-able), or the reason it gives none."""
    from privaudit.integrations.recorded import transcript_point
    from privaudit.results import jsonable

    out = {}
    for cls in classes:
        point, reason = transcript_point(cls, t)
        out[cls.name] = jsonable(point) if point is not None else {"reason": reason}
    return out


def one_recording(app: str, eps: float, seed: int, clients: int, folder: str, classes: list[str]) -> dict[str, Any]:
    """Record seed ``seed`` of the app copy with ``LocalDpMod(..., epsilon=eps)`` and audit it."""
    logging.disable(logging.WARNING)  # Flower's INFO lines per message
    app_dir = app_copy(Path(folder), eps, app)
    with contextlib.redirect_stdout(io.StringIO()):
        t = record_in_process(app_dir, clients, seed, **dict(APP_SPECS[app].overrides))
    return audit_points(t, attack_classes(classes))


def without_null_arm(point: dict[str, Any]) -> dict[str, Any]:
    """``point`` without the attack's null-view arm (the recorded path's verdict before it had one)."""
    out = {k: v for k, v in point.items() if k != "baseline_null"}
    out["bootstrap"] = {
        m: {k: v for k, v in b.items() if k not in ("null", "se_vs_null")}
        for m, b in point.get("bootstrap", {}).items()
    }
    return out


def experiment(points: list[dict[str, Any]], cls: type, null_arm: bool = True) -> str:
    """The verdict of ``cls`` pooled over the recordings' ``points`` (one per seed)."""
    from privaudit.integrations.recorded import pooled_verdict

    usable = [p[cls.name] for p in points]
    if any("reason" in p for p in usable):
        return "not applicable"
    return pooled_verdict(cls, usable if null_arm else [without_null_arm(p) for p in usable], defended=True)["verdict"]


def table(
    records: list[dict[str, Any]], classes: list[type], seeds: int, null_arm: bool = True
) -> dict[str, dict[str, Any]]:
    """Per attack (and "any"), over the experiments of ``seeds`` disjoint consecutive recordings:
    ``n`` (experiments where the attack applies), ``leaks``, ``below`` ("attack below prior") and
    ``verdicts`` (verdict -> count)."""
    n = len(records) // seeds
    counts: dict[str, dict[str, Any]] = {
        c.name: {"leaks": 0, "below": 0, "n": 0, "verdicts": Counter()} for c in classes
    }
    counts["any"] = {"leaks": 0, "below": 0, "n": n, "verdicts": Counter()}
    for e in range(n):
        group = records[e * seeds : (e + 1) * seeds]
        verdicts = {c.name: experiment(group, c, null_arm) for c in classes}
        for name, v in verdicts.items():
            counts[name]["verdicts"][v] += 1
            if v == "not applicable":
                continue
            counts[name]["n"] += 1
            counts[name]["leaks"] += v == "leaks"
            counts[name]["below"] += v == "attack below prior"
        counts["any"]["leaks"] += any(v == "leaks" for v in verdicts.values())
        counts["any"]["below"] += any(v == "attack below prior" for v in verdicts.values())
    return counts


def _cached(
    cache: Path, app: str, eps: float, seed: int, clients: int, folder: str, classes: list[str]
) -> dict[str, Any]:
    path = cache / f"{app}-eps{eps:g}-c{clients}-s{seed}-{'+'.join(classes) or 'default'}.json"
    if path.exists():
        return json.loads(path.read_text())
    got = one_recording(app, eps, seed, clients, folder, classes)
    path.write_text(json.dumps(got, allow_nan=True))
    return got


def recordings(
    app: str, eps: float, n: int, first: int, clients: int, jobs: int, cache: Path, classes: list[str]
) -> list[dict]:
    """``n`` audited recordings of seeds ``first``, ``first + 1``, ... (cached in ``cache``)."""
    from joblib import Parallel, delayed

    folder = str(cache / "apps")
    Path(folder).mkdir(parents=True, exist_ok=True)
    app_copy(Path(folder), eps, app)  # made once, before parallel workers read it
    return Parallel(n_jobs=jobs)(
        delayed(_cached)(cache, app, eps, first + i, clients, folder, classes) for i in range(n)
    )


def _cp(k: int, n: int) -> str:
    return f"{k / n:.3f} ({clopper_pearson(k, n)[1]:.3f})" if n else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recordings", type=int, default=600, help="null recordings (seeds 0..N-1)")
    ap.add_argument("--power-recordings", type=int, default=90, help="weak-leak recordings (seeds 10^6..)")
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--seed-counts", default="1,2,3")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--null-epsilon", type=float, default=NULL_EPSILON, help="the null copy's LocalDpMod epsilon")
    ap.add_argument("--app", choices=sorted(APP_SPECS), default="localdp_mf", help="the test app")
    ap.add_argument(
        "--weak-epsilon", type=float, default=0.0, help="the weak-leak copy's LocalDpMod epsilon (default: the app's)"
    )
    ap.add_argument(
        "--attacks", default="", help="comma-separated attacks (default: all but " + ", ".join(SKIPPED) + ")"
    )
    ap.add_argument(
        "--no-null-arm", action="store_true", help="verdicts without the null-view arm (the recorded path before)"
    )
    ap.add_argument("--cache", default="", help="folder of the audited recordings (default: a temporary one)")
    ap.add_argument("--check-engine", type=int, default=0, metavar="N", help="compare N seeds with Ray recordings")
    args = ap.parse_args(argv)
    try:
        counts = [int(x) for x in args.seed_counts.split(",")]
    except ValueError:
        print(f"--seed-counts: expected integers, got {args.seed_counts!r}", file=sys.stderr)
        return 2
    if (
        args.clients < 2
        or args.recordings < 0
        or args.power_recordings < 0
        or any(s < 1 for s in counts)
        or not (args.null_epsilon > 0 and args.weak_epsilon >= 0)
    ):
        print("--clients must be >= 2, the recording counts >= 0, the seed counts >= 1, epsilons > 0", file=sys.stderr)
        return 2
    names = [a for a in args.attacks.split(",") if a]
    weak_eps = args.weak_epsilon or APP_SPECS[args.app].weak_epsilon
    classes = attack_classes(names)
    tmp = None
    if args.cache:
        cache = Path(args.cache)
        cache.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="pa-flowercal-")
        cache = Path(tmp.name)
    try:
        if args.check_engine:
            folder = cache / "apps"
            folder.mkdir(parents=True, exist_ok=True)
            app_dir = app_copy(folder, CHECK_EPSILON, args.app)
            print(
                "| seed | Ray s | in-process s | same parties, kinds, rounds, shapes, truth, defenses | max abs float diff |"
            )
            print("|---|---|---|---|---|")
            for seed in range(args.check_engine):
                t0 = time.perf_counter()
                over = dict(APP_SPECS[args.app].overrides)
                ray = record_with_ray(app_dir, args.clients, seed, **over)
                t1 = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):
                    loop = record_in_process(app_dir, args.clients, seed, **over)
                t2 = time.perf_counter()
                c = compare(loop, ray)
                print(f"| {seed} | {t1 - t0:.1f} | {t2 - t1:.2f} | {c['same_structure']} | {c['max_abs_diff']:.2e} |")
            return 0
        t0 = time.perf_counter()
        null = recordings(args.app, args.null_epsilon, args.recordings, 0, args.clients, args.jobs, cache, names)
        weak = recordings(args.app, weak_eps, args.power_recordings, 10**6, args.clients, args.jobs, cache, names)
        seconds = time.perf_counter() - t0
        print(
            f"{args.app}, {args.clients} clients; null: LocalDpMod epsilon {args.null_epsilon:g}, "
            f"{args.recordings} recordings (seeds from 0); weak leak: epsilon "
            f"{weak_eps:g}, {args.power_recordings} recordings; {seconds:.0f} s; share of "
            "experiments (95 % Clopper-Pearson upper bound)" + ("; WITHOUT the null arm" if args.no_null_arm else "")
        )
        print(
            '| seeds | attack | null experiments | null "leaks" | null "attack below prior" | null verdicts '
            '| weak-leak experiments | weak leak "leaks" |'
        )
        print("|---|---|---|---|---|---|---|---|")
        for s in counts:
            tn, tw = table(null, classes, s, not args.no_null_arm), table(weak, classes, s, not args.no_null_arm)
            for name in [c.name for c in classes] + ["any"]:
                n, w = tn[name], tw[name]
                if not n["n"] and not w["n"]:
                    continue
                power = f"{w['leaks'] / w['n']:.2f}" if w["n"] else "n/a"
                seen = ", ".join(f"{v} {c}" for v, c in n["verdicts"].most_common()) or "-"
                print(
                    f"| {s} | {name} | {n['n']} | {_cp(n['leaks'], n['n'])} | {_cp(n['below'], n['n'])} | {seen} "
                    f"| {w['n']} | {power} |"
                )
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())

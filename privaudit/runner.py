"""Execution shared by experiments and audits: tasks, protocol runs, attack evaluation, the
parallel map with progress, and the Dask scheduler context.

Nothing here consults the registry: a :class:`Task` carries the classes a resolved plan
(:mod:`privaudit.plan`) picked, and classes travel by reference to worker processes.

Worker processes exit when their parent dies: every task starts (once per process) a daemon
thread that ends the process as soon as its parent process is gone, and the parallel map turns
SIGTERM into a normal exit, which shuts the pool down.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import registry, schema
from privaudit.defenses import accounting
from privaudit.errors import PrivauditError
from privaudit.results import floats, point_bootstrap
from privaudit.transcript import is_client

__all__ = [
    "Task",
    "default_jobs",
    "check_run_settings",
    "load_data",
    "subsample_users",
    "point_streams",
    "run_protocol",
    "evaluate_attack",
    "decision_rocs",
    "decision_epsilons",
    "defense_privacy",
    "show_progress",
    "parallel_map",
    "scheduler_context",
]

#: Seconds between two checks of a worker process for a vanished parent.
PARENT_POLL_SECONDS = 0.5


def default_jobs() -> int:
    """Default ``--jobs``: every core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def check_run_settings(seeds: int, seed: int, jobs: int) -> None:
    """One-line errors for a bad number of seeds, base seed or number of jobs."""
    for name, value in (("--seeds", seeds), ("--seed", seed), ("--jobs", jobs)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise PrivauditError(f"{name} must be an integer, got {value!r}")
    if int(seeds) < 1:
        raise PrivauditError(f"--seeds must be at least 1, got {seeds}")
    if int(seed) < 0:
        raise PrivauditError(f"--seed must be non-negative, got {seed}")
    if int(seed) + int(seeds) > 2**63:
        raise PrivauditError(f"--seed must be below 2**63 - seeds, got {seed}")
    if int(jobs) == 0 or int(jobs) < -1:
        raise PrivauditError(f"--jobs must be a positive number of processes or -1 (all cores), got {jobs}")


# ------------------------------------------------------------------------------ data


def load_data(data: Any = "synthetic") -> Any:
    """The dataset named by ``data``: ``"synthetic"`` (the built-in generator), a path
    (:func:`privaudit.data.load_dataset`) or a :class:`~privaudit.data.RatingsDataset` as is."""
    if data is None or (isinstance(data, str) and data.strip().lower() == "synthetic"):
        from privaudit.data import synthetic

        return synthetic()
    if isinstance(data, (str, Path)):
        from privaudit.data import load_dataset

        return load_dataset(data)
    return data


def subsample_users(dataset: Any, users: int | None, seed: int) -> Any:
    """``users`` users drawn without replacement (kept in their original order), seeded by
    ``seed``; the dataset unchanged when ``users`` is None or equal to its size; more users
    than it has is an error."""
    if users is None:
        return dataset
    users = int(users)
    if users < 1:
        raise PrivauditError(f"--users must be at least 1, got {users}")
    if int(seed) < 0:
        raise PrivauditError(f"--seed must be non-negative, got {seed}")
    n = int(dataset.n_users)
    if users > n:
        raise PrivauditError(f"--users {users}: the dataset has only {n} users")
    if users == n:
        return dataset
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5EED]))
    idx = np.sort(rng.choice(n, size=users, replace=False))
    return dataset.subset_users(idx)


def point_streams(seed: int, index: int) -> tuple[np.random.SeedSequence, np.random.SeedSequence]:
    """Seed sequences of point (``seed``, value ``index``): (spare, attack). The protocol itself
    runs with the integer ``seed`` (common random numbers across swept values)."""
    protocol_ss, attack_ss = np.random.SeedSequence([int(seed), int(index)]).spawn(2)
    return protocol_ss, attack_ss


# ------------------------------------------------------------------------------ tasks


@dataclass
class Task:
    """One protocol run and the attacks on its transcript.

    ``variants``: (value index, value, attack params) per attack run; more than one only for
    attack sweeps, whose points share the protocol run of their seed. ``names`` are the
    registered names of the protocol, the attack and the defenses, resolved in the main
    process (a plugin class registered under an entry-point name has no ``name`` of its own
    when a worker process re-imports it).
    """

    protocol_cls: type
    config: dict[str, Any]
    defense_specs: list[tuple[type, dict[str, Any]]]
    attack_cls: type
    seed: int
    variants: list[tuple[int, Any, dict[str, Any]]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)

    def _classes(self) -> list[type]:
        return [self.protocol_cls, self.attack_cls] + [cls for cls, _ in self.defense_specs]

    def __post_init__(self) -> None:
        if not self.names:
            self.names = [getattr(c, "name", "") or "" for c in self._classes()]

    def restore_names(self) -> None:
        """Register classes re-imported in a worker process under their names (no class is changed)."""
        kinds = ["protocol", "attack"] + ["defense"] * len(self.defense_specs)
        for kind, cls, name in zip(kinds, self._classes(), self.names):
            registry.adopt(kind, name, cls)


def run_protocol(task: Task, dataset: Any) -> tuple[Any, list[Any], float]:
    """Run ``task``'s protocol with its defenses and the integer seed -> (RunResult, the
    defense objects, seconds). The transcript records ``seed``."""
    _watch_parent()
    task.restore_names()
    defenses = [cls(**params) for cls, params in task.defense_specs]
    t0 = time.perf_counter()
    # common random numbers: the protocol (and the defenses' noise) draw from the seed alone
    result = task.protocol_cls().run(dataset, dict(task.config), defenses, int(task.seed))
    result.transcript.seed = task.seed
    seconds = time.perf_counter() - t0
    # the check a transcript file gets (privaudit.schema), composed with the defenses' declarations
    schema.validate(result.transcript)
    return result, defenses, seconds


def evaluate_attack(
    attack_cls: type,
    attack_params: Mapping[str, Any],
    transcript: Any,
    rng: np.random.Generator,
    privacy: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], float]:
    """``attack.evaluate`` on ``transcript`` -> (entry, seconds).

    The entry holds ``attack_metrics``, ``baseline_random`` (the uniform random guess),
    ``baseline_prior`` (the prior-only guess; empty when the attack provides none),
    ``baseline_null`` (the attack's own pipeline on the null view, when it ran),
    ``supported`` (and ``reason``), and for every per-record :class:`~privaudit.results.Decisions`
    its ROC summary under ``roc``; when ``privacy`` records a claimed epsilon (a DP defense), the
    empirical epsilon lower bound of every decision under ``empirical_epsilon``; under
    ``bootstrap`` the cluster-bootstrap summary of every metric the attack's victim table (or a
    decision set's AUC) covers (:func:`privaudit.results.point_bootstrap`).
    """
    t0 = time.perf_counter()
    outcome = attack_cls(**dict(attack_params)).evaluate(transcript, rng)
    recon = outcome.reconstruction
    out: dict[str, Any] = {
        "attack_metrics": floats(outcome.metrics),
        "baseline_random": floats(outcome.baseline),
        "baseline_prior": floats(getattr(outcome, "baseline_prior", None)),
        "supported": bool(recon.supported),
    }
    if getattr(outcome, "baseline_null", None):
        out["baseline_null"] = floats(outcome.baseline_null)
    if not recon.supported:
        out["reason"] = recon.reason
    decisions = getattr(outcome, "decisions", None) or {}
    if recon.supported:
        boot = point_bootstrap(out["attack_metrics"], getattr(outcome, "victims", None), decisions)
        if boot:
            out["bootstrap"] = boot
    if decisions and recon.supported:
        out["roc"] = decision_rocs(decisions)
        claimed = [v for v in (privacy or {}).values() if isinstance(v, Mapping) and "epsilon" in v]
        if claimed:
            out["empirical_epsilon"] = decision_epsilons(decisions, claimed)
    return out, time.perf_counter() - t0


def decision_rocs(decisions: Mapping[str, Any]) -> dict[str, Any]:
    """ROC summary (:func:`privaudit.metrics.roc_summary`) of every decision set, with its
    ``positive`` label and, beside every resolvable ``tpr@f``, ``tpr@f_ci95``: its 95 %
    bootstrap interval (:func:`privaudit.results.stats.tpr_interval`)."""
    from privaudit.metrics import roc_summary
    from privaudit.results.stats import tpr_interval

    out = {}
    for name, d in decisions.items():
        roc = roc_summary(d.labels, d.scores)
        roc["positive"] = str(getattr(d, "positive", "positive"))
        for key in [k for k in roc if k.startswith("tpr@")]:
            if math.isfinite(float(roc[key])):  # 95 % bootstrap interval over victims (records without ids)
                roc[key + "_ci95"] = list(tpr_interval(d, float(key[4:])))
        out[str(name)] = roc
    return out


def decision_epsilons(decisions: Mapping[str, Any], claimed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Empirical epsilon lower bound of every decision set against the claimed total epsilon
    (the sum over the DP defenses, at the largest of their deltas); ``violation`` when the
    bound exceeds the claim."""
    from privaudit.metrics import empirical_epsilon

    eps = float(sum(float(c["epsilon"]) for c in claimed))
    delta = max(float(c.get("delta", 0.0) or 0.0) for c in claimed)
    out = {}
    for name, d in decisions.items():
        e = empirical_epsilon(d.labels, d.scores, delta=delta)
        e["claimed_epsilon"] = eps
        e["delta"] = delta
        lb = e.get("epsilon_lb")
        e["violation"] = bool(lb is not None and np.isfinite(lb) and lb > eps)
        out[str(name)] = e
    return out


def defense_privacy(defenses: Sequence[Any], transcript: Any, names: Sequence[str] | None = None) -> dict[str, Any]:
    """``privacy_spent`` of every defense that reports one, for the rounds a client took part in:
    the release count the transcript's protocol declares (``Protocol.release_count``, rounds run
    whether recorded or not), or, when it declares none, the most distinct rounds any client
    uploaded in the transcript; ``rounds_source`` says which (``"protocol"``/``"recorded"``).
    Keyed by ``names`` when given (the registered names). Numbers become floats; strings
    (``unit``, ``accountant``) are kept."""
    rounds_by_client: dict[str, set[int]] = {}
    for m in transcript.messages:
        if m.sender != m.receiver and is_client(m.sender):
            rounds_by_client.setdefault(m.sender, set()).add(m.round)
    rounds = max((len(r) for r in rounds_by_client.values()), default=0)
    declared = accounting.declared_releases(transcript.protocol, transcript.config)
    source = "recorded" if declared is None else "protocol"
    rounds = rounds if declared is None else max(rounds, declared)
    out: dict[str, Any] = {}
    for k, d in enumerate(defenses):
        spent = d.privacy_spent(rounds)
        if spent:
            name = names[k] if names is not None and k < len(names) and names[k] else d.name
            entry: dict[str, Any] = {"rounds": rounds, "rounds_source": source}
            for key, v in spent.items():
                entry[key] = v if isinstance(v, str) else float(v)
            out[name] = entry
    return out


# ------------------------------------------------------------------------------ parallel map


#: Environment variable naming the process that started a parallel run (inherited by workers).
PARENT_ENV = "PRIVAUDIT_PARENT_PID"
_WATCHING = {"pid": None}


def _worker_start(parent: int) -> None:
    """Initializer of local worker processes: watch ``parent`` from the start."""
    os.environ[PARENT_ENV] = str(int(parent))
    _watch_parent()


def _watch_parent() -> None:
    """In a worker process of a parallel run, end the process once the process that started
    the run is gone (a daemon thread, started once per process)."""
    pid = os.getpid()
    try:
        parent = int(os.environ.get(PARENT_ENV, "0"))
    except ValueError:
        return
    if parent <= 0 or parent == pid or _WATCHING["pid"] == pid:
        return
    _WATCHING["pid"] = pid

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_SECONDS)
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                os._exit(1)
            except OSError:  # alive, owned by someone else
                pass

    threading.Thread(target=watch, name="privaudit-parent-watch", daemon=True).start()


def show_progress(progress: bool | None) -> bool:
    """Whether to show a progress bar: ``progress`` if given, else whether stderr is a terminal."""
    if progress is None:
        try:
            return sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False
    return bool(progress)


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """Inside: SIGTERM raises SystemExit(143) (so pools are shut down on the way out)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):  # noqa: ARG001 - signal API
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _restore_env(previous: str | None) -> None:
    if previous is None:
        os.environ.pop(PARENT_ENV, None)
    else:
        os.environ[PARENT_ENV] = previous


def _shutdown_pool() -> None:
    try:
        from joblib.externals.loky import get_reusable_executor

        get_reusable_executor().shutdown(wait=False, kill_workers=True)
    except Exception:  # pragma: no cover - best effort on the way out
        pass


#: numpy warnings of a mean over no values (e.g. attribute accuracy on a CSV without
#: attributes): the NaN they return is reported as n/a, so the warning only adds noise
_NAN_WARNINGS = ("Mean of empty slice", "invalid value encountered in scalar divide")
#: an estimate is printed once the rest of a parallel map is expected to take longer (seconds)
ESTIMATE_ABOVE_SECONDS = 60.0
#: without a progress bar (not a terminal), a progress line at most this often (seconds)
PROGRESS_LINE_SECONDS = 120.0


@contextlib.contextmanager
def quiet_nan_warnings() -> Iterator[None]:
    """Inside: numpy's empty-mean warnings (:data:`_NAN_WARNINGS`) are not shown."""
    import warnings

    with warnings.catch_warnings():
        for text in _NAN_WARNINGS:
            warnings.filterwarnings("ignore", message=text, category=RuntimeWarning)
        yield


def _quiet_call(fn: Callable[..., Any], item: Any, *args: Any) -> Any:
    with quiet_nan_warnings():
        return fn(item, *args)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class _Progress:
    """The tqdm bar (a terminal) or, for a long map, plain lines; plus one estimate line."""

    def __init__(self, total: int, desc: str, bar: bool, workers: int) -> None:
        from tqdm.auto import tqdm

        self.total, self.desc, self.workers = total, desc or "runs", max(1, workers)
        self.bar = tqdm(total=total, desc=desc, unit="run", disable=not bar, leave=False, file=sys.stderr)
        self.plain = not bar
        self.t0 = self.last = time.perf_counter()
        self.done = 0
        self.first = self.t0
        self.estimated = False

    def _say(self, text: str) -> None:
        if self.plain:
            print(text, file=sys.stderr, flush=True)
        else:
            self.bar.write(text, file=sys.stderr)

    def update(self) -> None:
        self.done += 1
        self.bar.update(1)
        now = time.perf_counter()
        if self.done == 1:
            self.first = now  # the first result carries one-time costs (imports, caches): rate from here
        left = self.total - self.done
        if not left or self.done < self.workers + 1 or now <= self.first:
            return
        remaining = left * (now - self.first) / (self.done - 1)
        elapsed = now - self.t0
        if not self.estimated and remaining > ESTIMATE_ABOVE_SECONDS:
            self.estimated = True
            self.last = now
            self._say(
                f"{self.desc}: {self.done}/{self.total} runs in {_duration(elapsed)}; "
                f"about {_duration(remaining)} left ({self.workers} at a time)"
            )
        elif self.plain and self.estimated and now - self.last >= PROGRESS_LINE_SECONDS:
            self.last = now
            self._say(f"{self.desc}: {self.done}/{self.total} runs in {_duration(elapsed)}")

    def close(self) -> None:
        self.bar.close()


def parallel_map(
    fn: Callable[..., Any],
    items: Sequence[Any],
    *args: Any,
    jobs: int = 1,
    progress: bool | None = None,
    desc: str = "",
    parallel: bool | None = None,
    backend: str | None = None,
) -> list[Any]:
    """``[fn(item, *args) for item in items]`` in order, on ``jobs`` joblib processes (-1: all
    cores). ``backend`` None: local loky processes whose initializer watches this process;
    ``"active"``: the backend set by the caller (the Dask backend of :func:`scheduler_context`).

    Progress on stderr: a tqdm bar with its estimate when :func:`show_progress` (a terminal);
    either way, once the rest is expected to take over :data:`ESTIMATE_ABOVE_SECONDS`, one
    estimate line, and without a bar a progress line every :data:`PROGRESS_LINE_SECONDS`.
    numpy's empty-mean warnings are not shown (:func:`quiet_nan_warnings`).

    ``parallel`` None: parallel when ``jobs != 1`` and there is more than one item. On any exit
    (an exception, SIGTERM, Ctrl-C) the worker processes are shut down.
    """
    if parallel is None:
        parallel = jobs != 1 and len(items) > 1
    if not parallel:
        workers = 1
    elif backend is not None:
        workers = len(items)  # a cluster: its size is not known here
    else:
        workers = min(len(items), default_jobs() if jobs < 0 else jobs, os.cpu_count() or 1)
    bar = _Progress(len(items), desc, show_progress(progress), workers)
    out: list[Any] = []
    try:
        if not parallel:
            for item in items:
                out.append(_quiet_call(fn, item, *args))
                bar.update()
            return out
        from joblib import Parallel, delayed

        previous = os.environ.get(PARENT_ENV)
        os.environ[PARENT_ENV] = str(os.getpid())  # workers watch this process (_watch_parent)
        kwargs: dict[str, Any] = {}
        if backend is None:
            from joblib._parallel_backends import LokyBackend

            kwargs["backend"] = LokyBackend(initializer=_worker_start, initargs=(os.getpid(),))
        ok = False
        with _sigterm_exits():
            try:
                for r in Parallel(n_jobs=jobs, return_as="generator", **kwargs)(
                    delayed(_quiet_call)(fn, item, *args) for item in items
                ):
                    out.append(r)
                    bar.update()
                ok = True
            finally:
                _restore_env(previous)
                if not ok:
                    _shutdown_pool()
        return out
    finally:
        bar.close()


@contextlib.contextmanager
def scheduler_context(scheduler: str | None) -> Iterator[str | None]:
    """Run joblib work on Dask while inside: ``scheduler`` is a Dask scheduler address or
    ``local:N`` (a local cluster of N single-threaded worker processes); None: local joblib.
    Yields a description of the backend."""
    if not scheduler:
        yield None
        return
    try:
        from dask.distributed import Client
    except ImportError:  # pragma: no cover - dask is a declared extra
        from privaudit.errors import MissingDependencyError

        raise MissingDependencyError("dask[distributed]", "dask") from None
    import joblib

    from privaudit._local_cluster import local_cluster, local_workers

    stack = contextlib.ExitStack()
    text = str(scheduler).strip()
    workers = local_workers(text)  # local:N capped like `run` (one-line error before any process)
    previous = os.environ.get(PARENT_ENV)
    os.environ[PARENT_ENV] = str(os.getpid())  # local Dask workers watch this process too
    if workers is not None:
        client = Client(stack.enter_context(local_cluster(workers)))  # loopback only, scratch removed
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
        stack.close()
        _restore_env(previous)

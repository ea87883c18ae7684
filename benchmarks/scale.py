"""Scale: time and peak memory of every stage of a FedMVMF audit at 100K, 1M and 10M ratings.

For each size (synthetic presets ``ml-100k-size``, ``ml-1m-size``, ``ml-10m-size``; each in a
fresh subprocess so that peak memory is its own) the stages are:

- dataset: ``load_dataset("synthetic:<preset>")``;
- protocol: ``fedmvmf`` with only the recorded rounds (``epochs = record_rounds = 2``, the two
  rounds the attack needs), including its utility evaluation, reported apart as ``of which
  utility`` (``fedmvmf.ranking_utility``, wrapped with a timer: it ranks every training item
  for every user, so it costs users x items, not ratings);
- attack in memory: ``mvmf-analytic`` on the server's view of the protocol's transcript (view,
  prior knowledge, run), after a warm-up of the whole pipeline on 40 users (imports);
- save / load: the transcript to and from a ``.ptx`` file (format 2) in a temporary folder
  (``SCALE_TMP`` chooses another), and its member count;
- cp: ``cp --reflink=never`` of that file to the same folder, then an fsync of the copy (the
  save fsyncs too); its CPU is cp's own (user + system);
- attack: the same attack on the loaded transcript (memory-mapped payloads);
- scoring: ``score`` and the random/majority ``baseline`` against the clients' private data.

Each stage reports wall seconds, process CPU seconds, microseconds of wall time per rating,
and peak resident memory (sampled every 5 ms from ``/proc/self/statm``; the stage's peak
minus the resident size when it started is printed as ``+MiB``). Then the per-rating cost
ratio of every stage between consecutive sizes (1.0 = linear in the ratings), and the targets:
ML-1M-sized fedmvmf + attack + scoring under 5 s wall; 10M: protocol + attack + scoring under
60 s wall and the whole run under 8 GiB peak; per size, save and load against cp + fsync (each
<= 2x), the members (< 1,000) and the attack from the file against in memory (<= 1.5x).

``--stream-rss SIZES`` instead runs fedmvmf and writes its transcript twice per size, each in a
fresh process: kept in memory then saved, and streamed (``transcript_io.streaming``, as
``privaudit run -o`` does); it prints each one's wall time and peak RSS. ``--rounds N`` sets the
recorded rounds of every run.

With ``--repeat N`` every size runs N times (each in a fresh subprocess) and each stage
reports its fastest run (wall; its CPU beside it), as ``timeit`` does; the pipeline totals
are printed for the first run and for the fastest stages. Each subprocess first measures how
long this machine takes to touch fresh memory (256 MiB, twice): on a virtual machine whose
guest memory is backed lazily by the host, the first touch of memory can cost far more than
the work done on it, and the first run of a size pays it.

    python benchmarks/scale.py [--sizes 100k,1m,10m] [--seed 0] [--repeat 1] [--rounds 2]
    python benchmarks/scale.py --stream-rss 1m [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SIZES = {"100k": "ml-100k-size", "1m": "ml-1m-size", "10m": "ml-10m-size"}
STAGES = ("dataset", "protocol", "utility", "attack in memory", "save", "cp", "load", "attack", "scoring")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


class Stage:
    """Wall/CPU seconds and peak RSS of a block (a thread samples RSS every 5 ms)."""

    def __init__(self, out: dict, name: str):
        self.out, self.name = out, name

    def __enter__(self):
        self.start_rss = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())
        self.out[self.name] = {"wall": wall, "cpu": cpu, "peak": self.peak, "delta": self.peak - self.start_rss}


def first_touch(mib: int = 256) -> list[float]:
    """Seconds per GiB to allocate and write ``mib`` MiB of fresh memory, twice in a row."""
    import numpy as np

    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        a = np.ones(mib * 2**17)  # float64: mib MiB
        out.append((time.perf_counter() - t0) * 1024 / mib)
        del a
    return out


def _protocol(st: dict, ds, seed: int, rounds: int):
    """The fedmvmf run (``epochs = record_rounds = rounds``), its utility evaluation timed apart."""
    from privaudit.protocols import fedmvmf

    utility_seconds = [0.0, 0.0]
    original = fedmvmf.ranking_utility

    def timed_utility(*a, **k):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return original(*a, **k)
        finally:
            utility_seconds[0] += time.perf_counter() - t0
            utility_seconds[1] += time.process_time() - c0

    fedmvmf.ranking_utility = timed_utility
    try:
        with Stage(st, "protocol"):
            run = fedmvmf.FedMVMF().run(ds, {"epochs": rounds, "record_rounds": rounds}, rng=seed)
    finally:
        fedmvmf.ranking_utility = original
    st["utility"] = {"wall": utility_seconds[0], "cpu": utility_seconds[1], "peak": st["protocol"]["peak"], "delta": 0}
    return run


def _attack(transcript, seed: int):
    """mvmf-analytic on the server's view (view, prior knowledge, run): the reconstruction."""
    import numpy as np

    from privaudit.registry import get

    attack = get("attack", "mvmf-analytic")()
    rng = np.random.default_rng(seed)
    view = transcript.view(attack.party)
    ok, reason = attack.applicable(view)
    if not ok:
        raise SystemExit(f"mvmf-analytic does not apply: {reason}")
    return attack, attack.run(view, attack.prior_knowledge(transcript, rng), rng)


def _copy(src: Path, dst: Path) -> None:
    """``cp`` of the transcript's bytes to the same folder (a real copy, no reflink), then an
    fsync of the copy: the same work and durability as a save."""
    subprocess.run(["cp", "--reflink=never", str(src), str(dst)], check=True)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _warm_up(seed: int) -> None:
    """The whole pipeline once on 40 users, so that no stage below pays for imports."""
    from privaudit.data import load_dataset
    from privaudit.protocols.fedmvmf import FedMVMF

    ds = load_dataset(f"synthetic:users=40,seed={seed}")
    transcript = FedMVMF().run(ds, {"epochs": 2, "record_rounds": 2}, rng=seed).transcript
    attack, recon = _attack(transcript, seed)
    attack.score(recon, transcript)
    attack.baseline(transcript)


def one(size: str, seed: int, rounds: int) -> dict:
    """Run every stage at one size in this process; a JSON-able dict."""
    import resource
    import zipfile

    from privaudit.data import load_dataset
    from privaudit.transcript import load

    res: dict = {"size": size, "stages": {}, "first_touch": first_touch()}
    st = res["stages"]
    _warm_up(seed)
    with Stage(st, "dataset"):
        ds = load_dataset(f"synthetic:{SIZES[size]},seed={seed}")
    res["ratings"] = int(ds.n_ratings)
    res["shape"] = [int(ds.n_users), int(ds.n_items)]
    run = _protocol(st, ds, seed, rounds)
    transcript = run.transcript
    res["messages"] = len(transcript)
    del run, ds
    with Stage(st, "attack in memory"):
        attack, recon_memory = _attack(transcript, seed)
    with tempfile.TemporaryDirectory(dir=os.environ.get("SCALE_TMP")) as tmp:
        path = Path(tmp) / "run.ptx"
        with Stage(st, "save"):
            transcript.save(path)
        res["file_bytes"] = path.stat().st_size
        with zipfile.ZipFile(path) as zf:
            res["members"] = len(zf.infolist())
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        with Stage(st, "cp"):
            _copy(path, Path(tmp) / "copy.ptx")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        st["cp"]["cpu"] += after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime  # cp's own
        os.unlink(Path(tmp) / "copy.ptx")
        del transcript
        with Stage(st, "load"):
            transcript = load(path, max_bytes=16 * 2**30)  # our own file; 10M needs > the default
        with Stage(st, "attack"):
            _, recon = _attack(transcript, seed)
        with Stage(st, "scoring"):
            metrics = attack.score(recon, transcript)
            baseline = attack.baseline(transcript)
        memory_metrics = attack.score(recon_memory, transcript)
    res["metrics"] = {k: float(v) for k, v in metrics.items()}
    res["same_metrics"] = {k: float(v) for k, v in memory_metrics.items()} == res["metrics"]
    res["baseline"] = {k: float(v) for k, v in baseline.items()}
    res["peak"] = max(s["peak"] for s in st.values())
    return res


def one_stream(size: str, seed: int, rounds: int, stream: bool) -> dict:
    """Protocol run and transcript write at one size, streamed (``transcript_io.streaming``,
    as ``privaudit run -o`` does) or kept in memory and saved after the run; peak RSS."""
    import resource

    from privaudit.data import load_dataset
    from privaudit.protocols.fedmvmf import FedMVMF
    from privaudit.transcript_io import streaming

    res: dict = {"size": size, "stream": stream, "stages": {}}
    st = res["stages"]
    ds = load_dataset(f"synthetic:{SIZES[size]},seed={seed}")
    cfg = {"epochs": rounds, "record_rounds": rounds}
    with tempfile.TemporaryDirectory(dir=os.environ.get("SCALE_TMP")) as tmp:
        path = Path(tmp) / "run.ptx"
        with Stage(st, "run + write"):
            if stream:
                with streaming(path) as s:
                    run = FedMVMF().run(ds, cfg, rng=seed)
                    s.finish(run.transcript)
            else:
                run = FedMVMF().run(ds, cfg, rng=seed)
                run.transcript.save(path)
        res["file_bytes"] = path.stat().st_size
    res["messages"] = len(run.transcript)
    res["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return res


def _child(args: list[str]) -> dict:
    """Run this script with ``args`` in a fresh subprocess; its JSON result."""
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: failed\n{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print_stages(r: dict) -> None:
    acc = r["metrics"]
    print(
        f"\n{r['size']}: {r['shape'][0]} users x {r['shape'][1]} items, {r['ratings']} ratings, "
        f"{r['messages']} messages, transcript {r['file_bytes'] / 2**20:.0f} MiB in {r['members']} members; "
        f"rating_accuracy {acc['rating_accuracy']:.4f} (majority baseline "
        f"{r['baseline']['rating_accuracy_majority']:.4f}), attribute_accuracy {acc['attribute_accuracy']:.4f}; "
        f"peak RSS {r['peak'] / 2**30:.2f} GiB"
    )
    print(f"  {'stage':18s}{'wall s':>9s}{'cpu s':>9s}{'us/rating':>11s}{'peak MiB':>10s}{'+MiB':>8s}")
    for name in STAGES:
        s = r["stages"][name]
        label = "  of which utility" if name == "utility" else name
        print(
            f"  {label:18s}{s['wall']:9.2f}{s['cpu']:9.2f}{1e6 * s['wall'] / r['ratings']:11.3f}"
            f"{s['peak'] / 2**20:10.0f}{s['delta'] / 2**20:8.0f}"
        )


def _print_file_targets(r: dict) -> None:
    s = r["stages"]
    cp, mem = s["cp"]["wall"], s["attack in memory"]["wall"]
    from_file = s["load"]["wall"] + s["attack"]["wall"]
    print(
        f"\n{r['size']} file: {r['members']} members (target < 1000); save {s['save']['wall']:.2f} s = "
        f"{s['save']['wall'] / cp:.2f}x and load {s['load']['wall']:.2f} s = {s['load']['wall'] / cp:.2f}x "
        f"cp + fsync of the same {r['file_bytes'] / 2**20:.0f} MiB ({cp:.2f} s; targets <= 2)"
    )
    print(
        f"{r['size']} attack from the file: load + attack {from_file:.2f} s ({s['attack']['wall']:.2f} s attack) "
        f"vs {mem:.2f} s in memory = {from_file / mem:.2f}x ({s['attack']['wall'] / mem:.2f}x without the load; "
        f"target <= 1.5); same scores: {r['same_metrics']}"
    )


def _print_totals(label: str, r: dict) -> None:
    s = r["stages"]
    pipeline = sum(s[k]["wall"] for k in ("protocol", "attack", "scoring"))
    cpu = sum(s[k]["cpu"] for k in ("protocol", "attack", "scoring"))
    if r["size"] == "1m":
        print(f"\n1m ({label}): fedmvmf + attack + scoring {pipeline:.2f} s wall ({cpu:.2f} s cpu); target < 5 s wall")
    if r["size"] == "10m":
        print(
            f"\n10m ({label}): protocol (2 recorded rounds) + attack + scoring {pipeline:.2f} s wall "
            f"({cpu:.2f} s cpu), peak {r['peak'] / 2**30:.2f} GiB; targets < 60 s, < 8 GiB"
        )


def _stream_table(sizes: list[str], seed: int, rounds: int) -> None:
    print(f"\nstreaming writes: fedmvmf run + transcript write, {rounds} recorded rounds, fresh process each")
    print(f"  {'size':6s}{'mode':>22s}{'wall s':>9s}{'peak RSS MiB':>14s}{'+MiB':>8s}{'ru_maxrss MiB':>15s}")
    for size in sizes:
        for stream in (False, True):
            args = ["--one-stream", size, "--seed", str(seed), "--rounds", str(rounds)] + (
                ["--stream"] if stream else []
            )
            r = _child(args)
            s = r["stages"]["run + write"]
            mode = "streamed (run -o)" if stream else "in memory, then save"
            print(
                f"  {size:6s}{mode:>22s}{s['wall']:9.2f}{s['peak'] / 2**20:14.0f}{s['delta'] / 2**20:8.0f}"
                f"{r['maxrss'] / 2**20:15.0f}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100k,1m,10m", help="comma-separated subset of 100k,1m,10m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2, help="recorded fedmvmf rounds (epochs = record_rounds)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per size; each stage reports its fastest")
    ap.add_argument("--stream-rss", metavar="SIZES", help="instead: peak RSS of run + write, streamed or not")
    ap.add_argument("--one", choices=sorted(SIZES), help=argparse.SUPPRESS)  # internal: one size, JSON out
    ap.add_argument("--one-stream", choices=sorted(SIZES), help=argparse.SUPPRESS)
    ap.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.seed, args.rounds)))
        return 0
    if args.one_stream:
        print(json.dumps(one_stream(args.one_stream, args.seed, args.rounds, args.stream)))
        return 0
    sizes = [s.strip() for s in (args.stream_rss or args.sizes).split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        ap.error(f"unknown size(s) {', '.join(bad)}; choose from {', '.join(SIZES)}")
    if args.repeat < 1 or args.rounds < 1:
        ap.error("--repeat and --rounds must be at least 1")
    if args.stream_rss:
        _stream_table(sizes, args.seed, args.rounds)
        return 0
    results, firsts = [], []
    for size in sizes:
        runs = [
            _child(["--one", size, "--seed", str(args.seed), "--rounds", str(args.rounds)]) for _ in range(args.repeat)
        ]
        firsts.append(runs[0])
        results.append(fastest(runs))
    print(
        f"cpus={os.cpu_count()} load average at the end={os.getloadavg()[0]:.1f}; "
        f"{args.repeat} run(s) per size, each stage its fastest"
    )
    for r in firsts:
        touch = ", ".join(f"{t:.2f}" for t in r["first_touch"])
        print(f"{r['size']} first run: fresh memory costs {touch} s/GiB (first touch, again)")
    for r in results:
        _print_stages(r)
        _print_file_targets(r)
    for a, b in itertools.pairwise(results):
        print(f"\nper-rating cost ratio {b['size']} / {a['size']} (1.0 = linear; wall, cpu):")
        for name in STAGES:
            sa, sb = a["stages"][name], b["stages"][name]
            ra = [sa[k] / a["ratings"] for k in ("wall", "cpu")]
            rb = [sb[k] / b["ratings"] for k in ("wall", "cpu")]
            ratios = [y / x if x > 0 else float("nan") for x, y in zip(ra, rb)]
            print(f"  {name:18s}{ratios[0]:7.2f}{ratios[1]:7.2f}")
    for label, rows in (("first run", firsts), ("fastest stages", results)):
        for r in rows:
            _print_totals(label, r)
    return 0


def fastest(runs: list[dict]) -> dict:
    """One result per size: each stage from its fastest run (wall); peaks are the largest seen."""
    out = dict(runs[0])
    out["stages"] = {}
    for name in STAGES:
        best = min((r["stages"][name] for r in runs), key=lambda s: s["wall"])
        peak = max(r["stages"][name]["peak"] for r in runs)
        out["stages"][name] = {**best, "peak": peak}
    out["peak"] = max(r["peak"] for r in runs)
    return out


if __name__ == "__main__":
    sys.exit(main())

"""Netflix size on one machine: a sharded FedMVMF run, its shards on disk, the attack per shard.

    PYTHONPATH=. python benchmarks/netflix.py --data synthetic:netflix-size --workers 2 --out /tmp/nf

Stages (wall seconds and CPU seconds of the server and the workers, user + system, each): the dataset (built in this process, the server's), a LocalCluster of
``--workers`` single-threaded worker processes, the protocol (``privaudit.sharded.run_sharded``:
the clients' blocks on the workers, every recorded upload written as a shard), and the attack
(``privaudit.sharded.attack_shards``: mvmf-analytic block by block on the workers). Memory: every
0.5 s the resident memory of this process and of each worker process is read from ``/proc``;
the table gives each one's peak and the peak of their sum (the pipeline's peak RSS). If the
machine's available memory falls under ``--min-available`` GiB the run stops (its workers are
ended by their process ids) and says so. Prints a JSON document and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

GIB = 1024**3


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_seconds() -> float:
    """User + system CPU seconds of the calling process (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class Watch(threading.Thread):
    """Samples the RSS of this process and of the workers; stops the run on low memory."""

    def __init__(self, min_available: float) -> None:
        super().__init__(daemon=True)
        self.pids: list[int] = []
        self.peak = {"driver": 0, "workers": {}, "sum": 0}
        self.min_available = min_available * GIB
        self.lowest_available = _available()
        self.stop = False
        self.out: Path | None = None

    def progress(self) -> str:
        if self.out is None or not self.out.is_dir():
            return ""
        files = list(self.out.iterdir())
        return f"{len(files)} shard files, {sum(f.stat().st_size for f in files if f.is_file()) / GIB:.2f} GiB"

    def run(self) -> None:
        me = os.getpid()
        t0 = last = time.perf_counter()
        while not self.stop:
            if (
                time.perf_counter() - last >= 60
            ):  # a progress line a minute (a long run stopped early still says something)
                last = time.perf_counter()
                print(
                    f"  [{last - t0:.0f} s] RSS now: server {_rss(me) / GIB:.2f} GiB, workers "
                    f"{', '.join(f'{_rss(p) / GIB:.2f}' for p in self.pids) or '-'}; peak of the sum "
                    f"{self.peak['sum'] / GIB:.2f} GiB; available {_available() / GIB:.1f} GiB; {self.progress()}",
                    flush=True,
                )
            driver = _rss(me)
            workers = {pid: _rss(pid) for pid in self.pids}
            self.peak["driver"] = max(self.peak["driver"], driver)
            for pid, value in workers.items():
                self.peak["workers"][pid] = max(self.peak["workers"].get(pid, 0), value)
            self.peak["sum"] = max(self.peak["sum"], driver + sum(workers.values()))
            available = _available()
            self.lowest_available = min(self.lowest_available, available)
            if available < self.min_available:
                print(
                    f"STOPPED: available memory {available / GIB:.1f} GiB < {self.min_available / GIB:.0f}", flush=True
                )
                for pid in self.pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                os._exit(3)
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="synthetic:netflix-size", help="dataset spec (default synthetic:netflix-size)")
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="LocalCluster worker processes (default 2: one per core of a 2-core machine)",
    )
    p.add_argument("--epochs", type=int, default=2, help="FedMVMF epochs (default 2, both recorded)")
    p.add_argument("--K", type=int, default=20, help="latent dimension (default 20)")
    p.add_argument("--block", type=int, default=None, help="clients per block (default 4096)")
    p.add_argument("--out", required=True, help="folder for the shards (emptied first; removed with --clean)")
    p.add_argument("--clean", action="store_true", help="remove the shards at the end")
    p.add_argument("--min-available", type=float, default=4.0, help="stop under this many GiB available")
    args = p.parse_args(argv)

    from privaudit import sharded
    from privaudit.data import load_dataset

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    watch = Watch(args.min_available)
    watch.out = out
    watch.start()
    print(f"server process {os.getpid()}", flush=True)
    res: dict = {"data": args.data, "workers": args.workers, "epochs": args.epochs, "K": args.K, "block": args.block}
    res["stages"], res["cpu"] = {}, {}
    t_all = time.perf_counter()
    cpu_at = [time.process_time()]  # CPU seconds of the server and its workers so far
    workers_cpu: dict = {}

    def stage(name: str, t0: float) -> None:
        res["stages"][name] = round(time.perf_counter() - t0, 2)
        total = time.process_time() + sum(workers_cpu.values())
        res["cpu"][name], cpu_at[0] = round(total - cpu_at[0], 2), total
        print(
            f"{name}: {res['stages'][name]:.1f} s, {res['cpu'][name]:.1f} CPU s "
            f"(sum RSS peak so far {watch.peak['sum'] / GIB:.2f} GiB; load {os.getloadavg()[0]:.1f})",
            flush=True,
        )

    def sample(client) -> None:  # each worker's user + system seconds so far
        workers_cpu.update(client.run(_cpu_seconds))

    t0 = time.perf_counter()
    holder = [load_dataset(args.data)]
    res["shape"] = [int(holder[0].n_users), int(holder[0].n_items)]
    res["ratings"] = int(holder[0].n_ratings)
    stage("dataset", t0)
    t0 = time.perf_counter()
    with sharded.dask_client(f"local:{args.workers}") as client:
        watch.pids = sorted(client.run(os.getpid).values())
        print(f"worker processes {watch.pids}", flush=True)
        sample(client)
        stage("cluster", t0)
        t0 = time.perf_counter()
        cfg = {"epochs": args.epochs, "record_rounds": args.epochs, "K": args.K}
        done = sharded.run_sharded("fedmvmf", holder.pop(), cfg, 0, client, out, block_size=args.block)
        res["utility"] = {k: v for k, v in done.result.utility.items() if isinstance(v, float)}
        res["clients"] = int(done.result.model["U"].shape[0])
        del done
        sample(client)
        stage("protocol", t0)
        t0 = time.perf_counter()
        res["attack"] = sharded.attack_shards(out, client, max_bytes=64 * GIB)
        sample(client)
        stage("attack", t0)
        worker_maxrss = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    res["stages"]["total"] = round(time.perf_counter() - t_all, 2)
    res["cpu"]["total"] = round(sum(v for k, v in res["cpu"].items()), 2)
    watch.stop = True
    res["shards"] = {"files": sum(1 for _ in out.iterdir()), "bytes": sum(f.stat().st_size for f in out.iterdir())}
    res["peak_gib"] = {
        "sum": round(watch.peak["sum"] / GIB, 2),
        "driver": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 2),
        # sampled from /proc: a worker's ru_maxrss starts at its parent's at fork (the server's)
        "workers": [round(v / GIB, 2) for v in sorted(watch.peak["workers"].values())],
        "workers_maxrss": [round(v / GIB, 2) for v in sorted(worker_maxrss.values())],
    }
    res["lowest_available_gib"] = round(watch.lowest_available / GIB, 1)
    res["load_average"] = os.getloadavg()
    if args.clean:
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(res, indent=1))
    s, pk = res["stages"], res["peak_gib"]
    c = res["cpu"]
    print(
        "\n| ratings | workers | dataset s (CPU) | protocol s (CPU) | attack s (CPU) | total s (CPU) |"
        " peak RSS (sum) GiB | server GiB | per worker GiB | shards GiB (files) |"
    )
    print(
        f"| {res['ratings']:,} | {args.workers} | {s['dataset']:.0f} ({c['dataset']:.0f}) | "
        f"{s['protocol']:.0f} ({c['protocol']:.0f}) | {s['attack']:.0f} ({c['attack']:.0f}) | "
        f"{s['total']:.0f} ({c['total']:.0f}) | {pk['sum']:.2f} | {pk['driver']:.2f} | "
        f"{', '.join(f'{w:.2f}' for w in pk['workers'])} | {res['shards']['bytes'] / GIB:.2f} ({res['shards']['files']}) |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

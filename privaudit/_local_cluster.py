"""The local Dask clusters privaudit starts (``--scheduler local:N`` on ``run``, ``attack``,
``audit`` and in plan files): one cap on N, loopback only, scratch in a private folder.

Every process of the cluster (scheduler, nannies, workers) listens on 127.0.0.1 on free ports;
the scheduler's HTTP endpoint has no dashboard (``PRIVAUDIT_DASK_DASHBOARD=1`` asks for one, on
127.0.0.1 as well, when Dask's ``bokeh`` is installed). Dask's ``dask-scratch-space`` lives in a
temporary folder (mode 0700) removed when the cluster closes.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from privaudit.errors import MissingDependencyError, PrivauditError

__all__ = ["DASHBOARD_ENV", "MAX_LOCAL_WORKERS", "local_cluster", "local_workers"]

#: Most worker processes of a ``local:N`` cluster, on every command and in plan files.
MAX_LOCAL_WORKERS = 256
#: Set to 1 to get the scheduler's dashboard (on 127.0.0.1, a free port).
DASHBOARD_ENV = "PRIVAUDIT_DASK_DASHBOARD"
_LOCAL = re.compile(r"local(?::(\d{1,12}))?")


def local_workers(text: Any, what: str = "--scheduler") -> int | None:
    """N of ``local`` (2) or ``local:N``, refused unless 1 <= N <= :data:`MAX_LOCAL_WORKERS`;
    None when ``text`` is not of that form (a scheduler address)."""
    m = _LOCAL.fullmatch(str(text).strip())
    if not m:
        if str(text).strip().startswith("local"):
            raise PrivauditError(f"{what}: expected local:N with N workers, got {str(text)[:40]!r}")
        return None
    workers = int(m.group(1) or 2)
    if not 1 <= workers <= MAX_LOCAL_WORKERS:
        raise PrivauditError(f"{what}: local:N needs 1 <= N <= {MAX_LOCAL_WORKERS}, got {workers}")
    return workers


@contextmanager
def local_cluster(workers: int) -> Iterator[Any]:
    """A ``LocalCluster`` of ``workers`` single-threaded worker processes on 127.0.0.1 (checked
    against the cap), closed and its scratch folder removed on exit."""
    if not 1 <= int(workers) <= MAX_LOCAL_WORKERS:
        raise PrivauditError(f"--scheduler: local:N needs 1 <= N <= {MAX_LOCAL_WORKERS}, got {workers}")
    try:
        import dask
        from dask.distributed import LocalCluster
    except ImportError:  # pragma: no cover - dask is a declared extra
        raise MissingDependencyError("dask[distributed]", "dask") from None
    scratch = tempfile.mkdtemp(prefix="privaudit-dask-")
    dashboard = os.environ.get(DASHBOARD_ENV) == "1"
    try:
        with dask.config.set({"temporary-directory": scratch}):  # the scheduler's scratch too
            cluster = LocalCluster(
                n_workers=int(workers),
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",  # a free loopback port: clusters never clash over 8787
                scheduler_kwargs={"dashboard": dashboard},
                local_directory=scratch,
            )
        try:
            yield cluster
        finally:
            cluster.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

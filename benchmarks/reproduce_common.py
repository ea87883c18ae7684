"""Shared pieces of ``benchmarks/reproduce.py``: the run context, quick checks against the docs'
stated values, Markdown tables and running an existing benchmark script."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "ml-100k"


@dataclass
class Check:
    """One quick check: ``value`` against the docs' ``target`` with ``tol``.

    ``kind``: ``"abs"`` (|value - target| <= tol), ``"min"`` (value >= target - tol) or
    ``"max"`` (value <= target + tol).
    """

    paper: str
    name: str
    value: float
    target: float
    tol: float
    kind: str = "abs"

    @property
    def ok(self) -> bool:
        v = float(self.value)
        if not np.isfinite(v):
            return False
        if self.kind == "abs":
            return abs(v - self.target) <= self.tol
        if self.kind == "min":
            return v >= self.target - self.tol
        return v <= self.target + self.tol

    def row(self) -> str:
        rel = {"abs": "=", "min": ">=", "max": "<="}[self.kind]
        return (
            f"| {self.paper} | {self.name} | {self.value:.5g} | {rel} {self.target:.5g} ± {self.tol:.3g} | "
            f"{'ok' if self.ok else '**FAIL**'} |"
        )


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:.4f}" if np.isfinite(x) else "n/a"
        return str(x)

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


def run_script(script: str, args: list[str], ctx: Context) -> str:
    """Run an existing benchmark script (same interpreter, this checkout first on the path) and return its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(BENCH), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, str(BENCH / script), *args]
    print("$ " + " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, env=env, cwd=str(ctx.out), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def script_table(script: str, *args: str, data_flag: str | None = "--data") -> Callable[..., str]:
    def fn(ctx: Context) -> str:
        extra = [data_flag, str(ctx.data)] if data_flag else []
        return "```\n" + run_script(script, [*args, *extra], ctx) + "```\n"

    fn.__doc__ = f"python benchmarks/{script} {' '.join(args)}"
    return fn


@dataclass
class Context:
    data: Path
    out: Path
    jobs: int

    def dataset(self):
        from privaudit.data import load_dataset

        return load_dataset(self.data)

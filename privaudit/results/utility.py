"""The utility cost of a defense with an interval: the per-user utility a run records and the paired
bootstrap over users that gives one seed an interval.

A protocol's evaluation returns, beside each decomposable utility metric, its per-unit
contributions (:class:`UserUtility`): the values whose mean (HR, NDCG, MAP, precision, recall) or
ratio of sums (RMSE: squared-error sums over rating counts, under a root; MAE; the weighted mean
rank) is the reported metric. The unit is the user, or the group for FedSPLIT (its ``rmse`` is a
mean over groups). A run stores the main utility metric's contributions compactly
(:meth:`UserUtility.to_json`, ``point["utility_users"]``).

The cost of a defended point against the undefended reference of the same seed is paired: the same
users, the same split. :func:`paired_bootstrap` resamples the units (one multinomial draw of
counts applied to both arms) and gives the standard error of the cost, multiplied by
:data:`UTILITY_RUN_INFLATION` for what a bootstrap over users cannot see (the run: split, initial
model, noise draws; measured); the seeds' costs are pooled as
:func:`privaudit.results.stats.combine_seeds` pools attack advantages (the within-seed variance
plus a between-seed random-effects term), and the 95 % interval is the normal one,
``cost +- 1.96 SE``. Without per-user contributions (a results file
written before them, a sharded FedRec run) the interval is Student's t over the paired seeds, as
before, and one seed has none.

Labels (:func:`utility_cost_interval`): "within noise" only when the whole interval lies within
+- :data:`UTILITY_MARGIN` of the reference utility; "costs" when it excludes 0 (and is not within
noise); "not resolved" when it holds 0 but reaches beyond the margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from privaudit.results.numbers import num
from privaudit.results.specs import utility_spec
from privaudit.results.stats import BOOTSTRAP_SEED, MIN_VERDICT_VICTIMS, bootstrap_counts, combine_seeds
from privaudit.results.summary import mean_ci95, utility_cost

#: A utility cost is "within noise" only when its whole 95 % interval lies within +- this share of
#: the reference utility (5 %: the verdict margin of the attack side).
UTILITY_MARGIN = 0.05

#: Replicates of the paired bootstrap over users (fixed stream :data:`BOOTSTRAP_SEED`).
UTILITY_REPLICATES = 1000

#: Fewest units (users, groups) with a contribution in either arm a paired bootstrap interval is
#: computed from (the victims' rule of the attack side, :data:`MIN_VERDICT_VICTIMS`).
MIN_UTILITY_UNITS = MIN_VERDICT_VICTIMS

#: Each seed's paired-bootstrap SE is multiplied by this before the seeds are pooled: a bootstrap over
#: users covers which users were sampled, not the run (the split, the initial model, the noise
#: draws), which moves a defense's cost as much again. Measured (docs/verdicts.md, "Utility cost: a
#: paired bootstrap over users"): over seeds 0-9 the SD of (cost - mean) / SE was 2.08 (FedMVMF,
#: dp-gaussian noise multiplier 1, NDCG@10), 1.85 (noise multiplier 0.3) and 1.66 (FedRec, Laplace
#: scale 1, RMSE); 2.1 covers them. With several seeds the between-seed term adds what it misses.
UTILITY_RUN_INFLATION = 2.1

#: Significant digits of the stored per-user contributions (compact JSON, ample for an SE).
STORED_DIGITS = 7

_Z95 = NormalDist().inv_cdf(0.975)


def _rounded(values: np.ndarray) -> list[float | None]:
    return [float(f"{v:.{STORED_DIGITS}g}") if math.isfinite(v) else None for v in values.tolist()]


@dataclass(frozen=True)
class UserUtility:
    """Per-unit contributions of one utility metric: ``value = sum(num) / sum(den)`` (its square
    root when ``root``) over the units (``over``: "users" or "groups") in a fixed order, the same
    in every run of a seed (so two runs pair unit by unit). A unit without a contribution has
    ``den`` 0."""

    num: np.ndarray
    den: np.ndarray
    root: bool = False
    over: str = "users"

    @classmethod
    def means(cls, values: Any, over: str = "users") -> UserUtility:
        """A metric that is the mean of per-unit ``values`` over the units where it is defined
        (NaN: no contribution)."""
        v = np.asarray(values, dtype=float).ravel()
        ok = np.isfinite(v)
        return cls(np.where(ok, v, 0.0), ok.astype(float), False, over)

    @classmethod
    def sums(cls, num_: Any, den: Any, root: bool = False, over: str = "users") -> UserUtility:
        """A ratio of sums, ``sum(num) / sum(den)`` (under a square root when ``root``: RMSE)."""
        n = np.asarray(num_, dtype=float).ravel()
        d = np.asarray(den, dtype=float).ravel()
        if n.shape != d.shape:
            raise ValueError(f"num and den must have the same length, got {n.size} and {d.size}")
        return cls(n, d, bool(root), over)

    @property
    def units(self) -> int:
        """Units with a contribution."""
        return int(np.count_nonzero(self.den > 0))

    def value(self) -> float:
        """The metric these contributions make (NaN without any)."""
        with np.errstate(over="ignore", invalid="ignore"):
            total, top = float(self.den.sum()), float(self.num.sum())
        if not total > 0:
            return math.nan
        v = top / total
        return math.sqrt(max(v, 0.0)) if self.root else v

    def to_json(self) -> dict[str, Any]:
        """Compact JSON: ``{"values": [...], "over"}`` for a mean (null: no contribution), else
        ``{"num": [...], "den": [...], "root", "over"}``; numbers to :data:`STORED_DIGITS` digits."""
        if not self.root and np.isin(self.den, (0.0, 1.0)).all():
            return {"values": _rounded(np.where(self.den > 0, self.num, np.nan)), "over": self.over}
        return {"num": _rounded(self.num), "den": _rounded(self.den), "root": self.root, "over": self.over}

    @classmethod
    def from_json(cls, d: Any) -> UserUtility | None:
        """The contributions stored by :meth:`to_json`; None for anything else (never raises:
        a malformed entry only costs the interval)."""
        if isinstance(d, UserUtility):
            return d
        if not isinstance(d, Mapping):
            return None
        over = str(d.get("over") or "users")
        try:
            if isinstance(d.get("values"), list):
                return cls.means([num(v) for v in d["values"]], over)
            if isinstance(d.get("num"), list) and isinstance(d.get("den"), list):
                n = np.array([num(v) for v in d["num"]], dtype=float)
                den = np.array([num(v) for v in d["den"]], dtype=float)
                if n.shape != den.shape or not (np.isfinite(n).all() and np.isfinite(den).all()) or (den < 0).any():
                    return None
                return cls(n, den, bool(d.get("root", False)), over)
        except (TypeError, ValueError):
            return None
        return None


def stored_user_utility(per_user: Mapping[str, UserUtility] | None, metric: str | None) -> dict[str, Any]:
    """``{metric: compact contributions}`` of the one metric a run's results keep (the main
    utility), ``{}`` when the run has none for it."""
    if not metric or not per_user or metric not in per_user:
        return {}
    return {metric: per_user[metric].to_json()}


def _replicates(u: UserUtility, counts: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        den = counts @ u.den
        v = np.where(den > 0, (counts @ u.num) / np.where(den > 0, den, 1.0), np.nan)
    return np.sqrt(np.maximum(v, 0.0)) if u.root else v


def paired_bootstrap(
    reference: UserUtility,
    defended: UserUtility,
    higher_is_better: bool = True,
    replicates: int = UTILITY_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any] | None:
    """Paired bootstrap over units of the cost of ``defended`` against ``reference`` (positive =
    worse, in the metric's direction): ``{"cost", "se", "n", "over"}`` -- the cost of the two
    full samples, the standard deviation of the cost over ``replicates`` resamples of the units
    that contribute to either arm (each resample's counts applied to both arms: the pairing),
    their number. None when the two do not pair (lengths or form differ) or fewer than
    :data:`MIN_UTILITY_UNITS` units contribute."""
    if reference.num.shape != defended.num.shape or reference.root != defended.root:
        return None
    used = (reference.den > 0) | (defended.den > 0)
    n = int(used.sum())
    if n < MIN_UTILITY_UNITS:
        return None
    ref = UserUtility(reference.num[used], reference.den[used], reference.root, reference.over)
    val = UserUtility(defended.num[used], defended.den[used], defended.root, defended.over)
    counts = bootstrap_counts(n, replicates, np.random.default_rng(seed)).astype(float)
    diff = _replicates(val, counts) - _replicates(ref, counts)
    full = val.value() - ref.value()
    sign = -1.0 if higher_is_better else 1.0
    finite = diff[np.isfinite(diff)]
    se = float(np.std(finite, ddof=1)) if finite.size >= 2 else math.nan
    return {"cost": sign * full, "se": se, "n": n, "over": reference.over}


def interval_labels(out: dict[str, Any]) -> dict[str, Any]:
    """``within_noise``, ``resolved`` and ``unresolved`` of a cost interval (in place)."""
    low, high, margin = num(out["low"]), num(out["high"]), num(out["margin"])
    if not (math.isfinite(low) and math.isfinite(high)):
        return out
    within = bool(math.isfinite(margin) and low >= -margin and high <= margin)
    holds = bool(low <= 0.0 <= high)
    out.update(within_noise=within, resolved=not within and not holds, unresolved=not within and holds)
    return out


def utility_cost_interval(
    reference: Mapping[str, float],
    values: Mapping[str, float],
    metric: str | None,
    declared: Mapping | None = None,
    reference_users: Mapping[str, Any] | None = None,
    value_users: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Utility cost of a defense paired by seed (``{seed: utility}`` without and with it: the
    protocol runs with the same seed) and, given ``{seed: per-user contributions}`` of both arms
    (:class:`UserUtility` or its JSON), by user.

    Returns ``cost`` (mean over the paired seeds), ``low``/``high`` (95 % interval: the paired
    bootstrap over users pooled over seeds with :func:`~privaudit.results.stats.combine_seeds`
    when every seed has contributions, else Student's t over the paired seeds, NaN with one),
    ``se``, ``seeds``, ``n`` (fewest units of a seed, 0 without the bootstrap), ``over``,
    ``method`` (how the interval was made, for sentences), ``margin`` (:data:`UTILITY_MARGIN` of
    the mean reference utility) and the labels ``within_noise`` (the whole interval within +-
    the margin), ``resolved`` (it excludes 0 and is not within noise: a cost) and
    ``unresolved`` (it holds 0 and reaches beyond the margin: no claim)."""
    seeds = [
        s
        for s in values
        if s in reference and math.isfinite(utility_cost(num(reference[s]), num(values[s]), metric, declared))
    ]
    costs = [utility_cost(num(reference[s]), num(values[s]), metric, declared) for s in seeds]
    refs = [num(reference[s]) for s in seeds]
    margin = UTILITY_MARGIN * abs(float(sum(refs) / len(refs))) if refs else math.nan
    out: dict[str, Any] = {
        "cost": math.nan,
        "low": math.nan,
        "high": math.nan,
        "se": math.nan,
        "seeds": len(costs),
        "n": 0,
        "over": "seeds",
        "method": "no interval",
        "margin": margin,
        "within_noise": False,
        "resolved": False,
        "unresolved": False,
    }
    if not costs:
        return out
    out["cost"] = float(np.mean(costs))
    higher = utility_spec(metric, declared).higher_is_better
    boots = []
    for s in seeds:
        a = UserUtility.from_json((reference_users or {}).get(s))
        b = UserUtility.from_json((value_users or {}).get(s))
        boots.append(paired_bootstrap(a, b, higher) if a is not None and b is not None else None)
    if all(b is not None and math.isfinite(b["se"]) for b in boots):
        mean, se = combine_seeds(costs, [UTILITY_RUN_INFLATION * b["se"] for b in boots])
        n, over = min(b["n"] for b in boots), boots[0]["over"]
        between = " and between seeds" if len(seeds) >= 2 else ""
        plural = "s" if len(seeds) != 1 else ""
        out.update(
            low=mean - _Z95 * se,
            high=mean + _Z95 * se,
            se=se,
            n=n,
            over=over,
            method=(
                f"paired bootstrap over {n} {over}{between}, SE x{UTILITY_RUN_INFLATION:g} for run-level variance, "
                f"{len(seeds)} seed{plural}"
            ),
        )
        return interval_labels(out)
    if len(costs) >= 2:
        mean, half = mean_ci95(costs)
        out.update(low=mean - half, high=mean + half, method=f"Student t over {len(costs)} paired seeds")
        return interval_labels(out)
    a = UserUtility.from_json((reference_users or {}).get(seeds[0]))
    b = UserUtility.from_json((value_users or {}).get(seeds[0]))
    if a is None or b is None:
        out["method"] = "no interval: one seed without per-user utility"
    else:
        units = int(np.count_nonzero((a.den > 0) | (b.den > 0))) if a.den.shape == b.den.shape else -1
        few = 0 <= units < MIN_UTILITY_UNITS
        out["method"] = (
            f"no interval: one seed, {units} {a.over} (fewer than {MIN_UTILITY_UNITS})"
            if few
            else "no interval: one seed whose per-user utility does not pair"
        )
    return out


def users_by_seed(points: Sequence[Mapping[str, Any]], metric: str | None) -> dict[str, Any]:
    """``{seed: stored contributions of metric}`` of ``points`` (those that have them)."""
    out = {}
    for p in points:
        stored = (p.get("utility_users") or {}).get(metric) if metric else None
        if stored is not None:
            out[str(p.get("seed"))] = stored
    return out


def cost_label(cost: Mapping[str, Any]) -> str:
    """ "within noise", "costs", "not resolved" or "no interval" (no cost: "unknown")."""
    if not math.isfinite(num(cost.get("cost"))):
        return "unknown"
    if cost.get("within_noise"):
        return "within noise"
    if cost.get("resolved"):
        return "costs"
    if cost.get("unresolved"):
        return "not resolved"
    return "no interval"


def cost_summary(cost: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-able part of a :func:`utility_cost_interval` a row records: ``cost``, ``low``,
    ``high``, ``margin``, ``label`` (:func:`cost_label`), ``method``."""
    return {
        "cost": cost.get("cost"),
        "low": cost.get("low"),
        "high": cost.get("high"),
        "margin": cost.get("margin"),
        "label": cost_label(cost),
        "method": cost.get("method"),
    }

"""``generic-mf-ratings``: a client's ratings from its plain-MF item uploads, one scalar per user.

Applies to any transcript whose clients train plain matrix factorization locally and upload
their item rows (``item_update``; rows, deltas, or whole-matrix replies converted by
:mod:`privaudit.integrations.dense`). Local training: ``T`` gradient steps (or SGD epochs: a
rated row is updated once per epoch) with learning rate ``lr`` on
1/2 (r_i - mu - u.v_i)^2 + lam/2 ||v_i||^2 per rated item, the user vector u fixed within the
round (ridge-fitted on the device, or trained in earlier rounds); ``mu`` is the public global
mean (``global_mean``, 0 when absent). Each step maps v_i to c v_i - lr (u.v_i) u + lr (r_i - mu) u,
c = 1 - lr lam, and u is an eigenvector of that map (eigenvalue a = c - lr |u|^2), so

    D_i = v_i(T) - c^T v_i(0) = [(a^T - c^T)(v_i(0).d) + lr (r_i - mu) |u| (1 - a^T) / (1 - a)] d,

d = u / |u|: every row of D is a multiple of u (one step: the closed-form idea of
``mvmf-analytic`` applied to MF). With d the top right singular vector of D, the ratings are a
known function of the one unknown |u| = t (and the sign of d); the attack picks the t > 0 that
puts them closest to the public rating grid (``rating_min``..``rating_max`` step
``rating_step``), then rounds. A client is *claimed* when D is rank one to ``rank_tol`` and the
decoded ratings sit on the grid to ``grid_tol``; training that also moves u within the round
bends D away from rank one, and the attack then reports its best guess without claiming it.
It needs the public ``lr`` (``lam`` default 0, ``local_steps`` default 1) and, for row
uploads, the model the server sent (``state`` messages). (u, r - mu) and (-u, mu - r) upload
the same rows: when the mirrored ratings 2 mu - r also sit on the grid (mu = 3.5 on 1..5 and
no rating of 1) the client is not claimed, and the sign is chosen by the claimed clients'
item means or, failing that, by more ratings above mu.
``generic-mf-ratings-estimated`` does without ``lr``, ``lam`` and ``local_steps``: it
estimates c^T as the value that makes the clients' D closest to rank one, then fits each
client's two remaining scalars against the grid; with the global mean hidden too, it estimates
the one mean the clients share (:func:`estimate_common_mean`), else fits one per client.

Metrics over the uploaded items of clients with ground truth: ``accuracy`` (exact rating),
``rmse``, ``claimed`` (share of clients claimed) and ``accuracy_claimed`` (exact ratings
among claimed clients). Random baseline: a uniform guess on the grid. Prior-only baseline:
the other clients' majority (mean for RMSE) rating, overall or of the item, whichever does
better on held-out clients (:meth:`GenericMFRatings.prior_baseline`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from privaudit.attacks.base import Attack, Reconstruction
from privaudit.attacks.generic._uploads import (
    client_uploads,
    cross_fit,
    loo_rating_counts,
    missing_note,
    rating_population,
    ratio,
    scored_victims,
    uploaders,
)
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.results import Decisions, MetricSpec, VictimTable
from privaudit.transcript import Transcript, View

_T_GRID = np.logspace(-4, 3, 2801)


def grid_of(config: dict) -> np.ndarray:
    """The public rating grid (default 1..5 step 1)."""
    lo, hi = float(config.get("rating_min", 1.0)), float(config.get("rating_max", 5.0))
    step = float(config.get("rating_step", 1.0)) or 1.0
    return np.arange(lo, hi + step / 2, step)


def _grid_residual(r: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Distance of each value to the nearest grid point (outside the range: to the range end)."""
    step = grid[1] - grid[0] if grid.size > 1 else 1.0
    clipped = np.clip(r, grid[0], grid[-1])
    return np.abs(r - (grid[0] + np.round((clipped - grid[0]) / step) * step))


@dataclass(frozen=True)
class LocalSteps:
    """The clients' local training: ``steps`` gradient steps (or SGD epochs: each rated row is
    updated once per epoch) of learning rate ``lr`` and L2 weight ``lam`` on the item rows,
    the user vector fixed within the round."""

    lr: float
    lam: float = 0.0
    steps: int = 1

    @property
    def decay(self) -> float:
        """c^T, c = 1 - lr lam: what the L2 term alone leaves of a row after the round."""
        return (1.0 - self.lr * self.lam) ** self.steps

    def change(self, sent: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """D = v_T - c^T v_0 per row (n x K): a multiple of the user vector u for every row."""
        return delta + (1.0 - self.decay) * sent

    def ratings(self, alpha: np.ndarray, beta: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Ratings (minus the public mean) of rows with D.d = alpha and v_0.d = beta, d = u/|u|,
        at |u| = t: with a = c - lr t^2 (u is an eigenvector of every step's linear map),
        v_T = c^T v_0 + (a^T - c^T)(v_0.d) d + lr r (sum_{k<T} a^k) u, so
        r = (alpha - (a^T - c^T) beta) / (lr t sum_{k<T} a^k). alpha, beta (n, 1) against t (m,)."""
        c = 1.0 - self.lr * self.lam
        a = c - self.lr * t**2  # < 1 for t > 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            geo = (1.0 - a**self.steps) / (1.0 - a)
            return (alpha - (a**self.steps - c**self.steps) * beta) / (self.lr * t * geo)

    def decode(self, D: np.ndarray, V: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, float, float, float]:
        """:func:`decode` with these hyperparameters."""
        return decode(D, V, grid, self)

    def describe(self) -> dict[str, float]:
        return {"lr": self.lr, "lam": self.lam, "local_steps": self.steps}


def decode(D: np.ndarray, V: np.ndarray, grid: np.ndarray, hp: LocalSteps) -> tuple[np.ndarray, float, float, float]:
    """(ratings, grid residual, the other sign's grid residual, rank-one residual) from the
    changes D (n x K) of :meth:`LocalSteps.change` and the sent rows V (n x K); ``grid`` is the
    public grid minus the public mean.

    The rank-one residual is sigma_2 / sigma_1 of D; a grid residual the RMS distance of the
    decoded ratings to the grid at the best |u| for that sign of d (:func:`_pick_sign`).
    """
    _, s, vt = np.linalg.svd(D, full_matrices=False)
    rank_res = float(s[1] / s[0]) if s.size > 1 and s[0] > 0 else (0.0 if s.size and s[0] > 0 else 1.0)
    fits = []
    for d in (vt[0], -vt[0]):  # u = t d with t > 0 for one of the two signs
        alpha, beta = D @ d, V @ d
        fits.append(_fit_scale(lambda t, alpha=alpha, beta=beta: hp.ratings(alpha[:, None], beta[:, None], t), grid))
    return (*_pick_sign(fits), rank_res)


def _pick_sign(fits: list[tuple[np.ndarray, float]], centre: float = 0.0) -> tuple[np.ndarray, float, float]:
    """(ratings, grid residual, the other sign's grid residual) of the sign closer to the grid.

    (u, y) and (-u, -y) give the same uploads, so when the public mean makes the grid symmetric
    for a client's ratings (mean 3.5 on 1..5 and no rating of 1) both signs fit exactly; the
    tie goes to the sign with more ratings above the mean (ratings skew high; ``centre``: the
    middle of the grid when the ratings are absolute, the mean unknown)."""
    (y0, r0), (y1, r1) = fits
    if abs(r0 - r1) <= 1e-9 + 1e-6 * min(r0, r1):
        first = np.sum(y0 > centre) >= np.sum(y1 > centre)
    else:
        first = r0 < r1
    return (y0, r0, r1) if first else (y1, r1, r0)


def _fit_scale(ratings, grid: np.ndarray) -> tuple[np.ndarray, float]:
    """``ratings(t)`` (n x len(t)) at the t > 0 closest to the grid, and their RMS grid residual."""

    def cost(t):
        c = np.mean(_grid_residual(ratings(t), grid) ** 2, axis=0)
        return np.where(np.isfinite(c), c, np.inf)

    costs = cost(_T_GRID)
    k = int(np.argmin(costs))
    lo, hi = _T_GRID[max(k - 1, 0)], _T_GRID[min(k + 1, _T_GRID.size - 1)]
    from scipy.optimize import minimize_scalar  # on use: scipy.optimize slows every command's start

    res = minimize_scalar(
        lambda t: float(cost(np.array([t]))[0]), bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}
    )
    t = float(res.x) if res.fun <= costs[k] else float(_T_GRID[k])
    r = ratings(np.array([t]))[:, 0]
    return r, float(np.sqrt(np.mean(_grid_residual(r, grid) ** 2)))


def _settle_mirrors(victims: dict[str, dict[str, np.ndarray]], mean: float, tol: float) -> None:
    """Clients whose mirrored ratings 2 mean - r also sit on the grid (:func:`_pick_sign`) take
    the mirror when it agrees with the claimed clients' mean rating of the same items and the
    ratings as decoded disagree (correlation below -1 / sqrt(shared items)); else unchanged."""
    claimed = [v for v in victims.values() if v["claimed"][0]]
    if not claimed:
        return
    items = np.concatenate([v["items"] for v in claimed])
    ratings = np.concatenate([v["ratings"] for v in claimed])
    n = int(max(items.max(), max(v["items"].max(initial=0) for v in victims.values()))) + 1
    count = np.bincount(items, minlength=n)
    item_mean = np.bincount(items, weights=ratings, minlength=n) / np.maximum(count, 1)
    for v in victims.values():
        if v["claimed"][0] or not v["residuals"][2] < tol:
            continue
        shared = count[v["items"]] > 0
        if shared.sum() < 2:
            continue
        r, m = v["ratings"][shared], item_mean[v["items"][shared]]
        if r.std() == 0 or m.std() == 0:
            continue
        corr = float(np.corrcoef(r, m)[0, 1])
        if corr * np.sqrt(shared.sum()) < -1.0:  # the mirror agrees, by about one standard error
            v["raw"], v["ratings"] = 2 * mean - v["raw"], 2 * mean - v["ratings"]


#: The names apps give their clients' training hyperparameters in the Flower run config
#: (``[tool.flwr.app.config]``, recorded as ``flower_run_config``), read in this order after the
#: privaudit name in the public config (``public-info`` or the schema map's ``public`` table).
#: The attack parameters ``lr_key``, ``lam_key``, ``steps_key`` and ``mean_key`` name another key.
HYPER_KEYS: dict[str, tuple[str, ...]] = {
    "lr": ("lr", "learning-rate", "learning_rate", "learningrate", "local-lr", "client-lr", "eta", "step-size"),
    "lam": ("lam", "lambda", "l2", "l2-reg", "l2_reg", "weight-decay", "weight_decay", "reg", "regularization"),
    "local_steps": ("local_steps", "local-steps", "local-epochs", "local_epochs", "epochs", "steps"),
    "global_mean": ("global_mean", "global-mean", "mean", "mu", "rating-mean"),
}


def config_value(config: dict, name: str, key: str = "") -> tuple[float | None, str]:
    """(the number the run gives for hyperparameter ``name``, where it was found), (None, "")
    when absent: ``key`` in the Flower run config when given, else ``name`` in the public
    config, else the first of :data:`HYPER_KEYS` in the Flower run config."""

    def number(v: Any) -> float | None:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
        return float(v) if ok else None

    run = config.get("flower_run_config")
    run = run if isinstance(run, dict) else {}
    if key:
        return number(run.get(key)), f"run config {key!r}" if number(run.get(key)) is not None else ""
    if number(config.get(name)) is not None:
        return number(config.get(name)), f"public {name!r}"
    for alias in HYPER_KEYS.get(name, ()):
        if number(run.get(alias)) is not None:
            return number(run.get(alias)), f"run config {alias!r}"
    return None, ""


def known_mean(config: dict, key: str = "") -> float | None:
    """The global mean the clients centre ratings by (:func:`config_value`), None when unknown."""
    return config_value(config, "global_mean", key)[0]


def _agree_mirrors(victims: dict[str, dict[str, np.ndarray]], centre: float, grid: np.ndarray) -> None:
    """With a mean fitted per client both mirrors of each client's ratings fit the grid. The
    mirrors are chosen together: the assignment maximising the agreement of the clients'
    deviations from their own mean on the items they share (sum over pairs; every assignment for
    up to 14 clients, else flips of one client at a time until none helps), oriented as a whole
    so that more ratings lie above the grid's centre (ratings skew high)."""
    parties = list(victims)
    n = len(parties)
    if n < 2:
        return
    dev = []
    for p in parties:
        r = victims[p]["ratings"]
        dev.append(dict(zip(victims[p]["items"].tolist(), (r - r.mean()).tolist())))
    agree = np.zeros((n, n))
    for a in range(n):
        for b in range(a + 1, n):
            shared = dev[a].keys() & dev[b].keys()
            agree[a, b] = agree[b, a] = sum(dev[a][i] * dev[b][i] for i in shared)
    if not agree.any():
        return
    if n <= 14:
        signs = ((np.arange(2 ** (n - 1))[:, None] >> np.arange(n)) & 1) * -2 + 1  # client n-1 fixed at +1
        best = signs[int(np.argmax(np.einsum("ki,ij,kj->k", signs, agree, signs)))]
    else:
        best = np.ones(n)
        for _ in range(10 * n):
            gain = -2 * best * (agree @ best)  # change of the objective / 2 when one client flips
            k = int(np.argmax(gain))
            if gain[k] <= 0:
                break
            best[k] = -best[k]
    above = sum(
        float(np.sum(victims[p]["ratings"] > centre) - np.sum(victims[p]["ratings"] < centre)) * best[k]
        for k, p in enumerate(parties)
    )
    best = best if above >= 0 else -best
    for k, p in enumerate(parties):
        if best[k] < 0:
            victims[p]["raw"] = 2 * centre - victims[p]["raw"]
            victims[p]["ratings"] = snap(victims[p]["raw"], grid)


def global_mean(config: dict) -> float:
    """The public global mean the clients centre ratings by (0 when absent)."""
    return known_mean(config) or 0.0


def rating_scale_note(config: dict) -> str:
    """Why a recorded Flower run has no ratings to infer ("" when its public config gives a rating
    scale, or the transcript is not a Flower recording)."""
    if ("rating_min" in config and "rating_max" in config) or config.get("recorded_from") != "flower":
        return ""
    return (
        "the app publishes no rating scale (rating_min, rating_max): implicit feedback, "
        "the clients hold no ratings to infer"
    )


def snap(r: np.ndarray, grid: np.ndarray) -> np.ndarray:
    step = grid[1] - grid[0] if grid.size > 1 else 1.0
    return grid[0] + np.round((np.clip(r, grid[0], grid[-1]) - grid[0]) / step) * step


@register_attack("generic-mf-ratings")
class GenericMFRatings(Attack):
    """Decode each client's ratings from its one-step plain-MF item uploads (module docstring)."""

    description = "plain-MF uploads: item rows are multiples of u, one scalar per user decodes the ratings"
    party = "server"
    protocols = ("flower",)  # recorded runs; within them the attack chooses itself by message kinds
    requires = ("item_update",)
    primary_metric = "accuracy"
    parameters = (
        Param(
            "rank_tol", 1e-6, "claim a client only when sigma_2/sigma_1 of its gradient rows is below this", gt=0, le=1
        ),
        Param("grid_tol", 1e-3, "... and its decoded ratings are this close (RMS) to the rating grid", gt=0),
        Param(
            "max_rank_ratio",
            0.5,
            "not applicable when the median sigma_2/sigma_1 of the clients' row changes exceeds this",
            gt=0,
            le=1,
        ),
        Param("lr_key", "", "the run-config key of the clients' learning rate ('': the documented names)"),
        Param("lam_key", "", "the run-config key of their L2 weight on item rows ('': the documented names)"),
        Param("steps_key", "", "the run-config key of their local steps or epochs ('': the documented names)"),
        Param("mean_key", "", "the run-config key of the global mean they centre by ('': the documented names)"),
        Param(
            "max_grid_residual",
            0.15,
            "not applicable when the clients' median RMS distance to the rating grid exceeds this (in steps)",
            gt=0,
        ),
    )
    metric_specs = {
        "accuracy": MetricSpec(True, True, "fraction", "share of uploaded items whose rating is recovered exactly"),
        "rmse": MetricSpec(False, True, "rating", "root mean squared error of the recovered ratings"),
        "claimed": MetricSpec(True, True, "fraction", "share of clients whose decode is exact (rank one, on the grid)"),
        "accuracy_claimed": MetricSpec(True, True, "fraction", "exact-rating share among the claimed clients"),
        "victims": MetricSpec(True, False, "count", "clients scored"),
    }

    def hyper(self, view: View, ups: dict[str, list]) -> tuple[LocalSteps | None, str]:
        """The clients' local training (``lr``, ``lam``, ``local_steps``) from the public config or
        the recorded Flower run config under the names apps use (:data:`HYPER_KEYS`), or (None, why not)."""
        cfg = view.config
        lr, _ = config_value(cfg, "lr", self.lr_key)
        if lr is None or not lr > 0:
            names = ", ".join(repr(k) for k in ((self.lr_key,) if self.lr_key else HYPER_KEYS["lr"]))
            return None, (
                f"neither the public config nor the Flower run config gives the clients' learning rate "
                f"(looked for {names}; name the key with lr_key=KEY; generic-mf-ratings-estimated estimates it)"
            )
        lam, _ = config_value(cfg, "lam", self.lam_key)
        steps, _ = config_value(cfg, "local_steps", self.steps_key)
        steps = int(steps) if steps is not None and steps >= 1 and float(steps).is_integer() else 1
        return LocalSteps(float(lr), float(lam or 0.0), steps), ""

    def _mean(self, view: View) -> float | None:
        return known_mean(view.config, self.mean_key)

    def settle_mean(
        self, hp: Any, ups: dict[str, list], grid: np.ndarray, known: float | None
    ) -> tuple[Any, float | None, str]:
        """(training model, global mean, where the mean comes from) for the decode: the public
        mean as given ("public" or "none": 0)."""
        return hp, known, "public" if known is not None else "none"

    def _rank_ratios(self, ups: dict[str, list], hp: Any) -> list[float]:
        """sigma_2/sigma_1 of D for the first usable upload of up to 5 clients."""
        ratios = []
        for us in list(ups.values())[:5]:
            up = next(iter(_usable(us)), None)
            if up is not None:
                s = np.linalg.svd(hp.change(up.sent, up.delta), compute_uv=False)
                ratios.append(s[1] / s[0] if s[0] > 0 else 1.0)
        return ratios

    def applicable(self, view: View) -> tuple[bool, str]:
        ok, reason = super().applicable(view)
        if not ok:
            return ok, reason + missing_note(view)
        implicit = rating_scale_note(view.config)
        if implicit:
            return False, implicit
        ups = client_uploads(view)
        if ups and all(u.delta is None for us in ups.values() for u in us):
            return False, "the uploads are item rows but the server's view holds no model it sent (no 'model' state)"
        hp, why = self.hyper(view, ups)
        if hp is None:
            return False, why
        ratios = self._rank_ratios(ups, hp)
        if ratios and float(np.median(ratios)) > self.max_rank_ratio:
            return False, (
                "the uploaded row changes are not multiples of one user vector "
                f"(sigma_2/sigma_1 = {np.median(ratios):.2f} > {self.max_rank_ratio}): "
                "the clients do not run plain-MF steps with a user vector fixed within the round"
            )
        return True, ""

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        ups = client_uploads(view)
        hp, why = self.hyper(view, ups)
        if hp is None:
            return self.unsupported(why)
        grid = grid_of(view.config)
        known = self._mean(view)
        hp, known, mean_source = self.settle_mean(hp, ups, grid, known)
        mean = 0.0 if known is None else known  # unknown: the estimated variant fits it per client
        victims: dict[str, dict[str, np.ndarray]] = {}
        for party, us in ups.items():
            decoded = []
            for up in _usable(us):
                y, grid_res, other_res, rank_res = hp.decode(hp.change(up.sent, up.delta), up.sent, grid - mean)
                decoded.append((grid_res, rank_res, up.items, y + mean, other_res))
            if not decoded:
                continue
            decoded.sort(key=lambda d: d[0])  # every item from the closest-to-grid upload holding it
            items = np.unique(np.concatenate([d[2] for d in decoded]))
            raw = np.full(items.size, np.nan)
            for _, _, its, r, _ in reversed(decoded):
                raw[np.searchsorted(items, its)] = r
            grid_res, rank_res, other_res = decoded[0][0], decoded[0][1], decoded[0][4]
            # claimed: exact and unique (the mirrored ratings of the other sign are off the grid)
            claimed = rank_res < self.rank_tol and grid_res < self.grid_tol <= other_res
            claimed = claimed and not getattr(hp, "fit_mean", False)
            victims[party] = {
                "items": items,
                "ratings": snap(raw, grid),
                "raw": raw,
                "claimed": np.array([claimed]),
                "residuals": np.array([rank_res, grid_res, other_res]),
            }
        step = float(grid[1] - grid[0]) if grid.size > 1 else 1.0
        residuals = [float(v["residuals"][1]) / step for v in victims.values()]
        if residuals and float(np.median(residuals)) > self.max_grid_residual:
            return self.unsupported(
                f"the uploads do not decode onto the rating grid (median RMS distance {np.median(residuals):.2f} "
                f"of a step > {self.max_grid_residual}): the clients do not run the plain-MF steps this attack models"
            )
        if not getattr(hp, "fit_mean", False):  # a mean fitted per client makes every mirror fit: no claims
            _settle_mirrors(victims, mean, self.grid_tol)
        else:
            _agree_mirrors(victims, float(grid[0] + grid[-1]) / 2, grid)
        meta = {"clients": len(victims), **hp.describe(), "global_mean": known, "mean_source": mean_source}
        return Reconstruction(self.name, self.party, victims, meta=meta)

    @staticmethod
    def _truth(transcript: Transcript, party: str, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of ``items`` the client rated, their true ratings)."""
        priv = transcript.private(party)
        t_items = np.asarray(priv.get("items", np.zeros(0)), dtype=np.int64)
        t_r = np.asarray(priv.get("ratings", np.zeros(0)), dtype=np.float64)
        lookup = dict(zip(t_items.tolist(), t_r.tolist()))
        mask = np.array([i in lookup for i in items.tolist()], dtype=bool)
        return mask, np.array([lookup[i] for i in items[mask].tolist()])

    def _attack_parts(self, reconstruction: Reconstruction, transcript: Transcript):
        """Victims, per-victim scored ratings (weight), exact hits, squared errors, claims."""
        parties = scored_victims(transcript, reconstruction.victims)
        n, hits, sq, claimed = (np.zeros(len(parties)) for _ in range(4))
        for i, p in enumerate(parties):
            rec = reconstruction.victims[p]
            mask, truth = self._truth(transcript, p, rec["items"])
            pred = rec["ratings"][mask]
            n[i], hits[i], sq[i] = truth.size, np.sum(pred == truth), np.sum((pred - truth) ** 2)
            claimed[i] = bool(rec["claimed"][0])
        return parties, n, hits, sq, claimed

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        parties, n, hits, sq, claimed = self._attack_parts(reconstruction, transcript)
        nan = float("nan")
        return {
            "accuracy": ratio(hits, n),
            "rmse": ratio(sq, n, root=True),
            "claimed": float(claimed.mean()) if parties else nan,
            "accuracy_claimed": ratio(hits * claimed, n * claimed),
            "victims": float(len(parties)),
        }

    def _prior_parts(self, transcript: Transcript):
        """Victims, weight, and cross-fitted exact hits and squared errors of the majority (for
        accuracy) and mean (for RMSE) of the other clients' ratings, overall or of the item."""
        grid = grid_of(transcript.config)
        step = grid[1] - grid[0] if grid.size > 1 else 1.0
        population = rating_population(transcript, grid[0], step, grid.size)
        owner = population[0]
        records = {
            p: np.unique(np.concatenate([u.items for u in _usable(ups)]) if _usable(ups) else np.zeros(0, int))
            for p, ups in client_uploads(transcript.view(self.party)).items()
        }
        parties = [p for p in scored_victims(transcript, sorted(records)) if p in owner]
        if not parties:
            return [], np.zeros(0), {}
        q_items, q_truth, q_owner, victim = [], [], [], []
        for j, p in enumerate(parties):
            mask, truth = self._truth(transcript, p, records[p])
            q_items.append(records[p][mask])
            q_truth.append(truth)
            q_owner.append(np.full(truth.size, owner[p]))
            victim.append(np.full(truth.size, j))
        q_items, q_truth, q_owner, victim = (np.concatenate(x) for x in (q_items, q_truth, q_owner, victim))
        glob, item = loo_rating_counts(population, q_items, q_owner, grid.size)
        n = np.bincount(victim, minlength=len(parties)).astype(float)

        def per_victim(x):
            return np.bincount(victim, weights=x, minlength=len(parties))

        def mean(c):
            return c @ grid / np.maximum(c.sum(axis=1), 1.0)

        acc, _ = cross_fit(
            {
                name: {"hits": per_victim(grid[np.argmax(c, axis=1)] == q_truth)}
                for name, c in (("global majority", glob), ("per-item majority", item))
            },
            "hits",
            n,
        )
        err, _ = cross_fit(
            {
                name: {"sq": per_victim((mean(c) - q_truth) ** 2)}
                for name, c in (("global mean", glob), ("per-item mean", item))
            },
            "sq",
            n,
            higher_is_better=False,
        )
        return parties, n, {"accuracy": acc["hits"], "rmse": err["sq"]}

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        grid = grid_of(transcript.config)
        senders = uploaders(transcript)
        victims = scored_victims(transcript, senders)
        vals = [np.asarray(transcript.private(p).get("ratings", np.zeros(0)), dtype=float) for p in victims]
        truth = np.concatenate(vals) if vals else np.zeros(0)
        if not truth.size:
            nan = float("nan")
            return {"accuracy": nan, "rmse": nan, "claimed": 0.0, "accuracy_claimed": nan, "victims": 0.0}
        acc = float(np.mean([np.mean(grid == r) for r in truth]))
        rmse = float(np.sqrt(np.mean((truth[:, None] - grid[None, :]) ** 2)))
        return {"accuracy": acc, "rmse": rmse, "claimed": 0.0, "accuracy_claimed": acc, "victims": 0.0}

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """Over the same (client, rated uploaded item) records: the best of the global and the
        per-item majority of the other clients' ratings (accuracy), and of their global and
        per-item mean (RMSE), each chosen on held-out halves of the clients
        (:func:`~privaudit.attacks.generic._uploads.cross_fit`; counted in hindsight from the other
        clients' private ratings). ``accuracy_claimed`` repeats the accuracy (no claims)."""
        parties, n, num = self._prior_parts(transcript)
        if not parties:
            return self.baseline(transcript)
        acc = ratio(num["accuracy"], n)
        return {
            "accuracy": acc,
            "rmse": ratio(num["rmse"], n, root=True),
            "claimed": 0.0,
            "accuracy_claimed": acc,
            "victims": 0.0,
        }

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """Per client: exact ratings and squared errors over its rated uploaded items, whether it
        was claimed and its exact ratings if claimed; the prior's hits and squared errors on the
        same clients (the prior claims nobody: its ``accuracy_claimed`` is its overall accuracy)."""
        parties, n, hits, sq, _ = self._attack_parts(reconstruction, transcript)
        prior_parties, prior_n, prior = self._prior_parts(transcript)
        if not parties or not prior_parties:
            return None
        idx = np.array([prior_parties.index(p) for p in parties])
        claimed = np.array([float(reconstruction.victims[p]["claimed"][0]) for p in parties])
        prior_hits = prior["accuracy"][idx]
        return VictimTable(
            parties,
            {"accuracy": n, "rmse": n, "claimed": np.ones(len(parties)), "accuracy_claimed": n * claimed},
            {"accuracy": hits, "rmse": sq, "claimed": claimed, "accuracy_claimed": hits * claimed},
            {
                "accuracy": prior_hits,
                "rmse": prior["rmse"][idx],
                "claimed": np.zeros(len(parties)),
                # the prior claims nobody: its accuracy_claimed is its accuracy over every client
                # (prior_baseline), spread over the attack's claimed records
                "accuracy_claimed": n * claimed * ratio(prior["accuracy"], prior_n),
            },
            root=frozenset({"rmse"}),
        )

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        """Per uploaded rated item: decoded rating as the score of "liked" (true rating >= 4);
        groups = the client."""
        scores, labels, groups = [], [], []
        for j, p in enumerate(scored_victims(transcript, reconstruction.victims)):
            rec = reconstruction.victims[p]
            mask, truth = self._truth(transcript, p, rec["items"])
            scores.append(np.nan_to_num(rec["raw"][mask], nan=0.0, posinf=1e9, neginf=-1e9))
            labels.append(truth >= 4)
            groups.append(np.full(truth.size, j))
        if not scores:
            return {}
        return {
            "liked": Decisions(
                np.concatenate(scores), np.concatenate(labels), "item rated 4 or more", groups=np.concatenate(groups)
            )
        }


def _usable(ups: list) -> list:
    """The uploads a decode can use: known change, known sent rows, at least two items."""
    return [u for u in ups if u.delta is not None and u.sent is not None and u.items.size >= 2]


_INV_KAPPA = np.logspace(-2, 4, 301)
_RHO = np.linspace(-80.0, 0.0, 161)
#: with an unknown mean, decodes whose ratings spread less than this (std, in rating steps) are refused
_MIN_SPREAD = 0.3
#: rows per client the two-parameter grid search uses (all rows are decoded afterwards)
_SEARCH_ROWS = 60


#: rows per client of the search with an unknown mean (three unknowns: a smaller search)
_MEAN_ROWS = 30


def _search_with_mean(base: np.ndarray, grid: np.ndarray, step: float) -> tuple[float, float, float, float]:
    """(cost, 1/kappa, rho, mu) of the grid search with an unknown mean (mu on half rating steps
    across the rating range; the first ``_MEAN_ROWS`` rows): ``base`` (rows x rho x 1/kappa)
    holds the decodes without it. Decodes that put every rating on one value (spread below
    ``_MIN_SPREAD`` steps) are refused."""
    base = base[:_MEAN_ROWS]
    flat = base.std(axis=0) < _MIN_SPREAD * step
    best = (np.inf, 1.0, 0.0, 0.0)
    for mu in np.arange(grid[0], grid[-1] + step / 4, step / 2):
        costs = np.where(flat, np.inf, np.mean(_grid_residual(base + mu, grid) ** 2, axis=0))
        i, j = np.unravel_index(int(np.argmin(costs)), costs.shape)
        if costs[i, j] < best[0]:
            best = (float(costs[i, j]), _INV_KAPPA[j], _RHO[i], float(mu))
    return best


@dataclass(frozen=True)
class EstimatedSteps:
    """Local training whose hyperparameters are not public: only the decay c^T (estimated);
    with ``fit_mean`` the global mean the clients centre by is unknown too (fitted per client)."""

    decay: float
    rank_ratio: float
    fit_mean: bool = False

    def change(self, sent: np.ndarray, delta: np.ndarray) -> np.ndarray:
        return delta + (1.0 - self.decay) * sent

    def decode(self, D: np.ndarray, V: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, float, float, float]:
        """:meth:`decode_with_mean` without the fitted mean."""
        return self.decode_with_mean(D, V, grid)[:4]

    def decode_with_mean(
        self, D: np.ndarray, V: np.ndarray, grid: np.ndarray
    ) -> tuple[np.ndarray, float, float, float, float]:
        """Ratings y = (D.d) / kappa - rho (V.d) (+ mu with ``fit_mean``) with the client's unknowns
        (kappa > 0, rho, mu) searched on a grid (on at most ``_SEARCH_ROWS`` rows; mu on half
        rating steps), then refitted by least squares against the snapped ratings; the sign of d
        closest to the grid wins. ``grid``: the rating grid minus the known mean (absolute with
        ``fit_mean``). Returns (ratings, grid residual, the other sign's, rank-one residual, mu of
        the chosen sign; 0 without ``fit_mean``)."""
        _, s, vt = np.linalg.svd(D, full_matrices=False)
        rank_res = float(s[1] / s[0]) if s.size > 1 and s[0] > 0 else (0.0 if s.size and s[0] > 0 else 1.0)
        step = float(grid[1] - grid[0]) if grid.size > 1 else 1.0
        fits = []
        for d in (vt[0], -vt[0]):
            alpha, beta = D @ d, V @ d
            sub = slice(0, _SEARCH_ROWS)
            base = alpha[sub, None, None] * _INV_KAPPA[None, None, :] - beta[sub, None, None] * _RHO[None, :, None]
            best = (np.inf, 1.0, 0.0, 0.0)
            if self.fit_mean:
                best = _search_with_mean(base, grid, step)
            else:
                costs = np.mean(_grid_residual(base, grid) ** 2, axis=0)
                i, j = np.unravel_index(int(np.argmin(costs)), costs.shape)
                best = (float(costs[i, j]), _INV_KAPPA[j], _RHO[i], 0.0)
            _, inv_k, rho, mu = best
            for _ in range(5):  # least squares: alpha = kappa y + kappa rho beta - kappa mu at the snapped y
                y = snap(alpha * inv_k - rho * beta + mu, grid)
                cols = [y, beta] + ([np.ones_like(y)] if self.fit_mean else [])
                coef, *_ = np.linalg.lstsq(np.stack(cols, axis=1), alpha, rcond=None)
                if not coef[0] > 0:
                    break
                inv_k, rho = 1.0 / coef[0], coef[1] / coef[0]
                mu = -coef[2] / coef[0] if self.fit_mean else 0.0
            y = alpha * inv_k - rho * beta + mu
            fits.append((y, float(np.sqrt(np.mean(_grid_residual(y, grid) ** 2))), mu))
        y, res, other = _pick_sign([f[:2] for f in fits], float(grid[0] + grid[-1]) / 2 if self.fit_mean else 0.0)
        mu = fits[0][2] if y is fits[0][0] else fits[1][2]
        return y, res, other, rank_res, float(mu)

    def describe(self) -> dict[str, float]:
        return {"decay": self.decay, "rank_ratio": self.rank_ratio, "fit_mean": self.fit_mean}


def estimate_common_mean(ups: dict[str, list], hp: EstimatedSteps, grid: np.ndarray, clients: int = 20) -> float | None:
    """The global mean the clients centre by, when they share one (a run-config value), or None.

    A mean fitted per client is ambiguous by whole rating steps (ratings 2..5 decode as well as
    1..4) and a coarse search can settle in a wrong basin; one mean shared by all clients is
    not. From the first usable upload of up to ``clients`` clients: the clients that decode onto
    the grid with their own mean agree on its position within a step (the mode of their means
    modulo the step, averaged over the agreeing ones); among that position shifted by whole
    steps (from min(0, lowest rating) to the highest), the one with the smallest summed grid
    residual when every client is decoded with it as a known mean wins, and its mirror about the
    grid's centre (which fits alike: the tie goes to more ratings above the centre). None when fewer than two
    clients decode onto the grid, they do not agree, or the common mean fits the clients worse
    (median residual) than their own means by more than a twentieth of a step."""
    step = float(grid[1] - grid[0]) if grid.size > 1 else 1.0
    sample = [(hp.change(u.sent, u.delta), u.sent) for us in list(ups.values())[:clients] for u in _usable(us)[:1]]
    own = [hp.decode_with_mean(D, V, grid) for D, V in sample]
    good = np.array([fit[4] for fit in own if fit[1] < 0.05 * step])
    if good.size < 2:
        return None
    frac = np.mod(good - grid[0], step)
    gap = np.abs(frac[:, None] - frac[None, :])
    near = np.minimum(gap, step - gap) < 0.02 * step
    mode = int(np.argmax(near.sum(axis=1)))
    if near[mode].sum() < max(2, good.size // 2):
        return None
    wrapped = frac[near[mode]] + step * np.round((frac[mode] - frac[near[mode]]) / step)
    pos = float(np.mean(wrapped))
    known = EstimatedSteps(hp.decay, hp.rank_ratio)
    lo = min(0.0, float(grid[0]))
    candidates = (
        grid[0]
        + pos
        + step * np.arange(np.floor((lo - grid[0] - pos) / step), np.ceil((grid[-1] - grid[0] - pos) / step) + 1)
    )
    candidates = candidates[(candidates >= lo - step / 2) & (candidates <= grid[-1] + step / 2)]
    centre = float(grid[0] + grid[-1]) / 2
    candidates = np.concatenate([candidates, 2 * centre - candidates])  # (u, r - mu) and (-u, mu - r) upload alike
    fits = [[known.decode(D, V, grid - m) for D, V in sample] for m in candidates]
    cost = np.array([float(np.sum([f[1] ** 2 for f in fit])) for fit in fits])
    # mirrored means fit alike: the tie goes to more decoded ratings above the grid's centre (ratings skew high)
    above = np.array(
        [
            sum(float(np.sum(f[0] + m > centre) - np.sum(f[0] + m < centre)) for f in fit)
            for m, fit in zip(candidates, fits)
        ]
    )
    tied = cost <= cost.min() + 1e-4 * step**2 * len(sample)
    k = int(np.flatnonzero(tied)[np.argmax(above[tied])])
    if float(np.median([f[1] for f in fits[k]])) > float(np.median([fit[1] for fit in own])) + 0.05 * step:
        return None
    return float(candidates[k])


def estimate_decay(ups: dict[str, list], clients: int = 20) -> tuple[float, float]:
    """(c^T, median sigma_2/sigma_1 there): the decay that makes v(T) - c^T v(0) closest to
    rank one, median over the first usable upload of up to ``clients`` clients, on (0, 1]."""
    pairs = [(u.sent + u.delta, u.sent) for us in list(ups.values())[:clients] for u in _usable(us)[:1]]
    if not pairs:
        return 1.0, 1.0

    def cost(g: float) -> float:
        out = []
        for new, old in pairs:
            s = np.linalg.svd(new - g * old, compute_uv=False)
            out.append(s[1] / s[0] if s[0] > 0 else 1.0)
        return float(np.median(out))

    grid = np.linspace(0.0, 1.0, 201)
    k = int(np.argmin([cost(g) for g in grid]))
    from scipy.optimize import minimize_scalar

    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, grid.size - 1)]
    res = minimize_scalar(cost, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    g = float(res.x) if res.fun <= cost(grid[k]) else float(grid[k])
    return g, cost(g)


@register_attack("generic-mf-ratings-estimated")
class GenericMFRatingsEstimated(GenericMFRatings):
    """generic-mf-ratings without the public ``lr``, ``lam`` and ``local_steps`` (estimated)."""

    description = "plain-MF uploads, training hyperparameters unknown: estimated from the uploads, then decoded"

    def hyper(self, view: View, ups: dict[str, list]) -> tuple[EstimatedSteps | None, str]:
        """The decay c^T estimated from the uploads (never from the public config); the global
        mean fitted per client when the run gives none (:func:`known_mean`)."""
        if not any(_usable(us) for us in ups.values()):
            return None, "no upload with a known change of at least two rows"
        return EstimatedSteps(*estimate_decay(ups), fit_mean=self._mean(view) is None), ""

    def settle_mean(
        self, hp: Any, ups: dict[str, list], grid: np.ndarray, known: float | None
    ) -> tuple[Any, float | None, str]:
        """With the mean unknown, the one mean every client centres by (:func:`estimate_common_mean`)
        when it fits the clients as well as a mean of their own does; else each client's own."""
        if known is not None or not getattr(hp, "fit_mean", False):
            return super().settle_mean(hp, ups, grid, known)
        common = estimate_common_mean(ups, hp, grid)
        if common is None:
            return hp, None, "fitted per client"
        return EstimatedSteps(hp.decay, hp.rank_ratio), common, "estimated, common to the clients"

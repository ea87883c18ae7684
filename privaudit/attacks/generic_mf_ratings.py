"""``generic-mf-ratings``: a client's ratings from its plain-MF item uploads, one scalar per user.

Applies to any transcript whose clients train plain matrix factorization locally and upload
their item rows (``item_update``; rows or deltas). One gradient step on
1/2 sum_i (r_i - u.v_i)^2 + lam/2 (||u||^2 + ||v_i||^2) with learning rate ``lr`` moves row i by

    delta_i = lr ((r_i - u.v_i) u - lam v_i),   so   g_i = delta_i / lr + lam v_i = (r_i - u.v_i) u:

every row of G is a multiple of the private user vector u (the closed-form idea of
``mvmf-analytic`` applied to MF). With d the top right singular vector of G and u = t d,
a_i = g_i.d and b_i = v_i.d give r_i = a_i / t + t b_i: one unknown scalar t per user. The
attack picks the t > 0 that puts the decoded ratings closest to the public rating grid
(``rating_min``..``rating_max`` step ``rating_step``), then rounds. A client is *claimed*
when G is rank one to ``rank_tol`` and the decoded ratings sit on the grid to ``grid_tol``
(exact one-step uploads); several local steps bend G away from rank one, and the attack then
reports its best guess without claiming it. It needs the public ``lr`` (and ``lam``, default
0) and, for row uploads, the model the server sent (``state`` messages).

Metrics over the uploaded items of clients with ground truth: ``accuracy`` (exact rating),
``rmse``, ``claimed`` (share of clients claimed) and ``accuracy_claimed`` (exact ratings
among claimed clients). Random baseline: a uniform guess on the grid. Prior-only baseline:
the other clients' majority (mean for RMSE) rating, overall or of the item, whichever does
better on held-out clients (:meth:`GenericMFRatings.prior_baseline`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attacks._generic import (
    client_uploads,
    cross_fit,
    defense_note,
    loo_rating_counts,
    rating_population,
    ratio,
    scored_victims,
    uploaders,
)
from privaudit.attacks.base import Attack, Reconstruction
from privaudit.errors import PrivauditError
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


def decode(G: np.ndarray, V: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Ratings, rank-one residual and grid residual from G (n x K) and the sent rows V (n x K).

    The rank-one residual is sigma_2 / sigma_1 of G; the grid residual the RMS distance of the
    decoded ratings to the grid at the chosen t.
    """
    _, s, vt = np.linalg.svd(G, full_matrices=False)
    rank_res = float(s[1] / s[0]) if s.size > 1 and s[0] > 0 else (0.0 if s.size and s[0] > 0 else 1.0)
    best = None
    for d in (vt[0], -vt[0]):  # u = t d with t > 0 for one of the two signs
        r, res = _fit_scale(G @ d, V @ d, grid)
        if best is None or res < best[1]:
            best = (r, res)
    return best[0], rank_res, best[1]


def _fit_scale(a: np.ndarray, b: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, float]:
    """Ratings a / t + t b at the t > 0 closest to the grid, and their RMS grid residual."""

    def cost(t):
        return np.mean(_grid_residual(a[:, None] / t + t * b[:, None], grid) ** 2, axis=0)

    costs = cost(_T_GRID)
    k = int(np.argmin(costs))
    lo, hi = _T_GRID[max(k - 1, 0)], _T_GRID[min(k + 1, _T_GRID.size - 1)]
    from scipy.optimize import minimize_scalar  # on use: scipy.optimize slows every command's start

    res = minimize_scalar(
        lambda t: float(cost(np.array([t]))[0]), bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}
    )
    t = float(res.x) if res.fun <= costs[k] else float(_T_GRID[k])
    r = a / t + t * b
    return r, float(np.sqrt(np.mean(_grid_residual(r, grid) ** 2)))


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
    params = {"rank_tol": 1e-6, "grid_tol": 1e-3, "max_rank_ratio": 0.5}
    param_help = {
        "rank_tol": "claim a client only when sigma_2/sigma_1 of its gradient rows is below this",
        "grid_tol": "... and its decoded ratings are this close (RMS) to the rating grid",
        "max_rank_ratio": "not applicable when the median sigma_2/sigma_1 of the clients' row changes exceeds this",
    }
    metric_specs = {
        "accuracy": MetricSpec(True, True, "fraction", "share of uploaded items whose rating is recovered exactly"),
        "rmse": MetricSpec(False, True, "rating", "root mean squared error of the recovered ratings"),
        "claimed": MetricSpec(True, True, "fraction", "share of clients whose decode is exact (rank one, on the grid)"),
        "accuracy_claimed": MetricSpec(True, True, "fraction", "exact-rating share among the claimed clients"),
        "victims": MetricSpec(True, False, "count", "clients scored"),
    }

    def validate(self) -> None:
        for key in ("rank_tol", "grid_tol", "max_rank_ratio"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise PrivauditError(f"attack 'generic-mf-ratings': {key} must be a positive number, got {value!r}")

    def applicable(self, view: View) -> tuple[bool, str]:
        ok, reason = super().applicable(view)
        if not ok:
            return ok, reason + defense_note(view)
        if not isinstance(view.config.get("lr"), (int, float)) or not view.config.get("lr"):
            return False, "the public config lacks 'lr' (the clients' learning rate; map it in the schema's public)"
        ups = client_uploads(view)
        if ups and all(u.delta is None for us in ups.values() for u in us):
            return False, "the uploads are item rows but the server's view holds no model it sent (no 'model' state)"
        ratios = []
        lr, lam = float(view.config["lr"]), float(view.config.get("lam", 0.0) or 0.0)
        for us in list(ups.values())[:5]:
            up = next((u for u in us if u.delta is not None and u.sent is not None and u.items.size >= 2), None)
            if up is not None:
                s = np.linalg.svd(up.delta / lr + lam * up.sent, compute_uv=False)
                ratios.append(s[1] / s[0] if s[0] > 0 else 1.0)
        if ratios and float(np.median(ratios)) > self.max_rank_ratio:
            return False, (
                "the uploaded row changes are not multiples of one user vector "
                f"(sigma_2/sigma_1 = {np.median(ratios):.2f} > {self.max_rank_ratio}): "
                "the clients do not run a few plain-MF gradient steps"
            )
        return True, ""

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        lr = float(view.config["lr"])
        lam = float(view.config.get("lam", 0.0) or 0.0)
        grid = grid_of(view.config)
        victims: dict[str, dict[str, np.ndarray]] = {}
        for party, ups in client_uploads(view).items():
            decoded = []
            for up in _usable(ups):
                r, rank_res, grid_res = decode(up.delta / lr + lam * up.sent, up.sent, grid)
                decoded.append((grid_res, rank_res, up.items, r))
            if not decoded:
                continue
            decoded.sort(key=lambda d: d[0])  # every item from the closest-to-grid upload holding it
            items = np.unique(np.concatenate([d[2] for d in decoded]))
            raw = np.full(items.size, np.nan)
            for _, _, its, r in reversed(decoded):
                raw[np.searchsorted(items, its)] = r
            grid_res, rank_res = decoded[0][:2]
            claimed = rank_res < self.rank_tol and grid_res < self.grid_tol
            victims[party] = {
                "items": items,
                "ratings": snap(raw, grid),
                "raw": raw,
                "claimed": np.array([claimed]),
                "residuals": np.array([rank_res, grid_res]),
            }
        return Reconstruction(self.name, self.party, victims, meta={"clients": len(victims)})

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
        (:func:`~privaudit.attacks._generic.cross_fit`; counted in hindsight from the other
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
        """Per client: exact ratings and squared errors over its rated uploaded items
        (``claimed`` and ``accuracy_claimed`` depend on the attack's claims and are left out)."""
        parties, n, hits, sq, _ = self._attack_parts(reconstruction, transcript)
        prior_parties, _, prior = self._prior_parts(transcript)
        if not parties or not prior_parties:
            return None
        idx = np.array([prior_parties.index(p) for p in parties])
        return VictimTable(
            parties,
            {"accuracy": n, "rmse": n},
            {"accuracy": hits, "rmse": sq},
            {m: v[idx] for m, v in prior.items()},
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

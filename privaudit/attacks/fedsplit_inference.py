"""``fedsplit-inference``: reconstruct a group's ratings from its FedSPLIT upload (FedSPLIT paper §4.4).

Threat model (§4.4): the server (honest but curious), or anyone holding what it holds, knows
every group's upload ``H`` = {(H^g)^T, b_H^g} (as received: noisy under a ``laplace``/
``gaussian`` defense), mu^Global (its own ``state``, else recomputed from the ``mean``
uploads by eq. 14), and is *granted* (:meth:`FedSplitInference.prior_knowledge`) the number
of members n^g and a fraction ``aux_fraction`` of X^g:

- ``mode=user``: round(f n^g) of the group's users, with all their ratings (rows of X^g);
- ``mode=movie``: round(f m^g) of the m^g movies the group rated, with all the group's ratings
  of them (columns of X^g);
- ``mode=rating``: round(f |X^g|) individual ratings (non-zero entries).

With H^g, b_H^g and mu fixed, the adversary fits W_adv (n^g x k^g) and b_W with the CNMF
W-update (eq. 12) and b_W-update (eq. 10) on the known entries (the public CNMF
hyperparameters of the run; :func:`~privaudit.models.cnmf.fit_row_factors`, all groups in
one vectorised pass), and reconstructs X^g_adv by eq. 7, clipped to the rating range (the
adversary knows it). Users without any known rating get W = 0, b_W = 0 (the limit of eq. 12
without data), i.e. mu + b_H.

Scoring, per group g, on the non-zeros of X^g (its training ratings, from the ``private``
messages):

- ``relative_error``: eq. 4, ||X^g - X^g_adv||^2 / ||X^g||^2 over all non-zeros (the paper's
  metric: the known entries included), mean over groups; ``relative_error_ci95`` its 95 %
  half-width over groups (Student t, :func:`privaudit.metrics.mean_ci95`);
- ``relative_error_unknown``: the same on the entries the adversary was not given (NaN when
  it was given everything);
- ``rating_accuracy``: fraction of all non-zeros whose rounded reconstruction equals the
  rating (pooled; PrivMVMF paper eq. 43 style) — the accuracy-like view: lower error = more
  leakage = higher accuracy.

Baseline (:meth:`FedSplitInference.baseline`): the adversary without H — it predicts
mu^Global + b_H^g (clipped) for every entry; same metric names. Lower is better for the
relative errors, so the attack leaks beyond the baseline when its error is *below* it.
``primary_metric = "relative_error"``; the default sweep is ``aux_fraction`` 0.05..1.0 in
steps of 0.05 (§4.4). Departure: the paper's Fig. 4 shows relative errors above 1 at small
fractions, which comes from leaving unknown users' W at its random initialisation; here they
get W = 0 (see above), so errors stay near the baseline instead.

Decoder (``prior_blend``, default true): the adversary keeps what it was given (the known
entries are predicted as known) and predicts every other entry as ``p + w (r - p)``, ``r`` the
reconstruction above and ``p`` the bias model of the prior library fitted on the known entries
(both clipped to the rating range), with one weight ``w`` in [0, 1] fitted on the adversary's
own knowledge: two-fold cross-fitting over each group's known entries (fit on one half, predict
the other) and the least-squares weight over the held-out entries. Uploads that carry nothing
give ``w`` ~ 0 (the decoder is the prior), informative ones ``w`` ~ 1. Without it (``prior_blend
= false``, the paper's decode, whose eq. 4 counts the known entries as reconstructed) the decode
of noise fell far below the prior (issue 35: "attack below prior" in every null experiment).
With no known entry there is nothing to calibrate on and the decode is used alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.attacks.base import Attack, Reconstruction
from privaudit.attacks.generic._uploads import cross_fit, ratio
from privaudit.errors import PrivauditError
from privaudit.metrics import mean_ci95
from privaudit.models.cnmf import fit_row_factors
from privaudit.params import Param
from privaudit.protocols.fedsplit import cnmf_from_config
from privaudit.registry import register_attack
from privaudit.results import MetricSpec, VictimTable
from privaudit.transcript import Transcript, View, is_client

__all__ = ["FedSplitInference", "AUX_FRACTIONS"]

#: The paper's auxiliary-knowledge grid (5 % to 100 % in steps of 5 %).
AUX_FRACTIONS = tuple(round(0.05 * i, 2) for i in range(1, 21))
MODES = ("user", "movie", "rating")
#: pseudo-ratings shrinking the user and item biases of the prior-only baseline towards 0
SHRINK = 25.0


def _half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def _client_index(party: str) -> int:
    return int(party.split(":", 1)[1])


def _uploads(view: View) -> dict[str, dict[str, np.ndarray]]:
    """party -> {"H_T": (m, k^g), "b_H": (m,)} of the ``H`` messages the server received."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for msg in view.select("H", receiver=view.party):
        out[msg.sender] = {
            "H_T": np.asarray(msg.payload["H_T"], dtype=np.float64),
            "b_H": np.asarray(msg.payload["b_H"], dtype=np.float64),
        }
    return out


def _mu_global(view: View) -> float:
    """mu^Global from the server's state, else from the ``mean`` uploads (eq. 14)."""
    for msg in view.select("state", receiver=view.party):
        if "mu_global" in msg.payload:
            return float(msg.payload["mu_global"])
    means = view.select("mean", receiver=view.party)
    if not means:
        raise PrivauditError("the view holds neither the server state nor the mean uploads (no mu^Global)")
    sums = np.array([float(m.payload["sum"]) for m in means])
    counts = np.array([float(m.payload["count"]) for m in means])
    if view.config.get("global_mean", "groups") == "ratings":
        return float(sums.sum() / max(counts.sum(), 1.0))
    return float(np.mean(sums / np.maximum(counts, 1.0)))


def _truth(transcript: Transcript, party: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    p = transcript.private(party)
    users = np.asarray(p["users"], dtype=np.int64)
    items = np.asarray(p["items"], dtype=np.int64)
    ratings = np.asarray(p["ratings"], dtype=np.float64)
    n_users = int(np.asarray(p["n_users"])) if "n_users" in p else int(users.max(initial=-1) + 1)
    return users, items, ratings, n_users


@register_attack("fedsplit-inference")
class FedSplitInference(Attack):
    description = (
        "FedSPLIT reconstruction: fit W_adv, b_W to H^g, b_H^g and partial knowledge of X^g (FedSPLIT paper §4.4)"
    )
    party = "server"
    protocols = ("fedsplit",)
    requires = ("H",)
    default_sweep = ("aux_fraction", AUX_FRACTIONS)
    primary_metric = "relative_error"
    metric_specs = {
        "relative_error": MetricSpec(
            False, True, "ratio", "||X - X_adv||^2 / ||X||^2 on a group's ratings (eq. 4), mean over groups"
        ),
        "relative_error_ci95": MetricSpec(False, False, "ratio", "95 % half-width of relative_error over groups"),
        "relative_error_unknown": MetricSpec(
            False, True, "ratio", "relative error on the ratings the adversary was not given"
        ),
        "rating_accuracy": MetricSpec(
            True, True, "fraction", "share of a group's ratings whose rounded reconstruction is exact"
        ),
        "n_groups": MetricSpec(True, False, "count", "number of groups scored"),
    }
    parameters = (
        Param(
            "mode",
            "rating",
            "what the adversary knows of X^g: 'user' (rows), 'movie' (columns) or 'rating' (entries)",
            choices=MODES,
        ),
        Param(
            "aux_fraction",
            0.5,
            "fraction of the users / rated movies / ratings of each group the adversary knows",
            ge=0,
            le=1,
        ),
        Param("n_iter", 0, "iterations of the W and b_W updates (0: the protocol's n_iter)", ge=0),
        Param(
            "prior_blend",
            True,
            "posterior decoder: known ratings kept, the rest the bias prior plus a self-calibrated "
            "weight times (decode - prior); false: the paper's decode alone",
        ),
    )

    # ------------------------------------------------------------------ knowledge
    def prior_knowledge(self, transcript: Transcript, rng: np.random.Generator) -> dict[str, Any]:
        """Per group: n^g and the known part of X^g (``users``, ``items``, ``ratings``, ``known``).

        ``known`` is the (|X^g|,) bool mask over the group's private entries (in their order).
        """
        f = float(self.aux_fraction)
        mode = self.mode
        groups: dict[str, dict[str, Any]] = {}
        for party in transcript.parties:
            if not is_client(party):
                continue
            if not transcript.private(party):
                continue
            users, items, ratings, n_users = _truth(transcript, party)
            if mode == "user":
                chosen = rng.choice(n_users, size=min(n_users, _half_up(f * n_users)), replace=False)
                known = np.isin(users, chosen)
            elif mode == "movie":
                rated = np.unique(items)
                chosen = rng.choice(rated, size=min(rated.size, _half_up(f * rated.size)), replace=False)
                known = np.isin(items, chosen)
            else:
                chosen = rng.choice(ratings.size, size=min(ratings.size, _half_up(f * ratings.size)), replace=False)
                known = np.zeros(ratings.size, dtype=bool)
                known[chosen] = True
            groups[party] = {
                "n_users": n_users,
                "users": users[known],
                "items": items[known],
                "ratings": ratings[known],
                "known": known,
            }
        return {"mode": mode, "aux_fraction": f, "groups": groups}

    # ------------------------------------------------------------------ attack
    def applicable(self, view: View) -> tuple[bool, str]:
        return super().applicable(view)  # the base rule: every kind of ``requires``, in plaintext

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        uploads = _uploads(view)
        granted = knowledge.get("groups", {})
        parties = sorted((p for p in uploads if p in granted), key=_client_index)
        if not parties:
            return self.unsupported("no group's upload has matching auxiliary knowledge (no private ground truth)")
        mu = _mu_global(view)
        cfg = dict(view.config)
        lo, hi = float(cfg.get("rating_min", 1.0)), float(cfg.get("rating_max", 5.0))
        entries = [(granted[p]["users"], granted[p]["items"], granted[p]["ratings"]) for p in parties]
        fit = self._fit_groups(view, uploads, parties, granted, entries, mu, rng)
        W, b_W, H_all, k_g, row_off, m, n_iter = fit
        blend, held_out = self._calibrate(view, uploads, parties, granted, entries, mu, rng, (lo, hi))
        victims = {}
        for b, p in enumerate(parties):
            r0, r1 = row_off[b], row_off[b + 1]
            ku, ki, kr = entries[b]
            mean, bu, bi = _bias_params(ku, ki, kr, SHRINK)
            victims[p] = {
                "W": W[r0:r1, : k_g[b]],
                "b_W": b_W[r0:r1],
                "H": H_all[: k_g[b], b * m : (b + 1) * m].copy(),  # as fitted (projected onto >= 0)
                "b_H": uploads[p]["b_H"],
                "mu": np.asarray(mu),
                "known": np.asarray(granted[p]["known"], dtype=bool),
            }
            if kr.size and self.prior_blend:  # the posterior decoder (class docstring)
                victims[p].update(
                    known_ratings=np.asarray(kr, dtype=np.float64),
                    prior_mean=np.asarray(mean),
                    prior_bu=bu,
                    prior_bi=bi,
                    blend=np.asarray(blend),
                    range=np.asarray([lo, hi]),
                )
        meta = {
            "mode": knowledge.get("mode", self.mode),
            "aux_fraction": knowledge.get("aux_fraction", float(self.aux_fraction)),
            "groups": len(parties),
            "known_ratings": int(sum(e[2].size for e in entries)),
            "n_iter": n_iter,
            "blend": float(blend),
            "blend_held_out": held_out,
        }
        return Reconstruction(self.name, self.party, victims, meta=meta)

    def _fit_groups(self, view, uploads, parties, granted, entries, mu, rng):
        """W_adv, b_W of every group fitted on ``entries`` (per group: users, items, ratings), all
        groups in one vectorised pass: (W, b_W, H_all, k_g, row_off, m, n_iter)."""
        cfg = dict(view.config)
        m = int(cfg.get("n_items", uploads[parties[0]]["H_T"].shape[0]))
        k_g = np.array([uploads[p]["H_T"].shape[1] for p in parties], dtype=np.int64)
        k_max = int(k_g.max())
        n_g = np.array([int(granted[p]["n_users"]) for p in parties], dtype=np.int64)
        G = len(parties)
        row_off = np.concatenate(([0], np.cumsum(n_g)))
        # all groups in one pass: group b's rows are row_off[b]..; its columns b*m..(b+1)*m
        H_all = np.zeros((k_max, G * m))
        for b, p in enumerate(parties):
            H_all[: k_g[b], b * m : (b + 1) * m] = np.maximum(uploads[p]["H_T"].T, 0.0)
        b_H_all = np.concatenate([uploads[p]["b_H"] for p in parties])
        rows = np.concatenate([np.asarray(e[0]) + row_off[b] for b, e in enumerate(entries)]).astype(np.int64)
        cols = np.concatenate([np.asarray(e[1]) + b * m for b, e in enumerate(entries)]).astype(np.int64)
        vals = np.concatenate([np.asarray(e[2]) for e in entries]).astype(np.float64)
        X_known = sp.csr_matrix((vals, (rows, cols)), shape=(int(row_off[-1]), G * m))
        model = cnmf_from_config(cfg, k_max)
        if int(self.n_iter) > 0:
            model.n_iter = int(self.n_iter)
        row_rank = np.repeat(k_g, n_g)
        W, b_W = fit_row_factors(model, X_known, H_all, b_H_all, mu, rng, row_rank)
        return W, b_W, H_all, k_g, row_off, m, model.n_iter

    def _calibrate(self, view, uploads, parties, granted, entries, mu, rng, bounds) -> tuple[float, int]:
        """The weight w in [0, 1] of the message decode against the prior, fitted on the
        adversary's own known ratings (no victim ground truth): two-fold cross-fitting over each
        group's known entries -- fit W_adv and the bias prior on one fold, predict the other --
        and w = argmin sum (y - p - w (r - p))^2 over the held-out entries (r the clipped decode,
        p the clipped prior). Returns (w, held-out entries); w = 1 (the decode alone, the paper's
        attack) when fewer than 2 known entries per group leave nothing to calibrate on."""
        lo, hi = bounds
        folds = []
        for _, _, kr in entries:
            f = np.zeros(kr.size, dtype=bool)
            f[rng.permutation(kr.size)[: kr.size // 2]] = True
            folds.append(f)
        if sum(int(f.sum()) for f in folds) < 2 or not self.prior_blend:
            return 1.0, 0
        ys, rs, ps = [], [], []
        for side in (True, False):
            train = [(u[f != side], i[f != side], r[f != side]) for (u, i, r), f in zip(entries, folds)]
            W, b_W, H_all, k_g, row_off, m, _ = self._fit_groups(view, uploads, parties, granted, train, mu, rng)
            for b, ((u, i, r), f) in enumerate(zip(entries, folds)):
                test = f == side
                if not test.any():
                    continue
                tu, ti = u[test], i[test]
                W_b = W[row_off[b] : row_off[b + 1], : k_g[b]]
                H_b = H_all[: k_g[b], b * m : (b + 1) * m]
                dec = np.einsum("nk,kn->n", W_b[tu], H_b[:, ti]) + b_W[row_off[b] + tu] + uploads[parties[b]]["b_H"][ti]
                ys.append(r[test])
                rs.append(np.clip(dec + mu, lo, hi))
                ps.append(np.clip(_bias_predict(_bias_params(*train[b], SHRINK), tu, ti), lo, hi))
        y, r, p = (np.concatenate(x) for x in (ys, rs, ps))
        d = r - p
        den = float(d @ d)
        w = float(np.clip((y - p) @ d / den, 0.0, 1.0)) if den > 0 else 0.0
        return w, int(y.size)

    # ------------------------------------------------------------------ scoring
    def _rating_range(self, transcript: Transcript) -> tuple[float, float]:
        return float(transcript.config.get("rating_min", 1.0)), float(transcript.config.get("rating_max", 5.0))

    def _parts(self, transcript: Transcript, predict) -> tuple[list[str], dict[str, np.ndarray]]:
        """Scored groups and their parts: ``relative_error`` (eq. 4), ``unknown`` (1 when the
        group has entries the adversary was not given), ``relative_error_unknown`` (0 without),
        ``hits`` (exact rounded ratings) and ``ratings`` (non-zeros)."""
        lo, hi = self._rating_range(transcript)
        parties, rows = [], []
        for party in transcript.parties:
            if not is_client(party) or not transcript.private(party):
                continue
            users, items, ratings, _ = _truth(transcript, party)
            if ratings.size == 0:
                continue
            out = predict(party, users, items)
            if out is None:
                continue
            pred, known = out
            pred = np.clip(pred, lo, hi)
            sq = (ratings - pred) ** 2
            unknown = ~known
            err_unknown = float(sq[unknown].sum() / np.sum(ratings[unknown] ** 2)) if unknown.any() else 0.0
            hits = float(np.sum(np.round(pred) == ratings))
            parties.append(party)
            rows.append((float(sq.sum() / np.sum(ratings**2)), float(unknown.any()), err_unknown, hits, ratings.size))
        keys = ("relative_error", "unknown", "relative_error_unknown", "hits", "ratings")
        table = np.asarray(rows, dtype=float).reshape(len(rows), len(keys))
        return parties, {k: table[:, j] for j, k in enumerate(keys)}

    @staticmethod
    def _values(parts: dict[str, np.ndarray]) -> dict[str, float]:
        errs = parts["relative_error"]
        if not errs.size:
            nan = float("nan")
            return {
                "relative_error": nan,
                "relative_error_ci95": nan,
                "relative_error_unknown": nan,
                "rating_accuracy": nan,
                "n_groups": 0.0,
            }
        mean, ci = mean_ci95(errs.tolist())
        return {
            "relative_error": mean,
            "relative_error_ci95": ci,
            "relative_error_unknown": ratio(parts["relative_error_unknown"], parts["unknown"]),
            "rating_accuracy": ratio(parts["hits"], parts["ratings"]),
            "n_groups": float(errs.size),
        }

    def _score(self, transcript: Transcript, predict) -> dict[str, float]:
        return self._values(self._parts(transcript, predict)[1])

    @staticmethod
    def _table(parties: list[str], parts: dict[str, np.ndarray], prior: dict[str, np.ndarray]) -> VictimTable:
        ones = np.ones(len(parties))
        weight = {
            "relative_error": ones,
            "relative_error_unknown": parts["unknown"],
            "rating_accuracy": parts["ratings"],
        }
        num = {"relative_error": "relative_error", "relative_error_unknown": "relative_error_unknown"}
        num["rating_accuracy"] = "hits"
        return VictimTable(
            parties, weight, {m: parts[k] for m, k in num.items()}, {m: prior[k] for m, k in num.items()}
        )

    @staticmethod
    def _predictor(reconstruction: Reconstruction):
        victims = reconstruction.victims

        def predict(party, users, items):
            v = victims.get(party)
            if v is None:
                return None
            est = (
                np.einsum("nk,kn->n", v["W"][users], v["H"][:, items])
                + v["b_W"][users]
                + v["b_H"][items]
                + float(v["mu"])
            )
            if "blend" in v:  # the posterior decoder: known entries as known, the rest blended
                lo, hi = v["range"]
                params = (float(v["prior_mean"]), v["prior_bu"], v["prior_bi"])
                prior = np.clip(_bias_predict(params, users, items), lo, hi)
                est = prior + float(v["blend"]) * (np.clip(est, lo, hi) - prior)
                known = v["known"]
                est[known] = v["known_ratings"]
            return est, v["known"]

        return predict

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        return self._score(transcript, self._predictor(reconstruction))

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """Per group: its relative errors (weight 1: means over groups; the unknown one only
        for groups with unknown entries) and its exact rounded ratings over its ratings."""
        parties, parts = self._parts(transcript, self._predictor(reconstruction))
        prior_parties, prior = self._prior_parts(transcript, knowledge)
        if not parties:
            return None
        idx = np.array([prior_parties.index(p) for p in parties])
        return self._table(parties, parts, {k: v[idx] for k, v in prior.items()})

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The adversary with its auxiliary ratings but without any group's upload.

        Known entries are predicted exactly; every other entry by the better (lower relative
        error on held-out halves of the groups, :func:`~privaudit.attacks.generic._uploads.cross_fit`)
        of a bias model fitted on the known ratings of the group, ``mean + b_user + b_item``
        (biases shrunk towards 0 by ``SHRINK`` pseudo-ratings), and the grand mean of the known
        ratings; the rating midpoint when none is known. Clipped to the rating range.
        """
        return self._values(self._prior_parts(transcript, knowledge)[1])

    def _prior_parts(self, transcript: Transcript, knowledge: dict[str, Any]):
        lo, hi = self._rating_range(transcript)
        groups = knowledge.get("groups", {})

        def predictor(shrink: float | None):
            def predict(party, users, items):
                g = groups.get(party)
                known = np.asarray(g["known"], dtype=bool) if g is not None else np.zeros(items.size, dtype=bool)
                if g is None or not known.any():
                    return np.full(items.size, (lo + hi) / 2.0), known
                ku, ki, kr = (np.asarray(g[k]) for k in ("users", "items", "ratings"))  # the granted entries
                pred = np.full(items.size, float(np.mean(kr)))
                if shrink is not None:
                    pred = _bias_predict(_bias_params(ku, ki, kr, shrink), users, items)
                pred[known] = kr
                return pred, known

            return predict

        library = {
            name: self._parts(transcript, predictor(shrink))
            for name, shrink in (("bias model", SHRINK), ("grand mean", None))
        }
        parties = library["bias model"][0]
        if not parties:
            return parties, library["bias model"][1]
        num, _ = cross_fit(
            {name: parts for name, (_, parts) in library.items()}, "relative_error", np.ones(len(parties)), False
        )
        return parties, num

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        """The adversary without H: mu^Global + b_H^g for every entry (same metrics)."""
        view = transcript.view(self.party)
        uploads = _uploads(view)
        try:
            mu = _mu_global(view)
        except PrivauditError:
            mu = float("nan")

        def predict(party, users, items):
            up = uploads.get(party)
            b_H = up["b_H"][items] if up is not None else 0.0
            return mu + b_H + np.zeros(items.size), np.zeros(items.size, dtype=bool)

        return self._score(transcript, predict)


def _bias_params(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, shrink: float):
    """The bias model ``mean + b_user + b_item`` fitted on known ratings (biases shrunk towards 0
    by ``shrink`` pseudo-ratings): (mean, b_user, b_item); the rating midpoint is not known
    here, so no ratings give (nan, [], [])."""
    users, items, ratings = (np.asarray(x) for x in (users, items, ratings))
    if ratings.size == 0:
        return float("nan"), np.zeros(0), np.zeros(0)
    mean = float(np.mean(ratings))
    nu, ni = int(users.max()) + 1, int(items.max()) + 1
    bu = np.bincount(users, weights=ratings - mean, minlength=nu) / (np.bincount(users, minlength=nu) + shrink)
    ri = ratings - mean - bu[users]
    bi = np.bincount(items, weights=ri, minlength=ni) / (np.bincount(items, minlength=ni) + shrink)
    return mean, bu, bi


def _bias_predict(params, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """The bias model's prediction (a user or item without known ratings gets bias 0)."""
    mean, bu, bi = params
    u = np.where(users < bu.size, bu[np.minimum(users, max(bu.size - 1, 0))], 0.0) if bu.size else 0.0
    i = np.where(items < bi.size, bi[np.minimum(items, max(bi.size - 1, 0))], 0.0) if bi.size else 0.0
    return mean + u + i + np.zeros(np.shape(items))

"""``mvmf-analytic``: closed-form server reconstruction attack on FedMVMF.

Every FedMVMF upload row is a multiple of the client's latent vector u = t d, so a rank-1 fit
gives d, the client's own update rule gives the scale t (:mod:`~privaudit.attacks.mvmf._scales`),
and the ratings and attributes follow in closed form: exact without noise, decoded on the
rating grid under a prior when noisy (:mod:`~privaudit.attacks.mvmf._decode`) or clipped
(:mod:`~privaudit.attacks.mvmf._decode_clipped`). Derivation and departures from the paper's
nonlinear-solver attack: ``docs/mvmf-analytic.md``.

Reads only the FedMVMF message kinds ``state``, ``grad_V``, ``grad_P`` and the public config
keys ``K``, ``alpha``, ``lam``, ``w``, ``eta``, ``update``, ``unrated``, ``rating_min``,
``rating_max`` (``rating_step``, ``attribute_names``, ``defenses`` if present).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from privaudit.attacks.base import Reconstruction
from privaudit.attacks.mvmf._clipped import Clipping, clipping_of, rated_log_odds
from privaudit.attacks.mvmf._core import (
    FlatFedMVMFView,
    MVMFAttack,
    missing_config,
    parse_view_flat,
    population_prior,
    round_attributes,
    round_ratings,
)
from privaudit.attacks.mvmf._decode import (
    DIGEST_MAX_BYTES,
    DecodeSettings,
    accumulate,
    clip_scales,
    decode_attribute_blocks,
    decode_attributes,
    decode_ratings,
    inputs_digest,
    reference_layout,
)
from privaudit.attacks.mvmf._decode_clipped import (
    clipped_evidence,
    decide_clipped,
    first_round_layout,
    stationarity_ratings,
)
from privaudit.attacks.mvmf._rounds import TINY, Round, UpdateModel, round_stats
from privaudit.attacks.mvmf._scales import SHORTCUT_MARGIN, SHORTCUT_TOL, round_scales, shortcut_first_round
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.transcript import View


def _sampling_weight(entry: dict, w: float) -> float:
    """Confidence c of the items a ``sampling`` defense added, from its public config entry.

    A numeric ``w`` (or ``weight``) is used as is; otherwise the registered defense's own rule
    (its ``weight`` property, e.g. FedMVMF's default w), else the protocol's ``w``.
    """
    for key in ("w", "weight"):
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    try:
        from privaudit.registry import get

        params = {k: v for k, v in entry.items() if k != "name"}
        return float(get("defense", "sampling")(**params).weight)
    except Exception:  # a foreign or older sampling entry: the protocol's w
        return w


def _update_model(cfg: dict) -> tuple[UpdateModel, list[dict]]:
    """The estimators' settings from the public config, and the ``sampling`` defense entries
    (their added items make c unknown, with their own weight)."""
    w = float(cfg.get("w", 0.0) or 0.0)
    sampling = [dd for dd in cfg.get("defenses", []) if isinstance(dd, dict) and dd.get("name") == "sampling"]
    w_virtual = w
    for dd in sampling:
        w_virtual = _sampling_weight(dd, w)
    lo, hi = float(cfg["rating_min"]), float(cfg["rating_max"])
    step = float(cfg.get("rating_step", 1.0) or 1.0)
    model = UpdateModel(
        K=int(cfg["K"]),
        update=str(cfg["update"]),
        unknown_c=cfg["unrated"] == "inclunc" or bool(sampling),
        w=w_virtual,
        eta=float(cfg.get("eta", 0.0) or 0.0),
        alpha=float(cfg["alpha"]),
        lam=float(cfg["lam"]),
        grid=np.arange(lo, hi + step / 2, step),
    )
    return model, sampling


def _upload_bytes(fv: FlatFedMVMFView) -> int:
    """Bytes of the uploaded grad_V rows of every round (from the offsets: nothing concatenated)."""
    K = next(iter(fv.V.values())).shape[1] if fv.V else 0
    return sum(int(R.offsets[-1]) if len(R.offsets) else 0 for R in fv.rounds) * K * 8


def _pooled_noise(stats: list[Round], K: int) -> float:
    """Noise variance per coordinate pooled over the rounds: the energy of the rows off the
    rank-1 fit per degree of freedom (floored relative to the signal)."""
    dof = sum(float(np.sum(s.rows)) for s in stats) * max(K - 1, 0)
    sigma2 = sum(float(np.sum(s.resid)) for s in stats) / dof if dof > 0 else 0.0
    scale2 = np.mean([np.mean(s.af**2) if len(s.af) else 0.0 for s in stats]) + TINY
    return max(sigma2, 1e-24 * scale2)


#: reconstructions kept per transcript (:meth:`~privaudit.transcript.Transcript.derived`): the last
#: ones by the digest of their inputs (:meth:`MVMFAnalytic._inputs_digest`). mvmf-aggregate's
#: inner mvmf-analytic on one-member cohorts reads the same uploads as mvmf-analytic on the run
#: (returned as copies of the per-victim dicts; the arrays are shared, read only)
RESULTS_KEPT = 2


@register_attack("mvmf-analytic")
class MVMFAnalytic(MVMFAttack):
    """Closed-form FedMVMF reconstruction: exact without noise, least squares + MAP under noise."""

    description = "Closed-form FedMVMF server reconstruction (rank-1 fit + scale in closed form; exact without noise)"
    requires = ("grad_V", "grad_P", "state")
    parameters = (
        Param("max_rounds", -1, "use at most this many recorded rounds (-1: every round the view holds)"),
        Param(
            "prior",
            True,
            "posterior decoding with the population prior of the knowledge, else one fitted by EM "
            "(false: plain clip-and-round)",
        ),
        Param("refits", 3, "InclUnc/sampling: decide-rated/refit-scale iterations per round", ge=0),
        Param(
            "shortcut",
            True,
            "decode from the first round alone when it decides every value with a residual far "
            "below the rating step (noise-free or near it); false: always the full estimator",
        ),
    )

    _population = None  # the run's PopulationPrior (knowledge), if any

    # ------------------------------------------------------------------ public API
    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        # The work is batches of tiny (K x K, K x L) products: BLAS threads only add overhead,
        # and on a busy machine their spinning dominates the attack's time.
        try:
            from threadpoolctl import threadpool_limits  # installed with scikit-learn
        except ImportError:  # pragma: no cover
            return self._run(view, knowledge)
        with threadpool_limits(limits=1, user_api="blas"):
            return self._run(view, knowledge)

    def _run(self, view: View, knowledge: dict[str, Any] | None = None) -> Reconstruction:
        self._population = population_prior(knowledge)
        tic = time.perf_counter()
        missing = missing_config(view)
        if missing:
            return self.unsupported(f"the view's config lacks {', '.join(missing)}")
        fv = parse_view_flat(view)
        if not fv.rounds:
            return self.unsupported("the view holds no client uploads with the server state of their round")
        if _upload_bytes(fv) > DIGEST_MAX_BYTES:  # digesting would cost more than a repeat saves
            return self._decode_view(fv, tic)
        kept = self._kept("mvmf-analytic results")
        if kept is None:  # no transcript to keep results with (no population prior)
            return self._decode_view(fv, tic)
        key = self._inputs_digest(fv)
        hit = kept.pop(key, None)
        if hit is not None:
            kept[key] = hit  # most recently used last
            victims = {party: dict(rec) for party, rec in hit.victims.items()}
            return Reconstruction(
                self.name, self.party, victims, meta=dict(hit.meta, seconds=time.perf_counter() - tic)
            )
        out = self._decode_view(fv, tic)
        if out.supported:
            kept[key] = out
            while len(kept) > RESULTS_KEPT:
                del kept[next(iter(kept))]
        return out

    def _kept(self, name: str) -> dict[Any, Any] | None:
        """The store ``name`` of the attacked transcript (that of the population prior), or None."""
        owner = self._population._transcript if self._population is not None else None
        return owner.derived(name) if owner is not None else None

    def _inputs_digest(self, fv: FlatFedMVMFView) -> bytes:
        """A digest of everything :meth:`_decode_view` reads besides the population prior: the
        config, the parties, the server states and uploads of every round, the parameters."""
        parts: list[Any] = [repr(fv.config), repr(fv.parties), repr(self.config)]
        for r in sorted(fv.V):
            parts += [r, fv.V[r]]
        for r in sorted(fv.P):
            parts += [r, fv.P[r]]
        for R in fv.rounds:
            parts += [R.round, R.users, R.offsets, R.items, R.grad_V, R.grad_P]
        return inputs_digest(*parts)

    def _decode_view(self, fv: FlatFedMVMFView, tic: float) -> Reconstruction:
        """The attack on a parsed view with at least one round (see the module doc)."""
        cfg = fv.config
        model, sampling = _update_model(cfg)
        if model.unknown_c and model.w <= 0:
            return self.unsupported("unrated items with weight w = 0 carry no gradient (nothing to separate)")
        rounds = fv.rounds
        if self.max_rounds is not None and self.max_rounds >= 0:
            rounds = rounds[: self.max_rounds]
        meta: dict[str, Any] = {"scenario": f"{cfg['update']}-{cfg['unrated']}" + ("+sampling" if sampling else "")}
        clip = clipping_of(cfg)
        joint_clip = clip is not None and clip.per != "row"
        if joint_clip:
            # a joint clip scales a client's uploads by one unknown factor: decoded as noise with a
            # per-user scale of the estimates (clip_scales); per message ("upload") approximately
            clip = None
        if self.shortcut and rounds and clip is None:
            # noise-adaptive use of rounds: when the first round alone decides every value with
            # a residual far below the grid step, further rounds cannot change a decision
            fast = shortcut_first_round(fv, rounds[0], model, tol=SHORTCUT_TOL * model.step, margin=SHORTCUT_MARGIN)
            if fast is not None:
                victims = self._victims(
                    cfg, fv.parties, fast.offsets, fast.items, fast.ratings, fast.attributes, rounded=True
                )
                meta.update(rounds=[fast.round], shortcut=True, max_residual=fast.residual)
                meta.update(noise_sigma=fast.noise_sigma, seconds=time.perf_counter() - tic)
                return Reconstruction(self.name, self.party, victims, meta=meta)
        stats = [s for s in (round_stats(fv, R, model.K) for R in rounds) if s is not None]
        if not stats:
            return self.unsupported("no round holds both the server state and client uploads")
        sigma2 = _pooled_noise(stats, model.K)
        taus = round_scales(fv, stats, model, self.refits)
        if all(np.all(~np.isfinite(t)) for t in taus):
            return self.unsupported(
                "SGD with ObsOnly needs two consecutive recorded rounds from the same clients to fix the scale"
            )
        if clip is not None:
            victims, diag = self._decode_clipped(cfg, fv, stats, taus, clip, model)
        else:
            settings = DecodeSettings(model.unknown_c, model.w, model.alpha, model.grid, sigma2, bool(self.prior))
            victims, diag = self._decode(cfg, fv, stats, taus, settings, joint_clip)
        meta.update(rounds=[s.round for s in stats], shortcut=False, noise_sigma=math.sqrt(sigma2))
        meta.update(seconds=time.perf_counter() - tic, **diag)
        return Reconstruction(self.name, self.party, victims, meta=meta)

    # ------------------------------------------------------------------ decoding
    @staticmethod
    def _victims(cfg, parties, offsets, items, ratings, attributes, rounded=False) -> dict[str, dict[str, np.ndarray]]:
        """Per-party reconstructions from CSR rows: ``items`` (concatenated array or per-user list),
        ``ratings`` (N,) and ``attributes`` (n, p), clipped and rounded as eq. 43 (unless ``rounded``:
        already on the grid and in the domain)."""
        if not rounded:
            ratings = round_ratings(ratings, cfg)
            attributes = round_attributes(attributes)
        bounds = np.asarray(offsets).tolist()
        if isinstance(items, np.ndarray):
            items = [items[bounds[u] : bounds[u + 1]] for u in range(len(parties))]
        return {
            party: {"items": items[u], "ratings": ratings[bounds[u] : bounds[u + 1]], "attributes": attributes[u]}
            for u, party in enumerate(parties)
        }

    def _decode_clipped(
        self,
        cfg: dict,
        fv: FlatFedMVMFView,
        stats: list[Round],
        taus: list[np.ndarray],
        clip: Clipping,
        model: UpdateModel,
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """Decode uploads clipped per row by a public DP defense (:mod:`privaudit.attacks.mvmf._clipped`).

        Censored rows (projection at the clipping bound) contribute only their side of the model
        prediction; uncensored rows their Gaussian likelihood; rounds whose item list for a user
        matches that user's first round are summed. Returns the victims and diagnostics
        (``clipped_row_share``: share of grad_V rows at the bound, ``clipped_attribute_share``).
        """
        parties, grid = fv.parties, model.grid
        layout = first_round_layout(stats, len(parties))
        values = np.concatenate([[0.0], grid]) if model.unknown_c else grid
        ev = clipped_evidence(stats, taus, clip, layout, model, values)
        shares = self._attribute_shares(parties, ev.XL.shape[1])
        attrs, _ = decode_attribute_blocks(cfg.get("attribute_names"), ev.XL, shares)
        stat_diag: dict[str, Any] = {}
        if str(cfg["update"]) == "semials" and not model.unknown_c:
            stat_diag = stationarity_ratings(fv, ev, layout, attrs, model)
        have = ev.pred_cnt > 0
        prior = self._population_rows(parties, layout.offsets, layout.flat, values, False)
        logprior = prior["joint"] if prior is not None else None
        pick, post, diag = decide_clipped(ev, values, logprior)
        diag.update(stat_diag)
        diag["prior"] = "population" if logprior is not None else "flat"
        ratings = np.full(len(layout.flat), grid[len(grid) // 2])
        if logprior is not None:
            ratings[:] = values[np.argmax(logprior, axis=1)]
        ratings[have] = values[pick]
        rated_score = np.zeros(len(layout.flat))
        if model.unknown_c:
            rated_score[have] = rated_log_odds(post)
        victims = self._victims(cfg, parties, layout.offsets, layout.items, ratings, attrs, rounded=True)
        for u, party in enumerate(parties):
            victims[party]["rated_score"] = rated_score[layout.offsets[u] : layout.offsets[u + 1]]
        diag.update(ev.diagnostics(clip))
        return victims, diag

    def _decode(
        self,
        cfg: dict,
        fv: FlatFedMVMFView,
        stats: list[Round],
        taus: list[np.ndarray],
        st: DecodeSettings,
        joint_clip: bool = False,
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """Combine the rounds per (user, item) and decode ratings and attributes (MAP / rounding);
        ``joint_clip``: the uploads were clipped per client or message (scale per user, :func:`clip_scales`)."""
        parties = fv.parties
        layout = reference_layout(fv, stats, taus, len(parties))
        ev = accumulate(layout, stats, taus, st)
        prior = self._population_rows(parties, layout.offsets, layout.flat, st.values, st.unknown_c)
        names = cfg.get("attribute_names")
        shares = self._attribute_shares(parties, ev.X0.shape[1])
        user_scales = row_scales = None
        if joint_clip and prior is not None and st.prior:
            seg = np.repeat(np.arange(len(parties)), layout.lengths)
            user_scales = clip_scales(ev, st, seg, prior["joint"], names, shares, self._kept("mvmf clip scales"))
            row_scales = (user_scales[0][seg], user_scales[1][seg])
        rating_guess, pi, extras, kappa = decode_ratings(ev, st, prior, row_scales)
        attrs, have_x, kappa_x = decode_attributes(names, ev, st, shares, user_scales)
        victims = self._victims(cfg, parties, layout.offsets, layout.items, rating_guess, attrs)
        for key, arr in extras.items():
            if key == "rated_ratings":
                arr = round_ratings(arr, cfg)
            for u, party in enumerate(parties):
                victims[party][key] = arr[layout.offsets[u] : layout.offsets[u + 1]]
        diag = {
            "users_without_scale": int(np.sum(~have_x)) if ev.X0.shape[1] else 0,
            "prior_ratings": [float(v) for v in pi],
            "prior": "population" if prior is not None else "em",
            "likelihood_inflation": kappa,
            "attribute_likelihood_inflation": kappa_x,
        }
        if user_scales is not None:
            diag["clip_scale_median"] = float(np.median(user_scales[0]))
        return victims, diag

    # ------------------------------------------------------------------ the population prior
    def _population_rows(
        self, parties: list[str], offsets: np.ndarray, items: np.ndarray, values: np.ndarray, unknown_c: bool
    ) -> dict[str, np.ndarray] | None:
        """Log priors of every decoded (user, item) row (CSR ``offsets``, ``items``) from the
        population's marginals, the user left out (:meth:`PriorTable.predictive`): ``joint``
        (N, H) over the hypotheses ``values``; with unrated items (``unknown_c``) also ``rated``
        (N, H - 1) over the grid given rated and ``rated_logit`` (N,) (log-odds of rated). Each is
        the prior the prior library uses for the metric the decision serves. None without a
        population prior; users it does not list get its mean rows."""
        pop = self._population
        if pop is None or not len(pop.table.victims) or not len(pop.table.values):
            return None
        table = pop.table
        rows = pop.index(parties)[np.repeat(np.arange(len(parties)), np.diff(offsets))]
        known = rows >= 0

        def rows_of(metric: str) -> np.ndarray:
            H = len(table.problem(metric)[2])
            pred = np.full((len(items), H), 1.0 / H)
            if known.any():
                pred[known] = table.predictive(metric, rows[known], items[known])
                pred[~known] = pred[known].mean(axis=0)
            return pred

        def on(pred: np.ndarray, wanted: np.ndarray) -> np.ndarray:
            pos = np.clip(np.searchsorted(table.values, wanted), 0, len(table.values) - 1)
            out = np.where((table.values[pos] == wanted)[None, :], pred[:, pos], 0.0) + 1e-6
            return np.log(out / out.sum(axis=1, keepdims=True))

        out = {"joint": on(rows_of("rating_accuracy"), values)}
        if unknown_c:
            out["rated"] = on(rows_of("rated_rating_accuracy"), values[1:])
            det = np.maximum(rows_of("rated_detection_accuracy"), 1e-12)
            out["rated_logit"] = np.log(det[:, 1]) - np.log(det[:, 0])
        return out

    def _attribute_shares(self, parties: list[str], p: int) -> np.ndarray | None:
        """Population share of 1 per user and dummy (n, p), the user left out; None without it."""
        pop = self._population
        if pop is None or pop.table.attributes.shape[1] != p or p == 0:
            return None
        idx = pop.index(parties)
        known = idx >= 0
        out = np.zeros((len(parties), p))
        if known.any():
            out[known] = pop.table.attribute_shares(idx[known])
            out[~known] = out[known].mean(axis=0)
        else:
            out[:] = pop.table.attributes.mean(axis=0)
        return out

"""Attack-scoring metrics: exact-reconstruction accuracy, relative error, set precision /
recall / F1, AUC and ROC summaries, Clopper-Pearson, the empirical epsilon lower bound, means
with 95 % intervals and the guess baselines.

Re-exported by :mod:`privaudit.metrics` (import them from there). Same conventions as
:mod:`privaudit.metrics`: plain ``float`` results, NaN where a metric is undefined.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit._metric_inputs import flat_values, paired_values, scipy_stats

__all__ = [
    "reconstruction_accuracy",
    "relative_error",
    "set_precision_recall",
    "f1_score",
    "set_prf",
    "auc",
    "roc_summary",
    "clopper_pearson",
    "empirical_epsilon",
    "mean_ci95",
    "uniform_guess_accuracy",
    "majority_guess_accuracy",
]


def set_precision_recall(predicted: Any, truth: Any) -> tuple[float, float]:
    """Precision and recall of a predicted id set against the true one (1-D int arrays of
    unique ids, shapes (n_pred,) and (n_true,)).

    Precision is 0 for an empty prediction; recall is NaN when ``truth`` is empty (undefined).
    """
    pred = np.asarray(predicted).ravel()
    true = np.asarray(truth).ravel()
    tp = np.intersect1d(pred, true).size
    precision = tp / pred.size if pred.size else 0.0
    recall = tp / true.size if true.size else float("nan")
    return float(precision), float(recall)


def f1_score(precision: float, recall: float) -> float:
    """Harmonic mean of ``precision`` and ``recall`` (0 when both are 0; NaN recall gives 0)."""
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def set_prf(predicted: Any, truth: Any) -> tuple[float, float, float]:
    """(precision, recall, F1) of a predicted id set (:func:`set_precision_recall`, :func:`f1_score`)."""
    p, r = set_precision_recall(predicted, truth)
    return p, r, f1_score(p, r)


def reconstruction_accuracy(true: Any, guess: Any) -> float:
    """Attack accuracy, PrivMVMF paper eq. 43: the fraction of entries guessed exactly.

    ``accuracy = sum_u sum_i 1[guess_ui == true_ui] / sum_u n_u`` -- pooled over all entries
    of all users (not a mean of per-user accuracies). The caller clips and rounds the
    estimates first (ratings to the rating range, attribute dummies to [0, 1]); comparison is
    exact. ``true``/``guess``: arrays of the same shape, or lists of per-user 1-D arrays
    (concatenated; per-user lengths must agree). A NaN guess counts as wrong. In [0, 1].
    """
    a, b = paired_values(true, guess, "true", "guess")
    return float(np.mean(a == b))


def relative_error(X: Any, X_hat: Any, mask: Any = None, squared: bool = True) -> float:
    """Relative reconstruction error, FedSPLIT paper eq. 4, restricted to observed entries.

    ``X``: (n, m) true matrix (dense or scipy sparse); ``X_hat``: (n, m) reconstruction;
    ``mask``: optional (n, m) bool (dense or sparse) of the entries to score -- by default the
    nonzero entries of X (the observed ratings, as in FedSPLIT paper §4.4). With Ω the mask:

        RE = ||(X - X_hat)_Ω||_F^2 / ||X_Ω||_F^2          (eq. 4 -- squared norms)

    ``squared=False`` returns the ratio of the (unsquared) Frobenius norms, i.e. sqrt(RE).
    Dimensionless, >= 0; 0 = perfect. Raises ValueError if Ω is empty or ||X_Ω|| = 0.
    """
    Xd = np.asarray(X.toarray() if sp.issparse(X) else X, dtype=float)
    Xh = np.asarray(X_hat.toarray() if sp.issparse(X_hat) else X_hat, dtype=float)
    if Xd.shape != Xh.shape:
        raise ValueError(f"X has shape {Xd.shape} but X_hat has shape {Xh.shape}")
    if Xd.size == 0:
        raise ValueError("X is empty")
    if mask is None:
        m = Xd != 0
    else:
        mm = mask.toarray() if sp.issparse(mask) else np.asarray(mask)
        if mm.shape != Xd.shape:
            raise ValueError(f"mask has shape {mm.shape} but X has shape {Xd.shape}")
        m = mm != 0
    if not m.any():
        raise ValueError("no observed entries to score (empty mask)")
    denom = float(np.sum(Xd[m] ** 2))
    if denom == 0.0:
        raise ValueError("X is zero on the scored entries; the relative error is undefined")
    re = float(np.sum((Xd[m] - Xh[m]) ** 2)) / denom
    return re if squared else math.sqrt(re)


def auc(labels: Any, scores: Any) -> float:
    """Area under the ROC curve via the Mann-Whitney U statistic, in [0, 1].

    ``labels``: (n,) binary (bool or 0/1), 1 = positive (e.g. member, real rating).
    ``scores``: (n,) float, higher = more likely positive. With average ranks R (ties share
    the mean rank, so a tied positive/negative pair counts 1/2):
    ``AUC = (sum_{positives} R_i - n_pos (n_pos + 1) / 2) / (n_pos n_neg)``.
    0.5 = chance. Raises ValueError if a class is missing or scores contain NaN.
    """
    y = np.asarray(labels).ravel()
    s = np.asarray(scores, dtype=float).ravel()
    if y.size == 0:
        raise ValueError("labels are empty")
    if y.shape != s.shape:
        raise ValueError(f"labels have {y.size} values but scores have {s.size}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    if y.dtype != bool:
        if not np.isin(y, (0, 1)).all():
            raise ValueError("labels must be binary (bool or 0/1)")
        y = y.astype(bool)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    ranks = scipy_stats().rankdata(s, method="average")
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


#: False-positive rates at which :func:`roc_summary` reports the true-positive rate
#: (Carlini et al., "Membership Inference Attacks From First Principles", IEEE S&P 2022).
LOW_FPRS: tuple[float, ...] = (0.01, 0.001)


def roc_summary(labels: Any, scores: Any, fprs: tuple[float, ...] = LOW_FPRS, max_points: int = 200) -> dict[str, Any]:
    """ROC curve, AUC and TPR at low false-positive rates of per-record decisions.

    ``labels``: (n,) binary, 1 = positive; ``scores``: (n,) finite floats, higher = positive.
    Uses ``sklearn.metrics.roc_curve``. Returns ``{"auc", "tpr@<f>", ..., "n_pos", "n_neg",
    "fpr", "tpr"}`` where ``tpr@0.01`` is the largest TPR at FPR <= 0.01 and is NaN when there
    are fewer than ``1 / f`` negatives (the FPR cannot be resolved: ``"fpr_floor"`` = 1/n_neg
    says the smallest non-zero FPR measurable). ``fpr``/``tpr`` are the curve, thinned to at
    most ``max_points`` points (keeping the ends and the low-FPR part), as lists for JSON.
    A single-class input gives NaN for AUC and every TPR and an empty curve.
    """
    from sklearn.metrics import roc_curve

    y = np.asarray(labels).ravel().astype(bool)
    s = np.asarray(scores, dtype=float).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels have {y.size} values but scores have {s.size}")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite")
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    out: dict[str, Any] = {"n_pos": n_pos, "n_neg": n_neg, "fpr_floor": (1.0 / n_neg) if n_neg else math.nan}
    if n_pos == 0 or n_neg == 0:
        out.update({"auc": math.nan, **{f"tpr@{f:g}": math.nan for f in fprs}, "fpr": [], "tpr": []})
        return out
    fpr, tpr, _ = roc_curve(y, s)
    out["auc"] = auc(y, s)
    for f in fprs:
        out[f"tpr@{f:g}"] = float(tpr[fpr <= f].max()) if n_neg * f >= 1 else math.nan
    if fpr.size > max_points:
        # keep the low-FPR end (log axes) and a uniform thinning of the rest
        keep = np.unique(
            np.concatenate(
                [
                    np.geomspace(1, fpr.size - 1, max_points // 2).astype(int),
                    np.linspace(0, fpr.size - 1, max_points // 2).astype(int),
                ]
            )
        )
        fpr, tpr = fpr[keep], tpr[keep]
    out["fpr"] = [float(v) for v in fpr]
    out["tpr"] = [float(v) for v in tpr]
    return out


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval of a binomial proportion ``k / n``.

    Each side holds with probability ``(1 + confidence) / 2``; ``n = 0`` gives ``(0, 1)``.
    """
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    a = (1.0 - confidence) / 2.0
    lo = 0.0 if k == 0 else float(scipy_stats().beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(scipy_stats().beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def _threshold_epsilons(
    s: np.ndarray, y: np.ndarray, delta: float, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct threshold of ``s`` (test "positive iff score >= threshold"): the two
    Clopper-Pearson epsilon bounds (TPR side, TNR side) and the thresholds."""
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    order = np.argsort(-s, kind="stable")
    ss, yy = s[order], y[order]
    tp = np.cumsum(yy)
    fp = np.cumsum(~yy)
    last = np.r_[ss[1:] != ss[:-1], True]  # thresholds between distinct scores
    tp, fp, thr = tp[last], fp[last], ss[last]
    a = (1.0 - confidence) / 2.0  # a union bound over the two intervals of one test
    beta = scipy_stats().beta
    tpr_lo = np.where(tp == 0, 0.0, beta.ppf(a, np.maximum(tp, 1), n_pos - tp + 1))
    fpr_hi = np.where(fp == n_neg, 1.0, beta.ppf(1 - a, fp + 1, np.maximum(n_neg - fp, 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.log(np.maximum(tpr_lo - delta, 0.0) / fpr_hi)
        e2 = np.log(np.maximum(1.0 - fpr_hi - delta, 0.0) / (1.0 - tpr_lo))
    return np.nan_to_num(e1, nan=-np.inf, posinf=np.inf), np.nan_to_num(e2, nan=-np.inf, posinf=np.inf), thr


def empirical_epsilon(
    labels: Any, scores: Any, delta: float = 0.0, confidence: float = 0.95, seed: Any = 0
) -> dict[str, float]:
    """Lower bound on the epsilon of a DP mechanism from an attack's per-record decisions.

    The test "positive iff score >= threshold" has TPR and FPR; an (epsilon, delta)-DP mechanism
    forces ``TPR <= e^eps FPR + delta`` and ``1 - FPR <= e^eps (1 - TPR) + delta`` (Kairouz et
    al., ICML 2015). The records are split at random in two halves (``seed``: an int, a
    SeedSequence or a Generator): on the first the threshold and the inequality with the
    largest Clopper-Pearson bound are chosen, on the second that single test is scored, with
    Clopper-Pearson bounds at ``confidence`` (lower on TPR and 1-FPR, upper on FPR and 1-TPR,
    each at (1 - confidence) / 2): ``ln((TPR_lo - delta) / FPR_hi)`` or ``ln((1 - FPR_hi -
    delta) / (1 - TPR_lo))`` (Jagielski et al., NeurIPS 2020; Nasr et al., IEEE S&P 2021).
    Choosing the threshold on the records it is scored on would overstate the bound.

    Returns ``{"epsilon_lb", "threshold", "side", "tp", "fp", "n_pos", "n_neg", "n_pos_scored",
    "n_neg_scored"}``: ``side`` "tpr" (first inequality) or "tnr"; ``tp``/``fp`` counted on the
    scored half; ``n_pos``/``n_neg`` over all records. ``epsilon_lb`` is 0.0 when the chosen
    test gives no evidence and NaN when a class has fewer than two records.
    """
    y = np.asarray(labels).ravel().astype(bool)
    s = np.asarray(scores, dtype=float).ravel()
    if y.size != s.size:
        raise ValueError(f"empirical_epsilon: {y.size} labels but {s.size} scores")
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    out: dict[str, Any] = {
        "epsilon_lb": math.nan,
        "threshold": math.nan,
        "side": "tpr",
        "tp": 0,
        "fp": 0,
        "n_pos": n_pos,
        "n_neg": n_neg,
        "n_pos_scored": 0,
        "n_neg_scored": 0,
    }
    if n_pos < 2 or n_neg < 2:
        return out
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    # a stratified random half: each class split in two, so both halves hold both classes
    choose = np.zeros(y.size, dtype=bool)
    for cls in (True, False):
        idx = np.flatnonzero(y == cls)
        choose[rng.permutation(idx)[: idx.size // 2]] = True
    e1, e2, thr = _threshold_epsilons(s[choose], y[choose], delta, confidence)
    k1, k2 = int(np.argmax(e1)), int(np.argmax(e2))
    side, threshold = ("tpr", thr[k1]) if e1[k1] >= e2[k2] else ("tnr", thr[k2])
    ys, sc = y[~choose], s[~choose]
    pos, neg = int(ys.sum()), int(ys.size - ys.sum())
    tp = int(np.sum(ys & (sc >= threshold)))
    fp = int(np.sum(~ys & (sc >= threshold)))
    a = (1.0 - confidence) / 2.0
    beta = scipy_stats().beta
    tpr_lo = 0.0 if tp == 0 else float(beta.ppf(a, tp, pos - tp + 1))
    fpr_hi = 1.0 if fp == neg else float(beta.ppf(1 - a, fp + 1, neg - fp))
    with np.errstate(divide="ignore", invalid="ignore"):
        if side == "tpr":
            e = np.log(np.float64(max(tpr_lo - delta, 0.0)) / np.float64(fpr_hi))
        else:
            e = np.log(np.float64(max(1.0 - fpr_hi - delta, 0.0)) / np.float64(1.0 - tpr_lo))
    e = float(e) if not np.isnan(e) else -math.inf
    out.update(
        {
            "epsilon_lb": max(0.0, e),
            "threshold": float(threshold),
            "side": side,
            "tp": tp,
            "fp": fp,
            "n_pos_scored": pos,
            "n_neg_scored": neg,
        }
    )
    return out


def mean_ci95(values: Any) -> tuple[float, float]:
    """Mean and half-width of the 95 % confidence interval of the mean (Student t).

    ``values``: array-like of any shape (e.g. one metric over seeds). NaNs are ignored.
    ``half_width = t_{0.975, n-1} * std(ddof=1) / sqrt(n)`` (scipy.stats.t); the interval is
    ``mean ± half_width``. One finite value -> half_width 0.0; all NaN -> (nan, nan).
    Raises ValueError for an empty input.
    """
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        raise ValueError("mean_ci95 of an empty input")
    v = v[~np.isnan(v)]
    n = v.size
    if n == 0:
        return math.nan, math.nan
    mean = float(np.mean(v))
    if n == 1:
        return mean, 0.0
    half = float(scipy_stats().t.ppf(0.975, n - 1) * np.std(v, ddof=1) / math.sqrt(n))
    return mean, half


def uniform_guess_accuracy(domain_size: Any) -> float:
    """Expected accuracy of guessing uniformly at random over a finite value domain.

    ``domain_size``: int >= 1 (e.g. 5 for ratings 1..5, 2 for a 0/1 attribute dummy), or an
    array of per-entry domain sizes, in which case the mean of ``1 / d`` (the expected
    fraction of entries guessed right). The random-guess baseline of PrivMVMF paper §6.2.
    """
    d = np.asarray(domain_size, dtype=float)
    if d.size == 0:
        raise ValueError("domain_size is empty")
    if np.isnan(d).any() or (d < 1).any() or (d != np.round(d)).any():
        raise ValueError(f"domain sizes must be integers >= 1, got {domain_size!r}")
    return float(np.mean(1.0 / d))


def majority_guess_accuracy(values: Any, guess: Any = None) -> float:
    """Accuracy of always guessing one value (the majority-class baseline).

    ``values``: the true values (array of any shape, or a list of per-user arrays).
    ``guess``: the constant guessed; by default the most frequent value of ``values`` itself
    (the best constant guess in hindsight, an upper bound for any constant strategy). Pass a
    guess learned elsewhere (e.g. the majority of an auxiliary set) for an honest baseline.
    Returns ``#{values == guess} / #values`` in [0, 1].
    """
    v, _ = flat_values(values, "values", dtype=None)
    if v.size == 0:
        raise ValueError("values are empty")
    if guess is not None:
        return float(np.mean(v == guess))
    _, counts = np.unique(v, return_counts=True)
    return float(counts.max() / v.size)

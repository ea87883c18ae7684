"""``ncf-interaction-inference``: which uploaded FedNCF item rows are a client's positives.

Threat (Yuan et al., "Interaction-level Membership Inference Attack Against Federated
Recommender Systems", WWW 2023): the honest-but-curious server sees which item rows a client
updated (its positives and the negatives it sampled that round, :mod:`.ncf_update_leak`) and
how. It knows the model it sent and the public recipe (BCE loss, Adam, ``negatives`` per
positive). The loss gradient of item row q_i is (sigmoid(s_i) - y_i) ds_i/dq_i: label 1 moves
the row along +ds_i/dq_i (the score rises), label 0 along -ds_i/dq_i. For GMF ds_i/dq_i = h * p_u
(prediction weights times the client's user vector) is the same for every item of the client,
so the client's row changes are +-1 multiples of one direction, and the attack needs neither
the user vector nor a shadow model: per upload it takes the top right singular vector w of the
changes (L x Dtot), scores each row by cos(change_i, w) and orients w so that the number of rows
with a positive score is nearest the number of positives the recipe implies (k +
unique(negatives * k uniform draws) = L). NeuMF's GMF half gives it the same structure. For MLP
the direction varies with the item through the ReLU pattern: the attack computes the simulated
gradients d logit / d q_i of the model the server sent that round (its recorded ``state``) for
``candidates`` user vectors drawn with the spread of the item table, keeps the user vector whose
gradients explain the changes best (largest mean squared cosine) and scores each row by
cos(change_i, d logit / d q_i): > 0 is the label-1 move, < 0 the label-0 move (the paper's
comparison of the real update with the simulated one under label 1 and label 0). Per upload it
keeps whichever of the two (SVD direction, simulated gradients) has the larger mean squared
cosine with the changes (the gradients of the sent model go stale when local training moves the
rows far, e.g. lr 0.01 on a fresh model); without a recorded ``state`` for the round, the SVD. The paper's own attacker
instead re-trains the sent model with guessed labels and a fresh user vector and keeps the
guesses whose simulated rows land nearest the uploaded ones.

Over the first r uploads of a client (``rounds``; -1 all) an item's score is the mean of its
per-upload scores, -1 in an upload that does not hold it; predicted positives: score > 0.
Metrics (mean over attacked clients, ground truth = the ``private`` training positives):
``precision``, ``recall``, ``f1`` (F1 of the two means, as :mod:`.ncf_update_leak`),
``victims``. Prior-only guess: the k most popular items (hindsight popularity, k = the median
number of positives). Two leaks are mixed in the advantage over that prior: which rows a client
uploaded (its positives are always among them) and how they moved. ``support_precision`` /
``support_f1`` are the support-only guess (:func:`support_guess`: the uploaded rows ranked by
popularity, as many as the recipe implies), and ``f1_over_support`` what the direction adds to
it (reported, not tested). Decisions: ``positive``, one record per (client, item), score as
above (-2 for items the client never uploaded), grouped by client, so TPR at low FPR counts the
never-uploaded items (trivially rejected) among the negatives; ``uploaded``, the same records
restricted to the rows the client uploaded (the TPR at low FPR of the direction alone).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attack_metrics import f1_score, set_precision_recall
from privaudit.attacks.base import Attack, Reconstruction
from privaudit.attacks.generic._uploads import cross_fit
from privaudit.attacks.ncf.update_leak import PRF_SPECS, client_truth, guess_baseline, popularity_strategies
from privaudit.models import ncf
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.results import Decisions, MetricSpec, VictimTable
from privaudit.transcript import Transcript, View

#: Score of an item absent from every considered upload of the client (below any cosine).
ABSENT = -2.0


def implied_positives(n_rows: int, negatives: int, n_items: int) -> float:
    """Number of positives k whose upload is expected to hold ``n_rows`` rows.

    k positives plus the distinct items among ``negatives * k`` uniform draws (with replacement)
    from the m - k - 1 items the client never rated (FedNCF excludes the held-out item too).
    """
    if negatives <= 0 or n_rows <= 1:
        return float(n_rows)
    k = np.arange(1, n_rows + 1, dtype=np.float64)
    pool = np.maximum(n_items - k - 1, 1.0)
    rows = k + pool * (1.0 - np.exp(negatives * k * np.log1p(-1.0 / np.maximum(pool, 1.0 + 1e-12))))
    return float(k[int(np.argmin(np.abs(rows - n_rows)))])


def support_guess(reconstruction: Reconstruction, transcript: Transcript) -> tuple[float, float]:
    """(precision, recall) of the support-only guess, averaged as the attack's: each attacked
    client's uploaded rows ranked by popularity (the other clients' positives, hindsight counts,
    as the prior), the top k, k the positives its first upload's size implies
    (:func:`implied_positives`). It reads which rows were uploaded and not how they moved."""
    names = sorted(reconstruction.victims)
    if not names:
        return float("nan"), float("nan")
    m = int(transcript.config.get("n_items", 0)) or 1
    truths = {p: client_truth(transcript, p) for p in transcript.clients()}
    counts = np.zeros(m)
    for t in truths.values():
        counts += np.bincount(t[t < m], minlength=m)[:m]
    ps, rs, has = [], [], []
    for party in names:
        v = reconstruction.victims[party]
        truth = truths.get(party, client_truth(transcript, party))
        own = np.zeros(m)
        own[truth[truth < m]] = 1.0
        up = np.asarray(v.get("uploaded", np.zeros(0)), dtype=np.int64)
        k = int(round(float(np.asarray(v.get("k", [0]))[0])))
        guess = up[np.argsort(-(counts - own)[up], kind="stable")[:k]]
        p, r = set_precision_recall(guess, truth)
        ps.append(p)
        rs.append(0.0 if truth.size == 0 else r)
        has.append(float(truth.size > 0))
    rec = float(np.sum(rs) / np.sum(has)) if np.sum(has) else float("nan")
    return float(np.mean(ps)), rec


def upload_scores(values: np.ndarray, negatives: int, n_items: int) -> np.ndarray:
    """Per-row score in [-1, 1] of one upload ``values`` (L, Dtot): > 0 means label 1 (positive).

    cos(row change, w) with w the oriented top right singular vector of ``values`` (module
    docstring). Without sampled negatives every uploaded row is a positive (all 1).
    """
    V = np.asarray(values, dtype=np.float64)
    L = V.shape[0]
    if negatives <= 0 or L < 2:
        return np.ones(L)
    norms = np.linalg.norm(V, axis=1)
    if not np.isfinite(V).all() or not norms.any():
        return np.zeros(L)
    w = np.linalg.svd(V, full_matrices=False)[2][0]
    cos = (V @ w) / np.where(norms > 0, norms, 1.0)
    k = implied_positives(L, negatives, n_items)
    if abs(int((cos > 0).sum()) - k) > abs(int((cos < 0).sum()) - k):
        cos = -cos
    return cos


def gradient_scores(
    values: np.ndarray,
    rows: np.ndarray,
    net: dict[str, np.ndarray],
    arch: tuple[str, int, tuple[int, ...]],
    user_scale: np.ndarray,
    rng: np.random.Generator,
    candidates: int = 64,
) -> np.ndarray:
    """Per-row score in [-1, 1] of one upload: cos(row change, d logit / d q_i) at the best user vector.

    ``values`` (L, Dtot) the uploaded changes, ``rows`` (L, Dtot) the same items' rows of the model
    the server sent, ``net`` its network weights, ``arch`` = (model, D, layers). ``candidates``
    user vectors are drawn N(0, diag(user_scale^2)); the one whose gradients d logit / d q_i
    explain the changes best (largest mean squared cosine) is kept. A positive score means the
    row moved the way label 1 moves it (the logit rises).
    """
    torch = ncf.require_torch()
    model, D, layers = arch
    V = np.asarray(values, dtype=np.float64)
    L, Dt = V.shape
    Vn = V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-300)
    P = rng.standard_normal((candidates, Dt)) * user_scale
    n_layers = len(layers) if model in ("mlp", "neumf") else 0
    with torch.enable_grad():
        net_t = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in net.items()}
        q = torch.as_tensor(np.asarray(rows, dtype=np.float32))[None].expand(candidates, -1, -1).clone()
        q.requires_grad_(True)
        u = torch.as_tensor(P, dtype=torch.float32)[:, None, :].expand(-1, L, -1)
        (J,) = torch.autograd.grad(ncf.forward(model, D, n_layers, net_t, u, q).sum(), q)
    J = J.numpy().astype(np.float64)
    cos = np.einsum("kld,ld->kl", J / np.maximum(np.linalg.norm(J, axis=2, keepdims=True), 1e-300), Vn)
    return cos[int(np.argmax((cos**2).mean(axis=1)))]


@register_attack("ncf-interaction-inference")
class NCFInteractionInference(Attack):
    """Tell a FedNCF client's positives from its sampled negatives in its uploads (module docstring)."""

    description = (
        "FedNCF plain uploads: the direction of each updated item row separates positives from sampled negatives "
        "(Yuan et al., WWW 2023)"
    )
    party = "server"
    protocols = ("fedncf",)
    requires = ("item_update",)
    primary_metric = "f1"
    metric_specs = {
        **PRF_SPECS,
        "victims": MetricSpec(True, False, "count", "clients attacked"),
        "support_precision": MetricSpec(
            True,
            False,
            "fraction",
            "the support-only guess: a client's uploaded rows ranked by popularity, as many as the recipe implies",
            tested=False,
        ),
        "support_f1": MetricSpec(True, False, "fraction", "F1 of the support-only guess", tested=False),
        "f1_over_support": MetricSpec(
            True,
            False,
            "fraction",
            "F1 minus the support-only guess's: what the direction of the rows adds to which rows were uploaded",
            tested=False,
        ),
    }
    default_sweep = ("rounds", (1, 2, 4))
    parameters = (
        Param("rounds", 1, "combine the scores of each client's first r recorded uploads (-1: all)", ge=1, also=(-1,)),
        Param(
            "candidates",
            64,
            "MLP: user vectors tried per upload for the simulated gradient directions (0: SVD direction only, as GMF/NeuMF)",
            ge=0,
        ),
    )

    def applicable(self, view: View) -> tuple[bool, str]:
        return super().applicable(view)  # the base rule: every kind of ``requires``, in plaintext

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        m = int(view.config.get("n_items", 0))
        negatives = int(view.config.get("negatives", 4))
        arch = (
            str(view.config.get("model", "gmf")),
            int(view.config.get("D", 12)),
            tuple(view.config.get("layers", ())),
        )
        # MLP rows move along item-dependent gradient directions: score them against the simulated
        # gradients of the model the server sent that round (recorded ``state``), when it has it
        states = (
            {s.round: s for s in view.select("state")} if arch[0] == "mlp" and self.candidates and negatives else {}
        )
        uploads: dict[str, list[Any]] = {}
        n_gradient = 0
        for msg in view.select("item_update"):
            uploads.setdefault(msg.sender, []).append(msg)
        victims: dict[str, dict[str, np.ndarray]] = {}
        for party, seq in uploads.items():
            r = len(seq) if self.rounds == -1 else self.rounds
            if len(seq) < r:
                continue
            total = np.zeros(m)
            seen = np.zeros(m, dtype=bool)
            for msg in seq[:r]:
                items = np.asarray(msg.payload["items"], dtype=np.int64)
                sc = np.full(m, -1.0)
                cos = upload_scores(msg.payload["values"], negatives, m)
                state = states.get(msg.round)
                if state is not None:
                    table = np.asarray(state.payload["items"], dtype=np.float64)
                    net = ncf.unflatten_network(np.asarray(state.payload["network"]), *arch)
                    sim = gradient_scores(
                        msg.payload["values"], table[items], net, arch, table.std(axis=0), rng, self.candidates
                    )
                    # keep the directions that explain the upload better (larger mean squared cosine)
                    if np.mean(sim**2) > np.mean(cos**2):
                        cos = sim
                        n_gradient += 1
                sc[items] = np.nan_to_num(cos, nan=0.0, posinf=0.0, neginf=0.0)  # non-finite uploads: no direction
                total += sc
                seen[items] = True
            score = np.where(seen, total / r, ABSENT)
            first = len(np.asarray(seq[0].payload["items"]))
            victims[party] = {
                "scores": score,
                "items": np.flatnonzero(score > 0).astype(np.int64),
                "uploaded": np.flatnonzero(seen).astype(np.int64),
                "k": np.array([implied_positives(first, negatives, m)]),
            }
        meta = {"clients": len(victims), "rounds": self.rounds, "gradient_uploads": n_gradient}
        return Reconstruction(self.name, self.party, victims, meta=meta)

    def _victim_parts(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, np.ndarray]:
        names = sorted(reconstruction.victims)
        ps, rs, has = [], [], []
        for party in names:
            truth = client_truth(transcript, party)
            p, r = set_precision_recall(reconstruction.victims[party]["items"], truth)
            ps.append(p)
            rs.append(0.0 if truth.size == 0 else r)
            has.append(float(truth.size > 0))
        return {"victims": names, "precision": np.array(ps), "recall": np.array(rs), "has": np.array(has)}

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        parts = self._victim_parts(reconstruction, transcript)
        nan = float("nan")
        n = len(parts["victims"])
        p = float(parts["precision"].mean()) if n else nan
        r = float(parts["recall"].sum() / parts["has"].sum()) if parts["has"].sum() else nan
        f1 = f1_score(p, r) if n else nan
        sp, sr = support_guess(reconstruction, transcript)
        sf1 = f1_score(sp, sr) if n else nan
        return {
            "precision": p,
            "recall": r,
            "f1": f1,
            "victims": float(n),
            "support_precision": sp,
            "support_f1": sf1,
            "f1_over_support": f1 - sf1,
        }

    def _parties(self, transcript: Transcript) -> list[str]:
        return sorted({m.sender for m in transcript.select("item_update")})

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        return guess_baseline(transcript, self._parties(transcript))

    def _prior_parts(self, parties: list[str], transcript: Transcript) -> dict[str, np.ndarray]:
        """Per party, precision and recall of the popularity strategy chosen by F1 on held-out
        halves of the clients (:func:`.ncf_update_leak.popularity_strategies`, the prior
        ``ncf-update-leak`` uses), with ``has`` = 1 for a party with positives."""
        strategies = popularity_strategies(transcript, parties)
        has = next(iter(strategies.values()))["scored"]
        best, _ = cross_fit(strategies, "f1", has)
        return {"precision": best["precision"], "recall": best["recall"], "has": has}

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The k items most rated by the other clients, k and the strategy chosen on held-out
        clients (:meth:`_prior_parts`); averaged like :meth:`score`."""
        parties = self._parties(transcript)
        nan = float("nan")
        if not parties:
            return {"precision": nan, "recall": nan, "f1": nan, "victims": 0.0}
        prior = self._prior_parts(parties, transcript)
        p = float(prior["precision"].mean())
        r = float(prior["recall"].sum() / prior["has"].sum()) if prior["has"].sum() else nan
        return {"precision": p, "recall": r, "f1": f1_score(p, r), "victims": float(len(parties))}

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        """One record per (attacked client, item): its combined score; groups = client index."""
        names = sorted(reconstruction.victims)
        if not names:
            return {}
        m = int(transcript.config.get("n_items", 0))
        scores = np.concatenate([reconstruction.victims[p]["scores"][:m] for p in names])
        labels = np.concatenate([np.isin(np.arange(m), client_truth(transcript, p)) for p in names])
        if labels.all() or not labels.any():
            return {}
        groups = np.repeat(np.arange(len(names)), m)
        out = {"positive": Decisions(scores, labels, positive="training positive, over all items", groups=groups)}
        uploaded = scores > ABSENT  # the rows the client uploaded: the honest question of direction
        if labels[uploaded].any() and not labels[uploaded].all():
            out["uploaded"] = Decisions(
                scores[uploaded],
                labels[uploaded],
                positive="training positive, over the uploaded rows",
                groups=groups[uploaded],
            )
        return out

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """Per-client precision and recall of the attack and of the popularity guess; F1, the
        harmonic mean of the two, resampled with them."""
        parts = self._victim_parts(reconstruction, transcript)
        names = parts["victims"]
        if not names:
            return None
        parties = self._parties(transcript)
        prior = self._prior_parts(parties, transcript)
        idx = np.array([parties.index(p) for p in names])
        prior_p, prior_r = prior["precision"][idx], prior["recall"][idx]
        ones = np.ones(len(names))
        return VictimTable(
            list(names),
            weight={"precision": ones, "recall": parts["has"]},
            attack={"precision": parts["precision"], "recall": parts["recall"]},
            prior={"precision": np.array(prior_p), "recall": np.array(prior_r)},
            harmonic={"f1": ("precision", "recall")},
        )

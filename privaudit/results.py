"""Result vocabulary shared by attacks, experiments and reports (a leaf: numpy and stdlib only).

:class:`MetricSpec` is how an attack declares what its metrics mean (direction, whether a
figure plots it, unit, one-line definition for the report glossary), so nothing downstream
guesses from a metric's name. :class:`Decisions` carries an attack's per-record scores for
the membership-style metrics (ROC, TPR at low FPR, empirical epsilon).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["MetricSpec", "Decisions"]


@dataclass(frozen=True)
class MetricSpec:
    """What one attack metric means.

    Attributes
    ----------
    higher_is_better : bool
        True when a larger value means a more successful attack (accuracy, AUC); False for
        errors (RMSE, relative error) where the attacker wants the value small.
    plotted : bool
        Whether accuracy-vs-strength figures draw it (counts and sizes are not plotted).
    unit : str
        ``"fraction"`` (in [0, 1]), ``"rating"`` (rating points), ``"count"``, ``"seconds"`` ...
    description : str
        One sentence for the report's glossary.
    """

    higher_is_better: bool = True
    plotted: bool = True
    unit: str = "fraction"
    description: str = ""


@dataclass
class Decisions:
    """Per-record decisions of an attack: one score per record, higher = more likely positive.

    Attributes
    ----------
    scores : numpy.ndarray of shape (n_records,)
        Finite floats.
    labels : numpy.ndarray of shape (n_records,)
        Bool truth (True = positive: a member, a really rated item, a trained item).
    positive : str
        What a positive is, for the report (``"rated item"``, ``"member row"``).
    """

    scores: np.ndarray
    labels: np.ndarray
    positive: str = "positive"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, dtype=float).ravel()
        self.labels = np.asarray(self.labels, dtype=bool).ravel()
        if self.scores.shape != self.labels.shape:
            raise ValueError(f"{self.scores.size} scores but {self.labels.size} labels")

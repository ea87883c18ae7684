"""Attacks: one module per attack family; :mod:`.base` holds Attack and scoring."""

from privaudit.attacks.base import Attack, AttackOutcome, Reconstruction

__all__ = ["Attack", "AttackOutcome", "Reconstruction"]

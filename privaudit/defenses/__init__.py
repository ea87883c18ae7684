"""Defenses: one module per defense; :mod:`privaudit.defenses.base` holds :class:`Defense`."""

from privaudit.defenses.base import ClientData, Defense, UploadBatch

__all__ = ["ClientData", "Defense", "UploadBatch"]

"""Defenses: one module per defense; :mod:`privaudit.defenses.base` holds :class:`Defense`."""

from privaudit.defenses.base import Defense, UploadBatch

__all__ = ["Defense", "UploadBatch"]

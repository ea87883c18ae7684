"""A worked privaudit plugin: the ``quantize`` defense and the ``uploaded-items`` attack."""

from privaudit_plugin_example.attack import UploadedItems
from privaudit_plugin_example.defense import Quantize

__all__ = ["Quantize", "UploadedItems"]

"""A worked privaudit plugin: the ``item-means`` protocol, the ``quantize`` defense and the ``uploaded-items`` attack."""

from privaudit_plugin_example.attack import UploadedItems
from privaudit_plugin_example.defense import Quantize
from privaudit_plugin_example.protocol import ItemMeans

__all__ = ["ItemMeans", "Quantize", "UploadedItems"]

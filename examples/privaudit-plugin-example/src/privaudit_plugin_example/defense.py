"""The ``quantize`` defense: clients round every uploaded float to a grid of width ``step``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from privaudit.defenses.base import ANY, UPLOAD, ChannelContext, Defense, RoundUploads
from privaudit.params import Param


class Quantize(Defense):
    """Round every float a client uploads to the nearest multiple of ``step`` (0 = off).

    Not a privacy mechanism with a guarantee: a worked example of the ``upload`` capability.
    """

    description = "round every uploaded float to a grid of width step (plugin example)"
    parameters = (Param("step", 0.0, "grid width of the rounding (0: off)", ge=0),)
    strength = "step"
    default_grid = (0.0, 0.5)
    capabilities = frozenset({UPLOAD})
    #: every float of every upload (an audit sweeps it on any protocol with uploads)
    acts_on = ((ANY, ANY),)

    def process_uploads(
        self, uploads: RoundUploads, ctx: ChannelContext, call_next: Callable[[RoundUploads], RoundUploads]
    ) -> RoundUploads:
        """Round the floats of every batch (one dict per sender), then hand them on."""
        step = self.config["step"]
        if step != 0.0:
            for batch in uploads.batches:
                for payload in batch.payloads:
                    for key in batch.float_keys(payload):
                        payload[key] = np.round(np.asarray(payload[key]) / step) * step
        return call_next(uploads)

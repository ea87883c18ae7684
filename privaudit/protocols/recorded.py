"""``flower``: the protocol name of transcripts recorded from a real Flower run (not simulated).

A recorded transcript names its messages through the app's schema map
(:mod:`privaudit.integrations.schema_map`); the attacks that read it are the generic ones,
which choose themselves by the message kinds it holds. Record a run with
``privaudit record --flower APP_DIR``; attack it with ``privaudit attack --transcript FILE``.
"""

from __future__ import annotations

from typing import Any

from privaudit.errors import PrivauditError
from privaudit.protocols.base import Protocol
from privaudit.registry import register_protocol


@register_protocol("flower")
class RecordedFlower(Protocol):
    """A run recorded from a Flower app; privaudit does not simulate it."""

    description = "a run recorded from a Flower app (privaudit record --flower APP_DIR); attacked from its transcript"
    default_attack = "generic-trained-items"

    @classmethod
    def validate_config(cls, config: dict[str, Any]) -> None:
        raise PrivauditError(
            "protocol 'flower' is recorded, not simulated: record a run with "
            "privaudit record --flower APP_DIR -o run.ptx, then attack it with --transcript run.ptx"
        )

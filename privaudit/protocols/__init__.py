"""Protocols: one module per federated recommender; :mod:`.base` holds Protocol and Channel."""

from privaudit.protocols.base import Channel, Protocol, RunResult, plain_sum

__all__ = ["Channel", "Protocol", "RunResult", "plain_sum"]

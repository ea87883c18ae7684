"""privaudit: privacy attacks and audits for federated recommender systems.

Protocols simulate a federated recommender and record a :class:`~privaudit.transcript.Transcript`
of everything each party sees; attacks play one party and reconstruct others' private data;
defenses change what is sent; experiments sweep a defense's strength and report attack accuracy
next to model utility.
"""

__version__ = "0.1.0"

from privaudit.errors import PrivauditError  # noqa: E402

__all__ = ["PrivauditError", "__version__"]

"""Exception types.

:class:`PrivauditError` marks a *user* mistake (bad flag, missing or malformed file, invalid
parameter). The CLI prints its message as one line on stderr and exits with code 2; anything
else that escapes is a bug and keeps its traceback.
"""


class PrivauditError(ValueError):
    """A user-facing error: one clear line, exit code 2 from the CLI."""


class TranscriptError(PrivauditError):
    """A transcript file is malformed, unsafe or of an unknown format."""


class DataError(PrivauditError):
    """A dataset file or folder is missing or malformed."""


class MissingDependencyError(PrivauditError):
    """An optional dependency (an extra) is not installed."""

    def __init__(self, package: str, extra: str):
        super().__init__(
            f"{package} is required for this feature: pip install \"privaudit[{extra}]\""
        )
        self.package = package
        self.extra = extra

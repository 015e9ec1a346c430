"""The one error type users see.

Every bad input (corrupt trace, wrong schema, impossible parallel config, NaN telemetry ...) is
raised as a CalibError whose message is one line naming the file or value and the cause. The CLI
prints it as `error: <message>` and exits with status 2, never with a traceback.
"""

from __future__ import annotations


class CalibError(Exception):
    """A user-facing error with a one-line message."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))

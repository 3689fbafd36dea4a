"""Error types of alpa_ir.

Every error a user can cause (bad IR, bad pipeline, bad options, a model that
does not fit) is an :class:`AlpaError` whose message is one line saying what is
wrong and where. Command-line tools print that line and exit non-zero, without
a traceback; library users catch :class:`AlpaError`.
"""

from __future__ import annotations


class AlpaError(Exception):
    """A user-facing error: ``str(err)`` is one line, what is wrong and where."""


class IRParseError(AlpaError):
    """The IR text does not parse (``file:line:col: message``)."""


class IRVerifyError(AlpaError):
    """A module does not verify."""


class PipelineError(AlpaError):
    """A pass pipeline string is malformed, names an unknown pass or a bad option."""


class PassFailure(AlpaError):
    """A pass raised while running; ``reproducer`` names the reproducer file written."""

    def __init__(self, message: str, reproducer: str | None = None) -> None:
        super().__init__(message)
        self.reproducer = reproducer


class UnsupportedPrimitiveError(AlpaError):
    """A JAX function uses a primitive the ``lax`` dialect cannot carry."""


class PlanError(AlpaError):
    """No plan satisfies the constraints (memory budget, device count, ...)."""

"""All of ror_annotate's exceptions, in one place, with stable codes.

Every message says what was wrong, where (file, line, record id, URL) and what to do.
The hierarchy is shallow and each class also inherits the builtin it refines, so
callers that catch ``ValueError`` or ``OSError`` keep working (the pattern used by
Hugging Face ``datasets``).

The CLI catches :class:`RorError` and prints ``error [CODE]: message`` on one line, exiting
with status 2; a traceback is only ever shown for a bug in ror_annotate itself.
"""

from __future__ import annotations


class RorError(Exception):
    """Base class of every error ror_annotate raises on purpose.

    Parameters
    ----------
    message : str
        What went wrong, where, and what to do about it.
    code : str, optional
        A stable code such as ``"E101"``; subclasses set a default.
    """

    code = "E000"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message


class InputError(RorError, ValueError):
    """Bad user input: a malformed trace file, a missing column, an unknown option value."""

    code = "E100"


class ConfigError(RorError, ValueError):
    """An unknown registry name, an invalid combination of options, a missing setting."""

    code = "E110"


class StoreError(RorError, RuntimeError):
    """The DuckDB store is inconsistent with the request (missing trace, stale segmentation...)."""

    code = "E200"


class StoreLockedError(StoreError, OSError):
    """Another process holds the DuckDB file's write lock (DuckDB allows one writer per file)."""

    code = "E201"


class SchemaVersionError(StoreError):
    """The store was written by a newer ror_annotate than the one reading it."""

    code = "E202"


class StoreReadOnlyError(StoreError):
    """A write was attempted on a store opened read-only (``Store(..., read_only=True)``)."""

    code = "E203"


class SegmentationError(RorError, ValueError):
    """The segmenter produced, or was given, segments that break the offset invariants."""

    code = "E300"


class CodebookError(RorError, ValueError):
    """A codebook file is malformed, unknown, or was edited in place (hash mismatch)."""

    code = "E400"


class JudgeError(RorError, RuntimeError):
    """A judge could not label segments (endpoint unreachable, bad response, no key)."""

    code = "E500"


class ReviewError(RorError, RuntimeError):
    """The Label Studio review queue failed (server unreachable, bad token, edited config)."""

    code = "E600"


class AgreementError(RorError, ValueError):
    """An agreement statistic was asked a meaningless question (e.g. one rater in total)."""

    code = "E700"


class AlignmentError(RorError, ValueError):
    """Segment labels could not be projected onto tokens exactly (no offset mapping, mismatch)."""

    code = "E800"


class ExportError(RorError, RuntimeError):
    """Writing, reading back or publishing a dataset failed."""

    code = "E810"


class SteerError(RorError, RuntimeError):
    """Router capture, probing or steering failed (unsupported family, hook never fired...)."""

    code = "E900"

"""All of ror_annotate's exceptions, in one place, with stable codes.

Every message says what was wrong, where (file, line, record id, URL) and what to do.
The hierarchy is shallow and each class also inherits the builtin it refines, so
callers that catch ``ValueError`` or ``OSError`` keep working (the pattern used by
Hugging Face ``datasets``).

The CLI catches :class:`RorError` and prints ``error [CODE]: message`` on one line, exiting
with the error's ``exit_status``: 2 for every error except :class:`JudgeOutcomeError` (3: the
judge ran but labelled nothing, or too little); a traceback is only ever shown for a bug in
ror_annotate itself.
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
    #: Process exit status of the ``ror`` command that ends with this error.
    exit_status = 2

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message


class UsageError(RorError, ValueError):
    """The command line itself is wrong: an unknown option, a missing argument, a bad option value."""

    code = "E010"


class InputError(RorError, ValueError):
    """Bad user input: a malformed trace file, a missing column, an unknown option value."""

    code = "E100"


class ImportLabelError(InputError):
    """A label the crosswalk does not declare (neither mapped nor listed as unmapped)."""

    code = "E130"


class ImportSpanError(InputError):
    """A span or text that does not match the stored trace or segment."""

    code = "E131"


class ImportRecordError(InputError):
    """A malformed or unknown record: missing field, bad value, unknown trace or segment, conflicting labels."""

    code = "E132"


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


class HubUnreachableError(ConfigError, InputError):
    """The Hugging Face hub endpoint did not answer the one reachability probe (:func:`ror_annotate.hub.check_hub`).

    A dataset look-up used to raise :class:`InputError` and a tokenizer look-up :class:`ConfigError`
    for this; it is both, so callers catching either keep working.
    """

    code = "E210"


class SegmentationError(RorError, ValueError):
    """The segmenter produced, or was given, segments that break the offset invariants."""

    code = "E300"


class WorkerError(RorError, RuntimeError):
    """A worker process of a CPU stage's pool (segmenter, baseline rules) ended abruptly.

    Code E140: the process was killed (``kill -9``, the out-of-memory killer) while the pool ran.
    Everything committed before it is kept; the same command resumes.
    """

    code = "E140"


class CodebookError(RorError, ValueError):
    """A codebook file is malformed, unknown, or was edited in place (hash mismatch)."""

    code = "E400"


class JudgeError(RorError, RuntimeError):
    """A judge could not label segments (endpoint unreachable, bad response, no key)."""

    code = "E500"


class RetriesExhaustedError(JudgeError):
    """A request kept failing with retryable errors (429, 5xx, timeouts) for ``max_attempts`` calls.

    ``status`` is the last HTTP status (``None`` without one); ``cause`` is ``"status"``,
    ``"body"`` (HTTP 200 bodies that are no completion, :class:`ResponseBodyError`), ``"timeout"``
    (the client gave up waiting) or ``"connection"`` (nothing answered: refused or reset);
    ``waits`` are the seconds waited between the calls.
    """

    code = "E501"

    def __init__(self, message: str, *, status: int | None = None, waits: list[float] | None = None,
                 cause: str = "status") -> None:
        super().__init__(message)
        self.status = status
        self.waits = list(waits or [])
        self.cause = cause


class RequestRejectedError(JudgeError):
    """The endpoint refused the request with a non-retryable status (400, 401, 403, 404, 422)."""

    code = "E502"

    def __init__(self, message: str, *, status: int, api_code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.api_code = api_code


class TruncatedOutputError(JudgeError):
    """The answer was cut at the output-token limit (``finish_reason == "length"``)."""

    code = "E503"


class ResponseParseError(JudgeError):
    """The answer is not JSON of the expected shape."""

    code = "E504"


class RefusalError(JudgeError):
    """The model refused to answer (``message.refusal`` set, or ``finish_reason == "content_filter"``)."""

    code = "E505"


class ResponseBodyError(JudgeError):
    """An HTTP 200 whose body is not a chat completion: not JSON, an HTML page (proxies, captive
    portals), or an error object without ``choices`` (gateways relay an upstream 502/429 that way).

    ``status`` is the HTTP status the body stands for (the error object's own code, e.g. 429 or 502;
    502 for a body that is not JSON or holds no usable code), ``api_code`` the provider's code if it
    gave a string one. :class:`~ror_annotate.judge.client.ChatClient` retries it like that status.
    """

    code = "E507"

    def __init__(self, message: str, *, status: int = 502, api_code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.api_code = api_code


class JudgeOutcomeError(JudgeError):
    """The judge ran, but labelled nothing, or left more segments judge-failed than ``--max-failed`` allows.

    ``ror label`` and ``ror run`` exit with status 3 on it (``ror run`` then exports nothing); the
    labels that were written stay stored and a re-run retries the failed segments.
    """

    code = "E506"
    exit_status = 3

    def __init__(self, message: str, *, counts: dict | None = None) -> None:
        super().__init__(message)
        #: The judge's counters of the pass (``JudgeReport.as_counts()``), for display.
        self.counts = dict(counts or {})


class VerifyError(JudgeError):
    """``ror verify`` cannot start: the audited rater has no labels (E521), the default rater is
    ambiguous (E522), or there is nothing to verify (E523); E520 for anything else."""

    code = "E520"


class VerifyOutcomeError(JudgeOutcomeError):
    """The verifier ran, but returned no verdict, or left more segments failed than ``--max-failed``
    allows (exit status 3, like :class:`JudgeOutcomeError`); the verdicts written stay stored."""

    code = "E524"


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


class ViewError(RorError, RuntimeError):
    """Building or serving the static viewer site failed (no traces, a bad output folder, an unreadable export)."""

    code = "E850"
class ExportWriteError(ExportError, OSError):
    """The export's files could not be written (disk full, read-only folder, I/O error); nothing is left
    behind. Also an ``OSError``, so callers that catch the builtin keep working."""

    code = "E818"


class SteerError(RorError, RuntimeError):
    """Router capture, probing or steering failed (unsupported family, hook never fired...)."""

    code = "E900"


class CaptureCheckError(SteerError):
    """A capture self-check failed: what the model returned cannot be router logits as captured.

    Codes: E910 the values are not logits (probabilities, log-probabilities, sigmoid scores,
    non-finite or all-zero rows); E911 a MoE layer returned nothing (no router found for a layer
    with experts, or its hook never fired); E912 the selected experts are not k distinct in-range
    ids equal to the family's top-k of the captured logits; E913 the first rows differ from a plain
    unbatched forward of the same tokens. The message names the family, the layer and the check.
    Nothing of the failing batch is written. The vLLM engine adds E920 (a request's captured rows
    are not exactly positions 0..T-1) and E921 (a MoE layer's or a residual-stream layer's hook did not
    fire in a forward step); its other errors are :class:`SteerError` with E922 (vLLM missing),
    E923 (no MoE layer routed through vLLM's router), E924 (an option only the HF engine has), E955
    (a router rule the vLLM engine does not define), E963 (expert parallelism asked), E964 (pipeline
    or data parallelism asked), E965 (a tensor-parallel size below 1) and E966 (a tensor-parallel
    size given to the HF engine).
    """

    code = "E910"


class LabelNoiseError(SteerError, ValueError):
    """Label resampling for ``ror probe`` / ``ror experts --label-resamples`` cannot proceed.

    Codes: E930 a segment has neither a class distribution in the export nor a confusion matrix to
    draw from; E931 the confusion file cannot be read or is in no known format; E932 its matrix is not
    6 x 6 or does not name all six behaviors; E933 a row is negative, non-finite or does not sum to 1;
    E934 it names an unknown behavior; E935 an ``ror agree --json`` file without a usable confusion
    matrix (none, or several raters and no ``--label-confusion-rater``); E936 the export's
    ``segments`` configuration is missing or disagrees with its ``tokens``; E937 a stored
    ``label_distribution`` is malformed; E938 ``--label-confusion`` without ``--label-resamples``. The
    message names the file (and the record).
    """

    code = "E930"

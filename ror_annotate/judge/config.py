"""The LLM judge's options as one validated record (:class:`JudgeConfig`).

Every option of ``make_judge("openai:MODEL", **options)`` and of the ``ror label``/``ror run``
judge flags lands here. Unknown names are refused (``LLMJudge("m", chunksize=3)`` used to run with
the default chunk size without a word), and each value is checked against its bounds; both give a
:class:`~ror_annotate.errors.ConfigError` naming the command-line flag.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from ..codebook import DEFAULT_CODEBOOK
from ..options import StageOptions

#: The OpenAI Batch API's documented per-batch limits: requests per batch and input file size (bytes).
BATCH_MAX_REQUESTS = 50_000
BATCH_MAX_BYTES = 200 * 1024 * 1024


class JudgeConfig(StageOptions):
    """Validated options of the LLM judge (see :class:`~ror_annotate.judge.llm.LLMJudge` for their meaning).

    Units: ``timeout``, ``backoff_base`` and ``batch_poll_s`` in seconds; ``context_tokens`` and
    ``max_tokens`` in the judge model's tokens; ``batch_max_bytes`` in bytes of JSONL.
    """

    stage: ClassVar[str] = "the openai judge"

    base_url: str | None = None
    codebook: str = DEFAULT_CODEBOOK
    mode: Literal["chunked", "per-segment"] = "chunked"
    chunk_size: int = Field(24, ge=1)
    concurrency: int = Field(8, ge=1, le=4096)  # each request in flight holds a connection (a file descriptor)
    temperature: float | None = Field(None, ge=0.0)
    seed: int | None = None
    max_tokens: int | None = Field(None, ge=16)
    samples: int = Field(1, ge=1, le=100)  # one annotator per sample: --samples 10**20 built them for ever
    max_attempts: int = Field(4, ge=1, le=100)  # more only retries a dead endpoint for days
    context_tokens: int = Field(128_000, ge=1024)
    prices: str | None = None
    retry_failed: bool = True
    batch: bool = False
    batch_id: str | None = None
    batch_poll_s: float = Field(30.0, gt=0.0)
    batch_requeue: Literal["interactive", "batch"] = "interactive"
    batch_max_requests: int = Field(BATCH_MAX_REQUESTS, ge=1, le=BATCH_MAX_REQUESTS)
    batch_max_bytes: int = Field(BATCH_MAX_BYTES, ge=1024, le=BATCH_MAX_BYTES)
    timeout: float = Field(120.0, gt=0.0)
    backoff_base: float = Field(1.0, ge=0.0)

    @classmethod
    def from_options(
        cls, options: dict[str, Any], *, judge: str = "openai", what: str | None = None, keep_none: bool = False,
    ) -> "JudgeConfig":
        """Validate keyword options; ``None`` values mean "not given" and take the default.

        :meth:`StageOptions.from_options <ror_annotate.options.StageOptions.from_options>`, with the
        errors naming ``the {judge} judge``.

        Raises
        ------
        ConfigError
            An unknown option (with the closest known name) or a value out of bounds, named as its
            command-line flag (``--chunk-size must be >= 1, got 0``).
        """
        return super().from_options(options, what=what or f"the {judge} judge", keep_none=keep_none)

"""Command-line options of the LLM judge, shared by ``ror label`` and ``ror run``.

Each option is a typer ``Annotated`` alias; a command puts them in its signature under the
parameter names below and hands the values to :func:`judge_options`, whose result is passed as
``make_judge(spec, **judge_options(...))``. The options are validated by
:class:`~ror_annotate.judge.config.JudgeConfig`; ``--judge baseline`` refuses them (a ConfigError),
since it would silently run without them. ``--max-failed`` is not a judge option: it decides the
exit status after labeling (:func:`~ror_annotate.judge.outcome.check_label_outcome`).

The API key is deliberately *not* an option: it comes from ``OPENAI_API_KEY`` in the environment
only, so it never lands in shell history, ``runs.parameters`` or logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

_PANEL = "LLM judge (--judge openai:MODEL)"


def _choice(value: str | None, choices: tuple[str, ...], flag: str) -> str | None:
    # typer 0.29 has no click_type; validate the choice ourselves with click's usual message. It must be
    # typer's BadParameter: typer vendors its own click, which shows a traceback for click's exceptions.
    if value is not None and value not in choices:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(map(repr, choices))}", param_hint=flag)
    return value

JudgeBaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        envvar="OPENAI_BASE_URL",
        help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 for vLLM or Ollama (env OPENAI_BASE_URL). "
        "The key is read from OPENAI_API_KEY only; a local URL without a key gets a placeholder key.",
        rich_help_panel=_PANEL,
    ),
]
JudgeChunkSizeOption = Annotated[
    int | None,
    typer.Option("--chunk-size", min=1, help="Segments labelled per request in chunked mode (default 24).", rich_help_panel=_PANEL),
]
JudgeModeOption = Annotated[
    str | None,
    typer.Option(
        "--mode",
        callback=lambda value: _choice(value, ("chunked", "per-segment"), "--mode"),
        help="chunked: K segments per request against one copy of the trace (cheap, default). "
        "per-segment: one request per segment with the whole trace as context (the method's protocol, for comparison).",
        rich_help_panel=_PANEL,
    ),
]
JudgeConcurrencyOption = Annotated[
    int | None,
    typer.Option("--concurrency", min=1, help="Requests in flight at once (default 8).", rich_help_panel=_PANEL),
]
JudgeTemperatureOption = Annotated[
    float | None,
    typer.Option("--temperature", min=0.0, help="Sampling temperature (default 0; samples >= 2 default to 1.0).", rich_help_panel=_PANEL),
]
JudgeSeedOption = Annotated[
    int | None,
    typer.Option("--seed", help="Sampling seed sent to the endpoint (best effort on most providers).", rich_help_panel=_PANEL),
]
JudgeMaxTokensOption = Annotated[
    int | None,
    typer.Option(
        "--max-tokens", min=16,
        help="Output token limit per request (default 96 + 64 per segment in the request). A cut-off answer is retried with a doubled limit.",
        rich_help_panel=_PANEL,
    ),
]
JudgeSamplesOption = Annotated[
    int | None,
    typer.Option(
        "--samples", min=1,
        help="Independent samples of the judge, stored as separate annotators openai:MODEL, openai:MODEL@s2, ... (judge-vs-judge agreement).",
        rich_help_panel=_PANEL,
    ),
]
JudgeBatchOption = Annotated[
    bool,
    typer.Option("--batch/--no-batch", help="Use the OpenAI Batch API (upload JSONL, poll, ingest) instead of interactive requests.", rich_help_panel=_PANEL),
]
JudgeBatchIdOption = Annotated[
    str | None,
    typer.Option("--batch-id", help="Resume (poll and ingest) an existing batch by id (open batches of the store are resumed anyway).", rich_help_panel=_PANEL),
]
JudgeBatchPollOption = Annotated[
    float | None,
    typer.Option("--batch-poll", min=0.001, help="Seconds between Batch API status polls (default 30).", rich_help_panel=_PANEL),
]
JudgeBatchRequeueOption = Annotated[
    str | None,
    typer.Option(
        "--batch-requeue",
        callback=lambda value: _choice(value, ("interactive", "batch"), "--batch-requeue"),
        help="Where requests of a batch that ended expired/cancelled/failed go: interactive (default: finished now, full price) "
        "or batch (a new batch, at most --max-attempts batches per request).",
        rich_help_panel=_PANEL,
    ),
]
JudgeRetryFailedOption = Annotated[
    bool | None,
    typer.Option(
        "--retry-failed/--no-retry-failed",
        help="Ask again for segments an earlier run stored as judge-failed, with --max-attempts new tries each (default); "
        "--no-retry-failed leaves them failed.",
        rich_help_panel=_PANEL,
    ),
]
MaxFailedOption = Annotated[
    str,
    typer.Option(
        "--max-failed",
        help="Exit with status 3 (error E506; `ror run` then exports nothing) when more segments than this end judge-failed: "
        "a fraction (0.1, 10%) or a count (25). Labelling nothing always exits 3.",
        rich_help_panel=_PANEL,
    ),
]
JudgePricesOption = Annotated[
    Path | None,
    typer.Option(
        "--prices", exists=True, dir_okay=False,
        help="JSON or YAML price table {model: {input, cached_input, output}} in USD per 1M tokens, overriding the built-in defaults.",
        rich_help_panel=_PANEL,
    ),
]
JudgeMaxAttemptsOption = Annotated[
    int | None,
    typer.Option(
        "--max-attempts", min=1,
        help="Tries per request (429/5xx/timeouts, with backoff) and per segment (missing/invalid answers) before a segment is stored as judge-failed (default 4).",
        rich_help_panel=_PANEL,
    ),
]
JudgeCodebookOption = Annotated[
    str | None,
    typer.Option("--codebook", help="Codebook name (see `ror codebook list`; default six-behaviors@v1).", rich_help_panel=_PANEL),
]
JudgeContextTokensOption = Annotated[
    int | None,
    typer.Option(
        "--context-tokens", min=1024,
        help="The judge model's context window in tokens; longer traces are shown as a window of segments around each chunk (default 128000). "
        "A trace the endpoint still refuses as too long is judge-failed alone, with the reason.",
        rich_help_panel=_PANEL,
    ),
]

JudgeTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout", min=0.001,
        help="Seconds the client waits for one HTTP answer before it gives up and retries (default 120). "
        "A stalled request then costs this long per try, up to --max-attempts tries.",
        rich_help_panel=_PANEL,
    ),
]

#: Parameter names :func:`judge_options` accepts (the names to use in a command's signature).
JUDGE_OPTION_NAMES: tuple[str, ...] = (
    "base_url", "chunk_size", "mode", "concurrency", "temperature", "seed", "max_tokens", "samples",
    "batch", "batch_id", "prices", "max_attempts", "codebook", "context_tokens", "retry_failed", "batch_poll", "batch_requeue",
    "timeout",
)
#: Command-line names that differ from the judge's option names.
_RENAMED = {"batch_poll": "batch_poll_s"}


def judge_options(**values: Any) -> dict[str, Any]:
    """Turn the judge options of a command into keyword arguments for the judge factory.

    Parameters
    ----------
    **values
        Any of :data:`JUDGE_OPTION_NAMES`; ``None`` (option not given) and ``batch=False`` are
        dropped so the factory's defaults apply.

    Returns
    -------
    dict
        Keyword arguments for ``make_judge(spec, **kwargs)``; ``prices`` becomes a ``str`` path.

    Raises
    ------
    TypeError
        An unknown option name (a wiring mistake in a command, not a user error).
    """
    unknown = sorted(set(values) - set(JUDGE_OPTION_NAMES))
    if unknown:
        raise TypeError(f"judge_options() got unknown option(s) {unknown}; known: {list(JUDGE_OPTION_NAMES)}")
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or (name == "batch" and value is False):
            continue
        out[_RENAMED.get(name, name)] = str(value) if isinstance(value, Path) else value
    return out

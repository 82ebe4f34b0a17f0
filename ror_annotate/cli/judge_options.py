"""Command-line options of the LLM judge, shared by ``ror label`` and ``ror run``.

Each option is a typer ``Annotated`` alias; a command puts them in its signature under the
parameter names below and hands the values to :func:`judge_options`, whose result is passed as
``make_judge(spec, **judge_options(...))``. The baseline judge ignores these options, so they are
harmless with ``--judge baseline``.

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
    typer.Option("--chunk-size", min=1, help="Segments labeled per request in chunked mode (default 24).", rich_help_panel=_PANEL),
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
    typer.Option("--batch-id", help="Resume (poll and ingest) an existing batch by id.", rich_help_panel=_PANEL),
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
        help="The judge model's context window in tokens; longer traces are shown as a window of segments around each chunk (default 128000).",
        rich_help_panel=_PANEL,
    ),
]

#: Parameter names :func:`judge_options` accepts (the names to use in a command's signature).
JUDGE_OPTION_NAMES: tuple[str, ...] = (
    "base_url", "chunk_size", "mode", "concurrency", "temperature", "seed", "max_tokens", "samples",
    "batch", "batch_id", "prices", "max_attempts", "codebook", "context_tokens",
)


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
        out[name] = str(value) if isinstance(value, Path) else value
    return out

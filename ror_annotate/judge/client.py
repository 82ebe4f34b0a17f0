"""Async chat-completions calls with bounded, honest retries, over the ``openai`` client.

The ``openai`` client's own retries are switched off (``max_retries=0``) so that this module
decides, and can report, every wait:

* 429, 408, 409, 5xx, timeouts, connection errors (refused, reset) and 200 bodies that are no
  completion are retried up to ``max_attempts`` calls in
  total, waiting what the server asked for (``retry-after-ms``, ``retry-after`` in seconds or as an
  HTTP date, or "try again in 1.5s" in the error message; ``shared/pitfalls/LLM-04``), otherwise
  exponential backoff with "equal jitter" (``min(cap, base * 2**k * U[0.5, 1])``), which keeps
  successive waits non-decreasing.
* Any other 4xx (a 400 for an invalid schema, 401, 404 ...) is not retried: the API's own message is
  raised in :class:`RequestRejectedError`.
* ``finish_reason == "length"`` is never accepted as an answer, even when the cut text happens to
  parse (``shared/pitfalls/LLM-01``): :class:`TruncatedOutputError`, a type distinct from
  :class:`ResponseParseError`.
* Reasoning models (Qwen3, DeepSeek-R1 behind vLLM/Ollama/gateways) answer in three shapes, all
  accepted by :func:`parse_answer`: ``<think>...</think>`` then the JSON (also with the opening
  tag missing, as chat templates that pre-fill ``<think>`` produce), the JSON inside one code fence
  (```json ... ```), or the reasoning in ``message.reasoning_content`` / ``message.reasoning`` with
  the JSON in ``content``. The reasoning text is kept on :class:`Completion` (``reasoning``).
* A 400 saying the prompt is longer than the model's context is recognised by
  :func:`is_context_length_error`: a property of that one request, not of the run.
* The body of an HTTP 200 is parsed here, not by the ``openai`` client (:func:`completion_from_text`):
  a body that is not JSON or an HTML page (proxies, captive portals) and an error object without
  ``choices`` (gateways relay upstream 502/429 that way) raise :class:`ResponseBodyError` (E507),
  retried like the status it stands for (the error object's code; 502 otherwise), so a 429 or 502
  relayed inside a 200 fails only its request after the retries, with the provider's text.
* ``message.content`` may be a string, a list of typed parts (``text`` -> answer, ``thinking`` ->
  reasoning) or ``null`` with the answer in ``tool_calls[0].function.arguments``; all are read.
* Usage is validated and the providers' prompt-cache fields are mapped (:func:`read_usage`); usage
  that is missing or invalid is *unknown* (``Completion.usage_status``), never 0.
* Every message this module builds from an endpoint's text is scrubbed of secrets
  (:func:`~ror_annotate.provenance.scrub_text`): endpoints may echo the ``Authorization`` header.

The API key comes from ``OPENAI_API_KEY`` only. For a local ``base_url`` (127.0.0.1, localhost:
vLLM, Ollama) without a key, the placeholder ``"sk-no-key-required"`` is sent; those servers accept
any key. The key is never logged or stored.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx

from ..errors import (  # re-exported: these names were defined here before errors.py held them
    ConfigError,
    JudgeError,  # noqa: F401  (kept importable from here)
    RefusalError,
    RequestRejectedError,
    ResponseBodyError,
    ResponseParseError,
    RetriesExhaustedError,
    TruncatedOutputError,
)
from ..provenance import register_secret, register_url_secrets, scrub_text, scrub_url
from . import plainhttp
from .plainhttp import PlainHttpPoster, RawResponse, ResponseTooLargeError, fast_path_url, too_large

__all__ = [
    "ChatClient", "Completion", "RefusalError", "RequestRejectedError", "ResponseBodyError", "ResponseParseError",
    "RetriesExhaustedError", "TruncatedOutputError", "backoff_seconds", "check_base_url", "completion_from_dict",
    "completion_from_text", "is_context_length_error", "parse_answer", "read_usage", "resolve_api_key", "retry_after_seconds", "run_interruptible",
]

PLACEHOLDER_KEY = "sk-no-key-required"
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
_TRY_AGAIN_RE = re.compile(r"try again in\s+(\d+(?:\.\d+)?)\s*(ms|s|sec|seconds?)?", re.IGNORECASE)
_RETRYABLE_STATUS = {408, 409, 429}


@dataclass
class Completion:
    """One chat completion's content and usage (tokens as reported by the endpoint).

    ``usage_status`` is ``"ok"``, ``"missing"`` (the response carried no usable ``usage``) or
    ``"invalid: ..."`` (negative or non-numeric counts, cached > prompt); unless ``"ok"`` the three
    token counts are 0 and mean "unknown", never "free" (:func:`read_usage`).
    """

    content: str | None
    finish_reason: str | None
    refusal: str | None
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    #: The model's reasoning: ``message.reasoning_content``/``reasoning``, typed ``thinking`` parts, or a leading think block.
    reasoning: str | None = None
    usage_status: str = "ok"


def check_base_url(base_url: str | None) -> None:
    """Refuse a ``base_url`` that is not an ``http(s)://host...`` URL (the ``openai`` client would
    otherwise fail every request with a connection error).

    Raises
    ------
    ConfigError
        Not an http or https URL with a host; E778: a URL that cannot be parsed (an unclosed IPv6
        bracket, a port outside 0-65535, whitespace or control characters), which was a ``ValueError``
        traceback or a request sent to a URL with a space in it.
    """
    if base_url is None:
        return
    from ..urls import check_http_url

    parsed = check_http_url(base_url, option="--base-url", example="http://127.0.0.1:8000/v1")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"--base-url {_redact_url(base_url)!r} is not an http(s) URL; give the endpoint root, e.g. http://127.0.0.1:8000/v1"
        )


def _redact_url(url: str) -> str:
    # Error messages must not echo a password written into the URL (even in one that cannot be parsed).
    from ..urls import redact_url

    return redact_url(url)


def resolve_api_key(base_url: str | None) -> str:
    """The API key from ``OPENAI_API_KEY``, or a placeholder for a local ``base_url``.

    Raises
    ------
    ConfigError
        No key in the environment and the endpoint is not local.
    """
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        return key
    host = urlparse(base_url).hostname if base_url else None
    if host in _LOCAL_HOSTS:
        return PLACEHOLDER_KEY
    where = _redact_url(base_url) if base_url else "the OpenAI API"
    raise ConfigError(
        f"no API key for {where}: set OPENAI_API_KEY in the environment (keys are never taken from options or files); "
        "a local --base-url (127.0.0.1/localhost) works without one"
    )


def completion_from_dict(body: Any) -> Completion:
    """A :class:`Completion` from a chat-completion response body (interactive or Batch API output).

    Reads the answer in every shape endpoints send it: ``message.content`` as a string, as a list
    of typed parts (Mistral/Magistral, Anthropic-style gateways: ``text`` parts are the answer,
    ``thinking``/``reasoning`` parts the reasoning), or, with no text, the arguments of the first
    tool call (``tool_calls[0].function.arguments``; gateways that send JSON output as a tool call).
    Usage is read by :func:`read_usage`.

    Raises
    ------
    ResponseBodyError
        The body is not an object, or has no choices (an error object relayed with HTTP 200 is
        classified by its embedded code: see :func:`embedded_error`).
    """
    if not isinstance(body, dict):
        raise ResponseBodyError(f"the endpoint answered with a JSON {type(body).__name__}, not a chat completion object")
    choices = body.get("choices") or []
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise embedded_error(body)
    choice = choices[0]
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        message = {}
    text, thinking, refusal = _content_parts(message.get("content"))
    if not text:
        text = _tool_call_arguments(message) or text
    reasoning = message.get("reasoning_content") or message.get("reasoning") or thinking
    if not isinstance(reasoning, str):
        reasoning = _part_text(reasoning) or None
    if isinstance(text, str):
        think, _ = split_reasoning(text)
        reasoning = reasoning or think
    input_tokens, cached, output_tokens, status = read_usage(body.get("usage"))
    return Completion(
        content=text,
        finish_reason=choice.get("finish_reason"),
        refusal=message.get("refusal") or refusal,
        input_tokens=input_tokens,
        cached_input_tokens=cached,
        output_tokens=output_tokens,
        raw=body,
        reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
        usage_status=status,
    )


def completion_from_text(text: str, *, content_type: str | None = None) -> Completion:
    """A :class:`Completion` from the raw text of an HTTP 200 response (see :func:`completion_from_dict`).

    Raises
    ------
    ResponseBodyError
        The text is not JSON (a proxy's or captive portal's HTML page, a cut body): retried by
        :class:`ChatClient` like a 502; or JSON that is not a chat completion.
    """
    try:
        body = json.loads(text)
    except ValueError:
        raise ResponseBodyError(
            f"the endpoint answered HTTP 200 with {_describe_body(text, content_type)} instead of a chat completion; "
            "check --base-url (a proxy, login page or captive portal answers instead of the API)"
        ) from None
    return completion_from_dict(body)


def _describe_body(text: str, content_type: str | None) -> str:
    ctype = f" ({content_type.split(';')[0].strip()})" if content_type else ""
    if not text.strip():
        return f"an empty body{ctype}"
    if re.search(r"<\s*(!doctype|html|head|body)\b", text[:2000], re.IGNORECASE):
        title = re.search(r"<title[^>]*>(.*?)</title>", text[:20000], re.IGNORECASE | re.DOTALL)
        what = f"an HTML page{ctype}"
        return what + (f" titled {' '.join(title.group(1).split())[:80]!r}" if title else "")
    return f"a body that is not JSON{ctype}: {' '.join(text.split())[:80]!r}"


def _part_text(value: Any) -> str:
    """The text of a typed part's payload: a string, a list of parts, or a part with ``text``."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_part_text(v) for v in value)
    if isinstance(value, dict):
        for key in ("text", "thinking", "reasoning", "content", "summary"):
            if key in value:
                return _part_text(value[key])
    return ""


_THINKING_PARTS = ("thinking", "reasoning", "reasoning_content", "redacted_thinking")


def _content_parts(content: Any) -> tuple[str | None, str | None, str | None]:
    """``(answer text, thinking text, refusal)`` of ``message.content`` in any of its shapes."""
    if content is None or isinstance(content, str):
        return content, None, None
    if isinstance(content, dict):
        if "type" in content:
            content = [content]
        else:  # the JSON answer itself, as an object
            return json.dumps(content, ensure_ascii=False), None, None
    if not isinstance(content, list):
        return str(content), None, None
    texts: list[str] = []
    thoughts: list[str] = []
    refusals: list[str] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in _THINKING_PARTS:
            thoughts.append(_part_text({k: v for k, v in part.items() if k != "type"}))
        elif kind == "refusal":
            refusals.append(_part_text(part.get("refusal")))
        elif kind == "json":
            texts.append(json.dumps(part.get("json"), ensure_ascii=False))
        elif kind in (None, "text", "output_text"):
            texts.append(_part_text(part.get("text", "")))
    return "".join(texts) or None, "\n".join(t for t in thoughts if t) or None, "".join(refusals) or None


def _tool_call_arguments(message: dict[str, Any]) -> str | None:
    """The arguments of the first tool call (or legacy ``function_call``), as JSON text."""
    calls = message.get("tool_calls")
    candidates: list[Any] = []
    if isinstance(calls, list):
        candidates += [c.get("function") for c in calls if isinstance(c, dict)]
    candidates.append(message.get("function_call"))
    for fn in candidates:
        if isinstance(fn, dict):
            args = fn.get("arguments")
            if isinstance(args, str) and args.strip():
                return args
            if isinstance(args, dict):
                return json.dumps(args, ensure_ascii=False)
    return None


#: Where providers report prompt-cache hits (tokens read from the cache), checked in this order:
#: OpenAI, vLLM, xAI, OpenRouter ``prompt_tokens_details.cached_tokens``; the Responses API
#: ``input_tokens_details.cached_tokens``; DeepSeek ``prompt_cache_hit_tokens``; Anthropic and
#: LiteLLM-style gateways ``cache_read_input_tokens``; Moonshot/Kimi a top-level ``cached_tokens``.
CACHE_HIT_FIELDS: tuple[tuple[str, ...], ...] = (
    ("prompt_tokens_details", "cached_tokens"), ("input_tokens_details", "cached_tokens"), ("prompt_cache_hit_tokens",),
    ("cache_read_input_tokens",), ("cached_tokens",),
)


def _usage_field(usage: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = usage
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _count(value: Any, name: str) -> int:
    """A token count: a non-negative integer (an integral float or digit string is accepted)."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a number")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value)
    else:
        raise ValueError(f"{name}={value!r} is not a whole number")
    if number < 0:
        raise ValueError(f"{name}={number} is negative")
    return number


def read_usage(usage: Any) -> tuple[int, int, int, str]:
    """``(input_tokens, cached_input_tokens, output_tokens, status)`` of a response's ``usage`` object.

    ``input_tokens`` includes the cached ones (the OpenAI convention, which the price formula of
    :func:`~ror_annotate.judge.pricing.cost_usd` assumes). Prompt tokens are read from
    ``prompt_tokens`` (OpenAI) or ``input_tokens`` (Anthropic, Responses API); cache hits from the
    first of :data:`CACHE_HIT_FIELDS` present. An Anthropic-style usage (``input_tokens`` with
    ``cache_read_input_tokens``/``cache_creation_input_tokens``, no ``prompt_tokens``) counts its
    input without the cache, so the cache reads and writes are added to it (Anthropic's usage
    documentation); cache writes are then billed at the input price (Anthropic bills them 1.25x:
    an estimate, like every figure of :mod:`.pricing`).

    ``status`` is ``"ok"``; ``"missing"`` when there is no usage or no prompt/completion count; or
    ``"invalid: <why>"`` for a negative or non-numeric count, or more cached than prompt tokens. In
    both latter cases the counts are ``0, 0, 0`` and mean *unknown*: the caller records them as
    such (``NULL`` in ``judge_cache``, ``usage_unknown_requests`` in the run's counts), never as free.
    """
    if not isinstance(usage, dict) or not usage:
        return 0, 0, 0, "missing"
    # Anthropic counts input_tokens without its cache reads and writes; the Responses API (also
    # input_tokens) counts them in, and reports hits under input_tokens_details.
    anthropic = "prompt_tokens" not in usage and "input_tokens" in usage and (
        "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage)
    prompt_raw = usage.get("prompt_tokens", usage.get("input_tokens"))
    output_raw = usage.get("completion_tokens", usage.get("output_tokens"))
    if prompt_raw is None or output_raw is None:
        return 0, 0, 0, "missing"
    try:
        prompt = _count(prompt_raw, "prompt_tokens" if not anthropic else "input_tokens")
        output = _count(output_raw, "completion_tokens" if "completion_tokens" in usage else "output_tokens")
        cached = 0
        for path in CACHE_HIT_FIELDS:
            value = _usage_field(usage, path)
            if value is not None:
                cached = _count(value, ".".join(path))
                break
        if anthropic:
            created = usage.get("cache_creation_input_tokens")
            prompt += cached + (_count(created, "cache_creation_input_tokens") if created is not None else 0)
        if cached > prompt:
            raise ValueError(f"cached tokens {cached} exceed prompt tokens {prompt}")
    except ValueError as exc:
        return 0, 0, 0, f"invalid: {exc}"
    return prompt, cached, output, "ok"


#: Error codes and types of error objects, as the HTTP status they stand for.
_CODE_STATUS = {
    "rate_limit_exceeded": 429, "rate_limit_error": 429, "rate_limited": 429, "too_many_requests": 429,
    "insufficient_quota": 429, "server_error": 500, "internal_error": 500, "internal_server_error": 500,
    "api_error": 500, "bad_gateway": 502, "upstream_error": 502, "service_unavailable": 503, "overloaded": 503,
    "overloaded_error": 503, "timeout": 504, "gateway_timeout": 504, "context_length_exceeded": 400,
    "string_above_max_length": 400, "invalid_request_error": 400, "invalid_api_key": 401, "authentication_error": 401,
    "permission_error": 403, "permission_denied": 403, "model_not_found": 404, "not_found_error": 404,
}


def embedded_error(body: dict[str, Any]) -> ResponseBodyError:
    """The error of a 200 body without ``choices``, classified like the HTTP status it stands for.

    The status is the error object's numeric ``code`` (``{"error": {"code": 502, ...}}``, as
    OpenRouter and other gateways relay upstream failures), else its ``status``/``status_code``,
    else the status a string ``code`` or ``type`` names (``rate_limit_exceeded`` -> 429,
    ``server_error`` -> 500, ``invalid_api_key`` -> 401, ...; :data:`_CODE_STATUS`), else 502 (an
    upstream failure of unknown kind: retried). The provider's own message is kept, scrubbed of secrets.
    """
    err = body.get("error")
    if isinstance(err, str):
        err = {"message": err}
    if not isinstance(err, dict):
        err = body if body.get("object") == "error" or "message" in body else {}
    status: int | None = None
    api_code: str | None = None
    for key in ("code", "status", "status_code"):
        value = err.get(key, body.get(key) if key != "code" else None)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            if 400 <= int(value) <= 599:
                status = int(value)
                break
        elif isinstance(value, str) and api_code is None:
            api_code = value
    if status is None:
        for name in (api_code, err.get("type")):
            if isinstance(name, str) and name.lower() in _CODE_STATUS:
                status = _CODE_STATUS[name.lower()]
                break
    message = err.get("message") or err.get("detail") or ""
    meta = err.get("metadata")
    if isinstance(meta, dict) and meta.get("raw"):  # OpenRouter keeps the upstream's own text here
        message = f"{message} ({meta['raw']})" if message else str(meta["raw"])
    if not err:
        text = f"response {body.get('id')!r} has no choices and no error object"
    else:
        text = f"the endpoint answered HTTP 200 with an error instead of a completion: {message or json.dumps(err)[:300]}"
    where = f" (code {status if status is not None else api_code})" if status is not None or api_code else ""
    return ResponseBodyError(scrub_text(f"{text}{where}"[:1000]), status=status or 502, api_code=api_code)


_THINK_TAGS = (("<think>", "</think>"), ("<thinking>", "</thinking>"), ("<|begin_of_thought|>", "<|end_of_thought|>"))
_FENCE_RE = re.compile(r"\A```[ \t]*([A-Za-z0-9_-]*)[ \t]*\r?\n(.*?)\r?\n?```\Z", re.DOTALL)


def split_reasoning(content: str) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a content string that may open with a think block.

    Accepts ``<think>R</think>A`` (and ``<thinking>``, ``<|begin_of_thought|>``), and ``R</think>A``
    with the opening tag missing (chat templates that pre-fill ``<think>`` in the prompt; then the
    last closing tag ends the reasoning). Content that itself opens as JSON or a code fence is left
    whole, so a JSON answer whose strings mention ``</think>`` is not cut. Without a think block the
    reasoning is ``None`` and the answer is ``content`` unchanged.
    """
    stripped = content.lstrip()
    for open_tag, close_tag in _THINK_TAGS:
        if stripped.startswith(open_tag):
            end = stripped.find(close_tag)
            if end < 0:
                return stripped[len(open_tag) :].strip() or None, ""  # never closed: no answer after it
            return stripped[len(open_tag) : end].strip() or None, stripped[end + len(close_tag) :]
    if stripped.startswith(("{", "[", "```")):
        return None, content
    for _, close_tag in _THINK_TAGS:
        end = stripped.rfind(close_tag)
        if end >= 0:
            return stripped[:end].strip() or None, stripped[end + len(close_tag) :]
    return None, content


def answer_text(content: str) -> str:
    """The JSON text of an answer: without a leading think block and without one enclosing code fence."""
    _, answer = split_reasoning(content)
    answer = answer.strip()
    m = _FENCE_RE.match(answer)
    if m and m.group(1).lower() in ("", "json", "json5", "jsonc"):
        answer = m.group(2).strip()
    return answer


#: Phrases of context-length 400s: OpenAI (``context_length_exceeded``), vLLM ("maximum context
#: length is N tokens"), Ollama/llama.cpp ("exceeds the context", "context size"), Anthropic-style
#: gateways ("prompt is too long"), Azure ("string too long").
_CONTEXT_RE = re.compile(
    r"context[ _]length|maximum context|context window|context size|exceeds the context|prompt is too long|"
    r"too many (input )?tokens|string too long|input is too long|reduce the length",
    re.IGNORECASE,
)


def is_context_length_error(exc: RequestRejectedError) -> bool:
    """Whether a rejected request was too long for the model's context (a property of that request)."""
    if exc.status not in (400, 413, 422):
        return False
    if exc.api_code in ("context_length_exceeded", "string_above_max_length"):
        return True
    return bool(_CONTEXT_RE.search(exc.message))


def parse_answer(completion: Completion) -> dict[str, Any]:
    """The JSON object in a completion, refusing truncated and refused answers.

    The JSON may follow a leading think block and sit in one code fence (:func:`answer_text`).

    Raises
    ------
    TruncatedOutputError
        ``finish_reason == "length"`` (checked first: a cut answer is never accepted, even if it parses).
    RefusalError
        The model refused.
    ResponseParseError
        Content missing, not JSON, or not a JSON object.
    """
    if completion.finish_reason == "length":
        raise TruncatedOutputError(
            f"answer cut at the output-token limit after {completion.output_tokens} tokens (finish_reason=length)"
        )
    if completion.refusal or completion.finish_reason == "content_filter":
        raise RefusalError(f"the model refused: {completion.refusal or 'content filter'}")
    if not completion.content:
        raise ResponseParseError("empty answer (no content)")
    text = answer_text(completion.content)
    if not text:
        raise ResponseParseError("empty answer after the reasoning (no JSON)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResponseParseError(f"answer is not valid JSON ({exc.msg} at char {exc.pos}): {text[:60]!r}") from exc
    if not isinstance(data, dict):
        raise ResponseParseError(f"answer is JSON but not an object: {text[:80]!r}")
    return data


def retry_after_seconds(headers: Any, message: str | None) -> float | None:
    """Seconds the server asked to wait: ``retry-after-ms``, ``retry-after`` (seconds or HTTP date),
    or "try again in Ns/ms" in the error message; ``None`` if it said nothing."""
    if headers is not None:
        ms = headers.get("retry-after-ms")
        if ms:
            try:
                return max(float(ms) / 1000.0, 0.0)
            except ValueError:
                pass
        value = headers.get("retry-after")
        if value:
            try:
                return max(float(value), 0.0)
            except ValueError:
                parsed = email.utils.parsedate_to_datetime(value) if value else None
                if parsed is not None:
                    return max(parsed.timestamp() - time.time(), 0.0)
    if message:
        m = _TRY_AGAIN_RE.search(message)
        if m:
            seconds = float(m.group(1))
            return seconds / 1000.0 if (m.group(2) or "s").lower() == "ms" else seconds
    return None


def backoff_seconds(attempt: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with equal jitter for retry ``attempt`` (0-based): ``min(cap, base * 2**k * U[0.5, 1])``.

    Successive waits never decrease: the jitter ranges of consecutive attempts only touch, and the
    cap is applied after the jitter (capping first would let two capped waits jitter downwards).
    """
    return min(cap, base * (2**attempt) * (0.5 + 0.5 * rng.random()))


Sleep = Callable[[float], Awaitable[None]]


class ChatClient:
    """Chat completions against one OpenAI-compatible endpoint with bounded retries.

    Parameters
    ----------
    base_url : str or None
        Endpoint root (``.../v1``); ``None`` means the OpenAI API.
    max_attempts : int, default 4
        Calls per request in total (so ``max_attempts - 1`` retries).
    timeout : float, default 120.0
        Seconds per call: the whole call (connect, send, answer), on both paths.
    backoff_base, backoff_cap : float
        Seconds: first backoff wait and the longest one.
    max_wait : float, default 600.0
        Longest Retry-After honoured, in seconds; a longer demand ends the retries at once.
    sleep : coroutine function, optional
        ``await sleep(seconds)``; tests pass a recorder instead of :func:`asyncio.sleep`.
    seed : int, optional
        Seed of the jitter generator.
    connections : int, optional
        Size of the HTTP connection pool, all kept alive (the judge passes its concurrency); ``None``
        keeps the ``openai`` client's default pool (100 connections on the plain-``http`` path).
    fast_http : bool, default True
        Send chat completions to a plain-``http`` endpoint through ``aiohttp`` (:mod:`.plainhttp`:
        same requests, same error classes, a fraction of the CPU); ``False`` always uses the
        ``openai`` client. URLs with credentials, a query or a proxy always use the ``openai``
        client (:func:`.plainhttp.fast_path_url`). On both paths an answer over
        :data:`.plainhttp.MAX_RESPONSE_BYTES` is cut off and retried as a transport fault.
    """

    def __init__(
        self,
        base_url: str | None,
        *,
        max_attempts: int = 4,
        timeout: float = 120.0,
        backoff_base: float = 1.0,
        backoff_cap: float = 60.0,
        max_wait: float = 600.0,
        sleep: Sleep | None = None,
        seed: int | None = None,
        connections: int | None = None,
        fast_http: bool = True,
    ) -> None:
        if max_attempts < 1:
            raise ConfigError(f"--max-attempts must be >= 1, got {max_attempts}")
        self.base_url = base_url
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_wait = max_wait
        self.connections = connections
        self.sleep: Sleep = sleep or asyncio.sleep
        self.rng = random.Random(seed)
        self.waits: list[float] = []
        #: Calls that got any HTTP answer; calls cancelled before their answer (an interrupt: the
        #: provider may bill them, their usage is unknown).
        self.answered = 0
        self.abandoned = 0
        self._api_key = resolve_api_key(base_url)
        # Endpoints may echo the Authorization header (the key, or base64 of the URL's user:password)
        # in their error texts: every text this client hands on is scrubbed of both.
        register_secret(self._api_key)
        register_url_secrets(base_url)
        self._client: Any = None
        #: The chat-completions URL when they go through :mod:`.plainhttp` instead of the ``openai`` client.
        self._fast_target = fast_path_url(base_url) if fast_http else None
        self._fast: PlainHttpPoster | None = None  # created inside the event loop, on first use

    @property
    def openai(self) -> Any:
        """The underlying ``openai.AsyncOpenAI`` (created on first use, inside the event loop)."""
        if self._client is None:
            from openai import AsyncOpenAI

            import openai

            kwargs: dict[str, Any] = {}
            http_client: Any = getattr(openai, "DefaultAsyncHttpxClient", None)  # openai >= 1.17
            if http_client is not None:
                # The answer's size is capped as on the plain-http path (plainhttp.MAX_RESPONSE_BYTES).
                options: dict[str, Any] = {"timeout": self.timeout, "event_hooks": {"response": [_cap_response_body]}}
                if self.connections:
                    # One pool sized to the requests in flight, every connection kept alive between them
                    # (the client's default keeps 100 alive: at a concurrency of 256 the rest reconnect).
                    options["limits"] = _limits(self.connections)
                kwargs["http_client"] = http_client(**options)
            self._client = AsyncOpenAI(api_key=self._api_key, base_url=self.base_url, max_retries=0, timeout=self.timeout, **kwargs)
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        if self._fast is not None:
            await self._fast.aclose()
            self._fast = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def with_retries(self, call: Callable[[], Awaitable[Any]], *, what: str) -> Any:
        """Run ``await call()`` with the retry policy of this module; ``what`` names it in errors.

        Raises
        ------
        RetriesExhaustedError, RequestRejectedError
        """
        import openai

        waits: list[float] = []
        last: BaseException | None = None
        status: int | None = None
        cause = "status"
        for attempt in range(self.max_attempts):
            try:
                try:
                    result = await call()
                except asyncio.CancelledError:
                    self.abandoned += 1
                    raise
                self.answered += 1
                return result
            except openai.APIStatusError as exc:
                self.answered += 1
                status = exc.status_code
                message = _api_message(exc)
                if status not in _RETRYABLE_STATUS and status < 500:
                    raise RequestRejectedError(f"{what}: the endpoint rejected the request with {status}: {message}",
                                               status=status, api_code=_api_code(exc)) from exc
                asked = retry_after_seconds(exc.response.headers, message)
                last, cause = exc, "status"
            except ResponseBodyError as exc:
                # An HTTP 200 that is no completion: an error object is treated like the status its code
                # stands for; a body that is not JSON (a proxy's HTML page) like a 502.
                self.answered += 1
                status = exc.status
                if status not in _RETRYABLE_STATUS and status < 500:
                    raise RequestRejectedError(f"{what}: {exc.message}", status=status, api_code=exc.api_code) from exc
                asked = retry_after_seconds(None, exc.message)
                last, cause = exc, "body"
            except openai.APITimeoutError as exc:
                # A client-side timeout is retried like a 5xx; it says nothing about reachability.
                asked, last, status, cause = None, exc, None, "timeout"
            except openai.APIConnectionError as exc:
                asked, last, status, cause = None, exc, None, "connection"
            if attempt + 1 >= self.max_attempts:
                break
            if asked is not None and asked > self.max_wait:
                break
            wait = asked if asked is not None else backoff_seconds(attempt, base=self.backoff_base, cap=self.backoff_cap, rng=self.rng)
            waits.append(wait)
            self.waits.append(wait)
            await self.sleep(wait)
        if cause == "body":
            kind = f"a body that is no chat completion (as HTTP {status})"
        else:
            kind = "rate limited (429)" if status == 429 else (f"status {status}" if status else type(last).__name__)
        raise RetriesExhaustedError(
            f"{what}: {kind} on all {len(waits) + 1} attempts (waited {sum(waits):.1f} s in total): {_api_message(last)}",
            status=status, waits=waits, cause=cause,
        ) from last

    def _fast_headers(self) -> dict[str, str]:
        """Headers of a chat-completion POST on the plain-``http`` path (as the ``openai`` client sends them)."""
        from .. import __version__

        headers = {"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": f"ror_annotate/{__version__}"}
        for env, name in (("OPENAI_ORG_ID", "OpenAI-Organization"), ("OPENAI_PROJECT_ID", "OpenAI-Project")):
            if os.environ.get(env):
                headers[name] = os.environ[env]
        return headers

    async def _fast_post(self, data: bytes) -> Completion:
        """One POST of ``data`` to ``{base_url}/chat/completions`` through :mod:`.plainhttp`, its errors
        raised as the ``openai`` exceptions :meth:`with_retries` classifies."""
        import aiohttp
        import openai

        assert self._fast_target is not None
        if self._fast is None:
            self._fast = PlainHttpPoster(self._fast_target, self._fast_headers(), connections=self.connections or 100,
                                         timeout=self.timeout)
        try:
            response = await self._fast.post(data)
        except ResponseTooLargeError as exc:
            raise openai.APIConnectionError(message=str(exc), request=self._request_stub()) from exc
        except (TimeoutError, asyncio.TimeoutError):
            raise openai.APITimeoutError(request=self._request_stub()) from None
        except (aiohttp.ClientError, OSError) as exc:
            detail = str(exc) or type(exc).__name__
            raise openai.APIConnectionError(message=f"Connection error: {detail}", request=self._request_stub()) from exc
        if not 200 <= response.status < 300:
            raise self._status_error(response)
        return completion_from_text(response.text, content_type=response.headers.get("content-type"))

    def _request_stub(self) -> Any:
        return _openai_http().Request("POST", self._fast_target or f"{scrub_url(self.base_url or '')}/chat/completions")

    def _status_error(self, response: RawResponse) -> Exception:
        """The ``openai`` status error of an HTTP answer (the client's own message and body parsing)."""
        import openai

        # the text is already decoded: the headers that describe the bytes on the wire stay out
        headers = [(k, v) for k, v in response.headers.items() if k not in ("content-encoding", "content-length", "transfer-encoding")]
        http_response = _openai_http().Response(response.status, headers=headers, content=response.text.encode("utf-8"),
                                                request=self._request_stub())
        make = getattr(self.openai, "_make_status_error_from_response", None)
        if make is not None:
            return make(http_response)  # type: ignore[no-any-return]
        try:  # pragma: no cover - an openai release without the helper
            body: Any = json.loads(response.text)
        except ValueError:  # pragma: no cover
            body = response.text
        return openai.APIStatusError(f"Error code: {response.status}", response=http_response, body=body)  # pragma: no cover

    async def complete(self, body: dict[str, Any], *, what: str = "chat completion", encoded: bytes | None = None) -> Completion:
        """POST one chat completion (``body`` as for ``chat.completions.create``) with retries.

        ``encoded``, when given, is ``body`` already serialised as JSON (UTF-8): a plain-``http``
        endpoint is sent these bytes as they are (:mod:`.plainhttp`), the ``openai`` client ``body``.
        """
        if self._fast_target is not None:
            data = encoded if encoded is not None else json.dumps(body, ensure_ascii=False).encode("utf-8")

            async def fast_call() -> Completion:
                return await self._fast_post(data)

            return await self.with_retries(fast_call, what=what)

        async def call() -> Completion:
            # The raw body, parsed here: an HTTP 200 may carry an HTML page or an error object, which
            # the client's own parsing turns into a traceback or an empty completion.
            # ``post`` with ``cast_to=httpx.Response`` (the client's documented way to send a body as is):
            # ``chat.completions.create`` walks the whole body through its type transforms first, about
            # as long as the rest of the request on a zero-latency server.
            import openai

            try:
                # The whole call within ``timeout`` seconds, as on the plain-http path: httpx's timeout is
                # per read, so an answer that trickles a byte a second (a slowloris reply, a body that never
                # ends) held the request, and the whole run, forever.
                response = await asyncio.wait_for(
                    self.openai.post("/chat/completions", body=body, cast_to=httpx.Response), self.timeout)
            except (TimeoutError, asyncio.TimeoutError):
                raise openai.APITimeoutError(request=self._request_stub()) from None
            except ResponseTooLargeError as exc:  # from the response hook, which the client lets through
                raise openai.APIConnectionError(message=str(exc), request=self._request_stub()) from exc
            except openai.APIConnectionError as exc:
                if isinstance(exc.__cause__, ResponseTooLargeError):  # the client says only "Connection error."
                    raise openai.APIConnectionError(message=str(exc.__cause__), request=exc.request) from exc.__cause__
                raise
            return completion_from_text(response.text, content_type=response.headers.get("content-type"))

        return await self.with_retries(call, what=what)


def run_interruptible(coro: Any) -> Any:
    """``asyncio.run(coro)`` where SIGINT and SIGTERM cancel the work instead of raising inside it.

    A signal handler that raises ``KeyboardInterrupt`` in whatever task runs at that moment leaves
    that task's exception unretrieved ("Task exception was never retrieved" and a long asyncio
    traceback after the one ``interrupted:`` line). Here the loop's own signal handlers cancel the
    main task: its ``finally`` blocks run (the counts are published), every request in flight is
    cancelled, and ``KeyboardInterrupt`` is raised once the loop is closed. The handlers in place
    before are restored. Off the main thread this is plain :func:`asyncio.run`.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)
    interrupted: list[int] = []

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def stop(signum: int) -> None:
            interrupted.append(signum)
            task.cancel()

        previous: dict[signal.Signals, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                before = signal.getsignal(sig)
                loop.add_signal_handler(sig, stop, sig)
                previous[sig] = before
            except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - platforms without it
                continue
        try:
            return await coro
        finally:
            for sig, before in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, before)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt() from None
        raise


def _openai_http() -> Any:
    """The HTTP library module the installed ``openai`` builds its requests and errors with
    (``httpx``, or ``httpx2`` in later releases)."""
    import sys

    try:
        from openai._constants import DEFAULT_CONNECTION_LIMITS

        return sys.modules[type(DEFAULT_CONNECTION_LIMITS).__module__.split(".")[0]]
    except (ImportError, KeyError):  # pragma: no cover
        return httpx


async def _cap_response_body(response: Any) -> None:
    """httpx response hook (it runs before the body is read): cut the body off past
    :data:`.plainhttp.MAX_RESPONSE_BYTES` (counted on the wire, before any decompression).

    Raises
    ------
    ResponseTooLargeError
        The announced length is over the limit, or the body grows past it while it is read.
    """
    limit = plainhttp.MAX_RESPONSE_BYTES
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit)
    response.stream = _capped_stream_type()(response.stream, limit)


_CAPPED: list[type] = []


def _capped_stream_type() -> type:
    """The byte-stream class of the HTTP library ``openai`` uses (``httpx`` or ``httpx2``: its
    responses accept only their own library's async streams) that raises
    :class:`ResponseTooLargeError` once more than ``limit`` bytes came."""
    base = _openai_http().AsyncByteStream
    for made in _CAPPED:
        if issubclass(made, base):
            return made

    class CappedStream(base):  # type: ignore[misc,valid-type]
        def __init__(self, inner: Any, limit: int) -> None:
            self.inner = inner
            self.limit = limit

        async def __aiter__(self) -> Any:
            seen = 0
            async for chunk in self.inner:
                seen += len(chunk)
                if seen > self.limit:
                    raise too_large(self.limit)
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    _CAPPED.append(CappedStream)
    return CappedStream


def _limits(connections: int) -> Any:
    """Connection limits of ``connections`` connections, all kept alive, in the HTTP library the
    installed ``openai`` uses (``httpx``, or ``httpx2`` in later releases)."""
    limits_type: Any = httpx.Limits
    try:
        from openai._constants import DEFAULT_CONNECTION_LIMITS

        limits_type = type(DEFAULT_CONNECTION_LIMITS)
    except ImportError:  # pragma: no cover
        pass
    return limits_type(max_connections=connections, max_keepalive_connections=connections)


def _api_code(exc: BaseException) -> str | None:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("code"), str):
            return err["code"]
    return getattr(exc, "code", None) if isinstance(getattr(exc, "code", None), str) else None


def _api_message(exc: BaseException | None) -> str:
    """The provider's own message of an error, scrubbed of every known secret."""
    return scrub_text(_raw_api_message(exc))


def _raw_api_message(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if body.get("message"):
            return str(body["message"])
    return getattr(exc, "message", None) or str(exc)


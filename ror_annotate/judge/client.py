"""Async chat-completions calls with bounded, honest retries, over the ``openai`` client.

The ``openai`` client's own retries are switched off (``max_retries=0``) so that this module
decides, and can report, every wait:

* 429, 408, 409, 5xx, timeouts and connection errors are retried up to ``max_attempts`` calls in
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

from ..errors import (  # re-exported: these names were defined here before errors.py held them
    ConfigError,
    JudgeError,  # noqa: F401  (kept importable from here)
    RefusalError,
    RequestRejectedError,
    ResponseParseError,
    RetriesExhaustedError,
    TruncatedOutputError,
)

__all__ = [
    "ChatClient", "Completion", "RefusalError", "RequestRejectedError", "ResponseParseError", "RetriesExhaustedError",
    "TruncatedOutputError", "backoff_seconds", "check_base_url", "completion_from_dict", "is_context_length_error",
    "parse_answer", "resolve_api_key", "retry_after_seconds",
]

PLACEHOLDER_KEY = "sk-no-key-required"
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
_TRY_AGAIN_RE = re.compile(r"try again in\s+(\d+(?:\.\d+)?)\s*(ms|s|sec|seconds?)?", re.IGNORECASE)
_RETRYABLE_STATUS = {408, 409, 429}


@dataclass
class Completion:
    """One chat completion's content and usage (tokens as reported by the endpoint)."""

    content: str | None
    finish_reason: str | None
    refusal: str | None
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    #: The model's reasoning: ``message.reasoning_content``/``reasoning``, or a leading think block.
    reasoning: str | None = None


def check_base_url(base_url: str | None) -> None:
    """Refuse a ``base_url`` that is not an ``http(s)://host...`` URL (the ``openai`` client would
    otherwise fail every request with a connection error).

    Raises
    ------
    ConfigError
        Not an http or https URL with a host.
    """
    if base_url is None:
        return
    parsed = urlparse(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"--base-url {_redact_url(base_url)!r} is not an http(s) URL; give the endpoint root, e.g. http://127.0.0.1:8000/v1"
        )


def _redact_url(url: str) -> str:
    # Error messages must not echo a password written into the URL.
    from ..store import scrub_url

    return scrub_url(url)


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


def completion_from_dict(body: dict[str, Any]) -> Completion:
    """A :class:`Completion` from a chat-completion response body (interactive or Batch API output).

    Raises
    ------
    ResponseParseError
        The body has no choices.
    """
    choices = body.get("choices") or []
    if not choices:
        raise ResponseParseError(f"response {body.get('id')!r} has no choices")
    choice = choices[0]
    message = choice.get("message") or {}
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    content = message.get("content")
    if isinstance(content, str):
        think, _ = split_reasoning(content)
        reasoning = reasoning or think
    return Completion(
        content=content,
        finish_reason=choice.get("finish_reason"),
        refusal=message.get("refusal"),
        input_tokens=int(usage.get("prompt_tokens") or 0),
        cached_input_tokens=int(details.get("cached_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        raw=body,
        reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
    )


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
        Seconds per call.
    backoff_base, backoff_cap : float
        Seconds: first backoff wait and the longest one.
    max_wait : float, default 600.0
        Longest Retry-After honoured, in seconds; a longer demand ends the retries at once.
    sleep : coroutine function, optional
        ``await sleep(seconds)``; tests pass a recorder instead of :func:`asyncio.sleep`.
    seed : int, optional
        Seed of the jitter generator.
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
    ) -> None:
        if max_attempts < 1:
            raise ConfigError(f"--max-attempts must be >= 1, got {max_attempts}")
        self.base_url = base_url
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_wait = max_wait
        self.sleep: Sleep = sleep or asyncio.sleep
        self.rng = random.Random(seed)
        self.waits: list[float] = []
        self._api_key = resolve_api_key(base_url)
        self._client: Any = None

    @property
    def openai(self) -> Any:
        """The underlying ``openai.AsyncOpenAI`` (created on first use, inside the event loop)."""
        if self._client is None:
            from openai import AsyncOpenAI

            self._client = AsyncOpenAI(api_key=self._api_key, base_url=self.base_url, max_retries=0, timeout=self.timeout)
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
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
                return await call()
            except openai.APIStatusError as exc:
                status = exc.status_code
                message = _api_message(exc)
                if status not in _RETRYABLE_STATUS and status < 500:
                    raise RequestRejectedError(f"{what}: the endpoint rejected the request with {status}: {message}",
                                               status=status, api_code=_api_code(exc)) from exc
                asked = retry_after_seconds(exc.response.headers, message)
                last, cause = exc, "status"
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
        kind = "rate limited (429)" if status == 429 else (f"status {status}" if status else type(last).__name__)
        raise RetriesExhaustedError(
            f"{what}: {kind} on all {len(waits) + 1} attempts (waited {sum(waits):.1f} s in total): {_api_message(last)}",
            status=status, waits=waits, cause=cause,
        ) from last

    async def complete(self, body: dict[str, Any], *, what: str = "chat completion") -> Completion:
        """POST one chat completion (``body`` as for ``chat.completions.create``) with retries."""

        async def call() -> Completion:
            response = await self.openai.chat.completions.create(**body)
            return completion_from_dict(response.model_dump())

        return await self.with_retries(call, what=what)


def _api_code(exc: BaseException) -> str | None:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("code"), str):
            return err["code"]
    return getattr(exc, "code", None) if isinstance(getattr(exc, "code", None), str) else None


def _api_message(exc: BaseException | None) -> str:
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


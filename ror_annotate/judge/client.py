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

from ..errors import ConfigError, JudgeError

PLACEHOLDER_KEY = "sk-no-key-required"
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
_TRY_AGAIN_RE = re.compile(r"try again in\s+(\d+(?:\.\d+)?)\s*(ms|s|sec|seconds?)?", re.IGNORECASE)
_RETRYABLE_STATUS = {408, 409, 429}


class RetriesExhaustedError(JudgeError):
    """A request kept failing with retryable errors (429, 5xx, timeouts) for ``max_attempts`` calls."""

    code = "E501"

    def __init__(self, message: str, *, status: int | None = None, waits: list[float] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.waits = list(waits or [])


class RequestRejectedError(JudgeError):
    """The endpoint refused the request with a non-retryable status (400, 401, 403, 404, 422)."""

    code = "E502"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class TruncatedOutputError(JudgeError):
    """The answer was cut at the output-token limit (``finish_reason == "length"``)."""

    code = "E503"


class ResponseParseError(JudgeError):
    """The answer is not JSON of the expected shape."""

    code = "E504"


class RefusalError(JudgeError):
    """The model refused to answer (``message.refusal`` set, or ``finish_reason == "content_filter"``)."""

    code = "E505"


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
    return Completion(
        content=message.get("content"),
        finish_reason=choice.get("finish_reason"),
        refusal=message.get("refusal"),
        input_tokens=int(usage.get("prompt_tokens") or 0),
        cached_input_tokens=int(details.get("cached_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        raw=body,
    )


def parse_answer(completion: Completion) -> dict[str, Any]:
    """The JSON object in a completion, refusing truncated and refused answers.

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
    try:
        data = json.loads(completion.content)
    except json.JSONDecodeError as exc:
        raise ResponseParseError(f"answer is not valid JSON ({exc.msg} at char {exc.pos})") from exc
    if not isinstance(data, dict):
        raise ResponseParseError(f"answer is JSON but not an object: {completion.content[:80]!r}")
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
        for attempt in range(self.max_attempts):
            try:
                return await call()
            except openai.APIStatusError as exc:
                status = exc.status_code
                message = _api_message(exc)
                if status not in _RETRYABLE_STATUS and status < 500:
                    raise RequestRejectedError(f"{what}: the endpoint rejected the request with {status}: {message}", status=status) from exc
                asked = retry_after_seconds(exc.response.headers, message)
                last = exc
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                asked, last, status = None, exc, None
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
            status=status, waits=waits,
        ) from last

    async def complete(self, body: dict[str, Any], *, what: str = "chat completion") -> Completion:
        """POST one chat completion (``body`` as for ``chat.completions.create``) with retries."""

        async def call() -> Completion:
            response = await self.openai.chat.completions.create(**body)
            return completion_from_dict(response.model_dump())

        return await self.with_retries(call, what=what)


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


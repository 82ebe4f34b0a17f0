"""The judge's chat-completion POSTs to a plain-``http://`` endpoint through ``aiohttp``.

A local or on-premises OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp) answers in
milliseconds, so the client's own CPU per request sets the labelling rate. Through the ``openai``
client a request cost about 1.5 ms of CPU in its request building, auth and retry layers and the
``httpx``/``httpcore`` stack (whose pool looks at every connection on each request): half of the
judge's CPU per request (``benchmarks/bench_judge.py --throughput``). ``aiohttp`` (a well-kept
asyncio HTTP client with a C response parser and a connection pool) sends the prebuilt body bytes
and reads the answer for a fraction of that.

It is used only where it changes nothing but speed (:func:`fast_path_url`): ``http`` URLs without
credentials, query or fragment, and no proxy configured for the host. ``https`` endpoints (the
OpenAI API and hosted providers, whose latency dwarfs the client's CPU), URLs with
``user:password@`` (sent as Basic auth by ``httpx``) and proxied hosts keep the ``openai`` client.
Errors keep their classes: :class:`~.client.ChatClient` maps a timeout, a refused, reset or broken
connection and a status outside 2xx to the ``openai`` exceptions its retry policy already handles.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["MAX_RESPONSE_BYTES", "PlainHttpPoster", "RawResponse", "ResponseTooLargeError", "fast_path_url", "too_large"]

#: Largest answer read, in bytes (after decompression). A chat completion is a few kB to a few MB
#: (``max_tokens`` times a few bytes per token); an endpoint that sends more (a misrouted download, a
#: hostile server) is cut off there instead of being read into memory whole (a 400 MB answer took
#: 2.4 GB of memory through the ``openai`` client). Both paths of :class:`~.client.ChatClient` apply it.
MAX_RESPONSE_BYTES = 64 * 2**20


class ResponseTooLargeError(Exception):
    """An answer over :data:`MAX_RESPONSE_BYTES` (the client retries it as a transport fault)."""


def too_large(limit: int) -> ResponseTooLargeError:
    """The :class:`ResponseTooLargeError` for a body over ``limit`` bytes."""
    return ResponseTooLargeError(
        f"the endpoint's answer is larger than {limit / 2**20:g} MiB, far beyond any chat completion; "
        "check --base-url (it answers with something else than the chat-completions API)"
    )


@dataclass
class RawResponse:
    """One HTTP answer: ``status``, ``headers`` (names in lower case, repeated ones joined by ``", "``), body ``text``."""

    status: int
    headers: dict[str, str]
    text: str


def fast_path_url(base_url: str | None) -> str | None:
    """The chat-completions URL when ``base_url`` may use :class:`PlainHttpPoster`, else ``None``.

    Only ``http`` URLs without ``user:password@``, query or fragment, whose host has no proxy in the
    environment (``http_proxy``/``all_proxy`` unless ``no_proxy`` lists the host; read with
    :func:`urllib.request.getproxies` and :func:`urllib.request.proxy_bypass`): everything else goes
    through the ``openai`` client.
    """
    if not base_url:
        return None
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError:
        return None
    host = parts.hostname
    if parts.scheme != "http" or not host or parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        return None
    proxies = urllib.request.getproxies()
    if (proxies.get("http") or proxies.get("all")) and not urllib.request.proxy_bypass(host):
        return None
    return f"http://{parts.netloc}{parts.path.rstrip('/')}/chat/completions"


class PlainHttpPoster:
    """POSTs JSON bodies to one URL over an ``aiohttp`` pool of kept-alive connections.

    Parameters
    ----------
    url : str
        The chat-completions URL (:func:`fast_path_url`).
    headers : mapping of str to str
        Sent with every request (authorization, content type, user agent).
    connections : int
        Most connections open at once, all kept alive between requests; a request beyond them waits.
    timeout : float
        Seconds for the whole call (connect, send, answer).

    Notes
    -----
    Created and used inside one running event loop (the session binds to it). Exceptions are
    ``aiohttp``'s: ``asyncio.TimeoutError`` for the timeout, ``aiohttp.ClientError`` subclasses for
    a refused, reset or broken connection and an unreadable answer.
    """

    def __init__(self, url: str, headers: Mapping[str, str], *, connections: int, timeout: float) -> None:
        import aiohttp

        self.url = url
        self.headers = dict(headers)
        # trust_env=False: a proxied host never gets here (fast_path_url); limit_per_host=0: the one host
        # may use every connection. auto_decompress (the default) reads gzip/deflate answers.
        self._session: Any = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max(connections, 1), limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=timeout), trust_env=False,
        )

    async def post(self, body: bytes) -> RawResponse:
        """POST ``body`` and return the answer, whatever its status.

        Raises
        ------
        ResponseTooLargeError
            The answer is over :data:`MAX_RESPONSE_BYTES` (read no further).
        """
        limit = MAX_RESPONSE_BYTES
        async with self._session.post(self.url, data=body, headers=self.headers) as response:
            if response.content_length is not None and response.content_length > limit:
                raise too_large(limit)
            data = bytearray()
            async for chunk in response.content.iter_chunked(2**16):
                data += chunk
                if len(data) > limit:
                    raise too_large(limit)
            try:
                text = data.decode(response.charset or "utf-8", errors="replace")
            except LookupError:  # a charset Python does not know
                text = data.decode("utf-8", errors="replace")
            headers = {k.lower(): v for k, v in response.headers.items()}
            return RawResponse(response.status, headers, text)

    async def aclose(self) -> None:
        """Close the pool."""
        await self._session.close()

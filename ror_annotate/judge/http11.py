"""A small HTTP/1.1 client for the judge's chat-completion POSTs to a plain-``http://`` endpoint.

A local or on-premises OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp) answers in
milliseconds, so the client's own CPU per request sets the labelling rate. Through the ``openai``
client a request cost about 1.5 ms of CPU in its request building, auth and retry layers and the
``httpx``/``httpcore`` stack (whose pool looks at every connection on each request): half of the
judge's CPU per request (``benchmarks/bench_judge.py --throughput``). This client sends the
prebuilt body bytes over a pool of kept-alive connections with ``asyncio`` streams and reads the
answer: status line, headers, a body delimited by ``Content-Length``, ``chunked`` transfer coding
or the end of the connection (gzip and deflate bodies are decoded, although it asks for none).

It is used only where it changes nothing but speed (:func:`fast_path_url`): ``http`` URLs without
credentials, query or fragment, and no proxy configured for the host. ``https`` endpoints (the
OpenAI API and hosted providers, whose latency dwarfs the client), URLs with ``user:password@``
(sent as Basic auth by ``httpx``) and proxied hosts keep the ``openai`` client. Errors keep their
classes: the caller (:class:`~.client.ChatClient`) maps a timeout, a refused or reset connection and
a status >= 300 to the ``openai`` exceptions its retry policy already handles.
"""

from __future__ import annotations

import asyncio
import urllib.request
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Http11Pool", "ProtocolError", "RawResponse", "fast_path_url"]

#: Longest response head (status line and headers) accepted, in bytes.
MAX_HEAD_BYTES = 65_536


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.1 this client can read (bad status line, head too long, bad chunk)."""


@dataclass
class RawResponse:
    """One HTTP answer: ``status``, ``headers`` (names in lower case, repeated ones joined by ``", "``), ``body`` bytes."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        """The body decoded with the charset of its ``content-type`` (UTF-8 when none; undecodable bytes replaced)."""
        charset = "utf-8"
        for part in self.headers.get("content-type", "").split(";")[1:]:
            name, _, value = part.strip().partition("=")
            if name.lower() == "charset" and value:
                charset = value.strip('"')
        try:
            return self.body.decode(charset, errors="replace")
        except LookupError:
            return self.body.decode("utf-8", errors="replace")


def fast_path_url(base_url: str | None) -> tuple[str, int, str, str] | None:
    """``(host, port, Host header, path prefix)`` when ``base_url`` may use :class:`Http11Pool`, else ``None``.

    Only ``http`` URLs without ``user:password@``, query or fragment, whose host has no proxy in the
    environment (``http_proxy``/``all_proxy`` unless ``no_proxy`` lists the host; read with
    :func:`urllib.request.getproxies`): everything else goes through the ``openai`` client.
    """
    if not base_url:
        return None
    try:
        parts = urlsplit(base_url)
        port = parts.port or 80
    except ValueError:
        return None
    host = parts.hostname
    if parts.scheme != "http" or not host or parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        return None
    proxies = urllib.request.getproxies()
    if (proxies.get("http") or proxies.get("all")) and not urllib.request.proxy_bypass(host):
        return None
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return host, port, netloc, parts.path.rstrip("/")


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        try:
            self.writer.close()
        except (OSError, RuntimeError):  # pragma: no cover - an already broken transport or a closed loop
            pass


class Http11Pool:
    """Kept-alive HTTP/1.1 connections to one ``http://`` endpoint; POSTs a body and reads the answer.

    Parameters
    ----------
    host, port : str, int
        Where to connect (from :func:`fast_path_url`).
    host_header : str
        The ``Host`` header (``host[:port]`` as written in the URL).
    headers : mapping of str to str
        Sent with every request (authorization, content type, user agent); ``Host``,
        ``Content-Length`` and ``Accept-Encoding: identity`` are added.
    connections : int
        Most connections open at once, all kept alive between requests; a request beyond them waits.

    Notes
    -----
    Use from one event loop. A connection is reused only after a complete answer that did not ask
    to close it; one whose request failed or was cancelled is closed.
    """

    def __init__(self, host: str, port: int, host_header: str, headers: Mapping[str, str], *, connections: int) -> None:
        self.host, self.port = host, port
        fixed = {k.lower(): v for k, v in headers.items() if k.lower() not in ("host", "content-length", "accept-encoding")}
        lines = [f"Host: {host_header}", *(f"{k}: {v}" for k, v in fixed.items()), "Accept-Encoding: identity", "Connection: keep-alive"]
        self._head_lines = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max(connections, 1))
        self.opened = 0

    async def post(self, path: str, body: bytes) -> RawResponse:
        """POST ``body`` to ``path`` and return the answer (any status).

        Raises
        ------
        OSError
            Connection refused, reset or broken (``ConnectionError`` and other socket errors).
        asyncio.IncompleteReadError
            The server closed the connection before a complete answer.
        ProtocolError
            An answer this client cannot read.
        """
        head = b"POST " + path.encode("ascii") + b" HTTP/1.1\r\n" + self._head_lines + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        async with self._slots:
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if candidate.usable():
                    conn = candidate
                    break
                candidate.close()
            if conn is None:
                reader, writer = await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD_BYTES)
                conn = _Connection(reader, writer)
                self.opened += 1
            keep = False
            try:
                conn.writer.write(head + body)
                await conn.writer.drain()
                response, keep = await _read_response(conn.reader)
            finally:
                if keep:
                    self._idle.append(conn)
                else:
                    conn.close()
        return response

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[RawResponse, bool]:
    """``(response, keep the connection)``: one answer read from ``reader`` (interim 1xx answers skipped)."""
    while True:
        try:
            raw_head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as exc:
            raise ProtocolError(f"response head longer than {MAX_HEAD_BYTES} bytes") from exc
        lines = raw_head[:-4].decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/") or not status_line[1].isdigit():
            raise ProtocolError(f"not an HTTP status line: {lines[0][:80]!r}")
        status = int(status_line[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                continue
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        if 100 <= status < 200 and status != 101:
            continue
        break
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection and (status_line[0] != "HTTP/1.0" or "keep-alive" in connection)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"].split(",")[0])
        except ValueError as exc:
            raise ProtocolError(f"bad content-length {headers['content-length']!r}") from exc
        body = await reader.readexactly(length)
    elif status in (204, 304):
        body = b""
    else:  # delimited by the end of the connection
        body = await reader.read()
        keep = False
    encoding = headers.get("content-encoding", "").lower().strip()
    if encoding in ("gzip", "x-gzip", "deflate") and body:
        try:
            body = zlib.decompress(body, 47) if encoding != "deflate" else _inflate(body)
        except zlib.error as exc:
            raise ProtocolError(f"cannot decode the {encoding} body: {exc}") from exc
    return RawResponse(status, headers, body), keep


def _inflate(body: bytes) -> bytes:
    try:
        return zlib.decompress(body)
    except zlib.error:
        return zlib.decompress(body, -15)  # raw deflate, as some servers send it


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise ProtocolError(f"bad chunk size line {line[:40]!r}") from exc
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise ProtocolError("chunk not followed by CRLF")

"""The judge's small HTTP/1.1 client (ror_annotate.judge.http11) and its place in ChatClient.

Expected values come from the HTTP/1.1 specification (RFC 9112: Content-Length, chunked transfer
coding, connection close, interim 1xx answers) and from the ``openai`` client's own path
(``fast_http=False``) answering the same scripted faults.
"""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from ror_annotate.errors import RequestRejectedError, RetriesExhaustedError
from ror_annotate.judge.client import ChatClient
from ror_annotate.judge.http11 import Http11Pool, ProtocolError, fast_path_url
from tests.openai_server import FakeOpenAI


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def _raw_server(replies: list[bytes], seen: list[bytes], *, close_after: set[int] = frozenset()):  # type: ignore[assignment]
    """A server answering the n-th request (over all connections) with ``replies[n]``; closes the
    connection after the requests numbered in ``close_after``. Records each request's head and body."""
    count = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
                seen.append(head + await reader.readexactly(length))
                n = count
                count += 1
                writer.write(replies[n])
                await writer.drain()
                if n in close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _post_all(replies: list[bytes], n: int, *, close_after: set[int] = frozenset()) -> tuple[list, list[bytes], int]:  # type: ignore[assignment]
    seen: list[bytes] = []

    async def go():
        server = await _raw_server(replies, seen, close_after=close_after)
        port = server.sockets[0].getsockname()[1]
        pool = Http11Pool("127.0.0.1", port, f"127.0.0.1:{port}", {"Authorization": "Bearer k"}, connections=2)
        out = []
        try:
            for _ in range(n):
                out.append(await pool.post("/v1/chat/completions", b'{"a": 1}'))
                await asyncio.sleep(0.01)  # a closed connection is seen as closed before the next request
        finally:
            await pool.aclose()
            server.close()
        return out, pool.opened

    out, opened = asyncio.run(go())
    return out, seen, opened


def _ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_keep_alive_reuses_one_connection_and_sends_the_headers():
    out, seen, opened = _post_all([_ok(b'{"x": 1}'), _ok(b'{"x": 2}'), _ok(b'{"x": 3}')], 3)
    assert [r.body for r in out] == [b'{"x": 1}', b'{"x": 2}', b'{"x": 3}'] and opened == 1
    head = seen[0].split(b"\r\n\r\n")[0].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    lines = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in head.split("\r\n")[1:]}
    assert lines["authorization"] == "Bearer k" and lines["content-length"] == "8" and lines["host"].startswith("127.0.0.1:")
    assert seen[0].endswith(b'{"a": 1}')


def test_chunked_gzip_interim_and_close_delimited_bodies():
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"x\"\r\n5;ext=1\r\n: 12}\r\n0\r\nx-trailer: t\r\n\r\n"
    zipped = gzip.compress(b'{"z": true}')
    gz = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: " + str(len(zipped)).encode() + b"\r\n\r\n" + zipped
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b"{}")
    until_close = b"HTTP/1.1 200 OK\r\ncontent-type: application/json; charset=latin-1\r\n\r\n\"caf\xe9\""
    out, _, opened = _post_all([chunked, gz, interim, until_close], 4, close_after={3})
    assert out[0].body == b'{"x": 12}' and out[1].body == b'{"z": true}' and out[2].status == 200 and out[2].body == b"{}"
    assert out[3].text == '"café"' and opened == 1


def test_connection_close_answer_opens_a_new_connection():
    out, _, opened = _post_all([_ok(b"{}", "connection: close\r\n"), _ok(b"{}")], 2, close_after={0})
    assert [r.status for r in out] == [200, 200] and opened == 2


def test_a_server_that_closes_mid_answer_and_a_bad_status_line():
    with pytest.raises(asyncio.IncompleteReadError):
        _post_all([b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{\"cut"], 1, close_after={0})
    with pytest.raises(ProtocolError, match="not an HTTP status line"):
        _post_all([b"SSH-2.0-OpenSSH\r\n\r\n"], 1)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000/v1", ("127.0.0.1", 8000, "127.0.0.1:8000", "/v1")),
        ("http://gpu-box/v1/", ("gpu-box", 80, "gpu-box", "/v1")),
        ("http://[::1]:9/v1", ("::1", 9, "[::1]:9", "/v1")),
        ("https://api.openai.com/v1", None),
        ("http://user:pw@127.0.0.1:8000/v1", None),
        ("http://127.0.0.1:8000/v1?api-version=1", None),
        (None, None),
    ],
)
def test_fast_path_only_for_plain_http(url, expected, monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert fast_path_url(url) == expected


def test_a_proxied_host_keeps_the_openai_client(monkeypatch):
    for name in ("HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", "http://proxy.lab:3128")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    assert fast_path_url("http://gpu-box:8000/v1") is None
    assert fast_path_url("http://127.0.0.1:8000/v1") is not None


_PROMPT = "<problem>\np\n</problem>\n\n<trace>\n«0» Let me compute 2+2.\n</trace>\n\nLabel exactly these segment ids (1): 0"

# Both paths answer the same scripted faults the same way (the openai path is fast_http=False).
_FAULTS = [
    [{"status": 429, "headers": {"retry-after": "3"}, "body": {"error": {"message": "slow down"}}}, {}],
    [{"status": 503, "body": {"error": {"message": "overloaded"}}}, {"raw": "<html><title>Login</title></html>"}, {}],
    [{"kind": "reset"}, {}],
]


@pytest.mark.parametrize("faults", _FAULTS, ids=["429-retry-after", "503-then-html", "reset"])
def test_fast_and_openai_paths_retry_the_same_way(faults):
    results = {}
    for fast in (True, False):
        sleeps = Sleeps()

        async def go(url, fast=fast, sleeps=sleeps):
            client = ChatClient(url, max_attempts=4, sleep=sleeps, seed=0, fast_http=fast, connections=2)
            assert (client._fast_target is not None) is fast
            try:
                return await client.complete({"model": "m", "messages": [{"role": "user", "content": _PROMPT}]})
            finally:
                await client.aclose()

        with FakeOpenAI() as srv:
            srv.push(*faults)
            completion = asyncio.run(go(srv.base_url))
            calls = len(srv.chat_requests())
        results[fast] = (calls, sleeps.waits, json.loads(completion.content or "null")["labels"][0]["segment_id"], completion.finish_reason)
    assert results[True] == results[False]
    assert results[True][0] == len(faults) and results[True][2] == 0


def test_fast_path_rejection_keeps_the_api_message_and_status():
    async def go(url):
        client = ChatClient(url, max_attempts=2, sleep=Sleeps(), connections=1)
        try:
            return await client.complete({"model": "m", "messages": []})
        finally:
            await client.aclose()

    with FakeOpenAI() as srv:
        srv.push({"status": 400, "body": {"error": {"message": "Invalid schema for response_format", "code": "bad_schema"}}})
        with pytest.raises(RequestRejectedError) as info:
            asyncio.run(go(srv.base_url))
    assert info.value.status == 400 and "Invalid schema for response_format" in info.value.message and info.value.api_code == "bad_schema"


def test_fast_path_timeout_and_refused_connection_are_transport_failures():
    async def go(url, timeout):
        client = ChatClient(url, max_attempts=2, sleep=Sleeps(), connections=1, timeout=timeout)
        try:
            return await client.complete({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        finally:
            await client.aclose()

    with FakeOpenAI(latency=0.5) as srv:
        with pytest.raises(RetriesExhaustedError) as info:
            asyncio.run(go(srv.base_url, 0.1))
    assert info.value.cause == "timeout" and "APITimeoutError" in info.value.message
    with pytest.raises(RetriesExhaustedError) as info:
        asyncio.run(go("http://127.0.0.1:9/v1", 5))
    assert info.value.cause == "connection"

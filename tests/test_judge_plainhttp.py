"""The judge's plain-http path (ror_annotate.judge.plainhttp, aiohttp) and its place in ChatClient.

Expected values come from the ``openai`` client's own path (``fast_http=False``) answering the same
scripted faults, and from the rule of which URLs may take the path (no credentials, query or proxy).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ror_annotate.errors import RequestRejectedError, RetriesExhaustedError
from ror_annotate.judge.client import ChatClient
from ror_annotate.judge.plainhttp import fast_path_url
from tests.openai_server import FakeOpenAI


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/chat/completions"),
        ("http://gpu-box/v1/", "http://gpu-box/v1/chat/completions"),
        ("http://[::1]:9/v1", "http://[::1]:9/v1/chat/completions"),
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
            return await client.complete({"model": "m", "messages": [{"role": "user", "content": _PROMPT}]})
        finally:
            await client.aclose()

    with FakeOpenAI(latency=0.5) as srv:
        with pytest.raises(RetriesExhaustedError) as info:
            asyncio.run(go(srv.base_url, 0.1))
    assert info.value.cause == "timeout" and "APITimeoutError" in info.value.message
    with pytest.raises(RetriesExhaustedError) as info:
        asyncio.run(go("http://127.0.0.1:9/v1", 5))
    assert info.value.cause == "connection"


def test_plain_http_reads_chunked_gzip_answers_and_keeps_one_connection_alive(monkeypatch):
    """A raw HTTP/1.1 server (RFC 9112): a gzip body in chunked transfer coding, then a plain one,
    over one kept-alive connection; the request carries the bearer key."""
    import gzip

    monkeypatch.setenv("OPENAI_API_KEY", "sk-plain-http-test")
    answer = json.dumps({"choices": [{"message": {"content": '{"labels": []}'}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 2}}).encode()
    zipped = gzip.compress(answer)
    chunked = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
               + f"{len(zipped[:10]):x}\r\n".encode() + zipped[:10] + b"\r\n" + f"{len(zipped[10:]):x}\r\n".encode() + zipped[10:]
               + b"\r\n0\r\n\r\n")
    plain = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " + str(len(answer)).encode() + b"\r\n\r\n" + answer
    heads: list[bytes] = []
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            for reply in (chunked, plain):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
                await reader.readexactly(length)
                heads.append(head)
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        client = ChatClient(url, max_attempts=1, sleep=Sleeps(), connections=4)
        try:
            return [await client.complete({"model": "m", "messages": []}) for _ in range(2)]
        finally:
            await client.aclose()
            server.close()

    got = asyncio.run(go())
    assert [c.content for c in got] == ['{"labels": []}'] * 2 and [c.input_tokens for c in got] == [5, 5]
    assert connections == 1 and len(heads) == 2
    assert all(b"authorization: bearer sk-plain-http-test" in h.lower() for h in heads)
    assert all(h.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") for h in heads)


# ---------------------------------------------------------------------------------------- the prompt's JSON, encoded once per trace
@pytest.mark.parametrize("suffix", ["\nLabel exactly these segment ids (2): 3, 4", '"quoted" \\ back\tslash', "«7» naïve ∑ 😀 \x01\x1f", ""])
def test_messages_json_equals_json_dumps_and_its_sha256(suffix):
    import hashlib

    from ror_annotate.judge.prompt import MessagesJson

    system = 'You label "segments".\nCodebook: ∑ «i» \\d'
    block = '<problem>\nx = "1"\n</problem>\n\n<trace>\n«0» Let\'s see 😀\t\x02 tab\n</trace>\n'
    messages = [{"role": "system", "content": system}, {"role": "user", "content": block + suffix}]
    reference = json.dumps(messages, ensure_ascii=False).encode("utf-8")  # the reference: the standard library
    got = MessagesJson(system, block).encode(messages)
    assert got == (reference, hashlib.sha256(reference).hexdigest())
    assert MessagesJson(system, block + "x").encode(messages) is None  # not a prefix (a windowed request)
    assert MessagesJson(system + "x", block).encode(messages) is None


def test_the_cache_key_and_body_of_a_request_do_not_change(tmp_path):
    """The key with the per-trace hash equals the key computed from the whole messages (stored answers
    stay reachable), and the body bytes parse to the request body."""
    from ror_annotate.judge import make_judge
    from ror_annotate.judge.llm import _body_bytes
    from ror_annotate.judge.prompt import MessagesJson
    from ror_annotate.records import Segment, Trace

    text = "First I plan. Then I compute 2+2=4. Wait, check it."
    starts = [0, 14, 36]
    ends = [13, 35, len(text)]
    trace = Trace(trace_id="t", text=text, problem='What is "2+2"?')
    segments = [Segment(trace_id="t", segment_index=i, char_start=a, char_end=b, text=text[a:b], n_tokens=4) for i, (a, b) in enumerate(zip(starts, ends))]
    judge = make_judge("openai:m", base_url="http://127.0.0.1:9/v1", chunk_size=2)
    block = judge.render_trace_block(None, trace, segments)  # type: ignore[arg-type]
    kinds = []
    for ids, context in (([0, 1], 128_000), ([2], 128_000), ([1], 2_300)):
        judge.context_tokens = context
        messages, windowed = judge.render_messages(trace, segments, ids, max_tokens=200, block=block, retry_problem=None if ids != [2] else "it was not JSON")
        encoded = MessagesJson(judge.system_prompt, block).encode(messages)
        params = judge.params(1, 200)
        kinds.append(windowed)
        if windowed:
            assert encoded is None
            continue
        assert encoded is not None
        assert judge.cache_key(trace, ids, params, 1, messages, prompt_sha=encoded[1]) == judge.cache_key(trace, ids, params, 1, messages)
        body = judge.request_body(messages, 1, 200)
        assert json.loads(_body_bytes(body, messages, encoded[0])) == body
        # byte for byte what json.dumps makes of the body with its messages first, with the
        # response format's stored encoding as without it
        rest = {k: v for k, v in body.items() if k != "messages"}
        reference = json.dumps({"messages": messages, **rest}, ensure_ascii=False).encode("utf-8")
        assert _body_bytes(body, messages, encoded[0], judge._known_json()) == reference
        assert _body_bytes(body, messages, encoded[0]) == reference
    assert kinds == [False, False, True]


def test_the_body_bytes_match_json_dumps_for_any_parameters():
    """Non-ASCII model names, seeds, floats, nested values and an empty rest, with and without the
    stored encodings: the bytes are json.dumps's."""
    from ror_annotate.judge.llm import _body_bytes, _KnownJson

    schema = {"type": "json_schema", "json_schema": {"name": "labels", "schema": {"enum": ["é", "計画"]}, "strict": True}}
    messages = [{"role": "system", "content": "Sÿstem ✓"}, {"role": "user", "content": "«0» x \"y\"\n"}]
    messages_json = json.dumps(messages, ensure_ascii=False).encode("utf-8")
    bodies = [
        {"model": "modèle/計画", "messages": messages, "temperature": 0.7, "max_tokens": 1632, "response_format": schema, "seed": 2**40},
        {"messages": messages},
        {"messages": messages, "temperature": 1e-7, "top_p": float("inf"), "stop": ["\u2028", None], "logit_bias": {"12": -100}},
    ]
    # values that compare and hash alike but encode apart, sent through one encoder (its cache) in turn
    alike = [{"messages": messages, "temperature": 0.0}, {"messages": messages, "temperature": -0.0},
             {"messages": messages, "seed": 1}, {"messages": messages, "seed": True}, {"messages": messages, "seed": 1.0},
             {"messages": messages, "max_tokens": 9, "model": "m"}, {"messages": messages, "model": "m", "max_tokens": 9},
             {"messages": messages, "response_format": {"type": "json_schema"}}, {"messages": messages, "response_format": schema}]
    shared = _KnownJson(schema)
    for body in bodies + alike + bodies + alike:
        reference = json.dumps({"messages": messages, **{k: v for k, v in body.items() if k != "messages"}}, ensure_ascii=False)
        for known in (None, _KnownJson(schema), _KnownJson({"type": "json_schema"}), shared):
            assert _body_bytes(body, messages, messages_json, known) == reference.encode("utf-8")
    assert _body_bytes({"messages": list(messages)}, messages, messages_json) is None  # other messages


def test_approx_tokens_never_exceeds_the_characters():
    """build_messages skips counting a block no longer than the budget in characters: every token of
    approx_tokens is at least one character (checked on text made of each token class)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ror_annotate.judge.prompt import approx_tokens

    @settings(max_examples=200, deadline=None)
    @given(st.text(alphabet=st.sampled_from(list("ab1 2\n\t.,«»∑😀_-\r")), max_size=200))
    def check(text):
        assert approx_tokens(text) <= len(text)

    check()

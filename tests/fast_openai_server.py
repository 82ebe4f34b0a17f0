"""A fast OpenAI-compatible chat-completions server in its own process, for speed benchmarks.

:class:`~tests.openai_server.FakeOpenAI` (a ``ThreadingHTTPServer`` in the test's own process, one
thread per connection, a simulated prefix cache over the last 32 prompts, the prompt's tokens
counted afresh on every request) shares the interpreter lock with the judge it serves and handles
a few dozen long prompts per second: a benchmark against it measures the server. This server runs
in a child process on one asyncio event loop (a bare HTTP/1.1 keep-alive protocol, no threads), so
``latency`` seconds are slept with ``loop.call_later`` and 256 requests in flight cost nothing.

It answers like ``FakeOpenAI`` with no faults scripted: the labels of :func:`~tests.openai_server.cue_label`
for the requested ids, read back from the prompt (the parsed trace block is kept per block, so a
trace's later requests skip the parse). Usage: ``prompt_tokens`` is the approximate token count
(:func:`~ror_annotate.judge.prompt.approx_tokens`, counted once per distinct system message and
trace block), and ``cached_tokens`` is the trace block's tokens (from 1,024, in 128-token steps)
when the same block was asked before: the provider prefix cache the judge's request order aims at.

    with FastOpenAI(latency=0.2) as srv:      # child process; srv.base_url ends in /v1
        ...
        srv.stats()                           # {"requests": n, "busy_s": seconds spent answering}

``python -m tests.fast_openai_server --port 0 --latency 0.2`` runs it in the foreground and prints
``listening PORT`` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from ror_annotate.judge.prompt import approx_tokens

_REPO = Path(__file__).resolve().parents[1]


class _Answerer:
    """Chat-completion answers, with per-block parse and token caches (bounded)."""

    def __init__(self) -> None:
        from tests.openai_server import _IDS_RE, _MARK_RE, cue_label

        self._ids_re, self._mark_re, self._cue = _IDS_RE, _MARK_RE, cue_label
        self._blocks: dict[str, tuple[dict[int, str], int]] = {}
        self._tokens: dict[str, int] = {}
        self.requests = 0
        self.busy_s = 0.0
        #: Seconds answers went out after their due time (arrival + latency), summed: the server's own
        #: queueing (a busy loop), which a client's figures would otherwise be blamed for.
        self.late_s = 0.0
        #: When each answer went out (``time.perf_counter``, CLOCK_MONOTONIC on Linux: comparable
        #: across processes), for the steady-state rate (:meth:`steady_rate`).
        self.sent_at: list[float] = []
        self._n = 0

    def warm(self, bodies: list[bytes]) -> None:
        """Answer ``bodies`` before serving and forget them (counters, answer times): every trace block
        in them is parsed and counted already when the measured run starts. A server on other
        hardware costs the client's cores nothing; this one shares them, and its per-block work
        (reading back the segments, their cue labels, the block's token count: about half of its CPU
        per request) would be charged to the client."""
        for body in bodies:
            self.answer(body)
        self.requests, self.busy_s, self.late_s, self._n = 0, 0.0, 0.0, 0
        self.sent_at.clear()

    def steady_rate(self) -> float | None:
        """Answers per second over the middle 80% of the answers (by the time they went out): the rate
        of the steady state, without the run's ramp-up and drain; ``None`` under 20 answers."""
        times = sorted(self.sent_at)
        n = len(times)
        if n < 20:
            return None
        lo, hi = times[n // 10], times[n - 1 - n // 10]
        return (n - 1 - 2 * (n // 10)) / (hi - lo) if hi > lo else None

    def _block(self, block: str) -> tuple[dict[int, str], int, bool]:
        hit = self._blocks.get(block)
        if hit is not None:
            return hit[0], hit[1], True
        trace = block.split("<trace>\n", 1)[1].rsplit("\n</trace>", 1)[0] if "<trace>\n" in block else ""
        parts = self._mark_re.split(trace)
        segs = {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}
        labels = {i: self._cue(t) for i, t in segs.items()}
        if len(self._blocks) > 4096:
            self._blocks.clear()
        self._blocks[block] = (labels, approx_tokens(block))  # type: ignore[assignment]
        return labels, self._blocks[block][1], False

    def _count(self, text: str) -> int:
        n = self._tokens.get(text)
        if n is None:
            if len(self._tokens) > 64:
                self._tokens.clear()
            n = self._tokens[text] = approx_tokens(text)
        return n

    def answer(self, raw: bytes) -> bytes:
        t0 = time.perf_counter()
        body = json.loads(raw)
        messages = body["messages"]
        user = messages[-1]["content"]
        head, sep, tail = user.rpartition("\n</trace>\n")
        block = head + sep
        labels, block_tokens, seen = self._block(block)
        m = self._ids_re.search(tail)
        ids = [int(x) for x in m.group(1).split(",") if x.strip()] if m else []
        items = [{"segment_id": i, "label": labels.get(i, "execution"), "confidence": 0.9, "rationale": "cue word"} for i in ids]
        content = json.dumps({"labels": items})
        system_tokens = sum(self._count(m["content"]) for m in messages[:-1])
        prompt_tokens = system_tokens + block_tokens + approx_tokens(tail) + 4 * len(messages)
        cached = system_tokens + block_tokens if seen else 0
        cached = 0 if cached < 1024 else (cached // 128) * 128
        self._n += 1
        completion_tokens = len(content) // 4
        reply = {
            "id": f"chatcmpl-{self._n}", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "fake"),
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": content, "refusal": None}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}},
        }
        out = json.dumps(reply).encode("utf-8")
        self.requests += 1
        self.busy_s += time.perf_counter() - t0
        return out


def _response(status: int, data: bytes) -> bytes:
    reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(status, "OK")
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
            "connection: keep-alive\r\n\r\n").encode("ascii") + data


class _Protocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies (what httpx sends); no chunked uploads."""

    def __init__(self, answerer: _Answerer, latency: float) -> None:
        self.answerer, self.latency = answerer, latency
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            request_line = head.split("\r\n", 1)[0].split()
            method, path = (request_line + ["", ""])[:2]
            self._handle(method, path, body)

    def _handle(self, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path == "/stats":
            data = json.dumps({"requests": self.answerer.requests, "busy_s": self.answerer.busy_s, "late_s": self.answerer.late_s,
                               "steady_rate": self.answerer.steady_rate()}).encode()
            return self._write(_response(200, data))
        if method == "POST" and path.endswith("/chat/completions"):
            arrived = time.perf_counter()
            try:
                data = self.answerer.answer(body)
            except (ValueError, KeyError, IndexError) as exc:
                return self._write(_response(400, json.dumps({"error": {"message": str(exc), "type": "invalid_request_error"}}).encode()))
            out = _response(200, data)
            if self.latency > 0:
                asyncio.get_running_loop().call_later(self.latency, self._write_due, out, arrived + self.latency)
            else:
                self._write_due(out, arrived)
            return None
        self._write(_response(404, json.dumps({"error": {"message": f"no route {path}"}}).encode()))
        return None

    def _write_due(self, data: bytes, due: float) -> None:
        now = time.perf_counter()
        self.answerer.late_s += now - due
        self.answerer.sent_at.append(now)
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


async def serve(port: int, latency: float, warm: str | None = None) -> None:
    """Serve on 127.0.0.1:``port`` (0 = any free port) until killed; prints ``listening PORT``. ``warm``:
    a JSON file of request bodies answered first (:meth:`_Answerer.warm`)."""
    answerer = _Answerer()
    if warm:
        answerer.warm([json.dumps(b).encode("utf-8") for b in json.loads(Path(warm).read_text(encoding="utf-8"))])
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Protocol(answerer, latency), "127.0.0.1", port, backlog=1024)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class FastOpenAI:
    """The server in a child process; a context manager with ``base_url`` (ending in ``/v1``).

    Parameters
    ----------
    latency : float
        Seconds between a request's arrival and its answer (slept without blocking the server).
    warm : path, optional
        A JSON file of request bodies the server answers before it listens (the trace blocks in them
        are parsed and counted before the measured run: :meth:`_Answerer.warm`).
    """

    def __init__(self, *, latency: float = 0.0, warm: Path | None = None) -> None:
        self.latency = latency
        self.warm = warm
        self.port: int | None = None
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> "FastOpenAI":
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_REPO), os.environ.get("PYTHONPATH", "")])}
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.fast_openai_server", "--port", "0", "--latency", str(self.latency)]
                                      + (["--warm", str(self.warm)] if self.warm else []),
                                      stdout=subprocess.PIPE, text=True, env=env, cwd=str(_REPO))
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("listening "):
            self._proc.kill()
            raise RuntimeError(f"fast server did not start: {line!r}")
        self.port = int(line.split()[1])
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict[str, Any]:
        """``{"requests": chat completions answered, "busy_s": CPU-bound seconds spent answering,
        "late_s": seconds the answers went out after arrival + latency, summed, "steady_rate": answers
        per second over the middle 80% of the answers or null}``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=10) as r:
            return json.loads(r.read())


def main() -> None:
    ap = argparse.ArgumentParser(description="fast OpenAI-compatible test server")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--warm", help="a JSON file of request bodies to answer before listening")
    args = ap.parse_args()
    asyncio.run(serve(args.port, args.latency, args.warm))


if __name__ == "__main__":
    main()

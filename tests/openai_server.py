"""A local OpenAI-compatible HTTP server for tests and benchmarks (stdlib ``ThreadingHTTPServer``).

Endpoints: ``POST /v1/chat/completions`` (``response_format`` json_schema), ``POST /v1/files``
(multipart upload), ``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches/{id}``.

It labels deterministically from cue words (:func:`cue_label`), reading the segments back out of
the prompt (markers ``«i»``, ids after "Label exactly these segment ids"). Usage: prompt tokens are
counted with :func:`ror_annotate.judge.prompt.approx_tokens`; ``cached_tokens`` simulates a provider
prefix cache (longest common prefix with an earlier prompt, counted only from 1,024 tokens, in steps
of 128 tokens, as OpenAI documents for its prompt caching).

Faults are scripted per chat request, in arrival order: ``server.push(fault, ...)``. A fault is a
dict, one of

* ``{"status": 429, "headers": {...}, "body": {...}}``: reply exactly that (pitfall replays);
  with ``status`` 200 the body is sent as is. ``"raw": "text"`` (with ``"content_type"``) sends
  that text as the body instead (an HTML page, a cut JSON); ``"echo_auth": True`` appends the
  request's ``Authorization`` header to ``body["error"]["message"]`` (proxies that echo it).
* ``{"kind": "reset"}``: the connection is reset (TCP RST) without an answer (a flaky proxy).
* Answer shapes of other providers: ``{"kind": "parts"}`` (``content`` as typed parts, a
  ``thinking`` part then a ``text`` part, Mistral/Magistral-style), ``{"kind": "tool_call"}`` (the
  JSON as ``tool_calls[0].function.arguments`` with ``content: null``).
* ``{"usage": {...}}`` replaces the answer's ``usage`` object (``None`` removes it), e.g. DeepSeek's
  ``prompt_cache_hit_tokens`` or a negative count; ``{"rationale": "..."}`` gives every item that
  rationale. Both combine with the other faults.
* ``{"kind": "truncate"}``: the right answer cut in half, ``finish_reason="length"``.
* ``{"kind": "drop", "n": 1}`` / ``{"kind": "dup"}`` / ``{"kind": "bad_label"}``: omit the last n ids,
  repeat the first id, give the first id the label ``"compute"`` (not in the codebook).
* ``{"kind": "refusal"}``, ``{"kind": "slow", "seconds": s}`` (then answers normally).
* Reasoning-model answer shapes: ``{"kind": "think"}`` (``<think>...</think>`` then the JSON),
  ``{"kind": "think_open"}`` (the same without the opening tag), ``{"kind": "fence"}`` (the JSON in a
  ```json fence), ``{"kind": "reasoning_content"}`` (the reasoning in ``message.reasoning_content``),
  ``{"kind": "prose"}`` (prose around the JSON: unparseable).

Server-wide behaviour (constructor arguments):

* ``style``: the answer shape of every request without a scripted fault (one of the reasoning kinds
  above), or ``"prose_unless_told"``: prose around the JSON unless the prompt carries the judge's
  retry instruction (a temperature-0 model that repeats itself until the request changes).
* ``context_limit``: a request whose prompt tokens plus ``max_tokens`` exceed it gets a 400 as
  OpenAI sends it (``code: context_length_exceeded``) or, with ``context_style="vllm"``, as vLLM
  sends it (no code, "This model's maximum context length is N tokens...").
* ``batch_outcomes``: per created batch, in order, how it ends: ``{"status": "expired", "answered": n}``
  answers the first ``n`` requests into the output file and writes the rest to the error file (code
  ``batch_expired``/``batch_cancelled``; ``failed`` gives them status 500); ``{"status": "failed",
  "validation": "message"}`` fails the whole input with ``errors.data`` and no files. Batches beyond
  the list complete normally. Requests answered with a non-200 status go to the error file.

Every request is recorded in ``server.requests`` (method, path, JSON body; the Authorization
header is kept only as a flag ``has_key`` plus the key itself for placeholder checks).
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import re
import socket
import struct
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ror_annotate.judge.prompt import approx_tokens

_MARK_RE = re.compile(r"«(\d+)» ")
_IDS_RE = re.compile(r"Label exactly these segment ids \(\d+\): ([0-9, ]+)")
RETRY_MARK = "Your previous answer could not be used"
THINK = "Okay, let me look at each marked segment in turn and apply the codebook. {\\frac{1}{2}} is execution."

CUES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("conclusion", re.compile(r"\b(answer is|therefore|boxed)\b", re.I)),
    ("reflection", re.compile(r"\b(wait|hmm|mistake|wrong|checks out)\b", re.I)),
    ("planning", re.compile(r"\b(let me|i'll|i will|next|i need to)\b|\bfirst,", re.I)),
    ("fact", re.compile(r"\b(recall|formula|theorem|is defined as)\b", re.I)),
    ("restatement", re.compile(r"\b(again|so far|the problem says|we have)\b", re.I)),
)


#: Any cue at all: most segments have none, and one scan tells so instead of one per class (a match
#: anywhere of the alternation is a match anywhere of one of its patterns, flags being equal).
_ANY_CUE = re.compile("|".join(f"(?:{pattern.pattern})" for _, pattern in CUES), re.I)


def cue_label(text: str) -> str:
    """The fake judge's rule: the first cue class whose pattern matches, else ``execution``."""
    if not _ANY_CUE.search(text):
        return "execution"
    for label, pattern in CUES:
        if pattern.search(text):
            return label
    return "execution"


def parse_prompt(messages: list[dict[str, Any]]) -> tuple[dict[int, str], list[int]]:
    """Segments ``{id: text}`` and the requested ids, read back from the judge's prompt."""
    user = messages[-1]["content"]
    trace = user.split("<trace>\n", 1)[1].rsplit("\n</trace>", 1)[0]
    parts = _MARK_RE.split(trace)
    segs = {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    m = _IDS_RE.search(user)
    ids = [int(x) for x in m.group(1).split(",") if x.strip()] if m else []
    return segs, ids


class FakeOpenAI:
    """The server. Use as a context manager; ``base_url`` ends in ``/v1``.

    Parameters
    ----------
    latency : float
        Seconds added to every chat completion (benchmarks use 0.05).
    batch_polls : int
        ``GET /v1/batches/{id}`` answers ``in_progress`` this many times before ``completed``.
    """

    def __init__(self, *, latency: float = 0.0, batch_polls: int = 1, record_bodies: bool = True, style: str | None = None,
                 context_limit: int | None = None, context_style: str = "openai",
                 batch_outcomes: list[dict[str, Any]] | None = None) -> None:
        self.latency = latency
        self.style = style
        self.context_limit = context_limit
        self.context_style = context_style
        self.batch_outcomes: deque[dict[str, Any]] = deque(batch_outcomes or [])
        self.batch_polls = batch_polls
        self.record_bodies = record_bodies
        self.requests: list[dict[str, Any]] = []
        self.script: deque[dict[str, Any]] = deque()
        self.files: dict[str, dict[str, Any]] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self._prompts: deque[str] = deque(maxlen=32)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "FakeOpenAI":
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def push(self, *faults: dict[str, Any]) -> None:
        """Queue faults for the next chat requests, in order (``{}`` = answer normally)."""
        self.script.extend(faults)

    def chat_requests(self) -> list[dict[str, Any]]:
        """Recorded ``POST /v1/chat/completions`` request bodies, in arrival order."""
        return [r["body"] for r in self.requests if r["path"] == "/v1/chat/completions"]

    # ------------------------------------------------------------------ logic
    def _next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def _cached_tokens(self, prompt: str) -> int:
        with self._lock:
            best = 0
            for old in self._prompts:
                n = min(len(old), len(prompt))
                if best >= n:
                    continue
                lo = 0
                # longest common prefix by binary search on slices (fast for long prompts)
                hi = n
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if old[:mid] == prompt[:mid]:
                        lo = mid
                    else:
                        hi = mid - 1
                best = max(best, lo)
            self._prompts.append(prompt)
        tokens = approx_tokens(prompt[:best])
        return 0 if tokens < 1024 else (tokens // 128) * 128

    def answer(self, body: dict[str, Any], fault: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        """Status, headers and JSON body for one chat completion request."""
        if "status" in fault:
            body = fault.get("body", {})
            if fault.get("echo_auth") and isinstance(body, dict) and isinstance(body.get("error"), dict):
                body = {**body, "error": {**body["error"], "message": f"{body['error'].get('message', '')} "
                                          f"(request header Authorization: {fault['_auth']})"}}
            return fault["status"], dict(fault.get("headers", {})), body
        kind = fault.get("kind")
        if kind == "slow":
            time.sleep(fault.get("seconds", 1.0))
        if kind == "500":
            return 500, {}, {"error": {"message": "internal error", "type": "server_error"}}
        messages = body["messages"]
        prompt = "\n".join(m["content"] for m in messages)
        prompt_tokens = approx_tokens(prompt) + 4 * len(messages)
        if self.context_limit is not None:
            wanted = prompt_tokens + int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
            if wanted > self.context_limit:
                return 400, {}, self._context_error(prompt_tokens, wanted)
        if not kind and self.style:
            kind = self.style
            if kind == "prose_unless_told":
                kind = None if RETRY_MARK in messages[-1]["content"] else "prose"
        segs, ids = parse_prompt(messages)
        rationale = fault.get("rationale", "cue word")
        items = [{"segment_id": i, "label": cue_label(segs.get(i, "")), "confidence": 0.9, "rationale": rationale} for i in ids]
        if kind == "drop":
            items = items[: max(len(items) - fault.get("n", 1), 0)]
        elif kind == "dup" and items:
            items = [items[0], *items]
        elif kind == "bad_label" and items:
            items[0] = {**items[0], "label": "compute"}
        content: str | None = json.dumps({"labels": items})
        finish, refusal, reasoning = "stop", None, None
        if kind == "truncate":
            content, finish = content[: len(content) // 2], "length"
        elif kind == "refusal":
            content, refusal = None, "I can't help with that."
        elif kind == "think":
            content = f"<think>\n{THINK}\n</think>\n\n{content}"
        elif kind == "think_open":
            content = f"{THINK}\n</think>\n\n{content}"
        elif kind == "fence":
            content = f"```json\n{content}\n```"
        elif kind == "reasoning_content":
            reasoning = THINK
        elif kind == "prose":
            content = f"Sure! Here are the labels:\n{content}\nLet me know if you need more."
        completion_tokens = approx_tokens((content or refusal or "") + (reasoning or ""))
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
        if kind == "parts":
            message["content"] = [{"type": "thinking", "thinking": [{"type": "text", "text": THINK}]},
                                  {"type": "text", "text": content}]
        elif kind == "tool_call":
            message["content"] = None
            message["tool_calls"] = [{"id": "call_1", "type": "function",
                                      "function": {"name": "LabelBatch", "arguments": content}}]
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        reply = {
            "id": self._next_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "finish_reason": finish, "logprobs": None, "message": message}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens,
                      "prompt_tokens_details": {"cached_tokens": self._cached_tokens(prompt)}},
        }
        if "usage" in fault:
            if fault["usage"] is None:
                del reply["usage"]
            else:
                reply["usage"] = fault["usage"]
        return 200, {}, reply

    def _context_error(self, prompt_tokens: int, wanted: int) -> dict[str, Any]:
        message = (f"This model's maximum context length is {self.context_limit} tokens. However, you requested {wanted} tokens "
                   f"({prompt_tokens} in the messages, {wanted - prompt_tokens} in the completion). "
                   "Please reduce the length of the messages or completion.")
        if self.context_style == "vllm":
            return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
        return {"error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}

    def _write_file(self, rows: list[dict[str, Any]], name: str) -> str | None:
        if not rows:
            return None
        fid = self._next_id("file")
        data = "".join(json.dumps(o) + "\n" for o in rows).encode("utf-8")
        self.files[fid] = {"id": fid, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                           "filename": name, "purpose": "batch_output", "status": "processed", "content": data}
        return fid

    def _run_batch(self, batch: dict[str, Any]) -> None:
        lines = self.files[batch["input_file_id"]]["content"].decode("utf-8").splitlines()
        end = batch.get("_outcome") or {"status": "completed"}
        status_end = end["status"]
        if end.get("validation"):
            batch.update(status="failed", failed_at=int(time.time()), output_file_id=None, error_file_id=None,
                         errors={"object": "list", "data": [{"code": "invalid_request", "message": end["validation"], "line": 1, "param": None}]},
                         request_counts={"total": len(lines), "completed": 0, "failed": 0})
            return
        answered = len(lines) if status_end == "completed" else end.get("answered", 0)
        out, err = [], []
        for n, line in enumerate(lines):
            req = json.loads(line)
            rid = self._next_id("batch_req")
            if n >= answered:
                if status_end == "failed":
                    err.append({"id": rid, "custom_id": req["custom_id"], "response": {"status_code": 500, "request_id": self._next_id("req"),
                                "body": {"error": {"message": "internal error", "type": "server_error", "code": "server_error"}}}, "error": None})
                else:
                    code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}[status_end]
                    err.append({"id": rid, "custom_id": req["custom_id"], "response": None,
                                "error": {"code": code, "message": f"This request could not be executed: the batch was {status_end}."}})
                continue
            status, _, body = self.answer(req["body"], {})
            row = {"id": rid, "custom_id": req["custom_id"],
                   "response": {"status_code": status, "request_id": self._next_id("req"), "body": body}, "error": None}
            (out if status == 200 else err).append(row)
        batch.update(status=status_end, output_file_id=self._write_file(out, "output.jsonl"),
                     error_file_id=self._write_file(err, "errors.jsonl"), completed_at=int(time.time()),
                     request_counts={"total": len(lines), "completed": len(out), "failed": len(err)})


_TERMINAL = {"completed", "failed", "expired", "cancelled"}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAI
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None, *, raw: bytes | None = None) -> None:
        data = raw if raw is not None else json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout, an interrupt)
            self.close_connection = True

    def _record(self, body: Any) -> None:
        auth = self.headers.get("Authorization", "")
        with self.fake._lock:
            self.fake.requests.append({"method": self.command, "path": self.path,
                                       "body": body if self.fake.record_bodies or self.path != "/v1/chat/completions" else None,
                                       "api_key": auth.removeprefix("Bearer ")})

    def do_GET(self) -> None:  # noqa: N802
        fake = self.fake
        self._record(None)
        m = re.fullmatch(r"/v1/batches/([\w-]+)", self.path)
        if m and m.group(1) in fake.batches:
            batch = fake.batches[m.group(1)]
            batch["_polls"] += 1
            if batch["status"] not in _TERMINAL and batch["_polls"] > fake.batch_polls:
                fake._run_batch(batch)
            elif batch["status"] not in _TERMINAL:
                batch["status"] = "in_progress"
            return self._send(200, {k: v for k, v in batch.items() if not k.startswith("_")})
        m = re.fullmatch(r"/v1/files/([\w-]+)/content", self.path)
        if m and m.group(1) in fake.files:
            return self._send(200, None, raw=fake.files[m.group(1)]["content"])
        self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

    def do_POST(self) -> None:  # noqa: N802
        fake = self.fake
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        if self.path == "/v1/files":
            return self._upload(raw)
        body = json.loads(raw or b"{}")
        self._record(body)
        if self.path == "/v1/chat/completions":
            with fake._lock:
                fault = fake.script.popleft() if fake.script else {}
            if fake.latency:
                time.sleep(fake.latency)
            if fault.get("kind") == "reset":
                # SO_LINGER 0: closing sends a TCP RST instead of an orderly end of the connection.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return None
            fault = {**fault, "_auth": self.headers.get("Authorization", "")}
            status, headers, reply = fake.answer(body, fault)
            if "raw" in fault:
                data = fault["raw"].encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", fault.get("content_type", "text/html; charset=utf-8"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return None
            return self._send(status, reply, headers)
        if self.path == "/v1/batches":
            bid = fake._next_id("batch")
            fake.batches[bid] = {"id": bid, "object": "batch", "endpoint": body["endpoint"], "input_file_id": body["input_file_id"],
                                 "completion_window": body.get("completion_window", "24h"), "status": "validating",
                                 "created_at": int(time.time()), "_polls": 0,
                                 "_outcome": fake.batch_outcomes.popleft() if fake.batch_outcomes else None}
            return self._send(200, {k: v for k, v in fake.batches[bid].items() if not k.startswith("_")})
        self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

    def _upload(self, raw: bytes) -> None:
        ctype = self.headers.get("Content-Type", "")
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + raw
        )
        fields: dict[str, Any] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[name] = (part.get_filename(), part.get_payload(decode=True))
        self._record({"purpose": fields.get("purpose", (None, b""))[1].decode()})
        filename, content = fields["file"]
        fid = self.fake._next_id("file")
        obj = {"id": fid, "object": "file", "bytes": len(content), "created_at": int(time.time()),
               "filename": filename or "input.jsonl", "purpose": "batch", "status": "processed"}
        self.fake.files[fid] = {**obj, "content": content}
        self._send(200, obj)

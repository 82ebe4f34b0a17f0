"""A local OpenAI-compatible verifier for tests and benchmarks: :class:`VerifierServer`.

It reads a verification request back out of the prompt (markers ``«i | label»``, ids after "Audit
exactly these segment ids") and answers each id with a verdict from ``decide(shown_label, segment_text)``:
by default the cue rule of :mod:`tests.openai_server` (accept a shown label equal to it, else revise
to it).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from .openai_server import FakeOpenAI, cue_label

VMARK = re.compile(r"«(\d+)(?: \| (\w+))?» ")
VIDS = re.compile(r"Audit exactly these segment ids \(\d+\): ([0-9, ]+)")

#: ``decide(shown, text) -> (verdict, label or None, reason or None)``
Decide = Callable[[str | None, str], tuple[str, str | None, str | None]]


def cue_decide(shown: str | None, text: str) -> tuple[str, str | None, str | None]:
    """Accept the shown label when it equals the cue rule's, else revise to the cue rule's with a (non-ASCII) reason."""
    truth = cue_label(text)
    if shown == truth:
        return "accept", None, None
    return "revise", truth, f"the codebook says {truth} — ✓"


def parse_verify_prompt(messages: list[dict[str, Any]]) -> tuple[dict[int, tuple[str | None, str]], list[int]]:
    """``({id: (shown label, segment text)}, requested ids)`` of a verification request."""
    user = messages[-1]["content"]
    trace = user.split("<trace>\n", 1)[1].rsplit("\n</trace>", 1)[0]
    parts = VMARK.split(trace)
    segs = {int(parts[i]): (parts[i + 1], parts[i + 2]) for i in range(1, len(parts) - 2, 3)}
    m = VIDS.search(user)
    return segs, [int(x) for x in m.group(1).split(",")] if m else []


class VerifierServer(FakeOpenAI):
    """The fake server answering verification requests with ``decide`` (see the module docstring).

    ``broken=True`` answers every id with the invalid verdict ``"maybe"``. ``shown`` records the
    labels read from the markers of each request. Scripted faults with a ``status`` (and kinds
    ``500``, ``truncate``, ``refusal``) behave as in :class:`FakeOpenAI`.
    """

    def __init__(self, *, decide: Decide = cue_decide, broken: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.decide = decide
        self.broken = broken
        self.shown: list[dict[int, str | None]] = []

    def answer(self, body: dict[str, Any], fault: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        if "status" in fault or fault.get("kind") in ("500", "truncate", "refusal"):
            return super().answer(body, fault)
        segs, ids = parse_verify_prompt(body["messages"])
        with self._lock:
            self.shown.append({i: shown for i, (shown, _) in segs.items()})
        verdicts = []
        for i in ids:
            shown, text = segs[i]
            if self.broken:
                verdicts.append({"segment_id": i, "verdict": "maybe", "label": None, "reason": None})
                continue
            verdict, label, reason = self.decide(shown, text)
            verdicts.append({"segment_id": i, "verdict": verdict, "label": label, "reason": reason})
        content = json.dumps({"verdicts": verdicts}, ensure_ascii=False)
        prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // 4
        reply = {"id": self._next_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                              "message": {"role": "assistant", "content": content, "refusal": None}}],
                 "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(content) // 4,
                           "total_tokens": prompt_tokens + len(content) // 4, "prompt_tokens_details": {"cached_tokens": 0}}}
        return 200, {}, reply

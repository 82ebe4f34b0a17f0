"""Simulated LLM judges of known accuracy behind the local OpenAI-compatible test server.

Every segment has a hidden true label, a deterministic function of its text (:func:`true_label`,
drawn with realistic class shares). A simulated judge ``sim-NAME`` (the request's ``model``) answers
the true label with its accuracy, else a realistic confusion (planning<->reflection,
execution<->restatement, fact->execution, conclusion->restatement) with probability
:data:`CONFUSION_SHARE`, else another class at random. Its draws are a deterministic function of
(model, text), so a judge answers the same segment the same way every time, and errors of different
judges are independent given the truth (the Dawid-Skene model). The truth and the noise live here,
in the test world, never in the code under test.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from ror_annotate.judge.prompt import approx_tokens
from ror_annotate.records import BEHAVIORS

from .openai_server import FakeOpenAI, parse_prompt

#: Shares of the true classes (roughly those of human-labelled reasoning traces).
PRIORS = {"planning": 0.15, "execution": 0.35, "restatement": 0.1, "fact": 0.1, "reflection": 0.2, "conclusion": 0.1}
#: The class a judge confuses a true class with most.
CONFUSED_WITH = {"planning": "reflection", "reflection": "planning", "execution": "restatement", "restatement": "execution",
                 "fact": "execution", "conclusion": "restatement"}
#: Share of a judge's errors that go to the confused class (the rest: uniform over the other classes).
CONFUSION_SHARE = 0.6
#: Accuracy of each simulated judge, by model name.
ACCURACY = {"sim-a": 0.85, "sim-b": 0.75, "sim-c": 0.7, "sim-d": 0.65, "sim-e": 0.6}


def _uniform(*parts: str) -> float:
    """A number in [0, 1) fixed by ``parts`` (sha256)."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _pick(u: float, weights: dict[str, float]) -> str:
    total = sum(weights.values())
    acc = 0.0
    for name, w in weights.items():
        acc += w / total
        if u < acc:
            return name
    return list(weights)[-1]


def _norm(text: str) -> str:
    return " ".join(text.split())  # the prompt may add separators around a segment's text


def true_label(text: str) -> str:
    """The hidden true label of a segment text."""
    return _pick(_uniform("truth", _norm(text)), PRIORS)


def judge_label(model: str, text: str) -> str:
    """What simulated judge ``model`` answers for a segment text."""
    truth = true_label(text)
    text = _norm(text)
    if _uniform(model, "correct", text) < ACCURACY[model]:
        return truth
    if _uniform(model, "confused", text) < CONFUSION_SHARE:
        return CONFUSED_WITH[truth]
    others = [b for b in BEHAVIORS if b not in (truth, CONFUSED_WITH[truth])]
    return others[int(_uniform(model, "other", text) * len(others))]


class SimJudges(FakeOpenAI):
    """The test server, answering as the simulated judge named by each request's ``model``."""

    def answer(self, body: dict[str, Any], fault: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        model = body.get("model", "")
        if model not in ACCURACY:
            return super().answer(body, fault)
        messages = body["messages"]
        segs, ids = parse_prompt(messages)
        items = [{"segment_id": i, "label": judge_label(model, segs.get(i, "")), "confidence": 0.9, "rationale": "simulated"}
                 for i in ids]
        content = json.dumps({"labels": items})
        prompt_tokens = approx_tokens("\n".join(m["content"] for m in messages))
        completion_tokens = approx_tokens(content)
        reply = {
            "id": self._next_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": content, "refusal": None}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": 0}},
        }
        return 200, {}, reply

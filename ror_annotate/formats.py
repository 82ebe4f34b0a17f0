"""Reasoning-trace formats: one declarative adapter per way models and servers write reasoning.

A model output reaches us in one of two shapes, and each shape has its adapters:

* **text** (a string): ``<think>`` tags and their variants, Harmony channels (GPT-OSS), Mistral
  ``[THINK]``, Seed ``<seed:think>``, Kimi ``◁think▷``, or plain chain of thought;
* **structured** (a JSON object or list): an OpenAI-compatible chat-completion response saved as
  JSON (``choices[i].message.content`` with ``reasoning_content`` or ``reasoning``, as vLLM,
  SGLang, DeepSeek, OpenRouter and Ollama return it, also inside an OpenAI Batch output line), an
  Ollama ``/api/chat`` response (``message.thinking``), or a chat transcript (a ``messages`` or
  ShareGPT ``conversations`` list).

Every adapter is one entry of :data:`FORMATS` (:func:`register_format` adds one); :func:`extract`
auto-detects the format of a value, or uses the one forced with ``format=NAME``
(``ror ingest --format NAME``). A structured adapter whose reasoning is not in a field of its own
runs text detection on the message content (``openai-response/think``: vLLM served without a
reasoning parser).

What an adapter guarantees (:class:`Extraction`):

* ``reasoning`` holds the reasoning blocks in order, each stripped, joined by a blank line; the
  ``answer`` is the text after the last block (the final channel for Harmony, the message content
  for response objects), or None;
* text between blocks (``<think>A</think>B<think>C</think>D``: ``B``) is never lost: it is kept,
  in order, in ``gaps`` (stored in ``Trace.meta["gaps"]``);
* tool calls and tool outputs go to ``side`` (``Trace.meta["tool_calls"]``/``["tool_outputs"]``),
  never into the reasoning or the answer;
* nested or unbalanced tags are refused with an :class:`~ror_annotate.errors.InputError` naming
  the record and the line and column in the text.

Line endings: :func:`normalize_newlines` turns CRLF and lone CR into LF and drops a leading BOM
before extraction, so the stored text always has LF line endings (whatever the source used) and
every offset is a Python string index into that stored text; ``Trace.meta["line_endings"]``
records ``"crlf"``, ``"cr"`` or ``"mixed"`` when the source text had others.

End of sequence: one token of :data:`EOS_TOKENS` at the very end of an output string is removed
(``Trace.meta["eos_token"]``); decoders keep it when special tokens are not skipped.

Leftover markers: :data:`KNOWN_MARKERS` lists the control tokens and thinking markers of the
formats above and of common chat templates (ChatML, Llama 3, DeepSeek, Mistral, Kimi, Seed);
:func:`find_marker` finds one left in an extracted text. :mod:`ror_annotate.traces` refuses such a
record, or stores it with a counted warning under ``allow_markers=True``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, InputError
from .registry import Registry

#: The format name that means "detect it".
AUTO = "auto"


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Extraction:
    """Reasoning and answer of one model output, and everything kept out of them.

    Attributes
    ----------
    reasoning : str
        The reasoning blocks in order, stripped, joined by ``"\\n\\n"``; may be empty (the caller
        refuses an empty trace).
    answer : str or None
        The final answer text, stripped; None when there is none (truncated output, plain text).
    format : str
        The adapter's name (``"think"``, ``"harmony"``, ``"openai-response/think"`` ...).
    problem, model, trace_id : str or None
        Found in the structure itself (user turn, response ``model``, response ``id``).
    gaps : tuple of str
        Non-blank text outside every reasoning block and outside the answer, in order.
    side : dict
        ``{"tool_calls": [...], "tool_outputs": [...], ...}``: text kept out of reasoning and answer.
    meta : dict
        Scalars worth keeping (``finish_reason``, ``truncated``, ``line_endings`` ...).
    notes : tuple of str
        Things the caller should count and report (e.g. no reasoning field: content stored as reasoning).
    """

    reasoning: str
    answer: str | None
    format: str
    problem: str | None = None
    model: str | None = None
    trace_id: str | None = None
    gaps: tuple[str, ...] = ()
    side: dict[str, list[str]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


NOTE_GAPS = "text between reasoning blocks kept in meta.gaps"
NOTE_NO_REASONING_FIELD = "response/transcript without a reasoning field or thinking markers: whole content stored as reasoning"
NOTE_NEWLINES = "CRLF/CR line endings stored as LF"
NOTE_TRUNCATED = "reasoning block never closed (truncated output): no answer"
NOTE_EOS = "end-of-sequence token at the end of the output removed (meta.eos_token)"

#: End-of-sequence tokens a decoder leaves at the very end of an output when special tokens are
#: kept (ChatML/Qwen, GPT-2 family, DeepSeek, Llama 3, Gemma, Seed, Llama 2/Mistral ``</s>``).
#: Removed there only; anywhere else the known ones are leftover markers.
EOS_TOKENS: tuple[str, ...] = (
    "<|im_end|>", "<|endoftext|>", "<｜end▁of▁sentence｜>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<seed:eos>", "</s>",
)


# --------------------------------------------------------------------------- text helpers
def normalize_newlines(text: str) -> tuple[str, str | None]:
    """``text`` with CRLF and lone CR turned into LF and leading BOMs (U+FEFF) removed.

    Returns ``(normalized, kind)`` where ``kind`` is ``"crlf"``, ``"cr"``, ``"mixed"`` (CRLF and
    lone CR) or None when the text had no CR. ``str.strip`` does not remove U+FEFF, so a BOM
    carried into a JSON string would otherwise start the stored reasoning.
    """
    text = text.lstrip("\ufeff")
    if "\r" not in text:
        return text, None
    n_crlf = text.count("\r\n")
    n_cr = text.count("\r") - n_crlf
    kind = "mixed" if n_crlf and n_cr else ("crlf" if n_crlf else "cr")
    return text.replace("\r\n", "\n").replace("\r", "\n"), kind


def strip_trailing_eos(text: str) -> tuple[str, str | None]:
    """``text`` without one end-of-sequence token of :data:`EOS_TOKENS` at its very end (trailing
    whitespace aside), and that token (None when there was none)."""
    stripped = text.rstrip()
    for token in EOS_TOKENS:
        if stripped.endswith(token):
            return stripped[: -len(token)], token
    return text, None


def line_col(text: str, index: int) -> str:
    """``"line L, column C"`` (both 1-based, columns in code points) of ``text[index]``."""
    line = text.count("\n", 0, index) + 1
    col = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {col}"


def _join(blocks: list[str]) -> str:
    return "\n\n".join(b for b in (x.strip() for x in blocks) if b)


def _clean(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text or None


# --------------------------------------------------------------------------- text adapters
@dataclass(frozen=True)
class TagFormat:
    """A reasoning format marked by an opening and a closing tag, stated as data.

    Attributes
    ----------
    name : str
        Registry name (``"think"``).
    open, close : str
        The tags around a reasoning block. A close before any open is a missing opening tag (the
        chat templates of DeepSeek-R1, Qwen3 and Seed put the opening tag in the prompt): the
        text before it is the first block. An open never closed is a truncated output: the rest
        is reasoning and there is no answer.
    description, example : str
        One line each, for ``--help`` and the README.
    answer_tags : (str, str) or None
        Tags that may wrap the answer (``<|begin_of_solution|>``...); removed, text outside them
        goes to ``gaps``.
    side_blocks : tuple of (open, close, key)
        Blocks removed from reasoning and answer and kept in ``side[key]`` (tool calls, Seed's
        thinking-budget reflections).
    """

    name: str
    open: str
    close: str
    description: str
    example: str
    answer_tags: tuple[str, str] | None = None
    side_blocks: tuple[tuple[str, str, str], ...] = ()

    @property
    def markers(self) -> tuple[str, ...]:
        """Every tag this format uses."""
        extra = tuple(t for o, c, _ in self.side_blocks for t in (o, c))
        return (self.open, self.close, *(self.answer_tags or ()), *extra)

    def first_marker(self, text: str) -> int | None:
        """Index of this format's first opening or closing tag in ``text``, or None."""
        found = [i for t in (self.open, self.close) if (i := text.find(t)) >= 0]
        return min(found) if found else None

    def extract(self, text: str, where: str) -> Extraction:
        """Split ``text`` (newlines already normalized) into reasoning blocks and answer.

        Raises
        ------
        InputError
            Nested opening tags, or a closing tag without an opening one after the first block,
            naming ``where`` and the line and column in the text.
        """
        pattern = re.compile(f"{re.escape(self.open)}|{re.escape(self.close)}")
        blocks: list[str] = []
        gaps: list[str] = []
        pos, inside, start = 0, False, 0
        for m in pattern.finditer(text):
            if m.group() == self.open:
                if inside:
                    raise InputError(
                        f"{where}: nested {self.open} at {line_col(text, m.start())} of the text (the block opened at "
                        f"{line_col(text, start - len(self.open))} is not closed); fix the record, or store the text unsplit with --format plain --allow-markers"
                    )
                gaps.append(text[pos : m.start()])
                inside, start = True, m.end()
            else:
                if inside:
                    blocks.append(text[start : m.start()])
                    inside = False
                elif pos == 0 and not blocks:  # missing opening tag: the template put it in the prompt
                    blocks.append(text[: m.start()])
                else:
                    raise InputError(
                        f"{where}: {self.close} at {line_col(text, m.start())} of the text closes no {self.open} "
                        "(unbalanced tags); fix the record, or store the text unsplit with --format plain --allow-markers"
                    )
                pos = m.end()
        meta: dict[str, Any] = {}
        notes: list[str] = []
        if inside:
            blocks.append(text[start:])
            tail = ""
            meta["truncated"] = True
            notes.append(NOTE_TRUNCATED)
        else:
            tail = text[pos:]
        side: dict[str, list[str]] = {}
        blocks = [self._take_side(b, side) for b in blocks]
        tail = self._take_side(tail, side)
        if self.answer_tags:
            tail = self._unwrap_answer(tail, gaps)
        kept_gaps = tuple(g.strip() for g in gaps if g.strip())
        if kept_gaps:
            notes.append(NOTE_GAPS)
        return Extraction(
            reasoning=_join(blocks), answer=_clean(tail), format=self.name, gaps=kept_gaps, side=side, meta=meta,
            notes=tuple(notes),
        )

    def _take_side(self, text: str, side: dict[str, list[str]]) -> str:
        for open_tag, close_tag, key in self.side_blocks:
            pattern = re.compile(f"{re.escape(open_tag)}(.*?){re.escape(close_tag)}", re.DOTALL)
            found = [m.group(1).strip() for m in pattern.finditer(text)]
            if found:
                side.setdefault(key, []).extend(found)
                text = pattern.sub("", text)
        return text

    def _unwrap_answer(self, tail: str, gaps: list[str]) -> str:
        open_tag, close_tag = self.answer_tags  # type: ignore[misc]
        if tail.count(open_tag) != 1 or tail.count(close_tag) > 1:
            return tail  # none, or an odd structure: left for the leftover-marker check
        before, _, rest = tail.partition(open_tag)
        inner, closed, after = rest.partition(close_tag)
        gaps.extend([before, after] if closed else [before])
        return inner


@dataclass(frozen=True)
class HarmonyFormat:
    """OpenAI's Harmony chat format (GPT-OSS), parsed from its rendered text.

    A message is ``[<|start|>ROLE[ to=RECIPIENT]][<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]]
    <|message|>CONTENT`` ended by ``<|end|>``, ``<|return|>`` (end of the final answer) or
    ``<|call|>`` (a tool call); a completion starts at ``<|channel|>`` because the prompt ends with
    ``<|start|>assistant``. Assistant messages on the ``analysis`` channel and ``commentary``
    messages without a recipient (preambles) are reasoning; the ``final`` channel is the answer;
    messages with a recipient or ended by ``<|call|>`` are tool calls, and messages of tool roles
    (``functions.NAME``, ``browser.search``, ``python``) tool outputs: both go to ``side``. The last
    user message, when present, is the problem; system and developer messages are dropped.
    Token list from the Harmony format guide (openai/harmony, ``openai-harmony.md``).
    """

    name: str = "harmony"
    description: str = "GPT-OSS Harmony channels: analysis/commentary -> reasoning, final -> answer, tool calls kept out"
    example: str = "<|channel|>analysis<|message|>R<|end|><|start|>assistant<|channel|>final<|message|>A<|return|>"
    markers: tuple[str, ...] = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")

    def first_marker(self, text: str) -> int | None:
        """Index of the first ``<|message|>`` header when the text has Harmony headers, else None."""
        if "<|message|>" not in text or not ("<|channel|>" in text or "<|start|>" in text):
            return None
        return min(i for t in ("<|start|>", "<|channel|>", "<|message|>") if (i := text.find(t)) >= 0)

    def extract(self, text: str, where: str) -> Extraction:
        """Parse the messages of ``text``; raises :class:`InputError` on a malformed header or content."""
        token = re.compile(r"<\|(start|channel|message|end|return|call|constrain)\|>")
        tokens = list(token.finditer(text))
        reasoning: list[str] = []
        finals: list[str] = []
        gaps: list[str] = []
        side: dict[str, list[str]] = {}
        problem: str | None = None
        meta: dict[str, Any] = {}
        i, pos = 0, 0
        while i < len(tokens):
            # header: tokens up to <|message|>
            j = i
            while j < len(tokens) and tokens[j].group(1) in ("start", "channel", "constrain"):
                j += 1
            if j == len(tokens):
                rest = text[pos:]
                if rest.strip() not in ("<|start|>assistant", "<|start|>"):  # a trailing generation prompt is harmless
                    gaps.append(rest)
                pos = len(text)
                break
            if tokens[j].group(1) != "message":
                raise InputError(
                    f"{where}: Harmony {tokens[j].group()} at {line_col(text, tokens[j].start())} of the text where a "
                    "message header (<|start|>ROLE<|channel|>CHANNEL<|message|>) was expected"
                )
            gaps.append(text[pos : tokens[i].start()] if i < j else text[pos : tokens[j].start()])
            role, channel, recipient = self._header(text, tokens[i:j], tokens[j].start())
            body_start = tokens[j].end()
            k = j + 1
            if k < len(tokens) and tokens[k].group(1) not in ("end", "return", "call", "start"):
                raise InputError(
                    f"{where}: Harmony {tokens[k].group()} inside a message at {line_col(text, tokens[k].start())} of the "
                    "text (a message ends with <|end|>, <|return|> or <|call|>)"
                )
            if k < len(tokens):
                end, terminator = tokens[k].start(), tokens[k].group(1)
                i = k + 1 if terminator != "start" else k
                pos = tokens[k].end() if terminator != "start" else tokens[k].start()
            else:
                end, terminator = len(text), None
                i, pos = k, len(text)
                meta["truncated"] = True
            content = text[body_start:end]
            role = role or "assistant"
            if role == "assistant":
                if recipient or terminator == "call":
                    side.setdefault("tool_calls", []).append(f"to={recipient}: {content.strip()}" if recipient else content.strip())
                elif channel in ("analysis", "commentary"):
                    reasoning.append(content)
                elif channel == "final":
                    finals.append(content)
                else:
                    raise InputError(
                        f"{where}: Harmony assistant message on channel {channel!r} at {line_col(text, body_start)} of "
                        "the text; expected analysis, commentary or final"
                    )
            elif role == "user":
                problem = content.strip()
            elif role not in ("system", "developer"):
                side.setdefault("tool_outputs", []).append(f"{role}: {content.strip()}")
        gaps.append(text[pos:])
        kept_gaps = tuple(g.strip() for g in gaps if g.strip())
        notes = (NOTE_GAPS,) if kept_gaps else ()
        return Extraction(
            reasoning=_join(reasoning), answer=_clean(_join(finals)), format=self.name, problem=problem or None,
            gaps=kept_gaps, side=side, meta=meta, notes=notes,
        )

    @staticmethod
    def _header(text: str, tokens: list[re.Match[str]], end: int) -> tuple[str | None, str | None, str | None]:
        role = channel = recipient = None
        for n, tok in enumerate(tokens):
            stop = tokens[n + 1].start() if n + 1 < len(tokens) else end
            words = text[tok.end() : stop].split()
            for w in words:
                if w.startswith("to="):
                    recipient = w[3:]
            plain = [w for w in words if not w.startswith("to=")]
            if tok.group(1) == "start":
                role = plain[0] if plain else None
            elif tok.group(1) == "channel":
                channel = plain[0] if plain else None
        return role, channel, recipient


@dataclass(frozen=True)
class PlainFormat:
    """No markers: the whole text is reasoning (QwQ-32B-Preview, chain of thought of chat models)."""

    name: str = "plain"
    description: str = "no markers: the whole text is the reasoning (the answer comes from a column or the last \\boxed{})"
    example: str = "Let me compute 6*7. That is 42."
    markers: tuple[str, ...] = ()

    def first_marker(self, text: str) -> int | None:
        """Always None: plain is never detected, only the fallback."""
        return None

    def extract(self, text: str, where: str) -> Extraction:
        """The whole text, stripped, as reasoning; no answer."""
        return Extraction(reasoning=text.strip(), answer=None, format=self.name)


TextAdapter = TagFormat | HarmonyFormat | PlainFormat


# --------------------------------------------------------------------------- structured adapters
#: Message fields that hold reasoning, in the order servers use them: vLLM (< 0.10), SGLang and
#: DeepSeek ``reasoning_content``; vLLM (>= 0.10), OpenRouter, Ollama's OpenAI endpoint ``reasoning``;
#: Ollama's native API ``thinking``.
REASONING_FIELDS: tuple[str, ...] = ("reasoning_content", "reasoning", "thinking")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system", "tool": "tool"}


@dataclass(frozen=True)
class StructuredFormat:
    """A format whose value is a JSON object or list (a response, a transcript), stated as data.

    ``detect(record)`` returns the value to extract from (or None); ``extract(value, where, text_format)``
    returns one :class:`Extraction` per generation (several for ``n > 1`` choices).
    """

    name: str
    description: str
    example: str
    detect: Callable[[Any], Any]
    extract: Callable[[Any, str, str], list[Extraction]]
    markers: tuple[str, ...] = ()


#: Content-part types that hold reasoning: Mistral's API (``{"type": "thinking", "thinking": [text parts]}``),
#: Anthropic-style blocks (``{"type": "thinking", "thinking": "..."}``), ``{"type": "reasoning", "text": ...}``.
_REASONING_PARTS = ("thinking", "reasoning")
#: Content-part types whose reasoning cannot be read.
_HIDDEN_PARTS = ("redacted_thinking", "reasoning.encrypted")


def _part_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_part_text(v) for v in value)
    if isinstance(value, dict):
        return _part_text(value.get("text", ""))
    return ""


def _split_parts(content: Any, where: str) -> tuple[str | None, str | None]:
    """``(reasoning, text)`` of a message ``content``: a string, None, or a list of typed parts.

    Reasoning parts (:data:`_REASONING_PARTS`) are kept apart from text parts, so that a thinking
    block returned inside ``content`` never becomes the answer or vanishes.

    Raises
    ------
    InputError
        Content of another type, or only hidden (redacted/encrypted) reasoning parts.
    """
    if content is None or isinstance(content, str):
        return None, content
    if not isinstance(content, list):
        raise InputError(f"{where}: message content must be a string or a list of parts, got {type(content).__name__}")
    reasoning, text, hidden = [], [], False
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _REASONING_PARTS:
            reasoning.append(_part_text(part.get(kind) if part.get(kind) is not None else part.get("text")))
        elif kind in _HIDDEN_PARTS:
            hidden = True
        elif isinstance(part, str) or kind in (None, "text", "output_text"):
            text.append(_part_text(part))
    if hidden and not any(r.strip() for r in reasoning):
        raise InputError(f"{where}: the message's reasoning is redacted or encrypted; it cannot be annotated")
    return ("\n\n".join(r for r in reasoning if r.strip()) or None), "".join(text)


def _content_text(content: Any, where: str) -> str | None:
    """The text of a message ``content`` (a string, None, or a list of parts; reasoning parts left out)."""
    return _split_parts(content, where)[1]


def _message_reasoning(message: dict[str, Any], where: str) -> str | None:
    for key in REASONING_FIELDS:
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value
    details = message.get("reasoning_details")
    if isinstance(details, list):  # OpenRouter: typed parts; only readable text counts
        texts: list[str] = [
            t for d in details if isinstance(d, dict) and isinstance(t := d.get("text") or d.get("summary"), str) and t.strip()
        ]
        if texts:
            return "\n\n".join(texts)
        if any(isinstance(d, dict) and d.get("type") == "reasoning.encrypted" for d in details):
            raise InputError(f"{where}: the reasoning is encrypted (reasoning_details of type reasoning.encrypted); it cannot be annotated")
    return None


def _from_message(message: dict[str, Any], where: str, text_format: str, hidden_reasoning_tokens: int = 0) -> Extraction:
    """Reasoning and answer of one assistant message (a reasoning field, or markers in the content)."""
    part_reasoning, content = _split_parts(message.get("content"), where)
    side: dict[str, list[str]] = {}
    calls = message.get("tool_calls") or ([message["function_call"]] if message.get("function_call") else [])
    if calls:
        side["tool_calls"] = [json.dumps(c, ensure_ascii=False, sort_keys=True) for c in calls]
    reasoning = _message_reasoning(message, where) or part_reasoning
    if reasoning is not None:
        reasoning, newlines = normalize_newlines(reasoning)
        meta = {"line_endings": newlines} if newlines else {}
        notes = (NOTE_NEWLINES,) if newlines else ()
        answer = _clean(normalize_newlines(content)[0]) if content is not None else None
        return Extraction(reasoning=reasoning.strip(), answer=answer, format="", side=side, meta=meta, notes=notes)
    if content is None:
        return Extraction(reasoning="", answer=None, format="", side=side)
    inner = extract_text(content, where, format=text_format)
    if inner.format == "plain":
        if hidden_reasoning_tokens:
            raise InputError(
                f"{where}: the response used {hidden_reasoning_tokens} reasoning tokens but carries no reasoning text "
                "(the provider hides it): its content is only the answer, not a trace"
            )
        inner = Extraction(reasoning=inner.reasoning, answer=None, format="plain", notes=(NOTE_NO_REASONING_FIELD,))
    merged = {**inner.side, **{k: inner.side.get(k, []) + v for k, v in side.items()}}
    return Extraction(
        reasoning=inner.reasoning, answer=inner.answer, format=inner.format, gaps=inner.gaps, side=merged,
        meta=inner.meta, notes=inner.notes, problem=inner.problem,
    )


def _completion_of(record: Any) -> dict[str, Any] | None:
    """The chat/text completion object in ``record``: itself, or an OpenAI Batch line's ``response.body``."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("choices"), list):
        return record
    response = _dict(record.get("response"))
    body = _dict(response.get("body")) or response
    return body if isinstance(body.get("choices"), list) else None


def _dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a dict, else an empty dict (for optional nested JSON objects)."""
    return value if isinstance(value, dict) else {}


def _last_user(messages: Any, where: str) -> str | None:
    if not isinstance(messages, list):
        return None
    users = [m for m in messages if isinstance(m, dict) and _SHAREGPT_ROLES.get(m.get("role") or m.get("from") or "") == "user"]
    if not users:
        return None
    text = _content_text(users[-1].get("content", users[-1].get("value")), where)
    return normalize_newlines(text)[0].strip() if text else None


def _detect_response(record: Any) -> Any:
    return record if _completion_of(record) is not None else None


def _extract_response(record: dict[str, Any], where: str, text_format: str) -> list[Extraction]:
    response = _dict(record.get("response"))
    if response.get("status_code") not in (None, 200) or record.get("error"):
        raise InputError(f"{where}: the request failed (status {response.get('status_code')}, error {record.get('error')!r}); no response to ingest")
    completion = _completion_of(record)
    assert completion is not None  # detect() said so
    choices = completion["choices"]
    if not choices:
        raise InputError(f"{where}: the response has no choices")
    details = _dict(_dict(completion.get("usage")).get("completion_tokens_details"))
    hidden = int(details.get("reasoning_tokens") or 0)
    request = _dict(record.get("request"))
    request_body = _dict(request.get("body")) or request
    problem = _last_user(record.get("messages") or request_body.get("messages"), where)
    out = []
    for n, choice in enumerate(choices):
        here = f"{where} choices[{n}]" if len(choices) > 1 else where
        if not isinstance(choice, dict):
            raise InputError(f"{here}: a choice must be an object, got {type(choice).__name__}")
        if isinstance(choice.get("message"), dict):
            got = _from_message(choice["message"], here, text_format, hidden)
        elif isinstance(choice.get("text"), str):  # /v1/completions: the raw generated text
            got = extract_text(choice["text"], here, format=text_format)
        elif isinstance(choice.get("delta"), dict):
            raise InputError(f"{here}: this is one streamed chunk (choices[].delta); save the assembled response, not the stream")
        else:
            raise InputError(f"{here}: a choice needs a message object or a text string")
        meta = {**got.meta, **({"finish_reason": choice["finish_reason"]} if choice.get("finish_reason") else {})}
        if completion.get("id"):
            meta["response_id"] = completion["id"]
        fmt = "openai-response" + (f"/{got.format}" if got.format else "")
        out.append(
            Extraction(
                reasoning=got.reasoning, answer=got.answer, format=fmt, problem=problem or got.problem,
                model=completion.get("model"), trace_id=record.get("custom_id") or completion.get("id"),
                gaps=got.gaps, side=got.side, meta=meta, notes=got.notes,
            )
        )
    return out


def _detect_ollama(record: Any) -> Any:
    if isinstance(record, dict) and isinstance(record.get("message"), dict) and record["message"].get("role") == "assistant":
        return record
    return None


def _extract_ollama(record: dict[str, Any], where: str, text_format: str) -> list[Extraction]:
    got = _from_message(record["message"], where, text_format)
    meta = {**got.meta, **({"done_reason": record["done_reason"]} if record.get("done_reason") else {})}
    return [
        Extraction(
            reasoning=got.reasoning, answer=got.answer, format="ollama-chat" + (f"/{got.format}" if got.format else ""),
            model=record.get("model"), gaps=got.gaps, side=got.side, meta=meta, notes=got.notes,
        )
    ]


def _detect_message(record: Any) -> Any:
    """A single saved assistant message (``{"role": "assistant", "content": ..., "reasoning_content": ...}``)."""
    if (
        isinstance(record, dict) and record.get("role") == "assistant" and "choices" not in record and "message" not in record
        and ("content" in record or any(k in record for k in REASONING_FIELDS))
    ):
        return record
    return None


def _extract_message(record: dict[str, Any], where: str, text_format: str) -> list[Extraction]:
    got = _from_message(record, where, text_format)
    return [
        Extraction(
            reasoning=got.reasoning, answer=got.answer, format="assistant-message" + (f"/{got.format}" if got.format else ""),
            model=record.get("model") if isinstance(record.get("model"), str) else None,
            gaps=got.gaps, side=got.side, meta=got.meta, notes=got.notes,
        )
    ]


def _transcript_of(record: Any) -> list[Any] | None:
    if isinstance(record, list) and record and all(isinstance(m, dict) and ("role" in m or "from" in m) for m in record):
        return record
    if isinstance(record, dict):
        for key in ("messages", "conversations", "conversation"):
            value = record.get(key)
            if _transcript_of(value) is not None:
                return value
    return None


def _extract_chat(record: Any, where: str, text_format: str) -> list[Extraction]:
    messages = _transcript_of(record)
    assert messages is not None
    roles = [_SHAREGPT_ROLES.get(m.get("role") or m.get("from") or "", m.get("role") or m.get("from")) for m in messages]
    last_user = max((n for n, r in enumerate(roles) if r == "user"), default=-1)
    turns = [(n, messages[n]) for n in range(last_user + 1, len(messages))]
    if not any(roles[n] == "assistant" for n, _ in turns):
        raise InputError(f"{where}: the transcript has no assistant turn after its last user turn")
    reasoning: list[str] = []
    gaps: list[str] = []
    side: dict[str, list[str]] = {}
    notes: list[str] = []
    meta: dict[str, Any] = {}
    answer: str | None = None
    inner_format = ""
    assistants = [n for n, _ in turns if roles[n] == "assistant"]
    for n, m in turns:
        here = f"{where} messages[{n}]"
        if roles[n] != "assistant":
            text = _content_text(m.get("content", m.get("value")), here) or ""
            side.setdefault("tool_outputs", []).append(normalize_newlines(text)[0].strip())
            continue
        message = dict(m)
        if "content" not in message and "value" in message:
            message["content"] = message["value"]
        got = _from_message(message, here, text_format)
        inner_format = inner_format or got.format
        reasoning.append(got.reasoning)
        gaps.extend(got.gaps)
        for key, values in got.side.items():
            side.setdefault(key, []).extend(values)
        notes.extend(got.notes)
        meta.update(got.meta)
        if n == assistants[-1]:
            answer = got.answer
        elif got.answer:  # the text of an intermediate turn (beside its tool call) is neither reasoning nor answer
            gaps.append(got.answer)
    if gaps and NOTE_GAPS not in notes:
        notes.append(NOTE_GAPS)
    problem = _last_user(messages, where)
    model = record.get("model") if isinstance(record, dict) and isinstance(record.get("model"), str) else None
    return [
        Extraction(
            reasoning=_join(reasoning), answer=answer, format="chat" + (f"/{inner_format}" if inner_format else ""),
            problem=problem, model=model, gaps=tuple(gaps), side=side, meta=meta, notes=tuple(dict.fromkeys(notes)),
        )
    ]


# --------------------------------------------------------------------------- registry
#: Every trace format (the one registry mechanism, :mod:`ror_annotate.registry`; plug-ins through the
#: ``ror_annotate.formats`` entry-point group). Detection tries text formats in registration order.
FORMAT_REGISTRY: Registry[TextAdapter | StructuredFormat] = Registry("formats", what="trace format")
#: Read-only live view of the registered formats, in registration order.
FORMATS = FORMAT_REGISTRY.loaded()


def register_format(adapter: TextAdapter | StructuredFormat, *, overwrite: bool = False) -> TextAdapter | StructuredFormat:
    """Add a format adapter to :data:`FORMATS` under ``adapter.name``.

    Raises
    ------
    ConfigError
        The name is taken (and ``overwrite`` is false) or is ``"auto"``.
    """
    if adapter.name == AUTO or (adapter.name in FORMATS and not overwrite):
        raise ConfigError(f"format name {adapter.name!r} is already taken; pass overwrite=True to replace it")
    return FORMAT_REGISTRY.register(adapter.name, adapter, replace=True)


register_format(StructuredFormat(
    "openai-response", "OpenAI-compatible chat-completion response saved as JSON (vLLM, SGLang, DeepSeek, OpenRouter, "
    "Ollama; also OpenAI Batch output lines): reasoning_content/reasoning -> reasoning, content -> answer",
    '{"id": "chatcmpl-1", "object": "chat.completion", "model": "m", "choices": [{"message": {"role": "assistant", '
    '"reasoning_content": "R", "content": "A"}}]}',
    _detect_response, _extract_response,
))
register_format(StructuredFormat(
    "ollama-chat", "Ollama /api/chat response: message.thinking -> reasoning, message.content -> answer",
    '{"model": "qwen3", "message": {"role": "assistant", "thinking": "R", "content": "A"}, "done": true}',
    _detect_ollama, _extract_ollama,
))
register_format(StructuredFormat(
    "assistant-message", "one saved assistant message: reasoning_content/reasoning/thinking -> reasoning, content -> answer",
    '{"role": "assistant", "reasoning_content": "R", "content": "A"}',
    _detect_message, _extract_message,
))
register_format(StructuredFormat(
    "chat", "chat transcript (messages or ShareGPT conversations): problem from the last user turn, reasoning and "
    "answer from the assistant turns after it",
    '{"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>R</think>A"}]}',
    lambda r: r if _transcript_of(r) is not None else None, _extract_chat,
))
register_format(HarmonyFormat())
register_format(TagFormat(
    "think", "<think>", "</think>",
    "<think> tags (DeepSeek-R1, QwQ, Qwen3, Kimi K2): several blocks in order, missing opening tag allowed",
    "<think>R</think>A", answer_tags=("<answer>", "</answer>"), side_blocks=(("<tool_call>", "</tool_call>", "tool_calls"),),
))
register_format(TagFormat("thinking", "<thinking>", "</thinking>", "<thinking> tags", "<thinking>R</thinking>A"))
register_format(TagFormat(
    "thought", "<|begin_of_thought|>", "<|end_of_thought|>",
    "OpenThoughts/Bespoke/Sky-T1 thought and solution tags",
    "<|begin_of_thought|>R<|end_of_thought|><|begin_of_solution|>A<|end_of_solution|>",
    answer_tags=("<|begin_of_solution|>", "<|end_of_solution|>"),
))
register_format(TagFormat("mistral", "[THINK]", "[/THINK]", "Mistral Magistral [THINK] markers", "[THINK]R[/THINK]A"))
register_format(TagFormat(
    "seed", "<seed:think>", "</seed:think>", "ByteDance Seed-OSS thinking tags (budget reflections and tool calls kept out)",
    "<seed:think>R</seed:think>A",
    side_blocks=(("<seed:cot_budget_reflect>", "</seed:cot_budget_reflect>", "budget_reflections"),
                 ("<seed:tool_call>", "</seed:tool_call>", "tool_calls")),
))
register_format(TagFormat("kimi", "◁think▷", "◁/think▷", "Kimi-VL thinking markers", "◁think▷R◁/think▷A"))
register_format(PlainFormat())

#: Control tokens and thinking markers that must never survive into a stored reasoning text or
#: answer: every marker of the formats above, plus the special tokens of common chat templates
#: (ChatML/Qwen, Llama 3, DeepSeek with its full-width bars, Mistral, Kimi, Seed, Gemma). Plain
#: ``<s>``/``</s>`` are left out: they are also HTML a trace may quote.
KNOWN_MARKERS: tuple[str, ...] = tuple(dict.fromkeys([
    *(m for a in FORMATS.values() for m in a.markers),
    "<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|endoftext|>", "<|startoftext|>", "<|endofprompt|>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
    "<|python_tag|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
    "[INST]", "[/INST]", "[TOOL_CALLS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
    "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
    "<seed:bos>", "<seed:eos>", "<start_of_turn>", "<end_of_turn>",
    # GPT-OSS output decoded with skip_special_tokens=True: the Harmony tokens are gone, their words stay
    "assistantfinal", "assistantanalysis", "assistantcommentary",
]))

#: What to do about a leftover marker, where more can be said than "force a format".
MARKER_HINTS: dict[str, str] = {
    m: "this is GPT-OSS Harmony output decoded with skip_special_tokens=True, which dropped its control tokens: "
    "decode again keeping special tokens, or save the server's reasoning_content"
    for m in ("assistantfinal", "assistantanalysis", "assistantcommentary")
}
_MARKER_RE = re.compile("|".join(re.escape(m) for m in sorted(KNOWN_MARKERS, key=len, reverse=True)), re.IGNORECASE)


#: Where a marker can start: its first character, for markers that start with punctuation
#: (``<``, ``[``, ``◁``); markers that start with a letter (``assistantfinal``) are searched whole.
_LEAD_RE = re.compile("[" + "".join(sorted({re.escape(m[0]) for m in KNOWN_MARKERS if not m[0].isalpha()})) + "]")
_WORD_MARKERS = tuple(m for m in KNOWN_MARKERS if m[0].isalpha())
_BY_PREFIX: dict[str, tuple[str, ...]] = {}  # first two characters (lowered) -> markers, longest first
for _m in sorted(KNOWN_MARKERS, key=len, reverse=True):
    if not _m[0].isalpha():
        _BY_PREFIX[_m[:2].lower()] = (*_BY_PREFIX.get(_m[:2].lower(), ()), _m.lower())
_LONGEST = max(map(len, KNOWN_MARKERS))


def find_marker(text: str | None, extra: tuple[str, ...] = ()) -> tuple[str, int] | None:
    """The first known control token or thinking marker in ``text`` and its index, or None.

    Matching ignores letter case (``<THINK>``, ``AssistantFinal``); ``extra`` markers match as written.
    """
    if not text:
        return None
    hits = [(t, i) for t in extra if (i := text.find(t)) >= 0]
    low = text.lower()
    if len(low) != len(text):  # a character lowered to several (U+0130): indices would shift
        m = _MARKER_RE.search(text)
        return min([*hits, (m.group(), m.start())], key=lambda h: h[1]) if m else (min(hits, key=lambda h: h[1]) if hits else None)
    hits += [(text[i : i + len(t)], i) for t in _WORD_MARKERS if (i := low.find(t)) >= 0]
    # Look only where a marker can start (the few '<' or '[' of a long trace) instead of searching
    # the whole text once per marker: one big case-insensitive alternation made ingestion ten times slower.
    for m in _LEAD_RE.finditer(text):
        i = m.start()
        window = text[i : i + _LONGEST].lower()
        found = next((t for t in _BY_PREFIX.get(window[:2], ()) if window.startswith(t)), None)
        if found is not None:
            hits.append((text[i : i + len(found)], i))
            break
    return min(hits, key=lambda h: h[1]) if hits else None


def markers_in(text: str | None, extra: tuple[str, ...] = ()) -> list[str]:
    """Every distinct known marker in ``text`` (as written there), sorted."""
    if not text:
        return []
    return sorted({m.group() for m in _MARKER_RE.finditer(text)} | {t for t in extra if t in text})


def _check_name(format: str) -> None:
    if format != AUTO and format not in FORMATS:
        raise ConfigError(f"unknown format {format!r}. Available formats: {AUTO}, {', '.join(FORMATS)}")


def detect_text_format(text: str) -> TextAdapter:
    """The text adapter for ``text``: Harmony when it has Harmony headers, else the tag format whose
    first tag comes earliest, else ``plain``. Markers of a second format are caught afterwards by
    the leftover-marker check, never silently kept."""
    harmony = FORMATS["harmony"]
    if harmony.first_marker(text) is not None:  # type: ignore[union-attr]
        return harmony  # type: ignore[return-value]
    found = [(i, a) for a in FORMATS.values() if isinstance(a, TagFormat) and (i := a.first_marker(text)) is not None]
    return min(found, key=lambda f: f[0])[1] if found else FORMATS["plain"]  # type: ignore[return-value]


def extract_text(text: str, where: str, *, format: str = AUTO, tags: tuple[str, str] | None = None) -> Extraction:
    """Extract reasoning and answer from one model output string.

    Parameters
    ----------
    text : str
        The output; CRLF/CR become LF and a leading BOM is dropped first (:func:`normalize_newlines`).
    where : str
        ``file:line`` of the record, for error messages.
    format : str
        A text format name, or ``"auto"``. A forced format whose markers are absent is an error.
    tags : (str, str), optional
        A custom opening/closing tag pair (``ColumnMap.think_tags``); overrides ``format``.

    Raises
    ------
    InputError
        Nested or unbalanced tags, malformed Harmony, or a forced format with none of its markers.
    ConfigError
        Unknown or non-text format name.
    """
    text, newlines = normalize_newlines(text)
    text, eos = strip_trailing_eos(text)
    if tags is not None:
        adapter: TextAdapter = TagFormat("custom", tags[0], tags[1], "custom tags", f"{tags[0]}R{tags[1]}A")
    elif format == AUTO:
        adapter = detect_text_format(text)
    else:
        _check_name(format)
        got = FORMATS[format]
        if isinstance(got, StructuredFormat):
            raise InputError(f"{where}: --format {format} reads a JSON object, but this record's value is a string")
        adapter = got
    if format != AUTO and not isinstance(adapter, PlainFormat) and adapter.first_marker(text) is None:
        raise InputError(f"{where}: --format {adapter.name} was forced, but the text has none of its markers")
    result = adapter.extract(text, where)
    if newlines:
        result = Extraction(**{**result.__dict__, "meta": {**result.meta, "line_endings": newlines}, "notes": (*result.notes, NOTE_NEWLINES)})
    if eos:
        result = Extraction(**{**result.__dict__, "meta": {**result.meta, "eos_token": eos}, "notes": (*result.notes, NOTE_EOS)})
    return result


def detect_structured(record: Any) -> StructuredFormat | None:
    """The structured adapter that recognizes ``record`` (response, Ollama message, transcript), or None."""
    for adapter in FORMATS.values():
        if isinstance(adapter, StructuredFormat) and adapter.detect(record) is not None:
            return adapter
    return None


def _parsed_json(text: str) -> Any:
    """``text`` parsed when it is a JSON object or list that a structured adapter recognizes, else ``text``."""
    head = text.lstrip("\ufeff \t\r\n")[:1]
    if head not in ("{", "["):
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the recursion limit: it stays text
        return text
    return value if detect_structured(value) is not None else text


def extract(value: Any, where: str, *, format: str = AUTO, tags: tuple[str, str] | None = None) -> list[Extraction]:
    """Extract one :class:`Extraction` per generation from a string, a response object or a transcript.

    With ``format="auto"`` a string goes through :func:`detect_text_format` and an object or list
    through :func:`detect_structured`; a forced structured format must recognize the value, and a
    forced text format is used for the text inside a structured value.

    Raises
    ------
    InputError
        The value matches no format, or breaks the rules of the one it matches (see the adapters).
    ConfigError
        Unknown format name.
    """
    _check_name(format)
    forced = FORMATS.get(format)
    if isinstance(value, str) and not isinstance(forced, (TagFormat, HarmonyFormat, PlainFormat)) and tags is None:
        value = _parsed_json(value)  # a response or transcript saved as a JSON string in a text column
    if isinstance(value, str):
        return [extract_text(value, where, format=format, tags=tags)]
    if isinstance(forced, StructuredFormat):
        if forced.detect(value) is None:
            raise InputError(f"{where}: --format {format} was forced, but the record is not one ({forced.description.split(':')[0]})")
        adapter: StructuredFormat | None = forced
    else:
        adapter = detect_structured(value)
    if adapter is None:
        raise InputError(
            f"{where}: the reasoning value is a {type(value).__name__} that matches no known format "
            f"(expected a string, a chat-completion response or a messages list); name the text column with --text-field"
        )
    return adapter.extract(value, where, format if forced is not None and not isinstance(forced, StructuredFormat) else AUTO)

"""The judge's prompt: codebook, then the whole trace with segments marked by id, then the ids to label.

Layout (everything before the id list is identical for every request of one trace, so provider
prompt caches, which match on the longest common prefix, serve it after the first request)::

    system: instructions + the codebook rendered by ror_annotate.codebook.render_markdown
    user:   <problem> ... </problem>
            <trace> ...text with «i» inserted before segment i... </trace>
            Label exactly these segment ids: 12, 13, ...

Markers are ``«i»`` (guillemets are rare in math traces, unlike ``[1]``) inserted in the original
text, so the trace's own line breaks and spacing are preserved.

Traces longer than the context window: when the marked trace does not fit in
``context_tokens - max_tokens - codebook - 512`` tokens (estimated with :func:`approx_tokens`), the
request shows a *window* of whole segments around the requested ones, grown alternately
backwards and forwards until the budget is used, with ``[... segments a-b omitted ...]`` where text
was cut. Such requests lose the shared prefix (and so the prompt cache) but stay within the model's
context.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Sequence

from ..codebook import Codebook, render_markdown
from ..records import SegmentLike, Trace, sha256_text

#: Bump when the template text below changes: its hash is part of the cache key and label provenance.
PROMPT_TEMPLATE_VERSION = "judge-prompt-v2"

SYSTEM_TEMPLATE = """You label the segments of a reasoning trace written by a model while it solved a problem.
Each segment is marked in the trace by its id in guillemets, like «12», placed right before the segment's text.
Apply the codebook below. Label every requested segment id exactly once, using only the six behavior names.
Answer with JSON only, matching the given schema: {{"labels": [{{"segment_id": <int>, "label": <behavior>, "confidence": <0..1 or null>, "rationale": <at most 15 words or null>}}]}}.

{codebook}"""

TRACE_TEMPLATE = """<problem>
{problem}
</problem>

<trace>
{trace}
</trace>
"""

IDS_TEMPLATE = """
Label exactly these segment ids ({n}): {ids}"""

#: Appended after the ids when an answer could not be used, so the retry is never the identical
#: request (a temperature-0 model would repeat the same unusable answer). It comes last, after
#: the shared prefix, so the provider's prompt cache still applies.
RETRY_TEMPLATE = """

Your previous answer could not be used: {problem}. Answer again with the JSON object only: no reasoning, no code fence, no text before or after it."""

#: Extra tokens reserved for message framing and the id list when sizing a window.
_RESERVED_TOKENS = 512
_TOKEN_RE = re.compile(r"\d{1,3}|[^\W\d_]+|[^\w\s]|\s*\n", re.UNICODE)


def approx_tokens(text: str) -> int:
    """Estimated token count of ``text`` for a BPE chat model (``approx:bpe-regex-v1``).

    Counts one token per run of up to 3 digits (as the cl100k/o200k tokenizers split numbers),
    per word, per punctuation or symbol character, and per line break. On English math traces this
    is within about 15% of tiktoken's cl100k counts (long rare words are undercounted, symbols
    slightly overcounted). Used for windowing and for the benchmark; billing uses the usage the
    endpoint reports.
    """
    return len(_TOKEN_RE.findall(text))


@functools.lru_cache(maxsize=256)
def _approx_tokens_cached(text: str) -> int:
    # Every request of a trace measures the same system message and trace block (the same string
    # objects: a cache hit costs an identity check), once per trace instead of once per request.
    return approx_tokens(text)


def template_hash() -> str:
    """sha256 of the prompt templates: recorded on every label and part of the cache key."""
    return sha256_text("\x1f".join([PROMPT_TEMPLATE_VERSION, SYSTEM_TEMPLATE, TRACE_TEMPLATE, IDS_TEMPLATE, RETRY_TEMPLATE]))


def marker(segment_index: int) -> str:
    """The id marker inserted before a segment's text."""
    return f"«{segment_index}» "


def system_message(codebook: Codebook) -> str:
    """The system message: instructions and the rendered codebook (identical for every request)."""
    return SYSTEM_TEMPLATE.format(codebook=render_markdown(codebook))


def marked_trace(trace: Trace, segments: Sequence[SegmentLike], *, window: tuple[int, int] | None = None,
                 mark: Callable[[int], str] = marker) -> str:
    """The trace text with ``«i»`` before each segment; offsets are code-point indices into ``trace.text``.

    Parameters
    ----------
    trace : Trace
    segments : sequence of Segment (or SegmentRow), ordered by ``segment_index``
    window : (first, last) or None
        Positions (into ``segments``, inclusive) to show; text outside is replaced by an omission
        note. ``None`` shows everything, including text before the first and after the last segment.
    mark : callable, default :func:`marker`
        ``segment_index -> marker text`` inserted before each segment (the verifier shows the
        audited label in it).
    """
    text = trace.text
    if window is None:
        lo, hi = 0, len(segments) - 1
        parts = [text[: segments[0].char_start]] if segments else [text]
    else:
        lo, hi = window
        parts = [f"[... segments {segments[0].segment_index}-{segments[lo - 1].segment_index} omitted ...]\n"] if lo > 0 else []
    for pos in range(lo, hi + 1):
        seg = segments[pos]
        if pos > lo:
            parts.append(text[segments[pos - 1].char_end : seg.char_start])
        parts.append(mark(seg.segment_index) + text[seg.char_start : seg.char_end])
    if window is None:
        if segments:
            parts.append(text[segments[-1].char_end :])
    elif hi < len(segments) - 1:
        parts.append(f"\n[... segments {segments[hi + 1].segment_index}-{segments[-1].segment_index} omitted ...]")
    return "".join(parts)


def _choose_window(segments: Sequence[SegmentLike], positions: Sequence[int], budget: int) -> tuple[int, int]:
    costs = [approx_tokens(s.text) + 2 for s in segments]
    lo, hi = min(positions), max(positions)
    used = sum(costs[lo : hi + 1])
    grow_back = True
    while True:
        candidates = [(lo - 1, hi), (lo, hi + 1)] if grow_back else [(lo, hi + 1), (lo - 1, hi)]
        for new_lo, new_hi in candidates:
            if new_lo < 0 or new_hi >= len(segments):
                continue
            extra = costs[new_lo] if new_lo < lo else costs[new_hi]
            if used + extra <= budget:
                lo, hi, used = new_lo, new_hi, used + extra
                break
        else:
            return lo, hi
        grow_back = not grow_back


def build_messages(
    codebook: Codebook,
    trace: Trace,
    segments: Sequence[SegmentLike],
    ids: Sequence[int],
    *,
    context_tokens: int,
    max_tokens: int,
    system: str | None = None,
    full_trace_block: str | None = None,
    retry_problem: str | None = None,
    mark: Callable[[int], str] = marker,
    ids_template: str = IDS_TEMPLATE,
) -> tuple[list[dict[str, str]], bool]:
    """Chat messages asking for the labels of segment ids ``ids`` of ``trace``.

    Parameters
    ----------
    codebook : Codebook
    trace : Trace
    segments : sequence of Segment (or SegmentRow)
        All segments of the trace, ordered by ``segment_index``.
    ids : sequence of int
        Segment indices to label now.
    context_tokens, max_tokens : int
        The model's context window and the output limit, in tokens (windowing budget).
    system, full_trace_block : str, optional
        Precomputed :func:`system_message` and full trace block (saves work for long traces).
    retry_problem : str, optional
        Why the previous answer to this request could not be used; adds :data:`RETRY_TEMPLATE`.
    mark : callable, default :func:`marker`
        Segment marker (see :func:`marked_trace`); must match the one ``full_trace_block`` was built with.
    ids_template : str, default :data:`IDS_TEMPLATE`
        The line asking for the ids, with ``{n}`` and ``{ids}`` fields (the verifier asks for verdicts).

    Returns
    -------
    (messages, windowed)
        ``messages`` for ``chat.completions.create``; ``windowed`` tells whether the trace was cut.
    """
    system = system if system is not None else system_message(codebook)
    block = full_trace_block if full_trace_block is not None else trace_block(trace, segments, mark=mark)
    budget = context_tokens - max_tokens - _approx_tokens_cached(system) - _RESERVED_TOKENS
    windowed = False
    # Every token of approx_tokens is at least one character, so a block of at most ``budget``
    # characters fits without counting (counting a 60 kB block costs milliseconds per trace).
    if len(block) > budget and _approx_tokens_cached(block) > budget:
        index_of = {s.segment_index: pos for s, pos in zip(segments, range(len(segments)))}
        window = _choose_window(segments, [index_of[i] for i in ids], budget - approx_tokens(trace.problem or ""))
        block = TRACE_TEMPLATE.format(problem=trace.problem or "(not given)", trace=marked_trace(trace, segments, window=window, mark=mark))
        windowed = True
    user = block + ids_template.format(n=len(ids), ids=", ".join(str(i) for i in ids))
    if retry_problem:
        user += RETRY_TEMPLATE.format(problem=retry_problem)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}], windowed


def trace_block(trace: Trace, segments: Sequence[SegmentLike], *, mark: Callable[[int], str] = marker) -> str:
    """The ``<problem>``/``<trace>`` block with every segment marked (the per-trace cacheable part)."""
    return TRACE_TEMPLATE.format(problem=trace.problem or "(not given)", trace=marked_trace(trace, segments, mark=mark))


class MessagesJson:
    """The JSON text (as bytes) and sha256 of one trace's chat messages, its shared prefix encoded once.

    Every request of a trace sends the same system message and trace block, then its own id list:
    ``json.dumps(messages, ensure_ascii=False)`` of each request repeats the encoding of the
    ~30-60 kB prefix, and the cache key hashes it again. Here the prefix is encoded and hashed once
    per trace (the JSON of a string cut at a character is the JSON of its two parts, without the
    closing and opening quote between them); each request encodes and hashes only its tail (a copy
    of the prefix's sha256 state). The result is byte-identical to ``json.dumps(messages,
    ensure_ascii=False).encode("utf-8")`` and its sha256, so cache keys do not change.

    Parameters
    ----------
    system : str
        The system message's content.
    block : str
        The trace block every user message of the trace starts with (:func:`trace_block`).
    """

    def __init__(self, system: str, block: str) -> None:
        self.system, self.block = system, block
        head = '[{"role": "system", "content": ' + json.dumps(system, ensure_ascii=False) + '}, {"role": "user", "content": '
        self._head = (head + json.dumps(block, ensure_ascii=False)[:-1]).encode("utf-8")
        self._sha = hashlib.sha256(self._head)

    def encode(self, messages: Sequence[dict[str, str]]) -> tuple[bytes, str] | None:
        """``(json.dumps(messages, ensure_ascii=False) as UTF-8, its sha256 hex)``, or ``None`` when
        ``messages`` are not ``[system, user]`` with this system message and a user message starting
        with the block (a windowed request: the caller encodes it whole)."""
        if len(messages) != 2:
            return None
        system, user = messages
        if (list(system) != ["role", "content"] or list(user) != ["role", "content"] or system["role"] != "system"
                or user["role"] != "user" or system["content"] != self.system or not user["content"].startswith(self.block)):
            return None
        tail = (json.dumps(user["content"][len(self.block) :], ensure_ascii=False)[1:] + "}]").encode("utf-8")
        sha = self._sha.copy()
        sha.update(tail)
        return self._head + tail, sha.hexdigest()

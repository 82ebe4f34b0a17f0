"""Project segment labels onto the token grid of a subject model's tokenizer.

The probe/steer stage reads one routing state per token, so every segment label must sit on the
exact tokens the model saw. This module turns character spans (Python string indices, code points)
into token indices through a fast tokenizer's offset mapping, and verifies the projection.

Alignment rule
--------------
* A token *belongs to* a span ``[s, e)`` iff ``text[max(ts, s):min(te, e)]`` contains at least one
  non-whitespace character (``str.isspace``), where ``(ts, te)`` is the token's character offset.
  Special tokens and zero-width tokens (``ts == te``) never belong to a span.
* A token's *label* (and segment id) is that of the span containing the token's **first non-space
  character**; tokens with no non-space character (whitespace-only, zero-width, special tokens,
  chat-template text) or whose first non-space character lies outside every span get the ignore
  value :data:`IGNORE_INDEX` (``-100``, the ``torch.nn.CrossEntropyLoss`` / token-classification
  convention the exported ``labels`` column uses).
* A *straddling* token has non-space characters in more than one span (or in a span and outside
  every span), e.g. ``".So"`` merged across a clause boundary. It belongs to every span it touches,
  is labeled by its first non-space character, and is counted in :attr:`SpanAlignment.n_straddling`.

These rules handle the known tokenizer pitfalls by construction: byte-level BPE tokens that share
one character (several tokens with the same ``(2, 3)`` offsets all belong to the character's span,
``shared/pitfalls/TOK-01``), SentencePiece tokens whose offsets include the preceding space
(``"▁cat" -> (3, 7)`` is labeled by ``c``, not by the space, ``TOK-03``), and special tokens with
``(0, 0)`` offsets (never in a span, ``TOK-04``).

Chat-template rendering
-----------------------
With ``rendering="chat_template"`` the trace is rendered through the tokenizer's chat template
(problem as the user turn, reasoning inside ``<think>...</think>`` as the assistant turn) so token
indices match a forward pass over what the model saw. The reasoning text is located inside the
rendered string and every segment span is shifted by that offset; offsets in the output index the
rendered text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .errors import AlignmentError, ConfigError
from .records import BEHAVIORS, Segment, Trace

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

#: Ignore value for tokens without a label in the exported ``tokens`` configuration's ``labels``
#: column: ``torch.nn.CrossEntropyLoss``'s default ``ignore_index`` and the value
#: ``transformers.DataCollatorForTokenClassification`` pads labels with.
IGNORE_INDEX = -100

Rendering = Literal["raw", "chat_template"]
RENDERINGS: tuple[str, ...] = ("raw", "chat_template")


# ---------------------------------------------------------------------------------------------
# span -> token alignment on one encoded text
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpanAlignment:
    """Result of :func:`align_spans` for one encoded text.

    Attributes
    ----------
    token_labels : ndarray of shape (n_tokens,), int64
        Label of each token under the first-non-space-character rule, or ``ignore_index``.
    token_spans : ndarray of shape (n_tokens,), int32
        Position (in the ``spans`` argument) of the span that labels each token, or ``-1``.
    token_start, token_end : ndarray of shape (n_spans,), int32
        Half-open token range ``[token_start, token_end)`` from the first to the last token that
        belongs to each span; ``-1`` for a span with no non-space character.
    n_straddling : int
        Tokens with non-space characters in more than one span (or in a span and outside every span).
    straddling : ndarray of shape (n_tokens,), bool
        Which tokens straddle a boundary.
    """

    token_labels: np.ndarray
    token_spans: np.ndarray
    token_start: np.ndarray
    token_end: np.ndarray
    n_straddling: int
    straddling: np.ndarray
    _member: np.ndarray = field(repr=False)

    def span_tokens(self) -> list[list[int]]:
        """Token indices belonging to each span (the overlap rule), in token order.

        Returns
        -------
        list of list of int, length n_spans
            Whitespace-only tokens inside a span's token range are not listed.
        """
        out: list[list[int]] = []
        for k in range(len(self.token_start)):
            lo, hi = int(self.token_start[k]), int(self.token_end[k])
            if lo < 0:
                out.append([])
                continue
            idx = np.arange(lo, hi)
            out.append([int(t) for t in idx[self._member[k](idx)]])
        return out


def nonspace_mask(text: str) -> np.ndarray:
    """Boolean mask of shape ``(len(text),)``: True where ``text[i]`` is not whitespace (``str.isspace``)."""
    return np.fromiter((not c.isspace() for c in text), dtype=bool, count=len(text))


def _next_prev_nonspace(nonspace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``nxt[i]`` = first non-space index >= i (``n`` if none), shape (n+1,);
    ``prv[i]`` = last non-space index <= i (``-1`` if none), shape (n+1,) with ``prv[n] = prv[n-1]``."""
    n = len(nonspace)
    pos = np.arange(n, dtype=np.int64)
    nxt = np.where(nonspace, pos, n)
    nxt = np.minimum.accumulate(nxt[::-1])[::-1] if n else nxt
    nxt = np.append(nxt, n)
    prv = np.where(nonspace, pos, -1)
    prv = np.maximum.accumulate(prv) if n else prv
    prv = np.append(prv, prv[-1] if n else -1)
    return nxt, prv


def align_spans(
    text: str,
    offsets: Sequence[Sequence[int]] | np.ndarray,
    spans: Sequence[Sequence[int]] | np.ndarray,
    *,
    special_tokens_mask: Sequence[int] | np.ndarray | None = None,
    ignore_index: int = IGNORE_INDEX,
    nonspace: np.ndarray | None = None,
    where: str = "text",
) -> SpanAlignment:
    """Map labeled character spans onto tokens (see the module docstring for the rule).

    Parameters
    ----------
    text : str
        The string that was tokenized; offsets index into it (code points).
    offsets : array-like of shape (n_tokens, 2)
        ``(start, end)`` character offsets of each token (a fast tokenizer's ``offset_mapping``).
        Non-special, non-empty tokens must be ordered (non-decreasing starts and ends), as a fast
        tokenizer produces them for one sequence.
    spans : array-like of shape (n_spans, 3)
        ``(char_start, char_end, label)`` per span, half-open, in characters. Spans may overlap; a
        character in several spans takes the label of the first listed one.
    special_tokens_mask : array-like of shape (n_tokens,), optional
        1 for special tokens (BOS/EOS, template tokens); they never receive a label.
    ignore_index : int, default -100
        Label given to tokens outside every span.
    nonspace : ndarray of shape (len(text),), optional
        Precomputed :func:`nonspace_mask` of ``text``.
    where : str
        Names the text in error messages (e.g. a trace id).

    Returns
    -------
    SpanAlignment

    Raises
    ------
    AlignmentError
        Offsets outside the text, out of order, or a span's non-space character covered by no token.
    """
    n = len(text)
    offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    n_tok = len(offs)
    sp = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
    special = (
        np.zeros(n_tok, dtype=bool) if special_tokens_mask is None else np.asarray(special_tokens_mask, dtype=bool)
    )
    if len(special) != n_tok:
        raise AlignmentError(f"{where}: special_tokens_mask has {len(special)} entries for {n_tok} tokens")
    ts, te = offs[:, 0], offs[:, 1]
    if n_tok and (ts.min() < 0 or te.max() > n or np.any(te < ts)):
        bad = int(np.flatnonzero((ts < 0) | (te > n) | (te < ts))[0])
        raise AlignmentError(
            f"{where}: token {bad} has offsets ({ts[bad]}, {te[bad]}) outside the text of {n} characters; "
            "the offsets do not belong to this text"
        )
    if len(sp) and (sp[:, 0].min() < 0 or sp[:, 1].max() > n or np.any(sp[:, 1] <= sp[:, 0])):
        bad = int(np.flatnonzero((sp[:, 0] < 0) | (sp[:, 1] > n) | (sp[:, 1] <= sp[:, 0]))[0])
        raise AlignmentError(f"{where}: span {bad} [{sp[bad, 0]}, {sp[bad, 1]}) is empty or outside the text of {n} characters")

    ns = nonspace_mask(text) if nonspace is None else nonspace
    nxt, prv = _next_prev_nonspace(ns)
    valid = ~special & (te > ts)
    vidx = np.flatnonzero(valid)
    vts, vte = ts[vidx], te[vidx]
    if len(vidx) > 1 and (np.any(np.diff(vts) < 0) or np.any(np.diff(vte) < 0)):
        raise AlignmentError(
            f"{where}: token offsets are not in text order; align one sequence at a time (no pairs, no truncation overflow)"
        )

    # label of the span holding each character (first listed span wins where spans overlap)
    char_span = np.full(n + 1, -1, dtype=np.int64)
    for k in range(len(sp) - 1, -1, -1):
        char_span[sp[k, 0] : sp[k, 1]] = k

    first_ns = nxt[ts]
    has_ns = valid & (first_ns < te)
    tok_span = np.where(has_ns, char_span[np.minimum(first_ns, n)], -1)
    labels_of_span = sp[:, 2]
    token_labels = np.where(tok_span >= 0, labels_of_span[np.maximum(tok_span, 0)] if len(sp) else ignore_index, ignore_index)
    last_ns = prv[np.maximum(te - 1, 0)]
    straddling = has_ns & (char_span[np.minimum(first_ns, n)] != char_span[np.maximum(last_ns, 0)]) & (
        (tok_span >= 0) | (char_span[np.maximum(last_ns, 0)] >= 0)
    )

    # per span: first member = first valid token ending after the span's first non-space char,
    # last member = last valid token starting at or before its last non-space char (offsets are ordered)
    s, e = sp[:, 0], sp[:, 1]
    a = nxt[s]
    b = prv[np.maximum(e - 1, 0)]
    nonempty = a < e
    tok_start: np.ndarray = np.full(len(sp), -1, dtype=np.int64)
    tok_end: np.ndarray = np.full(len(sp), -1, dtype=np.int64)
    if len(sp):
        fi = np.searchsorted(vte, a, side="right")
        li = np.searchsorted(vts, b, side="right") - 1
        covered_a = (fi < len(vidx)) & (vts[np.minimum(fi, max(len(vidx) - 1, 0))] <= a) if len(vidx) else np.zeros(len(sp), bool)
        covered_b = (li >= 0) & (vte[np.maximum(li, 0)] > b) if len(vidx) else np.zeros(len(sp), bool)
        missing = nonempty & ~(covered_a & covered_b)
        if missing.any():
            k = int(np.flatnonzero(missing)[0])
            c = int(a[k]) if not covered_a[k] else int(b[k])
            raise AlignmentError(
                f"{where}: character {c} ({text[c]!r}) of span {k} [{s[k]}, {e[k]}) is covered by no token; "
                "the tokenizer drops or re-maps characters, so labels cannot be projected exactly"
            )
        tok_start = np.where(nonempty, vidx[np.minimum(fi, len(vidx) - 1)] if len(vidx) else -1, -1)
        tok_end = np.where(nonempty, (vidx[np.maximum(li, 0)] + 1) if len(vidx) else -1, -1)

    def member_fn(k: int):
        sk, ek = int(s[k]), int(e[k])

        def is_member(idx: np.ndarray) -> np.ndarray:
            lo = np.maximum(ts[idx], sk)
            hi = np.minimum(te[idx], ek)
            return valid[idx] & (lo < hi) & (nxt[np.minimum(lo, n)] < hi)

        return is_member

    member = np.array([member_fn(k) for k in range(len(sp))], dtype=object)
    return SpanAlignment(
        token_labels=token_labels.astype(np.int64),
        token_spans=tok_span.astype(np.int32),
        token_start=tok_start.astype(np.int32),
        token_end=tok_end.astype(np.int32),
        n_straddling=int(straddling.sum()),
        straddling=straddling,
        _member=member,
    )


def verify_alignment(
    text: str,
    offsets: np.ndarray,
    spans: np.ndarray,
    alignment: SpanAlignment,
    *,
    special_tokens_mask: np.ndarray | None = None,
    nonspace: np.ndarray | None = None,
    where: str = "text",
) -> None:
    """Check that the tokens of each span cover exactly that span's non-space text.

    For every span ``k`` the union of the character ranges of tokens ``[token_start[k], token_end[k])``
    (non-special, non-empty), restricted to ``[s_k, e_k)``, must include every non-space character of
    the span; and every token labeled ``k`` must have its first non-space character inside the span.

    Parameters
    ----------
    text, offsets, spans, special_tokens_mask
        As given to :func:`align_spans`.
    alignment : SpanAlignment
        Its result.

    Raises
    ------
    AlignmentError
        Naming ``where``, the span and the first character that is not covered.
    """
    offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    sp = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
    special = np.zeros(len(offs), bool) if special_tokens_mask is None else np.asarray(special_tokens_mask, bool)
    ns = nonspace_mask(text) if nonspace is None else nonspace
    ts, te = offs[:, 0], offs[:, 1]
    for k in range(len(sp)):
        s, e = int(sp[k, 0]), int(sp[k, 1])
        want = ns[s:e]
        lo, hi = int(alignment.token_start[k]), int(alignment.token_end[k])
        if lo < 0:
            if want.any():
                raise AlignmentError(f"{where}: span {k} [{s}, {e}) has text but no tokens")
            continue
        # coverage restricted to the span, so the check costs O(span + its tokens), not O(text) per span
        length = e - s
        cover = np.zeros(length + 1, dtype=np.int64)
        keep = ~special[lo:hi] & (te[lo:hi] > ts[lo:hi])
        np.add.at(cover, np.clip(ts[lo:hi][keep], s, e) - s, 1)
        np.add.at(cover, np.clip(te[lo:hi][keep], s, e) - s, -1)
        got = np.cumsum(cover[:length]) > 0
        lost = want & ~got
        if lost.any():
            c = s + int(np.flatnonzero(lost)[0])
            raise AlignmentError(
                f"{where}: character {c} ({text[c]!r}) of span {k} [{s}, {e}) is not covered by the span's tokens "
                f"[{lo}, {hi})"
            )
    labeled = np.flatnonzero(alignment.token_spans >= 0)
    if len(labeled):
        span_of = alignment.token_spans[labeled]
        first = ts[labeled]
        # first non-space char of each labeled token must lie inside the span that labels it
        nxt, _ = _next_prev_nonspace(ns)
        f = nxt[first]
        bad = (f < sp[span_of, 0]) | (f >= sp[span_of, 1])
        if bad.any():
            t = int(labeled[np.flatnonzero(bad)[0]])
            raise AlignmentError(f"{where}: token {t} is labeled by span {int(alignment.token_spans[t])} but starts outside it")


# ---------------------------------------------------------------------------------------------
# tokenizers and renderings
# ---------------------------------------------------------------------------------------------
def load_tokenizer(tokenizer: "str | PreTrainedTokenizerBase") -> "PreTrainedTokenizerBase":
    """Load a fast tokenizer (a ``tokenizer.json``, a directory or a model name); see
    :func:`ror_annotate.tokenizer.load_tokenizer`, the one loader every stage uses.

    Raises
    ------
    ConfigError
        It cannot be loaded, or it is a slow tokenizer without an offset mapping.
    """
    from .tokenizer import load_tokenizer as _load

    return _load(tokenizer)


def tokenizer_name(tok: "PreTrainedTokenizerBase", given: Any = None) -> str:
    """The name written in the ``tokenizer`` column and the card: the string the user gave, else ``name_or_path``.

    Exports are published, so an absolute local path never goes in
    (:func:`ror_annotate.tokenizer.public_tokenizer_name`).
    """
    from .tokenizer import public_tokenizer_name

    return public_tokenizer_name(tok, given)


@dataclass(frozen=True)
class RenderedTrace:
    """The string that is tokenized for one trace, and where the trace's reasoning sits in it.

    ``text[text_offset : text_offset + len(trace.text)] == trace.text``; segment spans are shifted by
    ``text_offset`` (characters).
    """

    text: str
    text_offset: int
    rendering: str


#: Message fields chat templates read the reasoning from: GPT-OSS (Harmony) ``thinking``, Qwen3 /
#: DeepSeek ``reasoning_content``, vLLM-era templates ``reasoning``.
REASONING_TEMPLATE_FIELDS: tuple[str, ...] = ("thinking", "reasoning_content", "reasoning")
#: What a template writes right before the reasoning part (think tags, Harmony's analysis channel ...).
REASONING_OPENERS: tuple[str, ...] = (
    "<think>", "<thinking>", "<|channel|>analysis<|message|>", "[THINK]", "<seed:think>", "◁think▷",
    "<|begin_of_thought|>", "<|START_THINKING|>",
)
#: What a template writes right after the reasoning part.
REASONING_CLOSERS: tuple[str, ...] = (
    "</think>", "</thinking>", "<|end|>", "[/THINK]", "</seed:think>", "◁/think▷", "<|end_of_thought|>", "<|END_THINKING|>",
)
#: Code of a chat-template rendering whose reasoning is not in the template's reasoning part.
REASONING_MISPLACED = "E816"


def template_reasoning_fields(template: str) -> list[str]:
    """The reasoning fields of :data:`REASONING_TEMPLATE_FIELDS` a chat template reads from a message.

    A field is read when the template source accesses it as an attribute or a key
    (``message.thinking``, ``m['reasoning_content']``, ``m.get("reasoning")``).

    Parameters
    ----------
    template : str
        The Jinja source of the chat template.

    Returns
    -------
    list of str
        In :data:`REASONING_TEMPLATE_FIELDS` order; empty when the template reads reasoning only
        inline (``<think>`` tags in the content).
    """
    import re

    return [
        f for f in REASONING_TEMPLATE_FIELDS
        if re.search(rf"""(\.{f}\b(?!\s*\()|\[\s*['"]{f}['"]\s*\]|get\(\s*['"]{f}['"])""", template)
    ]


def _in_reasoning_part(rendered: str, pos: int, length: int) -> bool:
    before = rendered[:pos].rstrip()
    after = rendered[pos + length:].lstrip()
    return before.endswith(REASONING_OPENERS) and after.startswith(REASONING_CLOSERS)


def render_trace(trace: Trace, tok: "PreTrainedTokenizerBase | None", rendering: str = "raw") -> RenderedTrace:
    """Render one trace for tokenization.

    ``"raw"`` is the reasoning text alone. ``"chat_template"`` renders a user turn (the problem) and
    an assistant turn through the tokenizer's chat template, passing the reasoning the way the
    template reads it: in the field it reads (:func:`template_reasoning_fields`: ``thinking`` for
    GPT-OSS Harmony, ``reasoning_content`` for Qwen3/DeepSeek, ``reasoning``), with the answer as
    ``content``; or, for a template that reads no such field, inline as
    ``"<think>\n" + reasoning + "\n</think>\n\n" + answer`` in ``content``. The reasoning is then
    located after the problem, and must sit in the template's reasoning part: right after a reasoning
    opener (:data:`REASONING_OPENERS`: ``<think>``, Harmony's analysis channel ...) and right before
    its closer. Each field the template reads is tried in turn, then the inline form.

    Raises
    ------
    ConfigError
        Unknown rendering, or the tokenizer has no chat template.
    AlignmentError
        The template changed the reasoning text, so it cannot be found verbatim (``E800``); or it
        renders the reasoning outside a reasoning part, e.g. in the final answer (``E816``).
    """
    if rendering == "raw":
        return RenderedTrace(trace.text, 0, "raw")
    if rendering != "chat_template":
        raise ConfigError(f"unknown rendering {rendering!r}; choose one of {', '.join(RENDERINGS)}")
    template = getattr(tok, "chat_template", None) if tok is not None else None
    if tok is None or not template:
        raise ConfigError(
            f"the tokenizer {getattr(tok, 'name_or_path', None)!r} has no chat template; export without --chat-template "
            "or use the subject model's own tokenizer"
        )
    problem = trace.problem or ""
    answer = trace.answer or ""
    fields = template_reasoning_fields(str(template))

    attempts: list[tuple[str, dict[str, str]]] = [(f, {"content": answer, f: trace.text}) for f in fields]
    source = template if isinstance(template, str) else str(template)
    # A template that reads a reasoning field would print inline think tags as literal answer text,
    # unless it parses them itself (Qwen3's splits the content at </think>).
    if not fields or "</think>" in source:
        attempts.append(("inline <think>", {"content": f"<think>\n{trace.text}\n</think>\n\n{answer}"}))
    misplaced: list[str] = []
    for how, assistant in attempts:
        messages = [{"role": "user", "content": problem}, {"role": "assistant", **assistant}]
        try:
            rendered = tok.apply_chat_template(messages, tokenize=False)
        except Exception as exc:  # jinja errors come in many types
            raise AlignmentError(f"trace {trace.trace_id}: the chat template failed to render: {exc}") from exc
        if not isinstance(rendered, str):
            raise AlignmentError(f"trace {trace.trace_id}: the chat template returned {type(rendered).__name__}, not a string")
        start = rendered.find(problem) + len(problem) if problem and problem in rendered else 0
        pos = rendered.find(trace.text, start)
        if pos < 0:
            continue
        if _in_reasoning_part(rendered, pos, len(trace.text)):
            return RenderedTrace(rendered, pos, "chat_template")
        misplaced.append(how)
    if misplaced:
        raise AlignmentError(
            f"trace {trace.trace_id}: the chat template of {getattr(tok, 'name_or_path', None)!r} renders the reasoning "
            f"outside a reasoning part (passed as {', '.join(misplaced)}; not between {REASONING_OPENERS[0]}/"
            f"{REASONING_CLOSERS[0]}, Harmony's analysis channel or another known reasoning opener and closer): the "
            "labels would sit on tokens the model reads as its answer; export with the raw rendering instead",
            code=REASONING_MISPLACED,
        )
    raise AlignmentError(
        f"trace {trace.trace_id}: the reasoning text does not appear verbatim in the chat-template rendering "
        "(the template rewrites or strips it); export with the raw rendering instead"
    )


@dataclass
class TraceTokens:
    """Token-level view of one trace: one row of the ``tokens`` configuration.

    Attributes
    ----------
    input_ids : ndarray of shape (n_tokens,), int32
    labels : ndarray of shape (n_tokens,), int64 -- class id in :data:`~ror_annotate.records.BEHAVIORS` or :data:`IGNORE_INDEX` (-100)
    segment_ids : ndarray of shape (n_tokens,), int32 -- ``segment_index`` or -1
    offsets : ndarray of shape (n_tokens, 2), int32 -- characters into ``rendered.text``
    token_start, token_end : ndarray of shape (n_segments,), int32 -- half-open token span per segment
        (in the order of the segments given), -1 when the segment has no tokens
    n_straddling : int
    rendered : RenderedTrace
    """

    input_ids: np.ndarray
    labels: np.ndarray
    segment_ids: np.ndarray
    offsets: np.ndarray
    token_start: np.ndarray
    token_end: np.ndarray
    n_straddling: int
    rendered: RenderedTrace


#: Code of a class id outside the codebook given to :meth:`TokenAligner.align`.
BAD_CLASS_ID = "E814"


class TokenAligner:
    """Align the segments of traces to the tokens of one fast tokenizer.

    Parameters
    ----------
    tokenizer : str or PreTrainedTokenizerBase
        See :func:`load_tokenizer`.
    rendering : {"raw", "chat_template"}
        What is tokenized (see :func:`render_trace`). ``raw`` adds the tokenizer's own special tokens
        (BOS...) as a plain forward pass would; ``chat_template`` tokenizes the rendered string as is.
    verify : bool, default True
        Run :func:`verify_alignment` on every trace.
    n_classes : int, default ``len(BEHAVIORS)`` (6)
        Number of classes of the codebook; :meth:`align` accepts the class ids ``0 .. n_classes - 1``
        and :data:`IGNORE_INDEX`, nothing else.

    Raises
    ------
    AlignmentError, ConfigError
        See :func:`load_tokenizer`; ``n_classes`` below 1.
    """

    def __init__(
        self, tokenizer: "str | PreTrainedTokenizerBase", *, rendering: str = "raw", verify: bool = True,
        n_classes: int = len(BEHAVIORS),
    ) -> None:
        if rendering not in RENDERINGS:
            raise ConfigError(f"unknown rendering {rendering!r}; choose one of {', '.join(RENDERINGS)}")
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
            raise ConfigError(f"n_classes must be a positive integer, got {n_classes!r}")
        self.n_classes = n_classes
        self.tokenizer = load_tokenizer(tokenizer)
        self.name = tokenizer_name(self.tokenizer, tokenizer)
        from .tokenizer import tokenizer_vocab_sha256

        #: sha256 of the vocabulary (:func:`ror_annotate.tokenizer.tokenizer_vocab_sha256`), recorded in exports.
        self.vocab_sha256 = tokenizer_vocab_sha256(self.tokenizer)
        self.rendering = rendering
        self.verify = verify
        if rendering == "chat_template" and not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                f"the tokenizer {self.name!r} has no chat template; export without --chat-template or pick the "
                "subject model's tokenizer"
            )
        # [UNK] stands for real text, so it keeps its label
        special_ids = set(getattr(self.tokenizer, "all_special_ids", []) or []) - {getattr(self.tokenizer, "unk_token_id", None)}
        self._special_ids = np.array(sorted(special_ids), dtype=np.int64)

    def encode(self, texts: Sequence[str]) -> list[Any]:
        """Batch-encode rendered texts with offsets (the Rust tokenizer parallelizes the batch)."""
        add_special = self.rendering == "raw"
        enc = self.tokenizer(
            list(texts),
            add_special_tokens=add_special,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            return_attention_mask=False,
            truncation=False,
            verbose=False,
        )
        return [
            (enc["input_ids"][i], enc["offset_mapping"][i], enc["special_tokens_mask"][i]) for i in range(len(texts))
        ]

    def align(self, traces: Sequence[Trace], segments: Sequence[Sequence[Segment]], labels: Sequence[Sequence[int]]) -> list[TraceTokens]:
        """Align a batch of traces.

        Parameters
        ----------
        traces : sequence of Trace, length n_traces
        segments : sequence of sequences of Segment
            The segments of each trace, ordered by ``segment_index``.
        labels : sequence of sequences of int
            Class id of each segment (or :data:`IGNORE_INDEX` for an unlabeled one), parallel to ``segments``.

        Returns
        -------
        list of TraceTokens, length n_traces

        Raises
        ------
        AlignmentError
            A segment's text is not at its offsets in the trace, or the verification fails.
        AlignmentError
            A class id outside ``0 .. n_classes - 1`` (other than :data:`IGNORE_INDEX`), or ``labels`` not
            parallel to ``segments`` (code ``E814``, naming the trace, the segment and the id).
        """
        self._check_labels(traces, segments, labels)
        rendered = [render_trace(t, self.tokenizer, self.rendering) for t in traces]
        encoded = self.encode([r.text for r in rendered])
        out = []
        for trace, segs, labs, rend, (ids, offs, smask) in zip(traces, segments, labels, rendered, encoded):
            out.append(self._align_one(trace, segs, labs, rend, ids, offs, smask))
        return out

    def _check_labels(self, traces: Sequence[Trace], segments: Sequence[Sequence[Segment]], labels: Sequence[Sequence[int]]) -> None:
        if not (len(traces) == len(segments) == len(labels)):
            raise AlignmentError(
                f"traces, segments and labels must be parallel: got {len(traces)}, {len(segments)} and {len(labels)}",
                code=BAD_CLASS_ID,
            )
        for trace, segs, labs in zip(traces, segments, labels):
            if len(segs) != len(labs):
                raise AlignmentError(
                    f"trace {trace.trace_id}: {len(labs)} labels for {len(segs)} segments", code=BAD_CLASS_ID
                )
            for seg, lab in zip(segs, labs):
                ok = isinstance(lab, (int, np.integer)) and not isinstance(lab, bool) and (0 <= lab < self.n_classes or lab == IGNORE_INDEX)
                if not ok:
                    raise AlignmentError(
                        f"trace {trace.trace_id} segment {seg.segment_index}: class id {lab!r} is outside the codebook's "
                        f"{self.n_classes} classes (0..{self.n_classes - 1}, or {IGNORE_INDEX} for no label)",
                        code=BAD_CLASS_ID,
                    )

    def _align_one(self, trace, segs, labs, rend, ids, offs, smask) -> TraceTokens:
        ids = np.asarray(ids, dtype=np.int64)
        offs = np.asarray(offs, dtype=np.int64).reshape(-1, 2)
        special = np.asarray(smask, dtype=bool)
        if len(self._special_ids):  # special tokens written literally by a chat template
            special |= np.isin(ids, self._special_ids)
        shift = rend.text_offset
        for s in segs:
            if rend.text[s.char_start + shift : s.char_end + shift] != s.text:
                raise AlignmentError(
                    f"segment {s.segment_id}: its text is not at [{s.char_start}, {s.char_end}) of the trace; "
                    "the stored segmentation does not match the stored trace (re-run ror segment)"
                )
        spans = np.array(
            [(s.char_start + shift, s.char_end + shift, lab) for s, lab in zip(segs, labs)], dtype=np.int64
        ).reshape(-1, 3)
        ns = nonspace_mask(rend.text)
        where = f"trace {trace.trace_id} ({self.rendering} rendering, tokenizer {self.name})"
        al = align_spans(rend.text, offs, spans, special_tokens_mask=special, nonspace=ns, where=where)
        if self.verify:
            verify_alignment(rend.text, offs, spans, al, special_tokens_mask=special, nonspace=ns, where=where)
        seg_index = np.array([s.segment_index for s in segs], dtype=np.int32)
        seg_ids = np.where(al.token_spans >= 0, seg_index[np.maximum(al.token_spans, 0)] if len(segs) else -1, -1)
        return TraceTokens(
            input_ids=ids.astype(np.int32),
            labels=al.token_labels,
            segment_ids=seg_ids.astype(np.int32),
            offsets=offs.astype(np.int32),
            token_start=al.token_start,
            token_end=al.token_end,
            n_straddling=al.n_straddling,
            rendered=rend,
        )

"""Split a reasoning trace into sentence- and clause-level segments with exact offsets.

The segmenter follows spaCy's rule-based ``sentencizer`` (a mark of its punctuation list,
``Sentencizer.default_punct_chars``, ends a sentence) and spaCy's English tokenizer
exceptions (abbreviations), read directly on characters, plus rules for the text reasoning
models write. It does not run spaCy's pipeline: on every trace the pipeline's sentence starts
were a subset of the character rule's (spaCy keeps ``x.`` or ``Inc.`` as one token, so it
alone misses ``value of x. Then``), and tokenizing every line cost more than all the rules.

1. **Protected spans** are found first and never contain a boundary: code fences
   (```` ``` ```` / ``~~~``), display math (``$$...$$``, ``\\[...\\]``,
   ``\\begin{env}...\\end{env}``), inline math (``\\(...\\)``, ``$...$`` with Pandoc's
   delimiter rule) and inline code. Math may not run over a blank line (LaTeX rejects a
   paragraph break inside math), so one unclosed delimiter cannot swallow the trace, except
   display math whose delimiters stand on lines of their own (``\\[``, blank line, equation,
   blank line, ``\\]``, as some models write it), within 3,000 characters and, for the
   segmenter, the soft limit of rule 4. Line ends are LF, CRLF or a lone CR everywhere.
2. **Line breaks** outside protected spans end a segment (paragraphs, list items, headings,
   display equations each start their own segment), except where the next line continues the
   unit (:meth:`Segmenter._join_lines`): a line starting with ``=`` continues the equation above
   it, a Markdown table rule (``---|---``) its header row, and lines of symbols (no word of three
   letters or more: table rows, a column of values; not a line that opens display math, which is
   its own equation) one line end apart form one piece, while the piece stays within the soft
   limit of rule 4.
3. **Sentence ends**: a sentence mark of any script (``.!?…``, ``।``, ``؟`` ...) with closing
   quotes or brackets, then whitespace; full-width CJK enders (``。！？``) need no whitespace.
   A candidate is dropped when it would cut inside a protected span, between an enumerator and
   its item (``1.``, ``(a)``, ``- ``; on any line of a joined piece), before an equation number
   that closes its line (``x = 2y. (1)``), after an abbreviation (spaCy's English tokenizer
   exceptions plus a list for technical prose: ``approx.``, ``incl.``, ``e.g.``, ``Eq. 3``
   ...), before a lowercase word (except after a bare question mark: ``is it? yes`` ends a
   sentence, ``"is it?" and`` does not; and a formula after a period, ``2.45 rad. cos(2.45)``,
   ``100%. g1 is``, ``σ_x also``, ``∂f/∂z = 2z``, ``|a|^2 = 0.25``, ``z was found``, starts one),
   and when no whitespace separates the two sides
   (decimals, file names).
4. **Clauses**, at the method's granularity (a sentence stays whole unless it is long or a new
   reasoning step starts inside it): a cue that opens a new step (``, wait``, ``; hmm``,
   ``, alternatively``, ``, but wait``) always starts a clause when both sides keep at least
   :data:`MIN_CLAUSE_TOKENS` tokens; a piece longer than :data:`SOFT_MAX_TOKENS` is halved at
   its most central strong clause mark (``; ``, ``, so``, ``, but``, ``, therefore``, ``；``
   ...), else at weaker clause punctuation (``, ``, ``: ``, ``，``, ``：``, ``、``, before
   ``and``/``then``/``where``...), until every piece fits. These sizes are measured with the
   ``approx:regex-v1`` counter whatever tokenizer is configured, so the rules are fast and do
   not depend on the tokenizer; only the cap does.
5. **Hard cap**: a piece over ``max_tokens`` is split at the best available boundary: clause
   punctuation (ASCII or full width), then whitespace outside math, then whitespace inside
   math, then a character cut that prefers the position after a punctuation mark and never
   starts a segment with a closing mark such as ``，`` when any other cut exists. The cap
   always wins.

Every returned segment satisfies ``text[char_start:char_end] == segment.text``, has no
leading or trailing whitespace, and the segments are ordered, non-overlapping and cover
every non-whitespace character (whitespace as defined by :meth:`str.isspace`). These
invariants are checked on every call by :func:`check_segments`; a violation raises
:class:`~ror_annotate.errors.SegmentationError` instead of returning bad segments.

Offsets are Python string indices (code points), as everywhere in ror_annotate.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
import statistics
import unicodedata
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import ConfigError, SegmentationError
from .records import Segment
from .tokenizer import APPROX_COUNTER_NAME, ApproxTokenCounter, HFTokenCounter, TokenCounter, _count_many, make_token_counter

__all__ = [
    "APPROX_COUNTER_NAME",
    "SEGMENTER_NAME",
    "ApproxTokenCounter",
    "HFTokenCounter",
    "Segmenter",
    "TokenCounter",
    "check_segments",
    "find_protected_spans",
    "make_token_counter",
    "MAX_SEGMENT_TOKENS",
    "METHOD_LENGTH_PROFILE",
    "segment_many",
    "segment_stats",
    "segment_text",
]

#: Versioned id of the rule set below; change it whenever a rule changes the output (the store
#: compares it to skip re-segmenting traces already segmented by the same rules). v4 (from v3):
#: line joins of rule 2, formula sentence starts of rule 3, soft limit 100 (was 80) approximate
#: tokens. v5 (from v4): display math lines are not joined as lines of symbols, display math with
#: its delimiters on lines of their own may hold blank lines (up to the soft limit), an enumerator
#: on an inner line of a joined piece keeps its item, an equation number closing a line stays with
#: its equation, and formulas opened by a letter of any script (``σ_x``), a math operator (``∂``,
#: ``∇``, ``√``, ``|a|``) or a lone variable before a verb (``z was``) start a sentence after a
#: period. Only the current rule set is implemented: `ror segment` re-segments a trace segmented
#: by v4 (refused while labels refer to it, as after any rule change; a trace whose spans are the
#: same under v5 keeps its labels and only its provenance changes).
SEGMENTER_NAME = "ror-clause-v5"
#: The method's hard cap on a segment's length, in tokens of the subject model's tokenizer.
MAX_SEGMENT_TOKENS = 125
#: Segment length profile of the method's corpus (tokens; Wang, Fayyaz, Peng, arXiv:2611.05919):
#: 78,955 segments of 330 traces. Shown beside ours by ``ror segment --stats`` and the dataset card.
#: ``segments_per_trace`` is its mean number of segments per trace; ``max`` is the cap.
METHOD_LENGTH_PROFILE: dict[str, float] = {"segments_per_trace": 239, "median": 16, "p5": 3, "p95": 47, "max": MAX_SEGMENT_TOKENS}
#: A clause split must leave at least this many tokens on each side. Like SOFT_MAX_TOKENS it is
#: measured with the ``approx:regex-v1`` counter whatever tokenizer is configured, so the rules
#: (not the cap) give the same segments for every tokenizer and stay fast.
MIN_CLAUSE_TOKENS = 4
#: A sentence (or a cue-led clause) longer than this many approximate tokens is cut at its most
#: central strong clause mark (``; ``, ``, so``, ``, but`` ...), else at weaker clause punctuation,
#: until every piece fits; a shorter one stays whole, like the reference clause segmentations.
SOFT_MAX_TOKENS = 100


# --------------------------------------------------------------------------- records
def _fast_segment_factory() -> Any:
    """A constructor of already-checked :class:`Segment` records, about 2x ``model_construct``.

    It fills the same four slots ``Segment.model_construct`` fills for a model without defaults,
    extras or private attributes. Building segments is the part of :func:`segment_many` that
    runs in the parent process, so it bounds the parallel speed-up. At import the result is
    compared with a validated record; if a pydantic version fills other slots,
    ``model_construct`` is used instead.
    """
    fields = frozenset(Segment.model_fields)
    new, setattr_ = object.__new__, object.__setattr__

    def make(trace_id: str, segment_index: int, char_start: int, char_end: int, text: str, n_tokens: int) -> Segment:
        obj = new(Segment)
        setattr_(obj, "__dict__", {"trace_id": trace_id, "segment_index": segment_index, "char_start": char_start,
                                   "char_end": char_end, "text": text, "n_tokens": n_tokens})
        setattr_(obj, "__pydantic_fields_set__", set(fields))
        setattr_(obj, "__pydantic_extra__", None)
        setattr_(obj, "__pydantic_private__", None)
        return obj

    def construct(trace_id: str, segment_index: int, char_start: int, char_end: int, text: str, n_tokens: int) -> Segment:
        return Segment.model_construct(trace_id=trace_id, segment_index=segment_index, char_start=char_start,
                                       char_end=char_end, text=text, n_tokens=n_tokens)

    probe = ("t", 0, 0, 2, "ab", 1)
    ref = Segment(trace_id="t", segment_index=0, char_start=0, char_end=2, text="ab", n_tokens=1)
    fast = make(*probe)
    same = all(getattr(fast, slot, None) == getattr(ref, slot, None) for slot in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"))
    return make if same and fast == ref and fast.model_dump_json() == ref.model_dump_json() else construct


#: ``_new_segment(trace_id, segment_index, char_start, char_end, text, n_tokens)``: a
#: :class:`Segment` without validation, for spans :func:`check_segments` verifies.
_new_segment = _fast_segment_factory()


# --------------------------------------------------------------------------- protected spans
# Line ends as Markdown and LaTeX read them: LF, CRLF or a lone CR (old Mac, some exports).
_EOL = r"(?:\r\n|\r(?!\n)|\n)"  # never "\r" alone when "\n" follows: CRLF is one line end
_NO_BLANK = rf"(?:(?!{_EOL}[ \t]*{_EOL}).)"  # any char, but never across a blank line
_PROTECTED = re.compile(
    rf"(?P<fence>(?:^|(?<=\r))[ \t]*(?P<ticks>`{{3,}}|~{{3,}})[^\r\n]*"
    rf"(?:{_EOL}.*?(?:{_EOL}[ \t]*(?P=ticks)[ \t]*(?=[\r\n]|\Z))|.*\Z))"
    # v5: display math whose delimiters stand on lines of their own may hold blank lines (some models
    # write "\\[", a blank line, the equation, a blank line, "\\]"): it opens a line, holds no other
    # delimiter of its kind and closes within 3,000 characters, so a stray delimiter swallows little.
    rf"|(?P<ownbrk>(?<![^\r\n])\\\[[ \t]*{_EOL}(?:(?!\\[\[\]]).){{1,3000}}?{_EOL}[ \t]*\\\](?=[ \t]*(?:[\r\n]|\Z)))"
    rf"|(?P<owndd>(?<![^\r\n])\$\$[ \t]*{_EOL}(?:(?!\$\$).){{1,3000}}?{_EOL}[ \t]*\$\$(?=[ \t]*(?:[\r\n]|\Z)))"
    rf"|(?P<ownenv>(?<![^\r\n])\\begin\{{(?P<ownname>[A-Za-z]+\*?)\}}[ \t]*{_EOL}(?:(?!\\(?:begin|end)\{{(?P=ownname)\}}).){{1,3000}}?"
    rf"{_EOL}[ \t]*\\end\{{(?P=ownname)\}}(?=[ \t]*(?:[\r\n]|\Z)))"
    rf"|(?P<dd>\$\${_NO_BLANK}+?\$\$)"
    rf"|(?P<brk>\\\[{_NO_BLANK}+?\\\])"
    rf"|(?P<env>\\begin\{{(?P<envname>[A-Za-z]+\*?)\}}{_NO_BLANK}*?\\end\{{(?P=envname)\}})"
    rf"|(?P<par>\\\({_NO_BLANK}+?\\\))"
    r"|(?P<dollar>(?<![\\$])\$(?=[^\s$])[^$\r\n]*?(?<=[^\s\\$])\$(?![\d$]))"
    r"|(?P<code>`[^`\r\n]+`)",
    re.MULTILINE | re.DOTALL,
)
# Characters at which (or at whose line start) a protected span can begin.
_PROTECTED_TRIGGER = re.compile(r"[$\\`~]")


def find_protected_spans(text: str) -> list[tuple[int, int]]:
    """Character spans that must never contain a segment boundary.

    Parameters
    ----------
    text : str
        The trace.

    Returns
    -------
    list of (int, int)
        Sorted, non-overlapping half-open ``[start, end)`` spans (characters) of code fences,
        display math (``$$..$$``, ``\\[..\\]``, ``\\begin{env}..\\end{env}``), inline math
        (``\\(..\\)``, ``$..$``) and inline code. An unclosed code fence runs to the end of the
        text (Markdown's rule); math delimiters are matched within one paragraph (except display
        math whose opening and closing delimiters each stand on a line of their own, closed within
        3,000 characters with no other delimiter of its kind inside: it may hold blank lines), and
        inline ``$`` follows Pandoc's rule (no space inside the delimiters, closing ``$`` not followed
        by a digit), so prices such as ``$5 and $10`` are not math.
    """
    # Same result as ``[m.span() for m in _PROTECTED.finditer(text)]``, about 20x faster: a match
    # can only start at a "$", "\\" or "`", or at the start of a line whose first non-blank
    # character is "`" or "~" (a fence), so only those positions are tried, in text order.
    spans: list[tuple[int, int]] = []
    end = 0
    match = _PROTECTED.match
    for trigger in _PROTECTED_TRIGGER.finditer(text):
        p = trigger.start()
        if p < end:
            continue
        if text[p] in "`~":
            line_start = max(text.rfind("\n", 0, p), text.rfind("\r", 0, p)) + 1
            if line_start >= end and line_start < p and not text[line_start:p].strip(" \t"):
                m = match(text, line_start)
                if m is not None and m.group("fence") is not None:
                    spans.append(m.span())
                    end = m.end()
                    continue
        m = match(text, p)
        if m is not None:
            spans.append(m.span())
            end = m.end()
    return spans


class _Spans:
    """Sorted non-overlapping spans with O(log n) "is this cut inside one?" queries."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self.spans = spans
        self.starts = [s for s, _ in spans]

    def inside(self, pos: int) -> bool:
        """True when a cut at ``pos`` (between pos-1 and pos) falls strictly inside a span."""
        i = bisect.bisect_right(self.starts, pos - 1) - 1
        return i >= 0 and self.spans[i][0] < pos < self.spans[i][1]


# --------------------------------------------------------------------------- rules
_LINE_BREAK = re.compile(r"[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# Enumerators and bullets that start a line: "1.", "2)", "(a)", "iv.", "- ", "\- ", "* ", "#".
_ENUM_MARK = (
    r"(?:\*\*|__)?(?:\\?[-*+•·‣◦▪–—]|\d{1,3}(?:\.\d{1,3})*[.)]|\(\w{1,4}\)|[A-Za-z][.)]|[ivxlcdmIVXLCDM]{1,6}[.)]"
    r"|#{1,6}|>+|(?:Step|Case|Part)\s+\w{1,4}[.:)])(?:\*\*|__)?"
)
_ENUMERATOR = re.compile(rf"[ \t]*(?:{_ENUM_MARK}\s+)+")


@lru_cache(maxsize=1)
def _spacy_sentence_enders() -> str:
    """spaCy's sentencizer punctuation (``Sentencizer.default_punct_chars``: ``.!?``, ``。！？``,
    ``।``, ``؟``, ``።`` and the enders of other scripts), plus ``…``. Imports spaCy (seconds),
    so it is called when a :class:`Segmenter` is built, not when this module is imported, and
    cached per spaCy version (:func:`_cached_spacy_list`)."""

    def read() -> Iterable[str]:
        from spacy.pipeline.sentencizer import Sentencizer

        return Sentencizer.default_punct_chars

    return "".join(sorted(set(_cached_spacy_list("sentence-enders", read)) | {"…"}))


def _sentence_end_patterns(enders: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """``(all, bmp)``: sentence punctuation followed by whitespace, closing quotes, brackets and
    emphasis allowed between (spaCy's sentencizer rule, a token of its punctuation list ends a
    sentence, read on characters). ``bmp`` leaves out the enders beyond U+FFFF: a character
    class with astral members makes ``re`` test every position the slow way (10x slower on the
    real traces), so ``bmp`` serves every text without an astral character."""
    tail = r"[\"'”’»)\]}*_]*\s+(?=\S)"
    bmp = "".join(c for c in enders if c <= "\uffff")
    # A match may start only where a run of enders starts: tried from inside a run that is not
    # followed by the tail (a line of 20,000 dots, "。。。..."), the greedy run backtracked through
    # every shorter length at every position, quadratic in the run (43 s of CPU for 60,000 dots).
    # The matches are the same: a run that fails from its start fails from inside it.
    return (re.compile(f"(?<![{re.escape(enders)}])[{re.escape(enders)}]+{tail}"),
            re.compile(f"(?<![{re.escape(bmp)}])[{re.escape(bmp)}]+{tail}"))


# Question marks of any script: a quoted or bracketed question may continue its sentence.
_QUESTION_MARKS = frozenset("?？؟﹖⸮፧⁇")
# Full-width sentence enders of scripts written without spaces (CJK needs no space after them).
_CJK_END = re.compile(r"[。！？｡]+[」』”’）)】〕〉》]*\s*(?=\S)")
# Openers that belong to the next sentence when spaCy leaves them on the previous one.
_OPENERS = "\"'“‘«([{*_"
_CLOSERS = "\"'”’»)]}*_"

#: Abbreviations after which a period never ends a sentence (titles, Latin and technical
#: shorthand). Lowercased, without the final period.
ABBREVIATIONS_NEVER_FINAL = frozenset(
    """
    e.g eg i.e ie vs v.s viz cf approx appr apx incl excl resp esp w.r.t wrt a.k.a aka ca c.f
    mr mrs ms dr prof st mt gen gov sen rep rev adm messrs sgt capt lt col cmdr jr sr
    """.split()
)
#: Abbreviations that end a sentence unless a number (or a lowercase word) follows:
#: "Eq. 3", "No. 5", "Fig. 2", "p. 14", "Jan. 5".
ABBREVIATIONS_BEFORE_NUMBER = frozenset(
    """
    no nos nr eq eqs eqn eqns fig figs thm thms lem lemma prop def defn cor sec sect ch chap ref refs
    tab tbl app appx vol p pp art ex exs ex ps pt pts
    jan feb mar apr jun jul aug sep sept oct nov dec
    """.split()
)


#: Initials: one capital letter, or a chain written without spaces ("A.N"), before the final period.
_INITIALS = re.compile(r"[A-Z](?:\.[A-Z])*")
#: Words that open a sentence after a one-letter sentence end ("... the vertex is B. Now ..."), on top
#: of spaCy's English stop words: the openers of reasoning steps. Any other capitalized word after an
#: initial is taken as the rest of a name ("A. N. Kolmogorov"), which is not a sentence end.
SENTENCE_STARTERS = frozenset(
    """
    let wait hmm hmmm okay ok alright alternatively hence thus similarly therefore finally first second third
    next now then so but also maybe perhaps actually note notice recall consider suppose assume given since
    because check compute calculate verify compare substituting substitute plugging using yes no right good
    great oh ah well another option answer step case looking adding multiplying dividing subtracting solving
    simplifying expanding factoring take set try indeed clearly obviously otherwise instead anyway again still
    correct wrong hold oops sorry find count start let's i'm i'll we're that's it's there's
    """.split()
)


#: Words after which a single capital letter with a period is a name's initial ("proved by A. Kolmogorov").
_NAME_CUES = frozenset("by and with mathematician physicist professor prof. dr. mr. mrs. ms. sir".split())


@lru_cache(maxsize=1)
def _sentence_starters() -> frozenset[str]:
    return _spacy_stop_words() | SENTENCE_STARTERS


def _cached_spacy_list(kind: str, compute: "Callable[[], Iterable[str]]") -> frozenset[str]:
    """A list read from spaCy, cached per spaCy version beside :func:`_abbreviation_cache`'s file
    (``spacy-<kind>-<version>.json``): importing spaCy imports thinc and torch, seconds per process.
    A missing or unreadable cache is computed with ``compute`` and (re)written when it can be."""
    base = _abbreviation_cache()
    cache = base.with_name(base.name.replace("spacy-abbreviations-", f"spacy-{kind}-")) if base is not None else None
    if cache is not None:
        try:
            return frozenset(json.loads(cache.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            pass
    out = frozenset(compute())
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(sorted(out), ensure_ascii=False), encoding="utf-8")
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only home: read spaCy again next time
    return out


@lru_cache(maxsize=1)
def _spacy_stop_words() -> frozenset[str]:
    """spaCy's English stop words (cached per spaCy version: :func:`_cached_spacy_list`)."""

    def read() -> Iterable[str]:
        from spacy.lang.en.stop_words import STOP_WORDS

        return STOP_WORDS

    return _cached_spacy_list("stop-words", read)


@lru_cache(maxsize=1)
def _spacy_abbreviations() -> frozenset[str]:
    """Multi-letter abbreviations from spaCy's English tokenizer exceptions ("Inc.", "Ph.D.").

    Importing spaCy costs seconds (it imports thinc and torch), in every process that segments,
    for a list that only changes with spaCy's version. So the list is cached in a JSON file per
    installed spaCy version (:func:`_abbreviation_cache`); without a usable cache it is read from
    spaCy as before.
    """
    cache = _abbreviation_cache()
    if cache is not None:
        try:
            return frozenset(json.loads(cache.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            pass
    from spacy.lang.en import English

    out = set()
    for key in English.Defaults.tokenizer_exceptions:
        if key.endswith(".") and len(key) > 2 and key[:-1].replace(".", "").isalpha():
            out.add(key[:-1].lower())
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(sorted(out)), encoding="utf-8")
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only home: read spaCy again next time
    return frozenset(out)


def _abbreviation_cache() -> Path | None:
    """``$ROR_CACHE_DIR`` (else ``$XDG_CACHE_HOME/ror_annotate``, else ``~/.cache/ror_annotate``)
    ``/spacy-abbreviations-<spaCy version>.json``; None when spaCy's version cannot be read."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        spacy_version = version("spacy")
    except PackageNotFoundError:
        return None
    root = os.environ.get("ROR_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ror_annotate")
    return Path(root) / f"spacy-abbreviations-{spacy_version}.json"


# Clause boundaries: the cut is at the end of each match (the next clause's first character).
# A cue that opens a new reasoning step: always a clause start, whatever the sentence length.
_CLAUSE_CUE = re.compile(
    r"[,;]\s+(?=(?:(?:but|and|no|oh|or)[,\s]+)?(?:wait|hmm+|alternatively)\b)"
    r"|\s+[—–]\s+(?=(?:wait|hmm+|alternatively)\b)",
    re.IGNORECASE,
)
# Cheap pre-check: most sentences hold no cue at all.
_CLAUSE_CUE_HINT = re.compile(r"wait|hmm|alternatively", re.IGNORECASE)
# Where a long sentence is cut first: discourse markers and clause punctuation (ASCII and full width).
_CLAUSE_STRONG = re.compile(
    r"[ \t]*[\n\r][\s]*(?=\S)"  # a line end inside a piece of joined lines (Segmenter._join_lines)
    r"|;\s+(?=\S)|；\s*(?=\S)"
    r"|,\s+(?=(?:so|but|however|therefore|thus|hence|otherwise|whereas|"
    r"which\s+(?:means|gives|implies)|meaning|that\s+means)\b)"
    r"|，\s*(?=所以|但是|但|因此|然而|那么|不过|于是|因而|可是)"
    r"|\s+[—–]\s+(?=\S)"
    r"|(?<=\w)—(?=\w)",
    re.IGNORECASE,
)
# Weaker clause punctuation, for a long piece without a strong mark.
_CLAUSE_WEAK = re.compile(
    r"[,:]\s+(?=\S)|[，：、]\s*(?=\S)"
    r"|\s+(?=(?:and|but|so|then|where|which|because|since|while|if|or|giving|yielding)\s)",
    re.IGNORECASE,
)
_WHITESPACE_RUN = re.compile(r"\s+")
# A word of three letters or more (any script): a line without one is a line of symbols.
_WORD3 = re.compile(r"[^\W\d_]{3,}")
# One line end (CRLF counts once), for counting the line ends between two lines.
_LINE_END = re.compile(r"\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# The rule under a Markdown table's header row: "---|---", "|:--|--:|".
_TABLE_RULE = re.compile(r"\|?[ \t]*:?-{2,}:?[ \t]*(?:\|[ \t]*:?-{2,}:?[ \t]*)+\|?")
# A formula opening a sentence after a period: "... ≈ 1.617 rad. cos(1.617) ≈ ...", "... is 100%. g1 is 75%".
# A lowercase letter (or a short name: cos, sin, log) directly followed by a subscript, prime,
# bracket, digit, superscript or relation, or a letter then a spaced relation ("x = 3").
_FORMULA_START = re.compile(
    r"[^\W\d_][A-Za-z]{0,4}(?:[_^'′(=≈<>≤≥≡∈→|²³⁴¹⁰⁵⁶⁷⁸⁹\d]|\s*[=≈<>≤≥≡]\s)"  # v5: any script's letter (σ_x, ψ(t))
    r"|[a-z]\s+(?:is|was|are|were|has|had|equals|becomes|must|can|should|will|would|gives|satisfies|ranges)\b"
)
# v5: a formula opened by a math operator that names a quantity (∂f/∂z, ∇f, √2, Σ, ∫) or an
# absolute value (|a|^2 = 0.25) starts a sentence after a period like a formula opened by a letter.
_SYMBOL_FORMULA_START = re.compile(r"[∂∇√∑∏∫]\S|\|[^|\s]{1,12}\|(?:[\^_²³=<>≤≥≈]|\s*[=<>≤≥≈]\s)")
# v5: an equation number closing a line ("... = λ (ρ - R). (1)"): the label of the equation before it.
_EQUATION_TAG = re.compile(r"\((?:\d{1,3}[a-z]?'?|[*†‡]{1,3})\)[ \t]*(?:[\r\n]|\Z)")
# A blank line (any line end style): a display span holding one was matched by an own-line rule.
_BLANK_LINE = re.compile(rf"{_EOL}[ \t]*{_EOL}")
# v5: a line that opens display math (its own display equation, rule 2): never joined as a line of symbols.
_DISPLAY_OPEN = ("\\[", "$$", "\\begin{")


class Segmenter:
    """Clause-level segmenter for reasoning traces (spaCy's sentencizer rule and abbreviations + rules).

    Parameters
    ----------
    max_tokens : int, default 125
        Hard cap on a segment's length in tokens of ``token_counter`` (the method's cap).
    token_counter : TokenCounter, optional
        Counts tokens for the cap, the clause rules and ``Segment.n_tokens``. Defaults to
        :class:`ApproxTokenCounter`; use :func:`make_token_counter` for a real tokenizer.

    Attributes
    ----------
    name : str
        Versioned id of the rule set, :data:`SEGMENTER_NAME`, stored as provenance.
    token_counter : TokenCounter
        The counter in use; its ``.name`` is stored as provenance.

    Raises
    ------
    ConfigError
        ``max_tokens`` is below 2 * :data:`MIN_CLAUSE_TOKENS`.
    """

    name = SEGMENTER_NAME

    def __init__(self, *, max_tokens: int = MAX_SEGMENT_TOKENS, token_counter: TokenCounter | None = None) -> None:
        if max_tokens < 2 * MIN_CLAUSE_TOKENS:
            raise ConfigError(f"max_tokens={max_tokens} is too small; use at least {2 * MIN_CLAUSE_TOKENS} (the method uses {MAX_SEGMENT_TOKENS})")
        self.max_tokens = max_tokens
        self.soft_max_tokens = min(SOFT_MAX_TOKENS, max_tokens)
        self.token_counter: TokenCounter = token_counter if token_counter is not None else ApproxTokenCounter()
        self._approx = ApproxTokenCounter()
        self._exact_is_approx = type(self.token_counter) is ApproxTokenCounter
        self._abbrev_any = ABBREVIATIONS_NEVER_FINAL
        self._abbrev_num = ABBREVIATIONS_BEFORE_NUMBER | _spacy_abbreviations()
        self._starters = _sentence_starters()
        # Built here, not at import: spaCy's data costs seconds to import. The patterns and sets
        # travel with the object when segment_many pickles it to worker processes.
        self._enders = _spacy_sentence_enders()
        self._sent_end, self._sent_end_bmp = _sentence_end_patterns(self._enders)

    def __repr__(self) -> str:
        return f"Segmenter(name={self.name!r}, max_tokens={self.max_tokens}, token_counter={self.token_counter.name!r})"

    # ------------------------------------------------------------------ public API
    def segment(self, text: str, trace_id: str) -> list[Segment]:
        """Split one trace into segments.

        Parameters
        ----------
        text : str
            The reasoning trace. Any length; whitespace-only text gives no segments.
        trace_id : str
            Copied into every segment.

        Returns
        -------
        list of Segment
            Ordered segments with ``char_start``/``char_end`` in characters (code points) into
            ``text`` and ``n_tokens`` from :attr:`token_counter`.

        Raises
        ------
        SegmentationError
            ``trace_id`` is empty, or the result would break an offset invariant (a bug:
            reported, never returned).
        """
        if not isinstance(trace_id, str) or not trace_id:
            raise SegmentationError(f"trace_id must be a non-empty string, got {trace_id!r}")
        # Built without pydantic validation (a third of the run time on the real traces):
        # check_segments below verifies every constraint the record's validators would.
        segments = [_new_segment(trace_id, i, s, e, text[s:e], n) for i, (s, e, n) in enumerate(self._spans_with_counts(text))]
        check_segments(text, segments, trace_id=trace_id)
        return segments

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Segment spans ``[(char_start, char_end), ...]`` of ``text`` (see :meth:`segment`)."""
        return [(s, e) for s, e, _ in self._spans_with_counts(text)]

    def _spans_with_counts(self, text: str) -> list[tuple[int, int, int]]:
        """``(char_start, char_end, n_tokens)`` of every segment, before the invariant check."""
        protected = _Spans(self._protected_spans(text))
        lines = self._lines(text, protected)
        out: list[tuple[int, int, int]] = []
        for line_start, line_end, sentence_starts in self._sentences(text, lines, protected):
            cuts = [line_start, *sentence_starts, line_end]
            for s, e in zip(cuts, cuts[1:]):
                s, e = _trim(text, s, e)
                if s < e:
                    self._split_clauses(text, s, e, protected, out)
        if self._exact_is_approx:
            return out
        counts = _count_many(self.token_counter, [text[s:e] for s, e, _ in out])
        capped: list[tuple[int, int, int]] = []
        for (s, e, _), n in zip(out, counts):
            self._cap(text, s, e, n, protected, capped)
        return capped

    def _protected_spans(self, text: str) -> list[tuple[int, int]]:
        """:func:`find_protected_spans`, less display math over blank lines longer than the soft limit.

        Such a display (delimiters on lines of their own, blank lines inside) is one unit up to
        ``soft_max_tokens`` approximate tokens; a longer one is cut at its line ends as in v4, so its
        rows stay within the method's length profile rather than reaching the hard cap whole.
        """
        spans = find_protected_spans(text)
        count = self._approx.count
        return [
            (s, e) for s, e in spans
            if not (text.startswith(_DISPLAY_OPEN, s) and _BLANK_LINE.search(text, s, e) and count(text[s:e]) > self.soft_max_tokens)
        ]

    # ------------------------------------------------------------------ lines
    def _lines(self, text: str, protected: _Spans) -> list[tuple[int, int]]:
        """Non-empty trimmed line spans, cut at line breaks outside protected spans."""
        lines = []
        start = 0
        for m in _LINE_BREAK.finditer(text):
            pos = m.start()
            if protected.inside(pos):
                continue
            s, e = _trim(text, start, pos)
            if s < e:
                lines.append((s, e))
            start = pos + 1
        s, e = _trim(text, start, len(text))
        if s < e:
            lines.append((s, e))
        return self._join_lines(text, lines)

    def _join_lines(self, text: str, lines: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Join the lines that continue one unit (the exceptions to rule 2), in place of cutting.

        A line that starts with ``=`` continues the equation of the line before it
        (``KE = c² [...]`` / ``= c² [...]``); a Markdown table rule (``---|---``) belongs to
        the header row above it; two lines of symbols (no word of three letters or more on
        either: table rows ``3 | W``, a column of values ``x = 2^(-7/24)``) separated by one
        line end, not a blank line, form one piece. A join is made only while the piece stays
        within ``soft_max_tokens`` approximate tokens; a joined piece that grows past it later
        is cut at its line ends first (:data:`_CLAUSE_STRONG`).

        Measured against the ReasoningFlow clause segmentations (``benchmarks/compare_boundaries.py``):
        each of these line ends was a boundary there in fewer than one case in four.
        """
        if len(lines) < 2:
            return lines
        count = self._approx.count
        out = [lines[0]]
        prev_symbols = _WORD3.search(text, *lines[0]) is None and not text.startswith(_DISPLAY_OPEN, lines[0][0])
        piece_tokens = count(text[lines[0][0]:lines[0][1]])
        for s, e in lines[1:]:
            ps, pe = out[-1]
            symbols = _WORD3.search(text, s, e) is None and not text.startswith(_DISPLAY_OPEN, s)
            n = count(text[s:e])
            continues = (
                text[s] == "="
                or _TABLE_RULE.fullmatch(text, s, e) is not None
                or (symbols and prev_symbols and len(_LINE_END.findall(text, pe, s)) == 1)
            )
            joined_tokens = count(text[ps:e]) if continues and piece_tokens + n < self.soft_max_tokens else -1
            if 0 <= joined_tokens <= self.soft_max_tokens:
                out[-1] = (ps, e)
                piece_tokens = joined_tokens
            else:
                out.append((s, e))
                piece_tokens = n
            prev_symbols = symbols
        return out

    # ------------------------------------------------------------------ sentences
    def _sentences(self, text: str, lines: list[tuple[int, int]], protected: _Spans) -> Iterable[tuple[int, int, list[int]]]:
        """Yield ``(line_start, line_end, sentence_starts)`` with accepted sentence cuts."""
        sent_end = self._sent_end if not text.isascii() and max(text) > "\uffff" else self._sent_end_bmp
        for s, e in lines:
            candidates = {m.end() for m in sent_end.finditer(text, s, e)}
            cjk = {m.end() for m in _CJK_END.finditer(text, s, e)}
            if not candidates and not cjk:
                yield s, e, []
                continue
            enum = _ENUMERATOR.match(text, s, e)
            enum_end = enum.end() if enum else s
            joined = text.find("\n", s, e) >= 0 or text.find("\r", s, e) >= 0  # lines joined by rule 2
            accepted: list[int] = []
            for pos in sorted(candidates | cjk):
                cut = pos if pos in cjk else self._sentence_cut(text, pos, s, e)
                if cut is None or cut <= enum_end or cut >= e or protected.inside(cut):
                    continue
                if joined and (inner := max(text.rfind("\n", s, cut), text.rfind("\r", s, cut))) >= 0:
                    # v5: an enumerator opening a later line of a joined piece keeps its item too ("1. x = 2\n2. y = 3")
                    item = _ENUMERATOR.match(text, inner + 1, e)
                    if item is not None and cut <= item.end():
                        continue
                if not accepted or cut > accepted[-1]:
                    accepted.append(cut)
            yield s, e, accepted

    def _sentence_cut(self, text: str, pos: int, line_start: int, line_end: int) -> int | None:  # noqa: C901  (one branch per sentence-end exception: abbreviations, initials, decimals, ellipses)
        """Where a sentence starting near ``pos`` really starts, or None to reject the cut."""
        if pos <= line_start or pos >= line_end:
            return None
        gap = pos
        while gap > line_start and not text[gap - 1].isspace() and text[gap - 1] in _OPENERS:
            gap -= 1
        if gap <= line_start or not text[gap - 1].isspace():
            return None  # no whitespace between the sides: decimal, URL, "x.Then"
        prev_end = gap - 1
        while prev_end > line_start and text[prev_end - 1].isspace():
            prev_end -= 1
        word_start = prev_end
        while word_start > line_start and not text[word_start - 1].isspace():
            word_start -= 1
        raw_prev = text[word_start:prev_end]
        prev = raw_prev.rstrip(_CLOSERS)
        if not prev or prev[-1] not in self._enders:
            return None  # spaCy can start a sentence after a bare closer; not a sentence end
        nxt = text[gap:line_end].lstrip(_OPENERS)
        if not nxt:
            return None
        if prev.endswith(".") and not prev.endswith(".."):
            word = prev[:-1].lstrip(_OPENERS).lower()
            if word in self._abbrev_any:
                return None
            if word in self._abbrev_num and (nxt[0].isdigit() or nxt[0] in "(#$\\"):
                return None
            if _INITIALS.fullmatch(initials := prev[:-1].lstrip(_OPENERS)) and nxt[0].isupper():
                # Personal initials: "A. N. Kolmogorov", "A.N. Kolmogorov", "G. H. Hardy". Another initial,
                # or a capitalized word that does not open sentences, continues the name; "... is B. Now"
                # stays a sentence end.
                # A single capital letter is far more often a variable ending a sentence ("the curl of B.
                # Divergence ...", measured on ../shared/data): it is an initial only after a name cue
                # ("by", "and", a title) or inside a chain.
                following = re.match(r"[A-Za-z']+\.?", nxt)
                token = following.group(0) if following else ""
                if _INITIALS.fullmatch(token.rstrip(".")) and token.endswith(".") and len(token) <= 4:
                    return None  # the chain goes on: "A. N. ..."
                before = text[max(line_start, word_start - 40):word_start].split()
                in_chain = "." in initials or bool(before and _INITIALS.fullmatch(before[-1].rstrip(".")) and before[-1].endswith("."))
                cue = bool(before) and before[-1].lower().rstrip(",") in _NAME_CUES
                word = token.rstrip(".")
                if (in_chain or cue) and len(word) > 1 and word.lower() not in self._starters:
                    return None
        if prev[-1] == "." and _EQUATION_TAG.match(text, gap, line_end):
            return None  # v5: "... = λ (ρ - R). (1)": the equation's number, not a sentence
        if not (nxt[0].isalnum() or nxt[0] in _OPENERS or nxt[0] in "\\$¿¡"):
            if prev[-1] == "." and _SYMBOL_FORMULA_START.match(nxt) and prev[:-1].lstrip(_OPENERS).lower() not in self._abbrev_num:
                return gap  # v5: "∂f/∂y = 2z. ∂f/∂z = 2z", "b = 0.5. |a|^2 = 0.25": a formula opens a sentence
            return None  # "8! / 2", "x? = y": an operator cannot open a sentence
        if (
            nxt[0].isalpha()
            and nxt[0].islower()
            and (prev[-1] not in _QUESTION_MARKS or len(prev) < len(raw_prev))
            and not (prev[-1] == "." and _FORMULA_START.match(nxt) and prev[:-1].lstrip(_OPENERS).lower() not in self._abbrev_num)
        ):
            # "approx. twelve", "etc. and", "5! ways", "so... then", and a quoted or bracketed
            # question: 'I ask "is n even?" and', '(does it hold?) for': same sentence. A bare
            # "? lowercase" still ends one: traces often skip the capital after a question.
            return None
        if len(word_core := prev[:-1].lstrip(_OPENERS)) == 1 and word_core.isupper() and prev[-1] == "." and nxt[0].isdigit():
            return None  # an option letter before its value: "A. 0.85"
        return gap

    # ------------------------------------------------------------------ clauses and the cap
    # Rule decisions (clause sizes, the soft limit) use the fast approximation; the cap and
    # ``n_tokens`` use the configured counter. Each piece is counted O(1) times, so a sentence
    # costs O(length) however many clause markers it holds.
    def _split_clauses(self, text: str, s: int, e: int, protected: _Spans, out: list[tuple[int, int, int]]) -> None:
        """Append the clause spans of sentence ``[s, e)`` to ``out``.

        A cue that opens a new reasoning step (``, wait``, ``; hmm``, ``, alternatively``) always
        starts a clause; the rest of the sentence is cut only when long (:meth:`_split_long`).
        """
        approx = self._approx.count
        last = s
        if _CLAUSE_CUE_HINT.search(text, s, e) and approx(text[s:e]) >= 2 * MIN_CLAUSE_TOKENS:
            for m in _CLAUSE_CUE.finditer(text, s, e):
                cut = m.end()
                if cut >= e or protected.inside(cut) or protected.inside(m.start() + 1):
                    continue
                if approx(text[last:cut]) >= MIN_CLAUSE_TOKENS and self._at_least(text, cut, e, MIN_CLAUSE_TOKENS):
                    ps, pe = _trim(text, last, cut)
                    self._split_long(text, ps, pe, protected, out)
                    last = cut
        ps, pe = _trim(text, last, e)
        self._split_long(text, ps, pe, protected, out)

    def _at_least(self, text: str, s: int, e: int, k: int) -> bool:
        """Whether ``text[s:e]`` has at least ``k`` approximate tokens, reading a bounded window when it can.

        The rest of a sentence after each of its cues was counted whole: a sentence of N cues
        (a repetition loop, "Wait, wait, wait, ...") cost O(N^2) (81 s of CPU for 20,000 "Wait, ").
        A text's count is at least its prefix's count less one (only the prefix's last pre-token can
        merge with what follows), so a window counting ``k + 1`` decides without reading the rest.
        """
        window = 16 * (k + 1)
        if e - s > window and self._approx.count(text[s:s + window]) >= k + 1:
            return True
        return self._approx.count(text[s:e]) >= k

    def _split_long(self, text: str, s: int, e: int, protected: _Spans, out: list[tuple[int, int, int]], n: int = -1) -> None:
        """Halve a piece longer than the soft limit at its most central strong, else weak, clause mark."""
        n = self._approx.count(text[s:e]) if n < 0 else n
        if n > self.soft_max_tokens:
            cut = self._best_cut(text, s, e, protected, _CLAUSE_STRONG, min_side=MIN_CLAUSE_TOKENS) or self._best_cut(
                text, s, e, protected, _CLAUSE_WEAK, min_side=MIN_CLAUSE_TOKENS
            )
            if cut is not None:
                for ps, pe in ((s, cut), (cut, e)):
                    ps, pe = _trim(text, ps, pe)
                    self._split_long(text, ps, pe, protected, out)
                return
        if self._exact_is_approx:
            self._cap(text, s, e, n, protected, out)
        else:
            out.append((s, e, -1))  # counted in one batch by _spans_with_counts, then capped

    def _cap(self, text: str, s: int, e: int, n: int, protected: _Spans, out: list[tuple[int, int, int]]) -> None:
        """Enforce ``max_tokens`` on ``[s, e)`` (``n`` tokens of the counter), appending to ``out``."""
        if n <= self.max_tokens:
            out.append((s, e, n))
            return
        cut = (
            self._best_cut(text, s, e, protected, _CLAUSE_WEAK)
            or self._best_cut(text, s, e, protected, _WHITESPACE_RUN)
            or self._best_cut(text, s, e, None, _WHITESPACE_RUN)
            or _char_cut(text, s, e)
        )
        if cut is None:  # a single grapheme over the cap: nothing left to split
            out.append((s, e, n))
            return
        count = self.token_counter.count
        for ps, pe in ((s, cut), (cut, e)):
            ps, pe = _trim(text, ps, pe)
            if ps < pe:
                self._cap(text, ps, pe, count(text[ps:pe]), protected, out)

    def _best_cut(
        self, text: str, s: int, e: int, protected: _Spans | None, pattern: re.Pattern[str], *, min_side: int = 1
    ) -> int | None:
        """The allowed cut of ``pattern`` in ``(s, e)`` nearest the middle, or None."""
        mid = (s + e) / 2
        cuts = []
        for m in pattern.finditer(text, s, e):
            cut = m.end()
            if s < cut < e and (protected is None or not (protected.inside(cut) or protected.inside(m.start() + 1))):
                cuts.append(cut)
        cuts.sort(key=lambda c: abs(c - mid))
        count = self._approx.count
        for cut in cuts[:8]:  # the nearest few; a lopsided cut is tried only if those fail
            if min_side <= 1 or (count(text[s:cut].rstrip()) >= min_side and count(text[cut:e]) >= min_side):
                return cut
        return None


def _trim(text: str, s: int, e: int) -> tuple[int, int]:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return s, e


def _starts_grapheme(ch: str) -> bool:
    """False for characters that continue the previous one (combining marks, ZWJ, selectors)."""
    return not (unicodedata.combining(ch) or ch in "\u200d\ufe0e\ufe0f" or "\U0001f3fb" <= ch <= "\U0001f3ff")


# Marks that close or continue what precedes them: a segment must not start with one.
_NO_START = frozenset(",.;:!?%)]}»”’、，。；：！？）」』】〕〉》…｡")


def _char_cut(text: str, s: int, e: int) -> int | None:
    """A cut between two non-space characters as near the middle as possible.

    Never inside a grapheme cluster. In order of preference: just after a punctuation mark within
    a quarter of the span from the middle; any character that is not a closing or continuing mark
    (a segment must not start with ``，`` or ``)``); any character. None when no cut is allowed.
    """
    mid = (s + e) // 2
    order = [c for offset in range((e - s) // 2 + 1) for c in (mid - offset, mid + offset) if s < c < e]
    allowed = [c for c in order if not text[c].isspace() and _starts_grapheme(text[c]) and text[c - 1] != "\u200d"]
    reach = (e - s) // 4
    for cut in allowed:
        if abs(cut - mid) > reach:
            break
        if text[cut] not in _NO_START and unicodedata.category(text[cut - 1])[0] == "P":
            return cut
    for cut in allowed:
        if text[cut] not in _NO_START:
            return cut
    return allowed[0] if allowed else None


# --------------------------------------------------------------------------- invariants
def check_segments(text: str, segments: Sequence[Segment], *, trace_id: str | None = None) -> None:
    """Check the offset invariants of a segmentation of ``text``.

    Parameters
    ----------
    text : str
        The trace the segments index into.
    segments : sequence of Segment
        In ``segment_index`` order.
    trace_id : str, optional
        Named in the error message.

    Raises
    ------
    SegmentationError
        A segment's text differs from ``text[char_start:char_end]``, is empty, starts or ends
        with whitespace, has the wrong ``segment_index``, overlaps or precedes the previous
        one, or a non-whitespace character of ``text`` lies outside every segment.
    """
    where = f"trace {trace_id!r}" if trace_id is not None else "trace"
    prev_end = 0
    for i, seg in enumerate(segments):
        s, e = seg.char_start, seg.char_end
        if seg.segment_index != i:
            raise SegmentationError(f"{where}: segment at position {i} has segment_index {seg.segment_index}")
        if s < prev_end:
            raise SegmentationError(f"{where}: segment {i} [{s}, {e}) overlaps or precedes the previous one ending at {prev_end}")
        if e > len(text) or text[s:e] != seg.text:
            raise SegmentationError(f"{where}: segment {i} text does not equal trace[{s}:{e}]")
        if not seg.text.strip() or seg.text[0].isspace() or seg.text[-1].isspace():
            raise SegmentationError(f"{where}: segment {i} [{s}, {e}) is empty or starts/ends with whitespace: {seg.text[:40]!r}")
        if text[prev_end:s].strip():
            raise SegmentationError(f"{where}: characters {prev_end}..{s} ({text[prev_end:s][:40]!r}) are in no segment")
        prev_end = e
    if text[prev_end:].strip():
        raise SegmentationError(f"{where}: characters {prev_end}..{len(text)} ({text[prev_end:][:40]!r}) are in no segment")


# --------------------------------------------------------------------------- convenience
def segment_text(text: str, trace_id: str = "t", **kw: Any) -> list[Segment]:
    """Segment one text with a fresh :class:`Segmenter`.

    Parameters
    ----------
    text : str
        The reasoning trace.
    trace_id : str, default "t"
        Copied into every segment.
    **kw
        :class:`Segmenter` options: ``max_tokens`` (cap in tokens, default 125) and
        ``token_counter`` (default :class:`ApproxTokenCounter`).

    Returns
    -------
    list of Segment
        As :meth:`Segmenter.segment`: code-point offsets into ``text``, ``n_tokens`` in tokens.

    Raises
    ------
    ConfigError
        ``max_tokens`` too small.
    SegmentationError
        An offset invariant would break (a bug, never returned silently).
    """
    return Segmenter(**kw).segment(text, trace_id)


def segment_stats(segments: Iterable[Segment]) -> dict[str, float]:
    """Length profile of a segmentation, for ``ror segment --stats``.

    Parameters
    ----------
    segments : iterable of Segment
        Segments of one or many traces.

    Returns
    -------
    dict
        ``n_segments``, ``n_traces``, ``segments_per_trace`` (mean), and over ``n_tokens``:
        ``median``, ``p5``, ``p95``, ``max``, ``mean``. Percentiles use linear interpolation
        between order statistics (``statistics.quantiles(method="inclusive")``, the same as
        ``numpy.percentile``'s default). With no segments the length figures are NaN.
        The method's reference profile is :data:`METHOD_LENGTH_PROFILE`.
    """
    lengths: list[int] = []
    traces: set[str] = set()
    for seg in segments:
        lengths.append(seg.n_tokens)
        traces.add(seg.trace_id)
    nan = float("nan")
    if not lengths:
        return {"n_segments": 0, "n_traces": 0, "segments_per_trace": nan, "median": nan, "p5": nan, "p95": nan, "max": nan, "mean": nan}
    if len(lengths) == 1:
        p5 = p95 = float(lengths[0])
    else:
        q = statistics.quantiles(lengths, n=20, method="inclusive")
        p5, p95 = q[0], q[18]
    return {
        "n_segments": len(lengths),
        "n_traces": len(traces),
        "segments_per_trace": len(lengths) / len(traces),
        "median": float(statistics.median(lengths)),
        "p5": float(p5),
        "p95": float(p95),
        "max": float(max(lengths)),
        "mean": float(statistics.fmean(lengths)),
    }


# --------------------------------------------------------------------------- many traces
#: Characters of trace text sent to a worker process per task: large enough that the cost of
#: moving the task and its segments between processes stays small, small enough that every
#: worker gets many tasks (load balance) and memory in flight stays bounded.
TASK_CHARS = 200_000

_WORKER_SEGMENTER: Segmenter | None = None


def _init_worker(segmenter: Segmenter) -> None:
    from .pool import init_worker

    global _WORKER_SEGMENTER
    _WORKER_SEGMENTER = segmenter
    init_worker()  # Ctrl-C is the parent's to handle; the worker exits with its parent, even after kill -9


def _segment_task(batch: list[tuple[str, str]]) -> list[list[tuple[int, int, int]]]:
    """Spans with counts of each ``(trace_id, text)`` (checked in the worker, rebuilt by the parent)."""
    assert _WORKER_SEGMENTER is not None
    return [[(s.char_start, s.char_end, s.n_tokens) for s in _WORKER_SEGMENTER.segment(text, tid)] for tid, text in batch]


def _batches(items: Iterable[tuple[str, str]], task_chars: int) -> Iterator[list[tuple[str, str]]]:
    batch: list[tuple[str, str]] = []
    size = 0
    for trace_id, text in items:
        batch.append((trace_id, text))
        size += len(text)
        if size >= task_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def default_workers() -> int:
    """Number of CPU cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def segment_many(
    items: Iterable[tuple[str, str]],
    *,
    segmenter: Segmenter | None = None,
    workers: int | None = None,
    task_chars: int = TASK_CHARS,
) -> Iterator[list[Segment]]:
    """Segment many traces, in parallel over CPU cores, yielding results in input order.

    Parameters
    ----------
    items : iterable of (str, str)
        ``(trace_id, text)`` pairs; consumed lazily (at most about ``4 * workers`` tasks of
        ``task_chars`` characters are in flight), so a corpus of any size streams through.
    segmenter : Segmenter, optional
        The configured segmenter (cap, token counter); default ``Segmenter()``. It is pickled
        to each worker, so its token counter must be picklable (:class:`ApproxTokenCounter` and
        :class:`HFTokenCounter` are).
    workers : int, optional
        Worker processes. ``None`` (default): every core this process may use
        (:func:`default_workers`). ``1``: segment in this process, no pool. An input that fits
        one task is also segmented in this process (starting workers would cost more).
    task_chars : int, default :data:`TASK_CHARS`
        Characters of text per task sent to a worker.

    Yields
    ------
    list of Segment
        The segments of each input trace, in input order: the same list, byte for byte, as
        ``segmenter.segment(text, trace_id)`` (each worker runs that very method, invariant
        check included).

    Raises
    ------
    ConfigError
        ``workers`` or ``task_chars`` is below 1.
    SegmentationError
        From the first trace whose segmentation breaks an invariant (a bug) or that has an
        empty trace id; traces before it have already been yielded.

    Notes
    -----
    Workers are started with ``forkserver`` (``spawn`` where it does not exist), which re-imports
    the caller's ``__main__`` module: a script that calls this with ``workers > 1`` needs the
    usual ``if __name__ == "__main__":`` guard, as for any ``multiprocessing`` pool.
    """
    segmenter = segmenter if segmenter is not None else Segmenter()
    workers = default_workers() if workers is None else workers
    if workers < 1 or task_chars < 1:  # checked here, at the call, not at the first next()
        raise ConfigError(f"workers={workers} and task_chars={task_chars} must both be at least 1")
    if workers == 1:
        return (segmenter.segment(text, trace_id) for trace_id, text in items)
    return _segment_in_pool(items, segmenter, workers, task_chars)


def segment_spans_many(
    items: Iterable[tuple[str, str]],
    *,
    segmenter: Segmenter | None = None,
    workers: int | None = None,
    task_chars: int = TASK_CHARS,
) -> Iterator[list[tuple[int, int, int]]]:
    """:func:`segment_many` without a :class:`Segment` record per segment: each trace's checked spans.

    Yields
    ------
    list of (int, int, int)
        ``(char_start, char_end, n_tokens)`` of each input trace's segments, in input order: the
        fields of ``segmenter.segment(text, trace_id)`` (invariants checked there, in the worker
        or in this process), whose ``segment_index`` is the position and text ``text[char_start:char_end]``.
        For writers that take columns (:meth:`Store.replace_segment_spans_many`).

    Raises
    ------
    ConfigError, SegmentationError
        As :func:`segment_many`.
    """
    segmenter = segmenter if segmenter is not None else Segmenter()
    workers = default_workers() if workers is None else workers
    if workers < 1 or task_chars < 1:
        raise ConfigError(f"workers={workers} and task_chars={task_chars} must both be at least 1")
    if workers == 1:
        return (_spans_of(segmenter.segment(text, trace_id)) for trace_id, text in items)
    return _segment_in_pool(items, segmenter, workers, task_chars, spans=True)


def _spans_of(segments: list[Segment]) -> list[tuple[int, int, int]]:
    return [(s.char_start, s.char_end, s.n_tokens) for s in segments]


def _segment_in_pool(items: Iterable[tuple[str, str]], segmenter: Segmenter, workers: int, task_chars: int,
                     spans: bool = False) -> Iterator[Any]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from .pool import max_workers, submit

    batches = _batches(items, task_chars)
    first = next(batches, None)
    second = next(batches, None) if first is not None else None
    if first is None or second is None:  # the input fits one task: starting workers would only cost
        for trace_id, text in first or []:
            yield _spans_of(segmenter.segment(text, trace_id)) if spans else segmenter.segment(text, trace_id)
        return
    # forkserver (else spawn), not fork: a forked copy of a process that already runs threads
    # (the Rust tokenizer's pool, DuckDB) can deadlock. The server imports this module once, so
    # each worker starts as a cheap fork of it; workers are started on demand, up to ``workers``.
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload([__name__])
    workers = max_workers(workers)  # never more processes than cores
    workers = min(workers, 61) if os.name == "nt" else workers  # the Windows limit of ProcessPoolExecutor
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(segmenter,))
    pending: deque = deque()
    try:
        for batch in itertools.chain((first, second), batches):
            pending.append((batch, submit(pool, _segment_task, batch)))  # E140 if a worker died
            if len(pending) >= 4 * workers:  # bounded read-ahead: memory stays flat on any corpus
                done, future = pending.popleft()
                yield from _collect(done, future, spans=spans)
        while pending:
            done, future = pending.popleft()
            yield from _collect(done, future, spans=spans)
    finally:  # also when the caller stops early or a task failed: drop what is queued
        pool.shutdown(wait=True, cancel_futures=True)


def _collect(batch: list[tuple[str, str]], future: Any, spans: bool = False) -> Iterator[Any]:
    from .pool import result

    # The worker already checked every invariant on these spans: build the records unvalidated.
    if spans:
        yield from result(future)  # E140 if its worker died
        return
    for (trace_id, text), found in zip(batch, result(future)):
        yield [_new_segment(trace_id, i, s, e, text[s:e], n) for i, (s, e, n) in enumerate(found)]

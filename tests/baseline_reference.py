"""The baseline judge's rules exactly as first written (commit 64e97be), frozen as the test reference.

``tests/test_baseline_fast.py`` checks that the vectorised path in
:mod:`ror_annotate.judge.baseline` gives the same label and rule as these functions on every
segment. Do not edit: this file is the "before" of an equivalence test, not code in use.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ror_annotate.records import Segment

BASELINE_NAME = "baseline:cue-v1"
BASELINE_VERSION = "baseline-cue-v1"
#: Labels written per transaction: an interrupt loses at most this many, never the whole stage.
FLUSH_LABELS = 5_000
#: Traces read per query: memory stays flat in corpus size.
READ_BATCH_TRACES = 256

_I = re.IGNORECASE


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, _I)


# Opening cues, matched at the start of the segment (after markdown bullets/headers).
_LEAD = r"^(?:[#>*\-\s]|\d+[.)]\s)*"

CONCLUSION_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("final-answer-header", _rx(_LEAD + r"(?:\*\*)?final answer")),
    ("boxed", _rx(r"\\boxed\s*\{")),
    ("answer-is", _rx(r"\b(?:the|my|our) (?:final )?answer (?:is|should be|would be|=)")),
    ("so-the-result", _rx(_LEAD + r"(?:so|thus|therefore|hence|overall)\b[,:]?\s+(?:the )?(?:final |total |required |desired |minimum |maximum |only |correct )?(?:answer|result|value|solution|probability|number|total|sum|area|length|ratio|remainder)\b.*\b(?:is|are|equals?|=|should be|must be)\b")),
    ("conclusion-word", _rx(_LEAD + r"(?:in conclusion|to conclude|to summarize|in summary)\b")),
)

REFLECTION_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("wait", _rx(_LEAD + r"(?:but |oh |hmm,? )?wait\b")),
    ("hmm", _rx(_LEAD + r"(?:hmm+|hm+|oh|oops|uh|huh|whoa|aha|ah)\b")),
    ("hold-on", _rx(_LEAD + r"(?:but )?(?:hold on|actually|no,|nope|on second thought|on reflection)\b")),
    ("doubt-question", _rx(r"\b(?:is (?:that|this|it) (?:right|correct|possible|true)|did i (?:make|do|miss)|am i (?:missing|sure)|does (?:that|this) make sense|why (?:is|did|would))\b.*\?")),
    ("error-word", _rx(r"\b(?:mistake|miscalculat\w*|wrong|incorrect|contradict\w*|doesn't make sense|does not make sense|that can't be|can't be right|not possible|inconsistent|discrepancy|typo)\b")),
    ("confirmation", _rx(_LEAD + r"(?:yes|yep|right|correct|okay, that|ok, that|good|great|perfect)\b[,.! ].*|.*\b(?:checks out|matches|consistent with|makes sense|seems (?:right|correct|reasonable|plausible)|that's correct|is correct|confirm(?:s|ed)?)\b")),
    ("uncertainty", _rx(r"\b(?:i'm not sure|not sure|i wonder|maybe i|perhaps i (?:made|was)|i think i|seems off|suspicious|unclear|i'm confused|confusing)\b")),
)

PLANNING_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("let-me", _rx(_LEAD + r"(?:(?:so|now|ok(?:ay)?|alright|first|next|then|but|and|maybe|perhaps|well|thus|therefore|hence)[,]?\s+)*(?:let me|let's|let us|i'll|i will|i need to|i should|i have to|i must|i want to|i'm going to|we need to|we should|we have to|we must|we can|i can|i could|we'll|i might)\b")),
    ("approach", _rx(_LEAD + r"(?:(?:so|now|but)[,]?\s+)?(?:alternatively|another (?:way|approach|idea|method)|maybe (?:there's|i can|we can|try|use)|perhaps (?:i|we) (?:can|should|could)|one (?:way|approach|idea)|the (?:plan|strategy|approach|idea|goal|key) (?:is|here))\b")),
    ("step-header", _rx(_LEAD + r"(?:\*\*)?(?:step \d+|first|next|now|then|finally|to (?:find|solve|compute|calculate|determine|check|verify|get))\b[^.=]{0,80}[:,]?\s*$")),
    # A short lead-in that announces the next step ("So plugging in the numbers:", "Factor out k:").
    ("lead-in-colon", _rx(r"^(?!.*=)[^\n]{3,90}:\s*$")),
    ("to-do", _rx(_LEAD + r"to (?:find|solve|compute|calculate|determine|check|verify|get|figure out)\b")),
)

FACT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("recall", _rx(r"\b(?:recall|remember|i know that|we know that|it is known|well[- ]known|by definition|is defined as|defined as|the definition of|by the (?:\w+ ){0,3}(?:theorem|formula|rule|law|identity|principle|inequality)|according to)\b")),
    ("formula-is", _rx(r"\b(?:the )?(?:formula|equation|identity|theorem|law|rule|principle) (?:for|of|is|says|states|gives)\b")),
    ("constant", _rx(r"\b(?:speed of light|gas constant|planck|avogadro|boltzmann|gravitational constant|pi is approximately|e is approximately|\w+ constant is)\b")),
    ("general-statement", _rx(r"^(?!.*\d)(?:in general|generally|typically|usually|a \w+ is an?|an? \w+ (?:is|are) (?:a|an|the|always|never))\b")),
)

RESTATEMENT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("problem-says", _rx(r"\b(?:the (?:problem|question) (?:says|states|asks|is asking|gives|tells)|we(?:'re| are) (?:given|told|asked)|i(?:'m| am) (?:given|told|asked)|given that|the problem is|i have this problem|we have this problem)\b")),
    ("need-to-find-opening", _rx(_LEAD + r"(?:okay|ok|alright|all right|so)[,]?\s+(?:so\s+)?(?:i|we) (?:have|need|want|am|are)\b")),
    ("recap", _rx(_LEAD + r"(?:so )?(?:as (?:before|earlier|above|computed|found|established|mentioned)|recall(?:ing)? that (?:we|i) (?:found|had|got)|earlier (?:we|i) (?:found|had|got)|we (?:already|previously) (?:found|had|computed)|to recap|again,)\b")),
)

_WAIT_THEN_PLAN = _rx(_LEAD + r"(?:but |oh |hmm,? )?wait\b[,.!]?\s*(?:but |so |actually,? |hold on,? )?(?:let me|let's|i (?:need|should|have) to|maybe i should)\b")
_COMPUTATION = re.compile(r"(?:\d|\))\s*(?:=|≈|\\approx|is)\s*-?\(?\d")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")

_WORD = re.compile(r"[A-Za-z]+|\d+(?:\.\d+)?")
_STOP = frozenset("a an the of to and or is are be in on at for with that this it as by so we i let me".split())


def _content_words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP and len(w) > 1}


def _overlap(words: set[str], reference: set[str]) -> float:
    return len(words & reference) / len(words) if words else 0.0


@dataclass(frozen=True)
class Context:
    """What the rules may look at besides the segment: the problem and earlier segments."""

    problem_words: frozenset[str]
    earlier_words: frozenset[str]
    after_first_answer: bool
    index: int
    n_segments: int


def _claims_error(text: str) -> bool:
    return any(p.search(text) for name, p in REFLECTION_RULES if name in ("error-word", "doubt-question", "uncertainty"))


def classify_segment(text: str, context: Context) -> tuple[str, str]:
    """Label one segment; returns ``(behavior, rule_name)``.

    Order (first match wins): an opening segment (first three) that mostly repeats the problem is
    restatement; then conclusion, reflection, planning, fact, restatement by cue, then
    restatement by overlap (>= 80% of content words already in the problem or earlier text and no
    new number), then execution (the default: a derivation or computation step).
    """
    head = text.strip()
    first_line = head.splitlines()[0] if head else head
    words = _content_words(head)
    # Traces usually open by restating the task ("Okay, so I need to find ..."), which the
    # planning cues would otherwise claim.
    if context.index < 3 and len(words) >= 4 and _overlap(words, set(context.problem_words)) >= 0.5:
        return "restatement", "opening-restates-problem"
    # A doubt that opens a check ("Wait, let me verify ...") is the plan of a re-checking round.
    if _WAIT_THEN_PLAN.search(first_line):
        return "planning", "wait-then-plan"
    # A cue followed by an actual new computation ("Wait, 3/8 is 9/24 = ...") is execution.
    computes = len(_COMPUTATION.findall(head)) >= 1 and len(_NUMBER.findall(head)) >= 3
    for behavior, rules in (
        ("conclusion", CONCLUSION_RULES),
        ("reflection", REFLECTION_RULES),
        ("planning", PLANNING_RULES),
        ("fact", FACT_RULES),
        ("restatement", RESTATEMENT_RULES),
    ):
        for name, pattern in rules:
            if pattern.search(first_line if behavior == "planning" else head):
                if computes and behavior in ("reflection", "planning") and not _claims_error(head):
                    return "execution", f"{name}+computation"
                return behavior, name
    if len(words) >= 3:
        numbers = {w for w in words if w[0].isdigit()}
        new_numbers = numbers - context.problem_words - context.earlier_words
        if not new_numbers and _overlap(words, set(context.problem_words)) >= 0.8:
            return "restatement", "overlap-problem"
        # Near-verbatim repeats only: reasoning reuses earlier words all the time while deriving.
        if len(words) >= 6 and not new_numbers and _overlap(words, set(context.earlier_words)) >= 0.97 and not re.search(r"[=+\-*/^]", head):
            return "restatement", "overlap-earlier"
    return "execution", "default-execution"


def classify_trace(problem: str | None, segments: Sequence[Segment]) -> list[tuple[str, str]]:
    """Label every segment of one trace in order; returns ``[(behavior, rule_name), ...]``."""
    problem_words = frozenset(_content_words(problem or ""))
    earlier: set[str] = set()
    after_answer = False
    out = []
    for seg in segments:
        ctx = Context(problem_words, frozenset(earlier), after_answer, seg.segment_index, len(segments))
        behavior, rule = classify_segment(seg.text, ctx)
        out.append((behavior, rule))
        after_answer = after_answer or behavior == "conclusion"
        earlier |= _content_words(seg.text)
    return out



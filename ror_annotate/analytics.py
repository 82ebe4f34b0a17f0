"""Trace analytics computed from segment labels: where the first answer appears, how many tokens
each behavior takes, how many re-checking rounds follow the first answer, and how often a right
first answer is later abandoned for a wrong final one (the flip rate).

These are the figures users asked for in the discussion of the Routes-of-Reasoning method
(Wang, Fayyaz, Peng, arXiv:2611.05919): steering "only after the first answer" saves tokens
precisely because of what happens after it.

Definitions (all positions are 0-based; lengths in the subject tokenizer's tokens when the export
had one, else in the segment token counts stored by the segmenter):

* **first answer**: the first ``conclusion`` segment that states an answer, i.e. whose text holds
  ``\\boxed{``, a digit, the word "answer", or a stand-alone option letter ``(A)``-``(E)``.
  ``first_answer_token`` is the number of tokens before it; ``first_answer_fraction`` divides that
  by the trace's total.
* **re-checking round**: after the first answer, a round opens at a ``planning`` or ``reflection``
  segment that follows a ``conclusion`` (segments of other behaviors in between do not matter);
  it runs until the next ``conclusion``.
* **flip**: the first answer matches the reference answer and the final answer does not. The final
  answer is the trace's ``answer`` field (else the last answer-stating conclusion); its correctness
  is the source's ``correct`` flag when given, else a match against ``gold_answer``. Answers match
  when their normalized forms are equal or both parse as the same number.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .answers import answers_match, extract_answer
from .records import BEHAVIORS

_STATES_ANSWER = re.compile(r"\\boxed\s*\{|\d|\banswer\b|\(\s*[A-E]\s*\)", re.IGNORECASE)


@dataclass(frozen=True)
class SegmentView:
    """What the analytics need of one labeled segment (``label`` is a behavior name or None)."""

    segment_index: int
    label: str | None
    text: str
    n_tokens: int


@dataclass
class TraceAnalytics:
    """Analytics of one trace (see the module docstring for the definitions)."""

    trace_id: str
    n_segments: int
    n_tokens: int
    first_answer_segment: int | None
    first_answer_token: int | None
    first_answer_fraction: float | None
    tokens_after_first_answer: int | None
    recheck_rounds_after_first_answer: int | None
    tokens_per_behavior: dict[str, int] = field(default_factory=dict)
    first_answer: str | None = None
    final_answer: str | None = None
    first_correct: bool | None = None
    final_correct: bool | None = None
    flip: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: :func:`dataclasses.asdict`'s (same keys, order and values) without its deep
        copy of every value (a per-trace cost of the export: the fields are scalars and one flat dict)."""
        d = {name: getattr(self, name) for name in _TRACE_FIELDS}
        d["tokens_per_behavior"] = dict(self.tokens_per_behavior)
        return d


_TRACE_FIELDS = tuple(f.name for f in fields(TraceAnalytics))


def states_answer(text: str) -> bool:
    """Whether a conclusion segment's text states an answer (``\\boxed``, a digit, "answer", "(C)")."""
    return bool(_STATES_ANSWER.search(text))


def analyze_trace(
    trace_id: str,
    segments: Sequence[SegmentView],
    *,
    answer: str | None = None,
    gold_answer: str | None = None,
    correct: bool | None = None,
) -> TraceAnalytics:
    """Analytics of one trace from its labeled segments (ordered by ``segment_index``).

    Parameters
    ----------
    trace_id : str
    segments : sequence of SegmentView
    answer : str, optional
        The trace's final answer text (after ``</think>``).
    gold_answer : str, optional
        Reference answer; without it the correctness fields and ``flip`` are None.
    correct : bool, optional
        The source's verdict on the final answer; preferred over matching ``answer``.

    Returns
    -------
    TraceAnalytics
    """
    n_tokens = sum(s.n_tokens for s in segments)
    per_behavior = {b: 0 for b in BEHAVIORS}
    for s in segments:
        key = s.label if s.label in per_behavior else "unlabeled"
        per_behavior[key] = per_behavior.get(key, 0) + s.n_tokens

    first_idx = next(
        (i for i, s in enumerate(segments) if s.label == "conclusion" and states_answer(s.text)), None
    )
    result = TraceAnalytics(
        trace_id=trace_id, n_segments=len(segments), n_tokens=n_tokens, first_answer_segment=None,
        first_answer_token=None, first_answer_fraction=None, tokens_after_first_answer=None,
        recheck_rounds_after_first_answer=None, tokens_per_behavior=per_behavior,
    )
    if first_idx is not None:
        before = sum(s.n_tokens for s in segments[:first_idx])
        result.first_answer_segment = segments[first_idx].segment_index
        result.first_answer_token = before
        result.first_answer_fraction = before / n_tokens if n_tokens else None
        result.tokens_after_first_answer = n_tokens - before - segments[first_idx].n_tokens
        result.recheck_rounds_after_first_answer = _count_rounds(segments[first_idx + 1 :])
        result.first_answer = extract_answer(segments[first_idx].text)

    final = extract_answer(answer)
    if final is None:
        last = next(
            (s for s in reversed(segments) if s.label == "conclusion" and states_answer(s.text)), None
        )
        final = extract_answer(last.text) if last else None
    result.final_answer = final
    if gold_answer:
        result.first_correct = answers_match(result.first_answer, gold_answer)
        result.final_correct = correct if correct is not None else answers_match(final, gold_answer)
        if result.first_correct is not None and result.final_correct is not None:
            result.flip = bool(result.first_correct and not result.final_correct)
    return result


def _count_rounds(after_first: Sequence[SegmentView]) -> int:
    rounds, open_allowed = 0, True  # the first answer itself is a conclusion
    for s in after_first:
        if s.label == "conclusion":
            open_allowed = True
        elif s.label in ("planning", "reflection") and open_allowed:
            rounds += 1
            open_allowed = False
    return rounds


def _describe(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "mean": None, "median": None}
    return {"n": len(values), "mean": statistics.fmean(values), "median": statistics.median(values)}


def summarize(per_trace: Sequence[TraceAnalytics]) -> dict[str, Any]:
    """Corpus-level summary of :func:`analyze_trace` results (JSON-able).

    Returns
    -------
    dict
        ``n_traces``, ``first_answer_found``, ``first_answer_fraction`` and
        ``recheck_rounds_after_first_answer`` (n/mean/median over traces with a first answer),
        ``tokens_per_behavior`` (totals) and ``token_share_per_behavior``,
        ``token_share_after_first_answer``, and ``flip`` (``n_evaluable``, ``n_flips``,
        ``flip_rate``, ``n_recoveries`` = first wrong and final right, ``recovery_rate``); rates are
        NaN-free: None when nothing is evaluable.
    """
    totals: dict[str, int] = {}
    for t in per_trace:
        for k, v in t.tokens_per_behavior.items():
            totals[k] = totals.get(k, 0) + v
    all_tokens = sum(totals.values())
    with_answer = [t for t in per_trace if t.first_answer_segment is not None]
    evaluable = [t for t in per_trace if t.flip is not None]
    flips = sum(1 for t in evaluable if t.flip)
    recoveries = sum(1 for t in evaluable if t.first_correct is False and t.final_correct is True)
    after = sum(t.tokens_after_first_answer or 0 for t in with_answer)
    return {
        "n_traces": len(per_trace),
        "first_answer_found": len(with_answer),
        "first_answer_fraction": _describe([t.first_answer_fraction for t in with_answer if t.first_answer_fraction is not None]),
        "recheck_rounds_after_first_answer": _describe([t.recheck_rounds_after_first_answer or 0 for t in with_answer]),
        "tokens_per_behavior": totals,
        "token_share_per_behavior": {k: (v / all_tokens if all_tokens else None) for k, v in totals.items()},
        "token_share_after_first_answer": (after / all_tokens) if all_tokens else None,
        "flip": {
            "n_evaluable": len(evaluable),
            "n_flips": flips,
            "flip_rate": flips / len(evaluable) if evaluable else None,
            "n_recoveries": recoveries,
            "recovery_rate": recoveries / len(evaluable) if evaluable else None,
        },
    }

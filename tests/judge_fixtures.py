"""Small stores for the judge tests: hand-written traces split into sentences by a plain regex."""

from __future__ import annotations

import re
from pathlib import Path

from ror_annotate.records import Segment, Trace
from ror_annotate.store import Store

_SENTENCE = re.compile(r"[^.?!]+[.?!]?")

# Each sentence carries one cue of the fake server's rules, so its label is known by hand.
TRACE_A = (
    "Let me start by adding the two numbers. 17 + 25 = 42. Wait, is that right? "
    "Recall the formula for an arithmetic series. So far we have 42. Therefore the answer is 42."
)
LABELS_A = ["planning", "execution", "reflection", "fact", "restatement", "conclusion"]

# Non-ASCII: emoji, CJK and LaTeX inside segments.
TRACE_U = "First, compute 数学 ∑ 🎉 terms. $\\frac{1}{2} + \\frac{1}{3} = \\frac{5}{6}$ 😀. Hmm, 検算 needed? The answer is 5/6 ✅."
LABELS_U = ["planning", "execution", "reflection", "conclusion"]


def split_segments(trace_id: str, text: str) -> list[Segment]:
    """Sentence segments with exact code-point offsets (leading/trailing spaces trimmed)."""
    out = []
    for m in _SENTENCE.finditer(text):
        start, end = m.span()
        piece = m.group()
        start += len(piece) - len(piece.lstrip())
        end -= len(piece) - len(piece.rstrip())
        if end > start:
            out.append(Segment(trace_id=trace_id, segment_index=len(out), char_start=start, char_end=end,
                               text=text[start:end], n_tokens=max(1, (end - start) // 4)))
    return out


def build_store(path: Path, traces: dict[str, tuple[str, str]]) -> Store:
    """A store at ``path`` holding ``{trace_id: (problem, text)}``, each segmented by :func:`split_segments`."""
    store = Store(path)
    store.upsert_traces([Trace(trace_id=tid, problem=problem, text=text) for tid, (problem, text) in traces.items()])
    for tid, (_, text) in traces.items():
        store.replace_segments(tid, split_segments(tid, text), segmenter="test-regex", token_counter="chars/4")
    return store


class Sleeps:
    """Records the waits a judge asks for instead of sleeping them (pass as its ``sleep``)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)

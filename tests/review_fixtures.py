"""Small hand-made stores for the review tests: non-ASCII traces, segments and baseline labels.

Segment offsets are found with ``str.index`` on hand-picked segment texts, so every segment
satisfies ``trace[start:end] == text`` by construction; the labels are chosen by hand.
"""

from __future__ import annotations

from pathlib import Path

from ror_annotate.records import Label, Segment, Trace
from ror_annotate.store import Store

BASELINE = "baseline:cue-v1"

# (trace_id, problem, [(segment text, baseline label, baseline confidence)], separator)
TRACES = [
    (
        "t-latex",
        "Solve $x^2 = 4$ for x > 0.",
        [
            ("Let me solve $x^2 = 4$ first.", "planning", 0.9),
            ("Taking roots: $x = \\pm 2$ — so x = ±2.", "execution", 0.8),
            ("🤔 Wait, is the negative root allowed?", "reflection", 0.4),
            ("The problem says x > 0.", "restatement", 0.7),
            ("So the answer is 2.", "conclusion", 0.95),
        ],
        " ",
    ),
    (
        "t-cjk",
        "计算 3 + 4。",
        [
            ("首先，我们计算 3 + 4。", "planning", 0.6),
            ("3 + 4 = 7。", "execution", 0.9),
            ("加法满足交换律。", "fact", 0.5),
            ("所以答案是 7。", "conclusion", 0.9),
        ],
        "",
    ),
    (
        "t-zwj",
        "A firefighter 👨🏻‍🚒 carries 5 hoses, 3 times. How many?",
        [
            ("👨🏻‍🚒 carries 5 hoses 3 times.", "restatement", 0.7),
            ("Next I compute 5 × 3.", "planning", 0.8),
            ("5 × 3 = 15 <b>hoses</b> & more.", "execution", 0.9),
            ("Therefore 15.", "conclusion", 0.9),
        ],
        "\n",
    ),
]


def build_trace(trace_id: str, problem: str, parts: list[tuple[str, str, float]], sep: str) -> tuple[Trace, list[Segment], list[Label]]:
    text = sep.join(p[0] for p in parts)
    trace = Trace(trace_id=trace_id, text=text, problem=problem, model="hand-made", dataset="unit")
    segments, labels, cursor = [], [], 0
    for i, (seg_text, label, conf) in enumerate(parts):
        start = text.index(seg_text, cursor)
        cursor = start + len(seg_text)
        segments.append(Segment(trace_id=trace_id, segment_index=i, char_start=start, char_end=cursor, text=seg_text, n_tokens=len(seg_text.split())))
        labels.append(Label(trace_id=trace_id, segment_index=i, label=label, source="baseline", annotator=BASELINE,
                            codebook_version="baseline-cue-v1", confidence=conf))
    return trace, segments, labels


def make_store(path: Path, *, with_labels: bool = True) -> Store:
    """A store at ``path`` holding :data:`TRACES`, their segments and (optionally) baseline labels."""
    store = Store(path)
    for trace_id, problem, parts, sep in TRACES:
        trace, segments, labels = build_trace(trace_id, problem, parts, sep)
        store.upsert_traces([trace])
        store.replace_segments(trace_id, segments, segmenter="hand", token_counter="words")
        if with_labels:
            store.upsert_labels(labels)
    return store


def baseline_label(trace_id: str, index: int) -> str:
    """The hand-chosen baseline label of a segment."""
    for tid, _, parts, _ in TRACES:
        if tid == trace_id:
            return parts[index][1]
    raise KeyError(trace_id)


ALL_KEYS = [(tid, i) for tid, _, parts, _ in TRACES for i in range(len(parts))]

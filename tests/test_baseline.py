"""The cue-phrase baseline: each behavior's clear cases, provenance, and idempotent labeling."""

from __future__ import annotations

from pathlib import Path

import pytest

from ror_annotate.judge import make_judge
from ror_annotate.judge.baseline import BASELINE_NAME, BASELINE_VERSION, classify_trace
from ror_annotate.records import Segment, Trace
from ror_annotate.store import Store

PROBLEM = "A rectangle has sides 3 and 4. What is the length of its diagonal?"
# Hand-labeled: what a reader of the codebook would call each segment.
CASES = [
    ("Okay, so I need to find the diagonal of a rectangle with sides 3 and 4.", "restatement"),
    ("Let me use the Pythagorean theorem.", "planning"),
    ("Recall that the Pythagorean theorem says a^2 + b^2 = c^2 for a right triangle.", "fact"),
    ("3^2 + 4^2 = 9 + 16 = 25, so c = 5.", "execution"),
    ("Wait, is that right?", "reflection"),
    ("Let me double-check by computing the square root of 25.", "planning"),
    ("Yes, that checks out.", "reflection"),
    ("So the answer is 5.", "conclusion"),
    ("**Final Answer**\n\\boxed{5}", "conclusion"),
]


def _segments(texts: list[str]) -> list[Segment]:
    out, pos = [], 0
    for i, t in enumerate(texts):
        out.append(Segment(trace_id="t", segment_index=i, char_start=pos, char_end=pos + len(t), text=t, n_tokens=len(t.split())))
        pos += len(t) + 1
    return out


def test_clear_cases_get_their_behavior() -> None:
    got = [b for b, _ in classify_trace(PROBLEM, _segments([t for t, _ in CASES]))]
    assert got == [b for _, b in CASES]


@pytest.mark.parametrize("text", ["Hmm, that contradicts the earlier result.", "But wait, I made a mistake in the sign."])
def test_doubt_is_reflection(text: str) -> None:
    assert classify_trace(None, _segments([text]))[0][0] == "reflection"


def test_labels_stored_with_baseline_provenance_and_idempotent(tmp_path: Path) -> None:
    text = " ".join(t for t, _ in CASES)
    with Store(tmp_path / "s.duckdb") as store:
        store.upsert_traces([Trace(trace_id="t", text=text, problem=PROBLEM)])
        store.replace_segments("t", _segments([t for t, _ in CASES]), segmenter="manual", token_counter="words")
        judge = make_judge("baseline")
        run = store.start_run("label", {})
        judge.label(store, ["t"], run=run)
        judge.label(store, ["t"], run=run)
        labels = store.labels()
    assert len(labels) == len(CASES)
    assert {(lab.source, lab.annotator, lab.codebook_version) for lab in labels} == {("baseline", BASELINE_NAME, BASELINE_VERSION)}
    assert all(lab.rationale.startswith("rule:") for lab in labels)
    assert [lab.label for lab in labels] == [b for _, b in CASES]


@pytest.mark.parametrize(
    "text, behavior",
    [
        ("Wait, but let me check that again.", "planning"),  # a doubt that opens a check is the round's plan
        ("Wait, 3/8 is 9/24 = 0.375, and 5/12 = 10/24.", "execution"),  # a cue followed by new computation
        ("So plugging in the numbers:", "planning"),  # a lead-in announcing the next step
        ("Hmm, that can't be right, since 2 + 2 = 4 and not 5.", "reflection"),  # an error claim stays reflection
    ],
)
def test_boundary_rules(text: str, behavior: str) -> None:
    assert classify_trace(None, _segments([text]))[0][0] == behavior

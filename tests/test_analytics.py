"""Trace analytics on hand-made labeled traces; every expected value is counted by hand."""

from __future__ import annotations

import pytest

from ror_annotate.analytics import SegmentView, analyze_trace, summarize
from ror_annotate.answers import answers_match, extract_answer

TRACE = [  # (label, text, n_tokens)
    ("planning", "Let me compute.", 3),
    ("execution", "2+2=4", 5),
    ("conclusion", "So the answer is 4.", 6),  # first answer: 3 + 5 = 8 tokens before it
    ("reflection", "Wait, is that right?", 5),  # round 1 opens
    ("planning", "Let me check again.", 4),  # same round
    ("execution", "2+2 is 4", 4),
    ("conclusion", "Yes, 4.", 3),
    ("reflection", "Hmm.", 2),  # round 2 opens
    ("conclusion", "Final answer: \\boxed{5}", 6),
]


def views(rows):
    return [SegmentView(i, lab, text, n) for i, (lab, text, n) in enumerate(rows)]


def test_positions_rounds_tokens_and_flip():
    a = analyze_trace("t", views(TRACE), gold_answer="4")
    assert a.n_tokens == 38
    assert (a.first_answer_segment, a.first_answer_token) == (2, 8)
    assert a.first_answer_fraction == pytest.approx(8 / 38)
    assert a.tokens_after_first_answer == 38 - 8 - 6
    assert a.recheck_rounds_after_first_answer == 2
    assert a.tokens_per_behavior == {"planning": 7, "execution": 9, "restatement": 0, "fact": 0, "reflection": 7, "conclusion": 15}
    assert (a.first_answer, a.final_answer) == ("4", "5")
    assert (a.first_correct, a.final_correct, a.flip) == (True, False, True)
    # the source's verdict on the final answer wins over matching
    b = analyze_trace("t", views(TRACE), gold_answer="4", correct=True)
    assert (b.final_correct, b.flip) == (True, False)
    # the answer field (text after </think>) is the final answer when present
    c = analyze_trace("t", views(TRACE), gold_answer="4", answer="The answer is $\\boxed{4}$.")
    assert (c.final_answer, c.flip) == ("4", False)


def test_conclusion_without_an_answer_is_not_the_first_answer():
    rows = [("conclusion", "So that is the plan.", 4), ("execution", "x = 3", 3), ("conclusion", "Thus x = 3.", 4)]
    a = analyze_trace("t", views(rows))
    assert (a.first_answer_segment, a.first_answer_token, a.recheck_rounds_after_first_answer) == (2, 7, 0)
    assert a.flip is None and a.first_correct is None  # no reference answer
    none = analyze_trace("t", views([("execution", "x = 3", 3), (None, "ok", 1)]))
    assert none.first_answer_segment is None and none.recheck_rounds_after_first_answer is None
    assert none.tokens_per_behavior["unlabeled"] == 1


def test_summary_over_traces():
    flip = analyze_trace("a", views(TRACE), gold_answer="4")  # flip
    recover = analyze_trace("b", views(TRACE), gold_answer="5")  # first 4 wrong, final 5 right
    no_gold = analyze_trace("c", views(TRACE[:3]))
    s = summarize([flip, recover, no_gold])
    assert s["n_traces"] == 3 and s["first_answer_found"] == 3
    assert s["flip"] == {"n_evaluable": 2, "n_flips": 1, "flip_rate": 0.5, "n_recoveries": 1, "recovery_rate": 0.5}
    assert s["recheck_rounds_after_first_answer"]["median"] == 2
    assert s["tokens_per_behavior"]["conclusion"] == 15 + 15 + 6
    total = 38 + 38 + 14
    assert s["token_share_after_first_answer"] == pytest.approx((24 + 24 + 0) / total)
    assert summarize([])["flip"]["flip_rate"] is None


@pytest.mark.parametrize(
    "answer, reference, expected",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("1,000", "1000", True),
        ("$42$.", "42", True),
        ("C", "(C)", True),
        ("\\dfrac{3}{4}", "\\frac{3}{4}", True),
        ("41", "42", False),
        (None, "42", None),
    ],
)
def test_answers_match(answer, reference, expected):
    assert answers_match(answer, reference) is expected


def test_extract_answer_prefers_the_last_boxed_with_nested_braces():
    assert extract_answer("first \\boxed{1} then \\boxed{\\frac{1}{2}} done 7") == "\\frac{1}{2}"
    assert extract_answer("the total is 1,250 apples") == "1,250"
    assert extract_answer("so the answer is (B)") == "B"
    assert extract_answer("no answer here") is None

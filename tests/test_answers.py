"""One answer rule for analytics (flip rate) and steering (accuracy): checked by hand cases."""

from __future__ import annotations

import pytest

from ror_annotate.answers import answers_match, extract_answer


@pytest.mark.parametrize(
    "answer, reference, expected",
    [
        ("\\frac{1}{2}", "0.5", True),  # exact fractions: 1/2 == 0.5
        ("\\dfrac{3}{4}", "\\frac{3}{4}", True),
        ("$12.0$", "12", True),
        ("1,234", "1234", True),
        ("\\text{yes}", "yes", True),
        ("C", "(C)", True),
        ("3/4", "0.75", True),
        ("13", "12", False),
        ("B", "(C)", False),
        (None, "12", None),
        ("12", "", None),
    ],
)
def test_answers_match_by_hand(answer, reference, expected) -> None:
    assert answers_match(answer, reference) is expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("first \\boxed{4}, wait, actually \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("Therefore the answer is 1,234.", "1,234"),
        ("so the answer is (B)", "B"),
        ("we get 12 apples and 7 pears", "7"),
        ("it must be option (D) then", "D"),
        ("no answer here", None),
        (None, None),
    ],
)
def test_extract_answer_by_hand(text, expected) -> None:
    assert extract_answer(text) == expected


def test_analytics_and_steering_use_the_same_rule() -> None:
    from ror_annotate import analytics
    from ror_annotate.steer import evaluate

    assert analytics.answers_match is evaluate.answers_match is answers_match
    assert analytics.extract_answer is evaluate.extract_answer is extract_answer

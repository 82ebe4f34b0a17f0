"""Final-answer extraction and comparison, shared by trace analytics and the steering evaluation.

One rule for "is this answer right" everywhere, so a flip rate in a dataset card and an accuracy in
a ``ror steer`` table can be compared. The rules are the usual math-benchmark ones (last
``\\boxed{}``, "the answer is X", last number, option letter), with numbers compared exactly as
fractions; they are heuristics, not a symbolic checker (no ``sympy`` equivalence).
"""

from __future__ import annotations

import re
from fractions import Fraction

from .traces import last_boxed

_ANSWER_IS = re.compile(r"answer is\s*:?\s*\$?([^\s$]+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")
_OPTION = re.compile(r"(?:\(|\b)([A-E])(?:\)|\b)")
_OPTION_ONLY = re.compile(r"^\(?([A-E])\)?$")


def extract_answer(text: str | None) -> str | None:
    """The answer stated in ``text``, or None.

    Order: the last ``\\boxed{...}`` (nested braces allowed), else the last "answer is X" (an option
    letter loses its parentheses), else the last number, else the last option letter (A-E).
    """
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    stated = _ANSWER_IS.findall(text)
    if stated:
        answer = stated[-1].rstrip(".,;")
        option = _OPTION_ONLY.match(answer)
        return option.group(1) if option else answer
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1]
    options = _OPTION.findall(text)
    return options[-1] if options else None


def normalize_answer(answer: str) -> str:
    """Canonical form: no spaces, ``$``, ``\\text{}``, ``\\left``/``\\right``, thousands commas, final period; lower case."""
    a = answer.replace("$", "").strip().rstrip(".")
    a = re.sub(r"\\text\{([^}]*)\}", r"\1", a)
    a = re.sub(r"\\(?:left|right|displaystyle|,|!|;)", "", a)
    a = a.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    a = re.sub(r"(?<=\d),(?=\d{3}\b)", "", a)
    a = re.sub(r"\s+", "", a).rstrip(".")
    return a.lower()


def _as_number(a: str) -> Fraction | None:
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(-?\d+)\}", a)
    try:
        if m:
            return Fraction(int(m.group(1)), int(m.group(2)))
        if re.fullmatch(r"-?\d+(?:\.\d+)?(?:/\d+)?", a):
            return Fraction(a)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def answers_match(answer: str | None, reference: str | None) -> bool | None:
    """Whether ``answer`` agrees with ``reference``; None when either is missing or empty.

    Equal after :func:`normalize_answer`, or equal as exact fractions (``\\frac{1}{2}`` = ``0.5`` =
    ``1/2``, ``12.0`` = ``12``), or equal to the answer extracted from a longer reference text.
    """
    if not answer or not reference:
        return None
    a, r = normalize_answer(answer), normalize_answer(reference)
    if a == r:
        return True
    na, nr = _as_number(a), _as_number(r)
    if na is not None and nr is not None:
        return na == nr
    ra = extract_answer(reference)
    if ra and ra != reference:
        return a == normalize_answer(ra) or answers_match(answer, ra) is True
    option = _OPTION_ONLY.match(r.upper())
    return option is not None and a.upper() == option.group(1)

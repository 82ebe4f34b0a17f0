"""``ror steer``: answer extraction, the summary arithmetic, and an end-to-end run on a saved tiny model."""

from __future__ import annotations

import json

import pytest

from ror_annotate.errors import InputError
from ror_annotate.answers import answers_match, extract_answer
from ror_annotate.steer.evaluate import load_problems, summarize


@pytest.mark.parametrize("text,expected", [
    ("so x = 3 and then \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
    ("first \\boxed{4}, wait, actually \\boxed{5}.", "5"),
    ("Therefore the answer is 1,234.", "1,234"),
    ("we get 12 apples and 7 pears", "7"),
    ("no digits here", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_answers_match_normalisation():
    assert answers_match("1,234", "1234")
    assert answers_match("$12.0$", "12")
    assert answers_match("\\text{yes}", "yes")
    assert not answers_match("13", "12")
    assert not answers_match(None, "12")
    assert not answers_match("12", "")


def test_summarize_hand_numbers():
    rows = [
        {"condition": "unmodified", "problem_id": "a", "generated_tokens": 100, "correct": True},
        {"condition": "unmodified", "problem_id": "b", "generated_tokens": 200, "correct": False},
        {"condition": "steered", "problem_id": "a", "generated_tokens": 50, "correct": True},
        {"condition": "steered", "problem_id": "b", "generated_tokens": 180, "correct": True},
    ]
    by = {s["condition"]: s for s in summarize(rows)}
    assert by["steered"]["median_tokens"] == 115
    assert by["steered"]["accuracy"] == 1.0 and by["unmodified"]["accuracy"] == 0.5
    # paired changes: -50% and -10% -> median -30%
    assert by["steered"]["median_token_change"] == pytest.approx(-0.30)
    assert by["steered"]["steered_rows"] is None  # rows without steered_tokens: nothing to report


def test_summarize_counts_the_rows_and_tokens_actually_steered():
    rows = [
        {"condition": "unmodified", "problem_id": "a", "generated_tokens": 10, "steered_tokens": None, "correct": True},
        {"condition": "steered", "problem_id": "a", "generated_tokens": 10, "steered_tokens": 4, "correct": True},
        {"condition": "steered", "problem_id": "b", "generated_tokens": 8, "steered_tokens": 0, "correct": True},
        {"condition": "random", "problem_id": "a", "generated_tokens": 9, "steered_tokens": 0, "correct": True},
    ]
    by = {s["condition"]: s for s in summarize(rows)}
    assert (by["steered"]["steered_rows"], by["steered"]["steered_tokens"]) == (1, 4)
    assert (by["random"]["steered_rows"], by["random"]["steered_tokens"]) == (0, 0)
    assert (by["unmodified"]["steered_rows"], by["unmodified"]["steered_tokens"]) == (None, None)


def test_load_problems_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n{"answer": "3"}\n')
    with pytest.raises(InputError, match=r"p.jsonl:2: no 'problem'"):
        load_problems(path)


@pytest.mark.steer
def test_ror_steer_end_to_end(tmp_path):
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from ror_annotate.cli import app

    from . import moe_fixtures as mf
    from .tokenizers_fixtures import byte_level_bpe

    tok = byte_level_bpe()
    model = mf.build("qwen3_moe")
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    (tmp_path / "problems.jsonl").write_text(
        "".join(json.dumps({"id": i, "problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in (1, 2)))
    (tmp_path / "spec.json").write_text(json.dumps({"suppress": {"0": [0, 1], "1": [2]}, "activate": {"1": [5]}}))
    res = CliRunner().invoke(app, ["steer", str(tmp_path / "problems.jsonl"), "--model", str(tmp_path / "model"),
                                   "--spec", str(tmp_path / "spec.json"), "--max-new-tokens", "6",
                                   "--out", str(tmp_path / "rows.jsonl")])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [(r["condition"], r["problem_id"]) for r in rows] == [
        (c, p) for c in ("unmodified", "steered", "random", "concise_prompt") for p in ("1", "2")]
    assert all(1 <= r["generated_tokens"] <= 6 for r in rows)
    assert "steering evaluation" in res.output
    assert [r["steered_tokens"] for r in rows] == [None, None] + [r["generated_tokens"] for r in rows[2:6]] + [None, None]
    # a schedule that never switches on within 6 tokens (a random model writes no answer): said so
    never = CliRunner().invoke(app, ["steer", str(tmp_path / "problems.jsonl"), "--model", str(tmp_path / "model"),
                                     "--spec", str(tmp_path / "spec.json"), "--max-new-tokens", "6", "--schedule", "after_first_answer",
                                     "--conditions", "unmodified,steered", "--out", str(tmp_path / "never.jsonl")])
    assert never.exit_code == 0, never.output
    assert [json.loads(line)["steered_tokens"] for line in (tmp_path / "never.jsonl").read_text().splitlines()] == [None, None, 0, 0]
    assert "0/2" in never.output and "steered no token" in never.output and "--max-new-tokens 6" in never.output
    bad = CliRunner().invoke(app, ["steer", str(tmp_path / "problems.jsonl"), "--model", str(tmp_path / "model"),
                                   "--spec", str(tmp_path / "spec.json"), "--schedule", "sometimes"])
    assert bad.exit_code == 2 and "unknown schedule" in bad.output


def test_load_problems_reads_a_traces_file(tmp_path):
    """In a traces file the reference is gold_answer (answer is the model's), the id is trace_id,
    and a null answer is no reference at all, never the string 'None'."""
    path = tmp_path / "traces.jsonl"
    rows = [
        {"trace_id": "t1", "problem": "1+1?", "answer": "3", "gold_answer": "2"},
        {"trace_id": "t2", "problem": "2+2?", "answer": None, "gold_answer": None},
        {"id": 7, "problem_id": "x", "question": "3+3?", "answer": "6"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_problems(path)
    assert [(p.problem_id, p.problem, p.answer) for p in got] == [("t1", "1+1?", "2"), ("t2", "2+2?", ""),
                                                                   ("7", "3+3?", "6")]
    assert not answers_match("None", got[1].answer)


def test_load_problems_refuses_repeated_ids_and_non_objects(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "problem": "x"}\n{"id": "a", "problem": "y"}\n')
    with pytest.raises(InputError, match=r"p.jsonl:2: problem id 'a' already used on line 1"):
        load_problems(path)
    path.write_text('["not", "an", "object"]\n')
    with pytest.raises(InputError, match=r"p.jsonl:1: expected a JSON object"):
        load_problems(path)

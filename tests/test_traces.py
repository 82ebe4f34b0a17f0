"""Reading traces: formats, think-tag extraction, column mapping, presets, stable ids, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ror_annotate.errors import ConfigError, InputError
from ror_annotate.traces import PRESETS, ColumnMap, content_trace_id, last_boxed, load_traces, split_reasoning


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "text, reasoning, answer",
    [
        ("<think>\nStep 1.\n</think>\n\nThe answer is 4.", "Step 1.", "The answer is 4."),
        ("Step 1 without opening tag.</think>Answer: 5", "Step 1 without opening tag.", "Answer: 5"),
        ("<think>cut off mid-thought", "cut off mid-thought", None),
        ("plain chain of thought", "plain chain of thought", None),
        ("<|begin_of_thought|>\nr\n<|end_of_thought|>\n<|begin_of_solution|>\ns\n<|end_of_solution|>", "r", "s"),
        ("<think>é 🙂 答</think>", "é 🙂 答", None),
    ],
)
def test_split_reasoning_variants(text: str, reasoning: str, answer: str | None) -> None:
    got_reasoning, got_answer, _ = split_reasoning(text)
    assert (got_reasoning, got_answer) == (reasoning, answer)


def test_last_boxed_balanced_braces() -> None:
    assert last_boxed(r"so \boxed{1} then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert last_boxed("no box") is None


def test_jsonl_json_parquet_give_same_traces(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "question": "Q1 ∑", "response": "<think>Let me think. 🙂</think>\n\\boxed{3}", "model": "m1"},
        {"id": "b", "question": "Q2", "response": "So 2+2=4.</think>4", "model": "m2"},
    ]
    jl = _write_jsonl(tmp_path / "t.jsonl", rows)
    js = tmp_path / "t.json"
    js.write_text(json.dumps(rows), encoding="utf-8")
    pqf = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pqf)
    results = [[t.model_copy(update={"source": None}) for t in load_traces(p).traces] for p in (jl, js, pqf)]
    assert results[0] == results[1] == results[2]
    assert load_traces(jl).traces[0].source == "t.jsonl"
    t = results[0][0]
    assert (t.trace_id, t.text, t.problem, t.answer, t.model) == ("a", "Let me think. 🙂", "Q1 ∑", "\\boxed{3}", "m1")
    assert results[0][1].answer == "4"


def test_hf_save_to_disk_folder(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_list([{"trace": "Hmm. Wait.", "problem": "p"}])
    ds.save_to_disk(str(tmp_path / "ds"))
    traces = load_traces(str(tmp_path / "ds")).traces
    assert traces[0].text == "Hmm. Wait." and traces[0].trace_id == content_trace_id("p", "Hmm. Wait.")


def test_content_id_is_stable_and_explicit_mapping_wins(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "t.jsonl", [{"body": "x y z", "q": "p", "trace": "other"}])
    a = load_traces(path, columns=ColumnMap(text="body", problem="q")).traces[0]
    b = load_traces(path, columns=ColumnMap(text="body", problem="q")).traces[0]
    assert a.text == "x y z" and a.trace_id == b.trace_id == content_trace_id("p", "x y z")
    assert a.trace_id.startswith("sha256:") and len(a.trace_id) == len("sha256:") + 16


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"trace": "ok"}\n{"trace": "broken"\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"bad\.jsonl:2: malformed JSON"):
        load_traces(path)
    result = load_traces(path, skip_invalid=True)
    assert len(result.traces) == 1 and len(result.skipped) == 1 and ":2" in result.skipped[0].where


def test_non_utf8_missing_field_empty_trace(tmp_path: Path) -> None:
    path = tmp_path / "enc.jsonl"
    path.write_bytes(b'{"trace": "fine"}\n{"trace": "caf\xe9"}\n')
    with pytest.raises(InputError, match=r"enc\.jsonl:2: byte \d+ is not valid UTF-8"):
        load_traces(path)
    missing = _write_jsonl(tmp_path / "missing.jsonl", [{"question": "no text here"}])
    with pytest.raises(InputError, match=r"missing\.jsonl:1: record has no reasoning text.*--text-field"):
        load_traces(missing)
    empty = _write_jsonl(tmp_path / "empty.jsonl", [{"trace": "<think>  </think>answer"}])
    with pytest.raises(InputError, match=r"empty\.jsonl:1: empty reasoning trace"):
        load_traces(empty)


def test_missing_relative_file_is_not_tried_as_a_hub_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a bare "name.jsonl" that does not exist used to fall through to datasets.load_dataset (network retries)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"^nothere\.jsonl: no such file"):
        load_traces("nothere.jsonl")


def test_duplicate_ids_are_an_error(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "dup.jsonl", [{"id": "x", "trace": "a"}, {"id": "x", "trace": "b"}])
    with pytest.raises(InputError, match=r"dup\.jsonl:2: duplicate trace id 'x' \(first seen at .*dup\.jsonl:1\)"):
        load_traces(path)


def test_unknown_preset_lists_available() -> None:
    with pytest.raises(ConfigError, match="openr1-math"):
        load_traces("x", preset="nope")


# Local fixtures with the column names of the public datasets' cards (the hub is not reachable here).
PRESET_FIXTURES = {
    "openr1-math": {
        "problem": "Find x.", "solution": "x=2", "answer": "2", "problem_type": "Algebra", "question_type": "math-word-problem",
        "source": "olympiads", "uuid": "u-1", "is_reasoning_complete": [True, True],
        "generations": ["<think>\nLet me solve. x = 2.\n</think>\n\nThus \\boxed{2}", "<think>\nTry x = 3. Wait, no.\n</think>\n\\boxed{3}"],
        "correctness_math_verify": [True, False], "correctness_count": 1, "finish_reasons": ["stop", "stop"],
    },
    "s1k-1.1": {
        "solution": "42", "question": "What is 6*7?", "cot_type": "math", "source_type": "qq8933/AIME_1983_2024", "metadata": "{}",
        "gemini_thinking_trajectory": "Gemini thinks.", "gemini_attempt": "42", "deepseek_thinking_trajectory": "6*7 = 42. So 42.",
        "deepseek_attempt": "The answer is 42.",
    },
    "s1k": {
        "solution": "42", "question": "What is 6*7?", "cot_type": "math", "source_type": "AI-MO/NuminaMath-CoT/aops_forum",
        "metadata": "{}", "cot": None, "thinking_trajectories": ["6 times 7. That is 42."], "attempt": "42",
    },
    "openthoughts": {
        "problem": "Sum 1..3?", "deepseek_reasoning": "1+2+3 = 6.", "deepseek_solution": "6", "ground_truth_solution": "6",
        "domain": "math", "source": "numina_math", "test_cases": None, "starter_code": None,
    },
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_on_local_fixtures(preset: str, tmp_path: Path) -> None:
    path = tmp_path / f"{preset}.parquet"
    pq.write_table(pa.Table.from_pylist([PRESET_FIXTURES[preset]]), path)
    traces = load_traces(path, preset=preset).traces
    expected = {
        "openr1-math": [("u-1/g0", "Let me solve. x = 2.", "Thus \\boxed{2}", "2", True, "olympiads"),
                        ("u-1/g1", "Try x = 3. Wait, no.", "\\boxed{3}", "2", False, "olympiads")],
        "s1k-1.1": [(None, "6*7 = 42. So 42.", "The answer is 42.", "42", None, "qq8933/AIME_1983_2024")],
        "s1k": [(None, "6 times 7. That is 42.", "42", "42", None, "AI-MO/NuminaMath-CoT/aops_forum")],
        "openthoughts": [(None, "1+2+3 = 6.", "6", "6", None, "math")],
    }[preset]
    got = [(t.trace_id if not t.trace_id.startswith("sha256:") else None, t.text, t.answer, t.gold_answer, t.correct, t.dataset) for t in traces]
    assert got == expected
    assert all(t.model for t in traces)


@pytest.mark.parametrize("tier", ["sample", pytest.param("shared", marks=pytest.mark.shared)])
def test_real_traces_load(tier: str, real_traces_path: Path, shared_traces_path: Path) -> None:
    path, n = (real_traces_path, 40) if tier == "sample" else (shared_traces_path, 201)  # the data READMEs' counts
    rows = [json.loads(line) for line in path.open(encoding="utf-8")]
    traces = load_traces(path).traces
    assert len(traces) == len(rows) == n
    by_id = {t.trace_id: t for t in traces}
    for row in rows:
        t = by_id[row["trace_id"]]
        assert t.text == row["trace"].strip() and t.model == row["model"] and t.dataset == row["benchmark"]

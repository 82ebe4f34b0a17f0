"""Issue 27, ingest: a user-given trace id wins over a response's own id, a saved assistant message
keeps its answer, a deeply nested JSON line is a coded error for that record.

Expected values are written by hand from the inputs next to them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ror_annotate.errors import InputError
from ror_annotate.traces import load_traces


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _response(rid: str, reasoning: str, answer: str, **extra: object) -> dict:
    return {"id": rid, "model": "m", "choices": [{"message": {"role": "assistant", "reasoning_content": reasoning, "content": answer}}], **extra}


def test_user_trace_id_wins_over_the_response_id(tmp_path: Path) -> None:
    rows = [_response("chatcmpl-same", f"r{n}.", f"a{n}", trace_id=f"mine-{n}") for n in range(3)]
    result = load_traces(_jsonl(tmp_path / "r.jsonl", rows))
    assert [t.trace_id for t in result.traces] == ["mine-0", "mine-1", "mine-2"]
    assert [t.meta["response_id"] for t in result.traces] == ["chatcmpl-same"] * 3
    kept = load_traces(_jsonl(tmp_path / "s.jsonl", rows), skip_invalid=True)
    assert len(kept.trace_ids) == 3 and kept.skipped == []


def test_batch_custom_id_still_names_the_trace_and_a_bare_response_keeps_its_id(tmp_path: Path) -> None:
    batch = {"id": "batch_req_1", "custom_id": "task-7", "response": {"status_code": 200, "body": _response("chatcmpl-3", "b.", "B")}}
    bare = _response("chatcmpl-9", "x.", "1")
    traces = load_traces(_jsonl(tmp_path / "b.jsonl", [batch, bare])).traces
    assert [t.trace_id for t in traces] == ["task-7", "chatcmpl-9"]
    assert traces[0].meta["response_id"] == "chatcmpl-3"


def test_saved_assistant_message_keeps_its_answer(tmp_path: Path) -> None:
    message = {"role": "assistant", "content": "The answer is 4.", "reasoning_content": "2 plus 2.\nSo 4."}
    (t,) = load_traces(_jsonl(tmp_path / "m.jsonl", [message])).traces
    assert (t.text, t.answer, t.source_format) == ("2 plus 2.\nSo 4.", "The answer is 4.", "assistant-message")
    with_id = {**message, "trace_id": "t1", "reasoning_content": None, "reasoning": "Think.", "content": "Done."}
    (u,) = load_traces(_jsonl(tmp_path / "n.jsonl", [with_id])).traces
    assert (u.trace_id, u.text, u.answer) == ("t1", "Think.", "Done.")


def _deep(depth: int) -> str:
    return '{"trace": ' + "[" * depth + "]" * depth + "}"


def test_deeply_nested_json_line_is_a_coded_error_for_that_record(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text('{"trace": "fine."}\n' + _deep(100_000) + "\n" + '{"trace": "also fine."}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"deep\.jsonl:2: .*nested") as err:
        load_traces(path)
    assert err.value.code == "E111"
    result = load_traces(path, skip_invalid=True)
    assert [t.text for t in result.traces] == ["fine.", "also fine."]
    assert [s.where.endswith(":2") for s in result.skipped] == [True]


def test_deeply_nested_json_array_file_and_text_column(tmp_path: Path) -> None:
    array = tmp_path / "deep.json"
    array.write_text("[" + _deep(100_000) + "]", encoding="utf-8")
    with pytest.raises(InputError, match="nested") as err:
        load_traces(array)
    assert err.value.code == "E111"
    column = _jsonl(tmp_path / "col.jsonl", [{"trace": "[" * 100_000 + "]" * 100_000}])
    # a text column that is not a JSON response stays text; it must not crash the reader
    (t,) = load_traces(column).traces
    assert t.text.startswith("[[[")


def test_deeply_nested_line_through_the_cli_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text(_deep(100_000) + "\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "ror_annotate", "ingest", str(path), "--db", str(tmp_path / "s.duckdb")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "error [E111]" in out.stderr

"""Issue 26: ingest's per-load shortcuts (plain text without marker characters, dict records without
structure keys, one store check per batch for a read-once input) store exactly what the per-record
path stores.

The reference is the per-record path itself: the shortcuts switched off (``_Plan.plain`` always
False, no built-in structured detectors recognised, the input read twice as a large input is),
which is the code of main before issue 26. A few stored values are also checked by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ror_annotate import formats, pipeline, traces
from ror_annotate.errors import InputError
from ror_annotate.formats import FORMATS, StructuredFormat
from ror_annotate.sample import sample_path
from ror_annotate.store import Store

from .conftest import SHARED

#: Every stored column but the two that name the time and the run of the ingest.
COLUMNS = "trace_id, text, text_sha256, problem, answer, gold_answer, correct, model, source, dataset, source_format, meta"


def _mixed_records() -> list[Any]:
    """Records of every registered format, plus plain texts at the edges of the shortcuts' guards."""
    recs: list[Any] = []
    for n, (name, adapter) in enumerate(FORMATS.items()):
        if isinstance(adapter, StructuredFormat):
            recs.append({**json.loads(adapter.example), "trace_id": f"whole-{name}"})  # the whole record is the structure
            recs.append({"trace_id": f"nested-{name}", "trace": json.loads(adapter.example)})  # nested in the text column
            recs.append({"trace_id": f"string-{name}", "trace": adapter.example})  # saved as a JSON string
        else:
            recs.append({"trace_id": f"text-{name}", "problem": f"Q{n}", "trace": adapter.example})
    recs += [
        {"trace_id": "plain", "problem": "What is 6*7?", "trace": "Let me compute 6*7. That is 42. \\boxed{42}"},
        {"trace_id": "crlf", "trace": "First line.\r\nSecond line.\rThird."},
        {"trace_id": "bom", "trace": "\ufeffA BOM starts this text."},
        {"trace_id": "eos", "trace": "Reasoning then the end token.<|im_end|>"},
        {"trace_id": "bracket", "trace": "An interval [0, 1] is not a Mistral marker."},
        {"trace_id": "brace", "trace": "{not json} but braces first"},
        {"trace_id": "lt", "trace": "We know 3 < 4 and x<think>y</think>z"},
        {"trace_id": "gens", "trace": ["First generation.", "Second <think>r</think>a"], "correct": [True, False]},
        {"trace_id": "role-not-assistant", "role": "user", "trace": "A record with a role key that is no message."},
        {"trace_id": "messages-not-a-list", "messages": "just text", "trace": "A messages key that is no transcript."},
        {"id": "own-id", "question": "Q?", "reasoning": "Candidate columns, not the first names.", "final_answer": "A", "extra": 3,
         "nan": float("nan"), "flag": True},
        {"trace": "No id at all: the content names it.", "problem": "P"},
        {"trace_id": 7, "trace": "A numeric id.", "model": "m", "dataset": "GSM8K", "gold_answer": "4"},
    ]
    return recs


def _bad_records() -> list[Any]:
    return [
        {"trace_id": "empty", "trace": "   "},
        {"trace_id": "nested-tags", "trace": "<think>a<think>b</think></think>"},
        {"trace_id": "no-text", "problem": "only a problem"},
        {"trace_id": "number", "trace": 5},
        {"trace_id": "word-marker", "trace": "analysis then assistantfinal the answer"},
        {"trace_id": "plain", "trace": "A duplicate id."},
    ]


def _write(path: Path, records: list[Any], extra_lines: tuple[str, ...] = ()) -> Path:
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join([*lines, *extra_lines]) + "\n", encoding="utf-8")
    return path


def _ingest(db: Path, source: Path, **kw: Any) -> tuple[list[tuple], pipeline.IngestSummary]:
    with Store(db) as store:
        summary = pipeline.ingest(store, source, **kw)
        rows = store.execute(f"SELECT {COLUMNS} FROM traces ORDER BY trace_id").fetchall()
    return rows, summary


def _both(tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[Any, Any]:
    calls = {"n": 0}
    real = formats.detect_text_format

    def counting(text: str) -> Any:
        calls["n"] += 1
        return real(text)

    monkeypatch.setattr(formats, "detect_text_format", counting)
    monkeypatch.setattr(pipeline, "INGEST_BATCH", 4)  # several batches even on a small input
    fast = _ingest(tmp_path / "fast.duckdb", source, **kw)
    fast_calls, calls["n"] = calls["n"], 0
    with monkeypatch.context() as m:
        m.setattr(traces._Plan, "plain", lambda self, value, mapping, format: False)
        m.setattr(traces, "_BUILTIN_DETECTS", {})
        m.setattr(pipeline, "INGEST_KEEP_CHARS", -1)
        slow = _ingest(tmp_path / "slow.duckdb", source, **kw)
    assert fast_calls < calls["n"] / 2, "the plain-text shortcut was not taken"  # (per pass: the slow path reads twice)
    return fast, slow


def _same(fast: tuple, slow: tuple) -> None:
    (rows_f, sum_f), (rows_s, sum_s) = fast, slow
    assert rows_f == rows_s
    assert sum_f.model_dump() == sum_s.model_dump()


def test_mixed_formats_store_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _write(tmp_path / "mixed.jsonl", _mixed_records())
    fast, slow = _both(tmp_path, source, monkeypatch)
    _same(fast, slow)
    rows = {r[0]: r for r in fast[0]}
    # by hand: CRLF and lone CR become LF, a BOM is dropped, a trailing end token is removed, plain is plain
    assert rows["crlf"][1] == "First line.\nSecond line.\nThird." and rows["crlf"][10] == "plain"
    assert rows["bom"][1] == "A BOM starts this text."
    assert rows["eos"][1] == "Reasoning then the end token." and json.loads(rows["eos"][11])["eos_token"] == "<|im_end|>"
    assert rows["plain"][4] == "42" and rows["plain"][3] == "What is 6*7?"
    assert rows["lt"][10] == "think" and rows["lt"][1] == "y" and rows["lt"][4] == "z"
    assert rows["role-not-assistant"][10] == "plain"
    assert (rows["gens/g0"][6], rows["gens/g1"][6], rows["gens/g1"][10]) == (True, False, "think")
    assert rows["7"][7:10] == ("m", "mixed.jsonl", "GSM8K")
    assert json.loads(rows["own-id"][11]) == {"extra": 3, "flag": True}


def test_bad_records_are_named_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _write(tmp_path / "bad.jsonl", [*_mixed_records(), *_bad_records()], extra_lines=("{broken",))
    fast, slow = _both(tmp_path, source, monkeypatch, skip_invalid=True)
    _same(fast, slow)
    reasons = fast[1].skipped_reasons
    assert len(reasons) == 7 and any("assistantfinal" in r for r in reasons) and any("duplicate trace id 'plain'" in r for r in reasons)
    # without --skip-invalid: the same first error, code and line
    for bad in _bad_records()[:5]:
        one = _write(tmp_path / "one.jsonl", [{"trace_id": "ok", "trace": "Fine."}, bad])
        errors = []
        for fast_path in (True, False):
            with monkeypatch.context() as m:
                if not fast_path:
                    m.setattr(traces._Plan, "plain", lambda self, value, mapping, format: False)
                    m.setattr(traces, "_BUILTIN_DETECTS", {})
                with pytest.raises(InputError) as err, Store(tmp_path / f"e{fast_path}.duckdb") as store:
                    pipeline.ingest(store, one)
            errors.append((err.value.code, err.value.message))
        assert errors[0] == errors[1] and f"{one}:2" in errors[0][1]


def test_plugin_text_format_turns_the_plain_shortcut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text adapter detected by a marker starting with a letter makes no text provably plain."""
    from ror_annotate.formats import FORMAT_REGISTRY, TagFormat

    plan = traces._Plan(traces.ColumnMap())
    assert plan.plain("no markers here", traces.ColumnMap(), "auto") and plan.skip_structured
    assert not plan.plain("x < y", traces.ColumnMap(), "auto") and not plan.plain("no markers", traces.ColumnMap(), "think")
    FORMAT_REGISTRY.register("begin-tags", TagFormat("begin-tags", "BEGIN", "END", "test", "BEGIN R END A"), replace=True)
    try:
        plan = traces._Plan(traces.ColumnMap())
        assert not plan.plain("BEGIN r END a", traces.ColumnMap(), "auto")
        got = traces.records_to_traces({"trace": "BEGIN r END a"}, "x:1", traces.ColumnMap(), "x", _plan=plan)
        assert got[0].source_format == "begin-tags" and got[0].text == "r"
    finally:
        FORMAT_REGISTRY.unregister("begin-tags")


def test_the_sample_stores_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _same(*_both(tmp_path, sample_path(), monkeypatch))


@pytest.mark.shared
def test_the_real_traces_store_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = SHARED / "data" / "traces.jsonl"
    fast = _ingest(tmp_path / "fast.duckdb", path)
    with monkeypatch.context() as m:
        m.setattr(traces._Plan, "plain", lambda self, value, mapping, format: False)
        m.setattr(traces, "_BUILTIN_DETECTS", {})
        m.setattr(pipeline, "INGEST_KEEP_CHARS", -1)
        slow = _ingest(tmp_path / "slow.duckdb", path)
    _same(fast, slow)

"""What the judge's writer (persist.AnswerWriter.write_group) stores, checked against values worked
out here by hand: the labels' rows (ids, per-answer values spread over their rows, a repeated label
id), the judge_cache row and its commit-journal record; and the failure rows of labelled segments,
deleted whether they come from an earlier run or from this writer, and only those.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

from ror_annotate.journal import JOURNAL_SUFFIX
from ror_annotate.judge.persist import Answer, AnswerWriter, LabelRows, ensure_judge_tables
from ror_annotate.records import Label
from tests.judge_fixtures import TRACE_A, TRACE_U, build_store

ANN = "openai:gpt-x"
CB = "cb-1"
RUN = "run-1"


def _writer(store):
    return AnswerWriter(store, codebook_version=CB, prompt_template_hash="tpl", model="gpt-x", every_s=60.0)


def _rows(trace_id, labels, *, annotator=ANN, extra=None, created_at=None):
    """LabelRows of ``labels``: ``[(segment_index, label, confidence, rationale), ...]``."""
    return LabelRows(trace_id=trace_id, annotator=annotator, codebook_version=CB, run_id=RUN, source="judge",
                     extra=extra if extra is not None else {"n": trace_id},
                     created_at=created_at or datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc),
                     segment_index=[x[0] for x in labels], label=[x[1] for x in labels],
                     confidence=[x[2] for x in labels], rationale=[x[3] for x in labels])


def _answer(trace_id, labels=(), *, failures=None, annotator=ANN, objects=False, cache_row=None, **kw):
    rows = _rows(trace_id, list(labels), annotator=annotator, **kw) if labels and not objects else None
    objs = [Label(trace_id=trace_id, segment_index=i, label=lab, source="judge", annotator=annotator, codebook_version=CB,
                  run_id=RUN, confidence=conf, rationale=why) for i, lab, conf, why in labels] if objects else []
    return Answer(trace_id=trace_id, trace_sha256="sha", annotator=annotator, run_id=RUN, cache_row=cache_row,
                  labels=objs, failures=failures or {}, attempts=3, cause="parse", label_rows=rows)


def _failures(store):
    return sorted(store.execute("SELECT trace_id, segment_index, annotator, codebook_version FROM judge_failures").fetchall())


def _old_failure(store, trace_id, index, annotator=ANN, codebook_version=CB):
    """A failure row as an earlier run left it."""
    store.execute(
        "INSERT INTO judge_failures (trace_id, segment_index, annotator, codebook_version, reason, attempts, run_id, created_at, cause) "
        "VALUES (?, ?, ?, ?, 'bad answer', 3, 'run-0', TIMESTAMP '2025-01-01 00:00:00', 'parse')",
        [trace_id, index, annotator, codebook_version],
    )


def _label_id(trace_id, index, annotator):
    """Label.label_id by its definition: the first 32 hex digits of the sha256 of the JSON key."""
    key = json.dumps([trace_id, index, "judge", annotator, CB, None], ensure_ascii=False)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


# ------------------------------------------------------------------------------ failure rows of labelled segments
def test_failure_rows_of_an_earlier_run_are_deleted_when_their_segments_are_labelled(tmp_path):
    for objects in (False, True):  # labels as columns (the judge's own) and as Label objects (a custom make_labels)
        store = build_store(tmp_path / f"s{objects}.duckdb", {"a": ("p", TRACE_A), "u": ("q", TRACE_U)})
        ensure_judge_tables(store)
        for index in (0, 1, 2):
            _old_failure(store, "a", index)
        _old_failure(store, "a", 0, annotator="openai:other")  # another rater's failure of the same segment
        _old_failure(store, "a", 0, codebook_version="cb-0")  # an older codebook's
        _old_failure(store, "u", 0)
        w = _writer(store)
        # the first group labels segments without failure rows: nothing to delete
        w.write(_answer("u", [(1, "planning", 0.5, None)], objects=objects))
        assert len(_failures(store)) == 6
        # a later group labels segments 0 and 2 of trace a: their failure rows (this rater, this codebook) go
        w.add(_answer("a", [(0, "planning", 0.9, "x")], objects=objects))
        w.add(_answer("a", [(2, "reflection", None, None), (3, "fact", 1.0, None)], objects=objects))
        w.flush()
        assert _failures(store) == [("a", 0, "openai:gpt-x", "cb-0"), ("a", 0, "openai:other", CB), ("a", 1, ANN, CB),
                                    ("u", 0, ANN, CB)]
        store.close()


def test_failure_rows_this_writer_wrote_are_deleted_when_their_segments_are_labelled_later(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("p", TRACE_A), "u": ("q", TRACE_U)})
    ensure_judge_tables(store)
    w = _writer(store)
    w.write(_answer("u", [(0, "planning", 0.9, None)]))  # the store holds no failure row yet
    w.write(_answer("a", failures={1: "bad", 4: "bad"}))  # this writer fails segments 1 and 4 of trace a ...
    w.write(_answer("u", failures={2: "bad"}, annotator="openai:gpt-x@s2"))  # ... and another rater's segment of u
    assert _failures(store) == [("a", 1, ANN, CB), ("a", 4, ANN, CB), ("u", 2, "openai:gpt-x@s2", CB)]
    w.write(_answer("a", [(1, "fact", 0.2, None)]))  # ... then labels segment 1 (a retry that succeeded)
    assert _failures(store) == [("a", 4, ANN, CB), ("u", 2, "openai:gpt-x@s2", CB)]
    w.write(_answer("u", [(2, "fact", 0.2, None)], annotator="openai:gpt-x@s2", objects=True))
    assert _failures(store) == [("a", 4, ANN, CB)]
    # a failure and a label of the same trace in one group: the label's failure row goes, the new one stays
    w.add(_answer("a", [(4, "planning", None, None)]))
    w.add(_answer("a", failures={5: "bad"}))
    w.flush()
    assert _failures(store) == [("a", 5, ANN, CB)]
    store.close()


def test_a_new_writer_sees_the_failure_rows_an_earlier_writer_left(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("p", TRACE_A)})
    ensure_judge_tables(store)
    first = _writer(store)
    first.write(_answer("a", [(0, "planning", 0.9, None)]))
    first.write(_answer("a", failures={2: "bad"}))
    _writer(store).write(_answer("a", [(2, "fact", 0.1, None)]))  # the next run's writer
    assert _failures(store) == []
    store.close()


# ------------------------------------------------------------------------------ store content, worked out by hand
def test_label_rows_are_stored_as_worked_out_by_hand(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("p", TRACE_A), "u": ("q", TRACE_U)})
    ensure_judge_tables(store)
    t1 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
    t2 = datetime(2026, 1, 2, 4, 0, 0, 1)  # naive: taken as UTC
    answers = [
        _answer("a", [(0, "planning", 0.9, "cue «0» 😀"), (1, "execution", None, None)], extra={"k": "é", "n": [1, 2]}, created_at=t1),
        _answer("u", [(3, "conclusion", 1.0, 'said "so"')], annotator="openai:gpt-x@s2", extra={}, created_at=t2),
        _answer("a", []),  # an answer without labels
        _answer("a", [(1, "reflection", 0.0, "later"), (2, "fact", 0.25, None), (4, "restatement", 0.5, None)],
                extra={"attempt": 2}, created_at=t2),  # relabels segment 1: the later row wins
    ]
    w = _writer(store)
    for a in answers:
        w.add(a)
    w.flush()
    got = store.execute("SELECT label_id, trace_id, segment_index, label, source, annotator, codebook_version, run_id, study, confidence, "
                        "rationale, created_at, extra, distribution FROM labels ORDER BY trace_id, segment_index").fetchall()
    naive1, naive2 = datetime(2026, 1, 2, 3, 4, 5, 678901), datetime(2026, 1, 2, 4, 0, 0, 1)
    extra1, extra3 = '{"k": "é", "n": [1, 2]}', '{"attempt": 2}'
    expected = [
        (_label_id("a", 0, ANN), "a", 0, "planning", "judge", ANN, CB, RUN, None, 0.9, "cue «0» 😀", naive1, extra1, None),
        (_label_id("a", 1, ANN), "a", 1, "reflection", "judge", ANN, CB, RUN, None, 0.0, "later", naive2, extra3, None),
        (_label_id("a", 2, ANN), "a", 2, "fact", "judge", ANN, CB, RUN, None, 0.25, None, naive2, extra3, None),
        (_label_id("a", 4, ANN), "a", 4, "restatement", "judge", ANN, CB, RUN, None, 0.5, None, naive2, extra3, None),
        (_label_id("u", 3, "openai:gpt-x@s2"), "u", 3, "conclusion", "judge", "openai:gpt-x@s2", CB, RUN, None, 1.0, 'said "so"',
         naive2, "{}", None),
    ]
    assert got == expected
    # the Label objects of the same answers store the same rows (Label.label_id is the reference id)
    assert [r[0] for r in got] == [Label(trace_id=r[1], segment_index=r[2], label=r[3], source="judge", annotator=r[5],
                                         codebook_version=CB).label_id for r in got]
    store.close()


def test_the_cache_row_and_its_journal_record_are_stored_as_worked_out_by_hand(tmp_path):
    db = tmp_path / "s.duckdb"
    store = build_store(db, {"a": ("p", TRACE_A)})
    ensure_judge_tables(store)
    response = {"id": "r1", "choices": [{"message": {"content": '{"labels": [{"segment_id": 0, "label": "planning"}]}'}}],
                "model": "gpt-x", "note": "ünïcode ✅"}
    cache_row = {"cache_key": "key-1", "params": {"temperature": 0.0, "max_tokens": 64, "seed": 7}, "ids": [0, 1], "attempt": 2,
                 "response": response, "input_tokens": 120, "cached_input_tokens": 0, "output_tokens": 30, "cost_usd": 0.25,
                 "reasoning": "thought", "usage_status": "ok"}
    unknown = {**cache_row, "cache_key": "key-2", "usage_status": "missing", "cost_usd": None, "reasoning": None}
    w = _writer(store)
    w.add(_answer("a", [(0, "planning", 0.9, None)], cache_row=cache_row))
    w.add(_answer("a", [(1, "execution", 0.9, None)], cache_row=unknown))
    w.flush()
    rows = store.execute("SELECT cache_key, annotator, codebook_version, prompt_template_hash, model, params, trace_id, trace_sha256, "
                         "segment_ids, attempt, response, input_tokens, cached_input_tokens, output_tokens, cost_usd, run_id, reasoning, "
                         "usage_status, created_at FROM judge_cache ORDER BY cache_key").fetchall()
    params_json = '{"max_tokens": 64, "seed": 7, "temperature": 0.0}'  # keys sorted
    response_json = ('{"id": "r1", "choices": [{"message": {"content": "{\\"labels\\": [{\\"segment_id\\": 0, \\"label\\": '
                     '\\"planning\\"}]}"}}], "model": "gpt-x", "note": "ünïcode ✅"}')
    assert json.loads(response_json) == response
    assert [r[:-1] for r in rows] == [
        ("key-1", ANN, CB, "tpl", "gpt-x", params_json, "a", "sha", "[0, 1]", 2, response_json, 120, 0, 30, 0.25, RUN, "thought", "ok"),
        ("key-2", ANN, CB, "tpl", "gpt-x", params_json, "a", "sha", "[0, 1]", 2, response_json, None, None, None, None, RUN, None, "missing"),
    ]
    created = rows[0][-1]
    assert rows[1][-1] == created
    # the commit's journal line: each paid response's row, its columns in table order, created_at as ISO text
    lines = [json.loads(line) for line in Path(str(db) + JOURNAL_SUFFIX).read_text(encoding="utf-8").splitlines()]
    notes = [n for line in lines for n in line.get("notes", [])]
    columns = ["cache_key", "annotator", "codebook_version", "prompt_template_hash", "model", "params", "trace_id", "trace_sha256",
               "segment_ids", "attempt", "response", "input_tokens", "cached_input_tokens", "output_tokens", "cost_usd", "created_at",
               "run_id", "reasoning", "usage_status"]
    assert [kind for kind, _ in notes] == ["judge_cache", "judge_cache"]
    assert [list(p) for _, p in notes] == [columns, columns]
    assert notes[0][1] == {"cache_key": "key-1", "annotator": ANN, "codebook_version": CB, "prompt_template_hash": "tpl", "model": "gpt-x",
                           "params": params_json, "trace_id": "a", "trace_sha256": "sha", "segment_ids": "[0, 1]", "attempt": 2,
                           "response": response_json, "input_tokens": 120, "cached_input_tokens": 0, "output_tokens": 30,
                           "cost_usd": 0.25, "created_at": created.isoformat(), "run_id": RUN, "reasoning": "thought",
                           "usage_status": "ok"}
    assert notes[1][1]["input_tokens"] is None and notes[1][1]["usage_status"] == "missing"
    # written compactly, non-ASCII as is
    raw = Path(str(db) + JOURNAL_SUFFIX).read_text(encoding="utf-8")
    assert '"note\\": \\"ünïcode ✅\\"}' in raw and '"notes":[["judge_cache",{"cache_key":"key-1",' in raw
    store.close()

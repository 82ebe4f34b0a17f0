"""The judge's labels written as columns (persist.LabelRows) equal the Label objects' rows.

The reference is the store's own per-object path (``Store.upsert_labels`` of the labels
``LLMJudge.make_labels`` gives): the same answers are written once each way, into two stores, and
the stored rows are compared column by column.
"""

from __future__ import annotations

from ror_annotate.judge.llm import ChunkResult, LLMJudge
from ror_annotate.judge.persist import ensure_judge_tables
from tests.judge_fixtures import TRACE_A, TRACE_U, build_store

_COLUMNS = "label_id, trace_id, segment_index, label, source, annotator, codebook_version, run_id, study, confidence, rationale, extra, distribution"


class _ObjectJudge(LLMJudge):
    """The same judge with make_labels overridden (by itself): its answers carry Label objects."""

    def make_labels(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return LLMJudge.make_labels(self, *args, **kwargs)


def _write(tmp_path, judge_type, name):
    store = build_store(tmp_path / f"{name}.duckdb", {"a": ("p", TRACE_A), "u": ("q", TRACE_U)})
    ensure_judge_tables(store)
    judge = judge_type("gpt-x", base_url="http://127.0.0.1:9/v1", samples=2)
    writer = judge.writer(store)
    answers = []
    for tid in ("a", "u"):
        trace = store.get_trace(tid)
        for sample in (1, 2):
            # two answers of one trace, the second relabelling segment 1 (the later one wins), one with no labels
            results = [ChunkResult(good={0: ("planning", 0.9, "cue «0» 😀"), 1: ("execution", None, None)}),
                       ChunkResult(good={1: ("reflection", 1.0, 'said "wait"'), 2: ("fact", 0.0, None)}), ChunkResult(bad={3: "missing"})]
            for n, result in enumerate(results):
                extra = {"model": "gpt-x", "attempt": n + 1, "cache_key": f"{tid}{sample}{n}", "params": {"t": 0.0}}
                answers.append(judge.answer_record(trace=trace, sample=sample, run_id="run-1", cache_row=None, result=result,
                                                   failures={}, attempts=n + 1, extra=extra))
    for answer in answers:
        writer.add(answer)
    writer.flush()
    rows = store.execute(f"SELECT {_COLUMNS} FROM labels ORDER BY label_id").fetchall()
    store.close()
    return answers, rows


def test_label_rows_store_what_label_objects_store(tmp_path):
    columns, got = _write(tmp_path, LLMJudge, "rows")
    objects, expected = _write(tmp_path, _ObjectJudge, "objects")
    assert all(a.labels == [] for a in columns) and any(a.label_rows is not None for a in columns)
    assert all(a.label_rows is None for a in objects) and any(a.labels for a in objects)
    assert got == expected and len(got) == 2 * 2 * 3  # traces x samples x distinct segments
    by_segment = {(r[1], r[5], r[2]): r for r in got}
    assert by_segment[("a", "openai:gpt-x", 1)][3] == "reflection"  # the later answer's label
    assert by_segment[("u", "openai:gpt-x@s2", 0)][10] == "cue «0» 😀"

"""The judge's per-trace reads on a reader thread (llm._Prefetch): blocks of takes read ahead by a
thread with its own store handle, in the run's order (every trace for sample 1, then sample 2),
dropped once used; a store without a thread handle reads them on the loop's thread; a failed read
surfaces as the run's error and stops the thread.

Expected values: the hand-known labels of the fixtures (LABELS_A, LABELS_U), thread names, and the
block numbers the order implies (block size set to 2 here)."""

from __future__ import annotations

import threading

import pytest

from ror_annotate.errors import StoreError
from ror_annotate.judge import llm, make_judge

from .judge_fixtures import LABELS_A, LABELS_U, TRACE_A, TRACE_U, build_store
from .openai_server import FakeOpenAI

# no OPENAI_API_KEY / OPENAI_BASE_URL of the machine reaches a test (conftest.no_openai_env)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_openai_env")]

MODEL = "gpt-4.1-mini"


@pytest.fixture
def reads(monkeypatch):
    """Blocks of 2 takes; records (thread name, block number) of every block read."""
    monkeypatch.setattr(llm._Prefetch, "BLOCK", 2)
    log: list[tuple[str, int]] = []
    original = llm._Prefetch._read

    def _read(self, store, number):
        log.append((threading.current_thread().name, number))
        return original(self, store, number)

    monkeypatch.setattr(llm._Prefetch, "_read", _read)
    return log


def _traces(n: int) -> dict[str, tuple[str, str]]:
    return {f"t{i}": (f"Problem {i}.", TRACE_U if i % 2 else TRACE_A) for i in range(n)}


def _labels(store, tid, annotator):
    rows = store.execute("SELECT label FROM labels WHERE trace_id = ? AND annotator = ? ORDER BY segment_index", [tid, annotator])
    return [r[0] for r in rows.fetchall()]


def test_blocks_are_read_on_the_reader_thread_in_the_runs_order_for_every_sample(tmp_path, reads):
    store = build_store(tmp_path / "s.duckdb", _traces(5))
    with FakeOpenAI() as srv:
        report = make_judge(f"openai:{MODEL}", base_url=srv.base_url, samples=2, seed=3, concurrency=4).label(
            store, [f"t{i}" for i in range(5)])
    # 5 traces x 2 samples = 10 takes in blocks of 2: blocks 0-4, each read once, all on the reader thread
    assert sorted(n for _, n in reads) == [0, 1, 2, 3, 4]
    assert {name.rsplit("_", 1)[0] for name, _ in reads} == {"ror-judge-reader"}
    assert report.labeled == 2 * (3 * len(LABELS_A) + 2 * len(LABELS_U))
    for i in range(5):
        want = LABELS_U if i % 2 else LABELS_A
        assert _labels(store, f"t{i}", f"openai:{MODEL}") == want
        assert _labels(store, f"t{i}", f"openai:{MODEL}@s2") == want
    # the thread is gone once the run is over
    assert not [t for t in threading.enumerate() if t.name.startswith("ror-judge-reader")]
    store.close()


def test_a_rerun_skips_what_the_blocks_say_is_labelled(tmp_path, reads):
    store = build_store(tmp_path / "s.duckdb", _traces(4))
    with FakeOpenAI() as srv:
        make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(store, ["t0", "t1"])
        sent = len(srv.chat_requests())
        report = make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(store, ["t0", "t1", "t2", "t3"])
        # t0 and t1 (in block 0) are labelled: only t2 and t3 (block 1) are asked, one request each
        assert len(srv.chat_requests()) - sent == 2
    assert report.skipped == len(LABELS_A) + len(LABELS_U)
    assert report.labeled == len(LABELS_A) + len(LABELS_U)
    store.close()


def test_without_a_thread_handle_the_blocks_are_read_on_the_loops_thread(tmp_path, reads, monkeypatch):
    store = build_store(tmp_path / "s.duckdb", _traces(3))

    original = type(store).thread_handle
    asked: list[str] = []

    def refuse_the_reader(self):
        # the reader asks first (when the run starts); the writer thread's handle, asked later, is given
        asked.append("reader" if not asked else "writer")
        if len(asked) == 1:
            raise StoreError("no handle (planted)", code="E211")
        return original(self)

    monkeypatch.setattr(type(store), "thread_handle", refuse_the_reader)
    with FakeOpenAI() as srv:
        report = make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(store, ["t0", "t1", "t2"])
    assert report.labeled == 2 * len(LABELS_A) + len(LABELS_U)
    assert {name for name, _ in reads} == {threading.main_thread().name}
    assert asked == ["reader", "writer"]
    asked.clear()
    prefetch = llm._Prefetch(make_judge(f"openai:{MODEL}", base_url="http://127.0.0.1:9/v1"), store, ["t0"])
    prefetch.start()  # no handle: no thread either
    assert prefetch._executor is None
    prefetch.close()
    store.close()


def test_a_failed_read_is_the_runs_error_and_stops_the_thread(tmp_path, monkeypatch):
    store = build_store(tmp_path / "s.duckdb", _traces(3))

    def broken(self, store, number):
        raise StoreError("the segments table is damaged (planted)", code="E200")

    monkeypatch.setattr(llm._Prefetch, "_read", broken)
    import gc

    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    with FakeOpenAI() as srv:
        with pytest.raises(StoreError, match="damaged"):
            make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(store, ["t0", "t1", "t2"])
        assert srv.chat_requests() == []
    assert not [t for t in threading.enumerate() if t.name.startswith("ror-judge-reader")]
    assert (gc.get_threshold(), gc.get_freeze_count()) == (thresholds, frozen)  # the collector as before
    # nothing was half-written: no label, and the store takes a new run
    assert store.execute("SELECT count(*) FROM labels").fetchone()[0] == 0
    store.close()


def test_segment_rows_are_checked_like_segment_records():
    """Rows the store gives become SegmentRows with Segment's fields and id; a damaged row is refused
    as Segment refuses it (the same rows through pydantic raise too), naming the segment."""
    import pydantic

    from ror_annotate.records import Segment, SegmentRow, segment_rows_checked

    text = "Ünïcode 数学 🎉 ok. Next one."
    rows = [("t", 0, 0, 17, text[0:17], 5), ("t", 1, 18, len(text), text[18:], 2)]
    got = segment_rows_checked(rows)
    assert [tuple(r) for r in got] == rows
    records = [Segment(trace_id=r[0], segment_index=r[1], char_start=r[2], char_end=r[3], text=r[4], n_tokens=r[5]) for r in rows]
    assert [r.segment_id for r in got] == [s.segment_id for s in records] == ["t#0", "t#1"]
    assert all(isinstance(r, SegmentRow) for r in got)
    damaged = [
        ("t", 2, 0, 18, text[0:17], 5),     # span one longer than its text (🎉 is one code point, not two)
        ("t", 2, 5, 5, "", 0),             # empty
        ("", 2, 0, 17, text[0:17], 5),      # no trace id
        ("t", -1, 0, 17, text[0:17], 5),    # negative index
        ("t", 2, 0, 17, text[0:17], -3),    # negative token count
    ]
    for row in damaged:
        with pytest.raises(ValueError, match=r"stored segment t?#-?\d+ is damaged"):
            segment_rows_checked([rows[0], row])
        with pytest.raises(pydantic.ValidationError):
            Segment(trace_id=row[0], segment_index=row[1], char_start=row[2], char_end=row[3], text=row[4], n_tokens=row[5])


def test_prompts_from_segment_rows_equal_prompts_from_records():
    """The judge's trace block and messages are the same strings from SegmentRows as from Segment
    records (whole, and windowed when the context is small)."""
    from ror_annotate.judge.prompt import build_messages, trace_block
    from ror_annotate.records import Trace, segment_rows_checked

    from .judge_fixtures import split_segments

    text = TRACE_U + " " + TRACE_A
    trace = Trace(trace_id="u", text=text, problem="Ünïcode problem?")
    records = split_segments("u", text)
    rows = segment_rows_checked([(s.trace_id, s.segment_index, s.char_start, s.char_end, s.text, s.n_tokens) for s in records])
    judge = make_judge(f"openai:{MODEL}", base_url="http://127.0.0.1:9/v1")
    assert trace_block(trace, rows) == trace_block(trace, records)
    for context in (128_000, 2_200):
        a = build_messages(judge.book, trace, rows, [3, 4], context_tokens=context, max_tokens=200)
        b = build_messages(judge.book, trace, records, [3, 4], context_tokens=context, max_tokens=200)
        assert a == b
    assert build_messages(judge.book, trace, rows, [3, 4], context_tokens=2_200, max_tokens=200)[1] is True  # windowed


def test_a_run_inside_an_open_transaction_is_refused_before_any_request(tmp_path):
    """The run reads and commits through handles of its own threads, which cannot see what an open
    transaction of the caller has not committed (DuckDB's "Table ... does not exist", or a hang in
    round 6): E213 before any request, nothing written; outside the transaction the run works."""
    store = build_store(tmp_path / "s.duckdb", _traces(2))
    store.execute("CREATE TABLE marker (x INTEGER)")  # a first commit of the store
    with FakeOpenAI() as srv:
        judge = make_judge(f"openai:{MODEL}", base_url=srv.base_url)
        with pytest.raises(StoreError) as caught:
            with store.transaction():
                judge.label(store, ["t0", "t1"])
        assert caught.value.code == "E213" and "outside store.transaction()" in str(caught.value)
        with pytest.raises(StoreError) as caught:
            with store.read_snapshot():
                judge.label(store, ["t0", "t1"])
        # E212 where the judge's tables are created first (a write refused inside the snapshot), else E213
        assert caught.value.code in ("E212", "E213")
        assert srv.chat_requests() == []
        assert store.execute("SELECT count(*) FROM labels").fetchone()[0] == 0
        report = judge.label(store, ["t0", "t1"])
    assert report.labeled == len(LABELS_A) + len(LABELS_U)
    assert not store.in_transaction
    store.close()

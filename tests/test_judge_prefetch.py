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

pytestmark = pytest.mark.integration

MODEL = "gpt-4.1-mini"


@pytest.fixture(autouse=True)
def _no_real_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


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
    with FakeOpenAI() as srv:
        with pytest.raises(StoreError, match="damaged"):
            make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(store, ["t0", "t1", "t2"])
        assert srv.chat_requests() == []
    assert not [t for t in threading.enumerate() if t.name.startswith("ror-judge-reader")]
    # nothing was half-written: no label, and the store takes a new run
    assert store.execute("SELECT count(*) FROM labels").fetchone()[0] == 0
    store.close()

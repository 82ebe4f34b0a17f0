"""Faults found by attacking round 7's judge changes (the reader thread, checked segment rows, the
collector's settings) as a user would meet them.

Expected values are worked out by hand from the fixtures (tests/judge_fixtures.py: TRACE_A has 6
sentences, TRACE_U 4), from the error codes documented in ror_annotate/errors.py, and from CPython's
gc state read before the code under test runs."""

from __future__ import annotations

import gc
import threading

import pytest
from typer.testing import CliRunner

from ror_annotate.judge import make_judge

from .judge_fixtures import TRACE_A, TRACE_U, build_store
from .openai_server import FakeOpenAI

pytestmark = pytest.mark.integration

MODEL = "gpt-4.1-mini"


@pytest.fixture(autouse=True)
def _no_real_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def _damaged_store(path):
    """t0 (TRACE_A) intact; t1 (TRACE_U) with its third segment's span one character longer than its text."""
    store = build_store(path, {"t0": ("p", TRACE_A), "t1": ("p", TRACE_U)})
    store.execute("UPDATE segments SET char_end = char_end + 1 WHERE trace_id = 't1' AND segment_index = 2")
    return store


def test_a_damaged_stored_segment_is_a_coded_error_of_the_judge_and_of_ror_label(tmp_path):
    """Before: the reader's ValueError left `ror label --judge openai:...` with exit status 1 and a
    traceback. Now: SegmentationError (E300, exit status 2, errors.py), still a ValueError, naming
    the segment (t1#2) and what to do; nothing is labelled (t0 and t1 share the first block)."""
    from ror_annotate.cli import app
    from ror_annotate.errors import SegmentationError

    store = _damaged_store(tmp_path / "s.duckdb")
    with FakeOpenAI() as srv:
        with pytest.raises(SegmentationError, match=r"t1#2 is damaged") as caught:
            make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(store, ["t0", "t1"])
        assert isinstance(caught.value, ValueError) and caught.value.code == "E300"
        assert store.execute("SELECT count(*) FROM labels").fetchone()[0] == 0
        store.close()
        result = CliRunner().invoke(app, ["label", "--db", str(tmp_path / "s.duckdb"), "--judge", f"openai:{MODEL}",
                                          "--base-url", srv.base_url])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "E300" in result.output and "t1#2" in result.output and "ror segment --force" in result.output
    assert not [t for t in threading.enumerate() if t.name.startswith("ror-judge-reader")]


def test_a_run_leaves_objects_the_program_froze_itself_frozen(tmp_path):
    """A program that froze its own heap (gc.freeze, as before forking workers) and then runs the judge:
    before, the run's exit called gc.unfreeze() and returned the program's frozen objects to
    collection (freeze count 0, its object back among the collected ones); now they stay frozen.
    (The count itself may fall a little: a frozen object freed by its reference count leaves it.)"""
    from ror_annotate.gc_policy import fewer_collections

    def collected(obj: object) -> bool:
        return any(o is obj for o in gc.get_objects())  # frozen objects are in no generation

    store = build_store(tmp_path / "s.duckdb", {"t0": ("p", TRACE_A)})
    mine = [["the program's own"]]
    gc.freeze()
    try:
        assert not collected(mine)
        with FakeOpenAI() as srv:
            report = make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(store, ["t0"])
        assert report.labeled == 6
        assert gc.get_freeze_count() > 0 and not collected(mine)
        with fewer_collections():
            pass
        assert gc.get_freeze_count() > 0 and not collected(mine)
    finally:
        gc.unfreeze()
    assert collected(mine)
    store.close()


def test_two_runs_in_two_threads_keep_the_raised_threshold_until_the_last_one_ends():
    """Block A entered, then block B (another thread), then A left while B still runs: before, A's exit
    put the default threshold back under B's run; now the settings are restored when the last block
    ends, to what they were before the first."""
    from ror_annotate.gc_policy import RUN_THRESHOLD0, fewer_collections

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, tuple[int, int, int]] = {}

    def a() -> None:
        with fewer_collections():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b() -> None:
        a_in.wait(10)
        with fewer_collections():
            b_in.set()
            a_out.wait(10)
            seen["b after a left"] = gc.get_threshold()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["b after a left"] == (max(before[0], RUN_THRESHOLD0), before[1], before[2])
    assert (gc.get_threshold(), gc.get_freeze_count()) == (before, frozen)


def test_a_run_on_a_read_only_store_with_work_to_do_sends_no_request(tmp_path):
    """Before: the run sent requests (paid) and failed when it stored their labels (E203). Now it
    fails with E203 before the first request; a read-only store with nothing left to label still
    runs (t0's 6 segments labelled before: 6 skipped, no request)."""
    from ror_annotate.errors import StoreReadOnlyError
    from ror_annotate.store import Store

    store = build_store(tmp_path / "s.duckdb", {"t0": ("p", TRACE_A), "t1": ("p", TRACE_U)})
    with FakeOpenAI() as srv:
        make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(store, ["t0"])
        store.close()
        sent = len(srv.chat_requests())
        assert sent == 1
        with Store(tmp_path / "s.duckdb", read_only=True) as ro:
            with pytest.raises(StoreReadOnlyError):
                make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(ro, ["t0", "t1"])
            assert len(srv.chat_requests()) == sent
            report = make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(ro, ["t0"])
            assert (report.labeled, report.skipped) == (0, 6)
            assert len(srv.chat_requests()) == sent
    assert not [t for t in threading.enumerate() if t.name.startswith("ror-judge-reader")]

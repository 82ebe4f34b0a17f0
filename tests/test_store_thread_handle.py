"""Store.thread_handle: one dedicated writer thread with its own DuckDB connection on the store's file
(real threads). Expected values are hand-counted rows, journal sequence numbers and thread names."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ror_annotate.errors import StoreError, StoreReadOnlyError
from ror_annotate.journal import CommitJournal
from ror_annotate.records import Trace
from ror_annotate.store import Store


def _in_thread(fn, name: str = "writer"):
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=target, name=name)
    t.start()
    t.join(60)
    assert not t.is_alive()
    return box


def _code(box: dict[str, object]) -> str | None:
    error = box.get("error")
    return getattr(error, "code", None) if isinstance(error, StoreError) else None


def _traces(*ids: str) -> list[Trace]:
    return [Trace(trace_id=t, text=f"{t} one. {t} two.") for t in ids]


def test_a_thread_handle_writes_from_its_thread_and_the_store_reads_it_once_committed(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    store.upsert_traces(_traces("a"))
    handle = store.thread_handle()
    inside, go_on = threading.Event(), threading.Event()

    def write() -> str:
        with handle.transaction():
            handle.upsert_traces(_traces("b", "c"))
            inside.set()
            assert go_on.wait(30)
        return threading.current_thread().name

    writer = threading.Thread(target=lambda: box.update(value=write()), name="writer")
    box: dict[str, object] = {}
    writer.start()
    assert inside.wait(30)
    # the writer's transaction is open: its rows are not visible to the store's own connection yet
    assert sorted(store.trace_ids()) == ["a"]
    go_on.set()
    writer.join(30)
    assert box == {"value": "writer"}
    assert sorted(store.trace_ids()) == ["a", "b", "c"]
    handle.close()
    store.close()
    with Store(tmp_path / "s.duckdb") as again:
        assert sorted(again.trace_ids()) == ["a", "b", "c"]


def test_a_thread_handle_belongs_to_the_first_other_thread_that_uses_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    handle = store.thread_handle()
    with pytest.raises(StoreError) as info:
        handle.trace_ids()  # the store's own thread has the store itself
    assert info.value.code == "E205"
    claimed, done = threading.Event(), threading.Event()
    first: dict[str, object] = {}

    def own() -> None:
        first["value"] = handle.trace_ids()
        claimed.set()
        done.wait(30)  # alive while the second thread tries (a finished thread's id may be reused)

    owner = threading.Thread(target=own, name="first")
    owner.start()
    assert claimed.wait(30) and first == {"value": []}
    assert _code(_in_thread(lambda: handle.trace_ids(), name="second")) == "E205"
    done.set()
    owner.join(30)
    # a handle is made by the store's thread, from the store
    assert _code(_in_thread(lambda: store.thread_handle())) == "E205"
    with pytest.raises(StoreError) as info:
        handle.thread_handle()
    assert info.value.code == "E205"
    handle.close()
    store.close()


def test_a_read_only_or_closed_store_gives_no_writer_handle(tmp_path: Path) -> None:
    Store(tmp_path / "s.duckdb").close()
    with Store(tmp_path / "s.duckdb", read_only=True) as ro, pytest.raises(StoreReadOnlyError):
        ro.thread_handle()
    closed = Store(tmp_path / "s.duckdb")
    closed.close()
    with pytest.raises(StoreError) as info:
        closed.thread_handle()
    assert info.value.code == "E211"


def test_transactions_of_the_store_and_its_handle_take_turns_and_share_one_commit_journal(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    store = Store(db)
    seq0 = CommitJournal(str(db)).read().seq
    handle = store.thread_handle()
    order: list[str] = []
    inside = threading.Event()

    def write() -> None:
        with handle.transaction():
            handle.upsert_traces(_traces("w"))
            handle.journal_note("test", {"from": "writer"})
            inside.set()
            threading.Event().wait(0.3)  # the store's thread asks for its transaction meanwhile
            order.append("writer commits")

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    assert inside.wait(30)
    with store.transaction():  # waits for the writer's transaction: one commit counter, no conflict
        order.append("store begins")
        store.upsert_traces(_traces("s"))
        store.journal_note("test", {"from": "store"})
    writer.join(30)
    assert order == ["writer commits", "store begins"]
    state = CommitJournal(str(db)).read()
    notes = [(r["seq"] - seq0, [n[1]["from"] for n in r["notes"] if n[0] == "test"]) for r in state.records]
    assert [n for n in notes if n[1]] == [(1, ["writer"]), (2, ["store"])]
    assert state.seq == seq0 + 2
    assert store.execute("SELECT seq FROM store_journal").fetchone()[0] == seq0 + 2
    handle.close()
    store.close()


def test_a_thread_handle_neither_drops_the_cache_nor_checkpoints(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    handle = store.thread_handle()
    box = _in_thread(lambda: (handle.release_cache(force=True, keep_bytes=0), handle.checkpoint()))
    assert box == {"value": (0, False)}
    handle.close()
    handle.close()  # closing twice is harmless
    assert store.checkpoint() is True  # the store itself still does
    store.close()


def test_a_read_snapshot_commits_nothing_and_does_not_wait_for_the_writer(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    store = Store(db)
    store.upsert_traces(_traces("a", "b"))
    seq0 = store.execute("SELECT seq FROM store_journal").fetchone()[0]
    handle = store.thread_handle()
    order: list[str] = []
    inside, go_on = threading.Event(), threading.Event()

    def write() -> None:
        with handle.transaction():
            handle.upsert_traces(_traces("c"))
            inside.set()
            go_on.wait(5)  # the store's thread reads meanwhile (a read waiting for this would be 5 s late)
            order.append("writer commits")

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    assert inside.wait(30)
    with store.read_snapshot():
        seen = sorted(r[0] for r in store.execute("SELECT trace_id FROM traces").fetchall())
        order.append("store read")
        with pytest.raises(StoreError, match="read_snapshot") as info:
            with store.transaction():
                pass
        assert info.value.code == "E212"
    go_on.set()
    writer.join(30)
    assert seen == ["a", "b"] and order == ["store read", "writer commits"]
    # the snapshot wrote no commit: only the writer's raised the counter
    assert store.execute("SELECT seq FROM store_journal").fetchone()[0] == seq0 + 1
    assert sorted(store.trace_ids()) == ["a", "b", "c"]
    handle.close()
    store.close()

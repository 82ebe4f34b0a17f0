"""The judge's group commits on a writer thread (persist.CommitThread): the event loop keeps sending
while a group commits, a writer that falls behind holds new requests back, a failed commit surfaces
and loses nothing, the live counts never run ahead of what is committed.

Expected values: hand-known labels of the fixtures (LABELS_A), request counts from the test
server, thread names."""

from __future__ import annotations

import json
import threading
import time

import pytest

from ror_annotate.errors import StoreError
from ror_annotate.judge import llm, make_judge
from ror_annotate.judge.persist import AnswerWriter

from .judge_fixtures import LABELS_A, TRACE_A, build_store
from .openai_server import FakeOpenAI

# no OPENAI_API_KEY / OPENAI_BASE_URL of the machine reaches a test (conftest.no_openai_env)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_openai_env")]

MODEL = "gpt-4.1-mini"


class _Slow(AnswerWriter):
    """A writer whose every group takes ``pause`` seconds more, recording where and around what it ran."""

    pause = 0.0
    log: list[dict]
    max_pending = 0
    fail_first = False
    failed_keys: set[str] = set()
    server: FakeOpenAI | None = None

    def add(self, answer) -> None:
        super().add(answer)
        type(self).max_pending = max(type(self).max_pending, len(self.pending))

    def write_group(self, store, group) -> None:
        seen = len(self.server.chat_requests()) if self.server else 0
        time.sleep(self.pause)
        entry = {"thread": threading.current_thread().name, "n": len(group), "requests_before": seen,
                 "requests_after": len(self.server.chat_requests()) if self.server else 0}
        if type(self).fail_first:
            type(self).fail_first = False
            type(self).failed_keys = {a.cache_row["cache_key"] for a in group if a.cache_row}
            raise StoreError("disk full (planted)")
        super().write_group(store, group)
        self.log.append(entry)


def _judge(srv, *, pause: float, **options):
    judge = make_judge(f"openai:{MODEL}", base_url=srv.base_url, **options)
    log: list[dict] = []

    def writer(store):
        w = _Slow(store, codebook_version=judge.codebook_version, prompt_template_hash=judge.prompt_template_hash, model=MODEL)
        w.pause, w.log, w.server = pause, log, srv
        return w

    judge.writer = writer  # type: ignore[method-assign]
    return judge, log


def _labels(store, tid):
    return store.execute("SELECT segment_index, label FROM labels WHERE trace_id = ? ORDER BY 1", [tid]).fetchall()


def test_requests_go_on_while_a_group_commits_on_the_writer_thread(tmp_path):
    traces = {f"t{i}": (f"Problem {i}.", TRACE_A) for i in range(12)}
    store = build_store(tmp_path / "s.duckdb", traces)
    _Slow.max_pending = 0
    with FakeOpenAI(latency=0.05) as srv:
        judge, log = _judge(srv, pause=1.0, chunk_size=1, concurrency=8)
        report = judge.label(store, list(traces))
    assert report.labeled == 72 and report.requests == 72
    on_thread = [g for g in log if g["thread"] == "ror-judge-writer"]
    assert on_thread, log
    # while the first group slept for a second in its commit, the loop went on sending: with 8 in flight
    # and 50 ms per answer that is about 160 requests; a commit on the loop's thread lets none through
    first = on_thread[0]
    assert first["requests_after"] - first["requests_before"] >= 16, log
    assert sum(g["n"] for g in log) == 72
    for tid in traces:
        assert _labels(store, tid) == list(enumerate(LABELS_A))
    assert store.execute("SELECT count(*) FROM judge_cache").fetchone()[0] == 72


def test_a_writer_that_falls_behind_holds_new_requests_back(tmp_path, monkeypatch):
    monkeypatch.setattr(llm, "MAX_WAITING_ANSWERS", 4)
    traces = {f"t{i}": (f"Problem {i}.", TRACE_A) for i in range(6)}
    store = build_store(tmp_path / "s.duckdb", traces)
    _Slow.max_pending = 0
    with FakeOpenAI(latency=0.02) as srv:
        judge, log = _judge(srv, pause=0.3, chunk_size=1, concurrency=4)
        report = judge.label(store, list(traces))
    assert report.labeled == 36
    # at most the limit plus the answers of the requests already in flight when it was reached;
    # unbounded, 4 connections at 20 ms fill about 60 answers per 0.3 s commit
    assert _Slow.max_pending <= 4 + 4, _Slow.max_pending
    for tid in traces:
        assert _labels(store, tid) == list(enumerate(LABELS_A))


def test_a_failed_commit_on_the_writer_thread_surfaces_and_loses_no_answer(tmp_path):
    traces = {f"t{i}": (f"Problem {i}.", TRACE_A) for i in range(4)}
    store = build_store(tmp_path / "s.duckdb", traces)
    _Slow.fail_first = True
    with FakeOpenAI(latency=0.05) as srv:
        judge, log = _judge(srv, pause=0.0, chunk_size=2, concurrency=4)
        with pytest.raises(StoreError, match="planted"):
            judge.label(store, list(traces))
        sent = len(srv.chat_requests())
        stored = store.execute("SELECT count(*) FROM judge_cache").fetchone()[0]
        # the failed group's answers, and those recorded after, were written by the last flush on the loop's
        # thread; requests still unanswered when the error ended the run are the only ones missing
        keys = {k for (k,) in store.execute("SELECT cache_key FROM judge_cache").fetchall()}
        assert _Slow.failed_keys and _Slow.failed_keys <= keys and stored <= sent
        labels_before = len(store.labels())
        assert labels_before == 2 * stored
        judge, _ = _judge(srv, pause=0.0, chunk_size=2)
        report = judge.label(store, list(traces))
        assert len(srv.chat_requests()) == sent + (12 - stored)  # nothing asked twice
    assert report.labeled == 24 - labels_before
    for tid in traces:
        assert _labels(store, tid) == list(enumerate(LABELS_A))


def test_live_counts_are_stored_after_the_answers_they_count(tmp_path, monkeypatch):
    traces = {f"t{i}": (f"Problem {i}.", TRACE_A) for i in range(8)}
    store = build_store(tmp_path / "s.duckdb", traces)
    run = store.start_run("label", {})
    seen: list[tuple[int, int]] = []
    real = llm._RunContext.advance

    def advance(self, n):  # publish on every answer (else every 20 answers and one second)
        real(self, n)
        self._since_publish, self._published_at = 20, float("-inf")

    monkeypatch.setattr(llm._RunContext, "advance", advance)
    with FakeOpenAI(latency=0.05) as srv:
        judge, log = _judge(srv, pause=0.05, chunk_size=1, concurrency=8)

        def check(store_, group):  # what the runs row says when the writer thread begins a group
            counts = json.loads(store_.execute("SELECT counts FROM runs WHERE run_id = ?", [run.run_id]).fetchone()[0] or "{}")
            cached = store_.execute("SELECT count(*) FROM judge_cache").fetchone()[0]
            seen.append((int(counts.get("requests", 0)), int(cached)))

        original = _Slow.write_group

        def write_group(self, store_, group):
            check(store_, group)
            original(self, store_, group)

        monkeypatch.setattr(_Slow, "write_group", write_group)
        judge.label(store, list(traces), run=run)
    assert len(seen) > 2 and any(r for r, _ in seen)
    assert all(requests <= cached for requests, cached in seen), seen


_CHILD = """
import json, sys, time
from pathlib import Path
from ror_annotate.judge import make_judge
from ror_annotate.judge.persist import AnswerWriter
from ror_annotate.store import Store
marker = Path(sys.argv[3])
real = AnswerWriter.write_group
def slow(self, store, group):
    if group and not marker.exists():  # the first group: announce it, then take a second over it
        marker.write_text(json.dumps([a.cache_row["cache_key"] for a in group if a.cache_row]))
        time.sleep(1.0)
    real(self, store, group)
AnswerWriter.write_group = slow
store = Store(sys.argv[1])
judge = make_judge("openai:gpt-4.1-mini", base_url=sys.argv[2], chunk_size=1, concurrency=4)
try:
    judge.label(store, [f"t{i}" for i in range(8)])
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_sigterm_while_the_writer_thread_commits_drains_the_group(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from ror_annotate.store import Store

    db, marker = tmp_path / "s.duckdb", tmp_path / "group.json"
    build_store(db, {f"t{i}": (f"Problem {i}.", TRACE_A) for i in range(8)}).close()
    with FakeOpenAI(latency=0.05) as srv:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(db), srv.base_url, str(marker)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.01)
        time.sleep(0.05)  # the marker's JSON is written
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0 and out.strip() == "interrupted", err
    group = set(json.loads(marker.read_text()))
    with Store(db) as store:
        stored = {k for (k,) in store.execute("SELECT cache_key FROM judge_cache").fetchall()}
        labels = store.execute("SELECT count(*) FROM labels").fetchone()[0]
    # the group the writer thread held at the signal was committed before the process ended, with its labels
    assert group and group <= stored
    assert labels == len(stored)  # chunk_size 1: one label per stored answer, none half-written

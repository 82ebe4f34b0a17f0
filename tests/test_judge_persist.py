"""The judge's persistence module: no llm <-> batch import cycle, group commits, and what they keep
exactly once; the fast test server of the throughput benchmark answers like the tests' server."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from ror_annotate.judge import make_judge
from ror_annotate.judge import persist
from ror_annotate.judge.persist import Answer, AnswerWriter, ensure_judge_tables
from ror_annotate.records import Label
from ror_annotate.store import Store

from .fast_openai_server import FastOpenAI
from .judge_fixtures import LABELS_A, TRACE_A, build_store
from .openai_server import FakeOpenAI

# no OPENAI_API_KEY / OPENAI_BASE_URL of the machine reaches a test (conftest.no_openai_env)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_openai_env")]

MODEL = "gpt-4.1-mini"
ANN = f"openai:{MODEL}"
JUDGE_DIR = Path(__file__).resolve().parents[1] / "ror_annotate" / "judge"


def _runtime_imports(path: Path) -> set[str]:
    """Modules of the judge package a file imports when it runs (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in skip and node.level == 1:
            out.add(node.module or "")
    return out


def test_llm_and_batch_no_longer_import_each_other():
    assert "llm" not in _runtime_imports(JUDGE_DIR / "batch.py")
    assert not {"llm", "batch"} & _runtime_imports(JUDGE_DIR / "persist.py")
    # one UTC helper: the store's
    assert "naive_utc_now" not in (JUDGE_DIR / "llm.py").read_text() + (JUDGE_DIR / "batch.py").read_text()


def _label(trace_id, index, label):
    return Label(trace_id=trace_id, segment_index=index, label=label, source="judge", annotator=ANN, codebook_version="cb")


def _answer(key, trace_id, labels=(), failures=None):
    row = {"cache_key": key, "params": {"t": 0}, "ids": [0], "attempt": 1, "response": {"id": key}, "input_tokens": 10,
           "cached_input_tokens": 0, "output_tokens": 5, "cost_usd": 0.5, "reasoning": None, "usage_status": "ok"}
    return Answer(trace_id=trace_id, trace_sha256="sha", annotator=ANN, run_id="r1", cache_row=row,
                  labels=[_label(trace_id, i, lab) for i, lab in labels], failures=failures or {}, attempts=2, cause="parse")


def test_writer_commits_a_group_in_one_transaction_and_clears_failures_of_labelled_segments(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("p", TRACE_A)})
    ensure_judge_tables(store)
    w = AnswerWriter(store, codebook_version="cb", prompt_template_hash="tpl", model=MODEL, every_s=60.0)
    w.write(_answer("k1", "a", failures={0: "bad answer", 1: "bad answer"}))
    assert w.commits == 1
    # Other requests in flight and the last commit just now: the next answers wait ...
    w.add(_answer("k2", "a", labels=[(0, "planning")]))
    w.add(_answer("k3", "a", labels=[(2, "reflection")]))
    assert not w.due(idle=False) and w.due(idle=True)
    assert store.execute("SELECT count(*) FROM judge_cache").fetchone()[0] == 1
    # ... and one flush writes both, with their labels, in one transaction.
    assert w.flush() == 2 and w.commits == 2 and not w.pending
    rows = store.execute("SELECT cache_key, annotator, model, prompt_template_hash, input_tokens, cost_usd FROM judge_cache "
                         "ORDER BY cache_key").fetchall()
    assert rows == [(k, ANN, MODEL, "tpl", 10, 0.5) for k in ("k1", "k2", "k3")]
    assert sorted((lab.segment_index, lab.label) for lab in store.labels()) == [(0, "planning"), (2, "reflection")]
    # segment 0 was labelled after failing: its failure row is gone; segment 1's stays
    fails = store.execute("SELECT segment_index, reason, attempts, cause FROM judge_failures").fetchall()
    assert fails == [(1, "bad answer", 2, "parse")]
    assert persist.cached_response(store, "k2") == {"id": "k2"} and persist.cached_response(store, "nope") is None
    assert persist.cached_trace_ids(store, codebook_version="cb", prompt_template_hash="tpl", model=MODEL) == {"a"}
    assert persist.cached_trace_ids(store, codebook_version="cb", prompt_template_hash="other", model=MODEL) == set()


def test_writer_waits_longer_when_a_commit_is_slow():
    w = AnswerWriter.__new__(AnswerWriter)
    w.every_s, w.last_commit_s = 0.2, 0.001
    assert w.gap_s == 0.2
    w.last_commit_s = 0.05  # 9 x 0.05 = 0.45 s between commits: they take about a tenth of the time
    assert w.gap_s == pytest.approx(0.45)
    w.last_commit_s = 5.0
    assert w.gap_s == persist.MAX_COMMIT_GAP_S


def test_a_failed_group_commit_writes_nothing_and_keeps_the_answers(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("p", TRACE_A)})
    ensure_judge_tables(store)
    w = AnswerWriter(store, codebook_version="cb", prompt_template_hash="tpl", model=MODEL)
    w.add(_answer("k1", "a", labels=[(0, "planning")]))
    w.add(_answer("k2", "a", labels=[(99, "planning")]))  # no segment 99: the label write is refused
    with pytest.raises(Exception, match="not in"):
        w.flush()
    assert len(w.pending) == 2
    assert store.execute("SELECT count(*) FROM judge_cache").fetchone()[0] == 0 and not store.labels()


class _Counting(AnswerWriter):
    """Records the size of every committed group (on the loop's thread or the writer thread's)."""

    groups: list[int]

    def committed(self, n: int, seconds: float) -> None:
        super().committed(n, seconds)
        self.groups.append(n)


def _judge_with_counting_writer(base_url, **options):
    judge = make_judge(f"openai:{MODEL}", base_url=base_url, **options)
    groups: list[int] = []

    def writer(store):
        w = _Counting(store, codebook_version=judge.codebook_version, prompt_template_hash=judge.prompt_template_hash, model=MODEL)
        w.groups = groups
        return w

    judge.writer = writer  # type: ignore[method-assign]
    return judge, groups


def test_answers_arriving_together_share_a_commit_and_a_sequential_run_commits_each(tmp_path):
    traces = {f"t{i}": (f"Problem {i}.", TRACE_A) for i in range(8)}
    store = build_store(tmp_path / "s.duckdb", traces)
    with FakeOpenAI(latency=0.1) as srv:
        judge, groups = _judge_with_counting_writer(srv.base_url, chunk_size=1, concurrency=16)
        report = judge.label(store, list(traces))
    assert report.labeled == 48 and report.requests == 48
    assert sum(groups) == 48 and len(groups) < 48 and max(groups) > 1
    for tid in traces:
        got = store.execute("SELECT segment_index, label FROM labels WHERE trace_id = ? ORDER BY 1", [tid]).fetchall()
        assert got == list(enumerate(LABELS_A))
    assert store.execute("SELECT count(*) FROM judge_cache").fetchone()[0] == 48

    store2 = build_store(tmp_path / "s2.duckdb", {"a": ("p", TRACE_A)})
    # 0.3 s per answer: the writer thread has committed one answer before the next arrives
    with FakeOpenAI(latency=0.3) as srv:
        judge, groups = _judge_with_counting_writer(srv.base_url, chunk_size=2, concurrency=1)
        judge.label(store2, ["a"])
    assert groups == [1, 1, 1]  # nothing else in flight: each answer committed as it arrived


def test_a_trace_id_given_twice_is_judged_once(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("p", TRACE_A)})
    with FakeOpenAI() as srv:
        report = make_judge(f"openai:{MODEL}", base_url=srv.base_url, chunk_size=2).label(store, ["a", "a"])
        assert len(srv.chat_requests()) == 3
    assert report.labeled == 6


def test_a_rerun_replays_stored_answers_and_skips_lookups_for_new_traces(tmp_path, monkeypatch):
    store = build_store(tmp_path / "s.duckdb", {"a": ("p", TRACE_A), "b": ("q", TRACE_A)})
    with FakeOpenAI() as srv:
        make_judge(f"openai:{MODEL}", base_url=srv.base_url, chunk_size=2).label(store, ["a"])
        # the labels of "a" are lost, its cached answers are not: a re-run replays them
        store.execute("DELETE FROM labels")
        looked_up: list[str] = []
        real = persist.cached_response

        def spy(st, key):
            looked_up.append(key)
            return real(st, key)

        monkeypatch.setattr("ror_annotate.judge.llm._cached_response", spy)
        before = len(srv.chat_requests())
        report = make_judge(f"openai:{MODEL}", base_url=srv.base_url, chunk_size=2).label(store, ["a", "b"])
        sent = len(srv.chat_requests()) - before
    assert report.cached_responses == 3 and sent == 3  # "a" replayed, "b" asked
    assert len(looked_up) == 3  # only "a" had stored responses when the run began
    assert report.labeled == 12


def test_the_fast_server_answers_like_the_test_server(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("p", TRACE_A), "b": ("q", TRACE_A)})
    with FastOpenAI(latency=0.01) as srv:
        report = make_judge(f"openai:{MODEL}", base_url=srv.base_url, chunk_size=4, concurrency=4).label(store, ["a", "b"])
        stats = srv.stats()
    assert report.labeled == 12 and stats["requests"] == report.requests == 4
    for tid in ("a", "b"):
        got = store.execute("SELECT segment_index, label FROM labels WHERE trace_id = ? ORDER BY 1", [tid]).fetchall()
        assert got == list(enumerate(LABELS_A))
    usage = [json.loads(r[0])["usage"] for r in store.execute("SELECT response FROM judge_cache").fetchall()]
    assert all(u["prompt_tokens"] > 0 and u["completion_tokens"] > 0 for u in usage)


def test_the_client_pool_is_sized_to_the_concurrency():
    from ror_annotate.judge.client import ChatClient, _limits

    limits = _limits(256)
    assert (limits.max_connections, limits.max_keepalive_connections) == (256, 256)
    client = ChatClient("http://127.0.0.1:9/v1", connections=256)
    assert client.openai is not None  # builds with the sized pool


def test_store_labelled_indices_by_trace(tmp_path):
    store: Store = build_store(tmp_path / "s.duckdb", {"a": ("p", TRACE_A), "b": ("q", TRACE_A)})
    store.upsert_labels([_label("a", 0, "planning"), _label("a", 3, "fact"), _label("b", 1, "execution")])
    got = store.labelled_indices_by_trace(["a", "b", "c"], annotator=ANN, codebook_version="cb", source="judge")
    assert got == {"a": {0, 3}, "b": {1}}
    assert store.labelled_indices_by_trace(["a"], annotator="x", codebook_version="cb", source="judge") == {}

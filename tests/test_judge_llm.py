"""The LLM judge against a real local OpenAI-compatible HTTP server, driven by the real openai client."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ror_annotate.codebook import load_codebook
from ror_annotate.errors import ConfigError, JudgeError
from ror_annotate.judge import make_judge
from ror_annotate.judge.llm import JUDGE_MIGRATIONS
from ror_annotate.judge.prompt import marked_trace
from ror_annotate.store import Store

from .judge_fixtures import LABELS_A, LABELS_U, TRACE_A, TRACE_U, build_store, split_segments
from .openai_server import FakeOpenAI, parse_prompt

# no OPENAI_API_KEY / OPENAI_BASE_URL of the machine reaches a test (conftest.no_openai_env)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_openai_env")]

V1_SHA256 = "de0624a56bae30c53b6fa7203ca5d964e4f4d5445a3ba2db5381eb4462c488c7"
MODEL = "gpt-4.1-mini"
ANN = f"openai:{MODEL}"


class Sleeps:
    """Records the waits instead of sleeping them."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def server():
    with FakeOpenAI() as srv:
        yield srv


def judge_for(server, **options):
    options.setdefault("sleep", Sleeps())
    return make_judge(f"openai:{MODEL}", base_url=server.base_url, **options)


def labels_of(store, trace_id, annotator=ANN):
    return [(lab.segment_index, lab.label) for lab in store.labels(trace_id=trace_id, annotator=annotator)]


def failures(store):
    return store.execute("SELECT trace_id, segment_index, annotator, reason, attempts FROM judge_failures ORDER BY 1, 2").fetchall()


def user_prompts(server):
    return [body["messages"][-1]["content"] for body in server.chat_requests()]


# ---------------------------------------------------------------------------------------- happy path
def test_chunked_labels_every_segment_with_provenance(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A), "u": ("Sum 1/2 and 1/3.", TRACE_U)})
    run = store.start_run("label", {})
    report = judge_for(server, chunk_size=4).label(store, ["a", "u"], run=run)
    assert labels_of(store, "a") == list(enumerate(LABELS_A))
    assert labels_of(store, "u") == list(enumerate(LABELS_U))
    # 6 segments in chunks of 4 -> 2 requests; 4 segments -> 1 request
    assert report.requests == len(server.chat_requests()) == 3
    assert (report.labeled, report.failed, report.skipped) == (10, 0, 0)
    lab = store.labels(trace_id="a")[0]
    assert lab.source == "judge" and lab.annotator == ANN and lab.codebook_version == V1_SHA256
    assert lab.run_id == run.run_id and lab.confidence == 0.9 and lab.rationale == "cue word"
    assert set(lab.extra) >= {"prompt_template_hash", "model", "params", "cache_key"}
    assert lab.extra["params"]["temperature"] == 0.0
    # The runs row carries live usage.
    counts = [r for r in store.runs() if r.run_id == run.run_id][0].counts
    assert counts["requests"] == 3 and counts["input_tokens"] == report.input_tokens


def test_prompt_prefix_is_identical_within_a_trace_and_ids_come_last(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    judge_for(server, chunk_size=2, concurrency=4).label(store, ["a"])
    bodies = server.chat_requests()
    assert len(bodies) == 3
    prefixes = {b["messages"][0]["content"] + b["messages"][1]["content"].rsplit("Label exactly", 1)[0] for b in bodies}
    assert len(prefixes) == 1
    assert [parse_prompt(b["messages"])[1] for b in bodies][0] == [0, 1]  # the first chunk goes first, alone
    assert sorted(tuple(parse_prompt(b["messages"])[1]) for b in bodies) == [(0, 1), (2, 3), (4, 5)]
    assert load_codebook().behaviors[3].definition in bodies[0]["messages"][0]["content"]
    rf = bodies[0]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True


def test_per_segment_mode_sends_one_request_per_segment_with_the_whole_trace(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    judge_for(server, mode="per-segment").label(store, ["a"])
    bodies = server.chat_requests()
    assert len(bodies) == len(LABELS_A)
    for body in bodies:
        segs, ids = parse_prompt(body["messages"])
        assert len(ids) == 1 and sorted(segs) == list(range(len(LABELS_A)))
    assert labels_of(store, "a") == list(enumerate(LABELS_A))


def test_rerun_costs_nothing_and_duplicates_nothing(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    judge_for(server).label(store, ["a"])
    n = len(server.chat_requests())
    again = judge_for(server).label(store, ["a"])
    assert len(server.chat_requests()) == n and again.requests == 0
    assert again.skipped == len(LABELS_A) and again.labeled == 0
    assert len(store.labels(trace_id="a")) == len(LABELS_A)


def test_cached_responses_are_replayed_when_labels_are_gone(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    judge_for(server, chunk_size=3).label(store, ["a"])
    store.execute("DELETE FROM labels")
    report = judge_for(server, chunk_size=3).label(store, ["a"])
    assert report.requests == 0 and report.cached_responses == 2
    assert labels_of(store, "a") == list(enumerate(LABELS_A))
    # A different problem text is a different prompt: no cache hit.
    other = build_store(tmp_path / "t.duckdb", {"a": ("Another problem.", TRACE_A)})
    store.close()
    assert judge_for(server, chunk_size=3).label(other, ["a"]).requests == 2


def test_non_ascii_markers_sit_at_code_point_offsets(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"u": ("Σ?", TRACE_U)})
    segments = store.segments("u")
    text = marked_trace(store.get_trace("u"), segments)
    assert text.replace("«0» ", "").replace("«1» ", "").replace("«2» ", "").replace("«3» ", "") == TRACE_U
    judge_for(server).label(store, ["u"])
    segs, _ = parse_prompt(server.chat_requests()[0]["messages"])
    for s in segments:
        assert segs[s.segment_index].startswith(s.text)


# ---------------------------------------------------------------------------------------- faults
@pytest.mark.parametrize(
    ("fault", "reasked"),
    [({"kind": "drop", "n": 1}, [5]), ({"kind": "dup"}, [0]), ({"kind": "bad_label"}, [0])],
)
def test_only_missing_or_invalid_ids_are_asked_again(tmp_path, server, fault, reasked):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    server.push(fault)
    report = judge_for(server, chunk_size=6).label(store, ["a"])
    ids = [parse_prompt(b["messages"])[1] for b in server.chat_requests()]
    assert ids == [[0, 1, 2, 3, 4, 5], reasked]
    assert labels_of(store, "a") == list(enumerate(LABELS_A))
    assert report.failed == 0 and failures(store) == []


def test_refusal_on_every_try_becomes_judge_failed_never_a_label(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    server.push(*[{"kind": "refusal"}] * 3)
    report = judge_for(server, chunk_size=3, max_attempts=3).label(store, ["a"])
    assert labels_of(store, "a") == [(3, "fact"), (4, "restatement"), (5, "conclusion")]
    rows = failures(store)
    assert [(r[1], r[4]) for r in rows] == [(0, 3), (1, 3), (2, 3)]
    assert all("refused" in r[3] and r[2] == ANN for r in rows)
    assert report.failed == 3 and report.labeled == 3
    # A later successful run clears the failures.
    again = judge_for(server, chunk_size=3, max_attempts=4).label(store, ["a"])
    assert again.labeled == 3 and failures(store) == []


def test_500_and_timeouts_are_retried_with_backoff(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    server.push({"kind": "500"}, {"kind": "slow", "seconds": 1.5})
    sleeps = Sleeps()
    judge_for(server, sleep=sleeps, timeout=0.5).label(store, ["a"])
    assert len(server.chat_requests()) == 3
    assert len(sleeps.waits) == 2 and 0.5 <= sleeps.waits[0] <= 1.0 <= sleeps.waits[1] <= 2.0
    assert labels_of(store, "a") == list(enumerate(LABELS_A))


def test_fatal_status_aborts_with_the_api_message(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    server.push({"status": 401, "body": {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}})
    with pytest.raises(JudgeError, match="401: Incorrect API key provided"):
        judge_for(server).label(store, ["a"])
    assert len(server.chat_requests()) == 1


def test_400_after_a_success_fails_only_that_chunk(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    server.push({}, {"status": 400, "body": {"error": {"message": "context length exceeded", "type": "invalid_request_error"}}})
    report = judge_for(server, chunk_size=3, concurrency=1).label(store, ["a"])
    assert len(server.chat_requests()) == 2 and report.failed == 3
    assert all("context length exceeded" in r[3] for r in failures(store))


def test_samples_are_separate_annotators(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    judge_for(server, samples=2, seed=7).label(store, ["a"])
    assert {a for _, a, _ in store.annotators()} == {ANN, f"{ANN}@s2"}
    bodies = server.chat_requests()
    assert sorted(b["seed"] for b in bodies) == [7, 8] and {b["temperature"] for b in bodies} == {1.0}
    assert labels_of(store, "a", f"{ANN}@s2") == list(enumerate(LABELS_A))


def test_usage_and_cost_follow_the_price_file(tmp_path, server):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({MODEL: {"input": 1.0, "cached_input": 0.25, "output": 2.0}}))
    report = judge_for(server, chunk_size=2, prices=str(prices)).label(store, ["a"])
    rows = store.execute("SELECT input_tokens, cached_input_tokens, output_tokens FROM judge_cache").fetchall()
    assert report.input_tokens == sum(r[0] for r in rows) and report.output_tokens == sum(r[2] for r in rows)
    assert report.cached_input_tokens == sum(r[1] for r in rows) > 0  # later chunks reuse the cached prefix
    expected = sum((r[0] - r[1]) * 1.0 + r[1] * 0.25 + r[2] * 2.0 for r in rows) / 1e6
    assert report.cost_usd == pytest.approx(expected)
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"{MODEL}: {{input: -1, cached_input: 0, output: 0}}\n")
    with pytest.raises(ConfigError, match=f"model '{MODEL}'"):
        judge_for(server, prices=str(bad))


def test_long_trace_is_windowed_around_the_chunk(tmp_path, server):
    long_text = " ".join(f"Step {i}: 12 * {i} = {12 * i}." for i in range(400))
    store = build_store(tmp_path / "s.duckdb", {"L": ("Multiply.", long_text)})
    n = len(store.segments("L"))
    report = judge_for(server, chunk_size=50, context_tokens=8000).label(store, ["L"])
    assert len(store.labels(trace_id="L")) == n and report.extra["windowed_requests"] == math.ceil(n / 50)
    middle = [b for b in server.chat_requests() if parse_prompt(b["messages"])[1][0] == 200][0]
    segs, ids = parse_prompt(middle["messages"])
    assert set(ids) <= set(segs) and "omitted ...]" in middle["messages"][1]["content"]
    assert min(segs) > 0 and max(segs) < n - 1


def test_api_key_from_environment_only_and_never_stored(tmp_path, server, monkeypatch):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    judge_for(server).label(store, ["a"])
    assert server.requests[0]["api_key"] == "sk-no-key-required"  # local URL, no key set
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-123")
    store.execute("DELETE FROM labels")
    store.execute("DELETE FROM judge_cache")
    judge_for(server).label(store, ["a"], run=store.start_run("label", {"judge": ANN}))
    assert server.requests[-1]["api_key"] == "sk-test-secret-123"
    store.execute("CHECKPOINT")
    assert b"sk-test-secret-123" not in Path(store.path).read_bytes()
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        make_judge(f"openai:{MODEL}", base_url="https://api.example.org/v1")


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="needs a model"):
        make_judge("openai")
    with pytest.raises(ConfigError, match="--mode"):
        make_judge("openai:m", base_url="http://127.0.0.1:1/v1", mode="fast")
    with pytest.raises(ConfigError, match="--chunk-size"):
        make_judge("openai:m", base_url="http://127.0.0.1:1/v1", chunk_size=0)


# ---------------------------------------------------------------------------------------- batch
def test_batch_mode_uploads_polls_and_ingests(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A), "u": ("Sum.", TRACE_U)})
    sleeps = Sleeps()
    with FakeOpenAI(batch_polls=2) as srv:
        srv_paths = lambda: [(r["method"], r["path"].split("/")[2]) for r in srv.requests]  # noqa: E731
        report = judge_for(srv, batch=True, chunk_size=4, sleep=sleeps).label(store, ["a", "u"])
        assert srv_paths()[:3] == [("POST", "files"), ("POST", "batches"), ("GET", "batches")]
        assert srv.chat_requests() == []  # everything went through the batch
    assert sleeps.waits == [30.0, 30.0]
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and labels_of(store, "u") == list(enumerate(LABELS_U))
    assert report.labeled == 10 and report.extra["batch_labeled"] == 10 and report.requests == 3
    assert store.execute("SELECT status, ingested_at IS NOT NULL FROM judge_batches").fetchall() == [("completed", True)]


class _Interrupted(Exception):
    pass


def test_batch_resumes_by_id_without_resubmitting(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})

    async def interrupt(seconds: float) -> None:
        raise _Interrupted

    with FakeOpenAI(batch_polls=1) as srv:
        with pytest.raises(_Interrupted):
            judge_for(srv, batch=True, sleep=interrupt).label(store, ["a"])
        (batch_id,) = store.execute("SELECT batch_id FROM judge_batches").fetchone()
        assert store.labels() == []
        report = judge_for(srv, batch_id=batch_id).label(store, ["a"])
        uploads = [r for r in srv.requests if r["path"] == "/v1/files"]
        assert len(uploads) == 1 and report.extra["batches"] == {batch_id: "completed"}
        with pytest.raises(ConfigError, match="not recorded"):
            judge_for(srv, batch_id="batch-unknown").label(store, ["a"])
    assert labels_of(store, "a") == list(enumerate(LABELS_A))


# ---------------------------------------------------------------------------------------- kill -9
_CHILD = """
import sys
from ror_annotate.store import Store
from ror_annotate.judge import make_judge
store = Store(sys.argv[1])
judge = make_judge("openai:gpt-4.1-mini", base_url=sys.argv[2], chunk_size=2, concurrency=2)
judge.label(store, [f"t{i}" for i in range(4)], run=store.start_run("label", {}))
"""


def _request_keys(bodies):
    out = []
    for body in bodies:
        problem = body["messages"][-1]["content"].split("<problem>\n", 1)[1].split("\n</problem>", 1)[0]
        out.append((problem, tuple(parse_prompt(body["messages"])[1])))
    return out


def test_kill_9_mid_run_loses_nothing_and_pays_nothing_twice(tmp_path):
    db = tmp_path / "s.duckdb"
    traces = {f"t{i}": (f"Problem {i}.", TRACE_A) for i in range(4)}
    build_store(db, traces).close()
    with FakeOpenAI(latency=0.15) as srv:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        env.pop("OPENAI_API_KEY", None)
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(db), srv.base_url], env=env)
        deadline = time.monotonic() + 60
        # 7 requests: 3 rounds of answers, so the writer thread (which commits while requests go on) has committed some
        while len(srv.chat_requests()) < 7 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL
        before = len(srv.chat_requests())
        store = Store(db)
        store.migrate("judge", JUDGE_MIGRATIONS)
        done = {(f"Problem {t[1:]}.", tuple(json.loads(ids)))
                for t, ids in store.execute("SELECT trace_id, segment_ids FROM judge_cache").fetchall()}
        n_before = len(store.labels())
        assert 0 < len(done) < 12 and n_before == 2 * len(done)
        report = make_judge(f"openai:{MODEL}", base_url=srv.base_url, chunk_size=2).label(store, list(traces))
        resent = _request_keys(srv.chat_requests()[before:])
    assert not done & set(resent), "a completed request was sent again"
    assert report.labeled == 24 - n_before and report.skipped == n_before
    rows = store.execute("SELECT trace_id, segment_index, count(*) FROM labels GROUP BY 1, 2").fetchall()
    assert len(rows) == 24 and {r[2] for r in rows} == {1}
    for tid in traces:
        assert labels_of(store, tid) == list(enumerate(LABELS_A))


def test_segments_helper_matches_text():
    for s in split_segments("x", TRACE_U):
        assert TRACE_U[s.char_start : s.char_end] == s.text

"""The LLM judge against endpoints that behave like real ones (issue 13), driven by the real openai client.

1. reasoning models (think blocks, code fences, reasoning_content); 2. re-runs retry judge-failed
segments; 3. exit status when nothing (or too little) was labelled; 4. Batch API batches that end
expired/cancelled/failed, split batches, kill -9 while polling; 5. a trace longer than the model's
context fails alone, in either order; client timeouts are local and retried.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ror_annotate import errors
from ror_annotate.errors import ConfigError, JudgeError, JudgeOutcomeError
from ror_annotate.judge import JudgeReport, MaxFailed, check_label_outcome, make_judge
from ror_annotate.judge.batch import split_batches
from ror_annotate.judge.client import ResponseParseError, completion_from_dict, parse_answer
from ror_annotate.judge.llm import JUDGE_MIGRATIONS, LLMJudge
from ror_annotate.store import Store

from .judge_fixtures import LABELS_A, LABELS_U, TRACE_A, TRACE_U, Sleeps, build_store
from .openai_server import RETRY_MARK, THINK, FakeOpenAI, parse_prompt

# no OPENAI_API_KEY / OPENAI_BASE_URL of the machine reaches a test (conftest.no_openai_env)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_openai_env")]

MODEL = "gpt-4.1-mini"
ANN = f"openai:{MODEL}"
LONG = " ".join(f"Step {i}: 12 * {i} = {12 * i}." for i in range(700))  # 700 segments, ~9,000 tokens marked
CONTEXT = 8000  # the fake model's context: the short traces fit, LONG does not


def judge_for(server, **options):
    sleep = options.pop("sleep", None) or Sleeps()
    return make_judge(f"openai:{MODEL}", base_url=server.base_url, sleep=sleep, **options)


def labels_of(store, trace_id, annotator=ANN):
    return [(lab.segment_index, lab.label) for lab in store.labels(trace_id=trace_id, annotator=annotator)]


def failures(store):
    return store.execute("SELECT trace_id, segment_index, reason, attempts FROM judge_failures ORDER BY 1, 2").fetchall()


def asked_ids(server):
    return [parse_prompt(b["messages"])[1] for b in server.chat_requests()]


# ---------------------------------------------------------------------------------------- 1. reasoning models
@pytest.mark.parametrize(("style", "reasoning"), [("think", THINK), ("think_open", THINK), ("fence", None),
                                                  ("reasoning_content", THINK)])
def test_reasoning_model_answers_parse_with_one_request_per_chunk(tmp_path, style, reasoning):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    with FakeOpenAI(style=style) as srv:
        report = judge_for(srv, chunk_size=2).label(store, ["a"])
        assert len(srv.chat_requests()) == 3  # 6 segments, chunks of 2: one request each, no retry
    assert labels_of(store, "a") == list(enumerate(LABELS_A))
    assert (report.labeled, report.failed, report.requests) == (6, 0, 3)
    assert sum(report.extra["retries"].values()) == 0
    stored = [r[0] for r in store.execute("SELECT reasoning FROM judge_cache").fetchall()]
    assert stored == [reasoning] * 3


def test_unparseable_answer_is_retried_with_a_changed_request_and_counted_by_cause(tmp_path):
    # A temperature-0 model that wraps its JSON in prose until told otherwise: an identical retry
    # would get the identical unusable answer.
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    with FakeOpenAI(style="prose_unless_told") as srv:
        report = judge_for(srv, chunk_size=6).label(store, ["a"])
        first, second = srv.chat_requests()
    assert first["messages"] != second["messages"] and RETRY_MARK not in first["messages"][1]["content"]
    assert RETRY_MARK in second["messages"][1]["content"] and "not a JSON object" in second["messages"][1]["content"]
    # The retry keeps the shared prefix (codebook + trace), so the provider's prompt cache applies.
    assert second["messages"][1]["content"].startswith(first["messages"][1]["content"])
    assert labels_of(store, "a") == list(enumerate(LABELS_A))
    assert report.extra["retries"] == {"transport": 0, "truncated": 0, "parse": 1, "refusal": 0, "invalid_ids": 0}


def test_invalid_ids_and_transport_retries_are_counted_apart(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    with FakeOpenAI() as srv:
        srv.push({"kind": "500"}, {"kind": "drop", "n": 2}, {"kind": "truncate"})
        report = judge_for(srv, chunk_size=6).label(store, ["a"])
        assert asked_ids(srv) == [[0, 1, 2, 3, 4, 5]] * 2 + [[4, 5]] * 2
    assert report.extra["retries"] == {"transport": 1, "truncated": 1, "parse": 0, "refusal": 0, "invalid_ids": 1}
    assert labels_of(store, "a") == list(enumerate(LABELS_A))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('<think>\n\\frac{1}{2} is {x}</think>\n{"labels": []}', {"labels": []}),
        ('hmm {a} and </think> again\n</think>```json\n{"labels": [1]}\n```', {"labels": [1]}),
        ('{"labels": [], "note": "</think>"}', {"labels": [], "note": "</think>"}),
        ('```\n{"labels": []}\n```', {"labels": []}),
        ('<|begin_of_thought|>x<|end_of_thought|>\n\n{"labels": []}', {"labels": []}),
    ],
)
def test_parse_answer_accepts_think_blocks_and_one_fence(content, expected):
    body = {"choices": [{"finish_reason": "stop", "message": {"content": content}}]}
    assert parse_answer(completion_from_dict(body)) == expected


@pytest.mark.parametrize("content", ["<think>never closed {", "<think>x</think>", "```python\n{}\n```", "Sure: {\"labels\": []}"])
def test_parse_answer_refuses_what_is_not_one_json_object(content):
    body = {"choices": [{"finish_reason": "stop", "message": {"content": content}}]}
    with pytest.raises(ResponseParseError):
        parse_answer(completion_from_dict(body))


# ---------------------------------------------------------------------------------------- 2. re-runs retry failures
def test_rerun_retries_failed_segments_from_the_stored_attempt_count(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    with FakeOpenAI(style="prose") as srv:
        first = judge_for(srv, chunk_size=3, max_attempts=2).label(store, ["a"])
        assert len(srv.chat_requests()) == 4  # 2 chunks x 2 paid attempts
        assert (first.labeled, first.failed) == (0, 6) and {r[3] for r in failures(store)} == {2}
        assert {r[0] for r in store.execute("SELECT cause FROM judge_failures").fetchall()} == {"parse"}
        srv.style = None  # the endpoint is fixed
        second = judge_for(srv, chunk_size=3, max_attempts=2).label(store, ["a"])
        assert len(srv.chat_requests()) == 6  # new requests, not the cached failures replayed
        # ... and they are the requests the first run would have sent next: with the retry instruction.
        assert all(RETRY_MARK in b["messages"][1]["content"] for b in srv.chat_requests()[4:])
    assert second.cached_responses == 0 and (second.labeled, second.failed) == (6, 0)
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and failures(store) == []
    assert {lab.extra["attempt"] for lab in store.labels(trace_id="a")} == {3}


def test_rerun_after_a_still_failing_judge_pays_new_attempts_only(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    with FakeOpenAI(style="prose") as srv:
        judge_for(srv, chunk_size=6, max_attempts=2).label(store, ["a"])
        again = judge_for(srv, chunk_size=6, max_attempts=2).label(store, ["a"])
        assert len(srv.chat_requests()) == 4
    assert again.requests == 2 and again.cached_responses == 0 and again.failed == 6
    assert {r[3] for r in failures(store)} == {4}
    keys = store.execute("SELECT attempt FROM judge_cache ORDER BY attempt").fetchall()
    assert [k[0] for k in keys] == [1, 2, 3, 4]


def test_rerun_after_a_cut_off_answer_asks_with_the_doubled_output_limit(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    with FakeOpenAI() as srv:
        srv.push({"kind": "truncate"})
        judge_for(srv, chunk_size=6, max_attempts=1).label(store, ["a"])
        assert store.execute("SELECT DISTINCT cause, attempts FROM judge_failures").fetchall() == [("truncated", 1)]
        judge_for(srv, chunk_size=6, max_attempts=1).label(store, ["a"])
        first, second = srv.chat_requests()
    assert first["max_tokens"] == 96 + 64 * 6 and second["max_tokens"] == 2 * first["max_tokens"]
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and failures(store) == []


def test_no_retry_failed_leaves_failures_alone(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    with FakeOpenAI(style="prose") as srv:
        judge_for(srv, chunk_size=6, max_attempts=1).label(store, ["a"])
        srv.style = None
        kept = judge_for(srv, chunk_size=6, retry_failed=False).label(store, ["a"])
        assert len(srv.chat_requests()) == 1
    assert kept.requests == 0 and kept.extra["failed_kept"] == 6
    with pytest.raises(JudgeOutcomeError, match="none of the 6 segments"):
        check_label_outcome(kept)


# ---------------------------------------------------------------------------------------- 3. exit status
def test_max_failed_parses_fractions_percentages_and_counts():
    assert MaxFailed.parse("10%") == MaxFailed(fraction=0.1) == MaxFailed.parse("0.1") == MaxFailed.parse(0.1)
    assert MaxFailed.parse("25") == MaxFailed(count=25) == MaxFailed.parse(25)
    assert MaxFailed.parse("0") == MaxFailed(count=0)
    for bad in ("-1", "1.5", "150%", "ten", -2):
        with pytest.raises(ConfigError, match="--max-failed"):
            MaxFailed.parse(bad)


@pytest.mark.parametrize(
    ("labeled", "skipped", "failed", "max_failed", "raises"),
    [
        (0, 0, 5, "100%", "none of the 5"),  # nothing labelled fails whatever --max-failed says
        (90, 0, 10, "10%", None),  # 10 of 100 = 10%: allowed
        (89, 0, 11, "10%", "11 of 100"),  # 11%: too many
        (0, 95, 5, "5", None),  # labelled before counts as labelled
        (0, 95, 5, "4", "5 of 100"),
        (10, 0, 0, "0", None),
        (0, 0, 0, "0", None),  # nothing to do is not a failure
    ],
)
def test_check_label_outcome(labeled, skipped, failed, max_failed, raises):
    report = JudgeReport(labeled=labeled, skipped=skipped, failed=failed)
    if raises is None:
        check_label_outcome(report, max_failed=max_failed)
        check_label_outcome(report.as_counts(), max_failed=max_failed)
    else:
        with pytest.raises(JudgeOutcomeError, match=raises) as info:
            check_label_outcome(report, max_failed=max_failed)
        assert info.value.code == "E506" and info.value.exit_status == 3


def _app():
    from ror_annotate.cli import app

    return app


def _input_file(tmp_path: Path, n: int = 2) -> Path:
    rows = [{"trace_id": f"t{i}", "problem": f"Add {i}.", "trace": TRACE_A} for i in range(n)]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_ror_label_exits_3_when_the_judge_labels_nothing(tmp_path):
    db = tmp_path / "s.duckdb"
    build_store(db, {"a": ("Add.", TRACE_A)}).close()
    with FakeOpenAI(style="prose") as srv:
        result = CliRunner().invoke(_app(), ["label", "--judge", "openai:m", "--base-url", srv.base_url, "--db", str(db),
                                             "--max-attempts", "1"])
    assert result.exit_code == 3, result.output
    assert "error [E506]: the judge labelled none of the 6 segments" in " ".join(result.stderr.split())
    with Store(db) as store:
        assert [r.status for r in store.runs()] == ["failed"]
        assert store.runs()[0].counts["failed"] == 6


def test_ror_run_with_a_dead_judge_exports_nothing_and_exits_3(tmp_path):
    db, out = tmp_path / "s.duckdb", tmp_path / "export"
    with FakeOpenAI(style="prose") as srv:
        result = CliRunner().invoke(_app(), ["run", str(_input_file(tmp_path)), "--judge", "openai:m", "--base-url", srv.base_url,
                                             "--db", str(db), "--out", str(out), "--max-attempts", "1"])
    assert result.exit_code == 3, result.output
    assert "[E506]" in result.stderr and not out.exists()
    with Store(db) as store:
        assert [r.status for r in store.runs()] == ["failed"]
        assert store.runs()[0].counts["label"]["failed"] == 2 * len(LABELS_A)


def test_pipeline_run_raises_before_exporting_and_label_records_a_failed_run(tmp_path):
    from ror_annotate import pipeline

    with FakeOpenAI(style="prose") as srv, Store(tmp_path / "s.duckdb") as store:
        judge = judge_for(srv, max_attempts=1)
        with pytest.raises(JudgeOutcomeError) as info:
            pipeline.run(store, _input_file(tmp_path), judge=judge, out=tmp_path / "export")
        assert info.value.counts["failed"] == 2 * len(LABELS_A) and not (tmp_path / "export").exists()
        with pytest.raises(JudgeOutcomeError):
            pipeline.label(store, judge=judge)
        # max_failed=None: the caller decides (nothing raised, the failures are in the summary)
        summary = pipeline.label(store, judge=judge, max_failed=None)
        assert summary.failed == 2 * len(LABELS_A) and summary.labeled == 0
        assert [r.status for r in store.runs()] == ["failed", "failed", "ok"]


def test_max_failed_decides_the_exit_status_of_a_partly_failed_run(tmp_path):
    db = tmp_path / "s.duckdb"
    build_store(db, {"a": ("Add.", TRACE_A), "L": ("Multiply.", LONG)}).close()
    with FakeOpenAI(context_limit=CONTEXT) as srv:
        args = ["label", "--judge", "openai:m", "--base-url", srv.base_url, "--db", str(db)]
        strict = CliRunner().invoke(_app(), [*args, "--max-failed", "0"])
        assert strict.exit_code == 3, strict.output
        lenient = CliRunner().invoke(_app(), [*args, "--max-failed", "100%"])
        assert lenient.exit_code == 0, lenient.output
        assert "judge-failed" in lenient.stderr and "again" in lenient.stderr
        bad = CliRunner().invoke(_app(), [*args, "--max-failed", "lots"])
        assert bad.exit_code == 2 and "[E110]" in bad.stderr


def test_baseline_refuses_llm_options(tmp_path):
    with pytest.raises(ConfigError, match="--judge baseline takes no judge options, got --base-url, --chunk-size"):
        make_judge("baseline", chunk_size=3, base_url="http://127.0.0.1:1/v1")
    result = CliRunner().invoke(_app(), ["label", "--judge", "baseline", "--chunk-size", "3", "--db", str(tmp_path / "x.duckdb")])
    assert result.exit_code == 2 and "[E110]" in result.stderr


def test_unknown_llm_option_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match="unknown option.*'chunksize' \\(did you mean 'chunk_size'\\?\\)"):
        LLMJudge("m", base_url="http://127.0.0.1:1/v1", chunksize=3)
    with pytest.raises(ConfigError, match="--batch-requeue must be"):
        LLMJudge("m", base_url="http://127.0.0.1:1/v1", batch_requeue="later")


def test_judge_errors_live_in_errors_and_stay_importable_from_client():
    from ror_annotate.judge import client

    for name, code in [("RetriesExhaustedError", "E501"), ("RequestRejectedError", "E502"), ("TruncatedOutputError", "E503"),
                       ("ResponseParseError", "E504"), ("RefusalError", "E505")]:
        assert getattr(client, name) is getattr(errors, name) and getattr(errors, name).code == code
        assert issubclass(getattr(errors, name), JudgeError)


# ---------------------------------------------------------------------------------------- 4. batch terminal states
TRACES_3 = {"a": ("Add 17 and 25.", TRACE_A), "u": ("Sum.", TRACE_U)}  # chunk_size 4: 2 + 1 requests


def _batch_rows(store):
    return store.execute("SELECT batch_id, status, ingested_at IS NOT NULL, outcome FROM judge_batches ORDER BY created_at, batch_id").fetchall()


@pytest.mark.parametrize(("end", "code"), [("expired", "batch_expired"), ("cancelled", "batch_cancelled"), ("failed", "server_error")])
def test_dead_batch_keeps_its_answers_and_finishes_the_rest_interactively(tmp_path, end, code):
    store = build_store(tmp_path / "s.duckdb", TRACES_3)
    with FakeOpenAI(batch_outcomes=[{"status": end, "answered": 1}]) as srv:
        report = judge_for(srv, batch=True, chunk_size=4).label(store, ["a", "u"])
        assert len(srv.chat_requests()) == 2  # only the two requests the batch left unanswered
        (row,) = _batch_rows(store)
        assert row[1:3] == (end, True) and json.loads(row[3])["errors"] == {code: 2}
        assert report.extra["batch_errors"] == {code: 2} and report.extra["batches"] == {row[0]: end}
        assert report.extra["batch_labeled"] == 4 and report.labeled == 10
        # The dead batch is closed: a re-run neither polls it nor sends anything.
        polls = len([r for r in srv.requests if r["method"] == "GET"])
        again = judge_for(srv, batch=True, chunk_size=4).label(store, ["a", "u"])
        assert len([r for r in srv.requests if r["method"] == "GET"]) == polls and again.requests == 0
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and labels_of(store, "u") == list(enumerate(LABELS_U))


def test_dead_batch_requeued_into_a_new_batch(tmp_path):
    store = build_store(tmp_path / "s.duckdb", TRACES_3)
    with FakeOpenAI(batch_outcomes=[{"status": "expired", "answered": 2}]) as srv:
        report = judge_for(srv, batch=True, chunk_size=4, batch_requeue="batch").label(store, ["a", "u"])
        assert srv.chat_requests() == []
        second = [json.loads(line) for line in srv.files["file-" + str(_second_input(srv))]["content"].decode().splitlines()]
    assert len(second) == 1 and report.extra["batch_requeued"] == 1
    assert [r[1] for r in _batch_rows(store)] == ["expired", "completed"]
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and labels_of(store, "u") == list(enumerate(LABELS_U))


def _second_input(srv) -> int:
    inputs = sorted(int(b["input_file_id"].split("-")[1]) for b in srv.batches.values())
    return inputs[1]


def test_batch_failed_at_validation_is_closed_and_done_interactively(tmp_path):
    store = build_store(tmp_path / "s.duckdb", TRACES_3)
    with FakeOpenAI(batch_outcomes=[{"status": "failed", "validation": "model not available for batch"}]) as srv:
        report = judge_for(srv, batch=True, chunk_size=4).label(store, ["a", "u"])
        assert len(srv.chat_requests()) == 3
    (row,) = _batch_rows(store)
    assert row[1:3] == ("failed", True) and "model not available for batch" in json.loads(row[3])["messages"][0]
    assert report.labeled == 10 and report.extra["batch_labeled"] == 0


def test_large_jobs_are_split_and_the_poll_interval_is_an_option(tmp_path):
    store = build_store(tmp_path / "s.duckdb", TRACES_3)
    sleeps = Sleeps()
    with FakeOpenAI(batch_polls=1) as srv:
        report = judge_for(srv, batch=True, chunk_size=4, batch_max_requests=2, batch_poll_s=5, sleep=sleeps).label(store, ["a", "u"])
        sizes = sorted(len(srv.files[b["input_file_id"]]["content"].splitlines()) for b in srv.batches.values())
    assert sizes == [1, 2] and sleeps.waits == [5.0] and report.labeled == 10 and report.requests == 3


def test_split_batches_respects_count_and_bytes():
    lines = [b"x" * 10, b"y" * 10, b"z" * 25, b"w" * 5]
    assert split_batches(lines, max_requests=3, max_bytes=30) == [[0, 1], [2, 3]]
    assert split_batches(lines, max_requests=1, max_bytes=100) == [[0], [1], [2], [3]]
    with pytest.raises(JudgeError, match="over the 20-byte"):
        split_batches(lines, max_requests=9, max_bytes=20)


_BATCH_CHILD = """
import sys
from ror_annotate.store import Store
from ror_annotate.judge import make_judge
store = Store(sys.argv[1])
judge = make_judge("openai:gpt-4.1-mini", base_url=sys.argv[2], chunk_size=4, batch=True, batch_max_requests=1, batch_poll_s=0.05)
judge.label(store, ["a", "u"], run=store.start_run("label", {}))
"""


def test_kill_9_while_polling_resumes_the_same_batches_and_pays_once(tmp_path):
    db = tmp_path / "s.duckdb"
    build_store(db, TRACES_3).close()
    with FakeOpenAI(batch_polls=10**9) as srv:  # the batches never finish while the child polls
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        child = subprocess.Popen([sys.executable, "-c", _BATCH_CHILD, str(db), srv.base_url], env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None and (
                len(srv.batches) < 3 or min(b["_polls"] for b in srv.batches.values()) < 2):
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL and len(srv.batches) == 3
        srv.batch_polls = 0  # now they finish
        store = Store(db)
        store.migrate("judge", JUDGE_MIGRATIONS)
        report = make_judge(f"openai:{MODEL}", base_url=srv.base_url, chunk_size=4, batch=True, sleep=Sleeps()).label(store, ["a", "u"])
        uploads = [r for r in srv.requests if r["path"] == "/v1/files"]
        assert len(uploads) == 3 and len(srv.batches) == 3 and srv.chat_requests() == []
    assert set(report.extra["batches"]) == set(srv.batches) and report.requests == 3
    assert store.execute("SELECT count(*), sum(input_tokens) > 0 FROM judge_cache").fetchone() == (3, True)
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and labels_of(store, "u") == list(enumerate(LABELS_U))


# ---------------------------------------------------------------------------------------- 5. context length, timeouts
@pytest.mark.parametrize("context_style", ["openai", "vllm"])
@pytest.mark.parametrize("order", [["L", "a", "u"], ["a", "u", "L"]])
def test_trace_longer_than_the_context_fails_alone_in_any_order(tmp_path, order, context_style):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A), "u": ("Sum.", TRACE_U), "L": ("Multiply.", LONG)})
    n_long = len(store.segments("L"))
    with FakeOpenAI(context_limit=CONTEXT, context_style=context_style) as srv:
        report = judge_for(srv, chunk_size=50, concurrency=1).label(store, order)
        long_requests = [b for b in srv.chat_requests() if "Multiply." in b["messages"][1]["content"]]
    assert len(long_requests) == 1  # its other chunks are not sent: they would be just as long
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and labels_of(store, "u") == list(enumerate(LABELS_U))
    rows = [r for r in failures(store) if r[0] == "L"]
    assert len(rows) == n_long == report.failed and len(failures(store)) == n_long
    assert all(f"maximum context length is {CONTEXT} tokens" in r[2] and "--context-tokens" in r[2] for r in rows)


def test_context_tokens_windows_the_long_trace_instead(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A), "L": ("Multiply.", LONG)})
    with FakeOpenAI(context_limit=CONTEXT) as srv:
        report = judge_for(srv, chunk_size=50, context_tokens=CONTEXT).label(store, ["L", "a"])
    assert report.failed == 0 and report.labeled == len(store.segments("L")) + len(LABELS_A)
    assert report.extra["windowed_requests"] > 0


def test_other_rejections_are_fatal_even_after_a_success(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    with FakeOpenAI() as srv:
        srv.push({}, {"status": 400, "body": {"error": {"message": "Invalid schema for response_format 'LabelBatch'",
                                                      "type": "invalid_request_error", "code": "invalid_json_schema"}}})
        with pytest.raises(JudgeError, match="Invalid schema"):
            judge_for(srv, chunk_size=3, concurrency=1).label(store, ["a"])


def test_client_timeouts_are_retried_and_fail_only_their_request(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": ("Add 17 and 25.", TRACE_A)})
    with FakeOpenAI() as srv:
        # The run's very first request times out on both tries: local to that request, not "cannot reach".
        srv.push({"kind": "slow", "seconds": 0.8}, {"kind": "slow", "seconds": 0.8})
        report = judge_for(srv, chunk_size=3, max_attempts=2, timeout=0.3).label(store, ["a"])
    assert report.extra["retries"]["transport"] == 1 and report.failed == 3
    assert [r[1] for r in failures(store)] == [0, 1, 2] and all("APITimeoutError" in r[2] for r in failures(store))
    assert labels_of(store, "a") == list(enumerate(LABELS_A))[3:]


def test_batch_the_provider_no_longer_knows_is_closed_and_its_requests_requeued(tmp_path):
    store = build_store(tmp_path / "s.duckdb", TRACES_3)

    async def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    with FakeOpenAI(batch_polls=5) as first:
        with pytest.raises(KeyboardInterrupt):
            judge_for(first, batch=True, chunk_size=4, sleep=interrupt).label(store, ["a", "u"])
    with FakeOpenAI() as other:  # e.g. another --base-url or account: it answers 404 for that batch
        report = judge_for(other, batch=True, chunk_size=4).label(store, ["a", "u"])
        assert len(other.chat_requests()) == 3 and other.batches == {}
    (row,) = _batch_rows(store)
    assert row[1:3] == ("missing", True) and report.extra["batches"] == {row[0]: "missing"}
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and labels_of(store, "u") == list(enumerate(LABELS_U))

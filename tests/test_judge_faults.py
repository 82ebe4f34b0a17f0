"""The LLM judge against faulty endpoints, an honest cost ledger, and secrets (issue 27, sections
"The judge and its endpoints" and "Secrets"), driven by the real ``openai`` client against the
local fake server (tests/openai_server.py) with its fault-injecting modes.

Expected values come from the faults themselves (which request fails how) and from hand
calculation (token sums and prices); none from the code under test.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ror_annotate.errors import JudgeError
from ror_annotate.judge import make_judge
from ror_annotate.judge.pricing import Price, cost_usd
from ror_annotate.store import ProgressFile, Store

from .judge_fixtures import LABELS_A, LABELS_U, TRACE_A, TRACE_U, Sleeps, build_store
from .openai_server import THINK, FakeOpenAI

# no OPENAI_API_KEY / OPENAI_BASE_URL of the machine reaches a test (conftest.no_openai_env)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_openai_env")]

MODEL = "gpt-4.1-mini"
ANN = f"openai:{MODEL}"
ROOT = Path(__file__).resolve().parents[1]
ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]
TRACES = {"a": ("Add 17 and 25.", TRACE_A), "u": ("Sum.", TRACE_U)}


def judge_for(server, **options):
    sleep = options.pop("sleep", None) or Sleeps()
    return make_judge(f"openai:{MODEL}", base_url=server.base_url, sleep=sleep, **options)


def labels_of(store, trace_id, annotator=ANN):
    return [(lab.segment_index, lab.label) for lab in store.labels(trace_id=trace_id, annotator=annotator)]


def failures(store):
    return store.execute("SELECT trace_id, segment_index, reason, cause FROM judge_failures ORDER BY 1, 2").fetchall()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return {**env, "PYTHONPATH": str(ROOT), "ROR_PROGRESS_INTERVAL": "0", "COLUMNS": "200", **extra}


# ---------------------------------------------------------------------------------------- answer shapes
def test_content_as_typed_parts_gives_the_answer_and_the_reasoning(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": TRACES["a"]})
    with FakeOpenAI(style="parts") as srv:
        report = judge_for(srv, chunk_size=3).label(store, ["a"])
        assert len(srv.chat_requests()) == 2  # no retry: the first answer of each chunk is read
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and report.failed == 0
    assert [r[0] for r in store.execute("SELECT reasoning FROM judge_cache").fetchall()] == [THINK, THINK]


def test_structured_answer_sent_as_a_tool_call_is_read(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": TRACES["a"]})
    with FakeOpenAI(style="tool_call") as srv:
        report = judge_for(srv, chunk_size=6).label(store, ["a"])
        assert len(srv.chat_requests()) == 1
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and report.failed == 0


# ---------------------------------------------------------------------------------------- HTTP 200 that is no completion
GATEWAY_502 = {"status": 200, "body": {"error": {"code": 502, "message": "Upstream provider returned 502: model overloaded at upstream-7",
                                                 "metadata": {"provider_name": "upstream-7"}}}}
GATEWAY_429 = {"status": 200, "body": {"error": {"code": 429, "message": "Provider rate limit hit, try again in 2s"}}}
HTML = {"status": 200, "raw": "<!DOCTYPE html><html><head><title>Guest Wi-Fi login</title></head><body>Sign in</body></html>"}
NOT_JSON = {"status": 200, "raw": '{"id": "chatcmpl-1", "choices": [{"message": {"content": "{\\"lab', "content_type": "application/json"}


@pytest.mark.parametrize("fault", [GATEWAY_502, GATEWAY_429, HTML, NOT_JSON], ids=["502-in-200", "429-in-200", "html", "cut-json"])
def test_a_200_that_is_no_completion_is_retried_like_a_transient_status(tmp_path, fault):
    store = build_store(tmp_path / "s.duckdb", {"a": TRACES["a"]})
    sleeps = Sleeps()
    with FakeOpenAI() as srv:
        srv.push(fault)
        report = judge_for(srv, chunk_size=6, sleep=sleeps).label(store, ["a"])
        assert len(srv.chat_requests()) == 2
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and report.failed == 0
    assert report.extra["retries"]["transport"] == 1
    # the 429's "try again in 2s" is honoured; the others back off
    assert sleeps.waits == [2.0] if fault is GATEWAY_429 else len(sleeps.waits) == 1


@pytest.mark.parametrize(("fault", "shown"), [(GATEWAY_502, "model overloaded at upstream-7"), (HTML, "Guest Wi-Fi login")],
                         ids=["502-in-200", "html"])
def test_a_200_that_stays_no_completion_fails_only_its_request_with_the_providers_text(tmp_path, fault, shown):
    store = build_store(tmp_path / "s.duckdb", {"a": TRACES["a"]})
    with FakeOpenAI() as srv:
        srv.push({}, fault, fault)  # the first chunk is answered; the second gets the fault on both of its tries
        report = judge_for(srv, chunk_size=3, max_attempts=2, concurrency=1).label(store, ["a"])
    assert labels_of(store, "a") == list(enumerate(LABELS_A))[:3]
    rows = failures(store)
    assert [r[1] for r in rows] == [3, 4, 5] and report.failed == 3
    assert all(shown in r[2] and r[3] == "transport" for r in rows)


def test_an_embedded_rejection_is_fatal_like_its_status(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": TRACES["a"]})
    with FakeOpenAI() as srv:
        srv.push({"status": 200, "body": {"error": {"code": 401, "message": "No auth credentials found for this gateway"}}})
        with pytest.raises(JudgeError, match="No auth credentials found"):
            judge_for(srv, chunk_size=6).label(store, ["a"])
        assert len(srv.chat_requests()) == 1  # not retried


def test_html_answers_through_the_cli_end_in_one_coded_line_not_a_traceback(tmp_path):
    db = tmp_path / "s.duckdb"
    build_store(db, {"a": TRACES["a"]}).close()
    with FakeOpenAI() as srv:
        srv.push(*[HTML] * 8)
        done = subprocess.run([*ROR, "label", "--judge", ANN, "--base-url", srv.base_url, "--max-attempts", "2", "--chunk-size", "3",
                               "--concurrency", "1", "--db", str(db)], capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and "error [E506]" in done.stderr and "HTML page" in done.stderr


# ---------------------------------------------------------------------------------------- connection resets
def test_a_reset_connection_is_retried(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": TRACES["a"]})
    with FakeOpenAI() as srv:
        srv.push({"kind": "reset"})
        report = judge_for(srv, chunk_size=6).label(store, ["a"])
        assert len(srv.chat_requests()) == 2
    assert labels_of(store, "a") == list(enumerate(LABELS_A)) and report.extra["retries"]["transport"] == 1


def test_resets_on_some_requests_fail_only_those_requests(tmp_path):
    store = build_store(tmp_path / "s.duckdb", TRACES)
    with FakeOpenAI() as srv:
        # chunks of 3: a[0:3], a[3:6], u[0:3], u[3:4]; the second request sent is reset on both of its tries
        srv.push({}, {"kind": "reset"}, {"kind": "reset"})
        report = judge_for(srv, chunk_size=3, max_attempts=2, concurrency=1).label(store, ["a", "u"])
        assert len(srv.chat_requests()) == 4 + 1  # one retry of the reset request; no run-wide stop
    rows = failures(store)
    assert len(rows) == 3 and len({r[0] for r in rows}) == 1 and all(r[3] == "transport" for r in rows)
    assert report.failed == 3 and report.labeled == 7
    failed = {(r[0], r[1]) for r in rows}
    for tid, expected in (("a", LABELS_A), ("u", LABELS_U)):
        assert labels_of(store, tid) == [(i, lab) for i, lab in enumerate(expected) if (tid, i) not in failed]


def test_an_endpoint_that_resets_every_request_still_stops_the_run(tmp_path):
    store = build_store(tmp_path / "s.duckdb", TRACES)
    with FakeOpenAI() as srv:
        srv.push(*[{"kind": "reset"}] * 50)
        with pytest.raises(JudgeError, match="cannot reach"):
            judge_for(srv, chunk_size=3, max_attempts=2, concurrency=1).label(store, ["a", "u"])
    assert failures(store) == []


def test_an_endpoint_that_goes_down_mid_run_stops_it(tmp_path):
    # Answers once, then resets everything: a few requests fail locally, then the run stops.
    store = build_store(tmp_path / "s.duckdb", {f"t{i}": ("Add.", TRACE_A) for i in range(12)})
    with FakeOpenAI() as srv:
        srv.push({}, *[{"kind": "reset"}] * 500)
        with pytest.raises(JudgeError, match="stopped answering"):
            judge_for(srv, chunk_size=6, max_attempts=2, concurrency=2).label(store, sorted(f"t{i}" for i in range(12)))
        assert len(srv.chat_requests()) < 2 * 12  # it did not try every remaining trace


# ---------------------------------------------------------------------------------------- the cost ledger
@pytest.mark.parametrize(("usage", "expected"), [
    # OpenAI: prompt_tokens include the cached ones
    ({"prompt_tokens": 1000, "completion_tokens": 50, "prompt_tokens_details": {"cached_tokens": 768}}, (1000, 768, 50, "ok")),
    # DeepSeek: prompt_tokens = hit + miss
    ({"prompt_tokens": 1200, "completion_tokens": 40, "prompt_cache_hit_tokens": 1024, "prompt_cache_miss_tokens": 176},
     (1200, 1024, 40, "ok")),
    # Anthropic-style: input_tokens exclude cache reads and writes -> 100 + 900 + 50
    ({"input_tokens": 100, "output_tokens": 30, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 50}, (1050, 900, 30, "ok")),
    # LiteLLM relaying Anthropic in OpenAI shape: prompt_tokens already total
    ({"prompt_tokens": 1000, "completion_tokens": 30, "cache_read_input_tokens": 900}, (1000, 900, 30, "ok")),
    # Moonshot/Kimi: top-level cached_tokens
    ({"prompt_tokens": 500, "completion_tokens": 20, "cached_tokens": 256}, (500, 256, 20, "ok")),
    # Responses API naming
    ({"input_tokens": 700, "output_tokens": 9, "input_tokens_details": {"cached_tokens": 512}}, (700, 512, 9, "ok")),
])
def test_read_usage_maps_the_providers_cache_fields(usage, expected):
    from ror_annotate.judge.client import read_usage

    assert read_usage(usage) == expected


@pytest.mark.parametrize("usage", [None, {}, {"prompt_tokens": 10}])
def test_read_usage_missing_is_unknown(usage):
    from ror_annotate.judge.client import read_usage

    assert read_usage(usage)[3] == "missing"


@pytest.mark.parametrize("usage", [{"prompt_tokens": -5, "completion_tokens": 3}, {"prompt_tokens": "many", "completion_tokens": 3},
                                   {"prompt_tokens": 10, "completion_tokens": 3.5}, {"prompt_tokens": 10, "completion_tokens": True},
                                   {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 11}}])
def test_read_usage_refuses_negative_or_non_numeric_counts(usage):
    from ror_annotate.judge.client import read_usage

    assert read_usage(usage)[:3] == (0, 0, 0) and read_usage(usage)[3].startswith("invalid: ")


def test_a_deepseek_cache_hit_is_billed_at_the_cached_price(tmp_path):
    store = build_store(tmp_path / "s.duckdb", {"a": TRACES["a"]})
    usage = {"prompt_tokens": 2000, "completion_tokens": 100, "prompt_cache_hit_tokens": 1536, "prompt_cache_miss_tokens": 464}
    with FakeOpenAI() as srv:
        srv.push({"usage": usage})
        report = judge_for(srv, chunk_size=6).label(store, ["a"])
    # gpt-4.1-mini list price per 1M: 0.40 input, 0.10 cached, 1.60 output -> by hand:
    expected = (464 * 0.40 + 1536 * 0.10 + 100 * 1.60) / 1e6
    assert report.cached_input_tokens == 1536 and report.cost_usd == pytest.approx(expected)
    assert cost_usd(Price(input=0.40, cached_input=0.10, output=1.60), input_tokens=2000, cached_input_tokens=1536,
                    output_tokens=100) == pytest.approx(expected)


@pytest.mark.parametrize("usage", [None, {"prompt_tokens": -7, "completion_tokens": "x"}], ids=["missing", "invalid"])
def test_unknown_usage_is_recorded_as_unknown_never_as_zero(tmp_path, usage):
    store = build_store(tmp_path / "s.duckdb", {"a": TRACES["a"]})
    with FakeOpenAI() as srv:
        srv.push({"usage": usage}, {})
        run = store.start_run("label", {})
        report = judge_for(srv, chunk_size=3, concurrency=1).label(store, ["a"], run=run)
    assert report.requests == 2 and report.extra["usage_unknown_requests"] == 1
    rows = store.execute("SELECT input_tokens, output_tokens, cost_usd, usage_status FROM judge_cache ORDER BY created_at").fetchall()
    unknown = [r for r in rows if r[0] is None]
    assert len(unknown) == 1 and unknown[0][1] is None and unknown[0][2] is None
    assert unknown[0][3] == ("missing" if usage is None else "invalid: prompt_tokens=-7 is negative")
    known = [r for r in rows if r[0] is not None]
    assert report.input_tokens == known[0][0] > 0  # the known request only
    counts = {r.run_id: r.counts for r in store.runs()}[run.run_id]
    assert counts["usage_unknown_requests"] == 1


def test_the_cli_warns_that_the_cost_is_a_lower_bound(tmp_path):
    from ror_annotate.cli import app

    db = tmp_path / "s.duckdb"
    build_store(db, {"a": TRACES["a"]}).close()
    with FakeOpenAI() as srv:
        srv.push({"usage": None})
        result = CliRunner().invoke(app, ["label", "--judge", ANN, "--base-url", srv.base_url, "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "usage_unknown_requests=1" in result.output and "lower bound" in result.output


_KILL_CHILD = """
import sys
from ror_annotate.store import Store
from ror_annotate.judge import make_judge
store = Store(sys.argv[1])
judge = make_judge("openai:gpt-4.1-mini", base_url=sys.argv[2], chunk_size=1, concurrency=1)
with store.run("label", {}) as run:
    judge.label(store, ["a", "u"], run=run)
"""


def test_a_run_killed_with_sigkill_gets_its_ledger_back_from_the_stored_responses(tmp_path):
    from ror_annotate.judge.llm import reconcile_run_ledger

    db = tmp_path / "s.duckdb"
    build_store(db, TRACES).close()
    with FakeOpenAI(latency=0.05) as srv:
        child = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(db), srv.base_url], env=_env())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(srv.chat_requests()) < 6:
            time.sleep(0.01)
        time.sleep(0.03)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    store = Store(db)
    (killed,) = [r for r in store.runs() if r.command == "label"]
    assert killed.status == "running" and killed.counts.get("requests", 0) < 6  # published every 20 updates only
    reconcile_run_ledger(store)
    (run,) = [r for r in store.runs() if r.command == "label"]
    n, tokens_in, tokens_out = store.execute(
        "SELECT count(*), sum(input_tokens), sum(output_tokens) FROM judge_cache WHERE run_id = ?", [run.run_id]).fetchone()
    assert n >= 5
    assert (run.counts["requests"], run.counts["input_tokens"], run.counts["output_tokens"]) == (n, tokens_in, tokens_out)
    assert run.counts["ledger"] == "from judge_cache"


def test_every_finished_run_records_the_ledger_of_its_stored_responses(tmp_path):
    store = build_store(tmp_path / "s.duckdb", TRACES)
    with FakeOpenAI() as srv:
        with store.run("label", {}) as run:
            report = judge_for(srv, chunk_size=2).label(store, ["a", "u"], run=run)
    counts = {r.run_id: r.counts for r in store.runs()}[run.run_id]
    n, cost = store.execute("SELECT count(*), sum(cost_usd) FROM judge_cache").fetchone()
    assert counts["requests"] == n == report.requests == 5 and counts["cost_usd"] == pytest.approx(cost)


# ---------------------------------------------------------------------------------------- SIGTERM, --timeout, rationale cap
def test_sigterm_during_an_llm_judge_run_prints_one_line_and_exits_130(tmp_path):
    db = tmp_path / "s.duckdb"
    build_store(db, {f"t{i}": ("Add.", TRACE_A) for i in range(20)}).close()
    with FakeOpenAI(latency=0.3) as srv:
        proc = subprocess.Popen([*ROR, "label", "--judge", ANN, "--base-url", srv.base_url, "--chunk-size", "2", "--concurrency", "4",
                                 "--db", str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(srv.chat_requests()) < 12:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "never retrieved" not in err
    lines = [line for line in err.splitlines() if line.strip() and "━" not in line]  # not the transient progress bar
    assert len(lines) == 1 and lines[0].startswith("interrupted:")
    with Store(db) as store:
        (run,) = [r for r in store.runs() if r.command == "label"]
        n = store.execute("SELECT count(*) FROM judge_cache").fetchone()[0]
    assert run.status == "interrupted" and run.counts["requests"] == n > 0
    assert run.counts["requests_abandoned"] >= 1  # sent, unanswered at the interrupt: usage unknown


def test_timeout_option_sets_the_client_timeout(tmp_path):
    db = tmp_path / "s.duckdb"
    build_store(db, {"a": TRACES["a"]}).close()
    with FakeOpenAI() as srv:
        srv.push({"kind": "slow", "seconds": 1.5}, {"kind": "slow", "seconds": 1.5})
        result = CliRunner().invoke(__import__("ror_annotate.cli", fromlist=["app"]).app,
                                    ["label", "--judge", ANN, "--base-url", srv.base_url, "--timeout", "0.3", "--max-attempts", "2",
                                     "--chunk-size", "3", "--concurrency", "1", "--max-failed", "3", "--db", str(db)])
    assert result.exit_code == 0, result.output
    with Store(db) as store:
        rows = failures(store)
        params = [r.parameters for r in store.runs() if r.command == "label"][0]
    assert [r[1] for r in rows] == [0, 1, 2] and all("APITimeoutError" in r[2] for r in rows)
    assert params["timeout"] == 0.3


def test_timeout_option_refuses_non_positive_values(tmp_path):
    result = CliRunner().invoke(__import__("ror_annotate.cli", fromlist=["app"]).app,
                                ["label", "--judge", ANN, "--base-url", "http://127.0.0.1:9/v1", "--timeout", "0",
                                 "--db", str(tmp_path / "s.duckdb")])
    assert result.exit_code == 2 and "--timeout" in result.output


def test_rationales_are_capped_and_the_cut_is_marked(tmp_path):
    from ror_annotate.judge.llm import MAX_RATIONALE_CHARS

    store = build_store(tmp_path / "s.duckdb", {"a": TRACES["a"]})
    long = "because " * 12_500  # 100,000 characters
    with FakeOpenAI() as srv:
        srv.push({"rationale": long})
        judge_for(srv, chunk_size=6).label(store, ["a"])
    rationales = [lab.rationale for lab in store.labels(trace_id="a", annotator=ANN)]
    assert MAX_RATIONALE_CHARS == 2000
    assert all(len(r) <= 2000 and r.startswith("because because") and r.endswith("[rationale cut: 100000 characters]")
               for r in rationales)


# ---------------------------------------------------------------------------------------- secrets
KEY = "sk-" + "proj-TOPSECRET0123456789"  # planted test key, built at run time so no secret-looking literal is committed
USER, PASSWORD = "alice", "pw-S3cr3t!x"


def _secret_forms() -> list[str]:
    return [KEY, PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()]


def test_scrub_text_removes_keys_url_credentials_and_their_encodings(monkeypatch):
    from ror_annotate.provenance import register_url_secrets, scrub_text

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    monkeypatch.setenv("LABEL_STUDIO_URL", "http://admin:ls-Pa55word@review.lab:8089")
    register_url_secrets(f"http://{USER}:{PASSWORD}@127.0.0.1:8000/v1")
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    text = (f"401: bad header Authorization: Bearer {KEY}; proxy saw Basic {basic}; url http://{USER}:{PASSWORD}@127.0.0.1:8000/v1; "
            "hub token hf_abcdefghijklmnop; server said ls-Pa55word; Basic arithmetic and Bearer tokens stay")
    clean = scrub_text(text)
    assert all(s not in clean for s in [*_secret_forms(), "hf_abcdefghijklmnop", "ls-Pa55word"])
    assert "Basic arithmetic and Bearer tokens stay" in clean and "127.0.0.1:8000/v1" in clean


@pytest.mark.parametrize("url_credentials", [False, True], ids=["bearer-key", "basic-url-credentials"])
def test_an_endpoint_echoing_the_authorization_header_leaks_no_secret(tmp_path, url_credentials):
    db = tmp_path / "s.duckdb"
    build_store(db, {"a": TRACES["a"]}).close()
    echo = {"status": 500, "echo_auth": True, "body": {"error": {"message": "upstream refused the request", "type": "server_error"}}}
    with FakeOpenAI() as srv:
        srv.push(*[echo] * 20)
        host = srv.base_url.split("//", 1)[1]
        base_url = f"http://{USER}:{PASSWORD}@{host}" if url_credentials else srv.base_url
        done = subprocess.run([*ROR, "label", "--judge", ANN, "--base-url", base_url, "--max-attempts", "2",
                               "--chunk-size", "3", "--concurrency", "1", "--db", str(db)],
                              capture_output=True, text=True, env=_env(OPENAI_API_KEY=KEY), timeout=120)
        sent = [r["api_key"] for r in srv.requests if r["path"] == "/v1/chat/completions"]
    # what reached the endpoint (and was echoed): the key, or (httpx) the URL's user:password as Basic auth
    assert sent and all(k == (f"Basic {_secret_forms()[2]}" if url_credentials else KEY) for k in sent)
    assert done.returncode == 3 and "error [E506]" in done.stderr and "upstream refused the request" in done.stderr
    with Store(db) as store:
        reasons = " ".join(r[2] for r in failures(store))
        counts = json.dumps([r.counts for r in store.runs()])
        params = json.dumps([r.parameters for r in store.runs()])
    progress = json.dumps(ProgressFile.read(db))
    assert f"Authorization: {'Basic' if url_credentials else 'Bearer'} ***" in reasons
    for where in (done.stdout, done.stderr, reasons, counts, params, progress):
        assert all(s not in where for s in _secret_forms())


def test_label_studio_url_password_is_not_printed_in_the_unreachable_line(monkeypatch):
    pytest.importorskip("label_studio_sdk")
    from ror_annotate.errors import ReviewError
    from ror_annotate.review.labelstudio import LabelStudioClient, public_url

    monkeypatch.setenv("LABEL_STUDIO_URL", f"http://{USER}:{PASSWORD}@127.0.0.1:9")
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "0123456789abcdef0123456789")
    monkeypatch.delenv("LABEL_STUDIO_PUBLIC_URL", raising=False)
    client = LabelStudioClient(timeout=5)
    with pytest.raises(ReviewError) as info:
        client.whoami()
    assert info.value.code == "E600" and "not reachable" in info.value.message and "127.0.0.1:9" in info.value.message
    assert PASSWORD not in info.value.message
    assert public_url() == "http://127.0.0.1:9"  # links handed to people carry no credentials


def test_every_printed_error_line_is_scrubbed(monkeypatch, capsys):
    from ror_annotate.cli.app import print_error
    from ror_annotate.errors import ReviewError

    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "ls-token-0123456789")
    print_error(ReviewError(f"Label Studio at http://{USER}:{PASSWORD}@host:8089 refused ls-token-0123456789"))
    err = capsys.readouterr().err
    assert "error [E600]" in err and PASSWORD not in err and "ls-token-0123456789" not in err and "host:8089" in err


# ---------------------------------------------------------------------------------------- unit: shapes and classification
@pytest.mark.parametrize(("body", "status", "text"), [
    ({"error": {"code": 502, "message": "Bad gateway upstream"}}, 502, "Bad gateway upstream"),
    ({"error": {"code": "502", "message": "x"}}, 502, "x"),
    ({"error": {"code": "rate_limit_exceeded", "message": "slow down"}}, 429, "slow down"),
    ({"error": {"type": "invalid_request_error", "message": "bad schema"}}, 400, "bad schema"),
    ({"object": "error", "message": "This model's maximum context length is 8 tokens", "code": 400}, 400, "maximum context"),
    ({"error": {"code": 503, "message": "busy", "metadata": {"raw": "upstream said: overloaded"}}}, 503, "upstream said: overloaded"),
    ({"error": "plain string error"}, 502, "plain string error"),
    ({"id": "x", "object": "chat.completion"}, 502, "no choices"),
])
def test_a_body_without_choices_is_classified_by_its_embedded_code(body, status, text):
    from ror_annotate.errors import ResponseBodyError
    from ror_annotate.judge.client import completion_from_dict

    with pytest.raises(ResponseBodyError) as info:
        completion_from_dict(body)
    assert info.value.status == status and text in info.value.message and info.value.code == "E507"


@pytest.mark.parametrize(("message", "content", "reasoning", "refusal"), [
    ({"content": [{"type": "thinking", "thinking": "R1"}, {"type": "text", "text": '{"labels": []}'}]}, '{"labels": []}', "R1", None),
    ({"content": [{"type": "text", "text": '{"lab'}, {"type": "text", "text": 'els": []}'}]}, '{"labels": []}', None, None),
    ({"content": [{"type": "refusal", "refusal": "no"}]}, None, None, "no"),
    ({"content": {"labels": []}}, '{"labels": []}', None, None),
    ({"content": None, "function_call": {"name": "f", "arguments": '{"labels": []}'}}, '{"labels": []}', None, None),
    ({"content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"labels": []}}}]},
     '{"labels": []}', None, None),
])
def test_message_shapes_give_answer_reasoning_and_refusal(message, content, reasoning, refusal):
    from ror_annotate.judge.client import completion_from_dict

    c = completion_from_dict({"choices": [{"message": message, "finish_reason": "stop"}]})
    assert (c.content, c.reasoning, c.refusal) == (content, reasoning, refusal)

"""shared/pitfalls LLM-01, LLM-02, LLM-04 kept as tests, plus unit tests of the retry and option helpers.

The LLM-01/LLM-04 responses are replayed byte for byte by the local server. Their labels
("compute", "verify") belong to another codebook; where a case expects them to be *accepted*, they
are mapped onto ours (compute -> execution, verify -> reflection) before replaying.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from pathlib import Path
from typing import Literal, Optional

import pytest
from pydantic import BaseModel, Field

from ror_annotate.errors import ConfigError, JudgeError
from ror_annotate.judge import make_judge
from ror_annotate.judge.client import (
    ChatClient,
    ResponseParseError,
    RetriesExhaustedError,
    TruncatedOutputError,
    backoff_seconds,
    completion_from_dict,
    parse_answer,
    retry_after_seconds,
)
from ror_annotate.judge.schema import LabelBatch, strict_json_schema

from .conftest import load_pitfall
from .judge_fixtures import Sleeps, build_store
from .openai_server import FakeOpenAI

TWO = "17 + 25 = 42. Wait, is that right?"  # segments 0 and 1
OURS = {"compute": "execution", "verify": "reflection"}


@pytest.fixture(autouse=True)
def _no_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def _ours(response: dict) -> dict:
    out = copy.deepcopy(response)
    msg = out["body"]["choices"][0]["message"]
    data = json.loads(msg["content"])
    for item in data["labels"]:
        item["label"] = OURS[item["label"]]
    msg["content"] = json.dumps(data)
    return out


def _run(tmp_path: Path, replies: list[dict], **options):
    store = build_store(tmp_path / "s.duckdb", {"p": ("Add.", TWO)})
    sleeps = Sleeps()
    with FakeOpenAI() as srv:
        srv.push(*replies)
        judge = make_judge("openai:m", base_url=srv.base_url, sleep=sleeps, **options)
        try:
            report = judge.label(store, ["p"])
            error = None
        except JudgeError as exc:
            report, error = None, exc
        bodies = srv.chat_requests()
    labels = [(lab.segment_index, lab.label) for lab in store.labels()]
    fails = store.execute("SELECT segment_index, reason FROM judge_failures ORDER BY 1").fetchall() if report else []
    return report, error, bodies, labels, fails, sleeps.waits


# ---------------------------------------------------------------------------------------- LLM-01
def test_llm01_truncated_mid_string_is_a_truncation_error_and_retry_raises_max_tokens(tmp_path):
    case = load_pitfall("LLM-01")["input"]["subcases"]["truncated_mid_string"]
    body = case[0]["body"]
    with pytest.raises(TruncatedOutputError) as info:
        parse_answer(completion_from_dict(body))
    assert not isinstance(info.value, ResponseParseError)
    report, _, bodies, labels, fails, _ = _run(tmp_path, case)
    assert len(bodies) == 2 and bodies[1]["max_tokens"] == 2 * bodies[0]["max_tokens"]  # never an identical retry
    assert labels == [(0, "execution"), (1, "reflection")]  # from the retry, nothing from the cut answer
    # With a single attempt nothing is stored as a label; both segments are judge-failed as truncated.
    report, _, bodies, labels, fails, _ = _run(tmp_path / "one", case, max_attempts=1)
    assert labels == [] and [f[0] for f in fails] == [0, 1] and all("finish_reason=length" in f[1] for f in fails)


def test_llm01_truncated_but_parseable_is_still_truncated(tmp_path):
    case = load_pitfall("LLM-01")["input"]["subcases"]["truncated_but_parseable"]
    with pytest.raises(TruncatedOutputError):
        parse_answer(completion_from_dict(case[0]["body"]))
    report, _, bodies, labels, fails, _ = _run(tmp_path, case * 2, max_attempts=2)
    assert len(bodies) == 2 and labels == [] and report.failed == 2
    assert all("finish_reason=length" in f[1] for f in fails)


def test_llm01_invalid_then_valid(tmp_path):
    case = load_pitfall("LLM-01")
    replies = case["input"]["subcases"]["invalid_then_valid"]
    with pytest.raises(ResponseParseError):
        parse_answer(completion_from_dict(replies[0]["body"]))
    report, _, bodies, labels, _, _ = _run(tmp_path, [replies[0], _ours(replies[1])])
    expected = case["expected"]["invalid_then_valid"]
    assert len(bodies) == expected["calls"]
    assert labels == [(i, OURS[lab]) for i, lab in expected["labels"]]


# ---------------------------------------------------------------------------------------- LLM-02
def _pitfall_models() -> dict:
    namespace: dict = {"BaseModel": BaseModel, "Field": Field, "Literal": Literal, "Optional": Optional}
    source = load_pitfall("LLM-02")["input"]["model_source"]
    # dont_inherit: this module's `from __future__ import annotations` would leave the models undefined
    exec(compile(source, "LLM-02", "exec", dont_inherit=True), namespace)  # noqa: S102 - fixed test input
    return namespace


def _walk(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


@pytest.mark.parametrize("which", ["pitfall", "ours"])
def test_llm02_strict_schema_has_no_forbidden_keywords(which):
    model = _pitfall_models()["Batch"] if which == "pitfall" else LabelBatch
    schema = strict_json_schema(model)
    for node in _walk(schema):
        assert "default" not in node and "examples" not in node
        if node.get("type") == "object":
            assert node["additionalProperties"] is False
            assert sorted(node["required"]) == sorted(node["properties"])
    if which == "pitfall":
        seg = schema["$defs"]["SegLabel"]
        assert seg["required"] == load_pitfall("LLM-02")["expected"]["Batch"]["SegLabel.required"]
        assert seg["properties"]["note"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
        assert seg["properties"]["label"]["type"] == "string"
        assert seg["properties"]["label"]["enum"] == ["compute", "verify", "backtrack", "conclude"]


def test_llm02_dict_field_is_refused_at_build_time():
    with pytest.raises(ConfigError, match="per_label.*list of \\{key, value\\}"):
        strict_json_schema(_pitfall_models()["WithDict"])


# ---------------------------------------------------------------------------------------- LLM-04
def test_llm04_retry_after_header_is_honoured(tmp_path):
    case = load_pitfall("LLM-04")
    replies = case["input"]["subcases"]["retry_after_header"]
    expected = case["expected"]["retry_after_header"]
    _, _, bodies, labels, _, waits = _run(tmp_path, [replies[0], _ours(replies[1])])
    assert len(bodies) == expected["calls"] and waits[0] >= expected["first_wait_s_at_least"]
    assert labels == [(i, OURS[lab]) for i, lab in expected["labels"]]


def test_llm04_no_header_exhausts_with_nondecreasing_backoff(tmp_path):
    case = load_pitfall("LLM-04")
    replies = case["input"]["subcases"]["no_header_exhausts"]
    max_attempts = case["input"]["client_settings"]["max_retries"] + 1
    report, _, bodies, labels, fails, waits = _run(tmp_path, replies, max_attempts=max_attempts)
    assert len(bodies) == case["expected"]["no_header_exhausts"]["calls"] == 4
    assert len(waits) == 3 and waits == sorted(waits)
    assert labels == [] and report.failed == 2 and all("rate limited (429)" in f[1] for f in fails)


def test_llm04_no_header_exhausts_at_client_level():
    replies = load_pitfall("LLM-04")["input"]["subcases"]["no_header_exhausts"]
    sleeps = Sleeps()

    async def go(url):
        client = ChatClient(url, max_attempts=4, sleep=sleeps, seed=0)
        try:
            return await client.complete({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        finally:
            await client.aclose()

    with FakeOpenAI() as srv:
        srv.push(*replies)
        with pytest.raises(RetriesExhaustedError, match="rate limited") as info:
            asyncio.run(go(srv.base_url))
        assert len(srv.chat_requests()) == 4
    assert info.value.status == 429 and info.value.waits == sleeps.waits and len(sleeps.waits) == 3


def test_llm04_bad_request_is_not_retried(tmp_path):
    case = load_pitfall("LLM-04")
    replies = case["input"]["subcases"]["bad_request"]
    _, error, bodies, labels, _, waits = _run(tmp_path, replies)
    assert len(bodies) == case["expected"]["bad_request"]["calls"] == 1 and waits == []
    assert error is not None and "Invalid schema for response_format" in str(error) and labels == []


# ---------------------------------------------------------------------------------------- helpers
@pytest.mark.parametrize(
    ("headers", "message", "expected"),
    [
        ({"retry-after": "2"}, None, 2.0),
        ({"retry-after-ms": "1500"}, None, 1.5),
        ({}, "Rate limit reached. Please try again in 7.5s.", 7.5),
        ({}, "Please try again in 250ms", 0.25),
        ({}, "Rate limit reached", None),
    ],
)
def test_retry_after_parsing(headers, message, expected):
    assert retry_after_seconds(headers, message) == expected


def test_retry_after_http_date_is_in_the_future():
    from email.utils import formatdate
    import time

    wait = retry_after_seconds({"retry-after": formatdate(time.time() + 30, usegmt=True)}, None)
    assert 28 <= wait <= 31


def test_backoff_never_decreases_and_stays_in_its_jitter_range():
    for seed in range(50):
        rng = random.Random(seed)
        waits = [backoff_seconds(k, base=1.0, cap=60.0, rng=rng) for k in range(8)]
        assert waits == sorted(waits)
        for k, w in enumerate(waits):
            assert min(60.0, 0.5 * 2**k) <= w <= min(60.0, 2**k)


def test_judge_options_turn_cli_values_into_factory_kwargs(tmp_path):
    from ror_annotate.cli.judge_options import judge_options

    prices = tmp_path / "p.json"
    assert judge_options(base_url=None, chunk_size=8, batch=False, prices=prices, mode="per-segment") == {
        "chunk_size": 8, "prices": str(prices), "mode": "per-segment"}
    with pytest.raises(TypeError, match="unknown option"):
        judge_options(chunksize=8)

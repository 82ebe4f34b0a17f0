"""Reasoning formats: every adapter on small inputs in LF and CRLF, the issue's cases, leftover
markers, line endings, source_format in the store and the card, and `ror run` on saved vLLM responses.

Every expected value below is written by hand from the input next to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ror_annotate.errors import ConfigError, InputError
from ror_annotate.formats import FORMATS, KNOWN_MARKERS, extract, normalize_newlines
from ror_annotate.records import Trace
from ror_annotate.store import CORE_MIGRATIONS, Store
from ror_annotate.traces import NOTE_MARKERS, ColumnMap, load_traces, records_to_traces

ENDINGS = {"lf": "\n", "crlf": "\r\n"}


def _with_endings(value: Any, eol: str) -> Any:
    """``value`` with every LF inside every string replaced by ``eol`` (recursively)."""
    if isinstance(value, str):
        return value.replace("\n", eol)
    if isinstance(value, list):
        return [_with_endings(v, eol) for v in value]
    if isinstance(value, dict):
        return {k: _with_endings(v, eol) for k, v in value.items()}
    return value


def _write_jsonl(path: Path, rows: list[dict], eol: str = "\n", bom: bool = False) -> Path:
    data = "".join(json.dumps(r, ensure_ascii=False) + eol for r in rows).encode("utf-8")
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    return path


def _load_one(record: dict, tmp_path: Path, **kwargs: Any) -> Trace:
    traces = load_traces(_write_jsonl(tmp_path / "in.jsonl", [record]), **kwargs).traces
    assert len(traces) == 1
    return traces[0]


# --------------------------------------------------------------------------- one case per adapter
HARMONY_FULL = (
    "<|start|>system<|message|>You are ChatGPT.\nReasoning: high<|end|>"
    "<|start|>user<|message|>What is the weather in Tokyo?<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Need the weather.\nCall the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Tokyo\"}<|call|>"
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"temp\":20}<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking the result.<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>It is 20 C.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 20 °C in Tokyo.<|return|>"
)

# (case id, record, expected text, expected answer, expected source_format, expected meta subset)
ADAPTER_CASES: list[tuple[str, dict, str, str | None, str, dict]] = [
    ("think", {"trace": "<think>\nStep 1.\nStep 2.\n</think>\n\nThe answer is 4."}, "Step 1.\nStep 2.", "The answer is 4.", "think", {}),
    ("think-no-open", {"trace": "Step 1.\nSo 4.\n</think>\n4"}, "Step 1.\nSo 4.", "4", "think", {}),
    ("think-truncated", {"trace": "<think>\nStep 1.\nStep"}, "Step 1.\nStep", None, "think", {"truncated": True}),
    ("think-blocks", {"trace": "<think>\nA.\n</think>\nB.\n<think>\nC.\n</think>\nD."}, "A.\n\nC.", "D.", "think", {"gaps": ["B."]}),
    ("think-answer-tags", {"trace": "<think>\nR.\n</think>\n<answer>\n7\n</answer>"}, "R.", "7", "think", {}),
    ("thinking", {"trace": "<thinking>\nR one.\nR two.\n</thinking>\nA."}, "R one.\nR two.", "A.", "thinking", {}),
    (
        "thought",
        {"trace": "<|begin_of_thought|>\n\nr1\nr2\n\n<|end_of_thought|>\n\n<|begin_of_solution|>\n\ns\n\n<|end_of_solution|>"},
        "r1\nr2", "s", "thought", {},
    ),
    (
        "harmony",
        {"trace": HARMONY_FULL},
        "Need the weather.\nCall the tool.\n\nChecking the result.\n\nIt is 20 C.", "It is 20 °C in Tokyo.", "harmony",
        {"tool_calls": ['to=functions.get_weather: {"city":"Tokyo"}'], "tool_outputs": ['functions.get_weather: {"temp":20}']},
    ),
    ("mistral", {"trace": "[THINK]\nm1.\nm2.\n[/THINK]\nThe answer is 3."}, "m1.\nm2.", "The answer is 3.", "mistral", {}),
    (
        "seed",
        {"trace": "<seed:think>\ns1.\n<seed:cot_budget_reflect>I have used 9 tokens.</seed:cot_budget_reflect>\ns2.\n</seed:think>\nans."},
        "s1.\n\ns2.", "ans.", "seed", {"budget_reflections": ["I have used 9 tokens."]},
    ),
    ("kimi", {"trace": "◁think▷\nk1.\nk2.\n◁/think▷\nans."}, "k1.\nk2.", "ans.", "kimi", {}),
    ("plain", {"trace": "Let me think.\nSo \\boxed{42}."}, "Let me think.\nSo \\boxed{42}.", "42", "plain", {}),
    (
        "openai-response",
        {
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1764547200, "model": "Qwen/Qwen3-8B",
            "choices": [{"index": 0, "message": {"role": "assistant", "reasoning_content": "r1.\nr2.", "content": "\n\nA."},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
        },
        "r1.\nr2.", "A.", "openai-response", {"finish_reason": "stop", "response_id": "chatcmpl-1"},
    ),
    (
        "openai-response-reasoning-field",  # vLLM >= 0.10, OpenRouter, Ollama's OpenAI endpoint
        {"id": "gen-1", "model": "deepseek/deepseek-r1", "choices": [{"message": {"role": "assistant", "reasoning": "r.\nq.", "content": "A."}}]},
        "r.\nq.", "A.", "openai-response", {},
    ),
    (
        "openai-response-think-in-content",  # vLLM served without a reasoning parser
        {"id": "chatcmpl-2", "model": "m", "choices": [{"message": {"role": "assistant", "content": "R1.\nR2.\n</think>\n\nA."}}]},
        "R1.\nR2.", "A.", "openai-response/think", {},
    ),
    (
        "openai-response-thinking-parts",  # Mistral's API: the thinking is a typed part of content
        {"id": "cmpl-m", "model": "magistral-medium-2509", "choices": [{"message": {"role": "assistant", "content": [
            {"type": "thinking", "thinking": [{"type": "text", "text": "p1.\np2."}]}, {"type": "text", "text": "P."}]}}]},
        "p1.\np2.", "P.", "openai-response", {},
    ),
    (
        "openai-text-completion",  # /v1/completions: the raw generated text
        {"id": "cmpl-t", "object": "text_completion", "model": "m", "choices": [{"index": 0, "text": "x1.\nx2.</think>\n\nX.", "finish_reason": "stop"}]},
        "x1.\nx2.", "X.", "openai-response/think", {"finish_reason": "stop"},
    ),
    (
        "openai-batch-line",
        {"id": "batch_req_1", "custom_id": "task-7", "error": None,
         "response": {"status_code": 200, "request_id": "r", "body": {"id": "chatcmpl-3", "model": "m", "choices": [
             {"message": {"role": "assistant", "reasoning_content": "b1.\nb2.", "content": "B."}}]}}},
        "b1.\nb2.", "B.", "openai-response", {},
    ),
    (
        "ollama-chat",
        {"model": "qwen3:8b", "message": {"role": "assistant", "thinking": "o1.\no2.", "content": "O."}, "done": True, "done_reason": "stop"},
        "o1.\no2.", "O.", "ollama-chat", {"done_reason": "stop"},
    ),
    (
        "assistant-message",
        {"role": "assistant", "reasoning_content": "m1.\nm2.", "content": "M."},
        "m1.\nm2.", "M.", "assistant-message", {},
    ),
    (
        "chat",
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?\nReally?"},
                      {"role": "assistant", "content": "<think>\nc1.\nc2.\n</think>\nC."}]},
        "c1.\nc2.", "C.", "chat/think", {},
    ),
    (
        "chat-reasoning-field-and-tools",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Q?"}]},
                      {"role": "assistant", "reasoning_content": "t1.", "content": "Let me look.",
                       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "5"},
                      {"role": "assistant", "reasoning_content": "t2.\nt3.", "content": "Five."}]},
        "t1.\n\nt2.\nt3.", "Five.", "chat",
        {"gaps": ["Let me look."], "tool_outputs": ["5"],
         "tool_calls": ['{"function": {"arguments": "{}", "name": "f"}, "id": "c1", "type": "function"}']},
    ),
    (
        "sharegpt",
        {"conversations": [{"from": "human", "value": "Sum?"},
                           {"from": "gpt", "value": "<|begin_of_thought|>\ng1.\n<|end_of_thought|>\n<|begin_of_solution|>\nG.\n<|end_of_solution|>"}]},
        "g1.", "G.", "chat/thought", {},
    ),
]
PROBLEMS = {"harmony": "What is the weather in Tokyo?", "chat": "Q?\nReally?", "chat-reasoning-field-and-tools": "Q?", "sharegpt": "Sum?"}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
@pytest.mark.parametrize("case", ADAPTER_CASES, ids=[c[0] for c in ADAPTER_CASES])
def test_every_adapter_in_lf_and_crlf(case: tuple, ending: str, tmp_path: Path) -> None:
    case_id, record, text, answer, source_format, meta = case
    trace = _load_one(_with_endings(record, ENDINGS[ending]), tmp_path)
    assert (trace.text, trace.answer, trace.source_format) == (text, answer, source_format)
    assert {k: trace.meta.get(k) for k in meta} == meta
    assert trace.problem == PROBLEMS.get(case_id)
    assert "\r" not in trace.text and "\r" not in (trace.answer or "") and "\r" not in (trace.problem or "")
    if "\n" in text:  # the reasoning had line breaks: the CRLF run says what it normalized
        assert trace.meta.get("line_endings") == ("crlf" if ending == "crlf" else None)


def test_every_registered_format_has_a_case() -> None:
    covered = {c[4].split("/")[0] for c in ADAPTER_CASES} | {c[4].split("/")[1] for c in ADAPTER_CASES if "/" in c[4]}
    assert covered == set(FORMATS)


def test_response_ids_models_and_several_choices(tmp_path: Path) -> None:
    rec = {"id": "chatcmpl-9", "model": "Qwen/QwQ-32B", "choices": [
        {"index": 0, "message": {"role": "assistant", "reasoning_content": "x.", "content": "1"}},
        {"index": 1, "message": {"role": "assistant", "reasoning_content": "y.", "content": "2"}}],
        "messages": [{"role": "user", "content": "P?"}]}
    traces = load_traces(_write_jsonl(tmp_path / "r.jsonl", [rec])).traces
    assert [(t.trace_id, t.text, t.answer, t.model, t.problem) for t in traces] == [
        ("chatcmpl-9/g0", "x.", "1", "Qwen/QwQ-32B", "P?"), ("chatcmpl-9/g1", "y.", "2", "Qwen/QwQ-32B", "P?")]
    batch = {"id": "batch_req_1", "custom_id": "task-7", "response": {"status_code": 200, "body": {
        "id": "chatcmpl-3", "model": "m", "choices": [{"message": {"role": "assistant", "reasoning_content": "b.", "content": "B"}}]}}}
    assert _load_one(batch, tmp_path).trace_id == "task-7"


def test_response_saved_as_a_json_string_in_a_text_column(tmp_path: Path) -> None:
    response = {"id": "chatcmpl-s", "model": "m", "choices": [{"message": {"role": "assistant", "reasoning_content": "s1.", "content": "S"}}]}
    t = _load_one({"id": "row-1", "response": json.dumps(response)}, tmp_path)
    assert (t.trace_id, t.text, t.answer, t.source_format) == ("row-1", "s1.", "S", "openai-response")
    plain = _load_one({"trace": "{not json} so x = 2."}, tmp_path)
    assert (plain.text, plain.source_format) == ("{not json} so x = 2.", "plain")


def test_a_streamed_chunk_is_refused_with_the_reason(tmp_path: Path) -> None:
    chunk = {"id": "chatcmpl-c", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {"reasoning_content": "R"}}]}
    with pytest.raises(InputError, match=r"in\.jsonl:1: this is one streamed chunk"):
        _load_one(chunk, tmp_path)


def test_hidden_or_encrypted_reasoning_is_refused(tmp_path: Path) -> None:
    hidden = {"id": "chatcmpl-h", "model": "o3", "choices": [{"message": {"role": "assistant", "content": "42"}}],
              "usage": {"completion_tokens": 900, "completion_tokens_details": {"reasoning_tokens": 850}}}
    with pytest.raises(InputError, match=r"in\.jsonl:1: the response used 850 reasoning tokens but carries no reasoning text"):
        _load_one(hidden, tmp_path)
    redacted = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "EmwKAhgB"}, {"type": "text", "text": "A."}]}]}
    with pytest.raises(InputError, match=r"in\.jsonl:1 messages\[1\]: the message's reasoning is redacted or encrypted"):
        _load_one(redacted, tmp_path)
    encrypted = {"id": "gen-e", "model": "m", "choices": [{"message": {"role": "assistant", "content": "42", "reasoning_details": [
        {"type": "reasoning.encrypted", "data": "gAAAA"}]}}]}
    with pytest.raises(InputError, match=r"in\.jsonl:1: the reasoning is encrypted"):
        _load_one(encrypted, tmp_path)


def test_response_without_reasoning_is_stored_as_plain_with_a_counted_note(tmp_path: Path) -> None:
    rec = {"id": "chatcmpl-p", "model": "gpt-4o", "choices": [{"message": {"role": "assistant", "content": "First, 2+2=4. So 4."}}]}
    result = load_traces(_write_jsonl(tmp_path / "p.jsonl", [rec]))
    t = result.traces[0]
    assert (t.text, t.answer, t.source_format) == ("First, 2+2=4. So 4.", None, "openai-response/plain")
    assert sum(result.notes.values()) == 1 and "whole content stored as reasoning" in next(iter(result.notes))


# --------------------------------------------------------------------------- the issue's cases
def test_issue_gpt_oss_harmony_trace(tmp_path: Path) -> None:
    text = ("<|start|>assistant<|channel|>analysis<|message|>We need 3*4. That is 12.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>The answer is 12.<|return|>")
    t = _load_one({"id": "g1", "trace": text, "model": "openai/gpt-oss-120b"}, tmp_path)
    assert (t.text, t.answer, t.source_format) == ("We need 3*4. That is 12.", "The answer is 12.", "harmony")


def test_issue_several_think_blocks(tmp_path: Path) -> None:
    t = _load_one({"trace": "<think>A.</think>B.<think>C.</think>D."}, tmp_path)
    assert (t.text, t.answer, t.meta["gaps"]) == ("A.\n\nC.", "D.", ["B."])


@pytest.mark.parametrize(
    "text, message",
    [
        ("<think>A<think>B</think>C</think>D", r"nested <think> at line 1, column 9"),
        ("<think>A\n</think>B\n</think>C", r"</think> at line 3, column 1 of the text closes no <think>"),
        ("x</think>y</think>", r"</think> at line 1, column 11 of the text closes no <think>"),
        ("[THINK]a[THINK]b[/THINK]", r"nested \[THINK\]"),
    ],
)
def test_issue_nested_or_unbalanced_tags_are_refused_with_file_and_line(text: str, message: str, tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "n.jsonl", [{"trace": "<think>ok</think>fine"}, {"trace": text}])
    with pytest.raises(InputError, match=rf"n\.jsonl:2: {message}"):
        load_traces(path)


@pytest.mark.parametrize(
    "text, reasoning, answer",
    [
        ("[THINK]Mistral thinks.[/THINK]Answer M.", "Mistral thinks.", "Answer M."),
        ("<seed:think>Seed thinks.</seed:think>Answer S.", "Seed thinks.", "Answer S."),
        ("◁think▷Kimi thinks.◁/think▷Answer K.", "Kimi thinks.", "Answer K."),
    ],
)
def test_issue_mistral_seed_kimi_tags_do_not_leak(text: str, reasoning: str, answer: str, tmp_path: Path) -> None:
    t = _load_one({"trace": text}, tmp_path)
    assert (t.text, t.answer) == (reasoning, answer)


# --------------------------------------------------------------------------- leftover markers
def test_unrecognised_transcript_is_refused_or_counted_under_the_flag(tmp_path: Path) -> None:
    chatml = "<|im_start|>assistant\nLet me think about it.\nSo 5.<|im_end|>"
    path = _write_jsonl(tmp_path / "u.jsonl", [{"id": "a", "trace": "fine"}, {"id": "b", "trace": chatml}])
    with pytest.raises(InputError, match=r"u\.jsonl:2: the reasoning still holds '<\|im_start\|>' at line 1, column 1 .*--allow-markers"):
        load_traces(path)
    result = load_traces(path, allow_markers=True)
    assert [t.text for t in result.traces] == ["fine", "<|im_start|>assistant\nLet me think about it.\nSo 5."]
    assert result.notes[NOTE_MARKERS] == 1
    assert result.traces[1].meta["markers_left"] == ["<|im_start|>"]
    assert result.traces[1].meta["eos_token"] == "<|im_end|>"


@pytest.mark.parametrize(
    "eos, refused_mid_text",
    [("<|im_end|>", True), ("<|endoftext|>", True), ("<｜end▁of▁sentence｜>", True), ("<|eot_id|>", True), ("</s>", False)],
)
def test_one_trailing_end_of_sequence_token_is_removed_and_recorded(eos: str, refused_mid_text: bool, tmp_path: Path) -> None:
    t = _load_one({"trace": f"<think>r.</think>The answer is 3.{eos}\n"}, tmp_path)
    assert (t.text, t.answer, t.meta["eos_token"]) == ("r.", "The answer is 3.", eos)
    mid_text = {"trace": f"<think>r.</think>The answer{eos} is 3."}
    if refused_mid_text:  # anywhere but the end, a known token is a leftover
        with pytest.raises(InputError, match="the answer still holds"):
            _load_one(mid_text, tmp_path)
    else:  # </s> is also HTML: only removed at the very end
        assert _load_one(mid_text, tmp_path).answer == "The answer</s> is 3."


def test_harmony_decoded_without_special_tokens_is_refused_with_the_reason(tmp_path: Path) -> None:
    text = "analysisWe need 3*4. That is 12.assistantfinalThe answer is 12."
    with pytest.raises(InputError, match=r"holds 'assistantfinal'.*skip_special_tokens=True.*reasoning_content"):
        _load_one({"trace": text}, tmp_path)


def test_marker_of_a_second_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"the answer still holds '\[THINK\]'"):
        _load_one({"trace": "<think>a</think>b [THINK]c[/THINK]"}, tmp_path)
    with pytest.raises(InputError, match=r"the reasoning still holds '<THINK>'"):
        _load_one({"trace": "<THINK>upper case</think>b"}, tmp_path)


def test_forced_format(tmp_path: Path) -> None:
    rec = {"trace": "<think>a.</think>b."}
    with pytest.raises(InputError, match=r"--format mistral was forced, but the text has none of its markers"):
        _load_one(rec, tmp_path, format="mistral")
    with pytest.raises(InputError, match=r"the reasoning still holds '<think>'"):
        _load_one(rec, tmp_path, format="plain")
    raw = _load_one(rec, tmp_path, format="plain", allow_markers=True)
    assert (raw.text, raw.source_format) == ("<think>a.</think>b.", "plain")
    with pytest.raises(ConfigError, match=r"unknown format 'nope'. Available formats: auto, openai-response"):
        _load_one(rec, tmp_path, format="nope")
    with pytest.raises(InputError, match=r"--format chat was forced, but the record is not one"):
        _load_one({"id": "x", "choices": [{"message": {"role": "assistant", "content": "c"}}]}, tmp_path, format="chat")


# --------------------------------------------------------------------------- property: no marker survives
_FRAGMENT = st.text(alphabet=st.sampled_from(list("ab .\n\r|<>/[]:▷◁think")), max_size=6)
_WORDS = st.text(alphabet=st.sampled_from(list("ab x=1.\n\r")), min_size=1, max_size=6).filter(lambda w: w.strip())
_HARMONY_HEADERS = [
    "<|start|>assistant<|channel|>analysis", "<|start|>assistant<|channel|>commentary", "<|start|>assistant<|channel|>final",
    "<|channel|>analysis", "<|start|>user", "<|start|>system", "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json",
    "<|start|>functions.f to=assistant<|channel|>commentary",
]
_TAG_FORMATS = sorted(n for n, a in FORMATS.items() if hasattr(a, "open"))


@st.composite
def _pieces(draw: st.DrawFn) -> list[str]:
    """Random model output: a soup of known markers and fragments, or a well-formed text of one
    format (tags or Harmony messages around plain words), often mutated once: a piece dropped or
    repeated, or a marker of any format dropped in."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.lists(st.one_of(st.sampled_from(KNOWN_MARKERS), _FRAGMENT), max_size=12))
    pieces: list[str] = []
    if kind == 1:
        for _ in range(draw(st.integers(1, 4))):
            pieces += [draw(st.sampled_from(_HARMONY_HEADERS)), "<|message|>", draw(_WORDS), draw(st.sampled_from(["<|end|>", "<|return|>", "<|call|>"]))]
    else:
        adapter = FORMATS[draw(st.sampled_from(_TAG_FORMATS))]
        for _ in range(draw(st.integers(1, 3))):
            pieces += [adapter.open, draw(_WORDS), adapter.close, draw(_WORDS)]  # type: ignore[union-attr]
        if draw(st.booleans()):
            pieces = pieces[1:]  # missing opening tag
    mutation = draw(st.integers(0, 3))
    if mutation and pieces:
        at = draw(st.integers(0, len(pieces) - 1))
        if mutation == 1:
            del pieces[at]
        elif mutation == 2:
            pieces.insert(at, pieces[at])
        else:
            pieces.insert(at, draw(st.sampled_from(KNOWN_MARKERS)))
    return pieces


def _as_record(pieces: list[str], shape: int) -> dict:
    text = "".join(pieces)
    if shape == 0:
        return {"trace": text}
    if shape == 1:
        return {"id": "r", "model": "m", "choices": [{"message": {"role": "assistant", "content": text}}]}
    if shape == 2:
        return {"id": "r", "choices": [{"message": {"role": "assistant", "reasoning_content": text, "content": text[::-1]}}]}
    return {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=_pieces(), shape=st.sampled_from([0, 0, 0, 1, 2, 3]), fmt=st.sampled_from(["auto"] * 12 + list(FORMATS)))
def test_no_known_marker_ever_survives_into_a_stored_text(pieces: list[str], shape: int, fmt: str) -> None:
    try:
        traces = records_to_traces(_as_record(pieces, shape), "h.jsonl:1", ColumnMap(), "h.jsonl", format=fmt)
    except InputError:
        return  # refused with a message: allowed
    for t in traces:
        for stored in (t.text, t.answer or ""):
            low = stored.lower()
            assert not [m for m in KNOWN_MARKERS if m.lower() in low], (pieces, stored)
            assert "\r" not in stored


_CLEAN = st.text(alphabet=st.sampled_from(list("abc xyz.,=+1\n")), min_size=1, max_size=10).filter(lambda s: s.strip())


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(_TAG_FORMATS), blocks=st.lists(_CLEAN, min_size=1, max_size=4), gaps=st.lists(_CLEAN, min_size=4, max_size=4),
    tail=_CLEAN, eol=st.sampled_from(["\n", "\r\n", "\r"]),
)
def test_tag_blocks_in_order_and_gaps_never_lost(name: str, blocks: list[str], gaps: list[str], tail: str, eol: str) -> None:
    adapter = FORMATS[name]
    o, c = adapter.open, adapter.close  # type: ignore[union-attr]
    text = "".join(f"{o}{b}{c}{gaps[i]}" for i, b in enumerate(blocks[:-1])) + f"{o}{blocks[-1]}{c}{tail}"
    got = extract(text.replace("\n", eol), "p")[0]
    assert got.format == name
    assert got.reasoning == "\n\n".join(b.strip() for b in blocks)
    assert got.answer == tail.strip()
    assert list(got.gaps) == [g.strip() for g in gaps[: len(blocks) - 1]]


_HARMONY_KINDS = {  # header -> where its content must end up
    "<|start|>assistant<|channel|>analysis": "reasoning", "<|start|>assistant<|channel|>commentary": "reasoning",
    "<|start|>assistant<|channel|>final": "answer", "<|start|>user": "problem", "<|start|>developer": "dropped",
    "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json": "tool_calls",
    "<|start|>functions.f to=assistant<|channel|>commentary": "tool_outputs",
}


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(st.tuples(st.sampled_from(sorted(_HARMONY_KINDS)), _CLEAN), min_size=1, max_size=6), first_bare=st.booleans())
def test_harmony_messages_land_where_their_channel_says(messages: list[tuple[str, str]], first_bare: bool) -> None:
    parts = []
    for header, content in messages:
        end = "<|call|>" if _HARMONY_KINDS[header] == "tool_calls" else "<|end|>"
        parts.append(f"{header}<|message|>{content}{end}")
    if first_bare and messages[0][0] == "<|start|>assistant<|channel|>analysis":
        parts[0] = parts[0].removeprefix("<|start|>assistant")  # a completion starts at <|channel|>
    got = extract("".join(parts), "p")[0]
    want = {k: [c.strip() for h, c in messages if _HARMONY_KINDS[h] == k] for k in set(_HARMONY_KINDS.values())}
    assert got.reasoning == "\n\n".join(want["reasoning"])
    assert got.answer == ("\n\n".join(want["answer"]) or None)
    assert got.problem == (want["problem"][-1] if want["problem"] else None)
    assert [x.split(": ", 1)[1] for x in got.side.get("tool_calls", [])] == want["tool_calls"]
    assert [x.split(": ", 1)[1] for x in got.side.get("tool_outputs", [])] == want["tool_outputs"]
    assert got.gaps == ()


# --------------------------------------------------------------------------- line endings and BOM
@pytest.mark.parametrize("eol, bom", [("\n", False), ("\r\n", False), ("\r", False), ("\r\n", True), ("\n", True)])
def test_file_line_endings_and_bom(eol: str, bom: bool, tmp_path: Path) -> None:
    rows = [{"id": "a", "trace": "<think>\nx = 1.\ny = 2.\n</think>\nz"}, {"id": "b", "question": "Q\nq", "trace": "p\nq"}]
    path = _write_jsonl(tmp_path / "e.jsonl", _with_endings(rows, eol), eol=eol, bom=bom)
    traces = load_traces(path).traces
    assert [(t.trace_id, t.text, t.answer, t.problem) for t in traces] == [("a", "x = 1.\ny = 2.", "z", None), ("b", "p\nq", None, "Q\nq")]


def test_bad_json_after_lone_cr_lines_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "cr.jsonl"
    path.write_bytes(b'{"trace": "a"}\r{"trace": "b"}\r{"trace": \r')
    with pytest.raises(InputError, match=r"cr\.jsonl:3: malformed JSON"):
        load_traces(path)


def test_normalize_newlines_reports_what_it_changed() -> None:
    assert normalize_newlines("\ufeffa\r\nb\rc\n") == ("a\nb\nc\n", "mixed")
    assert normalize_newlines("a\rb") == ("a\nb", "cr")
    assert normalize_newlines("a\u2028b\n") == ("a\u2028b\n", None)


def test_offsets_index_the_stored_text_of_a_crlf_trace(tmp_path: Path) -> None:
    from ror_annotate.segment import Segmenter

    t = _load_one({"trace": "<think>\r\nFirst, 2+2=4.\r\nWait, is that right?\r\n\r\nYes. 🙂 答案是4。\r\n</think>\r\n4"}, tmp_path)
    assert t.text == "First, 2+2=4.\nWait, is that right?\n\nYes. 🙂 答案是4。"
    segments = Segmenter().segment(t.text, t.trace_id)
    assert all(t.text[s.char_start : s.char_end] == s.text for s in segments)
    assert "".join(s.text for s in segments).replace(" ", "") == t.text.replace("\n", "").replace(" ", "")


# --------------------------------------------------------------------------- store and card
def test_source_format_round_trips_through_the_store(tmp_path: Path) -> None:
    traces = [_load_one({"id": "h", "trace": "<|channel|>analysis<|message|>r<|end|>"}, tmp_path)]
    with Store(tmp_path / "s.duckdb") as store:
        store.upsert_traces(traces)
        assert [t.source_format for t in store.iter_traces()] == ["harmony"]
        assert store.get_trace("h") == traces[0]


def test_a_v1_store_migrates_and_keeps_its_traces(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE schema_versions (component VARCHAR PRIMARY KEY, version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)")
    for statement in CORE_MIGRATIONS[0].split(";"):
        if statement.strip():
            con.execute(statement)
    con.execute("INSERT INTO schema_versions VALUES ('core', 1, now())")
    con.execute("INSERT INTO traces (trace_id, text, text_sha256, meta, ingested_at) VALUES ('old', 'kept.', 'x', '{}', now())")
    con.close()
    with Store(db) as store:
        assert store.schema_version("core") == len(CORE_MIGRATIONS)
        old = store.get_trace("old")
    assert (old.text, old.source_format) == ("kept.", None)


ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]


def _vllm_response(n: int, reasoning: str, content: str) -> dict:
    """A chat completion as vLLM 0.9 with ``--reasoning-parser deepseek_r1`` returns it (saved by the openai client's model_dump)."""
    return {
        "id": f"chatcmpl-7c1e9a{n:02d}b4d2f4e0b9c3a1d5e6f70812", "object": "chat.completion", "created": 1764547200 + n,
        "model": "Qwen/Qwen3-30B-A3B",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": None, "annotations": None, "audio": None,
                        "function_call": None, "tool_calls": [], "reasoning_content": reasoning},
            "logprobs": None, "finish_reason": "stop", "stop_reason": None,
        }],
        "service_tier": None, "system_fingerprint": None,
        "usage": {"prompt_tokens": 24, "total_tokens": 24 + 40 * n, "completion_tokens": 40 * n, "prompt_tokens_details": None},
        "prompt_logprobs": None, "kv_transfer_params": None,
    }


VLLM_ROWS = [
    _vllm_response(1, "Okay, let me find 12 * 7.\n12 * 7 = 84.\nWait, let me check: 84 / 7 = 12. Yes.", "\n\nThe answer is **84**."),
    _vllm_response(2, "First, I need the sum of 1 to 10.\nThe formula is n(n+1)/2.\nSo 10 * 11 / 2 = 55.", "\n\n\\boxed{55}"),
    _vllm_response(3, "Let me think about primes below 10.\nThey are 2, 3, 5 and 7.\nHmm, is 1 prime? No.\nSo there are 4.", "4"),
    _vllm_response(4, "We need 2^10.\n2^10 = 1024.\nDouble-check: 2^5 = 32 and 32 * 32 = 1024.", "1024"),
]


def test_ror_run_on_saved_vllm_responses_produces_a_dataset(tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "vllm_responses.jsonl", VLLM_ROWS, eol="\r\n")
    db, out = tmp_path / "s.duckdb", tmp_path / "export"
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    result = subprocess.run([*ROR, "run", str(src), "--db", str(db), "--out", str(out)], check=False, cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    with Store(db) as store:
        traces = list(store.iter_traces())
        n_segments = store.counts()["segments"]
        runs = store.runs()
    assert [(t.trace_id, t.text, t.answer, t.model, t.source_format) for t in traces] == [
        (r["id"], r["choices"][0]["message"]["reasoning_content"], r["choices"][0]["message"]["content"].strip(), "Qwen/Qwen3-30B-A3B",
         "openai-response") for r in VLLM_ROWS
    ]
    assert runs[-1].parameters["format"] == "auto" and runs[-1].counts["ingest"]["formats"] == {"openai-response": 4}
    exported = datasets.load_from_disk(str(out / "segments"))
    assert sum(len(split) for split in exported.values()) == n_segments > 4
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "| source format | count | share |" in card and "| openai-response | 4 | 100.0% |" in card


def test_cli_format_option_is_passed_through(tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "t.jsonl", [{"id": "a", "trace": "<think>r.</think>a."}])
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}

    def ror(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*ROR, *args], check=False, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)

    refused = ror("ingest", str(src), "--db", str(tmp_path / "a.duckdb"), "--format", "plain")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "error [E100]" in refused.stderr and "--allow-markers" in " ".join(refused.stderr.split())
    stored = ror("ingest", str(src), "--db", str(tmp_path / "b.duckdb"), "--format", "plain", "--allow-markers")
    assert stored.returncode == 0, stored.stderr
    assert "1 traces: control token or thinking marker left" in " ".join(stored.stderr.split())
    with Store(tmp_path / "b.duckdb") as store:
        t = store.get_trace("a")
    assert (t.text, t.source_format, t.meta["markers_left"]) == ("<think>r.</think>a.", "plain", ["</think>", "<think>"])


def test_pipeline_ingest_passes_format_and_reports_formats_and_notes(tmp_path: Path) -> None:
    from ror_annotate import pipeline

    src = _write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "trace": "<think>A.</think>B.<think>C.</think>D."}, {"id": "b", "trace": "plain."}])
    with Store(tmp_path / "p.duckdb") as store:
        summary = pipeline.ingest(store, src)
        assert (summary.formats, summary.notes) == ({"think": 1, "plain": 1}, {"text between reasoning blocks kept in meta.gaps": 1})
        with pytest.raises(InputError, match=r"p\.jsonl:2: --format think was forced, but the text has none of its markers"):
            pipeline.ingest(store, src, format="think")
        assert store.runs()[-1].parameters["format"] == "think" and store.runs()[-1].status == "failed"

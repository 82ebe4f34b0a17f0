"""Batch mode of the LLM judge: the OpenAI Batch API (JSONL upload, create, poll, ingest).

For corpora that outgrow interactive rate limits. One batch holds the first request of every
pending chunk (the same request, and so the same cache key, as interactive mode would send), and
its bookkeeping row in ``judge_batches`` (batch id, input file id, ``custom_id`` -> request map) is
written right after the batch is created. Ingestion goes response by response: each stored
response, its labels and its cache row land in one store transaction, so an interrupted ingest is
simply run again. After ingestion, ids that were missing or invalid in the batch answers (and
requests the batch reported as failed) are re-asked interactively, under the usual bounded
attempts.

Resuming: ``--batch-id ID`` polls and ingests batch ``ID`` (recorded in this store); without it,
an un-ingested batch of the same annotators and codebook in the store is resumed before a new one
is created. Batch API usage is billed at half price (:data:`~.pricing.BATCH_DISCOUNT`).

The window between ``batches.create`` returning and the ``judge_batches`` row being committed is
the one place where a kill -9 can orphan a batch (it is then visible in the provider's dashboard).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, JudgeError
from . import JudgeReport
from .client import (
    ChatClient,
    RefusalError,
    ResponseParseError,
    TruncatedOutputError,
    completion_from_dict,
    parse_answer,
)
from .llm import ChunkResult, LLMJudge, naive_utc_now, UsageMeter, validate_answer
from .pricing import BATCH_DISCOUNT
from .prompt import build_messages, trace_block

if TYPE_CHECKING:  # pragma: no cover
    from rich.progress import Progress

    from ..records import Run
    from ..store import Store

_TERMINAL = {"completed", "failed", "expired", "cancelled"}


def label_with_batch(judge: LLMJudge, store: "Store", trace_ids: Sequence[str], *, run: "Run | None" = None,
                     progress: "Progress | None" = None) -> JudgeReport:
    """Label the pending segments of ``trace_ids`` through one Batch API batch, then finish interactively.

    Raises
    ------
    ConfigError
        ``--batch-id`` names a batch this store has no record of.
    JudgeError
        The batch ended ``failed``, ``expired`` or ``cancelled`` (the message says how to go on).
    """
    return asyncio.run(_label_with_batch(judge, store, trace_ids, run=run, progress=progress))


async def _label_with_batch(judge: LLMJudge, store: "Store", trace_ids: Sequence[str], *, run: "Run | None",
                            progress: "Progress | None") -> JudgeReport:
    report = JudgeReport()
    report.extra["batch_labeled"] = 0
    usage = UsageMeter(report, judge.prices.get(judge.model), discount=BATCH_DISCOUNT)
    client = ChatClient(judge.base_url, max_attempts=judge.max_attempts, timeout=judge.timeout,
                        backoff_base=judge.backoff_base, sleep=judge.sleep)
    run_id = run.run_id if run else None
    try:
        batch_id = judge.batch_id or _open_batch(judge, store)
        if batch_id is None:
            batch_id = await _submit(judge, store, client, trace_ids, run_id)
        if batch_id is not None:
            report.extra["batch_id"] = batch_id
            await _wait_and_ingest(judge, store, client, batch_id, usage, run_id, progress)
    finally:
        await client.aclose()
    # Whatever the batch did not settle (invalid/missing ids, failed lines) is finished interactively.
    report.extra["batch_labeled"] = report.labeled
    report = await judge.label_async(store, trace_ids, run=run, progress=progress, report=report)
    report.skipped -= report.extra["batch_labeled"]  # labeled by the batch in this run, not before it
    return report


def _open_batch(judge: LLMJudge, store: "Store") -> str | None:
    row = store.execute(
        "SELECT batch_id FROM judge_batches WHERE annotators = ? AND codebook_version = ? AND ingested_at IS NULL "
        "ORDER BY created_at DESC LIMIT 1",
        [_annotators(judge), judge.codebook_version],
    ).fetchone()
    return row[0] if row else None


def _annotators(judge: LLMJudge) -> str:
    return json.dumps([judge.annotator_for(k) for k in range(1, judge.samples + 1)])


def _requests(judge: LLMJudge, store: "Store", trace_ids: Sequence[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """JSONL lines of the first request of every pending chunk, and the custom_id -> request map."""
    lines, mapping = [], {}
    for trace_id in trace_ids:
        segments = store.segments(trace_id)
        if not segments:
            continue
        trace = store.get_trace(trace_id)
        block = trace_block(trace, segments)
        for sample in range(1, judge.samples + 1):
            done = judge.labeled_segments(store, trace_id, judge.annotator_for(sample))
            for i in range(0, len(segments), judge.chunk_size):
                ids = [s.segment_index for s in segments[i : i + judge.chunk_size] if s.segment_index not in done]
                if not ids:
                    continue
                max_tokens = judge.default_max_tokens(len(ids))
                params = judge.params(sample, max_tokens)
                messages, windowed = build_messages(judge.book, trace, segments, ids, context_tokens=judge.context_tokens,
                                                    max_tokens=max_tokens, system=judge.system_prompt, full_trace_block=block)
                key = judge.cache_key(trace, ids, params, 1, messages)
                if judge.cached_response(store, key) is not None:
                    continue
                custom_id = f"r{len(lines)}"
                lines.append({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                              "body": judge.request_body(messages, sample, max_tokens)})
                mapping[custom_id] = {"trace_id": trace_id, "ids": ids, "sample": sample, "params": params, "cache_key": key,
                                      "windowed": windowed}
    return lines, mapping


async def _submit(judge: LLMJudge, store: "Store", client: ChatClient, trace_ids: Sequence[str], run_id: str | None) -> str | None:
    lines, mapping = _requests(judge, store, trace_ids)
    if not lines:
        return None
    data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode("utf-8")
    api = client.openai
    uploaded = await client.with_retries(lambda: api.files.create(file=("ror-judge-batch.jsonl", data), purpose="batch"),
                                         what="batch input upload")
    batch = await client.with_retries(
        lambda: api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
                                   metadata={"tool": "ror_annotate", "codebook": judge.book.versioned_name}),
        what="batch create",
    )
    with store.transaction():
        store.execute(
            "INSERT INTO judge_batches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [batch.id, uploaded.id, _annotators(judge), judge.codebook_version, json.dumps(mapping), batch.status,
             naive_utc_now(), None, run_id],
        )
    return batch.id


async def _wait_and_ingest(judge: LLMJudge, store: "Store", client: ChatClient, batch_id: str, usage: UsageMeter,
                           run_id: str | None, progress: "Progress | None") -> None:
    row = store.execute("SELECT requests, ingested_at FROM judge_batches WHERE batch_id = ?", [batch_id]).fetchone()
    if row is None:
        raise ConfigError(f"batch {batch_id!r} is not recorded in {store.path}; resume it with the --db it was created with")
    if row[1] is not None:
        return
    mapping: dict[str, Any] = json.loads(row[0])
    api = client.openai
    sleep = judge.sleep or asyncio.sleep
    task = progress.add_task(f"batch {batch_id}", total=None) if progress is not None else None
    while True:
        batch = await client.with_retries(lambda: api.batches.retrieve(batch_id), what=f"batch {batch_id} status")
        store.execute("UPDATE judge_batches SET status = ? WHERE batch_id = ?", [batch.status, batch_id])
        if progress is not None:
            counts = batch.request_counts
            progress.update(task, description=f"batch {batch_id}: {batch.status}"
                            + (f" {counts.completed}/{counts.total}" if counts else ""))
        if batch.status in _TERMINAL:
            break
        await sleep(judge.batch_poll_s)
    if batch.status != "completed" or not batch.output_file_id:
        if batch.status == "completed":  # every request failed: nothing to ingest, all left for interactive
            store.execute("UPDATE judge_batches SET ingested_at = ? WHERE batch_id = ?", [naive_utc_now(), batch_id])
            return
        raise JudgeError(
            f"batch {batch_id} ended {batch.status!r}; its segments stay unlabeled. Run again without --batch-id to submit a new batch"
        )
    content = await client.with_retries(lambda: api.files.content(batch.output_file_id), what=f"batch {batch_id} output")
    text = content.text if hasattr(content, "text") else content.read().decode("utf-8")
    for line in text.splitlines():
        if line.strip():
            _ingest_line(judge, store, json.loads(line), mapping, usage, run_id)
    store.execute("UPDATE judge_batches SET ingested_at = ? WHERE batch_id = ?", [naive_utc_now(), batch_id])


def _ingest_line(judge: LLMJudge, store: "Store", line: dict[str, Any], mapping: dict[str, Any], usage: UsageMeter,
                 run_id: str | None) -> None:
    req = mapping.get(line.get("custom_id"))
    response = line.get("response") or {}
    if req is None or response.get("status_code") != 200:
        return  # a failed line: its segments stay pending and are asked interactively
    if judge.cached_response(store, req["cache_key"]) is not None:
        return  # already ingested by an interrupted earlier pass
    trace = store.get_trace(req["trace_id"])
    completion = completion_from_dict(response["body"])
    cost = usage.add(completion)
    try:
        result = validate_answer(parse_answer(completion), req["ids"], judge.book.labels)
    except (TruncatedOutputError, RefusalError, ResponseParseError) as exc:
        result = ChunkResult(bad={i: str(exc) for i in req["ids"]})
    cache_row = {"cache_key": req["cache_key"], "params": req["params"], "ids": req["ids"], "attempt": 1,
                 "response": completion.raw, "input_tokens": completion.input_tokens,
                 "cached_input_tokens": completion.cached_input_tokens, "output_tokens": completion.output_tokens, "cost_usd": cost}
    extra = {"prompt_template_hash": judge.prompt_template_hash, "model": judge.model, "response_model": completion.raw.get("model"),
             "codebook": judge.book.versioned_name, "params": req["params"], "mode": judge.mode, "chunk_size": judge.chunk_size,
             "attempt": 1, "cache_key": req["cache_key"], "windowed": req.get("windowed", False), "batch": True}
    judge.commit_response(store, trace=trace, sample=req["sample"], run_id=run_id, cache_row=cache_row, result=result,
                  failures={}, attempts=1, extra=extra)
    usage.report.labeled += len(result.good)

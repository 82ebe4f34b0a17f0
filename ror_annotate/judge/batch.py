"""Batch mode of the LLM judge: the OpenAI Batch API (JSONL upload, create, poll, ingest).

For corpora that outgrow interactive rate limits. The first request of every pending chunk (the
same request, and so the same cache key, as interactive mode would send) goes into batches of at
most ``batch_max_requests`` requests and ``batch_max_bytes`` bytes of JSONL (default: the Batch
API's documented 50,000 requests and 200 MB per batch). Each batch's bookkeeping row in
``judge_batches`` (batch id, input file id, ``custom_id`` -> request map) is written right after the
batch is created.

Every terminal state is handled the same way: ``completed``, ``failed``, ``expired`` and
``cancelled`` batches all have their ``output_file_id`` and ``error_file_id`` read when present;
each answered request is ingested (its cache row, labels and any failures in one store
transaction, so an interrupted ingest is simply run again), the errors are counted by code
(``extra["batch_errors"]``), and the row is closed (``ingested_at``, ``outcome``) so that no later
run returns to a dead batch. Requests a dead batch left unanswered are re-queued as the user chose
(``batch_requeue``): finished interactively (default), or put into a new batch, at most
``max_attempts`` batches per request. After the batches, whatever is still unlabeled (missing or
invalid ids in an answer) is finished interactively under the usual bounded attempts.

Resuming: every open batch of the same annotators and codebook in the store is polled and ingested
before anything new is submitted (``--batch-id ID`` names one explicitly), so a run killed while
polling continues the same batches, creates none twice and pays nothing twice. The window between
``batches.create`` returning and its ``judge_batches`` row being committed is the one place where a
kill -9 can orphan a batch (it is then visible in the provider's dashboard). Batch API usage is
billed at half price (:data:`~.pricing.BATCH_DISCOUNT`).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, JudgeError
from . import JudgeReport
from .client import ChatClient, RequestRejectedError, ResponseBodyError, completion_from_dict, run_interruptible
from .persist import UsageMeter, store_now
from .pricing import BATCH_DISCOUNT

if TYPE_CHECKING:  # pragma: no cover
    from rich.progress import Progress

    from ..records import Run
    from ..store import Store
    from .llm import LLMJudge

#: Batch states after which the provider does nothing more with a batch.
TERMINAL_STATES = frozenset({"completed", "failed", "expired", "cancelled"})


def label_with_batch(judge: "LLMJudge", store: "Store", trace_ids: Sequence[str], *, run: "Run | None" = None,
                     progress: "Progress | None" = None) -> JudgeReport:
    """Label the pending segments of ``trace_ids`` through Batch API batches, then finish interactively.

    Returns
    -------
    JudgeReport
        As interactive labeling, plus ``extra``: ``batch_labeled`` (labels from batches),
        ``batches`` (batch id -> final state), ``batch_errors`` (error code -> requests),
        ``batch_requeued`` (requests re-queued into a new batch).

    Raises
    ------
    ConfigError
        ``--batch-id`` names a batch this store has no record of.
    JudgeError
        The endpoint refused an upload or batch (see :class:`~.client.ChatClient`); batches created
        before stay recorded and a re-run resumes them.
    """
    return run_interruptible(_label_with_batch(judge, store, trace_ids, run=run, progress=progress))


async def _label_with_batch(judge: "LLMJudge", store: "Store", trace_ids: Sequence[str], *, run: "Run | None",
                            progress: "Progress | None") -> JudgeReport:
    report = JudgeReport()
    report.extra.update(batch_labeled=0, batches={}, batch_errors={}, batch_requeued=0)
    usage = UsageMeter(report, judge.prices.get(judge.model), discount=BATCH_DISCOUNT)
    client = ChatClient(judge.base_url, max_attempts=judge.max_attempts, timeout=judge.timeout,
                        backoff_base=judge.backoff_base, sleep=judge.sleep)
    run_id = run.run_id if run else None
    try:
        if judge.batch_id is not None:
            _require_recorded(store, judge.batch_id)
        await _settle(judge, store, client, _open_batches(judge, store), usage, run_id, progress)
        while True:
            lines, mapping = _requests(judge, store, trace_ids, report)
            if not lines:
                break
            new = await _submit(judge, store, client, lines, mapping, run_id)
            await _settle(judge, store, client, new, usage, run_id, progress)
    finally:
        await client.aclose()
    # Whatever the batches did not settle (invalid/missing ids, unanswered requests) is finished interactively.
    report.extra["batch_labeled"] = report.labeled
    report = await judge.label_async(store, trace_ids, run=run, progress=progress, report=report)
    report.skipped -= report.extra["batch_labeled"]  # labeled by a batch in this run, not before it
    return report


def _annotators(judge: "LLMJudge") -> str:
    return json.dumps([judge.annotator_for(k) for k in range(1, judge.samples + 1)])


def _require_recorded(store: "Store", batch_id: str) -> None:
    if store.execute("SELECT 1 FROM judge_batches WHERE batch_id = ?", [batch_id]).fetchone() is None:
        raise ConfigError(f"batch {batch_id!r} is not recorded in {store.path}; resume it with the --db it was created with")


def _open_batches(judge: "LLMJudge", store: "Store") -> list[str]:
    """Batches of this judge not yet closed (``--batch-id`` first), oldest first."""
    rows = store.execute(
        "SELECT batch_id FROM judge_batches WHERE annotators = ? AND codebook_version = ? AND ingested_at IS NULL "
        "ORDER BY created_at, batch_id",
        [_annotators(judge), judge.codebook_version],
    ).fetchall()
    ids = [r[0] for r in rows]
    if judge.batch_id is not None:
        closed = store.execute("SELECT ingested_at IS NOT NULL FROM judge_batches WHERE batch_id = ?", [judge.batch_id]).fetchone()
        if closed is not None and not closed[0]:
            ids = [judge.batch_id, *[i for i in ids if i != judge.batch_id]]
    return ids


def _asked(judge: "LLMJudge", store: "Store") -> Counter[str]:
    """Cache key -> how many closed batches of this judge held that request."""
    asked: Counter[str] = Counter()
    for (requests,) in store.execute(
        "SELECT requests FROM judge_batches WHERE annotators = ? AND codebook_version = ? AND ingested_at IS NOT NULL",
        [_annotators(judge), judge.codebook_version],
    ).fetchall():
        asked.update(req["cache_key"] for req in json.loads(requests).values())
    return asked


def _requests(judge: "LLMJudge", store: "Store", trace_ids: Sequence[str],
              report: JudgeReport) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """JSONL lines of the first request of every pending chunk that belongs in a batch, and the custom_id -> request map.

    A request already answered (cached) is left out; one that a closed batch held without an answer
    is left to the interactive pass (``batch_requeue="interactive"``) or re-queued, at most
    ``max_attempts`` batches in all (``"batch"``).
    """
    asked = _asked(judge, store)
    requeue = judge.config.batch_requeue == "batch"
    lines: list[dict[str, Any]] = []
    mapping: dict[str, Any] = {}
    for trace_id in trace_ids:
        segments = store.segments(trace_id)
        if not segments:
            continue
        trace = store.get_trace(trace_id)
        block = judge.render_trace_block(store, trace, segments)
        for sample in range(1, judge.samples + 1):
            annotator = judge.annotator_for(sample)
            done = judge.labeled_segments(store, trace_id, annotator)
            if not judge.retry_failed:
                done |= set(judge.failed_segments(store, trace_id, annotator))
            for i in range(0, len(segments), judge.chunk_size):
                ids = [s.segment_index for s in segments[i : i + judge.chunk_size] if s.segment_index not in done]
                if not ids:
                    continue
                max_tokens = judge.default_max_tokens(len(ids))
                params = judge.params(sample, max_tokens)
                messages, windowed = judge.render_messages(trace, segments, ids, max_tokens=max_tokens, block=block)
                key = judge.cache_key(trace, ids, params, 1, messages)
                if judge.cached_response(store, key) is not None:
                    continue
                if asked[key] and not (requeue and asked[key] < judge.max_attempts):
                    continue
                if asked[key]:
                    report.extra["batch_requeued"] += 1
                custom_id = f"r{len(lines)}"
                lines.append({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                              "body": judge.request_body(messages, sample, max_tokens)})
                mapping[custom_id] = {"trace_id": trace_id, "ids": ids, "sample": sample, "params": params, "cache_key": key,
                                      "windowed": windowed}
    return lines, mapping


def split_batches(encoded: Sequence[bytes], *, max_requests: int, max_bytes: int) -> list[list[int]]:
    """Indices of ``encoded`` JSONL lines grouped into batches of at most ``max_requests`` lines and ``max_bytes`` bytes.

    Greedy, in order. Raises :class:`JudgeError` for a single line longer than ``max_bytes``.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, line in enumerate(encoded):
        if len(line) > max_bytes:
            raise JudgeError(f"one batch request is {len(line)} bytes, over the {max_bytes}-byte batch file limit; label without --batch")
        if current and (len(current) >= max_requests or size + len(line) > max_bytes):
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += len(line)
    if current:
        groups.append(current)
    return groups


async def _submit(judge: "LLMJudge", store: "Store", client: ChatClient, lines: list[dict[str, Any]],
                  mapping: dict[str, Any], run_id: str | None) -> list[str]:
    """Upload and create the batches for ``lines``; each is recorded as soon as it exists. Returns their ids."""
    encoded = [(json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8") for line in lines]
    api = client.openai
    created = []
    for group in split_batches(encoded, max_requests=judge.config.batch_max_requests, max_bytes=judge.config.batch_max_bytes):
        data = b"".join(encoded[i] for i in group)
        part = {lines[i]["custom_id"]: mapping[lines[i]["custom_id"]] for i in group}
        uploaded = await client.with_retries(partial(api.files.create, file=("ror-judge-batch.jsonl", data), purpose="batch"),
                                             what="batch input upload")
        batch = await client.with_retries(
            partial(api.batches.create, input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
                    metadata={"tool": "ror_annotate", "codebook": judge.book.versioned_name}),
            what="batch create",
        )
        with store.transaction():
            store.execute(
                "INSERT INTO judge_batches (batch_id, input_file_id, annotators, codebook_version, requests, status, created_at, "
                "ingested_at, run_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [batch.id, uploaded.id, _annotators(judge), judge.codebook_version, json.dumps(part), batch.status,
                 store_now(), None, run_id],
            )
        created.append(batch.id)
    return created


async def _settle(judge: "LLMJudge", store: "Store", client: ChatClient, batch_ids: Sequence[str], usage: UsageMeter,
                  run_id: str | None, progress: "Progress | None") -> None:
    """Poll ``batch_ids`` every ``batch_poll_s`` seconds; ingest and close each as soon as it is terminal."""
    api = client.openai
    sleep = judge.sleep or asyncio.sleep
    pending = list(batch_ids)
    task = progress.add_task(f"{len(pending)} batch(es)", total=None) if progress is not None and pending else None
    while pending:
        for batch_id in list(pending):
            try:
                batch = await client.with_retries(partial(api.batches.retrieve, batch_id),
                                                  what=f"batch {batch_id} status")
            except RequestRejectedError as exc:
                if exc.status != 404:
                    raise
                # The provider no longer knows it (deleted, another account or --base-url): close it, so
                # no later run polls it again; its requests are re-queued like those of an expired batch.
                _close(store, batch_id, status="missing", output_file_id=None, error_file_id=None,
                       outcome={"status": "missing", "messages": [exc.message]})
                usage.report.extra["batches"][batch_id] = "missing"
                pending.remove(batch_id)
                continue
            store.execute("UPDATE judge_batches SET status = ? WHERE batch_id = ?", [batch.status, batch_id])
            if progress is not None and task is not None:
                counts = batch.request_counts
                progress.update(task, description=f"batch {batch_id}: {batch.status}"
                                + (f" {counts.completed}/{counts.total}" if counts else ""))
            if batch.status in TERMINAL_STATES:
                await _ingest_batch(judge, store, client, batch, usage, run_id)
                pending.remove(batch_id)
        if pending:
            await sleep(judge.batch_poll_s)


async def _read_file(client: ChatClient, file_id: str, what: str, messages: list[str]) -> list[dict[str, Any]]:
    """The JSONL lines of a batch output or error file; ``[]`` (and a message) when the provider lost it (404)."""
    api = client.openai
    try:
        content = await client.with_retries(lambda: api.files.content(file_id), what=what)
    except RequestRejectedError as exc:
        if exc.status != 404:
            raise
        messages.append(f"{what} ({file_id}) is gone: {exc.message}")
        return []
    text = content.text if hasattr(content, "text") else content.read().decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _close(store: "Store", batch_id: str, *, status: str, output_file_id: str | None, error_file_id: str | None,
           outcome: dict[str, Any]) -> None:
    """Close a batch's bookkeeping row: no run polls or ingests it again."""
    store.execute(
        "UPDATE judge_batches SET status = ?, output_file_id = ?, error_file_id = ?, outcome = ?, ingested_at = ? WHERE batch_id = ?",
        [status, output_file_id, error_file_id, json.dumps(outcome), store_now(), batch_id],
    )


async def _ingest_batch(judge: "LLMJudge", store: "Store", client: ChatClient, batch: Any, usage: UsageMeter,
                        run_id: str | None) -> None:
    """Ingest what a terminal batch answered, count what it did not, and close its bookkeeping row."""
    report = usage.report
    row = store.execute("SELECT requests FROM judge_batches WHERE batch_id = ?", [batch.id]).fetchone()
    mapping: dict[str, Any] = json.loads(row[0]) if row else {}
    errors: Counter[str] = Counter()
    messages: list[str] = []
    ingested = 0
    if batch.output_file_id:
        for line in await _read_file(client, batch.output_file_id, f"batch {batch.id} output", messages):
            status, code = _line_status(line)
            if status == 200:
                try:
                    ingested += _ingest_line(judge, store, line, mapping, usage, run_id)
                except ResponseBodyError as exc:  # a 200 line whose body is an error object, not a completion
                    errors["no_completion"] += 1
                    messages.append(exc.message[:300])
            else:
                errors[code] += 1
    if batch.error_file_id:
        for line in await _read_file(client, batch.error_file_id, f"batch {batch.id} errors", messages):
            errors[_line_status(line)[1]] += 1
    batch_errors = getattr(batch, "errors", None)
    for err in (getattr(batch_errors, "data", None) or []):  # validation failures of the whole input file
        errors[err.code or "batch_failed"] += 1
        messages.append(f"{err.code}: {err.message}" + (f" (line {err.line})" if err.line else ""))
    for code, n in errors.items():
        report.extra["batch_errors"][code] = report.extra["batch_errors"].get(code, 0) + n
    report.extra["batches"][batch.id] = batch.status
    outcome = {"status": batch.status, "requests": len(mapping), "ingested_now": ingested, "errors": dict(errors),
               "messages": messages[:5]}
    _close(store, batch.id, status=batch.status, output_file_id=batch.output_file_id, error_file_id=batch.error_file_id,
           outcome=outcome)


def _line_status(line: dict[str, Any]) -> tuple[int | None, str]:
    """HTTP status of one output/error file line and an error code for counting (``"ok"`` when 200)."""
    error = line.get("error")
    if isinstance(error, dict) and error:
        return None, str(error.get("code") or "error")
    response = line.get("response") or {}
    status = response.get("status_code")
    if status == 200:
        return 200, "ok"
    body = response.get("body") or {}
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return status, str(code or f"http_{status}")


def _ingest_line(judge: "LLMJudge", store: "Store", line: dict[str, Any], mapping: dict[str, Any], usage: UsageMeter,
                 run_id: str | None) -> bool:
    """Store one answered batch request (cache row, labels); ``False`` when unknown or already stored."""
    req = mapping.get(str(line.get("custom_id")))
    if req is None:
        return False
    if judge.cached_response(store, req["cache_key"]) is not None:
        return False  # already ingested by an interrupted earlier pass
    trace = store.get_trace(req["trace_id"])
    completion = completion_from_dict(line["response"]["body"])
    cost = usage.add(completion)
    result, _, _ = judge.judge_answer(completion, req["ids"])
    cache_row = {"cache_key": req["cache_key"], "params": req["params"], "ids": req["ids"], "attempt": 1,
                 "response": completion.raw, "input_tokens": completion.input_tokens,
                 "cached_input_tokens": completion.cached_input_tokens, "output_tokens": completion.output_tokens,
                 "cost_usd": cost, "reasoning": completion.reasoning, "usage_status": completion.usage_status}
    extra = {"prompt_template_hash": judge.prompt_template_hash, "model": judge.model, "response_model": completion.raw.get("model"),
             "codebook": judge.book.versioned_name, "params": req["params"], "mode": judge.mode, "chunk_size": judge.chunk_size,
             "attempt": 1, "cache_key": req["cache_key"], "windowed": req.get("windowed", False), "batch": True}
    judge.commit_response(store, trace=trace, sample=req["sample"], run_id=run_id, cache_row=cache_row, result=result,
                          failures={}, attempts=1, extra=extra)
    usage.report.labeled += len(result.good)
    return True

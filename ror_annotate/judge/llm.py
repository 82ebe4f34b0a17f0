"""The LLM judge: applies a frozen codebook to every segment through an OpenAI-compatible endpoint.

``make_judge("openai:MODEL", **options)`` builds an :class:`LLMJudge`. For each trace it sends the
codebook and the whole trace with segments marked by id, and asks for the labels of ``chunk_size``
segment ids per request (``mode="chunked"``), or of one id per request (``mode="per-segment"``,
the method's protocol, kept for comparison). The first request of a trace is sent alone and the
others after it returns, so the provider's prompt cache already holds the shared prefix (codebook +
trace) when they arrive.

Answers are strict structured outputs (:mod:`.schema`) and are validated: every requested id
exactly once, labels from the codebook. Only the missing or invalid ids are asked again; after
``max_attempts`` tries a segment is written to ``judge_failures`` with the reason, never as a label.

Exactly-once bookkeeping: every response is cached in ``judge_cache`` under a key of (codebook
hash, prompt template hash, model, parameters, trace hash, segment ids, attempt), and the cache row,
the labels it yields and any failure rows are written in ONE store transaction from the event-loop
thread. A process killed at any point (kill -9) and started again loses no label, writes none twice
and re-sends no request whose response was stored: segments with labels are skipped and every
stored response is replayed from the cache.

Requests that the endpoint rejects (4xx other than 408/409/429): 401, 403 and 404 (bad key, unknown
model or URL) and a rejection before any request of the run has succeeded (e.g. a schema the
endpoint refuses) abort the run with the API's message; later rejections (e.g. one over-long
request) fail only that request's segments.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..codebook import DEFAULT_CODEBOOK, Codebook, load_codebook
from ..errors import ConfigError, JudgeError
from ..records import Label, Segment, Trace, sha256_text, utc_now
from ..store import scrub_url
from . import JudgeReport, register_judge
from .client import (
    ChatClient,
    Completion,
    RefusalError,
    RequestRejectedError,
    ResponseParseError,
    RetriesExhaustedError,
    Sleep,
    TruncatedOutputError,
    check_base_url,
    completion_from_dict,
    parse_answer,
    resolve_api_key,
)
from .pricing import Price, cost_usd, load_prices
from .prompt import build_messages, system_message, template_hash, trace_block
from .schema import LabelBatch, response_format

if TYPE_CHECKING:  # pragma: no cover
    from rich.progress import Progress

    from ..records import Run
    from ..store import Store

DEFAULT_CHUNK_SIZE = 24
DEFAULT_CONCURRENCY = 8
DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_CONTEXT_TOKENS = 128_000
#: Output budget: a fixed part plus a per-segment part (an item with a short rationale is ~35 tokens).
MAX_TOKENS_BASE, MAX_TOKENS_PER_SEGMENT, MAX_TOKENS_CAP = 96, 64, 32_768
_FATAL_STATUS = {401, 403, 404}

#: The judge component's own tables (declared through Store.migrate("judge", ...)).
JUDGE_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE judge_cache (
        cache_key VARCHAR PRIMARY KEY,
        annotator VARCHAR NOT NULL,
        codebook_version VARCHAR NOT NULL,
        prompt_template_hash VARCHAR NOT NULL,
        model VARCHAR NOT NULL,
        params VARCHAR NOT NULL,
        trace_id VARCHAR NOT NULL,
        trace_sha256 VARCHAR NOT NULL,
        segment_ids VARCHAR NOT NULL,
        attempt INTEGER NOT NULL,
        response VARCHAR NOT NULL,
        input_tokens INTEGER NOT NULL,
        cached_input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_usd DOUBLE NOT NULL,
        created_at TIMESTAMP NOT NULL,
        run_id VARCHAR
    );
    CREATE TABLE judge_failures (
        trace_id VARCHAR NOT NULL,
        segment_index INTEGER NOT NULL,
        annotator VARCHAR NOT NULL,
        codebook_version VARCHAR NOT NULL,
        reason VARCHAR NOT NULL,
        attempts INTEGER NOT NULL,
        run_id VARCHAR,
        created_at TIMESTAMP NOT NULL,
        PRIMARY KEY (trace_id, segment_index, annotator, codebook_version)
    );
    CREATE TABLE judge_batches (
        batch_id VARCHAR PRIMARY KEY,
        input_file_id VARCHAR NOT NULL,
        annotators VARCHAR NOT NULL,
        codebook_version VARCHAR NOT NULL,
        requests VARCHAR NOT NULL,
        status VARCHAR NOT NULL,
        created_at TIMESTAMP NOT NULL,
        ingested_at TIMESTAMP,
        run_id VARCHAR
    );
    """,
)


def ensure_judge_tables(store: "Store") -> None:
    """Create or upgrade the judge's tables, and declare them to the store: cached responses and
    failures of a trace are derived from its segments, so re-segmenting the trace deletes them."""
    store.migrate("judge", JUDGE_MIGRATIONS)
    for table in ("judge_cache", "judge_failures"):
        store.register_trace_dependent(table, "cascade", component="judge")


def naive_utc_now():
    """Current UTC time without tzinfo: the store's TIMESTAMP convention."""
    return utc_now().replace(tzinfo=None)


@dataclass
class ChunkResult:
    """Validated answer for one request: labels by id, and a reason for every id still unanswered."""

    good: dict[int, tuple[str, float | None, str | None]] = field(default_factory=dict)
    bad: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def validate_answer(data: dict[str, Any], requested: Sequence[int], labels: Sequence[str]) -> ChunkResult:
    """Check a parsed answer against the requested ids and the codebook's labels.

    Every requested id must appear exactly once with a label from ``labels``; ids that are missing,
    duplicated (even with the same label) or labeled outside the codebook go to ``bad`` with the
    reason. Ids that were not requested are ignored (noted). A confidence outside [0, 1] is dropped
    (stored as None) with a note; the label itself stands.
    """
    result = ChunkResult()
    items = data.get("labels")
    if not isinstance(items, list):
        return ChunkResult(bad={i: "answer has no 'labels' list" for i in requested})
    wanted = set(requested)
    seen: dict[int, list[dict[str, Any]]] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("segment_id"), int) or isinstance(item.get("segment_id"), bool):
            result.notes.append(f"ignored malformed item {str(item)[:60]!r}")
            continue
        sid = item["segment_id"]
        if sid not in wanted:
            result.notes.append(f"ignored unrequested id {sid}")
            continue
        seen.setdefault(sid, []).append(item)
    for sid in requested:
        got = seen.get(sid)
        if not got:
            result.bad[sid] = "id missing from the answer"
            continue
        if len(got) > 1:
            result.bad[sid] = f"id answered {len(got)} times"
            continue
        item = got[0]
        label = item.get("label")
        if label not in labels:
            result.bad[sid] = f"label {label!r} is not in the codebook"
            continue
        conf = item.get("confidence")
        if conf is not None and (not isinstance(conf, (int, float)) or isinstance(conf, bool) or not 0.0 <= float(conf) <= 1.0):
            result.notes.append(f"id {sid}: confidence {conf!r} outside [0, 1] dropped")
            conf = None
        rationale = item.get("rationale")
        result.good[sid] = (label, None if conf is None else float(conf), rationale if isinstance(rationale, str) else None)
    return result


@dataclass
class UsageMeter:
    """Adds each completion's tokens and cost (USD, times ``discount`` for the Batch API) to ``report``."""

    report: JudgeReport
    price: Price | None
    discount: float = 1.0
    succeeded: int = 0

    def add(self, c: Completion) -> float:
        cost = cost_usd(self.price, input_tokens=c.input_tokens, cached_input_tokens=c.cached_input_tokens,
                        output_tokens=c.output_tokens, discount=self.discount)
        r = self.report
        r.requests += 1
        r.input_tokens += c.input_tokens
        r.cached_input_tokens += c.cached_input_tokens
        r.output_tokens += c.output_tokens
        r.cost_usd += cost
        self.succeeded += 1
        return cost


class LLMJudge:
    """Label segments with an LLM over an OpenAI-compatible chat-completions endpoint.

    Parameters
    ----------
    model : str
        Model name sent to the endpoint (``gpt-4.1-mini``, a vLLM served name, ...).
    base_url : str, optional
        Endpoint root; ``None`` is the OpenAI API. The key comes from ``OPENAI_API_KEY`` only.
    codebook : str, default ``"six-behaviors@v1"``
        Codebook name or path; its sha256 is written on every label as ``codebook_version``.
    mode : {"chunked", "per-segment"}
    chunk_size : int, default 24
        Segments per request in chunked mode.
    concurrency : int, default 8
        Requests in flight at once.
    temperature : float, optional
        Default 0.0, or 1.0 when ``samples > 1``.
    seed : int, optional
        Sent to the endpoint; sample ``k`` uses ``seed + k - 1``.
    max_tokens : int, optional
        Output limit per request in tokens; default ``96 + 64 * n_ids``. Doubled (up to 32,768) after a
        cut-off answer, so a retry is never identical.
    samples : int, default 1
        Independent samples stored as annotators ``openai:MODEL``, ``openai:MODEL@s2``, ...
    max_attempts : int, default 4
        Calls per request (retryable HTTP errors) and tries per segment (invalid answers).
    context_tokens : int, default 128000
        Model context window; longer traces are windowed (:mod:`.prompt`).
    prices : str, optional
        Price table file (:mod:`.pricing`).
    batch : bool, batch_id : str, optional
        Use the Batch API (:mod:`.batch`); ``batch_id`` resumes one.
    timeout : float, default 120
        Seconds per HTTP call.
    sleep : coroutine function, optional
        Waits between retries and batch polls go through it (tests record instead of sleeping).
    **ignored
        Options meant for other judges are accepted and ignored.
    """

    source = "judge"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        codebook: str = DEFAULT_CODEBOOK,
        mode: str = "chunked",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        concurrency: int = DEFAULT_CONCURRENCY,
        temperature: float | None = None,
        seed: int | None = None,
        max_tokens: int | None = None,
        samples: int = 1,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
        prices: str | None = None,
        batch: bool = False,
        batch_id: str | None = None,
        batch_poll_s: float = 30.0,
        timeout: float = 120.0,
        backoff_base: float = 1.0,
        sleep: Sleep | None = None,
        **ignored: Any,
    ) -> None:
        if not model:
            raise ConfigError("the LLM judge needs a model: --judge openai:MODEL (e.g. openai:gpt-4.1-mini)")
        if mode not in ("chunked", "per-segment"):
            raise ConfigError(f"--mode must be 'chunked' or 'per-segment', got {mode!r}")
        for name, value, low in (("chunk-size", chunk_size, 1), ("concurrency", concurrency, 1), ("samples", samples, 1),
                                 ("max-attempts", max_attempts, 1), ("context-tokens", context_tokens, 1024)):
            if value < low:
                raise ConfigError(f"--{name} must be >= {low}, got {value}")
        self.model = model
        self.base_url = base_url
        check_base_url(base_url)
        resolve_api_key(base_url)  # fail at construction, before any work, when no key is available
        self.book: Codebook = load_codebook(codebook)
        self.codebook_version = self.book.sha256
        self.mode = mode
        self.chunk_size = 1 if mode == "per-segment" else chunk_size
        self.concurrency = concurrency
        self.temperature = temperature if temperature is not None else (1.0 if samples > 1 else 0.0)
        self.seed = seed
        self.max_tokens = max_tokens
        self.samples = samples
        self.max_attempts = max_attempts
        self.context_tokens = context_tokens
        self.prices = load_prices(prices)
        self.batch = batch or batch_id is not None
        self.batch_id = batch_id
        self.batch_poll_s = batch_poll_s
        self.timeout = timeout
        self.backoff_base = backoff_base
        self.sleep = sleep
        self.annotator = f"openai:{model}"
        self.response_format = response_format(LabelBatch)
        self.prompt_template_hash = sha256_text(template_hash() + json.dumps(self.response_format, sort_keys=True))
        self.system_prompt = system_message(self.book)
        # OpenAI's own API wants max_completion_tokens (reasoning models reject max_tokens); compatible
        # servers (vLLM, Ollama) all understand max_tokens.
        self._max_tokens_field = "max_completion_tokens" if base_url is None else "max_tokens"

    # ------------------------------------------------------------------ identity
    def annotator_for(self, sample: int) -> str:
        """Annotator id of sample ``sample`` (1-based): ``openai:MODEL`` then ``openai:MODEL@s2``, ..."""
        return self.annotator if sample == 1 else f"{self.annotator}@s{sample}"

    def seed_for(self, sample: int) -> int | None:
        return None if self.seed is None else self.seed + sample - 1

    def default_max_tokens(self, n_ids: int) -> int:
        return self.max_tokens or min(MAX_TOKENS_BASE + MAX_TOKENS_PER_SEGMENT * n_ids, MAX_TOKENS_CAP)

    def params(self, sample: int, max_tokens: int) -> dict[str, Any]:
        """Sampling parameters that change the answer: part of the cache key and of label provenance."""
        return {
            "temperature": self.temperature, "seed": self.seed_for(sample), "max_tokens": max_tokens,
            "sample": sample, "context_tokens": self.context_tokens,
        }

    def cache_key(self, trace: Trace, ids: Sequence[int], params: dict[str, Any], attempt: int,
                  messages: list[dict[str, str]]) -> str:
        """sha256 of (codebook hash, prompt template hash, model, params, trace hash, segment ids, attempt, prompt hash).

        The hash of the rendered messages adds what the other parts miss: the problem text and the
        segment spans (a re-segmented trace must not hit the old answers).
        """
        prompt_sha = sha256_text(json.dumps(messages, ensure_ascii=False))
        return sha256_text(json.dumps(
            [self.codebook_version, self.prompt_template_hash, self.model, params, trace.text_sha256, list(ids), attempt, prompt_sha],
            sort_keys=True,
        ))

    def request_body(self, messages: list[dict[str, str]], sample: int, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "temperature": self.temperature,
            self._max_tokens_field: max_tokens, "response_format": self.response_format,
        }
        if self.seed_for(sample) is not None:
            body["seed"] = self.seed_for(sample)
        return body

    # ------------------------------------------------------------------ store helpers
    def labeled_segments(self, store: "Store", trace_id: str, annotator: str) -> set[int]:
        """Segment indices of ``trace_id`` this annotator already labeled under this codebook (skipped on re-runs)."""
        rows = store.execute(
            "SELECT segment_index FROM labels WHERE trace_id = ? AND annotator = ? AND codebook_version = ? AND source = 'judge'",
            [trace_id, annotator, self.codebook_version],
        ).fetchall()
        return {int(r[0]) for r in rows}

    def cached_response(self, store: "Store", key: str) -> dict[str, Any] | None:
        """The stored response for a request cache key, or None (a cached response is never paid for again)."""
        row = store.execute("SELECT response FROM judge_cache WHERE cache_key = ?", [key]).fetchone()
        return json.loads(row[0]) if row else None

    def commit_response(
        self,
        store: "Store",
        *,
        trace: Trace,
        sample: int,
        run_id: str | None,
        cache_row: dict[str, Any] | None,
        result: ChunkResult,
        failures: dict[int, str],
        attempts: int,
        extra: dict[str, Any],
    ) -> None:
        """Write one response's cache row, its labels and any final failures in one transaction."""
        annotator = self.annotator_for(sample)
        labels = [
            Label(trace_id=trace.trace_id, segment_index=sid, label=lab, source="judge", annotator=annotator,
                  codebook_version=self.codebook_version, run_id=run_id, confidence=conf, rationale=why, extra=extra)
            for sid, (lab, conf, why) in sorted(result.good.items())
        ]
        now = naive_utc_now()
        with store.transaction():
            if cache_row is not None:
                store.execute(
                    "INSERT INTO judge_cache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [cache_row["cache_key"], annotator, self.codebook_version, self.prompt_template_hash, self.model,
                     json.dumps(cache_row["params"], sort_keys=True), trace.trace_id, trace.text_sha256,
                     json.dumps(cache_row["ids"]), cache_row["attempt"], json.dumps(cache_row["response"], ensure_ascii=False),
                     cache_row["input_tokens"], cache_row["cached_input_tokens"], cache_row["output_tokens"],
                     cache_row["cost_usd"], now, run_id],
                )
            if labels:
                store.upsert_labels(labels)
                store.execute(
                    "DELETE FROM judge_failures WHERE trace_id = ? AND annotator = ? AND codebook_version = ? "
                    "AND list_contains(?, segment_index)",
                    [trace.trace_id, annotator, self.codebook_version, sorted(result.good)],
                )
            for sid, reason in sorted(failures.items()):
                store.execute(
                    "INSERT OR REPLACE INTO judge_failures VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [trace.trace_id, sid, annotator, self.codebook_version, reason[:2000], attempts, run_id, now],
                )

    # ------------------------------------------------------------------ interactive labeling
    def label(self, store: "Store", trace_ids: Sequence[str], *, run: "Run | None" = None,
              progress: "Progress | None" = None) -> JudgeReport:
        """Label every stored segment of ``trace_ids`` that this judge (and sample) has not labeled yet.

        Returns
        -------
        JudgeReport
            ``labeled`` new labels, ``failed`` segments written to ``judge_failures``, ``skipped``
            segments already labeled, request and token counts, ``cost_usd``; ``extra`` holds
            ``unsegmented_traces`` and ``windowed_requests``.

        Raises
        ------
        JudgeError
            The endpoint refused the run as a whole (bad key, unknown model, rejected schema); the
            labels written before stay stored.
        """
        ensure_judge_tables(store)
        if self.batch:
            from .batch import label_with_batch

            return label_with_batch(self, store, trace_ids, run=run, progress=progress)
        return asyncio.run(self.label_async(store, trace_ids, run=run, progress=progress))

    async def label_async(self, store: "Store", trace_ids: Sequence[str], *, run: "Run | None" = None,
                          progress: "Progress | None" = None, report: JudgeReport | None = None) -> JudgeReport:
        """:meth:`label` inside a running event loop (all store writes happen on this loop's thread)."""
        ensure_judge_tables(store)
        report = report or JudgeReport()
        report.extra.setdefault("unsegmented_traces", 0)
        report.extra.setdefault("windowed_requests", 0)
        usage = UsageMeter(report, self.prices.get(self.model))
        report.extra["price"] = "known" if usage.price else "unknown"
        client = ChatClient(self.base_url, max_attempts=self.max_attempts, timeout=self.timeout,
                            backoff_base=self.backoff_base, sleep=self.sleep)
        ctx = _RunContext(store=store, run_id=run.run_id if run else None, client=client, usage=usage,
                          req_sem=asyncio.Semaphore(self.concurrency), progress=progress)
        if progress is not None:
            ctx.task = progress.add_task(f"judge {self.annotator}", total=self._count_pending(store, trace_ids))
        trace_sem = asyncio.Semaphore(max(2 * self.concurrency, 4))

        async def one(trace_id: str, sample: int) -> None:
            async with trace_sem:
                await self._judge_trace(ctx, trace_id, sample)

        try:
            await asyncio.gather(*(one(t, k) for k in range(1, self.samples + 1) for t in trace_ids))
        finally:
            await client.aclose()
            ctx.publish(final=True)
        return report

    def _count_pending(self, store: "Store", trace_ids: Sequence[str]) -> int:
        total = 0
        for k in range(1, self.samples + 1):
            row = store.execute(
                "SELECT count(*) FROM segments s WHERE list_contains(?, s.trace_id) AND NOT EXISTS ("
                "SELECT 1 FROM labels l WHERE l.trace_id = s.trace_id AND l.segment_index = s.segment_index "
                "AND l.annotator = ? AND l.codebook_version = ? AND l.source = 'judge')",
                [list(trace_ids), self.annotator_for(k), self.codebook_version],
            ).fetchone()
            total += int(row[0])
        return total

    async def _judge_trace(self, ctx: "_RunContext", trace_id: str, sample: int) -> None:
        store = ctx.store
        trace = store.get_trace(trace_id)
        segments = store.segments(trace_id)
        if not segments:
            ctx.usage.report.extra["unsegmented_traces"] += 1
            return
        done = self.labeled_segments(store, trace_id, self.annotator_for(sample))
        ctx.usage.report.skipped += sum(1 for s in segments if s.segment_index in done)
        chunks = [
            [s.segment_index for s in segments[i : i + self.chunk_size] if s.segment_index not in done]
            for i in range(0, len(segments), self.chunk_size)
        ]
        chunks = [c for c in chunks if c]
        if not chunks:
            return
        job = _TraceJob(trace=trace, segments=segments, sample=sample, block=trace_block(trace, segments))
        # First request alone: the provider caches the shared prefix before the others arrive.
        await self._judge_chunk(ctx, job, chunks[0])
        await asyncio.gather(*(self._judge_chunk(ctx, job, c) for c in chunks[1:]))

    async def _judge_chunk(self, ctx: "_RunContext", job: "_TraceJob", ids: list[int]) -> None:
        remaining = list(ids)
        max_tokens = self.default_max_tokens(len(ids))
        transport_failure: str | None = None
        attempt = 0
        while remaining and attempt < self.max_attempts:
            attempt += 1
            params = self.params(job.sample, max_tokens)
            messages, windowed = build_messages(self.book, job.trace, job.segments, remaining, context_tokens=self.context_tokens,
                                                max_tokens=max_tokens, system=self.system_prompt, full_trace_block=job.block)
            key = self.cache_key(job.trace, remaining, params, attempt, messages)
            cached = self.cached_response(ctx.store, key)
            cache_row = None
            if cached is not None:
                completion = completion_from_dict(cached)
                ctx.usage.report.cached_responses += 1
            else:
                try:
                    async with ctx.req_sem:
                        completion = await ctx.client.complete(
                            self.request_body(messages, job.sample, max_tokens),
                            what=f"trace {job.trace.trace_id} segments {remaining[0]}-{remaining[-1]}",
                        )
                except RequestRejectedError as exc:
                    if exc.status in _FATAL_STATUS or ctx.usage.succeeded == 0:
                        raise JudgeError(f"{exc.message}. Check --judge, --base-url and OPENAI_API_KEY", code=exc.code) from exc
                    transport_failure = str(exc)
                    break
                except RetriesExhaustedError as exc:
                    if exc.status is None and ctx.usage.succeeded == 0:
                        # Connection refused or timed out on every try, and nothing of this run has
                        # succeeded: a wrong --base-url or a server that is down, not a bad segment.
                        # Abort instead of writing every segment of the run to judge_failures.
                        where = scrub_url(self.base_url) if self.base_url else "the OpenAI API"
                        raise JudgeError(
                            f"cannot reach {where}: {exc.message.rstrip('.')}. Check --base-url and that the server is up; "
                            "labels stored so far are kept and the run resumes where it stopped",
                            code=exc.code,
                        ) from exc
                    transport_failure = str(exc)
                    break
                cost = ctx.usage.add(completion)
                if windowed:
                    ctx.usage.report.extra["windowed_requests"] += 1
                cache_row = {"cache_key": key, "params": params, "ids": remaining, "attempt": attempt,
                             "response": completion.raw, "input_tokens": completion.input_tokens,
                             "cached_input_tokens": completion.cached_input_tokens,
                             "output_tokens": completion.output_tokens, "cost_usd": cost}
            try:
                result = validate_answer(parse_answer(completion), remaining, self.book.labels)
            except TruncatedOutputError as exc:
                result = ChunkResult(bad={i: str(exc) for i in remaining})
                # Never retry identically: a cut-off answer gets twice the output budget.
                max_tokens = min(max_tokens * 2, MAX_TOKENS_CAP)
            except (RefusalError, ResponseParseError) as exc:
                result = ChunkResult(bad={i: str(exc) for i in remaining})
            final = attempt >= self.max_attempts
            extra = {"prompt_template_hash": self.prompt_template_hash, "model": self.model,
                     "response_model": completion.raw.get("model"), "codebook": self.book.versioned_name,
                     "params": params, "mode": self.mode, "chunk_size": self.chunk_size,
                     "attempt": attempt, "cache_key": key, "windowed": windowed}
            self.commit_response(ctx.store, trace=job.trace, sample=job.sample, run_id=ctx.run_id, cache_row=cache_row, result=result,
                         failures=result.bad if final else {}, attempts=attempt, extra=extra)
            ctx.usage.report.labeled += len(result.good)
            if final:
                ctx.usage.report.failed += len(result.bad)
            ctx.advance(len(result.good) + (len(result.bad) if final else 0))
            remaining = [i for i in remaining if i in result.bad]
        if transport_failure is not None and remaining:
            # No answer to store: the failure rows are written alone.
            failures = {i: transport_failure for i in remaining}
            self.commit_response(ctx.store, trace=job.trace, sample=job.sample, run_id=ctx.run_id, cache_row=None,
                         result=ChunkResult(), failures=failures, attempts=attempt, extra={})
            ctx.usage.report.failed += len(failures)
            ctx.advance(len(failures))


@dataclass
class _TraceJob:
    trace: Trace
    segments: list[Segment]
    sample: int
    block: str


@dataclass
class _RunContext:
    store: "Store"
    run_id: str | None
    client: ChatClient
    usage: UsageMeter
    req_sem: asyncio.Semaphore
    progress: "Progress | None" = None
    task: Any = None
    _since_publish: int = 0

    def advance(self, n: int) -> None:
        """Move the progress bar and store live counts in ``runs`` (every 20 updates)."""
        r = self.usage.report
        if self.progress is not None and self.task is not None:
            self.progress.update(
                self.task, advance=n,
                description=f"judge · {r.requests} req · {r.input_tokens / 1000:.0f}k in ({r.cached_input_tokens / 1000:.0f}k cached) "
                f"· {r.output_tokens / 1000:.0f}k out · ${r.cost_usd:.4f}",
            )
        self._since_publish += 1
        if self._since_publish >= 20:
            self.publish()

    def publish(self, final: bool = False) -> None:
        self._since_publish = 0
        if self.run_id is not None:
            self.store.update_run_counts(self.run_id, self.usage.report.as_counts())


@register_judge("openai")
def make_openai_judge(model: str | None, **options: Any) -> LLMJudge:
    """Factory for ``--judge openai:MODEL``: see :class:`LLMJudge` for the options."""
    if not model:
        raise ConfigError("the openai judge needs a model name: --judge openai:MODEL (e.g. openai:gpt-4.1-mini)")
    return LLMJudge(model, **options)

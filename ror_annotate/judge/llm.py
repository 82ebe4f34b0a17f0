"""The LLM judge: applies a frozen codebook to every segment through an OpenAI-compatible endpoint.

``make_judge("openai:MODEL", **options)`` builds an :class:`LLMJudge`. For each trace it sends the
codebook and the whole trace with segments marked by id, and asks for the labels of ``chunk_size``
segment ids per request (``mode="chunked"``), or of one id per request (``mode="per-segment"``,
the method's protocol, kept for comparison). The first request of a trace is sent alone and the
others after it returns, so the provider's prompt cache already holds the shared prefix (codebook +
trace) when they arrive.

Answers are strict structured outputs (:mod:`.schema`); a reasoning model's think block, a code
fence around the JSON and ``reasoning_content`` are accepted (:func:`.client.parse_answer`), and
the reasoning text is stored with the cached response. Answers are validated: every requested id
exactly once, labels from the codebook. Only the missing or invalid ids are asked again, never with
the identical request (an unusable answer adds a retry instruction after the ids; a cut-off one
doubles the output budget), and retries are counted by cause (``extra["retries"]``). After
``max_attempts`` tries a segment is written to ``judge_failures`` with the reason, never as a label;
a re-run asks again for it with ``max_attempts`` new tries (``retry_failed``, the default).

Exactly-once bookkeeping: every response is cached in ``judge_cache`` under a key of (codebook
hash, prompt template hash, model, parameters, trace hash, segment ids, attempt), and the cache row,
the labels it yields and any failure rows are written in the same store transaction, by one writer
thread with its own store handle (:class:`.persist.CommitThread`), so the event loop keeps sending
and reading while a group commits (:mod:`.persist`: answers that arrive together share one
transaction, at most about a second apart while other requests are in flight, at once when none
is; with :data:`MAX_WAITING_ANSWERS` waiting for a busy writer no new request is sent). A process killed at
any point (kill -9) and started again loses no committed label, writes none twice and re-sends no
request whose response was stored: segments with labels are skipped and every stored response is
replayed from the cache (answers received in the last moment before the kill and not yet committed
are asked again).

Speed: the trace, its segments and its labelled and failed segments are read for blocks of 64
traces in one query each, cache lookups happen only for traces that had stored responses when the
run began, the prompt's token estimates are computed once per trace, requests are posted without
the ``openai`` client's type transform, and one HTTP pool holds ``concurrency`` kept-alive
connections (``benchmarks/bench_judge.py --throughput``). A plain-``http`` endpoint (vLLM, Ollama)
is sent the body bytes through ``aiohttp`` (:mod:`.plainhttp`); the messages' JSON and the
cache key's prompt hash encode the shared prefix (system message and trace block) once per trace
(:class:`.prompt.MessagesJson`, byte-identical keys); an answer's labels are written as Arrow
columns (:class:`.persist.LabelRows`) rather than a Label object per segment.

Fatal or local is decided by the kind of error, never by the order of the requests: a request
refused as longer than the model's context fails that trace only (its other chunks are not sent),
with the reason; any other rejection (4xx other than 408/409/429: bad key, unknown model or URL, a
schema the endpoint refuses, also when relayed inside an HTTP 200) and an endpoint that never
answered in the run (nothing answering on every try) or that stopped answering for
:data:`DOWN_AFTER_FAILED_REQUESTS` requests in a row abort the run with the API's message. 429s,
5xx, client-side timeouts, reset connections and 200 bodies that are no completion that outlast
the retries fail only that request's segments.

The cost ledger: each paid response's usage is stored with it in ``judge_cache`` (``NULL`` when
the endpoint reported none or an invalid one, ``usage_status`` saying which); at the end of a pass
the run's totals are recomputed from those rows (:func:`run_ledger`), and runs an earlier process
left unfinished (kill -9) are given theirs when the next pass starts (:func:`reconcile_run_ledger`).
Rationales are capped at :data:`MAX_RATIONALE_CHARS` characters; failure reasons are scrubbed of
secrets before they are stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..codebook import Codebook, load_codebook
from ..errors import ConfigError, JudgeError
from ..gc_policy import fewer_collections
from ..provenance import scrub_text, scrub_url
from ..records import Annotator, Label, SegmentLike, Trace, segment_rows_checked, sha256_text, utc_now
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
    is_context_length_error,
    parse_answer,
    resolve_api_key,
    run_interruptible,
)
from .config import JudgeConfig
from .persist import (  # noqa: F401  (JUDGE_MIGRATIONS, LEDGER_MIGRATIONS: re-exported, defined here before persist.py)
    JUDGE_MIGRATIONS,
    LEDGER_MIGRATIONS,
    Answer,
    AnswerWriter,
    CommitThread,
    LabelRows,
    UsageMeter,
    cached_trace_ids,
    ensure_judge_tables,
    failed_segments_by_trace,
    reconcile_run_ledger,
    run_ledger,
)
from .persist import cached_response as _cached_response
from .pricing import load_prices
from .prompt import MessagesJson, build_messages, system_message, template_hash, trace_block
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
#: Longest rationale stored on a label, in characters; a longer one is cut and ends with
#: ``" … [rationale cut: N characters]"`` (N its full length). The raw answer stays whole in judge_cache.
MAX_RATIONALE_CHARS = 2000
#: A run stops as "stopped answering" after this many requests in a row found nothing answering on
#: any try (connection refused or reset), although the endpoint had answered before in the run.
DOWN_AFTER_FAILED_REQUESTS = 3

#: Backpressure: with this many answers waiting while the writer thread commits a group, no new
#: request is sent until that commit is done (memory stays bounded when the store is slower than the server).
MAX_WAITING_ANSWERS = 2048

#: Seconds of trace preparation the event loop runs in one turn before it reads answers and sends again.
PREP_SLICE_S = 0.01

#: Why a request was asked again (``JudgeReport.extra["retries"]`` counts each).
RETRY_CAUSES = ("transport", "truncated", "parse", "refusal", "invalid_ids")
#: What the retry instruction (prompt.RETRY_TEMPLATE) says was wrong, per cause with a fixed text.
_RETRY_PROBLEMS = {"parse": "it was not a JSON object", "refusal": "it was a refusal; the task is only to classify text"}


@dataclass
class ChunkResult:
    """Validated answer for one request: labels by id, and a reason for every id still unanswered."""

    good: dict[int, tuple[str, float | None, str | None]] = field(default_factory=dict)
    bad: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def answered_once(items: list[Any], requested: Sequence[int], result: ChunkResult) -> dict[int, dict[str, Any]]:
    """The answer item of each requested id that the answer gives exactly once (``{segment_id: item}``,
    in ``requested`` order). Malformed and unrequested items are noted in ``result.notes``; ids
    missing or answered more than once go to ``result.bad`` with the reason. Shared by the
    labeller's and the verifier's answer checks."""
    wanted = set(requested)
    seen: dict[int, list[dict[str, Any]]] = {}
    for item in items:
        sid = item.get("segment_id") if isinstance(item, dict) else None
        if not isinstance(sid, int) or isinstance(sid, bool):
            result.notes.append(f"ignored malformed item {str(item)[:60]!r}")
            continue
        if sid not in wanted:
            result.notes.append(f"ignored unrequested id {sid}")
            continue
        seen.setdefault(sid, []).append(item)
    once: dict[int, dict[str, Any]] = {}
    for sid in requested:
        got = seen.get(sid)
        if not got:
            result.bad[sid] = "id missing from the answer"
        elif len(got) > 1:
            result.bad[sid] = f"id answered {len(got)} times"
        else:
            once[sid] = got[0]
    return once


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
    for sid, item in answered_once(items, requested, result).items():
        label = item.get("label")
        if label not in labels:
            result.bad[sid] = f"label {label!r} is not in the codebook"
            continue
        conf = item.get("confidence")
        if conf is not None and (not isinstance(conf, (int, float)) or isinstance(conf, bool) or not 0.0 <= float(conf) <= 1.0):
            result.notes.append(f"id {sid}: confidence {conf!r} outside [0, 1] dropped")
            conf = None
        rationale = item.get("rationale")
        result.good[sid] = (str(label), None if conf is None else float(conf), cap_rationale(rationale) if isinstance(rationale, str) else None)
    return result


def cap_rationale(text: str, limit: int = MAX_RATIONALE_CHARS) -> str:
    """``text`` if at most ``limit`` characters, else its start and ``" … [rationale cut: N characters]"``
    (N = ``len(text)``), ``limit`` characters in all."""
    if len(text) <= limit:
        return text
    marker = f" … [rationale cut: {len(text)} characters]"
    return text[: max(limit - len(marker), 0)].rstrip() + marker


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
    retry_failed : bool, default True
        Re-runs ask again for segments stored as judge-failed, with ``max_attempts`` new tries
        continuing the stored attempt count (never replaying the stored failed answers); ``False``
        leaves them failed (counted as ``extra["failed_kept"]``).
    batch_poll_s : float, default 30
        Seconds between Batch API status polls.
    batch_requeue : {"interactive", "batch"}
        Where requests of a batch that ended expired/cancelled/failed go: finished interactively
        (default) or into a new batch (at most ``max_attempts`` batches per request).
    batch_max_requests, batch_max_bytes : int
        Per-batch limits (default: the Batch API's 50,000 requests and 200 MB); larger jobs are split.
    timeout : float, default 120
        Seconds per HTTP call (``--timeout``).
    sleep : coroutine function, optional
        Waits between retries and batch polls go through it (tests record instead of sleeping).
    config : JudgeConfig, optional
        All options at once, instead of keywords.

    Raises
    ------
    ConfigError
        An unknown option (``chunksize=3``), a value out of bounds, no API key for a remote endpoint,
        an unknown codebook.
    """

    source = "judge"

    def __init__(self, model: str, *, sleep: Sleep | None = None, config: JudgeConfig | None = None, **options: Any) -> None:
        if not model:
            raise ConfigError("the LLM judge needs a model: --judge openai:MODEL (e.g. openai:gpt-4.1-mini)")
        if config is not None and options:
            raise ConfigError("give the LLM judge either config=JudgeConfig(...) or keyword options, not both")
        cfg = config if config is not None else JudgeConfig.from_options(options)
        self.config = cfg
        self.model = model
        # OPENAI_BASE_URL is what the `openai` client itself falls back to: the key check, the provider
        # recorded and the output-limit field follow the endpoint the requests really go to.
        self.base_url = cfg.base_url or os.environ.get("OPENAI_BASE_URL") or None
        check_base_url(self.base_url)
        resolve_api_key(self.base_url)  # fail at construction, before any work, when no key is available
        self.book: Codebook = load_codebook(cfg.codebook)
        self.codebook_version = self.book.sha256
        self.mode = cfg.mode
        self.chunk_size = 1 if cfg.mode == "per-segment" else cfg.chunk_size
        self.concurrency = cfg.concurrency
        self.temperature = cfg.temperature if cfg.temperature is not None else (1.0 if cfg.samples > 1 else 0.0)
        self.seed = cfg.seed
        self.max_tokens = cfg.max_tokens
        self.samples = cfg.samples
        self.max_attempts = cfg.max_attempts
        self.context_tokens = cfg.context_tokens
        self.prices = load_prices(cfg.prices)
        self.retry_failed = cfg.retry_failed
        self.batch = cfg.batch or cfg.batch_id is not None
        self.batch_id = cfg.batch_id
        self.batch_poll_s = cfg.batch_poll_s
        self.timeout = cfg.timeout
        self.backoff_base = cfg.backoff_base
        self.sleep = sleep
        self.annotator = f"openai:{model}"
        self.response_format = response_format(LabelBatch)
        self.prompt_template_hash = sha256_text(template_hash() + json.dumps(self.response_format, sort_keys=True))
        self.system_prompt = system_message(self.book)
        # OpenAI's own API wants max_completion_tokens (reasoning models reject max_tokens); compatible
        # servers (vLLM, Ollama) all understand max_tokens.
        self._max_tokens_field = "max_completion_tokens" if self.base_url is None else "max_tokens"

    # ------------------------------------------------------------------ identity
    def annotator_for(self, sample: int) -> str:
        """Annotator id of sample ``sample`` (1-based): ``openai:MODEL`` then ``openai:MODEL@s2``, ..."""
        return self.annotator if sample == 1 else f"{self.annotator}@s{sample}"

    def declared_annotators(self) -> list[Annotator]:
        """One declared rater per sample (``openai:MODEL``, ``openai:MODEL@s2``, ...): model, provider
        (the base URL; the store scrubs secrets), temperature, samples, codebook and sampling seed."""
        return [
            Annotator(
                annotator=self.annotator_for(k), kind="machine", source="judge", model=self.model, provider=self.base_url,
                temperature=self.temperature, samples=self.samples, codebook_version=self.codebook_version,
                details={"sample": k, "seed": self.seed_for(k), "codebook": f"{self.book.name}@v{self.book.version}",
                         "mode": self.mode, "chunk_size": self.chunk_size, "batch": self.batch},
            )
            for k in range(1, self.samples + 1)
        ]

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
                  messages: list[dict[str, str]], *, prompt_sha: str | None = None, trace_sha: str | None = None) -> str:
        """sha256 of (codebook hash, prompt template hash, model, params, trace hash, segment ids, attempt, prompt hash).

        The hash of the rendered messages adds what the other parts miss: the problem text and the
        segment spans (a re-segmented trace must not hit the old answers). ``prompt_sha``, when
        given, is that hash already computed (:class:`.prompt.MessagesJson`): the sha256 of
        ``json.dumps(messages, ensure_ascii=False)``; ``trace_sha``, when given, is
        ``trace.text_sha256`` already computed (once per trace rather than per request).
        """
        if prompt_sha is None:
            prompt_sha = sha256_text(json.dumps(messages, ensure_ascii=False))
        return sha256_text(json.dumps(
            [self.codebook_version, self.prompt_template_hash, self.model, params, trace_sha or trace.text_sha256, list(ids), attempt,
             prompt_sha],
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

    def _known_json(self) -> "_KnownJson":
        """The encoder of the values every request body repeats (the response format, fixed per judge)."""
        known = self.__dict__.get("_known_json_cache")
        if known is None or known._known[0][0] is not self.response_format:
            known = self.__dict__["_known_json_cache"] = _KnownJson(self.response_format)
        return known

    # ------------------------------------------------------------------ hooks (the verifier overrides them)
    def render_trace_block(self, store: "Store", trace: Trace, segments: Sequence[SegmentLike]) -> str:
        """The per-trace cacheable ``<problem>``/``<trace>`` block (:func:`.prompt.trace_block`)."""
        return trace_block(trace, segments)

    def render_messages(self, trace: Trace, segments: Sequence[SegmentLike], ids: Sequence[int], *, max_tokens: int, block: str,
                        retry_problem: str | None = None) -> tuple[list[dict[str, str]], bool]:
        """``(messages, windowed)`` of one request for ``ids`` (:func:`.prompt.build_messages`)."""
        return build_messages(self.book, trace, segments, ids, context_tokens=self.context_tokens, max_tokens=max_tokens,
                              system=self.system_prompt, full_trace_block=block, retry_problem=retry_problem)

    def make_labels(self, trace: Trace, sample: int, run_id: str | None, result: ChunkResult, extra: dict[str, Any]) -> list[Label]:
        """The labels one validated answer yields (written by :meth:`commit_response`)."""
        annotator = self.annotator_for(sample)
        good = sorted(result.good.items())
        if not good:
            return []
        # The first label is validated; the others are its shallow copies with their own segment,
        # label, confidence and rationale (checked by validate_answer), sharing its ``extra`` dict
        # and time: a chunk's labels cost one validation, and the store writes the JSON of ``extra`` once.
        sid, (lab, conf, why) = good[0]
        first = Label(trace_id=trace.trace_id, segment_index=sid, label=lab, source="judge", annotator=annotator,
                      codebook_version=self.codebook_version, run_id=run_id, confidence=conf, rationale=why, extra=extra)
        return [first] + [first.model_copy(update={"segment_index": sid, "label": lab, "confidence": conf, "rationale": why})
                          for sid, (lab, conf, why) in good[1:]]

    # ------------------------------------------------------------------ store helpers
    def labeled_segments(self, store: "Store", trace_id: str, annotator: str) -> set[int]:
        """Segment indices of ``trace_id`` this annotator already labeled under this codebook (skipped on re-runs)."""
        return store.labelled_segment_indices(trace_id, annotator=annotator, codebook_version=self.codebook_version, source="judge")

    def failed_segments(self, store: "Store", trace_id: str, annotator: str) -> dict[int, tuple[int, str | None, str]]:
        """Segment index -> ``(attempts, cause, reason)`` for segments of ``trace_id`` this annotator left judge-failed."""
        return failed_segments_by_trace(store, [trace_id], annotator, self.codebook_version).get(trace_id, {})

    def cached_response(self, store: "Store", key: str) -> dict[str, Any] | None:
        """The stored response for a request cache key, or None (a cached response is never paid for again)."""
        return _cached_response(store, key)

    def writer(self, store: "Store") -> AnswerWriter:
        """The :class:`~.persist.AnswerWriter` of this judge's answers to ``store``."""
        return AnswerWriter(store, codebook_version=self.codebook_version, prompt_template_hash=self.prompt_template_hash,
                            model=self.model)

    def answer_record(self, *, trace: Trace, sample: int, run_id: str | None, cache_row: dict[str, Any] | None,
                      result: ChunkResult, failures: dict[int, str], attempts: int, extra: dict[str, Any],
                      cause: str | None = None, trace_sha256: str | None = None) -> Answer:
        """What one response writes (:class:`~.persist.Answer`): its cache row, its labels, any final failures.

        The labels are :meth:`make_labels`' objects, or, where that hook is this class's own, the same
        rows as columns (:class:`~.persist.LabelRows`: no Label object per segment)."""
        labels: list[Label] = []
        rows = None
        if type(self).make_labels is LLMJudge.make_labels:
            good = sorted(result.good.items())
            if good:
                rows = LabelRows(trace_id=trace.trace_id, annotator=self.annotator_for(sample), codebook_version=self.codebook_version,
                                 run_id=run_id, source="judge", extra=extra, created_at=utc_now(),
                                 segment_index=[sid for sid, _ in good], label=[g[0] for _, g in good],
                                 confidence=[g[1] for _, g in good], rationale=[g[2] for _, g in good])
        else:
            labels = self.make_labels(trace, sample, run_id, result, extra)
        return Answer(trace_id=trace.trace_id, trace_sha256=trace_sha256 or trace.text_sha256, annotator=self.annotator_for(sample), run_id=run_id,
                      cache_row=cache_row, labels=labels, failures=dict(failures), attempts=attempts, cause=cause, label_rows=rows)

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
        cause: str | None = None,
    ) -> None:
        """Write one response's cache row, its labels and any final failures (with their ``cause``) in one
        transaction, now (the Batch API ingest; interactive runs group their answers, :class:`~.persist.AnswerWriter`)."""
        self.writer(store).write(self.answer_record(trace=trace, sample=sample, run_id=run_id, cache_row=cache_row, result=result,
                                                    failures=failures, attempts=attempts, extra=extra, cause=cause))

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
        return run_interruptible(self.label_async(store, trace_ids, run=run, progress=progress))

    async def label_async(self, store: "Store", trace_ids: Sequence[str], *, run: "Run | None" = None,
                          progress: "Progress | None" = None, report: JudgeReport | None = None) -> JudgeReport:
        """:meth:`label` inside a running event loop (all store writes happen on this loop's thread).

        Raises
        ------
        StoreError
            ``E213``: called inside an open transaction or snapshot of ``store`` (the run reads and
            commits through handles of its own threads, which cannot see what that transaction has
            not committed).
        """
        if store.in_transaction:
            from ..errors import StoreError
            from ..store.connection import IN_TRANSACTION

            raise StoreError(
                f"the LLM judge cannot run inside an open transaction of {store.path}: it reads and commits on threads of its "
                "own, which do not see what the transaction has not committed. Run it outside store.transaction() "
                "(and outside read_snapshot())", code=IN_TRANSACTION,
            )
        ensure_judge_tables(store)
        report = report or JudgeReport()
        report.extra.setdefault("unsegmented_traces", 0)
        report.extra.setdefault("windowed_requests", 0)
        report.extra.setdefault("retries", dict.fromkeys(RETRY_CAUSES, 0))
        usage = UsageMeter(report, self.prices.get(self.model))
        report.extra["price"] = "known" if usage.price else "unknown"
        reconcile_run_ledger(store)  # runs an earlier process left unfinished (kill -9) get their totals back
        client = ChatClient(self.base_url, max_attempts=self.max_attempts, timeout=self.timeout,
                            backoff_base=self.backoff_base, sleep=self.sleep, connections=self.concurrency)
        ctx = _RunContext(store=store, run_id=run.run_id if run else None, client=client, usage=usage,
                          req_sem=asyncio.Semaphore(self.concurrency), progress=progress, writer=self.writer(store),
                          prefetch=_Prefetch(self, store, trace_ids),
                          cached_traces=cached_trace_ids(store, codebook_version=self.codebook_version,
                                                         prompt_template_hash=self.prompt_template_hash, model=self.model))
        if progress is not None:
            ctx.task = progress.add_task(f"judge {self.annotator}", total=self._count_pending(store, trace_ids))
        trace_sem = asyncio.Semaphore(max(2 * self.concurrency, 4))

        async def one(trace_id: str, sample: int) -> None:
            async with trace_sem:
                await self._judge_trace(ctx, trace_id, sample)

        ctx.prefetch.start()
        try:
            # A trace id given twice is judged once (two concurrent passes would send the same requests).
            unique = list(dict.fromkeys(trace_ids))
            with fewer_collections():  # a fifth of the run's CPU went to the collector with its defaults
                await asyncio.gather(*(one(t, k) for k in range(1, self.samples + 1) for t in unique))
        finally:
            report.extra["retries"]["transport"] += len(client.waits)
            if client.abandoned:
                # Sent and unanswered at an interrupt: the provider may bill them; their usage is unknown.
                report.extra["requests_abandoned"] = report.extra.get("requests_abandoned", 0) + client.abandoned
            try:
                await client.aclose()
            finally:
                try:
                    ctx.close_writer()
                finally:
                    try:
                        ctx.publish(final=True)
                    finally:
                        ctx.prefetch.close()
        return report

    def _count_pending(self, store: "Store", trace_ids: Sequence[str]) -> int:
        total = 0
        for k in range(1, self.samples + 1):
            annotator = self.annotator_for(k)
            failed = None if self.retry_failed else (
                "EXISTS (SELECT 1 FROM judge_failures f WHERE f.trace_id = s.trace_id AND f.segment_index = s.segment_index "
                "AND f.annotator = ? AND f.codebook_version = ?)", [annotator, self.codebook_version])
            total += store.count_unlabelled_segments(trace_ids, annotator=annotator, codebook_version=self.codebook_version,
                                                     source="judge", exclude=failed)
        return total

    async def _judge_trace(self, ctx: "_RunContext", trace_id: str, sample: int) -> None:
        taken = await ctx.prefetch.take(trace_id, self.annotator_for(sample))
        await ctx.prep_slot()
        prepared = self._prepare_trace(ctx, taken, sample)
        if prepared is None:
            return
        job, chunks = prepared
        # First request alone: the provider caches the shared prefix before the others arrive.
        await self._judge_chunk(ctx, job, chunks[0])
        await asyncio.gather(*(self._judge_chunk(ctx, job, c) for c in chunks[1:]))

    def _prepare_trace(self, ctx: "_RunContext", taken: "_Taken",
                       sample: int) -> "tuple[_TraceJob, list[list[int]]] | None":
        """The trace's job and its chunks of segment ids still to label (None: nothing to ask), from
        what :meth:`_Prefetch.take` gave."""
        store = ctx.store
        trace, segments, done, failed = taken
        if not segments:
            ctx.usage.report.extra["unsegmented_traces"] += 1
            return None
        ctx.usage.report.skipped += sum(1 for s in segments if s.segment_index in done)
        if not self.retry_failed:
            kept = {i for i in failed if i not in done}
            ctx.usage.report.extra["failed_kept"] = ctx.usage.report.extra.get("failed_kept", 0) + len(kept)
            done = done | kept
        chunks = [
            [s.segment_index for s in segments[i : i + self.chunk_size] if s.segment_index not in done]
            for i in range(0, len(segments), self.chunk_size)
        ]
        chunks = [c for c in chunks if c]
        if not chunks:
            return None
        if store.read_only:  # refused before the first (paid) request, not when its labels are stored
            from ..errors import StoreReadOnlyError

            raise StoreReadOnlyError(f"cannot store labels: the store {store.path} is open read-only, and trace "
                                     f"{trace.trace_id} has segments to label; open it for writing")
        job = _TraceJob(trace=trace, segments=segments, sample=sample, block=self.render_trace_block(store, trace, segments),
                        failed=failed)
        return job, chunks

    async def _judge_chunk(self, ctx: "_RunContext", job: "_TraceJob", ids: list[int]) -> None:  # noqa: C901  (one branch per failure class of a paid request (retry, fail, cache))
        """Ask for the labels of ``ids`` until each is labeled or has used its tries.

        A chunk whose ids all ended judge-failed in an earlier run continues from the stored attempt
        count (attempt ``n + 1`` onwards, ``max_attempts`` new tries): the stored unusable answers are
        not replayed, and the new requests differ from them in their cache key.
        """
        remaining = list(ids)
        max_tokens = self.default_max_tokens(len(ids))
        local_failure: str | None = None
        local_cause: str | None = None
        retry_problem: str | None = None
        attempt = 0
        prior = [job.failed.get(i) for i in remaining]
        if prior and all(p is not None for p in prior):
            # Continue where the earlier run stopped, with the request it would have sent next.
            attempt = min(p[0] for p in prior if p is not None)
            _, cause, reason = job.failed[remaining[0]]
            if cause == "truncated":
                max_tokens = min(max_tokens * 2**attempt, MAX_TOKENS_CAP)
            elif cause in ("parse", "refusal"):
                retry_problem = _RETRY_PROBLEMS[cause]
            elif cause == "invalid_ids":
                retry_problem = f"segment id {remaining[0]}: {reason[:200]}"
        limit = attempt + self.max_attempts
        while remaining and attempt < limit:
            if job.too_long is not None:
                # The trace's first request already hit the context limit.
                local_failure, local_cause = job.too_long, "context_length"
                break
            attempt += 1
            params = self.params(job.sample, max_tokens)
            messages, windowed = self.render_messages(job.trace, job.segments, remaining, max_tokens=max_tokens, block=job.block,
                                                      retry_problem=retry_problem)
            if job.encoder is None and messages and isinstance(messages[0], dict):
                job.encoder = MessagesJson(str(messages[0].get("content", "")), job.block)
            encoded = job.encoder.encode(messages) if job.encoder is not None else None
            key = self.cache_key(job.trace, remaining, params, attempt, messages, prompt_sha=encoded[1] if encoded else None,
                                 trace_sha=job.trace_sha256)
            cached = self.cached_response(ctx.store, key) if ctx.may_be_cached(job.trace.trace_id) else None
            cache_row = None
            if cached is not None:
                completion = completion_from_dict(cached)
                ctx.usage.report.cached_responses += 1
            else:
                try:
                    async with ctx.req_sem:
                        await ctx.room()
                        ctx.in_flight += 1
                        try:
                            body = self.request_body(messages, job.sample, max_tokens)
                            completion = await ctx.client.complete(
                                body, encoded=_body_bytes(body, messages, encoded[0], self._known_json()) if encoded else None,
                                what=f"trace {job.trace.trace_id} segments {remaining[0]}-{remaining[-1]}",
                            )
                        finally:
                            ctx.in_flight -= 1
                except RequestRejectedError as exc:
                    if not is_context_length_error(exc):
                        # A rejected key, model, URL or request shape is wrong for every request.
                        raise JudgeError(f"{exc.message}. Check --judge, --base-url and OPENAI_API_KEY", code=exc.code) from exc
                    local_cause = "context_length"
                    local_failure = job.too_long = (
                        f"trace too long for the judge model's context: {exc.message}. Set --context-tokens to the "
                        f"model's context window (now {self.context_tokens}; a smaller value leaves more room) to label "
                        "it through windows of segments"
                    )
                    break
                except RetriesExhaustedError as exc:
                    if exc.cause == "connection":
                        ctx.down_streak += 1
                        where = scrub_url(self.base_url) if self.base_url else "the OpenAI API"
                        if ctx.client.answered == 0:
                            # Nothing answered on any try of any request: a wrong --base-url or a server that
                            # is down, not a bad segment. Abort instead of writing every segment to judge_failures.
                            raise JudgeError(
                                f"cannot reach {where}: {exc.message.rstrip('.')}. Check --base-url and that the server is up; "
                                "labels stored so far are kept and the run resumes where it stopped",
                                code=exc.code,
                            ) from exc
                        if ctx.down_streak >= DOWN_AFTER_FAILED_REQUESTS:
                            raise JudgeError(
                                f"{where} stopped answering: the last {ctx.down_streak} requests found nothing answering on "
                                f"any of their tries ({exc.message.rstrip('.')}). Check that the server is up; labels stored so far "
                                "are kept and the run resumes where it stopped",
                                code=exc.code,
                            ) from exc
                        # A flaky connection (a proxy resetting some requests): that request fails alone.
                    else:
                        ctx.down_streak = 0  # something answered (a 5xx, a timeout after connecting)
                    local_failure, local_cause = str(exc), "transport"
                    break
                ctx.down_streak = 0
                cost = ctx.usage.add(completion)
                if windowed:
                    ctx.usage.report.extra["windowed_requests"] += 1
                cache_row = {"cache_key": key, "params": params, "ids": remaining, "attempt": attempt,
                             "response": completion.raw, "input_tokens": completion.input_tokens,
                             "cached_input_tokens": completion.cached_input_tokens,
                             "output_tokens": completion.output_tokens, "cost_usd": cost, "reasoning": completion.reasoning,
                             "usage_status": completion.usage_status}
            result, cause, retry_problem = self.judge_answer(completion, remaining)
            if cause == "truncated":
                # Never retry identically: a cut-off answer gets twice the output budget.
                max_tokens = min(max_tokens * 2, MAX_TOKENS_CAP)
            final = attempt >= limit
            extra = {"prompt_template_hash": self.prompt_template_hash, "model": self.model,
                     "response_model": completion.raw.get("model"), "codebook": self.book.versioned_name,
                     "params": params, "mode": self.mode, "chunk_size": self.chunk_size,
                     "attempt": attempt, "cache_key": key, "windowed": windowed}
            ctx.record(self.answer_record(trace=job.trace, sample=job.sample, run_id=ctx.run_id, cache_row=cache_row, result=result,
                                          failures=result.bad if final else {}, attempts=attempt, extra=extra, cause=cause,
                                          trace_sha256=job.trace_sha256))
            ctx.usage.report.labeled += len(result.good)
            if final:
                ctx.usage.report.failed += len(result.bad)
                if result.bad:
                    ctx.usage.report.extra.setdefault("failure_example", _shorten(scrub_text(next(iter(result.bad.values())))))
            elif result.bad and cause is not None:
                ctx.count_retry(cause)
            ctx.advance(len(result.good) + (len(result.bad) if final else 0))
            remaining = [i for i in remaining if i in result.bad]
        if local_failure is not None and remaining:
            # No answer to store: the failure rows are written alone.
            failures = {i: local_failure for i in remaining}
            ctx.record(self.answer_record(trace=job.trace, sample=job.sample, run_id=ctx.run_id, cache_row=None,
                                          result=ChunkResult(), failures=failures, attempts=attempt, extra={}, cause=local_cause,
                                          trace_sha256=job.trace_sha256))
            ctx.usage.report.failed += len(failures)
            ctx.usage.report.extra.setdefault("failure_example", _shorten(scrub_text(local_failure)))
            ctx.advance(len(failures))

    def judge_answer(self, completion: Completion, ids: list[int]) -> tuple[ChunkResult, str | None, str | None]:
        """``(result, retry cause, problem for the retry instruction)`` of one answer to a request for ``ids``.

        The cause is one of :data:`RETRY_CAUSES` (``None`` when every id was answered validly); the
        problem is ``None`` for a truncation (the retry differs by its doubled output budget).
        """
        try:
            result = validate_answer(parse_answer(completion), ids, self.book.labels)
        except TruncatedOutputError as exc:
            return ChunkResult(bad={i: str(exc) for i in ids}), "truncated", None
        except RefusalError as exc:
            return ChunkResult(bad={i: str(exc) for i in ids}), "refusal", _RETRY_PROBLEMS["refusal"]
        except ResponseParseError as exc:
            return ChunkResult(bad={i: str(exc) for i in ids}), "parse", _RETRY_PROBLEMS["parse"]
        if not result.bad:
            return result, None, None
        first = min(result.bad)
        return result, "invalid_ids", f"segment id {first}: {result.bad[first]}"


@dataclass
class _TraceJob:
    trace: Trace
    segments: list[SegmentLike]
    sample: int
    block: str
    #: Segment index -> (attempts, cause, reason), for segments an earlier run left judge-failed.
    failed: dict[int, tuple[int, str | None, str]] = field(default_factory=dict)
    #: Set when a request of this trace was refused as longer than the model's context.
    too_long: str | None = None
    #: The JSON of this trace's messages with their shared prefix encoded once (set by the first request).
    encoder: MessagesJson | None = None
    #: ``trace.text_sha256``, computed once for the trace's requests (a hash of the whole text).
    trace_sha256: str = ""

    def __post_init__(self) -> None:
        if not self.trace_sha256:
            self.trace_sha256 = self.trace.text_sha256


#: What :meth:`_Prefetch.take` gives for one trace and rater: the trace, its segments, its labelled
#: segment indices, and its judge-failed segments (index -> (attempts, cause, reason)).
_Taken = tuple[Trace, list[SegmentLike], set[int], dict[int, tuple[int, str | None, str]]]


@dataclass
class _Block:
    """What :class:`_Prefetch` read for one block of takes: traces, their segments (records built),
    and per ``(trace_id, annotator)`` the labelled and the judge-failed segments (own hooks only)."""

    traces: dict[str, Trace]
    segments: dict[str, list[SegmentLike]]
    done: dict[tuple[str, str], set[int]]
    failed: dict[tuple[str, str], dict[int, tuple[int, str | None, str]]]
    #: Takes of this block not made yet (the block is dropped at zero).
    left: int


class _Prefetch:
    """The per-trace reads of a run, on a reader thread ahead of their use.

    A run takes each trace once per sample, in a known order (every trace for sample 1, then for
    sample 2, ...). The takes are cut into blocks of :attr:`BLOCK`; a block is read in one query per
    table (the traces, their segments with their records built, and per annotator the labelled and
    judge-failed segments) by one reader thread with its own store handle
    (:meth:`~ror_annotate.store.Store.thread_handle`), and the next block is read while this one is
    used. The event loop never runs a read: a block read on the loop's thread (64 traces, 50-100 ms
    of DuckDB fetch and records) held back every answer and every send meanwhile.
    Hooks a subclass overrides (``labeled_segments``, ``failed_segments``) are called per trace on
    the loop's thread. Where the store gives no thread handle (read-only, or inside a transaction
    before its first commit) the blocks are read on the loop's thread, as before.
    """

    BLOCK = 64

    def __init__(self, judge: LLMJudge, store: "Store", trace_ids: Sequence[str]) -> None:
        self.judge, self.store = judge, store
        self.annotators = [judge.annotator_for(k) for k in range(1, judge.samples + 1)]
        order = list(dict.fromkeys(trace_ids))
        #: The takes in the order the run makes them, and each one's position.
        self.takes = [(t, a) for a in self.annotators for t in order]
        self.pos = {take: i for i, take in enumerate(self.takes)}
        self.own_done = type(judge).labeled_segments is LLMJudge.labeled_segments
        self.own_failed = type(judge).failed_segments is LLMJudge.failed_segments
        self.blocks: dict[int, asyncio.Future[_Block]] = {}
        self._executor: Any = None
        self._handle: "Store | None" = None

    def start(self) -> None:
        """Start the reader thread (on the loop's thread, before the first :meth:`take`)."""
        from concurrent.futures import ThreadPoolExecutor

        from ..errors import StoreError

        try:
            self._handle = self.store.thread_handle()
        except StoreError:  # read-only, or no handle yet (E211): blocks are read on the loop's thread
            self._handle = None
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ror-judge-reader")

    def close(self) -> None:
        """Stop the reader thread (waiting for a read under way) and close its store handle."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()
        for future in self.blocks.values():  # blocks read ahead and never taken (a run that stopped early)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: no "exception was never retrieved" log at exit
        self.blocks.clear()

    def _read(self, store: "Store", number: int) -> _Block:
        takes = self.takes[number * self.BLOCK : (number + 1) * self.BLOCK]
        ids = list(dict.fromkeys(t for t, _ in takes))
        traces = {t.trace_id: t for t in store.iter_traces(ids)}
        segments: dict[str, list[SegmentLike]] = {t: list(segment_rows_checked(rows)) for t, rows in store.segment_rows_by_trace(ids).items()}
        done: dict[tuple[str, str], set[int]] = {}
        failed: dict[tuple[str, str], dict[int, tuple[int, str | None, str]]] = {}
        judge = self.judge
        for annotator in dict.fromkeys(a for _, a in takes):
            mine = [t for t, a in takes if a == annotator]
            if self.own_done:
                got = store.labelled_indices_by_trace(mine, annotator=annotator, codebook_version=judge.codebook_version, source="judge")
                done.update(((t, annotator), got.get(t, set())) for t in mine)
            if self.own_failed:
                bad = failed_segments_by_trace(store, mine, annotator, judge.codebook_version)
                failed.update(((t, annotator), bad.get(t, {})) for t in mine)
        return _Block(traces=traces, segments=segments, done=done, failed=failed, left=len(takes))

    def _request(self, number: int) -> None:
        if number in self.blocks or number * self.BLOCK >= len(self.takes):
            return
        loop = asyncio.get_running_loop()
        if self._executor is None or self._handle is None:
            future: asyncio.Future[_Block] = loop.create_future()
            try:
                future.set_result(self._read(self.store, number))
            except Exception as exc:  # raised by the take that waits for it
                future.set_exception(exc)
        else:
            future = loop.run_in_executor(self._executor, self._read, self._handle, number)
        self.blocks[number] = future

    async def take(self, trace_id: str, annotator: str) -> "_Taken":
        """``(trace, segments, labelled indices, failed segments)`` of ``trace_id`` for ``annotator``;
        asks for the next block to be read.

        Raises
        ------
        StoreError
            No such trace in the store, or the read failed.
        SegmentationError
            A stored segment whose span does not match its text (a damaged store; E300, naming the
            segment). A take out of the run's order reads its segments as records: pydantic's
            ``ValidationError`` there.
        """
        position = self.pos.get((trace_id, annotator))
        if position is None:  # not a take of this run's order: read it alone
            return self._take_alone(trace_id, annotator)
        number = position // self.BLOCK
        self._request(number)
        self._request(number + 1)
        block = await self.blocks[number]
        block.left -= 1
        if block.left <= 0:
            self.blocks.pop(number, None)
        trace = block.traces.get(trace_id) or self.store.get_trace(trace_id)
        segments = block.segments.get(trace_id, [])
        done = block.done.pop((trace_id, annotator), None)
        if done is None:
            done = self.judge.labeled_segments(self.store, trace_id, annotator)
        failed = block.failed.pop((trace_id, annotator), None)
        if failed is None:
            failed = self.judge.failed_segments(self.store, trace_id, annotator)
        return trace, segments, done, failed

    def _take_alone(self, trace_id: str, annotator: str) -> "_Taken":
        trace = self.store.get_trace(trace_id)
        segments: list[SegmentLike] = list(self.store.segments(trace_id))
        return (trace, segments, self.judge.labeled_segments(self.store, trace_id, annotator),
                self.judge.failed_segments(self.store, trace_id, annotator))


@dataclass
class _RunContext:
    store: "Store"
    run_id: str | None
    client: ChatClient
    usage: UsageMeter
    req_sem: asyncio.Semaphore
    writer: AnswerWriter
    prefetch: _Prefetch
    #: Traces with stored responses of this judge when the run began (others need no cache lookup).
    cached_traces: set[str] = field(default_factory=set)
    progress: "Progress | None" = None
    task: Any = None
    _since_publish: int = 0
    _published_at: float = field(default_factory=time.monotonic)
    #: Requests in a row that found nothing answering on any try (reset by any answer).
    down_streak: int = 0
    #: Requests sent and not yet answered.
    in_flight: int = 0
    _timer: asyncio.TimerHandle | None = None
    _flush_error: BaseException | None = None
    #: The writer thread (started by the first group handed over; stopped by close_writer).
    committer: CommitThread | None = None
    #: Times a request waited for the writer thread to catch up (:meth:`room`).
    backpressure_waits: int = 0
    _closing: bool = False
    _publish_due: bool = False
    _room: asyncio.Event = field(default_factory=asyncio.Event)
    _prep_clock: float = field(default_factory=time.perf_counter)
    _prep_reset: bool = False

    def may_be_cached(self, trace_id: str) -> bool:
        """Whether a request of ``trace_id`` may have a stored response (else the lookup is skipped).

        Only responses stored before the run began count: within a run no request is sent twice
        (each trace and sample is judged once, and a retry differs from its first try in the attempt
        number of its cache key)."""
        return trace_id in self.cached_traces

    def record(self, answer: Answer) -> None:
        """Queue one answer's writes and hand the waiting group to the writer thread when due
        (:meth:`.persist.AnswerWriter.due`; with nothing else in flight, or a request slot free, as
        in the run's last moments, as soon as the writer thread is free), else once the group's time
        is up. The event loop never waits for a commit: while the writer thread
        (:class:`.persist.CommitThread`) writes one group, the answers that arrive form the next.

        Raises
        ------
        BaseException
            The error of an earlier group's commit (its answers, and this one, wait for the last
            flush of :meth:`close_writer`).
        """
        self.writer.add(answer)  # kept even when raising below: the last flush writes it (it was paid for)
        if self._flush_error is not None:
            raise self._flush_error
        self._hand_off()

    async def room(self) -> None:
        """Wait while :data:`MAX_WAITING_ANSWERS` answers wait for the writer thread (backpressure:
        requests stop being sent until it catches up)."""
        while self._flush_error is None and len(self.writer.pending) >= MAX_WAITING_ANSWERS and self.committer is not None \
                and self.committer.busy:
            self.backpressure_waits += 1
            self._room.clear()
            await self._room.wait()

    async def prep_slot(self) -> None:
        """Wait until preparing a trace may hold the event loop: at most about :data:`PREP_SLICE_S`
        of trace preparation per turn of the loop. At the start of a run hundreds of traces are
        admitted at once; preparing them all in one turn (reads, prompt blocks) would hold back
        every answer and every send for that long."""
        while time.perf_counter() - self._prep_clock > PREP_SLICE_S:
            if not self._prep_reset:
                self._prep_reset = True
                asyncio.get_running_loop().call_soon(self._reset_prep_clock)  # runs first in the next turn
            await asyncio.sleep(0)

    def _reset_prep_clock(self) -> None:
        self._prep_reset = False
        self._prep_clock = time.perf_counter()

    def _hand_off(self) -> None:
        committer = self.committer
        if self._closing or (committer is not None and committer.busy):
            return  # the group being written hands the next one over when it is done (_committed)
        publish = self._publish_due and self.run_id is not None
        # a free request slot: the run's tail (or a light run), where nothing overlaps a commit left for the end
        tail = bool(self.writer.pending) and not self.req_sem.locked()
        if publish or tail or self.writer.due(idle=self.in_flight == 0) or len(self.writer.pending) >= MAX_WAITING_ANSWERS:
            self._cancel_timers()
            if committer is None:
                committer = self.committer = CommitThread(self.writer, asyncio.get_running_loop(), self._committed)
            counts = (self.run_id, self.usage.report.as_counts()) if publish and self.run_id is not None else None
            self._publish_due = False
            committer.submit(self.writer.take(), counts)
        elif self._timer is None and self.writer.pending:
            self._timer = asyncio.get_running_loop().call_later(self.writer.wait_s(), self._on_timer)

    def _committed(self, group: list[Answer], seconds: float, error: BaseException | None) -> None:
        if error is None:
            self.writer.committed(len(group), seconds)
        else:  # nothing of the group was written: its answers wait for the next try, the error is raised by record()
            self.writer.pending[:0] = group
            self._flush_error = error
        self._room.set()
        self._hand_off()

    def _cancel_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        self._hand_off()

    def close_writer(self) -> None:
        """Commit every waiting answer (the end of a run, also an interrupted or failed one): wait for
        the group the writer thread holds, stop it, then write the rest on this thread."""
        self._closing = True
        self._cancel_timers()
        committer, self.committer = self.committer, None
        if committer is not None:
            try:
                committer.wait()
            finally:
                committer.close()
        error, self._flush_error = self._flush_error, None
        self.writer.flush()
        if error is not None:
            raise error

    def count_retry(self, cause: str) -> None:
        """Count one re-ask of a request, by cause (:data:`RETRY_CAUSES`)."""
        retries = self.usage.report.extra.setdefault("retries", dict.fromkeys(RETRY_CAUSES, 0))
        retries[cause] = retries.get(cause, 0) + 1

    def advance(self, n: int) -> None:
        """Move the progress bar and store live counts in ``runs`` (every 20 updates, at most once a second)."""
        r = self.usage.report
        if self.progress is not None and self.task is not None:
            self.progress.update(
                self.task, advance=n,
                description=f"judge · {r.requests} req · {r.input_tokens / 1000:.0f}k in ({r.cached_input_tokens / 1000:.0f}k cached) "
                f"· {r.output_tokens / 1000:.0f}k out · ${r.cost_usd:.4f}",
            )
        self._since_publish += 1
        if self._since_publish >= 20 and time.monotonic() - self._published_at >= 1.0:
            self.publish()

    def publish(self, final: bool = False) -> None:
        """Store the live counts in ``runs``; the final call replaces the usage totals with the
        ledger of the responses stored for the run (:func:`run_ledger`)."""
        self._since_publish = 0
        self._published_at = time.monotonic()
        if self.run_id is None:
            return
        if not final and not self._closing:
            # stored by the writer thread after the answers counted so far are committed
            self._publish_due = True
            self._hand_off()
            return
        counts = self.usage.report.as_counts()
        if final:
            ledger = run_ledger(self.store, self.run_id)
            if ledger["requests"]:
                counts.update(ledger)
        self.store.update_run_counts(self.run_id, counts)


def _body_bytes(body: dict[str, Any], messages: list[dict[str, str]], messages_json: bytes,
                known: "_KnownJson | None" = None) -> bytes | None:
    """``body`` as JSON bytes, its ``messages`` given as their JSON (:class:`.prompt.MessagesJson`);
    ``None`` when ``body`` does not hold these messages. The bytes equal ``json.dumps(body,
    ensure_ascii=False)`` with ``messages`` moved first. ``known`` encodes the rest of the body once
    per distinct set of parameters (the response-format schema alone was a tenth of the event loop's
    time per request when it was encoded each time)."""
    if body.get("messages") is not messages:
        return None
    tail = known.tail(body) if known is not None else _tail(body, lambda v: json.dumps(v, ensure_ascii=False))
    return b'{"messages": ' + messages_json + tail


def _tail(body: dict[str, Any], dumps: Any) -> bytes:
    # json.dumps of a dict: '{' + ', '.join('"key": value') + '}' (the default separators)
    parts = [json.dumps(k, ensure_ascii=False) + ": " + dumps(v) for k, v in body.items() if k != "messages"]
    return (", " + ", ".join(parts) + "}" if parts else "}").encode("utf-8")


class _KnownJson:
    """The JSON of the part of a request body other than its messages, encoded once per distinct
    parameters (model, temperature, output budget, seed: a few dozen in a run) and per object the
    judge sends in every body (the response-format schema). The objects are held here (so an identity
    match is never a reused id) and must not change after they are registered."""

    #: Most distinct tails kept (a new one past it is encoded and not kept).
    MAX_TAILS = 512

    def __init__(self, *objects: Any) -> None:
        self._known = [(o, json.dumps(o, ensure_ascii=False)) for o in objects]
        self._tails: dict[tuple[Any, ...], bytes] = {}

    def dumps(self, value: Any) -> str:
        """``json.dumps(value, ensure_ascii=False)``, from the stored encoding for a registered object."""
        for obj, text in self._known:
            if value is obj:
                return text
        return json.dumps(value, ensure_ascii=False)

    def tail(self, body: dict[str, Any]) -> bytes:
        """The body's JSON after its messages: ``, "key": value, ...}`` (``}`` alone for no other key)."""
        key = self._key(body)
        if key is None:
            return _tail(body, self.dumps)
        tail = self._tails.get(key)
        if tail is None:
            tail = _tail(body, self.dumps)
            if len(self._tails) < self.MAX_TAILS:
                self._tails[key] = tail
        return tail

    def _key(self, body: dict[str, Any]) -> tuple[Any, ...] | None:
        # A value is its own key when JSON encodes it one way only: a str, an int or None of exact
        # type (True == 1 and 1.0 == 1 hash alike but encode differently), a float by its repr; a
        # registered object is keyed by its position here; anything else is not cached.
        key: list[Any] = []
        for k, v in body.items():
            if k == "messages":
                continue
            t = type(v)
            if t is str or t is int or v is None:
                key.append((k, t, v))
                continue
            if t is float:
                key.append((k, t, repr(v)))  # 0.0 and -0.0 are equal and hash alike, but encode apart
                continue
            for n, (obj, _) in enumerate(self._known):
                if v is obj:
                    key.append((k, "known", n))
                    break
            else:
                return None
        return tuple(key)


def _shorten(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


@register_judge("openai")
def make_openai_judge(model: str | None, **options: Any) -> LLMJudge:
    """Factory for ``--judge openai:MODEL``: see :class:`LLMJudge` for the options."""
    if not model:
        raise ConfigError("the openai judge needs a model name: --judge openai:MODEL (e.g. openai:gpt-4.1-mini)")
    return LLMJudge(model, **options)

"""The LLM judge's persistence: its tables, the response cache, failures, the cost ledger, and the
writer that commits answers in groups.

Used by the interactive judge (:mod:`.llm`), the Batch API path (:mod:`.batch`) and the verifier;
it imports neither of them, so ``llm`` and ``batch`` no longer import each other.

Exactly-once bookkeeping: every paid response is stored in ``judge_cache`` in the same transaction
as the labels and failure rows it yields (an :class:`Answer`). :class:`AnswerWriter` holds answers
for a moment and commits them together (group commit): with several requests in flight it commits
at most every :data:`COMMIT_EVERY_S` seconds (longer, up to :data:`MAX_COMMIT_GAP_S`, when a commit
takes more than a ninth of that) or every :data:`COMMIT_EVERY_ANSWERS` answers, and at once whenever
no other request is in flight, so a slow or sequential run commits each answer as it arrives, as
before. An interactive run commits on a writer thread (:class:`CommitThread`, its own store handle
from :meth:`Store.thread_handle <ror_annotate.store.Store.thread_handle>`), one group at a time,
while its event loop goes on sending and reading; the end of a run (also an interrupted or failed
one) waits for that group and commits the rest. A process killed with SIGKILL loses at most the
answers of the last second or so (they are asked again on the next run, never half-written); every
committed answer is replayed from the cache, never paid twice.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

from ..provenance import scrub_text
from ..records import Label, utc_now
from ..store import to_naive_utc
from . import JudgeReport
from .client import Completion
from .pricing import Price, cost_usd

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

#: Group commit: with other requests in flight, answers wait at most this long (seconds) ...
COMMIT_EVERY_S = 0.2
#: ... or until this many are waiting, before one transaction writes them all.
COMMIT_EVERY_ANSWERS = 512
#: The longest wait between commits when a commit is slow (:attr:`AnswerWriter.gap_s`), in seconds.
MAX_COMMIT_GAP_S = 1.0

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
    # v2: the judge's reasoning text kept with its response; what a closed batch left behind; why a
    # segment failed (a RETRY_CAUSES name or "context_length"), so a re-run changes its request.
    """
    ALTER TABLE judge_cache ADD COLUMN reasoning VARCHAR;
    ALTER TABLE judge_batches ADD COLUMN output_file_id VARCHAR;
    ALTER TABLE judge_batches ADD COLUMN error_file_id VARCHAR;
    ALTER TABLE judge_batches ADD COLUMN outcome VARCHAR;
    ALTER TABLE judge_failures ADD COLUMN cause VARCHAR;
    """,
)

#: The cost ledger's own migrations (component ``judge_ledger``, applied after :data:`JUDGE_MIGRATIONS`):
#: unknown usage is stored as NULL, never as 0, with why it is unknown (``usage_status``: ``ok``,
#: ``missing`` or ``invalid: ...``, see :func:`.client.read_usage`).
LEDGER_MIGRATIONS: tuple[str, ...] = (
    """
    ALTER TABLE judge_cache ALTER COLUMN input_tokens DROP NOT NULL;
    ALTER TABLE judge_cache ALTER COLUMN cached_input_tokens DROP NOT NULL;
    ALTER TABLE judge_cache ALTER COLUMN output_tokens DROP NOT NULL;
    ALTER TABLE judge_cache ALTER COLUMN cost_usd DROP NOT NULL;
    ALTER TABLE judge_cache ADD COLUMN usage_status VARCHAR;
    """,
)

_CACHE_COLUMNS = ("cache_key", "annotator", "codebook_version", "prompt_template_hash", "model", "params", "trace_id", "trace_sha256",
                  "segment_ids", "attempt", "response", "input_tokens", "cached_input_tokens", "output_tokens", "cost_usd",
                  "created_at", "run_id", "reasoning", "usage_status")
_CACHE_TYPES = ("VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "INTEGER",
                "VARCHAR", "INTEGER", "INTEGER", "INTEGER", "DOUBLE", "TIMESTAMP", "VARCHAR", "VARCHAR", "VARCHAR")

# The writer's JSON encoders, made once: json.dumps with any non-default option builds a JSONEncoder
# per call, about 2 us each time on the writer thread (GIL held). Same output as json.dumps with
# these options.
#: ``json.dumps(params, sort_keys=True)`` (judge_cache.params)
_PARAMS_JSON = json.JSONEncoder(sort_keys=True)
#: ``json.dumps(response, ensure_ascii=False)`` (judge_cache.response)
_RESPONSE_JSON = json.JSONEncoder(ensure_ascii=False)
#: ``json.dumps(extra, ensure_ascii=False, default=str)`` (labels.extra, as Store.upsert_labels writes it)
_EXTRA_JSON = json.JSONEncoder(ensure_ascii=False, default=str)


def ensure_judge_tables(store: "Store") -> None:
    """Create or upgrade the judge's tables, and declare them to the store: cached responses and
    failures of a trace are derived from its segments, so re-segmenting the trace deletes them."""
    store.migrate("judge", JUDGE_MIGRATIONS)
    store.migrate("judge_ledger", LEDGER_MIGRATIONS)
    for table in ("judge_cache", "judge_failures"):
        store.register_trace_dependent(table, "cascade", component="judge")


def store_now() -> Any:
    """The current time in the store's TIMESTAMP convention (naive UTC, :func:`~ror_annotate.store.to_naive_utc`)."""
    return to_naive_utc(utc_now())


# ---------------------------------------------------------------------------------------- reads
def cached_response(store: "Store", key: str) -> dict[str, Any] | None:
    """The stored response body for a request cache key, or None (a cached response is never paid for again)."""
    row = store.execute("SELECT response FROM judge_cache WHERE cache_key = ?", [key]).fetchone()
    return json.loads(row[0]) if row else None


def cached_trace_ids(store: "Store", *, codebook_version: str, prompt_template_hash: str, model: str) -> set[str]:
    """Trace ids with any stored response of this codebook, prompt template and model.

    A request's cache key hashes these three (:meth:`.llm.LLMJudge.cache_key`), so a trace outside
    this set has no stored response for any request of this judge: its lookups can be skipped.
    """
    rows = store.execute(
        "SELECT DISTINCT trace_id FROM judge_cache WHERE codebook_version = ? AND prompt_template_hash = ? AND model = ?",
        [codebook_version, prompt_template_hash, model],
    ).fetchall()
    return {r[0] for r in rows}


def failed_segments(store: "Store", trace_id: str, annotator: str, codebook_version: str) -> dict[int, tuple[int, str | None, str]]:
    """Segment index -> ``(attempts, cause, reason)`` of the segments of ``trace_id`` this annotator left judge-failed."""
    return failed_segments_by_trace(store, [trace_id], annotator, codebook_version).get(trace_id, {})


def failed_segments_by_trace(store: "Store", trace_ids: Sequence[str], annotator: str,
                             codebook_version: str) -> dict[str, dict[int, tuple[int, str | None, str]]]:
    """:func:`failed_segments` of many traces in one query (traces without failures are absent)."""
    rows = store.execute(
        "SELECT trace_id, segment_index, attempts, cause, reason FROM judge_failures WHERE trace_id IN (SELECT unnest(?::VARCHAR[])) "
        "AND annotator = ? AND codebook_version = ?",
        [list(trace_ids), annotator, codebook_version],
    ).fetchall()
    out: dict[str, dict[int, tuple[int, str | None, str]]] = {}
    for tid, index, attempts, cause, reason in rows:
        out.setdefault(tid, {})[int(index)] = (int(attempts), cause, reason)
    return out


# ---------------------------------------------------------------------------------------- writes
@dataclass
class Answer:
    """What one response (or one local failure) writes, in one transaction with the others of its group.

    ``cache_row`` holds the paid response (keys ``cache_key``, ``params``, ``ids``, ``attempt``,
    ``response``, ``input_tokens``, ``cached_input_tokens``, ``output_tokens``, ``cost_usd``,
    ``reasoning``, ``usage_status``), ``None`` for a replayed or local one; ``labels`` the labels
    it yields (their segments' failure rows are deleted); ``failures`` maps segment index -> reason
    for segments that used their last try (``attempts`` tries, ``cause`` why).
    """

    trace_id: str
    trace_sha256: str
    annotator: str
    run_id: str | None
    cache_row: dict[str, Any] | None = None
    labels: list[Label] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)
    attempts: int = 0
    cause: str | None = None
    #: The judge's own labels as columns (written as ``labels`` would be, without a Label object each).
    label_rows: "LabelRows | None" = None


@dataclass
class LabelRows:
    """The labels of one answer as columns: what :meth:`.llm.LLMJudge.make_labels` would give as
    :class:`~ror_annotate.records.Label` objects (one ``created_at`` and one ``extra`` dict for the
    answer), without an object per segment. :class:`AnswerWriter` writes them through
    :meth:`Store.upsert_label_table <ror_annotate.store.Store.upsert_label_table>`, which checks the
    rows as a whole (label names, confidence in [0, 1], non-empty ids) and computes nothing else:
    the stored rows equal those of ``store.upsert_labels(labels)``.

    Attributes
    ----------
    segment_index, label, confidence, rationale : list, length n
        One entry per labelled segment (labels already checked against the codebook, confidences
        in [0, 1] or None, rationales capped).
    """

    trace_id: str
    annotator: str
    codebook_version: str
    run_id: str | None
    source: str
    extra: dict[str, Any]
    created_at: Any
    segment_index: list[int]
    label: list[str]
    confidence: list[float | None]
    rationale: list[str | None]


def label_table(rows: Sequence[LabelRows]) -> Any:
    """One Arrow table (``LABEL_TABLE_SCHEMA``, one row per label, answers in order) of several
    answers' :class:`LabelRows`; of rows that repeat a label id the last one is kept (as
    :meth:`Store.upsert_labels` does).

    Built column by column: each per-segment column is the answers' lists concatenated into one
    Arrow array, and each per-answer value (trace, annotator, run, ``created_at``, the ``extra``
    JSON) one array of one entry per answer spread over its rows with ``take``, so the Python work
    is per answer, not per label (the writer thread holds the GIL for it; the event loop needs it).
    """
    import pyarrow as pa

    from ..records import label_ids
    from ..store.schema import LABEL_TABLE_SCHEMA

    ids: list[str] = []
    for r in rows:
        ids += label_ids(r.trace_id, r.segment_index, source=r.source, annotator=r.annotator, codebook_version=r.codebook_version)
    n = len(ids)
    # which answer each row comes from (a list, not numpy: pyarrow imports pandas to look at a numpy array)
    owner = pa.array(list(chain.from_iterable([k] * len(r.segment_index) for k, r in enumerate(rows))), type=pa.int32())

    def per_segment(name: str, type_: Any) -> Any:
        return pa.array(list(chain.from_iterable(getattr(r, name) for r in rows)), type=type_)

    def per_answer(values: list[Any], type_: Any) -> Any:
        return pa.array(values, type=type_).take(owner)

    string = pa.string()
    table = pa.table({
        "label_id": pa.array(ids, type=string),
        "trace_id": per_answer([r.trace_id for r in rows], string),
        "segment_index": per_segment("segment_index", pa.int32()),
        "label": per_segment("label", string),
        "source": per_answer([r.source for r in rows], string),
        "annotator": per_answer([r.annotator for r in rows], string),
        "codebook_version": per_answer([r.codebook_version for r in rows], string),
        "run_id": per_answer([r.run_id for r in rows], string),
        "study": pa.nulls(n, type=string),
        "confidence": per_segment("confidence", pa.float64()),
        "rationale": per_segment("rationale", string),
        "created_at": per_answer([to_naive_utc(r.created_at) for r in rows], pa.timestamp("us")),
        "extra": per_answer([_EXTRA_JSON.encode(r.extra) for r in rows], string),
        "distribution": pa.nulls(n, type=pa.list_(pa.float64())),
    }, schema=LABEL_TABLE_SCHEMA)
    if len(set(ids)) < n:
        # a label id repeated (a segment labelled twice in one group): keep the last row of each, in order
        keep = sorted({label_id: i for i, label_id in enumerate(ids)}.values())
        table = table.take(pa.array(keep, type=pa.int64()))
    return table


class AnswerWriter:
    """Commits :class:`Answer` s to the store in groups (see the module docstring).

    Parameters
    ----------
    store : Store
    codebook_version, prompt_template_hash, model : str
        Written on every ``judge_cache`` row.
    every_s : float, default :data:`COMMIT_EVERY_S`
        Longest wait, in seconds, of an answer while other requests are in flight.
    every_answers : int, default :data:`COMMIT_EVERY_ANSWERS`
        Answers that trigger a commit at once.

    Attributes
    ----------
    commits, written : int
        Transactions committed and answers written so far (the benchmark reports them).
    commit_s : float
        Seconds spent in those transactions.
    """

    def __init__(self, store: "Store", *, codebook_version: str, prompt_template_hash: str, model: str,
                 every_s: float = COMMIT_EVERY_S, every_answers: int = COMMIT_EVERY_ANSWERS) -> None:
        self.store = store
        self.codebook_version = codebook_version
        self.prompt_template_hash = prompt_template_hash
        self.model = model
        self.every_s = every_s
        self.every_answers = every_answers
        self.pending: list[Answer] = []
        self.last_commit = float("-inf")
        self.commits = 0
        self.written = 0
        self.commit_s = 0.0
        self.last_commit_s = 0.0
        #: ``(trace_id, annotator)`` pairs that may have ``judge_failures`` rows of this codebook version:
        #: those the table held at this writer's first group with labels, and those it wrote since
        #: (None until then; see :meth:`_delete_failures_of_labelled`).
        self._failed_pairs: set[tuple[str, str]] | None = None

    def add(self, answer: Answer) -> None:
        """Hold ``answer`` for the next :meth:`flush`."""
        self.pending.append(answer)

    @property
    def gap_s(self) -> float:
        """Least time between two commits while requests are in flight: :attr:`every_s`, or nine times
        the last commit's duration when that is longer (capped at :data:`MAX_COMMIT_GAP_S`), so that
        commits take at most about a tenth of the time on a slow or busy machine."""
        return min(max(self.every_s, 9.0 * self.last_commit_s), max(self.every_s, MAX_COMMIT_GAP_S))

    def due(self, *, idle: bool) -> bool:
        """Whether the waiting answers should be committed now: nothing else in flight (``idle``), the
        last commit :attr:`gap_s` ago or more, or :attr:`every_answers` waiting."""
        if not self.pending:
            return False
        return idle or len(self.pending) >= self.every_answers or time.monotonic() - self.last_commit >= self.gap_s

    def wait_s(self) -> float:
        """Seconds until the waiting answers are due by time (0 when they are)."""
        return max(self.gap_s - (time.monotonic() - self.last_commit), 0.0)

    def write(self, answer: Answer) -> None:
        """Commit ``answer`` (with any waiting ones) now."""
        self.add(answer)
        self.flush()

    def take(self) -> list[Answer]:
        """Remove and return the waiting answers (for :meth:`write_group` on another thread)."""
        group, self.pending = self.pending, []
        return group

    def committed(self, n: int, seconds: float) -> None:
        """Count one committed group of ``n`` answers that took ``seconds`` (sets :attr:`last_commit` to now)."""
        self.last_commit = time.monotonic()
        self.commits += 1
        self.written += n
        self.last_commit_s = seconds
        self.commit_s += seconds

    def flush(self) -> int:
        """Write every waiting answer in one transaction; returns how many. On an error nothing of
        the group is written and the answers stay waiting (the error propagates)."""
        if not self.pending:
            return 0
        group = self.pending
        t0 = time.perf_counter()
        self.write_group(self.store, group)
        self.pending = []
        self.committed(len(group), time.perf_counter() - t0)
        return len(group)

    def write_group(self, store: "Store", group: Sequence[Answer]) -> None:
        """Write ``group`` in one transaction of ``store`` (this writer's store, or a thread handle of
        it: :meth:`Store.thread_handle <ror_annotate.store.Store.thread_handle>`); nothing of the
        group is written if it raises. Reads no state of the writer but its constructor arguments and
        the pairs that may have failure rows (:meth:`_delete_failures_of_labelled`), which only this
        method keeps, one group at a time; so it may run on a writer thread while the event loop adds
        answers.

        Raises
        ------
        StoreError
            DuckDB refused a statement or the commit (the transaction is rolled back).
        """
        if not group:
            return
        now = store_now()
        cache = [a for a in group if a.cache_row is not None]
        labels = [lab for a in group for lab in a.labels]
        label_rows = [a.label_rows for a in group if a.label_rows is not None and a.label_rows.segment_index]
        table = label_table(label_rows) if label_rows else None
        with store.transaction():
            if cache:
                values = [self._cache_values(a, now) for a in cache]
                select = ", ".join(f"unnest(?::{t}[])" for t in _CACHE_TYPES)
                store.execute(f"INSERT INTO judge_cache ({', '.join(_CACHE_COLUMNS)}) SELECT {select} ON CONFLICT DO NOTHING",
                              [list(c) for c in zip(*values, strict=True)])
                # the paid responses also go to the commit journal, which outlives a write-ahead log cut short
                created_at = now.isoformat()
                for v in values:
                    note = dict(zip(_CACHE_COLUMNS, v, strict=True))
                    note["created_at"] = created_at  # keeps its place among the columns
                    store.journal_note("judge_cache", note)
            if labels:
                store.upsert_labels(labels)
            if table is not None:
                store.upsert_label_table(table)
            if labels or table is not None:
                self._delete_failures_of_labelled(store, table, group)
            rows = [(a, i) for a in group for i in sorted(a.failures)]
            if rows:
                # One statement for all rows (unnest zips the lists): a long trace that fails as a whole has
                # hundreds of segments, and one INSERT each took ~10 ms.
                store.execute(
                    "INSERT OR REPLACE INTO judge_failures (trace_id, segment_index, annotator, codebook_version, reason, attempts, "
                    "run_id, created_at, cause) SELECT unnest(?::VARCHAR[]), unnest(?::INTEGER[]), unnest(?::VARCHAR[]), ?, "
                    "unnest(?::VARCHAR[]), unnest(?::INTEGER[]), unnest(?::VARCHAR[]), ?, unnest(?::VARCHAR[])",
                    [[a.trace_id for a, _ in rows], [i for _, i in rows], [a.annotator for a, _ in rows], self.codebook_version,
                     [scrub_text(a.failures[i])[:2000] for a, i in rows], [a.attempts for a, _ in rows], [a.run_id for a, _ in rows],
                     now, [a.cause for a, _ in rows]],
                )
                if self._failed_pairs is not None:
                    self._failed_pairs.update((a.trace_id, a.annotator) for a in group if a.failures)

    def _delete_failures_of_labelled(self, store: "Store", table: Any, group: Sequence[Answer]) -> None:
        """Delete the ``judge_failures`` rows of the segments this group labels (of this codebook version).

        Skipped when no labelled answer's ``(trace_id, annotator)`` can have a failure row: the
        pairs the table held at this writer's first group with labels (one query, in that group's
        transaction), plus those this writer has written failure rows for since. A run's answers
        rarely meet a failure row (only segments that failed in an earlier run and are asked again),
        so most groups run no statement here. This assumes that while the writer lives (one run) no
        other writer adds failure rows of its annotators and codebook version, as one judge run per
        annotator at a time guarantees.

        Otherwise the keys are the label table's own columns (``table``: :func:`label_table` of the
        group's :class:`LabelRows`, or None), joined in SQL, so no Python tuple is made per label;
        the :class:`~ror_annotate.records.Label` objects of answers that carry them add theirs.
        """
        import pyarrow as pa

        if self._failed_pairs is None:
            rows = store.execute("SELECT DISTINCT trace_id, annotator FROM judge_failures WHERE codebook_version = ?",
                                 [self.codebook_version]).fetchall()
            self._failed_pairs = {(r[0], r[1]) for r in rows}
        pairs = self._failed_pairs
        labelled = [(a.trace_id, a.annotator) for a in group if a.labels]
        labelled += [(a.label_rows.trace_id, a.label_rows.annotator) for a in group if a.label_rows is not None]
        if pairs.isdisjoint(labelled):
            return
        parts = [table.select(["trace_id", "segment_index", "annotator"])] if table is not None else []
        objects = [(a.annotator, lab) for a in group for lab in a.labels]
        if objects:
            # keyed by the answer's trace and annotator, as the labels' own may differ (a custom make_labels)
            parts.append(pa.table({"trace_id": pa.array([a.trace_id for a in group for _ in a.labels], type=pa.string()),
                                   "segment_index": pa.array([lab.segment_index for _, lab in objects], type=pa.int32()),
                                   "annotator": pa.array([ann for ann, _ in objects], type=pa.string())}))
        keys = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        view = f"_ror_labelled_{uuid.uuid4().hex[:8]}"
        store._register(view, keys)
        try:
            store.execute(
                f"DELETE FROM judge_failures f USING {view} d WHERE f.trace_id = d.trace_id AND f.segment_index = d.segment_index "
                "AND f.annotator = d.annotator AND f.codebook_version = ?",
                [self.codebook_version],
            )
        finally:
            store._unregister(view)

    def _cache_values(self, a: Answer, now: Any) -> tuple[Any, ...]:
        row = a.cache_row
        assert row is not None
        known = row.get("usage_status", "ok") == "ok"
        usage = [row[k] if known else None for k in ("input_tokens", "cached_input_tokens", "output_tokens")]
        return (row["cache_key"], a.annotator, self.codebook_version, self.prompt_template_hash, self.model,
                _PARAMS_JSON.encode(row["params"]), a.trace_id, a.trace_sha256, json.dumps(row["ids"]), row["attempt"],
                _RESPONSE_JSON.encode(row["response"]), *usage, row["cost_usd"], now, a.run_id, row.get("reasoning"),
                row.get("usage_status", "ok"))


class CommitThread:
    """One writer thread that commits groups of answers off the event loop, through its own store
    handle (:meth:`Store.thread_handle <ror_annotate.store.Store.thread_handle>`).

    The event loop hands over one group at a time (:meth:`submit`) and keeps sending requests while
    the thread writes it; the answers that arrive meanwhile wait in the :class:`AnswerWriter` and
    form the next group. When a group is written (or fails), its outcome is passed to ``on_done``
    on the loop's thread: ``on_done(group, seconds, error)``, ``error`` ``None`` on success and the
    exception otherwise (nothing of the group is then written).

    Parameters
    ----------
    writer : AnswerWriter
        Its :meth:`~AnswerWriter.write_group` writes each group; its store gives the thread handle.
    loop : asyncio.AbstractEventLoop
        The loop ``on_done`` runs on.
    on_done : callable
        ``on_done(group: list[Answer], seconds: float, error: BaseException | None) -> None``.

    Attributes
    ----------
    busy : bool
        A group was handed over and its outcome not yet passed to ``on_done``.
    """

    def __init__(self, writer: AnswerWriter, loop: Any, on_done: Any) -> None:
        self.writer = writer
        self.handle = writer.store.thread_handle()
        self.busy = False
        self._loop = loop
        self._on_done = on_done
        self._jobs: queue.SimpleQueue[tuple[list[Answer], tuple[str, dict[str, Any]] | None] | None] = queue.SimpleQueue()
        self._outcome: tuple[list[Answer], float, BaseException | None] | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ror-judge-writer", daemon=True)
        self._thread.start()

    def submit(self, group: list[Answer], counts: tuple[str, dict[str, Any]] | None = None) -> None:
        """Hand ``group`` to the thread (one at a time: not while :attr:`busy`); ``counts``
        (``(run_id, counts)``) are stored in ``runs`` once the group is committed, so the live counts
        never run ahead of what is committed."""
        assert not self.busy, "one group at a time"
        self.busy = True
        self._jobs.put((group, counts))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            group, counts = job
            t0 = time.perf_counter()
            error: BaseException | None = None
            try:
                self.writer.write_group(self.handle, group)
                if counts is not None:
                    self.handle.update_run_counts(*counts)
            except BaseException as exc:  # passed to the loop's thread, raised there
                error = exc
            self._outcome = (group, time.perf_counter() - t0, error)
            self._done.set()
            try:
                self._loop.call_soon_threadsafe(self.collect)
            except RuntimeError:
                pass  # the loop is closed: wait() collects it

    def collect(self) -> None:
        """Pass a finished group's outcome to ``on_done`` (on the loop's thread; does nothing if none)."""
        if not self._done.is_set():
            return
        outcome, self._outcome = self._outcome, None
        self._done.clear()
        if outcome is None:
            return
        self.busy = False
        self._on_done(*outcome)

    def wait(self) -> None:
        """Block until the group handed over is written, then :meth:`collect` it (the end of a run)."""
        if self.busy:
            self._done.wait()
            self.collect()

    def close(self) -> None:
        """Stop the thread once it has written what it holds, and close its store handle."""
        self._jobs.put(None)
        self._thread.join()
        self.handle.close()


# ---------------------------------------------------------------------------------------- the cost ledger
@dataclass
class UsageMeter:
    """Adds each completion's tokens and cost (USD, times ``discount`` for the Batch API) to ``report``.

    A completion whose usage is unknown (``usage_status`` other than ``"ok"``) counts as a request
    and in ``extra["usage_unknown_requests"]``, not as 0 tokens: its cost is ``None`` (NULL in
    ``judge_cache``), and the run's ``cost_usd`` is then a lower bound.
    """

    report: JudgeReport
    price: Price | None
    discount: float = 1.0
    succeeded: int = 0

    def add(self, c: Completion) -> float | None:
        r = self.report
        if c.usage_status != "ok":
            r.requests += 1
            r.extra["usage_unknown_requests"] = r.extra.get("usage_unknown_requests", 0) + 1
            r.extra.setdefault("usage_unknown_example", c.usage_status)
            self.succeeded += 1
            return None
        cost = cost_usd(self.price, input_tokens=c.input_tokens, cached_input_tokens=c.cached_input_tokens,
                        output_tokens=c.output_tokens, discount=self.discount)
        r.requests += 1
        r.input_tokens += c.input_tokens
        r.cached_input_tokens += c.cached_input_tokens
        r.output_tokens += c.output_tokens
        r.cost_usd += cost
        self.succeeded += 1
        return cost


def run_ledger(store: "Store", run_id: str) -> dict[str, Any]:
    """A run's usage totals from what was stored: the ``judge_cache`` rows the run paid for.

    Returns ``requests``, ``input_tokens``, ``cached_input_tokens``, ``output_tokens`` (tokens of the
    judge model), ``cost_usd`` (USD, a lower bound when usage is unknown), ``usage_unknown_requests``
    (responses without usable usage, NULL in the cache) and ``ledger: "from judge_cache"``. Counts
    kept only in memory (a run killed with SIGKILL between two publications of its counts) are
    not needed: every paid response is stored in the same transaction as its labels.
    """
    row = store.execute(
        "SELECT count(*), coalesce(sum(input_tokens), 0), coalesce(sum(cached_input_tokens), 0), coalesce(sum(output_tokens), 0), "
        "coalesce(sum(cost_usd), 0.0), count(*) FILTER (WHERE input_tokens IS NULL) FROM judge_cache WHERE run_id = ?",
        [run_id],
    ).fetchone()
    n, tokens_in, cached, tokens_out, cost, unknown = row if row else (0, 0, 0, 0, 0.0, 0)
    return {"requests": int(n), "input_tokens": int(tokens_in), "cached_input_tokens": int(cached),
            "output_tokens": int(tokens_out), "cost_usd": float(cost), "usage_unknown_requests": int(unknown),
            "ledger": "from judge_cache"}


def reconcile_run_ledger(store: "Store", run_id: str | None = None) -> list[str]:
    """Write the ledger (:func:`run_ledger`) into ``runs.counts`` of ``run_id``, or of every run that
    did not finish (status ``running``, ``interrupted`` or ``failed``) and has stored responses
    without a ledger yet. Returns the run ids updated. A read-only store is left alone.

    ``running`` here means "never recorded its end": DuckDB lets one process write the file, so a run
    of another live process cannot be seen while this one holds the store.
    """
    if store.read_only:
        return []
    ensure_judge_tables(store)
    if run_id is not None:
        ids = [run_id]
    else:
        unfinished = store.run_ids_with_status(("running", "interrupted", "failed"))
        done = {r.run_id for r in store.runs() if r.run_id in set(unfinished) and "ledger" in r.counts}
        rows = store.execute("SELECT DISTINCT run_id FROM judge_cache WHERE list_contains(?, run_id)", [unfinished]).fetchall()
        ids = [r[0] for r in rows if r[0] not in done]
    for rid in ids:
        store.update_run_counts(rid, run_ledger(store, rid))
    return ids

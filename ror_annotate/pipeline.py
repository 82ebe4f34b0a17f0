"""The pipeline as a library: ``ingest -> segment -> label -> export``, and :func:`run`, the main job.

Every function works on an open :class:`~ror_annotate.store.Store`, records itself as a run
(:meth:`Store.run`) unless it is handed the run of an enclosing job, and returns a typed summary.
The ``ror`` command line is a thin shell over these functions: it parses options, shows progress
and prints the summaries. A notebook gets the same behaviour::

    import ror_annotate as ror

    with ror.Store("ror.duckdb") as store:
        summary = ror.pipeline.run(store, ror.sample_path(), out="exports/sample")
    print(summary.segment.segments, summary.export.n_rows)

``progress`` arguments take any object with rich's ``Progress`` task API (``add_task``, ``update``,
``advance``), e.g. a ``rich.progress.Progress``; whatever is given, the stages also keep the
store's progress file (``<db>.progress.json``) current so ``ror status`` can watch a running job.

Interrupts (Ctrl-C, and SIGTERM in the CLI) stop a stage between units of work: ingest stores
nothing unless the whole input validated, segmentation commits each trace, judges commit each
trace or chunk, and the export is built aside and swapped in. Re-running the same call resumes.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from pydantic import BaseModel, ConfigDict, Field

from .errors import InputError, JudgeOutcomeError
from .records import Run
from .segment import MAX_SEGMENT_TOKENS
from .export.build import ExportOptions
from .traces import ColumnMap

if TYPE_CHECKING:  # pragma: no cover
    from .export import ExportSummary
    from .aggregate import AggregateOptions, AggregateSummary
    from .judge import Judge, MaxFailed
    from .labels_import import ImportOptions, ImportSummary
    from .store import Store

__all__ = [
    "IngestSummary", "SegmentSummary", "LabelSummary", "RunSummary",
    "check_source", "default_dataset_name", "ingest", "segment", "label", "export", "run", "aggregate",
]


class _Summary(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class IngestSummary(_Summary):
    """What :func:`ingest` read and stored (counts are traces)."""

    source: str
    read: int = Field(description="Valid traces read from the input.")
    inserted: int = Field(description="Traces new to the store.")
    unchanged: int = Field(description="Traces already stored with the same text.")
    skipped: int = Field(0, description="Invalid records skipped (only with skip_invalid).")
    skipped_reasons: list[str] = Field(default_factory=list, description="The first 20 skipped records: where and why.")
    trace_ids: list[str] = Field(default_factory=list, description="This input's trace ids, in input order.")
    formats: dict[str, int] = Field(default_factory=dict, description="Traces per source format (ror_annotate.formats).")
    notes: dict[str, int] = Field(
        default_factory=dict, description="Traces per remark worth reporting (gaps kept in meta.gaps, markers stored under allow_markers, ...)."
    )

    def counts(self) -> dict[str, Any]:
        """The counts recorded with the run."""
        return {"read": self.read, "inserted": self.inserted, "unchanged": self.unchanged, "skipped": self.skipped, "formats": self.formats}


class SegmentSummary(_Summary):
    """What :func:`segment` did (``segments`` counts the segments of every handled trace)."""

    traces: int
    segments: int = 0
    inserted: int = Field(0, description="Traces segmented for the first time.")
    unchanged: int = Field(0, description="Traces whose stored segmentation was already this one.")
    replaced: int = Field(0, description="Traces re-segmented (their labels dropped; only with force).")
    segmenter: str = ""
    token_counter: str = ""

    def counts(self) -> dict[str, Any]:
        return self.model_dump()


class LabelSummary(_Summary):
    """What :func:`label` did: the judge's counters (segments, requests, tokens, cost in USD)."""

    annotator: str
    source: str
    traces: int
    labeled: int = 0
    failed: int = 0
    skipped: int = 0
    counts_: dict[str, Any] = Field(default_factory=dict, alias="counts", description="Every counter of the judge's report.")
    judges: list["LabelSummary"] = Field(
        default_factory=list, description="With several judges: each judge's own summary (the fields above are their totals)."
    )

    def counts(self) -> dict[str, Any]:
        return dict(self.counts_)


class RunSummary(_Summary):
    """What :func:`run`, the main job, did, stage by stage."""

    run_id: str
    ingest: IngestSummary
    segment: SegmentSummary
    label: LabelSummary
    export: Any = Field(description="The export's :class:`~ror_annotate.export.ExportSummary`.")


# --------------------------------------------------------------------------- progress
class _TrackedProgress:
    """Forwards rich's ``Progress`` task calls to an optional display and to the store's progress file."""

    def __init__(self, store: "Store", display: Any = None) -> None:
        self._store = store
        self._display = display
        self._tasks: dict[int, dict[str, Any]] = {}

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        task_id = self._display.add_task(description, total=total, **fields) if self._display is not None else len(self._tasks)
        # The stage is named once, by the description the task starts with: a bar whose text changes
        # (the judge's running cost) stays one stage, its newer text going to the info column.
        self._tasks[task_id] = {"description": description, "total": total, "completed": 0, "info": str(fields.get("info", ""))}
        self._report(task_id)
        return task_id

    def update(self, task_id: int, *, total: float | None = None, completed: float | None = None,
               advance: float | None = None, description: str | None = None, **fields: Any) -> None:
        if self._display is not None:
            kwargs: dict[str, Any] = {k: v for k, v in (("total", total), ("completed", completed), ("advance", advance), ("description", description)) if v is not None}
            self._display.update(task_id, **kwargs, **fields)
        task = self._tasks.setdefault(task_id, {"description": description or "", "total": total, "completed": 0, "info": ""})
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
        if advance is not None:
            task["completed"] += advance
        if "info" in fields:
            task["info"] = str(fields["info"])
        elif description is not None and description != task["description"]:
            task["info"] = description
        self._report(task_id)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def __getattr__(self, name: str) -> Any:  # anything else rich offers (console, remove_task, ...)
        if self._display is None:
            raise AttributeError(name)
        return getattr(self._display, name)

    def _report(self, task_id: int) -> None:
        task = self._tasks[task_id]
        total = task["total"]
        self._store.report_progress(task["description"], done=int(task["completed"]), total=None if total is None else int(total), info=task["info"])


def _every(n: int, update: Callable[[int, int | None], None]) -> Callable[[int, int | None], None]:
    """A per-record progress callback that passes on every ``n``-th call only (cheap on 1M records)."""

    def callback(done: int, total: int | None) -> None:
        if done % n == 0:
            update(done, total)

    return callback


@contextmanager
def _stage(store: "Store", run: Run | None, command: str, parameters: dict[str, Any], progress: Any) -> Iterator[tuple[Run, _TrackedProgress]]:
    """The run to record into (the enclosing job's, or a new one) and a progress tracker.

    A stage that completes ends with :meth:`Store.checkpoint`: its writes go into the store file
    while its own working memory is already released, not later on top of another stage's.
    """
    tracked = progress if isinstance(progress, _TrackedProgress) else _TrackedProgress(store, progress)
    if run is not None:
        yield run, tracked
    else:
        with store.run(command, parameters) as new_run:
            yield new_run, tracked
    store.checkpoint()


# --------------------------------------------------------------------------- input
def check_source(source: str | Path | None, preset: str | None = None) -> str:
    """Validate where traces come from before anything is created, and return it as a string.

    A local path must exist and have a known type; a hub name is only checked for form here (no
    network). Calling this before opening a store means a mistyped path creates no store file.

    Raises
    ------
    InputError
        No input at all, a missing local file, an empty folder or an unknown file type.
    ConfigError
        An unknown preset.
    """
    from .traces import PRESETS, iter_records

    text = "" if source is None else str(source)
    if not text and not preset:
        raise InputError("no input: give a traces file or dataset name (ror run FILE), or --preset NAME")
    if preset is not None and preset not in PRESETS:
        from .errors import ConfigError

        raise ConfigError(f"unknown preset {preset!r}. Available presets: {', '.join(sorted(PRESETS))}")
    if text and text != preset:
        iter_records(text)  # raises for a missing local file; returns a lazy reader otherwise
    return text


def default_dataset_name(source: str, preset: str | None = None) -> str:
    """The export's default name for an input: the file name without its suffix, the hub name with
    ``/`` as ``__``, or the preset's name."""
    if preset and not source:
        return preset
    name = Path(source).name if source else "dataset"
    for suffix in (".jsonl", ".ndjson", ".json", ".parquet"):
        name = name.removesuffix(suffix)
    return name.replace("/", "__") or "dataset"


def _column_map(preset: str | None, columns: "dict[str, str] | ColumnMap | None") -> "ColumnMap | None":
    from .traces import PRESETS, ColumnMap

    if columns is None or isinstance(columns, ColumnMap):
        return columns
    if not columns:
        return None
    base = PRESETS[preset].columns.model_dump() if preset is not None and preset in PRESETS else {}
    base.update(columns)
    return ColumnMap(**base)


# --------------------------------------------------------------------------- stages
#: Traces read from the store per query by the stages' loops: memory holds one batch of trace
#: texts, not the corpus.
TRACE_BATCH = 256


def _trace_texts_batched(store: "Store", ids: Sequence[str], batch: int = TRACE_BATCH) -> Iterator[tuple[str, str]]:
    """``(trace_id, text)`` of ``ids`` in the order of ``store.iter_traces(ids)`` batch by batch (ingestion
    order within each batch of ``batch`` ids), one query per batch that reads only the rows of its traces
    (:meth:`Store.rows_of_traces`), with no :class:`~ror_annotate.records.Trace` record per trace."""
    for start in range(0, len(ids), batch):
        yield from store.rows_of_traces("traces", "trace_id, text", ids[start : start + batch], order_by="ingested_at, trace_id")


#: Traces per committed batch of :func:`ingest`.
INGEST_BATCH = 500
#: Characters of trace text (reasoning and problem) that :func:`ingest` keeps from its validating pass
#: to store without reading the input again; a larger input is read twice (memory flat in corpus size).
INGEST_KEEP_CHARS = 64 * 2**20


def _batch_fingerprint(traces: Sequence[Any]) -> str:
    """sha256 over a batch's ``(trace_id, text_sha256)`` pairs: the write pass must see what was validated."""
    import hashlib

    h = hashlib.sha256()
    for t in traces:
        h.update(f"{t.trace_id}\x00{t.text_sha256}\x00".encode())
    return h.hexdigest()


def ingest(
    store: "Store",
    source: str | Path = "",
    *,
    preset: str | None = None,
    split: str | None = None,
    columns: "dict[str, str] | ColumnMap | None" = None,
    skip_invalid: bool = False,
    limit: int | None = None,
    format: str = "auto",
    allow_markers: bool = False,
    run: Run | None = None,
    progress: Any = None,
) -> IngestSummary:
    """Read, validate and store traces; nothing is stored unless the whole input validates.

    The input is read twice: a first pass validates every record and checks it against the store
    without writing; the second stores the traces in committed batches of :data:`INGEST_BATCH`,
    so memory stays flat in corpus size. An input of at most :data:`INGEST_KEEP_CHARS` characters
    of text is read once: the validated traces are kept and stored in the same batches. An interrupt during the second pass keeps the batches
    already written (a prefix of the input); running the same ingest again stores the rest. A hub
    dataset read with ``limit`` (streamed) is fetched twice.

    Parameters
    ----------
    source : str or Path
        A ``.jsonl``/``.json``/``.parquet`` file, a ``save_to_disk`` folder, or a hub dataset name.
    preset, split, columns, skip_invalid, limit
        As in :func:`ror_annotate.traces.load_traces`; ``columns`` maps record fields
        (``text``, ``trace_id``, ``problem``, ``answer``, ``gold_answer``, ``model``, ``dataset``)
        to column names and is merged over the preset's mapping.
    format, allow_markers
        As in :func:`~ror_annotate.traces.load_traces`: the reasoning format (``"auto"`` or a name
        of :data:`ror_annotate.formats.FORMATS`), and whether a trace that still holds a known
        control token or thinking marker is stored (counted in ``notes``) instead of refused.
    run : Run, optional
        The enclosing job's run; by default this call records its own ``ingest`` run.

    Raises
    ------
    InputError, ConfigError
        Bad input or options (see :func:`~ror_annotate.traces.load_traces`); nothing is stored.
    StoreError
        A trace id already stored with different text; nothing is stored.
    InputError
        The input changed between the two passes (the batches written before the change stay).
    """
    from .traces import load_traces

    text = check_source(source, preset)
    mapping = _column_map(preset, columns)
    params = {
        "source": text, "preset": preset, "split": split, "format": format, "allow_markers": allow_markers,
        **({} if mapping is None else mapping.model_dump(exclude_none=True)),
    }
    with _stage(store, run, "ingest", params, progress) as (the_run, tracked):
        def read(description: str, on_batch: Callable[[list], None]) -> Any:
            task = tracked.add_task(description, total=None)
            result = load_traces(
                text, columns=mapping, preset=preset, split=split, skip_invalid=skip_invalid, limit=limit, format=format,
                allow_markers=allow_markers, progress=_every(250, lambda n, t: tracked.update(task, completed=n, total=t)),
                on_batch=on_batch, batch_size=INGEST_BATCH,
            )
            tracked.update(task, total=len(result.trace_ids), completed=len(result.trace_ids))
            return result

        # Two passes over the input, so that memory stays flat in corpus size: the first validates
        # every record and checks it against the store, writing nothing; the second stores the
        # traces in batches, each committed (one transaction over a whole corpus keeps all its text
        # in DuckDB's transaction-local memory). A bad record therefore stores nothing, and an
        # interrupt while writing keeps whole batches that a re-run counts as unchanged.
        fingerprints: list[str] = []
        # a small input's validated batches are kept and stored without a second read (per-trace
        # parsing is most of the ingest of many short traces); None once the input outgrows the budget
        # (each with the traces check_traces found new: the ids of one input are distinct, so storing
        # the earlier batches cannot change a later batch's check, and it is not made again)
        kept: list[tuple[list, list]] | None = []
        kept_chars = 0

        def check_batch(traces: list) -> None:
            nonlocal kept, kept_chars
            new = store.check_traces(traces)
            fingerprints.append(_batch_fingerprint(traces))
            if kept is not None:
                kept_chars += sum(len(t.text) + len(t.problem or "") for t in traces)
                if kept_chars <= INGEST_KEEP_CHARS:
                    kept.append((traces, new))
                else:
                    kept = None  # too large to hold: read the input again to store it

        validated = read("validate", check_batch)
        counts: Counter[str] = Counter()
        written: list[str] = []  # fingerprints of the batches stored so far

        def store_batch(traces: list) -> None:
            n = len(written)
            if n >= len(fingerprints) or fingerprints[n] != _batch_fingerprint(traces):
                raise InputError(
                    f"{text}: the input changed while it was being ingested (batch {n + 1} differs from what was "
                    f"validated); {counts['inserted'] + counts['unchanged']} traces were stored before the change. "
                    "Run the ingest again once the input is final"
                )
            counts.update(store.upsert_traces(traces, run_id=the_run.run_id))
            written.append(fingerprints[n])

        if kept is not None:
            # the validated batches themselves (no second read, so no fingerprint to compare), each
            # committed on its own as before: an interrupt keeps whole batches
            task = tracked.add_task("ingest", total=len(validated.trace_ids))
            for traces, new in kept:
                counts.update(store.upsert_traces(traces, run_id=the_run.run_id, checked=new))
                written.append(fingerprints[len(written)])
                tracked.advance(task, len(traces))
            kept, result = None, validated
        else:
            result = read("ingest", store_batch)
        if len(written) != len(fingerprints):
            raise InputError(
                f"{text}: the input changed while it was being ingested ({len(fingerprints)} batches validated, "
                f"{len(written)} read back); run the ingest again once the input is final"
            )
        n_read = len(result.trace_ids)
        summary = IngestSummary(
            source=result.source, read=n_read, inserted=counts["inserted"], unchanged=counts["unchanged"],
            skipped=len(result.skipped), skipped_reasons=[f"{s.where}: {s.reason}" if s.reason and s.where not in s.reason else s.reason for s in result.skipped[:20]],
            trace_ids=result.trace_ids, formats=dict(result.formats.most_common()), notes=dict(result.notes),
        )
        if run is None:
            the_run.counts.update(summary.counts())
        return summary


#: A segment batch is written (one transaction) at this many traces or this many segments, whichever comes first.
SEGMENT_WRITE_TRACES = 2_000
SEGMENT_WRITE_SEGMENTS = 20_000


def segment(
    store: "Store",
    trace_ids: Sequence[str] | None = None,
    *,
    tokenizer: Any = None,
    max_tokens: int = MAX_SEGMENT_TOKENS,
    force: bool = False,
    workers: int | None = None,
    run: Run | None = None,
    progress: Any = None,
) -> SegmentSummary:
    """Segment traces into clause-level segments and store them (idempotent; one commit per batch of traces).

    Segmented traces are written in batches of :data:`SEGMENT_WRITE_TRACES` traces or
    :data:`SEGMENT_WRITE_SEGMENTS` segments, one transaction each (:meth:`Store.replace_segment_spans_many`):
    an interrupt keeps every batch committed before it, and a trace the store refuses rolls back
    its own batch only, with an error that names it.

    A trace already segmented by the same versioned rule set, cap and token counter is skipped
    without running the segmenter, so a re-run costs no segmentation; ``force`` re-segments
    everything (dropping labels of traces whose segments change; see
    :meth:`Store.replace_segments` for what other stages' rows do).

    Parameters
    ----------
    trace_ids : sequence of str, optional
        Traces to segment; default every stored trace.
    tokenizer : str or tokenizer, optional
        Token counter of the subject model for ``n_tokens`` and the cap (name, local path or a
        loaded fast tokenizer); default the documented approximation ``approx:regex-v1``.
    max_tokens : int
        Hard cap on a segment's length in tokens (the method's 125).
    workers : int, optional
        Processes segmenting in parallel (:func:`ror_annotate.segment.segment_many`); default
        every core, 1 segments in this process. The stored segments are the same for any value.

    Raises
    ------
    InputError
        No traces to segment.
    StoreError
        A trace is segmented differently and labels or review items refer to it.
    """
    from .segment import Segmenter, segment_spans_many
    from .tokenizer import make_token_counter

    ids = list(store.trace_ids() if trace_ids is None else trace_ids)
    if not ids:
        raise InputError(f"no traces in {store.path}; run `ror ingest FILE` first")
    segmenter = Segmenter(max_tokens=max_tokens, token_counter=make_token_counter(tokenizer))
    segmenter_id = f"{segmenter.name}:max{max_tokens}"
    counter_name = segmenter.token_counter.name
    params = {"tokenizer": tokenizer if tokenizer is None or isinstance(tokenizer, str) else counter_name, "max_segment_tokens": max_tokens, "force": force}
    with _stage(store, run, "segment", params, progress) as (the_run, tracked):
        done = store.segmentations()
        outcome: Counter[str] = Counter()
        task = tracked.add_task("segment", total=len(ids), info="")
        queued: deque[tuple[str, str]] = deque()  # (id, text) handed to segment_spans_many, whose results come in this order

        def to_segment() -> Iterator[tuple[str, str]]:
            # (id, text) rows, not Trace records: the segmenter needs nothing else (validation was ingest's)
            for trace_id, text in _trace_texts_batched(store, ids):
                prior = done.get(trace_id)
                if not force and prior is not None and prior[:2] == (segmenter_id, counter_name):
                    outcome["unchanged"] += 1
                    outcome["segments"] += prior[2]
                    tracked.update(task, advance=1, info=f"{outcome['segments']} segments")
                else:
                    queued.append((trace_id, text))
                    yield trace_id, text

        batch: list[tuple[str, str, list[tuple[int, int, int]]]] = []
        batch_segments = 0

        def write() -> None:
            # one transaction per batch of traces (Store.replace_segment_spans_many), not per trace
            nonlocal batch, batch_segments
            if not batch:
                return
            statuses = store.replace_segment_spans_many(batch, segmenter=segmenter_id, token_counter=counter_name, run_id=the_run.run_id, force=force)
            outcome.update(statuses)
            outcome["segments"] += batch_segments
            tracked.update(task, advance=len(batch), info=f"{outcome['segments']} segments")
            batch, batch_segments = [], 0

        # spans, not Segment records: this process only slices the texts into the batch's Arrow columns
        for spans in segment_spans_many(to_segment(), segmenter=segmenter, workers=workers):
            batch.append((*queued.popleft(), spans))
            batch_segments += len(spans)
            if len(batch) >= SEGMENT_WRITE_TRACES or batch_segments >= SEGMENT_WRITE_SEGMENTS:
                write()
        write()
        summary = SegmentSummary(traces=len(ids), segmenter=segmenter_id, token_counter=counter_name, **outcome)
        if run is None:
            the_run.counts.update(summary.counts())
        return summary


def make_judge(judge: "str | Judge" = "baseline", options: dict[str, Any] | None = None) -> "Judge":
    """A judge from a spec (``"baseline"``, ``"openai:MODEL"``) and its options, or ``judge`` itself.

    Build it before any work so a bad spec, an invalid option or a missing API key fails first.

    Raises
    ------
    ConfigError
        Unknown judge, invalid options, missing key.
    """
    from .judge import make_judge as _make

    if not isinstance(judge, str):
        return judge
    return _make(judge, **(options or {}))


def make_judges(
    judge: "str | Judge | Sequence[str | Judge]" = "baseline",
    options: "dict[str, Any] | Sequence[dict[str, Any]] | None" = None,
) -> "list[Judge]":
    """Several judges from specs, each its own rater, built (and checked) before any work.

    Parameters
    ----------
    judge : str, Judge, or sequence of them
        One spec (``"openai:MODEL"``), a judge object, or several.
    options : dict or sequence of dict, optional
        One dict: the options of every LLM judge (with several judges, ``baseline`` gets none of them;
        alone it refuses them, as :func:`make_judge`). A sequence: one dict per judge, paired by position.

    Raises
    ------
    ConfigError
        E133: a sequence of options whose length is not the number of judges; E134: two judges
        would write as the same rater, or ``batch_id`` (one batch of one judge) with several judges;
        any error of :func:`make_judge`.
    """
    from .errors import ConfigError

    specs = [judge] if isinstance(judge, str) or not isinstance(judge, Sequence) else list(judge)
    if not specs:
        raise ConfigError("no judge given: pass a judge spec such as 'baseline' or 'openai:MODEL'")
    if options is None or isinstance(options, dict):
        shared = dict(options or {})
        several = len(specs) > 1
        per = [{} if several and isinstance(s, str) and s.partition(":")[0] == "baseline" else shared for s in specs]
    else:
        per = [dict(o or {}) for o in options]
        if len(per) != len(specs):
            raise ConfigError(f"{len(per)} option sets for {len(specs)} judges: give one per judge, paired by position", code="E133")
    if len(specs) > 1 and any(o.get("batch_id") for o in per):
        raise ConfigError("--batch-id resumes one batch of one judge: give a single --judge with it", code="E134")
    judges = [make_judge(s, o) for s, o in zip(specs, per)]
    seen: dict[str, int] = {}
    for i, j in enumerate(judges):
        for a in _rater_ids(j):
            if a in seen:
                raise ConfigError(
                    f"judges {seen[a] + 1} and {i + 1} would both write labels as rater {a!r}; give each --judge once "
                    "(several samples of one judge: --samples K)", code="E134",
                )
            seen[a] = i
    return judges


def _rater_ids(judge: "Judge") -> list[str]:
    from .judge import judge_annotators

    return [a.annotator for a in judge_annotators(judge)]


def _sum_counts(counts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in counts:
        for k, v in c.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            out[k] = out.get(k, 0) + v
    return out


def label(
    store: "Store",
    trace_ids: Sequence[str] | None = None,
    *,
    judge: "str | Judge | Sequence[str | Judge]" = "baseline",
    judge_options: "dict[str, Any] | Sequence[dict[str, Any]] | None" = None,
    max_failed: "str | float | int | MaxFailed | None" = "10%",
    workers: int | None = None,
    run: Run | None = None,
    progress: Any = None,
) -> LabelSummary:
    """Label every stored segment of ``trace_ids`` with a judge (the offline baseline by default).

    Parameters
    ----------
    trace_ids : sequence of str, optional
        Traces to label; default every segmented trace.
    judge : str, Judge, or sequence of them
        ``"baseline"``, ``"openai:MODEL"``, any registered judge, or a judge object; several judges
        label one after another, each stored (and declared in the ``annotators`` table) as its own rater.
    judge_options : dict or sequence of dict, optional
        Options of the judge factory (``chunk_size``, ``concurrency``, ``base_url`` ...): one dict for
        every judge, or one per judge (see :func:`make_judges`).
    max_failed : str, float, int or None
        How many judge-failed segments the pass may leave: a fraction (``0.1``, ``"10%"``, the
        default) or a count (``25``); ``None`` never fails (see
        :func:`~ror_annotate.judge.outcome.check_label_outcome`).
    workers : int, optional
        Processes the baseline judge's rules run in (:func:`ror_annotate.judge.baseline.classify_many`);
        default every core, 1 labels in this process. The stored labels are the same for any value.

    Raises
    ------
    InputError
        Unknown trace ids, or nothing segmented to label.
    ConfigError, JudgeError
        From the judge (bad options, unreachable endpoint, missing key).
    JudgeOutcomeError
        Nothing was labelled, or more than ``max_failed`` segments are judge-failed (code E506,
        exit status 3 in the CLI); the labels written stay stored and the run is recorded failed.
    """
    from .judge import MaxFailed, check_label_outcome

    failed_limit = None if max_failed is None else MaxFailed.parse(max_failed)  # a bad value fails before any work
    judges = make_judges(judge, judge_options)
    if workers is not None:
        from .judge.baseline import BaselineJudge

        judges = [BaselineJudge(workers=workers) if type(j) is BaselineJudge else j for j in judges]
    if trace_ids is None:
        segmented = store.segmentations()
        ids = [t for t in store.trace_ids() if t in segmented]
    else:
        ids = list(trace_ids)
        unknown = sorted(set(ids) - set(store.trace_ids()))
        if unknown:
            raise InputError(f"no trace {', '.join(map(repr, unknown[:5]))}{' ...' if len(unknown) > 5 else ''} in {store.path}; see `ror status`")
    if not ids:
        raise InputError(f"no segmented traces in {store.path}; run `ror ingest FILE` and `ror segment` first")
    from .judge import judge_annotators

    names = [j.annotator for j in judges]
    params = {"judge": _spec_names(judge, judges), **_options_param(judge_options),
              "max_failed": None if failed_limit is None else str(failed_limit)}
    with _stage(store, run, "label", params, progress) as (the_run, tracked):
        store.upsert_annotators([a for j in judges for a in judge_annotators(j)])
        summaries = []
        for the_judge in judges:
            report = the_judge.label(store, ids, run=the_run, progress=cast(Any, tracked))  # rich Progress duck type
            summaries.append(LabelSummary(
                annotator=the_judge.annotator, source=the_judge.source, traces=len(ids),
                labeled=report.labeled, failed=report.failed, skipped=report.skipped, counts=report.as_counts(),
            ))
        if len(summaries) == 1:
            summary = summaries[0]
        else:
            totals = _sum_counts([s.counts() for s in summaries])
            totals["judges"] = {s.annotator: s.counts() for s in summaries}
            summary = LabelSummary(
                annotator=",".join(names), source=",".join(dict.fromkeys(s.source for s in summaries)), traces=len(ids),
                labeled=sum(s.labeled for s in summaries), failed=sum(s.failed for s in summaries),
                skipped=sum(s.skipped for s in summaries), counts=totals, judges=summaries,
            )
        if run is None:
            the_run.counts.update(summary.counts())
        if failed_limit is not None:
            for one in summaries:  # every judge ran; the first one that labelled too little decides the outcome
                check_label_outcome(one.counts(), max_failed=failed_limit)
        return summary


def _spec_names(judge: Any, judges: "list[Judge]") -> "str | list[str]":
    """The judge spec(s) as a run records them: a spec string as given, a judge object by its annotator id."""
    specs = [judge] if isinstance(judge, str) or not isinstance(judge, Sequence) else list(judge)
    names = [s if isinstance(s, str) else j.annotator for s, j in zip(specs, judges)]
    return names[0] if len(names) == 1 else names


def _options_param(options: "dict[str, Any] | Sequence[dict[str, Any]] | None") -> dict[str, Any]:
    """Judge options as a run records them: one dict flat (as before), several under ``judge_options``."""
    if options is None or isinstance(options, dict):
        return dict(options or {})
    return {"judge_options": [dict(o or {}) for o in options]}


def export(
    store: "Store",
    out: str | Path,
    options: "ExportOptions | None" = None,
    *,
    trace_ids: Sequence[str] | None = None,
    run: Run | None = None,
    progress: Any = None,
    **kwargs: Any,
) -> "ExportSummary":
    """Export the store's segmented traces as a Hugging Face dataset with its card.

    See :func:`ror_annotate.export.export_dataset` for the layout, the label choice (``labels``)
    and the token alignment (``tokenizer``, ``chat_template``). Splits are by trace, seeded by
    ``split_seed``, with ``split_fractions`` = train, validation, test fractions of traces. The
    settings are an :class:`~ror_annotate.export.ExportOptions` (``options``) or its fields as
    keywords (``labels="human", split_seed=3``), validated with did-you-mean errors.

    Raises
    ------
    ExportError, ConfigError, AlignmentError
        From the export; an earlier export at ``out`` is left as it was.
    """
    from .export import export_dataset

    options = ExportOptions.resolve(options, kwargs)
    o = options
    out_dir = Path(out)
    params = {"name": o.name, "out": str(out_dir), "labels": o.labels,
              "tokenizer": o.tokenizer if o.tokenizer is None or isinstance(o.tokenizer, str) else "object",
              "chat_template": o.chat_template, "split_seed": o.split_seed, "split_fractions": list(o.split_fractions),
              "stratify_by": o.stratify_by, "license": o.license, "source_licenses": dict(o.source_licenses or {})}
    if store.read_only and run is None:
        # Nothing can be written to a read-only store: the export's manifest records the run instead.
        detached = store.detached_run("export", params)
        tracked = progress if isinstance(progress, _TrackedProgress) else _TrackedProgress(store, progress)
        task = tracked.add_task("export", total=None)
        record = {**detached.model_dump(mode="json"), "status": "ok", "recorded_in": "manifest (the store was read-only)"}
        summary = export_dataset(
            store, out_dir, o, trace_ids=trace_ids, run_record=record,
            progress=lambda done, total: tracked.update(task, completed=done, total=total),
        )
        tracked.update(task, total=summary.n_traces, completed=summary.n_traces)
        return summary
    with _stage(store, run, "export", params, progress) as (the_run, tracked):
        task = tracked.add_task("export", total=None)
        summary = export_dataset(
            store, out_dir, o, trace_ids=trace_ids,
            progress=lambda done, total: tracked.update(task, completed=done, total=total),
        )
        tracked.update(task, total=summary.n_traces, completed=summary.n_traces)
        counts = {"traces": summary.n_traces, "segments": summary.n_segments, "tokens": summary.n_tokens,
                  "straddling_tokens": summary.n_straddling, "out_dir": str(summary.out_dir), "seconds": round(summary.seconds, 2)}
        if run is None:
            the_run.counts.update(counts)
        else:
            the_run.counts["export"] = counts
        return summary


class RunOptions(ExportOptions):
    """Options of ``ror run`` / :func:`run`: the export's (:class:`~ror_annotate.export.ExportOptions`)
    plus those of ingest, segment and label, each documented with its stage (:func:`ingest`,
    :func:`segment`, :func:`label`); ``max_segment_tokens`` is :func:`segment`'s ``max_tokens``,
    ``out`` the export folder (default ``exports/<input name>``)."""

    stage: ClassVar[str] = "the run"
    preset: str | None = None
    split: str | None = None
    columns: "dict[str, str] | ColumnMap | None" = None
    skip_invalid: bool = False
    limit: int | None = None
    format: str = "auto"
    allow_markers: bool = False
    max_segment_tokens: int = MAX_SEGMENT_TOKENS
    workers: int | None = None
    judge: Any = "baseline"
    judge_options: Any = None
    max_failed: Any = "10%"
    out: str | Path | None = None


def run(
    store: "Store",
    source: str | Path = "",
    options: RunOptions | None = None,
    *,
    progress: Any = None,
    **kwargs: Any,
) -> RunSummary:
    """The main job: ingest -> segment -> label -> export this input's traces, recorded as one run.

    Every stage is idempotent, so running the same job again changes nothing and a job stopped
    at any point resumes where it stopped. ``out`` defaults to ``exports/<input name>``. The
    settings are a :class:`RunOptions` (``options``) or its fields as keywords (``judge="baseline",
    out=...``), validated with did-you-mean errors: those of :func:`ingest`, :func:`segment`,
    :func:`label` and :func:`export`.
    When the judge labels nothing or leaves more than ``max_failed`` segments judge-failed, the
    job stops before the export (no all-unlabelled dataset is written).

    Raises
    ------
    InputError, ConfigError, StoreError, JudgeError, ExportError
        From the stage that failed; what earlier stages stored is kept.
    JudgeOutcomeError
        From :func:`label`: nothing exported.
    """
    from .judge import MaxFailed

    options = RunOptions.resolve(options, kwargs)
    o = options
    preset, split, columns, format, allow_markers = o.preset, o.split, o.columns, o.format, o.allow_markers
    tokenizer, judge, judge_options, max_failed, out, labels = o.tokenizer, o.judge, o.judge_options, o.max_failed, o.out, o.labels
    text = check_source(source, preset)
    judges = make_judges(judge, judge_options)  # fail on a bad judge before reading anything
    failed_limit = None if max_failed is None else MaxFailed.parse(max_failed)
    out_dir = Path(out) if out is not None else Path("exports") / default_dataset_name(text, preset)
    mapping = _column_map(preset, columns)
    params = {
        "source": text, "preset": preset, "split": split, "format": format, "allow_markers": allow_markers,
        **({} if mapping is None else mapping.model_dump(exclude_none=True)),
        "tokenizer": tokenizer if tokenizer is None or isinstance(tokenizer, str) else "object",
        "judge": _spec_names(judge, judges), **_options_param(judge_options),
        "max_failed": None if failed_limit is None else str(failed_limit), "out": str(out_dir), "labels": labels,
    }
    with store.run("run", params) as the_run:
        tracked = _TrackedProgress(store, progress)
        ingested = ingest(
            store, text, preset=preset, split=split, columns=mapping, skip_invalid=o.skip_invalid, limit=o.limit, format=format,
            allow_markers=allow_markers, run=the_run, progress=tracked,
        )
        the_run.counts["ingest"] = ingested.counts()
        segmented = segment(store, ingested.trace_ids, tokenizer=tokenizer, max_tokens=o.max_segment_tokens, workers=o.workers, run=the_run, progress=tracked)
        the_run.counts["segment"] = segmented.counts()
        try:
            labelled = label(store, ingested.trace_ids, judge=judges, max_failed=failed_limit, workers=o.workers, run=the_run, progress=tracked)
        except JudgeOutcomeError as exc:
            the_run.counts["label"] = exc.counts  # the run is recorded failed, with what the judge did
            raise
        the_run.counts["label"] = labelled.counts()
        export_options = ExportOptions(**{k: getattr(o, k) for k in ExportOptions.model_fields})
        exported = export(store, out_dir, export_options, trace_ids=ingested.trace_ids, run=the_run, progress=tracked)
        return RunSummary(run_id=the_run.run_id, ingest=ingested, segment=segmented, label=labelled, export=exported)


__all__ += ["ExportOptions", "RunOptions"]


# --------------------------------------------------------------------------- verify (ror verify)
from .verify import VerifyOptions, VerifyReport, VerifySummary, verify, verify_report  # noqa: E402

__all__ += ["VerifyOptions", "VerifyReport", "VerifySummary", "verify", "verify_report"]


# --------------------------------------------------------------------------- view (issue 25)
def view(source: "Store | str | Path", out: str | Path = "view", options: Any = None) -> Any:
    """Write the static viewer site (index, trace pages, compare view, dashboard) into ``out``.

    Parameters
    ----------
    source : Store, or str / Path of an export folder
        A store: every segmented trace with every rater's labels, and the agreement dashboard (the
        figures of ``ror agree --json`` with the same options). A folder written by ``ror export``
        (or a downloaded copy of the dataset): its traces and exported labels, no agreement.
    out : str or Path
        Site folder; open ``out/index.html`` (from disk: no server needed).
    options : ror_annotate.view.ViewOptions or dict, optional

    Returns
    -------
    ror_annotate.view.ViewSummary

    Raises
    ------
    ViewError
        E851 bad output folder, E852 no segmented trace, E853/E854 not a (complete) export folder.
    ConfigError
        An unknown or out-of-bounds option.
    """
    from .view import ViewOptions, build_view, build_view_from_export

    opts = options if isinstance(options, ViewOptions) else ViewOptions.from_options(dict(options or {}))
    if isinstance(source, (str, Path)):
        return build_view_from_export(source, out, opts)
    return build_view(source, out, opts)


__all__ += ["view"]


# ------------------------------------------------------------------------------------ trust (calibration, weighted review)
from .agreement.kinds import agreement_by_kind, agreement_drift  # noqa: E402
from .agreement.reliability import calibration_summary  # noqa: E402
from .agreement.weighted import weighted_estimates  # noqa: E402

__all__ += ["agreement_by_kind", "agreement_drift", "calibration_summary", "weighted_estimates"]
# --------------------------------------------------------------------------- aggregate (issue 24)
def aggregate(
    store: "Store", options: "AggregateOptions | dict[str, Any] | None" = None, *, run: Run | None = None, progress: Any = None,
) -> "AggregateSummary":
    """Combine several raters into one label per segment with a posterior, stored as rater ``aggregate:<method>``.

    See :func:`ror_annotate.aggregate.aggregate`; ``options`` is an
    :class:`~ror_annotate.aggregate.AggregateOptions` or a dict of its fields (validated, with
    did-you-mean errors). Recorded as an ``aggregate`` run unless ``run`` is given.

    Raises
    ------
    ConfigError, InputError
        Bad options (E110), unknown method (E710), rater problems (E711-E715); nothing is stored.
    """
    from .aggregate import AggregateOptions
    from .aggregate import aggregate as _aggregate

    opts = options if isinstance(options, AggregateOptions) else AggregateOptions.from_options(dict(options or {}))
    with _stage(store, run, "aggregate", opts.recorded(), progress) as (the_run, _tracked):
        summary = _aggregate(store, opts, run=the_run)
        if run is None:
            the_run.counts.update(summary.counts())
        return summary


# --------------------------------------------------------------------------- labels import (issue 24)
def import_labels(
    store: "Store", path: str | Path, options: "ImportOptions | dict[str, Any]", *, run: Run | None = None,
) -> "ImportSummary":
    """Import another project's labels through a crosswalk (:func:`ror_annotate.labels_import.import_labels`).

    Raises
    ------
    ConfigError, ImportLabelError (E130), ImportSpanError (E131), ImportRecordError (E132)
        See :func:`ror_annotate.labels_import.import_labels`; nothing is stored on error.
    """
    from .labels_import import import_labels as _import

    return _import(store, path, options, run=run)


__all__ += ["import_labels"]


# --------------------------------------------------------------------------- review start / finish (issue 27)
def review_start(store: "Store", name: str, options: Any = None, **kwargs: Any) -> Any:
    """Start a review study end to end (server, study, accounts, push, links): :func:`ror_annotate.review.flow.review_start`.

    ``options`` is a :class:`~ror_annotate.review.flow.ReviewStartOptions`, a dict of its fields,
    or None with the fields as keywords. Returns a ``ReviewStartSummary``.

    Raises
    ------
    ReviewError
        E740-E744 and the server errors of ``ror review push`` (see the flow module).
    """
    from .review.flow import ReviewStartOptions
    from .review.flow import review_start as _start

    if isinstance(options, dict):
        options = ReviewStartOptions.from_options(options)
    return _start(store, name, options, **kwargs)


def review_finish(store: "Store", name: str, options: Any = None, **kwargs: Any) -> Any:
    """Pull a study and compute its agreement (weighted when the design allows): :func:`ror_annotate.review.flow.review_finish`.

    ``options`` is a :class:`~ror_annotate.review.flow.ReviewFinishOptions`, a dict of its fields,
    or None with the fields as keywords. Returns a ``ReviewFinishSummary``.

    Raises
    ------
    ReviewError, AgreementError
        As ``ror review pull`` and ``ror agree``.
    """
    from .review.flow import ReviewFinishOptions
    from .review.flow import review_finish as _finish

    if isinstance(options, dict):
        options = ReviewFinishOptions.from_options(options)
    return _finish(store, name, options, **kwargs)


__all__ += ["review_start", "review_finish"]
# --------------------------------------------------------------------------- label noise in probe / experts (issue 24, item 7)
def label_noise_draws(table: Any, tokens_path: str | Path | None, options: Any = None, **keywords: Any) -> Any:
    """Redraw every segment's label for ``run_probes(label_draws=...)`` / ``expert_label_noise``
    (:func:`ror_annotate.steer.noise.draw_labels`; options ``resamples``, ``confusion``, ``confusion_rater``,
    ``seed``, ``confidence_level``).

    Raises
    ------
    LabelNoiseError
        E930-E937, see :func:`ror_annotate.steer.noise.draw_labels`.
    """
    from .steer.noise import draw_labels

    return draw_labels(table, tokens_path, options, **keywords)


__all__ += ["label_noise_draws"]

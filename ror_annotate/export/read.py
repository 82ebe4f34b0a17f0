"""Read the store in bounded batches for the export.

The export never holds the corpus: it first reads one small key row per trace (id, the
stratification fields, the segment count and the token counter) to decide the splits, then reads
traces, segments and labels one batch of traces at a time (about ``max_segments`` segments per
batch). Rows are checked on the way in, so a corrupt store row (a label outside the codebook, a
segment whose text is not at its offsets) stops the export with one coded line naming the row.

These are read-only queries on the core tables; segments and labels come through
:meth:`Store.rows_of_traces`, which reads only the parts of a table that hold the batch.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import ExportError
from ..records import BEHAVIORS, LABEL_SOURCES, Label, Segment, Trace
from ..segment import _new_segment

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

#: Code of the error for a store row the export cannot publish (corrupt or hand-edited).
CORRUPT_ROW = "E811"
_SOURCES = LABEL_SOURCES


@dataclass(frozen=True)
class TraceKey:
    """What the split and the batching need of one segmented trace (no text)."""

    trace_id: str
    model: str | None
    dataset: str | None
    source: str | None
    n_segments: int
    token_counter: str | None


#: A stored label as read for the export (checked): ``(label_id, trace_id, segment_index, label, source, annotator,
#: codebook_version, study, created_at, extra (JSON text), confidence, distribution)``.
LabelRow = tuple[Any, ...]


@dataclass
class Batch:
    """Traces of one batch with their segments (by ``segment_index``) and stored labels.

    ``label_rows`` holds each segment's stored labels as checked rows (:data:`LabelRow`);
    :meth:`labels_of` builds their :class:`Label` records on first use, so a segment whose label the
    export can choose from its row alone (one machine label: :func:`ror_annotate.export.build._choose`)
    costs no record.
    """

    traces: list[Trace]
    segments: dict[str, list[Segment]]
    label_rows: dict[tuple[str, int], list[LabelRow]] = field(default_factory=dict)
    source_format: dict[str, str | None] = field(default_factory=dict)
    _labels: dict[tuple[str, int], list[Label]] = field(default_factory=dict, repr=False)

    def labels_of(self, key: tuple[str, int]) -> list[Label]:
        """Every stored label of the segment ``(trace_id, segment_index)`` as records (``[]`` when none)."""
        got = self._labels.get(key)
        if got is None:
            got = self._labels[key] = [label_of_row(r) for r in self.label_rows.get(key, ())]
        return got


def label_of_row(r: LabelRow) -> Label:
    """The :class:`Label` record of one checked :data:`LabelRow` (as ``Label.model_construct`` builds it)."""
    created = r[8].replace(tzinfo=timezone.utc) if r[8] is not None and r[8].tzinfo is None else r[8]
    return _new_label(  # Label.model_construct with every field, in declaration order
        r[1], r[2], r[3], r[4], r[5], r[6], None, r[7], r[10], None, created,
        json.loads(r[9]) if r[9] and r[9] != "{}" else {}, list(r[11]) if r[11] is not None else None,
    )


def _fast_factory(cls: Any, probe: tuple[Any, ...]) -> Any:
    """``make(*values)``: ``cls.model_construct(**dict(zip(fields, values)))`` with a value for every field,
    in declaration order, about 3x faster (a per-label cost of the export).

    It fills the four slots ``model_construct`` fills for a model whose fields are all given (no
    extras, no private attributes), as :func:`ror_annotate.segment._fast_segment_factory` does for
    segments. At import the result is compared with ``model_construct``'s on ``probe``; if a pydantic
    version fills other slots, ``model_construct`` itself is used.
    """
    names = tuple(cls.model_fields)
    all_set = frozenset(names)
    new, setattr_ = object.__new__, object.__setattr__

    def make(*values: Any) -> Any:
        obj = new(cls)
        setattr_(obj, "__dict__", dict(zip(names, values)))
        setattr_(obj, "__pydantic_fields_set__", set(all_set))
        setattr_(obj, "__pydantic_extra__", None)
        setattr_(obj, "__pydantic_private__", None)
        return obj

    def construct(*values: Any) -> Any:
        return cls.model_construct(**dict(zip(names, values)))

    fast, ref = make(*probe), construct(*probe)
    slots = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
    same = len(probe) == len(names) and all(getattr(fast, k, None) == getattr(ref, k, None) for k in slots)
    return make if same and fast == ref and fast.model_dump_json() == ref.model_dump_json() else construct


#: ``_new_label(trace_id, segment_index, label, source, annotator, codebook_version, run_id, study, confidence,
#: rationale, created_at, extra, distribution)``: a :class:`Label` as ``model_construct`` builds it, for checked rows.
_new_label = _fast_factory(Label, ("t", 0, BEHAVIORS[0], "baseline", "a", "v1", None, None, 0.5, None,
                                   datetime(2026, 1, 1, tzinfo=timezone.utc), {"k": 1}, [1.0]))


#: ``_new_trace(trace_id, text, problem, answer, gold_answer, correct, model, source, dataset, source_format, meta)``.
_new_trace = _fast_factory(Trace, ("t", "text", "p", "a", "g", True, "m", "s", "d", "plain", {"k": [1]}))


def _ids_filter(column: str) -> str:
    # a hash semi-join on the batch's ids: list_contains would be O(rows x ids)
    return f"{column} IN (SELECT unnest(?::VARCHAR[]))"


def trace_keys(store: "Store", trace_ids: Sequence[str] | None = None) -> list[TraceKey]:
    """Key rows of every segmented trace (or of ``trace_ids``), in ingestion order then id.

    Returns
    -------
    list of TraceKey
        Traces without segments are left out.
    """
    return [TraceKey(*row) for row in store.segmented_trace_overview(trace_ids)]


def label_sources(store: "Store", trace_ids: Sequence[str]) -> set[str]:
    """Distinct label sources stored for these traces."""
    return store.label_sources(trace_ids)


def _has_column(store: "Store", table: str, column: str) -> bool:
    rows = store.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?", [table, column]
    ).fetchone()
    return bool(rows and rows[0])


def batches(store: "Store", keys: Sequence[TraceKey], *, max_segments: int = 20_000, max_traces: int = 256) -> Iterator[Batch]:
    """Yield the traces of ``keys`` in order, in batches of about ``max_segments`` segments.

    Raises
    ------
    ExportError
        A stored label is not one of the codebook's behaviors (or names an unknown source), or a
        stored segment's text is not at its offsets in the trace (code ``E811``, naming the row).
    """
    with_format = _has_column(store, "traces", "source_format")
    start = 0
    while start < len(keys):
        end, n = start, 0
        while end < len(keys) and (end == start or (n + keys[end].n_segments <= max_segments and end - start < max_traces)):
            n += keys[end].n_segments
            end += 1
        yield _read_batch(store, [k.trace_id for k in keys[start:end]], with_format)
        start = end


def _read_batch(store: "Store", ids: list[str], with_format: bool) -> Batch:
    cols = "trace_id, text, problem, answer, gold_answer, correct, model, source, dataset, meta" + (", source_format" if with_format else "")
    by_id = {}
    formats: dict[str, str | None] = {}
    # rows_of_traces: only the row groups holding the batch (a plain IN filter scanned every trace's text per batch)
    for r in store.rows_of_traces("traces", cols, ids):
        by_id[r[0]] = _new_trace(  # Trace.model_construct with every field, in declaration order
            r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[10] if with_format else None, json.loads(r[9]) if r[9] else {},
        )
        formats[r[0]] = r[10] if with_format else None  # stores written before the column existed have none
    traces = [by_id[i] for i in ids]
    segments: dict[str, list[Segment]] = defaultdict(list)
    # rows_of_traces reads only the row groups holding the batch: a plain IN filter read the whole table per batch
    rows = store.rows_of_traces(
        "segments", "trace_id, segment_index, char_start, char_end, text, n_tokens", ids, order_by="trace_id, segment_index"
    )
    for r in rows:
        text = by_id[r[0]].text
        if not (0 <= r[2] < r[3] <= len(text)) or text[r[2] : r[3]] != r[4]:
            raise ExportError(
                f"corrupt store row segments[{r[0]}#{r[1]}]: its text is not at [{r[2]}, {r[3]}) of the stored trace; "
                "re-segment that trace (ror segment --force) or restore the store",
                code=CORRUPT_ROW,
            )
        # the segmenter's unvalidated constructor: the same record as Segment.model_construct, about 2x faster
        segments[r[0]].append(_new_segment(r[0], r[1], r[2], r[3], r[4], r[5]))
    labels: dict[tuple[str, int], list[LabelRow]] = defaultdict(list)
    rows = store.rows_of_traces(
        "labels", "label_id, trace_id, segment_index, label, source, annotator, codebook_version, study, created_at, extra, "
        "confidence, distribution", ids
    )
    for r in rows:
        if r[3] not in BEHAVIORS or r[4] not in _SOURCES:
            what = f"label {r[3]!r} is not one of the codebook's behaviors ({', '.join(BEHAVIORS)})" if r[3] not in BEHAVIORS \
                else f"source {r[4]!r} is not one of {', '.join(_SOURCES)}"
            raise ExportError(
                f"corrupt store row labels[label_id={r[0]}] (segment {r[1]}#{r[2]}, annotator {r[5]}): {what}; "
                "fix or delete that row, or relabel the segment",
                code=CORRUPT_ROW,
            )
        labels[(r[1], r[2])].append(r)  # a Label record only when the export needs one (Batch.labels_of)
    return Batch(traces=traces, segments=dict(segments), label_rows=dict(labels), source_format=formats)

"""``ror labels import``: labels another project produced, mapped onto the six behaviors.

Input is a JSONL, CSV or parquet file with one record per labelled unit, in one of two units:

* ``segment`` -- our stored segments: ``trace_id`` + ``segment_index``, or ``segment_id``
  (``"<trace_id>#<index>"``); an optional ``text`` must equal the stored segment's text;
* ``span`` -- a character span of the stored trace text: ``trace_id``, ``char_start``, ``char_end``
  (Python string indices, half-open), an optional ``text`` that must equal
  ``trace.text[char_start:char_end]``.

``unit="auto"`` reads spans when the file has ``char_start`` and ``char_end`` columns (another
project's ``segment_index`` numbers *its* segmentation, not ours), else segments.

The label column (``label`` unless ``label_column`` says otherwise) holds a category of the
crosswalk's source taxonomy (:mod:`ror_annotate.crosswalks`; default the identity crosswalk
``six-behaviors``); an optional ``confidence`` column in [0, 1] is kept as the label's confidence.

**Projection rule for spans.** Each stored segment receives the behavior whose spans cover the most
of the segment's non-whitespace characters (``str.isspace`` is false), summed over every span that
maps to that behavior; it is stored only when that share is at least ``min_share`` (default 0.5)
and strictly larger than every other behavior's. Segments that no span touches (*uncovered*), whose
best share is below ``min_share`` (*below share*), whose top two behaviors tie (*ties*), or whose
winner is a category the crosswalk lists as unmapped (*unmapped*) are counted in the summary and
get no label: nothing is guessed. Unmapped spans compete like any other category.

The whole file is read and checked before anything is written; the labels (source ``import``,
annotator ``annotator``) and the rater's declaration go into the store in one transaction. Label ids
depend on the segment, the annotator and the crosswalk id, so importing the same file again rewrites
the same labels.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .crosswalks import Crosswalk, load_crosswalk
from .errors import ConfigError, ImportLabelError, ImportRecordError, ImportSpanError
from .options import StageOptions
from .records import BEHAVIORS, Annotator, Label, Run

if TYPE_CHECKING:  # pragma: no cover
    from .store import Store


class ImportOptions(StageOptions):
    """Options of ``ror labels import`` (:func:`import_labels`)."""

    stage: str = "labels import"
    annotator: str = Field(min_length=1, description="Rater id written on every imported label.")
    kind: Literal["machine", "human"] = Field(description="Whether the labels came from a machine or from humans.")
    crosswalk: str = Field("six-behaviors", min_length=1, description="Built-in crosswalk (name or name@vN) or a YAML file.")
    label_column: str = Field("label", min_length=1, description="Column holding the source category.")
    unit: Literal["auto", "segment", "span"] = "auto"
    min_share: float = Field(0.5, gt=0.0, le=1.0, description="Least share of a segment's non-space characters the winning label must cover.")
    model: str | None = Field(None, description="Model or method that produced the labels (declared with the rater).")


class ImportSummary(BaseModel):
    """What :func:`import_labels` read and stored.

    Counts of ``records`` are input records; every other count is of stored segments.
    """

    model_config = ConfigDict(extra="forbid")

    file: str = Field(description="Input file name (no directory).")
    annotator: str
    kind: str
    crosswalk: str = Field(description="Crosswalk id, name@vN.")
    unit: Literal["segment", "span"]
    records: int = Field(description="Records read.")
    unmapped_records: int = Field(0, description="Records whose category the crosswalk lists as unmapped.")
    traces: int = Field(0, description="Traces the records name.")
    segments: int = Field(0, description="Stored segments of those traces.")
    labelled: int = Field(0, description="Segments that received a label (labels written).")
    uncovered: int = Field(0, description="Segments no record covers.")
    below_share: int = Field(0, description="Span unit: the best behavior covers less than min_share of the segment.")
    ties: int = Field(0, description="Span unit: two behaviors cover the same, largest share.")
    unmapped: int = Field(0, description="Segments whose winning category is unmapped.")
    label_counts: dict[str, int] = Field(default_factory=dict, description="Labels written per behavior.")
    run_id: str | None = None

    def counts(self) -> dict[str, Any]:
        """The counts recorded with the run."""
        return self.model_dump(exclude={"run_id"})

    def table_rows(self) -> list[tuple[str, str]]:
        """``(field, value)`` rows for the command's summary table."""
        rows = [
            ("file", self.file), ("annotator", f"{self.annotator} ({self.kind})"), ("crosswalk", self.crosswalk),
            ("unit", self.unit), ("records", f"{self.records} ({self.unmapped_records} unmapped category)"),
            ("traces", str(self.traces)), ("segments of those traces", str(self.segments)),
            ("labelled", str(self.labelled)),
            ("not labelled", f"uncovered {self.uncovered}, below share {self.below_share}, ties {self.ties}, unmapped {self.unmapped}"),
            ("labels", ", ".join(f"{k} {v}" for k, v in self.label_counts.items() if v)),
        ]
        return rows


@dataclass(frozen=True)
class _Record:
    where: str  # "file.jsonl:3" / "file.parquet record 3"
    trace_id: str
    category: str
    behavior: str | None  # None: unmapped category
    confidence: float | None
    segment_index: int | None = None
    char_start: int | None = None
    char_end: int | None = None
    text: str | None = None


# --------------------------------------------------------------------------- reading
def _decode(path: Path) -> str:
    """The file's text: UTF-8, a leading byte-order mark dropped (Excel and Windows tools write one)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImportRecordError(f"{path.name}: cannot read ({exc.strerror or exc})") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ImportRecordError(
            f"{path.name}:{line}: byte {data[exc.start:exc.start + 1]!r} is not valid UTF-8; save the file as UTF-8"
        ) from None


def _read_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, record)`` for every record of a JSONL, CSV or parquet file.

    Raises
    ------
    ImportRecordError (E132)
        Not UTF-8, a line that is not one JSON object (or is nested past the parser's depth), a CSV
        that does not parse strictly (an unterminated quote) or repeats a column, an unreadable
        parquet file.
    """
    suffix = path.suffix.lower()
    name = path.name
    if suffix == ".json" and _decode(path).lstrip().startswith("["):
        yield from _json_array_rows(path)
    elif suffix in (".jsonl", ".ndjson", ".json"):
        yield from _jsonl_rows(path)
    elif suffix in (".csv", ".tsv"):
        yield from _csv_rows(path, "\t" if suffix == ".tsv" else ",")
    elif suffix == ".parquet":
        yield from _parquet_rows(path)
    else:
        raise ImportRecordError(f"{name}: unknown file type {suffix or '(none)'}; give a .jsonl, .csv or .parquet file")


def _json_array_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Records of a ``.json`` file that holds one JSON array of objects."""
    name = path.name
    # a .json file holding one JSON array of records (as json.dump writes a list); was read as
    # JSONL and refused at its first line ("[" is not valid JSON)
    try:
        items = json.loads(_decode(path))
    except json.JSONDecodeError as exc:
        raise ImportRecordError(f"{name}:{exc.lineno}: not valid JSON ({exc.msg}); give one JSON array of objects, or JSONL") from exc
    except RecursionError:
        raise ImportRecordError(f"{name}: JSON nested too deeply to read; give one flat JSON object per record") from None
    for i, obj in enumerate(items, 1):
        if not isinstance(obj, dict):
            raise ImportRecordError(f"{name} record {i}: a record must be a JSON object, got {type(obj).__name__}")
        yield f"{name} record {i}", obj


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Records of a JSONL file, one JSON object per line."""
    name = path.name
    for lineno, line in enumerate(_decode(path).split("\n"), 1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ImportRecordError(f"{name}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") from exc
        except RecursionError:
            raise ImportRecordError(f"{name}:{lineno}: JSON nested too deeply to read; each line must be one flat JSON object") from None
        if not isinstance(obj, dict):
            raise ImportRecordError(f"{name}:{lineno}: a record must be a JSON object, got {type(obj).__name__}")
        yield f"{name}:{lineno}", obj


def _csv_rows(path: Path, delimiter: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Records of a CSV/TSV file (read whole and strictly before the first is yielded); empty fields are None."""
    name = path.name
    last = 0  # line of the last record (or header) read: a malformed one starts after it
    text = _decode(path)
    # strict: an unterminated quote is an error, not a field that swallows the rest of the file;
    # the field limit is raised (process-wide, so only while this file is read) for long texts.
    before = csv.field_size_limit()
    csv.field_size_limit(max(before, len(text) + 1))
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
        try:
            header = reader.fieldnames or []
            last = reader.line_num
            repeated = sorted({h for h in header if header.count(h) > 1})
            if repeated:
                raise ImportRecordError(f"{name}:1: column {', '.join(map(repr, repeated))} appears twice in the header; keep one")
            rows = []
            for row in reader:
                rows.append((f"{name}:{reader.line_num}", {k: (v if v != "" else None) for k, v in row.items() if k is not None}))
                last = reader.line_num
        except csv.Error as exc:
            raise ImportRecordError(
                f"{name}:{last + 1}: malformed CSV ({exc}) in the record that starts on this line; a field that opens a quote must close it"
            ) from None
    finally:
        csv.field_size_limit(before)
    yield from rows


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Records of a parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = path.name

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ImportRecordError(f"{name}: cannot be read as parquet ({' '.join(str(exc).split())[:200]})") from None
    for i, row in enumerate(table.to_pylist(), 1):
        yield f"{name} record {i}", row


def _clip(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: a message quotes input, never all of a huge field."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} characters)"


def _listed(names: Sequence[str], limit: int = 20) -> str:
    """The first ``limit`` names, comma-separated, and how many more."""
    shown = ", ".join(_clip(n, 40)[1:-1] if isinstance(n, str) else _clip(n, 40) for n in names[:limit])
    return shown if len(names) <= limit else f"{shown} ... ({len(names) - limit} more)"


def _int(value: Any, field: str, where: str) -> int:
    if isinstance(value, bool) or value is None:
        raise ImportRecordError(f"{where}: {field} must be an integer, got {_clip(value)}")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ImportRecordError(f"{where}: {field} must be an integer, got {_clip(value)}") from None


def _present(row: dict[str, Any], key: str) -> bool:
    value = row.get(key)
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _unit_of(columns: set[str], unit: str, name: str) -> Literal["segment", "span"]:
    if unit == "span" or (unit == "auto" and {"char_start", "char_end"} <= columns):
        if not {"trace_id", "char_start", "char_end"} <= columns:
            raise ImportRecordError(f"{name}: span records need trace_id, char_start and char_end columns; found {_listed(sorted(columns))}")
        return "span"
    if "segment_id" in columns or {"trace_id", "segment_index"} <= columns:
        return "segment"
    raise ImportRecordError(
        f"{name}: cannot tell the unit; records need trace_id + segment_index, segment_id (trace#index), or "
        f"trace_id + char_start + char_end; found {_listed(sorted(columns)) or 'no columns'}"
    )


def _parse(path: Path, options: ImportOptions, crosswalk: Crosswalk) -> tuple[Literal["segment", "span"], list[_Record]]:
    rows = list(_read_rows(path))
    if not rows:
        raise ImportRecordError(f"{path.name}: no records; nothing to import")
    columns = {k for _, row in rows for k in row}
    unit = _unit_of(columns, options.unit, path.name)
    if options.label_column not in columns:
        raise ImportRecordError(f"{path.name}: no {_clip(options.label_column)} column; name the label column with --label-column (columns: {_listed(sorted(columns))})")
    records = []
    for where, row in rows:
        category = row.get(options.label_column)
        if not _present(row, options.label_column) or not str(category).strip():
            raise ImportRecordError(f"{where}: no label in column {options.label_column!r}; fill it or drop the record")
        category = str(category)
        try:
            behavior = crosswalk.lookup(category)
        except KeyError:
            raise ImportLabelError(
                f"{where}: label {_clip(category)} is not declared by crosswalk {crosswalk.id} ({crosswalk.source_taxonomy[:80]}); "
                f"declared: {_listed(crosswalk.declared())}; use another --crosswalk or a crosswalk file that maps or lists it"
            ) from None
        confidence = None
        if _present(row, "confidence"):
            try:
                confidence = float(row["confidence"])
            except (TypeError, ValueError):
                confidence = -1.0
            if not 0.0 <= confidence <= 1.0:
                raise ImportRecordError(f"{where}: confidence must be a number in [0, 1], got {_clip(row['confidence'])}")
        text = row.get("text") if _present(row, "text") else None
        if unit == "span":
            for key in ("trace_id", "char_start", "char_end"):
                if not _present(row, key):
                    raise ImportRecordError(f"{where}: {key} is missing; span records need trace_id, char_start, char_end")
            records.append(_Record(
                where, str(row["trace_id"]), category, behavior, confidence,
                char_start=_int(row["char_start"], "char_start", where), char_end=_int(row["char_end"], "char_end", where),
                text=None if text is None else str(text),
            ))
        else:
            if _present(row, "trace_id") and _present(row, "segment_index"):
                trace_id, index = str(row["trace_id"]), _int(row["segment_index"], "segment_index", where)
            elif _present(row, "segment_id"):
                trace_id, sep, idx = str(row["segment_id"]).rpartition("#")
                if not sep or not trace_id:
                    raise ImportRecordError(f"{where}: segment_id {_clip(row['segment_id'])} must look like <trace_id>#<segment_index>")
                index = _int(idx, "segment_id's index", where)
            else:
                raise ImportRecordError(f"{where}: no segment named; give trace_id + segment_index or segment_id")
            records.append(_Record(where, trace_id, category, behavior, confidence, segment_index=index,
                                   text=None if text is None else str(text)))
    return unit, records


# --------------------------------------------------------------------------- projection
@dataclass(frozen=True)
class Projected:
    """The outcome for one stored segment: a behavior, or why it got none (``status``)."""

    behavior: str | None
    status: Literal["labelled", "uncovered", "below_share", "tie", "unmapped"]
    share: float | None = None
    categories: tuple[str, ...] = ()
    confidence: float | None = None


_UNMAPPED = "\x00unmapped"


def project_spans(
    text: str, segments: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int, str | None, str, float | None]], *, min_share: float = 0.5,
) -> list[Projected]:
    """Project labelled character spans onto segments by the non-space majority rule (module docstring).

    Parameters
    ----------
    text : str
        The trace text both offsets index (code points).
    segments : sequence of (char_start, char_end)
        The stored segments, half-open.
    spans : sequence of (char_start, char_end, behavior or None, source category, confidence or None)
        Labelled spans; ``behavior`` None is an unmapped category. Spans may overlap (each counts).
    min_share : float in (0, 1]
        Least share of the segment's non-space characters the winner must cover.

    Returns
    -------
    list of Projected, shape (n_segments,)
        ``share`` is the winner's covered non-space characters / the segment's non-space
        characters; ``confidence`` the mean of the winner's spans' confidences when all have one.
    """
    # prefix[i] = non-space characters in text[:i], so a range's count is prefix[b] - prefix[a]
    prefix = [0] * (len(text) + 1)
    for i, ch in enumerate(text):
        prefix[i + 1] = prefix[i] + (not ch.isspace())
    ordered = sorted(spans, key=lambda s: s[0])
    starts = [s[0] for s in ordered]
    out = []
    for a, b in segments:
        total = prefix[b] - prefix[a]
        cover: Counter[str] = Counter()
        cats: dict[str, set[str]] = defaultdict(set)
        confs: dict[str, list[float | None]] = defaultdict(list)
        for s0, s1, behavior, category, conf in ordered[: bisect.bisect_left(starts, b)]:
            n = prefix[min(b, s1)] - prefix[max(a, s0)]
            if s1 <= a or n <= 0:
                continue
            key = behavior if behavior is not None else _UNMAPPED
            cover[key] += n
            cats[key].add(category)
            confs[key].append(conf)
        if not cover or total <= 0:
            out.append(Projected(None, "uncovered"))
            continue
        ranked = cover.most_common()
        best, n_best = ranked[0]
        share = n_best / total
        cat = tuple(sorted(cats[best]))
        if len(ranked) > 1 and ranked[1][1] == n_best:
            out.append(Projected(None, "tie", share, cat))
        elif share < min_share:
            out.append(Projected(None, "below_share", share, cat))
        elif best == _UNMAPPED:
            out.append(Projected(None, "unmapped", share, cat))
        else:
            cs = confs[best]
            conf = sum(c for c in cs if c is not None) / len(cs) if all(c is not None for c in cs) else None
            out.append(Projected(best, "labelled", share, cat, conf))
    return out


#: Rater-id prefixes of the raters ror_annotate derives (aggregate.py, verify.py).
_DERIVED_PREFIXES = ("aggregate:", "verify:")


def _check_annotator(store: "Store", annotator: str) -> None:
    """Refuse a rater id that already names a rater of another source (its declaration would be replaced),
    or that a derived rater will take (``aggregate:<method>``, ``verify:...``: ``ror aggregate`` would
    replace the imported rater's declaration and mix its labels with the aggregate's; E750)."""
    for prefix in _DERIVED_PREFIXES:
        if annotator.startswith(prefix):
            raise ConfigError(
                f"--annotator {_clip(annotator)} starts with {prefix!r}, the name ror_annotate gives its own derived raters "
                "(aggregates, verifiers); give the imported labels another rater id (e.g. 'thought-anchors:gpt-4o')", code="E750",
            )
    taken = {name: source for source, name, _ in store.annotators() if source != "import"}
    declared = store.declared_annotators().get(annotator)
    if declared is not None and declared.source != "import":
        taken.setdefault(annotator, declared.source)
    if annotator in taken:
        raise ConfigError(
            f"--annotator {annotator!r} already names a {taken[annotator]} rater in {store.path}; "
            "give the imported labels their own rater id (e.g. 'thought-anchors:gpt-4o')"
        )


def _segments_of(store: "Store", by_trace: dict[str, list[_Record]]) -> dict[str, list[Any]]:
    """The stored segments of every named trace; an unknown or unsegmented trace is an error naming its first record."""
    known = set(store.trace_ids())
    for tid, recs in by_trace.items():
        if tid not in known:
            raise ImportRecordError(f"{recs[0].where}: trace {_clip(tid)} is not in the store {store.path}; ingest and segment it first")
    segments = store.segments_by_trace(list(by_trace))
    for tid, recs in by_trace.items():
        if not segments.get(tid):
            raise ImportRecordError(f"{recs[0].where}: trace {_clip(tid)} has no segments in {store.path}; run ror segment first")
    return segments


def _segment_outcomes(tid: str, recs: Sequence[_Record], segs: Sequence[Any]) -> list[Projected]:
    """Per stored segment (in order): its record's behavior, ``unmapped`` or ``uncovered``."""
    by_index = {s.segment_index: s for s in segs}
    chosen: dict[int, _Record] = {}
    for rec in recs:
        seg = by_index.get(rec.segment_index)  # type: ignore[arg-type]
        if seg is None:
            raise ImportRecordError(
                f"{rec.where}: segment {tid}#{rec.segment_index} is not stored (the trace has segments 0..{len(segs) - 1}); "
                "span records (char_start, char_end) fit any segmentation"
            )
        if rec.text is not None and rec.text != seg.text:
            raise ImportSpanError(f"{rec.where}: text {rec.text[:40]!r} differs from stored segment {tid}#{seg.segment_index} {seg.text[:40]!r}")
        prev = chosen.get(seg.segment_index)
        if prev is not None and prev.category != rec.category:
            raise ImportRecordError(
                f"{rec.where}: segment {tid}#{seg.segment_index} already labelled {_clip(prev.category)} at {prev.where}; one label per segment"
            )
        chosen[seg.segment_index] = rec
    out = []
    for s in segs:
        hit = chosen.get(s.segment_index)
        if hit is None:
            out.append(Projected(None, "uncovered"))
        else:
            out.append(Projected(hit.behavior, "labelled" if hit.behavior else "unmapped", None, (hit.category,), hit.confidence))
    return out


def _span_outcomes(tid: str, text: str, recs: Sequence[_Record], segs: Sequence[Any], min_share: float) -> list[Projected]:
    """Check every span against the trace text, then project them onto the segments (:func:`project_spans`)."""
    spans = []
    for rec in recs:
        a, b = rec.char_start, rec.char_end
        assert a is not None and b is not None
        if not 0 <= a < b <= len(text):
            raise ImportSpanError(
                f"{rec.where}: span [{a}, {b}) is outside trace {tid!r} (length {len(text)} characters); offsets are Python string indices"
            )
        if rec.text is not None and text[a:b] != rec.text:
            raise ImportSpanError(
                f"{rec.where}: text {rec.text[:40]!r} does not match trace {tid!r} at [{a}, {b}) ({text[a:b][:40]!r}); "
                "offsets must be Python string indices (code points) into the stored text"
            )
        spans.append((a, b, rec.behavior, rec.category, rec.confidence))
    return project_spans(text, [(s.char_start, s.char_end) for s in segs], spans, min_share=min_share)


# --------------------------------------------------------------------------- the stage
def import_labels(store: "Store", path: str | Path, options: ImportOptions | dict[str, Any], *, run: Run | None = None) -> ImportSummary:
    """Import another project's labels from ``path`` into ``store`` (module docstring for the rules).

    Parameters
    ----------
    store : Store
        Holds the traces and their segments (``ror ingest`` + ``ror segment`` first).
    path : str or Path
        A ``.jsonl``, ``.csv`` or ``.parquet`` file.
    options : ImportOptions or dict
        ``annotator`` and ``kind`` are required; a dict is validated by :meth:`ImportOptions.from_options`.
    run : Run, optional
        Record into this run instead of a new ``labels import`` run.

    Returns
    -------
    ImportSummary

    Raises
    ------
    ConfigError
        Bad options, an unknown / invalid crosswalk, or an ``annotator`` that already names a rater
        of another source (a judge, a human ...).
    ImportLabelError (E130)
        A category the crosswalk does not declare.
    ImportSpanError (E131)
        A span outside the trace or whose ``text`` differs from the stored text; a ``text`` that
        differs from the named segment's.
    ImportRecordError (E132)
        Unreadable file or record, missing field, unknown trace or segment, two different labels
        for one segment.

    Every error names the file and line (or record number) and leaves the store unchanged.
    """
    opts = options if isinstance(options, ImportOptions) else ImportOptions.from_options(dict(options))
    path = Path(path).expanduser()
    if not path.is_file():
        raise ImportRecordError(f"{path}: no such file; give a .jsonl, .csv or .parquet file of labels")
    crosswalk = load_crosswalk(opts.crosswalk)
    _check_annotator(store, opts.annotator)
    unit, records = _parse(path, opts, crosswalk)
    by_trace: dict[str, list[_Record]] = defaultdict(list)
    for rec in records:
        by_trace[rec.trace_id].append(rec)
    segments = _segments_of(store, by_trace)

    summary = ImportSummary(
        file=path.name, annotator=opts.annotator, kind=opts.kind, crosswalk=crosswalk.id, unit=unit, records=len(records),
        unmapped_records=sum(r.behavior is None for r in records), traces=len(by_trace),
        segments=sum(len(segments[t]) for t in by_trace),
    )
    labels: list[Label] = []
    counts: Counter[str] = Counter()
    base_extra = {"file": path.name, "crosswalk": crosswalk.id, "unit": unit}
    for tid, recs in by_trace.items():
        segs = segments[tid]
        if unit == "segment":
            outcomes = _segment_outcomes(tid, recs, segs)
        else:
            outcomes = _span_outcomes(tid, store.get_trace(tid).text, recs, segs, opts.min_share)
        for seg, p in zip(segs, outcomes):
            if p.status != "labelled":
                key = "ties" if p.status == "tie" else p.status
                setattr(summary, key, getattr(summary, key) + 1)
                continue
            assert p.behavior is not None
            counts[p.behavior] += 1
            extra: dict[str, Any] = {**base_extra, "source_labels": list(p.categories)}
            if p.share is not None:
                extra["share"] = round(p.share, 6)
            labels.append(Label(
                trace_id=tid, segment_index=seg.segment_index, label=p.behavior, source="import",  # type: ignore[arg-type]
                annotator=opts.annotator, codebook_version=f"crosswalk:{crosswalk.id}", confidence=p.confidence, extra=extra,
            ))
    summary.labelled = len(labels)
    summary.label_counts = {b: counts.get(b, 0) for b in BEHAVIORS}
    annotator = Annotator(
        annotator=opts.annotator, kind=opts.kind, source="import", model=opts.model, codebook_version=f"crosswalk:{crosswalk.id}",
        details={
            "crosswalk": crosswalk.id, "source_taxonomy": crosswalk.source_taxonomy, "file": path.name, "unit": unit,
            "min_share": opts.min_share if unit == "span" else None,
        },
    )

    def write(the_run: Run) -> None:
        stamped = [lab.model_copy(update={"run_id": the_run.run_id}) for lab in labels]
        with store.transaction():
            store.upsert_labels(stamped)
            store.upsert_annotators([annotator])
        summary.run_id = the_run.run_id
        if run is None:
            the_run.counts.update(summary.counts())
        else:
            the_run.counts["labels import"] = summary.counts()

    if run is not None:
        write(run)
    else:
        with store.run("labels import", {"file": path.name, **opts.recorded()}) as new_run:
            write(new_run)
        store.checkpoint()
    return summary


__all__ = [
    "ImportLabelError", "ImportOptions", "ImportRecordError", "ImportSpanError", "ImportSummary", "Projected",
    "import_labels", "project_spans",
]

"""Where a viewer site's data come from besides the store: an exported dataset folder.

``ror view --from-export PATH`` reads the export's Parquet files (``data/traces/*.parquet`` and
``data/segments/*.parquet``, the files a download of the published dataset has), so anyone with the
dataset builds the same trace pages without the store. An export carries one label per segment (the
exported label, its source and annotator), so the site shows that one rater per annotator id and no
agreement figures (those need every rater's labels: build from the store).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ViewError
from ..records import BEHAVIORS, Label, Segment, Trace
from .build import TraceBundle

_TRACE_FIELDS = ("trace_id", "problem", "text", "answer", "gold_answer", "correct", "model", "dataset", "source", "source_format")


def export_files(path: Path) -> tuple[list[Path], list[Path]]:
    """The traces' and segments' Parquet files of an export folder, split by split.

    Raises
    ------
    ViewError
        E853: ``path`` holds no ``data/traces/*.parquet`` or no ``data/segments/*.parquet``.
    """
    traces = sorted((path / "data" / "traces").glob("*.parquet"))
    segments = sorted((path / "data" / "segments").glob("*.parquet"))
    if not traces or not segments:
        raise ViewError(
            f"--from-export {path}: no data/traces/*.parquet and data/segments/*.parquet there; "
            "give the folder `ror export` wrote (or a downloaded copy of the dataset)", code="E853",
        )
    return traces, segments


def _correct(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return True if text == "true" else False if text == "false" else None


def export_bundles(path: str | Path) -> tuple[Iterator[TraceBundle], list[tuple[str, str]]]:
    """Trace bundles of an export folder, one split file at a time, and its ``(source, annotator)`` pairs.

    Memory holds one split's segments (label columns only, no token columns) and one trace at a time.

    Raises
    ------
    ViewError
        E853: not an export folder; E854: a segment names a trace the export does not have.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root = Path(path)
    trace_files, segment_files = export_files(root)
    seg_cols = ["trace_id", "segment_index", "text", "char_start", "char_end", "n_tokens", "label", "label_source", "annotator", "codebook_version"]
    pairs: set[tuple[str, str]] = set()
    for f in segment_files:
        t = pq.read_table(f, columns=["label_source", "annotator", "label"]).filter(pc.is_valid(pc.field("label")))
        for source, annotator in set(zip(t.column("label_source").to_pylist(), t.column("annotator").to_pylist())):
            pairs.add((_source(source), str(annotator or source or "export")))

    def bundles() -> Iterator[TraceBundle]:
        segs_by_trace: dict[str, list[dict[str, Any]]] = {}
        for f in segment_files:
            for row in pq.read_table(f, columns=seg_cols).to_pylist():
                segs_by_trace.setdefault(row["trace_id"], []).append(row)
        for f in trace_files:
            cols = [c for c in _TRACE_FIELDS if c in pq.read_schema(f).names]
            for batch in pq.ParquetFile(f).iter_batches(batch_size=100, columns=cols):
                for row in batch.to_pylist():
                    rows = sorted(segs_by_trace.pop(row["trace_id"], []), key=lambda r: r["segment_index"])
                    if not rows or not row.get("text"):
                        continue
                    trace = Trace(**{**{k: row.get(k) for k in cols}, "correct": _correct(row.get("correct"))})
                    segments = [Segment(trace_id=r["trace_id"], segment_index=r["segment_index"], char_start=r["char_start"], char_end=r["char_end"],
                                        text=r["text"], n_tokens=r["n_tokens"] or 0) for r in rows]
                    labels = [
                        Label(trace_id=r["trace_id"], segment_index=r["segment_index"], label=BEHAVIORS[r["label"]], source=_source(r["label_source"]),
                              annotator=str(r["annotator"] or r["label_source"] or "export"), codebook_version=r["codebook_version"] or "export",
                              extra={"label_source": r["label_source"]})
                        for r in rows if r["label"] is not None and 0 <= r["label"] < len(BEHAVIORS)
                    ]
                    yield TraceBundle(trace, segments, labels)
        if segs_by_trace:
            missing = next(iter(segs_by_trace))
            raise ViewError(f"--from-export {root}: segments of trace {missing!r} but no such trace in data/traces; the export is incomplete", code="E854")

    return bundles(), sorted(pairs)


def _source(value: Any) -> Any:
    """The export's ``label_source`` as a label source (``majority`` votes show as ``aggregate``)."""
    known = ("judge", "baseline", "human", "adjudicated", "aggregate", "verify", "import")
    return value if value in known else "aggregate" if value == "majority" else "import"

"""A store segmented by ``ror-clause-v4`` keeps working under ``ror-clause-v5``.

The segmenter id is provenance (``segmentations.segmenter``): a trace whose spans are the same
under v5 keeps its segments and labels and only its provenance changes; a trace whose spans differ
is not re-segmented while labels refer to it (the store's coded refusal, as after any rule change),
and ``force`` re-segments it, dropping those labels. Expected spans are written by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ror_annotate import pipeline
from ror_annotate.errors import StoreError
from ror_annotate.records import Label, Segment, Trace
from ror_annotate.segment import SEGMENTER_NAME
from ror_annotate.store import Store
from ror_annotate.tokenizer import ApproxTokenCounter

V4 = "ror-clause-v4:max125"
SAME = "So x = 3. Then y = 4."  # v4 and v5: "So x = 3." | "Then y = 4."
# v4 cut after the inner enumerator "2." (a formula after a period); v5 keeps "2." with its item.
CHANGED = "1. x = yz * 2^(1/2)\n2. y = xz * 2^(1/3)"


def _segments(tid: str, text: str, spans: list[tuple[int, int]]) -> list[Segment]:
    # n_tokens as v4 stored them: the approximate counter's count of each segment (part of the stored spans)
    count = ApproxTokenCounter().count
    return [Segment(trace_id=tid, segment_index=i, char_start=s, char_end=e, text=text[s:e], n_tokens=count(text[s:e])) for i, (s, e) in enumerate(spans)]


def _v4_store(db: Path) -> Store:
    store = Store(db)
    store.upsert_traces([Trace(trace_id=t, text=x, problem="p", model="m", dataset="d") for t, x in (("same", SAME), ("changed", CHANGED))])
    # v4's spans, by hand: SAME at its sentence end; CHANGED after "...\n2." (character 22)
    assert CHANGED[:22] == "1. x = yz * 2^(1/2)\n2." and CHANGED[23:] == "y = xz * 2^(1/3)"
    for tid, text, spans in (("same", SAME, [(0, 9), (10, 21)]), ("changed", CHANGED, [(0, 22), (23, len(CHANGED))])):
        store.replace_segments(tid, _segments(tid, text, spans), segmenter=V4, token_counter="approx:regex-v1")
        store.upsert_labels([Label(trace_id=tid, segment_index=i, label="execution", source="human", annotator="a1", codebook_version="cb") for i in range(2)])
    return store


def test_a_v4_trace_with_the_same_spans_keeps_its_labels_and_gets_v5_provenance(tmp_path: Path) -> None:
    assert SEGMENTER_NAME == "ror-clause-v5"
    with _v4_store(tmp_path / "v4.duckdb") as store:
        summary = pipeline.segment(store, ["same"], workers=1)
        assert (summary.unchanged, summary.replaced) == (1, 0)
        assert store.segmentation_of("same") == ("ror-clause-v5:max125", "approx:regex-v1")
        assert [(s.char_start, s.char_end) for s in store.segments("same")] == [(0, 9), (10, 21)]
        assert len([lab for lab in store.labels() if lab.trace_id == "same"]) == 2


def test_a_v4_trace_whose_spans_change_is_refused_while_labelled_and_kept_readable(tmp_path: Path) -> None:
    with _v4_store(tmp_path / "v4.duckdb") as store:
        with pytest.raises(StoreError, match="segmented differently"):
            pipeline.segment(store, ["changed"], workers=1)
        # nothing was written: the v4 segments, their provenance and labels are as they were
        assert store.segmentation_of("changed") == (V4, "approx:regex-v1")
        assert [(s.char_start, s.char_end) for s in store.segments("changed")] == [(0, 22), (23, len(CHANGED))]
        assert len([lab for lab in store.labels() if lab.trace_id == "changed"]) == 2
        # --force re-segments with v5 (one segment: the joined lines of symbols) and drops those labels
        summary = pipeline.segment(store, ["changed"], workers=1, force=True)
        assert summary.replaced == 1
        assert [(s.char_start, s.char_end) for s in store.segments("changed")] == [(0, len(CHANGED))]
        assert store.segmentation_of("changed") == ("ror-clause-v5:max125", "approx:regex-v1")
        assert [lab for lab in store.labels() if lab.trace_id == "changed"] == []

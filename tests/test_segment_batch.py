"""Segments written in batches of traces (Store.replace_segments_many) store what one trace at a time stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from ror_annotate import pipeline
from ror_annotate.errors import StoreError
from ror_annotate.records import Label, Segment, Trace
from ror_annotate.segment import Segmenter
from ror_annotate.store import Store

TEXTS = {
    "a": "First we add. Then we check the sum. So the answer is 4.",
    "b": "Wait, that is wrong. Let me redo it: 2 + 2 = 4.",
    "c": "Okay.",
}


def _segs(trace_id: str, text: str) -> list[Segment]:
    return Segmenter().segment(text, trace_id)


def _dump(store: Store) -> tuple[list, list]:
    segs = store.execute("SELECT * FROM segments ORDER BY trace_id, segment_index").fetchall()
    marks = store.execute("SELECT trace_id, segmenter, token_counter, n_segments, run_id FROM segmentations ORDER BY trace_id").fetchall()
    return segs, marks


def _store(path: Path) -> Store:
    store = Store(path)
    store.upsert_traces([Trace(trace_id=t, text=x) for t, x in TEXTS.items()])
    return store


def test_batch_stores_what_one_by_one_stores(tmp_path: Path) -> None:
    with _store(tmp_path / "one.duckdb") as one, _store(tmp_path / "many.duckdb") as many:
        statuses = [one.replace_segments(t, _segs(t, x), segmenter="s", token_counter="c", run_id="r") for t, x in TEXTS.items()]
        got = many.replace_segments_many([(t, _segs(t, x)) for t, x in TEXTS.items()], segmenter="s", token_counter="c", run_id="r")
        assert got == statuses == ["inserted"] * 3
        assert _dump(one) == _dump(many)
        # again: unchanged; one trace cut differently: replaced (labels-free), in the same batch
        other = [Segment(trace_id="a", segment_index=0, char_start=0, char_end=len(TEXTS["a"]), text=TEXTS["a"], n_tokens=5)]
        got = many.replace_segments_many([("a", other), ("b", _segs("b", TEXTS["b"]))], segmenter="s", token_counter="c")
        assert got == ["replaced", "unchanged"]
        assert [s.text for s in many.segments("a")] == [TEXTS["a"]]
        assert many.replace_segments_many([], segmenter="s", token_counter="c") == []


def test_batch_of_spans_stores_what_the_records_store(tmp_path: Path) -> None:
    """Store.replace_segment_spans_many (texts sliced from the trace) against replace_segments one by one."""
    with _store(tmp_path / "one.duckdb") as one, _store(tmp_path / "spans.duckdb") as spans:
        statuses = [one.replace_segments(t, _segs(t, x), segmenter="s", token_counter="c", run_id="r") for t, x in TEXTS.items()]
        items = [(t, x, [(s.char_start, s.char_end, s.n_tokens) for s in _segs(t, x)]) for t, x in TEXTS.items()]
        assert spans.replace_segment_spans_many(items, segmenter="s", token_counter="c", run_id="r") == statuses
        assert _dump(one) == _dump(spans)
        # again: unchanged, and one trace cut differently in the same batch: replaced (through replace_segments)
        got = spans.replace_segment_spans_many([("a", TEXTS["a"], [(0, len(TEXTS["a"]), 5)]), items[1]], segmenter="s", token_counter="c")
        assert got == ["replaced", "unchanged"]
        assert [(s.text, s.n_tokens) for s in spans.segments("a")] == [(TEXTS["a"], 5)]
        assert spans.replace_segment_spans_many([], segmenter="s", token_counter="c") == []


def test_refused_trace_rolls_back_its_batch_only_and_is_named(tmp_path: Path) -> None:
    with _store(tmp_path / "s.duckdb") as store:
        store.replace_segments_many([("a", _segs("a", TEXTS["a"]))], segmenter="s", token_counter="c")
        store.upsert_labels([Label(trace_id="a", segment_index=0, label="planning", source="human", annotator="h", codebook_version="v")])
        before = _dump(store)
        other = [Segment(trace_id="a", segment_index=0, char_start=0, char_end=len(TEXTS["a"]), text=TEXTS["a"], n_tokens=5)]
        with pytest.raises(StoreError, match="'a'"):
            store.replace_segments_many([("b", _segs("b", TEXTS["b"])), ("a", other)], segmenter="s", token_counter="c")
        assert _dump(store) == before  # "b" of the same batch was rolled back too
        assert store.replace_segments_many([("b", _segs("b", TEXTS["b"]))], segmenter="s", token_counter="c") == ["inserted"]


def test_segment_stage_batches_give_the_per_trace_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    many_texts = {f"t{k:03d}": f"Step {k}: we add {k} and {k}. So it is {2 * k}. Wait, check it." for k in range(30)}
    dumps = []
    for name, size in (("small", 1), ("large", 7)):
        monkeypatch.setattr(pipeline, "SEGMENT_WRITE_TRACES", size)
        with Store(tmp_path / f"{name}.duckdb") as store:
            store.upsert_traces([Trace(trace_id=t, text=x) for t, x in many_texts.items()])
            summary = pipeline.segment(store, workers=1)
            assert summary.inserted == 30 and summary.segments == store.counts()["segments"]
            segs, marks = _dump(store)
            dumps.append((segs, [m[:4] for m in marks]))
    assert dumps[0] == dumps[1]


def test_spacy_abbreviations_cached_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spacy.lang.en import English

    from ror_annotate import segment as seg

    want = {k[:-1].lower() for k in English.Defaults.tokenizer_exceptions if k.endswith(".") and len(k) > 2 and k[:-1].replace(".", "").isalpha()}
    monkeypatch.setenv("ROR_CACHE_DIR", str(tmp_path))
    cache = seg._abbreviation_cache()
    assert cache is not None and cache.parent == tmp_path
    try:
        seg._spacy_abbreviations.cache_clear()
        assert seg._spacy_abbreviations() == want and cache.exists()  # read from spaCy, then written
        seg._spacy_abbreviations.cache_clear()
        cache.write_text('["only-this"]', encoding="utf-8")
        assert seg._spacy_abbreviations() == {"only-this"}  # read from the cache, spaCy not asked
        seg._spacy_abbreviations.cache_clear()
        cache.write_text("not json", encoding="utf-8")
        assert seg._spacy_abbreviations() == want  # a broken cache is read past and rewritten
    finally:
        seg._spacy_abbreviations.cache_clear()

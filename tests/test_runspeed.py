"""The main job's per-process and per-trace costs (issue 26): what the speed changes keep equal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_spacy_stop_words_cached_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spacy.lang.en.stop_words import STOP_WORDS

    from ror_annotate import segment as seg

    monkeypatch.setenv("ROR_CACHE_DIR", str(tmp_path))
    try:
        seg._spacy_stop_words.cache_clear()
        assert seg._spacy_stop_words() == frozenset(STOP_WORDS)  # read from spaCy, then written
        cache = next(tmp_path.glob("spacy-stop-words-*.json"))
        seg._spacy_stop_words.cache_clear()
        cache.write_text('["only-this"]', encoding="utf-8")
        assert seg._spacy_stop_words() == {"only-this"}  # read from the cache, spaCy not asked
        seg._spacy_stop_words.cache_clear()
        cache.write_text("not json", encoding="utf-8")
        assert seg._spacy_stop_words() == frozenset(STOP_WORDS)  # a broken cache is read past and rewritten
    finally:
        seg._spacy_stop_words.cache_clear()
        seg._sentence_starters.cache_clear()


def test_sentence_enders_cached_equal_spacy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spacy.pipeline.sentencizer import Sentencizer

    from ror_annotate import segment as seg

    want = "".join(sorted(set(Sentencizer.default_punct_chars) | {"…"}))
    monkeypatch.setenv("ROR_CACHE_DIR", str(tmp_path))
    try:
        for _ in range(2):  # cold (read from spaCy, written), then warm (read from the file)
            seg._spacy_sentence_enders.cache_clear()
            assert seg._spacy_sentence_enders() == want
        assert list(tmp_path.glob("spacy-sentence-enders-*.json"))
    finally:
        seg._spacy_sentence_enders.cache_clear()


def test_segmenting_with_a_warm_cache_does_not_import_spacy(tmp_path: Path) -> None:
    """spaCy (and through it thinc and torch) costs seconds per process; with the lists cached it is not imported."""
    code = ("import sys; from ror_annotate.segment import Segmenter; "
            "segs = Segmenter().segment('Let x be 2. Then Dr. Smith checks it. So x = 2!', 't'); "
            "print(len(segs), 'spacy' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ROR_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    assert first.stdout.split()[0] == second.stdout.split()[0]  # same segments either way
    assert first.stdout.split()[1] == "True" and second.stdout.split()[1] == "False"


def test_trace_analytics_to_dict_equals_asdict() -> None:
    """The export's per-trace analytics dicts are dataclasses.asdict's (keys, order, values), without the deep copy."""
    import json
    from dataclasses import asdict

    from ror_annotate.analytics import TraceAnalytics

    cases = [
        TraceAnalytics("t1", 3, 40, 1, 12, 0.3, 28, 2, {"planning": 4, "execution": 36}, "42", "41", True, False, True),
        TraceAnalytics("t2", 0, 0, None, None, None, None, None),
    ]
    for a in cases:
        d = a.to_dict()
        assert list(d) == list(asdict(a)) and d == asdict(a)
        assert json.dumps(d, indent=1) == json.dumps(asdict(a), indent=1)
        d["tokens_per_behavior"]["fact"] = 1  # a copy: the analytics object is not changed through it
        assert "fact" not in a.tokens_per_behavior


def _numbered(path: Path, n: int) -> Path:
    import json

    path.write_text("".join(json.dumps({"trace_id": f"n{i:04d}", "trace": f"Step {i}. So the answer is {i}."}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


@pytest.mark.parametrize("keep_chars", [0, 10**9])
def test_ingest_reads_a_small_input_once_and_stores_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_chars: int) -> None:
    """Under INGEST_KEEP_CHARS the validated traces are stored without a second read; the store is the same
    as the two-pass ingest's (traces table and summary), and batches are still committed one by one."""
    from ror_annotate import pipeline, traces
    from ror_annotate.store import Store

    monkeypatch.setattr(pipeline, "INGEST_BATCH", 10)
    monkeypatch.setattr(pipeline, "INGEST_KEEP_CHARS", keep_chars)
    src = _numbered(tmp_path / "t.jsonl", 25)
    reads = {"n": 0}
    real_parse = traces.records_to_traces

    def counting(*a, **kw):
        reads["n"] += 1
        return real_parse(*a, **kw)

    monkeypatch.setattr(traces, "records_to_traces", counting)
    batches = []
    real_upsert = Store.upsert_traces
    monkeypatch.setattr(Store, "upsert_traces", lambda self, ts, **kw: (batches.append(len(ts)), real_upsert(self, ts, **kw))[1])
    with Store(tmp_path / "s.duckdb") as store:
        summary = pipeline.ingest(store, src)
        rows = store.execute("SELECT trace_id, text, problem, source, meta FROM traces ORDER BY trace_id").fetchall()
    assert reads["n"] == (25 if keep_chars else 50)  # records parsed: once, or once per pass
    assert batches == [10, 10, 5]
    assert (summary.read, summary.inserted, summary.unchanged) == (25, 25, 0)
    assert [r[0] for r in rows] == [f"n{i:04d}" for i in range(25)]
    assert rows[3][1] == "Step 3. So the answer is 3." and rows[3][3] == "t.jsonl"


def test_export_reads_segments_as_model_construct_would() -> None:
    """The export's reader builds segments with the segmenter's fast constructor: the same record as
    Segment.model_construct with every field (fields set, dump, equality)."""
    from ror_annotate.records import Segment
    from ror_annotate.segment import _new_segment

    args = dict(trace_id="t-1", segment_index=3, char_start=10, char_end=14, text="abcd", n_tokens=2)
    fast, ref = _new_segment(*args.values()), Segment.model_construct(**args)
    assert fast == ref and fast.model_fields_set == ref.model_fields_set
    assert fast.model_dump_json() == ref.model_dump_json() and type(fast) is Segment


def test_export_reads_labels_as_model_construct_would() -> None:
    """The export's reader builds labels with a fast constructor: the same record as Label.model_construct
    given every field (fields set, dump, equality, label id), for values of every kind."""
    from datetime import datetime, timezone

    from ror_annotate.export.read import _new_label
    from ror_annotate.records import Label

    names = list(Label.model_fields)
    for values in (
        ("tr-1", 4, "reflection", "llm", "openai:gpt", "six-behaviors@v1", None, "s1", 0.75, None,
         datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc), {"note": "x"}, [0.1, 0.9]),
        ("tr-2", 0, "fact", "human", "ann", "v2", None, None, None, None, None, {}, None),
    ):
        fast, ref = _new_label(*values), Label.model_construct(**dict(zip(names, values)))
        assert fast == ref and fast.model_fields_set == ref.model_fields_set == set(names)
        assert fast.model_dump_json() == ref.model_dump_json() and fast.label_id == ref.label_id
        assert type(fast) is Label


def test_export_reads_traces_as_model_construct_would() -> None:
    from ror_annotate.export.read import _new_trace
    from ror_annotate.records import Trace

    names = list(Trace.model_fields)
    for values in (("t-1", "So x = 2.", "What is x?", "2", "2", True, "m", "file.jsonl", "d", "think-tags", {"license": "MIT"}),
                   ("t-2", "Text.", None, None, None, None, None, None, None, None, {})):
        fast, ref = _new_trace(*values), Trace.model_construct(**dict(zip(names, values)))
        assert fast == ref and fast.model_fields_set == ref.model_fields_set == set(names)
        assert fast.model_dump_json() == ref.model_dump_json() and type(fast) is Trace


def _mixed_label_store(path: Path) -> "Store":  # noqa: F821 (imported in the function)
    """Four traces whose segments carry every kind of label mix the export's chooser meets."""
    from datetime import datetime, timedelta, timezone

    from ror_annotate.records import Label, Trace
    from ror_annotate.segment import Segmenter
    from ror_annotate.store import Store

    texts = {f"t{k}": "First we add 2 and 2. Wait, is that right? So the answer is 4. Let me check: 2 + 2 = 4." for k in range(4)}
    store = Store(path)
    store.upsert_traces([Trace(trace_id=t, text=x, problem="What is 2 + 2?") for t, x in texts.items()])
    for t, x in texts.items():
        store.replace_segments(t, Segmenter().segment(x, t), segmenter="s", token_counter="approx:regex-v1")
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    labels = []
    for t in texts:
        for i, seg in enumerate(store.segments(t)):
            kind = (int(t[1:]) + i) % 5
            base = dict(trace_id=t, segment_index=seg.segment_index, codebook_version="v1")
            if kind == 0:  # one baseline label
                labels.append(Label(**base, label="execution", source="baseline", annotator="baseline:cue-v1"))
            elif kind == 1:  # one judge label with a confidence, a model and a distribution
                labels.append(Label(**base, label="planning", source="judge", annotator="openai:m", confidence=0.5 + 0.1 * (i % 3),
                                    extra={"model": f"m-{i % 2}", "prompt_template_hash": "h"},
                                    distribution=[0.1, 0.7, 0.05, 0.05, 0.05, 0.05] if i % 2 else None))
            elif kind == 2:  # one imported label (not chosen by auto)
                labels.append(Label(**base, label="fact", source="import", annotator="other:x"))
            elif kind == 3:  # a judge label and a human one: the human reference decides
                labels.append(Label(**base, label="reflection", source="judge", annotator="openai:m", created_at=at))
                labels.append(Label(**base, label="fact", source="human", annotator="ann-1", study="s", created_at=at + timedelta(1)))
            # kind 4: no label
    store.upsert_labels(labels)
    return store


@pytest.mark.parametrize("label_source", ["auto", "baseline", "judge", "import", "human", "majority"])
def test_export_chooser_equals_choosing_each_segment_from_its_records(tmp_path: Path, label_source: str) -> None:
    """The chooser's per-content reuse gives every segment what choose_label, _raters and _human_verified give
    on that segment's own Label records (the path every segment took before)."""
    from ror_annotate.export import build, read
    from ror_annotate.export.labels import choose_label
    from ror_annotate.records import Label

    with _mixed_label_store(tmp_path / "s.duckdb") as store:
        keys = read.trace_keys(store)
        kinds = store.rater_kinds()
        stats = build._Stats()
        chooser = build._Chooser(label_source, None, kinds, stats)
        n_ties = 0
        checked = 0
        for batch in read.batches(store, keys, max_segments=3, max_traces=1):
            for t in batch.traces:
                for s in batch.segments[t.trace_id]:
                    key = (t.trace_id, s.segment_index)
                    records = [lab for lab in store.labels(trace_id=t.trace_id) if lab.segment_index == s.segment_index]
                    assert all(isinstance(lab, Label) for lab in batch.labels_of(key))
                    want, tied = choose_label(records, label_source)
                    n_ties += tied
                    got = chooser.choose(batch, key)
                    assert got == (want, build._raters(records, kinds), build._human_verified(records, want)), key
                    checked += 1
        assert checked >= 16 and stats.n_ties == n_ties
        assert len(chooser.memo) < checked  # contents were reused


def test_label_stage_workers_store_the_same_labels(tmp_path: Path, real_traces_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pipeline.label(workers=N) hands N to the baseline judge; the stored labels do not depend on it."""
    import json

    from ror_annotate import pipeline
    from ror_annotate.judge import baseline
    from ror_annotate.records import Trace
    from ror_annotate.store import Store

    monkeypatch.setattr(baseline, "TASK_SEGMENTS", 200)  # several tasks: the pool path runs with 2 workers
    seen: list[int | None] = []
    real = baseline.classify_many

    def spy(items, *, workers=None, task_segments=baseline.TASK_SEGMENTS):  # type: ignore[no-untyped-def]
        seen.append(workers)
        return real(items, workers=workers, task_segments=task_segments)

    monkeypatch.setattr(baseline, "classify_many", spy)
    rows = [json.loads(line) for line in real_traces_path.open(encoding="utf-8")][:8]
    dumps = []
    for workers in (1, 2):
        with Store(tmp_path / f"w{workers}.duckdb") as store:
            store.upsert_traces([Trace(trace_id=r["trace_id"], text=r["trace"], problem=r.get("problem")) for r in rows])
            pipeline.segment(store, workers=1)
            summary = pipeline.label(store, judge="baseline", workers=workers)
            assert summary.labeled == store.counts()["segments"] > 100
            dumps.append(store.execute(
                "SELECT label_id, trace_id, segment_index, label, rationale FROM labels ORDER BY label_id").fetchall())
    assert seen == [1, 2]
    assert dumps[0] == dumps[1]

"""The DuckDB store: idempotence, transactions, schema versions, locking across processes (DB-01)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from ror_annotate.errors import SchemaVersionError, StoreError, StoreLockedError
from ror_annotate.records import Label, Segment, Trace
from ror_annotate.store import CORE_MIGRATIONS, Store, scrub_secrets

from .conftest import load_pitfall

TEXT = "Let me think. 3.14 × 2 = 6.28 🙂 答案。"


def _trace(tid: str = "t1", text: str = TEXT) -> Trace:
    return Trace(trace_id=tid, text=text, problem="What is 2π?", model="m", dataset="d")


def _segments(tid: str = "t1") -> list[Segment]:
    return [
        Segment(trace_id=tid, segment_index=0, char_start=0, char_end=13, text=TEXT[0:13], n_tokens=4),
        Segment(trace_id=tid, segment_index=1, char_start=14, char_end=len(TEXT), text=TEXT[14:], n_tokens=9),
    ]


def _label(i: int, label: str = "planning", annotator: str = "a1") -> Label:
    return Label(trace_id="t1", segment_index=i, label=label, source="human", annotator=annotator, codebook_version="cb")


def test_roundtrip_non_ascii_and_idempotent(db_path: Path) -> None:
    with Store(db_path) as store:
        assert store.upsert_traces([_trace()]) == {"inserted": 1, "unchanged": 0}
        assert store.upsert_traces([_trace()]) == {"inserted": 0, "unchanged": 1}
        assert store.replace_segments("t1", _segments(), segmenter="s", token_counter="c") == "inserted"
        assert store.replace_segments("t1", _segments(), segmenter="s", token_counter="c") == "unchanged"
        store.upsert_labels([_label(0), _label(1, "execution")])
        store.upsert_labels([_label(0), _label(1, "execution")])
        assert store.counts() == {"traces": 1, "segments": 2, "labels": 2, "runs": 0}
    with Store(db_path) as store:
        trace = store.get_trace("t1")
        assert trace.text == TEXT
        seg = store.segments("t1")[1]
        assert trace.text[seg.char_start:seg.char_end] == seg.text == "3.14 × 2 = 6.28 🙂 答案。"
        assert [lab.label for lab in store.labels()] == ["planning", "execution"]


def test_segment_rows_by_trace_are_the_stored_spans_and_build_validated_records(db_path: Path) -> None:
    from pydantic import ValidationError

    from ror_annotate.records import segments_of_rows

    with Store(db_path) as store:
        store.upsert_traces([_trace("t1"), _trace("t2")])
        store.replace_segments("t1", _segments("t1"), segmenter="s", token_counter="c")
        rows = store.segment_rows_by_trace(["t1", "t2", "absent"])
        # the hand-made spans above, as plain tuples; traces without segments map to []
        assert rows == {"t1": [("t1", 0, 0, 13, "Let me think.", 4), ("t1", 1, 14, 35, "3.14 × 2 = 6.28 🙂 答案。", 9)],
                        "t2": [], "absent": []}
        assert segments_of_rows(rows["t1"]) == store.segments_by_trace(["t1"])["t1"] == _segments("t1")
        with pytest.raises(ValidationError, match="span length"):
            segments_of_rows([("t1", 0, 0, 5, "Let me think.", 4)])


def test_relabel_replaces_not_duplicates(db_path: Path) -> None:
    with Store(db_path) as store:
        store.upsert_traces([_trace()])
        store.replace_segments("t1", _segments(), segmenter="s", token_counter="c")
        store.upsert_labels([_label(0, "planning")])
        store.upsert_labels([_label(0, "reflection")])
        labels = store.labels()
        assert [(lab.segment_index, lab.label) for lab in labels] == [(0, "reflection")]


def test_changed_text_under_same_id_is_refused(db_path: Path) -> None:
    with Store(db_path) as store:
        store.upsert_traces([_trace()])
        with pytest.raises(StoreError, match="different text"):
            store.upsert_traces([_trace(text="something else")])
        assert store.get_trace("t1").text == TEXT


def test_resegmenting_with_labels_needs_force(db_path: Path) -> None:
    with Store(db_path) as store:
        store.upsert_traces([_trace()])
        store.replace_segments("t1", _segments(), segmenter="s", token_counter="c")
        store.upsert_labels([_label(0)])
        one = [Segment(trace_id="t1", segment_index=0, char_start=0, char_end=len(TEXT), text=TEXT, n_tokens=12)]
        with pytest.raises(StoreError, match="labels refer"):
            store.replace_segments("t1", one, segmenter="s2", token_counter="c")
        assert len(store.segments("t1")) == 2 and store.counts()["labels"] == 1
        assert store.replace_segments("t1", one, segmenter="s2", token_counter="c", force=True) == "replaced"
        assert len(store.segments("t1")) == 1 and store.counts()["labels"] == 0


def test_label_for_unknown_segment_writes_nothing(db_path: Path) -> None:
    with Store(db_path) as store:
        store.upsert_traces([_trace()])
        store.replace_segments("t1", _segments(), segmenter="s", token_counter="c")
        with pytest.raises(StoreError, match="t1#7"):
            store.upsert_labels([_label(0), _label(7)])
        assert store.counts()["labels"] == 0


def test_transaction_rolls_back_on_error(db_path: Path) -> None:
    with Store(db_path) as store:
        store.upsert_traces([_trace()])
        store.replace_segments("t1", _segments(), segmenter="s", token_counter="c")
        with pytest.raises(RuntimeError):
            with store.transaction():
                store.upsert_labels([_label(0)])
                raise RuntimeError("crash mid-stage")
        assert store.counts()["labels"] == 0


def test_schema_versions_and_stage_migrations(db_path: Path) -> None:
    with Store(db_path) as store:
        assert store.schema_version("core") == len(CORE_MIGRATIONS)
        store.migrate("demo", ["CREATE TABLE demo (x INTEGER)", "ALTER TABLE demo ADD COLUMN y INTEGER"])
        assert store.schema_version("demo") == 2
        store.migrate("demo", ["CREATE TABLE demo (x INTEGER)", "ALTER TABLE demo ADD COLUMN y INTEGER"])  # no-op
        with pytest.raises(SchemaVersionError, match="v2"):
            store.migrate("demo", ["CREATE TABLE demo (x INTEGER)"])


def test_runs_never_store_secrets(db_path: Path) -> None:
    with Store(db_path) as store:
        run = store.start_run("label", {"judge": "openai:x", "api_key": "sk-secret-value", "nested": {"hf_token": "hf_abc"}})
        store.finish_run(run.run_id, counts={"labeled": 3})
        raw = store.execute("SELECT parameters FROM runs").fetchone()[0]
    assert "sk-secret-value" not in raw and "hf_abc" not in raw
    assert scrub_secrets({"token": "", "x": 1}) == {"token": "", "x": 1}


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from ror_annotate.records import Label
    from ror_annotate.store import Store
    store = Store(sys.argv[1])
    store.upsert_labels([Label(trace_id="t1", segment_index=0, label="fact", source="human", annotator="helper", codebook_version="cb")])
    print("locked", flush=True)
    time.sleep(3)
    store.close()
    """
)


def test_db01_lock_across_processes(db_path: Path) -> None:
    """shared/pitfalls/DB-01: a second process waits with backoff, or gets our own error naming the file."""
    case = load_pitfall("DB-01")
    assert case["expected"]["final_rows"] == 3
    with Store(db_path) as store:
        store.upsert_traces([_trace()])
        store.replace_segments("t1", _segments(), segmenter="s", token_counter="c")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(db_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        # (b) short timeout: our own lock error, naming the file and the wait, wrapping duckdb.IOException.
        # Raising at all shows it gave up before the holder released (waiting longer would have connected).
        with pytest.raises(StoreLockedError) as info:
            Store(db_path, lock_timeout=0.5)
        assert str(db_path.resolve()) in str(info.value) and isinstance(info.value.__cause__, duckdb.IOException)
        assert "waited 0.5 s" in str(info.value) and "--lock-timeout" in str(info.value)
        # (a) long timeout: waits for the holder to release, then writes
        with Store(db_path, lock_timeout=10) as store:
            store.upsert_labels([_label(0, "planning", "a")])
    finally:
        holder.wait(timeout=20)
    # (c) a reader after release sees both rows
    with Store(db_path, lock_timeout=10) as store:
        assert sorted(lab.annotator for lab in store.labels()) == ["a", "helper"]
        # same process: a second handle (a "read-only view") shares the connection, no configuration clash
        with Store(db_path) as view:
            assert view.con is store.con
            view.upsert_labels([_label(1, "execution", "b")])
        assert store.counts()["labels"] == case["expected"]["final_rows"]


def test_resegmenting_with_the_same_rules_does_no_work(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-run skips traces segmented by the same rule set, cap and counter; a new cap re-segments."""
    from ror_annotate import pipeline
    from ror_annotate.segment import SEGMENTER_NAME, Segmenter

    with Store(db_path) as store:
        store.upsert_traces([_trace()])
        first = pipeline.segment(store, ["t1"], max_tokens=125)
        assert first.inserted == 1 and first.segments == len(store.segments("t1"))

        def must_not_run(self, text, trace_id):
            raise AssertionError("segmenter ran again on an unchanged trace")

        monkeypatch.setattr(Segmenter, "segment", must_not_run)
        again = pipeline.segment(store, ["t1"], max_tokens=125)
        assert (again.unchanged, again.inserted, again.replaced, again.segments) == (1, 0, 0, first.segments)
        monkeypatch.undo()
        other_cap = pipeline.segment(store, ["t1"], max_tokens=64)
        # the short trace splits the same way under a 64-token cap: spans kept, provenance updated
        assert (other_cap.unchanged, other_cap.replaced, other_cap.segments) == (1, 0, first.segments)
        assert store.segmentation_of("t1") == (f"{SEGMENTER_NAME}:max64", "approx:regex-v1")


def test_a_v3_store_migrates_its_labels_to_a_table_without_an_index(tmp_path: Path) -> None:
    db = tmp_path / "v3.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE schema_versions (component VARCHAR PRIMARY KEY, version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)")
    for migration in CORE_MIGRATIONS[:3]:
        for statement in migration.split(";"):
            if statement.strip():
                con.execute(statement)
    con.execute("INSERT INTO schema_versions VALUES ('core', 3, now())")
    con.execute("INSERT INTO traces (trace_id, text, text_sha256, meta, ingested_at) VALUES ('t1', ?, 'x', '{}', now())", [TEXT])
    con.execute("INSERT INTO segments VALUES ('t1', 0, 0, 13, ?, 4)", [TEXT[:13]])
    lab = _label(0)
    con.execute(
        "INSERT INTO labels VALUES (?, 't1', 0, 'planning', 'human', 'a1', 'cb', NULL, NULL, NULL, 'why 🙂', now(), '{}')",
        [lab.label_id],
    )
    con.close()
    with Store(db) as store:
        assert store.schema_version("core") == len(CORE_MIGRATIONS)
        (kept,) = store.labels()
        assert (kept.label_id, kept.rationale) == (lab.label_id, "why 🙂")
        assert store.execute(
            "SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'labels' AND constraint_type = 'PRIMARY KEY'"
        ).fetchone() == (0,)
        assert store.execute("SELECT count(*) FROM duckdb_indexes() WHERE table_name = 'labels'").fetchone() == (0,)
        # upserting keeps one row per label id, also when one call repeats an id (the last one wins)
        store.upsert_labels([_label(0, "fact")])
        assert store.upsert_labels([_label(0, "execution"), _label(0, "reflection")]) == 1
        assert [(x.label_id, x.label) for x in store.labels()] == [(lab.label_id, "reflection")]


def test_duckdb_memory_limit_from_the_argument_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ror_annotate.errors import ConfigError

    with Store(tmp_path / "a.duckdb", memory_limit="200MB") as store:
        # DuckDB reports the limit in binary units: 200 MB = 200e6 bytes = 190.7 MiB
        assert store.execute("SELECT current_setting('memory_limit')").fetchone() == ("190.7 MiB",)
    monkeypatch.setenv("ROR_DUCKDB_MEMORY_LIMIT", "1GB")
    with Store(tmp_path / "b.duckdb") as store:
        assert store.execute("SELECT current_setting('memory_limit')").fetchone() == ("953.6 MiB",)
    monkeypatch.setenv("ROR_DUCKDB_MEMORY_LIMIT", "lots")
    with pytest.raises(ConfigError, match="ROR_DUCKDB_MEMORY_LIMIT='lots'"):
        Store(tmp_path / "c.duckdb")
    assert not (tmp_path / "c.duckdb").exists()


def test_rowid_ranges_by_hand() -> None:
    from ror_annotate.store import rowid_ranges

    assert rowid_ranges([]) == []
    assert rowid_ranges([1, 2, 3, 7, 8, 20]) == [(1, 3), (7, 8), (20, 20)]
    # two ranges at most: the gap 3 -> 7 (4) is smaller than 8 -> 20 (12), so that one is closed
    assert rowid_ranges([1, 2, 3, 7, 8, 20], max_ranges=2) == [(1, 8), (20, 20)]
    assert rowid_ranges([1, 2, 3, 7, 8, 20], max_ranges=1) == [(1, 20)]


def _many_segments(tid: str, n: int) -> tuple[Trace, list[Segment]]:
    words = [f"w{i}é" for i in range(n)]  # 3-5 characters each, one space apart
    text = " ".join(words)
    segs, pos = [], 0
    for i, w in enumerate(words):
        segs.append(Segment(trace_id=tid, segment_index=i, char_start=pos, char_end=pos + len(w), text=w, n_tokens=1))
        pos += len(w) + 1
    return Trace(trace_id=tid, text=text), segs


def test_reads_by_trace_touch_only_their_rows_and_match_a_plain_filter(db_path: Path) -> None:
    """segments_by_trace / labels(trace_ids=) / rows_of_traces return what a plain ``trace_id IN`` filter
    returns, also for a trace whose rows lie in two places and for rows of an open transaction; the
    condition's row-id ranges cover the traces' rows and not the whole table."""
    from ror_annotate.store import ROWID_BUCKET

    sizes = {"a": 3000, "b": 3000, "c": 2000}
    with Store(db_path) as store:
        for tid, n in sizes.items():  # rows 0-2999 (a), 3000-5999 (b), 6000-7999 (c)
            trace, segs = _many_segments(tid, n)
            store.upsert_traces([trace])
            store.replace_segments(tid, segs, segmenter="s", token_counter="c")

        def plain(table: str, ids: list[str]) -> list[tuple]:
            return store.execute(
                f"SELECT trace_id, segment_index FROM {table} WHERE list_contains(?, trace_id) ORDER BY 1, 2", [ids]
            ).fetchall()

        condition, params = store.trace_filter("segments", ["b"])
        bounds = params[:-1]
        # b's rows 3000..5999 are buckets 1 and 2 of 2048 rows: one range, rows 2048..6143
        assert bounds == [ROWID_BUCKET, 3 * ROWID_BUCKET - 1] and params[-1] == ["b"] and "rowid BETWEEN" in condition
        assert store.trace_filter("segments", ["nope"]) is None and store.trace_filter("segments", []) is None

        labels = [Label(trace_id=t, segment_index=i, label="fact", source="baseline", annotator="x", codebook_version="v")
                  for t in ("a", "b", "c") for i in range(sizes[t])]  # label rows as the segments: a, b, c
        store.upsert_labels(labels)
        store.upsert_labels([Label(trace_id="a", segment_index=1, label="fact", source="human", annotator="h", codebook_version="v")])
        # a's labels now sit in two places: rows 0..2999 (buckets 0-1) and row 8000 (bucket 3)
        assert store.trace_filter("labels", ["a"])[1][:-1] == [0, 2 * ROWID_BUCKET - 1, 3 * ROWID_BUCKET, 4 * ROWID_BUCKET - 1]
        for ids in (["a"], ["b"], ["c", "a"], ["a", "b", "c"]):
            got = store.segments_by_trace(ids)
            assert sorted((s.trace_id, s.segment_index) for v in got.values() for s in v) == plain("segments", ids), ids
            assert [(x.trace_id, x.segment_index) for x in store.labels(trace_ids=ids)] == plain("labels", ids), ids

        with store.transaction():  # rows not yet committed are found too
            store.upsert_labels([Label(trace_id="b", segment_index=5, label="planning", source="human", annotator="h",
                                       codebook_version="v")])
            got = store.labels(source="human", trace_ids=["b"])
            assert [(x.trace_id, x.segment_index, x.label) for x in got] == [("b", 5, "planning")]
            # an upsert of a stored id replaces it, found through the same ranges
            store.upsert_labels([Label(trace_id="a", segment_index=1, label="reflection", source="human", annotator="h",
                                       codebook_version="v")])
        human = store.labels(source="human", trace_ids=["a", "b"])
        assert [(x.trace_id, x.segment_index, x.label) for x in human] == [("a", 1, "reflection"), ("b", 5, "planning")]
        assert store.execute("SELECT count(*), count(DISTINCT label_id) FROM labels").fetchone() == (len(labels) + 2,) * 2
        with pytest.raises(StoreError, match="b#3000 names a segment that is not"):
            store.upsert_labels([Label(trace_id="b", segment_index=3000, label="fact", source="human", annotator="h", codebook_version="v")])


def _file_alone(path: Path, copy: Path) -> Path:
    """A copy of the store file without its write-ahead log (what a checkpoint must make complete)."""
    import shutil

    shutil.copyfile(path, copy)
    return copy


def test_checkpoint_puts_the_wal_into_the_store_file(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    wal = Path(f"{path}.wal")
    with Store(path) as store:
        store.upsert_traces([_trace()])
        store.replace_segments("t1", _segments(), segmenter="s", token_counter="c")
        assert wal.exists() and wal.stat().st_size > 0  # small writes stay in the WAL (DuckDB's 16 MiB threshold)
        with duckdb.connect(str(_file_alone(path, tmp_path / "before.duckdb"))) as con:
            # the rows are in the log only (the schema may be in the file: the commit journal checkpoints its file id first)
            assert con.execute("SELECT coalesce(sum(estimated_size), 0) FROM duckdb_tables() WHERE table_name IN ('traces', 'segments')").fetchone() == (0,)
        with store.transaction():
            assert store.checkpoint() is False  # never inside a transaction
        assert wal.stat().st_size > 0
        assert store.checkpoint() is True
        assert not wal.exists() or wal.stat().st_size == 0
        assert store.con.sql("SELECT count(*) FROM traces").fetchall() == [(1,)]  # no unfinished result left behind
        with duckdb.connect(str(_file_alone(path, tmp_path / "after.duckdb"))) as con:
            assert con.execute("SELECT text FROM segments ORDER BY segment_index").fetchall() == [(TEXT[0:13],), (TEXT[14:],)]
    with Store(path, read_only=True) as store:
        assert store.checkpoint() is False


def _limit_bytes(shown: str) -> float:
    number, unit = shown.split()
    return float(number) * 1024 ** ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB").index(unit)


def test_release_cache_drops_cached_blocks_and_keeps_the_configured_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cached(store: Store) -> int:
        row = store.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'BASE_TABLE'").fetchone()
        return int(row[0])

    for configured in ("300MB", None):
        path = tmp_path / f"{configured}.duckdb"
        with Store(path, memory_limit=configured) as store:
            store.execute("CREATE TABLE big AS SELECT i, repeat('x', 200) || i::VARCHAR AS s FROM range(200000) r(i)")
            store.execute("CHECKPOINT")
        with Store(path, memory_limit=configured) as store:
            limit = store.execute("SELECT current_setting('memory_limit')").fetchone()
            assert store.execute("SELECT sum(length(s)) FROM big").fetchone()[0] > 40_000_000
            before = cached(store)
            assert before > 2**20  # the scan left the table's blocks cached
            assert store.release_cache(keep_bytes=before) == 0  # under the threshold: nothing to do
            with store.transaction():
                assert store.release_cache(keep_bytes=0, force=True) == 0  # never inside a transaction
            current = cached(store)  # the first transaction checkpointed the commit journal's file id (a block of its own)
            dropped = store.release_cache(keep_bytes=0, force=True)
            assert dropped > 0 and cached(store) == current - dropped < before
            # DuckDB 1.x: the default limit is set back from its displayed value (0.1 of its unit)
            restored = store.execute("SELECT current_setting('memory_limit')").fetchone()
            assert restored == limit or (configured is None and _limit_bytes(restored[0]) == pytest.approx(_limit_bytes(limit[0]), rel=1e-3)), configured
            assert store.execute("SELECT count(*) FROM big").fetchone() == (200000,)  # the blocks are read again
            # at most one look per CACHE_CHECK_SECONDS
            import ror_annotate.store.connection as store_module  # where release_cache reads it

            monkeypatch.setattr(store_module, "CACHE_CHECK_SECONDS", 3600.0)
            store.execute("SELECT sum(length(s)) FROM big").fetchone()
            assert store.release_cache(keep_bytes=0) == 0 and cached(store) > 0
            monkeypatch.undo()


def test_v5_declared_annotators_and_label_distributions(tmp_path: Path) -> None:
    from ror_annotate.records import Annotator, Label

    with Store(tmp_path / "s.duckdb") as store:
        store.upsert_traces([Trace(trace_id="t1", text=TEXT)])
        store.replace_segments("t1", [Segment(trace_id="t1", segment_index=0, char_start=0, char_end=13, text=TEXT[:13], n_tokens=4)],
                               segmenter="s", token_counter="c")
        dist = [0.7, 0.1, 0.05, 0.05, 0.05, 0.05]
        lab = Label(trace_id="t1", segment_index=0, label="planning", source="aggregate", annotator="aggregate:dawid-skene",
                    codebook_version="cb", confidence=0.7, distribution=dist)
        store.upsert_labels([lab])
        (back,) = store.labels(source="aggregate")
        assert back.distribution == dist and back.confidence == 0.7
        store.upsert_annotators([
            Annotator(annotator="openai:m", kind="machine", source="judge", model="m", provider="https://user:pw@host/v1?key=sk-abc",
                      temperature=0.0, samples=3, codebook_version="cb"),
            Annotator(annotator="aggregate:dawid-skene", kind="machine", source="aggregate", model="dawid-skene",
                      details={"raters": ["openai:m", "baseline:cue-v1"]}),
        ])
        declared = store.declared_annotators()
        assert set(declared) == {"openai:m", "aggregate:dawid-skene"}
        assert "pw" not in (declared["openai:m"].provider or "") and "sk-abc" not in (declared["openai:m"].provider or "")
        assert declared["openai:m"].samples == 3 and declared["aggregate:dawid-skene"].details["raters"][1] == "baseline:cue-v1"
        assert store.rater_kinds() == {"aggregate:dawid-skene": "machine"}
    with pytest.raises(ValueError, match="distribution must be 6 probabilities"):
        Label(trace_id="t1", segment_index=0, label="planning", source="aggregate", annotator="a", codebook_version="cb",
              distribution=[0.5, 0.5])

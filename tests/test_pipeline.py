"""The pipeline as a library: Store.run, store transactions and errors, dependents of segments,
read-only stores, the progress file, the lazy public API, and pipeline.run == ``ror run``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from ror_annotate import pipeline
from ror_annotate.errors import InputError, StoreError, StoreReadOnlyError
from ror_annotate.records import Label, Segment, Trace
from ror_annotate.store import ProgressFile, Store

ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]

# Three small traces written for these tests (not produced by the code under test).
TRACES = [
    {"trace_id": "p1", "problem": "What is 2 + 3?", "trace": "Let me add 2 and 3. 2 + 3 = 5. Wait, is that right? Yes. So the answer is 5.", "answer": "5"},
    {"trace_id": "p2", "problem": "Is 7 prime?", "trace": "A prime has no divisors but 1 and itself. 7 is not divisible by 2, 3 or 5. So 7 is prime.", "answer": "yes"},
    {"trace_id": "p3", "problem": "Ünïcode 😀 test", "trace": "First, restate: the input has emoji 😀 and CJK 中文。Then I check each character. So it works.", "answer": "ok"},
]


def _write_traces(path: Path) -> Path:
    path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in TRACES), encoding="utf-8")
    return path


def _trace(tid: str = "t1", text: str = "One. Two. Three.") -> Trace:
    return Trace(trace_id=tid, text=text)


def _segments(tid: str, spans: list[tuple[int, int]], text: str) -> list[Segment]:
    return [Segment(trace_id=tid, segment_index=i, char_start=s, char_end=e, text=text[s:e], n_tokens=1) for i, (s, e) in enumerate(spans)]


# ----------------------------------------------------------------------------- Store.run
@pytest.mark.parametrize(
    ("raised", "status"),
    [(None, "ok"), (ValueError("boom"), "failed"), (KeyboardInterrupt(), "interrupted")],
)
def test_store_run_records_how_the_command_ended(db_path: Path, raised: BaseException | None, status: str) -> None:
    with Store(db_path) as store:
        with pytest.raises(type(raised)) if raised is not None else _nothing():
            with store.run("demo", {"api_key": "sk-secret", "base_url": "http://u:pw@host/v1"}) as run:
                run.counts["done"] = 3
                if raised is not None:
                    raise raised
        (rec,) = store.runs()
    assert rec.status == status
    assert rec.counts["done"] == 3
    assert rec.parameters == {"api_key": "***", "base_url": "http://u:***@host/v1"}
    if status == "failed":
        assert rec.counts["error"] == "ValueError: boom"
    state = ProgressFile.read(db_path)
    assert state is not None and state["status"] == status and state["run_id"] == rec.run_id
    assert "sk-secret" not in json.dumps(state)


def test_duckdb_interrupt_is_recorded_as_interrupted(db_path: Path) -> None:
    with Store(db_path) as store:
        with pytest.raises(KeyboardInterrupt):
            with store.run("demo"):
                raise duckdb.InterruptException("Query interrupted")
        assert store.runs()[0].status == "interrupted"


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


# ----------------------------------------------------------------------------- transactions and errors
def test_two_handles_on_one_file_share_one_transaction(db_path: Path) -> None:
    with Store(db_path) as a, Store(db_path) as b:
        with a.transaction():
            a.upsert_traces([_trace("t1")])
            with b.transaction():  # joins a's transaction instead of a nested BEGIN
                b.upsert_traces([_trace("t2", "Other text.")])
            assert a.in_transaction and b.in_transaction
        assert not a.in_transaction
        assert a.trace_ids() == b.trace_ids() and sorted(a.trace_ids()) == ["t1", "t2"]
        # a failure inside the inner block rolls back the whole outer transaction
        with pytest.raises(RuntimeError):
            with a.transaction():
                a.upsert_traces([_trace("t3", "Third.")])
                with b.transaction():
                    raise RuntimeError("inner failure")
        assert sorted(b.trace_ids()) == ["t1", "t2"]


def test_duckdb_errors_become_coded_store_errors(db_path: Path) -> None:
    with Store(db_path) as store:
        with pytest.raises(StoreError) as info:
            store.execute("SELEC 1")
        assert info.value.code == "E200" and str(db_path.name) in info.value.message
        with pytest.raises(StoreError):
            with store.transaction():
                store.execute("INSERT INTO no_such_table VALUES (1)")
        assert not store.in_transaction
        store.upsert_traces([_trace()])  # the store is still usable


# ----------------------------------------------------------------------------- segment identity
def _segmented_store(store: Store) -> str:
    text = "One. Two. Three."
    store.upsert_traces([_trace("t1", text)])
    store.replace_segments("t1", _segments("t1", [(0, 4), (5, 9), (10, 16)], text), segmenter="s", token_counter="c")
    return text


def test_resegmenting_cascades_to_derived_rows(db_path: Path) -> None:
    from ror_annotate.judge.llm import ensure_judge_tables

    with Store(db_path) as store:
        text = _segmented_store(store)
        ensure_judge_tables(store)
        store.execute(
            "INSERT INTO judge_failures (trace_id, segment_index, annotator, codebook_version, reason, attempts, run_id, created_at) "
            "VALUES ('t1', 1, 'openai:m', 'cb', 'invalid', 4, NULL, now())"
        )
        store.upsert_labels([Label(trace_id="t1", segment_index=0, label="execution", source="baseline", annotator="b", codebook_version="v")])
        with pytest.raises(StoreError, match="1 labels refer"):
            store.replace_segments("t1", _segments("t1", [(0, 9), (10, 16)], text), segmenter="s2", token_counter="c")
        assert len(store.segments("t1")) == 3  # nothing changed
        assert store.replace_segments("t1", _segments("t1", [(0, 9), (10, 16)], text), segmenter="s2", token_counter="c", force=True) == "replaced"
        assert [(s.char_start, s.char_end) for s in store.segments("t1")] == [(0, 9), (10, 16)]
        assert store.counts()["labels"] == 0
        assert store.execute("SELECT count(*) FROM judge_failures").fetchone()[0] == 0


@pytest.mark.parametrize("registered", [True, False])
def test_resegmenting_refuses_while_review_rows_refer_to_the_trace(db_path: Path, registered: bool) -> None:
    with Store(db_path) as store:
        text = _segmented_store(store)
        if registered:
            from ror_annotate.review.studies import ensure_tables

            ensure_tables(store)
            store.execute("INSERT INTO review_items (study, trace_id, segment_index, item_order) VALUES ('pilot', 't1', 1, 0)")
            table = "review_items"
        else:  # a stage table nobody declared: refused too (the safe default)
            store.execute("CREATE TABLE my_notes (trace_id VARCHAR, segment_index INTEGER, note VARCHAR)")
            store.execute("INSERT INTO my_notes VALUES ('t1', 2, 'interesting')")
            table = "my_notes"
        with pytest.raises(StoreError, match=table):
            store.replace_segments("t1", _segments("t1", [(0, 16)], text), segmenter="s2", token_counter="c", force=True)
        assert [(s.char_start, s.char_end) for s in store.segments("t1")] == [(0, 4), (5, 9), (10, 16)]
        assert store.segmentation_of("t1") == ("s", "c")


# ----------------------------------------------------------------------------- read-only stores
def test_read_only_store_reads_and_refuses_writes(db_path: Path) -> None:
    with Store(db_path) as store:
        _segmented_store(store)
    before = db_path.read_bytes()
    with Store(db_path, read_only=True) as ro:
        assert ro.trace_ids() == ["t1"] and len(ro.segments("t1")) == 3
        with pytest.raises(StoreReadOnlyError):
            ro.upsert_traces([_trace("t2", "x.")])
        with pytest.raises(StoreReadOnlyError):
            with ro.run("demo"):
                pass
        with pytest.raises(StoreError):
            ro.execute("DELETE FROM traces")
    assert db_path.read_bytes() == before
    with pytest.raises(StoreError, match="no store"):
        Store(db_path.with_name("missing.duckdb"), read_only=True)
    assert not db_path.with_name("missing.duckdb").exists()


# ----------------------------------------------------------------------------- public API
def test_import_is_lazy_and_exposes_the_api() -> None:
    code = (
        "import sys, ror_annotate as ror\n"
        "assert callable(ror.pipeline.run) and callable(ror.segment_text) and ror.Store.__name__ == 'Store'\n"
        "assert callable(ror.agreement.cohen_kappa) and callable(ror.load_traces) and ror.review is not None\n"
        "heavy = [m for m in ('torch', 'label_studio_sdk', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print(len(ror.segment_text('Let me try. Wait, no.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == 2


def test_pipeline_functions_return_typed_summaries(tmp_path: Path) -> None:
    src = _write_traces(tmp_path / "t.jsonl")
    with Store(tmp_path / "s.duckdb") as store:
        ing = pipeline.ingest(store, src)
        assert (ing.read, ing.inserted, ing.trace_ids) == (3, 3, ["p1", "p2", "p3"])
        seg = pipeline.segment(store)
        assert seg.traces == 3 and seg.segments == len(store.segments()) and seg.inserted == 3
        lab = pipeline.label(store, judge="baseline")
        assert lab.labeled == seg.segments and lab.annotator == "baseline:cue-v1"
        again = pipeline.label(store)
        assert (again.labeled, again.skipped) == (0, seg.segments)
        commands = [(r.command, r.status) for r in store.runs()]
        # each stage ends with a checkpoint: the store file alone holds every label, without its WAL
        alone = tmp_path / "alone.duckdb"
        alone.write_bytes((tmp_path / "s.duckdb").read_bytes())
        with duckdb.connect(str(alone), read_only=True) as con:
            assert con.execute("SELECT count(*) FROM labels").fetchone() == (seg.segments,)
    assert commands == [("ingest", "ok"), ("segment", "ok"), ("label", "ok"), ("label", "ok")]
    with pytest.raises(InputError, match="no such file"):
        pipeline.check_source(tmp_path / "missing.jsonl")


def test_missing_input_creates_no_store(tmp_path: Path) -> None:
    done = subprocess.run([*ROR, "run", "missing.jsonl", "--db", "new.duckdb"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no such file" in done.stderr
    assert not (tmp_path / "new.duckdb").exists()


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_library_run_and_cli_run_give_byte_identical_exports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # the manifest's build time, for both runs
    src = _write_traces(tmp_path / "traces.jsonl")
    (tmp_path / "lib").mkdir()
    (tmp_path / "cli").mkdir()
    with Store(tmp_path / "lib" / "s.duckdb") as store:
        summary = pipeline.run(store, src, out=tmp_path / "lib" / "demo")
    assert summary.segment.segments > 0 and summary.label.labeled == summary.segment.segments
    done = subprocess.run([*ROR, "run", str(src), "--db", str(tmp_path / "cli" / "s.duckdb"), "--out", str(tmp_path / "cli" / "demo")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lib, cli = _tree(tmp_path / "lib" / "demo"), _tree(tmp_path / "cli" / "demo")
    assert "ror_export.json" in lib and str(tmp_path) not in lib["ror_export.json"].decode()
    assert sorted(lib) == sorted(cli)
    different = [name for name in lib if lib[name] != cli[name]]
    assert different == []


def test_status_shows_a_running_jobs_progress(tmp_path: Path) -> None:
    db = tmp_path / "busy.duckdb"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom ror_annotate.store import Store\n"
         "with Store(sys.argv[1]) as s, s.run('segment') as r:\n"
         "    s.report_progress('segment', done=7, total=40, info='123 segments')\n"
         "    print('ready', flush=True); time.sleep(60)\n", str(db)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        done = subprocess.run([*ROR, "status", "--db", str(db), "--lock-timeout", "0.2"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "locked by a running job" in " ".join(done.stdout.split())  # rich wraps at the terminal's width
        assert "segment" in done.stdout and "7" in done.stdout and "40" in done.stdout and "running" in done.stdout
    finally:
        holder.kill()
        holder.wait()


def test_an_error_caused_by_an_interrupt_counts_as_the_interrupt(db_path: Path) -> None:
    """A cleanup query on the transaction Ctrl-C aborted fails with "Current transaction is aborted";
    that error must not mask the interrupt (the run is "interrupted", the CLI exits 130)."""
    from ror_annotate.store import is_interrupt, translate_duckdb_error

    try:
        try:
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")
        except duckdb.InterruptException:
            raise duckdb.TransactionException("Current transaction is aborted (please ROLLBACK)")  # noqa: B904
    except duckdb.TransactionException as masked:
        assert is_interrupt(masked)
        assert isinstance(translate_duckdb_error(masked, str(db_path)), KeyboardInterrupt)
    assert not is_interrupt(duckdb.TransactionException("Current transaction is aborted (please ROLLBACK)"))
    assert is_interrupt(RuntimeError("Query interrupted"))
    # Ctrl-C landing while DuckDB reads a registered Arrow table (every bulk insert does) comes back
    # as DuckDB's own InvalidInputException; produced here by the real DuckDB, not constructed.

    class InterruptedArrowStream:
        def __arrow_c_stream__(self, requested_schema: object = None) -> object:
            raise KeyboardInterrupt

    con = duckdb.connect()
    caught: BaseException | None = None
    try:  # DuckDB 2.0 reads the schema in register() and wraps the interrupt; DuckDB 1.3 lets it through
        con.register("v", InterruptedArrowStream())
        con.execute("SELECT * FROM v").fetchall()
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt or duckdb.Error, depending on the version
        caught = exc
    assert isinstance(caught, (KeyboardInterrupt, duckdb.Error))
    assert is_interrupt(caught)
    assert isinstance(translate_duckdb_error(caught, str(db_path)), KeyboardInterrupt)
    con.close()
    assert not is_interrupt(duckdb.InvalidInputException("reading the schema of the object registered as 'v' failed: ValueError: x"))
    with Store(db_path) as store:
        with pytest.raises(KeyboardInterrupt):
            with store.run("demo"):
                try:
                    raise KeyboardInterrupt()
                except KeyboardInterrupt:
                    raise StoreError("store x: TransactionContext Error: Current transaction is aborted")  # noqa: B904
        assert store.runs()[-1].status == "interrupted"


# ----------------------------------------------------------------------------- ingest in two passes
def _numbered_traces(path: Path, n: int, bad_line: int | None = None) -> Path:
    lines = [json.dumps({"trace_id": f"n{i:04d}", "trace": f"Step {i}. So the answer is {i}."}) for i in range(n)]
    if bad_line is not None:
        lines[bad_line - 1] = '{"trace_id": "broken", "trace": '
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_ingest_validates_everything_before_writing_a_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "INGEST_BATCH", 10)
    src = _numbered_traces(tmp_path / "t.jsonl", 35, bad_line=34)  # the bad record is in the 4th batch
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(InputError, match="t.jsonl:34"):
            pipeline.ingest(store, src)
        assert store.counts()["traces"] == 0
        # a conflict with the store, in the last batch, also stores nothing
        store.upsert_traces([Trace(trace_id="n0033", text="other text")])
        with pytest.raises(StoreError, match="n0033"):
            pipeline.ingest(store, _numbered_traces(tmp_path / "u.jsonl", 35))
        assert store.counts()["traces"] == 1


def test_ingest_interrupted_while_writing_keeps_whole_batches_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "INGEST_BATCH", 10)
    src = _numbered_traces(tmp_path / "t.jsonl", 35)
    writes = {"n": 0}
    real = Store.upsert_traces

    def interrupted_on_third(self: Store, traces: list, **kw: object) -> dict:
        writes["n"] += 1
        if writes["n"] == 3:
            raise KeyboardInterrupt
        return real(self, traces, **kw)

    with Store(tmp_path / "s.duckdb") as store:
        monkeypatch.setattr(Store, "upsert_traces", interrupted_on_third)
        with pytest.raises(KeyboardInterrupt):
            pipeline.ingest(store, src)
        assert store.trace_ids() == [f"n{i:04d}" for i in range(20)]  # two whole batches
        assert [r.status for r in store.runs()] == ["interrupted"]
        monkeypatch.setattr(Store, "upsert_traces", real)
        again = pipeline.ingest(store, src)
        assert (again.read, again.inserted, again.unchanged) == (35, 15, 20)
        assert sorted(store.trace_ids()) == [f"n{i:04d}" for i in range(35)]


def test_ingest_refuses_an_input_that_changes_between_its_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "INGEST_BATCH", 10)
    monkeypatch.setattr(pipeline, "INGEST_KEEP_CHARS", 0)  # read twice (a small input is otherwise read once)
    src = _numbered_traces(tmp_path / "t.jsonl", 25)
    real = Store.check_traces
    checked = {"n": 0}

    def edit_after_validation(self: Store, traces: list) -> list:
        checked["n"] += 1
        if checked["n"] == 3:  # the last validated batch: another user rewrites the file now
            lines = src.read_text(encoding="utf-8").splitlines()
            lines[14] = json.dumps({"trace_id": "n0014", "trace": "Edited in the meantime."})
            src.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return real(self, traces)

    monkeypatch.setattr(Store, "check_traces", edit_after_validation)
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(InputError, match="changed while it was being ingested.*batch 2"):
            pipeline.ingest(store, src)
        assert store.counts()["traces"] == 10  # the first batch matched what was validated

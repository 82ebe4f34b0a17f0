"""Faults found by using the product from outside (issue 27's method applied to the newer stages:
``ror labels import``, crosswalks, ``ror aggregate``, ``ror agree``, ``ror verify``, ``ror view``):
each input that once ended in a traceback, a silent wrong result or an unbounded message is kept
here with the one coded line it now gets."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ror_annotate import pipeline
from ror_annotate.crosswalks import load_crosswalk
from ror_annotate.errors import ConfigError, ImportLabelError, ImportRecordError
from ror_annotate.records import Segment, Trace
from ror_annotate.store import Store

TEXT = "Let me try. It is 4. So the answer is 4."
SEGS = [(0, 11), (12, 20), (21, 40)]


def _store(path: Path) -> Store:
    store = Store(path)
    store.upsert_traces([Trace(trace_id="t-1", text=TEXT)])
    store.replace_segments("t-1", [Segment(trace_id="t-1", segment_index=i, char_start=a, char_end=b, text=TEXT[a:b], n_tokens=2)
                                   for i, (a, b) in enumerate(SEGS)], segmenter="hand", token_counter="chars/4")
    return store


def _import(store: Store, path: Path, **extra: object):
    return pipeline.import_labels(store, path, {"annotator": "other", "kind": "machine", **extra})


def _n_labels(store: Store) -> int:
    return sum(1 for _ in store.labels())


# --------------------------------------------------------------------------- labels import: files as users have them
def test_byte_order_mark_is_read_in_jsonl_and_csv(tmp_path):
    # Excel's "CSV UTF-8" and Windows tools start the file with U+FEFF: before, the JSONL line was
    # "not valid JSON" and the CSV's first column was named "\ufefftrace_id" (unit unknown).
    store = _store(tmp_path / "s.duckdb")
    (tmp_path / "a.jsonl").write_text("\ufeff" + json.dumps({"trace_id": "t-1", "segment_index": 0, "label": "planning"}) + "\n", encoding="utf-8")
    assert _import(store, tmp_path / "a.jsonl").labelled == 1
    (tmp_path / "b.csv").write_bytes("\ufefftrace_id,segment_index,label\r\nt-1,1,execution\r\nt-1,2,conclusion\r\n".encode())
    summary = _import(store, tmp_path / "b.csv")
    assert (summary.labelled, summary.label_counts["execution"], summary.label_counts["conclusion"]) == (2, 1, 1)


@pytest.mark.parametrize("name, data, match", [
    # each of these ended in a traceback (UnicodeDecodeError, RecursionError, csv.Error, ArrowInvalid)
    ("latin1.csv", "trace_id,segment_index,label\nt-1,0,plann\xe9ng\n".encode("latin-1"), r"latin1\.csv:2: byte b'\\xe9' is not valid UTF-8"),
    ("bin.jsonl", b"\x00\x01\xff\xfe", r"bin\.jsonl:1: byte b'\\xff' is not valid UTF-8"),
    ("deep.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n", r"deep\.jsonl:1: JSON nested too deeply"),
    ("deep2.jsonl", b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n", r"deep2\.jsonl:1: JSON nested too deeply"),
    ("bad.parquet", b"PAR1 not parquet", r"bad\.parquet: cannot be read as parquet"),
    # an unterminated quote swallowed the rest of the file into one label (silently, or as E130)
    ("quote.csv", b'trace_id,segment_index,label\nt-1,0,"planning\nt-1,1,execution\n', r"quote\.csv:2: malformed CSV"),
    # a repeated column kept its last value silently
    ("dup.csv", b"trace_id,segment_index,label,label\nt-1,0,planning,fact\n", r"dup\.csv:1: column 'label' appears twice"),
])
def test_unreadable_label_files_are_one_coded_error(tmp_path, name, data, match):
    store = _store(tmp_path / "s.duckdb")
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ImportRecordError, match=match) as info:
        _import(store, tmp_path / name)
    assert info.value.code == "E132"
    assert _n_labels(store) == 0


def test_a_long_field_is_read_and_quoted_short(tmp_path):
    # a field over csv's default limit (131,072 characters) raised csv.Error; a 200,000-character
    # label was then quoted in full in the E130 line
    store = _store(tmp_path / "s.duckdb")
    (tmp_path / "long.csv").write_text("trace_id,segment_index,label\nt-1,0," + "p" * 200_000 + "\n", encoding="utf-8")
    with pytest.raises(ImportLabelError) as info:
        _import(store, tmp_path / "long.csv")
    assert "200000 characters" in info.value.message and len(info.value.message) < 600


def test_text_with_line_separators_inside_json_strings(tmp_path):
    # U+2028 and U+0085 are legal unescaped inside a JSON string; reading lines with str.splitlines
    # would cut the record there
    store = _store(tmp_path / "s.duckdb")
    (tmp_path / "ls.jsonl").write_text(json.dumps({"trace_id": "t-1", "segment_index": 0, "label": "planning", "note": "a\u2028b\x85c"},
                                                  ensure_ascii=False) + "\n", encoding="utf-8")
    assert _import(store, tmp_path / "ls.jsonl").labelled == 1


# --------------------------------------------------------------------------- crosswalk files
def _cw(tmp_path: Path, body: bytes | str, name: str = "cw.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    return path


@pytest.mark.parametrize("body, match", [
    # PyYAML keeps the last of two equal keys: 'a' was mapped to fact without a word
    ("name: x\nversion: 1\nsource_taxonomy: t\nmapping: {a: planning, a: fact}\n", r"key 'a' appears twice in one mapping \(line 4\)"),
    (b"\xff\xfe\x00\x00", r"byte b'\\xff' is not valid UTF-8"),  # was a UnicodeDecodeError traceback
    ("x: " + "[" * 20_000 + "]" * 20_000 + "\n", r"nested too deeply"),  # was a RecursionError traceback
    ("1: x\nname: y\nversion: 1\nsource_taxonomy: t\nmapping: {a: planning}\n", r"1: Keys should be strings"),  # was TypeError: keywords must be strings
    ("!!python/object/apply:os.system ['echo pwned']\n", r"cannot be read as YAML"),
])
def test_bad_crosswalk_files_are_one_coded_error(tmp_path, body, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_crosswalk(_cw(tmp_path, body))
    assert info.value.code == "E110"


def test_crosswalk_with_a_bom_and_unicode_categories(tmp_path):
    cw = load_crosswalk(_cw(tmp_path, "\ufeffname: x\nversion: 1\nsource_taxonomy: 日本\nmapping: {計画: planning, \"検算 ✓\": reflection}\n"))
    assert (cw.lookup("計画"), cw.lookup("検算 ✓")) == ("planning", "reflection")


def test_a_huge_crosswalk_gives_a_bounded_message(tmp_path):
    # 20,000 declared categories were all listed in the E130 line
    body = "name: big\nversion: 1\nsource_taxonomy: t\nmapping:\n" + "".join(f"  c{i}: planning\n" for i in range(20_000))
    store = _store(tmp_path / "s.duckdb")
    (tmp_path / "a.jsonl").write_text(json.dumps({"trace_id": "t-1", "segment_index": 0, "label": "zzz"}) + "\n", encoding="utf-8")
    with pytest.raises(ImportLabelError) as info:
        _import(store, tmp_path / "a.jsonl", crosswalk=str(_cw(tmp_path, body)))
    assert "(19980 more)" in info.value.message and len(info.value.message) < 1000


def test_cli_prints_one_line_for_a_bad_file(tmp_path):
    from ror_annotate.cli import app

    db = tmp_path / "s.duckdb"
    _store(db).close()
    (tmp_path / "x.csv").write_bytes(b"trace_id,segment_index,label\nt-1,0,\xe9\n")
    result = CliRunner().invoke(app, ["labels", "import", str(tmp_path / "x.csv"), "--annotator", "o", "--kind", "human", "--db", str(db)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "error [E132]: x.csv:2: byte" in " ".join(result.output.split())


def test_parquet_with_a_nested_label_is_refused_by_name(tmp_path):
    store = _store(tmp_path / "s.duckdb")
    pq.write_table(pa.table({"trace_id": ["t-1"], "segment_index": [0], "label": [{"x": 1}]}), tmp_path / "n.parquet")
    with pytest.raises(ImportLabelError, match=r"n\.parquet record 1: label"):
        _import(store, tmp_path / "n.parquet")


# --------------------------------------------------------------------------- names a derived rater takes; raters with no overlap
TEXT2 = "We plan. Then we add. Check it. Done."
SEGS2 = [(0, 8), (9, 21), (22, 31), (32, 37)]


def _store2(path: Path) -> Store:
    store = _store(path)
    store.upsert_traces([Trace(trace_id="t-2", text=TEXT2)])
    store.replace_segments("t-2", [Segment(trace_id="t-2", segment_index=i, char_start=a, char_end=b, text=TEXT2[a:b], n_tokens=2)
                                   for i, (a, b) in enumerate(SEGS2)], segmenter="hand", token_counter="chars/4")
    return store


def _rows(trace: str, labels: list[str]) -> str:
    return "".join(json.dumps({"trace_id": trace, "segment_index": i, "label": lab}) + "\n" for i, lab in enumerate(labels))


def test_import_refuses_the_name_of_a_derived_rater(tmp_path):
    # an imported human rater named 'aggregate:dawid-skene' was later taken over by `ror aggregate`:
    # its declaration became a machine aggregate and its human labels mixed with the aggregate's
    store = _store(tmp_path / "s.duckdb")
    (tmp_path / "h.jsonl").write_text(_rows("t-1", ["planning", "execution", "conclusion"]), encoding="utf-8")
    for name in ("aggregate:dawid-skene", "verify:gpt-4.1:of:x"):
        with pytest.raises(ConfigError, match="the name ror_annotate gives its own derived raters") as info:
            pipeline.import_labels(store, tmp_path / "h.jsonl", {"annotator": name, "kind": "human"})
        assert info.value.code == "E750"
    assert _n_labels(store) == 0


def test_aggregate_does_not_take_over_a_rater_of_another_source(tmp_path):
    # a store written before the import check (or by another tool) may hold such a rater
    from ror_annotate.errors import InputError
    from ror_annotate.records import Annotator, Label

    store = _store(tmp_path / "s.duckdb")
    for name, labs in (("a", ["planning", "execution", "conclusion"]), ("b", ["planning", "execution", "fact"])):
        (tmp_path / f"{name}.jsonl").write_text(_rows("t-1", labs), encoding="utf-8")
        pipeline.import_labels(store, tmp_path / f"{name}.jsonl", {"annotator": name, "kind": "machine"})
    store.upsert_labels([Label(trace_id="t-1", segment_index=0, label="fact", source="import", annotator="aggregate:dawid-skene",
                              codebook_version="crosswalk:x@v1")])
    store.upsert_annotators([Annotator(annotator="aggregate:dawid-skene", kind="human", source="import")])
    with pytest.raises(InputError, match="already names a rater of source 'import'") as info:
        pipeline.aggregate(store, {"raters": ("a", "b")})
    assert info.value.code == "E751"
    assert store.declared_annotators()["aggregate:dawid-skene"].kind == "human"


def test_aggregate_of_raters_that_never_overlap_is_refused(tmp_path):
    # A on t-1, B on t-2: Dawid-Skene reported accuracy 1.000 for both and confidence 1.000 everywhere
    from ror_annotate.errors import InputError

    store = _store2(tmp_path / "s.duckdb")
    (tmp_path / "a.jsonl").write_text(_rows("t-1", ["planning", "execution", "conclusion"]), encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(_rows("t-2", ["planning", "execution", "reflection", "conclusion"]), encoding="utf-8")
    pipeline.import_labels(store, tmp_path / "a.jsonl", {"annotator": "A", "kind": "machine"})
    pipeline.import_labels(store, tmp_path / "b.jsonl", {"annotator": "B", "kind": "machine"})
    for method in ("dawid-skene", "majority-vote", "glad"):
        with pytest.raises(InputError, match="never label the same segment") as info:
            pipeline.aggregate(store, {"raters": ("A", "B"), "method": method})
        assert info.value.code == "E752"
    assert not any(lab.annotator.startswith("aggregate:") for lab in store.labels())
    # one shared segment is enough to estimate: the aggregate runs (A and B agree there)
    (tmp_path / "b2.jsonl").write_text(_rows("t-1", ["planning"]), encoding="utf-8")
    pipeline.import_labels(store, tmp_path / "b2.jsonl", {"annotator": "B2", "kind": "machine"})
    assert pipeline.aggregate(store, {"raters": ("A", "B2"), "method": "majority-vote"}).segments == 3


def test_reference_human_names_the_imported_humans(tmp_path):
    # imported human raters (source import) are not a review reference (README); the message said only
    # "no human labels" although the user had just imported some with --kind human
    from ror_annotate.agreement.from_store import agreement_summary
    from ror_annotate.errors import AgreementError

    store = _store(tmp_path / "s.duckdb")
    (tmp_path / "a.jsonl").write_text(_rows("t-1", ["planning", "execution", "conclusion"]), encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(_rows("t-1", ["planning", "fact", "conclusion"]), encoding="utf-8")
    pipeline.import_labels(store, tmp_path / "a.jsonl", {"annotator": "judge-x", "kind": "machine"})
    pipeline.import_labels(store, tmp_path / "b.jsonl", {"annotator": "alice", "kind": "human"})
    with pytest.raises(AgreementError, match=r"imported human raters \(alice\) are not a review reference: name one with --reference NAME"):
        agreement_summary(store, reference="human", n_resamples=0)
    assert agreement_summary(store, reference="alice", n_resamples=0)["n_items"] == 3


# --------------------------------------------------------------------------- review start: odd names and e-mails
@pytest.mark.parametrize("name", ["brk-<script>x</script>", "../../etc", "a b", "\u202eevil", "-x", ""])
def test_a_bad_study_name_is_one_coded_line(tmp_path, name):
    # was a pydantic ValidationError traceback from deep inside create_study (after sampling)
    from ror_annotate.review.flow import review_start
    from ror_annotate.review.studies import create_study

    store = _store(tmp_path / "s.duckdb")
    with pytest.raises(ConfigError, match="is not allowed: use letters, digits") as info:
        review_start(store, name, annotators=("alice@lab.org",), url="http://127.0.0.1:9")  # refused before any server is asked
    assert info.value.code == "E753"
    with pytest.raises(ConfigError) as info:
        create_study(store, name, annotators=["alice@lab.org"], strategy="random", n=2, overlap=1)
    assert info.value.code == "E753"


@pytest.mark.parametrize("email", ["<script>alert(1)</script>@x.org", "a b@x.org", "brk.\u00fcn\u00ef@example.org", "a@b@c.org", "@x.org", "a@", "a@.org", "a@x.org."])
def test_an_email_label_studio_refuses_is_refused_before_the_study_is_stored(tmp_path, email):
    # was: the study was stored with the annotator, then Label Studio refused the sign-up (E600 with an
    # empty reason), leaving a study whose account can never be created
    from ror_annotate.errors import InputError
    from ror_annotate.review.flow import review_start
    from ror_annotate.review.studies import create_study

    store = _store(tmp_path / "s.duckdb")
    with pytest.raises(InputError, match="is not an e-mail address") as info:
        review_start(store, "pilot-1", annotators=(email,), url="http://127.0.0.1:9")
    assert info.value.code == "E100"
    with pytest.raises(InputError, match="is not an e-mail address"):
        create_study(store, "pilot-1", annotators=[email], strategy="random", n=2, overlap=1)
    has = store.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'review_studies'").fetchone()[0]
    assert not has or store.execute("SELECT count(*) FROM review_studies").fetchone()[0] == 0


def test_ordinary_emails_still_pass():
    from ror_annotate.review.studies import check_email

    for email in ("alice@lab.org", "o'brien@x.org", "alice@localhost", " A.B+tag@sub.example.co "):
        assert check_email(email) == email.strip()


def test_signup_refusal_reason_is_read_from_the_form():
    # Label Studio 1.x's refused sign-up page (the part that matters, as served by the lead's server):
    # the reason sits in <li> inside <ul class="field_errors">; it was read as the white space before <li>
    from ror_annotate.review.labelstudio import signup_errors

    page = ('<input type="text" class="lsf-input-ls" name="email" id="email" value="x">\n'
            '  <ul class="field_errors">\n    <li>Enter a valid email address.</li>\n  </ul>\n'
            '<div class="form-errors"><p>Password &amp; e-mail</p></div>')
    assert signup_errors(page) == "Enter a valid email address.; Password & e-mail"
    assert signup_errors("<html><body>fine</body></html>") == ""


def test_a_json_file_holding_an_array_of_records(tmp_path):
    # json.dump(list_of_records, f, indent=2) -> "x.json: line 1: not valid JSON" before
    store = _store(tmp_path / "s.duckdb")
    rows = [{"trace_id": "t-1", "segment_index": i, "label": lab} for i, lab in enumerate(["planning", "execution", "conclusion"])]
    (tmp_path / "x.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    assert _import(store, tmp_path / "x.json").label_counts == {"planning": 1, "execution": 1, "restatement": 0, "fact": 0,
                                                                "reflection": 0, "conclusion": 1}
    (tmp_path / "y.json").write_text(json.dumps([rows[0], ["not", "a", "record"]]), encoding="utf-8")
    with pytest.raises(ImportRecordError, match=r"y\.json record 2: a record must be a JSON object, got list"):
        _import(store, tmp_path / "y.json")


def test_human_anchor_without_humans_is_refused(tmp_path):
    # was: an aggregate declared human="anchor" with no human in it, and the export card then said
    # "human labels joined the estimate ... so its calibration against them below is optimistic"
    from ror_annotate.errors import InputError

    store = _store(tmp_path / "s.duckdb")
    for name, labs in (("a", ["planning", "execution", "conclusion"]), ("b", ["planning", "execution", "fact"])):
        (tmp_path / f"{name}.jsonl").write_text(_rows("t-1", labs), encoding="utf-8")
        pipeline.import_labels(store, tmp_path / f"{name}.jsonl", {"annotator": name, "kind": "machine"})
    with pytest.raises(InputError, match="--human anchor: no human rater") as info:
        pipeline.aggregate(store, {"human": "anchor"})
    assert info.value.code == "E754"
    assert "aggregate:dawid-skene" not in store.declared_annotators()
    (tmp_path / "h.jsonl").write_text(_rows("t-1", ["planning", "execution", "fact"]), encoding="utf-8")
    pipeline.import_labels(store, tmp_path / "h.jsonl", {"annotator": "alice", "kind": "human"})
    assert pipeline.aggregate(store, {"human": "anchor", "method": "majority-vote"}).raters == ["a", "b", "alice"]


def test_verify_of_an_imported_rater_says_why(tmp_path, monkeypatch):
    # was: "its labels use crosswalk:si: pass the same --codebook" (a crosswalk id cut at 12 characters,
    # and no --codebook could ever match it)
    from ror_annotate.errors import VerifyError
    from ror_annotate.verify import VerifyOptions, verify

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    store = _store(tmp_path / "s.duckdb")
    (tmp_path / "a.jsonl").write_text(_rows("t-1", ["planning", "execution", "conclusion"]), encoding="utf-8")
    pipeline.import_labels(store, tmp_path / "a.jsonl", {"annotator": "other", "kind": "machine"})
    with pytest.raises(VerifyError, match=r"rater 'other' holds imported labels \(crosswalk:six-behaviors@v1\)") as info:
        verify(store, VerifyOptions.build("openai:v", base_url="http://127.0.0.1:9/v1", of="other"))
    assert info.value.code == "E521"


def test_names_that_look_like_rich_markup_are_printed_as_they_are(tmp_path):
    # an annotator named "[/x]" ended `ror labels import`, `ror aggregate`, `ror agree`, `ror view`
    # and `ror status` in a rich MarkupError traceback; "[bold red]alice" restyled the tables
    from ror_annotate.cli import app

    db = tmp_path / "s.duckdb"
    _store(db).close()
    runner = CliRunner()
    for name, labs in (("[/x]", ["planning", "execution", "conclusion"]), ("[bold red]alice", ["planning", "fact", "conclusion"])):
        (tmp_path / "a.jsonl").write_text(_rows("t-1", labs), encoding="utf-8")
        result = runner.invoke(app, ["labels", "import", str(tmp_path / "a.jsonl"), "--annotator", name, "--kind", "machine", "--db", str(db)])
        assert result.exit_code == 0, result.output
        assert f"{name} (machine)" in result.output
    for args in (["aggregate", "--method", "majority-vote"], ["agree", "--resamples", "0"], ["status"]):
        result = runner.invoke(app, [*args, "--db", str(db)])
        assert result.exit_code == 0 and "Traceback" not in result.output and "MarkupError" not in result.output, (args, result.output)
    assert "[bold red]alice" in result.output or "[bold red]alice" in runner.invoke(app, ["agree", "--resamples", "0", "--db", str(db)]).output


def test_pull_lines_with_markup_like_text_are_printed(capsys):
    # a removed label's line quotes segment text and annotator names; "[/x]" in it was a MarkupError
    from types import SimpleNamespace

    from ror_annotate.cli.review import _print_pull

    report = SimpleNamespace(labels_written=0, labels_unchanged=0, labels_removed=1, skips=0, replaced=[], superseded=[],
                             reanchored=[], rejected=["h-1: '[/x] [bold]not bold'"], removed=["t#0 by h-1: [/x]"])
    _print_pull(report)
    err = " ".join(capsys.readouterr().err.split())
    assert "removed: t#0 by h-1: [/x]" in err and "rejected: h-1: '[/x] [bold]not bold'" in err

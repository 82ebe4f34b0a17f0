"""``ror labels import``: crosswalks, the span projection rule (hand-computed, with CJK and emoji),
idempotence, coded errors that store nothing, and the thought-anchors labels of the 40 sample traces."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ror_annotate import pipeline
from ror_annotate.crosswalks import CROSSWALKS, Crosswalk, load_crosswalk
from ror_annotate.errors import ConfigError, ImportLabelError, ImportRecordError, ImportSpanError
from ror_annotate.labels_import import ImportOptions, project_spans
from ror_annotate.records import BEHAVIORS, Segment, Trace
from ror_annotate.registry import registry
from ror_annotate.sample import sample_path
from ror_annotate.store import Store

from .conftest import DATA

# s0 = "数学 🎉 abc." (9 code points, 7 non-space), s1 = "Wait 😀 no!" (10, 8), s2 = "So 42." (6, 5)
S0, S1, S2 = "数学 🎉 abc.", "Wait 😀 no!", "So 42."
TEXT = f"{S0} {S1} {S2}"
SEGS = [(0, 9), (10, 20), (21, 27)]


def _store(path: Path) -> Store:
    store = Store(path)
    store.upsert_traces([Trace(trace_id="t-1", text=TEXT), Trace(trace_id="t-2", text="Let me try. It is 4.")])
    store.replace_segments("t-1", [Segment(trace_id="t-1", segment_index=i, char_start=a, char_end=b, text=TEXT[a:b], n_tokens=2)
                                   for i, (a, b) in enumerate(SEGS)], segmenter="hand", token_counter="chars/4")
    t2 = "Let me try. It is 4."
    store.replace_segments("t-2", [Segment(trace_id="t-2", segment_index=0, char_start=0, char_end=11, text=t2[:11], n_tokens=3),
                                   Segment(trace_id="t-2", segment_index=1, char_start=12, char_end=20, text=t2[12:], n_tokens=3)],
                           segmenter="hand", token_counter="chars/4")
    return store


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


SPANS = [
    {"trace_id": "t-1", "char_start": 0, "char_end": 4, "text": "数学 🎉", "label": "planning"},
    {"trace_id": "t-1", "char_start": 4, "char_end": 14, "text": " abc. Wait", "label": "execution"},
    {"trace_id": "t-1", "char_start": 14, "char_end": 20, "text": " 😀 no!", "label": "reflection"},
]


def test_segments_of_the_hand_made_trace():
    assert [TEXT[a:b] for a, b in SEGS] == [S0, S1, S2]


def test_projection_rule_by_hand():
    spans = [(r["char_start"], r["char_end"], r["label"], r["label"], None) for r in SPANS]
    out = project_spans(TEXT, SEGS, spans)
    # s0: planning covers 数,学,🎉 = 3/7; execution covers a,b,c,. = 4/7 -> execution
    assert (out[0].behavior, out[0].status) == ("execution", "labelled")
    assert out[0].share == pytest.approx(4 / 7)
    # s1: execution covers W,a,i,t = 4/8, reflection 😀,n,o,! = 4/8 -> tie, no label
    assert (out[1].behavior, out[1].status) == (None, "tie")
    # s2: nothing covers it
    assert (out[2].behavior, out[2].status) == (None, "uncovered")
    # 4/7 = 0.571 < 0.6: below share
    assert project_spans(TEXT, SEGS, spans, min_share=0.6)[0].status == "below_share"
    # two spans of one behavior add up: planning over 数学 (2/7) and over 🎉 abc. (5/7) -> 7/7
    two = project_spans(TEXT, SEGS, [(0, 2, "planning", "a", 0.8), (3, 9, "planning", "b", 0.6)])
    assert (two[0].behavior, two[0].share, two[0].categories) == ("planning", 1.0, ("a", "b"))
    assert two[0].confidence == pytest.approx(0.7)
    # an unmapped category that wins leaves the segment unlabeled
    unm = project_spans(TEXT, SEGS, [(21, 27, None, "unknown", None), (21, 23, "fact", "fact_retrieval", None)])
    assert unm[2].status == "unmapped" and unm[2].share == pytest.approx(5 / 5)


def test_span_import_stores_the_projection_and_is_idempotent(tmp_path):
    store = _store(tmp_path / "s.duckdb")
    path = _jsonl(tmp_path / "spans.jsonl", SPANS)
    summary = pipeline.import_labels(store, path, {"annotator": "other:gpt", "kind": "machine", "model": "gpt-4o"})
    assert (summary.unit, summary.records, summary.traces, summary.segments) == ("span", 3, 1, 3)
    assert (summary.labelled, summary.ties, summary.uncovered, summary.below_share, summary.unmapped) == (1, 1, 1, 0, 0)
    labels = store.labels(source="import")
    assert [(lab.trace_id, lab.segment_index, lab.label, lab.annotator) for lab in labels] == [("t-1", 0, "execution", "other:gpt")]
    assert labels[0].extra["share"] == pytest.approx(4 / 7, abs=1e-6)
    assert labels[0].codebook_version == "crosswalk:six-behaviors@v1"
    declared = store.declared_annotators()["other:gpt"]
    assert (declared.kind, declared.source, declared.model) == ("machine", "import", "gpt-4o")
    assert declared.details["crosswalk"] == "six-behaviors@v1" and declared.details["file"] == "spans.jsonl"
    assert store.rater_kinds()["other:gpt"] == "machine"
    ids = store.execute("SELECT label_id FROM labels ORDER BY 1").fetchall()
    pipeline.import_labels(store, path, {"annotator": "other:gpt", "kind": "machine"})
    assert store.execute("SELECT label_id FROM labels ORDER BY 1").fetchall() == ids  # same ids, no duplicates


def test_segment_import_from_csv_and_parquet_with_crosswalk(tmp_path):
    store = _store(tmp_path / "s.duckdb")
    rows = [
        {"segment_id": "t-2#0", "tag": "plan_generation", "confidence": "0.9"},
        {"segment_id": "t-2#1", "tag": "Result_Consolidation ", "confidence": ""},
        {"segment_id": "t-1#2", "tag": "unknown", "confidence": ""},
    ]
    path = tmp_path / "seg.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["segment_id", "tag", "confidence"])
        w.writeheader()
        w.writerows(rows)
    opts = ImportOptions(annotator="ta", kind="human", crosswalk="thought-anchors", label_column="tag")
    summary = pipeline.import_labels(store, path, opts)
    assert (summary.unit, summary.labelled, summary.unmapped_records, summary.unmapped, summary.uncovered) == ("segment", 2, 1, 1, 2)
    got = {(lab.trace_id, lab.segment_index): (lab.label, lab.confidence) for lab in store.labels(annotator="ta")}
    assert got == {("t-2", 0): ("planning", 0.9), ("t-2", 1): ("conclusion", None)}
    assert store.rater_kinds()["ta"] == "human"
    # the same labels from parquet, by trace_id + segment_index, under another rater
    pq.write_table(pa.table({"trace_id": ["t-2", "t-2"], "segment_index": [0, 1], "label": ["fact", "reflection"]}), tmp_path / "x.parquet")
    pipeline.import_labels(store, tmp_path / "x.parquet", {"annotator": "pq", "kind": "machine"})
    assert [lab.label for lab in store.labels(annotator="pq")] == ["fact", "reflection"]


@pytest.mark.parametrize(
    "rows, error, match",
    [
        ([{"trace_id": "t-1", "char_start": 0, "char_end": 4, "label": "pondering"}], ImportLabelError, r"bad.jsonl:1: label 'pondering'"),
        ([SPANS[0], {"trace_id": "t-1", "char_start": 20, "char_end": 99, "label": "fact"}], ImportSpanError, r"bad.jsonl:2: span \[20, 99\)"),
        # offsets counted in UTF-16 (as JavaScript does) land one code unit late after the emoji
        ([{"trace_id": "t-1", "char_start": 15, "char_end": 21, "text": "😀 no!", "label": "fact"}], ImportSpanError, r"bad.jsonl:1: text"),
        ([{"segment_id": "t-1#1", "text": "Wait no!", "label": "fact"}], ImportSpanError, r"differs from stored segment t-1#1"),
        ([SPANS[0], {"trace_id": "nope", "char_start": 0, "char_end": 1, "label": "fact"}], ImportRecordError, r"bad.jsonl:2: trace 'nope'"),
        ([{"segment_id": "t-1#7", "label": "fact"}], ImportRecordError, r"segment t-1#7 is not stored"),
        ([{"segment_id": "t-1#0", "label": "fact"}, {"segment_id": "t-1#0", "label": "planning"}], ImportRecordError, r"bad.jsonl:2: .*already labelled 'fact' at bad.jsonl:1"),
        ([{"trace_id": "t-1", "label": "fact"}], ImportRecordError, r"cannot tell the unit"),
        ([SPANS[0], {"trace_id": "t-1", "char_start": 0, "char_end": 4}], ImportRecordError, r"bad.jsonl:2: no label"),
        ([{"segment_id": "t-1#0", "label": "fact", "confidence": 3}], ImportRecordError, r"confidence must be"),
        ([{"segment_id": "t-1", "label": "fact"}], ImportRecordError, r"must look like <trace_id>#<segment_index>"),
    ],
)
def test_bad_input_is_one_coded_error_and_stores_nothing(tmp_path, rows, error, match):
    store = _store(tmp_path / "s.duckdb")
    before = store.counts()
    with pytest.raises(error, match=match):
        pipeline.import_labels(store, _jsonl(tmp_path / "bad.jsonl", rows), {"annotator": "x", "kind": "machine"})
    assert store.labels() == [] and store.declared_annotators() == {}
    assert {k: v for k, v in store.counts().items() if k != "runs"} == {k: v for k, v in before.items() if k != "runs"}


def test_error_codes_and_unknown_file_type(tmp_path):
    assert (ImportLabelError.code, ImportSpanError.code, ImportRecordError.code) == ("E130", "E131", "E132")
    store = _store(tmp_path / "s.duckdb")
    (tmp_path / "x.txt").write_text("a", encoding="utf-8")
    with pytest.raises(ImportRecordError, match="unknown file type"):
        pipeline.import_labels(store, tmp_path / "x.txt", {"annotator": "x", "kind": "machine"})
    with pytest.raises(ConfigError, match="did you mean 'min_share'"):
        pipeline.import_labels(store, tmp_path / "x.txt", {"annotator": "x", "kind": "machine", "min_shares": 0.3})
    with pytest.raises(ConfigError, match="--kind"):
        ImportOptions.from_options({"annotator": "x", "kind": "robot"})
    # an id already used by another source's rater is refused (its declaration would be overwritten)
    from ror_annotate.records import Label

    store.upsert_labels([Label(trace_id="t-2", segment_index=0, label="fact", source="judge", annotator="openai:g", codebook_version="cb")])
    _jsonl(tmp_path / "ok.jsonl", [{"segment_id": "t-2#0", "label": "fact"}])
    with pytest.raises(ConfigError, match="already names a judge rater"):
        pipeline.import_labels(store, tmp_path / "ok.jsonl", {"annotator": "openai:g", "kind": "machine"})


# the mapping table of ../shared/data/README.md, written out by hand
README_TABLE = {
    "reasoningflow": {"planning": "planning", "reasoning": "execution", "example": "execution", "assumption": "execution",
                      "restatement": "restatement", "fact": "fact", "reflection": "reflection", "conclusion": "conclusion"},
    "thought-anchors": {"plan_generation": "planning", "active_computation": "execution", "problem_setup": "restatement",
                        "fact_retrieval": "fact", "self_checking": "reflection", "uncertainty_management": "reflection",
                        "result_consolidation": "conclusion", "final_answer_emission": "conclusion"},
    "venhoff": {"deduction": "execution", "example-testing": "execution", "initializing": "restatement",
                "adding-knowledge": "fact", "uncertainty-estimation": "reflection", "backtracking": "reflection"},
}


def test_builtin_crosswalks_follow_the_readme_table():
    assert set(registry("crosswalks").names()) >= {"thought-anchors@v1", "reasoningflow@v1", "venhoff@v1", "six-behaviors@v1"}
    for name, table in README_TABLE.items():
        cw = load_crosswalk(name)
        assert cw is CROSSWALKS.get(f"{name}@v1")
        assert dict(cw.mapping) == table
    assert load_crosswalk("thought-anchors").lookup("unknown") is None
    with pytest.raises(ConfigError, match="Did you mean 'venhoff@v1'"):
        load_crosswalk("venhof@v1")


def test_user_crosswalk_file(tmp_path):
    good = tmp_path / "cw.yaml"
    good.write_text("name: mine\nversion: 2\nsource_taxonomy: my steps\nmapping: {plan: planning, calc: execution}\nunmapped: [noise]\n",
                    encoding="utf-8")
    cw = load_crosswalk(good)
    assert (cw.id, cw.lookup("PLAN"), cw.lookup("noise")) == ("mine@v2", "planning", None)
    with pytest.raises(KeyError):
        cw.lookup("other")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\nversion: 1\nsource_taxonomy: x\nmapping: {plan: thinking}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="mapping.plan"):
        load_crosswalk(bad)
    with pytest.raises(ValueError, match="both mapped and listed as unmapped"):
        Crosswalk(name="c", version=1, source_taxonomy="x", mapping={"a": "fact"}, unmapped=["A"])
    store = _store(tmp_path / "s.duckdb")
    _jsonl(tmp_path / "m.jsonl", [{"segment_id": "t-2#0", "label": "plan"}, {"segment_id": "t-2#1", "label": "noise"}])
    summary = pipeline.import_labels(store, tmp_path / "m.jsonl", {"annotator": "m", "kind": "machine", "crosswalk": str(good)})
    assert (summary.crosswalk, summary.labelled, summary.unmapped) == ("mine@v2", 1, 1)


def test_cli_labels_import(tmp_path):
    from ror_annotate.cli import app

    db = tmp_path / "s.duckdb"
    _store(db).close()
    path = _jsonl(tmp_path / "spans.jsonl", SPANS)
    runner = CliRunner()
    ok = runner.invoke(app, ["labels", "import", str(path), "--annotator", "o", "--kind", "machine", "--db", str(db)])
    assert ok.exit_code == 0, ok.output
    assert "labelled" in ok.output and "ties 1" in ok.output
    bad = runner.invoke(app, ["labels", "import", str(path), "--annotator", "o", "--kind", "machine", "--crosswalk", "venhoff", "--db", str(db)])
    assert bad.exit_code == 2 and "error [E130]: spans.jsonl:1: label 'planning'" in " ".join(bad.output.split())


@pytest.mark.shared
def test_shipped_crosswalks_reproduce_the_shared_data_mapping():
    schemes = {"reasoningflow-nodes": "reasoningflow", "thought-anchors-function-tags": "thought-anchors", "venhoff-steering-6": "venhoff"}
    n = 0
    with (DATA / "labeled_segments.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            if r["label_original"] is None:
                continue
            assert load_crosswalk(schemes[r["label_scheme"]]).lookup(r["label_original"]) == r["label_six"]
            n += 1
    assert n == 21_502


@pytest.mark.shared
def test_thought_anchors_labels_of_the_sample(tmp_path):
    """The thought-anchors project's own labels of the 40 sample traces, as character spans onto our segments."""
    records = [json.loads(line) for line in (DATA / "labeled_segments.jsonl").open(encoding="utf-8")]
    ta = [r for r in records if r["label_scheme"] == "thought-anchors-function-tags"]
    path = _jsonl(tmp_path / "ta.jsonl", ta)
    store = Store(tmp_path / "s.duckdb")
    pipeline.ingest(store, sample_path())
    pipeline.segment(store)
    summary = pipeline.import_labels(
        store, path, {"annotator": "thought-anchors:gpt-4o", "kind": "machine", "crosswalk": "thought-anchors", "label_column": "label_original"},
    )
    assert (summary.records, summary.traces) == (5814, 40)
    assert summary.labelled + summary.uncovered + summary.below_share + summary.ties + summary.unmapped == summary.segments
    labels = {(lab.trace_id, lab.segment_index): lab.label for lab in store.labels(annotator="thought-anchors:gpt-4o")}
    assert len(labels) == summary.labelled
    # independent check: a segment lying inside one of their sentences gets that sentence's label_six
    by_trace: dict[str, list[dict]] = {}
    for r in ta:
        by_trace.setdefault(r["trace_id"], []).append(r)
    inside = 0
    for s in store.segments():
        hits = [r for r in by_trace[s.trace_id] if r["char_start"] <= s.char_start and s.char_end <= r["char_end"]]
        if len(hits) == 1:
            assert labels[(s.trace_id, s.segment_index)] == hits[0]["label_six"]
            inside += 1
    assert inside > 0.8 * summary.segments


@pytest.mark.shared
def test_imported_rater_joins_the_aggregate_and_the_export(tmp_path):
    """End to end on the sample: baseline + thought-anchors import -> ror aggregate -> export --labels aggregate."""
    from ror_annotate.export import load_export

    ta = [line for line in (DATA / "labeled_segments.jsonl").open(encoding="utf-8") if '"thought-anchors-function-tags"' in line]
    path = tmp_path / "ta.jsonl"
    path.write_text("".join(ta), encoding="utf-8")
    store = Store(tmp_path / "s.duckdb")
    ids = pipeline.ingest(store, sample_path()).trace_ids[:6]
    pipeline.segment(store, ids)
    pipeline.label(store, ids, judge="baseline")
    sub = tmp_path / "ta6.jsonl"
    sub.write_text("".join(line for line in ta if json.loads(line)["trace_id"] in set(ids)), encoding="utf-8")
    pipeline.import_labels(store, sub, {"annotator": "ta:gpt-4o", "kind": "machine", "crosswalk": "thought-anchors",
                                        "label_column": "label_original"})
    agg = pipeline.aggregate(store, {"method": "majority-vote"})
    assert set(agg.raters) == {"baseline:cue-v1", "ta:gpt-4o"}
    stored = {(lab.trace_id, lab.segment_index): lab for lab in store.labels(source="aggregate")}
    pipeline.export(store, tmp_path / "exp", labels="aggregate", trace_ids=ids, split_fractions=(1, 0, 0))
    rows = [r for r in load_export(tmp_path / "exp", "segments")["train"]]
    assert len(rows) == len(stored) > 0
    for r in rows:
        lab = stored[(r["trace_id"], r["segment_index"])]
        assert BEHAVIORS[r["label"]] == lab.label and r["label_source"] == "aggregate"
        # two raters: the majority-vote posterior is 1.0 when they agree, else a 0.5 / 0.5 tie
        raters = {x["annotator"]: BEHAVIORS[x["label"]] for x in r["raters"]}
        assert set(raters) == {"baseline:cue-v1", "ta:gpt-4o", agg.annotator}
        agree = raters["baseline:cue-v1"] == raters["ta:gpt-4o"]
        assert r["label_confidence"] == pytest.approx(1.0 if agree else 0.5)
        assert sorted(r["label_distribution"], reverse=True)[:2] == pytest.approx([1.0, 0.0] if agree else [0.5, 0.5])

"""``ror agree`` and the agreement report over a real DuckDB store and over CSV files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score, f1_score
from typer.testing import CliRunner

from ror_annotate.agreement import agreement_summary, ratings_from_csv
from ror_annotate.agreement_report import write_report
from ror_annotate.errors import AgreementError, InputError
from ror_annotate.records import BEHAVIORS, Label, Segment, Trace
from ror_annotate.store import Store

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _app():
    from ror_annotate.cli import app

    return app


# ----------------------------------------------------------------------------- a small store
N_TRACES, N_SEGS = 6, 25


@pytest.fixture
def store_data(tmp_path: Path):
    """Store with 6 traces x 25 segments; two humans (study s1), a judge, and an adjudicator."""
    rng = np.random.default_rng(0)
    path = tmp_path / "agree.duckdb"
    truth, tokens = {}, {}
    labels = []
    with Store(path) as store:
        for t in range(N_TRACES):
            tid = f"trace-{t}"
            # non-ASCII text so segment texts in the report go through unchanged
            parts = [f"Schritt {i}: 😀 x²={i} ∑ 数学. " for i in range(N_SEGS)]
            text = "".join(parts)
            store.upsert_traces([Trace(trace_id=tid, text=text)])
            segs, pos = [], 0
            for i, p in enumerate(parts):
                body = p.rstrip()
                n_tok = int(rng.integers(3, 40))
                segs.append(Segment(trace_id=tid, segment_index=i, char_start=pos, char_end=pos + len(body), text=body, n_tokens=n_tok))
                tokens[(tid, i)] = n_tok
                pos += len(p)
            store.replace_segments(tid, segs, segmenter="test", token_counter="test")
            for i in range(N_SEGS):
                truth[(tid, i)] = BEHAVIORS[int(rng.integers(0, 6))]

        def noisy(p):
            return {k: (v if rng.random() > p else BEHAVIORS[int(rng.integers(0, 6))]) for k, v in truth.items()}

        annot = {"h-ann": ("human", "s1", noisy(0.2)), "h-bob": ("human", "s1", noisy(0.3)),
                 "openai:gpt-x": ("judge", None, noisy(0.4)), "adjudicator:h-cy": ("adjudicated", "s1", truth)}
        for name, (source, study, labs) in annot.items():
            for (tid, i), lab in labs.items():
                if source == "human" and name == "h-bob" and i == 0:
                    continue  # a missing label
                labels.append(Label(trace_id=tid, segment_index=i, label=lab, source=source, annotator=name,
                                    codebook_version="cb1", study=study))
        store.upsert_labels(labels)
    return path, annot, tokens


def _pairs(d):
    return {(k["annotator_a"], k["annotator_b"]): k for k in d["cohen_kappa"]}


def test_summary_over_store_matches_sklearn(store_data):
    path, annot, tokens = store_data
    with Store(path) as store:
        d = agreement_summary(store, study="s1", with_judge=True, reference="adjudicated", n_resamples=200)
    assert set(d["annotators"]) == {"h-ann", "h-bob", "openai:gpt-x"}  # adjudicator is the reference, not an annotator
    assert d["n_traces"] == N_TRACES and d["n_items"] == N_TRACES * N_SEGS
    a, b = annot["h-ann"][2], annot["h-bob"][2]
    keys = [k for k in a if k[1] != 0]
    ref = cohen_kappa_score([a[k] for k in keys], [b[k] for k in keys], labels=list(BEHAVIORS))
    assert _pairs(d)[("h-ann", "h-bob")]["value"] == pytest.approx(ref, abs=1e-9)
    ref_w = cohen_kappa_score([a[k] for k in keys], [b[k] for k in keys], labels=list(BEHAVIORS), sample_weight=[tokens[k] for k in keys])
    tok = {(k["annotator_a"], k["annotator_b"]): k for k in d["token_weighted"]["cohen_kappa"]}
    assert tok[("h-ann", "h-bob")]["value"] == pytest.approx(ref_w, abs=1e-9)
    # per-class F1 of the judge against the adjudicated labels
    judge, adj = annot["openai:gpt-x"][2], annot["adjudicator:h-cy"][2]
    ks = list(judge)
    macro = f1_score([adj[k] for k in ks], [judge[k] for k in ks], labels=list(BEHAVIORS), average="macro", zero_division=np.nan)
    assert d["per_class"]["reference"] == "adjudicated"
    assert d["per_class"]["annotators"]["openai:gpt-x"]["macro_f1"]["value"] == pytest.approx(macro, abs=1e-9)
    assert d["selection"]["annotator_sources"]["openai:gpt-x"] == "judge"
    assert all(len(p["example_texts"]) == len(p["examples"]) and "😀" in p["example_texts"][0] for p in d["disagreements"])
    json.dumps(d, allow_nan=False)


def test_summary_reference_human_and_selection(store_data):
    path, annot, _ = store_data
    with Store(path) as store:
        d = agreement_summary(store, annotators=["h-ann", "openai:gpt-x"], reference="human", n_resamples=0)
        assert d["annotators"] == ["h-ann", "openai:gpt-x"]
        # one human: the judge is scored against that human, the human has no one to be scored against
        assert set(d["per_class"]["annotators"]) == {"openai:gpt-x"}
        h, j = annot["h-ann"][2], annot["openai:gpt-x"][2]
        ks = list(h)
        acc = np.mean([h[k] == j[k] for k in ks])
        assert d["per_class"]["annotators"]["openai:gpt-x"]["accuracy"]["value"] == pytest.approx(acc, abs=1e-12)
        with pytest.raises(AgreementError, match="no labels"):
            agreement_summary(store, study="nope")
        with pytest.raises(AgreementError, match="no human labels"):
            agreement_summary(store, sources=["judge", "adjudicated"], reference="human")


def test_cli_store_json_and_report(store_data, tmp_path):
    path, _, _ = store_data
    out = tmp_path / "report"
    res = runner.invoke(_app(), ["agree", "--db", str(path), "--study", "s1", "--with-judge", "--reference", "adjudicated",
                                 "--resamples", "100", "--json", "--report", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    for key in ("percent_agreement", "cohen_kappa", "fleiss_kappa", "krippendorff_alpha", "gwet_ac1", "per_class", "n_items", "n_annotators"):
        assert key in d
    assert d["n_annotators"] == 3 and len(d["cohen_kappa"]) == 3
    md = (out / "agreement.md").read_text(encoding="utf-8")
    assert "Krippendorff's alpha" in md and "## Most frequent disagreements" in md and "😀" in md
    assert (out / "confusion.png").read_bytes()[:8] == PNG_MAGIC
    assert (out / "per_class.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads((out / "agreement.json").read_text()) == d


def test_cli_table_output(store_data):
    path, _, _ = store_data
    res = runner.invoke(_app(), ["agree", "--db", str(path), "--source", "human", "--resamples", "20"])
    assert res.exit_code == 0, res.output
    assert "Krippendorff" in res.stdout and "h-ann" in res.stdout


# ----------------------------------------------------------------------------- CSV
def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "labels.csv"
    p.write_text(text, encoding="utf-8")
    return p


def test_csv_roundtrip_values(tmp_path):
    # hand check: 2 raters, items s1..s3 both rated: A/A, B/A, B/B -> po = 2/3;
    # r1: A 1/3, B 2/3; r2: A 2/3, B 1/3 -> pe = 2/9 + 2/9 = 4/9; kappa = (2/3 - 4/9)/(5/9) = 2/5
    p = _write(tmp_path, "item_id,annotator,label,trace_id,weight\n"
               "s1,r1,A,t1,3\ns1,r2,A,t1,3\ns2,r1,B,t1,5\ns2,r2,A,t1,5\ns3,r1,B,t2,2\ns3,r2,B,t2,2\ns4,r1,A,t2,4\ns4,r2,,t2,4\n")
    r = ratings_from_csv(p, categories=["A", "B"])
    assert r.n_items == 4 and r.group_ids == ("t1", "t2") and list(r.weights) == [3, 5, 2, 4]
    res = runner.invoke(_app(), ["agree", "--from-csv", str(p), "--categories", "A,B", "--json", "--resamples", "0"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["cohen_kappa"][0]["value"] == pytest.approx(2 / 5, abs=1e-12)
    assert d["percent_agreement"]["value"] == pytest.approx(2 / 3, abs=1e-12)
    assert d["n_items"] == 4 and d["n_annotators"] == 2


@pytest.mark.parametrize(
    "body, message",
    [
        ("item,annotator,label\nx,r1,A\n", "line 1: missing column(s) ['item_id']"),
        ("item_id,annotator,label\ns1,r1,A\ns1,r2,Q\n", "line 3: label 'Q' is not one of the categories"),
        ("item_id,annotator,label\ns1,r1,A\ns2,r2,B\ns1,r1,B\n", "line 4: annotator 'r1' already labeled item 's1' on line 2"),
        ("item_id,annotator,label,weight\ns1,r1,A,x\n", "line 2: weight 'x' is not a number"),
        ("item_id,annotator,label,trace_id\ns1,r1,A,t1\ns1,r2,A,t2\n", "line 3: item 's1' has trace_id 't2' but 't1' on line 2"),
        ("item_id,annotator,label\n", "no label rows"),
    ],
)
def test_csv_bad_rows_name_file_and_line(tmp_path, body, message):
    p = _write(tmp_path, body)
    with pytest.raises(InputError) as err:
        ratings_from_csv(p, categories=["A", "B"])
    assert str(p) in str(err.value) and message in str(err.value)
    res = runner.invoke(_app(), ["agree", "--from-csv", str(p), "--categories", "A,B"])
    # one clear line and exit status 2 (the app turns RorError into "error [CODE]: ...")
    assert res.exit_code == 2
    assert "error [E100]" in res.output and message in " ".join(res.output.split())


def test_csv_single_annotator_is_a_clear_error(tmp_path):
    p = _write(tmp_path, "item_id,annotator,label\ns1,r1,A\ns2,r1,B\n")
    res = runner.invoke(_app(), ["agree", "--from-csv", str(p), "--categories", "auto"])
    assert res.exit_code == 2 and "error [E700]" in res.output and "at least two annotators" in res.output


def test_write_report_from_dict_with_undefined_values(tmp_path):
    p = _write(tmp_path, "item_id,annotator,label\ns1,r1,A\ns1,r2,A\ns2,r1,A\ns2,r2,A\n")
    from ror_annotate.agreement import agreement

    d = agreement(ratings_from_csv(p, categories=["A", "B"]), n_resamples=10, reference="r1").to_dict()
    path = write_report(d, tmp_path / "rep")
    md = path.read_text(encoding="utf-8")
    assert "undefined (single_category)" in md and "`single_category`:" in md
    assert "No two annotators disagreed" in md


# ----------------------------------------------------------------------------- real labels (judge vs judge)
@pytest.mark.slow
@pytest.mark.shared
def test_real_llm_labels_vs_baseline_match_references():
    """LLM-judge labels from shared/data against the project's cue-phrase baseline on the same segments."""
    import krippendorff

    from .conftest import DATA

    seg_path, trace_path = DATA / "labeled_segments.jsonl", DATA / "traces.jsonl"
    from ror_annotate.agreement import Ratings, agreement
    from ror_annotate.judge.baseline import classify_trace

    problems = {}
    for line in trace_path.open(encoding="utf-8"):
        d = json.loads(line)
        problems[d["trace_id"]] = d.get("problem")
    rows: dict[str, list[dict]] = {}
    for line in seg_path.open(encoding="utf-8"):
        d = json.loads(line)
        if d["char_start"] is not None and d["text"].strip():
            rows.setdefault(d["trace_id"], []).append(d)
    items, anns, labs, groups = [], [], [], []
    for tid in sorted(rows)[:40]:
        segs = sorted(rows[tid], key=lambda d: d["char_start"])
        recs = []
        for i, d in enumerate(segs):
            lead = len(d["text"]) - len(d["text"].lstrip())
            body = d["text"].strip()
            start = d["char_start"] + lead
            recs.append(Segment(trace_id=tid, segment_index=i, char_start=start, char_end=start + len(body), text=body, n_tokens=len(body.split())))
        for d, rec, (lab, _) in zip(segs, recs, classify_trace(problems.get(tid), recs)):
            for who, label in (("llm", d["label_six"]), ("baseline", lab)):
                items.append(rec.segment_id)
                anns.append(who)
                labs.append(label)
                groups.append(tid)
    r = Ratings.from_long(items, anns, labs, groups=groups)
    d = agreement(r, n_resamples=200, reference="llm").to_dict()
    llm, base = r.column("llm"), r.column("baseline")
    both = (llm >= 0) & (base >= 0)
    assert d["cohen_kappa"][0]["value"] == pytest.approx(cohen_kappa_score(llm[both], base[both], labels=list(range(6))), abs=1e-9)
    data = np.where(r.codes >= 0, r.codes, np.nan).T
    assert d["krippendorff_alpha"]["value"] == pytest.approx(
        krippendorff.alpha(reliability_data=data, level_of_measurement="nominal", value_domain=list(range(6))), abs=1e-9
    )
    pc = d["per_class"]["annotators"]["baseline"]
    assert pc["macro_f1"]["value"] == pytest.approx(
        f1_score(llm[both], base[both], labels=list(range(6)), average="macro", zero_division=np.nan), abs=1e-9
    )
    assert d["krippendorff_alpha"]["ci_low"] < d["krippendorff_alpha"]["value"] < d["krippendorff_alpha"]["ci_high"]


def test_with_judge_includes_the_offline_baseline(store_data):
    """A study judged by the offline baseline (no LLM labels yet) still compares it with the humans."""
    path, annot, _ = store_data
    with Store(path) as store:
        truth = annot["adjudicator:h-cy"][2]
        store.upsert_labels(
            Label(trace_id=tid, segment_index=i, label=lab, source="baseline", annotator="baseline:cue-v1", codebook_version="baseline-cue-v1")
            for (tid, i), lab in truth.items()
        )
        d = agreement_summary(store, study="s1", with_judge=True, reference="adjudicated", n_resamples=50)
    assert "baseline:cue-v1" in d["annotators"]
    # the baseline here copies the reference labels exactly: its per-class macro-F1 against it is 1
    assert d["per_class"]["annotators"]["baseline:cue-v1"]["macro_f1"]["value"] == pytest.approx(1.0)

"""The export carries label uncertainty: label_confidence, label_distribution, raters, human_verified,
per-token confidence, --labels aggregate / import / auto, and the card's rater section. Every expected
value below is worked out by hand from the labels written in :func:`_store`."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ror_annotate.export import choose_label, export_dataset, load_export
from ror_annotate.records import BEHAVIORS, Annotator, Label

from . import tokenizers_fixtures as F
from .test_export import make_store

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
P, E, R, F_, X, C = range(6)  # class ids: planning, execution, restatement, fact, reflection, conclusion


def _lab(index, label, source, annotator, minutes=0, confidence=None, distribution=None):
    return Label(trace_id="tr-a", segment_index=index, label=label, source=source, annotator=annotator, codebook_version="cb",
                 created_at=T0 + timedelta(minutes=minutes), confidence=confidence, distribution=distribution)


def _store(path: Path):
    # tr-a = "Let me add them." | "17 + 25 = 42." | "Wait, is that right?" | "So the answer is 42."; the baseline
    # labelled them planning, execution, restatement, fact (make_store: BEHAVIORS[i % 6])
    store = make_store(path)
    store.upsert_labels([
        # seg 0: two judges, two aggregates (dawid-skene is the newer run), two humans who agree
        _lab(0, "planning", "judge", "openai:A", confidence=0.9), _lab(0, "reflection", "judge", "openai:B", confidence=0.6),
        _lab(0, "planning", "aggregate", "aggregate:dawid-skene", 10, 0.8, [0.8, 0, 0, 0, 0.2, 0]),
        _lab(0, "reflection", "aggregate", "aggregate:majority-vote", 1, 0.5, [0.5, 0, 0, 0, 0.5, 0]),
        _lab(0, "planning", "human", "h-1"), _lab(0, "planning", "human", "h-2"),
        # seg 1: the aggregate says conclusion, the one human says execution
        _lab(1, "conclusion", "aggregate", "aggregate:dawid-skene", 10, 0.55, [0, 0.45, 0, 0, 0, 0.55]),
        _lab(1, "execution", "human", "h-1"),
        # seg 2: three judges, 2 fact vs 1 execution; no aggregate
        _lab(2, "fact", "judge", "openai:A"), _lab(2, "fact", "judge", "openai:B"), _lab(2, "execution", "judge", "openai:C"),
        # seg 3: one judge with a self-reported confidence; an imported human rater
        _lab(3, "conclusion", "judge", "openai:A", confidence=0.7), _lab(3, "fact", "import", "ta"),
    ])
    store.upsert_annotators([
        Annotator(annotator="ta", kind="human", source="import", details={"crosswalk": "thought-anchors@v1"}),
        Annotator(annotator="aggregate:dawid-skene", kind="machine", source="aggregate", model="dawid-skene"),
        Annotator(annotator="openai:A", kind="machine", source="judge", model="gpt-a"),
    ])
    return store


def _rows(out: Path) -> dict[tuple[str, int], dict]:
    return {(r["trace_id"], r["segment_index"]): r for split in load_export(out, "segments").values() for r in split}


def test_auto_export_carries_confidence_distribution_raters_and_verification(tmp_path):
    store = _store(tmp_path / "s.duckdb")
    summary = export_dataset(store, tmp_path / "auto", split_fractions=(1, 0, 0))
    rows = _rows(tmp_path / "auto")
    a = [rows[("tr-a", i)] for i in range(4)]
    # seg 0: human plurality (2 of 2 humans: planning) -> vote share 1.0, distribution all on planning, verified
    assert (a[0]["label"], a[0]["label_source"], a[0]["n_votes"]) == (P, "human", 2)
    assert a[0]["label_confidence"] == 1.0 and a[0]["label_distribution"] == [1.0, 0, 0, 0, 0, 0]
    assert a[0]["human_verified"] is True
    assert a[0]["raters"] == [
        {"annotator": "aggregate:dawid-skene", "kind": "machine", "label": P},
        {"annotator": "aggregate:majority-vote", "kind": "machine", "label": X},
        {"annotator": "baseline:cue-v1", "kind": "machine", "label": P},
        {"annotator": "h-1", "kind": "human", "label": P},
        {"annotator": "h-2", "kind": "human", "label": P},
        {"annotator": "openai:A", "kind": "machine", "label": P},
        {"annotator": "openai:B", "kind": "machine", "label": X},
    ]
    # seg 1: the single human -> execution, its own confidence (none), verified by itself
    assert (a[1]["label"], a[1]["label_source"], a[1]["label_confidence"], a[1]["label_distribution"], a[1]["human_verified"]) == (
        E, "human", None, None, True)
    # seg 2: no human, no aggregate -> judges 2 fact / 1 execution: share 2/3, distribution (0, 1/3, 0, 2/3, 0, 0)
    assert (a[2]["label"], a[2]["label_source"], a[2]["n_votes"], a[2]["human_verified"]) == (F_, "judge", 3, False)
    assert a[2]["label_confidence"] == pytest.approx(2 / 3, abs=1e-6)
    assert a[2]["label_distribution"] == pytest.approx([0, 1 / 3, 0, 2 / 3, 0, 0], abs=1e-6)
    # seg 3: one judge (the import is never chosen by auto) -> its self-reported confidence; the imported rater is human
    assert (a[3]["label"], a[3]["label_source"], a[3]["label_distribution"]) == (C, "judge", None)
    assert a[3]["label_confidence"] == pytest.approx(0.7)
    assert {"annotator": "ta", "kind": "human", "label": F_} in a[3]["raters"]
    # other traces: the baseline alone, no confidence, no reviewer
    b0 = rows[("tr-b", 0)]
    assert (b0["label_source"], b0["label_confidence"], b0["raters"], b0["human_verified"]) == (
        "baseline", None, [{"annotator": "baseline:cue-v1", "kind": "machine", "label": 0}], False)
    # 10 labelled segments, 2 verified (tr-a 0 and 1); confidences: 1.0, 2/3, 0.7
    u = summary.uncertainty
    assert (u["n_labelled"], u["n_human_verified"], u["n_with_confidence"]) == (10, 2, 3)
    assert u["human_verified_share"] == pytest.approx(0.2)
    assert u["mean_label_confidence"] == pytest.approx((1 + 2 / 3 + 0.7) / 3)
    assert u["aggregate"] == "aggregate:dawid-skene"  # newest aggregate run; auto reaches no aggregate label here


def test_aggregate_export_round_trips_through_disk_and_parquet(tmp_path):
    import datasets

    store = _store(tmp_path / "s.duckdb")
    out = tmp_path / "agg"
    summary = export_dataset(store, out, label_source="aggregate", split_fractions=(1, 0, 0))
    rows = _rows(out)
    # the newest aggregate rater only (dawid-skene), never the older majority-vote run
    assert (rows[("tr-a", 0)]["label"], rows[("tr-a", 0)]["annotator"]) == (P, "aggregate:dawid-skene")
    assert rows[("tr-a", 0)]["label_confidence"] == pytest.approx(0.8)
    assert rows[("tr-a", 0)]["label_distribution"] == pytest.approx([0.8, 0, 0, 0, 0.2, 0])
    assert rows[("tr-a", 0)]["human_verified"] is True  # humans' unanimous planning
    assert (rows[("tr-a", 1)]["label"], rows[("tr-a", 1)]["human_verified"]) == (C, False)  # the human said execution
    assert rows[("tr-a", 1)]["label_confidence"] == pytest.approx(0.55)
    assert rows[("tr-a", 2)]["label"] is None and rows[("tr-a", 2)]["label_confidence"] is None
    assert rows[("tr-a", 2)]["label_distribution"] is None
    assert (summary.uncertainty["n_labelled"], summary.uncertainty["n_human_verified"]) == (2, 1)
    # parquet, read without datasets: the same values, float32 and a variable-length list with nulls
    table = pq.read_table(next((out / "data" / "segments").glob("train-*.parquet")))
    by_key = {(r["trace_id"], r["segment_index"]): r for r in table.to_pylist()}
    assert by_key[("tr-a", 1)]["label_distribution"] == pytest.approx([0, 0.45, 0, 0, 0, 0.55])
    assert by_key[("tr-a", 2)]["label_distribution"] is None
    assert str(table.schema.field("label_distribution").type) == "list<element: float>"
    via_parquet = datasets.load_dataset("parquet", data_files=str(out / "data/segments/train-*.parquet"))["train"]
    assert via_parquet.features["raters"].feature["label"] == datasets.ClassLabel(names=list(BEHAVIORS))
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "## Raters and label uncertainty" in card
    assert "aggregation: `aggregate:dawid-skene` (method dawid-skene)" in card
    assert "human-verified labels: 1 of 2 labelled segments (50.0%)" in card
    assert "| ta | human | import |  | thought-anchors@v1 | 1 |" in card
    assert "Raters: 6 machine, 3 human." in card  # aggregate x2, baseline, openai:A/B/C; h-1, h-2, ta


def test_import_label_source(tmp_path):
    store = _store(tmp_path / "s.duckdb")
    export_dataset(store, tmp_path / "imp", label_source="import", split_fractions=(1, 0, 0))
    rows = _rows(tmp_path / "imp")
    assert (rows[("tr-a", 3)]["label"], rows[("tr-a", 3)]["label_source"], rows[("tr-a", 3)]["annotator"]) == (F_, "import", "ta")
    assert sum(r["label"] is not None for r in rows.values()) == 1


def test_per_token_confidence(tmp_path):
    store = _store(tmp_path / "s.duckdb")
    export_dataset(store, tmp_path / "tok", label_source="aggregate", tokenizer=F.byte_level_bpe(), split_fractions=(1, 0, 0))
    t = next(r for r in load_export(tmp_path / "tok", "tokens")["train"] if r["trace_id"] == "tr-a")
    assert len(t["confidence"]) == len(t["input_ids"])
    for i, (lab, sid) in enumerate(zip(t["labels"], t["segment_ids"])):
        if lab == -100:
            assert t["confidence"][i] is None
        else:
            assert t["confidence"][i] == pytest.approx({0: 0.8, 1: 0.55}[sid])
    assert any(c == pytest.approx(0.8) for c in t["confidence"]) and any(c == pytest.approx(0.55) for c in t["confidence"])


def test_auto_order_puts_the_aggregate_between_humans_and_judges():
    judge = Label(trace_id="t", segment_index=0, label="fact", source="judge", annotator="openai:A", codebook_version="cb")
    agg = Label(trace_id="t", segment_index=0, label="planning", source="aggregate", annotator="aggregate:ds", codebook_version="cb",
                confidence=0.6, distribution=[0.6, 0.4, 0, 0, 0, 0])
    other = agg.model_copy(update={"annotator": "aggregate:mv", "label": "execution"})
    human = Label(trace_id="t", segment_index=0, label="reflection", source="human", annotator="h-1", codebook_version="cb")
    imported = Label(trace_id="t", segment_index=0, label="fact", source="import", annotator="ta", codebook_version="cb")
    assert choose_label([judge, agg], "auto")[0].label == "planning"
    assert choose_label([judge, agg], "auto")[0].confidence == 0.6
    assert choose_label([judge, agg, human], "auto")[0].label == "reflection"
    assert choose_label([agg, other], "aggregate", aggregate="aggregate:mv")[0].label == "execution"
    assert choose_label([agg], "auto", aggregate="aggregate:mv")[0].label is None  # another run's label is not mixed in
    assert choose_label([imported], "auto")[0].label is None  # an import alone is not an auto label
    assert choose_label([imported], "import")[0].label == "fact"


def test_aggregate_or_import_labels_missing_is_e830(tmp_path):
    from ror_annotate.errors import ExportError

    store = make_store(tmp_path / "s.duckdb")  # baseline labels only
    for source, hint in (("aggregate", "ror aggregate"), ("import", "ror labels import")):
        with pytest.raises(ExportError, match=hint) as info:
            export_dataset(store, tmp_path / source, label_source=source)
        assert info.value.code == "E830"
        assert not (tmp_path / source).exists()

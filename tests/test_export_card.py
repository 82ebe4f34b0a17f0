"""Every export column is declared once (export/columns.py), and the card -- rendered from its Jinja
template -- states the aggregate's ensemble and its calibration against the human reference with the
same numbers as ``ror agree --json``. Expected figures are worked out by hand from the labels below."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ror_annotate.export import COLUMN_DOCS, CONFIGS, export_dataset
from ror_annotate.export.columns import COLUMNS, Column, features_of
from ror_annotate.records import Annotator, Label

from . import tokenizers_fixtures as F
from .test_export import make_store

WRONG = {("tr-a", 0), ("tr-a", 1), ("tr-b", 0), ("tr-c", 0)}  # the aggregate's 4 errors among the 10 segments


def test_every_column_has_one_name_type_doc_and_value():
    for config in CONFIGS:
        cols = COLUMNS[config]
        names = [c.name for c in cols]
        assert len(names) == len(set(names)), config
        for c in cols:
            assert isinstance(c, Column) and c.doc.strip() and "\n" not in c.doc, (config, c.name)
            assert callable(c.value) and callable(c.encode) and c.feature() is not None, (config, c.name)
        # the features and the card's docs are the same table, in the same order
        assert list(features_of(config)) == names == list(COLUMN_DOCS[config]), config


def test_written_files_have_exactly_the_declared_columns(tmp_path):
    """The row builder writes every declared column, in order, with the declared type: nothing can drift."""
    store = make_store(tmp_path / "s.duckdb")
    out = tmp_path / "o"
    export_dataset(store, out, tokenizer=F.byte_level_bpe(), split_fractions=(1, 0, 0))
    for config in CONFIGS:
        schema = pq.read_schema(next((out / "data" / config).glob("train-*.parquet")))
        assert schema.names == [c.name for c in COLUMNS[config]], config
        assert schema.remove_metadata() == features_of(config).arrow_schema.remove_metadata(), config


def _calibration_store(path):
    """make_store's 10 segments (tr-a 4, tr-b 3, tr-c 3); two humans agree on planning everywhere; the
    aggregate gives every segment confidence 0.8 and 0.2 on the other class, right on 6, wrong on 4."""
    store = make_store(path)
    labels = []
    for s in store.segments():
        key = (s.trace_id, s.segment_index)
        for h in ("h-1", "h-2"):
            labels.append(Label(trace_id=s.trace_id, segment_index=s.segment_index, label="planning", source="human",
                                annotator=h, codebook_version="cb", study="s1"))
        wrong = key in WRONG
        labels.append(Label(
            trace_id=s.trace_id, segment_index=s.segment_index, label="reflection" if wrong else "planning", source="aggregate",
            annotator="aggregate:dawid-skene", codebook_version="cb", confidence=0.8,
            distribution=(0.2, 0, 0, 0, 0.8, 0) if wrong else (0.8, 0, 0, 0, 0.2, 0),
        ))
        labels.append(Label(trace_id=s.trace_id, segment_index=s.segment_index, label="planning", source="judge",
                            annotator="openai:A", codebook_version="cb"))
    store.upsert_labels(labels)
    store.upsert_annotators([
        Annotator(annotator="openai:A", kind="machine", source="judge", model="gpt-a"),
        Annotator(annotator="aggregate:dawid-skene", kind="machine", source="aggregate", model="dawid-skene",
                  details={"raters": ["openai:A", "baseline:cue-v1"], "human": "held-out", "held_out_humans": ["h-1", "h-2"]}),
    ])
    return store


def test_card_states_calibration_like_ror_agree(tmp_path):
    from ror_annotate.cli import app

    path = tmp_path / "s.duckdb"
    store = _calibration_store(path)
    out = tmp_path / "o"
    export_dataset(store, out, label_source="aggregate", split_fractions=(1, 0, 0))
    store.close()
    res = CliRunner().invoke(app, ["agree", "--db", str(path), "--json"])
    assert res.exit_code == 0, res.output
    (agreed,) = json.loads(res.stdout)["calibration"]["raters"]
    # by hand: one bin holds all 10 (confidence 0.8, 6 right): ECE = |6 - 8| / 10 = 0.2; multi-class Brier:
    # right (0.8-1)^2 + 0.2^2 = 0.08, wrong 0.8^2 + (0.2-1)^2 = 1.28 -> (6 * 0.08 + 4 * 1.28) / 10 = 0.56
    assert agreed["ece"]["value"] == pytest.approx(0.2) and agreed["brier"]["value"] == pytest.approx(0.56)
    manifest = json.loads((out / "ror_export.json").read_text(encoding="utf-8"))
    (exported,) = manifest["uncertainty"]["calibration"]["raters"]
    assert exported["ece"] == agreed["ece"] and exported["brier"] == agreed["brier"]  # the same numbers, intervals included
    card = (out / "README.md").read_text(encoding="utf-8")
    ece, brier = agreed["ece"], agreed["brier"]
    assert (
        f"| aggregate:dawid-skene (the exported labels) | posterior | 10 | 3 | 0.600 | 0.800 | "
        f"0.200 [{ece['ci_low']:.3f}, {ece['ci_high']:.3f}] | 0.560 [{brier['ci_low']:.3f}, {brier['ci_high']:.3f}] "
        "(multi-class, 0 to 2) |"
    ) in card
    assert "scored on the 10 segments with a human reference" in card and "(1000 resamples)" in card
    assert (
        "- ensemble behind `aggregate:dawid-skene`: `openai:A` (machine, gpt-a), `baseline:cue-v1` (machine); "
        "human labels held out of the estimate (h-1, h-2)"
    ) in card
    # the share of human-verified labels is still stated: 6 of 10 aggregate labels equal the humans' planning
    assert "human-verified labels: 6 of 10 labelled segments (60.0%)" in card


def test_card_says_why_calibration_could_not_be_measured(tmp_path):
    store = make_store(tmp_path / "s.duckdb")
    export_dataset(store, tmp_path / "none", split_fractions=(1, 0, 0))
    card = (tmp_path / "none" / "README.md").read_text(encoding="utf-8")
    assert "Calibration could not be measured: no human reference (no human or adjudicated labels)" in card
    assert "Review a sample of segments" in card
    # humans now, but no machine rater with a confidence (the baseline gives none)
    store.upsert_labels([Label(trace_id="tr-a", segment_index=i, label="planning", source="human", annotator=h,
                               codebook_version="cb", study="s1") for h in ("h-1", "h-2") for i in range(4)])
    export_dataset(store, tmp_path / "humans", split_fractions=(1, 0, 0))
    card = (tmp_path / "humans" / "README.md").read_text(encoding="utf-8")
    assert "Calibration could not be measured: no machine rater with a confidence" in card
    assert "Run `ror aggregate` (a posterior)" in card and "Review a sample of segments" not in card
    assert "| rater | confidence | segments |" not in card

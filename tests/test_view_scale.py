"""The viewer at corpus scale, without a browser: compact agreement, sharded index and cells.

The dashboard's agreement figures are computed from integer codes (``ror_annotate.view.agreement``);
the expected values are ``ror_annotate.agreement.agreement_summary`` (what ``ror agree --json``
prints), which reads every label as a ``Label`` object: the two paths share no reading code.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from ror_annotate import pipeline
from ror_annotate.agreement import agreement_summary
from ror_annotate.errors import AgreementError
from ror_annotate.records import BEHAVIORS, Label, utc_now
from ror_annotate.sample import sample_path
from ror_annotate.store import Store
from ror_annotate.view import ViewOptions, build_view
from ror_annotate.view.agreement import view_agreement
from ror_annotate.view.build import INDEX_SHARD_SIZE, cell_path, index_shard_path

RESAMPLES = 40


def _payload(path: Path) -> dict:
    text = path.read_text(encoding="ascii")
    return json.loads(text[text.index("(") + 1 : text.rindex(")")])


def _shift(name: str, k: int) -> str:
    return BEHAVIORS[(BEHAVIORS.index(name) + k) % len(BEHAVIORS)]


@pytest.fixture(scope="module")
def rich_store(tmp_path_factory) -> Path:
    """Six sample traces; raters: baseline, two humans (bob on half the segments), adjudications on a few
    disagreements, an aggregate with distributions, a judge with self-reported confidence and its K-sample sibling."""
    tmp = tmp_path_factory.mktemp("viewscale")
    rows = [json.loads(line) for line in sample_path().open(encoding="utf-8")][:6]
    src = tmp / "traces.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    db = tmp / "rich.duckdb"
    later = utc_now() + timedelta(seconds=5)
    with Store(db) as store:
        pipeline.ingest(store, src)
        pipeline.segment(store)
        pipeline.label(store, judge="baseline")
        extra = []
        for lab in store.labels(source="baseline"):
            t, i, name = lab.trace_id, lab.segment_index, lab.label
            alice = _shift(name, 1) if i % 4 == 1 else name
            extra.append(Label(trace_id=t, segment_index=i, label=alice, source="human", annotator="alice", codebook_version="v1"))
            if i % 2 == 0:
                bob = _shift(name, 2) if i % 6 == 0 else alice
                extra.append(Label(trace_id=t, segment_index=i, label=bob, source="human", annotator="bob", codebook_version="v1"))
                if bob != alice and i % 3 == 0:
                    extra.append(Label(trace_id=t, segment_index=i, label=bob, source="adjudicated", annotator="carol",
                                       codebook_version="v1", created_at=later))
            if i % 3 != 2:
                peak = 0.8 if i % 5 else 0.35
                top = BEHAVIORS.index(name if i % 7 else _shift(name, 3))
                p = [peak if k == top else (1 - peak) / (len(BEHAVIORS) - 1) for k in range(len(BEHAVIORS))]
                extra.append(Label(trace_id=t, segment_index=i, label=BEHAVIORS[top], source="aggregate", annotator="ds",
                                   codebook_version="v1", confidence=peak, distribution=p))
            judge = name if i % 5 else _shift(name, 1)
            extra.append(Label(trace_id=t, segment_index=i, label=judge, source="judge", annotator="openai:m", codebook_version="v1",
                               confidence=0.9 if i % 5 else 0.6))
            extra.append(Label(trace_id=t, segment_index=i, label=judge if i % 3 else name, source="judge", annotator="openai:m@s2",
                               codebook_version="v1"))
        store.upsert_labels(extra)
    return db


@pytest.mark.parametrize("reference", ["majority", "human", "adjudicated", "alice", None])
@pytest.mark.parametrize("batch_size", [1, 200])
def test_compact_agreement_equals_agree_json(rich_store, reference, batch_size):
    with Store(rich_store, read_only=True) as store:
        want = agreement_summary(store, reference=reference, n_resamples=RESAMPLES, seed=3)
        got = view_agreement(store, reference=reference, n_resamples=RESAMPLES, seed=3, batch_size=batch_size)
    assert want["calibration"]["raters"], "the fixture must exercise calibration"
    assert {r["confidence_kind"] for r in want["calibration"]["raters"]} == {"posterior", "self-reported", "vote"}
    # through JSON, as ror agree --json and data/agreement.json write it (NaN as null)
    assert json.loads(json.dumps(got, default=str)) == json.loads(json.dumps(want, default=str))


def test_compact_agreement_refuses_two_labels_of_one_rater(tmp_path, rich_store):
    db = tmp_path / "dup.duckdb"
    db.write_bytes(rich_store.read_bytes())
    with Store(db) as store:
        lab = store.labels(annotator="alice")[0]
        store.upsert_labels([Label(trace_id=lab.trace_id, segment_index=lab.segment_index, label=lab.label, source="human",
                                   annotator="alice", codebook_version="v2")])
        with pytest.raises(AgreementError, match="alice"):
            agreement_summary(store, n_resamples=0)
        with pytest.raises(AgreementError, match=f"alice.*{lab.trace_id}#{lab.segment_index}"):
            view_agreement(store, n_resamples=0)
        summary = build_view(store, tmp_path / "site", ViewOptions(resamples=0))
    assert summary.agreement is not None and "two labels" in summary.agreement


def test_index_and_cells_are_sharded(rich_store, tmp_path, monkeypatch):
    import ror_annotate.view.build as build_mod

    monkeypatch.setattr(build_mod, "INDEX_SHARD_SIZE", 2)
    with Store(rich_store, read_only=True) as store:
        summary = build_view(store, tmp_path / "site", ViewOptions(resamples=0, cell_examples=3))
        ids = [t for t in store.trace_ids()]
        want_rows = {t: len(store.segments(t)) for t in ids}
        agree = agreement_summary(store, n_resamples=0)
    site = tmp_path / "site"
    meta = _payload(site / "data" / "index.js")
    assert meta["n_traces"] == summary.traces == len(ids) and meta["index_shard_size"] == 2
    assert meta["index_shards"] == 3 and "traces" not in meta
    rows = []
    for k in range(meta["index_shards"]):
        shard = _payload(site / index_shard_path(k))
        assert shard["k"] == k and len(shard["rows"]) <= 2
        rows += [dict(zip(meta["columns"], r)) for r in shard["rows"]]
    assert [r["n"] for r in rows] == list(range(len(ids)))
    assert {r["id"]: r["segments"] for r in rows} == want_rows
    # every non-empty confusion cell has a shard: its count equals ror agree's matrix entry, at most 3 items listed
    raters = [r["name"] for r in meta["raters"]]
    by_n = {r["id"]: r["n"] for r in rows}
    for a, entry in agree["per_class"]["annotators"].items():
        for r, row in enumerate(entry["confusion_matrix"]):
            for c, v in enumerate(row):
                path = site / cell_path(raters.index(a), r, c)
                if not v:
                    assert not path.exists()
                    continue
                cell = _payload(path)
                assert cell["n"] == v and len(cell["items"]) == min(v, 3)
                for trace_id, _index, _text, n in cell["items"]:
                    assert by_n[trace_id] == n
    assert INDEX_SHARD_SIZE >= 1000  # the real shard size keeps the file count small at 10,000 traces


def test_compact_agreement_without_confidences_counts_the_reference(tmp_path, rich_store):
    """No rater with a confidence: calibration only counts the human reference (machine labels are not read)."""
    db = tmp_path / "noconf.duckdb"
    db.write_bytes(rich_store.read_bytes())
    with Store(db) as store:
        store.delete_labels([lab.label_id for lab in store.labels() if lab.annotator in ("ds", "openai:m", "openai:m@s2")])
        want = agreement_summary(store, n_resamples=RESAMPLES)
        got = view_agreement(store, n_resamples=RESAMPLES, batch_size=2)
    assert want["calibration"]["raters"] == [] and want["calibration"]["n_reference_items"] > 0
    assert json.loads(json.dumps(got, default=str)) == json.loads(json.dumps(want, default=str))

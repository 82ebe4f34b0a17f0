"""Integration: real traces (the embedded sample; in the ``shared`` tier also a spread of
shared/data's three sources), the real segmenter and baseline judge, exported with real
offline-built tokenizers (raw and chat-template renderings); every trace's alignment is verified by
the export itself, and checked here against the segments."""

from __future__ import annotations

import json

import pytest

from ror_annotate.export import export_dataset, load_export
from ror_annotate.records import Trace
from ror_annotate.store import Store

from . import tokenizers_fixtures as F

from .conftest import DATA

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["sample", pytest.param("shared", marks=pytest.mark.shared)])
def real_store(request, tmp_path_factory, real_traces_path):
    from ror_annotate.judge import make_judge
    from ror_annotate.segment import Segmenter

    path = real_traces_path if request.param == "sample" else DATA / "traces.jsonl"
    rows = [json.loads(line) for line in path.open(encoding="utf-8")]
    # a spread: every 5th sample trace (both models, six MATH subjects); every 25th shared trace
    # (ReasoningFlow, thought-anchors, steering-thinking-llms)
    picked = rows[:: 5 if request.param == "sample" else 25]
    store = Store(tmp_path_factory.mktemp("real") / "s.duckdb")
    store.upsert_traces(
        Trace(trace_id=r["trace_id"], text=r["trace"], problem=r.get("problem"), answer=r.get("answer"),
              gold_answer=r.get("gold_answer"), correct=r.get("correct"), model=r.get("model"), dataset=r.get("benchmark"))
        for r in picked
    )
    segmenter = Segmenter()
    for t in store.iter_traces():
        store.replace_segments(t.trace_id, segmenter.segment(t.text, t.trace_id), segmenter=segmenter.name, token_counter="approx")
    run = store.start_run("test")
    make_judge("baseline").label(store, store.trace_ids(), run=run)
    yield store
    store.close()


@pytest.mark.parametrize("family, chat_template", [("byte_level_bpe", True), ("metaspace_bpe", False), ("wordpiece", False)])
def test_real_traces_align_and_round_trip(real_store, tmp_path, family, chat_template):
    tok = F.ALL[family]()
    summary = export_dataset(real_store, tmp_path / "o", tokenizer=tok, chat_template=chat_template, stratify_by="dataset")
    segments = real_store.segments()
    assert summary.n_segments == len(segments) and summary.label_source_counts == {"baseline": len(segments)}
    tokens = {r["trace_id"]: r for split in load_export(tmp_path / "o", "tokens").values() for r in split}
    assert len(tokens) == len(real_store.trace_ids())
    for split in load_export(tmp_path / "o", "segments").values():
        for row in split:
            t = tokens[row["trace_id"]]
            off = t["text_offset"]
            ids = [i for i in range(row["token_start"], row["token_end"]) if t["segment_ids"][i] == row["segment_index"]]
            assert ids, row["text"]
            covered = set()
            for i in range(row["token_start"], row["token_end"]):
                s, e = t["offsets"][i]
                covered.update(range(max(s, row["char_start"] + off), min(e, row["char_end"] + off)))
            nonspace = {c + row["char_start"] + off for c, ch in enumerate(row["text"]) if not ch.isspace()}
            assert nonspace <= covered
    assert summary.analytics["n_traces"] == len(tokens)
    card = (tmp_path / "o" / "README.md").read_text(encoding="utf-8")
    assert f"This export has **{summary.n_straddling}** straddling tokens" in card

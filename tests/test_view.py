"""The viewer site's builder without a browser: shard contents, escaping, errors, export input, ledger, serve.

Expected values come from the store's own records (``text[char_start:char_end]``), hand calculation,
or ``ror agree --json``; the browser-side checks are in ``test_view_browser.py``.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ror_annotate import pipeline
from ror_annotate.cli import app
from ror_annotate.errors import ConfigError, ViewError
from ror_annotate.records import BEHAVIORS, Label, Trace
from ror_annotate.store import Store
from ror_annotate.view import ViewOptions, build_view, make_server
from ror_annotate.view.build import _Calibration, js_payload, read_index_rows, round_starts, shard_path

from .view_fixtures import HOSTILE_ID, HOSTILE_TEXT, build_store

runner = CliRunner()


def _payload(path: Path) -> dict:
    text = path.read_text(encoding="ascii")
    assert text.startswith("ROR.") and text.rstrip().endswith(");")
    return json.loads(text[text.index("(") + 1 : text.rindex(")")])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("viewunit")
    db = build_store(tmp, n_sample=2)
    with Store(db, read_only=True) as store:
        summary = build_view(store, tmp / "site", ViewOptions(resamples=50))
    return tmp, db, summary


def test_shards_hold_exact_segment_texts_and_every_label(built):
    tmp, db, summary = built
    index = _payload(tmp / "site" / "data" / "index.js")
    raters = [r["name"] for r in index["raters"]]
    with Store(db, read_only=True) as store:
        traces = {t.trace_id: t for t in store.iter_traces()}
        rows = read_index_rows(tmp / "site")
        assert summary.traces == len(traces) == len(rows) == index["n_traces"]
        for row in rows:
            shard = _payload(tmp / "site" / shard_path(row["n"]))
            trace, segs = traces[row["id"]], store.segments(row["id"])
            assert shard["id"] == trace.trace_id
            assert [s[0] for s in shard["segs"]] == [trace.text[s.char_start : s.char_end] for s in segs]
            # gaps and segments rebuild the text exactly
            assert "".join(g + s[0] for g, s in zip(shard["gaps"], shard["segs"])) + shard["gaps"][-1] == trace.text
            want = sorted((lab.segment_index, lab.annotator, lab.label) for lab in store.labels(trace_id=row["id"]))
            got = sorted((segs[i].segment_index, raters[e[0]], BEHAVIORS[e[1]]) for i, entries in enumerate(shard["labels"]) for e in entries)
            assert got == want
    assert set(raters) == {"alice", "ds", "baseline:cue-v1"}
    assert raters[0] == "alice"  # human before aggregate before baseline


def test_hostile_text_is_ascii_json_without_a_closing_tag(built):
    tmp, _, _ = built
    n = next(r["n"] for r in read_index_rows(tmp / "site") if r["id"] == HOSTILE_ID)
    raw = (tmp / "site" / shard_path(n)).read_text(encoding="ascii")
    assert "</" not in raw and "<script>" in raw  # "</script>" is written "<\/script>"
    shard = _payload(tmp / "site" / shard_path(n))
    assert "".join(g + s[0] for g, s in zip(shard["gaps"], shard["segs"])) + shard["gaps"][-1] == HOSTILE_TEXT
    assert js_payload("x", {"a": "😀</b>"}) == 'ROR.x({"a":"\\ud83d\\ude00<\\/b>"});\n'


def test_agreement_json_equals_ror_agree(built):
    tmp, db, _ = built
    res = runner.invoke(app, ["agree", "--db", str(db), "--json", "--resamples", "50"])
    assert res.exit_code == 0, res.output
    agree = json.loads(res.stdout)
    mine = json.loads((tmp / "site" / "data" / "agreement.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in mine.items() if k != "selection"} == {k: v for k, v in agree.items() if k != "selection"}
    assert _payload(tmp / "site" / "data" / "dashboard.js")["agreement"] == mine


def test_round_starts_by_hand():
    labels = ["planning", "conclusion", "execution", "reflection", "planning", "conclusion", "planning", "conclusion", "fact"]
    # first answer at 1; rounds open at 3 (reflection after a conclusion) and 6 (planning after the conclusion at 5)
    assert round_starts(labels, 1) == [3, 6]
    assert round_starts(labels, None) == []


def test_calibration_bins_by_hand():
    cal = _Calibration()
    # rater 0 conf 0.95 agrees with the others' majority (1,1); rater 0 conf 0.55 disagrees (2 vs 3); a tie is skipped
    cal.add([[[0, 1, 0.95], [1, 1, None], [2, 1, None]], [[0, 2, 0.55], [1, 3, None], [2, 3, None]], [[0, 4, 0.35], [1, 2, None], [2, 3, None]]])
    bins = cal.result()["0"]
    assert bins[9] == {"n": 1, "correct": 1, "mean_confidence": 0.95}
    assert bins[5] == {"n": 1, "correct": 0, "mean_confidence": 0.55}
    assert sum(b["n"] for b in bins) == 2


def test_cost_ledger_reads_run_counts(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.upsert_traces([Trace(trace_id="t", text="Let me think. So the answer is 4.")])
        pipeline.segment(store)
        with store.run("label", {"judge": "openai"}) as run:
            run.counts.update({"requests": 3, "input_tokens": 1200, "output_tokens": 90, "cost_usd": 0.25, "labeled": 2})
        store.upsert_labels([Label(trace_id="t", segment_index=0, label="planning", source="judge", annotator="j", codebook_version="v")])
        summary = build_view(store, tmp_path / "site", ViewOptions(resamples=0))
    dash = _payload(tmp_path / "site" / "data" / "dashboard.js")
    row = next(r for r in dash["ledger"] if r["command"] == "label")
    assert (row["requests"], row["input_tokens"], row["output_tokens"], row["cost_usd"], row["labeled"]) == (3, 1200, 90, 0.25, 2)
    assert summary.agreement is not None and summary.agreement.startswith("One rater (j) labelled this store, so there is nothing to compare")
    assert dash["review"] == []


def test_from_export_builds_trace_pages(tmp_path, real_traces_path):
    rows = real_traces_path.read_text(encoding="utf-8").splitlines()[:3]
    (tmp_path / "t.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    with Store(tmp_path / "s.duckdb") as store:
        pipeline.ingest(store, tmp_path / "t.jsonl")
        store.upsert_traces([Trace(trace_id=HOSTILE_ID, text=HOSTILE_TEXT)])
        pipeline.segment(store)
        pipeline.label(store, judge="baseline")
        want = {t.trace_id: t.text for t in store.iter_traces()}
    res = runner.invoke(app, ["export", "demo", "--out", str(tmp_path / "export"), "--view", "--db", str(tmp_path / "s.duckdb")])
    assert res.exit_code == 0, res.output
    # `ror export --view` put the site (from the store) into the export folder
    assert {r["id"] for r in read_index_rows(tmp_path / "export" / "view")} == set(want)
    res = runner.invoke(app, ["view", "--from-export", str(tmp_path / "export"), "--out", str(tmp_path / "site")])
    assert res.exit_code == 0, res.output
    index = _payload(tmp_path / "site" / "data" / "index.js")
    assert {r["id"] for r in read_index_rows(tmp_path / "site")} == set(want)
    assert [r["name"] for r in index["raters"]] == ["baseline:cue-v1"]
    for row in read_index_rows(tmp_path / "site"):
        shard = _payload(tmp_path / "site" / shard_path(row["n"]))
        assert "".join(g + s[0] for g, s in zip(shard["gaps"], shard["segs"])) + shard["gaps"][-1] == want[row["id"]]
        assert all(len(e) == 1 for e in shard["labels"])


def test_errors_are_coded(built, tmp_path):
    _, db, _ = built
    (tmp_path / "file").write_text("x")
    res = runner.invoke(app, ["view", "--db", str(db), "--out", str(tmp_path / "file")])
    assert res.exit_code == 2 and "E851" in res.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    res = runner.invoke(app, ["view", "--db", str(db), "--out", str(tmp_path / "full")])
    assert res.exit_code == 2 and "E851" in res.output and (tmp_path / "full" / "keep.txt").exists()
    res = runner.invoke(app, ["view", "--from-export", str(tmp_path), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "E853" in res.output
    with Store(tmp_path / "empty.duckdb") as store:
        with pytest.raises(ViewError) as exc:
            build_view(store, tmp_path / "o2")
        assert exc.value.code == "E852"
    with pytest.raises(ConfigError, match="batch_size"):
        ViewOptions.from_options({"batch_sise": 3})
    with pytest.raises(ViewError) as exc:
        make_server(tmp_path / "nothing")
    assert exc.value.code == "E855"


def test_rebuild_replaces_old_shards(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.upsert_traces([Trace(trace_id=f"t{i}", text=f"Let me think. So the answer is {i}.") for i in range(3)])
        pipeline.segment(store)
        build_view(store, tmp_path / "site", ViewOptions(resamples=0))
        assert (tmp_path / "site" / shard_path(2)).exists()
    with Store(tmp_path / "s2.duckdb") as store:
        store.upsert_traces([Trace(trace_id="only", text="Let me think.")])
        pipeline.segment(store)
        build_view(store, tmp_path / "site", ViewOptions(resamples=0))
    assert not (tmp_path / "site" / shard_path(2)).exists()
    assert [r["id"] for r in read_index_rows(tmp_path / "site")] == ["only"]


def test_serve_binds_loopback_and_serves_the_site(built):
    tmp, _, _ = built
    server = make_server(tmp / "site", 0)
    assert server.server_address[0] == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=10) as resp:
            assert resp.status == 200 and b"data/index.js" in resp.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{shard_path(0)}", timeout=10) as resp:
            assert resp.read().startswith(b"ROR.shard(")
    finally:
        server.shutdown()
        server.server_close()


def test_dashboard_shows_review_progress(tmp_path):
    from ror_annotate.review.studies import assignments, create_study, study_people

    from .review_fixtures import make_store

    store = make_store(tmp_path / "r.duckdb")
    create_study(store, "s1", annotators=["ann1@example.org", "ann2@example.org"], overlap=2, n=4)
    first = study_people(store, "s1")[0]
    done = assignments(store, "s1", first)[:3]  # the first annotator labelled 3 of their 4 segments
    store.upsert_labels([Label(trace_id=t, segment_index=i, label="fact", source="human", annotator=first,
                               codebook_version="v", study="s1") for t, i in done])
    store.close()
    with Store(tmp_path / "r.duckdb", read_only=True) as ro:
        build_view(ro, tmp_path / "site", ViewOptions(resamples=0))
    rows = {r["annotator"]: r for r in _payload(tmp_path / "site" / "data" / "dashboard.js")["review"]}
    assert len(rows) == 2 and all(r["study"] == "s1" and r["assigned"] == 4 for r in rows.values())
    assert (rows[first]["labeled"], rows[first]["remaining"]) == (3, 1)

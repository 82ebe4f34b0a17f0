"""The viewer at mid size (2,400 traces) in a real headless Chromium: sharded index, virtualised list, cell shards.

The index's rows come in two shards (``data/rows/0.js``, ``1.js``) and only the rows in view are in
the DOM; the checks compare what the page shows with the store (ids, lengths, models) and with
``ror agree``'s confusion matrix (computed by ``agreement_summary``, not by the viewer).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ror_annotate import pipeline
from ror_annotate.agreement import agreement_summary
from ror_annotate.records import BEHAVIORS, Trace
from ror_annotate.sample import sample_path
from ror_annotate.store import RaterLabels, Store
from ror_annotate.view import ViewOptions, build_view
from ror_annotate.view.build import INDEX_SHARD_SIZE

from .test_view_browser import ARTIFACTS, Page, browser  # noqa: F401  (browser: the module-scoped Chromium fixture)

pytestmark = pytest.mark.browser

N_TRACES = 2400
MODELS = ("model-a", "model-b", "model-c")
CELL_EXAMPLES = 40


@pytest.fixture(scope="module")
def mid_site(tmp_path_factory):
    """2,400 short traces (2 to 9 sentences of the sample), labelled by the baseline and a second rater."""
    tmp = tmp_path_factory.mktemp("viewmid")
    sentences = [m.group(0).strip() for line in sample_path().open(encoding="utf-8")
                 for m in re.finditer(r"[^.!?\n]+[.!?]", json.loads(line)["trace"]) if len(m.group(0).strip()) > 3]
    rng = np.random.default_rng(7)
    traces = []
    for i in range(N_TRACES):
        k = int(rng.integers(2, 10))
        start = int(rng.integers(0, len(sentences) - k))
        traces.append(Trace(trace_id=f"mid-{i:05d}", text=" ".join(sentences[start : start + k]), model=MODELS[i % 3], dataset="synthetic"))
    db = tmp / "mid.duckdb"
    with Store(db) as store:
        store.upsert_traces(traces)
        pipeline.segment(store)
        pipeline.label(store, judge="baseline")
        (baseline,) = [a for s, a, _ in store.annotators() if s == "baseline"]
        table = store.latest_rater_labels([baseline])
        index = table.column("segment_index").to_numpy()
        codes = np.array([BEHAVIORS.index(x) for x in table.column("label").to_pylist()])
        codes = np.where(index % 3 == 1, (codes + 1) % len(BEHAVIORS), codes)
        store.replace_rater_labels("human", "alice", RaterLabels(table.column("trace_id").to_pylist(), index, codes, codebook_version="v1"))
    with Store(db, read_only=True) as store:
        build_view(store, tmp / "site", ViewOptions(resamples=0, cell_examples=CELL_EXAMPLES))
        agree = agreement_summary(store, n_resamples=0)
        labels = {(lab.trace_id, lab.segment_index, lab.annotator): lab.label for lab in store.labels()}
        segments = {t: store.segments(t) for t in store.trace_ids()}
    return {"out": tmp / "site", "traces": {t.trace_id: t for t in traces}, "agree": agree, "labels": labels, "segments": segments}


@pytest.fixture
def page(browser, mid_site):  # noqa: F811
    p = Page(browser, mid_site)
    yield p
    p.check_clean()
    p.page.close()


def _visible(page: Page) -> list[list[str]]:
    return page.page.eval_on_selector_all("#traces tbody tr", "els => els.map(e => Array.from(e.children).map(c => c.textContent))")


def test_index_loads_shards_lazily_and_keeps_few_rows_in_the_dom(page, mid_site):
    assert N_TRACES > INDEX_SHARD_SIZE  # at least two index shards
    page.open("index.html")
    page.page.wait_for_selector("#traces[data-loaded='all']", state="attached")
    assert page.page.text_content("#count") == f"{N_TRACES} shown"
    shown = _visible(page)
    assert 20 <= len(shown) < 200  # virtualised: a window of rows, not 2,400
    ids = sorted(mid_site["traces"])
    assert [r[0] for r in shown] == ids[: len(shown)]  # in trace order
    # scrolled to the end, the last rows are in the DOM, the first ones are not
    page.page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
    page.page.wait_for_function(f"() => Array.from(document.querySelectorAll('#traces tbody tr td:first-child')).some(e => e.textContent === '{ids[-1]}')")
    shown = [r[0] for r in _visible(page)]
    assert shown[-1] == ids[-1] and ids[0] not in shown and len(shown) < 200
    assert shown == ids[ids.index(shown[0]) : ids.index(shown[0]) + len(shown)]  # a contiguous window
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "index_mid.png"))


def test_index_sorts_and_searches_every_row(page, mid_site):
    traces = mid_site["traces"]
    page.open("index.html")
    page.page.wait_for_selector("#traces[data-loaded='all']", state="attached")
    page.page.click("#traces th[data-key='chars']")
    page.page.click("#traces th[data-key='chars']")  # descending
    want = sorted(traces.values(), key=lambda t: (-len(t.text), t.trace_id))
    shown = _visible(page)
    assert [(r[0], int(r[3])) for r in shown] == [(t.trace_id, len(t.text)) for t in want[: len(shown)]]
    page.page.fill("#search", "model-b")
    n_b = sum(t.model == "model-b" for t in traces.values())
    assert page.page.text_content("#count") == f"{n_b} shown"
    assert {r[1] for r in _visible(page)} == {"model-b"}
    target = sorted(traces)[1999]  # in the second index shard
    page.page.fill("#search", target)
    assert [r[0] for r in _visible(page)] == [target]
    page.page.click("#traces tbody a")
    page.page.wait_for_selector("#text .seg", state="attached")
    assert page.page.text_content("#title") == target
    assert page.page.eval_on_selector("#text", "e => e.textContent") == traces[target].text


def test_confusion_cell_lists_its_segments_from_its_shard(page, mid_site):
    agree = mid_site["agree"]
    a, entry = next(iter(agree["per_class"]["annotators"].items()))
    m = entry["confusion_matrix"]
    r, c = max(((r, c) for r in range(6) for c in range(6) if r != c), key=lambda rc: m[rc[0]][rc[1]])
    assert m[r][c] > CELL_EXAMPLES  # the list is capped
    page.open("dashboard.html")
    page.page.wait_for_selector("table.confusion td[data-r]")
    before = page.page.evaluate("() => Array.from(document.scripts).map(s => s.getAttribute('src'))")
    assert not any("cells/" in (s or "") for s in before)  # no cell is loaded with the dashboard
    page.page.click(f"table.confusion[data-annotator='{a}'] td[data-r='{r}'][data-c='{c}'] a")
    page.page.wait_for_selector("#cell-items tbody tr")
    assert page.page.text_content("#meta") == f"{m[r][c]} segments (first {CELL_EXAMPLES} listed)"
    items = page.page.eval_on_selector_all("#cell-items tbody tr", "els => els.map(e => [e.children[0].textContent, +e.children[1].textContent])")
    assert len(items) == CELL_EXAMPLES
    raters = {k[2] for k in mid_site["labels"]}
    for tid, seg in items:
        assert mid_site["labels"][(tid, seg, a)] == BEHAVIORS[c]
        others = Counter(mid_site["labels"][(tid, seg, o)] for o in raters - {a} if (tid, seg, o) in mid_site["labels"])
        assert others.most_common(1)[0][0] == BEHAVIORS[r]
    page.page.click("#cell-items tbody a")
    page.page.wait_for_selector("#text .seg.target", state="attached")
    tid, seg = items[0]
    assert page.page.text_content("#title") == tid
    assert int(page.page.get_attribute("#text .seg.target", "data-i")) == [s.segment_index for s in mid_site["segments"][tid]].index(seg)


def test_site_files_stay_small(mid_site):
    """No file grows with the corpus: the index metadata is a few KiB, each index shard holds at most INDEX_SHARD_SIZE rows."""
    out: Path = mid_site["out"]
    assert (out / "data" / "index.js").stat().st_size < 4096
    rows = sorted((out / "data" / "rows").glob("*.js"))
    assert len(rows) == -(-N_TRACES // INDEX_SHARD_SIZE)
    assert not (out / "data" / "cells.js").exists()

"""The viewer with little to show, read in a real Chromium: one rater, no labels, an unlabelled trace,
and a long right-to-left / emoji trace whose highlights must sit on exactly the segment's characters.

A dashboard of one rater once drew empty "Cohen's kappa per pair", "Per-class F1" and "Confusion
matrices" panels, and the compare view compared the rater with itself (100%, kappa 1). Skipped
without Chromium / playwright, as ``tests/test_view_browser.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ror_annotate import pipeline
from ror_annotate.records import Trace
from ror_annotate.sample import sample_path
from ror_annotate.store import Store
from ror_annotate.view import ViewOptions, build_view
from ror_annotate.view.build import read_index_rows

from .view_fixtures import tiny_store
from .test_view_browser import ARTIFACTS, Page, browser, site  # noqa: F401  (the module-scoped Chromium and three-rater site fixtures)

pytestmark = pytest.mark.browser

# Hebrew and Arabic sentences (Arabic-Indic digits), astral emoji and a ZWJ family, an unpopped U+202E:
# every segment's highlight must hold exactly its characters (offsets are code points, JS strings UTF-16)
RTL_BLOCK = (
    "נחשב את השטח: 3 × 4 = 12. אבל רגע, בוא נבדוק שוב 🤔.\n"
    "لنحسب المساحة: ٣ × ٤ = ١٢. إذن الجواب هو ١٢.\n"
    "Wait 👩‍👩‍👧 so the answer is \u202eevil 12. "
)
LONG_ID = "rtl-long"


def _site(tmp: Path, *, labelled: bool) -> dict:
    rows = [json.loads(line) for line in sample_path().open(encoding="utf-8")][:1]
    src = tmp / "t.jsonl"
    src.write_text(json.dumps(rows[0], ensure_ascii=False) + "\n", encoding="utf-8")
    db = tmp / "s.duckdb"
    with Store(db) as store:
        pipeline.ingest(store, src)
        store.upsert_traces([Trace(trace_id=LONG_ID, text=RTL_BLOCK * 220, answer="١٢")])
        pipeline.segment(store)
        if labelled:
            pipeline.label(store, judge="baseline")
        store.upsert_traces([Trace(trace_id="unlabelled", text="Let me think. First, 2 + 2 = 4. So the answer is 4.")])
        pipeline.segment(store)
        build_view(store, tmp / "site", ViewOptions(resamples=0))
        traces = {t.trace_id: t for t in store.iter_traces()}
        segments = {t: store.segments(t) for t in traces}
    return {"out": tmp / "site", "n": {r["id"]: r["n"] for r in read_index_rows(tmp / "site")}, "traces": traces, "segments": segments}


@pytest.fixture(scope="module")
def one_rater(tmp_path_factory):
    return _site(tmp_path_factory.mktemp("one"), labelled=True)


@pytest.fixture(scope="module")
def no_labels(tmp_path_factory):
    return _site(tmp_path_factory.mktemp("none"), labelled=False)


def _page(browser, site):  # noqa: F811
    return Page(browser, site)


def _visible(page: Page, selector: str) -> bool:
    return page.page.is_visible(selector)


def test_one_rater_dashboard_says_why_in_one_line_and_draws_no_empty_panel(browser, one_rater):  # noqa: F811
    p = _page(browser, one_rater)
    p.open("dashboard.html")
    p.page.wait_for_selector("#dist-table tbody tr")
    why = p.page.text_content("#agree-missing")
    assert _visible(p, "#agree-missing")
    assert "One rater (baseline:cue-v1)" in why and "nothing to compare" in why
    assert "second judge" in why and "ror review pull" in why
    for panel in ("#agree-figures", "#confusion-section", "#calibration-section"):
        assert not _visible(p, panel), panel
    shown = p.page.evaluate("() => Array.from(document.querySelectorAll('h2, h3')).filter(h => h.offsetParent !== null).map(h => h.textContent)")
    assert "Cohen's kappa per pair" not in shown and "Per-class F1" not in shown and "Confusion matrices" not in shown
    assert "Labels per rater" in shown and "Judge cost ledger" in shown
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p.page.screenshot(path=str(ARTIFACTS / "dashboard-one-rater.png"), full_page=True)
    p.check_clean()


def test_one_rater_compare_view_compares_nothing_and_index_counts_right(browser, one_rater):  # noqa: F811
    p = _page(browser, one_rater)
    n = one_rater["n"][LONG_ID]
    p.open(f"compare.html#t={n}")
    p.page.wait_for_function("document.getElementById('stats').textContent.length > 0")
    stats = p.page.text_content("#stats")
    assert stats.startswith("One rater (baseline:cue-v1) labelled this trace, so there is nothing to compare")
    assert "kappa" not in stats and "100" not in stats
    assert not _visible(p, "#pairs") and not _visible(p, "#rater-a") and not _visible(p, "#legend")
    p.open(f"trace.html#t={n}")
    p.page.wait_for_selector("#text .seg", state="attached")
    assert not _visible(p, "#compare-link")  # a link to a comparison of one rater with itself is not offered
    p.open("index.html")
    p.page.wait_for_selector("#traces tbody tr")
    summary = p.page.text_content("#summary")
    assert summary.startswith("3 traces, 1 rater (baseline:cue-v1)") and "1 raters" not in summary
    assert "one rater: no agreement or disagreements to show" in summary
    links = p.page.eval_on_selector_all("#traces tbody td:first-child a", "as => as.map(a => [a.textContent, a.title])")
    assert links and all(text == title for text, title in links)  # a long id cut with "…" reads whole on hover
    p.check_clean()


def test_no_labels_every_page_says_so(browser, no_labels):  # noqa: F811
    p = _page(browser, no_labels)
    p.open("dashboard.html")
    p.page.wait_for_selector("#dist-table tbody tr")
    assert "No labels yet, so there is nothing to compare" in p.page.text_content("#agree-missing")
    assert p.page.text_content("#dist-table tbody") == "No labels yet: label the segments (`ror label`)."
    assert not _visible(p, "#confusion-section") and not _visible(p, "#calibration-section")
    n = no_labels["n"]["unlabelled"]
    p.open(f"trace.html#t={n}")
    p.page.wait_for_selector("#text .seg", state="attached")
    assert p.page.text_content("#analytics").startswith("No rater labelled this trace")
    assert p.page.eval_on_selector_all("#analytics table", "ts => ts.length") == 0  # no table of zeros
    p.open(f"compare.html#t={n}")
    p.page.wait_for_function("document.getElementById('stats').textContent.length > 0")
    assert p.page.text_content("#stats").startswith("No rater labelled this trace, so there is nothing to compare")
    p.open("index.html")
    p.page.wait_for_selector("#traces tbody tr")
    assert p.page.text_content("#summary").startswith("3 traces, 0 raters from ")
    p.check_clean()


def test_long_right_to_left_trace_highlights_exactly_each_segment(browser, one_rater):  # noqa: F811
    """Every highlight's text is ``text[char_start:char_end]`` and it starts at code point ``char_start``
    of the reasoning block (measured in the browser: the block's text before the span, in code points)."""
    trace, segs = one_rater["traces"][LONG_ID], one_rater["segments"][LONG_ID]
    assert len(segs) >= 1000
    p = _page(browser, one_rater)
    p.open(f"trace.html#t={one_rater['n'][LONG_ID]}")
    p.page.wait_for_selector("#text .seg", state="attached")
    got = p.page.evaluate(
        """() => {
        const box = document.getElementById('text'), out = [];
        for (const s of box.querySelectorAll('.seg')) {
          const r = document.createRange(); r.setStart(box, 0); r.setEndBefore(s);
          out.push([Array.from(r.toString()).length, s.textContent]);
        }
        return out;
      }"""
    )
    assert len(got) == len(segs)
    for (start, text), s in zip(got, segs):
        assert (start, text) == (s.char_start, trace.text[s.char_start : s.char_end])
    assert p.page.eval_on_selector("#text", "e => e.textContent") == trace.text
    # the unpopped U+202E stays inside its own segment: every span is its own bidi run
    assert set(p.page.eval_on_selector_all("#text .seg", "els => els.map(e => getComputedStyle(e).unicodeBidi)")) == {"isolate"}
    p.check_clean()


def test_confusion_cards_name_the_majority_reference(browser, site):  # noqa: F811
    """"vs majority" read as a rater named majority: the reference is the majority of the *other* raters."""
    p = _page(browser, site)
    p.open("dashboard.html")
    p.page.wait_for_selector("#confusion .card h3")
    heads = p.page.eval_on_selector_all("#confusion .card h3", "hs => hs.map(h => h.textContent)")
    assert heads and all(h.endswith(" vs the majority of the other raters") for h in heads), heads
    assert p.page.text_content("#conf-note").startswith("Rows: the reference (the majority of the other raters, ties skipped)")
    assert _visible(p, "#agree-figures") and _visible(p, "#confusion-section")  # two or more raters: the panels are drawn
    p.check_clean()


def test_one_trace_dashboard_says_its_intervals_have_zero_width(browser, tmp_path):  # noqa: F811
    """One trace, two raters: a trace bootstrap draws that trace every time, so every CI is one point; say so."""
    with Store(tiny_store(tmp_path / "s.duckdb", human="bob"), read_only=True) as store:
        build_view(store, tmp_path / "site", ViewOptions(resamples=20))
    p = _page(browser, {"out": tmp_path / "site"})
    p.open("dashboard.html")
    p.page.wait_for_selector("#kappa-table tbody tr")
    assert p.page.text_content("#origin").startswith("1 trace · ")
    cmd = p.page.text_content("#agree-cmd")
    assert ", 1 trace, 2 raters." in cmd and "With one trace the trace-level bootstrap intervals have zero width" in cmd
    p.check_clean()

"""The viewer site in a real headless Chromium (Debian's /usr/bin/chromium, driven by playwright).

Every check reads the DOM of the built site and compares it with the store, with the output of
``ror agree --json`` or with scikit-learn; screenshots of a trace page, the compare view and the
dashboard go to ``test-artifacts/view/`` (gitignored). Without Chromium (or playwright) the tests
are skipped with the reason; ``ROR_REQUIRE_BROWSER=1`` (CI) makes that an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ror_annotate.records import BEHAVIORS
from ror_annotate.store import Store
from ror_annotate.view import ViewOptions, build_view
from ror_annotate.view.build import read_index_rows

from .view_fixtures import HOSTILE_ID, HOSTILE_TEXT, RATIONALE, build_store

pytestmark = pytest.mark.browser

CHROMIUM = Path(os.environ.get("ROR_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "view"
RESAMPLES = 200
PRIORITY = ("adjudicated", "human", "aggregate", "verify", "judge", "import", "baseline")


def _unavailable() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "python playwright is not installed (pip install -e '.[dev]')"
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set ROR_CHROMIUM)"
    return None


@pytest.fixture(scope="module")
def browser():
    why = _unavailable()
    if why:
        if os.environ.get("ROR_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ROR_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("view")
    db = build_store(tmp)
    with Store(db, read_only=True) as store:
        summary = build_view(store, tmp / "site", ViewOptions(resamples=RESAMPLES, cell_examples=10_000))
        traces = {t.trace_id: t for t in store.iter_traces()}
        segments = {t: store.segments(t) for t in traces}
        labels = store.labels()
    index = _payload(tmp / "site" / "data" / "index.js")
    order = {row["id"]: row["n"] for row in read_index_rows(tmp / "site")}
    return {"db": db, "out": tmp / "site", "summary": summary, "traces": traces, "segments": segments, "labels": labels, "n": order, "index": index}


def _payload(path: Path) -> dict:
    text = path.read_text(encoding="ascii")
    return json.loads(text[text.index("(") + 1 : text.rindex(")")])


class Page:
    """A page that records console errors, page errors and every non-file request."""

    def __init__(self, browser, site):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.site = site
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: None if r.url.startswith("file://") else self.requests.append(r.url))

    def open(self, name: str) -> None:
        self.page.goto((self.site["out"] / name.split("#")[0]).as_uri() + ("#" + name.split("#", 1)[1] if "#" in name else ""))

    def check_clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.requests == [], self.requests


@pytest.fixture
def page(browser, site):
    p = Page(browser, site)
    yield p
    p.check_clean()
    p.page.close()


def _primary(labels_of_trace) -> str | None:
    by = {lab.annotator: lab.source for lab in labels_of_trace}
    ranked = sorted(by.items(), key=lambda kv: (PRIORITY.index(kv[1]), kv[0]))
    return ranked[0][0] if ranked else None


def _open_trace(page: Page, n: int, extra: str = "") -> None:
    page.open(f"trace.html#t={n}{extra}")
    page.page.wait_for_selector("#text .seg", state="attached")


def test_every_segment_has_its_exact_text_and_label(page, site):
    """The DOM text of every segment equals text[char_start:char_end], and the whole reasoning block equals
    the trace's text (CJK, emoji, CRLF, markup included); each segment shows the default rater's label."""
    ids = list(site["traces"])
    assert HOSTILE_ID in ids and "crlf-origin" in ids and len(ids) >= 5
    for tid in ids:
        trace, segs = site["traces"][tid], site["segments"][tid]
        _open_trace(page, site["n"][tid])
        got = page.page.eval_on_selector_all("#text .seg", "els => els.map(e => [e.textContent, e.getAttribute('data-label')])")
        assert len(got) == len(segs)
        labs = [lab for lab in site["labels"] if lab.trace_id == tid]
        who = _primary(labs)
        want = {lab.segment_index: lab.label for lab in labs if lab.annotator == who}
        for (text, label), s in zip(got, segs):
            assert text == trace.text[s.char_start : s.char_end]
            assert label == want.get(s.segment_index, "")
        assert page.page.eval_on_selector("#text", "e => e.textContent") == trace.text
        assert page.page.title().startswith(tid)
    page.check_clean()


def test_hostile_text_is_shown_as_text(page, site):
    """Markup in a trace, its id, problem, answer and a rationale is displayed, never parsed or run."""
    _open_trace(page, site["n"][HOSTILE_ID])
    assert page.page.evaluate("() => window.__pwned") is None
    assert page.page.eval_on_selector("#text", "e => e.textContent") == HOSTILE_TEXT
    assert page.page.eval_on_selector("#text", "e => e.querySelectorAll('script, img, b, strong, em, div').length") == 0
    assert page.page.text_content("#title") == HOSTILE_ID
    assert page.page.text_content("#problem") == "<h1>2+2</h1> *?*"
    assert page.page.text_content("#answer") == "<b>4</b>"
    page.page.focus("#text .seg[data-i='1']")
    assert RATIONALE in page.page.text_content("#detail")
    assert page.page.eval_on_selector("#detail", "e => e.querySelectorAll('img, script').length") == 0
    assert page.page.evaluate("() => window.__pwned") is None
    page.page.focus("#text .seg[data-i='0']")
    dist = page.page.eval_on_selector_all("#detail .distrow .distname", "els => els.map(e => e.textContent)")
    assert dist == list(BEHAVIORS)  # segment 0 carries ds's distribution
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "trace_hostile.png"), full_page=True)


def _segments_where(site, tid, pred) -> set[int]:
    by_seg: dict[int, dict[str, object]] = {}
    for lab in site["labels"]:
        if lab.trace_id == tid:
            by_seg.setdefault(lab.segment_index, {})[lab.annotator] = lab
    return {i for i, labs in by_seg.items() if pred(labs)}


def _shown(page: Page) -> set[int]:
    return set(page.page.eval_on_selector_all("#text .seg:not(.dim)", "els => els.map(e => +e.getAttribute('data-i'))"))


def test_filters_and_keyboard_navigation(page, site):
    tid = next(t for t in site["traces"] if t.startswith("thought-anchors"))
    n = site["n"][tid]
    _open_trace(page, n)
    segs = site["segments"][tid]
    pos = {s.segment_index: i for i, s in enumerate(segs)}
    # label filter: only the default rater's (alice, human) execution segments stay lit
    page.page.select_option("#label-filter", "execution")
    want = {pos[i] for i in _segments_where(site, tid, lambda labs: "alice" in labs and labs["alice"].label == "execution")}
    assert _shown(page) == want and want
    page.page.select_option("#label-filter", "")
    # disagreements only: segments whose raters do not all agree
    page.page.check("#dis-only")
    dis = {pos[i] for i in _segments_where(site, tid, lambda labs: len({lab.label for lab in labs.values()}) > 1)}
    assert _shown(page) == dis and dis
    page.page.uncheck("#dis-only")
    # low confidence only, for the aggregate rater ds: confidence < 0.6
    ds = next(i for i, r in enumerate(site["index"]["raters"]) if r["name"] == "ds")
    page.page.select_option("#rater", str(ds))
    page.page.check("#low-only")
    low = {pos[i] for i in _segments_where(site, tid, lambda labs: "ds" in labs and labs["ds"].confidence < 0.6)}
    assert _shown(page) == low and low
    colours = page.page.eval_on_selector_all("#text .seg", "els => els.map(e => e.getAttribute('data-label'))")
    ds_labels = {lab.segment_index: lab.label for lab in site["labels"] if lab.trace_id == tid and lab.annotator == "ds"}
    assert colours == [ds_labels.get(s.segment_index, "") for s in segs]
    page.page.uncheck("#low-only")
    # n / p walk the disagreements in order
    ordered = sorted(dis)
    page.page.click("h1")
    page.page.keyboard.press("n")
    assert page.page.evaluate("() => +document.activeElement.getAttribute('data-i')") == ordered[0]
    page.page.keyboard.press("n")
    assert page.page.evaluate("() => +document.activeElement.getAttribute('data-i')") == ordered[1]
    page.page.keyboard.press("p")
    assert page.page.evaluate("() => +document.activeElement.getAttribute('data-i')") == ordered[0]
    # the timeline strip has one block per segment and marks the first answer
    assert page.page.eval_on_selector_all("#timeline .tl", "els => els.length") == len(segs)
    page.page.select_option("#rater", page.page.eval_on_selector("#rater option", "o => o.value"))
    page.page.focus("#text .seg[data-i='2']")
    page.page.evaluate("() => window.scrollTo(0, 0)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "trace.png"))


def test_index_lists_sorts_searches_and_links(page, site):
    page.open("index.html")
    page.page.wait_for_selector("#traces tbody tr")
    rows = page.page.eval_on_selector_all("#traces tbody tr td:first-child", "els => els.map(e => e.textContent)")
    assert sorted(rows) == sorted(site["traces"])
    page.page.click("#traces th[data-key='chars']")
    page.page.click("#traces th[data-key='chars']")  # descending
    chars = page.page.eval_on_selector_all("#traces tbody tr td:nth-child(4)", "els => els.map(e => +e.textContent)")
    assert chars == sorted((len(t.text) for t in site["traces"].values()), reverse=True)
    page.page.fill("#search", "crlf")
    assert page.page.eval_on_selector_all("#traces tbody tr", "els => els.length") == 1
    page.page.click("#traces tbody a")
    page.page.wait_for_selector("#text .seg", state="attached")
    assert page.page.text_content("#title") == "crlf-origin"


def test_compare_view_agreement_matches_sklearn(page, site):
    from sklearn.metrics import cohen_kappa_score

    tid = next(t for t in site["traces"] if t.startswith("thought-anchors"))
    raters = [r["name"] for r in site["index"]["raters"]]
    a, b = raters.index("alice"), raters.index("baseline:cue-v1")
    page.open(f"compare.html#t={site['n'][tid]}&a={a}&b={b}")
    page.page.wait_for_selector("#pairs tbody tr")
    la = {lab.segment_index: lab.label for lab in site["labels"] if lab.trace_id == tid and lab.annotator == "alice"}
    lb = {lab.segment_index: lab.label for lab in site["labels"] if lab.trace_id == tid and lab.annotator == "baseline:cue-v1"}
    both = sorted(set(la) & set(lb))
    y1, y2 = [la[i] for i in both], [lb[i] for i in both]
    assert float(page.page.get_attribute("#kappa", "data-value")) == pytest.approx(cohen_kappa_score(y1, y2), abs=1e-12)
    assert float(page.page.get_attribute("#pct", "data-value")) == pytest.approx(sum(x == y for x, y in zip(y1, y2)) / len(both))
    n_dis = sum(x != y for x, y in zip(y1, y2))
    assert page.page.eval_on_selector_all("#pairs tbody tr.dis", "els => els.length") == n_dis
    page.page.check("#dis-only")
    assert page.page.eval_on_selector_all("#pairs tbody tr", "els => els.length") == n_dis
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "compare.png"))


def test_dashboard_equals_ror_agree_json(page, site):
    proc = subprocess.run(
        [sys.executable, "-m", "ror_annotate", "agree", "--db", str(site["db"]), "--json", "--resamples", str(RESAMPLES)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert proc.returncode == 0, proc.stderr
    agree = json.loads(proc.stdout)
    page.open("dashboard.html")
    page.page.wait_for_selector("#agree-table td.stat")
    cells = dict(page.page.eval_on_selector_all("[data-stat]", "els => els.map(e => [e.getAttribute('data-stat'), [e.getAttribute('data-value'), e.textContent]])"))
    expected = {}
    for key in ("percent_agreement", "fleiss_kappa", "krippendorff_alpha", "gwet_ac1"):
        expected[f"segment/{key}"] = agree[key]["value"]
        expected[f"token/{key}"] = agree["token_weighted"][key]["value"]
    for k in agree["cohen_kappa"]:
        expected[f"kappa/{k['annotator_a']}|{k['annotator_b']}"] = k["value"]
    for a, entry in agree["per_class"]["annotators"].items():
        expected[f"macro_f1/{a}"] = entry["macro_f1"]["value"]
        for c in BEHAVIORS:
            expected[f"f1/{a}/{c}"] = entry["classes"][c]["f1"]["value"]
    assert set(expected) <= set(cells)
    for key, value in expected.items():
        raw, shown = cells[key]
        if value is None:
            assert raw == "" and shown.startswith("n/a"), key
        else:
            assert float(raw) == value, key  # the same float, not just the same 3 decimals
            assert shown.startswith(f"{value:.3f}"), key
    # confusion matrices equal agree's, and a cell links to exactly its segments
    for a, entry in agree["per_class"]["annotators"].items():
        got = page.page.eval_on_selector_all(f"table.confusion[data-annotator='{a}'] td[data-r]", "els => els.map(e => [+e.dataset.r, +e.dataset.c, +e.dataset.value])")
        assert {(r, c): v for r, c, v in got} == {(r, c): v for r, row in enumerate(entry["confusion_matrix"]) for c, v in enumerate(row)}
    a, entry = next(iter(agree["per_class"]["annotators"].items()))
    m = entry["confusion_matrix"]
    r, c = max(((r, c) for r in range(6) for c in range(6) if r != c), key=lambda rc: m[rc[0]][rc[1]])
    assert m[r][c] > 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    page.page.click(f"table.confusion[data-annotator='{a}'] td[data-r='{r}'][data-c='{c}'] a")
    page.page.wait_for_selector("#cell-items tbody tr")
    items = page.page.eval_on_selector_all("#cell-items tbody tr", "els => els.map(e => [e.children[0].textContent, +e.children[1].textContent, e.children[2].textContent])")
    assert len(items) == m[r][c]
    for tid, seg, text in items[:25]:  # the rater said BEHAVIORS[c] on each listed segment
        own = [lab for lab in site["labels"] if lab.trace_id == tid and lab.segment_index == seg]
        assert next(lab.label for lab in own if lab.annotator == a) == BEHAVIORS[c]
        others = Counter(lab.label for lab in own if lab.annotator != a)
        assert others.most_common(1)[0][0] == BEHAVIORS[r]
        assert text == site["traces"][tid].text[site["segments"][tid][seg].char_start : site["segments"][tid][seg].char_end][:300]
    # following a listed segment opens its trace page on that segment
    page.page.click("#cell-items tbody a")
    page.page.wait_for_selector("#text .seg.target", state="attached")
    assert page.page.text_content("#title") == items[0][0]
    assert int(page.page.get_attribute("#text .seg.target", "data-i")) == [s.segment_index for s in site["segments"][items[0][0]]].index(items[0][1])


def test_content_security_policy_refuses_network_requests(page, site):
    """Defence in depth: even a script that tried would be refused by the pages' policy (connect-src 'none')."""
    page.open("index.html")
    page.page.wait_for_selector("#traces tbody tr")
    directive = page.page.evaluate(
        """() => new Promise(resolve => {
            document.addEventListener('securitypolicyviolation', e => resolve(e.effectiveDirective), { once: true });
            fetch('https://example.com/x').catch(() => {});
        })"""
    )
    assert directive == "connect-src"
    assert page.requests == []
    page.errors.clear()  # the refusal itself is logged as a console error

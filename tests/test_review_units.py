"""Unit tests of the review stage that need no server: offsets, sampling, assignment, configs, studies."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from collections import Counter

import pytest

from ror_annotate.errors import ConfigError, InputError, ReviewError
from ror_annotate.records import BEHAVIORS, Label, Segment, Trace
from ror_annotate.review import (
    anchor_span, assign_overlap, codepoint_to_utf16, create_study, load_study, sample_size_for_ci_width, utf16_to_codepoint,
)
from ror_annotate.review import config as cfg
from ror_annotate.review.studies import (
    SamplingInput, _equal_allocation, assignments, get_strategy, sample_disagreement, sample_stratified, study_items, study_people,
)

from . import review_fixtures as F
from .conftest import load_pitfall


# ------------------------------------------------------------------------------------ offsets
def test_ls01_pitfall_utf16_offsets_are_reanchored():
    case = load_pitfall("LS-01")
    text = case["input"]["task"]["data"]["text"]
    region = case["input"]["task"]["annotations"][0]["result"][0]["value"]
    a = anchor_span(text, region["start"], region["end"], region["text"])
    exp = case["expected"]["stored_span"]
    assert (a.start, a.end, a.how) == (exp["start"], exp["end"], "utf16")
    assert text[a.start:a.end] == case["expected"]["text_check"]


@pytest.mark.parametrize(
    ("text", "cp", "u16"),
    [
        ("💩ab", 1, 2),  # one astral character = 2 UTF-16 units
        ("a👨🏻‍🚒b", 5, 8),  # before "b": a 1 + man 2 + skin tone 2 + ZWJ 1 + fire engine 2 units
        ("首先，计算", 3, 3),  # CJK is in the BMP: 1 unit each
        ("$x^2$ — ±", 9, 9),
    ],
)
def test_codepoint_utf16_round_trip(text, cp, u16):
    assert codepoint_to_utf16(text, cp) == u16
    assert utf16_to_codepoint(text, u16) == cp


def test_utf16_offset_inside_a_surrogate_pair_is_refused():
    assert utf16_to_codepoint("💩ab", 1) is None
    assert utf16_to_codepoint("ab", 5) is None


def test_anchor_span_policy():
    text = "🤔 Wait. 🤔 Wait, is x = 2? Yes."
    # Exact code points are accepted as they are.
    s = text.index("is x")
    assert anchor_span(text, s, s + 8, "is x = 2").how == "codepoints"
    # Text-search re-anchors a unique text; an ambiguous text is refused with a clear message.
    assert anchor_span(text, 0, 3, "Yes.") == type(anchor_span(text, 0, 3, "Yes."))(text.index("Yes."), len(text), "text-search")
    with pytest.raises(ReviewError, match="misaligned.*occurs 2 times"):
        anchor_span(text, 30, 34, "Wait")
    with pytest.raises(ReviewError, match="does not occur"):
        anchor_span(text, 0, 4, "nope")


# ------------------------------------------------------------------------------------ assignment
@pytest.mark.parametrize(("n_units", "k", "r"), [(10, 2, 2), (11, 3, 2), (30, 3, 2), (7, 4, 3), (5, 3, 1)])
def test_assign_overlap_exact_and_balanced(n_units, k, r):
    people = [f"h-{i}" for i in range(k)]
    out = assign_overlap(list(range(n_units)), people, r, seed=7)
    per_unit = Counter(u for got in out.values() for u in got)
    assert per_unit == {u: r for u in range(n_units)}  # every unit exactly r times
    assert all(len(set(got)) == len(got) for got in out.values())  # never twice to one annotator
    loads = [len(got) for got in out.values()]
    assert max(loads) - min(loads) <= 1
    assert sum(loads) == n_units * r


def test_assign_overlap_pairs_balanced_for_three_annotators():
    out = assign_overlap(list(range(30)), ["a", "b", "c"], 2, seed=0)
    sets = {p: set(v) for p, v in out.items()}
    shared = [len(sets[x] & sets[y]) for x, y in itertools.combinations("abc", 2)]
    assert shared == [10, 10, 10]  # 30 units, 3 pairs, each unit to one pair


def test_assign_overlap_rejects_impossible_overlap():
    with pytest.raises(ConfigError, match="overlap 3 needs at least 3 annotators"):
        assign_overlap([1, 2], ["a", "b"], 3, seed=0)


# ------------------------------------------------------------------------------------ sampling
def test_equal_allocation_by_hand():
    sizes = {"planning": 1, "execution": 50, "restatement": 3, "fact": 0, "reflection": 9, "conclusion": 4}
    # Smallest first, each takes min(size, left // strata_left), left = 12:
    # fact 0 (12//6=2, cap 0), planning 1 (12//5=2, cap 1), restatement 2 (11//4), conclusion 3 (9//3),
    # reflection 3 (6//2), execution 3 (3//1) -> 12 in total, no stratum starved.
    assert _equal_allocation(sizes, 12) == {"planning": 1, "execution": 3, "restatement": 2, "fact": 0, "reflection": 3, "conclusion": 3}
    assert sum(_equal_allocation(sizes, 1000).values()) == 67


def _labels(pairs):
    return {k: [Label(trace_id=k[0], segment_index=k[1], label=lab, source="baseline", annotator=ann,
                      codebook_version="x", confidence=conf) for ann, lab, conf in v] for k, v in pairs.items()}


def test_stratified_sampling_reaches_rare_behaviors_and_is_reproducible():
    keys = [("t", i) for i in range(60)]
    labs = {k: [("j", "execution" if k[1] < 55 else "fact", None)] for k in keys}
    inp = SamplingInput(segments=keys, judge_labels=_labels(labs), judge_annotator="j")
    picked = sample_stratified(inp, n=10, seed=1)
    assert sum(1 for k in picked if k[1] >= 55) == 5  # all 5 rare 'fact' segments, vs 10/60 expected at random
    assert len(picked) == len(set(picked)) == 10
    assert picked == sample_stratified(inp, n=10, seed=1)
    assert picked != sample_stratified(inp, n=10, seed=2)


def test_disagreement_first_then_low_confidence():
    keys = [("t", i) for i in range(5)]
    labs = {
        ("t", 0): [("a", "fact", 0.9), ("b", "fact", 0.9)],
        ("t", 1): [("a", "fact", 0.9), ("b", "execution", 0.9)],  # disagreement
        ("t", 2): [("a", "fact", 0.3), ("b", "fact", 0.9)],  # low confidence 0.3
        ("t", 3): [("a", "fact", 0.5), ("b", "fact", 0.9)],  # low confidence 0.5
        ("t", 4): [("a", "fact", 0.9), ("b", "fact", 0.95)],
    }
    inp = SamplingInput(segments=keys, judge_labels=_labels(labs))
    assert sample_disagreement(inp, n=3, seed=0) == [("t", 1), ("t", 2), ("t", 3)]


def test_trace_strategy_takes_whole_traces():
    keys = sorted((tid, i) for tid in "abc" for i in range(3))
    picked = get_strategy("trace")(SamplingInput(segments=keys), n_traces=2, seed=0)
    by_trace = Counter(k[0] for k in picked)
    assert len(by_trace) == 2 and set(by_trace.values()) == {3}


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="Available strategies: disagreement, random, stratified, trace"):
        get_strategy("nope")


def test_sample_size_for_ci_width_by_hand():
    # z = 1.959964, n = z^2 * 0.25 / 0.05^2 = 384.15 -> 385 (the textbook figure)
    assert sample_size_for_ci_width(0.1) == 385
    # p = 0.8, width 0.2 (half width 0.1): 3.841459 * 0.16 / 0.01 = 61.46 -> 62
    assert sample_size_for_ci_width(0.2, proportion=0.8) == 62
    with pytest.raises(ConfigError):
        sample_size_for_ci_width(0)


# ------------------------------------------------------------------------------------ configs
@pytest.mark.parametrize("build", [cfg.segment_config, cfg.adjudication_config, cfg.span_config])
def test_configs_are_valid_xml_with_six_hotkeyed_choices(build):
    root = ET.fromstring(build("cb (abc)\nplanning: uses $money & <tags>\nTie-break: a > b"))
    choices = root.find("Choices")
    assert [(c.get("value"), c.get("hotkey")) for c in choices] == [(b, str(i)) for i, b in enumerate(BEHAVIORS, 1)]
    assert choices.get("choice") == "single-radio" and choices.get("required") == "true"
    headers = [h.get("value") for h in root.iter("Header")]
    assert "planning: uses \uff04money & <tags>" in headers  # escaped, and "$" cannot pull task data
    assert root.find("TextArea").get("name") == "note"


def _trace():
    trace, segs, _ = F.build_trace(*F.TRACES[0])
    return trace, segs


def test_context_window_snaps_to_segments():
    trace, segs = _trace()
    assert cfg.context_window(segs, 2, 0) == (segs[2].char_start, segs[2].char_end)
    # Segment 0 is 29 characters + 1 space, segment 1 is 38 + 1 space (hand count), so segment 1 starts
    # 39 before segment 2 and segment 0 starts 69 before: a 40-character budget takes segment 1 only.
    assert segs[2].char_start - segs[1].char_start == 39 and segs[2].char_start - segs[0].char_start == 69
    assert cfg.context_window(segs, 2, 40)[0] == segs[1].char_start
    assert cfg.context_window(segs, 2, 10_000) == (segs[0].char_start, segs[-1].char_end)


def test_context_html_escapes_and_marks():
    trace, segs, _ = F.build_trace(*F.TRACES[2])
    html_ = cfg.context_html(trace, segs, 2, 0)
    assert "<mark>5 × 3 = 15 &lt;b&gt;hoses&lt;/b&gt; &amp; more.</mark>" in html_
    assert html_.count("…") == 2  # cut on both sides
    full = cfg.context_html(trace, segs, 0, 10_000)
    assert "…" not in full and "👨🏻‍🚒" in full


# ------------------------------------------------------------------------------------ studies
def test_create_study_persists_and_is_reproducible(tmp_path):
    s1 = F.make_store(tmp_path / "a.duckdb")
    s2 = F.make_store(tmp_path / "b.duckdb")
    emails = ["A@Example.org", "b@example.org", "c@example.org"]
    for store in (s1, s2):
        create_study(store, "st", annotators=emails, strategy="random", n=8, seed=11, overlap=2, judge_annotator=F.BASELINE)
    assert study_items(s1, "st") == study_items(s2, "st")
    assert len(study_items(s1, "st")) == 8
    study = load_study(s1, "st")
    assert (study.blind, study.overlap, study.strategy, study.seed, study.judge_annotator) == (True, 2, "random", 11, F.BASELINE)
    people = study_people(s1, "st")
    assert len(people) == 3 and all(p.startswith("h-") and len(p) == 12 for p in people)
    assert sum(len(assignments(s1, "st", p)) for p in people) == 16
    # Pseudonyms are salted per store: the same e-mail gets different ids in two stores.
    assert set(people).isdisjoint(study_people(s2, "st"))
    # E-mails live only in the private table, lower-cased.
    assert sorted(r[0] for r in s1.execute("SELECT email FROM review_people").fetchall()) == ["a@example.org", "b@example.org", "c@example.org"]


def test_create_study_errors(tmp_path):
    store = F.make_store(tmp_path / "e.duckdb")
    create_study(store, "one", annotators=["a@x.org"], n=2, overlap=1)
    with pytest.raises(ConfigError, match="already exists"):
        create_study(store, "one", annotators=["a@x.org"], n=2, overlap=1)
    with pytest.raises(ConfigError, match="needs at least 2 annotators"):
        create_study(store, "two", annotators=["a@x.org"], n=2, overlap=2)
    with pytest.raises(InputError, match="not an e-mail"):
        create_study(store, "three", annotators=["alice"], n=2, overlap=1)
    with pytest.raises(ConfigError, match="needs a sample size"):
        create_study(store, "four", annotators=["a@x.org"], overlap=1)
    with pytest.raises(ConfigError, match="no judge labels from annotator 'openai:nope'.*baseline:cue-v1"):
        create_study(store, "five", annotators=["a@x.org"], n=2, overlap=1, judge_annotator="openai:nope")
    # Nothing half-written by the failed attempts.
    assert [r[0] for r in store.execute("SELECT name FROM review_studies").fetchall()] == ["one"]
    assert store.execute("SELECT count(DISTINCT study) FROM review_items").fetchone()[0] == 1


def test_non_blind_needs_a_judge(tmp_path):
    store = F.make_store(tmp_path / "n.duckdb", with_labels=False)
    with pytest.raises(ConfigError, match="non-blind study shows a judge label"):
        create_study(store, "nb", annotators=["a@x.org"], n=2, overlap=1, blind=False)


def test_span_mode_assigns_whole_traces(tmp_path):
    store = F.make_store(tmp_path / "sp.duckdb")
    create_study(store, "sp", annotators=["a@x.org", "b@x.org"], strategy="trace", n_traces=3, overlap=1, mode="span")
    per_person = [assignments(store, "sp", p) for p in study_people(store, "sp")]
    traces = [{k[0] for k in got} for got in per_person]
    assert traces[0].isdisjoint(traces[1]) and len(traces[0] | traces[1]) == 3
    for got in per_person:  # every segment of an assigned trace
        for tid in {k[0] for k in got}:
            assert [k[1] for k in got if k[0] == tid] == [s.segment_index for s in store.segments(tid)]


def test_segment_records_are_consistent():
    # Guard for the fixtures themselves: offsets are code points into the trace.
    for args in F.TRACES:
        trace, segs, _ = F.build_trace(*args)
        assert isinstance(trace, Trace)
        assert all(isinstance(s, Segment) and trace.text[s.char_start:s.char_end] == s.text for s in segs)


def test_reference_labels_keep_unanimous_segments_beside_adjudicated(tmp_path):
    """Adjudication only sees disagreements: the reference must still cover agreed segments."""
    from ror_annotate.review import reference_labels
    from ror_annotate.store import Store

    text = "Let me try. So x = 2. Wait, no."
    spans = [(0, 11), (12, 21), (22, 31)]
    with Store(tmp_path / "s.duckdb") as store:
        store.upsert_traces([Trace(trace_id="t", text=text)])
        store.replace_segments(
            "t", [Segment(trace_id="t", segment_index=i, char_start=a, char_end=b, text=text[a:b], n_tokens=3) for i, (a, b) in enumerate(spans)],
            segmenter="manual", token_counter="manual",
        )
        human = {"h-1": ["planning", "execution", "reflection"], "h-2": ["planning", "conclusion", "reflection"]}
        store.upsert_labels(
            Label(trace_id="t", segment_index=i, label=lab, source="human", annotator=who, codebook_version="cb", study="s")
            for who, labs in human.items() for i, lab in enumerate(labs)
        )
        store.upsert_labels([Label(trace_id="t", segment_index=1, label="execution", source="adjudicated", annotator="adjudicator:h-3", codebook_version="cb", study="s")])
        refs = reference_labels(store, "s")
        assert [(r.segment_index, r.label, r.basis) for r in refs] == [
            (0, "planning", "unanimous"), (1, "execution", "adjudicated"), (2, "reflection", "unanimous"),
        ]
        assert reference_labels(store) == refs


# ------------------------------------------------------------------------------------ links and accounts
def test_public_url_defaults_to_the_server_url_and_is_validated(monkeypatch):
    from ror_annotate.review import public_url

    monkeypatch.delenv("LABEL_STUDIO_PUBLIC_URL", raising=False)
    monkeypatch.setenv("LABEL_STUDIO_URL", "http://127.0.0.1:8089/")
    assert public_url() == "http://127.0.0.1:8089"
    monkeypatch.setenv("LABEL_STUDIO_PUBLIC_URL", "https://review.lab.example/")
    assert public_url() == "https://review.lab.example"
    assert public_url("http://localhost:9000") == "http://localhost:9000"
    with pytest.raises(ConfigError, match="LABEL_STUDIO_PUBLIC_URL.*http:// or https://"):
        public_url("review.lab.example")


def test_every_missing_account_is_named_in_one_error(tmp_path):
    from ror_annotate.review import push_study

    store = F.make_store(tmp_path / "acc.duckdb")
    create_study(store, "acc", annotators=["has@example.org", "no1@example.org", "no2@example.org"], n=3, overlap=1)
    ls = F.FakeLabelStudio({"has@example.org": 5})
    with pytest.raises(ReviewError) as err:
        push_study(store, "acc", ls)
    msg = str(err.value)
    assert "2 people have no Label Studio account" in msg and "no1@example.org" in msg and "no2@example.org" in msg
    assert "has@example.org" not in msg and f"{ls.public_url}/user/signup/?token=" in msg
    assert ls.projects == {}  # nothing created before every account exists


def test_a_signup_whose_token_request_fails_is_a_coded_review_error():
    """Label Studio accepts the signup but /api/current-user/token answers 500: one coded line, no bare HTTPStatusError."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from ror_annotate.review.labelstudio import signup_annotator

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.startswith("/user/signup"):
                self.send_response(200)
                self.send_header("Set-Cookie", "csrftoken=abc; Path=/")
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(b"<form></form>")
            else:
                self.send_response(500)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(b"<h1>Server Error</h1>")

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(302)
            self.send_header("Location", "/")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ReviewError) as info:
            signup_annotator(url, "/user/signup/?token=xyz", "alice@lab.org", "pw", timeout=10)
    finally:
        server.shutdown()
    assert info.value.code == "E600"
    assert "gave no API token (HTTP 500" in str(info.value)

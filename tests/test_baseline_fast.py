"""The baseline judge's batch path gives the labels and rules of the rules as first written.

The reference is ``tests/baseline_reference.py``, a frozen copy of the rule module before it was
made fast (commit 64e97be): every real segment (the embedded sample's 40 traces, and the 201 shared
traces in the ``shared`` tier) and a set of tricky probe strings must get the same
``(behavior, rule)`` from both. The stored labels of the judge's Arrow path must equal the
:class:`~ror_annotate.records.Label` records the reference would store, id included.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pyarrow as pa
import pytest

from ror_annotate.errors import StoreError
from ror_annotate.judge import baseline as fast
from ror_annotate.records import Label, Segment, Trace, label_ids
from ror_annotate.segment import Segmenter
from ror_annotate.store import LABEL_TABLE_SCHEMA, Store

from . import baseline_reference as ref
from .conftest import DATA

PROBES = [
    "", " ", "\n", "Yes", "Yes,", "yes. fine", "Yes,that checks out", "- Yes! It matches.", "1. Right, so",
    "That checks out.", "It CHECKS OUT", "xchecks out", "checks outx", "this matches the value", "rematches",
    "Good", "good!", "goodness", "GREAT. done", "Perfect\n", "perfect\nand it is correct",
    "it is correct\nyes", "first line\nthat's correct", "x" * 5000 + " is correct", "a " * 3000 + "matches",
    "Okay, that works", "ok, that is it", "Hmm, that confirms it", "confirmed", "confirming", "Confirms.",
    "Wait, let me check", "But wait, 3 = 4 and 5 and 6", "Wait, 3/8 is 9/24 = 0.375, and 5/12 = 10/24.",
    "Let me compute 2 + 2 = 4 with 5", "Let me see: is that right? 1 = 2, 3",
    "Ja, das stimmt — größer als 5", "Donc la réponse est 5.", "答案是 5。 That checks out", "Ｙｅｓ, ｆｕｌｌ ｗｉｄｔｈ",
    "İt is correct", "ſo the answer is 5", "The Kelvin sign: K is correct", "١٢٣ = ٤٥٦ and 7 and 8",
    "x² + y² = z² matches", "\u2028Yes, ok", "Yes,\u00a0fine", "**Final Answer**\n\\boxed{5}", "\\boxed {x}",
    "So the total is 12", "Therefore, the final answer should be 7", "In summary, done",
    "Recall that the theorem says", "By the Pythagorean theorem we get", "The formula for area is",
    "We are given that x = 2.", "Okay, so I need to find x.", "As before, we found 5.",
    "So plugging in the numbers:", "Step 1: factor", "To find the area, multiply", "a = b:", "a:b:c:\n",
    "is that right? yes", "Why did I do that", "I'm not sure this is wrong", "That can't be right since 2 + 2 = 4 and not 5.",
]


def _reference(problem: str | None, texts: list[str]) -> list[tuple[str, str]]:
    # model_construct: the probes include texts a stored segment cannot be (empty, blank); the rules only read two fields
    segs = [Segment.model_construct(trace_id="t", segment_index=i, text=t) for i, t in enumerate(texts)]
    return ref.classify_trace(problem, segs)


def _real_traces(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


@pytest.fixture(scope="module", params=["sample", pytest.param("shared", marks=pytest.mark.shared)])
def real_traces(request: pytest.FixtureRequest, real_traces_path: Path) -> list[dict]:
    return _real_traces(real_traces_path if request.param == "sample" else DATA / "traces.jsonl")


def test_real_segments_get_the_reference_labels(real_traces: list[dict]) -> None:
    segmenter = Segmenter()
    n = 0
    for row in real_traces:
        segs = segmenter.segment(row["trace"], row["trace_id"])
        want = ref.classify_trace(row.get("problem"), segs)
        assert fast.classify_trace(row.get("problem"), segs) == want, row["trace_id"]
        assert fast.classify_texts(row.get("problem"), [s.text for s in segs]) == want, row["trace_id"]
        n += len(segs)
    assert n > 1000  # the comparison covered the real corpus, not an empty one


def test_probe_strings_get_the_reference_labels() -> None:
    # alone (index 0: the opening rules apply), after a context, and as one trace in order
    for text in PROBES:
        assert fast.classify_texts(None, [text]) == _reference(None, [text]), text
        context = ["We need the value of x where x is 3 or 5.", "The answer is 5 and it is correct"]
        assert fast.classify_texts("Find x if x is 3 or 5", [*context, text])[-1] == _reference("Find x if x is 3 or 5", [*context, text])[-1], text
    assert fast.classify_texts("Is that right", PROBES) == _reference("Is that right", PROBES)


def test_rewritten_confirmation_rule_matches_the_same_strings() -> None:
    """The confirmation cue without its quadratic ``.*``: same truth value on the probes and on random strings."""
    old = dict(ref.REFLECTION_RULES)["confirmation"]
    new = dict(fast.REFLECTION_RULES)["confirmation"]
    pieces = ["yes", "Yes", "right", " ", ",", ".", "!", "\n", "- ", "1. ", "checks out", "matches", "is correct", "that's correct",
              "confirm", "ed", "s", "x", "é", "İ", "K", "ok, that", "okay, that", "seems right", "makes sense", "#", "\t"]
    rng = random.Random(0)
    strings = PROBES + ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 8))) for _ in range(20_000)]
    strings += ["".join(p) for p in itertools.product(pieces[:8], repeat=3)]
    for s in strings:
        assert bool(old.search(s)) == bool(new.search(s)), repr(s)


def test_rule_needles_are_in_every_match() -> None:
    """A rule skipped for want of a needle could not have matched: on random strings made of the pattern's own
    words (random case, spaces, punctuation), every ASCII match holds a needle in its lowercase form and every
    match of a rule with a needed character holds that character."""
    rules = {name: pattern for _, name, pattern, *_ in fast._ORDERED_RULES}
    rng = random.Random(1)
    checked = 0
    for name in [*fast._NEEDLES, *fast._NEEDS_CHAR]:
        pattern = rules[name]
        words = sorted(set(re_words(pattern.pattern)))
        pieces = words + [" ", " ", ", ", "-", "?", "?", "?", ".", "1", "x", "the", "is", "\n"]
        matched = 0
        for _ in range(10_000):
            s = ""
            for _ in range(rng.randint(1, 6)):
                s += rng.choice(pieces) + rng.choice(("", " ", " ", " ", ", "))
            s = "".join(c.upper() if rng.random() < 0.3 else c for c in s)
            if pattern.search(s):
                matched += 1
                if name in fast._NEEDLES:
                    assert any(n in s.lower() for n in fast._NEEDLES[name]), (name, s)
                else:
                    assert fast._NEEDS_CHAR[name] in s, (name, s)
        assert matched > 20, name  # the strings did exercise the rule
        checked += matched
    assert checked > 1000


def re_words(pattern: str) -> list[str]:
    """The literal words of a rule's pattern (with spaces between pairs, so multi-word cues occur)."""
    import re

    words = re.findall(r"[a-z']+", pattern.replace("\\b", " ").replace("\\w", " ").replace("\\s", " "))
    return words + [f"{a} {b}" for a, b in zip(words, words[1:])]


def test_classify_texts_on_non_ascii_and_mixed_case_match_the_reference() -> None:
    """Segments the needles must not skip: Unicode case folding (long s, dotted I, Kelvin sign) and upper case."""
    texts = ["ſeems right", "İs that right?", "The gas \u212aonstant is 8.3", "WRONG, that is a MISTAKE", "By The Law of sines",
             "Thiſ is correct", "ACCORDING TO the formula", "I'M NOT SURE about 3 = 4 and 5", "We're given x", "İ AM GIVEN 5"]
    texts = [t.encode().decode("unicode_escape") if "\\u" in t else t for t in texts]
    for t in texts:
        assert fast.classify_texts(None, [t]) == _reference(None, [t]), t
        assert fast.classify_texts("p q r s", ["a b c d e", t]) == _reference("p q r s", ["a b c d e", t]), t


def _store_with_sample(path: Path, rows: list[dict]) -> Store:
    store = Store(path)
    segmenter = Segmenter()
    store.upsert_traces([Trace(trace_id=r["trace_id"], text=r["trace"], problem=r.get("problem")) for r in rows])
    for r in rows:
        store.replace_segments(r["trace_id"], segmenter.segment(r["trace"], r["trace_id"]), segmenter="s", token_counter="c")
    return store


@pytest.mark.parametrize("workers", [1, 2])
def test_stored_labels_equal_the_reference_records(tmp_path: Path, real_traces_path: Path, workers: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # tasks of ~300 segments: 12 traces make several tasks, so with 2 workers the pool path runs
    monkeypatch.setattr(fast, "TASK_SEGMENTS", 300)
    rows = _real_traces(real_traces_path)[:12]
    with _store_with_sample(tmp_path / "s.duckdb", rows) as store:
        run = store.start_run("label", {})
        judge = fast.BaselineJudge(workers=workers)
        first = judge.label(store, [r["trace_id"] for r in rows], run=run)
        again = judge.label(store, [r["trace_id"] for r in rows], run=run)
        stored = {lab.label_id: lab for lab in store.labels()}
        segs = store.segments_by_trace([r["trace_id"] for r in rows])
    want = {}
    for r in rows:
        for seg, (behavior, rule) in zip(segs[r["trace_id"]], ref.classify_trace(r.get("problem"), segs[r["trace_id"]])):
            lab = Label(trace_id=seg.trace_id, segment_index=seg.segment_index, label=behavior, source="baseline",
                        annotator=ref.BASELINE_NAME, codebook_version=ref.BASELINE_VERSION, run_id=run.run_id, rationale=f"rule:{rule}")
            want[lab.label_id] = lab
    assert first.labeled == len(want) and first.skipped == 0
    assert again.labeled == 0 and again.skipped == len(want)
    assert stored.keys() == want.keys()
    fields = ("trace_id", "segment_index", "label", "source", "annotator", "codebook_version", "run_id", "study", "confidence",
              "rationale", "extra", "distribution")
    for key, lab in want.items():
        assert {f: getattr(stored[key], f) for f in fields} == {f: getattr(lab, f) for f in fields}


def test_classify_many_in_workers_gives_each_trace_its_labels_in_input_order(real_traces_path: Path) -> None:
    """The pool path (2 workers, tasks of ~40 segments) against the reference rules and Label ids, trace by trace."""
    rows = _real_traces(real_traces_path)[:10]
    segmenter = Segmenter()
    items = []
    for r in rows:
        segs = segmenter.segment(r["trace"], r["trace_id"])
        items.append((r["trace_id"], r.get("problem"), [s.text for s in segs], [s.segment_index for s in segs]))
    got = list(fast.classify_many(iter(items), workers=2, task_segments=40))
    assert [g[0] for g in got] == [r["trace_id"] for r in rows]
    for (trace_id, problem, texts, indexes), (tid, idx, labels, rationales, ids) in zip(items, got):
        want = _reference(problem, texts)
        assert tid == trace_id and idx == indexes
        assert list(zip(labels, rationales)) == [(b, f"rule:{rule}") for b, rule in want]
        assert ids == [Label(trace_id=trace_id, segment_index=i, label=b, source="baseline", annotator=ref.BASELINE_NAME,
                             codebook_version=ref.BASELINE_VERSION).label_id for i, (b, _) in zip(indexes, want)]
    assert sum(len(g[1]) for g in got) > 200  # several tasks, not one
    with pytest.raises(Exception, match="workers=0"):
        fast.classify_many(iter(items), workers=0)


def test_label_ids_are_the_records_ids() -> None:
    for trace_id, study in [("t", None), ('q"é~c0001', "s1"), ("a\\b\u2028", None)]:
        want = [Label(trace_id=trace_id, segment_index=i, label="fact", source="human", annotator="ann", codebook_version="v",
                      study=study).label_id for i in (0, 7, 123)]
        assert label_ids(trace_id, [0, 7, 123], source="human", annotator="ann", codebook_version="v", study=study) == want


def _label_table(**override: list) -> pa.Table:
    cols = {
        "label_id": ["x1"], "trace_id": ["t"], "segment_index": [0], "label": ["fact"], "source": ["baseline"],
        "annotator": ["a"], "codebook_version": ["v"], "run_id": [None], "study": [None], "confidence": [None],
        "rationale": [None], "created_at": [None], "extra": ["{}"], "distribution": [None],
    }
    cols.update(override)
    return pa.table({k: pa.array(v, LABEL_TABLE_SCHEMA.field(k).type) if k in LABEL_TABLE_SCHEMA.names else v for k, v in cols.items()})


@pytest.mark.parametrize(
    "override, code",
    [
        ({"label": ["nonsense"]}, "E961"),
        ({"source": ["oracle"]}, "E961"),
        ({"segment_index": [-1]}, "E961"),
        ({"annotator": [""]}, "E961"),
        ({"confidence": [1.5]}, "E961"),
        ({"label_id": ["x1", "x1"], "trace_id": ["t", "t"], "segment_index": [0, 1], "label": ["fact", "fact"], "source": ["baseline"] * 2,
          "annotator": ["a"] * 2, "codebook_version": ["v"] * 2, "run_id": [None] * 2, "study": [None] * 2, "confidence": [None] * 2,
          "rationale": [None] * 2, "created_at": [None] * 2, "extra": ["{}"] * 2, "distribution": [None] * 2}, "E962"),
        ({"surprise": [1]}, "E960"),
    ],
)
def test_label_table_is_checked_at_the_edge(tmp_path: Path, override: dict, code: str) -> None:
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(StoreError) as err:
            store.upsert_label_table(_label_table(**override))
        assert err.value.code == code
        assert store.counts()["labels"] == 0


def test_label_table_refuses_unstored_segments(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as store:
        store.upsert_traces([Trace(trace_id="t", text="one. two.")])
        store.replace_segments("t", [Segment(trace_id="t", segment_index=0, char_start=0, char_end=4, text="one.", n_tokens=1)],
                               segmenter="m", token_counter="w")
        with pytest.raises(StoreError, match="t#5"):
            store.upsert_label_table(_label_table(segment_index=[5]))
        assert store.upsert_label_table(_label_table(created_at=pa.array([0], pa.timestamp("us")))) == 1
        assert [lab.label for lab in store.labels()] == ["fact"]

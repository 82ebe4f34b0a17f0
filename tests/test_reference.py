"""One reference-label rule: the pure function, review.reference_labels, the export's "adjudicated"
choice and ``ror agree --reference adjudicated`` must give the same reference.

The scenario has two studies (s1, s2), two adjudicators (one per study) and re-annotations (a
human relabeling a segment in a later study or under a later codebook). Every expected value
below was worked out by hand from the rule in ror_annotate/reference.py; the comment at each
segment gives the reasoning.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ror_annotate.export import choose_label
from ror_annotate.records import Label, Segment, Trace
from ror_annotate.reference import latest, latest_per_annotator, reference_label, reference_labels_from
from ror_annotate.store import Store

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _lab(seg, label, source, who, study, minutes, codebook="cb-1"):
    return Label(trace_id="t", segment_index=seg, label=label, source=source, annotator=who,
                 codebook_version=codebook, study=study, created_at=T0 + timedelta(minutes=minutes))


A1, A2 = "adjudicator:a1", "adjudicator:a2"
LABELS = [
    # seg 0: humans split in s1, a1 adjudicates "execution" at m10; in s2 a2 adjudicated "planning"
    # earlier (m5). Pooled: the latest adjudication (a1, m10) -> execution. Annotator order alone
    # (the old review rule) would have taken a2 -> planning.
    _lab(0, "planning", "human", "h-1", "s1", 0), _lab(0, "execution", "human", "h-2", "s1", 0),
    _lab(0, "execution", "adjudicated", A1, "s1", 10),
    _lab(0, "planning", "human", "h-1", "s2", 1), _lab(0, "planning", "human", "h-3", "s2", 1),
    _lab(0, "planning", "adjudicated", A2, "s2", 5),
    # seg 1: h-1 says fact in s1, re-annotates reflection in s2 (later); h-2 says reflection in s2.
    # Pooled: latest h-1 = reflection, h-2 = reflection -> unanimous reflection (2 annotators).
    # s1 alone: only h-1 -> single fact. s2 alone: unanimous reflection.
    _lab(1, "fact", "human", "h-1", "s1", 0),
    _lab(1, "reflection", "human", "h-1", "s2", 30), _lab(1, "reflection", "human", "h-2", "s2", 30),
    # seg 2: both adjudicators at the same instant (m40): the tie goes to the larger annotator id
    # (adjudicator:a2 > adjudicator:a1) -> fact. s1 alone: conclusion (a1); s2 alone: fact (a2).
    _lab(2, "conclusion", "human", "h-1", "s1", 0), _lab(2, "fact", "human", "h-2", "s1", 0),
    _lab(2, "conclusion", "adjudicated", A1, "s1", 40),
    _lab(2, "fact", "human", "h-3", "s2", 0), _lab(2, "fact", "adjudicated", A2, "s2", 40),
    # seg 3: no adjudication, the humans of the two studies disagree -> pooled: no reference.
    # s1: single planning (h-1), s2: single execution (h-2). The judge label never counts.
    _lab(3, "planning", "human", "h-1", "s1", 0), _lab(3, "execution", "human", "h-2", "s2", 0),
    Label(trace_id="t", segment_index=3, label="planning", source="judge", annotator="openai:m",
          codebook_version="cb-1", created_at=T0 + timedelta(minutes=99)),
    # seg 4: h-1 re-annotates in s1 under codebook cb-2 (m50: restatement -> planning); h-2 says
    # planning under cb-2. Latest per annotator: planning, planning -> unanimous planning (2), in
    # s1 and pooled; s2 has no label of it.
    _lab(4, "restatement", "human", "h-1", "s1", 0, "cb-1"),
    _lab(4, "planning", "human", "h-1", "s1", 50, "cb-2"), _lab(4, "planning", "human", "h-2", "s1", 50, "cb-2"),
    # seg 5: h-3 labels in both studies at the same instant (m60): fact (s1) vs execution (s2);
    # the tie goes to the larger study name (s2) -> pooled single execution; s1 fact; s2 execution.
    _lab(5, "fact", "human", "h-3", "s1", 60), _lab(5, "execution", "human", "h-3", "s2", 60),
]

EXPECTED = {  # study -> {segment: (label, basis, n_annotators)}
    None: {0: ("execution", "adjudicated", 3), 1: ("reflection", "unanimous", 2), 2: ("fact", "adjudicated", 3),
           4: ("planning", "unanimous", 2), 5: ("execution", "single", 1)},
    "s1": {0: ("execution", "adjudicated", 2), 1: ("fact", "single", 1), 2: ("conclusion", "adjudicated", 2),
           3: ("planning", "single", 1), 4: ("planning", "unanimous", 2), 5: ("fact", "single", 1)},
    "s2": {0: ("planning", "adjudicated", 2), 1: ("reflection", "unanimous", 2), 2: ("fact", "adjudicated", 1),
           3: ("execution", "single", 1), 5: ("execution", "single", 1)},
}


def _summary(refs):
    return {key[1]: (r.label, r.basis, r.n_annotators) for key, r in refs.items()}


@pytest.mark.parametrize("study", [None, "s1", "s2"])
def test_reference_rule_two_studies_two_adjudicators_reannotations(study):
    assert _summary(reference_labels_from(LABELS, study=study)) == EXPECTED[study]
    # input order never matters (ties are broken by content, not position)
    rng = random.Random(7)
    for _ in range(20):
        shuffled = LABELS[:]
        rng.shuffle(shuffled)
        assert _summary(reference_labels_from(shuffled, study=study)) == EXPECTED[study]


def test_reference_rests_on_the_winning_labels():
    refs = reference_labels_from(LABELS)
    assert [(lab.annotator, lab.study) for lab in refs[("t", 0)].labels] == [(A1, "s1")]
    assert [(lab.annotator, lab.study, lab.label) for lab in refs[("t", 1)].labels] == [
        ("h-1", "s2", "reflection"), ("h-2", "s2", "reflection")]
    assert [lab.codebook_version for lab in refs[("t", 4)].labels] == ["cb-2", "cb-2"]
    assert latest([]) is None and latest_per_annotator([]) == []
    assert reference_label([]) is None
    assert reference_label([lab for lab in LABELS if lab.segment_index == 3]) is None
    with pytest.raises(ValueError, match="2 segments"):
        reference_label([LABELS[0], LABELS[6]])


def _store(path) -> Store:
    text = " ".join(f"Step {i}." for i in range(6))
    spans = [(text.index(f"Step {i}."), text.index(f"Step {i}.") + len(f"Step {i}.")) for i in range(6)]
    store = Store(path)
    store.upsert_traces([Trace(trace_id="t", text=text)])
    store.replace_segments(
        "t", [Segment(trace_id="t", segment_index=i, char_start=a, char_end=b, text=text[a:b], n_tokens=2)
              for i, (a, b) in enumerate(spans)],
        segmenter="manual", token_counter="manual",
    )
    store.upsert_labels(LABELS)
    return store


@pytest.mark.parametrize("study", [None, "s1", "s2"])
def test_review_and_agree_reference_labels_use_the_rule(tmp_path, study):
    from ror_annotate.agreement import adjudicated_reference
    from ror_annotate.review import reference_labels

    with _store(tmp_path / "s.duckdb") as store:
        refs = reference_labels(store, study)
        by_item = adjudicated_reference(store, study=study)
    assert {r.segment_index: (r.label, r.basis, r.n_annotators) for r in refs} == EXPECTED[study]
    assert [r.segment_index for r in refs] == sorted(EXPECTED[study])
    assert {int(k.split("#")[1]): (r.label, r.basis, r.n_annotators) for k, r in by_item.items()} == EXPECTED[study]


def test_agree_reference_adjudicated_scores_against_the_rule(tmp_path):
    from ror_annotate.agreement import agreement_summary

    # Study s1 under codebook cb-1 (h-1's cb-2 re-annotation of segment 4 is another codebook):
    # annotators h-1 (segments 0-4), h-2 (0-3), h-3 (5). The reference of s1 (EXPECTED["s1"]) is
    # execution, fact, conclusion, planning, planning, fact for segments 0..5, so h-1 (planning,
    # fact, conclusion, planning, restatement) matches on 1, 2, 3 and misses 0 and 4: accuracy 3/5.
    with _store(tmp_path / "s.duckdb") as store:
        d = agreement_summary(store, study="s1", codebook_version="cb-1", reference="adjudicated", n_resamples=0)
    assert d["per_class"]["reference"] == "adjudicated"
    h1 = d["per_class"]["annotators"]["h-1"]
    assert h1["accuracy"]["value"] == pytest.approx(3 / 5)
    cats = d["categories"]
    conf = h1["confusion_matrix"]  # rows: reference, columns: h-1
    assert conf[cats.index("execution")][cats.index("planning")] == 1  # segment 0
    assert conf[cats.index("planning")][cats.index("restatement")] == 1  # segment 4
    assert sum(map(sum, conf)) == 5


def test_export_adjudicated_choice_uses_the_rule():
    by_seg: dict[int, list[Label]] = {}
    for lab in LABELS:
        by_seg.setdefault(lab.segment_index, []).append(lab)
    got = {}
    for seg, labs in by_seg.items():
        chosen, _ = choose_label(labs, "adjudicated")
        if chosen.label is not None:
            got[seg] = (chosen.label, "adjudicated" if chosen.source == "adjudicated" else None, chosen.n_votes)
    assert got == {0: ("execution", "adjudicated", 1), 1: ("reflection", None, 2), 2: ("fact", "adjudicated", 1),
                   4: ("planning", None, 2), 5: ("execution", None, 1)}
    # "auto" takes the same adjudication first
    assert choose_label(by_seg[0], "auto")[0].label == "execution"
    assert choose_label(by_seg[2], "auto")[0].annotator == A2
    # the human branch keeps the provenance of the latest labels (the cb-2 re-annotation)
    assert choose_label(by_seg[4], "adjudicated")[0].codebook_version == "cb-2"
    assert choose_label(by_seg[4], "adjudicated")[0].annotator == "h-1,h-2"


# ------------------------------------------------------------------ properties of the rule

_BEHAVIORS = ["planning", "execution", "fact", "reflection"]
_label = st.builds(
    lambda seg, label, source, who, study, minutes: _lab(seg, label, source, who, study, minutes),
    seg=st.integers(0, 2),
    label=st.sampled_from(_BEHAVIORS),
    source=st.sampled_from(["human", "adjudicated", "judge", "baseline"]),
    who=st.sampled_from(["h-1", "h-2", "adjudicator:a1"]),
    study=st.sampled_from(["s1", "s2"]),
    minutes=st.integers(0, 3),  # few distinct times: many exact-time ties
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_label, max_size=14), st.randoms(use_true_random=False))
def test_rule_properties(labels, rnd):
    refs = reference_labels_from(labels)
    # 1. order of the input never matters
    shuffled = labels[:]
    rnd.shuffle(shuffled)
    assert reference_labels_from(shuffled) == refs
    # 2. judge and baseline labels never take part
    assert reference_labels_from([lab for lab in labels if lab.source in ("human", "adjudicated")]) == refs
    for key, ref in refs.items():
        segment = [lab for lab in labels if (lab.trace_id, lab.segment_index) == key]
        adjudications = [lab for lab in segment if lab.source == "adjudicated"]
        if adjudications:
            # 3. an adjudication exists -> the reference is an adjudication no other one is later than
            assert ref.basis == "adjudicated"
            assert all(a.created_at <= ref.labels[0].created_at for a in adjudications)
        else:
            # 4. otherwise every human's latest label (by time) is the reference label
            humans = [lab for lab in segment if lab.source == "human"]
            for who in {h.annotator for h in humans}:
                newest = max(h.created_at for h in humans if h.annotator == who)
                assert any(h.label == ref.label for h in humans if h.annotator == who and h.created_at == newest)
    # 5. a later adjudication always becomes the reference of its segment
    late = _lab(0, "conclusion", "adjudicated", "adjudicator:z", "s9", 10)
    assert reference_labels_from([*labels, late])[("t", 0)].label == "conclusion"


def test_the_export_uses_the_one_recency_rule_whatever_the_arrival_order() -> None:
    """Two labels of one annotator share a timestamp: the export's vote is the same in both arrival orders."""
    from datetime import datetime, timezone

    from ror_annotate.export.labels import _latest_per_annotator
    from ror_annotate.records import Label
    from ror_annotate.reference import latest_per_annotator

    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    a = Label(trace_id="t", segment_index=0, label="fact", source="human", annotator="h1", codebook_version="cb", created_at=t)
    b = Label(trace_id="t", segment_index=0, label="planning", source="human", annotator="h1", codebook_version="cb", created_at=t)
    first = _latest_per_annotator([a, b])
    second = _latest_per_annotator([b, a])
    assert [x.label for x in first] == [x.label for x in second] == [x.label for x in latest_per_annotator([a, b])]
    # by hand: the tie is broken by the largest (annotator, study, codebook_version, label): "planning" > "fact"
    assert first[0].label == "planning"

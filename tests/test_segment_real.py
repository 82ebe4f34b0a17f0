"""Property test of the segmenter over every real trace: the embedded sample (40 traces) always,
and the 201 traces of ../shared/data/traces.jsonl in the ``shared`` tier.

The length targets are the issue's (from the method's corpus: median 16, p95 47, cap 125 tokens):
median 12-20, p95 <= 60, max <= 125.
"""

from __future__ import annotations

import json

import pytest

from ror_annotate.segment import ApproxTokenCounter, Segmenter, segment_stats

from .conftest import DATA
from .test_segment import assert_invariants

pytestmark = pytest.mark.slow
N_TRACES = {"sample": 40, "shared": 201}  # the data READMEs' counts


@pytest.fixture(scope="module", params=["sample", pytest.param("shared", marks=pytest.mark.shared)])
def segmented(request, real_traces_path) -> tuple[str, list[tuple[str, list]]]:
    path = real_traces_path if request.param == "sample" else DATA / "traces.jsonl"
    segmenter = Segmenter()
    out = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            out.append((row["trace"], segmenter.segment(row["trace"], row["trace_id"])))
    return request.param, out


def test_invariants_hold_on_every_real_trace(segmented: tuple[str, list[tuple[str, list]]]) -> None:
    tier, segmented = segmented
    assert len(segmented) == N_TRACES[tier]
    counter = ApproxTokenCounter()
    for text, segs in segmented:
        assert segs, "a non-empty trace gave no segments"
        assert_invariants(text, segs, max_tokens=125)
        for s in segs[:: max(1, len(segs) // 20)]:  # a sample: the counts are the counter's own
            assert s.n_tokens == counter.count(s.text)


def test_length_profile_meets_the_targets(segmented: tuple[str, list[tuple[str, list]]]) -> None:
    stats = segment_stats(s for _, segs in segmented[1] for s in segs)
    print(stats)
    assert 12 <= stats["median"] <= 20
    assert stats["p95"] <= 60
    assert stats["max"] <= 125

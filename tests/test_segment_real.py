"""Property test of the segmenter over every real trace in ../shared/data/traces.jsonl.

Skips cleanly when the shared folder is absent. The length targets are the issue's (from the
method's corpus: median 16, p95 47, cap 125 tokens): median 12-20, p95 <= 60, max <= 125.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ror_annotate.segment import ApproxTokenCounter, Segmenter, segment_stats

from .test_segment import assert_invariants

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces.jsonl"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not TRACES.is_file(), reason=f"{TRACES} not present"),
]


@pytest.fixture(scope="module")
def segmented() -> list[tuple[str, list]]:
    segmenter = Segmenter()
    out = []
    with TRACES.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            out.append((row["trace"], segmenter.segment(row["trace"], row["trace_id"])))
    return out


def test_invariants_hold_on_every_real_trace(segmented: list[tuple[str, list]]) -> None:
    assert len(segmented) == 201  # the data README's count
    counter = ApproxTokenCounter()
    for text, segs in segmented:
        assert segs, "a non-empty trace gave no segments"
        assert_invariants(text, segs, max_tokens=125)
        for s in segs[:: max(1, len(segs) // 20)]:  # a sample: the counts are the counter's own
            assert s.n_tokens == counter.count(s.text)


def test_length_profile_meets_the_targets(segmented: list[tuple[str, list]]) -> None:
    stats = segment_stats(s for _, segs in segmented for s in segs)
    print(stats)
    assert 12 <= stats["median"] <= 20
    assert stats["p95"] <= 60
    assert stats["max"] <= 125

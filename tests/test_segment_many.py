"""Tests of :func:`ror_annotate.segment.segment_many`: parallel segmentation of a corpus.

The expected result of every trace is :meth:`Segmenter.segment` on that trace alone (the
serial path), compared record by record and as serialized JSON (byte for byte).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ror_annotate.errors import ConfigError, SegmentationError
from ror_annotate.segment import TASK_CHARS, Segmenter, default_workers, segment_many, segment_spans_many
from ror_annotate.tokenizer import make_token_counter

from .test_segment import _tiny_tokenizer_file

# Texts of many shapes and sizes: CRLF and CR line ends, CJK, math, fences, an empty trace.
TEXTS = [
    "So x = 4.\n\nWait, that is wrong.  \n  Let me redo it...\n\n\nFinal: x = 5.",
    "Steps:\r\n1. Expand the square.\r\n2. Collect like terms.\r\n```\r\nx. y\r\n```\r\nSo the answer is 12.",
    "我们先计算这个数的平方，然后把结果加上三。对吗？对！" * 7,
    "",
    "Old Mac\rline ends\rhere. And more. " * 30,
    "We have \\( a = 1. B = 2 \\) here. Then $x. Y$ too. " * 50,
    " ".join(f"word{i}" for i in range(700)),
    "   \n\t ",
] + [f"Trace {i}: the value is {i}. Hmm, is {i} even? Let me check, so {i} mod 2 is {i % 2}.\n" * (i % 9 + 1) for i in range(40)]


def _ids(n: int) -> list[str]:
    return [f"t{i}" for i in range(n)]


def _serial(segmenter: Segmenter) -> list[list]:
    return [segmenter.segment(text, tid) for tid, text in zip(_ids(len(TEXTS)), TEXTS)]


def _json(results: list[list]) -> list[list[str]]:
    return [[s.model_dump_json() for s in segs] for segs in results]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_parallel_equals_serial_in_input_order(workers: int) -> None:
    segmenter = Segmenter(max_tokens=40)
    expected = _serial(segmenter)
    # A small task size spreads the traces over many tasks, so results arrive out of order.
    got = list(segment_many(zip(_ids(len(TEXTS)), TEXTS), segmenter=segmenter, workers=workers, task_chars=300))
    assert got == expected
    assert _json(got) == _json(expected)
    assert [segs[0].trace_id for segs in got if segs] == [tid for tid, t in zip(_ids(len(TEXTS)), TEXTS) if t.strip()]


@pytest.mark.parametrize("workers", [1, 2])
def test_spans_are_the_segments_fields_in_input_order(workers: int) -> None:
    segmenter = Segmenter(max_tokens=40)
    expected = [[(s.char_start, s.char_end, s.n_tokens) for s in segs] for segs in _serial(segmenter)]
    got = list(segment_spans_many(zip(_ids(len(TEXTS)), TEXTS), segmenter=segmenter, workers=workers, task_chars=300))
    assert got == expected and sum(map(len, got)) > 10
    with pytest.raises(ConfigError):
        segment_spans_many([("t", "x.")], workers=0)


def test_parallel_with_a_real_tokenizer(tmp_path: Path) -> None:
    # The Rust tokenizer is pickled into each worker; counts and cap cuts must not change.
    segmenter = Segmenter(max_tokens=12, token_counter=make_token_counter(_tiny_tokenizer_file(tmp_path)))
    got = list(segment_many(zip(_ids(len(TEXTS)), TEXTS), segmenter=segmenter, workers=2, task_chars=500))
    assert _json(got) == _json(_serial(segmenter))


def test_input_is_consumed_lazily() -> None:
    pulled = []

    def items():
        for tid, text in zip(_ids(len(TEXTS)), TEXTS):
            pulled.append(tid)
            yield tid, text

    stream = segment_many(items(), workers=1)
    first = next(stream)
    assert first[0].trace_id == "t0"
    assert pulled == ["t0"]  # one trace read for one result
    assert len(list(stream)) == len(TEXTS) - 1


def test_default_uses_every_core_and_still_matches() -> None:
    assert default_workers() >= 1
    got = list(segment_many(zip(_ids(5), TEXTS[:5])))
    assert got == [Segmenter().segment(t, tid) for tid, t in zip(_ids(5), TEXTS[:5])]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_record_raises_segmentation_error(workers: int) -> None:
    with pytest.raises(SegmentationError, match="trace_id"):
        list(segment_many([("ok", "Fine."), ("", "No id here.")], workers=workers))


@pytest.mark.parametrize("kw", [{"workers": 0}, {"workers": -2}, {"task_chars": 0}])
def test_bad_options(kw: dict) -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        segment_many([("t", "x.")], **kw)


# ----------------------------------------------------------------------------- the pipeline's segment stage
def _big_traces() -> list[dict]:
    # Over TASK_CHARS characters in all, so segment_many really hands tasks to worker processes.
    rows = []
    for k in range(3):
        # LF line ends: ingest stores every text with LF (formats.normalize_newlines).
        body = "".join(f"Step {i}: we add {i} and {k}, so the sum is {i + k}. Wait, is that right? Yes.\n" for i in range(1500))
        rows.append({"trace_id": f"big{k}", "trace": body})
    assert sum(len(r["trace"]) for r in rows) > TASK_CHARS
    return rows


def test_pipeline_segment_and_cli_store_the_serial_segments_with_workers(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from ror_annotate import pipeline
    from ror_annotate.store import Store

    rows = _big_traces()
    src = tmp_path / "big.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    expected = [s for r in rows for s in Segmenter().segment(r["trace"], r["trace_id"])]
    with Store(tmp_path / "lib.duckdb") as store:
        pipeline.ingest(store, src)
        summary = pipeline.segment(store, workers=2)
        assert summary.segments == len(expected) and summary.inserted == 3
        assert store.segments() == expected
    ror = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]
    for args in (["ingest", str(src)], ["segment", "--workers", "2"]):
        done = subprocess.run([*ror, *args, "--db", "cli.duckdb"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    with Store(tmp_path / "cli.duckdb") as store:
        assert store.segments() == expected
    bad = subprocess.run([*ror, "segment", "--workers", "0", "--db", "cli.duckdb"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--workers" in bad.stderr

"""Segmentation speed on the real traces: ours vs spaCy's bare sentencizer vs pysbd, in one run.

Prints, for each segmenter, segments, seconds, segments/s and characters/s, and each one's
throughput as a ratio to spaCy's bare sentencizer (blank English + ``sentencizer``) measured
in the same run on the same texts, all on one core. Loading (spaCy pipeline, pysbd rules)
happens before the clock starts; each segmenter gets one untimed warm-up trace. Each
single-core figure is the best of ``--rounds`` runs (the least disturbed by other processes).

Then the scaling of :func:`ror_annotate.segment.segment_many` over worker processes: the
corpus repeated ``--repeat`` times (distinct trace ids) is segmented with 1, 2 and N workers
(N = all cores this process may use, or ``--workers``), timed from the call to the last
result (worker start-up included), with the speed-up over 1 worker and a check that every
result equals the serial one byte for byte.

With ``--compare-tokenizer PATH`` (a Hugging Face ``tokenizer.json`` or tokenizer folder) it
also compares the ``approx:regex-v1`` token counts of our segments with that tokenizer's
counts: total ratio, mean absolute error per segment, and both length profiles.

Usage::

    python benchmarks/bench_segment.py [--data FILE] [--limit N] [--no-pysbd] [--rounds 3]
                                       [--repeat 4] [--workers N] [--no-scaling]
                                       [--tokenizer PATH] [--compare-tokenizer PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The shared data folder: $ROR_SHARED_DIR, else ../shared next to the repository.
SHARED = Path(os.environ.get("ROR_SHARED_DIR", REPO.parent / "shared"))
sys.path.insert(0, str(REPO))

from ror_annotate.segment import Segmenter, default_workers, segment_many, segment_stats  # noqa: E402
from ror_annotate.tokenizer import make_token_counter  # noqa: E402


def _time(fn, texts: list[str], rounds: int) -> tuple[int, float]:
    fn(texts[0])  # warm-up, untimed
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        n = sum(fn(t) for t in texts)
        best = min(best, time.perf_counter() - t0)
    return n, best


def _scaling(segmenter: Segmenter, texts: list[str], repeat: int, n_workers: int) -> None:
    items = [(f"r{r}-t{i}", t) for r in range(repeat) for i, t in enumerate(texts)]
    n_chars = sum(len(t) for _, t in items)
    print(f"\nsegment_many scaling: {len(items)} traces ({repeat} x the corpus), {n_chars:,} characters, "
          f"{default_workers()} cores available")
    reference = None
    base = None
    print(f"{'workers':>7} {'seconds':>8} {'chars/s':>11} {'speed-up':>9} {'efficiency':>10} {'parent CPU s':>12} {'load':>5}  same output")
    for workers in sorted({1, 2, n_workers}):
        t0, c0 = time.perf_counter(), time.process_time()
        results = [list(segs) for segs in segment_many(items, segmenter=segmenter, workers=workers)]
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        dumped = [[s.model_dump_json() for s in segs] for segs in results]
        reference = reference if reference is not None else dumped
        base = base if base is not None else secs
        print(
            f"{workers:>7} {secs:>8.2f} {n_chars / secs:>11,.0f} {base / secs:>8.2f}x {base / secs / workers:>10.2f} "
            f"{cpu:>12.2f} {os.getloadavg()[0]:>5.1f}  {dumped == reference}"
        )
    print("speed-up = seconds with 1 worker / seconds with this many (start-up included); efficiency = speed-up / workers.")
    print("parent CPU s = CPU time of this process (with workers: reading, task hand-off, building records), the part")
    print("that does not scale; load = 1-minute load average after the run (above the core count, the figures are contended).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=SHARED / "data" / "traces.jsonl")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N traces")
    ap.add_argument("--no-pysbd", action="store_true", help="skip pysbd (the slowest)")
    ap.add_argument("--rounds", type=int, default=3, help="single-core runs per segmenter; the best is reported")
    ap.add_argument("--repeat", type=int, default=4, help="copies of the corpus for the scaling run")
    ap.add_argument("--workers", type=int, default=None, help="N for the scaling run (default: all cores)")
    ap.add_argument("--no-scaling", action="store_true", help="skip the segment_many scaling run")
    ap.add_argument("--tokenizer", default=None, help="token counter for our segmenter (default: approximation)")
    ap.add_argument("--compare-tokenizer", default=None, help="tokenizer to compare the approximation against")
    args = ap.parse_args(argv)

    with args.data.open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    texts = [r["trace"] for r in rows][: args.limit]
    n_chars = sum(len(t) for t in texts)
    print(f"{len(texts)} traces, {n_chars:,} characters (longest {max(map(len, texts)):,})")

    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.max_length = max(nlp.max_length, max(map(len, texts)) + 1)
    ours = Segmenter(token_counter=make_token_counter(args.tokenizer))
    contenders = {
        "spacy sentencizer (baseline)": lambda t: sum(1 for _ in nlp(t).sents),
        f"ror_annotate {ours.name} [{ours.token_counter.name}]": lambda t: len(ours.segment(t, "t")),
    }
    if not args.no_pysbd:
        import pysbd

        sbd = pysbd.Segmenter(language="en", clean=False, char_span=False)
        contenders["pysbd (clean=False, char_span=False)"] = lambda t: len(sbd.segment(t))

    results = {name: _time(fn, texts, args.rounds) for name, fn in contenders.items()}
    base_n, base_s = results["spacy sentencizer (baseline)"]
    print(f"{'segmenter':<58} {'segments':>9} {'seconds':>8} {'segments/s':>11} {'chars/s':>11} {'x spaCy':>8}")
    for name, (n, secs) in results.items():
        print(f"{name:<58} {n:>9,} {secs:>8.2f} {n / secs:>11,.0f} {n_chars / secs:>11,.0f} {base_s / secs:>8.2f}")
    print("x spaCy = characters/s relative to spaCy's bare sentencizer in this run (higher is faster), one core.")
    if not args.no_scaling:
        _scaling(ours, texts, args.repeat, args.workers or default_workers())

    if args.compare_tokenizer:
        _compare_counts(ours, texts, make_token_counter(args.compare_tokenizer))
    return 0


def _compare_counts(ours: Segmenter, texts: list[str], real) -> None:
    approx = make_token_counter(None)
    segs = [s for i, t in enumerate(texts) for s in ours.segment(t, f"t{i}")]
    a = [approx.count(s.text) for s in segs]
    r = [real.count(s.text) for s in segs]
    err = [x - y for x, y in zip(a, r)]
    print(f"\ntoken counts of {len(segs):,} segments: {approx.name} vs {real.name}")
    print(f"  total ratio approx/real {sum(a) / sum(r):.3f}; mean |error| {statistics.fmean(abs(e) for e in err):.2f} tokens; "
          f"mean |relative error| {statistics.fmean(abs(e) / y for e, y in zip(err, r) if y):.3f}; "
          f"segments over the real count by >10%: {sum(e > 0.1 * y for e, y in zip(err, r)) / len(r):.3f}, under by >10%: "
          f"{sum(-e > 0.1 * y for e, y in zip(err, r)) / len(r):.3f}")
    for name, counts in ((approx.name, a), (real.name, r)):
        q = statistics.quantiles(counts, n=20, method="inclusive")
        print(f"  {name:<40} median {statistics.median(counts):g}  p5 {q[0]:g}  p95 {q[18]:g}  max {max(counts)}")
    stats = segment_stats(segs)
    print(f"  (segment_stats on n_tokens: median {stats['median']:g}, p95 {stats['p95']:g}, max {stats['max']:g})")


if __name__ == "__main__":
    raise SystemExit(main())

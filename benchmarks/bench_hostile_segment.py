"""Segmentation of degenerate texts (repetition loops, runs of sentence punctuation) vs real text.

A reasoning trace that hits its token limit often ends in a repetition loop ("Wait, wait, wait,
...", "......", "。。。"). Each hostile text below is segmented next to a baseline text of the same
length (the embedded sample's traces joined and cut), in the same run, and the CPU seconds of both
and their ratio are printed. A segmenter linear in its input keeps the ratio near 1; before round 6
"Wait, " x 20,000 took 81 s of CPU (ratio about 400), 60,000 dots 43 s, 20,000 "。" 4.7 s.

Usage::

    python benchmarks/bench_hostile_segment.py [--n 20000]
"""

from __future__ import annotations

import argparse
import time

from ror_annotate import segment_text
from ror_annotate.sample import sample_path
from ror_annotate.traces import load_traces


def _cpu(text: str) -> tuple[float, int]:
    start = time.process_time()
    n = len(segment_text(text))
    return time.process_time() - start, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="repetitions of each hostile unit (default 20000)")
    args = parser.parse_args()
    real = "\n\n".join(t.text for t in load_traces(sample_path()).traces)
    hostile = {"'Wait, ' loop": "Wait, " * args.n, "'...' run": "..." * args.n, "'。' run": "。" * args.n,
               "'?!' run": "?!" * args.n, "'Hmm; wait — ' loop": "Hmm; wait — alternatively, " * (args.n // 4)}
    print(f"{'text':24s} {'chars':>8s} {'segments':>9s} {'cpu s':>7s} {'baseline s':>10s} {'ratio':>6s}")
    for name, text in hostile.items():
        base_text = (real * (len(text) // len(real) + 1))[: len(text)]
        base, _ = _cpu(base_text)
        took, n = _cpu(text)
        print(f"{name:24s} {len(text):8d} {n:9d} {took:7.2f} {base:10.2f} {took / max(base, 1e-3):6.1f}")


if __name__ == "__main__":
    main()

"""Segment length profile in tokens of an independent byte-level BPE, ours vs the reference segmentations.

The counter is a byte-level BPE (GPT-2 / Qwen style: ``ByteLevel`` pre-tokenizer, no special
tokens) trained with the ``tokenizers`` library on the ``trace`` texts of
``../shared/data/traces.jsonl``; training is deterministic for a fixed corpus and vocabulary
size, so the figures reproduce. It is independent of the segmenter's own ``approx:regex-v1``
counter, and close to a real LLM tokenizer on this text.

Printed per segmentation (ours on all traces; ours and each reference labeler on the traces that
labeler segmented, over the character range it covered): number of segments and median, p5, p95,
max and mean length in tokens. Percentiles are ``statistics.quantiles(method="inclusive")`` (numpy's
default linear interpolation). The method's corpus (Routes of Reasoning) is printed for reference.

Usage::

    python benchmarks/segment_profile.py [--data DIR] [--vocab 32000] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The shared data folder: $ROR_SHARED_DIR, else ../shared next to the repository.
SHARED = Path(os.environ.get("ROR_SHARED_DIR", REPO.parent / "shared"))
sys.path.insert(0, str(REPO))

from ror_annotate.segment import METHOD_LENGTH_PROFILE, Segmenter, segment_many  # noqa: E402


def train_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE trained on ``texts`` (deterministic); returns a ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def profile(counts: list[int]) -> str:
    """``n median p5 p95 max mean`` of token counts, formatted."""
    if not counts:
        return "no segments"
    q = statistics.quantiles(counts, n=20, method="inclusive") if len(counts) > 1 else [counts[0]] * 19
    return (
        f"{len(counts):>7,}  {statistics.median(counts):>6g}  {q[0]:>5g}  {q[18]:>6.1f}  {max(counts):>5}  "
        f"{statistics.fmean(counts):>6.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=SHARED / "data", help="folder with traces.jsonl and labeled_segments.jsonl")
    ap.add_argument("--vocab", type=int, default=32000, help="BPE vocabulary size (default 32000)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N traces")
    args = ap.parse_args(argv)

    with open(args.data / "traces.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh][: args.limit]
    traces = {r["trace_id"]: r["trace"] for r in rows}
    t0 = time.perf_counter()
    bpe = train_bpe(list(traces.values()), args.vocab)
    print(f"byte-level BPE, vocabulary {bpe.get_vocab_size():,}, trained on {len(traces)} traces in {time.perf_counter() - t0:.1f} s")

    def count_many(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in bpe.encode_batch(texts, add_special_tokens=False)]

    theirs: dict[str, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    with open(args.data / "labeled_segments.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["char_start"] is not None and row["trace_id"] in traces:
                theirs[row["labeler"]][row["trace_id"]].append((row["char_start"], row["char_end"]))

    segmenter = Segmenter()
    ours = {
        tid: [(s.char_start, s.char_end) for s in segs]
        for tid, segs in zip(traces, segment_many(traces.items(), workers=1))
    }
    print(f"segmenter {segmenter.name}; token counts from the BPE above")
    print(f"{'segmentation':<52} {'n':>7}  {'median':>6}  {'p5':>5}  {'p95':>6}  {'max':>5}  {'mean':>6}")
    m = METHOD_LENGTH_PROFILE
    print(f"{'method corpus (Routes of Reasoning, its tokenizer)':<52} {'':>7}  {m['median']:>6g}  {m['p5']:>5g}  {m['p95']:>6g}  {m['max']:>5g}")
    all_ours = [traces[t][s:e] for t, spans in ours.items() for s, e in spans]
    print(f"{'ours, all traces':<52} {profile(count_many(all_ours))}")
    for labeler, per_trace in sorted(theirs.items()):
        ref, mine = [], []
        for tid, spans in per_trace.items():
            text = traces[tid]
            lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
            ref += [text[s:e] for s, e in spans]
            mine += [text[s:e] for s, e in ours[tid] if lo <= s < hi]
        print(f"{labeler + f' ({len(per_trace)} traces)':<52} {profile(count_many(ref))}")
        print(f"{'  ours on the same ranges':<52} {profile(count_many(mine))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

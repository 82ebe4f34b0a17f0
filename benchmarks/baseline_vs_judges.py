"""How far the cue-phrase baseline agrees with other projects' LLM judges.

Two views, per labeler in shared/data/labeled_segments.jsonl (label_six):
  * segment level on THEIR segmentation (our rules applied to their segment texts), and
  * character level on OUR segmentation: every non-whitespace character of a trace covered by
    both gets our segment's label and theirs; Cohen's kappa over those characters
    (scikit-learn's cohen_kappa_score).
They are other judges under other codebooks: use the figures to find weak rules, not as a target.

    python benchmarks/baseline_vs_judges.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np
from sklearn.metrics import cohen_kappa_score, confusion_matrix

from ror_annotate.judge.baseline import classify_trace
from ror_annotate.records import BEHAVIORS, Segment


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--char-level", action="store_true", help="also compare at character level on our segmentation")
    args = ap.parse_args()
    data = Path(args.data)
    traces = {(rec := json.loads(line))["trace_id"]: rec for line in (data / "traces.jsonl").open()}
    rows = [json.loads(line) for line in (data / "labeled_segments.jsonl").open()]
    by_trace = collections.defaultdict(list)
    for r in rows:
        if r["label_six"] and r["char_start"] is not None:
            by_trace[(r["labeler"], r["trace_id"])].append(r)
    ours_by_labeler = collections.defaultdict(list)
    theirs_by_labeler = collections.defaultdict(list)
    for (labeler, tid), segs in by_trace.items():
        segs.sort(key=lambda r: r["char_start"])
        recs = [
            Segment(trace_id=tid, segment_index=i, char_start=r["char_start"], char_end=r["char_end"], text=r["text"], n_tokens=0)
            for i, r in enumerate(segs) if r["text"].strip() and r["char_end"] > r["char_start"]
        ]
        kept = [r for r in segs if r["text"].strip() and r["char_end"] > r["char_start"]]
        preds = classify_trace(traces[tid]["problem"], recs)
        ours_by_labeler[labeler] += [p for p, _ in preds]
        theirs_by_labeler[labeler] += [r["label_six"] for r in kept]
    print(f"{'labeler':55s} {'n':>6s} {'kappa':>7s} {'acc':>6s}")
    allo, allt = [], []
    for labeler in sorted(ours_by_labeler):
        o, t = ours_by_labeler[labeler], theirs_by_labeler[labeler]
        allo += o
        allt += t
        print(f"{labeler:55s} {len(o):6d} {cohen_kappa_score(o, t):7.3f} {np.mean(np.array(o) == np.array(t)):6.3f}")
    print(f"{'ALL':55s} {len(allo):6d} {cohen_kappa_score(allo, allt):7.3f} {np.mean(np.array(allo) == np.array(allt)):6.3f}")
    print("\nconfusion (rows = other judges, cols = baseline):", BEHAVIORS)
    print(confusion_matrix(allt, allo, labels=list(BEHAVIORS)))
    if args.char_level:
        char_level(traces, by_trace)


def char_level(traces, by_trace) -> None:
    from ror_annotate.segment import Segmenter

    segmenter = Segmenter()
    ours_cache = {}
    per_labeler = collections.defaultdict(lambda: ([], []))
    for (labeler, tid), segs in by_trace.items():
        text = traces[tid]["trace"]
        if tid not in ours_cache:
            our_segs = segmenter.segment(text, tid)
            preds = classify_trace(traces[tid]["problem"], our_segs)
            arr = np.full(len(text), -1)
            for s, (p, _) in zip(our_segs, preds):
                arr[s.char_start:s.char_end] = BEHAVIORS.index(p)
            ours_cache[tid] = arr
        ours = ours_cache[tid]
        theirs = np.full(len(text), -1)
        for r in segs:
            theirs[r["char_start"]:r["char_end"]] = BEHAVIORS.index(r["label_six"])
        nonspace = np.array([not c.isspace() for c in text])
        both = nonspace & (ours >= 0) & (theirs >= 0)
        per_labeler[labeler][0].extend(ours[both].tolist())
        per_labeler[labeler][1].extend(theirs[both].tolist())
    print(f"\ncharacter level on our segmentation\n{'labeler':55s} {'chars':>8s} {'kappa':>7s}")
    for labeler, (o, t) in sorted(per_labeler.items()):
        print(f"{labeler:55s} {len(o):8d} {cohen_kappa_score(o, t):7.3f}")


if __name__ == "__main__":
    main()

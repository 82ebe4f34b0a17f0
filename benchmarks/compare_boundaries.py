"""Compare our segment boundaries with the segmentations other judges made of the same traces.

Reads ``../shared/data/traces.jsonl`` (field ``trace``) and ``labeled_segments.jsonl``
(``trace_id, char_start, char_end, labeler, source_repo``), segments every trace that has
labeled segments with :class:`ror_annotate.segment.Segmenter`, and prints boundary
precision / recall / F1 per (source repository, labeler).

A *boundary* is a segment start moved forward past whitespace. The first boundary of each
covered range is dropped (every segmentation has it), and our boundaries are only counted
inside the range a source covered (some sources segmented only a prefix of the trace).
A boundary matches when the other segmentation has one at the same character (``exact``) or
within +-2 characters (``tol2``); precision = matched ours / ours, recall = matched theirs /
theirs, F1 their harmonic mean (the usual boundary-detection scoring, e.g. the
segmentation-evaluation literature's "boundary similarity with tolerance").

``--half dev|test`` keeps the traces whose SHA-256 of the trace id is even (``dev``) or odd
(``test``): rules are tuned on ``dev`` and reported on ``test`` (ror-clause-v4 and ror-clause-v5 were; a round-5 candidate was measured once and not adopted). ``--errors N``
prints, per source, the N most common kinds of miss (their boundary, not ours) and false split
(ours, not theirs), a kind being the character before the boundary, whether a line end lies
between, and the next word, with a few example contexts. ``--per-trace N`` prints, per source, the N
traces with the most errors and the share of all errors they hold: where a few traces hold most of
them, the reference's own style varies by trace (one trace splits every "If ..., then", the next
never does), which no rule can follow.

Usage::

    python benchmarks/compare_boundaries.py [--data DIR] [--tokenizer PATH] [--half dev|test|all] [--errors N] [--per-trace N] [--digits N]
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import re
import os
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The shared data folder: $ROR_SHARED_DIR, else ../shared next to the repository.
SHARED = Path(os.environ.get("ROR_SHARED_DIR", REPO.parent / "shared"))
sys.path.insert(0, str(REPO))

from ror_annotate.segment import Segmenter  # noqa: E402
from ror_annotate.tokenizer import make_token_counter  # noqa: E402


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _matched(mine: list[int], theirs: list[int], tol: int) -> int:
    """How many of ``mine`` have a boundary of ``theirs`` (sorted) within ``tol`` characters."""
    hits = 0
    for b in mine:
        i = bisect.bisect_left(theirs, b - tol)
        if i < len(theirs) and theirs[i] <= b + tol:
            hits += 1
    return hits


def in_half(trace_id: str, half: str) -> bool:
    """Whether ``trace_id`` is in ``half``: ``dev`` (even SHA-256 of the id), ``test`` (odd) or ``all``."""
    if half == "all":
        return True
    odd = int(hashlib.sha256(trace_id.encode("utf-8")).hexdigest(), 16) % 2 == 1
    return odd == (half == "test")


def _kind(text: str, b: int) -> str:
    """``'<char before>' <NL|SP> <next word>`` of a boundary at ``b``."""
    j = b - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    nxt = re.match(r"\S{1,12}", text[b:])
    gap = "NL" if any(c in "\r\n" for c in text[j + 1:b]) else "SP"
    before = repr(text[j]) if j >= 0 else "^"
    return f"{before} {gap} {nxt.group(0).lower() if nxt else ''}"


def _context(text: str, b: int) -> str:
    return (text[max(0, b - 40):b] + " ‖ " + text[b:b + 30]).replace("\r", "⏎").replace("\n", "⏎")


def _prf(tp_p: int, n_p: int, tp_r: int, n_r: int) -> tuple[float, float, float]:
    p = tp_p / n_p if n_p else float("nan")
    r = tp_r / n_r if n_r else float("nan")
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=SHARED / "data", help="folder with traces.jsonl and labeled_segments.jsonl")
    ap.add_argument("--tokenizer", default=None, help="tokenizer for the cap (default: the approximation)")
    ap.add_argument("--half", choices=("dev", "test", "all"), default="all", help="traces by the parity of their id's SHA-256 (default all)")
    ap.add_argument("--errors", type=int, default=0, metavar="N", help="print the N most common kinds of miss and false split")
    ap.add_argument("--per-trace", type=int, default=0, metavar="N", help="print the N traces with the most errors per source, and their share")
    ap.add_argument("--digits", type=int, default=3, metavar="N", help="decimals of P, R and F1 (default 3; 4 tells 0.9495 from 0.9502)")
    args = ap.parse_args(argv)

    traces = {}
    with open(args.data / "traces.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            traces[row["trace_id"]] = row["trace"]
    theirs: dict[tuple[str, str], dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    with open(args.data / "labeled_segments.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["char_start"] is None or row["trace_id"] not in traces or not in_half(row["trace_id"], args.half):
                continue
            source = (row["source_repo"], row["labeler"])
            theirs[source][row["trace_id"]].append((row["char_start"], row["char_end"]))

    segmenter = Segmenter(token_counter=make_token_counter(args.tokenizer))
    ours: dict[str, list[tuple[int, int]]] = {}
    for spans in theirs.values():
        for trace_id in spans:
            if trace_id not in ours:
                ours[trace_id] = [(s.char_start, s.char_end) for s in segmenter.segment(traces[trace_id], trace_id)]

    header = f"{'source':<40} {'labeler':<34} {'traces':>6} {'theirs':>7} {'ours':>7} {'chars/seg t|o':>14}  {'P':>5} {'R':>5} {'F1':>5}  {'P±2':>5} {'R±2':>5} {'F1±2':>5}"
    print(f"segmenter {segmenter.name}, token counter {segmenter.token_counter.name}, traces: {args.half}")
    errors: dict[tuple[str, str], tuple[Counter[str], Counter[str], dict[str, str]]] = {}
    per_trace_errors: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)  # (misses, false splits, trace)
    print(header)
    print("-" * len(header))
    for (repo, labeler), per_trace in sorted(theirs.items()):
        counts = {"n_t": 0, "n_o": 0, "e_o": 0, "e_t": 0, "t_o": 0, "t_t": 0}
        len_t, len_o = [], []
        for trace_id, spans in per_trace.items():
            text = traces[trace_id]
            spans.sort()
            lo, hi = _skip_ws(text, spans[0][0]), max(e for _, e in spans)
            b_t = sorted({_skip_ws(text, s) for s, _ in spans} - {lo})
            mine = [(s, e) for s, e in ours[trace_id] if lo <= s < hi]
            b_o = sorted({s for s, _ in mine} - {lo})
            len_t += [e - s for s, e in spans]
            len_o += [e - s for s, e in mine]
            counts["n_t"] += len(b_t)
            counts["n_o"] += len(b_o)
            counts["e_o"] += _matched(b_o, b_t, 0)
            counts["e_t"] += _matched(b_t, b_o, 0)
            counts["t_o"] += _matched(b_o, b_t, 2)
            counts["t_t"] += _matched(b_t, b_o, 2)
            per_trace_errors[(repo, labeler)].append((len(set(b_t) - set(b_o)), len(set(b_o) - set(b_t)), trace_id))
            if args.errors:
                miss, false, example = errors.setdefault((repo, labeler), (Counter(), Counter(), {}))
                for b in sorted(set(b_t) - set(b_o)):
                    miss[k := _kind(text, b)] += 1
                    example.setdefault("miss " + k, _context(text, b))
                for b in sorted(set(b_o) - set(b_t)):
                    false[k := _kind(text, b)] += 1
                    example.setdefault("false " + k, _context(text, b))
        p, r, f = _prf(counts["e_o"], counts["n_o"], counts["e_t"], counts["n_t"])
        p2, r2, f2 = _prf(counts["t_o"], counts["n_o"], counts["t_t"], counts["n_t"])
        med = f"{statistics.median(len_t):.0f}|{statistics.median(len_o):.0f}"
        scores = "  ".join(" ".join(f"{x:5.{args.digits}f}" for x in trio) for trio in ((p, r, f), (p2, r2, f2)))
        print(f"{repo:<40} {labeler[:34]:<34} {len(per_trace):>6} {counts['n_t']:>7} {counts['n_o']:>7} {med:>14}  {scores}")
    print("chars/seg: median segment length in characters, theirs|ours, over the covered ranges.")
    if args.per_trace:
        for (repo, labeler), rows in sorted(per_trace_errors.items()):
            rows.sort(key=lambda r: -(r[0] + r[1]))
            total = sum(m + f for m, f, _ in rows) or 1
            top = rows[: args.per_trace]
            share = sum(m + f for m, f, _ in top) / total
            print(f"\n{repo} {labeler}: the {len(top)} of {len(rows)} traces with the most errors hold {share:.0%} of them (misses, false splits)")
            for m, f, trace_id in top:
                print(f"  {m:5} {f:5}  {trace_id}")
    for (repo, labeler), (miss, false, example) in sorted(errors.items()):
        for name, kinds in (("misses (theirs, not ours)", miss), ("false splits (ours, not theirs)", false)):
            print(f"\n{repo} {labeler}: {sum(kinds.values())} {name}, the {args.errors} most common kinds")
            for k, n in kinds.most_common(args.errors):
                print(f"  {n:5}  {k:<30} e.g. {example[('miss ' if name.startswith('misses') else 'false ') + k]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

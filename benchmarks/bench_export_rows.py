"""Row building of the ``segments`` configuration: the column table (export/columns.py) vs a hand-written dict per row.

The export builds each row from one declared column table (:data:`ror_annotate.export.columns.COLUMNS`):
a row context per segment, then per column ``encode([value(row) for row in rows])``. The baseline is the
code it replaced, written out here: one dict literal per segment, appended column by column, then
``pyarrow.array`` per column. Both build the same Arrow table (checked); the script prints seconds per
100,000 segments and the ratio, measured in the same run (best of ``--repeat``).

Usage::

    python benchmarks/bench_export_rows.py [--segments 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import pyarrow as pa

from ror_annotate.export.columns import BEHAVIOR_ID, COLUMNS, Rows, SegmentRow
from ror_annotate.export.labels import ChosenLabel
from ror_annotate.records import BEHAVIORS

_TYPED = {
    "label_distribution": pa.list_(pa.float32()),
    "raters": pa.list_(pa.struct([("annotator", pa.string()), ("kind", pa.string()), ("label", pa.int64())])),
}


def _dict_row(s, c, t, al, i, n_tokens, tv, raters, verified):  # the code before the column table
    has_tokens = al is not None and al.token_start[i] >= 0
    return {
        "trace_id": s.trace_id, "segment_index": s.segment_index, "text": s.text, "char_start": s.char_start,
        "char_end": s.char_end, "token_start": int(al.token_start[i]) if has_tokens else None,
        "token_end": int(al.token_end[i]) if has_tokens else None, "n_tokens": n_tokens,
        "label": BEHAVIOR_ID[c.label] if c.label else None, "label_source": c.source, "annotator": c.annotator,
        "n_votes": c.n_votes, "vote_share": c.vote_share, "codebook_version": c.codebook_version,
        "judge_model": c.judge_model, "prompt_template_hash": c.prompt_template_hash,
        "label_confidence": c.confidence if c.label else None,
        "label_distribution": list(c.distribution) if c.label and c.distribution is not None else None,
        "raters": raters, "human_verified": verified, "tool_version": tv,
        "dataset": t.dataset, "model": t.model,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--segments", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.segments
    t = SimpleNamespace(trace_id="t", dataset="d", model="m")
    segs = [SimpleNamespace(trace_id=f"t{i // 150}", segment_index=i % 150, text="Let me add them.", char_start=i, char_end=i + 16,
                            n_tokens=5) for i in range(n)]
    chosen = [ChosenLabel(BEHAVIORS[i % 6], "aggregate", "aggregate:dawid-skene", 1, None, "cb", None, None, 0.8,
                          (0.8, 0.2, 0.0, 0.0, 0.0, 0.0)) for i in range(n)]
    raters = [{"annotator": "openai:A", "kind": "machine", "label": i % 6} for i in range(n)]
    names = [c.name for c in COLUMNS["segments"]]

    def old() -> pa.Table:
        cols: dict[str, list] = {k: [] for k in names}
        for i in range(n):
            for k, v in _dict_row(segs[i], chosen[i], t, None, i, 5, "v", [raters[i]], True).items():
                cols[k].append(v)
        return pa.table({k: pa.array(v, type=_TYPED.get(k)) for k, v in cols.items()})

    def new() -> pa.Table:
        rows = Rows()
        for i in range(n):
            rows.add("segments", "train", SegmentRow(segs[i], chosen[i], t, None, i, 5, "v", [raters[i]], True))
        ((_, _, table),) = rows.tables()
        return table

    assert old().equals(new()), "the two builders disagree"
    best = {}
    for name, fn in (("dict per row (before)", old), ("column table (now)", new)):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[name] = min(times)
    base = best["dict per row (before)"]
    for name, sec in best.items():
        print(f"{name:24s} {sec / n * 1e5:6.3f} s per 100k segments   ratio {sec / base:.2f}")


if __name__ == "__main__":
    main()

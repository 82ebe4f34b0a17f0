"""Benchmark: aggregation of N segments x 5 raters, ours vs crowd-kit's plain ``DawidSkene`` call.

Simulated raters of accuracy 0.85 ... 0.60 label N segments (5% of labels missing). Each part runs
in its own fresh process, which reports its wall time and its peak resident memory (``ru_maxrss``,
the whole process: Python, numpy and the data):

* ``ours-ds``: :func:`ror_annotate.aggregate.dawid_skene` (numpy EM over distinct response patterns)
  plus majority vote, on the encoded long table;
* ``crowdkit-ds``: crowd-kit 1.4.2 ``DawidSkene(n_iter=100).fit_predict_proba`` on the same rows as a
  pandas DataFrame (the baseline; ``--reference-segments`` caps its size, default N);
* ``store`` (with ``--store-segments M``): ``pipeline.aggregate`` end to end on a store holding M
  segments x 5 raters (read each rater's latest labels, fit, write M aggregate labels and the
  declaration); building that store is not timed.

Prints one line per part and the ratio crowd-kit / ours; the posteriors of ours and crowd-kit are
compared (max abs difference) when both ran at the same size.

    python benchmarks/bench_aggregate.py [--segments 1000000] [--reference-segments N] [--store-segments 0]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ACCURACY = (0.85, 0.75, 0.7, 0.65, 0.6)
K = 6


def simulate(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tasks, workers, labels) rows: 5 raters, 5% missing, errors to a confused class or uniform."""
    rng = np.random.default_rng(seed)
    truth = rng.choice(K, n, p=[0.15, 0.35, 0.1, 0.1, 0.2, 0.1])
    confused = np.array([4, 2, 1, 1, 0, 2])
    tasks, workers, labels = [], [], []
    for w, acc in enumerate(ACCURACY):
        keep = rng.random(n) >= 0.05
        lab = np.where(rng.random(n) < acc, truth, np.where(rng.random(n) < 0.6, confused[truth], rng.integers(0, K, n)))
        idx = np.flatnonzero(keep)
        tasks.append(idx)
        workers.append(np.full(len(idx), w))
        labels.append(lab[idx])
    return np.concatenate(tasks), np.concatenate(workers), np.concatenate(labels)


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def part_ours(n: int, out: Path | None) -> dict:
    from ror_annotate.aggregate import dawid_skene

    tasks, workers, labels = simulate(n)
    n_tasks = int(tasks.max()) + 1
    t0 = time.perf_counter()
    probas, iterations = dawid_skene(tasks, workers, labels, n_tasks, len(ACCURACY), K)
    votes = np.bincount(tasks * K + labels, minlength=n_tasks * K).reshape(n_tasks, K)
    _ = votes / votes.sum(axis=1, keepdims=True)
    seconds = time.perf_counter() - t0
    if out is not None:
        np.save(out, probas)
    return {"seconds": seconds, "iterations": iterations}


def part_crowdkit(n: int, out: Path | None) -> dict:
    import warnings

    import pandas as pd
    from crowdkit.aggregation import DawidSkene

    tasks, workers, labels = simulate(n)
    frame = pd.DataFrame({"task": tasks, "worker": workers, "label": labels})
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = DawidSkene(n_iter=100)
        probas = ds.fit_predict_proba(frame)
    seconds = time.perf_counter() - t0
    if out is not None:
        np.save(out, probas.reindex(index=range(int(tasks.max()) + 1), columns=range(K), fill_value=0.0).to_numpy())
    return {"seconds": seconds, "iterations": len(ds.loss_history_)}


def part_store(n: int, out: Path | None) -> dict:
    from ror_annotate import pipeline
    from ror_annotate.records import BEHAVIORS, Label, Segment, Trace
    from ror_annotate.store import Store

    tasks, workers, labels = simulate(n)
    per_trace = 200
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.duckdb")
        n_traces = (n + per_trace - 1) // per_trace
        traces = [Trace(trace_id=f"t{t:06d}", text="x " * per_trace) for t in range(n_traces)]
        store.upsert_traces(traces)
        for t in range(n_traces):
            m = min(per_trace, n - t * per_trace)
            store.replace_segments(f"t{t:06d}", [Segment(trace_id=f"t{t:06d}", segment_index=i, char_start=2 * i, char_end=2 * i + 1,
                                                         text="x", n_tokens=1) for i in range(m)],
                                   segmenter="bench", token_counter="bench")
        order = np.argsort(tasks, kind="stable")
        batch: list[Label] = []
        for r in order:
            t = int(tasks[r])
            batch.append(Label(trace_id=f"t{t // per_trace:06d}", segment_index=t % per_trace, label=BEHAVIORS[labels[r]],
                               source="judge", annotator=f"sim-{workers[r]}", codebook_version="bench"))
            if len(batch) >= 200_000:
                store.upsert_labels(batch)
                batch = []
        store.upsert_labels(batch)
        del batch
        store.checkpoint()
        t0 = time.perf_counter()
        summary = pipeline.aggregate(store, {"method": "dawid-skene"})
        seconds = time.perf_counter() - t0
        store.close()
    return {"seconds": seconds, "iterations": summary.iterations, "labels_written": summary.labels_written}


PARTS = {"ours-ds": part_ours, "crowdkit-ds": part_crowdkit, "store": part_store}


def run_part(name: str, n: int, out: Path | None) -> dict:
    cmd = [sys.executable, __file__, "--part", name, "--segments", str(n)] + (["--out", str(out)] if out else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=1_000_000)
    ap.add_argument("--reference-segments", type=int, default=None, help="segments for crowd-kit (default: --segments)")
    ap.add_argument("--store-segments", type=int, default=0, help="also time pipeline.aggregate on a store of this many segments")
    ap.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        result = PARTS[args.part](args.segments, args.out)
        result["peak_mib"] = peak_mib()
        print(json.dumps(result))
        return
    ref_n = args.reference_segments or args.segments
    with tempfile.TemporaryDirectory() as tmp:
        ours_path, ref_path = Path(tmp) / "ours.npy", Path(tmp) / "ref.npy"
        ours = run_part("ours-ds", args.segments, ours_path)
        print(f"ours (numpy EM + majority vote), {args.segments:,} segments x {len(ACCURACY)} raters: "
              f"{ours['seconds']:.2f} s, {ours['iterations']} EM iterations, peak RSS {ours['peak_mib']:.0f} MiB")
        ref = run_part("crowdkit-ds", ref_n, ref_path)
        print(f"crowd-kit DawidSkene, {ref_n:,} segments x {len(ACCURACY)} raters: "
              f"{ref['seconds']:.2f} s, {ref['iterations']} EM iterations, peak RSS {ref['peak_mib']:.0f} MiB")
        if ref_n == args.segments:
            diff = float(np.abs(np.load(ours_path) - np.load(ref_path)).max())
            print(f"ratio crowd-kit / ours: {ref['seconds'] / ours['seconds']:.1f}x time; max |posterior difference| {diff:.1e}")
        else:
            small = run_part("ours-ds", ref_n, None)
            print(f"ours at {ref_n:,}: {small['seconds']:.2f} s; ratio crowd-kit / ours at that size: {ref['seconds'] / small['seconds']:.1f}x")
    if args.store_segments:
        st = run_part("store", args.store_segments, None)
        print(f"pipeline.aggregate end to end (store read + fit + write), {args.store_segments:,} segments x {len(ACCURACY)} raters: "
              f"{st['seconds']:.2f} s, peak RSS {st['peak_mib']:.0f} MiB (store build included in the peak, not in the time)")


if __name__ == "__main__":
    main()

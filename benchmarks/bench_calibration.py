"""Benchmark: calibration (ECE, Brier, bins) with a trace-level bootstrap, ours vs resampling items explicitly.

Ours: :func:`ror_annotate.agreement.calibration_error` on ``--items`` labels with a confidence
(traces of ~240 segments), ``--resamples`` trace bootstraps, computed as ``counts @ per-trace sums``.
Reference: each resample written out explicitly (the drawn traces' items gathered with
``np.concatenate``, ECE and Brier recomputed with ``np.bincount``), timed on
``--reference-resamples`` resamples and extrapolated linearly (printed as such); the ratio is
reference / ours. Also times the weighted (Hajek) figures of a designed study of ``--reviewed``
items with the same number of resamples. Only the numeric core is timed, not reading labels from a
store.

    python benchmarks/bench_calibration.py [--items 1000000] [--resamples 1000] [--reviewed 20000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def reference_resample(conf: np.ndarray, correct: np.ndarray, members: list[np.ndarray], draw: np.ndarray, n_bins: int) -> tuple[float, float]:
    idx = np.concatenate([members[t] for t in draw])
    c, y = conf[idx], correct[idx]
    b = np.clip(np.ceil(np.round(c * n_bins, 9)).astype(np.int64) - 1, 0, n_bins - 1)
    gap = np.abs(np.bincount(b, weights=y, minlength=n_bins) - np.bincount(b, weights=c, minlength=n_bins)).sum()
    return gap / len(idx), float(((c - y) ** 2).mean())


def main() -> None:
    from ror_annotate.agreement import calibration_error, trace_bootstrap_counts
    from ror_annotate.agreement.weighted import _rater_figures

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--reference-resamples", type=int, default=20)
    ap.add_argument("--reviewed", type=int, default=20_000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = args.items
    n_traces = max(1, n // 240)
    groups = rng.integers(0, n_traces, n)
    conf = rng.beta(5, 2, n)
    correct = rng.random(n) < conf
    t0 = time.perf_counter()
    res = calibration_error(conf, correct, groups=groups, n_resamples=args.resamples)
    ours = time.perf_counter() - t0
    print(f"ours: calibration of {n:,} labels, {n_traces:,} traces, {args.resamples} trace bootstraps: {ours:.2f} s "
          f"(ECE {res['ece']['value']:.4f} [{res['ece']['ci_low']:.4f}, {res['ece']['ci_high']:.4f}])")
    order = np.argsort(groups, kind="stable")
    members = np.split(order, np.cumsum(np.bincount(groups, minlength=n_traces))[:-1])
    draws = trace_bootstrap_counts(n_traces, n_resamples=args.reference_resamples, seed=1)
    t0 = time.perf_counter()
    for counts in draws:
        reference_resample(conf, correct, members, np.repeat(np.arange(n_traces), counts), 10)
    ref = (time.perf_counter() - t0) / max(1, args.reference_resamples) * args.resamples
    print(f"reference (explicit resamples, {args.reference_resamples} run, extrapolated to {args.resamples}): {ref:.2f} s; "
          f"ratio reference / ours: {ref / ours:.1f}x")

    m = args.reviewed
    q = 6
    traces = max(1, m // 15)
    g = rng.integers(0, traces, m)
    r = rng.integers(0, q, m)
    a = np.where(rng.random(m) < 0.8, r, rng.integers(0, q, m))
    w = np.where(rng.random(m) < 0.75, 1.0, 40.0)
    boot = trace_bootstrap_counts(traces, n_resamples=args.resamples, seed=0).astype(np.float64)
    t0 = time.perf_counter()
    figs = _rater_figures(r, a, w, g, traces, boot, 0.95)
    print(f"ours: weighted accuracy / kappa / macro-F1 of one rater on {m:,} reviewed items, {traces:,} traces, "
          f"{args.resamples} bootstraps: {time.perf_counter() - t0:.2f} s (accuracy {figs['accuracy']['value']:.4f})")


if __name__ == "__main__":
    main()

"""Benchmark: agreement with a trace-level bootstrap, ours (vectorized) vs looping the references.

Prints our wall time for every statistic (segment- and token-weighted, pairwise kappas, per-class
vs majority) with ``--resamples`` trace-level bootstrap resamples, and the time of computing
Krippendorff's alpha (``krippendorff`` package) and the pairwise Cohen's kappas (scikit-learn) on
the same resamples written out explicitly. The reference is timed on a subset of resamples and
extrapolated linearly (printed as such); the ratio is reference / ours.

    python benchmarks/bench_agreement.py [--items 100000] [--annotators 3] [--resamples 1000]
"""

from __future__ import annotations

import argparse
import time
from itertools import combinations

import numpy as np


def make_ratings(n_items: int, n_annotators: int, seed: int = 0):
    from ror_annotate.agreement import Ratings
    from ror_annotate.records import BEHAVIORS

    rng = np.random.default_rng(seed)
    q = len(BEHAVIORS)
    # traces of ~240 segments (the method's corpus average)
    n_traces = max(1, n_items // 240)
    groups = rng.integers(0, n_traces, n_items)
    truth = rng.integers(0, q, n_items)
    codes = np.where(rng.random((n_items, n_annotators)) < 0.3, rng.integers(0, q, (n_items, n_annotators)), truth[:, None])
    codes = np.where(rng.random((n_items, n_annotators)) < 0.05, -1, codes)
    tokens = rng.integers(3, 48, n_items).astype(float)
    return Ratings(codes, BEHAVIORS, tuple(f"a{j}" for j in range(n_annotators)), tuple(map(str, range(n_items))),
                   groups.astype(np.int64), tuple(f"t{g}" for g in range(n_traces)), tokens)


def reference_loop(r, draws: np.ndarray) -> None:
    import krippendorff
    from sklearn.metrics import cohen_kappa_score

    members = [np.flatnonzero(r.groups == g) for g in range(len(r.group_ids))]
    for counts in draws:
        rows = np.concatenate([members[g] for g in range(len(members)) for _ in range(counts[g])])
        data = r.codes[rows].astype(float)
        data[data < 0] = np.nan
        krippendorff.alpha(reliability_data=data.T, level_of_measurement="nominal", value_domain=list(range(r.n_categories)))
        for i, j in combinations(range(r.n_annotators), 2):
            both = ~np.isnan(data[:, i]) & ~np.isnan(data[:, j])
            cohen_kappa_score(data[both, i], data[both, j], labels=list(range(r.n_categories)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--annotators", type=int, default=3)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--reference-resamples", type=int, default=10, help="resamples actually run for the reference loop")
    args = ap.parse_args()

    from ror_annotate.agreement import agreement, trace_bootstrap_counts

    r = make_ratings(args.items, args.annotators)
    print(f"data: {r.n_items} items x {r.n_annotators} annotators, {len(r.group_ids)} traces, {r.n_categories} categories")
    t0 = time.perf_counter()
    res = agreement(r, n_resamples=args.resamples, seed=0, reference="majority")
    ours = time.perf_counter() - t0
    alpha = res.statistics["segment"]["krippendorff_alpha"]
    print(f"ours: {ours:.2f} s for {args.resamples} trace-level resamples, all statistics, segment- and token-weighted "
          f"(alpha {alpha.value:.4f} [{alpha.ci_low:.4f}, {alpha.ci_high:.4f}])")

    draws = trace_bootstrap_counts(len(r.group_ids), n_resamples=args.reference_resamples, seed=0)
    t0 = time.perf_counter()
    reference_loop(r, draws)
    ref_sub = time.perf_counter() - t0
    ref_full = ref_sub / args.reference_resamples * args.resamples
    print(f"reference (krippendorff.alpha + sklearn cohen_kappa_score per pair, segment-weighted only): "
          f"{ref_sub:.2f} s for {args.reference_resamples} resamples -> extrapolated {ref_full:.1f} s for {args.resamples}")
    print(f"ratio reference / ours: {ref_full / ours:.0f}x")


if __name__ == "__main__":
    main()

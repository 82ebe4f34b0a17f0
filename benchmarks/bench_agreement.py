"""Benchmark: agreement with a trace-level bootstrap, ours (vectorized) vs looping the references.

Prints our wall time for every statistic (segment- and token-weighted, pairwise kappas, per-class
vs majority) with ``--resamples`` trace-level bootstrap resamples, and the time of computing
Krippendorff's alpha (``krippendorff`` package) and the pairwise Cohen's kappas (scikit-learn) on
the same resamples written out explicitly. The reference is timed on a subset of resamples and
extrapolated linearly (printed as such); the ratio is reference / ours.

    python benchmarks/bench_agreement.py [--items 100000] [--annotators 3] [--resamples 1000]
    python benchmarks/bench_agreement.py --items 1000000 --annotators 5 --against ../_base --reference-resamples 0

``--against TREE`` also times :func:`agreement` as another checkout (an old worktree of main) has it,
in a child process on the same data and seed, prints the ratio and checks that every point estimate,
interval and bootstrap replicate agrees to 1e-12. Peak RSS of each side is its own process's
(``--isolated`` runs ours in a child too).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from itertools import combinations

from pathlib import Path

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


def time_agreement(n_items: int, n_annotators: int, resamples: int, dump: str | None = None) -> dict:
    """Time :func:`agreement` on :func:`make_ratings` data; optionally save every number to ``dump`` (.npz)."""
    import resource

    from ror_annotate.agreement import agreement

    r = make_ratings(n_items, n_annotators)
    t0 = time.perf_counter()
    res = agreement(r, n_resamples=resamples, seed=0, reference="majority")
    seconds = time.perf_counter() - t0
    alpha = res.statistics["segment"]["krippendorff_alpha"]
    if dump:
        numbers = {k: np.asarray(v, dtype=float) for k, v in res.resamples.items()}
        for weighting, block in res.statistics.items():
            for name, est in block.items():
                if hasattr(est, "value"):
                    numbers[f"{weighting}/{name}/point"] = np.array([est.value, est.ci_low, est.ci_high])
        np.savez(dump, **numbers)
    return {"seconds": seconds, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "alpha": [alpha.value, alpha.ci_low, alpha.ci_high], "n_traces": len(r.group_ids)}


def in_child(root: Path, args: argparse.Namespace, dump: str) -> dict:
    """:func:`time_agreement` in a child process importing ``ror_annotate`` from ``root``."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]); import bench_agreement as b; "
            "print(json.dumps(b.time_agreement(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])))")
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", code, str(root), str(Path(__file__).parent), str(args.items), str(args.annotators),
                          str(args.resamples), dump], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--annotators", type=int, default=3)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--reference-resamples", type=int, default=10, help="resamples actually run for the reference loop (0: skip it)")
    ap.add_argument("--against", type=Path, default=None, metavar="TREE", help="also time an old checkout's agreement() and compare numbers")
    ap.add_argument("--isolated", action="store_true", help="time ours in a child process as well (its own peak RSS)")
    args = ap.parse_args()

    from ror_annotate.agreement import trace_bootstrap_counts

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        ours_dump = os.path.join(tmp, "ours.npz")
        ours = in_child(root, args, ours_dump) if args.isolated or args.against else time_agreement(
            args.items, args.annotators, args.resamples, ours_dump)
        print(f"data: {args.items} items x {args.annotators} annotators, {ours['n_traces']} traces")
        a = ours["alpha"]
        print(f"ours: {ours['seconds']:.2f} s, peak RSS {ours['peak_rss_mib']:.0f} MiB for {args.resamples} trace-level resamples, "
              f"all statistics, segment- and token-weighted (alpha {a[0]:.4f} [{a[1]:.4f}, {a[2]:.4f}])")
        if args.against is not None:
            theirs_dump = os.path.join(tmp, "theirs.npz")
            theirs = in_child(args.against.resolve(), args, theirs_dump)
            x, y = np.load(ours_dump), np.load(theirs_dump)
            same_keys = set(x.files) == set(y.files)
            worst = max((float(np.nanmax(np.abs(x[k] - y[k]), initial=0.0)) for k in x.files if k in y.files), default=float("nan"))
            nan_same = all(np.array_equal(np.isnan(x[k]), np.isnan(y[k])) for k in x.files if k in y.files)
            print(f"against {args.against}: {theirs['seconds']:.2f} s, peak RSS {theirs['peak_rss_mib']:.0f} MiB; "
                  f"speed-up {theirs['seconds'] / ours['seconds']:.2f}x")
            print(f"numbers: {len(x.files)} arrays, same keys {same_keys}, same undefined entries {nan_same}, "
                  f"largest absolute difference {worst:.2e} ({'within' if worst <= 1e-12 and same_keys and nan_same else 'NOT within'} 1e-12)")
    if args.reference_resamples <= 0:
        return
    r = make_ratings(args.items, args.annotators)
    draws = trace_bootstrap_counts(len(r.group_ids), n_resamples=args.reference_resamples, seed=0)
    t0 = time.perf_counter()
    reference_loop(r, draws)
    ref_sub = time.perf_counter() - t0
    ref_full = ref_sub / args.reference_resamples * args.resamples
    print(f"reference (krippendorff.alpha + sklearn cohen_kappa_score per pair, segment-weighted only): "
          f"{ref_sub:.2f} s for {args.reference_resamples} resamples -> extrapolated {ref_full:.1f} s for {args.resamples}")
    print(f"ratio reference / ours: {ref_full / ours['seconds']:.0f}x")


if __name__ == "__main__":
    main()

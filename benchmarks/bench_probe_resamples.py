"""``ror probe --label-resamples N``: the refits of main (one ``fit_probe`` per row and resample) vs
:func:`ror_annotate.steer.probe.refit_resamples` as ``run_probes`` calls it now, measured in the same run.

Runs :func:`run_probes` once on an export and its capture (the README's tiny-model sequence:
``ror run``, ``ror tiny-model``, ``ror export --tokenizer``, ``ror capture``), with ``--resamples`` label
draws from a confusion matrix putting ``--keep`` on the stored label and the rest uniformly on the
other five. For every reported row, each resample is refitted twice on the same features and C:

- main: the code before this change, ``fit_probe(..., Cs=(C,))`` per resample (a fresh scaler +
  lbfgs from zeros on every token row);
- new: ``refit_resamples`` (features scaled once; the TF-IDF control on one row per segment weighted
  by its tokens; with ``--warm-start``, lbfgs started from the stored-label fit).

Prints CPU seconds of this process (``time.process_time``: all threads) per row and in total, the
ratio main / new, the CPU seconds per resample of each, and the largest |new - main| test macro-F1
over rows and resamples (both stop at lbfgs tol 1e-4 or 500 iterations).

    python benchmarks/bench_probe_resamples.py --export exports/sample_traces --capture cap/ --resamples 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", required=True, help="Export directory (its tokens/ and segments/).")
    ap.add_argument("--capture", required=True)
    ap.add_argument("--resamples", type=int, default=3)
    ap.add_argument("--keep", type=float, default=0.8, help="P(true = stored label) of the confusion matrix.")
    ap.add_argument("--max-train", type=int, default=50_000)
    ap.add_argument("--controls", default="position,tfidf")
    ap.add_argument("--warm-start", action="store_true", help="Also start lbfgs from the stored-label fit.")
    args = ap.parse_args()

    from ror_annotate.errors import SteerError
    from ror_annotate.records import BEHAVIORS
    from ror_annotate.steer import probe
    from ror_annotate.steer.capture import Capture
    from ror_annotate.steer.noise import draw_labels
    from ror_annotate.steer.table import labeled_tokens
    from ror_annotate.steer.tokens import load_tokens

    cap = Capture(args.capture)
    table = labeled_tokens(cap, load_tokens(args.export))
    off = (1 - args.keep) / (len(BEHAVIORS) - 1)
    matrix = np.full((len(BEHAVIORS), len(BEHAVIORS)), off) + np.eye(len(BEHAVIORS)) * (args.keep - off)
    with tempfile.TemporaryDirectory() as tmp:  # the stored labels only: this confusion matrix gives the noise
        conf = Path(tmp) / "confusion.json"
        conf.write_text(json.dumps({"behaviors": list(BEHAVIORS), "matrix": matrix.tolist()}), encoding="utf-8")
        draws = draw_labels(table, None, resamples=args.resamples, confusion=str(conf), seed=0)

    warm_refit = probe.refit_resamples
    timings: list[tuple[int, float, float, float]] = []

    def cold_refit(x_train, y_stored, x_test, y_train_draws, y_test_draws, *, C, seed=0, **_):
        """main's loop: fit_probe per resample (the dev split is not scored here; C is fixed)."""
        f1 = np.full(len(y_train_draws), np.nan)
        for r in range(len(y_train_draws)):
            try:
                f1[r] = probe.fit_probe(x_train, y_train_draws[r], x_test[:1], y_test_draws[r][:1], x_test, y_test_draws[r],
                                        Cs=(C,), seed=seed).test_f1
            except SteerError:
                pass
        return f1

    def both(x_train, y_stored, x_test, y_train_draws, y_test_draws, **kw):
        t0 = time.process_time()
        cold = cold_refit(x_train, y_stored, x_test, y_train_draws, y_test_draws, **kw)
        t1 = time.process_time()
        warm, base = warm_refit(x_train, y_stored, x_test, y_train_draws, y_test_draws, warm_start=args.warm_start, **kw)
        t2 = time.process_time()
        diff = float(np.nanmax(np.abs(warm - cold))) if np.isfinite(cold).any() else 0.0
        timings.append((x_train.shape[1], t1 - t0, t2 - t1, diff))
        return warm, base

    probe.refit_resamples = both
    t0 = time.process_time()
    rows, _ = probe.run_probes(cap, table, controls=[c for c in args.controls.split(",") if c], max_train=args.max_train,
                               label_draws=draws)
    total = time.process_time() - t0
    print(f"{len(table):,} labeled tokens (max train {args.max_train:,}), {args.resamples} resamples, "
          f"{len(rows)} reported rows; CPU s of this process")
    print(f"{'row':<40} {'main':>8} {'new':>8} {'ratio':>6} {'max|dF1|':>9}")
    for row, (_, cold, warm, diff) in zip(rows, timings):
        print(f"{row.features + ' ' + row.layers:<40} {cold:8.2f} {warm:8.2f} {cold / max(warm, 1e-9):6.2f} {diff:9.2g}")
    cold_t = sum(t[1] for t in timings)
    warm_t = sum(t[2] for t in timings)
    print(f"{'all rows':<40} {cold_t:8.2f} {warm_t:8.2f} {cold_t / max(warm_t, 1e-9):6.2f} "
          f"{max(t[3] for t in timings):9.2g}")
    print(f"per resample: main {cold_t / args.resamples:.2f} CPU s, new {warm_t / args.resamples:.2f} CPU s; "
          f"the plain probe (no resamples) took {total - cold_t - warm_t:.2f} CPU s")


if __name__ == "__main__":
    main()

"""Cost of ``--label-resamples N`` against the plain figures, measured in the same run.

Synthetic routing with a planted signal (no torch): ``--tokens`` labeled tokens in segments of
``--seg-len``, ``--layers`` MoE layers of ``--experts`` experts, top-``--router-k``, two datasets; every
segment's distribution puts 0.8 on its label. Reports wall seconds of

- experts: :func:`analyze` (risk difference, top-k, profile correlation, permutation null, transfer
  AUC) = the plain run, and :func:`expert_label_noise` with N resamples on top of it;
- probe: :func:`run_probes` on the router layers with the position control, plain and with N
  resamples (one refit per reported row and resample, features computed once);

and the ratio (plain + resamples) / plain. Defaults take about 2 minutes on 2 shared cores.

    python benchmarks/bench_label_noise.py
    python benchmarks/bench_label_noise.py --tokens 400000 --layers 24 --experts 64 --resamples 50
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--seg-len", type=int, default=25)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--router-k", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--resamples", type=int, default=20)
    ap.add_argument("--probe-tokens", type=int, default=5_000, help="Tokens of the probe part (its capture is written).")
    args = ap.parse_args()

    from ror_annotate.records import BEHAVIORS
    from ror_annotate.steer.capture import Capture, CaptureMeta, _Writer
    from ror_annotate.steer.experts import analyze
    from ror_annotate.steer.noise import LabelNoiseOptions, SegmentLabels, draws_for, expert_label_noise
    from ror_annotate.steer.probe import run_probes
    from ror_annotate.steer.table import TokenTable

    rng = np.random.default_rng(0)

    def synthetic(n_tokens: int):
        n_seg = n_tokens // args.seg_len
        labels_seg = rng.integers(0, len(BEHAVIORS), n_seg)
        seg = np.repeat(np.arange(n_seg), args.seg_len)
        logits = rng.normal(size=(len(seg), args.layers, args.experts)).astype(np.float32)
        logits[np.arange(len(seg)), :, labels_seg[seg] % args.experts] += 1.5
        selected = np.argsort(-logits, axis=-1)[..., :args.router_k].astype(np.int16)
        dist = np.full((n_seg, len(BEHAVIORS)), 0.04)
        dist[np.arange(n_seg), labels_seg] = 0.8
        split = np.where(seg % 10 < 8, "train", np.where(seg % 10 == 8, "validation", "test")).astype(object)
        table = TokenTable(rows=np.arange(len(seg)), labels=labels_seg[seg], split=split, dataset=(seg % 2).astype(np.int64),
                           dataset_names=["a", "b"], segment=seg, position=np.arange(len(seg)) % 500,
                           trace_len=np.full(len(seg), 500), token_id=np.zeros(len(seg), np.int64))
        return table, logits, selected, SegmentLabels(np.arange(n_seg), labels_seg, dist)

    table, _, selected, seg = synthetic(args.tokens)
    options = LabelNoiseOptions(resamples=args.resamples, seed=1)
    t0 = time.perf_counter()
    report = analyze(selected, table.labels, table.dataset, table.segment, dataset_names=table.dataset_names,
                     layers=list(range(args.layers)), n_experts=args.experts, k=args.top_k, n_permutations=20)
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    draws = draws_for(seg, options)
    t_draw = time.perf_counter() - t0
    t0 = time.perf_counter()
    expert_label_noise(selected, table, draws, report, n_experts=args.experts, k=args.top_k)
    t_noise = time.perf_counter() - t0
    print(f"experts: {args.tokens:,} tokens, {len(seg.keys):,} segments, {args.layers} layers x {args.experts} experts")
    print(f"  plain analyze (20 permutations)      {t_plain:7.2f} s")
    print(f"  draw {args.resamples} label resamples          {t_draw:7.2f} s")
    print(f"  {args.resamples} resamples of every figure     {t_noise:7.2f} s  "
          f"({t_noise / args.resamples:.3f} s per resample)")
    print(f"  ratio (plain + resamples) / plain     {(t_plain + t_draw + t_noise) / t_plain:7.2f}x")

    ptable, logits, pselected, pseg = synthetic(args.probe_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        meta = CaptureMeta(model="synthetic", family="qwen3_moe", layers=list(range(args.layers)), n_experts=args.experts,
                           top_k=args.router_k, logits_dtype="float32")
        writer = _Writer(Path(tmp) / "cap", meta, overwrite=True)
        writer.append([({"trace_id": "t", "split": "train", "dataset": "a"}, logits, pselected)])
        writer.close()
        cap = Capture(Path(tmp) / "cap")
        t0 = time.perf_counter()
        run_probes(cap, ptable, controls=("position",), max_train=None)
        p_plain = time.perf_counter() - t0
        pdraws = draws_for(pseg, options)
        t0 = time.perf_counter()
        run_probes(cap, ptable, controls=("position",), max_train=None, label_draws=pdraws)
        p_noise = time.perf_counter() - t0
    print(f"probe: {args.probe_tokens:,} tokens, {args.layers} layers (one row) + position control, 4 values of C")
    print(f"  plain run_probes                      {p_plain:7.2f} s")
    print(f"  with {args.resamples} label resamples            {p_noise:7.2f} s")
    print(f"  ratio                                 {p_noise / p_plain:7.2f}x")


if __name__ == "__main__":
    main()

"""Simulation: does a verification pass (``ror verify``) raise a noisy judge's agreement with the truth?

Not a timed test: a quality simulation on the embedded sample traces (MIT, ``ror_annotate.sample``).

* Truth: every segment's label from the offline cue-phrase baseline (``ror_annotate.judge.baseline``),
  taken as the hidden true label.
* A noisy judge: the truth, replaced with probability ``--error-rate`` by a realistic confusion
  (planning <-> reflection, execution <-> fact / restatement, conclusion -> execution ...), stored
  as rater ``openai:noisy-judge``.
* Humans: the truth on a random ``--human-share`` of the traces (rater ``h1``), the reference of
  ``ror verify --report``.
* A verifier (the local OpenAI-compatible server of the tests, driven through the real openai client
  by :func:`ror_annotate.verify.verify`): it fixes a wrong label with probability ``--fix-rate`` and
  wrongly revises a right one with probability ``--false-revise``.

Printed: Cohen's kappa (scikit-learn) and accuracy vs the truth on every segment, before and after
verification, next to the accuracy expected by hand, ``acc_after = acc_before (1 - false) +
(1 - acc_before) fix``; and the report's kappa vs the human reference before and after.

    python benchmarks/verify_simulated.py                  # 12 traces (about a minute)
    python benchmarks/verify_simulated.py --traces 40      # the whole sample
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sklearn.metrics import cohen_kappa_score  # noqa: E402

from ror_annotate import pipeline  # noqa: E402
from ror_annotate.codebook import load_codebook  # noqa: E402
from ror_annotate.judge.baseline import classify_trace  # noqa: E402
from ror_annotate.records import Label  # noqa: E402
from ror_annotate.sample import sample_path  # noqa: E402
from ror_annotate.store import Store  # noqa: E402
from tests.verify_fixtures import VerifierServer  # noqa: E402

#: A judge's realistic confusions: where a wrong label goes.
CONFUSIONS = {
    "planning": ["reflection", "execution"], "reflection": ["planning", "conclusion"], "execution": ["fact", "restatement"],
    "fact": ["execution"], "restatement": ["execution", "reflection"], "conclusion": ["execution", "reflection"],
}


def _rng(*parts: object) -> random.Random:
    return random.Random(hashlib.sha256(repr(parts).encode()).hexdigest())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=int, default=12)
    ap.add_argument("--error-rate", type=float, default=0.25)
    ap.add_argument("--fix-rate", type=float, default=0.7)
    ap.add_argument("--false-revise", type=float, default=0.03)
    ap.add_argument("--human-share", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    v1 = load_codebook().sha256
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "sim.duckdb")
        ids = pipeline.ingest(store, str(sample_path()), limit=args.traces).trace_ids
        pipeline.segment(store, ids)
        truth: dict[tuple[str, int], str] = {}
        by_text: dict[str, Counter[str]] = {}
        for t in ids:
            segments = store.segments(t)
            for seg, (label, _) in zip(segments, classify_trace(store.get_trace(t).problem, segments)):
                truth[(t, seg.segment_index)] = label
                by_text.setdefault(seg.text.strip(), Counter())[label] += 1
        rng = random.Random(args.seed)
        judge = {k: (rng.choice(CONFUSIONS[v]) if rng.random() < args.error_rate else v) for k, v in truth.items()}
        human_traces = set(rng.sample(ids, max(1, round(args.human_share * len(ids)))))
        store.upsert_labels(
            [Label(trace_id=t, segment_index=i, label=lab, source="judge", annotator="openai:noisy-judge", codebook_version=v1)
             for (t, i), lab in judge.items()]
            + [Label(trace_id=t, segment_index=i, label=lab, source="human", annotator="h1", codebook_version=v1, study="sim")
               for (t, i), lab in truth.items() if t in human_traces]
        )

        def decide(shown: str | None, text: str) -> tuple[str, str | None, str | None]:
            real = by_text[text.strip()].most_common(1)[0][0]
            r = _rng(args.seed, text, shown)
            if shown != real and r.random() < args.fix_rate:
                return "revise", real, "simulated fix"
            if shown == real and r.random() < args.false_revise:
                return "revise", r.choice(CONFUSIONS[real]), "simulated false revision"
            return "accept", None, None

        with VerifierServer(decide=decide) as srv:
            start = time.perf_counter()
            summary = pipeline.verify(store, pipeline.VerifyOptions.build("openai:sim-verifier", base_url=srv.base_url))
            wall = time.perf_counter() - start
        after = {(lab.trace_id, lab.segment_index): lab.label for lab in store.labels(source="verify")}
        report = pipeline.verify_report(store).verifiers[0]
        keys = sorted(truth)
        y, b, a = [truth[k] for k in keys], [judge[k] for k in keys], [after[k] for k in keys]
        acc_b = sum(p == q for p, q in zip(y, b)) / len(keys)
        acc_a = sum(p == q for p, q in zip(y, a)) / len(keys)
        expected = acc_b * (1 - args.false_revise) + (1 - acc_b) * args.fix_rate
        print(f"traces {len(ids)}, segments {len(keys)}, human-labelled traces {len(human_traces)} "
              f"({report.reference.n_items} segments)")
        print(f"judge error rate {args.error_rate:.2f}, verifier fix rate {args.fix_rate:.2f}, false revisions {args.false_revise:.2f}")
        print(f"verifier: {summary.verified} verdicts, {summary.revised} revised, {summary.counts['requests']} requests, {wall:.1f} s")
        print(f"vs truth   kappa before {cohen_kappa_score(y, b):.3f} -> after {cohen_kappa_score(y, a):.3f}; "
              f"accuracy {acc_b:.3f} -> {acc_a:.3f} (expected by hand {expected:.3f})")
        r = report.reference
        print(f"vs humans  kappa before {r.kappa_before:.3f} -> after {r.kappa_after:.3f}; "
              f"accuracy {r.accuracy_before:.3f} -> {r.accuracy_after:.3f}  (ror verify --report)")
        store.close()


if __name__ == "__main__":
    main()

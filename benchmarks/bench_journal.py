"""Cost of the commit journal (ror_annotate/journal.py) on the undamaged path.

Two workloads, each run with the journal on and off (``ROR_COMMIT_JOURNAL=off``) in this process,
alternating, ``--repeat`` times; the median of each is printed with the ratio on/off:

* ``commits``: ``--commits`` small transactions (one trace each) on a fresh store: the worst case,
  where each commit's own work is smallest next to the journal's ``UPDATE`` and appended line;
* ``noted``: the same, each transaction noting a 2 KB payload, as the LLM judge notes a paid
  response (such a line is also ``fsync``-ed; a real judge commit waits for a request first);
* ``pipeline``: ingest, segment and baseline-label the embedded sample (40 traces) into a fresh
  store, as ``ror run`` does before its export.

Usage::

    python benchmarks/bench_journal.py [--commits 300] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ror_annotate import pipeline  # noqa: E402
from ror_annotate.journal import JOURNAL_ENV  # noqa: E402
from ror_annotate.records import Trace  # noqa: E402
from ror_annotate.sample import sample_path  # noqa: E402
from ror_annotate.store import Store  # noqa: E402


def commits(work: Path, n: int) -> float:
    """Seconds for ``n`` one-trace transactions on a fresh store."""
    with Store(work / "c.duckdb") as store:
        t0 = time.perf_counter()
        for i in range(n):
            store.upsert_traces([Trace(trace_id=f"t{i}", text=f"Step {i}. Done.")])
        return time.perf_counter() - t0


def noted_commits(work: Path, n: int) -> float:
    """Seconds for ``n`` one-trace transactions that each note a 2 KB payload, as a paid judge response does."""
    payload = {"cache_key": "k", "response": "x" * 2000}
    with Store(work / "n.duckdb") as store:
        t0 = time.perf_counter()
        for i in range(n):
            with store.transaction():
                store.upsert_traces([Trace(trace_id=f"t{i}", text=f"Step {i}. Done.")])
                store.journal_note("judge_cache", {**payload, "cache_key": f"k{i}"})
        return time.perf_counter() - t0


def pipeline_run(work: Path) -> float:
    """Seconds to ingest, segment and baseline-label the embedded sample into a fresh store."""
    t0 = time.perf_counter()
    with Store(work / "p.duckdb") as store:
        pipeline.ingest(store, sample_path())
        pipeline.segment(store, workers=1)
        pipeline.label(store, judge="baseline")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=300, help="transactions in the commits workload (default 300)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each workload per setting (default 3)")
    args = ap.parse_args(argv)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeat):
        for setting in ("off", "on"):
            os.environ[JOURNAL_ENV] = setting
            workloads = (("commits", lambda w: commits(w, args.commits)), ("noted", lambda w: noted_commits(w, args.commits)),
                         ("pipeline", pipeline_run))
            for name, fn in workloads:
                with tempfile.TemporaryDirectory() as tmp:
                    times.setdefault((name, setting), []).append(fn(Path(tmp)))
    os.environ.pop(JOURNAL_ENV, None)
    print(f"{'workload':<10} {'journal off (s)':>16} {'journal on (s)':>15} {'on/off':>7}  (median of {args.repeat})")
    for name in ("commits", "noted", "pipeline"):
        off, on = statistics.median(times[(name, "off")]), statistics.median(times[(name, "on")])
        extra = f"  {1000 * (on - off) / args.commits:+.2f} ms per commit" if name != "pipeline" else ""
        print(f"{name:<10} {off:>16.3f} {on:>15.3f} {on / off:>7.2f}{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

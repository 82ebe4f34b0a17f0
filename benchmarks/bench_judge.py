"""Benchmark: the LLM judge's cost and speed, per-segment mode vs chunked mode, on the real traces.

Against the local OpenAI-compatible server of the tests (tests/openai_server.py), which reports
usage with the ``approx:bpe-regex-v1`` token estimate of ``ror_annotate.judge.prompt.approx_tokens``
and simulates a provider prefix cache (common prefix with an earlier prompt, from 1,024 tokens in
128-token steps). Segments come from ``ror_annotate.segment.Segmenter``.

Cost table, per mode (and chunk size):
  requests per trace; input tokens per labeled segment; input and *uncached* input tokens per
  trace as a ratio to the floor, where floor = each trace's tokens (problem + trace) plus the
  codebook (system message) once per trace.
The row "K=24 reasoning" has every answer shaped as a reasoning model's (``<think>...</think>``
then the JSON): it must need the same requests as the plain K=24 row (no parse-failure retries).
Speed table: segments/s with ``--latency`` (50 ms) added per request at concurrency 1, 8, 32.
The baseline for every ratio is measured in the same run.

    python benchmarks/bench_judge.py                 # 6 traces (short, about 2 min)
    python benchmarks/bench_judge.py --traces 0      # all 201 traces (long)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ror_annotate.codebook import load_codebook  # noqa: E402
from ror_annotate.judge import make_judge  # noqa: E402
from ror_annotate.judge.prompt import approx_tokens, system_message  # noqa: E402
from ror_annotate.records import Trace  # noqa: E402
from ror_annotate.segment import Segmenter  # noqa: E402
from ror_annotate.store import Store  # noqa: E402
from tests.openai_server import FakeOpenAI  # noqa: E402


def load_traces(path: Path, n: int) -> list[Trace]:
    rows = [json.loads(line) for line in path.open(encoding="utf-8")]
    rows = [r for r in rows if r.get("trace")]
    rows.sort(key=lambda r: r["trace_id"])
    if n:
        # a spread of lengths rather than the first n by id
        step = max(len(rows) // n, 1)
        rows = rows[::step][:n]
    return [Trace(trace_id=r["trace_id"], text=r["trace"], problem=r.get("problem")) for r in rows]


def build(db: Path, traces: list[Trace]) -> Store:
    store = Store(db)
    store.upsert_traces(traces)
    seg = Segmenter()
    for t in traces:
        store.replace_segments(t.trace_id, seg.segment(t.text, t.trace_id), segmenter=seg.name, token_counter=seg.token_counter.name)
    return store


def default_data() -> Path:
    """``shared/data/traces.jsonl`` next to the checkout (or next to the folder holding a worktree)."""
    for parent in REPO.parents:
        candidate = parent / "shared" / "data" / "traces.jsonl"
        if candidate.exists():
            return candidate
    return REPO.parent / "shared" / "data" / "traces.jsonl"


def run_mode(tmp: Path, traces: list[Trace], name: str, *, latency: float, style: str | None = None,
             **options) -> tuple[dict, float, int]:
    db = tmp / f"{name}.duckdb"
    store = build(db, traces)
    n_segments = len(store.segments())
    with FakeOpenAI(latency=latency, record_bodies=False, style=style) as srv:
        judge = make_judge("openai:gpt-4.1-mini", base_url=srv.base_url, **options)
        t0 = time.perf_counter()
        report = judge.label(store, [t.trace_id for t in traces])
        wall = time.perf_counter() - t0
    store.close()
    assert report.labeled == n_segments, (report, n_segments)
    return report.as_counts(), wall, n_segments


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--traces", type=int, default=6, help="number of traces (0 = all)")
    ap.add_argument("--chunk-sizes", default="8,24,64")
    ap.add_argument("--latency", type=float, default=0.05, help="seconds added per request in the speed table")
    ap.add_argument("--speed-traces", type=int, default=3, help="traces used in the speed table")
    args = ap.parse_args()
    os.environ.pop("OPENAI_API_KEY", None)

    traces = load_traces(args.data, args.traces)
    system_tokens = approx_tokens(system_message(load_codebook()))
    floor = sum(approx_tokens(t.text) + approx_tokens(t.problem or "") + system_tokens for t in traces)
    print(f"{len(traces)} traces; codebook/system message {system_tokens} tokens; floor {floor} tokens "
          f"({floor / len(traces):.0f}/trace); token counts: approx:bpe-regex-v1")
    print()
    print(f"{'mode':<20}{'req/trace':>10}{'req/seg':>9}{'in tok/seg':>12}{'in/floor':>10}{'uncached/floor':>16}{'out tok/seg':>12}")
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        modes = [("per-segment", {"mode": "per-segment"})]
        modes += [(f"chunked K={k}", {"chunk_size": int(k)}) for k in args.chunk_sizes.split(",")]
        modes += [("K=24 reasoning", {"chunk_size": 24, "style": "think"})]
        for name, options in modes:
            counts, _, n = run_mode(tmp, traces, name.replace(" ", "_").replace("=", ""), latency=0.0, concurrency=8, **options)
            uncached = counts["input_tokens"] - counts["cached_input_tokens"]
            print(f"{name:<20}{counts['requests'] / len(traces):>10.1f}{counts['requests'] / n:>9.3f}{counts['input_tokens'] / n:>12.0f}"
                  f"{counts['input_tokens'] / floor:>10.2f}{uncached / floor:>16.2f}{counts['output_tokens'] / n:>12.1f}"
                  + (f"   retries {counts['retries']}" if sum(counts.get("retries", {}).values()) else ""))
        print()
        speed_traces = traces[: args.speed_traces]
        print(f"segments/s with {args.latency * 1000:.0f} ms added latency per request ({len(speed_traces)} traces)")
        print(f"{'mode':<20}" + "".join(f"{'c=' + str(c):>10}" for c in (1, 8, 32)))
        for name, options in [("per-segment", {"mode": "per-segment"}), ("chunked K=24", {"chunk_size": 24})]:
            rates = []
            for c in (1, 8, 32):
                _, wall, n = run_mode(tmp, speed_traces, f"speed_{name.replace(' ', '_')}_{c}", latency=args.latency,
                                      concurrency=c, **options)
                rates.append(n / wall)
            print(f"{name:<20}" + "".join(f"{r:>10.1f}" for r in rates))


if __name__ == "__main__":
    main()

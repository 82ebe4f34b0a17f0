"""Benchmark: the LLM judge's writer (``AnswerWriter.write_group``) alone, per answer.

Builds a store of ``--copies`` copies of ``--traces`` real traces (``bench_judge``'s helpers), makes
the answers a chunked judge (K=24) would make of every chunk (``LLMJudge.answer_record``: labels as
columns, a cache row with a response shaped like ``tests/fast_openai_server.py``'s), and writes them
through ``AnswerWriter.write_group`` in groups of ``--group`` answers, on the calling thread, into a
fresh copy of the store (commit journal on). Figures per answer:

* thread CPU ms: ``time.thread_time`` of the writing thread (its Python work, which holds the GIL,
  plus the DuckDB statements it runs; DuckDB releases the GIL while a statement runs);
* process CPU ms: the whole process (adds DuckDB's own threads);
* wall ms;
* with ``--contend``: the same, with a pure-Python busy thread running beside the writes (standing
  for an event loop that always has work, as at concurrency 256), and that thread's speed as a
  share of its speed alone: the writer's GIL-held work and its waits to take the GIL back after
  each DuckDB statement show up in its wall and thread CPU;
* with ``--gil`` (needs ``py-spy`` beside the interpreter, and leave to ptrace): GIL-held ms, the
  samples of ``py-spy record --gil`` inside ``write_group`` (only the thread holding the GIL is
  sampled, so a DuckDB statement that released it is not counted) over the sampling rate: the
  Python work that keeps an event loop sharing the process from running. The top frames of the new
  tree's samples are printed too.

``--failures N`` first stores a failure row for N segments of every trace (as an earlier run that
failed them would), so the deletion of failure rows of labelled segments has rows to delete.
``--profile`` prints the writer's top functions (cProfile, own time) of the tree under test.
With ``--against TREE`` (a checkout of another commit, e.g. /work/wt/_base) the same run is made
with that tree's code, in the same process order (base, new, base, new, ...), and the ratios
new / base printed. Timings are printed, never asserted.

    python benchmarks/bench_judge_writer.py --against /work/wt/_base
    python benchmarks/bench_judge_writer.py --failures 3 --against /work/wt/_base
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_judge import _run_json, build_copies, default_data, load_traces  # noqa: E402

#: One timed run in a fresh process, with the code of the tree on its PYTHONPATH; prints one JSON line.
_WRITER_WORKER = """
import json, os, shutil, sys, time
import ror_annotate
from ror_annotate.judge import make_judge
from ror_annotate.judge.llm import ChunkResult
from ror_annotate.judge.persist import ensure_judge_tables
from ror_annotate.store import Store
src, db, group_size, failures, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
contend = len(sys.argv) > 6 and sys.argv[6] == "1"
for suffix in ("", ".wal", ".commits"):
    if os.path.exists(db + suffix):
        os.unlink(db + suffix)
shutil.copy(src, db)
store = Store(db)
ensure_judge_tables(store)
judge = make_judge("openai:gpt-4.1-mini", base_url="http://127.0.0.1:9/v1", chunk_size=24)
writer = judge.writer(store)
labels = judge.book.labels
answers = []
fail_rows = []
n = 0
for tid in store.trace_ids():
    trace = store.get_trace(tid)
    indexes = [s.segment_index for s in store.segments(tid)]
    fail_rows += [(tid, i) for i in indexes[:failures]]
    for c in range(0, len(indexes), 24):
        ids = indexes[c:c + 24]
        n += 1
        params = judge.params(1, 1024)
        key = f"{n:064x}"
        items = [{"segment_id": i, "label": labels[i % len(labels)], "confidence": 0.9, "rationale": "cue word"} for i in ids]
        content = json.dumps({"labels": items})
        response = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1765000000, "model": "gpt-4.1-mini",
                    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                 "message": {"role": "assistant", "content": content, "refusal": None}}],
                    "usage": {"prompt_tokens": 3000, "completion_tokens": len(content) // 4, "total_tokens": 3000 + len(content) // 4,
                              "prompt_tokens_details": {"cached_tokens": 2048}}}
        cache_row = {"cache_key": key, "params": params, "ids": ids, "attempt": 1, "response": response, "input_tokens": 3000,
                     "cached_input_tokens": 2048, "output_tokens": len(content) // 4, "cost_usd": 0.0012, "reasoning": None,
                     "usage_status": "ok"}
        extra = {"prompt_template_hash": judge.prompt_template_hash, "model": judge.model, "response_model": "gpt-4.1-mini",
                 "codebook": judge.book.versioned_name, "params": params, "mode": judge.mode, "chunk_size": judge.chunk_size,
                 "attempt": 1, "cache_key": key, "windowed": False}
        result = ChunkResult(good={i: (labels[i % len(labels)], 0.9, "cue word") for i in ids})
        answers.append(judge.answer_record(trace=trace, sample=1, run_id="bench-run", cache_row=cache_row, result=result,
                                           failures={}, attempts=1, extra=extra))
if fail_rows:
    store.execute(
        "INSERT INTO judge_failures (trace_id, segment_index, annotator, codebook_version, reason, attempts, run_id, created_at, cause) "
        "SELECT unnest(?::VARCHAR[]), unnest(?::INTEGER[]), ?, ?, 'bad', 3, 'old-run', now()::TIMESTAMP, 'parse'",
        [[t for t, _ in fail_rows], [i for _, i in fail_rows], judge.annotator_for(1), judge.codebook_version])
groups = [answers[i:i + group_size] for i in range(0, len(answers), group_size)]
def warm_up(group):  # untimed (and left out of the GIL samples by its name): first-call imports and caches
    writer.write_group(store, group)
warm_up(groups.pop(0))
answers = [a for g in groups for a in g]
prof = None
if profile:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
busy = {"stop": False, "n": 0}
def busy_loop():  # pure Python, as an event loop that always has work: it runs whenever it gets the GIL
    n = 0
    while not busy["stop"]:
        n += 1
    busy["n"] = n
alone = 0
if contend:
    import threading
    t_alone = time.perf_counter()
    while time.perf_counter() - t_alone < 0.3:
        pass
    th = threading.Thread(target=busy_loop)
    th.start()
    time.sleep(0.3)
    busy["stop"] = True
    th.join()
    alone = busy["n"] / 0.3
    busy.update(stop=False, n=0)
    th = threading.Thread(target=busy_loop)
    th.start()
c0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
for g in groups:
    writer.write_group(store, g)
c1, p1, w1 = time.thread_time(), time.process_time(), time.perf_counter()
if contend:
    busy["stop"] = True
    th.join()
top = []
if prof is not None:
    prof.disable()
    import pstats
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:14]
    top = [[f"{k[0].rsplit('/', 2)[-1]}:{k[1]}({k[2]})", 1000 * v[2] / len(answers)] for k, v in rows]
labels_n = store.execute("SELECT count(*) FROM labels").fetchone()[0]
fails_left = store.execute("SELECT count(*) FROM judge_failures").fetchone()[0]
store.close()
print(json.dumps({"code": ror_annotate.__file__, "answers": len(answers), "groups": len(groups), "labels": labels_n,
                  "failures_left": fails_left, "thread_cpu": c1 - c0, "process_cpu": p1 - p0, "wall": w1 - w0, "top": top,
                  "busy_share": busy["n"] / (w1 - w0) / alone if contend else None}))
"""


#: py-spy's sampling rate (samples per second) for ``--gil``.
GIL_RATE = 1000


def run_tree(tree: Path, src: Path, tmp: Path, args: argparse.Namespace, *, profile: bool = False, gil: bool = False) -> dict:
    argv = [str(src), str(tmp / "run.duckdb"), str(args.group), str(args.failures), "1" if profile else "0", "1" if args.contend else "0"]
    if not gil:
        got = _run_json(_WRITER_WORKER, argv, pythonpath=tree)
    else:
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
        if spy is None:
            raise SystemExit("--gil needs py-spy (pip install py-spy)")
        raw = tmp / "gil.txt"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run([spy, "record", "--gil", "--nonblocking", "-r", str(GIL_RATE), "-f", "raw", "-o", str(raw), "--", sys.executable, "-c",
                              _WRITER_WORKER, *argv], env=env, capture_output=True, text=True, check=False, cwd=str(tree), timeout=900)
        lines = [x for x in out.stdout.strip().splitlines() if x.startswith("{")]
        if out.returncode != 0 or not lines:
            raise SystemExit(f"worker under py-spy failed ({tree}):\n{out.stderr[-3000:]}")
        got = json.loads(lines[-1])
        stacks: dict[str, int] = {}
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if "write_group" in stack and "warm_up" not in stack:
                stacks[stack] = stacks.get(stack, 0) + int(count)
        got["gil"] = sum(stacks.values()) / GIL_RATE
        got["gil_stacks"] = stacks
    assert Path(got["code"]).resolve().is_relative_to(tree.resolve()), (got["code"], tree)
    return got


def gil_breakdown(stacks: dict[str, int], answers: int) -> list[tuple[str, float]]:
    """GIL-held ms per answer by the innermost ror_annotate frame of each sample (its own Python work and what it calls)."""
    by: dict[str, int] = {}
    for stack, count in stacks.items():
        frames = stack.split(";")
        ours = [f for f in frames if "ror_annotate" in f]
        key = ours[-1] if ours else frames[-1]
        key = key.replace(str(REPO), "").replace("/ror_annotate/", "")
        by[key] = by.get(key, 0) + count
    return sorted(((k, 1000 * v / GIL_RATE / answers) for k, v in by.items()), key=lambda kv: -kv[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=default_data())
    p.add_argument("--traces", type=int, default=40)
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--group", type=int, default=64, help="answers per write_group (one transaction)")
    p.add_argument("--failures", type=int, default=0, help="failure rows stored first, per trace (its first N segments)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="print the top functions of the tree under test (cProfile)")
    p.add_argument("--contend", action="store_true",
                   help="a pure-Python busy thread runs beside the writes (an event loop's demand for the GIL)")
    p.add_argument("--gil", action="store_true", help="also measure the GIL-held time in write_group (py-spy record --gil)")
    p.add_argument("--against", type=Path, default=None, help="another checkout to compare with (e.g. /work/wt/_base)")
    args = p.parse_args()
    traces = load_traces(args.data, args.traces)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        src = tmp / "src.duckdb"
        n_segments = build_copies(src, traces, args.copies)
        print(f"{len(traces)} traces x {args.copies} copies, {n_segments} segments; groups of {args.group} answers; "
              f"{args.failures} failure rows per trace stored first")
        trees = {"new": REPO} | ({"base": args.against.resolve()} if args.against else {})
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.repeat):
            for name, tree in sorted(trees.items()):  # base before new in each round
                runs[name].append(run_tree(tree, src, tmp, args))
                if args.gil:
                    runs[name][-1].update({k: v for k, v in run_tree(tree, src, tmp, args, gil=True).items() if k.startswith("gil")})
        figures: dict[str, dict[str, float]] = {}
        keys = ("thread_cpu", "process_cpu", "wall") + (("gil",) if args.gil else ())
        for name, got in runs.items():
            a = got[0]["answers"]
            figures[name] = {k: statistics.median(1000 * g[k] / a for g in got) for k in keys}
            first = got[0]
            gil = f", GIL-held {figures[name]['gil']:.3f} ms" if args.gil else ""
            if args.contend:
                share = statistics.median(g["busy_share"] for g in got)
                gil += f"; the busy thread ran at {share:.2f} of its speed alone"
            print(f"{name:>5}: {a} answers in {first['groups']} groups, {first['labels']} labels stored, "
                  f"{first['failures_left']} failure rows left; per answer (median of {len(got)}): "
                  f"thread CPU {figures[name]['thread_cpu']:.3f} ms, process CPU {figures[name]['process_cpu']:.3f} ms, "
                  f"wall {figures[name]['wall']:.3f} ms{gil}")
        if "base" in figures:
            r = {k: figures["new"][k] / figures["base"][k] for k in figures["new"]}
            gil = f", GIL-held {r['gil']:.2f}" if args.gil else ""
            print(f"new / base: thread CPU {r['thread_cpu']:.2f}, process CPU {r['process_cpu']:.2f}, wall {r['wall']:.2f}{gil}")
        if args.gil:
            for name, got in runs.items():
                print(f"GIL-held ms per answer of {name}, by innermost ror_annotate frame (last run):")
                for frame, ms in gil_breakdown(got[-1]["gil_stacks"], got[-1]["answers"])[:12]:
                    print(f"  {ms:7.4f}  {frame}")
        if args.profile:
            got = run_tree(REPO, src, tmp, args, profile=True)
            print("top functions of the new tree (own time, ms per answer, under cProfile):")
            for name, ms in got["top"]:
                print(f"  {ms:7.4f}  {name}")


if __name__ == "__main__":
    main()

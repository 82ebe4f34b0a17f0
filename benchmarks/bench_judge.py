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

Throughput (``--throughput``): requests/s of the usual chunked prompt (K=24) against the fast
server of ``tests/fast_openai_server.py`` (its own process, one asyncio loop), each judge run in a
fresh process on a copy of one store of ``--copies`` copies of the traces:
  1. the server alone: requests/s it answers from a bare asyncio load generator (its own process)
     sending the judge's request bodies, next to the tests' in-process ``FakeOpenAI``; and with
     ``--latency-ms`` at each concurrency: what the server and the machine allow against Little's
     law when the client does no work of its own;
  2. the judge against the zero-latency server at ``--concurrency`` (chunked; ``--per-segment`` adds
     per-segment mode), the client's ceiling;
  3. the judge with ``--latency-ms`` (200) per request at each concurrency, against Little's law
     (throughput = concurrency / latency): over the whole run, and in the steady state (answers per
     second over the middle 80% of the answers, by the time the server sent them: Little's law is a
     statement about the steady state, and a run of a few thousand requests spends a few hundred
     milliseconds ramping up and draining); and against min(Little, the zero-latency ceiling).
The server of the judge runs is warm (``--cold-server`` to turn it off): it answered the first request
of every trace before the run, so that reading back a trace block's segments, their cue labels and
its token count (about half of its CPU per request otherwise) is not charged to the cores it shares
with the judge; a vLLM server on other hardware costs the judge's machine nothing.
Each judge row also prints the judge's and the server's CPU milliseconds per request (the server's
from ``/proc``, Linux; the judge's whole process, and its event loop's thread alone) and the CPU
bound they set: min(one core / the loop thread's CPU per request, all cores / (judge + server CPU
per request)), the rate a free machine of this many cores allows, and the
longest event-loop stall of the judge (a 5 ms watchdog task on its loop: how late it woke, and in
brackets the loop thread's CPU between two wakes, which the machine's load does not inflate; the
worst of the runs).
With ``--against TREE`` (a checkout of another commit, e.g. /work/wt/_base) every judge figure is
also measured with that tree's code in the same run, and printed with the ratio new / base.

    python benchmarks/bench_judge.py                 # 6 traces (short, about 2 min)
    python benchmarks/bench_judge.py --traces 0      # all 201 traces (long)
    python benchmarks/bench_judge.py --throughput --traces 40 --copies 30 --against ../_base
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ror_annotate.codebook import load_codebook  # noqa: E402
from ror_annotate.judge import make_judge  # noqa: E402
from ror_annotate.journal import JOURNAL_SUFFIX  # noqa: E402
from ror_annotate.judge.prompt import approx_tokens, system_message  # noqa: E402
from ror_annotate.records import Trace  # noqa: E402
from ror_annotate.segment import Segmenter  # noqa: E402
from ror_annotate.store import Store  # noqa: E402
from tests.fast_openai_server import FastOpenAI  # noqa: E402
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


# ---------------------------------------------------------------------------------------- throughput
#: One judge run in a fresh process, with the code of the tree on its PYTHONPATH; prints one JSON line.
#: Event-loop stalls: a watchdog task on the judge's loop sleeps 5 ms at a time and records how late
#: it wakes (wall clock: the loop running something else without yielding, waiting for the GIL, or its
#: process waiting for a core on a loaded machine) and the loop thread's CPU time between two wakes
#: (``time.thread_time``: the loop's own work only, whatever the load).
_JUDGE_WORKER = """
import asyncio, json, sys, time
import openai  # imported before the clock starts (about 1.5 s)
import ror_annotate
from ror_annotate.judge import make_judge
from ror_annotate.judge.persist import ensure_judge_tables
from ror_annotate.store import Store
db, url, concurrency, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
store = Store(db)
ids = store.trace_ids()
options = {"mode": "per-segment"} if mode == "per-segment" else {"chunk_size": int(mode)}
judge = make_judge("openai:gpt-4.1-mini", base_url=url, concurrency=concurrency, **options)
ensure_judge_tables(store)
stalls, cpu_stalls = [], []
async def main():
    done = asyncio.Event()
    async def watchdog():
        while not done.is_set():
            t, c = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.005)
            stalls.append(time.perf_counter() - t - 0.005)
            cpu_stalls.append(time.thread_time() - c)
    watch = asyncio.create_task(watchdog())
    try:
        return await judge.label_async(store, ids)
    finally:
        done.set()
        await watch
t0, c0, l0 = time.perf_counter(), time.process_time(), time.thread_time()
report = asyncio.run(main())
wall, cpu, loop_cpu = time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - l0
stalls.sort()
print(json.dumps({"wall": wall, "cpu": cpu, "loop_cpu": loop_cpu, "requests": report.requests, "labeled": report.labeled, "code": ror_annotate.__file__,
                  "stall_max": stalls[-1], "cpu_stall_max": max(cpu_stalls), "stall_p99": stalls[int(0.99 * (len(stalls) - 1))], "stalls_over_50ms": sum(s > 0.05 for s in stalls)}))
"""

#: A bare asyncio HTTP/1.1 load generator (no client library): keep-alive connections, each sending
#: the next body as soon as its previous answer is read. argv: port, concurrency, bodies file, seconds.
_LOADGEN = r"""
import asyncio, json, sys, time
port, conc, path, seconds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
bodies = [json.dumps(b).encode() for b in json.load(open(path))]
reqs = [(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: "
         + str(len(b)).encode() + b"\r\n\r\n" + b) for b in bodies]
done = 0
errors = 0
async def worker(k):
    global done, errors
    i = k
    while time.perf_counter() < end:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            while time.perf_counter() < end:
                w.write(reqs[i % len(reqs)]); i += conc
                head = await r.readuntil(b"\r\n\r\n")
                n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
                await r.readexactly(n)
                done += 1
            w.close()
        except (ConnectionError, asyncio.IncompleteReadError):
            errors += 1  # a server with a short listen queue resets connections: reconnect
async def main():
    global end
    end = time.perf_counter() + seconds
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(conc)))
    print(json.dumps({"requests": done, "wall": time.perf_counter() - t0, "errors": errors}))
asyncio.run(main())
"""


def _run_json(code: str, args: list[str], *, pythonpath: Path, timeout: float = 900) -> dict:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    env.pop("OPENAI_API_KEY", None)
    # cwd: ``python -c`` puts the working directory first on sys.path, before PYTHONPATH
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False,
                         cwd=str(pythonpath))
    if out.returncode != 0:
        raise SystemExit(f"worker failed ({pythonpath}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_copies(db: Path, traces: list[Trace], copies: int) -> int:
    """A store of ``copies`` copies of ``traces`` (ids ``ID#k``), segmented; returns the segment count."""
    many = [Trace(trace_id=f"{t.trace_id}#{k}", text=t.text, problem=f"{t.problem or ''} (copy {k})") for k in range(copies) for t in traces]
    store = build(db, many)
    n = len(store.segments())
    store.close()
    return n


def request_bodies(db: Path, limit: int = 400) -> list[dict]:
    """The judge's first request body (K=24) of each chunk of the store's traces, up to ``limit``."""
    store = Store(db)
    judge = make_judge("openai:gpt-4.1-mini", base_url="http://127.0.0.1:9/v1", chunk_size=24)
    bodies: list[dict] = []
    for tid in store.trace_ids():
        trace, segments = store.get_trace(tid), store.segments(tid)
        block = judge.render_trace_block(store, trace, segments)
        for i in range(0, len(segments), 24):
            ids = [s.segment_index for s in segments[i : i + 24]]
            max_tokens = judge.default_max_tokens(len(ids))
            messages, _ = judge.render_messages(trace, segments, ids, max_tokens=max_tokens, block=block)
            bodies.append(judge.request_body(messages, 1, max_tokens))
            if len(bodies) >= limit:
                store.close()
                return bodies
    store.close()
    return bodies


def trace_bodies(db: Path) -> list[dict]:
    """The judge's first request body (K=24) of every trace of the store: answering them parses and
    counts every trace block once (a warm server, ``tests.fast_openai_server._Answerer.warm``)."""
    store = Store(db)
    judge = make_judge("openai:gpt-4.1-mini", base_url="http://127.0.0.1:9/v1", chunk_size=24)
    bodies: list[dict] = []
    for tid in store.trace_ids():
        trace, segments = store.get_trace(tid), store.segments(tid)
        if not segments:
            continue
        block = judge.render_trace_block(store, trace, segments)
        ids = [s.segment_index for s in segments[:24]]
        max_tokens = judge.default_max_tokens(len(ids))
        messages, _ = judge.render_messages(trace, segments, ids, max_tokens=max_tokens, block=block)
        bodies.append(judge.request_body(messages, 1, max_tokens))
    store.close()
    return bodies


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def judge_rate(tmp: Path, db: Path, tree: Path, *, latency: float, concurrency: int, mode: str = "24",
               warm: Path | None = None) -> tuple[float, float, float | None, tuple[float, float], float, float | None]:
    """``(requests/s, requests per CPU-second of the judge's process, the server's CPU ms per request,
    the longest event-loop stall in ms, the event loop's thread's CPU ms per request)`` of one judge
    run of ``tree``'s code on a fresh copy of ``db``.
    The second figure does not depend on what else the machine runs: it is the rate one free core
    would sustain (the judge's process: its event loop and, where the tree has one, its writer
    thread). The third is the fast server's own CPU during the run (the server shares the machine's
    cores with the judge). The fourth: how late a 5 ms watchdog on the judge's loop woke, at most.
    The fifth: the CPU of the loop's own thread (``time.thread_time``), which one core bounds.
    The sixth: the steady-state rate, answers per second over the middle 80% of the answers by the
    time the server sent them (without the run's ramp-up and drain), or None.
    ``warm``: the bodies the server answers before the run (:func:`trace_bodies`)."""
    run_db = tmp / "run.duckdb"
    for suffix in ("", ".wal", JOURNAL_SUFFIX):  # the commit journal of an earlier run belongs to another store
        Path(str(run_db) + suffix).unlink(missing_ok=True)
    shutil.copy(db, run_db)
    with FastOpenAI(latency=latency, warm=warm) as srv:
        pid = srv._proc.pid if srv._proc is not None else -1
        before = process_cpu_s(pid)
        got = _run_json(_JUDGE_WORKER, [str(run_db), srv.base_url, str(concurrency), mode], pythonpath=tree)
        after = process_cpu_s(pid)
        steady = srv.stats()["steady_rate"]
    assert Path(got["code"]).resolve().is_relative_to(tree.resolve()), (got["code"], tree)
    server_ms = 1000 * (after - before) / got["requests"] if before is not None and after is not None else None
    return (got["requests"] / got["wall"], got["requests"] / got["cpu"], server_ms, (1000 * got["stall_max"], 1000 * got["cpu_stall_max"]),
            1000 * got["loop_cpu"] / got["requests"], steady)


def throughput(args: argparse.Namespace, traces: list[Trace]) -> None:
    trees = [("new", REPO)] + ([("base", args.against.resolve())] if args.against else [])
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    latency = args.latency_ms / 1000.0
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        db = tmp / "corpus.duckdb"
        n_segments = build_copies(db, traces, args.copies)
        print(f"throughput: {len(traces)} traces x {args.copies} copies, {n_segments} segments; {os.cpu_count()} CPUs; "
              f"trees: {', '.join(f'{n}={p}' for n, p in trees)}")
        # 1. the server alone
        bodies_file = tmp / "bodies.json"
        bodies_file.write_text(json.dumps(request_bodies(db)), encoding="utf-8")
        rates = {}
        for c0 in sorted({8, max(concurrencies)}):
            with FastOpenAI() as fast:
                got = _run_json(_LOADGEN, [str(fast.port), str(c0), str(bodies_file), str(args.server_seconds)], pythonpath=REPO)
            rates[("fast", c0)] = got["requests"] / got["wall"]
            with FakeOpenAI(record_bodies=False) as fake:
                port = int(fake.base_url.rsplit(":", 1)[1].split("/")[0])
                got = _run_json(_LOADGEN, [str(port), str(c0), str(bodies_file), str(args.server_seconds)], pythonpath=REPO)
            rates[("fake", c0)] = got["requests"] / got["wall"]
            print(f"server alone, {c0} connections: fast server {rates[('fast', c0)]:.0f} req/s; tests' FakeOpenAI "
                  f"{rates[('fake', c0)]:.0f} req/s ({got['errors']} connection resets)")
        for conc in concurrencies:
            # what the server and this machine allow at the latency, with a client that does no work of its own
            with FastOpenAI(latency=latency) as fast:
                got = _run_json(_LOADGEN, [str(fast.port), str(conc), str(bodies_file), str(args.server_seconds)], pythonpath=REPO)
            bare = got["requests"] / got["wall"]
            print(f"server alone with {args.latency_ms:.0f} ms latency, {conc} connections (bare load generator): {bare:.0f} req/s "
                  f"(Little {conc / latency:.0f}: {bare * latency / conc:.2f})")
        # 2. zero latency; 3. with latency. Each figure: the trees one after the other, best of --repeat runs.
        warm: Path | None = None
        if not args.cold_server:
            warm = tmp / "warm.json"
            warm.write_text(json.dumps(trace_bodies(db)), encoding="utf-8")
        print(f"judge runs: the server {'cold (parses each trace block when first asked)' if warm is None else 'warm (every trace block parsed before the run)'}")
        rows: list[tuple[str, float, dict[str, float]]] = []
        ceiling: dict[str, float] = {}

        def measure(name: str, lat: float, conc: int, mode: str, expect: float | None) -> None:
            rates: dict[str, float] = {}
            per_cpu: dict[str, float] = {}
            server_ms: dict[str, float] = {}
            stall_ms: dict[str, tuple[float, float]] = {}
            loop_ms: dict[str, float] = {}
            steady: dict[str, float] = {}
            for _ in range(args.repeat):
                for tree_name, tree in trees:
                    rate, cpu_rate, srv_ms, stall, loop, steady_rate = judge_rate(tmp, db, tree, latency=lat, concurrency=conc, mode=mode,
                                                                                  warm=warm)
                    if steady_rate is not None:
                        steady[tree_name] = max(steady.get(tree_name, 0.0), steady_rate)
                    loop_ms[tree_name] = min(loop_ms.get(tree_name, loop), loop)
                    before = stall_ms.get(tree_name, stall)  # the worst of the runs
                    stall_ms[tree_name] = (max(before[0], stall[0]), max(before[1], stall[1]))
                    rates[tree_name] = max(rates.get(tree_name, 0.0), rate)
                    per_cpu[tree_name] = max(per_cpu.get(tree_name, 0.0), cpu_rate)
                    if srv_ms is not None:
                        server_ms[tree_name] = min(server_ms.get(tree_name, srv_ms), srv_ms)
            rows.append((name, expect or 0.0, rates))
            cells = "".join(f"{rates[t]:>9.1f}" for t, _ in trees)
            cells += f"{rates['new'] / rates['base']:>7.2f}x" if "base" in rates else ""
            cells += "".join(f"{per_cpu[t]:>9.1f}" for t, _ in trees)
            cells += f"{per_cpu['new'] / per_cpu['base']:>7.2f}x" if "base" in rates else ""
            extra = "   longest loop stall ms, wall (loop CPU) " + " / ".join(f"{t} {stall_ms[t][0]:.0f} ({stall_ms[t][1]:.0f})" for t, _ in trees)
            extra += "   loop thread CPU ms/req " + " / ".join(f"{t} {loop_ms[t]:.2f}" for t, _ in trees)
            if "new" in server_ms:
                # what bounds the judge on this machine: one core for its event loop's thread, and the cores the
                # judge's process (loop and writer thread) shares with the server
                client_ms = 1000 / per_cpu["new"]
                bound = min(1000 / loop_ms["new"], (os.cpu_count() or 1) * 1000 / (client_ms + server_ms["new"]))
                extra += f"   client {client_ms:.2f} + server {server_ms['new']:.2f} CPU ms/req: CPU bound {bound:.0f}/s"
            if expect:
                bound = min(expect, ceiling.get("new", expect))
                extra += f"   Little {expect:.0f}: whole run {rates['new'] / expect:.2f}"
                if "new" in steady:
                    extra += f", steady state {steady['new']:.0f}/s: {steady['new'] / expect:.2f}"
                    extra += f" (base {steady['base']:.0f}/s: {steady['base'] / expect:.2f})" if "base" in steady else ""
                extra += f"; min(Little, ceiling {bound:.0f}): {rates['new'] / bound:.2f}"
            print(f"{name:<30}{cells}{extra}", flush=True)

        names = "".join(f"{t:>9}" for t, _ in trees) + (f"{'ratio':>8}" if len(trees) > 1 else "")
        print(f"{'judge: requests/s (wall), then':<30}{names}{names}")
        print(f"{'requests per CPU-second':<30}")
        for conc in concurrencies:
            measure(f"chunked K=24, 0 ms, c={conc}", 0.0, conc, "24", None)
            ceiling["new"] = max(ceiling.get("new", 0.0), rows[-1][2]["new"])  # the zero-latency ceiling
        if args.per_segment:
            measure(f"per-segment, 0 ms, c={concurrencies[0]}", 0.0, concurrencies[0], "per-segment", None)
        for conc in concurrencies:
            measure(f"chunked K=24, {args.latency_ms:.0f} ms, c={conc}", latency, conc, "24", conc / latency)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--traces", type=int, default=6, help="number of traces (0 = all)")
    ap.add_argument("--chunk-sizes", default="8,24,64")
    ap.add_argument("--latency", type=float, default=0.05, help="seconds added per request in the speed table")
    ap.add_argument("--speed-traces", type=int, default=3, help="traces used in the speed table")
    ap.add_argument("--throughput", action="store_true", help="only the throughput tables (see the docstring)")
    ap.add_argument("--copies", type=int, default=2, help="throughput: copies of the traces in the store")
    ap.add_argument("--concurrency", default="64,256", help="throughput: concurrencies")
    ap.add_argument("--latency-ms", type=float, default=200.0, help="throughput: server latency for Little's law")
    ap.add_argument("--repeat", type=int, default=1, help="throughput: runs per figure (the best is kept)")
    ap.add_argument("--server-seconds", type=float, default=3.0, help="throughput: seconds of the server-alone load")
    ap.add_argument("--per-segment", action="store_true", help="throughput: add per-segment mode at zero latency")
    ap.add_argument("--against", type=Path, help="throughput: another checkout measured in the same run (the baseline)")
    ap.add_argument("--cold-server", action="store_true",
                    help="throughput: the server parses each trace block when first asked, on the cores the judge uses (default: before the run)")
    args = ap.parse_args()
    os.environ.pop("OPENAI_API_KEY", None)

    traces = load_traces(args.data, args.traces)
    if args.throughput:
        throughput(args, traces)
        return
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

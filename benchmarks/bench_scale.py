"""The main job at corpus scale: wall time, segments/s per stage, peak memory and export size.

Builds a synthetic corpus from the real traces in ``../shared/data/traces.jsonl`` (renumbered copies:
the same texts under distinct trace ids ``<id>~cNNNN``, cycling through the 201 traces) sized to
about ``--segments`` segments, then runs the main job with the offline baseline judge in child
processes, each measured with ``os.wait4`` (its own peak RSS, not this script's):

* ``stages`` -- ``ror ingest``, ``ror segment``, ``ror label --judge baseline``, ``ror export``, one
  process each: wall time, segments/s and peak RSS per stage;
* ``run``    -- ``ror run FILE --judge baseline`` in one process: the figure the target is about.

The export's size on disk (parquet files, and the whole directory with its save_to_disk copy) is
printed too. The corpus and store live in a temporary work directory (or ``--workdir``) and are
removed afterwards unless ``--keep``; the traces never enter the repository.

Target (issue 16): ``run`` at about 1,000,000 segments on a 2-core machine under 2 GiB peak RSS,
and the peak at 250k segments within 10% of it (memory flat in corpus size).

``--against TREE`` runs the same commands from another checkout (an old worktree of main, e.g.
``git worktree add --detach ../_base <commit>``) on the same corpus in the same session, prints the
ratio of its time to ours per row (>1: we are faster) and compares the two exports byte for byte:
every file except ``README.md``, ``ror_export.json`` and the ``state.json`` files, which carry the
export's name, time and a random fingerprint (``ror_export.json`` is compared without those keys).
When the bytes differ (an export layout version changed, e.g. version 2's row groups), the rows are
compared instead: every config and split read back from parquet, in order.
``--short-traces N`` replaces the corpus by N short traces (2-5 sentences each, cut from the real
traces), the shape of chat datasets where per-trace costs dominate. ``--workers N`` is passed on.

Usage::

    python benchmarks/bench_scale.py --segments 250000          # a figure for the issue
    python benchmarks/bench_scale.py --smoke                     # CI: ~3,000 segments, both modes
    python benchmarks/bench_scale.py --segments 1000000 --mode run
    python benchmarks/bench_scale.py --segments 50000 --against ../_base --workers 1   # ratios vs an old tree
    python benchmarks/bench_scale.py --short-traces 100000 --mode run --against ../_base
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "traces.jsonl"
SMOKE_SEGMENTS = 3_000


def segments_per_trace(rows: list[dict]) -> list[int]:
    """Segments the project's segmenter makes of each real trace (the corpus is sized with these)."""
    from ror_annotate.segment import Segmenter

    segmenter = Segmenter()
    return [len(segmenter.segment(r["trace"], r["trace_id"])) for r in rows]


def build_corpus(path: Path, target_segments: int, traces: Path = SHARED) -> tuple[int, int]:
    """Write renumbered copies of the real traces to ``path`` (JSONL) until ``target_segments``.

    Returns ``(n_traces, n_segments)`` of the corpus (segments as the segmenter will cut them).
    """
    rows = [json.loads(line) for line in traces.open(encoding="utf-8")]
    counts = segments_per_trace(rows)
    n_traces = n_segments = 0
    with path.open("w", encoding="utf-8") as f:
        while n_segments < target_segments:
            copy = n_traces // len(rows)
            r = dict(rows[n_traces % len(rows)])
            r["trace_id"] = f"{r['trace_id']}~c{copy:04d}"
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n_segments += counts[n_traces % len(rows)]
            n_traces += 1
    return n_traces, n_segments


_SENTENCE = re.compile(r"[^.!?\n]+[.!?]")


def build_short_corpus(path: Path, n_traces: int, traces: Path = SHARED, seed: int = 0) -> int:
    """Write ``n_traces`` short traces (2-5 consecutive sentences of the real traces) to ``path``; returns the count."""
    import random

    rng = random.Random(seed)
    rows = [json.loads(line) for line in traces.open(encoding="utf-8")]
    sentences = [[m.group(0).strip() for m in _SENTENCE.finditer(r["trace"]) if len(m.group(0).strip()) > 3] for r in rows]
    usable = [(r, s) for r, s in zip(rows, sentences) if len(s) >= 5]
    with path.open("w", encoding="utf-8") as f:
        for k in range(n_traces):
            r, sents = usable[k % len(usable)]
            n = rng.randint(2, 5)
            start = rng.randrange(0, len(sents) - n + 1)
            f.write(json.dumps({"trace_id": f"short-{k:07d}", "problem": r.get("problem"), "trace": " ".join(sents[start:start + n])},
                               ensure_ascii=False) + "\n")
    return n_traces


def stored_segments(db: Path) -> int:
    """Segments in a finished store (read-only), for corpora not sized in advance."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return int(con.execute("SELECT count(*) FROM segments").fetchone()[0])
    finally:
        con.close()


_VOLATILE_FILES = {"README.md", "state.json"}
_VOLATILE_KEYS = {"out_dir", "name", "created_at"}


def _strip(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in _VOLATILE_KEYS}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def export_digest(out: Path) -> dict[str, str]:
    """sha256 per export file (relative path), without the files that name the export or its time."""
    digest = {}
    for p in sorted(out.rglob("*")):
        if not p.is_file() or p.name in _VOLATILE_FILES:
            continue
        data = p.read_bytes()
        if p.name == "ror_export.json":
            data = json.dumps(_strip(json.loads(data)), sort_keys=True).encode()
        digest[str(p.relative_to(out))] = hashlib.sha256(data).hexdigest()
    return digest


def compare_exports(ours: Path, theirs: Path) -> tuple[bool, list[str]]:
    """Whether two exports are byte-identical (see :func:`export_digest`), and the files that differ."""
    a, b = export_digest(ours), export_digest(theirs)
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return not differ and bool(a), differ


def same_rows(ours: Path, theirs: Path) -> bool:
    """Whether two exports hold the same rows in the same order in every config and split (their parquet
    files read back, shards concatenated): the check when the bytes differ by a layout version."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def tables(root: Path) -> dict[str, pa.Table]:
        groups: dict[str, list[Path]] = {}
        for p in sorted((root / "data").rglob("*.parquet")):
            groups.setdefault(f"{p.parent.name}/{p.name.split('-')[0]}", []).append(p)
        return {k: pa.concat_tables([pq.read_table(p) for p in v]) for k, v in groups.items()}

    a, b = tables(ours), tables(theirs)
    return bool(a) and a.keys() == b.keys() and all(a[k].equals(b[k]) for k in a)


def layout_version(out: Path) -> int:
    """The export's ``layout_version`` (1 when its manifest has none: exports before the key)."""
    return int(json.loads((out / "ror_export.json").read_text(encoding="utf-8")).get("layout_version", 1))


def _descendant_cpu(root: int, seen: dict[int, float], stop: threading.Event, every: float = 0.25) -> None:
    """Sample the CPU seconds (user + system) of every process below ``root`` (segment workers, the
    forkserver) from /proc until ``stop``; ``seen[pid]`` keeps each one's last reading. wait4 does not
    count them: the workers are the forkserver's children, not the command's."""
    if not os.path.isdir("/proc"):  # not Linux: the workers' CPU is not counted
        return
    tick = os.sysconf("SC_CLK_TCK")
    while not stop.is_set():
        parent: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d)] = int(fields[1])
            cpu[int(d)] = (int(fields[11]) + int(fields[12])) / tick
        for pid in cpu:
            p, depth = parent.get(pid), 0
            while p and p != root and depth < 8:
                p, depth = parent.get(p), depth + 1
            if p == root and pid != root:
                seen[pid] = cpu[pid]
        stop.wait(every)


def run_child(argv: list[str], env: dict[str, str], cwd: Path) -> dict:
    """Run one command; return its wall seconds, CPU seconds, peak RSS (MiB, from wait4) and exit status."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers_cpu: dict[int, float] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_descendant_cpu, args=(proc.pid, workers_cpu, stop), daemon=True)
    sampler.start()
    out_f = proc.stdout.read()  # the CLI prints little; read to the end before waiting
    err_f = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    stop.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(err_f.decode(errors="replace")[-3000:])
        raise SystemExit(f"{' '.join(argv[3:])} failed with exit status {proc.returncode}")
    # ru_maxrss is in KiB on Linux; CPU seconds (user + system, the process and the children it waited for,
    # e.g. segment workers) are the steadier figure on a machine shared with other work
    main_cpu = usage.ru_utime + usage.ru_stime  # the command itself (and any child it waited for)
    cpu = main_cpu + sum(workers_cpu.values())  # plus its workers, sampled every 0.25 s
    return {"seconds": seconds, "cpu_s": cpu, "peak_rss_mib": usage.ru_maxrss / 1024,
            # the main process's share of the CPU (what the segment workers do not share): the serial share
            "serial_share": main_cpu / cpu if cpu > 0 else None,
            "stdout": out_f.decode(errors="replace")}


def dir_size(path: Path, pattern: str = "**/*") -> int:
    return sum(p.stat().st_size for p in path.glob(pattern) if p.is_file())


def bench(work: Path, corpus: Path, n_segments: int | None, mode: str, memory_limit: str | None = None, *,
          root: Path = ROOT, workers: int | None = None, tag: str = "") -> list[dict]:
    """Run the stages and/or ``ror run`` with the ``ror`` of ``root``; ``n_segments`` None: counted in the store."""
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "COLUMNS": "200"}
    more = ["--workers", str(workers)] if workers else []
    if memory_limit:
        env["ROR_DUCKDB_MEMORY_LIMIT"] = memory_limit
    # the command as a user runs it (``python -m ror_annotate``: the command's own process settings,
    # signal handlers and collector thresholds, apply; ``-c`` was a program importing the package)
    ror = [sys.executable, "-m", "ror_annotate"]
    results = []
    if mode in ("stages", "both"):
        db = work / f"stages{tag}.duckdb"
        out = work / f"export-stages{tag}"
        for stage, args in (
            ("ingest", ["ingest", str(corpus)]),
            ("segment", ["segment", *more]),
            ("label (baseline)", ["label", "--judge", "baseline"]),
            ("export", ["export", "scale", "--out", str(out)]),
        ):
            r = run_child([*ror, *args, "--db", str(db)], env, work)
            results.append({"what": stage, **r})
        n = n_segments if n_segments is not None else stored_segments(db)
        for r in results:
            r["segments_per_s"] = n / r["seconds"]
        results.append({"what": "export size", "parquet_mib": dir_size(out, "data/**/*") / 2**20,
                        "dir_mib": dir_size(out) / 2**20, "out": out})
    if mode in ("run", "both"):
        db = work / f"run{tag}.duckdb"
        out = work / f"export-run{tag}"
        r = run_child([*ror, "run", str(corpus), "--judge", "baseline", "--out", str(out), "--db", str(db), *more], env, work)
        n = n_segments if n_segments is not None else stored_segments(db)
        results.append({"what": "ror run (one process)", **r, "segments_per_s": n / r["seconds"]})
        results.append({"what": "export size (run)", "parquet_mib": dir_size(out, "data/**/*") / 2**20,
                        "dir_mib": dir_size(out) / 2**20, "out": out})
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=250_000, help="target corpus size in segments")
    ap.add_argument("--smoke", action="store_true", help=f"CI size (~{SMOKE_SEGMENTS} segments), both modes")
    ap.add_argument("--mode", choices=("stages", "run", "both"), default="both")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (corpus, stores, exports)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    ap.add_argument("--duckdb-memory-limit", default=None, metavar="SIZE",
                    help="run the commands with ROR_DUCKDB_MEMORY_LIMIT=SIZE (e.g. 256MB): bounds DuckDB's block cache")
    ap.add_argument("--traces", type=Path, default=SHARED, help="the real traces the corpus copies (shared/data/traces.jsonl)")
    ap.add_argument("--short-traces", type=int, default=None, metavar="N", help="a corpus of N short traces (2-5 sentences) instead")
    ap.add_argument("--against", type=Path, default=None, metavar="TREE",
                    help="also run the commands of this checkout (an old worktree of main) and print ratios and an export comparison")
    ap.add_argument("--workers", type=int, default=None, help="--workers for ror segment / ror run (default: every core)")
    args = ap.parse_args()
    if not args.traces.exists():
        raise SystemExit(f"{args.traces}: the shared real traces are needed to build the corpus (give --traces PATH)")
    if args.against is not None and not (args.against / "ror_annotate").is_dir():
        raise SystemExit(f"{args.against}: not a checkout of ror_annotate (no ror_annotate/ folder)")
    target = SMOKE_SEGMENTS if args.smoke else args.segments
    work = Path(tempfile.mkdtemp(prefix="ror-scale-", dir=args.workdir))
    try:
        corpus = work / "corpus.jsonl"
        t0 = time.perf_counter()
        n_segments: int | None
        if args.short_traces:
            n_traces, n_segments = build_short_corpus(corpus, args.short_traces, args.traces), None
        else:
            n_traces, n_segments = build_corpus(corpus, target, args.traces)
        print(f"corpus: {n_traces} traces, {n_segments if n_segments is not None else 'uncounted'} segments, "
              f"{corpus.stat().st_size / 2**20:.1f} MiB JSONL (built in {time.perf_counter() - t0:.1f} s); {os.cpu_count()} CPUs; "
              f"workers {args.workers or 'default (all cores)'}")
        limit = args.duckdb_memory_limit or os.environ.get("ROR_DUCKDB_MEMORY_LIMIT")
        print(f"DuckDB memory_limit: {limit or 'DuckDB default (80% of RAM)'}")
        results = bench(work, corpus, n_segments, args.mode, args.duckdb_memory_limit, workers=args.workers)
        theirs = (bench(work, corpus, n_segments, args.mode, args.duckdb_memory_limit, root=args.against.resolve(),
                        workers=args.workers, tag="-against") if args.against is not None else None)
        header = f"{'stage':<24}{'seconds':>10}{'CPU s':>9}{'segments/s':>14}{'peak RSS MiB':>15}"
        if theirs is not None:
            header += f"{'against s':>12}{'CPU s':>9}{'against MiB':>13}{'speed-up':>10}{'CPU ratio':>11}"
        print(header)
        for k, r in enumerate(results):
            if "seconds" in r:
                line = f"{r['what']:<24}{r['seconds']:>10.1f}{r['cpu_s']:>9.1f}{r['segments_per_s']:>14.0f}{r['peak_rss_mib']:>15.0f}"
                if theirs is not None:
                    t = theirs[k]
                    line += (f"{t['seconds']:>12.1f}{t['cpu_s']:>9.1f}{t['peak_rss_mib']:>13.0f}{t['seconds'] / r['seconds']:>9.2f}x"
                             f"{t['cpu_s'] / max(r['cpu_s'], 1e-9):>10.2f}x")
                print(line)
            else:
                print(f"{r['what']:<24} parquet {r['parquet_mib']:.1f} MiB, whole directory {r['dir_mib']:.1f} MiB")
                if theirs is not None:
                    same, differ = compare_exports(r["out"], theirs[k]["out"])
                    print(f"{'':<24} export byte-identical to {args.against}'s: {'yes' if same else 'NO: ' + ', '.join(differ[:5])}")
                    r["identical_to_against"] = same
                    versions = (layout_version(r["out"]), layout_version(theirs[k]["out"]))
                    if not same:
                        rows = same_rows(r["out"], theirs[k]["out"])
                        print(f"{'':<24} layout versions {versions[0]} vs {versions[1]}; same rows in every config and split: "
                              f"{'yes' if rows else 'NO'}")
                        r["same_rows_as_against"] = rows
        for name, rows in (("ours", results), ("against", theirs or [])):
            for r in rows:
                if r.get("serial_share") is not None and r["what"] in ("segment", "ror run (one process)"):
                    print(f"{name} {r['what']}: main process {r['serial_share']:.0%} of {r['cpu_s']:.1f} CPU s "
                          "(the rest in its worker processes, sampled from /proc)")
        stage_peaks = [r["peak_rss_mib"] for r in results if "peak_rss_mib" in r and not r["what"].startswith("ror run")]
        if stage_peaks:
            print(f"peak RSS over the stages: {max(stage_peaks):.0f} MiB (target: < 2048 MiB at 1M segments)")
        if args.json:
            def clean(rows: list[dict]) -> list[dict]:
                return [{k: (str(v) if isinstance(v, Path) else v) for k, v in r.items() if k != "stdout"} for r in rows]
            args.json.write_text(json.dumps({"n_traces": n_traces, "n_segments": n_segments, "workers": args.workers,
                                             "results": clean(results), "against": clean(theirs) if theirs else None}, indent=2))
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

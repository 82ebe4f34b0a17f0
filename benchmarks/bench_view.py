"""The viewer at scale: ``ror view`` build time and peak RSS, index open time and a 60,000-character
trace page's render time in Chromium.

Builds a synthetic store from the embedded sample (renumbered copies of its 40 real traces under
distinct ids ``<id>~cNNNNN``, plus one trace of about 60,000 characters made by joining sample
texts), segments it and labels it with the offline baseline and a second rater (the baseline's label
changed on every 4th segment, so the dashboard has agreement figures), then measures:

* ``ror view`` in a child process (``os.wait4``: its own peak RSS) -- against a baseline measured in
  the same run: a child that only reads the same traces, segments and labels in the same batches
  (the store read the build cannot avoid); the ratio is the cost of writing the site;
* with ``--against TREE``: the same ``ror view`` from another checkout (e.g. ``git archive main``
  unpacked in /tmp) on the same store, in the same run: time and memory ratios old / new;
* what the site holds: bytes, files, the largest file of each kind (trace shard, index shard,
  confusion-cell shard, ``data/index.js``, ``data/dashboard.js``);
* in headless Chromium (``/usr/bin/chromium``): the index page until its first rows are rendered and
  until every index shard is loaded, and the 60,000-character trace page until every segment is in
  the DOM -- against opening a one-line static page from the same folder in the same browser (the
  browser's own floor);
* with ``--index-rows N``: the index page of a copy of the site whose index shards list the built
  traces' rows repeated (renamed) up to N rows -- the index page reads nothing else, so this is the
  index's open time at N traces without building N traces.

The store is kept in ``--workdir`` when given: a second run with the same ``--workdir`` and
``--traces`` reuses it (only the build and the browser are measured again).

Targets (issue 25): 10,000 traces / 1,000,000 segments build with memory flat under 2 GiB; the
index opens in under 2 s and the long trace page renders in under 1 s. Figures are printed, never
asserted.

Usage::

    python benchmarks/bench_view.py --traces 200            # a quick figure
    python benchmarks/bench_view.py --traces 10000          # the issue's scale (long: segmenting it)
    python benchmarks/bench_view.py --traces 2000 --workdir /tmp/bv2k --against /tmp/main_tree   # old vs new
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

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LONG_ID = "long-60k"
READ_ONLY = """
import sys
from ror_annotate.store import Store
from ror_annotate.view.build import store_batches
n = 0
with Store(sys.argv[1], read_only=True) as store:
    for b in store_batches(store, int(sys.argv[2])):
        n += len(b.segments) + len(b.labels) + len(b.trace.text)
print(n)
"""


def make_store(work: Path, n_traces: int) -> tuple[Path, int]:
    """A store of ``n_traces`` renumbered sample traces plus the long one; returns (path, n_segments)."""
    import numpy as np

    from ror_annotate import pipeline
    from ror_annotate.records import BEHAVIORS, Trace
    from ror_annotate.sample import sample_path
    from ror_annotate.store import RaterLabels, Store

    rows = [json.loads(line) for line in sample_path().open(encoding="utf-8")]
    corpus = work / "traces.jsonl"
    with corpus.open("w", encoding="utf-8") as f:
        for i in range(n_traces):
            r = rows[i % len(rows)]
            f.write(json.dumps(dict(r, trace_id=f"{r['trace_id']}~c{i:05d}"), ensure_ascii=False) + "\n")
    long_text, k = "", 0
    while len(long_text) < 60_000:
        long_text += rows[k % len(rows)]["trace"] + "\n\n"
        k += 1
    db = work / "bench.duckdb"
    with Store(db) as store:
        pipeline.ingest(store, corpus)
        store.upsert_traces([Trace(trace_id=LONG_ID, text=long_text[:60_000], model="synthetic")])
        pipeline.segment(store)
        pipeline.label(store, judge="baseline")
        # alice: the baseline's label, changed on every 4th segment (columnar: no Label object per label)
        (baseline,) = [a for s, a, _ in store.annotators() if s == "baseline"]
        table = store.latest_rater_labels([baseline])
        index = table.column("segment_index").to_numpy()
        codes = np.array([BEHAVIORS.index(x) for x in table.column("label").to_pylist()], dtype=np.int64)
        codes = np.where(index % 4 == 1, (codes + 1) % len(BEHAVIORS), codes)
        store.replace_rater_labels("human", "alice", RaterLabels(table.column("trace_id").to_pylist(), index, codes, codebook_version="v1"))
        n_segments = store.counts()["segments"]
    (work / "store.json").write_text(json.dumps({"traces": n_traces, "segments": n_segments}), encoding="utf-8")
    return db, n_segments


def reuse_store(work: Path, n_traces: int) -> tuple[Path, int] | None:
    """The store an earlier run left in ``work`` for the same ``n_traces``, if any."""
    meta = work / "store.json"
    if not meta.exists() or not (work / "bench.duckdb").exists():
        return None
    got = json.loads(meta.read_text(encoding="utf-8"))
    return (work / "bench.duckdb", got["segments"]) if got["traces"] == n_traces else None


def run_child(argv: list[str], root: Path = ROOT) -> dict:
    """Run ``argv`` with ``root`` on the path; wall seconds and the child's own peak RSS (MiB, from ``os.wait4``)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # cwd: `-m` looks there first
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out, err = proc.communicate()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed:\n{err.decode()[-2000:]}")
    return {"wall_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024}


def _payload(path: Path) -> dict:
    text = path.read_text(encoding="ascii")
    return json.loads(text[text.index("(") + 1 : text.rindex(")")])


def inflate_index(site: Path, out: Path, n_rows: int) -> None:
    """A copy of ``site``'s pages whose index lists ``n_rows`` rows (the built rows repeated, ids renamed)."""
    from ror_annotate.view.build import INDEX_COLUMNS, INDEX_SHARD_SIZE, index_shard_path, read_index_rows

    shutil.copytree(site, out, ignore=shutil.ignore_patterns("t", "rows", "cells"))
    meta = _payload(site / "data" / "index.js")
    rows = read_index_rows(site)
    (out / "data" / "rows").mkdir(parents=True)
    shards = 0
    for start in range(0, n_rows, INDEX_SHARD_SIZE):
        part = [dict(rows[i % len(rows)], id=f"{rows[i % len(rows)]['id']}~x{i}", n=i) for i in range(start, min(n_rows, start + INDEX_SHARD_SIZE))]
        body = json.dumps({"k": shards, "rows": [[r[c] for c in INDEX_COLUMNS] for r in part]})
        (out / index_shard_path(shards)).write_text(f"ROR.rows({body});\n", encoding="ascii")
        shards += 1
    meta.update(n_traces=n_rows, index_shards=shards)
    (out / "data" / "index.js").write_text(f"ROR.index({json.dumps(meta)});\n", encoding="ascii")


def site_figures(site: Path) -> dict:
    """Bytes and files of the site, and the largest file of each kind (KiB)."""
    kinds = {"trace shard": "data/t/", "index shard": "data/rows/", "cell shard": "data/cells/", "index.js": "data/index.js",
             "dashboard.js": "data/dashboard.js", "cells.js (before sharding)": "data/cells.js"}
    files = [(f, f.stat().st_size) for f in site.rglob("*") if f.is_file()]
    largest = {}
    for kind, prefix in kinds.items():
        sizes = [size for f, size in files if prefix and f.relative_to(site).as_posix().startswith(prefix)]
        if sizes:
            largest[kind] = max(sizes) / 1024
    return {"bytes": sum(s for _, s in files), "files": len(files), "largest_kib": largest}


def index_time(site: Path, repeats: int) -> tuple[float, float]:
    """Best-of-``repeats`` seconds until the index shows its first rows, and until every shard is loaded."""
    from playwright.sync_api import sync_playwright

    first, full = float("inf"), float("inf")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for _ in range(repeats):
            page.goto("about:blank")
            start = time.perf_counter()
            page.goto((site / "index.html").as_uri(), wait_until="commit")
            page.wait_for_selector("#traces tbody tr", state="attached", timeout=120_000)
            first = min(first, time.perf_counter() - start)
            page.wait_for_selector("#traces[data-loaded='all']", state="attached", timeout=120_000)
            full = min(full, time.perf_counter() - start)
        browser.close()
    return first, full


def browser_times(site: Path, long_n: int, n_long_segments: int, repeats: int) -> dict:
    from playwright.sync_api import sync_playwright

    (site / "blank.html").write_text("<!DOCTYPE html><title>blank</title><p>blank</p>\n", encoding="utf-8")
    out: dict[str, list[float]] = {"blank_s": [], "index_s": [], "index_all_s": [], "long_trace_s": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for _ in range(repeats):
            for key, url, ready in (
                ("blank_s", (site / "blank.html").as_uri(), "p"),
                ("index_s", (site / "index.html").as_uri(), "#traces tbody tr"),
                ("index_all_s", (site / "index.html").as_uri(), "#traces[data-loaded='all']"),
                ("long_trace_s", (site / "trace.html").as_uri() + f"#t={long_n}", f"#text .seg[data-i='{n_long_segments - 1}']"),
            ):
                page.goto("about:blank")
                start = time.perf_counter()
                page.goto(url, wait_until="commit")  # not "load": the index page delays its load event until every shard is in
                page.wait_for_selector(ready, state="attached", timeout=60_000)
                out[key].append(time.perf_counter() - start)
        browser.close()
    return {k: min(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=int, default=200, help="renumbered sample traces (plus the 60k-character one)")
    ap.add_argument("--batch-size", type=int, default=200)
    ap.add_argument("--resamples", type=int, default=200, help="bootstrap resamples of the dashboard's agreement")
    ap.add_argument("--no-agreement", action="store_true", help="build without the agreement figures (ror view --no-agreement)")
    ap.add_argument("--index-rows", type=int, default=0, help="also time the index page listing this many rows (built rows repeated)")
    ap.add_argument("--repeats", type=int, default=3, help="browser timings: best of this many")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the store (and the site) here; a later run with the same --traces reuses the store")
    ap.add_argument("--against", type=Path, default=None, help="also build with `ror view` from this checkout, on the same store")
    ap.add_argument("--no-browser", action="store_true", help="skip the Chromium timings")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    work = (args.workdir or Path(tempfile.mkdtemp(prefix="bench_view_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        reused = reuse_store(work, args.traces)
        db, n_segments = reused or make_store(work, args.traces)
        print(f"store: {args.traces + 1} traces, {n_segments} segments, 2 raters "
              + ("(reused)" if reused else f"(prepared in {time.perf_counter() - t0:.1f} s)"))
        read = run_child([sys.executable, "-c", READ_ONLY, str(db), str(args.batch_size)])
        site = work / "site"
        view_args = ["view", "--db", str(db), "--batch-size", str(args.batch_size), "--resamples", str(args.resamples),
                     *(["--no-agreement"] if args.no_agreement else [])]
        build = run_child([sys.executable, "-m", "ror_annotate", *view_args, "--out", str(site)])
        fig = site_figures(site)
        print(f"read only (baseline): {read['wall_s']:.2f} s, peak RSS {read['peak_rss_mib']:.0f} MiB")
        print(f"ror view build:       {build['wall_s']:.2f} s, peak RSS {build['peak_rss_mib']:.0f} MiB "
              f"(x{build['wall_s'] / read['wall_s']:.2f} time, x{build['peak_rss_mib'] / read['peak_rss_mib']:.2f} memory of the read); "
              f"{n_segments / build['wall_s']:.0f} segments/s")
        print(f"site: {fig['bytes'] / 2**20:.1f} MiB in {fig['files']} files; largest (KiB): "
              + ", ".join(f"{k} {v:.0f}" for k, v in fig["largest_kib"].items()))
        if args.against:
            old_site = work / "site_against"
            old = run_child([sys.executable, "-m", "ror_annotate", *view_args, "--out", str(old_site)], root=args.against.resolve())
            old_fig = site_figures(old_site)
            print(f"ror view from {args.against}: {old['wall_s']:.2f} s, peak RSS {old['peak_rss_mib']:.0f} MiB "
                  f"(x{old['wall_s'] / build['wall_s']:.2f} time, x{old['peak_rss_mib'] / build['peak_rss_mib']:.2f} memory of ours); "
                  f"site {old_fig['bytes'] / 2**20:.1f} MiB, largest (KiB): " + ", ".join(f"{k} {v:.0f}" for k, v in old_fig["largest_kib"].items()))
            shutil.rmtree(old_site, ignore_errors=True)
        from ror_annotate.view.build import read_index_rows

        rows = read_index_rows(site)
        long_row = next(r for r in rows if r["id"] == LONG_ID)
        if args.no_browser or not Path("/usr/bin/chromium").exists():
            print("browser timings skipped")
            return
        times = browser_times(site, long_row["n"], long_row["segments"], args.repeats)
        print(f"chromium, best of {args.repeats}: blank page {times['blank_s'] * 1000:.0f} ms (baseline); "
              f"index of {len(rows)} traces: first rows {times['index_s'] * 1000:.0f} ms (x{times['index_s'] / times['blank_s']:.1f}), "
              f"every shard loaded {times['index_all_s'] * 1000:.0f} ms (x{times['index_all_s'] / times['blank_s']:.1f}); "
              f"{long_row['chars']}-character trace page, {long_row['segments']} segments: {times['long_trace_s'] * 1000:.0f} ms "
              f"(x{times['long_trace_s'] / times['blank_s']:.1f})")
        if args.index_rows:
            inflate_index(site, work / "site_big", args.index_rows)
            first, full = index_time(work / "site_big", args.repeats)
            print(f"index page listing {args.index_rows} rows (built rows repeated): first rows {first * 1000:.0f} ms "
                  f"(x{first / times['blank_s']:.1f} the blank page), every shard loaded {full * 1000:.0f} ms (x{full / times['blank_s']:.1f})")
            shutil.rmtree(work / "site_big", ignore_errors=True)
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

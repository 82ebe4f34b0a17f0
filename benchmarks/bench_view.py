"""The viewer at scale: ``ror view`` build time and peak RSS, index open time and a 60,000-character
trace page's render time in Chromium.

Builds a synthetic store from the embedded sample (renumbered copies of its 40 real traces under
distinct ids ``<id>~cNNNNN``, plus one trace of about 60,000 characters made by joining sample
texts), segments it and labels it with the offline baseline and a second rater (the baseline's label
changed on every 4th segment, so the dashboard has agreement figures), then measures:

* ``ror view`` in a child process (``os.wait4``: its own peak RSS) -- against a baseline measured in
  the same run: a child that only reads the same traces, segments and labels in the same batches
  (the store read the build cannot avoid); the ratio is the cost of writing the site;
* in headless Chromium (``/usr/bin/chromium``): the index page until its table is rendered, and the
  60,000-character trace page until every segment is in the DOM -- against opening a one-line
  static page from the same folder in the same browser (the browser's own floor);
* with ``--index-rows N``: the index page of a copy of the site whose ``data/index.js`` lists the
  built traces' rows repeated (renamed) up to N rows -- the index page reads nothing else, so this is
  the index's open time at N traces without building N traces.

Targets (issue 25): 10,000 traces / 1,000,000 segments build with memory flat under 2 GiB; the
index opens in under 2 s and the long trace page renders in under 1 s. Figures are printed, never
asserted.

Usage::

    python benchmarks/bench_view.py --traces 200            # a quick figure
    python benchmarks/bench_view.py --traces 10000          # the issue's scale (long: segmenting it)
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
    from ror_annotate import pipeline
    from ror_annotate.records import BEHAVIORS, Label, Trace
    from ror_annotate.sample import sample_path
    from ror_annotate.store import Store

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
        batch: list[Label] = []
        for lab in store.labels(source="baseline"):
            name = BEHAVIORS[(BEHAVIORS.index(lab.label) + 1) % 6] if lab.segment_index % 4 == 1 else lab.label
            batch.append(Label(trace_id=lab.trace_id, segment_index=lab.segment_index, label=name, source="human", annotator="alice", codebook_version="v1"))
            if len(batch) >= 50_000:
                store.upsert_labels(batch)
                batch = []
        store.upsert_labels(batch)
        n_segments = store.counts()["segments"]
    return db, n_segments


def run_child(argv: list[str]) -> dict:
    """Run ``argv``; wall seconds and the child's own peak RSS (MiB, from ``os.wait4``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out, err = proc.communicate()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed:\n{err.decode()[-2000:]}")
    return {"wall_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024}


def inflate_index(site: Path, out: Path, n_rows: int) -> None:
    """A copy of ``site``'s pages whose index lists ``n_rows`` rows (the built rows repeated, ids renamed)."""
    shutil.copytree(site, out, ignore=shutil.ignore_patterns("t"))
    text = (site / "data" / "index.js").read_text(encoding="ascii")
    index = json.loads(text[text.index("(") + 1 : text.rindex(")")])
    rows = index["traces"]
    index["traces"] = [dict(rows[i % len(rows)], id=f"{rows[i % len(rows)]['id']}~x{i}") for i in range(n_rows)]
    (out / "data" / "index.js").write_text(f"ROR.index({json.dumps(index)});\n", encoding="ascii")


def index_time(site: Path, repeats: int) -> float:
    from playwright.sync_api import sync_playwright

    best = float("inf")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for _ in range(repeats):
            page.goto("about:blank")
            start = time.perf_counter()
            page.goto((site / "index.html").as_uri())
            page.wait_for_selector("#traces tbody tr", state="attached", timeout=60_000)
            best = min(best, time.perf_counter() - start)
        browser.close()
    return best


def browser_times(site: Path, long_n: int, n_long_segments: int, repeats: int) -> dict:
    from playwright.sync_api import sync_playwright

    (site / "blank.html").write_text("<!DOCTYPE html><title>blank</title><p>blank</p>\n", encoding="utf-8")
    out: dict[str, list[float]] = {"blank_s": [], "index_s": [], "long_trace_s": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for _ in range(repeats):
            for key, url, ready in (
                ("blank_s", (site / "blank.html").as_uri(), "p"),
                ("index_s", (site / "index.html").as_uri(), "#traces tbody tr"),
                ("long_trace_s", (site / "trace.html").as_uri() + f"#t={long_n}", f"#text .seg[data-i='{n_long_segments - 1}']"),
            ):
                page.goto("about:blank")
                start = time.perf_counter()
                page.goto(url)
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
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_view_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        db, n_segments = make_store(work, args.traces)
        print(f"store: {args.traces + 1} traces, {n_segments} segments, 2 raters (prepared in {time.perf_counter() - t0:.1f} s)")
        read = run_child([sys.executable, "-c", READ_ONLY, str(db), str(args.batch_size)])
        site = work / "site"
        build = run_child([sys.executable, "-m", "ror_annotate", "view", "--db", str(db), "--out", str(site), "--batch-size", str(args.batch_size),
                           "--resamples", str(args.resamples), *(["--no-agreement"] if args.no_agreement else [])])
        size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
        print(f"read only (baseline): {read['wall_s']:.2f} s, peak RSS {read['peak_rss_mib']:.0f} MiB")
        print(f"ror view build:       {build['wall_s']:.2f} s, peak RSS {build['peak_rss_mib']:.0f} MiB "
              f"(x{build['wall_s'] / read['wall_s']:.2f} time, x{build['peak_rss_mib'] / read['peak_rss_mib']:.2f} memory of the read); "
              f"site {size / 2**20:.1f} MiB, {n_segments / build['wall_s']:.0f} segments/s")
        index = (site / "data" / "index.js").read_text(encoding="ascii")
        rows = json.loads(index[index.index("(") + 1 : index.rindex(")")])["traces"]
        long_row = next(r for r in rows if r["id"] == LONG_ID)
        if not Path("/usr/bin/chromium").exists():
            print("no /usr/bin/chromium: browser timings skipped")
            return
        times = browser_times(site, long_row["n"], long_row["segments"], args.repeats)
        print(f"chromium, best of {args.repeats}: blank page {times['blank_s'] * 1000:.0f} ms (baseline); "
              f"index of {len(rows)} traces {times['index_s'] * 1000:.0f} ms (x{times['index_s'] / times['blank_s']:.1f}); "
              f"{long_row['chars']}-character trace page, {long_row['segments']} segments: {times['long_trace_s'] * 1000:.0f} ms "
              f"(x{times['long_trace_s'] / times['blank_s']:.1f})")
        if args.index_rows:
            inflate_index(site, work / "site_big", args.index_rows)
            big = index_time(work / "site_big", args.repeats)
            print(f"index page listing {args.index_rows} rows (built rows repeated): {big * 1000:.0f} ms (x{big / times['blank_s']:.1f} the blank page)")
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

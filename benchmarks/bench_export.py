"""Export at the method's corpus size: ~80,000 segments in ~330 traces, with a real tokenizer.

Builds a store by segmenting the real traces in ../shared/data/traces.jsonl with the project's
segmenter and replicating them (consecutive traces concatenated, segment offsets shifted) up to the
target size, labels every segment (seeded random behaviors: label values do not change the export's
cost), trains a byte-level BPE tokenizer offline on the same text (4,096 pieces, GPT-2/Qwen style),
then measures, each in a fresh child process so peak memory is its own:

* ``import``        -- importing the export stack (the memory floor of any run),
* ``tokenize``      -- batch-encoding every trace with offsets, nothing else (the floor of any token-aligned export),
* ``segments-only`` -- ``export_dataset`` without a tokenizer,
* ``full``          -- ``export_dataset`` with the tokenizer (raw rendering), the figure the target is about,
* ``full+chat``     -- the same with the chat-template rendering.

Prints seconds, peak RSS (MiB) and ratios against ``tokenize`` and ``segments-only``.
Target (issue 5): ``full`` under 60 s and 2 GiB on a 2-core machine.

Usage::

    python benchmarks/bench_export.py [--traces 330] [--segments 80000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "traces.jsonl"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def build_store(db: Path, n_traces: int, n_segments: int) -> dict:
    import numpy as np

    from ror_annotate.records import BEHAVIORS, Label, Segment, Trace
    from ror_annotate.segment import Segmenter
    from ror_annotate.store import Store

    rows = [json.loads(line) for line in SHARED.open(encoding="utf-8")]
    segmenter = Segmenter()
    t0 = time.perf_counter()
    real = [(r, segmenter.segment(r["trace"], r["trace_id"])) for r in rows]
    seg_seconds = time.perf_counter() - t0
    per_trace = n_segments / n_traces
    store = Store(db)
    rng = np.random.default_rng(0)
    i = 0
    made_segments = 0
    traces, seg_lists = [], []
    for k in range(n_traces):
        want = round((k + 1) * per_trace) - round(k * per_trace)
        parts, segs, offset = [], [], 0
        while len(segs) < want:
            r, rsegs = real[i % len(real)]
            i += 1
            if not rsegs:
                continue
            if parts:
                offset += 2  # "\n\n" between concatenated pieces
            take = rsegs[: want - len(segs)]  # cut the last piece at a segment end
            for s in take:
                segs.append(Segment(trace_id=f"bench-{k:04d}", segment_index=len(segs), char_start=s.char_start + offset,
                                    char_end=s.char_end + offset, text=s.text, n_tokens=s.n_tokens))
            piece = r["trace"][: take[-1].char_end] if len(take) < len(rsegs) else r["trace"]
            parts.append(piece)
            offset += len(piece)
        text = "\n\n".join(parts)
        assert all(text[x.char_start : x.char_end] == x.text for x in segs)
        traces.append(Trace(trace_id=f"bench-{k:04d}", text=text, problem=r.get("problem"), answer=r.get("answer"),
                            gold_answer=r.get("gold_answer"), model=r.get("model"), dataset=r.get("benchmark")))
        seg_lists.append(segs)
        made_segments += len(segs)
    store.upsert_traces(traces)
    labels = []
    for t, segs in zip(traces, seg_lists):
        store.replace_segments(t.trace_id, segs, segmenter="bench-replicated", token_counter="approx")
        picks = rng.integers(0, len(BEHAVIORS), size=len(segs))
        labels += [Label(trace_id=s.trace_id, segment_index=s.segment_index, label=BEHAVIORS[p], source="judge",
                         annotator="bench:random", codebook_version="bench", extra={"model": "bench-random"})
                   for s, p in zip(segs, picks)]
    store.upsert_labels(labels)
    store.close()
    chars = sum(len(t.text) for t in traces)
    return {"traces": len(traces), "segments": made_segments, "chars": chars, "segment_seconds_real": seg_seconds}


def train_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rows = [json.loads(line)["trace"] for line in SHARED.open(encoding="utf-8")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=4096, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False)
    tok.train_from_iterator(rows, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                            chat_template=CHATML).save_pretrained(str(path))


def _peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux carries that over exec from the
    forked parent, so a spawned child would report the parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(kind: str, db: str, tok: str, out: str, q) -> None:
    t0 = time.perf_counter()
    from ror_annotate.export import export_dataset
    from ror_annotate.store import Store

    result: dict = {}
    if kind == "tokenize":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tok)
        with Store(db) as store:
            texts = [t.text for t in store.iter_traces()]
        t1 = time.perf_counter()
        enc = tokenizer(texts, return_offsets_mapping=True, verbose=False)
        result["tokens"] = sum(len(x) for x in enc["input_ids"])
        result["seconds_work"] = time.perf_counter() - t1
    elif kind != "import":
        with Store(db) as store:
            t1 = time.perf_counter()
            s = export_dataset(store, out, tokenizer=tok if kind.startswith("full") else None,
                               chat_template=kind == "full+chat")
            result["seconds_work"] = time.perf_counter() - t1
            result["tokens"] = s.n_tokens
            result["straddling"] = s.n_straddling
    result["seconds"] = time.perf_counter() - t0
    result["peak_rss_mib"] = _peak_rss_mib()
    q.put(result)


def measure(kind: str, db: Path, tok: Path, out: Path) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(kind, str(db), str(tok), str(out), q))
    p.start()
    while True:
        try:
            result = q.get(timeout=5)
            break
        except queue.Empty:
            if not p.is_alive():
                raise SystemExit(f"the {kind!r} run died (exit code {p.exitcode}); see its traceback above") from None
    p.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=int, default=330)
    ap.add_argument("--segments", type=int, default=80_000)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    if not SHARED.exists():
        sys.exit(f"{SHARED} not found: the benchmark replicates the real traces")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_export_"))
    work.mkdir(parents=True, exist_ok=True)
    db, tok, out = work / "bench.duckdb", work / "tokenizer", work / "export"
    t0 = time.perf_counter()
    built = build_store(db, args.traces, args.segments)
    print(f"store: {built['traces']} traces, {built['segments']} segments, {built['chars']:,} chars "
          f"(built in {time.perf_counter() - t0:.1f} s; segmenting the real traces took {built['segment_seconds_real']:.1f} s)")
    t0 = time.perf_counter()
    train_tokenizer(tok)
    print(f"tokenizer: byte-level BPE, 4,096 pieces, trained offline in {time.perf_counter() - t0:.1f} s")
    results = {kind: measure(kind, db, tok, out) for kind in ("import", "tokenize", "segments-only", "full", "full+chat")}
    base_tok = results["tokenize"]["seconds_work"]
    base_seg = results["segments-only"]["seconds_work"]
    print(f"\n{'run':<14}{'seconds':>9}{'work s':>9}{'peak MiB':>10}{'tokens':>11}{'x tokenize':>12}{'x segments':>12}")
    for kind, r in results.items():
        work_s = r.get("seconds_work")
        ratio_t = f"{work_s / base_tok:.1f}" if work_s and base_tok else ""
        ratio_s = f"{work_s / base_seg:.1f}" if work_s and base_seg else ""
        print(f"{kind:<14}{r['seconds']:>9.1f}{(work_s or 0):>9.1f}{r['peak_rss_mib']:>10.0f}{r.get('tokens') or '':>11}"
              f"{ratio_t:>12}{ratio_s:>12}")
    full = results["full"]
    ok = full["seconds"] < 60 and full["peak_rss_mib"] < 2048
    print(f"\nfull export with tokenizer: {full['seconds']:.1f} s, peak {full['peak_rss_mib']:.0f} MiB, "
          f"{full.get('straddling')} straddling tokens -> target (<60 s, <2 GiB) {'met' if ok else 'NOT met'}")
    print(f"work directory: {work}")


if __name__ == "__main__":
    main()

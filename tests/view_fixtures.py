"""A small store for the viewer tests: real sample traces, a hostile CJK/emoji/CRLF trace, three raters.

Raters: the offline baseline (``baseline:cue-v1``, through the real pipeline), a human ``alice``
(the baseline's label with every 4th segment changed, a rationale holding HTML), and an aggregate
``ds`` with a class distribution and confidence on every other segment.
"""

from __future__ import annotations

import json
from pathlib import Path

from ror_annotate import pipeline
from ror_annotate.records import BEHAVIORS, Label, Trace
from ror_annotate.sample import sample_path
from ror_annotate.store import Store

#: Text of the hostile trace: markup, Markdown, CJK, emoji (astral, ZWJ sequence), CRLF line ends.
HOSTILE_TEXT = (
    "Let me think about <script>window.__pwned = 1</script> this.\r\n"
    "First, I compute 2 + 2 = 4 with <img src=x onerror=\"window.__pwned = 2\"> and **bold** _markdown_.\r\n"
    "然后我们计算面积：长 × 宽 = 12。 这很简单。\r\n"
    "Wait, let me check 🤔 again 👩‍👩‍👧 — the answer is \\boxed{4}.\r\n"
    "So the answer is 4 &amp; done </div> 𝔘𝔫𝔦𝔠𝔬𝔡𝔢."
)
HOSTILE_ID = "hostile <b>id</b> & \"quotes\""
RATIONALE = "Because <img src=x onerror=\"window.__pwned = 3\"> says so; **not bold**"


def build_store(tmp: Path, n_sample: int = 4) -> Path:
    """Write the store; return its path."""
    rows = [json.loads(line) for line in sample_path().open(encoding="utf-8")][:n_sample]
    crlf = dict(rows[0], trace_id="crlf-origin", trace=rows[0]["trace"].replace("\n", "\r\n"))
    src = tmp / "traces.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [*rows, crlf]), encoding="utf-8")
    db = tmp / "view.duckdb"
    with Store(db) as store:
        pipeline.ingest(store, src)
        store.upsert_traces([Trace(trace_id=HOSTILE_ID, text=HOSTILE_TEXT, problem="<h1>2+2</h1> *?*", answer="<b>4</b>", gold_answer="4",
                                   model="m<script>", dataset="d&d")])
        pipeline.segment(store)
        pipeline.label(store, judge="baseline")
        extra = []
        for lab in store.labels(source="baseline"):
            changed = BEHAVIORS[(BEHAVIORS.index(lab.label) + 1) % len(BEHAVIORS)] if lab.segment_index % 4 == 1 else lab.label
            extra.append(Label(trace_id=lab.trace_id, segment_index=lab.segment_index, label=changed, source="human", annotator="alice",
                               codebook_version="v1", rationale=RATIONALE if lab.trace_id == HOSTILE_ID else None))
            if lab.segment_index % 2 == 0:  # ds: on even segments, a distribution peaked at 0.75 (or 0.3: low confidence)
                top = BEHAVIORS.index(lab.label) if lab.segment_index % 3 else (BEHAVIORS.index(changed) + 2) % len(BEHAVIORS)
                peak = 0.75 if lab.segment_index % 5 else 0.3
                p = [peak if k == top else (1 - peak) / (len(BEHAVIORS) - 1) for k in range(len(BEHAVIORS))]
                extra.append(Label(trace_id=lab.trace_id, segment_index=lab.segment_index, label=BEHAVIORS[top], source="aggregate",
                                   annotator="ds", codebook_version="v1", confidence=max(p), distribution=p))
        store.upsert_labels(extra)
    return db


#: The one trace of :func:`tiny_store`: four segments under the clause segmenter.
TINY_TEXT = "Let me think. First, 2 + 2 = 4. Wait, check: 2 + 2 = 4 indeed. So the answer is 4."


def tiny_store(db: Path, *, human: str | None = None) -> Path:
    """A store of one trace (``"only"``) labelled by the offline baseline; with ``human``, also by that human
    annotator, who keeps the baseline's label on odd segments and takes the next behavior on even ones."""
    with Store(db) as store:
        store.upsert_traces([Trace(trace_id="only", text=TINY_TEXT)])
        pipeline.segment(store)
        pipeline.label(store, judge="baseline")
        if human:
            store.upsert_labels([
                Label(trace_id=lab.trace_id, segment_index=lab.segment_index, source="human", annotator=human, codebook_version="v1",
                      label=lab.label if lab.segment_index % 2 else BEHAVIORS[(BEHAVIORS.index(lab.label) + 1) % len(BEHAVIORS)])
                for lab in store.labels()])
    return db

"""Build the static viewer site from a store: one small data file per trace, an index, a dashboard.

Layout of the site (``DIR``)::

    index.html  trace.html  compare.html  dashboard.html  cell.html   pages (static, from assets/)
    assets/view.css  assets/view.js                                    style and the one script
    data/index.js                                                      every trace's index row, the raters
    data/t/<k>/<n>.js                                                  trace ``n``'s text, segments, labels
    data/dashboard.js  data/cells.js                                   agreement, confusion cells, ledger
    data/agreement.json                                                the same figures as ``ror agree --json``

Data files are JavaScript calling a function (``ROR.shard({...})``, JSONP style) because a page opened
from ``file://`` may load ``<script src>`` but not ``fetch()`` a file. Every string is JSON with
non-ASCII escaped (``\\uXXXX``, astral characters as UTF-16 surrogate pairs), so the page reads
exactly the Python string; segment texts are sliced in Python (``trace.text[char_start:char_end]``,
code-point offsets), so no offset is converted in the browser. Pages only ever insert data with
``textContent``: no text from the data is parsed as HTML.

Traces are read in batches of ``batch_size`` (traces, their segments, their labels), so memory stays
bounded by a batch plus one index row per trace.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from ..analytics import SegmentView, analyze_trace
from ..errors import AgreementError, ViewError
from ..options import StageOptions
from ..records import BEHAVIORS, Label, Segment, Trace

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

#: Which rater colours a trace by default: the first of these sources that labelled it.
SOURCE_PRIORITY: tuple[str, ...] = ("adjudicated", "human", "aggregate", "verify", "judge", "import", "baseline")
#: Static pages copied from the package's ``assets`` folder.
PAGES: tuple[str, ...] = ("index.html", "trace.html", "compare.html", "dashboard.html", "cell.html")
#: Files under ``assets/`` copied to ``DIR/assets``.
ASSETS: tuple[str, ...] = ("view.css", "view.js")
#: Traces per shard sub-folder (keeps folders small at 10,000+ traces).
SHARD_DIR_SIZE = 1000


class ViewOptions(StageOptions):
    """Options of ``ror view`` (the viewer site).

    Attributes
    ----------
    batch_size : int
        Traces read from the store per batch (memory is bounded by one batch).
    low_confidence : float
        A label with a confidence below this (in [0, 1]) is "low confidence" for the filter.
    reference : str
        Reference of the dashboard's confusion matrices, as ``ror agree --reference``.
    resamples : int
        Bootstrap resamples of the agreement intervals (as ``ror agree --resamples``).
    seed : int
        Bootstrap seed (as ``ror agree --seed``).
    cell_examples : int
        At most this many segments listed behind one confusion-matrix cell.
    agreement : bool
        Compute the dashboard's agreement figures (``ror agree`` holds every label in memory at once:
        turn it off for a corpus too large for that).
    title : str
        Title shown on every page.
    """

    stage: ClassVar[str] = "the view stage"
    batch_size: int = Field(200, ge=1)
    low_confidence: float = Field(0.6, ge=0.0, le=1.0)
    reference: str = "majority"
    resamples: int = Field(1000, ge=0)
    seed: int = 0
    cell_examples: int = Field(500, ge=0)
    agreement: bool = True
    title: str = "ror_annotate viewer"


@dataclass
class ViewSummary:
    """What :func:`build_view` wrote.

    Attributes
    ----------
    out : Path
        The site folder; open ``out / "index.html"``.
    traces, segments, labels : int
        Counts written into the trace shards.
    raters : list of str
        Every rater with labels, in display order.
    agreement : str or None
        Why there are no agreement figures (None when there are).
    """

    out: Path
    traces: int = 0
    segments: int = 0
    labels: int = 0
    raters: list[str] = field(default_factory=list)
    agreement: str | None = None

    @property
    def index(self) -> Path:
        """The entry point, ``out / "index.html"``."""
        return self.out / "index.html"


# --------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class TraceBundle:
    """One trace with its segments (ordered by index) and every label on them."""

    trace: Trace
    segments: list[Segment]
    labels: list[Label]


@dataclass
class Rater:
    """A rater as the site shows it: id, label source and kind (machine or human)."""

    name: str
    source: str
    kind: str


def order_raters(pairs: Sequence[tuple[str, str]], kinds: dict[str, str]) -> list[Rater]:
    """Raters ``(source, annotator)`` in display order: by :data:`SOURCE_PRIORITY`, then by name.

    An annotator found under two sources is shown once, under its first source in that order.
    """
    rank = {s: i for i, s in enumerate(SOURCE_PRIORITY)}
    out: dict[str, Rater] = {}
    for source, name in sorted(pairs, key=lambda p: (rank.get(p[0], len(rank)), p[1])):
        out.setdefault(name, Rater(name, source, kinds.get(name, "machine")))
    return list(out.values())


def store_batches(store: "Store", batch_size: int) -> Iterator[TraceBundle]:
    """Every segmented trace of ``store`` with its segments and labels, read ``batch_size`` traces at a time."""
    segmented = store.segmentations()
    ids = [t for t in store.trace_ids() if t in segmented]
    for start in range(0, len(ids), batch_size):
        batch = ids[start : start + batch_size]
        segs = store.segments_by_trace(batch)
        by_trace: dict[str, list[Label]] = {}
        for lab in store.labels(trace_ids=batch):
            by_trace.setdefault(lab.trace_id, []).append(lab)
        for trace in store.iter_traces(batch):
            yield TraceBundle(trace, sorted(segs.get(trace.trace_id, []), key=lambda s: s.segment_index), by_trace.get(trace.trace_id, []))


def js_payload(callback: str, data: Any) -> str:
    """``ROR.<callback>(<json>);`` with every non-ASCII character escaped and ``</`` broken up.

    ``ensure_ascii`` makes the file pure ASCII (a lone surrogate in the data cannot break the
    encoding) and the page decodes ``\\uXXXX`` into exactly the original string; ``<\\/`` keeps a
    ``</script>`` inside a string from ending anything if the payload is ever inlined.
    """
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"), default=str).replace("</", "<\\/")
    return f"ROR.{callback}({text});\n"


def shard_path(n: int) -> str:
    """Relative path of trace ``n``'s data file (also computed by view.js)."""
    return f"data/t/{n // SHARD_DIR_SIZE}/{n}.js"


def round_starts(labels: Sequence[str | None], first: int | None) -> list[int]:
    """Positions (in ``labels``) of the segments that open a re-checking round after position ``first``.

    Same rule as :func:`ror_annotate.analytics.analyze_trace`: a round opens at a ``planning`` or
    ``reflection`` segment that follows a ``conclusion``.
    """
    if first is None:
        return []
    out, open_allowed = [], True
    for i in range(first + 1, len(labels)):
        if labels[i] == "conclusion":
            open_allowed = True
        elif labels[i] in ("planning", "reflection") and open_allowed:
            out.append(i)
            open_allowed = False
    return out


def trace_shard(n: int, bundle: TraceBundle, rater_index: dict[str, int], low_confidence: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shard of one trace and its index row.

    Returns
    -------
    (dict, dict)
        The shard (text pieces, segments, labels, analytics) and the index row
        (id, model, dataset, length, correctness, agreement, disagreements).
    """
    trace, segments = bundle.trace, bundle.segments
    text = trace.text
    cat = {b: i for i, b in enumerate(BEHAVIORS)}
    gaps: list[str] = []
    segs: list[list[Any]] = []
    pos = 0
    for s in segments:
        gaps.append(text[pos : s.char_start] if s.char_start >= pos else "")
        segs.append([text[s.char_start : s.char_end], s.n_tokens, s.char_start, s.char_end])
        pos = max(pos, s.char_end)
    gaps.append(text[pos:])
    index_of = {s.segment_index: i for i, s in enumerate(segments)}
    per_seg: list[list[list[Any]]] = [[] for _ in segments]
    used: set[int] = set()
    for lab in bundle.labels:
        i = index_of.get(lab.segment_index)
        r = rater_index.get(lab.annotator)
        if i is None or r is None:
            continue
        conf = lab.confidence
        if conf is None and lab.distribution is not None:
            conf = max(lab.distribution)
        per_seg[i].append([r, cat[lab.label], conf, lab.rationale, lab.distribution, lab.study])
        used.add(r)
    for entries in per_seg:
        entries.sort(key=lambda e: e[0])
    raters = sorted(used)
    primary = raters[0] if raters else None
    prim_labels: list[str | None] = []
    for entries in per_seg:
        hit = next((e for e in entries if e[0] == primary), None)
        prim_labels.append(BEHAVIORS[hit[1]] if hit else None)
    analytics = analyze_trace(
        trace.trace_id,
        [SegmentView(s.segment_index, prim_labels[i], str(segs[i][0]), s.n_tokens) for i, s in enumerate(segments)],
        answer=trace.answer, gold_answer=trace.gold_answer, correct=trace.correct,
    ).to_dict()
    first = index_of.get(analytics["first_answer_segment"]) if analytics["first_answer_segment"] is not None else None
    multi = [e for e in per_seg if len(e) >= 2]
    n_dis = sum(1 for e in multi if len({x[1] for x in e}) > 1)
    n_low = sum(1 for e in per_seg if any(x[0] == primary and x[2] is not None and x[2] < low_confidence for x in e))
    shard = {
        "n": n, "id": trace.trace_id, "model": trace.model, "dataset": trace.dataset, "source": trace.source,
        "correct": trace.correct, "problem": trace.problem, "answer": trace.answer, "gold": trace.gold_answer,
        "n_chars": len(text), "gaps": gaps, "segs": segs, "labels": per_seg, "raters": raters, "primary": primary,
        "analytics": analytics, "first": first, "rounds": round_starts(prim_labels, first),
    }
    row = {
        "n": n, "id": trace.trace_id, "model": trace.model, "dataset": trace.dataset, "chars": len(text),
        "segments": len(segments), "correct": trace.correct, "raters": raters,
        "agreement": (len(multi) - n_dis) / len(multi) if multi else None, "disagreements": n_dis, "low": n_low,
    }
    return shard, row


# --------------------------------------------------------------------------------------------- build
def _copy_static(out: Path, title: str) -> None:
    root = resources.files("ror_annotate.view") / "assets"
    (out / "assets").mkdir(parents=True, exist_ok=True)
    for name in ASSETS:
        (out / "assets" / name).write_bytes((root / name).read_bytes())
    for name in PAGES:
        html = (root / name).read_text(encoding="utf-8")
        (out / name).write_text(html.replace("{{TITLE}}", _html_escape(title)), encoding="utf-8")


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _prepare_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ViewError(f"--out {out} is a file; give a folder for the site", code="E851")
    if out.exists() and any(out.iterdir()) and not (out / "data" / "index.js").exists():
        raise ViewError(f"--out {out} is a non-empty folder that holds no viewer site; give an empty or new folder", code="E851")
    if (out / "data").exists():
        shutil.rmtree(out / "data")  # an earlier build: its shards are replaced, none left behind
    (out / "data" / "t").mkdir(parents=True, exist_ok=True)


def write_site(
    out: Path,
    bundles: Iterator[TraceBundle],
    raters: list[Rater],
    options: ViewOptions,
    *,
    dashboard: dict[str, Any] | None = None,
    cells: dict[str, Any] | None = None,
    agreement_json: dict[str, Any] | None = None,
    origin: str = "",
) -> ViewSummary:
    """Write the site from trace bundles (any source: store or export).

    Raises
    ------
    ViewError
        E851: ``out`` is a file or a non-empty folder that is not a viewer site; E852: no segmented trace.
    """
    _prepare_out(out)
    _copy_static(out, options.title)
    rater_index = {r.name: i for i, r in enumerate(raters)}
    summary = ViewSummary(out=out, raters=[r.name for r in raters])
    rows = []
    for n, bundle in enumerate(bundles):
        shard, row = trace_shard(n, bundle, rater_index, options.low_confidence)
        path = out / shard_path(n)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(js_payload("shard", shard), encoding="ascii")
        rows.append(row)
        summary.traces += 1
        summary.segments += len(bundle.segments)
        summary.labels += sum(len(e) for e in shard["labels"])
    if not rows:
        raise ViewError(f"no segmented trace in {origin or 'the input'}: run `ror segment` (or `ror run`) first", code="E852")
    index = {
        "title": options.title, "origin": origin, "behaviors": list(BEHAVIORS), "low_confidence": options.low_confidence,
        "raters": [r.__dict__ for r in raters], "traces": rows, "shard_dir_size": SHARD_DIR_SIZE,
    }
    (out / "data" / "index.js").write_text(js_payload("index", index), encoding="ascii")
    dash = dict(dashboard or {})
    dash.setdefault("agreement", None)
    (out / "data" / "dashboard.js").write_text(js_payload("dashboard", dash), encoding="ascii")
    (out / "data" / "cells.js").write_text(js_payload("cells", cells or {}), encoding="ascii")
    if agreement_json is not None:
        (out / "data" / "agreement.json").write_text(json.dumps(agreement_json, indent=2, allow_nan=False, ensure_ascii=False), encoding="utf-8")
    return summary


# --------------------------------------------------------------------------------------------- dashboard
def cost_ledger(store: "Store") -> list[dict[str, Any]]:
    """One row per run that made judge requests: run id, command, status, start, requests, tokens, cost in USD.

    The counters are read from :attr:`Run.counts` (flat for ``ror label``, under ``"label"`` for ``ror run``).
    """
    out = []
    for run in store.runs():
        found = [c for c in (run.counts, run.counts.get("label")) if isinstance(c, dict) and "requests" in c]
        for c in found:
            out.append({
                "run_id": run.run_id, "command": run.command, "status": run.status, "started_at": run.started_at.isoformat(),
                "requests": int(c.get("requests") or 0), "cached_responses": int(c.get("cached_responses") or 0),
                "input_tokens": int(c.get("input_tokens") or 0), "output_tokens": int(c.get("output_tokens") or 0),
                "cost_usd": float(c.get("cost_usd") or 0.0), "labeled": int(c.get("labeled") or 0),
            })
    return out


def review_progress(store: "Store") -> list[dict[str, Any]]:
    """Per-annotator progress of every review study in the store (empty when no study was created)."""
    has = store.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'review_studies'").fetchone()
    if not has or not has[0]:
        return []
    from ..review.sync import study_status

    out = []
    for (name,) in store.execute("SELECT name FROM review_studies ORDER BY name").fetchall():
        for p in study_status(store, name):
            out.append({"study": name, "annotator": p.pseudonym, "role": p.role, "assigned": p.assigned, "labeled": p.labeled,
                        "skipped": p.skipped, "rejected": p.rejected, "remaining": p.remaining})
    return out


class _Cells:
    """The segments behind every confusion-matrix cell, gathered while the traces stream by.

    Same reference as :func:`ror_annotate.agreement.agreement` with ``reference="majority"``: for rater
    ``a``, the most frequent label of the other raters on the segment (no reference on a tie); with an
    annotator name as reference, that annotator's label. Rows index the reference's label, columns
    the rater's (the layout of ``ror agree``). At most ``limit`` segments are listed per cell.
    """

    def __init__(self, reference: str, raters: list[Rater], limit: int) -> None:
        self.reference, self.raters, self.limit = reference, raters, limit
        self.cells: dict[int, dict[str, Any]] = {}

    def add(self, bundle: TraceBundle, per_seg: list[list[list[Any]]]) -> None:
        if self.reference in ("human", "adjudicated", "", "none"):
            return
        ref_rater = next((i for i, r in enumerate(self.raters) if r.name == self.reference), None)
        if self.reference != "majority" and ref_rater is None:
            return
        text = bundle.trace.text
        for seg, entries in zip(bundle.segments, per_seg):
            for e in entries:
                if self.reference == "majority":
                    counts = Counter(x[1] for x in entries if x[0] != e[0]).most_common(2)
                    if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
                        continue
                    ref = counts[0][0]
                else:
                    if e[0] == ref_rater:
                        continue
                    hit = next((x for x in entries if x[0] == ref_rater), None)
                    if hit is None:
                        continue
                    ref = hit[1]
                cell = self.cells.setdefault(e[0], {}).setdefault(f"{ref},{e[1]}", {"n": 0, "items": []})
                cell["n"] += 1
                if len(cell["items"]) < self.limit:
                    cell["items"].append([seg.trace_id, seg.segment_index, text[seg.char_start : seg.char_end][:300]])

    def result(self, agreement: dict[str, Any] | None) -> dict[str, Any]:
        """``{annotator: {"r,c": {"n": count, "items": [[trace_id, segment_index, text[:300]], ...]}}}`` for the
        raters ``agreement["per_class"]`` scores (empty without agreement figures)."""
        scored = ((agreement or {}).get("per_class") or {}).get("annotators") or {}
        return {self.raters[i].name: cells for i, cells in self.cells.items() if self.raters[i].name in scored}


class _Calibration:
    """Confidence vs accuracy per rater, against the majority of the other raters on the segment.

    Ten equal-width confidence bins over [0, 1] (the last closed); a segment counts for a rater when it
    has a confidence and the other raters' labels have a unique most frequent label (ties skipped).
    Accuracy per bin = matches / n; the reliability diagram of DeGroot & Fienberg (1983).
    """

    def __init__(self) -> None:
        self.bins: dict[int, list[list[float]]] = {}

    def add(self, per_seg: list[list[list[Any]]]) -> None:
        for entries in per_seg:
            if len(entries) < 2:
                continue
            for e in entries:
                if e[2] is None:
                    continue
                others = Counter(x[1] for x in entries if x[0] != e[0])
                if not others:
                    continue
                top = others.most_common(2)
                if len(top) > 1 and top[0][1] == top[1][1]:
                    continue
                b = min(int(e[2] * 10), 9)
                rows = self.bins.setdefault(e[0], [[0, 0, 0.0] for _ in range(10)])
                rows[b][0] += 1
                rows[b][1] += int(top[0][0] == e[1])
                rows[b][2] += e[2]

    def result(self) -> dict[str, Any]:
        return {str(r): [{"n": n, "correct": c, "mean_confidence": s / n if n else None} for n, c, s in rows] for r, rows in self.bins.items()}


def build_view(store: "Store", out: str | Path, options: ViewOptions | None = None) -> ViewSummary:
    """Build the viewer site from a store.

    Parameters
    ----------
    store : Store
        Read only; every segmented trace is written, with every rater's labels.
    out : str or Path
        Site folder (created; an earlier site there is replaced).
    options : ViewOptions, optional

    Returns
    -------
    ViewSummary

    Raises
    ------
    ViewError
        E851 bad output folder, E852 no segmented trace.
    """
    options = options or ViewOptions()
    out = Path(out)
    raters = order_raters([(s, a) for s, a, _ in store.annotators()], store.rater_kinds())
    calib = _Calibration()
    cells = _Cells(options.reference, raters, options.cell_examples)

    def bundles() -> Iterator[TraceBundle]:
        rater_index = {r.name: i for i, r in enumerate(raters)}
        for b in store_batches(store, options.batch_size):
            per_seg = _labels_by_segment(b, rater_index)
            calib.add(per_seg)
            cells.add(b, per_seg)
            yield b

    agreement_json: dict[str, Any] | None = None
    why: str | None = None
    try:
        from ..agreement import agreement_summary

        if not options.agreement:
            raise AgreementError("turned off (--no-agreement)")
        ref = None if options.reference in ("", "none") else options.reference
        agreement_json = agreement_summary(store, reference=ref, n_resamples=options.resamples, confidence_level=0.95, seed=options.seed)
    except AgreementError as exc:
        why = exc.message
    dashboard: dict[str, Any] = {
        "agreement": agreement_json, "agreement_missing": why,
        "agree_command": f"ror agree --json --reference {options.reference} --resamples {options.resamples} --seed {options.seed}",
        "label_counts": [{"source": s, "annotator": a, "counts": c} for (s, a), c in store.label_counts().items()],
        "ledger": cost_ledger(store), "review": review_progress(store),
    }
    summary = write_site(out, bundles(), raters, options, dashboard=dashboard, agreement_json=agreement_json, origin=str(store.path))
    dashboard["calibration"] = calib.result()
    (out / "data" / "dashboard.js").write_text(js_payload("dashboard", dashboard), encoding="ascii")
    (out / "data" / "cells.js").write_text(js_payload("cells", cells.result(agreement_json)), encoding="ascii")
    summary.agreement = why
    return summary


def _labels_by_segment(bundle: TraceBundle, rater_index: dict[str, int]) -> list[list[list[Any]]]:
    index_of = {s.segment_index: i for i, s in enumerate(bundle.segments)}
    per_seg: list[list[list[Any]]] = [[] for _ in bundle.segments]
    for lab in bundle.labels:
        i, r = index_of.get(lab.segment_index), rater_index.get(lab.annotator)
        if i is None or r is None:
            continue
        conf = lab.confidence if lab.confidence is not None else (max(lab.distribution) if lab.distribution else None)
        per_seg[i].append([r, BEHAVIORS.index(lab.label), conf])
    return per_seg


def build_view_from_export(path: str | Path, out: str | Path, options: ViewOptions | None = None) -> ViewSummary:
    """Build the viewer site from an exported dataset folder (its ``data/*/*.parquet`` files).

    The export has one label per segment, so the site has trace pages, the index and the label
    distribution, and no agreement figures (build from the store for those).

    Raises
    ------
    ViewError
        E853 not an export folder, E854 an incomplete export, E851 bad output folder, E852 no trace.
    """
    from ..records import SOURCE_KINDS
    from .sources import export_bundles

    options = options or ViewOptions()
    bundles, pairs = export_bundles(path)
    raters = order_raters(pairs, {a: SOURCE_KINDS.get(s, "machine") for s, a in pairs})
    counts: dict[tuple[str, str], Counter[str]] = {}
    source_of = {r.name: r.source for r in raters}

    def counted() -> Iterator[TraceBundle]:
        for b in bundles:
            for lab in b.labels:
                counts.setdefault((source_of.get(lab.annotator, lab.source), lab.annotator), Counter())[lab.label] += 1
            yield b

    why = "an export has one label per segment; build the site from the store (`ror view --db ...`) for agreement figures"
    summary = write_site(Path(out), counted(), raters, options, origin=str(path))
    dashboard: dict[str, Any] = {
        "agreement": None, "agreement_missing": why, "calibration": {}, "ledger": [], "review": [],
        "label_counts": [{"source": s, "annotator": a, "counts": dict(c)} for (s, a), c in sorted(counts.items())],
    }
    (Path(out) / "data" / "dashboard.js").write_text(js_payload("dashboard", dashboard), encoding="ascii")
    summary.agreement = why
    return summary

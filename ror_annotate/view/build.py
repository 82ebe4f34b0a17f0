"""Build the static viewer site from a store: one small data file per trace, an index, a dashboard.

Layout of the site (``DIR``)::

    index.html  trace.html  compare.html  dashboard.html  cell.html   pages (static, from assets/)
    assets/view.css  assets/view.js                                    style and the one script
    data/index.js                                                      the raters, counts, how the rows are sharded
    data/rows/<k>.js                                                   index rows ``k*S .. k*S+S-1`` (S = INDEX_SHARD_SIZE)
    data/t/<k>/<n>.js                                                  trace ``n``'s text, segments, labels
    data/dashboard.js                                                  agreement, calibration, ledger, review progress
    data/cells/<rater>/<r>_<c>.js                                      the segments behind one confusion-matrix cell
    data/agreement.json                                                the same figures as ``ror agree --json``

Data files are JavaScript calling a function (``ROR.shard({...})``, JSONP style) because a page opened
from ``file://`` may load ``<script src>`` but not ``fetch()`` a file. Every string is JSON with
non-ASCII escaped (``\\uXXXX``, astral characters as UTF-16 surrogate pairs), so the page reads
exactly the Python string; segment texts are sliced in Python (``trace.text[char_start:char_end]``,
code-point offsets), so no offset is converted in the browser. Pages only ever insert data with
``textContent``: no text from the data is parsed as HTML.

Traces are read in batches of ``batch_size`` (traces, their segments, their labels) and every file
is written as soon as its data are complete (a trace's shard after its batch, an index shard every
``INDEX_SHARD_SIZE`` traces), so memory is bounded by one batch, one index shard and the confusion
cells' listed segments (at most ``cell_examples`` per cell), whatever the corpus size. The agreement
figures come from integer codes (:mod:`ror_annotate.view.agreement`), not from Label objects. The
index page loads the row shards one after another and renders only the rows in view.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from ..analytics import SegmentView, analyze_trace
from ..errors import AgreementError, ViewError
from ..options import Resamples, Seed, StageOptions
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
#: Index rows per ``data/rows/<k>.js`` file (the index page shows the first file's rows while the rest load).
INDEX_SHARD_SIZE = 2000
#: Fields of an index row, in the order each row of ``data/rows/<k>.js`` lists them.
INDEX_COLUMNS: tuple[str, ...] = ("n", "id", "model", "dataset", "chars", "segments", "correct", "raters", "agreement", "disagreements", "low")


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
        Compute the dashboard's agreement figures (from integer label codes,
        :mod:`ror_annotate.view.agreement`; off: the dashboard says so).
    title : str
        Title shown on every page.
    """

    stage: ClassVar[str] = "the view stage"
    batch_size: int = Field(200, ge=1)
    low_confidence: float = Field(0.6, ge=0.0, le=1.0)
    reference: str = "majority"
    resamples: Resamples = 1000
    seed: Seed = 0
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
    """Every segmented trace of ``store`` with its segments and labels, read ``batch_size`` traces at a time.

    Between batches the store's cached table blocks are released (:meth:`Store.release_cache`), so
    memory stays at one batch whatever the corpus size.
    """
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
        del segs, by_trace
        store.release_cache()  # DuckDB keeps every block read until its memory_limit: drop them as the corpus streams by


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


def index_shard_path(k: int) -> str:
    """Relative path of the ``k``-th index shard (rows ``k * INDEX_SHARD_SIZE`` onwards; also computed by view.js)."""
    return f"data/rows/{k}.js"


def cell_path(rater: int, ref: int, said: int) -> str:
    """Relative path of the segments behind confusion cell (reference ``ref``, rater said ``said``) of rater number ``rater``."""
    return f"data/cells/{rater}/{ref}_{said}.js"


def read_index_rows(site: str | Path) -> list[dict[str, Any]]:
    """Every index row of a built site, as dicts keyed by :data:`INDEX_COLUMNS` (for tests and scripts).

    Raises
    ------
    ViewError
        E860: ``site`` holds no built index (``data/index.js``) or an index shard is missing.
    """
    root = Path(site)
    try:
        meta = _read_payload(root / "data" / "index.js")
        rows: list[dict[str, Any]] = []
        for k in range(meta["index_shards"]):
            rows += [dict(zip(meta["columns"], r)) for r in _read_payload(root / index_shard_path(k))["rows"]]
    except (OSError, ValueError, KeyError) as exc:
        raise ViewError(f"{root} holds no complete viewer index ({exc})", code="E860") from exc
    return rows


def _read_payload(path: Path) -> Any:
    text = path.read_text(encoding="ascii")
    return json.loads(text[text.index("(") + 1 : text.rindex(")")])


class _IndexWriter:
    """Index rows written ``INDEX_SHARD_SIZE`` at a time, and the best trace to compare each rater pair on.

    ``compare[(a, b)]`` is the trace number with the most disagreements among traces labelled by
    both raters ``a < b`` (the first such trace on a tie), for the dashboard's "most disagreements" link.
    """

    def __init__(self, out: Path) -> None:
        self.out, self.shards, self.count = out, 0, 0
        self.rows: list[list[Any]] = []
        self.size = INDEX_SHARD_SIZE
        self.compare: dict[tuple[int, int], tuple[int, int]] = {}

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append([row[c] for c in INDEX_COLUMNS])
        self.count += 1
        raters = row["raters"]
        for i, a in enumerate(raters):
            for b in raters[i + 1 :]:
                best = self.compare.get((a, b))
                if best is None or row["disagreements"] > best[0]:
                    self.compare[(a, b)] = (row["disagreements"], row["n"])
        if len(self.rows) >= self.size:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        path = self.out / index_shard_path(self.shards)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(js_payload("rows", {"k": self.shards, "rows": self.rows}), encoding="ascii")
        self.shards += 1
        self.rows = []


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


#: Code of a site file that cannot be written (:func:`write_site`).
SITE_WRITE_FAILED = "E770"


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
    dashboard: Callable[[], dict[str, Any]] | None = None,
    cells: Callable[[], dict[str, Any]] | None = None,
    agreement_json: dict[str, Any] | None = None,
    origin: str = "",
) -> ViewSummary:
    """Write the site from trace bundles (any source: store or export), each file as soon as its data are complete.

    ``dashboard`` and ``cells`` are called once every bundle is written (their figures are gathered
    while the bundles stream by): the dashboard's data and ``{annotator: {"r,c": cell}}`` (see
    :meth:`_Cells.result`), each cell written to its own file.

    Raises
    ------
    ViewError
        E851: ``out`` is a file or a non-empty folder that is not a viewer site; E852: no segmented trace;
        E770: a file of the site cannot be written (a folder that cannot be created or written, a full
        disk: the ``OSError``'s reason and file are named).
    """
    try:
        return _write_site(out, bundles, raters, options, dashboard=dashboard, cells=cells, agreement_json=agreement_json, origin=origin)
    except OSError as exc:
        where = exc.filename or out
        raise ViewError(f"cannot write the site to --out {out}: {exc.strerror or type(exc).__name__} ({where}); "
                        "give a folder you can write to, on a disk with free space", code=SITE_WRITE_FAILED) from None


def _write_site(
    out: Path,
    bundles: Iterator[TraceBundle],
    raters: list[Rater],
    options: ViewOptions,
    *,
    dashboard: Callable[[], dict[str, Any]] | None,
    cells: Callable[[], dict[str, Any]] | None,
    agreement_json: dict[str, Any] | None,
    origin: str,
) -> ViewSummary:
    _prepare_out(out)
    _copy_static(out, options.title)
    rater_index = {r.name: i for i, r in enumerate(raters)}
    summary = ViewSummary(out=out, raters=[r.name for r in raters])
    index = _IndexWriter(out)
    for n, bundle in enumerate(bundles):
        shard, row = trace_shard(n, bundle, rater_index, options.low_confidence)
        path = out / shard_path(n)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(js_payload("shard", shard), encoding="ascii")
        index.add(row)
        summary.traces += 1
        summary.segments += len(bundle.segments)
        summary.labels += sum(len(e) for e in shard["labels"])
    if not summary.traces:
        raise ViewError(f"no segmented trace in {origin or 'the input'}: run `ror segment` (or `ror run`) first", code="E852")
    index.flush()
    meta = {
        "title": options.title, "origin": origin, "behaviors": list(BEHAVIORS), "low_confidence": options.low_confidence,
        "raters": [r.__dict__ for r in raters], "shard_dir_size": SHARD_DIR_SIZE, "n_traces": summary.traces,
        "n_segments": summary.segments, "index_shards": index.shards, "index_shard_size": index.size, "columns": list(INDEX_COLUMNS),
    }
    (out / "data" / "index.js").write_text(js_payload("index", meta), encoding="ascii")
    dash = dict(dashboard() if dashboard else {})
    dash.setdefault("agreement", None)
    dash["compare"] = {f"{a},{b}": n for (a, b), (_, n) in sorted(index.compare.items())}
    (out / "data" / "dashboard.js").write_text(js_payload("dashboard", dash), encoding="ascii")
    for rater, by_cell in (cells() if cells else {}).items():
        for key, cell in by_cell.items():
            ref, said = (int(x) for x in key.split(","))
            path = out / cell_path(rater_index[rater], ref, said)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(js_payload("cell", {"annotator": rater, "r": ref, "c": said, **cell}), encoding="ascii")
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
                "requests": _count(c.get("requests")), "cached_responses": _count(c.get("cached_responses")),
                "input_tokens": _count(c.get("input_tokens")), "output_tokens": _count(c.get("output_tokens")),
                "cost_usd": _count(c.get("cost_usd"), float), "labeled": _count(c.get("labeled")),
            })
    return out


def _count(value: Any, kind: type = int) -> Any:
    """A ledger counter as a finite number, or None where the run recorded it as unknown (None, a word
    such as ``"unknown"``, NaN): shown as "unknown", never as 0 and never a crash."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return kind(value)


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

    def add(self, n: int, bundle: TraceBundle, per_seg: list[list[list[Any]]]) -> None:
        """Count trace number ``n``'s segments into their cells (``per_seg``: ``[rater, label code, confidence]`` per label)."""
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
                    cell["items"].append([seg.trace_id, seg.segment_index, text[seg.char_start : seg.char_end][:300], n])

    def result(self, agreement: dict[str, Any] | None) -> dict[str, Any]:
        """``{annotator: {"r,c": {"n": count, "items": [[trace_id, segment_index, text[:300], trace number], ...]}}}`` for the
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
        for n, b in enumerate(store_batches(store, options.batch_size)):
            per_seg = _labels_by_segment(b, rater_index)
            calib.add(per_seg)
            cells.add(n, b, per_seg)
            yield b

    agreement_json: dict[str, Any] | None = None
    why: str | None = None
    try:
        from .agreement import view_agreement

        if not options.agreement:
            raise AgreementError("turned off (--no-agreement)")
        ref = None if options.reference in ("", "none") else options.reference
        agreement_json = view_agreement(store, reference=ref, n_resamples=options.resamples, confidence_level=0.95, seed=options.seed,
                                        batch_size=options.batch_size)
    except AgreementError as exc:
        why = why_no_agreement([r for r in raters if r.source != "adjudicated"], exc.message)
    dashboard: dict[str, Any] = {
        "agreement": agreement_json, "agreement_missing": why,
        "agree_command": f"ror agree --json --reference {options.reference} --resamples {options.resamples} --seed {options.seed}",
        "label_counts": [{"source": s, "annotator": a, "counts": c} for (s, a), c in store.label_counts().items()],
        "ledger": cost_ledger(store), "review": review_progress(store),
    }
    summary = write_site(out, bundles(), raters, options, dashboard=lambda: {**dashboard, "calibration": calib.result()},
                         cells=lambda: cells.result(agreement_json), agreement_json=agreement_json, origin=str(store.path))
    summary.agreement = why
    return summary


def why_no_agreement(raters: Sequence[Rater], message: str) -> str:
    """The dashboard's one line when there are no agreement figures.

    Parameters
    ----------
    raters : sequence of Rater
        The raters that could be compared (adjudications left out: they are a reference, not a rater).
    message : str
        The :class:`~ror_annotate.errors.AgreementError`'s message, said as is when two or more raters exist.

    Returns
    -------
    str
        With no rater or one rater: why there is nothing to compare and what to do; else ``message``.
    """
    if not raters:
        return "No labels yet, so there is nothing to compare. Label the segments (`ror label`), then build this site again."
    if len(raters) == 1:
        return (f"One rater ({raters[0].name}) labelled this store, so there is nothing to compare: Cohen's kappa, macro-F1 "
                "and the confusion matrices need a second rater. Label with a second judge (`ror label --judge openai:MODEL`) "
                "or pull human labels (`ror review pull`), then build this site again.")
    return message


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
    summary = write_site(Path(out), counted(), raters, options, origin=str(path), dashboard=lambda: {
        "agreement": None, "agreement_missing": why, "calibration": {}, "ledger": [], "review": [],
        "label_counts": [{"source": s, "annotator": a, "counts": dict(c)} for (s, a), c in sorted(counts.items())],
    })
    summary.agreement = why
    return summary

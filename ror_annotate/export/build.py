"""Build an export from the store, batch by batch, in bounded memory.

Order of work: read one key row per segmented trace and decide the splits from trace ids (and the
stratification field); then read traces, segments and labels one batch at a time, choose each
segment's label, align to tokens when a tokenizer is given, and hand the rows to the writers; last,
the card, the manifest and the analytics are written and the directory is swapped in.

Memory holds one batch of rows plus per-trace key rows and analytics (a few hundred bytes per
trace), whatever the number of segments.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pydantic import ConfigDict

from ..errors import ConfigError, ExportError, ExportWriteError, RorError
from ..options import Seed, StageOptions
from ..records import BEHAVIORS, SOURCE_KINDS
from ..store import Store
from . import read
from .columns import BEHAVIOR_ID, CONFIGS, Rows, SegmentRow, TraceRow, token_row
from .labels import LABEL_CHOICES, SOURCES_USED, ChosenLabel, choose_label
from .splits import check_fractions, split_traces
from .write import LAYOUT_VERSION, MANIFEST, WRITE_FAILED, ExportWriter, check_replaceable, license_allows_publishing, new_tmp_dir, swap_in, write_json

if TYPE_CHECKING:  # pragma: no cover
    from ..card import CardFigures

#: Code of the error for ``--labels aggregate`` / ``--labels import`` on a store without such labels.
MISSING_RATER = "E830"

#: Name of the built-in token-count approximation (``ror_annotate.segment``), as the card spells it.
APPROX_PREFIX = "approx:"


@dataclass
class ExportSummary:
    """What an export wrote.

    Attributes
    ----------
    out_dir : Path -- the export directory (absolute, local; the manifest records only its name)
    name : str
    configs : list of str -- ``["traces", "segments"]`` or ``["traces", "segments", "tokens"]``
    n_rows : dict -- ``{config: {split: rows}}``
    label_counts : dict -- exported segments per behavior (plus ``"unlabeled"``)
    label_source_counts : dict -- exported segments per chosen source
    n_traces, n_segments : int
    n_tokens : int or None -- tokens in the ``tokens`` configuration
    n_straddling : int or None -- tokens straddling a segment boundary
    n_ties : int -- segments left unlabeled by a tied vote
    n_skipped_traces : int -- traces without segments (not exported)
    paths : dict -- relative to ``out_dir``: ``{"card": "README.md", "manifest": ..., "<config>": save_to_disk dir,
        "<config>/<split>": parquet file or glob}``
    analytics : dict -- :func:`ror_annotate.analytics.summarize` output
    parameters : dict -- options of the export (tokenizer by public name, its vocabulary hash ...)
    segment_length : dict -- ``unit``, ``counter``, ``median``, ``p5``, ``p95``, ``max`` of segment lengths (tokens)
    token_counter : dict -- what counted ``n_tokens``: ``name``, ``kind`` ("subject tokenizer" or
        "approximation"), ``segments`` per counter name
    trace_sources : dict -- ``{"models"|"datasets"|"sources": {value: n_traces}}``
    sources : list of dict -- per (source, licence): ``source``, ``license``, ``publishable``, ``n_traces``
    provenance : dict -- codebook versions, judge models, prompt template hashes (segments each),
        annotators in the store, tool version
    uncertainty : dict -- ``raters`` (every rater with labels: annotator, kind, source, model, n_labels,
        crosswalk), ``aggregate`` (the aggregate rater read, or None) and its ``aggregation_method``,
        ``ensemble`` (the raters the aggregate combined, with kind and model, and its human mode;
        None without one), ``n_labelled``, ``n_human_verified``, ``human_verified_share``,
        ``n_with_confidence``, ``mean_label_confidence`` over the exported labelled segments, and
        ``calibration`` (:func:`ror_annotate.agreement.calibration_summary` with ``ror agree``'s
        defaults: ECE and Brier with intervals per machine rater with a confidence, or a ``note``
        saying why none was measured)
    seconds : float
    """

    out_dir: Path
    name: str
    configs: list[str]
    n_rows: dict[str, dict[str, int]]
    label_counts: dict[str, int]
    label_source_counts: dict[str, int]
    n_traces: int
    n_segments: int
    n_tokens: int | None
    n_straddling: int | None
    n_ties: int
    n_skipped_traces: int
    paths: dict[str, str]
    analytics: dict[str, Any]
    parameters: dict[str, Any] = field(default_factory=dict)
    segment_length: dict[str, Any] = field(default_factory=dict)
    token_counter: dict[str, Any] = field(default_factory=dict)
    trace_sources: dict[str, dict[str, int]] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    uncertainty: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict without local paths: ``out_dir`` is the directory's name, ``paths`` are relative."""
        d = asdict(self)
        d["out_dir"] = self.out_dir.name
        return d

    def table_rows(self) -> list[tuple[str, str]]:
        """``(field, value)`` rows for a summary table."""
        rows = [("export", str(self.out_dir)), ("traces", str(self.n_traces)), ("segments", str(self.n_segments))]
        for config, splits in self.n_rows.items():
            rows.append((f"{config} rows", ", ".join(f"{s} {n}" for s, n in splits.items())))
        rows.append(("labels", ", ".join(f"{k} {v}" for k, v in self.label_counts.items() if v)))
        rows.append(("label sources", ", ".join(f"{k} {v}" for k, v in self.label_source_counts.items())))
        if self.n_tokens is not None:
            rows.append(("tokens", f"{self.n_tokens} ({self.n_straddling} straddling a segment boundary)"))
        if self.n_ties:
            rows.append(("tied votes (unlabeled)", str(self.n_ties)))
        u = self.uncertainty
        if u.get("n_labelled"):
            rows.append(("human-verified labels", f"{u['n_human_verified']} of {u['n_labelled']}"))
            if u.get("aggregate"):
                rows.append(("aggregate rater", str(u["aggregate"])))
        blocked = [s["source"] for s in self.sources if not s["publishable"]]
        if blocked:
            rows.append(("text not publishable (licence unknown)", ", ".join(str(b) for b in blocked[:5]) + (" ..." if len(blocked) > 5 else "")))
        fa = self.analytics.get("first_answer_fraction", {})
        if fa.get("median") is not None:
            rows.append(("first answer at (median share of tokens)", f"{fa['median']:.2f}"))
        flip = self.analytics.get("flip", {})
        if flip.get("n_evaluable"):
            rows.append(("flip rate", f"{flip['flip_rate']:.3f} of {flip['n_evaluable']} traces"))
        rows.append(("card", str(self.out_dir / self.paths.get("card", "README.md"))))
        return rows


def _build_time() -> str:
    """UTC time of the export, or ``SOURCE_DATE_EPOCH`` when set (the reproducible-builds convention),
    so two builds of the same store can be byte-identical."""
    import os

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch) if epoch else None))


def percentile_from_counts(counts: np.ndarray, q: float) -> float:
    """``numpy.percentile(values, q)`` (linear interpolation) from a histogram of non-negative integers.

    ``counts[v]`` is how many values equal ``v``. The sorted values are implied by the cumulative
    counts, so the ``k``-th smallest is ``searchsorted(cumsum, k, side="right")``; numpy's default
    rule interpolates between positions ``floor(q/100 (n-1))`` and ``ceil(...)``.
    """
    cum = np.cumsum(counts)
    n = int(cum[-1]) if len(cum) else 0
    if n == 0:
        return float("nan")
    pos = q / 100.0 * (n - 1)
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))
    v_lo = float(np.searchsorted(cum, lo, side="right"))
    v_hi = float(np.searchsorted(cum, hi, side="right"))
    return v_lo + (pos - lo) * (v_hi - v_lo)


class _Stats:
    """Running counts over the exported rows (constant memory in the number of segments)."""

    def __init__(self) -> None:
        self.labels: Counter[str] = Counter()
        self.sources: Counter[str] = Counter()
        self.codebooks: Counter[str] = Counter()
        self.judges: Counter[str] = Counter()
        self.prompts: Counter[str] = Counter()
        self.counters: Counter[str] = Counter()
        self.formats: Counter[str] = Counter()
        self.length_hist: np.ndarray = np.zeros(0, dtype=np.int64)
        self.n_segments = 0
        self.n_ties = 0
        self.n_tokens = 0
        self.n_straddling = 0
        self.n_verified = 0  # labelled segments whose human reference equals the label
        self.n_confident = 0  # labelled segments with a label confidence
        self.sum_confidence = 0.0

    def add_segment(self, c: ChosenLabel, verified: bool) -> None:
        """Count one exported segment: its label, source, provenance, confidence and verification."""
        if c.label is not None:
            self.n_verified += verified
            if c.confidence is not None:
                self.n_confident += 1
                self.sum_confidence += c.confidence
        self.labels[c.label or "unlabeled"] += 1
        self.sources[c.source or "none"] += 1
        for counter, value in ((self.codebooks, c.codebook_version), (self.judges, c.judge_model), (self.prompts, c.prompt_template_hash)):
            if value:
                counter[value] += 1

    def add_lengths(self, n_tok: np.ndarray) -> None:
        if not len(n_tok):
            return
        h = np.bincount(n_tok)
        if len(h) > len(self.length_hist):
            self.length_hist = np.pad(self.length_hist, (0, len(h) - len(self.length_hist)))
        self.length_hist[: len(h)] += h

    def length_profile(self, counter: str) -> dict[str, Any]:
        if not self.length_hist.sum():
            return {}
        return {
            "unit": f"tokens ({counter})",
            "counter": counter,
            "median": percentile_from_counts(self.length_hist, 50),
            "p5": percentile_from_counts(self.length_hist, 5),
            "p95": percentile_from_counts(self.length_hist, 95),
            "max": int(np.flatnonzero(self.length_hist)[-1]),
        }


def _latest_aggregate(store: Store) -> str | None:
    """The ``aggregate:*`` rater whose newest label is the newest in the store (ties: largest id), or None."""
    times = store.latest_label_times(source="aggregate")
    return max(times, key=lambda a: (times[a], a)) if times else None


def _uncertainty(store: Store, stats: _Stats, aggregate: str | None) -> dict[str, Any]:
    """The card's rater and label-uncertainty figures (see :class:`ExportSummary`)."""
    declared = store.declared_annotators()
    kinds = store.rater_kinds()
    raters = []
    for source, annotator, n in store.annotators():
        d = declared.get(annotator)
        raters.append({
            "annotator": annotator, "kind": kinds.get(annotator, "machine"), "source": source,
            "model": d.model if d is not None else None, "n_labels": n,
            "crosswalk": (d.details.get("crosswalk") if d is not None else None),
        })
    method = None
    ensemble: dict[str, Any] | None = None
    if aggregate is not None:
        d = declared.get(aggregate)
        method = (d.model if d is not None and d.model else None) or aggregate.split(":", 1)[-1]
        ensemble = _ensemble(d.details if d is not None else {}, raters)
    n_labelled = sum(v for k, v in stats.labels.items() if k != "unlabeled")
    return {
        "raters": raters, "aggregate": aggregate, "aggregation_method": method, "ensemble": ensemble, "n_labelled": n_labelled,
        "n_human_verified": stats.n_verified,
        "human_verified_share": stats.n_verified / n_labelled if n_labelled else None,
        "n_with_confidence": stats.n_confident,
        "mean_label_confidence": stats.sum_confidence / stats.n_confident if stats.n_confident else None,
    }


def _ensemble(details: Mapping[str, Any], raters: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The raters an aggregate combined (as its declaration records them, ``ror aggregate``) with their
    kind and model, and how human labels were used; None when the declaration names no raters."""
    names = details.get("raters") or []
    if not names:
        return None
    by_name = {r["annotator"]: r for r in raters}
    return {
        "raters": [{"annotator": n, "kind": by_name.get(n, {}).get("kind", "machine"), "model": by_name.get(n, {}).get("model")}
                   for n in names],
        "human": details.get("human"),
        "held_out_humans": list(details.get("held_out_humans") or []),
    }


def _check_label_source_present(store: Store, label_source: str, present: set[str]) -> None:
    """Refuse an explicit ``label_source`` none of whose labels exist: it would export every segment unlabeled."""
    used = SOURCES_USED.get(label_source)
    if used is None or present.intersection(used):
        return
    have = ", ".join(sorted(present)) or "none"
    make = {"aggregate": " (ror aggregate writes them)", "import": " (ror labels import writes them)"}.get(label_source, "")
    raise ExportError(
        f"--labels {label_source}: the store {store.path} holds no {' or '.join(repr(u) for u in used)} labels for "
        f"these traces{make} (it has: {have}), so every segment would be exported unlabeled; pick one of those sources "
        "or --labels auto",
        code=MISSING_RATER if label_source in ("aggregate", "import") else None,
    )


def _license_of(trace: Any, source_licenses: Mapping[str, str]) -> str | None:
    lic = source_licenses.get(trace.source or "")
    if lic is None and trace.meta:
        lic = trace.meta.get("license") or trace.meta.get("licence")
    return str(lic) if lic else None


def _common_license(sources: Sequence[Mapping[str, Any]]) -> str:
    """The one known licence all ``sources`` share, else ``"other"``."""
    found = {s.get("license") for s in sources}
    lic = found.pop() if len(found) == 1 else None
    return str(lic) if lic and license_allows_publishing(str(lic)) else "other"


def _counter_name(names: Counter[str]) -> str:
    from ..tokenizer import public_tokenizer_name

    public = sorted({public_tokenizer_name(None, n) for n in names})
    return ", ".join(public) if public else "unknown"


class ExportOptions(StageOptions):
    """Options of ``ror export`` / :func:`export_dataset` / :func:`ror_annotate.pipeline.export`.

    Fields are named as the command-line flags (``labels`` is ``--labels``, ``split_seed`` is
    ``--split-seed``); :func:`export_dataset` documents each one (``labels`` there is
    ``label_source``, ``split_seed`` is ``seed``). Their checks (label source, fractions,
    positive batch sizes) run in :func:`export_dataset`, as before.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    stage: ClassVar[str] = "the export stage"
    labels: str = "auto"
    tokenizer: Any = None
    chat_template: bool = False
    split_seed: Seed = 0
    split_fractions: Sequence[float] = (0.8, 0.1, 0.1)
    stratify_by: str | None = None
    name: str | None = None
    license: str | None = None
    source_licenses: Mapping[str, str] | None = None
    batch_size: int = 4096
    max_batch_segments: int = 20_000


#: export_dataset's earlier keyword names -> the option names (``label_source=`` keeps working).
_LEGACY_EXPORT_NAMES = {"label_source": "labels", "seed": "split_seed"}


def export_dataset(
    store: Store,
    out_dir: Path | str,
    options: ExportOptions | None = None,
    *,
    trace_ids: Sequence[str] | None = None,
    run_record: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    **kwargs: Any,
) -> ExportSummary:
    """Export every segmented trace of ``store`` as a Hugging Face dataset under ``out_dir``.

    Configurations: ``traces`` (the text the offsets index), ``segments`` and, with a tokenizer,
    ``tokens``. Rows are read from the store and written in batches, so peak memory does not grow
    with the corpus.

    Parameters
    ----------
    store : Store
    out_dir : Path or str
        Export directory; replaced atomically if it holds an earlier export.
    options : ExportOptions, optional
        The settings below as one model; else they are given as keywords (``**kwargs``), validated
        by :meth:`ExportOptions.from_options` (an unknown name: ConfigError with the closest one).
    label_source : {"auto", "adjudicated", "human", "judge", "baseline", "majority", "aggregate", "import"}
        Which labels to export (:mod:`ror_annotate.export.labels`); ``aggregate`` (and ``auto``) read the
        aggregate rater whose newest label is the newest (:meth:`Store.latest_label_times`).
    tokenizer : str, Path or tokenizer object, optional
        Fast tokenizer of the subject model (``tokenizer.json``, a directory or a model name, see
        :func:`ror_annotate.tokenizer.load_tokenizer`). Without it no ``tokens`` configuration is
        written and ``n_tokens`` comes from the store (the segmentation's token counter).
    chat_template : bool
        Tokenize the chat-template rendering instead of the raw reasoning text.
    seed : int
        Split shuffle seed.
    split_fractions : (train, validation, test)
    stratify_by : {"dataset", "model", "source"}, optional
    name : str, optional
        Dataset name in the card (default: the directory name).
    license : str, optional
        Licence identifier of the dataset written in the card. Default: the licence of the traces'
        sources when every source has the same known one (the embedded sample's ``mit``, kept with
        its stored traces), else ``"other"``.
    source_licenses : mapping, optional
        ``{trace source: licence id}`` for the traces' sources (a trace's ``meta["license"]`` is
        used otherwise). A source without a known licence is listed as not publishable, and
        :func:`~ror_annotate.export.publish_export` refuses to upload its text unless told to.
    trace_ids : sequence of str, optional
        Export only these traces (default: every segmented trace in the store).
    run_record : mapping, optional
        A run that could not be recorded in the store (a read-only store): written into the
        manifest under ``"run"``, with the export's counts and end time.
    batch_size : int
        Most traces read, tokenized and written per batch (default 4,096; the files do not depend
        on it: layout version 2, see :mod:`ror_annotate.export.write`).
    progress : callable, optional
        Called as ``progress(traces_done, traces_total)`` after each batch (a progress bar).
    max_batch_segments : int
        About how many segments one batch holds (bounds memory).

    Returns
    -------
    ExportSummary

    Raises
    ------
    ConfigError
        Unknown ``label_source``/``stratify_by``, bad fractions, unloadable tokenizer.
    AlignmentError
        A segment whose tokens do not cover exactly its text.
    ExportError
        Nothing to export; ``out_dir`` is a non-export directory; a corrupt store row (``E811``,
        naming the row); writing failed.
    """
    t0 = time.perf_counter()
    options = ExportOptions.resolve(options, {_LEGACY_EXPORT_NAMES.get(k, k): v for k, v in kwargs.items()})
    plan = _plan(store, out_dir, options, trace_ids)
    from ..card import card_figures

    tmp = new_tmp_dir(plan.out_dir)
    writer = ExportWriter(tmp, plan.configs)
    try:
        stats, per_trace, sources = _stream_rows(store, writer, plan, progress)
        data_files, infos, n_rows = writer.close(fingerprint_seed=f"{plan.name}/{options.split_seed}/{options.labels}")
        summary = _summarise(store, plan, stats, per_trace, sources, data_files, n_rows)
        figures = card_figures(store)
        summary.uncertainty["calibration"] = figures.calibration
        _write_files(tmp, summary, per_trace, figures, data_files, infos, run_record)
        swap_in(tmp, plan.out_dir)
    except BaseException as exc:
        _discard(writer, tmp, plan.out_dir, exc)
        raise
    summary.seconds = time.perf_counter() - t0
    return summary


@dataclass
class _Plan:
    """What :func:`_plan` settled before any row is read: options, output, tokenizer, traces and splits."""

    options: ExportOptions
    out_dir: Path
    name: str
    aligner: Any
    keys: list[read.TraceKey]
    split_of: dict[str, str]
    n_skipped: int
    configs: list[str]
    tool_version: str
    aggregate: str | None
    kinds: dict[str, str]


def _check_options(options: ExportOptions) -> None:
    """The checks of :func:`export_dataset`'s options that need no store (raises :class:`ConfigError`)."""
    if options.labels not in LABEL_CHOICES:
        raise ConfigError(f"unknown label source {options.labels!r}; choose one of {', '.join(LABEL_CHOICES)}")
    if options.batch_size < 1 or options.max_batch_segments < 1:
        raise ConfigError(
            f"batch_size ({options.batch_size}) and max_batch_segments ({options.max_batch_segments}) must be positive"
        )
    check_fractions(options.split_fractions)
    if options.chat_template and options.tokenizer is None:
        raise ConfigError("--chat-template needs --tokenizer: the rendering is the subject model's chat template")


def _plan(store: Store, out_dir: Path | str, options: ExportOptions, trace_ids: Sequence[str] | None) -> _Plan:
    """Validate the options, load the tokenizer, list the traces and decide their splits (reads keys only)."""
    _check_options(options)
    out = Path(out_dir).expanduser().resolve()
    check_replaceable(out)
    aligner = None
    if options.tokenizer is not None:
        from ..align import TokenAligner

        aligner = TokenAligner(options.tokenizer, rendering="chat_template" if options.chat_template else "raw")
    keys = read.trace_keys(store, trace_ids)
    if not keys:
        raise ExportError(
            f"the store {store.path} has no segmented traces to export; run ror ingest and ror segment first (or ror run)"
        )
    _check_label_source_present(store, options.labels, read.label_sources(store, [k.trace_id for k in keys]))
    split_of = split_traces(keys, fractions=options.split_fractions, seed=options.split_seed, stratify_by=options.stratify_by)
    n_skipped = (len(trace_ids) if trace_ids is not None else len(store.trace_ids())) - len(keys)
    from ..provenance import tool_version

    return _Plan(
        options=options, out_dir=out, name=options.name or out.name, aligner=aligner, keys=list(keys), split_of=dict(split_of),
        n_skipped=max(n_skipped, 0), configs=[c for c in CONFIGS if c != "tokens" or aligner is not None],
        tool_version=tool_version(),
        aggregate=_latest_aggregate(store) if options.labels in ("aggregate", "auto") else None,
        kinds=store.rater_kinds(),
    )


def _discard(writer: ExportWriter, tmp: Path, out_dir: Path, exc: BaseException) -> None:
    """Remove a failed export's temporary folder; an OS error becomes :class:`ExportWriteError` (``E818``)."""
    import shutil

    writer.abort()
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(exc, OSError) and not isinstance(exc, RorError):  # disk full, read-only, I/O error
        raise ExportWriteError(
            f"the export to {out_dir} failed while writing: {exc.strerror or exc}"
            f"{f' ({exc.filename})' if exc.filename else ''}; nothing was left behind (its temporary folder is "
            f"removed{', an earlier export there is unchanged' if out_dir.exists() else ''}). Free some space or "
            "choose another --out, then export again",
            code=WRITE_FAILED,
        ) from None


def _summarise(
    store: Store, plan: _Plan, stats: _Stats, per_trace: list[Any], sources: list[dict[str, Any]],
    data_files: Mapping[str, Mapping[str, list[str]]], n_rows: dict[str, dict[str, int]],
) -> ExportSummary:
    """The :class:`ExportSummary` of the rows written (no figures from review studies yet)."""
    from ..analytics import summarize

    o, aligner, keys = plan.options, plan.aligner, plan.keys
    counter = aligner.name if aligner else _counter_name(stats.counters)
    parameters = {
        "label_source": o.labels,
        "tokenizer": aligner.name if aligner else None,
        "tokenizer_vocab_sha256": aligner.vocab_sha256 if aligner else None,
        "rendering": aligner.rendering if aligner else None,
        "seed": o.split_seed,
        "split_fractions": [float(f) for f in o.split_fractions],
        "stratify_by": o.stratify_by,
        "license": o.license or _common_license(sources),
    }
    paths = {"card": "README.md", "manifest": MANIFEST, "analytics": "analytics.json"}
    for config, splits in data_files.items():
        paths[config] = config
        for split, globs in splits.items():
            paths[f"{config}/{split}"] = globs[0]
    return ExportSummary(
        out_dir=plan.out_dir,
        name=plan.name,
        configs=list(data_files),
        n_rows=n_rows,
        label_counts={b: stats.labels.get(b, 0) for b in (*BEHAVIORS, "unlabeled")},
        label_source_counts=dict(sorted(stats.sources.items())),
        n_traces=len(keys),
        n_segments=stats.n_segments,
        n_tokens=stats.n_tokens if aligner else None,
        n_straddling=stats.n_straddling if aligner else None,
        n_ties=stats.n_ties,
        n_skipped_traces=plan.n_skipped,
        paths=paths,
        analytics=summarize(per_trace),
        parameters=parameters,
        segment_length=stats.length_profile(counter),
        token_counter=_token_counter(stats, aligner, counter),
        trace_sources={
            **{key: dict(Counter(getattr(k, attr) or "(unknown)" for k in keys).most_common())
               for key, attr in (("models", "model"), ("datasets", "dataset"), ("sources", "source"))},
            "source_formats": dict(sorted(stats.formats.items(), key=lambda kv: (-kv[1], kv[0]))),
        },
        sources=sources,
        provenance={
            "codebook_versions": dict(stats.codebooks.most_common()),
            "judge_models": dict(stats.judges.most_common()),
            "prompt_template_hashes": dict(stats.prompts.most_common()),
            "annotators": [list(a) for a in store.annotators()],
            "tool_version": plan.tool_version,
        },
        uncertainty=_uncertainty(store, stats, plan.aggregate),
    )


def _token_counter(stats: _Stats, aligner: Any, counter: str) -> dict[str, Any]:
    """What counted ``n_tokens`` (see :class:`ExportSummary`)."""
    if aligner:
        return {"name": counter, "kind": "subject tokenizer", "segments": {counter: stats.n_segments}}
    approx = bool(stats.counters) and all(c.startswith(APPROX_PREFIX) for c in stats.counters)
    return {
        "name": counter,
        "kind": "approximation" if approx else "tokenizer recorded at segmentation",
        "segments": {k: v for k, v in stats.counters.most_common()},
    }


def _write_files(
    tmp: Path, summary: ExportSummary, per_trace: list[Any], figures: "CardFigures",
    data_files: Mapping[str, Mapping[str, list[str]]], infos: Mapping[str, Any], run_record: Mapping[str, Any] | None,
) -> None:
    """Write the agreement reports, the card, the analytics and the manifest into ``tmp``."""
    from ..card import build_card, report_slug

    reports: dict[str, str] = {}
    if figures.agreement:
        from ..agreement_report import write_report

        for fig_name, fig in figures.agreement.items():
            slug = report_slug(fig_name)
            write_report(fig, tmp / "agreement" / slug)
            reports[fig_name] = f"agreement/{slug}/agreement.md"
    card = build_card(summary, data_files=data_files, infos=infos, figures=figures, reports=reports)
    card.save(str(tmp / "README.md"))
    write_json(tmp / "analytics.json", {"overall": summary.analytics, "per_trace": [a.to_dict() for a in per_trace]}, indent=1)
    manifest = summary.to_dict()
    manifest.pop("seconds")  # not known until the files are written
    manifest["created_at"] = _build_time()
    manifest["layout_version"] = LAYOUT_VERSION  # how rows fall into row groups (export/write.py)
    if run_record is not None:
        manifest["run"] = {
            **dict(run_record), "ended_at": manifest["created_at"],
            "counts": {"traces": summary.n_traces, "segments": summary.n_segments, "tokens": summary.n_tokens},
        }
    write_json(tmp / MANIFEST, manifest)


def _raters(labels: Sequence[Any], kinds: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every rater's latest label of one segment, by annotator: ``{annotator, kind, label}``."""
    from ..reference import latest_per_annotator

    votes = labels if len(labels) == 1 else latest_per_annotator(labels)
    return [
        {"annotator": v.annotator, "kind": kinds.get(v.annotator) or SOURCE_KINDS.get(v.source, "machine"), "label": BEHAVIOR_ID[v.label]}
        for v in votes
    ]


def _human_verified(labels: Sequence[Any], c: ChosenLabel) -> bool:
    """Whether the segment's human reference (:mod:`ror_annotate.reference`) exists and equals the chosen label."""
    if c.label is None or not any(lab.source in ("human", "adjudicated") for lab in labels):
        return False
    from ..reference import reference_label

    ref = reference_label(labels)
    return ref is not None and ref.label == c.label


#: Sources whose single label on a segment is chosen from its row alone (no human reference can exist on the
#: segment, so it is not human-verified; not an aggregate, whose choice depends on the other aggregate labels).
_ROW_CHOICE_SOURCES = frozenset(("judge", "baseline", "import"))
#: Most distinct label contents :class:`_Chooser` remembers (then it starts over): memory stays flat.
_MEMO_SIZE = 4096


class _Chooser:
    """The exported label of each segment, with its ``raters`` and ``human_verified`` values.

    The common case at scale, one judge/baseline/import label on a segment that :func:`choose_label`
    takes as it is, depends only on that label's content (label, source, annotator, codebook version,
    confidence, extra, distribution), not on which segment holds it: its choice is computed once per
    distinct content from the label's record (by :func:`choose_label`, :func:`_raters` and
    :func:`_human_verified`, as for any segment) and reused for the next segments with the same content.
    Every other segment goes through those functions with its records (:meth:`read.Batch.labels_of`).
    """

    def __init__(self, label_source: str, aggregate: str | None, kinds: Mapping[str, str], stats: _Stats) -> None:
        self.label_source, self.aggregate, self.kinds, self.stats = label_source, aggregate, kinds, stats
        self.memo: dict[tuple[Any, ...], tuple[ChosenLabel, list[dict[str, Any]], bool, bool]] = {}

    def choose(self, batch: read.Batch, key: tuple[str, int]) -> tuple[ChosenLabel, list[dict[str, Any]], bool]:
        """``(chosen label, raters, human_verified)`` of the segment ``key`` (tied votes counted in ``stats``)."""
        rows = batch.label_rows.get(key, ())
        if len(rows) == 1:
            r = rows[0]
            if r[4] in _ROW_CHOICE_SOURCES and (self.label_source == r[4] or self.label_source == "auto"):
                content = (r[3], r[4], r[5], r[6], r[10], r[9], None if r[11] is None else tuple(r[11]))
                got = self.memo.get(content)
                if got is None:
                    if len(self.memo) >= _MEMO_SIZE:
                        self.memo.clear()
                    got = self.memo[content] = self._choose(batch.labels_of(key))
                self.stats.n_ties += got[3]
                return got[:3]
        got = self._choose(batch.labels_of(key))
        self.stats.n_ties += got[3]
        return got[:3]

    def _choose(self, labels: Sequence[Any]) -> tuple[ChosenLabel, list[dict[str, Any]], bool, bool]:
        c, tied = choose_label(labels, self.label_source, aggregate=self.aggregate)
        return c, _raters(labels, self.kinds), _human_verified(labels, c), tied


def _choose(batch: read.Batch, chooser: _Chooser) -> list[list[tuple[ChosenLabel, list[dict[str, Any]], bool]]]:
    """``(chosen label, raters, human_verified)`` of every segment of a batch, trace by trace."""
    return [[chooser.choose(batch, (t.trace_id, s.segment_index)) for s in batch.segments[t.trace_id]] for t in batch.traces]


def _align(aligner: Any, batch: read.Batch, chosen_batch: list[list[ChosenLabel]]) -> list[Any]:
    """Token alignment of every trace of a batch (None each without a tokenizer)."""
    if aligner is None:
        return [None] * len(batch.traces)
    from ..align import IGNORE_INDEX

    return list(aligner.align(
        batch.traces,
        [batch.segments[t.trace_id] for t in batch.traces],
        [[BEHAVIOR_ID[c.label] if c.label else IGNORE_INDEX for c in ch] for ch in chosen_batch],
    ))


def _view_factory() -> Callable[[int, str | None, str, int], Any]:
    """``SegmentView(segment_index, label, text, n_tokens)`` without the frozen dataclass's per-field
    ``object.__setattr__`` (a per-segment cost of the export): the instance dict is filled directly. At
    import the result is compared with the class's own constructor; if they differ, that is used."""
    from ..analytics import SegmentView

    new = object.__new__

    def make(segment_index: int, label: str | None, text: str, n_tokens: int) -> Any:
        obj = new(SegmentView)
        obj.__dict__.update(segment_index=segment_index, label=label, text=text, n_tokens=n_tokens)
        return obj

    probe = (3, "fact", "x = 1.", 4)
    ref, fast = SegmentView(*probe), make(*probe)
    same = fast == ref and hash(fast) == hash(ref) and vars(fast) == vars(ref) and type(fast) is SegmentView
    return make if same else SegmentView


_segment_view = _view_factory()


class _Streamer:
    """Turns the batches of :func:`read.batches` into row contexts (:mod:`.columns`), analytics and running stats."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.stats = _Stats()
        self.per_trace: list[Any] = []
        self.by_source: Counter[tuple[str | None, str | None]] = Counter()
        self.counter_of = {k.trace_id: k.token_counter for k in plan.keys}
        self.source_licenses = dict(plan.options.source_licenses or {})
        self.chooser = _Chooser(plan.options.labels, plan.aggregate, plan.kinds, self.stats)

    def batch_rows(self, batch: read.Batch) -> Rows:
        """Every row of one batch, queued per configuration and split."""
        choices = _choose(batch, self.chooser)
        chosen_batch = [[c for c, _, _ in per_trace] for per_trace in choices]
        rows = Rows()
        for t, chosen, trace_choices, al in zip(batch.traces, chosen_batch, choices, _align(self.plan.aligner, batch, chosen_batch)):
            self.trace_rows(rows, batch, t, chosen, al, trace_choices)
        return rows

    def trace_rows(self, rows: Rows, batch: read.Batch, t: Any, chosen: list[ChosenLabel], al: Any,
                   choices: list[tuple[ChosenLabel, list[dict[str, Any]], bool]]) -> None:
        """Queue one trace's rows (traces, segments and, aligned, tokens) and add it to the stats and analytics."""
        from ..analytics import analyze_trace

        stats, plan = self.stats, self.plan
        split = plan.split_of[t.trace_id]
        segs = batch.segments[t.trace_id]
        if al is not None:
            n_tok = np.maximum(al.token_end - al.token_start, 0).astype(np.int64)
        else:
            n_tok = np.fromiter((s.n_tokens for s in segs), dtype=np.int64, count=len(segs))
            stats.counters[self.counter_of.get(t.trace_id) or "unknown"] += len(segs)
        stats.add_lengths(n_tok)
        stats.n_segments += len(segs)
        lic = _license_of(t, self.source_licenses)
        self.by_source[(t.source, lic)] += 1
        source_format = batch.source_format.get(t.trace_id)
        stats.formats[source_format or "(unknown)"] += 1
        rows.add("traces", split, TraceRow(t, source_format, lic, len(segs)))
        counts = n_tok.tolist()  # Python ints, as int(n_tok[i]) gives, without a NumPy scalar per segment
        segment_rows = rows.queue("segments", split) if segs else []
        for i, (s, (c, raters, verified), n) in enumerate(zip(segs, choices, counts)):
            segment_rows.append(SegmentRow(s, c, t, al, i, n, plan.tool_version, raters, verified))
            stats.add_segment(c, verified)
        self.per_trace.append(analyze_trace(
            t.trace_id, [_segment_view(s.segment_index, c.label, s.text, n) for s, c, n in zip(segs, chosen, counts)],
            answer=t.answer, gold_answer=t.gold_answer, correct=t.correct,
        ))
        if al is not None:
            stats.n_straddling += al.n_straddling
            stats.n_tokens += len(al.input_ids)
            rows.add("tokens", split, token_row(t, chosen, al, plan.aligner, plan.options.labels, plan.tool_version, segs))

    def sources(self) -> list[dict[str, Any]]:
        """Traces per (source, licence), most traces first."""
        return [
            {"source": src, "license": lic, "publishable": license_allows_publishing(lic), "n_traces": n}
            for (src, lic), n in sorted(self.by_source.items(), key=lambda kv: (-kv[1], str(kv[0][0]), str(kv[0][1])))
        ]


def _stream_rows(
    store: Store, writer: ExportWriter, plan: _Plan, progress: Callable[[int, int], None] | None = None,
) -> tuple[_Stats, list[Any], list[dict[str, Any]]]:
    """Stream every batch of traces into ``writer``; return the running stats, per-trace analytics and sources."""
    streamer = _Streamer(plan)
    done = 0
    for batch in read.batches(store, plan.keys, max_segments=plan.options.max_batch_segments, max_traces=plan.options.batch_size):
        done += len(batch.traces)
        if progress is not None:  # counted as the batch starts: the bar moves while it is written
            progress(done, len(plan.keys))
        for config, split, table in streamer.batch_rows(batch).tables():
            writer.write(config, split, table)
    return streamer.stats, streamer.per_trace, streamer.sources()

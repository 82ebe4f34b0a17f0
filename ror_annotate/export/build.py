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
from typing import Any

import numpy as np
import pyarrow as pa

from pydantic import ConfigDict

from ..errors import ConfigError, ExportError, ExportWriteError, RorError
from ..options import StageOptions
from ..records import BEHAVIORS, SOURCE_KINDS
from ..store import Store
from . import read
from .features import BEHAVIOR_ID, CONFIGS
from .labels import LABEL_CHOICES, SOURCES_USED, ChosenLabel, choose_label, joined
from .splits import check_fractions, split_traces
from .write import LAYOUT_VERSION, MANIFEST, WRITE_FAILED, ExportWriter, check_replaceable, license_allows_publishing, new_tmp_dir, swap_in, write_json

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
        ``n_labelled``, ``n_human_verified``, ``human_verified_share``, ``n_with_confidence``,
        ``mean_label_confidence`` over the exported labelled segments
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
    if aggregate is not None:
        d = declared.get(aggregate)
        method = (d.model if d is not None and d.model else None) or aggregate.split(":", 1)[-1]
    n_labelled = sum(v for k, v in stats.labels.items() if k != "unlabeled")
    return {
        "raters": raters, "aggregate": aggregate, "aggregation_method": method, "n_labelled": n_labelled,
        "n_human_verified": stats.n_verified,
        "human_verified_share": stats.n_verified / n_labelled if n_labelled else None,
        "n_with_confidence": stats.n_confident,
        "mean_label_confidence": stats.sum_confidence / stats.n_confident if stats.n_confident else None,
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


def _list_array(arrays: Sequence[np.ndarray], value_type: pa.DataType) -> pa.Array:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if len(arrays) else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, value_type))


def _tokens_table(cols: dict[str, list[Any]]) -> pa.Table:
    data: dict[str, pa.Array] = {}
    for k, v in cols.items():
        if k in ("input_ids", "segment_ids", "labeled_positions"):
            data[k] = _list_array(v, pa.int32())
        elif k in ("labels", "labeled_classes"):
            data[k] = _list_array(v, pa.int64())
        elif k == "confidence":
            values = np.concatenate(v) if len(v) else np.zeros(0, dtype=np.float32)
            lengths = np.fromiter((len(a) for a in v), dtype=np.int64, count=len(v))
            offsets = np.zeros(len(v) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            inner = pa.array(values.astype(np.float32), pa.float32(), mask=np.isnan(values))
            data[k] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner)
        elif k == "offsets":
            inner = _list_array([a.reshape(-1) for a in v], pa.int32())
            pairs = pa.FixedSizeListArray.from_arrays(inner.values, 2)
            data[k] = pa.ListArray.from_arrays(pa.array(np.asarray(inner.offsets) // 2, pa.int32()), pairs)
        else:
            data[k] = pa.array(v)
    return pa.table(data)


class ExportOptions(StageOptions):
    """Options of ``ror export`` / :func:`export_dataset` / :func:`ror_annotate.pipeline.export`.

    Fields are named as the command-line flags (``labels`` is ``--labels``, ``split_seed`` is
    ``--split-seed``); :func:`export_dataset` documents each one (``labels`` there is
    ``label_source``, ``split_seed`` is ``seed``). Their checks (label source, fractions,
    positive batch sizes) run in :func:`export_dataset`, as before.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    stage: str = "the export stage"
    labels: str = "auto"
    tokenizer: Any = None
    chat_template: bool = False
    split_seed: int = 0
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
    label_source, tokenizer, chat_template = options.labels, options.tokenizer, options.chat_template
    seed, split_fractions, stratify_by = options.split_seed, options.split_fractions, options.stratify_by
    name, license = options.name, options.license
    batch_size, max_batch_segments = options.batch_size, options.max_batch_segments
    if label_source not in LABEL_CHOICES:
        raise ConfigError(f"unknown label source {label_source!r}; choose one of {', '.join(LABEL_CHOICES)}")
    if batch_size < 1 or max_batch_segments < 1:
        raise ConfigError(f"batch_size ({batch_size}) and max_batch_segments ({max_batch_segments}) must be positive")
    check_fractions(split_fractions)
    out_dir = Path(out_dir).expanduser().resolve()
    name = name or out_dir.name
    check_replaceable(out_dir)
    aligner = None
    if tokenizer is not None:
        from ..align import TokenAligner

        aligner = TokenAligner(tokenizer, rendering="chat_template" if chat_template else "raw")
    elif chat_template:
        raise ConfigError("--chat-template needs --tokenizer: the rendering is the subject model's chat template")

    keys = read.trace_keys(store, trace_ids)
    if not keys:
        raise ExportError(
            f"the store {store.path} has no segmented traces to export; run ror ingest and ror segment first (or ror run)"
        )
    _check_label_source_present(store, label_source, read.label_sources(store, [k.trace_id for k in keys]))
    split_of = split_traces(keys, fractions=split_fractions, seed=seed, stratify_by=stratify_by)
    n_skipped = (len(trace_ids) if trace_ids is not None else len(store.trace_ids())) - len(keys)

    from ..card import agreement_section, build_card, report_slug
    from ..provenance import tool_version

    tv = tool_version()
    configs = [c for c in CONFIGS if c != "tokens" or aligner is not None]
    tmp = new_tmp_dir(out_dir)
    writer = ExportWriter(tmp, configs)
    try:
        aggregate = _latest_aggregate(store) if label_source in ("aggregate", "auto") else None
        stats, per_trace, sources = _write_rows(
            store, writer, keys, split_of, options, aligner, tv, progress, aggregate=aggregate, kinds=store.rater_kinds(),
        )
        data_files, infos, n_rows = writer.close(fingerprint_seed=f"{name}/{seed}/{label_source}")
        from ..analytics import summarize

        counter = aligner.name if aligner else _counter_name(stats.counters)
        parameters = {
            "label_source": label_source,
            "tokenizer": aligner.name if aligner else None,
            "tokenizer_vocab_sha256": aligner.vocab_sha256 if aligner else None,
            "rendering": aligner.rendering if aligner else None,
            "seed": seed,
            "split_fractions": [float(f) for f in split_fractions],
            "stratify_by": stratify_by,
            "license": license or _common_license(sources),
        }
        paths = {"card": "README.md", "manifest": MANIFEST, "analytics": "analytics.json"}
        for config, splits in data_files.items():
            paths[config] = config
            for split, globs in splits.items():
                paths[f"{config}/{split}"] = globs[0]
        summary = ExportSummary(
            out_dir=out_dir,
            name=name,
            configs=list(data_files),
            n_rows=n_rows,
            label_counts={b: stats.labels.get(b, 0) for b in (*BEHAVIORS, "unlabeled")},
            label_source_counts=dict(sorted(stats.sources.items())),
            n_traces=len(keys),
            n_segments=stats.n_segments,
            n_tokens=stats.n_tokens if aligner else None,
            n_straddling=stats.n_straddling if aligner else None,
            n_ties=stats.n_ties,
            n_skipped_traces=max(n_skipped, 0),
            paths=paths,
            analytics=summarize(per_trace),
            parameters=parameters,
            segment_length=stats.length_profile(counter),
            token_counter={
                "name": counter,
                "kind": "subject tokenizer" if aligner else (
                    "approximation" if stats.counters and all(c.startswith(APPROX_PREFIX) for c in stats.counters)
                    else "tokenizer recorded at segmentation"),
                "segments": {k: v for k, v in stats.counters.most_common()} if not aligner else {counter: stats.n_segments},
            },
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
                "tool_version": tv,
            },
            uncertainty=_uncertainty(store, stats, aggregate),
        )
        agreement_text, figures = agreement_section(store)
        reports: dict[str, str] = {}
        if figures:
            from ..agreement_report import write_report

            for fig_name, fig in figures.items():
                slug = report_slug(fig_name)
                write_report(fig, tmp / "agreement" / slug)
                reports[fig_name] = f"agreement/{slug}/agreement.md"
        card = build_card(summary, data_files=data_files, infos=infos, agreement=agreement_text, reports=reports)
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
        swap_in(tmp, out_dir)
    except BaseException as exc:
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
        raise
    summary.seconds = time.perf_counter() - t0
    return summary


#: Arrow types of the segment columns whose type a batch cannot infer when every value is null or empty.
_TYPED: dict[str, pa.DataType] = {
    "label_distribution": pa.list_(pa.float32()),
    "raters": pa.list_(pa.struct([("annotator", pa.string()), ("kind", pa.string()), ("label", pa.int64())])),
}


class _Rows:
    """Rows of one batch per configuration and split, as columns in the features' order."""

    def __init__(self) -> None:
        from .features import COLUMN_DOCS

        self._names = {c: list(COLUMN_DOCS[c]) for c in CONFIGS}
        self.cols: dict[tuple[str, str], dict[str, list[Any]]] = {}

    def add(self, config: str, split: str, row: dict[str, Any]) -> None:
        cols = self.cols.setdefault((config, split), {k: [] for k in self._names[config]})
        for k, v in row.items():
            cols[k].append(v)

    def write(self, writer: ExportWriter) -> None:
        for (config, split), cols in self.cols.items():
            table = _tokens_table(cols) if config == "tokens" else pa.table({k: pa.array(v, type=_TYPED.get(k)) for k, v in cols.items()})
            writer.write(config, split, table)


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


def _segment_row(
    s: Any, c: ChosenLabel, t: Any, al: Any, i: int, n_tokens: int, tv: str, raters: list[dict[str, Any]], verified: bool,
) -> dict[str, Any]:
    has_tokens = al is not None and al.token_start[i] >= 0
    return {
        "trace_id": s.trace_id, "segment_index": s.segment_index, "text": s.text, "char_start": s.char_start,
        "char_end": s.char_end, "token_start": int(al.token_start[i]) if has_tokens else None,
        "token_end": int(al.token_end[i]) if has_tokens else None, "n_tokens": n_tokens,
        "label": BEHAVIOR_ID[c.label] if c.label else None, "label_source": c.source, "annotator": c.annotator,
        "n_votes": c.n_votes, "vote_share": c.vote_share, "codebook_version": c.codebook_version,
        "judge_model": c.judge_model, "prompt_template_hash": c.prompt_template_hash,
        "label_confidence": c.confidence if c.label else None,
        "label_distribution": list(c.distribution) if c.label and c.distribution is not None else None,
        "raters": raters, "human_verified": verified, "tool_version": tv,
        "dataset": t.dataset, "model": t.model,
    }


def _token_row(
    t: Any, chosen: Sequence[ChosenLabel], al: Any, aligner: Any, label_source: str, tv: str, segs: Sequence[Any],
) -> dict[str, Any]:
    from ..align import IGNORE_INDEX

    labels = np.asarray(al.labels, dtype=np.int64)
    positions = np.flatnonzero(labels != IGNORE_INDEX).astype(np.int32)
    # per token, its segment's label confidence (NaN -> null where unlabeled or without a confidence)
    top = max((s.segment_index for s in segs), default=-1) + 1
    seg_conf = np.full(top + 1, np.nan)  # by segment_index; the last slot serves tokens of no segment (-1)
    for s, c in zip(segs, chosen):
        if c.label is not None and c.confidence is not None:
            seg_conf[s.segment_index] = c.confidence
    seg_ids = np.asarray(al.segment_ids, dtype=np.int64)
    confidence = np.where(labels != IGNORE_INDEX, seg_conf[np.where(seg_ids >= 0, seg_ids, top)], np.nan)
    return {
        "trace_id": t.trace_id, "dataset": t.dataset, "model": t.model, "input_ids": al.input_ids, "labels": labels,
        "labeled_positions": positions, "labeled_classes": labels[positions], "segment_ids": al.segment_ids, "confidence": confidence,
        "offsets": al.offsets, "text": al.rendered.text, "text_offset": al.rendered.text_offset,
        "rendering": al.rendered.rendering, "tokenizer": aligner.name, "tokenizer_vocab_sha256": aligner.vocab_sha256,
        "label_source": label_source, "codebook_version": joined([c.codebook_version for c in chosen]),
        "judge_model": joined([c.judge_model for c in chosen]),
        "prompt_template_hash": joined([c.prompt_template_hash for c in chosen]), "tool_version": tv,
    }


def _write_rows(
    store: Store, writer: ExportWriter, keys: Sequence[read.TraceKey], split_of: Mapping[str, str], options: ExportOptions,
    aligner: Any, tv: str, progress: Callable[[int, int], None] | None = None, aggregate: str | None = None,
    kinds: Mapping[str, str] | None = None,
) -> tuple[_Stats, list[Any], list[dict[str, Any]]]:
    """Stream every batch of traces into ``writer``; return the running stats, per-trace analytics and sources."""
    label_source, source_licenses = options.labels, dict(options.source_licenses or {})
    batch_size, max_batch_segments = options.batch_size, options.max_batch_segments
    from ..align import IGNORE_INDEX
    from ..analytics import SegmentView, analyze_trace

    stats = _Stats()
    per_trace = []
    by_source: Counter[tuple[str | None, str | None]] = Counter()
    counter_of = {k.trace_id: k.token_counter for k in keys}
    done = 0
    for batch in read.batches(store, keys, max_segments=max_batch_segments, max_traces=batch_size):
        done += len(batch.traces)
        if progress is not None:  # counted as the batch starts: the bar moves while it is written
            progress(done, len(keys))
        chosen_batch: list[list[ChosenLabel]] = []
        for t in batch.traces:
            chosen = []
            for s in batch.segments[t.trace_id]:
                c, tied = choose_label(batch.labels.get((t.trace_id, s.segment_index), ()), label_source, aggregate=aggregate)
                stats.n_ties += tied
                chosen.append(c)
            chosen_batch.append(chosen)
        aligned = (
            aligner.align(
                batch.traces,
                [batch.segments[t.trace_id] for t in batch.traces],
                [[BEHAVIOR_ID[c.label] if c.label else IGNORE_INDEX for c in ch] for ch in chosen_batch],
            )
            if aligner
            else [None] * len(batch.traces)
        )
        rows = _Rows()
        for t, chosen, al in zip(batch.traces, chosen_batch, aligned):
            split = split_of[t.trace_id]
            segs = batch.segments[t.trace_id]
            if al is not None:
                n_tok = np.maximum(al.token_end - al.token_start, 0).astype(np.int64)
            else:
                n_tok = np.fromiter((s.n_tokens for s in segs), dtype=np.int64, count=len(segs))
                stats.counters[counter_of.get(t.trace_id) or "unknown"] += len(segs)
            stats.add_lengths(n_tok)
            stats.n_segments += len(segs)
            lic = _license_of(t, source_licenses)
            by_source[(t.source, lic)] += 1
            stats.formats[batch.source_format.get(t.trace_id) or "(unknown)"] += 1
            rows.add("traces", split, {
                "trace_id": t.trace_id, "problem": t.problem, "text": t.text, "answer": t.answer,
                "gold_answer": t.gold_answer, "correct": t.correct, "model": t.model, "dataset": t.dataset,
                "source": t.source, "source_format": batch.source_format.get(t.trace_id), "license": lic,
                "n_segments": len(segs),
            })
            for i, (s, c) in enumerate(zip(segs, chosen)):
                seg_labels = batch.labels.get((t.trace_id, s.segment_index), ())
                verified = _human_verified(seg_labels, c)
                rows.add("segments", split, _segment_row(s, c, t, al, i, int(n_tok[i]), tv, _raters(seg_labels, kinds or {}), verified))
                if c.label is not None:
                    stats.n_verified += verified
                    if c.confidence is not None:
                        stats.n_confident += 1
                        stats.sum_confidence += c.confidence
                stats.labels[c.label or "unlabeled"] += 1
                stats.sources[c.source or "none"] += 1
                for counter, value in ((stats.codebooks, c.codebook_version), (stats.judges, c.judge_model),
                                       (stats.prompts, c.prompt_template_hash)):
                    if value:
                        counter[value] += 1
            per_trace.append(
                analyze_trace(
                    t.trace_id,
                    [SegmentView(s.segment_index, c.label, s.text, int(n)) for s, c, n in zip(segs, chosen, n_tok)],
                    answer=t.answer, gold_answer=t.gold_answer, correct=t.correct,
                )
            )
            if al is not None:
                stats.n_straddling += al.n_straddling
                stats.n_tokens += len(al.input_ids)
                rows.add("tokens", split, _token_row(t, chosen, al, aligner, label_source, tv, segs))
        rows.write(writer)
    sources = [
        {"source": src, "license": lic, "publishable": license_allows_publishing(lic), "n_traces": n}
        for (src, lic), n in sorted(by_source.items(), key=lambda kv: (-kv[1], str(kv[0][0]), str(kv[0][1])))
    ]
    return stats, per_trace, sources

"""Export the store as a Hugging Face dataset: ``segments`` and (with a tokenizer) ``tokens``.

Layout of an export directory (``exports/<name>/`` by default)::

    <out>/README.md                                  dataset card (YAML: configs, features, splits)
    <out>/ror_export.json                            manifest: parameters, counts, provenance
    <out>/analytics.json                             trace analytics, overall and per trace
    <out>/<config>/                                  DatasetDict.save_to_disk (train/validation/test)
    <out>/data/<config>/<split>-00000-of-00001.parquet

The parquet files follow the Hugging Face hub layout and the card's ``configs:`` YAML points at
them, so ``datasets.load_dataset(str(out), "tokens")``, ``datasets.load_dataset("parquet",
data_files=...)``, ``datasets.load_from_disk(out / "tokens")`` and the hub after
``ror publish`` all give the same typed features (``ClassLabel`` names travel in the parquet
schema metadata, ``shared/pitfalls/DS-02``). Splits without rows are not written.

A re-export to the same directory is built in a sibling temporary directory and swapped in by
rename, so a failed export never leaves a half-written dataset; a directory that is not a
ror_annotate export (no ``ror_export.json``) and not empty is never replaced.

Label choice (``label_source``), per segment:

* ``adjudicated`` -- the study reference: the latest adjudicated label, else the humans' label when
  every human annotator's latest label agrees (the rule of :mod:`ror_annotate.reference`;
  adjudication only sees disagreements, so adjudicated rows alone would drop every agreed segment);
* ``human`` / ``judge`` / ``baseline`` -- plurality vote over that source's annotators (one vote
  per annotator, their latest label); a tie leaves the segment unlabeled;
* ``majority`` -- plurality over every human and judge annotator; a tie leaves it unlabeled;
* ``auto`` -- adjudicated, else human plurality, else judge, else baseline.

Unlabeled segments keep their row with ``label = -1`` (``ClassLabel``'s "no label") and their
tokens get -1, so the token grid stays complete.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .errors import ConfigError, ExportError
from .records import BEHAVIORS, Label, Segment, Trace
from .store import Store

if TYPE_CHECKING:  # pragma: no cover
    import datasets

LABEL_CHOICES: tuple[str, ...] = ("auto", "adjudicated", "human", "judge", "baseline", "majority")
SPLITS: tuple[str, ...] = ("train", "validation", "test")
STRATIFY_KEYS: tuple[str, ...] = ("dataset", "model", "source")
MANIFEST = "ror_export.json"
BEHAVIOR_ID = {b: i for i, b in enumerate(BEHAVIORS)}
#: Parquet shard size target; one file per split below it.
MAX_SHARD_BYTES = 500 * 2**20


# ---------------------------------------------------------------------------------------------
# features
# ---------------------------------------------------------------------------------------------
def segments_features() -> "datasets.Features":
    """Features of the ``segments`` configuration (one row per segment)."""
    from datasets import ClassLabel, Features, Value

    return Features(
        {
            "trace_id": Value("string"),
            "segment_index": Value("int32"),
            "text": Value("string"),
            "char_start": Value("int32"),
            "char_end": Value("int32"),
            "token_start": Value("int32"),
            "token_end": Value("int32"),
            "n_tokens": Value("int32"),
            "label": ClassLabel(names=list(BEHAVIORS)),
            "label_source": Value("string"),
            "annotator": Value("string"),
            "n_votes": Value("int32"),
            "vote_share": Value("float32"),
            "codebook_version": Value("string"),
            "judge_model": Value("string"),
            "prompt_template_hash": Value("string"),
            "tool_version": Value("string"),
            "dataset": Value("string"),
            "model": Value("string"),
        }
    )


def tokens_features() -> "datasets.Features":
    """Features of the ``tokens`` configuration (one row per trace; the probe/steer stage reads these names)."""
    from datasets import ClassLabel, Features, List, Value

    return Features(
        {
            "trace_id": Value("string"),
            "dataset": Value("string"),
            "model": Value("string"),
            "input_ids": List(Value("int32")),
            "labels": List(ClassLabel(names=list(BEHAVIORS))),
            "segment_ids": List(Value("int32")),
            "offsets": List(List(Value("int32"), length=2)),
            "text": Value("string"),
            "text_offset": Value("int32"),
            "rendering": Value("string"),
            "tokenizer": Value("string"),
            "label_source": Value("string"),
            "codebook_version": Value("string"),
            "judge_model": Value("string"),
            "prompt_template_hash": Value("string"),
            "tool_version": Value("string"),
        }
    )


# ---------------------------------------------------------------------------------------------
# label choice
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChosenLabel:
    """The label exported for one segment, with its provenance."""

    label: str | None
    source: str | None
    annotator: str | None
    n_votes: int
    vote_share: float | None
    codebook_version: str | None
    judge_model: str | None
    prompt_template_hash: str | None


UNLABELED = ChosenLabel(None, None, None, 0, None, None, None, None)


def _judge_model(lab: Label) -> str | None:
    if lab.source != "judge":
        return None
    model = lab.extra.get("model")
    if model:
        return str(model)
    name = lab.annotator.split("@", 1)[0]
    return name.split(":", 1)[1] if ":" in name else name


def _joined(values: Sequence[str | None]) -> str | None:
    uniq = sorted({v for v in values if v})
    return ",".join(uniq) if uniq else None


def _latest_per_annotator(labels: Sequence[Label]) -> list[Label]:
    latest: dict[str, Label] = {}
    for lab in labels:
        cur = latest.get(lab.annotator)
        if cur is None or lab.created_at > cur.created_at:
            latest[lab.annotator] = lab
    return [latest[a] for a in sorted(latest)]


def _single(lab: Label) -> ChosenLabel:
    return ChosenLabel(
        label=lab.label, source=lab.source, annotator=lab.annotator, n_votes=1, vote_share=1.0,
        codebook_version=lab.codebook_version, judge_model=_judge_model(lab),
        prompt_template_hash=str(lab.extra.get("prompt_template_hash") or "") or None,
    )


def _plurality(labels: Sequence[Label], source_name: str) -> ChosenLabel | None:
    """Plurality vote, one vote per annotator; None on a tie or without votes."""
    votes = _latest_per_annotator(labels)
    if not votes:
        return None
    counts = Counter(v.label for v in votes).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None
    winner = counts[0][0]
    winners = [v for v in votes if v.label == winner]
    return ChosenLabel(
        label=winner,
        source=source_name,
        annotator=",".join(v.annotator for v in votes),
        n_votes=len(votes),
        vote_share=counts[0][1] / len(votes),
        codebook_version=_joined([v.codebook_version for v in winners]),
        judge_model=_joined([_judge_model(v) for v in winners]),
        prompt_template_hash=_joined([str(v.extra.get("prompt_template_hash") or "") for v in winners]),
    )


def choose_label(labels: Sequence[Label], label_source: str) -> tuple[ChosenLabel, bool]:
    """Pick the exported label of one segment from all its stored labels.

    Parameters
    ----------
    labels : sequence of Label
        Every stored label of the segment (any source).
    label_source : {"auto", "adjudicated", "human", "judge", "baseline", "majority"}
        See the module docstring.

    Returns
    -------
    (ChosenLabel, bool)
        The choice (:data:`UNLABELED` when none), and whether a tie prevented one.
    """
    if len(labels) == 1 and label_source in (labels[0].source, "auto") and labels[0].source != "adjudicated":
        return _single(labels[0]), False  # the common case at scale: one judge or baseline label per segment
    by_source: dict[str, list[Label]] = defaultdict(list)
    for lab in labels:
        by_source[lab.source].append(lab)
    tied = False

    def vote(sources: Sequence[str], name: str) -> ChosenLabel | None:
        nonlocal tied
        pool = [lab for s in sources for lab in by_source.get(s, [])]
        if not pool:
            return None
        chosen = _plurality(pool, name)
        if chosen is None:
            tied = True
        return chosen

    def adjudicated(or_unanimous: bool = False) -> ChosenLabel | None:
        if not by_source.get("adjudicated") and not (or_unanimous and by_source.get("human")):
            return None  # most segments: judge and baseline labels only
        from ror_annotate.reference import reference_label  # the one reference rule, shared with review and agree

        ref = reference_label(labels)
        if ref is None or (ref.basis != "adjudicated" and not or_unanimous):
            return None
        if ref.basis != "adjudicated":
            return _plurality(ref.labels, "human")
        lab = ref.labels[0]
        return ChosenLabel(lab.label, "adjudicated", lab.annotator, 1, 1.0, lab.codebook_version, None, None)

    if label_source == "adjudicated":
        chosen = adjudicated(or_unanimous=True)
    elif label_source in ("human", "judge", "baseline"):
        chosen = vote([label_source], label_source)
    elif label_source == "majority":
        chosen = vote(["human", "judge"], "majority")
    elif label_source == "auto":
        chosen = adjudicated()
        for src in ("human", "judge", "baseline"):
            if chosen is not None:
                break
            chosen = vote([src], src)
        tied = tied and chosen is None
    else:
        raise ConfigError(f"unknown label source {label_source!r}; choose one of {', '.join(LABEL_CHOICES)}")
    return (chosen or UNLABELED), (tied and chosen is None)


# ---------------------------------------------------------------------------------------------
# splits
# ---------------------------------------------------------------------------------------------
def _allocate(n: int, fractions: Sequence[float]) -> list[int]:
    """Split ``n`` items into counts proportional to ``fractions`` (largest remainder, ties to earlier splits)."""
    raw = [n * f for f in fractions]
    counts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def split_traces(
    traces: Sequence[Trace],
    *,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    seed: int = 0,
    stratify_by: str | None = None,
) -> dict[str, str]:
    """Assign every trace to one split (a trace is never split across splits).

    Parameters
    ----------
    traces : sequence of Trace
    fractions : (train, validation, test), non-negative, summing to 1
    seed : int
        Seed of the ``numpy.random.default_rng`` shuffle; same store + seed = same splits.
    stratify_by : {"dataset", "model", "source"}, optional
        Allocate the fractions within each value of this trace field (None counts as one value).

    Returns
    -------
    dict
        ``trace_id -> split name``.

    Raises
    ------
    ConfigError
        Bad fractions or an unknown stratification key.
    """
    fr = [float(f) for f in fractions]
    if len(fr) != 3 or any(f < 0 or not math.isfinite(f) for f in fr) or abs(sum(fr) - 1.0) > 1e-6:
        raise ConfigError(f"split fractions {tuple(fractions)} must be three non-negative numbers (train, validation, test) summing to 1")
    if stratify_by is not None and stratify_by not in STRATIFY_KEYS:
        raise ConfigError(f"cannot stratify by {stratify_by!r}; choose one of {', '.join(STRATIFY_KEYS)}")
    groups: dict[str, list[str]] = defaultdict(list)
    for t in traces:
        key = str(getattr(t, stratify_by) or "") if stratify_by else ""
        groups[key].append(t.trace_id)
    rng = np.random.default_rng(seed)
    out: dict[str, str] = {}
    for key in sorted(groups):
        ids = sorted(groups[key])
        order = rng.permutation(len(ids))
        counts = _allocate(len(ids), fr)
        pos = 0
        for split, c in zip(SPLITS, counts):
            for i in order[pos : pos + c]:
                out[ids[i]] = split
            pos += c
    return out


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------
@dataclass
class ExportSummary:
    """What an export wrote.

    Attributes
    ----------
    out_dir : Path
    name : str
    configs : list of str -- ``["segments"]`` or ``["segments", "tokens"]``
    n_rows : dict -- ``{config: {split: rows}}``
    label_counts : dict -- exported segments per behavior (plus ``"unlabeled"``)
    label_source_counts : dict -- exported segments per chosen source
    n_traces, n_segments : int
    n_tokens : int or None -- tokens in the ``tokens`` configuration
    n_straddling : int or None -- tokens straddling a segment boundary
    n_ties : int -- segments left unlabeled by a tied vote
    n_skipped_traces : int -- traces without segments (not exported)
    paths : dict -- ``{"card": ..., "manifest": ..., "<config>": save_to_disk dir, "<config>/<split>": parquet}``
    analytics : dict -- :func:`ror_annotate.analytics.summarize` output
    parameters : dict
    segment_length : dict -- ``unit``, ``median``, ``p5``, ``p95``, ``max`` of segment lengths (tokens)
    trace_sources : dict -- ``{"models"|"datasets"|"sources": {value: n_traces}}``
    provenance : dict -- codebook versions, judge models, prompt template hashes (segments each),
        annotators in the store, tool version
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
    trace_sources: dict[str, dict[str, int]] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (local paths as they are: :func:`export_dataset` writes the manifest without them)."""
        d = asdict(self)
        d["out_dir"] = str(self.out_dir)
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
        fa = self.analytics.get("first_answer_fraction", {})
        if fa.get("median") is not None:
            rows.append(("first answer at (median share of tokens)", f"{fa['median']:.2f}"))
        flip = self.analytics.get("flip", {})
        if flip.get("n_evaluable"):
            rows.append(("flip rate", f"{flip['flip_rate']:.3f} of {flip['n_evaluable']} traces"))
        rows.append(("card", self.paths.get("card", "")))
        return rows


# ---------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------
def export_dataset(
    store: Store,
    out_dir: Path | str,
    *,
    label_source: str = "auto",
    tokenizer: Any = None,
    chat_template: bool = False,
    seed: int = 0,
    split_fractions: Sequence[float] = (0.8, 0.1, 0.1),
    stratify_by: str | None = None,
    name: str | None = None,
    license: str = "other",
    trace_ids: Sequence[str] | None = None,
    batch_size: int = 64,
) -> ExportSummary:
    """Export every segmented trace of ``store`` as a Hugging Face dataset under ``out_dir``.

    Parameters
    ----------
    store : Store
        Read through its public API only.
    out_dir : Path or str
        Export directory; replaced atomically if it holds an earlier export.
    label_source : {"auto", "adjudicated", "human", "judge", "baseline", "majority"}
        Which labels to export (module docstring).
    tokenizer : str or PreTrainedTokenizerBase, optional
        Fast tokenizer of the subject model (name or local path). Without it only the ``segments``
        configuration is written, with null token spans and the store's ``n_tokens``.
    chat_template : bool
        Tokenize the chat-template rendering instead of the raw reasoning text.
    seed : int
        Split shuffle seed.
    split_fractions : (train, validation, test)
    stratify_by : {"dataset", "model", "source"}, optional
    name : str, optional
        Dataset name in the card (default: the directory name).
    license : str, default "other"
        License identifier written in the card (the traces' licenses decide it; see the card).
    trace_ids : sequence of str, optional
        Export only these traces (default: every segmented trace in the store).
    batch_size : int
        Traces tokenized per batch (the Rust tokenizer parallelizes within a batch).

    Returns
    -------
    ExportSummary

    Raises
    ------
    ConfigError
        Unknown ``label_source``/``stratify_by``, bad fractions, unloadable tokenizer.
    AlignmentError
        Slow tokenizer, or a segment whose tokens do not cover exactly its text.
    ExportError
        Nothing to export, ``out_dir`` is a non-export directory, or writing failed.
    """
    t0 = time.perf_counter()
    if label_source not in LABEL_CHOICES:
        raise ConfigError(f"unknown label source {label_source!r}; choose one of {', '.join(LABEL_CHOICES)}")
    out_dir = Path(out_dir).expanduser().resolve()
    name = name or out_dir.name
    _check_replaceable(out_dir)
    aligner = None
    if tokenizer is not None:
        from .align import TokenAligner

        aligner = TokenAligner(tokenizer, rendering="chat_template" if chat_template else "raw")
    elif chat_template:
        raise ConfigError("--chat-template needs --tokenizer: the rendering is the subject model's chat template")

    traces = list(store.iter_traces(list(trace_ids) if trace_ids is not None else None))
    wanted = {t.trace_id for t in traces}
    segs_by_trace: dict[str, list[Segment]] = defaultdict(list)
    for s in store.segments():
        if s.trace_id in wanted:
            segs_by_trace[s.trace_id].append(s)
    labels_by_seg: dict[tuple[str, int], list[Label]] = defaultdict(list)
    for lab in store.labels():
        if lab.trace_id in wanted:
            labels_by_seg[(lab.trace_id, lab.segment_index)].append(lab)
    exported = [t for t in traces if segs_by_trace.get(t.trace_id)]
    if not exported:
        raise ExportError(
            f"the store {store.path} has no segmented traces to export; run ror ingest and ror segment first (or ror run)"
        )
    _check_label_source_present(store, label_source, {lab.source for labs in labels_by_seg.values() for lab in labs})
    split_of = split_traces(exported, fractions=split_fractions, seed=seed, stratify_by=stratify_by)

    from .provenance import tool_version

    tv = tool_version()
    seg_rows: dict[str, list[Any]] = {k: [] for k in segments_features()}
    seg_split: list[str] = []
    tok_cols: dict[str, list[Any]] = {k: [] for k in tokens_features()}
    tok_split: list[str] = []
    n_ties = 0
    n_straddling = 0
    label_counts = Counter()
    source_counts = Counter()
    from .analytics import SegmentView, analyze_trace, summarize

    per_trace_analytics = []
    for start in range(0, len(exported), batch_size):
        batch = exported[start : start + batch_size]
        chosen_batch = []
        for t in batch:
            chosen = []
            for s in segs_by_trace[t.trace_id]:
                c, tied = choose_label(labels_by_seg.get((t.trace_id, s.segment_index), ()), label_source)
                n_ties += tied
                chosen.append(c)
            chosen_batch.append(chosen)
        aligned = (
            aligner.align(
                batch,
                [segs_by_trace[t.trace_id] for t in batch],
                [[BEHAVIOR_ID.get(c.label, -1) for c in ch] for ch in chosen_batch],
            )
            if aligner
            else [None] * len(batch)
        )
        for t, chosen, al in zip(batch, chosen_batch, aligned):
            segs = segs_by_trace[t.trace_id]
            n_tok = (al.token_end - al.token_start).astype(int).tolist() if al is not None else [s.n_tokens for s in segs]
            if al is not None:
                n_tok = [max(n, 0) for n in n_tok]
            for i, (s, c) in enumerate(zip(segs, chosen)):
                seg_rows["trace_id"].append(s.trace_id)
                seg_rows["segment_index"].append(s.segment_index)
                seg_rows["text"].append(s.text)
                seg_rows["char_start"].append(s.char_start)
                seg_rows["char_end"].append(s.char_end)
                seg_rows["token_start"].append(int(al.token_start[i]) if al is not None and al.token_start[i] >= 0 else None)
                seg_rows["token_end"].append(int(al.token_end[i]) if al is not None and al.token_end[i] >= 0 else None)
                seg_rows["n_tokens"].append(n_tok[i])
                seg_rows["label"].append(BEHAVIOR_ID.get(c.label, -1))
                seg_rows["label_source"].append(c.source)
                seg_rows["annotator"].append(c.annotator)
                seg_rows["n_votes"].append(c.n_votes)
                seg_rows["vote_share"].append(c.vote_share)
                seg_rows["codebook_version"].append(c.codebook_version)
                seg_rows["judge_model"].append(c.judge_model)
                seg_rows["prompt_template_hash"].append(c.prompt_template_hash)
                seg_rows["tool_version"].append(tv)
                seg_rows["dataset"].append(t.dataset)
                seg_rows["model"].append(t.model)
                seg_split.append(split_of[t.trace_id])
                label_counts[c.label or "unlabeled"] += 1
                source_counts[c.source or "none"] += 1
            per_trace_analytics.append(
                analyze_trace(
                    t.trace_id,
                    [SegmentView(s.segment_index, c.label, s.text, n) for s, c, n in zip(segs, chosen, n_tok)],
                    answer=t.answer, gold_answer=t.gold_answer, correct=t.correct,
                )
            )
            if al is None:
                continue
            n_straddling += al.n_straddling
            tok_cols["trace_id"].append(t.trace_id)
            tok_cols["dataset"].append(t.dataset)
            tok_cols["model"].append(t.model)
            tok_cols["input_ids"].append(al.input_ids)
            tok_cols["labels"].append(al.labels)
            tok_cols["segment_ids"].append(al.segment_ids)
            tok_cols["offsets"].append(al.offsets)
            tok_cols["text"].append(al.rendered.text)
            tok_cols["text_offset"].append(al.rendered.text_offset)
            tok_cols["rendering"].append(al.rendered.rendering)
            tok_cols["tokenizer"].append(aligner.name)
            tok_cols["label_source"].append(label_source)
            tok_cols["codebook_version"].append(_joined([c.codebook_version for c in chosen]))
            tok_cols["judge_model"].append(_joined([c.judge_model for c in chosen]))
            tok_cols["prompt_template_hash"].append(_joined([c.prompt_template_hash for c in chosen]))
            tok_cols["tool_version"].append(tv)
            tok_split.append(split_of[t.trace_id])

    tables = {"segments": (_segments_table(seg_rows), seg_split)}
    if aligner is not None:
        tables["tokens"] = (_tokens_table(tok_cols), tok_split)
    analytics = summarize(per_trace_analytics)
    parameters = {
        "label_source": label_source,
        "tokenizer": aligner.name if aligner else None,
        "rendering": aligner.rendering if aligner else None,
        "seed": seed,
        "split_fractions": list(split_fractions),
        "stratify_by": stratify_by,
        "license": license,
    }
    summary = ExportSummary(
        out_dir=out_dir,
        name=name,
        configs=list(tables),
        n_rows={},
        label_counts={b: label_counts.get(b, 0) for b in (*BEHAVIORS, "unlabeled")},
        label_source_counts=dict(sorted(source_counts.items())),
        n_traces=len(exported),
        n_segments=len(seg_split),
        n_tokens=int(sum(len(x) for x in tok_cols["input_ids"])) if aligner else None,
        n_straddling=n_straddling if aligner else None,
        n_ties=n_ties,
        n_skipped_traces=len(traces) - len(exported),
        paths={},
        analytics=analytics,
        parameters=parameters,
        segment_length=_length_profile(seg_rows["n_tokens"], aligner.name if aligner else "store token counts"),
        trace_sources={
            key: dict(Counter(getattr(t, attr) or "(unknown)" for t in exported).most_common())
            for key, attr in (("models", "model"), ("datasets", "dataset"), ("sources", "source"))
        },
        provenance={
            "codebook_versions": _count_values(seg_rows["codebook_version"]),
            "judge_models": _count_values(seg_rows["judge_model"]),
            "prompt_template_hashes": _count_values(seg_rows["prompt_template_hash"]),
            "annotators": [list(a) for a in store.annotators()],
            "tool_version": tv,
        },
    )
    _write_export(store, out_dir, tables, summary, per_trace_analytics)
    summary.seconds = time.perf_counter() - t0
    return summary


#: Label sources each ``label_source`` choice draws on (module docstring).
_SOURCES_USED = {"adjudicated": ("adjudicated", "human"), "human": ("human",), "judge": ("judge",),
                 "baseline": ("baseline",), "majority": ("human", "judge")}


def _check_label_source_present(store: Store, label_source: str, present: set[str]) -> None:
    """Refuse an explicit ``label_source`` none of whose labels exist: it would export every segment as -1."""
    used = _SOURCES_USED.get(label_source)
    if used is None or present.intersection(used):
        return
    have = ", ".join(sorted(present)) or "none"
    raise ExportError(
        f"--labels {label_source}: the store {store.path} holds no {' or '.join(repr(u) for u in used)} labels for "
        f"these traces (it has: {have}), so every segment would be exported unlabeled; pick one of those sources "
        "or --labels auto"
    )


def _count_values(values: Sequence[str | None]) -> dict[str, int]:
    return dict(Counter(v for v in values if v).most_common())


def _length_profile(n_tokens: Sequence[int], unit: str) -> dict[str, Any]:
    if not n_tokens:
        return {}
    a = np.asarray(n_tokens, dtype=np.float64)
    return {
        "unit": f"tokens ({unit})",
        "median": float(np.median(a)),
        "p5": float(np.percentile(a, 5)),
        "p95": float(np.percentile(a, 95)),
        "max": int(a.max()),
    }


def _segments_table(rows: dict[str, list[Any]]) -> pa.Table:
    features = segments_features()
    return pa.table({k: pa.array(v) for k, v in rows.items()}).cast(features.arrow_schema)


def _list_array(arrays: Sequence[np.ndarray], value_type: pa.DataType) -> pa.Array:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if len(arrays) else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, value_type))


def _tokens_table(cols: dict[str, list[Any]]) -> pa.Table:
    features = tokens_features()
    data: dict[str, pa.Array] = {}
    for k, v in cols.items():
        if k in ("input_ids", "segment_ids"):
            data[k] = _list_array(v, pa.int32())
        elif k == "labels":
            data[k] = _list_array(v, pa.int64())
        elif k == "offsets":
            flat = [a.reshape(-1) for a in v]
            inner = _list_array(flat, pa.int32())
            pairs = pa.FixedSizeListArray.from_arrays(inner.values, 2)
            data[k] = pa.ListArray.from_arrays(pa.array(np.asarray(inner.offsets) // 2, pa.int32()), pairs)
        else:
            data[k] = pa.array(v)
    return pa.table(data).cast(features.arrow_schema)


def _is_export_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def _check_replaceable(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not _is_export_dir(out_dir))):
        raise ExportError(
            f"{out_dir} exists and is not a ror_annotate export (no {MANIFEST}); refusing to replace it. "
            "Choose another --out, or remove that directory yourself"
        )


def _n_shards(table: pa.Table) -> int:
    return max(1, math.ceil(table.nbytes / MAX_SHARD_BYTES))


def _write_export(
    store: Store,
    out_dir: Path,
    tables: dict[str, tuple[pa.Table, list[str]]],
    summary: ExportSummary,
    per_trace_analytics: Sequence[Any],
) -> None:
    import datasets

    bars_were_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # the CLI shows its own progress; per-shard bars are noise
    try:
        _write_files(store, out_dir, tables, summary, per_trace_analytics)
    finally:
        if bars_were_on:
            datasets.enable_progress_bars()


def _write_files(store, out_dir, tables, summary, per_trace_analytics) -> None:
    from datasets import Dataset, DatasetDict, DatasetInfo
    from datasets.table import InMemoryTable

    from .card import build_card

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        data_files: dict[str, dict[str, list[str]]] = {}
        infos: dict[str, Any] = {}
        for config, (table, split_col) in tables.items():
            features = segments_features() if config == "segments" else tokens_features()
            split_arr = np.asarray(split_col)
            dd = {}
            for split in SPLITS:
                idx = np.flatnonzero(split_arr == split)
                if not len(idx):
                    continue
                part = table.take(pa.array(idx))
                dd[split] = Dataset(InMemoryTable(part), info=DatasetInfo(features=features.copy(), config_name=config), split=split)
            ddict = DatasetDict(dd)
            ddict.save_to_disk(str(tmp / config))
            summary.n_rows[config] = {s: d.num_rows for s, d in dd.items()}
            summary.paths[config] = str(out_dir / config)
            data_files[config] = {}
            for split, ds in dd.items():
                n = _n_shards(ds.data.table)
                rel_paths = []
                for i in range(n):
                    rel = f"data/{config}/{split}-{i:05d}-of-{n:05d}.parquet"
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    shard = ds.shard(num_shards=n, index=i, contiguous=True) if n > 1 else ds
                    shard.to_parquet(str(tmp / rel))
                    rel_paths.append(rel)
                summary.paths[f"{config}/{split}"] = str(out_dir / rel_paths[0]) if n == 1 else str(out_dir / f"data/{config}/{split}-*.parquet")
                data_files[config][split] = [f"data/{config}/{split}-*.parquet"]
            infos[config] = (features, {s: (d.num_rows, d.data.table.nbytes) for s, d in dd.items()})
        summary.paths["card"] = str(out_dir / "README.md")
        summary.paths["manifest"] = str(out_dir / MANIFEST)
        summary.paths["analytics"] = str(out_dir / "analytics.json")
        card = build_card(store, summary, data_files=data_files, infos=infos, report_dir=tmp / "agreement")
        card.save(str(tmp / "README.md"))
        (tmp / "analytics.json").write_text(
            json.dumps({"overall": summary.analytics, "per_trace": [a.to_dict() for a in per_trace_analytics]}, indent=1, default=str),
            encoding="utf-8",
        )
        manifest = summary.to_dict()
        manifest.pop("seconds")  # not known until the files are written
        # The export's own folder is where the user put it: record paths inside it, never the local path.
        manifest["out_dir"] = out_dir.name
        manifest["paths"] = {k: _relative_to(v, out_dir) for k, v in summary.paths.items()}
        manifest["created_at"] = _build_time()
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by ``tmp`` with renames on one filesystem; the old export survives any failure."""
    if not out_dir.exists():
        os.rename(tmp, out_dir)
        return
    _check_replaceable(out_dir)
    old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        os.rename(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def load_export(out_dir: Path | str, config: str = "segments") -> "datasets.DatasetDict":
    """Load one configuration of an export with ``datasets.load_from_disk``.

    Raises
    ------
    ExportError
        ``out_dir`` is not an export or lacks ``config``.
    """
    from datasets import load_from_disk

    out_dir = Path(out_dir)
    if not (out_dir / config).is_dir():
        raise ExportError(f"{out_dir} has no {config!r} configuration; export with --tokenizer to get 'tokens'")
    return load_from_disk(str(out_dir / config))


def resolve_export_dir(name_or_path: str | Path, exports_dir: Path | str = "exports") -> Path:
    """``exports/<name>`` for a bare name, else the path itself; it must hold an export.

    Raises
    ------
    ExportError
        No ror_annotate export there.
    """
    p = Path(name_or_path)
    candidates = [p] if (p.is_absolute() or len(p.parts) > 1) else [Path(exports_dir) / p, p]
    for c in candidates:
        if _is_export_dir(c):
            return c.resolve()
    raise ExportError(
        f"no export named {str(name_or_path)!r}: looked for {MANIFEST} in {', '.join(str(c) for c in candidates)}; "
        "run ror export (or ror run) first"
    )


#: Files of an export that go to the hub; the save_to_disk copies stay local (the parquet files are the same rows).
PUBLISH_PATTERNS = ["README.md", "analytics.json", "data/**", "agreement/**"]


def publish_export(
    name_or_path: str | Path,
    repo_id: str,
    *,
    exports_dir: Path | str = "exports",
    private: bool = False,
    endpoint: str | None = None,
    token: str | None = None,
) -> str:
    """Push an export (card, parquet files, analytics) to a dataset repository on the Hugging Face hub.

    Parameters
    ----------
    name_or_path : str or Path
        Export name under ``exports_dir``, or its directory.
    repo_id : str
        ``"ORG/NAME"``; created (as a dataset repository) if missing.
    private : bool
        Create the repository as private.
    endpoint : str, optional
        Hub URL (default: ``huggingface_hub``'s, which honours ``HF_ENDPOINT``).
    token : str, optional
        Defaults to the ``HF_TOKEN`` environment variable. The token is passed to the client only:
        it is never written to the store, the export, logs or error messages.

    Returns
    -------
    str
        URL of the commit.

    Raises
    ------
    ExportError
        No export, no token, or the hub could not be reached / refused; the local export is untouched
        in every case (publishing only reads it).
    """
    out_dir = resolve_export_dir(name_or_path, exports_dir)
    if not repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ExportError(f"--repo-id {repo_id!r} must look like ORG/NAME")
    token = token or os.environ.get("HF_TOKEN") or None
    if not token:
        raise ExportError(
            "no Hugging Face token: set HF_TOKEN in the environment (a write token of the target organization); "
            f"the local export at {out_dir} is unchanged"
        )
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(
            folder_path=str(out_dir),
            repo_id=repo_id,
            repo_type="dataset",
            allow_patterns=PUBLISH_PATTERNS,
            commit_message=f"Upload {out_dir.name} (ror_annotate export)",
        )
    except Exception as exc:  # network, offline mode, auth, permissions: all end the same way for the user
        reason = str(exc).replace(token, "***") if token else str(exc)
        raise ExportError(
            f"could not publish {out_dir} to the hub dataset {repo_id} ({type(exc).__name__}: {reason.splitlines()[0] if reason else ''}); "
            f"check the network, HF_TOKEN's write access and HF_HUB_OFFLINE. The local export at {out_dir} is unchanged"
        ) from None
    return str(getattr(info, "commit_url", info))


def _relative_to(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return Path(path).name


def _build_time() -> str:
    """UTC time of the export, or ``SOURCE_DATE_EPOCH`` when set (the reproducible-builds convention),
    so two builds of the same store can be byte-identical."""
    import os

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch) if epoch else None))

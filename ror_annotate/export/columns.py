"""Every exported column, declared once: name, ``datasets`` feature type, documentation and value.

One :class:`Column` per column of each configuration (``traces``, ``segments``, ``tokens``), in
output order, in :data:`COLUMNS`. Everything else is derived from that table:

* the typed features (:func:`ror_annotate.export.features.features_of`);
* the card's column list (:data:`ror_annotate.export.features.COLUMN_DOCS`);
* the row builder (:class:`Rows`): each column's ``value`` reads one row's context
  (:class:`TraceRow`, :class:`SegmentRow`, :class:`TokenRow`) and its ``encode`` turns a batch of
  values into one Arrow array (default ``pyarrow.array``; typed for columns whose type a batch of
  nulls cannot show, vectorised for the per-token lists).

Adding a column is one entry here (plus, where new, a field of its row context).

``ClassLabel`` columns hold class ids only: every stored value decodes with ``int2str``. A segment
without a label has a null ``label``; at token level the model-ready ``labels`` column is a plain
integer column with :data:`~ror_annotate.align.IGNORE_INDEX` (-100) for tokens without a label, and
the typed names travel in the parallel ``labeled_positions`` / ``labeled_classes`` pair.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..records import BEHAVIORS
from .labels import ChosenLabel, joined

if TYPE_CHECKING:  # pragma: no cover
    import datasets

CONFIGS: tuple[str, ...] = ("traces", "segments", "tokens")
BEHAVIOR_ID = {b: i for i, b in enumerate(BEHAVIORS)}

FeatureFactory = Callable[[], Any]


# ----------------------------------------------------------------------------- feature factories
def _value(dtype: str) -> FeatureFactory:
    """``datasets.Value(dtype)``, built on demand (``datasets`` is imported only when features are needed)."""

    def make() -> Any:
        from datasets import Value

        return Value(dtype)

    return make


def _class_label() -> Any:
    from datasets import ClassLabel

    return ClassLabel(names=list(BEHAVIORS))


def _list(inner: FeatureFactory, length: int = -1) -> FeatureFactory:
    """``datasets.List(inner)`` (fixed ``length`` when given)."""

    def make() -> Any:
        from datasets import List

        return List(inner(), length=length)

    return make


def _raters_feature() -> Any:
    from datasets import List, Value

    return List({"annotator": Value("string"), "kind": Value("string"), "label": _class_label()})


# ----------------------------------------------------------------------------- Arrow encoders
def default_encode(values: list[Any]) -> pa.Array:
    """``pyarrow.array(values)``: the type inferred from the batch (cast to the features' schema on write)."""
    return pa.array(values)


def _typed(arrow_type: pa.DataType) -> Callable[[list[Any]], pa.Array]:
    """Encoder for a column whose type a batch cannot infer when every value is null or empty."""

    def encode(values: list[Any]) -> pa.Array:
        return pa.array(values, type=arrow_type)

    return encode


def list_array(arrays: Sequence[Any], value_type: pa.DataType) -> pa.Array:
    """A ``list<value_type>`` array from a sequence of 1-d arrays (one concatenation, no per-value Python)."""
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if len(arrays) else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, value_type))


def _ragged(value_type: pa.DataType) -> Callable[[list[Any]], pa.Array]:
    def encode(values: list[Any]) -> pa.Array:
        return list_array(values, value_type)

    return encode


def _nan_as_null_floats(values: list[Any]) -> pa.Array:
    """``list<float32>`` from float arrays, NaN stored as null."""
    flat = np.concatenate(values) if len(values) else np.zeros(0, dtype=np.float32)
    lengths = np.fromiter((len(a) for a in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    inner = pa.array(flat.astype(np.float32), pa.float32(), mask=np.isnan(flat))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner)


def _pairs(values: list[Any]) -> pa.Array:
    """``list<fixed_size_list<int32, 2>>`` from ``(n, 2)`` offset arrays."""
    inner = list_array([a.reshape(-1) for a in values], pa.int32())
    pairs = pa.FixedSizeListArray.from_arrays(inner.values, 2)
    return pa.ListArray.from_arrays(pa.array(np.asarray(inner.offsets) // 2, pa.int32()), pairs)


# ----------------------------------------------------------------------------- row contexts
@dataclass(slots=True)  # not frozen: a frozen dataclass is several times slower to build, once per row
class TraceRow:
    """What one ``traces`` row is built from: the trace, its source format, licence and segment count."""

    t: Any
    source_format: str | None
    license: str | None
    n_segments: int


@dataclass(slots=True)  # not frozen: a frozen dataclass is several times slower to build, once per row
class SegmentRow:
    """What one ``segments`` row is built from.

    Attributes
    ----------
    s, t : the stored segment and its trace
    c : ChosenLabel -- the exported label
    al : aligned trace (``ror_annotate.align``) or None without a tokenizer
    i : int -- position of the segment in ``al``
    n_tokens : int
    tv : str -- tool version
    raters : list of dict -- every rater's latest label (``annotator``, ``kind``, ``label`` id)
    verified : bool -- a human reference equals the label
    """

    s: Any
    c: ChosenLabel
    t: Any
    al: Any
    i: int
    n_tokens: int
    tv: str
    raters: list[dict[str, Any]]
    verified: bool

    @property
    def has_tokens(self) -> bool:
        return self.al is not None and self.al.token_start[self.i] >= 0


@dataclass(slots=True)  # not frozen: a frozen dataclass is several times slower to build, once per row
class TokenRow:
    """What one ``tokens`` row is built from (:func:`token_row` computes the per-token arrays once)."""

    t: Any
    al: Any
    aligner: Any
    label_source: str
    tv: str
    chosen: Sequence[ChosenLabel]
    labels: np.ndarray  # int64, IGNORE_INDEX where unlabeled
    positions: np.ndarray  # int32, where labels != IGNORE_INDEX
    confidence: np.ndarray  # float, NaN where no confidence


def token_row(t: Any, chosen: Sequence[ChosenLabel], al: Any, aligner: Any, label_source: str, tv: str, segs: Sequence[Any]) -> TokenRow:
    """The ``tokens`` row context of one aligned trace.

    ``confidence[j]`` is the ``label_confidence`` of the segment labelling token ``j`` (NaN where
    ``labels[j]`` is ignored or that label has no confidence).
    """
    from ..align import IGNORE_INDEX

    labels = np.asarray(al.labels, dtype=np.int64)
    positions = np.flatnonzero(labels != IGNORE_INDEX).astype(np.int32)
    top = max((s.segment_index for s in segs), default=-1) + 1
    seg_conf = np.full(top + 1, np.nan)  # by segment_index; the last slot serves tokens of no segment (-1)
    for s, c in zip(segs, chosen):
        if c.label is not None and c.confidence is not None:
            seg_conf[s.segment_index] = c.confidence
    seg_ids = np.asarray(al.segment_ids, dtype=np.int64)
    confidence = np.where(labels != IGNORE_INDEX, seg_conf[np.where(seg_ids >= 0, seg_ids, top)], np.nan)
    return TokenRow(t, al, aligner, label_source, tv, chosen, labels, positions, confidence)


# ----------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Column:
    """One exported column.

    Attributes
    ----------
    name : str
    feature : callable
        Zero-argument factory of its ``datasets`` feature type.
    doc : str
        One line for the card.
    value : callable
        ``value(row_context) -> value`` of one row.
    encode : callable
        ``encode(list of values) -> pyarrow.Array`` of one batch.
    """

    name: str
    feature: FeatureFactory
    doc: str
    value: Callable[[Any], Any]
    encode: Callable[[list[Any]], pa.Array] = field(default=default_encode)


def _get(path: str) -> Callable[[Any], Any]:
    return attrgetter(path)


_S, _I32, _F32, _BOOL = _value("string"), _value("int32"), _value("float32"), _value("bool")

_TRACES = (
    Column("trace_id", _S, "stable id of the trace (the key every other configuration refers to)", _get("t.trace_id")),
    Column("problem", _S, "the prompt or problem the model answered (null when the source gave none)", _get("t.problem")),
    Column("text", _S, "the reasoning text; `char_start`/`char_end` of `segments` are Python string indices (code points) into it",
           _get("t.text")),
    Column("answer", _S, "the final answer text after the reasoning (null when unknown)", _get("t.answer")),
    Column("gold_answer", _S, "the reference answer, when the source gives one", _get("t.gold_answer")),
    Column("correct", _BOOL, "whether the source marked the final answer correct (null when unknown)", _get("t.correct")),
    Column("model", _S, "the model that wrote the trace", _get("t.model")),
    Column("dataset", _S, "benchmark or source dataset of the problem", _get("t.dataset")),
    Column("source", _S, "where the trace came from (repository, dataset name or file name)", _get("t.source")),
    Column("source_format", _S, "the format adapter that read the trace (think, harmony, openai-response, chat/think, plain ...), "
           "null when not recorded", _get("source_format")),
    Column("license", _S, "licence of the trace's source as given at export time (null: unknown; see the card before redistributing)",
           _get("license")),
    Column("n_segments", _I32, "number of segments of the trace in `segments`", _get("n_segments")),
)


def _label_id(r: SegmentRow) -> int | None:
    return BEHAVIOR_ID[r.c.label] if r.c.label else None


def _distribution(r: SegmentRow) -> list[float] | None:
    return list(r.c.distribution) if r.c.label and r.c.distribution is not None else None


_SEGMENTS = (
    Column("trace_id", _S, "the trace (row of `traces`) the segment belongs to", _get("s.trace_id")),
    Column("segment_index", _I32, "0-based position of the segment in its trace", _get("s.segment_index")),
    Column("text", _S, "the segment's text, equal to `traces.text[char_start:char_end]`", _get("s.text")),
    Column("char_start", _I32, "start offset in characters (code points) into the trace's `text`, inclusive", _get("s.char_start")),
    Column("char_end", _I32, "end offset in characters, exclusive; text between segments is whitespace only", _get("s.char_end")),
    Column("token_start", _I32, "first token of the segment in the trace's `tokens` row (null without a tokenizer)",
           lambda r: int(r.al.token_start[r.i]) if r.has_tokens else None),
    Column("token_end", _I32, "one past its last token (half-open; null without a tokenizer)",
           lambda r: int(r.al.token_end[r.i]) if r.has_tokens else None),
    Column("n_tokens", _I32, "segment length in tokens of the counter named in the card", _get("n_tokens")),
    Column("label", _class_label, "behavior class (ClassLabel; null when the chosen label source gave none or tied)", _label_id),
    Column("label_source", _S, "which source the label came from (adjudicated, human, aggregate, judge, baseline, majority, import)",
           _get("c.source")),
    Column("annotator", _S, "annotator id(s) behind the label (comma-separated for votes)", _get("c.annotator")),
    Column("n_votes", _I32, "annotators that voted (0: unlabeled)", _get("c.n_votes")),
    Column("vote_share", _F32, "share of votes for the exported label", _get("c.vote_share")),
    Column("codebook_version", _S, "hash of the codebook the label was given under", _get("c.codebook_version")),
    Column("judge_model", _S, "LLM judge model behind the label (null for humans and the baseline)", _get("c.judge_model")),
    Column("prompt_template_hash", _S, "hash of the judge prompt template", _get("c.prompt_template_hash")),
    Column("label_confidence", _F32, "confidence of the exported label: an aggregate's posterior of the chosen class; else the vote "
           "share when 2 or more raters voted; else the single rater's own confidence; null if none",
           lambda r: r.c.confidence if r.c.label else None),
    # variable-length: datasets 4.0 refuses nulls in a fixed-size list
    Column("label_distribution", _list(_F32), "6 probabilities in ClassLabel order (an aggregate's posterior, or the vote fractions "
           "of 2 or more raters, or the single label's stored distribution); null if none", _distribution,
           _typed(pa.list_(pa.float32()))),
    Column("raters", _raters_feature, "every rater's latest label of the segment: `annotator`, `kind` (machine or human) and "
           "`label` (ClassLabel)", _get("raters"),
           _typed(pa.list_(pa.struct([("annotator", pa.string()), ("kind", pa.string()), ("label", pa.int64())])))),
    Column("human_verified", _BOOL, "a human reference (the latest adjudication, else the humans' unanimous or single label) "
           "exists and equals `label`", _get("verified")),
    Column("tool_version", _S, "ror_annotate version that wrote the export", _get("tv")),
    Column("dataset", _S, "benchmark or source dataset of the trace", _get("t.dataset")),
    Column("model", _S, "the model that wrote the trace", _get("t.model")),
)

_TOKENS = (
    Column("trace_id", _S, "the trace (row of `traces`)", _get("t.trace_id")),
    Column("dataset", _S, "benchmark or source dataset of the trace", _get("t.dataset")),
    Column("model", _S, "the model that wrote the trace", _get("t.model")),
    Column("input_ids", _list(_I32), "token ids of `text` under `tokenizer`", _get("al.input_ids"), _ragged(pa.int32())),
    Column("labels", _list(_value("int64")), "per-token class id, -100 = ignore (special, whitespace-only, template and unlabeled "
           "tokens): model-ready for token classification", _get("labels"), _ragged(pa.int64())),
    Column("labeled_positions", _list(_I32), "indices of the labelled tokens (where `labels` != -100)", _get("positions"),
           _ragged(pa.int32())),
    Column("labeled_classes", _list(_class_label), "their classes (ClassLabel, parallel to `labeled_positions`; every value decodes)",
           lambda r: r.labels[r.positions], _ragged(pa.int64())),
    Column("segment_ids", _list(_I32), "`segment_index` of the segment labelling each token, or -1", _get("al.segment_ids"),
           _ragged(pa.int32())),
    Column("confidence", _list(_F32), "per token, the `label_confidence` of the segment labelling it (null where `labels` is -100 "
           "or the segment's label has no confidence)", _get("confidence"), _nan_as_null_floats),
    Column("offsets", _list(_list(_I32, length=2)), "`[start, end]` characters of each token into `text`", _get("al.offsets"), _pairs),
    Column("text", _S, "the rendered string that was tokenized (the reasoning alone, or the chat-template rendering)",
           _get("al.rendered.text")),
    Column("text_offset", _I32, "where the trace's reasoning text starts inside `text`", _get("al.rendered.text_offset")),
    Column("rendering", _S, "`raw` or `chat_template`", _get("al.rendered.rendering")),
    Column("tokenizer", _S, "the tokenizer's name (a model name, or a local folder's name; never an absolute path)", _get("aligner.name")),
    Column("tokenizer_vocab_sha256", _S, "sha256 of the tokenizer's vocabulary; compare before feeding `input_ids` to a model",
           _get("aligner.vocab_sha256")),
    Column("label_source", _S, "the export's label source", _get("label_source")),
    Column("codebook_version", _S, "codebook hash(es) of the trace's labels", lambda r: joined([c.codebook_version for c in r.chosen])),
    Column("judge_model", _S, "judge model(s) of the trace's labels", lambda r: joined([c.judge_model for c in r.chosen])),
    Column("prompt_template_hash", _S, "judge prompt template hash(es)", lambda r: joined([c.prompt_template_hash for c in r.chosen])),
    Column("tool_version", _S, "ror_annotate version that wrote the export", _get("tv")),
)

#: The columns of each configuration, in output order: the one definition of names, types, docs and values.
COLUMNS: dict[str, tuple[Column, ...]] = {"traces": _TRACES, "segments": _SEGMENTS, "tokens": _TOKENS}


def features_of(config: str) -> "datasets.Features":
    """Typed features of one configuration, in column order (from :data:`COLUMNS`).

    Raises
    ------
    KeyError
        ``config`` is not one of :data:`CONFIGS`.
    """
    from datasets import Features

    return Features({c.name: c.feature() for c in COLUMNS[config]})


class Rows:
    """Row contexts of one batch per configuration and split, encoded column by column on :meth:`tables`."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], list[Any]] = {}

    def add(self, config: str, split: str, row: Any) -> None:
        """Queue one row context (:class:`TraceRow`, :class:`SegmentRow` or :class:`TokenRow`)."""
        self.rows.setdefault((config, split), []).append(row)

    def queue(self, config: str, split: str) -> list[Any]:
        """The list :meth:`add` appends to for ``(config, split)``: append row contexts to it directly."""
        return self.rows.setdefault((config, split), [])

    def tables(self) -> list[tuple[str, str, pa.Table]]:
        """``(config, split, table)`` per queued batch, columns named and ordered as :data:`COLUMNS`."""
        out = []
        for (config, split), rows in self.rows.items():
            data = {}
            for col in COLUMNS[config]:
                data[col.name] = col.encode(list(map(col.value, rows)))  # map: no Python loop around C getters
            out.append((config, split, pa.table(data)))
        return out

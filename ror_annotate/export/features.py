"""Typed features of the three configurations of an export, and a description of every column.

``ClassLabel`` columns hold class ids only: every stored value decodes with ``int2str``. A segment
without a label has a null ``label``; at token level the model-ready ``labels`` column is a plain
integer column with :data:`~ror_annotate.align.IGNORE_INDEX` (-100) for tokens without a label
(what ``torch.nn.CrossEntropyLoss`` and ``transformers.DataCollatorForTokenClassification`` expect),
and the typed names travel in the parallel ``labeled_positions`` / ``labeled_classes`` pair, which
lists only the labelled tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..records import BEHAVIORS

if TYPE_CHECKING:  # pragma: no cover
    import datasets

CONFIGS: tuple[str, ...] = ("traces", "segments", "tokens")
BEHAVIOR_ID = {b: i for i, b in enumerate(BEHAVIORS)}

#: One line per column of each configuration; the card prints these, a test checks they cover the features.
COLUMN_DOCS: dict[str, dict[str, str]] = {
    "traces": {
        "trace_id": "stable id of the trace (the key every other configuration refers to)",
        "problem": "the prompt or problem the model answered (null when the source gave none)",
        "text": "the reasoning text; `char_start`/`char_end` of `segments` are Python string indices (code points) into it",
        "answer": "the final answer text after the reasoning (null when unknown)",
        "gold_answer": "the reference answer, when the source gives one",
        "correct": "whether the source marked the final answer correct (null when unknown)",
        "model": "the model that wrote the trace",
        "dataset": "benchmark or source dataset of the problem",
        "source": "where the trace came from (repository, dataset name or file name)",
        "source_format": "the format adapter that read the trace (think, harmony, openai-response, chat/think, plain ...), null when not recorded",
        "license": "licence of the trace's source as given at export time (null: unknown; see the card before redistributing)",
        "n_segments": "number of segments of the trace in `segments`",
    },
    "segments": {
        "trace_id": "the trace (row of `traces`) the segment belongs to",
        "segment_index": "0-based position of the segment in its trace",
        "text": "the segment's text, equal to `traces.text[char_start:char_end]`",
        "char_start": "start offset in characters (code points) into the trace's `text`, inclusive",
        "char_end": "end offset in characters, exclusive; text between segments is whitespace only",
        "token_start": "first token of the segment in the trace's `tokens` row (null without a tokenizer)",
        "token_end": "one past its last token (half-open; null without a tokenizer)",
        "n_tokens": "segment length in tokens of the counter named in the card",
        "label": "behavior class (ClassLabel; null when the chosen label source gave none or tied)",
        "label_source": "which source the label came from (adjudicated, human, aggregate, judge, baseline, majority, import)",
        "annotator": "annotator id(s) behind the label (comma-separated for votes)",
        "n_votes": "annotators that voted (0: unlabeled)",
        "vote_share": "share of votes for the exported label",
        "codebook_version": "hash of the codebook the label was given under",
        "judge_model": "LLM judge model behind the label (null for humans and the baseline)",
        "prompt_template_hash": "hash of the judge prompt template",
        "label_confidence": "confidence of the exported label: an aggregate's posterior of the chosen class; else the vote share when 2 or more raters voted; else the single rater's own confidence; null if none",
        "label_distribution": "6 probabilities in ClassLabel order (an aggregate's posterior, or the vote fractions of 2 or more raters, or the single label's stored distribution); null if none",
        "raters": "every rater's latest label of the segment: `annotator`, `kind` (machine or human) and `label` (ClassLabel)",
        "human_verified": "a human reference (the latest adjudication, else the humans' unanimous or single label) exists and equals `label`",
        "tool_version": "ror_annotate version that wrote the export",
        "dataset": "benchmark or source dataset of the trace",
        "model": "the model that wrote the trace",
    },
    "tokens": {
        "trace_id": "the trace (row of `traces`)",
        "dataset": "benchmark or source dataset of the trace",
        "model": "the model that wrote the trace",
        "input_ids": "token ids of `text` under `tokenizer`",
        "labels": "per-token class id, -100 = ignore (special, whitespace-only, template and unlabeled tokens): model-ready for token classification",
        "labeled_positions": "indices of the labelled tokens (where `labels` != -100)",
        "labeled_classes": "their classes (ClassLabel, parallel to `labeled_positions`; every value decodes)",
        "segment_ids": "`segment_index` of the segment labelling each token, or -1",
        "confidence": "per token, the `label_confidence` of the segment labelling it (null where `labels` is -100 or the segment's label has no confidence)",
        "offsets": "`[start, end]` characters of each token into `text`",
        "text": "the rendered string that was tokenized (the reasoning alone, or the chat-template rendering)",
        "text_offset": "where the trace's reasoning text starts inside `text`",
        "rendering": "`raw` or `chat_template`",
        "tokenizer": "the tokenizer's name (a model name, or a local folder's name; never an absolute path)",
        "tokenizer_vocab_sha256": "sha256 of the tokenizer's vocabulary; compare before feeding `input_ids` to a model",
        "label_source": "the export's label source",
        "codebook_version": "codebook hash(es) of the trace's labels",
        "judge_model": "judge model(s) of the trace's labels",
        "prompt_template_hash": "judge prompt template hash(es)",
        "tool_version": "ror_annotate version that wrote the export",
    },
}


def traces_features() -> "datasets.Features":
    """Features of the ``traces`` configuration (one row per trace: the text the offsets index)."""
    from datasets import Features, Value

    return Features(
        {
            "trace_id": Value("string"),
            "problem": Value("string"),
            "text": Value("string"),
            "answer": Value("string"),
            "gold_answer": Value("string"),
            "correct": Value("bool"),
            "model": Value("string"),
            "dataset": Value("string"),
            "source": Value("string"),
            "source_format": Value("string"),
            "license": Value("string"),
            "n_segments": Value("int32"),
        }
    )


def segments_features() -> "datasets.Features":
    """Features of the ``segments`` configuration (one row per segment)."""
    from datasets import ClassLabel, Features, List, Value

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
            "label_confidence": Value("float32"),
            # variable-length: datasets 4.0 refuses nulls in a fixed-size list
            "label_distribution": List(Value("float32")),
            "raters": List({"annotator": Value("string"), "kind": Value("string"), "label": ClassLabel(names=list(BEHAVIORS))}),
            "human_verified": Value("bool"),
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
            "labels": List(Value("int64")),
            "labeled_positions": List(Value("int32")),
            "labeled_classes": List(ClassLabel(names=list(BEHAVIORS))),
            "segment_ids": List(Value("int32")),
            "confidence": List(Value("float32")),
            "offsets": List(List(Value("int32"), length=2)),
            "text": Value("string"),
            "text_offset": Value("int32"),
            "rendering": Value("string"),
            "tokenizer": Value("string"),
            "tokenizer_vocab_sha256": Value("string"),
            "label_source": Value("string"),
            "codebook_version": Value("string"),
            "judge_model": Value("string"),
            "prompt_template_hash": Value("string"),
            "tool_version": Value("string"),
        }
    )


def features_of(config: str) -> "datasets.Features":
    """Features of one configuration name."""
    return {"traces": traces_features, "segments": segments_features, "tokens": tokens_features}[config]()

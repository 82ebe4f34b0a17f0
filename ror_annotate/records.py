"""Typed records that cross stage boundaries.

Every record handed from one pipeline stage to the next is a pydantic model defined here;
``schemas/*.schema.json`` are generated from these models (``python -m ror_annotate.records``)
and a test keeps them in sync.

Offsets are always Python string indices (code points) into ``Trace.text``, half-open
``[char_start, char_end)``. Conversions to UTF-16 (Label Studio) or token indices
(tokenizers) happen at those edges only.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import SegmentationError

#: The six behaviors, in ClassLabel order (index = class id in every export).
BEHAVIORS: tuple[str, ...] = (
    "planning",
    "execution",
    "restatement",
    "fact",
    "reflection",
    "conclusion",
)

Behavior = Literal["planning", "execution", "restatement", "fact", "reflection", "conclusion"]

#: Where a label came from. ``baseline`` is the offline cue-phrase judge, never an LLM; ``aggregate``
#: combines several raters (ror aggregate); ``verify`` is a verifier's audit of another rater's labels
#: (ror verify); ``import`` came from another project's labels (ror labels import).
LabelSource = Literal["judge", "baseline", "human", "adjudicated", "aggregate", "verify", "import"]
LABEL_SOURCES: tuple[str, ...] = ("judge", "baseline", "human", "adjudicated", "aggregate", "verify", "import")

#: Kind of rater behind each label source, when no declared annotator says otherwise (an imported
#: rater declares its own kind in the ``annotators`` table).
RaterKind = Literal["machine", "human"]
SOURCE_KINDS: dict[str, str] = {
    "judge": "machine", "baseline": "machine", "aggregate": "machine", "verify": "machine",
    "human": "human", "adjudicated": "human", "import": "machine",
}


def utc_now() -> datetime:
    """Timezone-aware current UTC time (stored as TIMESTAMPTZ)."""
    return datetime.now(timezone.utc)


def sha256_text(text: str) -> str:
    """Hex sha256 of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Trace(_Record):
    """One reasoning trace: the text a reasoning model wrote before its answer.

    ``text`` is the reasoning only (inside ``<think>...</think>`` when the source had tags), with
    LF line endings whatever the source used; ``answer`` is the final answer text after the
    reasoning, when known.
    """

    trace_id: str = Field(min_length=1, description="Stable id: given by the source, or 'sha256:<16 hex>' of problem+text.")
    text: str = Field(min_length=1, description="The reasoning text; all segment offsets index into it.")
    problem: str | None = None
    answer: str | None = Field(None, description="Final answer text (after </think>, or the last \\boxed{}).")
    gold_answer: str | None = Field(None, description="Reference answer, when the source gives one.")
    correct: bool | None = Field(None, description="Whether the source marked the final answer correct.")
    model: str | None = Field(None, description="The model that wrote the trace.")
    source: str | None = Field(None, description="Where the trace came from (file, dataset name, repository).")
    dataset: str | None = Field(None, description="Benchmark or source dataset (GSM8K, MATH, ...), used for stratified splits.")
    source_format: str | None = Field(
        None, description="Format adapter that read the trace (think, harmony, openai-response, chat/think, plain ...; ror_annotate.formats)."
    )
    meta: dict[str, Any] = Field(default_factory=dict, description="Any other JSON-serializable fields kept from the source.")

    @property
    def text_sha256(self) -> str:
        """sha256 of ``text``; part of the judge cache key."""
        return sha256_text(self.text)


class Segment(_Record):
    """A sentence- or clause-level piece of one trace.

    Invariant: ``trace.text[char_start:char_end] == text``; the text neither starts nor ends with
    whitespace. ``n_tokens`` is counted by ``token_counter`` (a tokenizer name, or
    ``approx:regex-v1``, see :mod:`ror_annotate.segment`).
    """

    trace_id: str = Field(min_length=1)
    segment_index: int = Field(ge=0, description="0-based position of the segment in its trace.")
    char_start: int = Field(ge=0, description="Start offset in characters (code points), inclusive.")
    char_end: int = Field(gt=0, description="End offset in characters (code points), exclusive.")
    text: str = Field(min_length=1)
    n_tokens: int = Field(ge=0, description="Length in tokens of the subject tokenizer, or the approximation.")

    @model_validator(mode="after")
    def _check_span(self) -> "Segment":
        if self.char_end <= self.char_start:
            raise ValueError(f"segment {self.trace_id}#{self.segment_index}: char_end {self.char_end} <= char_start {self.char_start}")
        if self.char_end - self.char_start != len(self.text):
            raise ValueError(
                f"segment {self.trace_id}#{self.segment_index}: span length {self.char_end - self.char_start} "
                f"!= len(text) {len(self.text)}"
            )
        return self

    @property
    def segment_id(self) -> str:
        """``"<trace_id>#<segment_index>"``: the id shown to judges and annotators."""
        return f"{self.trace_id}#{self.segment_index}"


def segments_of_rows(rows: Sequence[tuple[str, int, int, int, str, int]]) -> list[Segment]:
    """:class:`Segment` records (validated) of rows ``(trace_id, segment_index, char_start, char_end, text,
    n_tokens)`` as :meth:`~ror_annotate.store.Store.segment_rows_by_trace` returns them.

    Raises
    ------
    pydantic.ValidationError
        A row whose span does not match its text (a damaged store).
    """
    return [Segment(trace_id=r[0], segment_index=r[1], char_start=r[2], char_end=r[3], text=r[4], n_tokens=r[5]) for r in rows]


class SegmentRow(NamedTuple):
    """A stored segment as a plain read-only row: :class:`Segment`'s fields, in its order, without a
    pydantic record.

    For stages that read thousands of stored segments a second and only read their fields (the LLM
    judge's prompts): a block of 64 traces, 4,732 segments, took 11.4 ms of CPU as records and
    1.8 ms as checked rows (best of five over the same rows; a first pass over fresh rows, as in a
    run, cost the records up to 9 microseconds each), on the core the event loop shares. Built by
    :func:`segment_rows_checked`, which makes the checks :class:`Segment` makes; everything else uses
    :class:`Segment`.
    """

    trace_id: str
    segment_index: int
    char_start: int
    char_end: int
    text: str
    n_tokens: int

    @property
    def segment_id(self) -> str:
        """``"<trace_id>#<segment_index>"``: the id shown to judges and annotators."""
        return f"{self.trace_id}#{self.segment_index}"


#: What reading a segment's fields needs: a :class:`Segment` record or a :class:`SegmentRow`.
SegmentLike = Segment | SegmentRow


def segment_rows_checked(rows: Iterable[tuple[str, int, int, int, str, int]]) -> list[SegmentRow]:
    """:class:`SegmentRow` of rows ``(trace_id, segment_index, char_start, char_end, text, n_tokens)`` as
    :meth:`~ror_annotate.store.Store.segment_rows_by_trace` returns them, with :class:`Segment`'s
    checks (a non-empty trace id and text, non-negative index, offsets and token count, and
    ``char_end - char_start == len(text) > 0``).

    Raises
    ------
    SegmentationError
        A row that fails a check (a damaged store), naming the segment and the check; code E300, a
        ``ValueError`` (the ``ror`` command prints it and exits with status 2, no traceback).
    """
    out = list(map(SegmentRow._make, rows))
    for s in out:
        if (s.char_end - s.char_start != len(s.text) or not s.text or not s.trace_id or s.segment_index < 0
                or s.char_start < 0 or s.n_tokens < 0):
            raise SegmentationError(
                f"stored segment {s.trace_id}#{s.segment_index} is damaged: span {s.char_start}-{s.char_end}, "
                f"{len(s.text)} characters of text, {s.n_tokens} tokens (a span must hold its text, every count >= 0); "
                "segment the trace again (ror segment --force)"
            )
    return out


class Label(_Record):
    """One behavior label for one segment from one annotator.

    ``annotator`` names who labeled: ``"baseline:cue-v1"``, ``"openai:gpt-4.1-mini"``,
    ``"openai:gpt-4.1-mini@s2"`` (second sample), a pseudonymous human id such as ``"h-3f2a9c"``,
    or ``"adjudicator:<pseudonym>"``. Emails never appear here.
    """

    trace_id: str = Field(min_length=1)
    segment_index: int = Field(ge=0)
    label: Behavior
    source: LabelSource
    annotator: str = Field(min_length=1)
    codebook_version: str = Field(min_length=1, description="sha256 of the codebook's canonical form, or a name for the baseline rules.")
    run_id: str | None = None
    study: str | None = Field(None, description="Review study the label belongs to (human and adjudicated labels).")
    confidence: float | None = Field(None, ge=0.0, le=1.0)
    rationale: str | None = None
    created_at: datetime = Field(default_factory=utc_now)
    extra: dict[str, Any] = Field(default_factory=dict, description="Source-specific provenance (Label Studio ids, lead time, ...).")
    distribution: list[float] | None = Field(
        None, description="Probability of each behavior in BEHAVIORS order (6 values summing to 1), e.g. an aggregate's posterior."
    )

    @model_validator(mode="after")
    def _check_distribution(self) -> "Label":
        d = self.distribution
        if d is not None:
            if len(d) != len(BEHAVIORS) or any(not (0.0 <= p <= 1.0) for p in d) or abs(sum(d) - 1.0) > 1e-6:
                raise ValueError(
                    f"label of {self.trace_id}#{self.segment_index}: distribution must be {len(BEHAVIORS)} probabilities "
                    f"in BEHAVIORS order summing to 1, got {d!r}"
                )
        return self

    @property
    def label_id(self) -> str:
        """Deterministic id: one label per (segment, source, annotator, codebook, study)."""
        key = json.dumps(
            [self.trace_id, self.segment_index, self.source, self.annotator, self.codebook_version, self.study],
            ensure_ascii=False,
        )
        return sha256_text(key)[:32]



def label_ids(
    trace_id: str, segment_indexes: Iterable[int], *, source: str, annotator: str, codebook_version: str, study: str | None = None
) -> list[str]:
    """:attr:`Label.label_id` of the labels of one trace's segments by one rater, without a Label each.

    The same sha256 over the same JSON key (``json.dumps`` with ``ensure_ascii=False``: ``", "``
    separators, an int index); the constant parts of the key are encoded once per call.

    Returns
    -------
    list of str
        One 32-hex-digit id per index, in ``segment_indexes`` order.
    """
    head = json.dumps([trace_id], ensure_ascii=False)[:-1] + ", "
    tail = ", " + json.dumps([source, annotator, codebook_version, study], ensure_ascii=False)[1:]
    # two tight loops (int() by map, no name look-up of hashlib.sha256 per id): the judge's writer
    # thread makes an id per label while holding the GIL
    keys = [f"{head}{i}{tail}".encode() for i in map(int, segment_indexes)]
    sha256 = hashlib.sha256
    return [sha256(k).hexdigest()[:32] for k in keys]

class Annotator(_Record):
    """A declared rater: who or what produced a set of labels, and how.

    Machines (LLM judges, the baseline, aggregates, verifiers, imported machine labels) carry their
    model, provider (the endpoint's base URL with any secret scrubbed), sampling settings and codebook;
    humans carry only their pseudonym, study and role. E-mails never appear here.
    """

    annotator: str = Field(min_length=1, description="The id written on the rater's labels (Label.annotator).")
    kind: RaterKind
    source: LabelSource
    model: str | None = Field(None, description="Model or method name (e.g. 'gpt-4.1-mini', 'dawid-skene').")
    provider: str | None = Field(None, description="Base URL of the endpoint, secrets scrubbed; None for the default provider.")
    temperature: float | None = None
    samples: int | None = Field(None, ge=1)
    codebook_version: str | None = None
    study: str | None = None
    details: dict[str, Any] = Field(default_factory=dict, description="Anything else: raters combined, role, crosswalk, accuracy estimates ...")
    declared_at: datetime = Field(default_factory=utc_now)


class Run(_Record):
    """One execution of a ``ror`` command, for provenance and usage accounting."""

    run_id: str
    command: str
    parameters: dict[str, Any] = Field(default_factory=dict, description="Options as given; secrets are never stored.")
    package_versions: dict[str, str] = Field(default_factory=dict)
    started_at: datetime = Field(default_factory=utc_now)
    ended_at: datetime | None = None
    status: Literal["running", "ok", "failed", "interrupted"] = "running"
    counts: dict[str, Any] = Field(default_factory=dict, description="What the run did: traces, segments, labels, requests, tokens, cost_usd ...")


RECORDS: dict[str, type[BaseModel]] = {"trace": Trace, "segment": Segment, "label": Label, "run": Run, "annotator": Annotator}


def write_json_schemas(directory: str | Path) -> list[Path]:
    """Write ``<name>.schema.json`` for every record in :data:`RECORDS` into ``directory``.

    Returns the written paths. The files are generated from the models, never edited by hand.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in RECORDS.items():
        path = directory / f"{name}.schema.json"
        path.write_text(json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover
    import sys

    for p in write_json_schemas(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "schemas"):
        print(p)

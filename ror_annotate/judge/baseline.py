"""The offline cue-phrase baseline judge (``--judge baseline``).

A transparent rule set, not an LLM: it maps discourse cues ("Wait,", "Let me", "So the answer
is") and a few simple features (overlap with the problem statement or earlier text, digits and
operators, position after the first answer) to the six behaviors. It exists so the whole pipeline
runs offline and as a floor for any real judge. Its labels are stored with ``source="baseline"``,
``annotator="baseline:cue-v1"`` and ``codebook_version="baseline-cue-v1"`` (the rules, not the
codebook, are what they follow).

Rules are tried in a fixed order; the first that fires wins (see :func:`classify_segment`). Every
rule is a named regular expression or feature so a user can see why a segment got its label
(the rule name is stored as the label's rationale).
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..records import Annotator, Segment, label_ids
from . import JudgeReport, register_judge

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from rich.progress import Progress

    from ..records import Run
    from ..store import Store

BASELINE_NAME = "baseline:cue-v1"
BASELINE_VERSION = "baseline-cue-v1"
#: Labels written per transaction: an interrupt loses at most this many, never the whole stage.
FLUSH_LABELS = 20_000
#: Traces read per query: memory stays flat in corpus size.
READ_BATCH_TRACES = 256
#: ... or, for short traces, up to this many segments (at most READ_BATCH_MAX_TRACES traces): each batch's
#: queries cost a scan of the tables' trace ids, so 100k short traces in 256s would do 400 scans.
READ_BATCH_SEGMENTS = 60_000
READ_BATCH_MAX_TRACES = 8_192

_I = re.IGNORECASE


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, _I)


# Opening cues, matched at the start of the segment (after markdown bullets/headers).
_LEAD = r"^(?:[#>*\-\s]|\d+[.)]\s)*"

CONCLUSION_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("final-answer-header", _rx(_LEAD + r"(?:\*\*)?final answer")),
    ("boxed", _rx(r"\\boxed\s*\{")),
    ("answer-is", _rx(r"\b(?:the|my|our) (?:final )?answer (?:is|should be|would be|=)")),
    ("so-the-result", _rx(_LEAD + r"(?:so|thus|therefore|hence|overall)\b[,:]?\s+(?:the )?(?:final |total |required |desired |minimum |maximum |only |correct )?(?:answer|result|value|solution|probability|number|total|sum|area|length|ratio|remainder)\b.*\b(?:is|are|equals?|=|should be|must be)\b")),
    ("conclusion-word", _rx(_LEAD + r"(?:in conclusion|to conclude|to summarize|in summary)\b")),
)

REFLECTION_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("wait", _rx(_LEAD + r"(?:but |oh |hmm,? )?wait\b")),
    ("hmm", _rx(_LEAD + r"(?:hmm+|hm+|oh|oops|uh|huh|whoa|aha|ah)\b")),
    ("hold-on", _rx(_LEAD + r"(?:but )?(?:hold on|actually|no,|nope|on second thought|on reflection)\b")),
    ("doubt-question", _rx(r"\b(?:is (?:that|this|it) (?:right|correct|possible|true)|did i (?:make|do|miss)|am i (?:missing|sure)|does (?:that|this) make sense|why (?:is|did|would))\b.*\?")),
    ("error-word", _rx(r"\b(?:mistake|miscalculat\w*|wrong|incorrect|contradict\w*|doesn't make sense|does not make sense|that can't be|can't be right|not possible|inconsistent|discrepancy|typo)\b")),
    # As first written this was ``LEAD(...)\b[,.! ].*|.*\b(...)\b``: the second branch's leading
    # ``.*`` made every search quadratic in the line length (147 us of a segment's 200 us). A search
    # only asks whether some position matches, and ``.*`` may match nothing, so dropping the leading
    # and trailing ``.*`` matches exactly the same strings (tests/test_baseline_fast.py checks it).
    ("confirmation", _rx(_LEAD + r"(?:yes|yep|right|correct|okay, that|ok, that|good|great|perfect)\b[,.! ]|\b(?:checks out|matches|consistent with|makes sense|seems (?:right|correct|reasonable|plausible)|that's correct|is correct|confirm(?:s|ed)?)\b")),
    ("uncertainty", _rx(r"\b(?:i'm not sure|not sure|i wonder|maybe i|perhaps i (?:made|was)|i think i|seems off|suspicious|unclear|i'm confused|confusing)\b")),
)

PLANNING_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("let-me", _rx(_LEAD + r"(?:(?:so|now|ok(?:ay)?|alright|first|next|then|but|and|maybe|perhaps|well|thus|therefore|hence)[,]?\s+)*(?:let me|let's|let us|i'll|i will|i need to|i should|i have to|i must|i want to|i'm going to|we need to|we should|we have to|we must|we can|i can|i could|we'll|i might)\b")),
    ("approach", _rx(_LEAD + r"(?:(?:so|now|but)[,]?\s+)?(?:alternatively|another (?:way|approach|idea|method)|maybe (?:there's|i can|we can|try|use)|perhaps (?:i|we) (?:can|should|could)|one (?:way|approach|idea)|the (?:plan|strategy|approach|idea|goal|key) (?:is|here))\b")),
    ("step-header", _rx(_LEAD + r"(?:\*\*)?(?:step \d+|first|next|now|then|finally|to (?:find|solve|compute|calculate|determine|check|verify|get))\b[^.=]{0,80}[:,]?\s*$")),
    # A short lead-in that announces the next step ("So plugging in the numbers:", "Factor out k:").
    ("lead-in-colon", _rx(r"^(?!.*=)[^\n]{3,90}:\s*$")),
    ("to-do", _rx(_LEAD + r"to (?:find|solve|compute|calculate|determine|check|verify|get|figure out)\b")),
)

FACT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("recall", _rx(r"\b(?:recall|remember|i know that|we know that|it is known|well[- ]known|by definition|is defined as|defined as|the definition of|by the (?:\w+ ){0,3}(?:theorem|formula|rule|law|identity|principle|inequality)|according to)\b")),
    ("formula-is", _rx(r"\b(?:the )?(?:formula|equation|identity|theorem|law|rule|principle) (?:for|of|is|says|states|gives)\b")),
    ("constant", _rx(r"\b(?:speed of light|gas constant|planck|avogadro|boltzmann|gravitational constant|pi is approximately|e is approximately|\w+ constant is)\b")),
    ("general-statement", _rx(r"^(?!.*\d)(?:in general|generally|typically|usually|a \w+ is an?|an? \w+ (?:is|are) (?:a|an|the|always|never))\b")),
)

RESTATEMENT_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("problem-says", _rx(r"\b(?:the (?:problem|question) (?:says|states|asks|is asking|gives|tells)|we(?:'re| are) (?:given|told|asked)|i(?:'m| am) (?:given|told|asked)|given that|the problem is|i have this problem|we have this problem)\b")),
    ("need-to-find-opening", _rx(_LEAD + r"(?:okay|ok|alright|all right|so)[,]?\s+(?:so\s+)?(?:i|we) (?:have|need|want|am|are)\b")),
    ("recap", _rx(_LEAD + r"(?:so )?(?:as (?:before|earlier|above|computed|found|established|mentioned)|recall(?:ing)? that (?:we|i) (?:found|had|got)|earlier (?:we|i) (?:found|had|got)|we (?:already|previously) (?:found|had|computed)|to recap|again,)\b")),
)

_WAIT_THEN_PLAN = _rx(_LEAD + r"(?:but |oh |hmm,? )?wait\b[,.!]?\s*(?:but |so |actually,? |hold on,? )?(?:let me|let's|i (?:need|should|have) to|maybe i should)\b")
_COMPUTATION = re.compile(r"(?:\d|\))\s*(?:=|≈|\\approx|is)\s*-?\(?\d")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")

_WORD = re.compile(r"[A-Za-z]+|\d+(?:\.\d+)?")
_STOP = frozenset("a an the of to and or is are be in on at for with that this it as by so we i let me".split())


def _content_words(text: str) -> set[str]:
    if text.isascii():  # lowercasing first finds the same words, lowercased (ASCII letters stay letters)
        return {w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in _STOP}
    return {w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP and len(w) > 1}


def _overlap(words: set[str], reference: set[str] | frozenset[str]) -> float:
    return len(words & reference) / len(words) if words else 0.0


@dataclass(frozen=True)
class Context:
    """What the rules may look at besides the segment: the problem and earlier segments."""

    problem_words: frozenset[str]
    earlier_words: frozenset[str]
    after_first_answer: bool
    index: int
    n_segments: int


_CLAIMS_ERROR = tuple(p for name, p in REFLECTION_RULES if name in ("error-word", "doubt-question", "uncertainty"))
_SYMBOL = re.compile(r"[=+\-*/^]")
#: Substrings at least one of which every match of a rule's pattern holds, for the unanchored rules
#: that cost most (a search tries every position): on an ASCII segment, whose lowercase form is what
#: ``re.IGNORECASE`` compares, a rule none of whose needles is in ``head.lower()`` cannot match and is not
#: searched. Each needle is a literal that every alternative of the pattern must contain (lowercase;
#: ``' '`` is the pattern's literal space). Non-ASCII segments are always searched: Unicode case
#: folding (``ſ`` matches ``s``, ``İ`` matches ``i``) is not ``str.lower``. ``tests/test_baseline_fast.py``
#: checks the needles on random strings and every real segment against the frozen reference rules.
_NEEDLES: dict[str, tuple[str, ...]] = {
    "answer-is": ("answer ",),
    "error-word": ("mistake", "miscalculat", "wrong", "incorrect", "contradict", "doesn't make sense", "does not make sense",
                   "can't be", "not possible", "inconsistent", "discrepancy", "typo"),
    "confirmation": ("yes", "yep", "right", "correct", "okay, that", "ok, that", "good", "great", "perfect", "checks out", "matches",
                     "consistent with", "makes sense", "seems ", "confirm"),
    "uncertainty": ("not sure", "i wonder", "maybe i", "perhaps i", "i think i", "seems off", "suspicious", "unclear", "i'm confused",
                    "confusing"),
    "recall": ("recall", "remember", "know that", "it is known", "well-known", "well known", "by definition", "defined as",
               "definition of", "by the ", "according to"),
    "formula-is": ("formula ", "equation ", "identity ", "theorem ", "law ", "rule ", "principle "),
    "constant": ("speed of light", "constant", "planck", "avogadro", "boltzmann", "is approximately"),
    "problem-says": ("the problem ", "the question ", "we're ", "we are ", "i'm ", "i am ", "given that", "this problem"),
}
#: A rule whose every match holds this character, whatever the script (``doubt-question`` ends in ``?``).
_NEEDS_CHAR: dict[str, str] = {"doubt-question": "?"}
#: Every cue rule in the order it is tried: ``(behavior, rule name, pattern, on the first line only,
#: needles of _NEEDLES or None, character of _NEEDS_CHAR or "")``.
_ORDERED_RULES: tuple[tuple[str, str, re.Pattern[str], bool, tuple[str, ...] | None, str], ...] = tuple(
    (behavior, name, pattern, behavior == "planning", _NEEDLES.get(name), _NEEDS_CHAR.get(name, ""))
    for behavior, rules in (
        ("conclusion", CONCLUSION_RULES),
        ("reflection", REFLECTION_RULES),
        ("planning", PLANNING_RULES),
        ("fact", FACT_RULES),
        ("restatement", RESTATEMENT_RULES),
    )
    for name, pattern in rules
)


def _claims_error(text: str) -> bool:
    return any(p.search(text) for p in _CLAIMS_ERROR)


def _computes(head: str) -> bool:
    """A computation (``3 = 4``, ``x) is 2``) and at least three numbers: a new derivation step."""
    if _COMPUTATION.search(head) is None:
        return False
    found = 0
    for _ in _NUMBER.finditer(head):
        found += 1
        if found >= 3:
            return True
    return False


def _rule_of(text: str, words: set[str], problem_words: frozenset[str], earlier_words: set[str] | frozenset[str], index: int) -> tuple[str, str]:
    """The rules of :func:`classify_segment` on one segment whose content words are already known.

    Shared by :func:`classify_segment`, :func:`classify_trace` and the judge's batch path, so the
    rules exist once. ``words`` is ``_content_words(text)``; the sets are read, never copied.
    """
    head = text.strip()
    first_line = head.splitlines()[0] if head else head
    # Traces usually open by restating the task ("Okay, so I need to find ..."), which the
    # planning cues would otherwise claim.
    if index < 3 and len(words) >= 4 and _overlap(words, problem_words) >= 0.5:
        return "restatement", "opening-restates-problem"
    # A doubt that opens a check ("Wait, let me verify ...") is the plan of a re-checking round.
    if _WAIT_THEN_PLAN.search(first_line):
        return "planning", "wait-then-plan"
    # A cue followed by an actual new computation ("Wait, 3/8 is 9/24 = ...") is execution;
    # computed only when a reflection or planning cue fires (the only rules it changes).
    computes: bool | None = None
    lower = head.lower() if head.isascii() else None  # for the needles: only where str.lower is what re.I compares
    for behavior, name, pattern, on_first_line, needles, char in _ORDERED_RULES:
        if needles is not None and lower is not None:
            for needle in needles:
                if needle in lower:
                    break
            else:
                continue  # no needle: the pattern cannot match
        elif char and char not in head:
            continue
        if pattern.search(first_line if on_first_line else head):
            if behavior in ("reflection", "planning"):
                if computes is None:
                    computes = _computes(head)
                if computes and not _claims_error(head):
                    return "execution", f"{name}+computation"
            return behavior, name
    if len(words) >= 3:
        new_numbers = any(w[0].isdigit() and w not in problem_words and w not in earlier_words for w in words)
        if not new_numbers and _overlap(words, problem_words) >= 0.8:
            return "restatement", "overlap-problem"
        # Near-verbatim repeats only: reasoning reuses earlier words all the time while deriving.
        if len(words) >= 6 and not new_numbers and _overlap(words, earlier_words) >= 0.97 and not _SYMBOL.search(head):
            return "restatement", "overlap-earlier"
    return "execution", "default-execution"


def classify_segment(text: str, context: Context) -> tuple[str, str]:
    """Label one segment; returns ``(behavior, rule_name)``.

    Order (first match wins): an opening segment (first three) that mostly repeats the problem is
    restatement; then conclusion, reflection, planning, fact, restatement by cue, then
    restatement by overlap (>= 80% of content words already in the problem or earlier text and no
    new number), then execution (the default: a derivation or computation step).
    """
    return _rule_of(text, _content_words(text), context.problem_words, context.earlier_words, context.index)


def classify_texts(problem: str | None, texts: Sequence[str], indexes: Sequence[int] | None = None) -> list[tuple[str, str]]:
    """Label one trace's segment texts in order; returns ``[(behavior, rule_name), ...]``.

    The rules of :func:`classify_segment` with each segment's content words computed once and
    the earlier text's words kept in one growing set (no copy per segment). ``indexes`` are the
    segments' ``segment_index`` values (default ``0 .. len(texts) - 1``).
    """
    problem_words = frozenset(_content_words(problem or ""))
    earlier: set[str] = set()
    out = []
    for position, text in enumerate(texts):
        words = _content_words(text)
        out.append(_rule_of(text, words, problem_words, earlier, position if indexes is None else indexes[position]))
        earlier |= words
    return out


def classify_trace(problem: str | None, segments: Sequence[Segment]) -> list[tuple[str, str]]:
    """Label every segment of one trace in order; returns ``[(behavior, rule_name), ...]``."""
    return classify_texts(problem, [seg.text for seg in segments], [seg.segment_index for seg in segments])


class BaselineJudge:
    """The cue-phrase baseline as a :class:`~ror_annotate.judge.Judge`.

    Parameters
    ----------
    workers : int, optional
        Processes its rules run in (:func:`classify_many`); default every core, 1 in this process.
        The stored labels are the same for any value.
    """

    annotator = BASELINE_NAME
    source = "baseline"
    codebook_version = BASELINE_VERSION

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def declared_annotators(self) -> list[Annotator]:
        """The baseline as a declared machine rater (its model is the rule-set name)."""
        return [Annotator(annotator=BASELINE_NAME, kind="machine", source="baseline", model=BASELINE_VERSION,
                          codebook_version=BASELINE_VERSION, details={"rules": "cue phrases (ror_annotate.judge.baseline)"})]

    def label(
        self, store: "Store", trace_ids: Sequence[str], *, run: "Run", progress: "Progress | None" = None
    ) -> JudgeReport:
        """Label all stored segments of ``trace_ids``, committing every ``FLUSH_LABELS`` labels.

        Idempotent: a segment whose stored baseline label (and rule) is what the rules give now is
        left untouched, with its run and time, and counted as ``skipped``; changed ones are replaced.
        An interrupt keeps every batch committed before it; re-running labels the rest.

        Works on columns: per batch of :data:`READ_BATCH_TRACES` traces one Arrow read of the
        segments' texts; the rules (:func:`classify_texts`) and the label ids run in
        :attr:`workers` processes (:func:`classify_many`, results in input order, so the stored
        labels are the same for any number of workers) while this process reads the next batch
        and writes labels as one Arrow table per flush (:meth:`Store.upsert_label_table`): no
        :class:`~ror_annotate.records.Segment` or :class:`~ror_annotate.records.Label` object per segment.
        """
        report = JudgeReport()
        trace_ids = list(dict.fromkeys(trace_ids))  # a trace given twice is labelled once
        task = progress.add_task("baseline labels", total=len(trace_ids)) if progress else None
        pending = _PendingLabels(run.run_id)
        # per trace handed to classify_many, in order: (stored labels of its batch, traces done when it is the batch's last)
        queued: deque[tuple[set[tuple[str, int, str, str]], int]] = deque()

        def to_classify() -> Iterator[tuple[str, str | None, list[str], list[int]]]:
            for batch in _read_batches(trace_ids, store.segmentations()):
                # ingestion order, as the traces were labelled one by one before
                problems = store.rows_of_traces("traces", "trace_id, problem", batch, order_by="ingested_at, trace_id")
                segs = store.arrow_of_traces("segments", "trace_id, segment_index, text", batch, order_by="trace_id, segment_index")
                stored = set(store.rows_of_traces(
                    "labels", "trace_id, segment_index, label, rationale", batch,
                    where="source = 'baseline' AND annotator = ? AND codebook_version = ?", params=[BASELINE_NAME, BASELINE_VERSION],
                ))
                by_trace = _trace_slices(segs["trace_id"].to_pylist())
                indexes = segs["segment_index"].to_pylist()
                texts = segs["text"].to_pylist()
                for k, (trace_id, problem) in enumerate(problems):
                    lo, hi = by_trace.get(trace_id, (0, 0))
                    queued.append((stored, len(problems) if k == len(problems) - 1 else 0))
                    yield trace_id, problem, texts[lo:hi], indexes[lo:hi]

        for trace_id, indexes, labels, rationales, ids in classify_many(to_classify(), workers=self.workers, task_segments=TASK_SEGMENTS):
            stored, batch_done = queued.popleft()
            if stored:
                for index, behavior, rationale, label_id in zip(indexes, labels, rationales, ids):
                    if (trace_id, index, behavior, rationale) in stored:
                        report.skipped += 1
                    else:
                        pending.add(trace_id, index, behavior, rationale, label_id)
            else:
                pending.extend(trace_id, indexes, labels, rationales, ids)
            if len(pending) >= FLUSH_LABELS:
                report.labeled += store.upsert_label_table(pending.take())
            if batch_done and progress is not None and task is not None:
                progress.advance(task, batch_done)
        report.labeled += store.upsert_label_table(pending.take())
        return report


#: Segments per task sent to a worker by :func:`classify_many` (whole traces; a longer trace is one task).
TASK_SEGMENTS = 8_000


def _classify_one(trace_id: str, problem: str | None, texts: list[str], indexes: list[int]) -> tuple[str, list[int], list[str], list[str], list[str]]:
    """``(trace_id, indexes, labels, rationales, label_ids)`` of one trace's segments (the rules and the ids)."""
    labels: list[str] = []
    rationales: list[str] = []
    for behavior, rule in classify_texts(problem, texts, indexes):
        labels.append(behavior)
        rationales.append(f"rule:{rule}")
    ids = label_ids(trace_id, indexes, source="baseline", annotator=BASELINE_NAME, codebook_version=BASELINE_VERSION)
    return trace_id, indexes, labels, rationales, ids


def _classify_task(batch: list[tuple[str, str | None, list[str], list[int]]]) -> list[tuple[str, list[int], list[str], list[str], list[str]]]:
    return [_classify_one(*item) for item in batch]


def classify_many(
    items: Iterable[tuple[str, str | None, list[str], list[int]]], *, workers: int | None = None, task_segments: int = TASK_SEGMENTS,
) -> Iterator[tuple[str, list[int], list[str], list[str], list[str]]]:
    """The baseline's labels of many traces, in parallel over CPU cores, in input order.

    Parameters
    ----------
    items : iterable of (trace_id, problem, texts, indexes)
        One trace's segment texts in order, with their ``segment_index`` values; consumed lazily
        (at most about ``4 * workers`` tasks of ``task_segments`` segments are in flight).
    workers : int, optional
        Worker processes; default every core (:func:`ror_annotate.segment.default_workers`), and never
        more than that (:func:`ror_annotate.pool.max_workers`); 1, or an input that fits one task, runs
        in this process.
    task_segments : int
        Segments per task sent to a worker.

    Yields
    ------
    (trace_id, indexes, labels, rationales, label_ids)
        Per input trace, in input order: the behaviors and ``"rule:<name>"`` rationales of
        :func:`classify_texts`, and the label ids of :func:`ror_annotate.records.label_ids` for the
        baseline rater, the same whatever ``workers`` is.

    Raises
    ------
    ConfigError
        ``workers`` or ``task_segments`` is below 1.
    WorkerError
        ``E140``: a worker process died (was killed) while the pool ran.
    """
    from ..segment import default_workers

    workers = default_workers() if workers is None else workers
    if workers < 1 or task_segments < 1:
        raise ConfigError(f"workers={workers} and task_segments={task_segments} must both be at least 1")
    if workers == 1:
        return (_classify_one(*item) for item in items)
    return _classify_in_pool(items, workers, task_segments)


def _tasks(items: Iterable[tuple[str, str | None, list[str], list[int]]], task_segments: int) -> Iterator[list[tuple[str, str | None, list[str], list[int]]]]:
    batch: list[tuple[str, str | None, list[str], list[int]]] = []
    size = 0
    for item in items:
        batch.append(item)
        size += len(item[2]) + 1
        if size >= task_segments:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _classify_in_pool(
    items: Iterable[tuple[str, str | None, list[str], list[int]]], workers: int, task_segments: int,
) -> Iterator[tuple[str, list[int], list[str], list[str], list[str]]]:
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from ..pool import init_worker, result, submit
    from ..pool import max_workers as pool_workers

    tasks = _tasks(items, task_segments)
    first = next(tasks, None)
    second = next(tasks, None) if first is not None else None
    if first is None or second is None:  # one task: starting workers would only cost
        yield from _classify_task(first or [])
        return
    # forkserver (else spawn), not fork: this process runs threads (DuckDB); see ror_annotate.segment
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(["ror_annotate.segment", __name__])  # no effect once the server runs
    workers = pool_workers(workers)
    workers = min(workers, 61) if os.name == "nt" else workers
    # init_worker: Ctrl-C is the parent's to handle; a worker exits with its parent, even after kill -9
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=init_worker)
    pending: deque = deque()
    try:
        for batch in itertools.chain((first, second), tasks):
            pending.append(submit(pool, _classify_task, batch))  # E140 if a worker died
            if len(pending) >= 4 * workers:  # bounded read-ahead: memory stays flat on any corpus
                yield from result(pending.popleft())
        while pending:
            yield from result(pending.popleft())
    finally:  # also when the caller stops early or a task failed: drop what is queued
        pool.shutdown(wait=True, cancel_futures=True)


def _read_batches(trace_ids: list[str], segmented: dict[str, tuple[str, str, int]]) -> Iterator[list[str]]:
    """Batches of ``trace_ids`` in order: :data:`READ_BATCH_TRACES` traces, or more while they hold
    fewer than :data:`READ_BATCH_SEGMENTS` segments (``segmented``: :meth:`Store.segmentations`)."""
    batch: list[str] = []
    n_segments = 0
    for trace_id in trace_ids:
        batch.append(trace_id)
        n_segments += segmented[trace_id][2] if trace_id in segmented else 0
        if len(batch) >= READ_BATCH_MAX_TRACES or (len(batch) >= READ_BATCH_TRACES and n_segments >= READ_BATCH_SEGMENTS):
            yield batch
            batch, n_segments = [], 0
    if batch:
        yield batch


def _trace_slices(trace_col: list[str]) -> dict[str, tuple[int, int]]:
    """``{trace_id: (start, stop)}`` of the runs of equal ids in a column sorted by trace id."""
    out: dict[str, tuple[int, int]] = {}
    start = 0
    for k in range(1, len(trace_col) + 1):
        if k == len(trace_col) or trace_col[k] != trace_col[start]:
            out[trace_col[start]] = (start, k)
            start = k
    return out


class _PendingLabels:
    """Baseline labels gathered as columns until they are written as one Arrow table."""

    def __init__(self, run_id: str | None) -> None:
        self.run_id = run_id
        self._clear()

    def _clear(self) -> None:
        self.trace_ids: list[str] = []
        self.indexes: list[int] = []
        self.labels: list[str] = []
        self.rationales: list[str] = []
        self.ids: list[str] = []

    def __len__(self) -> int:
        return len(self.indexes)

    def add(self, trace_id: str, index: int, behavior: str, rationale: str, label_id: str) -> None:
        self.trace_ids.append(trace_id)
        self.indexes.append(index)
        self.labels.append(behavior)
        self.rationales.append(rationale)
        self.ids.append(label_id)

    def extend(self, trace_id: str, indexes: list[int], labels: list[str], rationales: list[str], ids: list[str]) -> None:
        """Add one trace's labels (the lists are parallel)."""
        self.trace_ids += [trace_id] * len(indexes)
        self.indexes += indexes
        self.labels += labels
        self.rationales += rationales
        self.ids += ids

    def take(self) -> "pa.Table":
        """The gathered labels as a table of :data:`~ror_annotate.store.LABEL_TABLE_SCHEMA` (then empties)."""
        import pyarrow as pa

        from ..records import utc_now
        from ..store import LABEL_TABLE_SCHEMA, to_naive_utc

        n = len(self)
        now = to_naive_utc(utc_now())

        def const(value: Any, type_: "pa.DataType") -> "pa.Array":
            return pa.repeat(pa.scalar(value, type=type_), n)

        table = pa.table(
            {
                "label_id": pa.array(self.ids, pa.string()), "trace_id": pa.array(self.trace_ids, pa.string()),
                "segment_index": pa.array(self.indexes, pa.int32()), "label": pa.array(self.labels, pa.string()),
                "source": const("baseline", pa.string()), "annotator": const(BASELINE_NAME, pa.string()),
                "codebook_version": const(BASELINE_VERSION, pa.string()), "run_id": const(self.run_id, pa.string()),
                "study": const(None, pa.string()), "confidence": const(None, pa.float64()),
                "rationale": pa.array(self.rationales, pa.string()), "created_at": const(now, pa.timestamp("us")),
                "extra": const("{}", pa.string()), "distribution": const(None, pa.list_(pa.float64())),
            },
            schema=LABEL_TABLE_SCHEMA,
        )
        self._clear()
        return table


@register_judge("baseline")
def make_baseline(model: str | None = None, **options: Any) -> BaselineJudge:
    """Factory for ``--judge baseline``.

    Raises
    ------
    ConfigError
        Options were given (``--base-url``, ``--chunk-size``, ...): they belong to LLM judges, and the
        baseline would silently run without them.
    """
    given = sorted(name for name, value in options.items() if value is not None and value is not False)
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"--judge baseline takes no judge options, got {flags}: they apply to --judge openai:MODEL")
    return BaselineJudge()

"""Verification: an LLM audits the stored labels of one rater against the frozen codebook (``ror verify``).

Published judge studies report that a second pass, in which the judge (or another model) checks each
label against the codebook, raises judge-vs-human agreement. ``verify(store, options)`` runs that pass:
per segment the verifier answers ``accept`` (the audited label stands) or ``revise`` with the
codebook's label and a reason.

The verifier is the LLM judge with a different question (:class:`Verifier` subclasses
:class:`~ror_annotate.judge.llm.LLMJudge` and reuses all of its machinery): chunked requests with one
copy of the trace per chunk, the audited label shown in each segment's marker (``«12 | planning»``),
strict structured outputs (:class:`VerdictBatch`), the response cache (a re-run sends no request),
exactly-once writes (a run killed with kill -9 or SIGTERM resumes where it stopped), the Batch API
(``batch=True``), the cost ledger in the run's counts, and per-segment failures in ``judge_failures``.

Storage: the verdicts are labels of their own rater ``verify:<model>:of:<rater>`` (source
``verify``); the label is the original on ``accept`` and the revision on ``revise``; ``extra`` holds
``verdict``, ``original``, ``reason`` and ``of``. The rater is declared in the ``annotators`` table
(kind machine, model, provider with secrets scrubbed, codebook, ``details={"of": rater}``). A segment
is verified again only when the audited label changed since its verdict.

Which rater is audited: ``of``, else the latest ``aggregate:*`` rater (by its latest label), else the
single ``judge`` rater. Errors: E521 the rater has no labels (under this codebook), E522 the default
is ambiguous (the choices are listed), E523 nothing to verify, E524 (exit status 3) no verdict came
back or more segments failed than ``max_failed`` allows.

:func:`verify_report` summarises every verifier in the store: revisions per verifier and rater, the
revision rate per original class, the from->to matrix, and Cohen's kappa (Cohen 1960) and accuracy
against the human reference (:mod:`ror_annotate.reference`: adjudicated, else unanimous humans)
before and after verification, on the same segments.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from .codebook import render_markdown
from .errors import ConfigError, VerifyError, VerifyOutcomeError
from .judge import JudgeReport
from .judge.client import Completion, RefusalError, ResponseParseError, TruncatedOutputError, parse_answer
from .judge.config import JudgeConfig
from .judge.llm import _RETRY_PROBLEMS, ChunkResult, LLMJudge, answered_once, cap_rationale
from .judge.outcome import MaxFailed
from .judge.prompt import RETRY_TEMPLATE, TRACE_TEMPLATE, build_messages, trace_block
from .judge.schema import BehaviorName, response_format
from .options import StageOptions
from .records import BEHAVIORS, Annotator, Label, SegmentLike, Trace, sha256_text
from .reference import latest, reference_labels_from
from .provenance import scrub_url

if TYPE_CHECKING:  # pragma: no cover
    from .store import Store

#: Bump when a template below changes: its hash is part of the cache key and of every verdict's provenance.
VERIFY_TEMPLATE_VERSION = "verify-prompt-v1"

VERIFY_SYSTEM_TEMPLATE = """You audit the labels another annotator gave to the segments of a reasoning trace written by a model while it solved a problem.
Each segment is marked in the trace by its id and its current label in guillemets, like «12 | planning», placed right before the segment's text.
Apply the codebook below strictly. For every requested segment id, exactly once, answer "accept" when the current label is the one the codebook prescribes, or "revise" with the codebook's label and a reason of at most 20 words. Use only the six behavior names.
Answer with JSON only, matching the given schema: {{"verdicts": [{{"segment_id": <int>, "verdict": "accept" or "revise", "label": <behavior, or null on accept>, "reason": <at most 20 words or null>}}]}}.

{codebook}"""

VERIFY_IDS_TEMPLATE = """
Audit exactly these segment ids ({n}): {ids}"""

Verdict = Literal["accept", "revise"]


class SegmentVerdict(BaseModel):
    """One item of the verifier's answer."""

    model_config = ConfigDict(extra="forbid")

    segment_id: int = Field(description="The number shown in «» before the segment.")
    verdict: Verdict = Field(description="accept: the current label is right; revise: it is not.")
    label: BehaviorName | None = Field(None, description="On revise: the codebook's label for the segment; null on accept.")
    reason: str | None = Field(None, description="At most 20 words: why the label is revised (or accepted).")


class VerdictBatch(BaseModel):
    """The verifier's whole answer: one verdict per requested segment id."""

    model_config = ConfigDict(extra="forbid")

    verdicts: list[SegmentVerdict]


def verify_template_hash() -> str:
    """sha256 of the verifier's templates (part of the cache key and of every verdict's provenance)."""
    return sha256_text("\x1f".join([VERIFY_TEMPLATE_VERSION, VERIFY_SYSTEM_TEMPLATE, TRACE_TEMPLATE, VERIFY_IDS_TEMPLATE, RETRY_TEMPLATE]))


def verifier_name(model: str, of: str) -> str:
    """The verifier's rater id: ``verify:<model>:of:<rater>``."""
    return f"verify:{model}:of:{of}"


@dataclass
class VerdictResult(ChunkResult):
    """A validated answer: ``good[id] = (verdict, None, reason)`` and ``revisions[id]`` the revised label."""

    revisions: dict[int, str] = field(default_factory=dict)


def validate_verdicts(data: dict[str, Any], requested: Sequence[int], labels: Sequence[str]) -> VerdictResult:
    """Check a parsed answer against the requested ids and the codebook's labels.

    Every requested id must appear exactly once with ``verdict`` ``accept`` or ``revise``; a
    ``revise`` must carry a label from ``labels``. Ids that are missing, repeated, or invalid go to
    ``bad`` with the reason; unrequested ids are ignored (noted). The label of an ``accept`` is ignored.
    """
    result = VerdictResult()
    items = data.get("verdicts")
    if not isinstance(items, list):
        result.bad = {i: "answer has no 'verdicts' list" for i in requested}
        return result
    for sid, item in answered_once(items, requested, result).items():
        verdict = item.get("verdict")
        reason = cap_rationale(item["reason"]) if isinstance(item.get("reason"), str) else None
        if verdict == "accept":
            result.good[sid] = ("accept", None, reason)
        elif verdict == "revise":
            label = item.get("label")
            if label not in labels:
                result.bad[sid] = f"revise with label {label!r}, which is not in the codebook"
                continue
            result.good[sid] = ("revise", None, reason)
            result.revisions[sid] = str(label)
        else:
            result.bad[sid] = f"verdict {verdict!r} is neither 'accept' nor 'revise'"
    return result


class Verifier(LLMJudge):
    """The LLM judge asked to audit the labels of rater ``of`` instead of labelling afresh.

    Parameters
    ----------
    model : str
        Verifier model name sent to the endpoint.
    of : str
        The audited rater (its labels under the verifier's codebook are shown and judged).
    sleep, config
        As :class:`~ror_annotate.judge.llm.LLMJudge`; ``config.samples`` must be 1.

    Raises
    ------
    ConfigError
        As the LLM judge (no key for a remote endpoint, bad options), or ``samples > 1``.
    """

    source = "verify"

    def __init__(self, model: str, *, of: str, config: JudgeConfig, sleep: Any = None) -> None:
        if config.samples != 1:
            raise ConfigError(f"--samples {config.samples}: a verifier gives one verdict per label; leave --samples at 1")
        super().__init__(model, sleep=sleep, config=config)
        self.of = of
        self.annotator = verifier_name(model, of)
        self.response_format = response_format(VerdictBatch)
        self.prompt_template_hash = sha256_text(verify_template_hash() + json.dumps(self.response_format, sort_keys=True))
        self.system_prompt = VERIFY_SYSTEM_TEMPLATE.format(codebook=render_markdown(self.book))
        self._audited: dict[str, dict[int, str]] = {}

    # ------------------------------------------------------------------ what is audited
    def audited(self, store: "Store", trace_id: str, *, refresh: bool = False) -> dict[int, str]:
        """``{segment_index: label}`` of the audited rater on ``trace_id`` under this codebook (latest per segment)."""
        if refresh or trace_id not in self._audited:
            by_segment: dict[int, list[Label]] = {}
            for lab in store.labels(annotator=self.of, trace_id=trace_id):
                if lab.codebook_version == self.codebook_version:
                    by_segment.setdefault(lab.segment_index, []).append(lab)
            self._audited[trace_id] = {i: latest(labs).label for i, labs in by_segment.items()}  # type: ignore[union-attr]
        return self._audited[trace_id]

    def verified(self, store: "Store", trace_id: str) -> dict[int, Label]:
        """This verifier's stored verdicts on ``trace_id``, by segment index."""
        return {lab.segment_index: lab for lab in store.labels(annotator=self.annotator, trace_id=trace_id, source="verify")
                if lab.codebook_version == self.codebook_version}

    def labeled_segments(self, store: "Store", trace_id: str, annotator: str) -> set[int]:
        """Segments with nothing to ask: already verified against the current audited label, or not labelled by the rater."""
        audited = self.audited(store, trace_id, refresh=True)
        current = {i for i, lab in self.verified(store, trace_id).items() if lab.extra.get("original") == audited.get(i)}
        return current | {s.segment_index for s in store.segments(trace_id) if s.segment_index not in audited}

    def _count_pending(self, store: "Store", trace_ids: Sequence[str]) -> int:
        """Audited segments still without a current verdict (the progress bar's total)."""
        total = 0
        for t in trace_ids:
            done = self.labeled_segments(store, t, self.annotator)  # refreshes the audited labels
            total += sum(1 for i in self.audited(store, t) if i not in done)
        return total

    # ------------------------------------------------------------------ prompt
    def _mark(self, trace_id: str):
        audited = self._audited.get(trace_id, {})
        return lambda i: f"«{i} | {audited[i]}» " if i in audited else f"«{i}» "

    def render_trace_block(self, store: "Store", trace: Trace, segments: Sequence[SegmentLike]) -> str:
        self.audited(store, trace.trace_id, refresh=True)
        return trace_block(trace, segments, mark=self._mark(trace.trace_id))

    def render_messages(self, trace: Trace, segments: Sequence[SegmentLike], ids: Sequence[int], *, max_tokens: int, block: str,
                        retry_problem: str | None = None) -> tuple[list[dict[str, str]], bool]:
        return build_messages(self.book, trace, segments, ids, context_tokens=self.context_tokens, max_tokens=max_tokens,
                              system=self.system_prompt, full_trace_block=block, retry_problem=retry_problem,
                              mark=self._mark(trace.trace_id), ids_template=VERIFY_IDS_TEMPLATE)

    # ------------------------------------------------------------------ answers
    def judge_answer(self, completion: Completion, ids: list[int]) -> tuple[ChunkResult, str | None, str | None]:
        """As :meth:`LLMJudge.judge_answer`, validating verdicts (:func:`validate_verdicts`)."""
        try:
            result = validate_verdicts(parse_answer(completion), ids, self.book.labels)
        except TruncatedOutputError as exc:
            return VerdictResult(bad={i: str(exc) for i in ids}), "truncated", None
        except RefusalError as exc:
            return VerdictResult(bad={i: str(exc) for i in ids}), "refusal", _RETRY_PROBLEMS["refusal"]
        except ResponseParseError as exc:
            return VerdictResult(bad={i: str(exc) for i in ids}), "parse", _RETRY_PROBLEMS["parse"]
        if not result.bad:
            return result, None, None
        first = min(result.bad)
        return result, "invalid_ids", f"segment id {first}: {result.bad[first]}"

    def make_labels(self, trace: Trace, sample: int, run_id: str | None, result: ChunkResult, extra: dict[str, Any]) -> list[Label]:
        """One ``verify`` label per verdict: the original label on accept, the revision on revise.

        A ``revise`` to the label the segment already has is stored as ``accept`` (``extra["same_label"]``).
        """
        audited = self._audited.get(trace.trace_id, {})
        revisions = result.revisions if isinstance(result, VerdictResult) else {}
        out = []
        for sid, (verdict, _, reason) in sorted(result.good.items()):
            original = audited.get(sid)
            if original is None:  # the audited label vanished between the request and its answer
                continue
            new = revisions.get(sid, original)
            info: dict[str, Any] = {"verdict": verdict, "original": original, "reason": reason, "of": self.of}
            if verdict == "revise" and new == original:
                info.update(verdict="accept", same_label=True)
            out.append(Label(trace_id=trace.trace_id, segment_index=sid, label=new, source="verify", annotator=self.annotator,
                             codebook_version=self.codebook_version, run_id=run_id, rationale=reason, extra={**extra, **info}))
        return out


# --------------------------------------------------------------------------- options and the stage
class VerifyOptions(StageOptions):
    """Options of ``ror verify`` / :func:`verify`.

    Attributes
    ----------
    judge : str
        The verifier, ``openai:MODEL`` (same or another model than the audited judge).
    of : str, optional
        The audited rater; default the latest ``aggregate:*`` rater, else the single judge rater.
    max_failed : str, float or int
        Failed segments allowed before the pass exits with E524 (a fraction ``"10%"`` or a count).
    judge_options : JudgeConfig
        The LLM judge's options (``base_url``, ``chunk_size``, ``concurrency``, ``batch``, ...).
    """

    stage: ClassVar[str] = "the verify stage"
    judge: str = Field(min_length=1)
    of: str | None = None
    max_failed: str | float | int = "10%"
    judge_options: JudgeConfig = Field(default_factory=JudgeConfig)

    @classmethod
    def build(cls, judge: str, *, of: str | None = None, max_failed: str | float | int | None = None,
              **judge_options: Any) -> "VerifyOptions":
        """Options from flat keywords (the judge's options validated with their did-you-mean errors).

        Raises
        ------
        ConfigError
            An unknown or out-of-bounds option, or a bad ``max_failed``.
        """
        config = JudgeConfig.from_options(judge_options, judge="verifier")
        opts = cls.from_options({"judge": judge, "of": of, "max_failed": max_failed, "judge_options": config})
        MaxFailed.parse(opts.max_failed)
        return opts


class VerifySummary(BaseModel):
    """What :func:`verify` did (counts are segments; tokens in the verifier's tokens; cost in USD)."""

    model_config = ConfigDict(extra="forbid")

    verifier: str
    of: str
    traces: int
    audited: int = Field(description="Segments of these traces with a label of the audited rater.")
    verified: int = Field(description="Verdicts written by this run.")
    revised: int = Field(description="Of those, revisions.")
    skipped: int = Field(description="Segments already verified against the same label before this run.")
    failed: int
    counts: dict[str, Any] = Field(default_factory=dict, description="Every counter of the pass (requests, tokens, cost_usd ...).")


def default_rater(store: "Store") -> str:
    """The rater ``ror verify`` audits without ``--of``: the latest ``aggregate:*`` rater, else the single judge rater.

    Raises
    ------
    VerifyError
        E522 when several aggregates share the latest time, or several judge raters exist (choices
        listed); E523 when the store has no aggregate or judge labels.
    """
    aggregates = store.latest_label_times(source="aggregate")
    if aggregates:
        newest = max(aggregates.values())
        top = sorted(a for a, t in aggregates.items() if t == newest)
        if len(top) == 1:
            return top[0]
        raise VerifyError(f"several aggregate raters are equally recent: {', '.join(top)}; choose one with --of", code="E522")
    judges = sorted(store.latest_label_times(source="judge"))
    if len(judges) == 1:
        return judges[0]
    if judges:
        raise VerifyError(f"which rater should be verified? Several judge raters: {', '.join(judges)}; choose one with --of", code="E522")
    raise VerifyError(f"nothing to verify in {store.path}: no aggregate or judge labels; run `ror label --judge ...` first "
                      "or name a rater with --of", code="E523")


def verify(store: "Store", options: VerifyOptions, *, trace_ids: Sequence[str] | None = None, progress: Any = None,
           sleep: Any = None) -> VerifySummary:
    """Audit the labels of one rater with an LLM verifier; the verdicts become rater ``verify:<model>:of:<rater>``.

    Parameters
    ----------
    store : Store
    options : VerifyOptions
    trace_ids : sequence of str, optional
        Only these traces; default every trace the rater labelled.
    progress : rich.progress.Progress, optional
    sleep : coroutine function, optional
        Waits between retries go through it (tests record instead of sleeping).

    Returns
    -------
    VerifySummary

    Raises
    ------
    ConfigError
        The judge is not ``openai:MODEL``, or its options are invalid.
    VerifyError
        E521 the rater has no labels (under the verifier's codebook); E522 / E523 see :func:`default_rater`.
    JudgeError
        The endpoint refused the run as a whole (bad key, model, URL); verdicts written stay stored.
    VerifyOutcomeError
        E524: no verdict came back, or more failed segments than ``options.max_failed``.
    """
    from .pipeline import _stage

    name, _, model = options.judge.partition(":")
    if name != "openai" or not model:
        raise ConfigError(f"ror verify needs an LLM verifier: --judge openai:MODEL, got {options.judge!r}")
    limit = MaxFailed.parse(options.max_failed)
    of = options.of or default_rater(store)
    verifier = Verifier(model, of=of, config=options.judge_options, sleep=sleep)
    rated = store.labels(annotator=of)
    if not rated:
        known = ", ".join(a for _, a, _ in store.annotators()) or "none"
        raise VerifyError(f"rater {of!r} has no labels in {store.path}; raters with labels: {known}", code="E521")
    versions = {lab.codebook_version for lab in rated}
    if verifier.codebook_version not in versions:
        imported = sorted(v for v in versions if v.startswith("crosswalk:"))
        if any(v.startswith("mixed-") for v in versions):  # an aggregate of raters of several codebooks
            same = sorted(a for _, a, _ in store.annotators()
                          if not a.startswith("aggregate:") and store.rater_codebook_versions([a]) == [verifier.codebook_version])
            raise VerifyError(
                f"rater {of!r} combines raters of different codebooks (e.g. the baseline's cue rules and an LLM judge's "
                f"{verifier.book.versioned_name}), so its labels are under no one codebook a verifier can be given: verify one "
                f"judge with --of ({', '.join(same) or 'no rater has labels under ' + verifier.book.versioned_name}), or aggregate "
                "judges of one codebook (ror aggregate --raters A,B) and verify that aggregate",
                code="E521",
            )
        if imported:  # an imported rater's labels carry their crosswalk, not a codebook hash (was shown cut: "crosswalk:si")
            raise VerifyError(f"rater {of!r} holds imported labels ({', '.join(imported)}), not labels under a codebook: ror verify "
                              "audits a judge's labels; compare the imported rater with ror agree instead", code="E521")
        raise VerifyError(f"rater {of!r} has no labels under codebook {verifier.book.versioned_name} ({verifier.codebook_version[:12]}); "
                          f"its labels use {', '.join(sorted(v[:12] for v in versions))}: pass the same --codebook", code="E521")
    wanted = None if trace_ids is None else set(trace_ids)
    ids = sorted({lab.trace_id for lab in rated if lab.codebook_version == verifier.codebook_version
                  and (wanted is None or lab.trace_id in wanted)})
    if not ids:
        raise VerifyError(f"nothing to verify: rater {of!r} labelled none of the given traces", code="E523")
    audited = sum(len(verifier.audited(store, t, refresh=True)) for t in ids)
    cfg = options.judge_options
    store.upsert_annotators([Annotator(
        annotator=verifier.annotator, kind="machine", source="verify", model=model,
        provider=scrub_url(verifier.base_url) if verifier.base_url else None, temperature=verifier.temperature, samples=1,
        codebook_version=verifier.codebook_version,
        details={"of": of, "codebook": verifier.book.versioned_name, "prompt_template_hash": verifier.prompt_template_hash},
    )])
    params = {"judge": options.judge, "of": of, "max_failed": str(limit),
              **cfg.model_dump(mode="json", exclude_defaults=True)}
    with _stage(store, None, "verify", params, progress) as (run, tracked):
        report: JudgeReport = verifier.label(store, ids, run=run, progress=cast(Any, tracked))  # rich Progress duck type
        report.skipped = audited - report.labeled - report.failed - int(report.extra.get("failed_kept", 0))
        counts = report.as_counts()
        revised = sum(1 for t in ids for lab in verifier.verified(store, t).values()
                      if lab.run_id == run.run_id and lab.extra.get("verdict") == "revise")
        counts.update(audited=audited, revised=revised)
        run.counts.update(counts)
        summary = VerifySummary(verifier=verifier.annotator, of=of, traces=len(ids), audited=audited, verified=report.labeled,
                                revised=revised, skipped=report.skipped, failed=report.failed, counts=counts)
        _check_outcome(summary, limit, counts)
    return summary


def _check_outcome(summary: VerifySummary, limit: MaxFailed, counts: dict[str, Any]) -> None:
    failed = summary.failed + int(counts.get("failed_kept", 0))
    done = summary.verified + summary.skipped
    if failed == 0:
        return
    example = counts.get("failure_example")
    why = f" First reason: {example}." if example else ""
    after = "The verdicts written are kept; run the same command again to retry the failed segments (reasons in judge_failures)."
    if done == 0:
        raise VerifyOutcomeError(f"the verifier returned no verdict for any of the {failed} segments.{why} {after}", counts=counts)
    if failed > limit.allowed(failed + done):
        raise VerifyOutcomeError(f"{failed} of {failed + done} segments ({failed / (failed + done):.1%}) got no verdict, more than "
                                 f"--max-failed {limit} allows.{why} {after}", counts=counts)


# --------------------------------------------------------------------------- report
class AgreementBeforeAfter(BaseModel):
    """Cohen's kappa and accuracy of the audited rater (before) and of the verifier (after) vs the human reference."""

    n_items: int = Field(description="Verified segments that have a human reference.")
    kappa_before: float | None = None
    kappa_after: float | None = None
    accuracy_before: float | None = None
    accuracy_after: float | None = None


class VerifierReport(BaseModel):
    """One verifier's verdicts on one rater."""

    verifier: str
    of: str
    verified: int
    revised: int
    revision_rate: float | None
    by_class: dict[str, dict[str, Any]] = Field(description="Original class -> {verified, revised, rate}.")
    matrix: dict[str, dict[str, int]] = Field(description="Original -> final label -> segments (diagonal: accepted).")
    reference: AgreementBeforeAfter


class VerifyReport(BaseModel):
    """Every verifier in the store (:func:`verify_report`)."""

    categories: list[str]
    verifiers: list[VerifierReport]


def verify_report(store: "Store", *, verifier: str | None = None, of: str | None = None) -> VerifyReport:
    """Revisions per verifier and rater, per original class, the from->to matrix, and agreement with humans.

    Agreement uses the reference of :mod:`ror_annotate.reference` (adjudicated, else unanimous
    humans) on the verified segments that have one: ``before`` compares the audited label (as shown to
    the verifier), ``after`` the verifier's label. Cohen's kappa (Cohen 1960,
    :func:`ror_annotate.agreement.metrics.cohen_kappa`, equal to scikit-learn's ``cohen_kappa_score``)
    is None when undefined (no items, or a single category on both sides); accuracy is the share of
    items equal to the reference.

    Parameters
    ----------
    verifier, of : str, optional
        Only this verifier rater / only verifiers of this audited rater.

    Returns
    -------
    VerifyReport
        ``verifiers`` sorted by verifier id; empty when the store has no verdicts.
    """
    from .agreement.metrics import cohen_kappa

    reference = {k: r.label for k, r in reference_labels_from(store.labels(source=["human", "adjudicated"])).items()}
    groups: dict[tuple[str, str], list[Label]] = {}
    for lab in store.labels(source="verify"):
        audited = str(lab.extra.get("of", ""))
        if (verifier is None or lab.annotator == verifier) and (of is None or audited == of):
            groups.setdefault((lab.annotator, audited), []).append(lab)
    out = []
    for (name, audited), labs in sorted(groups.items()):
        matrix = {a: dict.fromkeys(BEHAVIORS, 0) for a in BEHAVIORS}
        for lab in labs:
            matrix.setdefault(str(lab.extra.get("original")), dict.fromkeys(BEHAVIORS, 0))[lab.label] += 1
        revised = sum(1 for lab in labs if lab.label != lab.extra.get("original"))
        by_class = {}
        for cls, row in matrix.items():
            n = sum(row.values())
            r = n - row.get(cls, 0)
            by_class[cls] = {"verified": n, "revised": r, "rate": r / n if n else None}
        pairs = [(reference[(lab.trace_id, lab.segment_index)], str(lab.extra.get("original")), lab.label)
                 for lab in labs if (lab.trace_id, lab.segment_index) in reference]
        agree = AgreementBeforeAfter(n_items=len(pairs))
        if pairs:
            ref, before, after = (list(x) for x in zip(*pairs))
            kb, ka = cohen_kappa(ref, before, categories=list(BEHAVIORS)), cohen_kappa(ref, after, categories=list(BEHAVIORS))
            agree = AgreementBeforeAfter(
                n_items=len(pairs), kappa_before=None if kb.reason else float(kb.value), kappa_after=None if ka.reason else float(ka.value),
                accuracy_before=sum(r == b for r, b in zip(ref, before)) / len(pairs),
                accuracy_after=sum(r == a for r, a in zip(ref, after)) / len(pairs),
            )
        out.append(VerifierReport(verifier=name, of=audited, verified=len(labs), revised=revised,
                                  revision_rate=revised / len(labs) if labs else None, by_class=by_class, matrix=matrix, reference=agree))
    return VerifyReport(categories=list(BEHAVIORS), verifiers=out)


__all__ = [
    "VERIFY_TEMPLATE_VERSION", "AgreementBeforeAfter", "SegmentVerdict", "VerdictBatch", "Verifier", "VerifierReport", "VerifyOptions",
    "VerifyReport", "VerifySummary", "default_rater", "validate_verdicts", "verifier_name", "verify", "verify_report",
]
